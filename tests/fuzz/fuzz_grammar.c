/* Grammars of constrained decoding (src/engine/json_schema.c, gbnf.c, grammar.c) from hostile specs.  Input: byte 0
 * picks the spec's kind (bits 0-1: JSON Schema, tools, GBNF, a regular expression; for tools bit 2 names the function
 * "f", bit 3 allows one call) and bit 4 a thinking channel first; the rest up to a NUL byte is the
 * spec, what follows the output fed to the grammar (bytes, and byte 0x01 as the next special token the grammar
 * may take).  A spec compiles or fails with a one-line message; output is read or refused, never a crash. */
#include "engine/grammar.h"
#include "fuzz.h"
#include "tokenizer/tokenizer.h"

static g4_tokenizer *tok;
static g4_gr_tokens *tokens;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g4_error err;
    unsetenv("G4_TOKENIZER_CACHE_DIR");
    unsetenv("G4_NO_TOKENIZER_CACHE");
    if (g4_tokenizer_load(fuzz_shared("tokenizer/tokenizer.json"), &tok, &err) ||
        g4_gr_tokens_new(tok, g4_tokenizer_vocab_size(tok), &tokens, &err)) {
        fprintf(stderr, "fuzz_grammar: %s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int mode = data[0];
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    const size_t spec_len = nul ? (size_t)(nul - data - 1) : size - 1;
    char *spec = malloc(spec_len + 1);
    memcpy(spec, data + 1, spec_len);
    spec[spec_len] = 0;
    g4_grammar *g = NULL;
    g4_error err = {{0}};
    int rc;
    switch (mode & 3) {
    case 0: rc = g4_grammar_json_schema(spec, &g, &err); break;
    case 1: rc = g4_grammar_tool_calls(spec, mode & 4 ? "f" : NULL, mode & 8 ? 1 : 0, &g, &err); break;
    case 2: rc = g4_grammar_gbnf(spec, &g, &err); break;
    default: rc = g4_grammar_regex(spec, &g, &err); break;
    }
    fuzz_expect_error(rc, &err);
    free(spec);
    if (rc) return 0;
    fuzz_expect(g != NULL);
    g4_gr_match *m;
    const int32_t eos = 1;
    if (g4_gr_match_new(g, tokens, tok, &eos, 1, mode >> 4 & 1, &m, &err)) {
        fuzz_expect_error(-1, &err);
        g4_grammar_free(g);
        return 0;
    }
    const uint8_t *out = nul ? nul + 1 : data + size;
    const int32_t specials[] = {48, 49, 52, 100, 101}; /* <|tool_call>, <tool_call|>, <|"|>, <|channel>, <channel|> */
    int k = 0;
    for (; out < data + size; out++) {
        if (*out == 1) {
            g4_gr_match_accept(m, specials[k++ % 5]);
        } else {
            (void)g4_gr_match_try(m, (const char *)out, 1);
            g4_gr_match_feed(m, (const char *)out, 1);
        }
        if (g4_gr_match_done(m)) fuzz_expect(g4_gr_match_accepting(m));
    }
    g4_gr_match_free(m);
    g4_grammar_free(g);
    return 0;
}
