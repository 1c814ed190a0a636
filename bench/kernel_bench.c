/* Kernel throughput of the CPU backend's matmul on one thread, per instruction set:
 *   g4-kernel-bench [rows=4096] [in=1536] [tokens=1,64] [type: one of the names below, e.g. q4_k]
 * prints GMAC/s (multiply-adds per second) and, for one token, GB/s of weights read,
 * for each weight type (F32/BF16 tiled f32, BF16 with bf16 activations (bf16-act: vdpbf16ps
 * where the CPU has it), the GGUF types and MLX 4/8-bit (held as AF4 / AF8) with int8 activations where the set
 * takes them (g4_cpu_q8_supported), else rows decoded to f32) and each
 * ISA this CPU has. Time is the process's CPU time (one thread), so that other load on the
 * machine changes the figures little; compare ISAs and types within one run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "core/quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int rows = argc > 1 ? atoi(argv[1]) : 4096, in = argc > 2 ? atoi(argv[2]) : 1536;
    int toks[2] = {1, 64};
    if (argc > 3) toks[0] = toks[1] = atoi(argv[3]);
    g4_error err;
    g4_backend *be_f32 = g4_backend_cpu_new(1, 0, &err), *be_bf16 = g4_backend_cpu_new(1, 1, &err);
    if (!be_f32 || !be_bf16) return 1;
    float *wf = malloc((size_t)rows * in * sizeof(float)), *x = malloc((size_t)64 * in * sizeof(float));
    float *y = malloc((size_t)64 * rows * sizeof(float));
    unsigned s = 1;
    for (size_t i = 0; i < (size_t)rows * in; i++) wf[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / 8388608.0f - 1.0f;
    for (size_t i = 0; i < (size_t)64 * in; i++) x[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / 8388608.0f - 1.0f;
    g4_dtype types[] = {G4_BF16,  G4_BF16, G4_Q8_0,   G4_Q4_0, G4_Q5_0, G4_IQ4_NL,
                        G4_Q4_K,  G4_Q5_K, G4_Q6_K,   G4_Q3_K,   G4_IQ4_XS, G4_MLX4, G4_MLX8};
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++) {
        if (argc > 4 && strcasecmp(argv[4], g4_dtype_name(types[ti]))) continue;
        g4_backend *be = ti == 1 ? be_bf16 : be_f32;
        const int mlx = g4_dtype_is_mlx(types[ti]), group = 64; /* (MLX: bf16 scales and biases, as mlx-lm writes) */
        size_t rb = g4_dtype_row_bytes(types[ti], in), sb = mlx ? (size_t)(in / group) * 2 : 0;
        unsigned char *wq = malloc(rb * (size_t)rows), *sc = malloc(sb * (size_t)rows + 1),
                      *bi = malloc(sb * (size_t)rows + 1);
        for (int r = 0; r < rows; r++)
            if (mlx)
                g4_mlx_quant_row(g4_mlx_bits(types[ti]), group, wf + (size_t)r * in, in, wq + (size_t)r * rb,
                                 sc + (size_t)r * sb, bi + (size_t)r * sb, G4_BF16);
            else
                g4_quant(types[ti], wf + (size_t)r * in, wq + (size_t)r * rb, in);
        g4_tensor host = {.name = "w", .dtype = types[ti], .ndim = 2, .shape = {rows, in}, .data = wq,
                          .nbytes = rb * (size_t)rows, .scales = sc, .biases = bi, .scale_dtype = G4_BF16,
                          .group = mlx ? group : 0},
                  w;
        if (be->ops->upload_weight(be, &host, &w, &err)) return 1; /* (the CPU holds MLX as AF4 / AF8) */
        rb = w.nbytes / (size_t)rows;
        for (int k = 0; k < (toks[0] == toks[1] ? 1 : 2); k++) {
            int n = toks[k];
            for (int ii = 0; g4_cpu_isas[ii]; ii++) {
                const g4_cpu_kernels *kk = g4_cpu_kernels_for(g4_cpu_isas[ii]);
                if (!kk) continue;
                g4_cpu_kernels_use(kk);
                int iters = 0;
                double t0 = now(), t1;
                do {
                    be->ops->matmul(be, x, n, &w, NULL, y);
                    iters++;
                    t1 = now();
                } while (t1 - t0 < 0.5 && !(ii == 0 && iters >= 1));
                double per = (t1 - t0) / iters;
                printf("%-13s n=%-3d %-8s %8.2f GMAC/s  %7.2f GB/s weights\n", ti == 1 ? "bf16 bf16-act" : g4_dtype_name(types[ti]), n,
                       g4_cpu_isas[ii],
                       (double)rows * in * n / per * 1e-9, (double)rb * rows / per * 1e-9);
            }
        }
        be->ops->release_weight(be, &w);
        free(wq), free(sc), free(bi);
    }
    g4_backend_free(be_f32);
    g4_backend_free(be_bf16);
    return 0;
}
