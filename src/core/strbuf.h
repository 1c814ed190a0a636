/* A growable byte string (always NUL-terminated once anything was put). Running out of
 * memory sets `failed` and later puts do nothing, so a caller checks once at the end. */
#ifndef G4_CORE_STRBUF_H
#define G4_CORE_STRBUF_H

#include <stddef.h>

typedef struct g4_strbuf {
    char *p; /* NULL until the first put */
    size_t len, cap;
    int failed;
} g4_strbuf;

void g4_strbuf_put(g4_strbuf *b, const char *s, size_t n);
void g4_strbuf_puts(g4_strbuf *b, const char *s);
/* The content ("" when empty); valid until the next put. */
const char *g4_strbuf_str(const g4_strbuf *b);
/* Empties it, keeping the memory (and clearing `failed`). */
void g4_strbuf_clear(g4_strbuf *b);
void g4_strbuf_free(g4_strbuf *b);
/* The length of the longest tail of s[0..n) that is a proper prefix of one of the count
 * patterns (lens: their lengths, or NULL to measure them): what a matcher over streamed text
 * holds back until more text tells whether the pattern completes. */
size_t g4_tail_prefix_len(const char *s, size_t n, const char *const *pats, const size_t *lens, int count);

/* A malloc'ed copy of s[0..n) with a NUL; NULL when out of memory. */
char *g4_strndup(const char *s, size_t n);

#endif
