/* A small program against llama.cpp's public C API (built by bench/llamacpp.sh, never by
 * our build): runs a GGUF on the given token ids and writes
 *   OUT.logits.f32  float32 logits [n_ids, vocab] of one forward of all ids
 *   OUT.greedy.txt  the ids of N greedy tokens after them (one forward per token)
 * so that bench/llamacpp.sh can compare llama.cpp and gemma4c on the same file.
 * usage: llama-logits MODEL.gguf 2,17,99,... N OUT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS N OUT\n", argv[0]);
        return 2;
    }
    int ids[4096], n = 0, N = atoi(argv[3]);
    for (char *p = argv[2]; *p && n < 4096;) {
        ids[n++] = (int)strtol(p, &p, 10);
        if (*p == ',') p++;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + N + 8);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n + 8);
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(n + 8, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) return 1;
    char path[4096];
    snprintf(path, sizeof path, "%s.logits.f32", argv[4]);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < n; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)V, f);
    fclose(f);
    snprintf(path, sizeof path, "%s.greedy.txt", argv[4]);
    f = fopen(path, "w");
    int pos = n;
    const float *lg = llama_get_logits_ith(ctx, n - 1);
    for (int k = 0; k < N; k++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        fprintf(f, "%s%d", k ? "," : "", best);
        b.n_tokens = 1;
        b.token[0] = best;
        b.pos[0] = pos++;
        b.logits[0] = 1;
        if (llama_decode(ctx, b)) return 1;
        lg = llama_get_logits_ith(ctx, 0);
    }
    fprintf(f, "\n");
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
