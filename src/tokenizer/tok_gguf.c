/* The tokenizer of a GGUF file (docs/formats.md 3.3 "Tokenizer keys"): tokenizer.ggml.model
 * "gemma4" (llama.cpp) or "llama" with pre "gemma4" (Ollama) is Gemma's BPE, rebuilt here
 * as the tokenizer.json it came from: every token in the model vocabulary, control (3) and
 * user-defined (4) tokens also as added tokens (control ones special), the merges as pairs
 * (a space inside a part was written as U+0120; a pair is taken as written when its parts
 * and their join are tokens, else with U+0120 read back as a space), Gemma's normalizer
 * (space -> U+2581) and decoder (U+2581 -> space, byte fallback, fuse). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/tok_internal.h"

static char *replace_g120(const char *s) {
    size_t n = strlen(s);
    char *o = malloc(n + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] == 0xC4 && (unsigned char)s[i + 1] == 0xA0) {
            *p++ = ' ';
            i += 2;
        } else {
            *p++ = s[i++];
        }
    }
    *p = 0;
    return o;
}

static json_t *pair_if_tokens(const json_t *vocab, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *ab = malloc(la + lb + 1);
    if (!ab) return NULL;
    memcpy(ab, a, la);
    memcpy(ab + la, b, lb + 1);
    json_t *r = NULL;
    if (json_object_get(vocab, a) && json_object_get(vocab, b) && json_object_get(vocab, ab)) r = json_pack("[ss]", a, b);
    free(ab);
    return r;
}

/* The next string of a, NUL-terminated in *buf (grown as needed; a NUL inside ends it, as a JSON key's would);
 * NULL past the end or without memory. */
static const char *next_str(const g4_gguf_array *a, size_t *at, char **buf, size_t *cap) {
    size_t len;
    const char *s = g4_gguf_array_str(a, at, &len);
    if (!s) return NULL;
    if (len + 1 > *cap) {
        char *b = realloc(*buf, len + 1);
        if (!b) return NULL;
        *buf = b;
        *cap = len + 1;
    }
    memcpy(*buf, s, len);
    (*buf)[len] = 0;
    return *buf;
}

/* tokens, token types (optional) and merges of the metadata, as the file holds them (gguf.h) */
typedef struct vocabulary {
    g4_gguf_array tokens, types, merges;
    int has_types;
} vocabulary;

static int read_vocabulary(const json_t *meta, const char *path, vocabulary *v, g4_error *err) {
    const char *model = json_string_value(json_object_get(meta, "tokenizer.ggml.model"));
    const char *pre = json_string_value(json_object_get(meta, "tokenizer.ggml.pre"));
    if (!model || !g4_gguf_array_of(meta, "tokenizer.ggml.tokens", &v->tokens) || !v->tokens.n)
        return g4_fail(err, "%s: the file has no tokenizer (tokenizer.ggml.tokens)", path);
    if (strcmp(model, "gemma4") && !(!strcmp(model, "llama") && pre && !strcmp(pre, "gemma4")))
        return g4_fail(err, "%s: tokenizer model '%s' is not supported (gemma4)", path, model);
    if (v->tokens.type != G4_GGUF_STR) return g4_fail(err, "%s: token 0 is not a string", path);
    if (!g4_gguf_array_of(meta, "tokenizer.ggml.merges", &v->merges) || v->merges.type != G4_GGUF_STR)
        return g4_fail(err, "%s: a gemma4 tokenizer needs tokenizer.ggml.merges", path);
    v->has_types = g4_gguf_array_of(meta, "tokenizer.ggml.token_type", &v->types);
    if (json_object_get(meta, "tokenizer.ggml.token_type") &&
        (!v->has_types || v->types.type == G4_GGUF_STR || v->types.n != v->tokens.n))
        return g4_fail(err, "%s: tokenizer.ggml.token_type must have one entry per token", path);
    return 0;
}

static json_t *convert(const json_t *meta, const char *path, g4_error *err) {
    vocabulary v;
    if (read_vocabulary(meta, path, &v, err)) return NULL;
    json_t *vocab = json_object(), *added = json_array(), *mj = json_array();
    char *buf = NULL, *unk_s = NULL;
    size_t cap = 0, at = 0;
    const json_t *unk = json_object_get(meta, "tokenizer.ggml.unknown_token_id");
    const json_int_t unk_id = json_is_integer(unk) ? json_integer_value(unk) : -1;
    for (uint64_t i = 0; i < v.tokens.n; i++) {
        const char *t = next_str(&v.tokens, &at, &buf, &cap);
        if (!t) {
            g4_fail(err, "out of memory");
            goto fail;
        }
        json_object_set_new(vocab, t, json_integer((json_int_t)i));
        if ((json_int_t)i == unk_id) unk_s = strdup(t);
        const json_int_t ty = v.has_types ? (json_int_t)g4_gguf_array_num(&v.types, i) : 1;
        if (ty == 3 || ty == 4)
            json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)i, "content", t,
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", ty == 3));
    }
    at = 0;
    for (uint64_t i = 0; i < v.merges.n; i++) {
        const char *m = next_str(&v.merges, &at, &buf, &cap);
        const char *sp = m && m[0] ? strchr(m + 1, ' ') : NULL;
        if (!sp) {
            g4_fail(err, m ? "%s: merge %llu is not \"a b\"" : "out of memory", path, (unsigned long long)i);
            goto fail;
        }
        char *a = strndup(m, (size_t)(sp - m)), *b = strdup(sp + 1);
        json_t *pr = a && b ? pair_if_tokens(vocab, a, b) : NULL;
        if (!pr && a && b) {
            char *a2 = replace_g120(a), *b2 = replace_g120(b);
            if (a2 && b2) pr = pair_if_tokens(vocab, a2, b2);
            if (!pr && a2 && b2) pr = json_pack("[ss]", a2, b2); /* the loader names the bad merge */
            free(a2);
            free(b2);
        }
        free(a);
        free(b);
        if (!pr) {
            g4_fail(err, "out of memory");
            goto fail;
        }
        json_array_append_new(mj, pr);
    }
    free(buf);
    json_t *root = json_pack(
        "{s:o,s:{s:s,s:n,s:s?,s:n,s:n,s:b,s:b,s:b,s:o,s:o},s:{s:s,s:{s:s},s:s},s:n,s:n,"
        "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]}}",
        "added_tokens", added, "model", "type", "BPE", "dropout", "unk_token", unk_s, "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0, "vocab", vocab, "merges", mj,
        "normalizer", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81", "pre_tokenizer",
        "post_processor", "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
        "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse");
    free(unk_s);
    if (!root) g4_fail(err, "out of memory");
    return root;
fail:
    free(buf);
    free(unk_s);
    json_decref(vocab);
    json_decref(added);
    json_decref(mj);
    return NULL;
}

static json_t *meta_source(const char *path, void *meta, g4_error *err) { return convert(meta, path, err); }

static void key_add_string(tok_source_key *k, const json_t *v) {
    const char *s = json_string_value(v);
    if (s) tok_key_add(k, s, json_string_length(v));
    else tok_key_add(k, "", 0); /* (convert refuses it: such a file is never cached) */
}

static void key_add_array(tok_source_key *k, const g4_gguf_array *a) {
    const uint64_t head[2] = {(uint64_t)a->type, a->n};
    tok_key_add(k, head, sizeof head);
    tok_key_add(k, a->data, a->size);
}

/* The cache key of a GGUF tokenizer: every key convert() reads (their bytes as the file holds them), so GGUF files
 * of one model in several types (which differ in their weights and general.* keys) share one cache. 0, or -1 when
 * the file has no tokenizer to key (convert says why). */
static int gguf_key(const json_t *meta, tok_source_key *k) {
    vocabulary v;
    g4_error ignored;
    if (read_vocabulary(meta, "", &v, &ignored)) return -1;
    tok_key_init(k, TOK_KEY_GGUF);
    key_add_string(k, json_object_get(meta, "tokenizer.ggml.model"));
    key_add_string(k, json_object_get(meta, "tokenizer.ggml.pre"));
    const json_t *unk = json_object_get(meta, "tokenizer.ggml.unknown_token_id");
    const int64_t unk_id = json_is_integer(unk) ? (int64_t)json_integer_value(unk) : INT64_MIN;
    tok_key_add(k, &unk_id, sizeof unk_id);
    key_add_array(k, &v.tokens);
    if (v.has_types) key_add_array(k, &v.types);
    else tok_key_add(k, "", 0);
    key_add_array(k, &v.merges);
    return 0;
}

int g4_tokenizer_load_gguf(const char *path, const json_t *meta, g4_tokenizer **out, g4_error *err) {
    *out = NULL;
    g4_gguf g = {0};
    if (!meta) {
        if (g4_gguf_open(path, &g, err)) return -1;
        meta = g.meta;
    }
    const json_t *bos = json_object_get(meta, "tokenizer.ggml.bos_token_id");
    const json_t *eos = json_object_get(meta, "tokenizer.ggml.eos_token_id");
    const json_t *add = json_object_get(meta, "tokenizer.ggml.add_bos_token");
    const json_int_t b = json_is_integer(bos) ? json_integer_value(bos) : -1;
    const json_int_t e = json_is_integer(eos) ? json_integer_value(eos) : -1;
    int add_bos = add ? json_is_true(add) : 1;
    g4_tokenizer *tok = NULL;
    tok_source_key key;
    int rc = tok_load_cached(path, gguf_key(meta, &key) == 0 ? &key : NULL, meta_source, (void *)meta, &tok, err);
    g4_gguf_free(&g);
    /* an id the file gives that names no token of its vocabulary: an error (a BOS silently dropped otherwise) */
    const json_int_t n = rc ? 0 : g4_tokenizer_vocab_size(tok), bad = b >= n ? b : e >= n ? e : -1;
    if (!rc && bad >= 0)
        rc = g4_fail(err, "%s: tokenizer.ggml.%s_token_id %lld is outside the vocabulary of %lld tokens", path,
                     bad == b ? "bos" : "eos", (long long)bad, (long long)n);
    if (!rc && tok_set_special(tok, (int32_t)b, (int32_t)e, add_bos, err)) rc = -1;
    if (rc) {
        g4_tokenizer_free(tok);
        return -1;
    }
    *out = tok;
    return 0;
}
