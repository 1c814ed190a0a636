#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

void g4_warn_lines(char **lines, const char *more) {
    const size_t old = *lines ? strlen(*lines) : 0, n = more ? strlen(more) : 0;
    if (!n) return;
    char *w = realloc(*lines, old + n + 1);
    if (!w) return;
    memcpy(w + old, more, n + 1);
    *lines = w;
}

void g4_warn(char **lines, const char *fmt, ...) {
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    for (int i = 0; i < n; i++)
        if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
    line[n] = '\n';
    line[n + 1] = 0;
    g4_warn_lines(lines, line);
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
