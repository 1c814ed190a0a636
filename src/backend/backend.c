/* Choosing a backend by device name (src/backend/backend.h). */
#include "backend/backend.h"

#include <string.h>

#include "core/error.h"

const char *g4_backends_built(void) {
#ifdef G4_WITH_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}

g4_backend *g4_backend_new(const char *device, int n_threads, int bf16_act, g4_error *err) {
    if (!device || !strcmp(device, "auto")) {
#ifdef G4_WITH_CUDA
        if (g4_cuda_available()) return g4_backend_cuda_new(bf16_act, err);
#endif
        return g4_backend_cpu_new(n_threads, bf16_act, err);
    }
    if (!strcmp(device, "cpu")) return g4_backend_cpu_new(n_threads, bf16_act, err);
    if (!strcmp(device, "cuda")) {
#ifdef G4_WITH_CUDA
        return g4_backend_cuda_new(bf16_act, err);
#else
        g4_fail(err, "device 'cuda': this build has no CUDA backend (built: %s; configure with -DGEMMA4C_CUDA=ON)",
                g4_backends_built());
        return NULL;
#endif
    }
    g4_fail(err, "unknown device '%s' (built: %s)", device, g4_backends_built());
    return NULL;
}
