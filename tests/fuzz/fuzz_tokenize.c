/* Encoding and decoding arbitrary bytes (src/tokenizer/tok_encode.c, tok_decode.c) with the real
 * Gemma 4 tokenizer and the synthetic ones of tests/data/tokenizer_cases.json (byte fallback,
 * normalizers, splits, prefixes, ...).  Input: byte 0 picks the tokenizer, byte 1 the options,
 * the rest is the text, and also read as ids to decode. */
#include <jansson.h>

#include "fuzz_tok.h"

static g4_tokenizer *toks[64];
static int n_toks;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g4_error err;
    /* the real one through its usual cache (beside it, or in ~/.cache): fast after the first time */
    unsetenv("G4_TOKENIZER_CACHE_DIR");
    unsetenv("G4_NO_TOKENIZER_CACHE");
    if (g4_tokenizer_load(fuzz_shared("tokenizer/tokenizer.json"), &toks[0], &err) == 0) n_toks = 1;
    else fprintf(stderr, "fuzz_tokenize: no Gemma tokenizer: %s\n", err.msg);
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    json_t *root = json_load_file(fuzz_source("tests/data/tokenizer_cases.json"), 0, NULL);
    const json_t *cases = json_object_get(root, "cases");
    for (size_t k = 0; k < json_array_size(cases) && n_toks < 64; k++) {
        char *text = json_dumps(json_object_get(json_array_get(cases, k), "tokenizer"), JSON_COMPACT);
        const char *path = fuzz_tmp("synthetic.json");
        if (text) fuzz_write_file(path, text, strlen(text));
        free(text);
        if (g4_tokenizer_load(path, &toks[n_toks], &err) == 0) n_toks++;
    }
    json_decref(root);
    if (!n_toks) abort();
    fprintf(stderr, "fuzz_tokenize: %d tokenizers\n", n_toks);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const g4_tokenizer *tok = toks[data[0] % n_toks];
    int opts = data[1];
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    fuzz_tokenizer(tok, text, len, opts & 1);
    /* the bytes as ids: in range (mostly), or raw */
    size_t n = len / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int vocab = g4_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, text + 4 * i, 4);
        ids[i] = (opts & 4) ? v : (int32_t)((uint32_t)v % (uint32_t)vocab);
    }
    fuzz_decode(tok, ids, n, (opts >> 1) & 1);
    free(ids);
    return 0;
}
