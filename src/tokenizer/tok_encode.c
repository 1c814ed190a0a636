/* Encoding: added tokens, normalizer, pre-tokenizer, BPE. Mirrors the `tokenizers`
 * library (added_vocabulary.rs, normalizer.rs, bpe/model.rs, bpe/word.rs). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct tbuf {
    char *p;
    size_t n, cap;
} tbuf;

static int tbuf_reserve(tbuf *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int tbuf_add(tbuf *b, const char *s, size_t n) {
    if (tbuf_reserve(b, b->n + n + 1)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int g4_tokens_push(g4_tokens *t, int32_t id) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        int32_t *p = realloc(t->ids, cap * sizeof *p);
        if (!p) return -1;
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return 0;
}

static int tokens_reserve(g4_tokens *t, size_t extra) {
    if (t->n + extra <= t->cap) return 0;
    size_t cap = t->cap ? t->cap : 64;
    while (cap < t->n + extra) cap *= 2;
    int32_t *p = realloc(t->ids, cap * sizeof *p);
    if (!p) return -1;
    t->ids = p;
    t->cap = cap;
    return 0;
}

/* ---------------------------------------------------------------- normalizer */

/* Runs the normalizer ops on s into one of two scratch buffers; *res points at the result.
 * -1: out of memory; -2: the text would grow past tok_growth_limit. */
static int normalize(const g4_tokenizer *tok, const char *s, size_t n, tbuf bufs[2], const char **res,
                     size_t *res_len) {
    const char *cur = s;
    size_t cur_len = n, limit = tok_growth_limit(n, tok->norm_inserted);
    int which = 0;
    for (size_t k = 0; k < tok->n_norm; k++) {
        const tok_norm_op *op = &tok->norm[k];
        tbuf *out = &bufs[which];
        out->n = 0;
        if (op->type == TOK_NORM_PREPEND) {
            if (!cur_len) continue;
            if (op->content_len > limit - cur_len) return -2;
            if (tbuf_reserve(out, cur_len + op->content_len + 1)) return -1;
            memcpy(out->p, op->content, op->content_len);
            memcpy(out->p + op->content_len, cur, cur_len);
            out->n = cur_len + op->content_len;
        } else if (op->pattern_len == 1) {
            /* one byte replaced (Gemma: ' ' -> U+2581): memchr from hit to hit */
            const char pc = op->pattern[0];
            const char *p = cur, *end = cur + cur_len;
            const char *hit = memchr(p, pc, cur_len);
            if (!hit) continue; /* unchanged */
            size_t grow = op->content_len > 1 ? op->content_len - 1 : 0;
            size_t count = 0;
            for (const char *q = hit; q; q = memchr(q + 1, pc, (size_t)(end - q - 1))) count++;
            if (grow && count > (limit - cur_len) / grow) return -2;
            if (tbuf_reserve(out, cur_len + count * grow + 1)) return -1;
            char *w = out->p;
            while (hit) {
                memcpy(w, p, (size_t)(hit - p));
                w += hit - p;
                memcpy(w, op->content, op->content_len);
                w += op->content_len;
                p = hit + 1;
                hit = p < end ? memchr(p, pc, (size_t)(end - p)) : NULL;
            }
            memcpy(w, p, (size_t)(end - p));
            w += end - p;
            out->n = (size_t)(w - out->p);
        } else {
            const char *p = cur, *end = cur + cur_len;
            const char *hit = cur_len >= op->pattern_len ? memmem(p, (size_t)(end - p), op->pattern, op->pattern_len) : NULL;
            if (!hit) continue; /* unchanged */
            if (tbuf_reserve(out, cur_len + 1)) return -1;
            while (hit) {
                if (tbuf_add(out, p, (size_t)(hit - p)) || tbuf_add(out, op->content, op->content_len)) return -1;
                if (out->n > limit) return -2;
                p = hit + op->pattern_len;
                hit = (size_t)(end - p) >= op->pattern_len ? memmem(p, (size_t)(end - p), op->pattern, op->pattern_len) : NULL;
            }
            if (tbuf_add(out, p, (size_t)(end - p))) return -1;
            if (out->n > limit) return -2;
        }
        cur = out->p;
        cur_len = out->n;
        which ^= 1;
    }
    *res = cur;
    *res_len = cur_len;
    return 0;
}

char *tok_normalize_alloc(const g4_tokenizer *tok, const char *s, size_t len, size_t *out_len) {
    tbuf bufs[2] = {{0}, {0}};
    const char *r;
    size_t rl;
    char *res = NULL;
    if (normalize(tok, s, len, bufs, &r, &rl) == 0 && (res = malloc(rl + 1))) {
        memcpy(res, r, rl);
        res[rl] = 0;
        *out_len = rl;
    }
    free(bufs[0].p);
    free(bufs[1].p);
    return res;
}

/* ----------------------------------------------------------------------- BPE */

/* A per-call cache of chunk -> ids. */
typedef struct cache_ent {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_n;
} cache_ent;

/* The text is the caller's, so the cache's hash is seeded per call and a lookup probes at most
 * CACHE_MAX_PROBES slots (a miss only costs the merge again). */
enum { CACHE_MAX_KEY = 256, CACHE_MAX_ENTRIES = 1 << 20, CACHE_MAX_PROBES = 64 };

typedef struct enc_ctx {
    const g4_tokenizer *tok;
    g4_tokens *out;
    g4_error *err;
    tbuf norm[2];
    tbuf scratch;
    int32_t *sym_id, *sym_prev, *sym_next;
    size_t sym_cap;
    uint64_t *heap;
    size_t heap_n, heap_cap;
    cache_ent *ctab;
    size_t ccap, cn;
    tbuf ckeys;
    int32_t *cids;
    size_t cids_n, cids_cap;
    uint64_t cseed;
} enc_ctx;

static int sym_reserve(enc_ctx *c, size_t n) {
    if (n <= c->sym_cap) return 0;
    size_t cap = c->sym_cap ? c->sym_cap : 256;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(c->sym_id, cap * sizeof *a);
    if (!a) return -1;
    c->sym_id = a;
    a = realloc(c->sym_prev, cap * sizeof *a);
    if (!a) return -1;
    c->sym_prev = a;
    a = realloc(c->sym_next, cap * sizeof *a);
    if (!a) return -1;
    c->sym_next = a;
    c->sym_cap = cap;
    return 0;
}

static inline uint64_t merge_hash(uint32_t a, uint32_t b) {
    return (((uint64_t)a << 32) | b) * 0x9E3779B97F4A7C15ULL;
}

static inline int merge_maybe(const g4_tokenizer *tok, uint64_t hk) {
    uint64_t f = hk >> tok->merge_filter_shift;
    return (tok->merge_filter[f >> 6] >> (f & 63)) & 1;
}

/* Rank of the merge of the pair (a, b), -1 if none. */
static inline int64_t merge_rank(const g4_tokenizer *tok, uint32_t a, uint32_t b) {
    uint64_t hk = merge_hash(a, b);
    if (tok->merge_hot) {
        const int rb = tok->merge_rank_bits;
        const uint64_t kp = ((uint64_t)a << tok->merge_id_bits) | b;
        for (uint64_t h = hk >> tok->merge_hot_shift;; h = (h + 1) & tok->merge_hot_mask) {
            uint64_t e = tok->merge_hot[h];
            if ((e >> rb) == kp) return (int64_t)(e & (((uint64_t)1 << rb) - 1));
            if (e == UINT64_MAX) break;
        }
    }
    if (!merge_maybe(tok, hk)) return -1;
    uint64_t h = hk >> tok->merge_shift;
    if (tok->merge_packed) {
        const int rb = tok->merge_rank_bits;
        const uint64_t kp = ((uint64_t)a << tok->merge_id_bits) | b;
        for (;;) {
            uint64_t e = tok->merge_packed[h];
            if ((e >> rb) == kp) return (int64_t)(e & (((uint64_t)1 << rb) - 1));
            if (e == UINT64_MAX) return -1;
            h = (h + 1) & tok->merge_mask;
        }
    }
    const uint64_t key = ((uint64_t)a << 32) | b;
    for (;;) {
        const tok_merge_slot *s = &tok->merge_wide[h];
        if (s->key == key) return (int64_t)s->rank;
        if (s->key == UINT64_MAX) return -1;
        h = (h + 1) & tok->merge_mask;
    }
}

static inline void merge_prefetch(const g4_tokenizer *tok, uint32_t a, uint32_t b) {
    uint64_t hk = merge_hash(a, b);
    if (!merge_maybe(tok, hk)) return;
    uint64_t h = hk >> tok->merge_shift;
    if (tok->merge_packed)
        __builtin_prefetch(&tok->merge_packed[h]);
    else
        __builtin_prefetch(&tok->merge_wide[h]);
}

/* Min-heap of (rank << 32 | position): the lowest rank first, then the leftmost. */
static inline void heap_sift_down(uint64_t *h, size_t n, size_t i) {
    uint64_t v = h[i];
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t m = (l + 1 < n && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[m] >= v) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = v;
}

static inline int heap_push(enc_ctx *c, uint64_t v) {
    if (c->heap_n == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 256;
        uint64_t *p = realloc(c->heap, cap * sizeof *p);
        if (!p) return -1;
        c->heap = p;
        c->heap_cap = cap;
    }
    uint64_t *h = c->heap;
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= v) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
    return 0;
}

/* word.rs merge_all: merges by (rank, leftmost position) until no pair has a merge. */
static int merge_all(enc_ctx *c, size_t n) {
    const g4_tokenizer *tok = c->tok;
    int32_t *id = c->sym_id, *prev = c->sym_prev, *next = c->sym_next;
    const uint32_t *tri = tok->merge_triples;
    if (n < 2 || !tok->n_merges) return 0;
    if (c->heap_cap < n) {
        uint64_t *p = realloc(c->heap, n * sizeof *p);
        if (!p) return -1;
        c->heap = p;
        c->heap_cap = n;
    }
    size_t hn = 0;
    enum { AHEAD = 8 };
    for (size_t i = 0; i + 1 < n && i < AHEAD; i++) merge_prefetch(tok, (uint32_t)id[i], (uint32_t)id[i + 1]);
    for (size_t i = 0; i + 1 < n; i++) {
        if (i + AHEAD + 1 < n) merge_prefetch(tok, (uint32_t)id[i + AHEAD], (uint32_t)id[i + AHEAD + 1]);
        int64_t rank = merge_rank(tok, (uint32_t)id[i], (uint32_t)id[i + 1]);
        if (rank >= 0) c->heap[hn++] = ((uint64_t)rank << 32) | i;
    }
    for (size_t i = hn / 2; i-- > 0;) heap_sift_down(c->heap, hn, i);
    c->heap_n = hn;
    while (c->heap_n) {
        uint64_t top = c->heap[0];
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(top & 0xffffffffu);
        int32_t right = id[pos] >= 0 ? next[pos] : -1; /* absorbed, or the last symbol: stale */
        int32_t new_id = -1, p = -1, rr = -1;
        if (right >= 0) {
            const uint32_t *t = tri + 3 * (size_t)rank;
            new_id = (int32_t)t[2];
            if ((uint32_t)id[pos] != t[0] || (uint32_t)id[right] != t[1]) {
                /* the pair changed; HF still merges when the new pair maps to the same token */
                int64_t r2 = merge_rank(tok, (uint32_t)id[pos], (uint32_t)id[right]);
                if (r2 < 0 || tri[3 * (size_t)r2 + 2] != (uint32_t)new_id) new_id = -1;
            }
            if (new_id >= 0) {
                p = prev[pos];
                rr = next[right];
                if (p >= 0) merge_prefetch(tok, (uint32_t)id[p], (uint32_t)new_id);
                if (rr >= 0) merge_prefetch(tok, (uint32_t)new_id, (uint32_t)id[rr]);
            }
        }
        c->heap[0] = c->heap[--c->heap_n];
        if (c->heap_n) heap_sift_down(c->heap, c->heap_n, 0);
        if (new_id < 0) continue;
        id[pos] = new_id;
        id[right] = -1;
        next[pos] = rr;
        if (rr >= 0) prev[rr] = pos;
        int64_t r;
        if (p >= 0 && (r = merge_rank(tok, (uint32_t)id[p], (uint32_t)new_id)) >= 0)
            if (heap_push(c, ((uint64_t)r << 32) | (uint32_t)p)) return -1;
        if (rr >= 0 && (r = merge_rank(tok, (uint32_t)new_id, (uint32_t)id[rr])) >= 0)
            if (heap_push(c, ((uint64_t)r << 32) | (uint32_t)pos)) return -1;
    }
    return 0;
}

static inline size_t utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Vocabulary id of the character s[0..k) (k = its UTF-8 length), -1 if none. */
static inline int32_t char_id(const g4_tokenizer *tok, const unsigned char *s, size_t k) {
    uint32_t cp;
    switch (k) {
    case 1:
        return tok->bmp_id[s[0]];
    case 2:
        cp = ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return tok->bmp_id[cp];
    case 3:
        cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return tok->bmp_id[cp];
    default:
        return tok_vocab_get(tok, (const char *)s, k);
    }
}

/* bpe/model.rs merge_word for one word (or one chunk of it). */
static int bpe_chunk(enc_ctx *c, const char *word, size_t n) {
    const g4_tokenizer *tok = c->tok;
    if (n > 0x7fffffff) return g4_fail(c->err, "text piece too long (%zu bytes)", n);
    if (sym_reserve(c, n)) return g4_fail(c->err, "out of memory");
    int32_t *id = c->sym_id;
    size_t ns = 0;
    int have_unk = 0;
    int plain = !tok->cont_prefix && !tok->eow_suffix;
    const unsigned char *s = (const unsigned char *)word;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(s[i]);
        const unsigned char *piece = s + i;
        size_t plen = k;
        int32_t tid;
        if (plain) {
            tid = char_id(tok, piece, k);
        } else {
            tbuf *b = &c->scratch;
            b->n = 0;
            if ((i > 0 && tok->cont_prefix && tbuf_add(b, tok->cont_prefix, strlen(tok->cont_prefix))) ||
                tbuf_add(b, (const char *)piece, k) ||
                (i + k == n && tok->eow_suffix && tbuf_add(b, tok->eow_suffix, strlen(tok->eow_suffix))))
                return g4_fail(c->err, "out of memory");
            piece = (const unsigned char *)b->p;
            plen = b->n;
            tid = tok_vocab_get(tok, b->p, b->n);
        }
        i += k;
        if (tid >= 0) {
            if (have_unk) {
                id[ns++] = tok->unk_id;
                have_unk = 0;
            }
            id[ns++] = tid;
            continue;
        }
        if (tok->byte_fallback) {
            size_t j = 0;
            while (j < plen && tok->byte_id[piece[j]] >= 0) j++;
            if (j == plen) {
                if (sym_reserve(c, ns + plen + (n - i) + 1)) return g4_fail(c->err, "out of memory");
                id = c->sym_id;
                /* as in HF, a pending unknown is not flushed before byte tokens */
                for (j = 0; j < plen; j++) id[ns++] = tok->byte_id[piece[j]];
                continue;
            }
        }
        if (!tok->has_unk) continue; /* unknown character without unk_token: dropped */
        if (tok->unk_id < 0)
            return g4_fail(c->err, "the unk_token '%s' is not in the vocabulary", tok->unk_token);
        if (have_unk && !tok->fuse_unk) id[ns++] = tok->unk_id;
        have_unk = 1;
    }
    if (have_unk) id[ns++] = tok->unk_id;
    for (size_t i = 0; i < ns; i++) {
        c->sym_prev[i] = (int32_t)i - 1;
        c->sym_next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    if (merge_all(c, ns)) return g4_fail(c->err, "out of memory");
    size_t count = 0;
    for (int32_t i = ns ? 0 : -1; i >= 0; i = c->sym_next[i]) count++;
    if (tokens_reserve(c->out, count)) return g4_fail(c->err, "out of memory");
    for (int32_t i = ns ? 0 : -1; i >= 0; i = c->sym_next[i]) c->out->ids[c->out->n++] = c->sym_id[i];
    return 0;
}

static int cache_grow(enc_ctx *c) {
    size_t cap = c->ccap ? c->ccap * 2 : 1024;
    cache_ent *t = calloc(cap, sizeof *t);
    if (!t) return -1;
    for (size_t i = 0; i < c->ccap; i++) {
        if (!c->ctab[i].key_len) continue;
        size_t h = c->ctab[i].hash & (cap - 1);
        int probes = 0;
        while (t[h].key_len && probes++ < CACHE_MAX_PROBES) h = (h + 1) & (cap - 1);
        if (!t[h].key_len) t[h] = c->ctab[i]; /* else dropped */
    }
    free(c->ctab);
    c->ctab = t;
    c->ccap = cap;
    return 0;
}

/* A chunk through the per-call cache. */
static int bpe_cached(enc_ctx *c, const char *s, size_t n) {
    if (n > CACHE_MAX_KEY) return bpe_chunk(c, s, n);
    uint64_t hash = tok_hash_bytes(s, n, c->cseed);
    size_t slot = 0;
    int probes = 0;
    if (c->ccap) {
        for (slot = hash & (c->ccap - 1); c->ctab[slot].key_len; slot = (slot + 1) & (c->ccap - 1)) {
            if (++probes > CACHE_MAX_PROBES) return bpe_chunk(c, s, n); /* not cached */
            const cache_ent *e = &c->ctab[slot];
            if (e->hash == hash && e->key_len == n && !memcmp(c->ckeys.p + e->key_off, s, n)) {
                if (tokens_reserve(c->out, e->ids_n)) return g4_fail(c->err, "out of memory");
                memcpy(c->out->ids + c->out->n, c->cids + e->ids_off, e->ids_n * sizeof *c->cids);
                c->out->n += e->ids_n;
                return 0;
            }
        }
    }
    size_t before = c->out->n;
    if (bpe_chunk(c, s, n)) return -1;
    if (c->cn >= CACHE_MAX_ENTRIES) return 0;
    size_t k = c->out->n - before;
    if ((c->cn + 1) * 2 > c->ccap) {
        if (cache_grow(c)) return 0; /* no cache: still correct */
        probes = 0;
        for (slot = hash & (c->ccap - 1); c->ctab[slot].key_len; slot = (slot + 1) & (c->ccap - 1))
            if (++probes > CACHE_MAX_PROBES) return 0;
    }
    if (c->cids_n + k > c->cids_cap) {
        size_t cap = c->cids_cap ? c->cids_cap * 2 : 4096;
        while (cap < c->cids_n + k) cap *= 2;
        int32_t *p = realloc(c->cids, cap * sizeof *p);
        if (!p) return 0;
        c->cids = p;
        c->cids_cap = cap;
    }
    size_t key_off = c->ckeys.n;
    if (c->ckeys.n + n >= UINT32_MAX || c->cids_n + k >= UINT32_MAX || tbuf_add(&c->ckeys, s, n)) return 0;
    if (k) memcpy(c->cids + c->cids_n, c->out->ids + before, k * sizeof *c->cids); /* (cids may be NULL yet) */
    c->ctab[slot] = (cache_ent){hash, (uint32_t)key_off, (uint32_t)n, (uint32_t)c->cids_n, (uint32_t)k};
    c->cids_n += k;
    c->cn++;
    return 0;
}

static int forbidden_before_sep(const g4_tokenizer *tok, uint32_t cp) {
    size_t lo = 0, hi = tok->n_chunk_forbidden;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (tok->chunk_forbidden[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < tok->n_chunk_forbidden && tok->chunk_forbidden[lo] == cp;
}

/* bpe/model.rs tokenize for one word: cut into chunks no merge can cross (see chunk_ok). */
static int bpe_word(enc_ctx *c, const char *word, size_t n) {
    const g4_tokenizer *tok = c->tok;
    if (!n) return 0;
    if (tok->ignore_merges) {
        int32_t id = tok_vocab_get(tok, word, n);
        if (id >= 0) return g4_tokens_push(c->out, id) ? g4_fail(c->err, "out of memory") : 0;
    }
    if (!tok->chunk_ok) return bpe_chunk(c, word, n);
    const unsigned char *s = (const unsigned char *)word;
    const char *sep = tok->chunk_sep;
    size_t sl = tok->chunk_sep_len, start = 0;
    for (size_t j = 1; j + sl <= n;) {
        const char *hit = memchr(word + j, sep[0], n - j - sl + 1);
        if (!hit) break;
        j = (size_t)(hit - word);
        if (memcmp(hit, sep, sl)) {
            j++;
            continue;
        }
        size_t q = j;
        do q--;
        while (q > 0 && (s[q] & 0xC0) == 0x80);
        uint32_t cp;
        size_t k = tok_utf8_decode(s + q, j - q, &cp);
        int token = k == 1 || k == 2 || k == 3 ? tok->bmp_id[cp] >= 0 : k == 4 && tok_vocab_get(tok, word + q, 4) >= 0;
        if (j > start && cp != tok->chunk_sep_cp && token && !forbidden_before_sep(tok, cp)) {
            if (bpe_cached(c, word + start, j - start)) return -1;
            start = j;
        }
        j += sl;
    }
    return bpe_cached(c, word + start, n - start);
}

/* --------------------------------------------------------------- pre-tokenizer */

typedef struct seg {
    size_t start, end;
    int flag; /* is_match in the first list, "remove" in the second */
} seg;

static int pretok_apply(enc_ctx *c, size_t k, const char *s, size_t n);

static int split_pieces(enc_ctx *c, size_t k, const char *s, size_t n) {
    const tok_pretok_op *op = &c->tok->pretok[k];
    const char *hit = n >= op->pattern_len ? memmem(s, n, op->pattern, op->pattern_len) : NULL;
    if (!hit) return pretok_apply(c, k + 1, s, n); /* no match: the piece stays whole */
    /* matches / non-matches, as Pattern::find_matches gives them */
    size_t cap = 16, m = 0;
    seg *segs = malloc(cap * sizeof *segs);
    if (!segs) return g4_fail(c->err, "out of memory");
    size_t prev = 0;
    while (hit) {
        size_t a = (size_t)(hit - s), b = a + op->pattern_len;
        if (m + 2 > cap) {
            cap *= 2;
            seg *p = realloc(segs, cap * sizeof *segs);
            if (!p) {
                free(segs);
                return g4_fail(c->err, "out of memory");
            }
            segs = p;
        }
        if (prev != a) segs[m++] = (seg){prev, a, 0};
        segs[m++] = (seg){a, b, 1};
        prev = b;
        hit = n - b >= op->pattern_len ? memmem(s + b, n - b, op->pattern, op->pattern_len) : NULL;
    }
    if (m + 1 > cap) {
        seg *p = realloc(segs, (cap + 1) * sizeof *segs);
        if (!p) {
            free(segs);
            return g4_fail(c->err, "out of memory");
        }
        segs = p;
    }
    if (prev != n) segs[m++] = (seg){prev, n, 0};

    /* fold by behavior (normalizer.rs NormalizedString::split); out[] reuses segs in place
     * except for MergedWithNext, which folds from the right */
    size_t q = 0;
    int prev_match = 0;
    switch (op->behavior) {
    case TOK_SPLIT_REMOVED: /* the matches keep flag 1 and are dropped below */
        q = m;
        break;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < m; i++) segs[i].flag = 0;
        q = m;
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < m; i++) {
            seg g = segs[i];
            if (g.flag && !prev_match) {
                if (q)
                    segs[q - 1].end = g.end;
                else
                    segs[q++] = (seg){g.start, g.end, 0};
            } else {
                segs[q++] = (seg){g.start, g.end, 0};
            }
            prev_match = g.flag;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* right to left into the tail of the array, then used from there */
        size_t w = m;
        for (size_t i = m; i-- > 0;) {
            seg g = segs[i];
            if (g.flag && !prev_match) {
                if (w < m)
                    segs[w].start = g.start;
                else
                    segs[--w] = (seg){g.start, g.end, 0};
            } else {
                segs[--w] = (seg){g.start, g.end, 0};
            }
            prev_match = g.flag;
        }
        memmove(segs, segs + w, (m - w) * sizeof *segs);
        q = m - w;
        break;
    }
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < m; i++) {
            seg g = segs[i];
            if (g.flag == prev_match && q)
                segs[q - 1].end = g.end;
            else
                segs[q++] = (seg){g.start, g.end, 0};
            prev_match = g.flag;
        }
        break;
    }
    int rc = 0;
    for (size_t i = 0; i < q && rc == 0; i++) {
        if (segs[i].flag || segs[i].end == segs[i].start) continue;
        rc = pretok_apply(c, k + 1, s + segs[i].start, segs[i].end - segs[i].start);
    }
    free(segs);
    return rc;
}

static int pretok_apply(enc_ctx *c, size_t k, const char *s, size_t n) {
    if (!n) return 0;
    if (k >= c->tok->n_pretok) return bpe_word(c, s, n);
    return split_pieces(c, k, s, n);
}

/* -------------------------------------------------------------- added tokens */

typedef int (*plain_fn)(enc_ctx *c, const char *s, size_t n);

static size_t prev_char_start(const unsigned char *s, size_t i) {
    do i--;
    while (i > 0 && (s[i] & 0xC0) == 0x80);
    return i;
}

/* added_vocabulary.rs find_matches + split_with_indices: emits matched tokens and hands
 * the text between them to `plain`. */
static int split_added(enc_ctx *c, const tok_trie *trie, const char *text, size_t n, plain_fn plain) {
    const g4_tokenizer *tok = c->tok;
    if (trie->empty) return plain(c, text, n);
    const unsigned char *s = (const unsigned char *)text;
    size_t start_offset = 0, search = 0;
    while (search < n) {
        size_t p = search, ml = 0;
        int32_t idx = -1;
        for (; p < n; p++) {
            if (!trie->root[s[p]]) continue;
            idx = tok_trie_longest(trie, s + p, n - p, &ml);
            if (idx >= 0) break;
        }
        if (idx < 0) break;
        size_t start = p, stop = p + ml;
        search = stop;
        const tok_added *a = &tok->added[idx];
        if (a->single_word) {
            uint32_t cp;
            int start_space = 1, stop_space = 1;
            if (start > 0) {
                size_t q = prev_char_start(s, start);
                if (tok_utf8_decode(s + q, start - q, &cp) && tok_is_word_char(cp)) start_space = 0;
            }
            if (stop < n && tok_utf8_decode(s + stop, n - stop, &cp) && tok_is_word_char(cp)) stop_space = 0;
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t q = prev_char_start(s, ns);
                uint32_t cp;
                if (!tok_utf8_decode(s + q, ns - q, &cp) || !tok_is_white_space(cp)) break;
                ns = q;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            uint32_t cp;
            size_t k;
            while (stop < n && (k = tok_utf8_decode(s + stop, n - stop, &cp)) && tok_is_white_space(cp)) stop += k;
        }
        if (start_offset < start && plain(c, text + start_offset, start - start_offset)) return -1;
        if (g4_tokens_push(c->out, a->id)) return g4_fail(c->err, "out of memory");
        start_offset = stop;
    }
    if (start_offset < n) return plain(c, text + start_offset, n - start_offset);
    return 0;
}

static int plain_normalized(enc_ctx *c, const char *s, size_t n) {
    return pretok_apply(c, 0, s, n);
}

static int plain_raw(enc_ctx *c, const char *s, size_t n) {
    const char *ns = s;
    size_t nn = n;
    int rc = c->tok->n_norm ? normalize(c->tok, s, n, c->norm, &ns, &nn) : 0;
    if (rc == -2)
        return g4_fail(c->err, "the tokenizer's normalizer makes the text more than %d times longer", TOK_MAX_GROWTH);
    if (rc) return g4_fail(c->err, "out of memory");
    if (!nn) return 0;
    return split_added(c, &c->tok->trie_norm, ns, nn, plain_normalized);
}

int g4_tokenize(const g4_tokenizer *tok, const char *text, size_t len, int add_bos, g4_tokens *out,
                g4_error *err) {
    G4_ARG(tok, err);
    G4_ARG(out, err);
    if (!text && len) return g4_fail(err, "no text");
    size_t bad = tok_utf8_validate(text, len);
    if (bad < len) return g4_fail(err, "the text is not valid UTF-8 (byte %zu)", bad);
    size_t n0 = out->n;
    enc_ctx c;
    memset(&c, 0, sizeof c);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t where[2] = {(uint64_t)(uintptr_t)&c, (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 32)};
    c.cseed = tok_hash_bytes(where, sizeof where, 0); /* differs by call and process */
    c.tok = tok;
    c.out = out;
    c.err = err;
    int rc = 0;
    if (tokens_reserve(out, len / 3 + 8)) rc = g4_fail(err, "out of memory");
    if (add_bos)
        for (size_t i = 0; i < tok->n_prefix && !rc; i++)
            if (g4_tokens_push(out, tok->prefix_ids[i])) rc = g4_fail(err, "out of memory");
    if (!rc && len) rc = split_added(&c, &tok->trie_raw, text, len, plain_raw);
    if (add_bos)
        for (size_t i = 0; i < tok->n_suffix && !rc; i++)
            if (g4_tokens_push(out, tok->suffix_ids[i])) rc = g4_fail(err, "out of memory");
    free(c.norm[0].p);
    free(c.norm[1].p);
    free(c.scratch.p);
    free(c.sym_id);
    free(c.sym_prev);
    free(c.sym_next);
    free(c.heap);
    free(c.ctab);
    free(c.ckeys.p);
    free(c.cids);
    if (rc) out->n = n0;
    return rc;
}
