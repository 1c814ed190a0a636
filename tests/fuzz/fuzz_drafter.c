/* A drafter's config.json against its weights and its main model (src/model/config.c
 * gemma4_assistant, src/model/model.c, src/model/drafter.c, src/engine/speculative.c): the first
 * byte picks the dense-head or the centroid-head drafter of ../shared/fixtures/assistant, the rest
 * is its config.json.  A drafter the weights or the main model do not fit must be refused with one
 * line; one that loads must run a prefill and two speculative rounds whose tokens are in the
 * vocabulary. */
#include "fuzz.h"

static const char *const drafters[] = {"assistant-lmhead", "assistant-ordered"};
#define N_DRAFTERS (int)(sizeof drafters / sizeof drafters[0])
static char dirs[N_DRAFTERS][600];
static g4_model *main_model;
static g4_context *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < N_DRAFTERS; i++) {
        snprintf(dirs[i], sizeof dirs[i], "%s", fuzz_tmp(drafters[i]));
        char target[4096], link[700];
        snprintf(target, sizeof target, "%s", fuzz_shared("fixtures/assistant"));
        snprintf(target + strlen(target), sizeof target - strlen(target), "/%s/model.safetensors", drafters[i]);
        snprintf(link, sizeof link, "%s/model.safetensors", dirs[i]);
        if (mkdir(dirs[i], 0700) != 0 || symlink(target, link) != 0) {
            perror(dirs[i]);
            abort();
        }
    }
    g4_load_params lp = {.n_threads = 1, .device = "cpu"};
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 64, .n_batch = 24, .kv_block_size = 8};
    g4_error err = {{0}};
    if (g4_model_load(fuzz_shared("fixtures/assistant"), &lp, &main_model, &err) ||
        g4_context_new(main_model, &cp, &ctx, &err)) {
        fprintf(stderr, "main model: %s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *dir = dirs[data[0] % N_DRAFTERS];
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    fuzz_write_file(path, data + 1, size - 1);

    g4_drafter *d = NULL;
    g4_error err = {{0}};
    int rc = g4_drafter_load(dir, main_model, &d, &err);
    fuzz_expect_error(rc, &err);
    if (rc) return 0;
    g4_seq_reset(ctx, 0);
    g4_spec_params sp = {.n_draft = 4};
    g4_spec *s = NULL;
    rc = g4_spec_new(ctx, 0, d, &sp, &s, &err);
    fuzz_expect_error(rc, &err);
    const int V = g4_model_vocab_size(main_model);
    float *logits = malloc((size_t)V * sizeof *logits);
    fuzz_expect(logits != NULL);
    int32_t prompt[20], out[5];
    for (int i = 0; i < 20; i++) prompt[i] = (int32_t)((i * 37 + 2) % V);
    if (!rc) {
        rc = g4_spec_prefill(s, prompt, 20, logits, &err);
        fuzz_expect_error(rc, &err);
    }
    int32_t last = 3;
    for (int r = 0; !rc && r < 2; r++) {
        int n = 0;
        rc = g4_spec_round(s, last, 8, NULL, out, &n, &err);
        fuzz_expect_error(rc, &err);
        if (rc) break;
        fuzz_expect(n >= 1 && n <= 5);
        for (int i = 0; i < n; i++) fuzz_expect(out[i] >= 0 && out[i] < V);
        last = out[n - 1];
    }
    free(logits);
    g4_spec_free(s);
    g4_drafter_free(d);
    return 0;
}
