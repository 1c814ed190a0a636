/* The peer of bench/grammar_bench.c, against llama.cpp's public C API (built by bench/grammar_speed.sh, never by
 * our build): a fresh llama.cpp grammar sampler (llama_sampler_init_grammar) walks a document's token ids, each step
 * applied to every token of the vocabulary (llama_sampler_apply on logits of zeros) and then the step's token
 * (llama_sampler_accept), as llama.cpp's sampling chain does when a request has a grammar.
 *
 *   llama-grammar MODEL.gguf GRAMMAR.gbnf IDS ROUNDS      (only the GGUF's vocabulary is loaded)
 *
 * Prints what g4-grammar-bench prints: tokens, the median whole-document milliseconds, ms a token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar_bench.h"

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)text, (void)user;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: llama-grammar MODEL.gguf GRAMMAR.gbnf IDS ROUNDS\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    char *text = slurp(argv[2]), *ids_text = slurp(argv[3]);
    if (!model || !text || !ids_text) {
        fprintf(stderr, "cannot load %s, %s or %s\n", argv[1], argv[2], argv[3]);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int V = llama_vocab_n_tokens(vocab), rounds = atoi(argv[4]) > 0 ? atoi(argv[4]) : 1;
    int n;
    int32_t *ids = parse_ids(ids_text, &n);
    llama_token_data *cand = malloc((size_t)V * sizeof *cand);
    double *ms = malloc((size_t)rounds * sizeof *ms);
    for (int r = 0; r < rounds; r++) {
        struct llama_sampler *s = llama_sampler_init_grammar(vocab, text, "root");
        if (!s) {
            fprintf(stderr, "llama.cpp refuses the grammar\n");
            return 1;
        }
        double t = 0;
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < V; k++) cand[k] = (llama_token_data){k, 0.0f, 0.0f}; /* (not timed) */
            llama_token_data_array arr = {cand, (size_t)V, -1, false};
            double t0 = now_ms();
            llama_sampler_apply(s, &arr);
            t += now_ms() - t0;
            int refused = 1; /* (not timed) */
            for (size_t k = 0; k < arr.size; k++)
                if (arr.data[k].id == ids[i]) refused = arr.data[k].logit == -INFINITY;
            t0 = now_ms();
            llama_sampler_accept(s, ids[i]);
            t += now_ms() - t0;
            if (refused) {
                fprintf(stderr, "token %d (id %d) is refused by the grammar\n", i, ids[i]);
                return 1;
            }
        }
        ms[r] = t;
        llama_sampler_free(s);
    }
    const double mid = median(ms, rounds);
    printf("%d %.3f %.4f\n", n, mid, mid / n);
    free(ms);
    free(cand);
    free(ids);
    free(text);
    free(ids_text);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
