/* Tokenizer tests: every encode/decode fixture computed by HF, streaming decode, the
 * binary cache (reuse, corruption, staleness), both merge spellings, malformed files. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- fixtures */

typedef struct {
    json_t **items;
    size_t n;
} jsonl;

static int load_jsonl(const char *path, jsonl *out) {
    char *text;
    size_t len;
    g4_error err;
    out->items = NULL;
    out->n = 0;
    if (g4_read_file(path, &text, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    size_t cap = 0;
    for (char *line = text; line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t ll = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        if (ll) {
            json_error_t je;
            json_t *v = json_loadb(line, ll, 0, &je);
            if (!v) {
                fprintf(stderr, "%s: bad line: %s\n", path, je.text);
                free(text);
                return -1;
            }
            if (out->n == cap) {
                cap = cap ? cap * 2 : 64;
                out->items = realloc(out->items, cap * sizeof *out->items);
            }
            out->items[out->n++] = v;
        }
        line += ll + 1;
    }
    free(text);
    return 0;
}

static void free_jsonl(jsonl *j) {
    for (size_t i = 0; i < j->n; i++) json_decref(j->items[i]);
    free(j->items);
}

static int ids_equal(const g4_tokens *t, const json_t *arr) {
    if (!json_is_array(arr) || json_array_size(arr) != t->n) return 0;
    for (size_t i = 0; i < t->n; i++)
        if (json_integer_value(json_array_get(arr, i)) != t->ids[i]) return 0;
    return 1;
}

static int32_t *json_ids(const json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static jsonl enc_fx, dec_fx;

/* Every encode fixture, with and without BOS. Returns the number of mismatches. */
static int check_encode_fixtures(const g4_tokenizer *tok, const char *label) {
    int bad = 0;
    for (size_t i = 0; i < enc_fx.n; i++) {
        const json_t *c = enc_fx.items[i];
        const json_t *jt = json_object_get(c, "text");
        const char *text = json_string_value(jt);
        size_t len = json_string_length(jt);
        for (int bos = 0; bos < 2; bos++) {
            g4_tokens t = {0};
            g4_error err;
            int rc = g4_tokenize(tok, text, len, bos, &t, &err);
            int ok = rc == 0 && ids_equal(&t, json_object_get(c, bos ? "ids_with_bos" : "ids"));
            if (!ok) {
                bad++;
                fprintf(stderr, "[%s] encode case %zu (bos=%d) %.60s: mismatch (%s; got %zu ids)\n", label, i,
                        bos, text, rc ? err.msg : "ok", t.n);
            }
            free(t.ids);
        }
    }
    return bad;
}

static int check_decode_fixtures(const g4_tokenizer *tok, const char *label) {
    int bad = 0;
    for (size_t i = 0; i < dec_fx.n; i++) {
        const json_t *c = dec_fx.items[i];
        size_t n;
        int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
        int skip = json_is_true(json_object_get(c, "skip_special_tokens"));
        const json_t *jt = json_object_get(c, "text");
        char *out;
        size_t len;
        g4_error err;
        int rc = g4_detokenize(tok, ids, n, skip, &out, &len, &err);
        if (rc || len != json_string_length(jt) || memcmp(out, json_string_value(jt), len)) {
            bad++;
            fprintf(stderr, "[%s] decode case %zu: mismatch (%s)\n", label, i, rc ? err.msg : "ok");
        }
        if (!rc) free(out);
        free(ids);
    }
    return bad;
}

/* --------------------------------------------------------------- streaming */

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : (c >= 0xC2 && c < 0xE0) ? 2 : (c >= 0xE0 && c < 0xF0) ? 3 : (c >= 0xF0 && c < 0xF5) ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Streams ids one at a time; checks every chunk is valid UTF-8 and the whole equals batch
 * decoding. Returns 0 when all is well. */
static int stream_matches_batch(const g4_tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    char *want;
    size_t want_len;
    g4_error err;
    if (g4_detokenize(tok, ids, n, skip, &want, &want_len, &err)) return -1;
    g4_detok_stream *s = g4_detok_stream_new(tok, skip);
    size_t cap = want_len + 64, got_len = 0;
    char *got = malloc(cap);
    int rc = 0;
    for (size_t i = 0; i <= n && !rc; i++) {
        const char *t;
        size_t tl;
        if (i < n)
            rc = g4_detok_stream_push(s, ids[i], &t, &tl, &err);
        else
            rc = g4_detok_stream_flush(s, &t, &tl);
        if (rc) break;
        if (!valid_utf8(t, tl)) rc = -2;
        if (got_len + tl > cap) rc = -3;
        if (rc) break;
        memcpy(got + got_len, t, tl);
        got_len += tl;
    }
    if (!rc && (got_len != want_len || memcmp(got, want, want_len))) rc = -4;
    free(got);
    free(want);
    g4_detok_stream_free(s);
    return rc;
}

static void test_streaming(const g4_tokenizer *tok) {
    int bad = 0;
    for (size_t i = 0; i < dec_fx.n; i++) {
        const json_t *c = dec_fx.items[i];
        size_t n;
        int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
        int skip = json_is_true(json_object_get(c, "skip_special_tokens"));
        int rc = stream_matches_batch(tok, ids, n, skip);
        if (rc) {
            bad++;
            fprintf(stderr, "stream decode case %zu: %d\n", i, rc);
        }
        free(ids);
    }
    CHECKF(bad == 0, "%d decode fixtures differ when streamed", bad);

    /* byte-fallback runs split across tokens: complete, interrupted, incomplete at the end,
     * with special tokens inside the run (skipped or not) */
    int32_t b[256];
    char name[8];
    for (int i = 0; i < 256; i++) {
        snprintf(name, sizeof name, "<0x%02X>", i);
        b[i] = g4_tokenizer_token_id(tok, name);
    }
    int32_t word = g4_tokenizer_token_id(tok, "▁the");
    int32_t bos = g4_tokenizer_bos_id(tok);
    CHECK(b[0xC3] >= 0 && b[0xA9] >= 0 && b[0xF0] >= 0 && word >= 0 && bos >= 0);
    int32_t seqs[][8] = {
        {b[0xC3], b[0xA9], word, -1},                        /* é then a word */
        {word, b[0xE2], b[0x82], b[0xAC], -1},                /* € at the end */
        {b[0xF0], b[0x9F], b[0x98], b[0x80], b[0xC3], -1},    /* 😀 + incomplete: all U+FFFD */
        {b[0xC3], bos, b[0xA9], word, -1},                    /* special inside the run */
        {b[0xE2], b[0x82], word, b[0xAC], word, -1},          /* run broken by a word */
        {b[0x41], b[0xFF], b[0x42], -1},                      /* invalid byte */
        {word, b[0xC3], -1},                                  /* incomplete at the end */
    };
    for (size_t k = 0; k < sizeof seqs / sizeof seqs[0]; k++) {
        size_t n = 0;
        while (seqs[k][n] >= 0) n++;
        for (int skip = 0; skip < 2; skip++)
            CHECKF(stream_matches_batch(tok, seqs[k], n, skip) == 0, "byte sequence %zu skip=%d", k, skip);
    }
    /* HF's rule: a run that is not valid UTF-8 gives one U+FFFD per byte */
    char *out;
    size_t len;
    g4_error err;
    int32_t run[] = {b[0xF0], b[0x9F], b[0x98], b[0x80], b[0xC3]};
    CHECK(g4_detokenize(tok, run, 5, 0, &out, &len, &err) == 0);
    CHECK(len == 15 && !memcmp(out, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 15));
    free(out);
    /* and a valid run stays held until it ends: nothing printed for the first byte */
    g4_detok_stream *s = g4_detok_stream_new(tok, 0);
    const char *t;
    size_t tl;
    CHECK(g4_detok_stream_push(s, b[0xC3], &t, &tl, &err) == 0 && tl == 0);
    CHECK(g4_detok_stream_push(s, b[0xA9], &t, &tl, &err) == 0 && tl == 0);
    CHECK(g4_detok_stream_push(s, word, &t, &tl, &err) == 0 && tl == 6 && !memcmp(t, "\xC3\xA9 the", 6));
    CHECK(g4_detok_stream_push(s, 1 << 30, &t, &tl, &err) == -1);
    CHECK(g4_detok_stream_flush(s, &t, &tl) == 0 && tl == 0);
    g4_detok_stream_free(s);
}

/* ------------------------------------------------------------------ cache */

static int copy_file(const char *from, const char *to) {
    char *data;
    size_t len;
    g4_error err;
    if (g4_read_file(from, &data, &len, &err)) return -1;
    FILE *f = fopen(to, "wb");
    int rc = f && fwrite(data, 1, len, f) == len ? 0 : -1;
    if (f) fclose(f);
    free(data);
    return rc;
}

static int encode_equal(const g4_tokenizer *a, const g4_tokenizer *b, const char *text) {
    g4_tokens x = {0}, y = {0};
    g4_error err;
    int ok = g4_tokenize(a, text, strlen(text), 1, &x, &err) == 0 && g4_tokenize(b, text, strlen(text), 1, &y, &err) == 0 &&
             x.n == y.n && !memcmp(x.ids, y.ids, x.n * sizeof *x.ids);
    free(x.ids);
    free(y.ids);
    return ok;
}

static void corrupt_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x5A, f);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void test_cache(const char *src) {
    g4_error err;
    const char *dir = g4t_tmp("tokenizer-cache");
    mkdir(dir, 0755);
    setenv("G4_TOKENIZER_CACHE_DIR", dir, 1);
    unsetenv("G4_NO_TOKENIZER_CACHE");

    /* start cold: remove what an earlier run left */
    g4_tokenizer *t0;
    CHECK(g4_tokenizer_load(src, &t0, &err) == 0);
    if (g4_tokenizer_cache_path(t0)) unlink(g4_tokenizer_cache_path(t0));
    g4_tokenizer_free(t0);

    double t_start = now_s();
    g4_tokenizer *cold, *warm;
    CHECKF(g4_tokenizer_load(src, &cold, &err) == 0, "%s", err.msg);
    double t_cold = now_s() - t_start;
    CHECK(!g4_tokenizer_loaded_from_cache(cold));
    const char *cpath = g4_tokenizer_cache_path(cold);
    CHECKF(cpath && !strncmp(cpath, dir, strlen(dir)), "cache written under G4_TOKENIZER_CACHE_DIR: %s",
           cpath ? cpath : "(none)");
    char cache[4096];
    snprintf(cache, sizeof cache, "%s", cpath ? cpath : "");

    t_start = now_s();
    CHECKF(g4_tokenizer_load(src, &warm, &err) == 0, "%s", err.msg);
    double t_warm = now_s() - t_start;
    CHECK(g4_tokenizer_loaded_from_cache(warm));
    fprintf(stderr, "load: cold %.3f s, from cache %.3f s\n", t_cold, t_warm);
    CHECK(g4_tokenizer_vocab_size(warm) == g4_tokenizer_vocab_size(cold));
    CHECK(g4_tokenizer_bos_id(warm) == g4_tokenizer_bos_id(cold));
    CHECK(check_encode_fixtures(warm, "cache") == 0);
    CHECK(check_decode_fixtures(warm, "cache") == 0);
    g4_tokenizer_free(warm);

    /* a flipped byte in the middle: detected (checksum), rebuilt, and then used again */
    long size = file_size(cache);
    CHECK(size > 1000);
    corrupt_byte(cache, size / 2);
    g4_tokenizer *t;
    CHECKF(g4_tokenizer_load(src, &t, &err) == 0, "%s", err.msg);
    CHECK(!g4_tokenizer_loaded_from_cache(t));
    CHECK(encode_equal(t, cold, "Corrupt caches are rebuilt — «ça marche» 😀"));
    g4_tokenizer_free(t);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);

    /* a truncated cache */
    CHECK(truncate(cache, size / 3) == 0);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    CHECK(file_size(cache) == size);
    g4_tokenizer_free(t);

    /* garbage header */
    corrupt_byte(cache, 2);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);

    /* disabled by the environment: neither read nor written */
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t) && !g4_tokenizer_cache_path(t));
    g4_tokenizer_free(t);
    unsetenv("G4_NO_TOKENIZER_CACHE");

    /* beside the tokenizer.json when the folder is writable; stale when the source changes */
    unsetenv("G4_TOKENIZER_CACHE_DIR");
    const char *cdir = g4t_tmp("tokenizer-copy");
    mkdir(cdir, 0755);
    char copy[4096], beside[4200];
    snprintf(copy, sizeof copy, "%s/tokenizer.json", cdir);
    snprintf(beside, sizeof beside, "%s.g4c", copy);
    unlink(beside);
    CHECK(copy_file(src, copy) == 0);
    CHECK(g4_tokenizer_load(copy, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    CHECKF(g4_tokenizer_cache_path(t) && !strcmp(g4_tokenizer_cache_path(t), beside), "cache beside: %s",
           g4_tokenizer_cache_path(t) ? g4_tokenizer_cache_path(t) : "(none)");
    g4_tokenizer_free(t);
    CHECK(g4_tokenizer_load(copy, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);
    struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
    CHECK(utimensat(AT_FDCWD, copy, times, 0) == 0);
    CHECK(g4_tokenizer_load(copy, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);
    CHECK(g4_tokenizer_load(copy, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);
    unlink(beside);
    unlink(copy);
    g4_tokenizer_free(cold);
}

/* ------------------------------------------------- legacy merge spelling */

/* Rewrites the merges as "a b" strings (Gemma's merges have no space inside a part) and
 * checks the fixtures still match. */
static void test_legacy_merges(const char *src) {
    json_error_t je;
    json_t *root = json_load_file(src, 0, &je);
    CHECK(root != NULL);
    if (!root) return;
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t n = json_array_size(merges);
    json_t *legacy = json_array();
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                 json_string_value(json_array_get(m, 1)));
        json_array_append_new(legacy, json_string(buf));
    }
    json_object_set_new(json_object_get(root, "model"), "merges", legacy);
    const char *dir = g4t_tmp("tokenizer-legacy");
    mkdir(dir, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK(json_dump_file(root, path, JSON_COMPACT) == 0);
    json_decref(root);
    /* the config beside it decides BOS the same way */
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    CHECK(copy_file(g4t_shared("tokenizer/tokenizer_config.json"), cfg) == 0);
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    g4_tokenizer *t;
    g4_error err;
    CHECKF(g4_tokenizer_load(path, &t, &err) == 0, "%s", err.msg);
    unsetenv("G4_NO_TOKENIZER_CACHE");
    if (t) {
        CHECK(check_encode_fixtures(t, "legacy merges") == 0);
        g4_tokenizer_free(t);
    }
    unlink(path);
    unlink(cfg);
}

/* ---------------------------------------------------------- bad tokenizers */

static void expect_load_error(const char *label, const char *json, const char *needle) {
    char path[4096];
    snprintf(path, sizeof path, "%s", g4t_tmp("bad-tokenizer.json"));
    FILE *f = fopen(path, "wb");
    fputs(json, f);
    fclose(f);
    g4_tokenizer *t = (g4_tokenizer *)1;
    g4_error err = {{0}};
    int rc = g4_tokenizer_load(path, &t, &err);
    CHECKF(rc == -1 && t == NULL, "%s: load should fail", label);
    CHECKF(strstr(err.msg, needle) != NULL, "%s: error '%s' should mention '%s'", label, err.msg, needle);
    CHECKF(strchr(err.msg, '\n') == NULL, "%s: one line", label);
    if (rc == 0) g4_tokenizer_free(t);
    unlink(path);
}

#define MODEL_HEAD "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

static void test_bad_files(void) {
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    g4_tokenizer *t;
    g4_error err;
    CHECK(g4_tokenizer_load(g4t_tmp("no/such/tokenizer.json"), &t, &err) == -1 && strstr(err.msg, "No such file"));
    CHECK(g4_tokenizer_load_dir(g4t_tmp("no-such-model"), &t, &err) == -1);
    expect_load_error("truncated", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", "invalid JSON");
    expect_load_error("not an object", "[1, 2]", "object");
    expect_load_error("no model", "{\"version\": \"1.0\"}", "model");
    expect_load_error("not BPE", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "Unigram");
    expect_load_error("bad id", "{\"model\":{\"vocab\":{\"a\":-1}}}", "vocab");
    expect_load_error("duplicate id", "{\"model\":{\"vocab\":{\"a\":0,\"b\":0}}}", "both");
    expect_load_error("merge not in vocab", MODEL_HEAD ",\"merges\":[\"a c\"]}}", "'c' is not in the vocabulary");
    expect_load_error("merged not in vocab", MODEL_HEAD ",\"merges\":[[\"b\",\"a\"]]}}", "'ba'");
    expect_load_error("bad merge", MODEL_HEAD ",\"merges\":[\"a b c\"]}}", "merges[0]");
    expect_load_error("bad merge type", MODEL_HEAD ",\"merges\":[3]}}", "merges[0]");
    expect_load_error("normalizer", MODEL_HEAD "},\"normalizer\":{\"type\":\"NFKC\"}}", "NFKC");
    expect_load_error("regex", MODEL_HEAD "},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"x\"},\"behavior\":\"Isolated\"}}",
                      "Regex");
    expect_load_error("decoder", MODEL_HEAD "},\"decoder\":{\"type\":\"WordPiece\"}}", "WordPiece");
    expect_load_error("added tokens", MODEL_HEAD "},\"added_tokens\":[{\"id\":3}]}", "content");
    expect_load_error("template", MODEL_HEAD "},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<x>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}}",
                      "<x>");
    expect_load_error("dropout", MODEL_HEAD ",\"dropout\":0.1}}", "dropout");

    /* a small valid file works, and ids out of range are errors on decode */
    char path[4096];
    snprintf(path, sizeof path, "%s", g4t_tmp("tiny-tokenizer.json"));
    FILE *f = fopen(path, "wb");
    fputs(MODEL_HEAD ",\"merges\":[\"a b\"]}}", f);
    fclose(f);
    CHECKF(g4_tokenizer_load(path, &t, &err) == 0, "%s", err.msg);
    if (t) {
        g4_tokens ids = {0};
        CHECK(g4_tokenize(t, "abab", 4, 1, &ids, &err) == 0 && ids.n == 2 && ids.ids[0] == 2 && ids.ids[1] == 2);
        CHECK(g4_tokenize(t, "a\xff", 2, 0, &ids, &err) == -1 && strstr(err.msg, "UTF-8"));
        char *out;
        size_t len;
        int32_t bad_ids[] = {0, 7};
        CHECK(g4_detokenize(t, bad_ids, 2, 0, &out, &len, &err) == -1 && strstr(err.msg, "7"));
        int32_t neg[] = {-1};
        CHECK(g4_detokenize(t, neg, 1, 0, &out, &len, &err) == -1);
        /* no decoder: tokens joined with spaces, as HF does */
        int32_t ok_ids[] = {2, 0, 1};
        CHECK(g4_detokenize(t, ok_ids, 3, 0, &out, &len, &err) == 0 && !strcmp(out, "ab a b"));
        free(out);
        CHECK(stream_matches_batch(t, ok_ids, 3, 0) == 0);
        free(ids.ids);
        g4_tokenizer_free(t);
    }
    unlink(path);
    unsetenv("G4_NO_TOKENIZER_CACHE");
}

/* --------------------------------------------------------------- round trip */

static void test_round_trip(const g4_tokenizer *tok) {
    char *text;
    size_t len;
    g4_error err;
    if (g4_read_file(g4t_shared("corpus/war-and-peace.txt"), &text, &len, &err)) {
        fprintf(stderr, "skipping round trip: %s\n", err.msg);
        return;
    }
    size_t n = len < 200000 ? len : 200000;
    while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) n--; /* whole characters */
    g4_tokens ids = {0};
    CHECK(g4_tokenize(tok, text, n, 0, &ids, &err) == 0);
    char *back;
    size_t blen;
    CHECK(g4_detokenize(tok, ids.ids, ids.n, 0, &back, &blen, &err) == 0);
    CHECKF(blen == n && !memcmp(back, text, n), "decode(encode(text)) == text for %zu bytes", n);
    CHECK(stream_matches_batch(tok, ids.ids, ids.n, 0) == 0);
    free(back);
    free(ids.ids);
    free(text);
}

int main(void) {
    const char *src = g4t_shared("tokenizer/tokenizer.json");
    if (!g4_file_exists(src)) {
        fprintf(stderr, "no %s: skipped\n", src);
        return 77;
    }
    if (load_jsonl(g4t_shared("tokenizer/fixtures/public/encode.jsonl"), &enc_fx) ||
        load_jsonl(g4t_shared("tokenizer/fixtures/public/decode.jsonl"), &dec_fx)) {
        CHECK(0);
        return g4t_done();
    }
    CHECK(enc_fx.n >= 80 && dec_fx.n >= 120);

    setenv("G4_TOKENIZER_CACHE_DIR", g4t_tmp("tokenizer-cache"), 1);
    g4_tokenizer *tok;
    g4_error err;
    CHECKF(g4_tokenizer_load(src, &tok, &err) == 0, "%s", err.msg);
    if (!tok) return g4t_done();

    /* API basics, against HF's ids */
    CHECK(g4_tokenizer_vocab_size(tok) == 262144);
    const json_t *first_bos = json_object_get(enc_fx.items[0], "ids_with_bos");
    CHECK(json_array_size(first_bos) == 1 && g4_tokenizer_bos_id(tok) == json_integer_value(json_array_get(first_bos, 0)));
    CHECK(g4_tokenizer_token_id(tok, "<bos>") == g4_tokenizer_bos_id(tok));
    CHECK(g4_tokenizer_eos_id(tok) >= 0 && g4_tokenizer_is_special(tok, g4_tokenizer_eos_id(tok)));
    CHECK(!strcmp(g4_tokenizer_piece(tok, g4_tokenizer_bos_id(tok)), "<bos>"));
    CHECK(g4_tokenizer_piece(tok, -1) == NULL && g4_tokenizer_piece(tok, 262144) == NULL);
    CHECK(g4_tokenizer_token_id(tok, "no such piece, surely") == -1);
    int32_t nl = g4_tokenizer_token_id(tok, "\n");
    CHECK(nl >= 0 && !g4_tokenizer_is_special(tok, nl));

    int enc_bad = check_encode_fixtures(tok, "fixtures");
    int dec_bad = check_decode_fixtures(tok, "fixtures");
    CHECKF(enc_bad == 0, "%d of %zu encode cases differ from HF", enc_bad, 2 * enc_fx.n);
    CHECKF(dec_bad == 0, "%d of %zu decode cases differ from HF", dec_bad, dec_fx.n);
    fprintf(stderr, "fixtures: %zu encode cases x2, %zu decode cases\n", enc_fx.n, dec_fx.n);

    test_streaming(tok);
    test_round_trip(tok);
    g4_tokenizer_free(tok);

    test_cache(src);
    test_legacy_merges(src);
    test_bad_files();

    free_jsonl(&enc_fx);
    free_jsonl(&dec_fx);
    return g4t_done();
}
