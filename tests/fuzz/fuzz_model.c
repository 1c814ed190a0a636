/* config.json against the weights it describes (src/model/config.c, src/model/model.c, src/engine/):
 * the first byte picks one of three small checkpoints of ../shared/fixtures (PLE + KV sharing,
 * keys-as-values, MoE), the rest is its config.json.  A config the weights do not fit must be
 * refused with one line; one that loads must run a prefill that crosses the sliding window and
 * two decode steps with finite logits. */
#include <math.h>

#include "fuzz.h"

static const char *const fixtures[] = {"dense-ple", "dense-keqv", "moe"};
#define N_FIXTURES (int)(sizeof fixtures / sizeof fixtures[0])
static char dirs[N_FIXTURES][600];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < N_FIXTURES; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s", fuzz_tmp(fixtures[i]));
        char target[4096], link[700];
        snprintf(target, sizeof target, "%s", fuzz_shared("fixtures"));
        snprintf(target + strlen(target), sizeof target - strlen(target), "/%s/model.safetensors", fixtures[i]);
        snprintf(link, sizeof link, "%s/model.safetensors", dirs[i]);
        if (mkdir(dirs[i], 0700) != 0 || symlink(target, link) != 0) {
            perror(dirs[i]);
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *dir = dirs[data[0] % N_FIXTURES];
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    fuzz_write_file(path, data + 1, size - 1);

    g4_load_params lp = {.n_threads = 1, .device = "cpu"};
    g4_model *m = NULL;
    g4_error err = {{0}};
    int rc = g4_model_load(dir, &lp, &m, &err);
    fuzz_expect_error(rc, &err);
    if (rc) return 0;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 40, .n_batch = 24, .kv_block_size = 8};
    g4_context *ctx = NULL;
    rc = g4_context_new(m, &cp, &ctx, &err);
    fuzz_expect_error(rc, &err);
    const int V = g4_model_vocab_size(m);
    float *logits = rc ? NULL : malloc((size_t)24 * (size_t)V * sizeof *logits);
    if (!rc) fuzz_expect(logits != NULL);
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = (int32_t)((i * 37 + 2) % V);
    const int steps[3] = {20, 1, 1};
    for (int s = 0, at = 0; !rc && s < 3; at += steps[s], s++) {
        g4_batch b = {.n_tokens = steps[s], .token = ids + at};
        rc = g4_decode(ctx, &b, logits, &err);
        fuzz_expect_error(rc, &err);
        for (size_t i = 0; !rc && i < (size_t)steps[s] * (size_t)V; i++) fuzz_expect(isfinite(logits[i]));
    }
    free(logits);
    g4_context_free(ctx);
    g4_model_free(m);
    return 0;
}
