/* tokenizer.json (src/tokenizer/tok_load.c): vocabulary, merges, added tokens, normalizer,
 * pre-tokenizer, post-processor, decoder; what loads is then used (fuzz_tok.h). */
#include "fuzz_tok.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_tmp("tokenizer.json");
    fuzz_write_file(path, data, size);
    g4_tokenizer *tok = NULL;
    g4_error err = {{0}};
    int rc = g4_tokenizer_load(path, &tok, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        static const char text[] = "Hello, world!  ab ba\n\t<s><bos> \xc3\xa9t\xc3\xa9 \xe2\x96\x81x \xf0\x9f\x98\x80 <0x41>a";
        fuzz_tokenizer(tok, text, sizeof text - 1, 1);
        g4_tokenizer_free(tok);
    }
    return 0;
}
