#include "core/strbuf.h"

#include <stdlib.h>
#include <string.h>

void g4_strbuf_put(g4_strbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void g4_strbuf_puts(g4_strbuf *b, const char *s) { g4_strbuf_put(b, s, strlen(s)); }

const char *g4_strbuf_str(const g4_strbuf *b) { return b->p ? b->p : ""; }

void g4_strbuf_clear(g4_strbuf *b) {
    b->len = 0;
    b->failed = 0;
    if (b->p) b->p[0] = 0;
}

void g4_strbuf_free(g4_strbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

char *g4_strndup(const char *s, size_t n) {
    char *out = malloc(n + 1);
    if (out) {
        if (n) memcpy(out, s, n);
        out[n] = 0;
    }
    return out;
}

size_t g4_tail_prefix_len(const char *s, size_t n, const char *const *pats, const size_t *lens, int count) {
    size_t most = 0; /* a proper prefix is shorter than its pattern */
    for (int i = 0; i < count; i++) {
        size_t l = lens ? lens[i] : strlen(pats[i]);
        if (l > most + 1) most = l - 1;
    }
    if (most > n) most = n;
    for (size_t k = most; k > 0; k--)
        for (int i = 0; i < count; i++) {
            size_t l = lens ? lens[i] : strlen(pats[i]);
            if (l > k && memcmp(pats[i], s + n - k, k) == 0) return k;
        }
    return 0;
}
