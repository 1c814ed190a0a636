/* Decoding: ids -> pieces -> decoder chain (the decoders of `tokenizers`), batch and
 * streaming. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tok_internal.h"

typedef struct dbuf {
    char *p;
    size_t n, cap;
} dbuf;

static int dbuf_add(dbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* A list of strings stored in one arena. */
typedef struct slist {
    dbuf arena;
    size_t *off, *len;
    size_t n, cap;
} slist;

static int slist_add(slist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *o = realloc(l->off, cap * sizeof *o);
        if (!o) return -1;
        l->off = o;
        size_t *q = realloc(l->len, cap * sizeof *q);
        if (!q) return -1;
        l->len = q;
        l->cap = cap;
    }
    l->off[l->n] = l->arena.n;
    l->len[l->n] = n;
    l->n++;
    return dbuf_add(&l->arena, s, n);
}

/* Appends to the last item (which must be the last thing in the arena). */
static int slist_extend_last(slist *l, const char *s, size_t n) {
    l->len[l->n - 1] += n;
    return dbuf_add(&l->arena, s, n);
}

static void slist_reset(slist *l) {
    l->n = 0;
    l->arena.n = 0;
}

static void slist_free(slist *l) {
    free(l->arena.p);
    free(l->off);
    free(l->len);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ByteFallback's test: exactly 6 bytes "<0x" HH ">" where HH parses as a base-16 u8
 * (Rust's from_str_radix also takes a leading '+'). */
static int bf_byte(const char *s, size_t n, unsigned *val) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    int a = hexval(s[3]), b = hexval(s[4]);
    if (s[3] == '+' && b >= 0) {
        *val = (unsigned)b;
        return 1;
    }
    if (a < 0 || b < 0) return 0;
    *val = (unsigned)(a * 16 + b);
    return 1;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static int flush_bytes(slist *out, dbuf *bytes) {
    if (!bytes->n) return 0;
    int rc = 0;
    if (tok_utf8_validate(bytes->p, bytes->n) == bytes->n)
        rc = slist_add(out, bytes->p, bytes->n);
    else
        for (size_t i = 0; i < bytes->n && !rc; i++) rc = slist_add(out, REPLACEMENT, 3);
    bytes->n = 0;
    return rc;
}

/* One decoder step: in -> out (failing once out holds more than limit bytes). */
static int apply_op(const tok_dec_op *op, const slist *in, slist *out, dbuf *bytes, size_t limit) {
    slist_reset(out);
    const char *base = in->arena.p;
    switch (op->type) {
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = base + in->off[i], *end = s + in->len[i];
            if (slist_add(out, "", 0)) return -1;
            const char *hit;
            while ((size_t)(end - s) >= op->pattern_len && (hit = memmem(s, (size_t)(end - s), op->pattern, op->pattern_len))) {
                if (slist_extend_last(out, s, (size_t)(hit - s)) || slist_extend_last(out, op->content, op->content_len) ||
                    out->arena.n > limit)
                    return -1;
                s = hit + op->pattern_len;
            }
            if (slist_extend_last(out, s, (size_t)(end - s))) return -1;
        }
        return 0;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *s = base + in->off[i];
            size_t a = 0, b = in->len[i], cl = op->content_len;
            for (size_t k = 0; k < op->start && b - a >= cl && !memcmp(s + a, op->content, cl); k++) a += cl;
            for (size_t k = 0; k < op->stop && b - a >= cl && !memcmp(s + b - cl, op->content, cl); k++) b -= cl;
            if (slist_add(out, s + a, b - a)) return -1;
        }
        return 0;
    case TOK_DEC_FUSE:
        if (slist_add(out, "", 0)) return -1;
        for (size_t i = 0; i < in->n; i++)
            if (slist_extend_last(out, base + in->off[i], in->len[i])) return -1;
        return 0;
    case TOK_DEC_BYTE_FALLBACK:
        bytes->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            unsigned v;
            if (bf_byte(base + in->off[i], in->len[i], &v)) {
                char c = (char)v;
                if (dbuf_add(bytes, &c, 1)) return -1;
                continue;
            }
            if (flush_bytes(out, bytes) || slist_add(out, base + in->off[i], in->len[i])) return -1;
        }
        return flush_bytes(out, bytes);
    }
    return -1;
}

/* Runs ops [lo, hi) of the chain over the tokens; the result list ends in *res (one of a/b).
 * -1: out of memory; -2: the text grew past tok_growth_limit. */
static int run_ops(const g4_tokenizer *tok, size_t lo, size_t hi, slist *a, slist *b, dbuf *bytes, slist **res) {
    slist *cur = a, *nxt = b;
    size_t limit = tok_growth_limit(a->arena.n, 0);
    for (size_t k = lo; k < hi; k++) {
        if (apply_op(&tok->dec[k], cur, nxt, bytes, limit)) return nxt->arena.n > limit ? -2 : -1;
        slist *t = cur;
        cur = nxt;
        nxt = t;
    }
    *res = cur;
    return 0;
}

typedef struct dec_work {
    slist a, b;
    dbuf bytes;
} dec_work;

static void dec_work_free(dec_work *w) {
    slist_free(&w->a);
    slist_free(&w->b);
    free(w->bytes.p);
}

/* Decodes the tokens (ids already checked and filtered) and appends the text to out. */
static int decode_ids(const g4_tokenizer *tok, const int32_t *ids, size_t n, dec_work *w, dbuf *out) {
    if (!tok->has_decoder) {
        for (size_t i = 0; i < n; i++)
            if ((i && dbuf_add(out, " ", 1)) || dbuf_add(out, tok->id_str[ids[i]], tok->id_len[ids[i]])) return -1;
        return 0;
    }
    slist_reset(&w->a);
    for (size_t i = 0; i < n; i++)
        if (slist_add(&w->a, tok->id_str[ids[i]], tok->id_len[ids[i]])) return -1;
    slist *res;
    int rc = run_ops(tok, 0, tok->n_dec, &w->a, &w->b, &w->bytes, &res);
    if (rc) return rc;
    for (size_t i = 0; i < res->n; i++)
        if (dbuf_add(out, res->arena.p + res->off[i], res->len[i])) return -1;
    return 0;
}

int g4_tokenizer_token_bytes(const g4_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= tok->n_ids || !tok->id_str[id] || !cap) return -1;
    char work[2][1024];
    size_t n = strlen(tok->id_str[id]);
    if (n >= sizeof work[0]) return -1;
    memcpy(work[0], tok->id_str[id], n);
    int cur = 0, fused = 0;
    for (size_t k = 0; k < tok->n_dec; k++) {
        const tok_dec_op *op = &tok->dec[k];
        const char *s = work[cur];
        char *o = work[!cur];
        size_t m = 0;
        unsigned v;
        switch (op->type) {
        case TOK_DEC_REPLACE:
            for (size_t i = 0; i < n;) {
                if (op->pattern_len && i + op->pattern_len <= n && !memcmp(s + i, op->pattern, op->pattern_len)) {
                    if (m + op->content_len >= sizeof work[0]) return -1;
                    memcpy(o + m, op->content, op->content_len);
                    m += op->content_len;
                    i += op->pattern_len;
                } else {
                    if (m + 1 >= sizeof work[0]) return -1;
                    o[m++] = s[i++];
                }
            }
            n = m;
            cur = !cur;
            break;
        case TOK_DEC_BYTE_FALLBACK:
            if (bf_byte(s, n, &v)) work[cur][0] = (char)v, n = 1;
            break;
        case TOK_DEC_FUSE: fused = 1; break;
        case TOK_DEC_STRIP: /* per token only before the tokens are fused into one text */
            if (!fused) {
                size_t a = 0, b = n, cl = op->content_len;
                for (size_t q = 0; q < op->start && b - a >= cl && !memcmp(s + a, op->content, cl); q++) a += cl;
                for (size_t q = 0; q < op->stop && b - a >= cl && !memcmp(s + b - cl, op->content, cl); q++) b -= cl;
                memmove(work[cur], s + a, b - a);
                n = b - a;
            }
            break;
        }
    }
    if (n > cap) return -1;
    memcpy(buf, work[cur], n);
    return (int)n;
}

/* The message of decode_ids' failure rc (-1 / -2). */
static int decode_failure(g4_error *err, int rc) {
    if (rc == -2) return g4_fail(err, "the tokenizer's decoder makes the text more than %d times longer", TOK_MAX_GROWTH);
    return g4_fail(err, "out of memory");
}

static int check_id(const g4_tokenizer *tok, int32_t id, g4_error *err) {
    if (id < 0 || id >= tok->n_ids)
        return g4_fail(err, "token id %d is out of range (vocabulary size %d)", id, tok->n_ids);
    if (!tok->id_str[id]) return g4_fail(err, "token id %d is not in the vocabulary", id);
    return 0;
}

int g4_detokenize(const g4_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **out,
                  size_t *len, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    if (len) *len = 0;
    G4_ARG(tok, err);
    if (n && !ids) return g4_fail(err, "g4_detokenize: ids is NULL (%zu ids)", n);
    for (size_t i = 0; i < n; i++)
        if (check_id(tok, ids[i], err)) return -1;
    int32_t *kept = malloc((n ? n : 1) * sizeof *kept);
    if (!kept) return g4_fail(err, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!(skip_special && (tok->id_flags[ids[i]] & TOK_ID_SPECIAL))) kept[m++] = ids[i];
    dec_work w;
    memset(&w, 0, sizeof w);
    dbuf res = {0};
    int rc = decode_ids(tok, kept, m, &w, &res);
    if (!rc) rc = dbuf_add(&res, "", 0);
    free(kept);
    dec_work_free(&w);
    if (rc) {
        free(res.p);
        return decode_failure(err, rc);
    }
    *out = res.p;
    if (len) *len = res.n;
    return 0;
}

/* ------------------------------------------------------------------ streaming */

struct g4_detok_stream {
    const g4_tokenizer *tok;
    int skip_special;
    int32_t *pending;
    size_t n_pending, cap_pending;
    int emitted_any;
    dec_work w;
    dbuf out;
};

g4_detok_stream *g4_detok_stream_new(const g4_tokenizer *tok, int skip_special) {
    if (!tok) return NULL;
    g4_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->tok = tok;
    s->skip_special = skip_special;
    return s;
}

void g4_detok_stream_free(g4_detok_stream *s) {
    if (!s) return;
    free(s->pending);
    dec_work_free(&s->w);
    free(s->out.p);
    free(s);
}

static int pending_push(g4_detok_stream *s, int32_t id) {
    if (s->n_pending == s->cap_pending) {
        size_t cap = s->cap_pending ? s->cap_pending * 2 : 16;
        int32_t *p = realloc(s->pending, cap * sizeof *p);
        if (!p) return -1;
        s->pending = p;
        s->cap_pending = cap;
    }
    s->pending[s->n_pending++] = id;
    return 0;
}

/* Whether ByteFallback will see this token as a byte (after the steps before it). */
static int is_fallback_byte(g4_detok_stream *s, int32_t id) {
    const g4_tokenizer *tok = s->tok;
    if (tok->dec_bf_index >= tok->n_dec) return 0;
    unsigned v;
    if (tok->dec_bf_index == 0) return bf_byte(tok->id_str[id], tok->id_len[id], &v);
    slist_reset(&s->w.a);
    if (slist_add(&s->w.a, tok->id_str[id], tok->id_len[id])) return -1;
    slist *res;
    if (run_ops(tok, 0, tok->dec_bf_index, &s->w.a, &s->w.b, &s->w.bytes, &res)) return -1;
    return res->n == 1 && bf_byte(res->arena.p + res->off[0], res->len[0], &v);
}

int g4_detok_stream_push(g4_detok_stream *s, int32_t id, const char **text, size_t *len, g4_error *err) {
    const char *text_unused;
    size_t len_unused;
    if (!text) text = &text_unused;
    if (!len) len = &len_unused;
    *text = "";
    *len = 0;
    G4_ARG(s, err);
    const g4_tokenizer *tok = s->tok;
    s->out.n = 0;
    if (dbuf_add(&s->out, "", 0)) return g4_fail(err, "out of memory");
    *text = s->out.p;
    *len = 0;
    if (check_id(tok, id, err)) return -1;
    if (s->skip_special && (tok->id_flags[id] & TOK_ID_SPECIAL)) return 0;
    int rc = 0;
    switch (tok->stream_mode) {
    case TOK_STREAM_SPACES:
        rc = (s->emitted_any && dbuf_add(&s->out, " ", 1)) || dbuf_add(&s->out, tok->id_str[id], tok->id_len[id]);
        s->emitted_any = 1;
        break;
    case TOK_STREAM_ALL:
        rc = pending_push(s, id);
        break;
    default: {
        int b = is_fallback_byte(s, id);
        if (b < 0 || pending_push(s, id)) {
            rc = -1;
            break;
        }
        if (b) break; /* held until the run of bytes ends */
        rc = decode_ids(tok, s->pending, s->n_pending, &s->w, &s->out);
        s->n_pending = 0;
        break;
    }
    }
    if (rc) return decode_failure(err, rc);
    *text = s->out.p;
    *len = s->out.n;
    return 0;
}

int g4_detok_stream_flush(g4_detok_stream *s, const char **text, size_t *len) {
    const char *text_unused;
    size_t len_unused;
    if (!text) text = &text_unused;
    if (!len) len = &len_unused;
    *text = "";
    *len = 0;
    if (!s) return -1;
    s->out.n = 0;
    int rc = dbuf_add(&s->out, "", 0);
    if (!rc && s->n_pending) rc = decode_ids(s->tok, s->pending, s->n_pending, &s->w, &s->out);
    s->n_pending = 0;
    *text = s->out.p ? s->out.p : "";
    *len = rc ? 0 : s->out.n;
    return rc ? -1 : 0;
}
