/* A small program against llama.cpp's public C API (built by bench/llamacpp.sh, never by
 * our build): runs a GGUF on the given token ids and writes
 *   OUT.logits.f32  float32 logits [n_ids, vocab] of one forward of all ids
 *   OUT.greedy.txt  the ids of N greedy tokens after them (one forward per token)
 * so that bench/llamacpp.sh can compare llama.cpp and gemma4c on the same file.
 * usage: llama-logits MODEL.gguf 2,17,99,... N OUT
 *        llama-logits --bench MODEL.gguf P N THREADS REPEATS
 * The second form times what llama-bench times (a P-token prefill into an empty cache; N
 * one-token decodes from an empty cache; after one warm-up of each) and prints
 * "pp<P> <tok/s>" and "tg<N> <tok/s>" per repeat, for when llama-bench is not built. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)text, (void)user;
}

static int bench(int argc, char **argv) {
    if (argc != 7) return 2;
    const int P = atoi(argv[3]), N = atoi(argv[4]), T = atoi(argv[5]), R = atoi(argv[6]);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[2], llama_model_default_params());
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(P + N + 16);
    cp.n_batch = (uint32_t)(P > 512 ? P : 512);
    cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = T;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch b = llama_batch_init(P > 1 ? P : 1, 0, 1);
    unsigned s = 1;
    for (int r = -1; r < R; r++) { /* r = -1: warm-up */
        llama_memory_clear(llama_get_memory(ctx), true);
        for (int i = 0; i < P; i++) {
            s = s * 1103515245u + 12345u;
            b.token[i] = (int)(3 + (s >> 8) % (unsigned)(V - 3));
            b.pos[i] = i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = i == P - 1;
        }
        b.n_tokens = P;
        double t0 = now_s();
        if (P > 0 && llama_decode(ctx, b)) return 1;
        llama_synchronize(ctx);
        double t1 = now_s();
        llama_memory_clear(llama_get_memory(ctx), true);
        for (int i = 0; i < N; i++) {
            s = s * 1103515245u + 12345u;
            b.token[0] = (int)(3 + (s >> 8) % (unsigned)(V - 3));
            b.pos[0] = i;
            b.logits[0] = 1;
            b.n_tokens = 1;
            if (llama_decode(ctx, b)) return 1;
        }
        llama_synchronize(ctx);
        double t2 = now_s();
        if (r >= 0) printf("pp%d %.2f\ntg%d %.2f\n", P, P / (t1 - t0), N, N / (t2 - t1));
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

int main(int argc, char **argv) {
    llama_log_set(quiet, NULL);
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench(argc, argv);
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
    /* f32 K/V and plain attention: the comparison is about the weights, not f16 caches */
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
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
