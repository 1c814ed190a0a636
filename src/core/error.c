#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int g4_fail(g4_error *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    /* one line: a message never carries a newline */
    for (char *p = err->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return -1;
}

int g4_fail_prefix(g4_error *err, const char *fmt, ...) {
    if (!err) return -1;
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    char pre[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    /* Truncating a long message is intended; using the result keeps -Wformat-truncation
     * (GCC at -O0) quiet. */
    int n = snprintf(err->msg, sizeof err->msg, "%s: %s", pre, old);
    (void)n;
    return -1;
}
