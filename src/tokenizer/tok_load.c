/* Loading a tokenizer.json (through the binary cache when it is valid) and
 * tokenizer_config.json. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/json.h"
#include "formats/gguf.h"
#include "core/mapped_file.h"
#include "tokenizer/tok_internal.h"

#define TOK_MAX_ID (1 << 24)

static char *dupn(const char *s, size_t n) {
    char *r = malloc(n + 1);
    if (!r) return NULL;
    if (n) memcpy(r, s, n);
    r[n] = 0;
    return r;
}

/* A short printable excerpt of a token for error messages (cap >= 16). */
static const char *excerpt(const char *s, size_t len, char *buf, size_t cap) {
    size_t j = 0, i = 0;
    for (; i < len && j + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            j += (size_t)snprintf(buf + j, cap - j, "\\x%02x", c);
        else
            buf[j++] = (char)c;
    }
    if (i < len) {
        /* do not end inside a UTF-8 sequence */
        size_t k = j;
        while (k > 0 && ((unsigned char)buf[k - 1] & 0xC0) == 0x80) k--;
        if (k > 0 && (unsigned char)buf[k - 1] >= 0xC0) {
            unsigned char lead = (unsigned char)buf[k - 1];
            size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            if (j - (k - 1) < want) j = k - 1;
        }
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = 0;
    return buf;
}

int32_t tok_vocab_get(const g4_tokenizer *tok, const char *s, size_t len) {
    return tok_strmap_get(&tok->vocab_map, &tok->vocab_tab, s, len);
}

static int json_strn(const json_t *v, const char **s, size_t *len) {
    if (!json_is_string(v)) return -1;
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

/* Optional string field: absent/null -> *s = NULL. */
static int opt_strn(const json_t *obj, const char *key, const char **s, size_t *len, const char *what,
                    g4_error *err) {
    const json_t *v = json_object_get(obj, key);
    *s = NULL;
    *len = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_strn(v, s, len)) return g4_fail(err, "%s: \"%s\" must be a string", what, key);
    return 0;
}

/* ------------------------------------------------------------ vocabulary */

static int degenerate(g4_error *err, const char *what) {
    return g4_fail(err, "tokenizer.json: %s: its hash table has a run of more than %d slots (a file made "
                        "to slow lookups down?)", what, TOK_MAX_RUN);
}

/* size == count * elem, without overflow. */
static int sized(uint64_t size, uint64_t count, uint64_t elem) {
    return count <= UINT64_MAX / elem && size == count * elem;
}

static int build_vocab(g4_tokenizer *tok, uint32_t n_slots, const uint32_t *off, const char *blob,
                       g4_error *err) {
    tok->n_slots = n_slots;
    tok->vocab_tab.off = off;
    tok->vocab_tab.blob = blob;
    uint32_t n = 0;
    for (uint32_t i = 0; i < n_slots; i++) n += off[i + 1] != off[i];
    tok->n_vocab = n;
    if (tok_strmap_init(&tok->vocab_map, n)) return g4_fail(err, "out of memory");
    tok->bmp_id = malloc(65536 * sizeof *tok->bmp_id);
    if (!tok->bmp_id) return g4_fail(err, "out of memory");
    memset(tok->bmp_id, 0xff, 65536 * sizeof *tok->bmp_id);
    for (uint32_t i = 0; i < n_slots; i++) {
        uint32_t a = off[i], b = off[i + 1];
        if (a == b) continue;
        if (tok_strmap_put(&tok->vocab_map, &tok->vocab_tab, i)) return degenerate(err, "model.vocab");
        const unsigned char *s = (const unsigned char *)blob + a;
        size_t len = b - a - 1;
        uint32_t cp;
        if (len && len <= 3 && tok_utf8_decode(s, len, &cp) == len && cp < 65536 &&
            tok->bmp_id[cp] < 0)
            tok->bmp_id[cp] = (int32_t)i;
    }
    if (tok_longest_run(tok->vocab_map.slots, tok->vocab_map.mask + 1, 1, 0) > TOK_MAX_RUN)
        return degenerate(err, "model.vocab");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_id[b] = tok_vocab_get(tok, name, 6);
    }
    return 0;
}

static int build_merges(g4_tokenizer *tok, const uint32_t *triples, size_t n, g4_error *err) {
    const uint32_t *off = tok->vocab_tab.off;
    for (size_t i = 0; i < n * 3; i++) {
        uint32_t id = triples[i];
        if (id >= tok->n_slots || off[id + 1] == off[id])
            return g4_fail(err, "merge %zu refers to id %u, which is not in the vocabulary", i / 3, id);
    }
    size_t cap = 16;
    int bits = 4;
    while (cap < n * 2) {
        cap <<= 1;
        bits++;
    }
    int id_bits = 1, rank_bits = 1;
    while (((uint64_t)1 << id_bits) < tok->n_slots) id_bits++;
    while (((uint64_t)1 << rank_bits) < n) rank_bits++;
    tok->merge_mask = cap - 1;
    tok->merge_shift = 64 - bits;
    tok->merge_triples = triples;
    tok->n_merges = n;
    tok->merge_id_bits = id_bits;
    tok->merge_rank_bits = rank_bits;
    /* the filter: 8+ bits per merge, so most pairs without a merge are rejected without
     * touching the (large) table */
    int fbits = 6;
    while (((uint64_t)1 << fbits) < (uint64_t)n * 8) fbits++;
    tok->merge_filter_shift = 64 - fbits;
    tok->merge_filter = calloc(((size_t)1 << fbits) / 64, sizeof *tok->merge_filter);
    if (!tok->merge_filter) return g4_fail(err, "out of memory");
    if (2 * id_bits + rank_bits <= 63) {
        tok->merge_packed = malloc(cap * sizeof *tok->merge_packed);
        if (!tok->merge_packed) return g4_fail(err, "out of memory");
        memset(tok->merge_packed, 0xff, cap * sizeof *tok->merge_packed);
    } else {
        tok->merge_wide = malloc(cap * sizeof *tok->merge_wide);
        if (!tok->merge_wide) return g4_fail(err, "out of memory");
        memset(tok->merge_wide, 0xff, cap * sizeof *tok->merge_wide);
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t a = triples[3 * i], b = triples[3 * i + 1];
        uint64_t hk = ((a << 32) | b) * 0x9E3779B97F4A7C15ULL;
        uint64_t h = hk >> tok->merge_shift, f = hk >> tok->merge_filter_shift;
        tok->merge_filter[f >> 6] |= (uint64_t)1 << (f & 63);
        /* a repeated pair: the later entry wins, as in HF */
        int probes = 0;
        if (tok->merge_packed) {
            uint64_t kp = (a << id_bits) | b;
            for (;; h = (h + 1) & tok->merge_mask) {
                uint64_t e = tok->merge_packed[h];
                if (e == UINT64_MAX || (e >> rank_bits) == kp) {
                    tok->merge_packed[h] = (kp << rank_bits) | i;
                    break;
                }
                if (++probes > TOK_MAX_RUN) return degenerate(err, "model.merges");
            }
        } else {
            uint64_t key = (a << 32) | b;
            for (;; h = (h + 1) & tok->merge_mask) {
                tok_merge_slot *s = &tok->merge_wide[h];
                if (s->key == UINT64_MAX || s->key == key) {
                    s->key = key;
                    s->rank = i;
                    break;
                }
                if (++probes > TOK_MAX_RUN) return degenerate(err, "model.merges");
            }
        }
    }
    if (tok->merge_packed ? tok_longest_run(tok->merge_packed, cap, 1, UINT64_MAX) > TOK_MAX_RUN
                          : tok_longest_run(&tok->merge_wide->key, cap, 2, UINT64_MAX) > TOK_MAX_RUN)
        return degenerate(err, "model.merges");
    /* the most used merges (BPE ranks follow frequency) in a table that fits in L2 */
    size_t hot_n = n < 16384 ? n : 16384;
    if (tok->merge_packed && hot_n) {
        size_t hcap = 16;
        int hbits = 4;
        while (hcap < hot_n * 2) {
            hcap <<= 1;
            hbits++;
        }
        tok->merge_hot = malloc(hcap * sizeof *tok->merge_hot);
        if (!tok->merge_hot) return g4_fail(err, "out of memory");
        memset(tok->merge_hot, 0xff, hcap * sizeof *tok->merge_hot);
        tok->merge_hot_mask = hcap - 1;
        tok->merge_hot_shift = 64 - hbits;
        for (size_t i = 0; i < hot_n; i++) {
            uint64_t a = triples[3 * i], b = triples[3 * i + 1];
            uint64_t hk = ((a << 32) | b) * 0x9E3779B97F4A7C15ULL;
            uint64_t kp = (a << id_bits) | b, e;
            /* the effective rank (a later duplicate wins) from the full table */
            for (uint64_t h = hk >> tok->merge_shift;; h = (h + 1) & tok->merge_mask) {
                e = tok->merge_packed[h];
                if ((e >> rank_bits) == kp) break;
            }
            if ((e & (((uint64_t)1 << rank_bits) - 1)) != i) continue;
            int probes = 0;
            for (uint64_t h = hk >> tok->merge_hot_shift;; h = (h + 1) & tok->merge_hot_mask) {
                if (tok->merge_hot[h] == UINT64_MAX) {
                    tok->merge_hot[h] = e;
                    break;
                }
                if (++probes > TOK_MAX_RUN) return degenerate(err, "model.merges");
            }
        }
        if (tok_longest_run(tok->merge_hot, hcap, 1, UINT64_MAX) > TOK_MAX_RUN) return degenerate(err, "model.merges");
    }
    return 0;
}

/* ------------------------------------------------------------ model options */

static int parse_model_options(g4_tokenizer *tok, const json_t *model, g4_error *err) {
    const char *what = "tokenizer.json: model";
    const char *type;
    if (g4_json_str(model, "type", &type, what, err)) return -1;
    if (type && strcmp(type, "BPE"))
        return g4_fail(err, "%s: type '%s' is not supported (only BPE)", what, type);
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) {
        if (!json_is_number(dropout)) return g4_fail(err, "%s: \"dropout\" must be a number", what);
        if (json_number_value(dropout) != 0.0)
            return g4_fail(err, "%s: BPE dropout is not supported (it makes encoding random)", what);
    }
    if (g4_json_bool(model, "fuse_unk", 0, &tok->fuse_unk, what, err) ||
        g4_json_bool(model, "byte_fallback", 0, &tok->byte_fallback, what, err) ||
        g4_json_bool(model, "ignore_merges", 0, &tok->ignore_merges, what, err))
        return -1;
    const char *s;
    size_t n;
    free(tok->unk_token);
    free(tok->cont_prefix);
    free(tok->eow_suffix);
    tok->unk_token = tok->cont_prefix = tok->eow_suffix = NULL;
    if (opt_strn(model, "unk_token", &s, &n, what, err)) return -1;
    tok->has_unk = s != NULL;
    if (s && !(tok->unk_token = dupn(s, n))) return g4_fail(err, "out of memory");
    if (opt_strn(model, "continuing_subword_prefix", &s, &n, what, err)) return -1;
    if (s && n && !(tok->cont_prefix = dupn(s, n))) return g4_fail(err, "out of memory");
    if (opt_strn(model, "end_of_word_suffix", &s, &n, what, err)) return -1;
    if (s && n && !(tok->eow_suffix = dupn(s, n))) return g4_fail(err, "out of memory");
    return 0;
}

/* ------------------------------------------------- JSON -> vocab and merges */

typedef struct {
    const char *key;
    size_t len;
} vocab_entry;

static int vocab_from_json(g4_tokenizer *tok, const json_t *vocab, g4_error *err) {
    if (!json_is_object(vocab)) return g4_fail(err, "tokenizer.json: model.vocab must be an object");
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        char buf[80];
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= TOK_MAX_ID)
            return g4_fail(err, "tokenizer.json: model.vocab['%s']: id must be an integer in [0, %d)",
                           excerpt(key, strlen(key), buf, sizeof buf), TOK_MAX_ID);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    uint32_t n_slots = (uint32_t)(max_id + 1);
    vocab_entry *slot = calloc((size_t)n_slots + 1, sizeof *slot);
    if (!slot) return g4_fail(err, "out of memory");
    size_t blob_size = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = json_integer_value(val);
        size_t len = json_object_iter_key_len(json_object_key_to_iter(key));
        if (slot[id].key) {
            char b1[80], b2[80];
            int rc = g4_fail(err, "tokenizer.json: model.vocab: id %lld is given to both '%s' and '%s'",
                             (long long)id, excerpt(slot[id].key, slot[id].len, b1, sizeof b1),
                             excerpt(key, len, b2, sizeof b2));
            free(slot);
            return rc;
        }
        slot[id].key = key;
        slot[id].len = len;
        blob_size += len + 1;
    }
    if (blob_size >= UINT32_MAX) {
        free(slot);
        return g4_fail(err, "tokenizer.json: model.vocab is too large");
    }
    tok->own_off = malloc(((size_t)n_slots + 1) * sizeof *tok->own_off);
    tok->own_blob = malloc(blob_size ? blob_size : 1);
    if (!tok->own_off || !tok->own_blob) {
        free(slot);
        return g4_fail(err, "out of memory");
    }
    uint32_t pos = 0;
    for (uint32_t i = 0; i < n_slots; i++) {
        tok->own_off[i] = pos;
        if (slot[i].key) {
            memcpy(tok->own_blob + pos, slot[i].key, slot[i].len);
            tok->own_blob[pos + slot[i].len] = 0;
            pos += (uint32_t)slot[i].len + 1;
        }
    }
    tok->own_off[n_slots] = pos;
    tok->blob_size = pos;
    free(slot);
    return build_vocab(tok, n_slots, tok->own_off, tok->own_blob, err);
}

static int merges_from_json(g4_tokenizer *tok, const json_t *merges, g4_error *err) {
    if (merges && !json_is_null(merges) && !json_is_array(merges))
        return g4_fail(err, "tokenizer.json: model.merges must be an array");
    size_t n = merges ? json_array_size(merges) : 0;
    tok->own_triples = malloc((n ? n : 1) * 3 * sizeof *tok->own_triples);
    char *joined = NULL;
    size_t joined_cap = 0;
    if (!tok->own_triples) return g4_fail(err, "out of memory");
    size_t prefix_len = tok->cont_prefix ? strlen(tok->cont_prefix) : 0;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            size_t len = json_string_length(m);
            if (len >= 8 && !memcmp(s, "#version", 8)) continue;
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))) {
                char buf[80];
                free(joined);
                return g4_fail(err, "tokenizer.json: model.merges[%zu] '%s' is not two tokens separated by one space",
                               i, excerpt(s, len, buf, sizeof buf));
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = len - al - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   !json_strn(json_array_get(m, 0), &a, &al) &&
                   !json_strn(json_array_get(m, 1), &b, &bl)) {
        } else {
            free(joined);
            return g4_fail(err, "tokenizer.json: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", i);
        }
        char buf[80];
        int32_t ia = tok_vocab_get(tok, a, al), ib = tok_vocab_get(tok, b, bl);
        if (ia < 0 || ib < 0) {
            free(joined);
            return g4_fail(err, "tokenizer.json: model.merges[%zu]: '%s' is not in the vocabulary", i,
                           ia < 0 ? excerpt(a, al, buf, sizeof buf) : excerpt(b, bl, buf, sizeof buf));
        }
        if (bl < prefix_len) {
            free(joined);
            return g4_fail(err, "tokenizer.json: model.merges[%zu]: '%s' is shorter than the continuing_subword_prefix",
                           i, excerpt(b, bl, buf, sizeof buf));
        }
        size_t jl = al + bl - prefix_len;
        if (jl + 1 > joined_cap) {
            joined_cap = (jl + 1) * 2;
            char *nj = realloc(joined, joined_cap);
            if (!nj) {
                free(joined);
                return g4_fail(err, "out of memory");
            }
            joined = nj;
        }
        memcpy(joined, a, al);
        memcpy(joined + al, b + prefix_len, bl - prefix_len);
        int32_t inew = tok_vocab_get(tok, joined, jl);
        if (inew < 0) {
            g4_fail(err, "tokenizer.json: model.merges[%zu]: the merged token '%s' is not in the vocabulary", i,
                    excerpt(joined, jl, buf, sizeof buf));
            free(joined);
            return -1;
        }
        tok->own_triples[3 * kept] = (uint32_t)ia;
        tok->own_triples[3 * kept + 1] = (uint32_t)ib;
        tok->own_triples[3 * kept + 2] = (uint32_t)inew;
        kept++;
    }
    free(joined);
    return build_merges(tok, tok->own_triples, kept, err);
}

/* ------------------------------------------------------------- normalizer */

static int pattern_string(const json_t *obj, const char **s, size_t *len, const char *what,
                          g4_error *err) {
    const json_t *p = json_object_get(obj, "pattern");
    if (!json_is_object(p)) return g4_fail(err, "%s: \"pattern\" must be an object", what);
    const json_t *str = json_object_get(p, "String");
    if (!str) {
        if (json_object_get(p, "Regex"))
            return g4_fail(err, "%s: Regex patterns are not supported", what);
        return g4_fail(err, "%s: \"pattern\" must have a \"String\"", what);
    }
    if (json_strn(str, s, len)) return g4_fail(err, "%s: pattern.String must be a string", what);
    if (!*len) return g4_fail(err, "%s: empty pattern", what);
    return 0;
}

static int grow(void **arr, size_t *n, size_t elem) {
    void *p = realloc(*arr, (*n + 1) * elem);
    if (!p) return -1;
    memset((char *)p + *n * elem, 0, elem);
    *arr = p;
    (*n)++;
    return 0;
}

static int parse_normalizer(g4_tokenizer *tok, const json_t *n, int depth, g4_error *err) {
    const char *what = "tokenizer.json: normalizer";
    if (!n || json_is_null(n)) return 0;
    if (depth > 16) return g4_fail(err, "%s: nested too deeply", what);
    if (!json_is_object(n)) return g4_fail(err, "%s must be an object or null", what);
    const char *type;
    if (g4_json_str(n, "type", &type, what, err)) return -1;
    if (!type) return g4_fail(err, "%s: missing \"type\"", what);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list)) return g4_fail(err, "%s: Sequence needs a \"normalizers\" array", what);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (parse_normalizer(tok, json_array_get(list, i), depth + 1, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
        const char *p = NULL, *c;
        size_t pl = 0, cl;
        int is_replace = type[1] == 'e';
        if (is_replace && pattern_string(n, &p, &pl, what, err)) return -1;
        if (json_strn(json_object_get(n, is_replace ? "content" : "prepend"), &c, &cl))
            return g4_fail(err, "%s: %s needs a \"%s\" string", what, type, is_replace ? "content" : "prepend");
        if (tok->n_norm >= TOK_MAX_STEPS) return g4_fail(err, "%s: more than %d steps", what, TOK_MAX_STEPS);
        if (grow((void **)&tok->norm, &tok->n_norm, sizeof *tok->norm)) return g4_fail(err, "out of memory");
        tok_norm_op *op = &tok->norm[tok->n_norm - 1];
        op->type = is_replace ? TOK_NORM_REPLACE : TOK_NORM_PREPEND;
        if ((p && !(op->pattern = dupn(p, pl))) || !(op->content = dupn(c, cl)))
            return g4_fail(err, "out of memory");
        op->pattern_len = pl;
        op->content_len = cl;
        if (!is_replace) tok->norm_inserted += cl;
        return 0;
    }
    return g4_fail(err, "%s: type '%s' is not supported", what, type);
}

static int parse_pretok(g4_tokenizer *tok, const json_t *n, int depth, g4_error *err) {
    const char *what = "tokenizer.json: pre_tokenizer";
    if (!n || json_is_null(n)) return 0;
    if (depth > 16) return g4_fail(err, "%s: nested too deeply", what);
    if (!json_is_object(n)) return g4_fail(err, "%s must be an object or null", what);
    const char *type;
    if (g4_json_str(n, "type", &type, what, err)) return -1;
    if (!type) return g4_fail(err, "%s: missing \"type\"", what);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "pretokenizers");
        if (!json_is_array(list)) return g4_fail(err, "%s: Sequence needs a \"pretokenizers\" array", what);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (parse_pretok(tok, json_array_get(list, i), depth + 1, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const char *p, *behavior;
        size_t pl;
        int invert;
        if (pattern_string(n, &p, &pl, what, err) || g4_json_str(n, "behavior", &behavior, what, err) ||
            g4_json_bool(n, "invert", 0, &invert, what, err))
            return -1;
        if (invert) return g4_fail(err, "%s: Split with invert=true is not supported", what);
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"};
        int b = -1;
        for (int i = 0; i < 5; i++)
            if (behavior && !strcmp(behavior, names[i])) b = i;
        if (b < 0) return g4_fail(err, "%s: unknown Split behavior '%s'", what, behavior ? behavior : "(none)");
        if (tok->n_pretok >= TOK_MAX_STEPS) return g4_fail(err, "%s: more than %d steps", what, TOK_MAX_STEPS);
        if (grow((void **)&tok->pretok, &tok->n_pretok, sizeof *tok->pretok))
            return g4_fail(err, "out of memory");
        tok_pretok_op *op = &tok->pretok[tok->n_pretok - 1];
        if (!(op->pattern = dupn(p, pl))) return g4_fail(err, "out of memory");
        op->pattern_len = pl;
        op->behavior = b;
        return 0;
    }
    return g4_fail(err, "%s: type '%s' is not supported", what, type);
}

static int parse_decoder(g4_tokenizer *tok, const json_t *n, int depth, g4_error *err) {
    const char *what = "tokenizer.json: decoder";
    if (!n || json_is_null(n)) return 0;
    if (depth > 16) return g4_fail(err, "%s: nested too deeply", what);
    if (!json_is_object(n)) return g4_fail(err, "%s must be an object or null", what);
    tok->has_decoder = 1;
    const char *type;
    if (g4_json_str(n, "type", &type, what, err)) return -1;
    if (!type) return g4_fail(err, "%s: missing \"type\"", what);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "decoders");
        if (!json_is_array(list)) return g4_fail(err, "%s: Sequence needs a \"decoders\" array", what);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (parse_decoder(tok, json_array_get(list, i), depth + 1, err)) return -1;
        return 0;
    }
    tok_dec_op op;
    memset(&op, 0, sizeof op);
    if (!strcmp(type, "Replace")) {
        const char *p, *c;
        size_t pl, cl;
        if (pattern_string(n, &p, &pl, what, err)) return -1;
        if (json_strn(json_object_get(n, "content"), &c, &cl))
            return g4_fail(err, "%s: Replace needs a \"content\" string", what);
        op.type = TOK_DEC_REPLACE;
        op.pattern = dupn(p, pl);
        op.pattern_len = pl;
        op.content = dupn(c, cl);
        op.content_len = cl;
        if (!op.pattern || !op.content) {
            free(op.pattern);
            free(op.content);
            return g4_fail(err, "out of memory");
        }
    } else if (!strcmp(type, "ByteFallback")) {
        op.type = TOK_DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        op.type = TOK_DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        const char *c;
        size_t cl;
        int64_t start, stop;
        if (json_strn(json_object_get(n, "content"), &c, &cl))
            return g4_fail(err, "%s: Strip needs a \"content\" string", what);
        uint32_t cp;
        if (!cl || tok_utf8_decode((const unsigned char *)c, cl, &cp) != cl)
            return g4_fail(err, "%s: Strip content must be one character", what);
        if (g4_json_int(n, "start", 0, &start, what, err) || g4_json_int(n, "stop", 0, &stop, what, err))
            return -1;
        if (start < 0 || stop < 0) return g4_fail(err, "%s: Strip start/stop must be >= 0", what);
        op.type = TOK_DEC_STRIP;
        op.content = dupn(c, cl);
        op.content_len = cl;
        op.start = (size_t)start;
        op.stop = (size_t)stop;
        if (!op.content) return g4_fail(err, "out of memory");
    } else {
        return g4_fail(err, "%s: type '%s' is not supported", what, type);
    }
    if (tok->n_dec >= TOK_MAX_STEPS || grow((void **)&tok->dec, &tok->n_dec, sizeof *tok->dec)) {
        if (tok->n_dec >= TOK_MAX_STEPS) {
            free(op.pattern);
            free(op.content);
            return g4_fail(err, "%s: more than %d steps", what, TOK_MAX_STEPS);
        }
        free(op.pattern);
        free(op.content);
        return g4_fail(err, "out of memory");
    }
    tok->dec[tok->n_dec - 1] = op;
    return 0;
}

static int push_id(int32_t **arr, size_t *n, int32_t id) {
    int32_t *p = realloc(*arr, (*n + 1) * sizeof *p);
    if (!p) return -1;
    p[(*n)++] = id;
    *arr = p;
    return 0;
}

static int parse_template(g4_tokenizer *tok, const json_t *pp, g4_error *err) {
    const char *what = "tokenizer.json: post_processor";
    const json_t *single = json_object_get(pp, "single");
    const json_t *specials = json_object_get(pp, "special_tokens");
    if (!json_is_array(single)) return g4_fail(err, "%s: TemplateProcessing needs a \"single\" array", what);
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *item = json_array_get(single, i);
        const json_t *st = json_object_get(item, "SpecialToken");
        const json_t *seq = json_object_get(item, "Sequence");
        if (seq) {
            const char *id;
            if (g4_json_str(seq, "id", &id, what, err)) return -1;
            if (!id || strcmp(id, "A"))
                return g4_fail(err, "%s: the single template may only hold the sequence A", what);
            if (seen_a) return g4_fail(err, "%s: the single template holds $A twice", what);
            seen_a = 1;
            continue;
        }
        if (!json_is_object(st)) return g4_fail(err, "%s: single[%zu] must be a SpecialToken or a Sequence", what, i);
        const char *name;
        if (g4_json_str(st, "id", &name, what, err)) return -1;
        const json_t *entry = name ? json_object_get(specials, name) : NULL;
        const json_t *ids = json_object_get(entry, "ids");
        if (!json_is_array(ids))
            return g4_fail(err, "%s: special token '%s' has no ids in special_tokens", what, name ? name : "(none)");
        for (size_t k = 0; k < json_array_size(ids); k++) {
            const json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
                return g4_fail(err, "%s: special token '%s': ids must be non-negative integers", what, name);
            if (push_id(seen_a ? &tok->suffix_ids : &tok->prefix_ids, seen_a ? &tok->n_suffix : &tok->n_prefix,
                        (int32_t)json_integer_value(v)))
                return g4_fail(err, "out of memory");
        }
    }
    if (!seen_a) return g4_fail(err, "%s: the single template has no $A", what);
    return 0;
}

static int parse_post_processor(g4_tokenizer *tok, const json_t *pp, int depth, g4_error *err) {
    const char *what = "tokenizer.json: post_processor";
    if (!pp || json_is_null(pp)) return 0;
    if (depth > 16) return g4_fail(err, "%s: nested too deeply", what);
    const char *type;
    if (!json_is_object(pp)) return g4_fail(err, "%s must be an object or null", what);
    if (g4_json_str(pp, "type", &type, what, err)) return -1;
    if (!type) return g4_fail(err, "%s: missing \"type\"", what);
    if (!strcmp(type, "TemplateProcessing")) return parse_template(tok, pp, err);
    if (!strcmp(type, "ByteLevel")) return 0; /* only adjusts offsets */
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list)) return g4_fail(err, "%s: Sequence needs a \"processors\" array", what);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (parse_post_processor(tok, json_array_get(list, i), depth + 1, err)) return -1;
        return 0;
    }
    return g4_fail(err, "%s: type '%s' is not supported", what, type);
}

/* ----------------------------------------------------------- added tokens */

/* tokenizer.json's added_tokens, as listed, into tok->own_added_raw / own_added_blob. */
static int added_raw_from_json(g4_tokenizer *tok, const json_t *arr, g4_error *err) {
    const char *what = "tokenizer.json: added_tokens";
    if (arr && !json_is_null(arr) && !json_is_array(arr)) return g4_fail(err, "%s must be an array", what);
    size_t n = arr && json_is_array(arr) ? json_array_size(arr) : 0;
    size_t blob_size = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *c = json_object_get(json_array_get(arr, i), "content");
        blob_size += (json_is_string(c) ? json_string_length(c) : 0) + 1;
    }
    if (blob_size >= UINT32_MAX) return g4_fail(err, "%s: too large", what);
    tok->own_added_raw = calloc(n + 1, sizeof *tok->own_added_raw);
    tok->own_added_blob = malloc(blob_size + 1);
    if (!tok->own_added_raw || !tok->own_added_blob) return g4_fail(err, "out of memory");
    uint32_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(arr, i);
        char ctx[96];
        snprintf(ctx, sizeof ctx, "%s[%zu]", what, i);
        if (!json_is_object(t)) return g4_fail(err, "%s must be an object", ctx);
        const char *c;
        size_t cl;
        if (json_strn(json_object_get(t, "content"), &c, &cl)) return g4_fail(err, "%s: \"content\" must be a string", ctx);
        int sw, ls, rs, norm, sp;
        if (g4_json_bool(t, "special", 0, &sp, ctx, err) || g4_json_bool(t, "single_word", 0, &sw, ctx, err) ||
            g4_json_bool(t, "lstrip", 0, &ls, ctx, err) || g4_json_bool(t, "rstrip", 0, &rs, ctx, err) ||
            g4_json_bool(t, "normalized", !sp, &norm, ctx, err))
            return -1;
        tok_added_raw *r = &tok->own_added_raw[i];
        r->off = pos;
        r->len = (uint32_t)cl;
        r->special = (uint8_t)sp;
        r->single_word = (uint8_t)sw;
        r->lstrip = (uint8_t)ls;
        r->rstrip = (uint8_t)rs;
        r->normalized = (uint8_t)norm;
        memcpy(tok->own_added_blob + pos, c, cl);
        tok->own_added_blob[pos + cl] = 0;
        pos += (uint32_t)cl + 1;
    }
    tok->n_added_raw = n;
    tok->added_blob_size = pos;
    return 0;
}

/* The added tokens as HF's AddedVocabulary keeps them: the first of equal contents, the
 * vocabulary id when the content is in it, else the next free id; then the lookup map and
 * the two tries. raw[i]'s content is blob + raw[i].off (NUL-terminated, in order). */
static int install_added(g4_tokenizer *tok, const tok_added_raw *raw, size_t n, const char *raw_blob,
                         size_t raw_blob_size, g4_error *err) {
    const char *what = "tokenizer.json: added_tokens";
    tok_added *list = calloc(n + 1, sizeof *list);
    uint32_t *off = calloc(n + 1, sizeof *off);
    const char **content = calloc(n + 1, sizeof *content);
    size_t *clen = calloc(n + 1, sizeof *clen);
    char *blob = malloc(raw_blob_size + 1);
    int rc = -1;
    if (!list || !off || !content || !clen || !blob) {
        g4_fail(err, "out of memory");
        goto done;
    }
    if (raw_blob_size) memcpy(blob, raw_blob, raw_blob_size);
    for (size_t i = 0; i < n; i++) {
        if (raw[i].len > TOK_MAX_ADDED_LEN) {
            g4_fail(err, "%s[%zu]: %u bytes long (at most %d)", what, i, raw[i].len, TOK_MAX_ADDED_LEN);
            goto done;
        }
        off[i] = raw[i].off;
        content[i] = blob + raw[i].off;
        clen[i] = raw[i].len;
        list[i].special = raw[i].special;
        list[i].single_word = raw[i].single_word;
        list[i].lstrip = raw[i].lstrip;
        list[i].rstrip = raw[i].rstrip;
        list[i].normalized = raw[i].normalized;
    }
    off[n] = (uint32_t)raw_blob_size;
    uint32_t pos;
    tok_strtab all = {off, blob};
    tok_strmap first;
    if (tok_strmap_init(&first, n)) {
        g4_fail(err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (tok_strmap_put(&first, &all, (uint32_t)i)) {
            tok_strmap_free(&first);
            degenerate(err, "added_tokens");
            goto done;
        }
    uint8_t *special_any = calloc(n + 1, 1);
    uint8_t *keep = calloc(n + 1, 1);
    if (!special_any || !keep) {
        free(special_any);
        free(keep);
        tok_strmap_free(&first);
        g4_fail(err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (!clen[i]) continue;
        int32_t f = tok_strmap_get(&first, &all, content[i], clen[i]);
        keep[i] = f == (int32_t)i;
        if (list[i].special) special_any[f] = 1;
    }
    tok_strmap_free(&first);

    /* ids: the vocabulary id when the content is in it, else the next free id */
    size_t m = 0;
    int64_t max_added = -1;
    for (size_t i = 0; i < n; i++) {
        if (!keep[i]) continue;
        int32_t id = tok_vocab_get(tok, content[i], clen[i]);
        if (id < 0) {
            int64_t vs = tok->n_vocab;
            int64_t next = max_added < 0 ? vs : ((max_added >= vs || vs == 0) ? max_added + 1 : vs);
            if (next >= TOK_MAX_ID) {
                free(special_any);
                free(keep);
                g4_fail(err, "%s: too many tokens", what);
                goto done;
            }
            id = (int32_t)next;
        }
        if (id > max_added) max_added = id;
        tok_added a = list[i];
        a.id = id;
        a.special = special_any[i];
        a.content = blob + off[i];
        a.len = clen[i];
        list[m++] = a;
    }
    free(special_any);
    free(keep);
    /* compact string table of the kept tokens */
    pos = 0;
    for (size_t i = 0; i < m; i++) {
        size_t len = list[i].len;
        memmove(blob + pos, list[i].content, len);
        blob[pos + len] = 0;
        list[i].content = NULL;
        off[i] = pos;
        pos += (uint32_t)len + 1;
    }
    off[m] = pos;
    for (size_t i = 0; i < m; i++) list[i].content = blob + off[i];
    tok->added = list;
    tok->n_added = m;
    tok->added_off = off;
    tok->added_blob = blob;
    tok->added_tab.off = off;
    tok->added_tab.blob = blob;
    list = NULL;
    off = NULL;
    blob = NULL;
    if (tok_strmap_init(&tok->added_map, m)) {
        g4_fail(err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < m; i++)
        if (tok_strmap_put(&tok->added_map, &tok->added_tab, (uint32_t)i)) {
            degenerate(err, "added_tokens");
            goto done;
        }
    if (tok_longest_run(tok->added_map.slots, tok->added_map.mask + 1, 1, 0) > TOK_MAX_RUN) {
        degenerate(err, "added_tokens");
        goto done;
    }
    for (size_t i = 0; i < m; i++) {
        tok_added *a = &tok->added[i];
        if (!a->normalized) continue;
        a->norm = tok_normalize_alloc(tok, a->content, a->len, &a->norm_len);
        if (!a->norm) {
            g4_fail(err, "%s: normalizing an added token failed (out of memory, or the normalizer makes it more than "
                         "%d times longer)", what, TOK_MAX_GROWTH);
            goto done;
        }
    }
    if (tok_trie_build(&tok->trie_raw, tok->added, m, 0) || tok_trie_build(&tok->trie_norm, tok->added, m, 1)) {
        g4_fail(err, "out of memory");
        goto done;
    }
    rc = 0;
done:
    free(list);
    free(off);
    free(blob);
    free(content);
    free(clen);
    return rc;
}

/* ------------------------------------------------------------- chunking */

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int single_char_token(const g4_tokenizer *tok, uint32_t cp) {
    if (cp < 65536) return tok->bmp_id[cp] >= 0;
    char u[4] = {(char)(0xF0 | (cp >> 18)), (char)(0x80 | ((cp >> 12) & 0x3F)), (char)(0x80 | ((cp >> 6) & 0x3F)),
                 (char)(0x80 | (cp & 0x3F))};
    return tok_vocab_get(tok, u, 4) >= 0;
}

static void set_chunk_sep(g4_tokenizer *tok, uint32_t cp) {
    tok->chunk_sep_cp = cp;
    tok->chunk_sep_len = 0;
    if (cp == 0x2581) {
        memcpy(tok->chunk_sep, "\xE2\x96\x81", 3);
        tok->chunk_sep_len = 3;
    } else if (cp == 0x20) {
        tok->chunk_sep[0] = ' ';
        tok->chunk_sep_len = 1;
    }
}

/* Picks the separator S (U+2581, else U+0020, when it is a token) and collects the
 * characters X that some vocabulary token holds right before S (one pass over the blob). */
static int compute_chunk_data(g4_tokenizer *tok, g4_error *err) {
    uint32_t sep_cp = single_char_token(tok, 0x2581) ? 0x2581 : single_char_token(tok, 0x20) ? 0x20 : 0;
    set_chunk_sep(tok, sep_cp);
    if (!sep_cp) return 0;
    const char *sep = tok->chunk_sep, *blob = tok->vocab_tab.blob;
    size_t sl = tok->chunk_sep_len, size = tok->blob_size, cap = 0, n = 0, piece = 0;
    const uint32_t *off = tok->vocab_tab.off;
    uint32_t *forb = NULL;
    for (const char *hit = size >= sl ? memmem(blob, size, sep, sl) : NULL; hit;
         hit = (size_t)(blob + size - hit - 1) >= sl ? memmem(hit + 1, (size_t)(blob + size - hit - 1), sep, sl) : NULL) {
        size_t pos = (size_t)(hit - blob);
        while (piece < tok->n_slots && off[piece + 1] <= pos) piece++;
        if (piece >= tok->n_slots || off[piece] == pos) continue; /* at the start of a piece */
        const unsigned char *q = (const unsigned char *)hit, *start = (const unsigned char *)blob + off[piece];
        do q--;
        while (q > start && (*q & 0xC0) == 0x80);
        uint32_t cp;
        if (!tok_utf8_decode(q, (size_t)((const unsigned char *)hit - q), &cp)) cp = 0xFFFFFFFFu; /* not text */
        if (cp == sep_cp) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *nf = realloc(forb, cap * sizeof *nf);
            if (!nf) {
                free(forb);
                return g4_fail(err, "out of memory");
            }
            forb = nf;
        }
        forb[n++] = cp;
    }
    if (n) qsort(forb, n, sizeof *forb, cmp_u32);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!m || forb[m - 1] != forb[i]) forb[m++] = forb[i];
    tok->chunk_forbidden = forb;
    tok->n_chunk_forbidden = m;
    return 0;
}

/* Chunking is exact only when every character is looked up alone (no subword prefix or
 * word suffix) and the whole-word lookup of ignore_merges is off. */
static void apply_chunking(g4_tokenizer *tok) {
    tok->chunk_ok = tok->chunk_sep_cp && !tok->cont_prefix && !tok->eow_suffix && !tok->ignore_merges &&
                    getenv("G4_TOKENIZER_NO_CHUNKS") == NULL;
}

/* ------------------------------------------------------------- the rest */

static int configure_rest(g4_tokenizer *tok, const json_t *root, const tok_added_raw *raw, size_t n_raw,
                          const char *raw_blob, size_t raw_blob_size, g4_error *err) {
    if (parse_normalizer(tok, json_object_get(root, "normalizer"), 0, err) ||
        parse_pretok(tok, json_object_get(root, "pre_tokenizer"), 0, err) ||
        install_added(tok, raw, n_raw, raw_blob, raw_blob_size, err) ||
        parse_post_processor(tok, json_object_get(root, "post_processor"), 0, err) ||
        parse_decoder(tok, json_object_get(root, "decoder"), 0, err))
        return -1;

    tok->unk_id = tok->has_unk ? tok_vocab_get(tok, tok->unk_token, strlen(tok->unk_token)) : -1;
    if (!tok->tables_borrowed && compute_chunk_data(tok, err)) return -1;
    apply_chunking(tok);

    /* decoder chain: how the streaming decoder may split it */
    tok->dec_bf_index = tok->n_dec;
    int n_bf = 0, after_fuse = 0, bad = 0;
    for (size_t i = 0; i < tok->n_dec; i++) {
        if (tok->dec[i].type == TOK_DEC_BYTE_FALLBACK) {
            if (!n_bf++) tok->dec_bf_index = i;
        }
        if (after_fuse && tok->dec[i].type != TOK_DEC_FUSE) bad = 1;
        if (tok->dec[i].type == TOK_DEC_FUSE) after_fuse = 1;
    }
    tok->stream_mode = !tok->has_decoder ? TOK_STREAM_SPACES
                       : (bad || n_bf > 1) ? TOK_STREAM_ALL
                                           : TOK_STREAM_GROUPS;

    /* id tables */
    int64_t n_ids = tok->n_slots;
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id + 1 > n_ids) n_ids = tok->added[i].id + 1;
    tok->n_ids = (int32_t)n_ids;
    tok->id_str = calloc((size_t)n_ids + 1, sizeof *tok->id_str);
    tok->id_len = calloc((size_t)n_ids + 1, sizeof *tok->id_len);
    tok->id_flags = calloc((size_t)n_ids + 1, 1);
    if (!tok->id_str || !tok->id_len || !tok->id_flags) return g4_fail(err, "out of memory");
    const uint32_t *off = tok->vocab_tab.off;
    for (uint32_t i = 0; i < tok->n_slots; i++) {
        if (off[i + 1] == off[i]) continue;
        tok->id_str[i] = tok->vocab_tab.blob + off[i];
        tok->id_len[i] = off[i + 1] - off[i] - 1;
        tok->id_flags[i] = TOK_ID_MODEL;
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        /* HF's id_to_token (and so decode) gives a normalized added token's normalized form */
        const tok_added *a = &tok->added[i];
        tok->id_str[a->id] = a->normalized ? a->norm : a->content;
        tok->id_len[a->id] = (uint32_t)(a->normalized ? a->norm_len : a->len);
        tok->id_flags[a->id] |= TOK_ID_ADDED | (a->special ? TOK_ID_SPECIAL : 0);
    }
    for (size_t i = 0; i < tok->n_prefix; i++)
        if (tok->prefix_ids[i] >= tok->n_ids)
            return g4_fail(err, "tokenizer.json: post_processor: id %d is out of the vocabulary", tok->prefix_ids[i]);
    for (size_t i = 0; i < tok->n_suffix; i++)
        if (tok->suffix_ids[i] >= tok->n_ids)
            return g4_fail(err, "tokenizer.json: post_processor: id %d is out of the vocabulary", tok->suffix_ids[i]);
    return 0;
}

/* Cold path: parse the JSON file; *rest gets the compact JSON of everything but the
 * vocabulary and the merges (for the cache) when want_rest. */
/* ------------------------------------------------------------ cache sections */

static void cache_fill(const g4_tokenizer *tok, const char *rest, tok_cache_data *d) {
    memset(d, 0, sizeof *d);
    d->sec[TOK_SEC_VOCAB_OFF] = (tok_cache_sec){tok->vocab_tab.off, ((uint64_t)tok->n_slots + 1) * 4};
    d->sec[TOK_SEC_VOCAB_BLOB] = (tok_cache_sec){tok->vocab_tab.blob, tok->blob_size};
    d->sec[TOK_SEC_MERGES] = (tok_cache_sec){tok->merge_triples, (uint64_t)tok->n_merges * 12};
    d->sec[TOK_SEC_JSON] = (tok_cache_sec){rest, strlen(rest) + 1};
    d->sec[TOK_SEC_ADDED] = (tok_cache_sec){tok->own_added_raw, tok->n_added_raw * sizeof(tok_added_raw)};
    d->sec[TOK_SEC_ADDED_BLOB] = (tok_cache_sec){tok->own_added_blob, tok->added_blob_size};
    d->sec[TOK_SEC_VOCAB_MAP] = (tok_cache_sec){tok->vocab_map.slots, (tok->vocab_map.mask + 1) * 8};
    d->sec[TOK_SEC_BMP] = (tok_cache_sec){tok->bmp_id, 65536 * 4};
    uint64_t cap = tok->merge_mask + 1;
    d->sec[TOK_SEC_MERGE_MAIN] = tok->merge_packed ? (tok_cache_sec){tok->merge_packed, cap * 8}
                                               : (tok_cache_sec){tok->merge_wide, cap * sizeof(tok_merge_slot)};
    d->sec[TOK_SEC_MERGE_FILTER] = (tok_cache_sec){tok->merge_filter, ((uint64_t)1 << (64 - tok->merge_filter_shift)) / 8};
    d->sec[TOK_SEC_MERGE_HOT] = (tok_cache_sec){tok->merge_hot, tok->merge_hot ? (tok->merge_hot_mask + 1) * 8 : 0};
    d->sec[TOK_SEC_CHUNK_FORBIDDEN] = (tok_cache_sec){tok->chunk_forbidden, tok->n_chunk_forbidden * 4};
    d->param[TOK_P_N_SLOTS] = tok->n_slots;
    d->param[TOK_P_N_MERGES] = tok->n_merges;
    d->param[TOK_P_BLOB_SIZE] = tok->blob_size;
    d->param[TOK_P_VOCAB_MASK] = tok->vocab_map.mask;
    d->param[TOK_P_MERGE_PACKED] = tok->merge_packed != NULL;
    d->param[TOK_P_MERGE_MASK] = tok->merge_mask;
    d->param[TOK_P_MERGE_SHIFT] = (uint64_t)tok->merge_shift;
    d->param[TOK_P_ID_BITS] = (uint64_t)tok->merge_id_bits;
    d->param[TOK_P_RANK_BITS] = (uint64_t)tok->merge_rank_bits;
    d->param[TOK_P_FILTER_SHIFT] = (uint64_t)tok->merge_filter_shift;
    d->param[TOK_P_HOT_MASK] = tok->merge_hot ? tok->merge_hot_mask : 0;
    d->param[TOK_P_HOT_SHIFT] = (uint64_t)tok->merge_hot_shift;
    d->param[TOK_P_CHUNK_SEP] = tok->chunk_sep_cp;
    d->param[TOK_P_N_ADDED] = tok->n_added_raw;
}

static int log2_exact(uint64_t x) {
    if (!x || (x & (x - 1))) return -1;
    int b = 0;
    while (((uint64_t)1 << b) != x) b++;
    return b;
}

/* The cache's tables, after the checksum: their shapes must agree and every stored value
 * must be in range (a table a lookup could loop or read out of bounds on is refused). */
static int adopt_cache(g4_tokenizer *tok, const tok_cache_data *d, g4_error *err) {
    const uint64_t *P = d->param;
    const tok_cache_sec *S = d->sec;
#define REQUIRE(cond)                                                                  \
    do {                                                                               \
        if (!(cond)) return g4_fail(err, "cache: inconsistent (%s)", #cond);           \
    } while (0)
    uint64_t n_slots = P[TOK_P_N_SLOTS], n_merges = P[TOK_P_N_MERGES], blob_size = P[TOK_P_BLOB_SIZE];
    REQUIRE(n_slots <= TOK_MAX_ID && n_merges < ((uint64_t)1 << 32) && blob_size < UINT32_MAX);
    REQUIRE(sized(S[TOK_SEC_VOCAB_OFF].size, n_slots + 1, 4) && S[TOK_SEC_VOCAB_BLOB].size == blob_size);
    const uint32_t *off = S[TOK_SEC_VOCAB_OFF].data;
    const char *blob = S[TOK_SEC_VOCAB_BLOB].data;
    REQUIRE(off[0] == 0 && off[n_slots] == blob_size);
    uint32_t n_vocab = 0;
    for (uint64_t i = 0; i < n_slots; i++) {
        REQUIRE(off[i + 1] >= off[i] && off[i + 1] <= blob_size);
        if (off[i + 1] > off[i]) {
            REQUIRE(blob[off[i + 1] - 1] == 0);
            n_vocab++;
        }
    }
    tok->n_slots = (uint32_t)n_slots;
    tok->vocab_tab.off = off;
    tok->vocab_tab.blob = blob;
    tok->blob_size = blob_size;
    tok->n_vocab = n_vocab;

    /* vocabulary map: every entry names a present slot, as many entries as pieces */
    uint64_t vcap = P[TOK_P_VOCAB_MASK] + 1;
    REQUIRE(log2_exact(vcap) >= 0 && vcap >= 2 * (uint64_t)n_vocab && sized(S[TOK_SEC_VOCAB_MAP].size, vcap, 8));
    const uint64_t *vslots = S[TOK_SEC_VOCAB_MAP].data;
    uint64_t used = 0;
    for (uint64_t i = 0; i < vcap; i++) {
        if (!vslots[i]) continue;
        uint64_t idx = (vslots[i] & 0xffffffffu) - 1;
        REQUIRE(idx < n_slots && off[idx + 1] > off[idx]);
        used++;
    }
    REQUIRE(used == n_vocab && tok_longest_run(vslots, vcap, 1, 0) <= TOK_MAX_RUN);
    tok->vocab_map.slots = (uint64_t *)vslots;
    tok->vocab_map.mask = vcap - 1;

    REQUIRE(S[TOK_SEC_BMP].size == 65536 * 4);
    const int32_t *bmp = S[TOK_SEC_BMP].data;
    for (size_t i = 0; i < 65536; i++) REQUIRE(bmp[i] >= -1 && bmp[i] < (int64_t)n_slots);
    tok->bmp_id = (int32_t *)bmp;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_id[b] = tok_vocab_get(tok, name, 6);
    }

    /* merges: triples name present ids; the tables hold ranks in range and have room */
    REQUIRE(sized(S[TOK_SEC_MERGES].size, n_merges, 12));
    const uint32_t *tri = S[TOK_SEC_MERGES].data;
    for (uint64_t i = 0; i < n_merges * 3; i++) REQUIRE(tri[i] < n_slots && off[tri[i] + 1] > off[tri[i]]);
    tok->merge_triples = tri;
    tok->n_merges = n_merges;
    uint64_t mcap = P[TOK_P_MERGE_MASK] + 1;
    int mbits = log2_exact(mcap);
    REQUIRE(mbits >= 4 && P[TOK_P_MERGE_SHIFT] == (uint64_t)(64 - mbits) && mcap >= 2 * n_merges);
    int id_bits = (int)P[TOK_P_ID_BITS], rank_bits = (int)P[TOK_P_RANK_BITS];
    REQUIRE(id_bits >= 1 && id_bits <= 32 && rank_bits >= 1 && rank_bits <= 32);
    REQUIRE(((uint64_t)1 << id_bits) >= n_slots && ((uint64_t)1 << rank_bits) >= n_merges);
    tok->merge_mask = mcap - 1;
    tok->merge_shift = 64 - mbits;
    tok->merge_id_bits = id_bits;
    tok->merge_rank_bits = rank_bits;
    used = 0;
    if (P[TOK_P_MERGE_PACKED]) {
        REQUIRE(2 * id_bits + rank_bits <= 63 && sized(S[TOK_SEC_MERGE_MAIN].size, mcap, 8));
        const uint64_t *t = S[TOK_SEC_MERGE_MAIN].data;
        for (uint64_t i = 0; i < mcap; i++)
            if (t[i] != UINT64_MAX) {
                REQUIRE((t[i] & (((uint64_t)1 << rank_bits) - 1)) < n_merges);
                used++;
            }
        REQUIRE(tok_longest_run(t, mcap, 1, UINT64_MAX) <= TOK_MAX_RUN);
        tok->merge_packed = (uint64_t *)t;
    } else {
        REQUIRE(sized(S[TOK_SEC_MERGE_MAIN].size, mcap, sizeof(tok_merge_slot)));
        const tok_merge_slot *t = S[TOK_SEC_MERGE_MAIN].data;
        for (uint64_t i = 0; i < mcap; i++)
            if (t[i].key != UINT64_MAX) {
                REQUIRE(t[i].rank < n_merges);
                used++;
            }
        REQUIRE(tok_longest_run(&t->key, mcap, 2, UINT64_MAX) <= TOK_MAX_RUN);
        tok->merge_wide = (tok_merge_slot *)t;
    }
    REQUIRE(used <= n_merges && used < mcap);
    int fshift = (int)P[TOK_P_FILTER_SHIFT];
    REQUIRE(fshift >= 6 && fshift <= 58 && S[TOK_SEC_MERGE_FILTER].size == ((uint64_t)1 << (64 - fshift)) / 8);
    tok->merge_filter = (uint64_t *)S[TOK_SEC_MERGE_FILTER].data;
    tok->merge_filter_shift = fshift;
    if (S[TOK_SEC_MERGE_HOT].size) {
        uint64_t hcap = P[TOK_P_HOT_MASK] + 1;
        int hbits = log2_exact(hcap);
        REQUIRE(P[TOK_P_MERGE_PACKED] && hbits >= 4 && P[TOK_P_HOT_SHIFT] == (uint64_t)(64 - hbits) &&
                sized(S[TOK_SEC_MERGE_HOT].size, hcap, 8));
        const uint64_t *t = S[TOK_SEC_MERGE_HOT].data;
        used = 0;
        for (uint64_t i = 0; i < hcap; i++)
            if (t[i] != UINT64_MAX) {
                REQUIRE((t[i] & (((uint64_t)1 << rank_bits) - 1)) < n_merges);
                used++;
            }
        REQUIRE(used < hcap && tok_longest_run(t, hcap, 1, UINT64_MAX) <= TOK_MAX_RUN);
        tok->merge_hot = (uint64_t *)t;
        tok->merge_hot_mask = hcap - 1;
        tok->merge_hot_shift = 64 - hbits;
    }

    /* chunking data */
    REQUIRE(P[TOK_P_CHUNK_SEP] == 0 || P[TOK_P_CHUNK_SEP] == 0x20 || P[TOK_P_CHUNK_SEP] == 0x2581);
    REQUIRE(S[TOK_SEC_CHUNK_FORBIDDEN].size % 4 == 0);
    set_chunk_sep(tok, (uint32_t)P[TOK_P_CHUNK_SEP]);
    tok->chunk_forbidden = (uint32_t *)S[TOK_SEC_CHUNK_FORBIDDEN].data;
    tok->n_chunk_forbidden = S[TOK_SEC_CHUNK_FORBIDDEN].size / 4;
    for (size_t i = 1; i < tok->n_chunk_forbidden; i++) REQUIRE(tok->chunk_forbidden[i - 1] < tok->chunk_forbidden[i]);

    /* added tokens as listed: contents laid out in order, each NUL-terminated */
    uint64_t n_added = P[TOK_P_N_ADDED];
    REQUIRE(n_added < ((uint64_t)1 << 24) && sized(S[TOK_SEC_ADDED].size, n_added, sizeof(tok_added_raw)));
    const tok_added_raw *raw = S[TOK_SEC_ADDED].data;
    const char *ablob = S[TOK_SEC_ADDED_BLOB].data;
    uint64_t pos = 0;
    for (uint64_t i = 0; i < n_added; i++) {
        REQUIRE(raw[i].off == pos && pos + raw[i].len < S[TOK_SEC_ADDED_BLOB].size && ablob[pos + raw[i].len] == 0);
        pos += (uint64_t)raw[i].len + 1;
    }
    REQUIRE(pos == S[TOK_SEC_ADDED_BLOB].size);
    const char *json = S[TOK_SEC_JSON].data;
    REQUIRE(S[TOK_SEC_JSON].size >= 1 && json[S[TOK_SEC_JSON].size - 1] == 0);
#undef REQUIRE
    return 0;
}

/* Cold path: a parsed tokenizer.json (consumed). When want_rest, *rest gets the compact JSON of what the
 * cache keeps as JSON (everything but the vocabulary, the merges and the added tokens). */
static int build_from_root(g4_tokenizer *tok, json_t *root, int want_rest, char **rest, g4_error *err) {
    int rc = -1;
    *rest = NULL;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(root)) {
        g4_fail(err, "tokenizer.json: the top level must be an object");
        goto done;
    }
    if (!json_is_object(model)) {
        g4_fail(err, "tokenizer.json: missing \"model\" object");
        goto done;
    }
    if (parse_model_options(tok, model, err) || vocab_from_json(tok, json_object_get(model, "vocab"), err) ||
        merges_from_json(tok, json_object_get(model, "merges"), err) ||
        added_raw_from_json(tok, json_object_get(root, "added_tokens"), err))
        goto done;
    json_object_del(model, "vocab");
    json_object_del(model, "merges");
    json_object_del(root, "added_tokens");
    if (configure_rest(tok, root, tok->own_added_raw, tok->n_added_raw, tok->own_added_blob, tok->added_blob_size, err))
        goto done;
    if (want_rest) *rest = json_dumps(root, JSON_COMPACT | JSON_ENCODE_ANY);
    rc = 0;
done:
    json_decref(root);
    return rc;
}

/* Warm path: everything comes from a checked cache (tok->cache holds the mapping). */
static int build_from_cache(g4_tokenizer *tok, g4_error *err) {
    tok->tables_borrowed = 1;
    if (adopt_cache(tok, &tok->cache, err)) return -1;
    const tok_cache_sec *json = &tok->cache.sec[TOK_SEC_JSON];
    json_error_t je;
    json_t *root = json_loadb(json->data, json->size - 1, JSON_REJECT_DUPLICATES, &je);
    if (!root) return g4_fail(err, "cache: invalid JSON: %s", je.text);
    int rc = -1;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        g4_fail(err, "cache: no model");
        goto done;
    }
    if (parse_model_options(tok, model, err) ||
        configure_rest(tok, root, tok->cache.sec[TOK_SEC_ADDED].data, tok->cache.param[TOK_P_N_ADDED],
                       tok->cache.sec[TOK_SEC_ADDED_BLOB].data, tok->cache.sec[TOK_SEC_ADDED_BLOB].size, err))
        goto done;
    rc = 0;
done:
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------ tokenizer_config.json */

static int config_token(const json_t *cfg, const char *key, const char **s, size_t *len, g4_error *err) {
    const json_t *v = json_object_get(cfg, key);
    *s = NULL;
    *len = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (json_strn(v, s, len))
        return g4_fail(err, "tokenizer_config.json: \"%s\" must be a string or an object with \"content\"", key);
    return 0;
}

static int load_config(g4_tokenizer *tok, const char *json_path, g4_error *err) {
    char dir[PATH_MAX], path[PATH_MAX];
    size_t n = strlen(json_path);
    if (n >= sizeof dir) return g4_fail(err, "path too long: %s", json_path);
    memcpy(dir, json_path, n + 1);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        strcpy(dir, ".");
    if (g4_path_join(path, sizeof path, dir, "tokenizer_config.json", err)) return -1;

    tok->bos_id = tok->n_prefix == 1 ? tok->prefix_ids[0] : -1;
    tok->eos_id = -1;
    if (!g4_file_exists(path)) return 0;
    json_t *cfg;
    if (g4_json_load_file(path, &cfg, err)) return -1;
    int rc = -1;
    const char *what = "tokenizer_config.json";
    int add_bos = tok->n_prefix > 0, add_eos = tok->n_suffix > 0;
    int has_flags = g4_json_present(cfg, "add_bos_token") || g4_json_present(cfg, "add_eos_token");
    const char *bos, *eos;
    size_t bos_len, eos_len;
    if (!json_is_object(cfg)) {
        g4_fail(err, "%s: the top level must be an object", path);
        goto done;
    }
    if (g4_json_bool(cfg, "add_bos_token", add_bos, &add_bos, what, err) ||
        g4_json_bool(cfg, "add_eos_token", add_eos, &add_eos, what, err) ||
        config_token(cfg, "bos_token", &bos, &bos_len, err) || config_token(cfg, "eos_token", &eos, &eos_len, err))
        goto done;
    char buf[80];
    if (bos) {
        tok->bos_id = g4_tokenizer_token_id_n(tok, bos, bos_len);
        if (tok->bos_id < 0) {
            g4_fail(err, "%s: bos_token '%s' is not in the vocabulary", what, excerpt(bos, bos_len, buf, sizeof buf));
            goto done;
        }
    }
    if (eos) {
        tok->eos_id = g4_tokenizer_token_id_n(tok, eos, eos_len);
        if (tok->eos_id < 0) {
            g4_fail(err, "%s: eos_token '%s' is not in the vocabulary", what, excerpt(eos, eos_len, buf, sizeof buf));
            goto done;
        }
    }
    if (has_flags) {
        /* transformers rebuilds the post-processor from these flags */
        tok->n_prefix = tok->n_suffix = 0;
        if (add_bos && tok->bos_id >= 0 && push_id(&tok->prefix_ids, &tok->n_prefix, tok->bos_id)) {
            g4_fail(err, "out of memory");
            goto done;
        }
        if (add_eos && tok->eos_id >= 0 && push_id(&tok->suffix_ids, &tok->n_suffix, tok->eos_id)) {
            g4_fail(err, "out of memory");
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(cfg);
    return rc;
}

/* ------------------------------------------------------------------ API */

void g4_tokenizer_free(g4_tokenizer *tok) {
    if (!tok) return;
    if (!tok->tables_borrowed) {
        tok_strmap_free(&tok->vocab_map);
        free(tok->bmp_id);
        free(tok->chunk_forbidden);
        free(tok->merge_filter);
        free(tok->merge_hot);
        free(tok->merge_packed);
        free(tok->merge_wide);
    }
    tok_cache_close(&tok->cache);
    tok_strmap_free(&tok->added_map);
    free(tok->unk_token);
    free(tok->cont_prefix);
    free(tok->eow_suffix);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].norm);
    free(tok->added);
    free(tok->added_off);
    free(tok->added_blob);
    tok_trie_free(&tok->trie_raw);
    tok_trie_free(&tok->trie_norm);
    for (size_t i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].pattern);
        free(tok->norm[i].content);
    }
    free(tok->norm);
    for (size_t i = 0; i < tok->n_pretok; i++) free(tok->pretok[i].pattern);
    free(tok->pretok);
    for (size_t i = 0; i < tok->n_dec; i++) {
        free(tok->dec[i].pattern);
        free(tok->dec[i].content);
    }
    free(tok->dec);
    free(tok->prefix_ids);
    free(tok->suffix_ids);
    free(tok->id_str);
    free(tok->id_len);
    free(tok->id_flags);
    free(tok->cache_path);
    free(tok->own_off);
    free(tok->own_blob);
    free(tok->own_triples);
    free(tok->own_added_raw);
    free(tok->own_added_blob);
    free(tok);
}

static g4_tokenizer *tok_new(void) {
    g4_tokenizer *tok = calloc(1, sizeof *tok);
    if (tok) {
        tok->bos_id = tok->eos_id = tok->unk_id = -1;
    }
    return tok;
}

static int cache_disabled(void) {
    const char *v = getenv("G4_NO_TOKENIZER_CACHE");
    return v && *v && strcmp(v, "0") != 0;
}

static json_t *json_file_source(const char *path, void *user, g4_error *err) {
    (void)user;
    json_t *root;
    return g4_json_load_file(path, &root, err) ? NULL : root;
}

int tok_load_cached(const char *path, const tok_source_key *key, tok_source_fn source, void *user, g4_tokenizer **out,
                    g4_error *err) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return g4_fail(err, "%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return g4_fail(err, "%s: not a regular file", path);

    char *cache = cache_disabled() || !key ? NULL : tok_cache_path(key);
    g4_tokenizer *tok = NULL;
    if (cache) {
        g4_tokenizer *t = tok_new();
        g4_error e2;
        if (t && tok_cache_open(cache, key, &t->cache) == 0 && build_from_cache(t, &e2) == 0) {
            tok = t;
            tok->from_cache = 1;
            tok->cache_path = strdup(cache);
        } else {
            g4_tokenizer_free(t); /* absent, stale or corrupt: rebuilt from the source below */
        }
    }
    if (!tok) {
        tok = tok_new();
        json_t *root = tok ? source(path, user, err) : NULL;
        if (!tok) g4_fail(err, "out of memory");
        char *rest = NULL;
        if (!root || build_from_root(tok, root, cache != NULL, &rest, err) != 0) {
            free(cache);
            g4_tokenizer_free(tok);
            if (err && strstr(err->msg, path) == NULL) g4_fail_prefix(err, "%s", path);
            return -1;
        }
        if (rest) {
            tok_cache_data d;
            cache_fill(tok, rest, &d);
            if (tok_cache_prepare_dir(cache) == 0 && tok_cache_write(cache, key, &d) == 0)
                tok->cache_path = strdup(cache);
            free(rest);
        }
    }
    free(cache);
    *out = tok;
    return 0;
}

int g4_tokenizer_load(const char *path, g4_tokenizer **out, g4_error *err) {
    g4_tokenizer *tok;
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(path, err);
    tok_source_key key;
    int keyed = !cache_disabled() && tok_key_file(path, TOK_KEY_JSON, &key) == 0;
    if (tok_load_cached(path, keyed ? &key : NULL, json_file_source, NULL, &tok, err)) return -1;
    if (load_config(tok, path, err) != 0) {
        g4_tokenizer_free(tok);
        return -1;
    }
    *out = tok;
    return 0;
}

int tok_set_special(g4_tokenizer *tok, int32_t bos_id, int32_t eos_id, int add_bos, g4_error *err) {
    tok->bos_id = bos_id >= 0 && bos_id < tok->n_ids ? bos_id : -1;
    tok->eos_id = eos_id >= 0 && eos_id < tok->n_ids ? eos_id : -1;
    tok->n_prefix = tok->n_suffix = 0;
    if (add_bos && tok->bos_id >= 0 && push_id(&tok->prefix_ids, &tok->n_prefix, tok->bos_id))
        return g4_fail(err, "out of memory");
    return 0;
}

int g4_tokenizer_load_dir(const char *model_dir, g4_tokenizer **out, g4_error *err) {
    char path[PATH_MAX];
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(model_dir, err);
    if (g4_gguf_is_file(model_dir)) return g4_tokenizer_load_gguf(model_dir, NULL, out, err);
    if (g4_path_join(path, sizeof path, model_dir, "tokenizer.json", err)) return -1;
    if (!g4_file_exists(path)) return g4_fail(err, "%s: no tokenizer.json in this folder", model_dir);
    return g4_tokenizer_load(path, out, err);
}

int g4_tokenizer_vocab_size(const g4_tokenizer *tok) { return tok ? tok->n_ids : 0; }
int32_t g4_tokenizer_bos_id(const g4_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t g4_tokenizer_eos_id(const g4_tokenizer *tok) { return tok ? tok->eos_id : -1; }

int32_t g4_tokenizer_token_id_n(const g4_tokenizer *tok, const char *piece, size_t len) {
    int32_t i = tok_strmap_get(&tok->added_map, &tok->added_tab, piece, len);
    if (i >= 0) return tok->added[i].id;
    return tok_vocab_get(tok, piece, len);
}

int32_t g4_tokenizer_token_id(const g4_tokenizer *tok, const char *piece) {
    if (!tok || !piece) return -1;
    return g4_tokenizer_token_id_n(tok, piece, strlen(piece));
}

const char *g4_tokenizer_piece(const g4_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids) return NULL;
    return tok->id_str[id];
}

int g4_tokenizer_is_special(const g4_tokenizer *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->n_ids) return 0;
    return (tok->id_flags[id] & TOK_ID_SPECIAL) != 0;
}

const char *g4_tokenizer_cache_path(const g4_tokenizer *tok) { return tok->cache_path; }
int g4_tokenizer_loaded_from_cache(const g4_tokenizer *tok) { return tok->from_cache; }
