/* The server engine's default number of sequences (srv_engine_auto_parallel, src/server/engine.h): 4 on the CPU;
 * on a GPU (the CUDA backend, or its CPU emulator with G4_EMU_MEMORY_MB of device memory) as many as the free
 * memory holds the KV cache of, less the reserve for the steps: an engine of that many sequences is made, takes
 * no more than that, and one sequence more would not have fitted (below the cap). */
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "check.h"
#include "server/engine.h"

#define FIXTURE "fixtures/dense-ple"

static g4_model *load(const char *device) {
    g4_error err;
    g4_model *m = NULL;
    g4_load_params lp = {.n_threads = 2, .device = device};
    CHECKF(g4_model_load(g4t_shared(FIXTURE), &lp, &m, &err) == 0, "%s: %s", device, err.msg);
    return m;
}

#ifdef G4_WITH_CUDA
/* auto-sizes at n_ctx, then makes the engine and compares what it took with what was free */
static void check_sizing(g4_model *m, int n_ctx, const char *label) {
    g4_error err;
    size_t free_b = 0, total = 0;
    CHECKF(g4_model_memory(m, &free_b, &total, &err) == 0, "%s: %s", label, err.msg);
    char note[256];
    const int n = srv_engine_auto_parallel(m, NULL, n_ctx, G4_KV_BF16, note, sizeof note);
    printf("%s, context %d: parallel %d (%s)\n", label, n_ctx, n, note);
    CHECKF(n >= 1 && n <= SRV_GPU_PARALLEL_MAX, "%s: %d sequences", label, n);
    const size_t reserve = total / 20 > G4_STEP_RESERVE_BYTES ? total / 20 : G4_STEP_RESERVE_BYTES;
    srv_engine *e = NULL;
    if (srv_engine_new(m, NULL, 0, n, n_ctx, G4_KV_BF16, 16, NULL, NULL, &e, &err)) {
        CHECKF(0, "%s: an engine of %d sequences: %s", label, n, err.msg);
        return;
    }
    size_t after = 0;
    CHECK(g4_model_memory(m, &after, &total, &err) == 0);
    g4_context_params cp = {.n_seq_max = n, .n_ctx = n_ctx, .n_batch = 2048, .kv_history = -1, .kv_type = G4_KV_BF16};
    const size_t kv = g4_kv_bytes_needed(m, &cp, &err);
    /* the engine's KV cache took device memory, and it fits in what was free less the reserve */
    CHECKF(kv > 0 && free_b - after >= kv, "%s: the KV cache of %.3f GB, %.3f GB taken", label, (double)kv / 1e9,
           (double)(free_b - after) / 1e9);
    CHECKF(n == 1 || kv + reserve <= free_b, "%s: %d sequences' KV cache of %.3f GB, %.3f GB free (reserve %.3f)",
           label, n, (double)kv / 1e9, (double)free_b / 1e9, (double)reserve / 1e9);
    srv_engine_free(e);
    if (n < SRV_GPU_PARALLEL_MAX) { /* one more would not have fitted beside the reserve */
        cp.n_seq_max = n + 1;
        const size_t more = g4_kv_bytes_needed(m, &cp, &err);
        CHECKF(more != 0 && more + reserve > free_b, "%s: %d sequences would take %.3f GB of %.3f GB free", label,
               n + 1, (double)more / 1e9, (double)free_b / 1e9);
    }
}

#endif

int main(void) {
    g4_model *m = load("cpu");
    if (m) {
        char note[256];
        CHECK(srv_engine_auto_parallel(m, NULL, 512, G4_KV_F32, note, sizeof note) == SRV_CPU_PARALLEL);
        g4_model_free(m);
    }
#ifdef G4_WITH_CUDA
    if (!g4_cuda_available()) {
        fprintf(stderr, "no GPU here: the GPU's sizing is not run\n");
        return g4t_done();
    }
    if (!(m = load("cuda"))) return g4t_done();
    check_sizing(m, 4096, "the device's memory");
#ifdef G4_CUDA_EMULATED
    {   /* the emulator: a card small enough that the KV cache bounds the sequences */
        const char *emu = getenv("G4_EMU_MEMORY_MB");
        for (int mb = 2100; mb <= 2400; mb += 300) {
            char v[16];
            snprintf(v, sizeof v, "%d", mb);
            setenv("G4_EMU_MEMORY_MB", v, 1);
            char label[64];
            snprintf(label, sizeof label, "an emulated card of %d MB", mb);
            check_sizing(m, 4096, label);
        }
        if (emu) setenv("G4_EMU_MEMORY_MB", emu, 1);
        else unsetenv("G4_EMU_MEMORY_MB");
    }
#endif
    g4_model_free(m);
#else
    fprintf(stderr, "no CUDA backend in this build: the GPU's sizing is not run\n");
#endif
    return g4t_done();
}
