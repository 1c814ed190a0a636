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

static json_t *convert(const json_t *meta, const char *path, g4_error *err) {
    const json_t *tokens = json_object_get(meta, "tokenizer.ggml.tokens");
    const json_t *types = json_object_get(meta, "tokenizer.ggml.token_type");
    const json_t *merges = json_object_get(meta, "tokenizer.ggml.merges");
    const char *model = json_string_value(json_object_get(meta, "tokenizer.ggml.model"));
    const char *pre = json_string_value(json_object_get(meta, "tokenizer.ggml.pre"));
    if (!model || !json_is_array(tokens) || !json_array_size(tokens)) {
        g4_fail(err, "%s: the file has no tokenizer (tokenizer.ggml.tokens)", path);
        return NULL;
    }
    if (strcmp(model, "gemma4") && !(!strcmp(model, "llama") && pre && !strcmp(pre, "gemma4"))) {
        g4_fail(err, "%s: tokenizer model '%s' is not supported (gemma4)", path, model);
        return NULL;
    }
    if (!json_is_array(merges)) {
        g4_fail(err, "%s: a gemma4 tokenizer needs tokenizer.ggml.merges", path);
        return NULL;
    }
    size_t n = json_array_size(tokens);
    if (types && (!json_is_array(types) || json_array_size(types) != n)) {
        g4_fail(err, "%s: tokenizer.ggml.token_type must have one entry per token", path);
        return NULL;
    }
    json_t *vocab = json_object(), *added = json_array(), *mj = json_array();
    for (size_t i = 0; i < n; i++) {
        const char *t = json_string_value(json_array_get(tokens, i));
        if (!t) {
            g4_fail(err, "%s: token %zu is not a string", path, i);
            goto fail;
        }
        json_object_set_new(vocab, t, json_integer((json_int_t)i));
        json_int_t ty = types ? json_integer_value(json_array_get(types, i)) : 1;
        if (ty == 3 || ty == 4)
            json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", (json_int_t)i, "content", t,
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                                   "special", ty == 3));
    }
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *m = json_string_value(json_array_get(merges, i));
        const char *sp = m && m[0] ? strchr(m + 1, ' ') : NULL;
        if (!sp) {
            g4_fail(err, "%s: merge %zu is not \"a b\"", path, i);
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
    const json_t *unk = json_object_get(meta, "tokenizer.ggml.unknown_token_id");
    const char *unk_s = json_is_integer(unk) ? json_string_value(json_array_get(tokens, (size_t)json_integer_value(unk))) : NULL;
    json_t *root = json_pack(
        "{s:o,s:{s:s,s:n,s:s?,s:n,s:n,s:b,s:b,s:b,s:o,s:o},s:{s:s,s:{s:s},s:s},s:n,s:n,"
        "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]}}",
        "added_tokens", added, "model", "type", "BPE", "dropout", "unk_token", unk_s, "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0, "vocab", vocab, "merges", mj,
        "normalizer", "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81", "pre_tokenizer",
        "post_processor", "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
        "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse");
    if (!root) g4_fail(err, "out of memory");
    return root;
fail:
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

static void key_add_integer(tok_source_key *k, const json_t *v) {
    int64_t x = json_is_integer(v) ? (int64_t)json_integer_value(v) : INT64_MIN;
    tok_key_add(k, &x, sizeof x);
}

/* The cache key of a GGUF tokenizer: every key convert() reads, so GGUF files of one model in several types (which
 * differ in their weights and general.* keys) share one cache. 0, or -1 when the file has no tokenizer to key. */
static int gguf_key(const json_t *meta, tok_source_key *k) {
    const json_t *tokens = json_object_get(meta, "tokenizer.ggml.tokens");
    const json_t *types = json_object_get(meta, "tokenizer.ggml.token_type");
    const json_t *merges = json_object_get(meta, "tokenizer.ggml.merges");
    if (!json_is_array(tokens) || !json_is_array(merges)) return -1;
    tok_key_init(k, TOK_KEY_GGUF);
    key_add_string(k, json_object_get(meta, "tokenizer.ggml.model"));
    key_add_string(k, json_object_get(meta, "tokenizer.ggml.pre"));
    key_add_integer(k, json_object_get(meta, "tokenizer.ggml.unknown_token_id"));
    const uint64_t n[3] = {json_array_size(tokens), json_is_array(types) ? json_array_size(types) : 0,
                           json_array_size(merges)};
    tok_key_add(k, n, sizeof n);
    for (size_t i = 0; i < n[0]; i++) key_add_string(k, json_array_get(tokens, i));
    for (size_t i = 0; i < n[1]; i++) key_add_integer(k, json_array_get(types, i));
    for (size_t i = 0; i < n[2]; i++) key_add_string(k, json_array_get(merges, i));
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
