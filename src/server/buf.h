/* A growable text buffer for the server's output (bodies, stream chunks, metrics), always NUL-terminated.
 * Out of memory sets `failed` and later writes do nothing: the caller checks once at the end. */
#ifndef G4_SERVER_BUF_H
#define G4_SERVER_BUF_H

#include <stddef.h>

typedef struct srv_buf {
    char *p;
    size_t len, cap;
    int failed;
} srv_buf;

void srv_buf_put(srv_buf *b, const char *s, size_t n);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);

#endif
