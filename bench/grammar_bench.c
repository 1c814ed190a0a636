/* What constrained decoding costs per token (src/engine/grammar.h): a fresh walk through a GBNF grammar along
 * a document's token ids (a new request's), each step the mask over the whole vocabulary (g4_gr_match_mask on
 * logits of zeros) and then the step's token (g4_gr_match_accept). bench/grammar_speed.sh runs it beside
 * bench/llama_grammar.c (llama.cpp's grammar sampler on the same grammar and ids).
 *
 *   g4-grammar-bench TOKENIZER.json GRAMMAR.gbnf IDS ROUNDS
 *
 * IDS: the document's ids, comma-separated (each must be allowed where it stands: checked). Prints one line:
 * tokens, then the median over rounds of the whole document's milliseconds, and ms a token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar_bench.h"

#include "engine/grammar.h"
#include "gemma4c.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: g4-grammar-bench TOKENIZER.json GRAMMAR.gbnf IDS ROUNDS\n");
        return 2;
    }
    g4_error err;
    g4_tokenizer *tok;
    g4_gr_tokens *tokens;
    g4_grammar *g;
    char *text = slurp(argv[2]), *ids_text = slurp(argv[3]);
    if (!text || !ids_text) {
        fprintf(stderr, "cannot read %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    if (g4_tokenizer_load(argv[1], &tok, &err) ||
        g4_gr_tokens_new(tok, g4_tokenizer_vocab_size(tok), &tokens, &err) || g4_grammar_gbnf(text, &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int n;
    int32_t *ids = parse_ids(ids_text, &n);
    const int V = g4_tokenizer_vocab_size(tok), rounds = atoi(argv[4]) > 0 ? atoi(argv[4]) : 1;
    float *logits = malloc((size_t)V * sizeof *logits);
    double *ms = malloc((size_t)rounds * sizeof *ms);
    const int32_t eos = 1;
    for (int r = 0; r < rounds; r++) {
        g4_gr_match *m;
        if (g4_gr_match_new(g, tokens, tok, &eos, 1, 0, &m, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        double t = 0;
        for (int i = 0; i < n; i++) {
            memset(logits, 0, (size_t)V * sizeof *logits); /* (not timed: the model's logits arrive filled) */
            const double t0 = now_ms();
            g4_gr_match_mask(m, logits);
            const int refused = logits[ids[i]] == -INFINITY || g4_gr_match_accept(m, ids[i]);
            t += now_ms() - t0;
            if (refused) {
                fprintf(stderr, "token %d (id %d) is refused by the grammar\n", i, ids[i]);
                return 1;
            }
        }
        ms[r] = t;
        g4_gr_match_free(m);
    }
    const double mid = median(ms, rounds);
    printf("%d %.3f %.4f\n", n, mid, mid / n);
    free(ms);
    free(logits);
    free(ids);
    free(text);
    free(ids_text);
    g4_grammar_free(g);
    g4_gr_tokens_free(tokens);
    g4_tokenizer_free(tok);
    return 0;
}
