/* Tokenizer utilities: hashing, string maps, UTF-8, character classes, the byte trie. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ------------------------------------------------------------------ hashing */

#define TOK_P1 0x9E3779B97F4A7C15ULL
#define TOK_P2 0xC2B2AE3D27D4EB4FULL
#define TOK_P3 0x165667B19E3779F9ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t final_mix(uint64_t h) {
    h ^= h >> 32;
    h *= TOK_P2;
    h ^= h >> 29;
    h *= TOK_P3;
    h ^= h >> 32;
    return h;
}

uint64_t tok_hash_bytes(const void *data, size_t len, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t h = seed ^ ((uint64_t)len * TOK_P1);
    if (len >= 32) {
        /* four independent lanes so the multiplies overlap */
        uint64_t v0 = seed + TOK_P1, v1 = seed + TOK_P2, v2 = seed ^ TOK_P3, v3 = seed - TOK_P1;
        while (len >= 32) {
            v0 = rotl64(v0 + load64(p) * TOK_P2, 31) * TOK_P1;
            v1 = rotl64(v1 + load64(p + 8) * TOK_P2, 31) * TOK_P1;
            v2 = rotl64(v2 + load64(p + 16) * TOK_P2, 31) * TOK_P1;
            v3 = rotl64(v3 + load64(p + 24) * TOK_P2, 31) * TOK_P1;
            p += 32;
            len -= 32;
        }
        h ^= final_mix(v0);
        h = rotl64(h, 17) * TOK_P1 + final_mix(v1);
        h = rotl64(h, 17) * TOK_P1 + final_mix(v2);
        h = rotl64(h, 17) * TOK_P1 + final_mix(v3);
    }
    while (len >= 8) {
        h = rotl64(h ^ (load64(p) * TOK_P2), 27) * TOK_P1 + TOK_P3;
        p += 8;
        len -= 8;
    }
    if (len) {
        uint64_t w = 0;
        memcpy(&w, p, len);
        h = rotl64(h ^ (w * TOK_P3), 23) * TOK_P2 + TOK_P1;
    }
    return final_mix(h);
}

size_t tok_growth_limit(size_t n, size_t inserted) {
    size_t lim = 4096;
    if (n > (SIZE_MAX / 4) / TOK_MAX_GROWTH || inserted > SIZE_MAX / 4) return SIZE_MAX / 2;
    return lim + n * TOK_MAX_GROWTH + inserted;
}

/* --------------------------------------------------------------- string map */

int tok_strmap_init(tok_strmap *m, size_t n_entries) {
    size_t cap = 16;
    while (cap < n_entries * 2) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    return m->slots ? 0 : -1;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static inline int tab_get(const tok_strtab *tab, uint32_t i, const char **s, size_t *len) {
    uint32_t a = tab->off[i], b = tab->off[i + 1];
    if (b == a) return 0;
    *s = tab->blob + a;
    *len = b - a - 1;
    return 1;
}

int tok_strmap_put(tok_strmap *m, const tok_strtab *tab, uint32_t index) {
    const char *s;
    size_t len;
    if (!tab_get(tab, index, &s, &len)) return 0;
    uint64_t h = tok_hash_bytes(s, len, 0);
    uint64_t tag = h >> 32;
    uint64_t i = h & m->mask;
    for (int probes = 0; probes <= TOK_MAX_RUN; probes++, i = (i + 1) & m->mask) {
        uint64_t v = m->slots[i];
        if (!v) {
            m->slots[i] = (tag << 32) | ((uint64_t)index + 1);
            return 0;
        }
        if ((v >> 32) == tag) {
            const char *t;
            size_t tl;
            if (tab_get(tab, (uint32_t)(v & 0xffffffffu) - 1, &t, &tl) && tl == len &&
                !memcmp(t, s, len))
                return 0; /* keep the first */
        }
    }
    return -1;
}

uint64_t tok_longest_run(const uint64_t *table, uint64_t cap, size_t stride, uint64_t empty) {
    uint64_t best = 0, run = 0, first_empty = cap;
    for (uint64_t i = 0; i < cap; i++) {
        if (table[i * stride] == empty) {
            if (first_empty == cap) first_empty = i;
            run = 0;
        } else if (++run > best) {
            best = run;
        }
    }
    if (first_empty == cap) return cap;
    /* the run at the end continues at the start */
    return run + first_empty > best ? run + first_empty : best;
}

int32_t tok_strmap_get(const tok_strmap *m, const tok_strtab *tab, const char *s, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = tok_hash_bytes(s, len, 0);
    uint64_t tag = h >> 32;
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t v = m->slots[i];
        if (!v) return -1;
        if ((v >> 32) == tag) {
            uint32_t idx = (uint32_t)(v & 0xffffffffu) - 1;
            const char *t;
            size_t tl;
            if (tab_get(tab, idx, &t, &tl) && tl == len && !memcmp(t, s, len)) return (int32_t)idx;
        }
    }
}

/* -------------------------------------------------------------------- UTF-8 */

size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        uint32_t v = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        *cp = v;
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        uint32_t v = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) |
                     (s[3] & 0x3Fu);
        if (v < 0x10000 || v > 0x10FFFF) return 0;
        *cp = v;
        return 4;
    }
    return 0;
}

size_t tok_utf8_validate(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (i + 8 <= len && !(load64(s + i) & 0x8080808080808080ULL)) {
            i += 8;
            continue;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = tok_utf8_decode(s + i, len - i, &cp);
        if (!k) return i;
        i += k;
    }
    return len;
}

/* Unicode White_Space (what Rust's char::is_whitespace tests). */
int tok_is_white_space(uint32_t c) {
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85) return 0;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* --------------------------------------------------------------------- trie */

typedef struct {
    const unsigned char *s;
    size_t len;
    int32_t index;
} trie_pat;

static int pat_cmp(const void *a, const void *b) {
    const trie_pat *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

typedef struct {
    uint32_t node, lo, hi;
    size_t depth;
} trie_job;

int tok_trie_build(tok_trie *t, const tok_added *added, size_t n, int use_norm) {
    memset(t, 0, sizeof *t);
    size_t m = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (added[i].normalized != (use_norm != 0)) continue;
        size_t len = use_norm ? added[i].norm_len : added[i].len;
        if (!len) continue;
        m++;
        total += len;
    }
    t->empty = m == 0;
    t->nodes = calloc(total + 1, sizeof *t->nodes);
    t->edges = calloc(total + 1, sizeof *t->edges);
    trie_pat *pats = calloc(m + 1, sizeof *pats);
    trie_job *queue = calloc(total + 1, sizeof *queue);
    if (!t->nodes || !t->edges || !pats || !queue) {
        free(pats);
        free(queue);
        tok_trie_free(t);
        return -1;
    }
    m = 0;
    for (size_t i = 0; i < n; i++) {
        if (added[i].normalized != (use_norm != 0)) continue;
        size_t len = use_norm ? added[i].norm_len : added[i].len;
        if (!len) continue;
        pats[m].s = (const unsigned char *)(use_norm ? added[i].norm : added[i].content);
        pats[m].len = len;
        pats[m].index = (int32_t)i;
        m++;
    }
    qsort(pats, m, sizeof *pats, pat_cmp);

    t->n_nodes = 1;
    t->nodes[0].match = -1;
    size_t qhead = 0, qtail = 0;
    queue[qtail++] = (trie_job){0, 0, (uint32_t)m, 0};
    while (qhead < qtail) {
        trie_job job = queue[qhead++];
        uint32_t lo = job.lo;
        /* patterns that end here: the first (lowest added index) wins */
        if (lo < job.hi && pats[lo].len == job.depth) {
            t->nodes[job.node].match = pats[lo].index;
            while (lo < job.hi && pats[lo].len == job.depth) lo++;
        }
        t->nodes[job.node].first_edge = (uint32_t)t->n_edges;
        uint16_t count = 0;
        while (lo < job.hi) {
            unsigned char c = pats[lo].s[job.depth];
            uint32_t hi = lo;
            while (hi < job.hi && pats[hi].s[job.depth] == c) hi++;
            uint32_t child = (uint32_t)t->n_nodes++;
            t->nodes[child].match = -1;
            t->edges[t->n_edges++] = (tok_trie_edge){c, child};
            count++;
            if (job.node == 0) t->root[c] = child;
            queue[qtail++] = (trie_job){child, lo, hi, job.depth + 1};
            lo = hi;
        }
        t->nodes[job.node].n_edges = count;
    }
    free(pats);
    free(queue);
    return 0;
}

void tok_trie_free(tok_trie *t) {
    free(t->nodes);
    free(t->edges);
    t->nodes = NULL;
    t->edges = NULL;
}

static inline uint32_t trie_child(const tok_trie *t, uint32_t node, unsigned char c) {
    const tok_trie_node *nd = &t->nodes[node];
    const tok_trie_edge *e = t->edges + nd->first_edge;
    size_t lo = 0, hi = nd->n_edges;
    if (hi <= 8) {
        for (size_t i = 0; i < hi; i++)
            if (e[i].byte == c) return e[i].node;
        return 0;
    }
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (e[mid].byte < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nd->n_edges && e[lo].byte == c ? e[lo].node : 0;
}

int32_t tok_trie_longest(const tok_trie *t, const unsigned char *s, size_t n, size_t *match_len) {
    if (t->empty || !n) return -1;
    uint32_t node = t->root[s[0]];
    if (!node) return -1;
    int32_t best = -1;
    size_t j = 1;
    for (;;) {
        if (t->nodes[node].match >= 0) {
            best = t->nodes[node].match;
            *match_len = j;
        }
        if (j >= n) break;
        node = trie_child(t, node, s[j]);
        if (!node) break;
        j++;
    }
    return best;
}
