/* The tokenizer's binary cache (src/tokenizer/tok_cache.c, tok_load.c adopt_cache): the input is
 * a cache file; the harness re-seals it (source key and checksum, tok_cache_reseal) so that the
 * checks behind the checksum see it, as they would see a cache shipped in a downloaded model
 * folder.  The source tokenizer.json is not valid, so a refused cache is not rebuilt. */
#include "fuzz_tok.h"
#include "tokenizer/tok_internal.h"

static char src[600], cache[700];
static tok_source_key key;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(src, sizeof src, "%s", fuzz_tmp("tokenizer.json"));
    fuzz_write_file(src, "{}", 2);
    setenv("G4_TOKENIZER_CACHE_DIR", fuzz_tmp("cache"), 1);
    unsetenv("G4_NO_TOKENIZER_CACHE");
    if (tok_key_file(src, TOK_KEY_JSON, &key)) abort();
    char *path = tok_cache_path(&key);
    if (!path) abort();
    snprintf(cache, sizeof cache, "%s", path);
    free(path);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned char *file;
    static size_t cap;
    if (size > cap) { /* kept across inputs: a fresh big block per input is slow under ASan */
        free(file);
        file = malloc(cap = size);
    }
    if (size) memcpy(file, data, size);
    tok_cache_reseal(file, size, &key); /* fails only for files shorter than a header */
    fuzz_write_file(cache, file, size);
    g4_tokenizer *tok = NULL;
    g4_error err = {{0}};
    int rc = g4_tokenizer_load(src, &tok, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        fuzz_expect(g4_tokenizer_loaded_from_cache(tok));
        static const char text[] = "Hello, world!  ab ba\n\t<s><bos> \xc3\xa9t\xc3\xa9 \xe2\x96\x81x \xf0\x9f\x98\x80";
        fuzz_tokenizer(tok, text, sizeof text - 1, 1);
        g4_tokenizer_free(tok);
    }
    return 0;
}
