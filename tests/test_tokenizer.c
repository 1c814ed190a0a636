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
#include "tokenizer/tok_internal.h"
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

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int rc = fputs(text, f) < 0 ? -1 : 0;
    return fclose(f) || rc ? -1 : 0;
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

/* The real file: a cold load writes the cache, the next load reads it and gives the same
 * ids as HF. Returns the tokenizer loaded from the cache (for the other tests). */
static g4_tokenizer *test_cache_real(const char *src) {
    g4_error err;
    const char *dir = g4t_tmp("tokenizer-cache");
    mkdir(dir, 0755);
    setenv("G4_TOKENIZER_CACHE_DIR", dir, 1);
    unsetenv("G4_NO_TOKENIZER_CACHE");
    char cache[4096];
    g4_tokenizer *cold = NULL, *warm = NULL;

    /* the first load tells where the cache is; one left by an earlier run is removed */
    double t0 = now_s();
    CHECKF(g4_tokenizer_load(src, &cold, &err) == 0, "%s", err.msg);
    double t_first = now_s() - t0;
    if (!cold) return NULL;
    snprintf(cache, sizeof cache, "%s", g4_tokenizer_cache_path(cold) ? g4_tokenizer_cache_path(cold) : "");
    CHECKF(cache[0] && !strncmp(cache, dir, strlen(dir)), "cache under G4_TOKENIZER_CACHE_DIR: '%s'", cache);
    if (g4_tokenizer_loaded_from_cache(cold)) {
        /* an earlier run left it: start over from the JSON */
        g4_tokenizer_free(cold);
        unlink(cache);
        t0 = now_s();
        CHECKF(g4_tokenizer_load(src, &cold, &err) == 0, "%s", err.msg);
        t_first = now_s() - t0;
        if (!cold) return NULL;
    }
    CHECK(!g4_tokenizer_loaded_from_cache(cold));
    CHECK(g4_file_exists(cache));

    t0 = now_s();
    CHECKF(g4_tokenizer_load(src, &warm, &err) == 0, "%s", err.msg);
    double t_warm = now_s() - t0;
    fprintf(stderr, "load: from JSON %.3f s, from cache %.3f s\n", t_first, t_warm);
    if (!warm) {
        g4_tokenizer_free(cold);
        return NULL;
    }
    CHECK(g4_tokenizer_loaded_from_cache(warm));
    CHECK(g4_tokenizer_vocab_size(warm) == g4_tokenizer_vocab_size(cold));
    CHECK(g4_tokenizer_bos_id(warm) == g4_tokenizer_bos_id(cold));
    CHECK(g4_tokenizer_eos_id(warm) == g4_tokenizer_eos_id(cold));
    /* the cold one against HF here; the warm one in main */
    CHECK(check_encode_fixtures(cold, "parsed JSON") == 0);
    CHECK(check_decode_fixtures(cold, "parsed JSON") == 0);
    g4_tokenizer_free(cold);
    return warm;
}

#define SMALL_TOKENIZER                                                                           \
    "{\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"       \
    "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"_\"},"            \
    "\"decoder\":{\"type\":\"Replace\",\"pattern\":{\"String\":\"_\"},\"content\":\" \"},"              \
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"_\":2,\"ab\":3,\"_ab\":4,\"<unk>\":5,\"<s>\":6}," \
    "\"unk_token\":\"<unk>\",\"merges\":[[\"a\",\"b\"],[\"_\",\"ab\"]]}}"

/* Rewrites a valid cache with one inconsistency but a correct checksum (what the checks
 * behind the checksum must catch). */
static int write_tampered_cache(const char *cache, const char *src, int which) {
    tok_cache_data d, w;
    tok_source_key key;
    if (tok_key_file(src, TOK_KEY_JSON, &key) || tok_cache_open(cache, &key, &d)) return -1;
    w = d;
    w.map = NULL;
    void *copy = NULL;
    int sec = which == 0 ? TOK_SEC_VOCAB_MAP : which == 1 ? TOK_SEC_MERGES : which == 3 ? TOK_SEC_ADDED
            : which == 4 ? TOK_SEC_VOCAB_OFF : -1;
    if (sec >= 0) {
        copy = malloc(d.sec[sec].size);
        memcpy(copy, d.sec[sec].data, d.sec[sec].size);
        w.sec[sec].data = copy;
    }
    if (which == 0) { /* a map entry naming a slot past the vocabulary */
        uint64_t *m = copy;
        for (size_t i = 0; i < d.sec[sec].size / 8; i++)
            if (m[i]) {
                m[i] = (m[i] & ~(uint64_t)0xffffffffu) | (d.param[TOK_P_N_SLOTS] + 7);
                break;
            }
    } else if (which == 1) { /* a merge naming an id out of range */
        ((uint32_t *)copy)[1] = (uint32_t)d.param[TOK_P_N_SLOTS] + 3;
    } else if (which == 2) { /* the merge table's size disagrees with its parameters */
        w.param[TOK_P_MERGE_MASK] = d.param[TOK_P_MERGE_MASK] * 2 + 1;
    } else if (which == 3) { /* an added token's content outside its blob */
        ((tok_added_raw *)copy)[0].len += 1000;
    } else if (which == 4) { /* an offset past the end of the pieces (they end where they must) */
        ((uint32_t *)copy)[1] = 0xfffffff0u;
    } else if (which == 5) { /* a map of 2^61 slots in 0 bytes: 2^61 * 8 wraps to 0 */
        w.param[TOK_P_VOCAB_MASK] = ((uint64_t)1 << 61) - 1;
        for (int k = TOK_SEC_VOCAB_MAP; k < TOK_SEC_COUNT; k++) w.sec[k].size = 0; /* last in the file */
    } else if (which >= 6) { /* a merge table of 2^61 slots (2^60 of 16 bytes) in 0 bytes */
        int bits = which == 6 ? 61 : 60;
        w.param[TOK_P_MERGE_MASK] = ((uint64_t)1 << bits) - 1;
        w.param[TOK_P_MERGE_SHIFT] = (uint64_t)(64 - bits);
        w.param[TOK_P_MERGE_PACKED] = which == 6;
        w.param[TOK_P_HOT_MASK] = 0; /* (the hot table goes with the packed form only) */
        for (int k = TOK_SEC_MERGE_MAIN; k < TOK_SEC_COUNT; k++) w.sec[k].size = 0; /* last in the file */
    }
    int rc = tok_cache_write(cache, &key, &w);
    free(copy);
    tok_cache_close(&d);
    return rc;
}

/* The cache's checks, on a small tokenizer: corruption, truncation, a changed source,
 * the environment switch, and the default folder ($XDG_CACHE_HOME/gemma4c, ~/.cache/gemma4c). */
static void test_cache_checks(void) {
    g4_error err;
    const char *sdir = g4t_tmp("small-tokenizer");
    mkdir(sdir, 0755);
    char src[4096], beside[4200];
    snprintf(src, sizeof src, "%s/tokenizer.json", sdir);
    snprintf(beside, sizeof beside, "%s.g4c", src);
    CHECK(write_text(src, SMALL_TOKENIZER) == 0);
    const char *dir = g4t_tmp("tokenizer-cache");
    setenv("G4_TOKENIZER_CACHE_DIR", dir, 1);
    unsetenv("G4_NO_TOKENIZER_CACHE");

    g4_tokenizer *ref, *t;
    CHECKF(g4_tokenizer_load(src, &ref, &err) == 0, "%s", err.msg);
    if (!ref) return;
    char cache[4096];
    snprintf(cache, sizeof cache, "%s", g4_tokenizer_cache_path(ref) ? g4_tokenizer_cache_path(ref) : "");
    CHECK(cache[0] != 0);
    const char *text = "ab ab<s>b a";
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t) && encode_equal(t, ref, text));
    g4_tokenizer_free(t);

    /* a flipped byte anywhere is detected (checksum): rebuilt, then used again */
    long size = file_size(cache);
    CHECK(size > 160);
    for (long at = 0; at < size; at += size / 7 + 1) {
        corrupt_byte(cache, at);
        CHECK(g4_tokenizer_load(src, &t, &err) == 0);
        CHECKF(!g4_tokenizer_loaded_from_cache(t), "a corrupt byte at %ld was not detected", at);
        CHECK(encode_equal(t, ref, text));
        g4_tokenizer_free(t);
        CHECK(g4_tokenizer_load(src, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t));
        g4_tokenizer_free(t);
    }
    /* a correct checksum over inconsistent tables (4 and up: what fuzzing found, issue 16) */
    for (int which = 0; which < 8; which++) {
        CHECKF(write_tampered_cache(cache, src, which) == 0, "tampered cache %d written", which);
        CHECK(g4_tokenizer_load(src, &t, &err) == 0);
        CHECKF(!g4_tokenizer_loaded_from_cache(t), "tampered cache %d was used", which);
        CHECK(encode_equal(t, ref, text));
        g4_tokenizer_free(t);
    }
    /* truncated */
    CHECK(truncate(cache, size / 2) == 0);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);
    CHECK(file_size(cache) == size);
    CHECK(truncate(cache, 0) == 0);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);

    /* the cache belongs to the content: a new modification time is the same tokenizer; the same size and time
     * with other content is another (and its own merges are read: "_a" is not in the vocabulary) */
    struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
    CHECK(utimensat(AT_FDCWD, src, times, 0) == 0);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t));
    g4_tokenizer_free(t);
    char *changed = strdup(SMALL_TOKENIZER);
    char *p = strstr(changed, "[\"a\",\"b\"],[\"_\",\"ab\"]");
    CHECK(p != NULL);
    if (p) memcpy(p, "[\"_\",\"a\"],[\"a\",\"b\"]", strlen("[\"_\",\"a\"],[\"a\",\"b\"]"));
    CHECK(write_text(src, changed) == 0);
    free(changed);
    CHECK(utimensat(AT_FDCWD, src, times, 0) == 0);
    CHECK(g4_tokenizer_load(src, &t, &err) == -1);
    CHECK(write_text(src, SMALL_TOKENIZER) == 0);

    /* a copy of the tokenizer in another folder: the same cache, used as it is */
    const char *cdir = g4t_tmp("small-tokenizer-copy");
    mkdir(cdir, 0755);
    char copy[4200];
    snprintf(copy, sizeof copy, "%s/tokenizer.json", cdir);
    CHECK(write_text(copy, SMALL_TOKENIZER) == 0);
    CHECK(g4_tokenizer_load(copy, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t) && g4_tokenizer_cache_path(t) &&
          !strcmp(g4_tokenizer_cache_path(t), cache) && encode_equal(t, ref, text));
    g4_tokenizer_free(t);

    /* a FIFO named as the tokenizer: an error, not a wait for a writer (its key is never read) */
    char fifo[4200];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", cdir);
    unlink(fifo);
    CHECK(mkfifo(fifo, 0644) == 0);
    alarm(60); /* (a hang ends the test) */
    CHECKF(g4_tokenizer_load(fifo, &t, &err) == -1 && strstr(err.msg, "not a regular file"), "a FIFO: %s", err.msg);
    alarm(0);
    unlink(fifo);

    /* disabled by the environment: neither read nor written */
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t) && !g4_tokenizer_cache_path(t));
    g4_tokenizer_free(t);
    unsetenv("G4_NO_TOKENIZER_CACHE");

    /* by default under $XDG_CACHE_HOME/gemma4c (else ~/.cache/gemma4c), never beside the file */
    unsetenv("G4_TOKENIZER_CACHE_DIR");
    const char *saved_xdg = getenv("XDG_CACHE_HOME"), *saved_home = getenv("HOME");
    char *xdg_was = saved_xdg ? strdup(saved_xdg) : NULL, *home_was = saved_home ? strdup(saved_home) : NULL;
    const char *xdg = g4t_tmp("xdg-cache");
    char under[4200];
    snprintf(under, sizeof under, "rm -rf '%s'", xdg); /* (what an earlier run cached there is this tokenizer's) */
    CHECK(system(under) == 0);
    snprintf(under, sizeof under, "%s/gemma4c/", xdg);
    setenv("XDG_CACHE_HOME", xdg, 1);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t));
    CHECKF(g4_tokenizer_cache_path(t) && !strncmp(g4_tokenizer_cache_path(t), under, strlen(under)),
           "cache under $XDG_CACHE_HOME/gemma4c: %s", g4_tokenizer_cache_path(t) ? g4_tokenizer_cache_path(t) : "(none)");
    CHECK(!g4_file_exists(beside));
    if (g4_tokenizer_cache_path(t)) unlink(g4_tokenizer_cache_path(t));
    g4_tokenizer_free(t);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && !g4_tokenizer_loaded_from_cache(t)); /* written again */
    g4_tokenizer_free(t);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t) && encode_equal(t, ref, text));
    g4_tokenizer_free(t);
    /* without XDG_CACHE_HOME: $HOME/.cache/gemma4c */
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", xdg, 1);
    snprintf(under, sizeof under, "%s/.cache/gemma4c/", xdg);
    CHECK(g4_tokenizer_load(src, &t, &err) == 0);
    CHECKF(g4_tokenizer_cache_path(t) && !strncmp(g4_tokenizer_cache_path(t), under, strlen(under)),
           "cache under ~/.cache/gemma4c: %s", g4_tokenizer_cache_path(t) ? g4_tokenizer_cache_path(t) : "(none)");
    g4_tokenizer_free(t);
    if (xdg_was) setenv("XDG_CACHE_HOME", xdg_was, 1);
    if (home_was) setenv("HOME", home_was, 1); else unsetenv("HOME");
    free(xdg_was);
    free(home_was);
    setenv("G4_TOKENIZER_CACHE_DIR", dir, 1);
    g4_tokenizer_free(ref);
}

/* The cache folder keeps the 16 caches used last: a write removes the oldest beyond them (a hit renews a cache), and
 * temporary files a killed writer left; other files stay. Sixteen tokenizers that differ in their bytes only (16
 * keys), their caches aged by hand (file times are coarse), then four more. */
static void test_cache_prune(void) {
    g4_error err;
    const char *dir = g4t_tmp("tokenizer-prune"), *sdir = g4t_tmp("prune-sources");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, sdir);
    CHECK(system(cmd) == 0);
    mkdir(dir, 0755);
    mkdir(sdir, 0755);
    setenv("G4_TOKENIZER_CACHE_DIR", dir, 1);
    unsetenv("G4_NO_TOKENIZER_CACHE");
    char caches[20][4300], src[4200], other[4200], stale[4200], fresh[4200];
    for (int i = 0; i < 20; i++) {
        snprintf(src, sizeof src, "%s/tok%d.json", sdir, i);
        char text[sizeof SMALL_TOKENIZER + 32];
        snprintf(text, sizeof text, "%s%*s", SMALL_TOKENIZER, i, ""); /* i spaces after the JSON */
        CHECK(write_text(src, text) == 0);
        g4_tokenizer *t = NULL;
        CHECKF(g4_tokenizer_load(src, &t, &err) == 0, "%s", err.msg);
        snprintf(caches[i], sizeof caches[i], "%s", t && g4_tokenizer_cache_path(t) ? g4_tokenizer_cache_path(t) : "");
        CHECK(t && !g4_tokenizer_loaded_from_cache(t) && g4_file_exists(caches[i]));
        g4_tokenizer_free(t);
        if (i < 16) { /* aged: i seconds after 1000000000 */
            struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000 + i, 0}};
            CHECK(utimensat(AT_FDCWD, caches[i], times, 0) == 0);
        }
        if (i == 15) {
            /* the oldest used again: renewed */
            snprintf(src, sizeof src, "%s/tok0.json", sdir);
            CHECK(g4_tokenizer_load(src, &t, &err) == 0 && g4_tokenizer_loaded_from_cache(t));
            g4_tokenizer_free(t);
            /* beside them: a file of another name, a killed writer's temporary file of an hour ago, one being written */
            snprintf(other, sizeof other, "%s/notes.txt", dir);
            snprintf(stale, sizeof stale, "%s.tmp.1.0", caches[3]);
            snprintf(fresh, sizeof fresh, "%s.tmp.2.0", caches[4]);
            CHECK(write_text(other, "x") == 0 && write_text(stale, "x") == 0 && write_text(fresh, "x") == 0);
            struct timespec old[2] = {{0, UTIME_OMIT}, {time(NULL) - 7200, 0}};
            CHECK(utimensat(AT_FDCWD, stale, old, 0) == 0);
        }
    }
    for (int i = 0; i < 20; i++)
        CHECKF(g4_file_exists(caches[i]) == !(i >= 1 && i <= 4), "cache %d of 20 %s", i,
               g4_file_exists(caches[i]) ? "kept" : "removed");
    CHECK(g4_file_exists(other) && !g4_file_exists(stale) && g4_file_exists(fresh));
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, sdir);
    CHECK(system(cmd) == 0);
}

/* ------------------------------------------------- synthetic tokenizers */

/* Small tokenizers with HF's answers (tests/data/make_tokenizer_cases.js). */
static void test_synthetic(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer_cases.json", getenv("G4_SOURCE_DIR") ? getenv("G4_SOURCE_DIR") : "..");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECKF(root != NULL, "%s: %s", path, je.text);
    if (!root) return;
    const char *dir = g4t_tmp("synthetic");
    mkdir(dir, 0755);
    char tpath[4096];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    const json_t *cases = json_object_get(root, "cases");
    size_t n_enc = 0, n_dec = 0;
    for (size_t k = 0; k < json_array_size(cases); k++) {
        const json_t *c = json_array_get(cases, k);
        const char *name = json_string_value(json_object_get(c, "name"));
        char *text = json_dumps(json_object_get(c, "tokenizer"), JSON_COMPACT);
        CHECK(text && write_text(tpath, text) == 0);
        free(text);
        g4_tokenizer *tok;
        g4_error err;
        if (g4_tokenizer_load(tpath, &tok, &err)) {
            CHECKF(0, "%s: %s", name, err.msg);
            continue;
        }
        const json_t *enc = json_object_get(c, "encode");
        for (size_t i = 0; i < json_array_size(enc); i++) {
            const json_t *e = json_array_get(enc, i);
            const json_t *jt = json_object_get(e, "text");
            int special = json_is_true(json_object_get(e, "add_special_tokens"));
            g4_tokens t = {0};
            int rc = g4_tokenize(tok, json_string_value(jt), json_string_length(jt), special, &t, &err);
            CHECKF(rc == 0 && ids_equal(&t, json_object_get(e, "ids")), "%s: encode '%s' (specials %d): %s", name,
                   json_string_value(jt), special, rc ? err.msg : "different ids");
            free(t.ids);
            n_enc++;
        }
        const json_t *dec = json_object_get(c, "decode");
        for (size_t i = 0; i < json_array_size(dec); i++) {
            const json_t *d = json_array_get(dec, i);
            size_t n;
            int32_t *ids = json_ids(json_object_get(d, "ids"), &n);
            int skip = json_is_true(json_object_get(d, "skip_special_tokens"));
            const json_t *want = json_object_get(d, "text");
            char *out;
            size_t len;
            int rc = g4_detokenize(tok, ids, n, skip, &out, &len, &err);
            CHECKF(rc == 0 && len == json_string_length(want) && !memcmp(out, json_string_value(want), len),
                   "%s: decode case %zu: got '%s', want '%s'", name, i, rc ? err.msg : out, json_string_value(want));
            if (!rc) free(out);
            CHECKF(stream_matches_batch(tok, ids, n, skip) == 0, "%s: streamed decode case %zu", name, i);
            free(ids);
            n_dec++;
        }
        g4_tokenizer_free(tok);
    }
    unsetenv("G4_NO_TOKENIZER_CACHE");
    fprintf(stderr, "synthetic tokenizers: %zu encode and %zu decode cases\n", n_enc, n_dec);
    CHECK(n_enc > 200 && n_dec > 400);
    unlink(tpath);
    json_decref(root);
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

/* A tokenizer.json whose model is MODEL_HEAD with `steps` copies of `step` in a Sequence of `kind`
 * (normalizer / pre_tokenizer / decoder, listed under `list`). */
static char *with_steps(const char *kind, const char *list, const char *step, int steps) {
    size_t cap = strlen(MODEL_HEAD) + 200 + (strlen(step) + 1) * (size_t)steps;
    char *s = malloc(cap);
    size_t n = (size_t)snprintf(s, cap, MODEL_HEAD "},\"%s\":{\"type\":\"Sequence\",\"%s\":[", kind, list);
    for (int i = 0; i < steps; i++) n += (size_t)snprintf(s + n, cap - n, "%s%s", i ? "," : "", step);
    snprintf(s + n, cap - n, "]}}");
    return s;
}

/* Hostile tokenizer.json files (issue 16): clear errors, never a crash, a hang or an explosion. */
static void test_hostile_files(void) {
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    /* 100,000 steps: each is a pass over the text (and the pre-tokenizer recursed per step) */
    char *s = with_steps("pre_tokenizer", "pretokenizers",
                         "{\"type\":\"Split\",\"pattern\":{\"String\":\"a\"},\"behavior\":\"Isolated\"}", 100000);
    expect_load_error("pre-tokenizer steps", s, "steps");
    free(s);
    s = with_steps("normalizer", "normalizers", "{\"type\":\"Prepend\",\"prepend\":\"x\"}", 100000);
    expect_load_error("normalizer steps", s, "steps");
    free(s);
    s = with_steps("decoder", "decoders", "{\"type\":\"Fuse\"}", 100000);
    expect_load_error("decoder steps", s, "steps");
    free(s);

    /* steps that multiply the text: 'a' becomes ten of them, 20 times over */
    char path[4096];
    snprintf(path, sizeof path, "%s", g4t_tmp("growing-tokenizer.json"));
    const char *tenfold = "{\"type\":\"Replace\",\"pattern\":{\"String\":\"a\"},\"content\":\"aaaaaaaaaa\"}";
    for (int dec = 0; dec < 2; dec++) {
        s = with_steps(dec ? "decoder" : "normalizer", dec ? "decoders" : "normalizers", tenfold, 20);
        CHECK(write_text(path, s) == 0);
        free(s);
        g4_tokenizer *t;
        g4_error err;
        CHECKF(g4_tokenizer_load(path, &t, &err) == 0, "%s", err.msg);
        if (!t) continue;
        g4_tokens ids = {0};
        char *out = NULL;
        size_t len;
        int32_t a = 0;
        int rc = dec ? g4_detokenize(t, &a, 1, 0, &out, &len, &err) : g4_tokenize(t, "ab", 2, 0, &ids, &err);
        CHECKF(rc == -1 && strstr(err.msg, "times longer"), "growing %s: %s", dec ? "decoder" : "normalizer",
               rc ? err.msg : "no error");
        free(out);
        free(ids.ids);
        g4_tokenizer_free(t);
    }
    unlink(path);

    /* an added token of 100,000 bytes: finding added tokens in a text of its prefix would take
     * 100,000 steps per byte */
    size_t big = 100000;
    char *huge = malloc(big + 200);
    int n0 = snprintf(huge, 200, MODEL_HEAD "},\"added_tokens\":[{\"id\":3,\"content\":\"");
    memset(huge + n0, 'a', big);
    strcpy(huge + n0 + big, "\"}]}");
    expect_load_error("long added token", huge, "at most");
    free(huge);

    /* a vocabulary made to collide in the hash table: every lookup would walk 1,100 slots */
    size_t cap = 64 + 1100 * 24, n = 0;
    char *json = malloc(cap);
    n += (size_t)snprintf(json + n, cap - n, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    int found = 0;
    for (unsigned i = 0; found < 1100; i++) {
        char piece[16];
        int len = snprintf(piece, sizeof piece, "p%u", i);
        if ((tok_hash_bytes(piece, (size_t)len, 0) & 4095) >= 64) continue; /* 1,100 pieces: 4,096 slots */
        n += (size_t)snprintf(json + n, cap - n, "%s\"%s\":%d", found ? "," : "", piece, found);
        found++;
    }
    snprintf(json + n, cap - n, "}}}");
    expect_load_error("colliding vocabulary", json, "run of more than");
    free(json);
    unsetenv("G4_NO_TOKENIZER_CACHE");
}

/* Random texts and id lists with HF's answers (tests/data/make_gemma_random_cases.js). */
static void test_random_cases(const g4_tokenizer *tok) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/gemma_random_cases.json", getenv("G4_SOURCE_DIR") ? getenv("G4_SOURCE_DIR") : "..");
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    CHECKF(root != NULL, "%s: %s", path, je.text);
    if (!root) return;
    const json_t *enc = json_object_get(root, "encode"), *dec = json_object_get(root, "decode");
    int bad = 0;
    for (size_t i = 0; i < json_array_size(enc); i++) {
        const json_t *e = json_array_get(enc, i);
        const json_t *jt = json_object_get(e, "text");
        g4_tokens t = {0};
        g4_error err;
        int rc = g4_tokenize(tok, json_string_value(jt), json_string_length(jt),
                             json_is_true(json_object_get(e, "add_special_tokens")), &t, &err);
        if (rc || !ids_equal(&t, json_object_get(e, "ids"))) {
            bad++;
            fprintf(stderr, "random encode case %zu differs (%s)\n", i, rc ? err.msg : "ids");
        }
        free(t.ids);
    }
    for (size_t i = 0; i < json_array_size(dec); i++) {
        const json_t *d = json_array_get(dec, i);
        size_t n;
        int32_t *ids = json_ids(json_object_get(d, "ids"), &n);
        int skip = json_is_true(json_object_get(d, "skip_special_tokens"));
        const json_t *want = json_object_get(d, "text");
        char *out;
        size_t len;
        g4_error err;
        int rc = g4_detokenize(tok, ids, n, skip, &out, &len, &err);
        if (rc || len != json_string_length(want) || memcmp(out, json_string_value(want), len)) {
            bad++;
            fprintf(stderr, "random decode case %zu differs (%s)\n", i, rc ? err.msg : "text");
        }
        if (!rc) free(out);
        if (stream_matches_batch(tok, ids, n, skip)) {
            bad++;
            fprintf(stderr, "random decode case %zu differs when streamed\n", i);
        }
        free(ids);
    }
    CHECKF(bad == 0, "%d random cases differ from HF", bad);
    CHECK(json_array_size(enc) >= 400 && json_array_size(dec) >= 400);
    fprintf(stderr, "random cases: %zu encode, %zu decode\n", json_array_size(enc), json_array_size(dec));
    json_decref(root);
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

    g4_tokenizer *tok = test_cache_real(src);
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
    test_random_cases(tok);
    test_round_trip(tok);
    g4_tokenizer_free(tok);

    test_cache_checks();
    test_cache_prune();
    test_hostile_files();
    test_synthetic();
    test_bad_files();

    free_jsonl(&enc_fx);
    free_jsonl(&dec_fx);
    return g4t_done();
}
