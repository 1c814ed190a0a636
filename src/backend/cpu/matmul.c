/* y[n, out] = x[n, in] * W^T on the CPU for float weights (F32, BF16, F16).
 * Work is split over output rows. One token (decode) streams each weight row once
 * through a fused convert+dot kernel; several tokens take a block of weight rows
 * (converted to f32 once, about BLOCK_FLOATS in all, so that it stays in the L2 cache)
 * through every token in 4 x 4 register tiles (4 tokens by 4 rows). */
#include <string.h>

#include "backend/cpu/cpu.h"

#define ROW_BLOCK 64        /* at most, a multiple of 4 */
#define BLOCK_FLOATS 49152  /* f32 weights of a block: 192 KiB */

typedef struct {
    g4_cpu *cpu;
    const g4_cpu_kernels *k;
    const float *x;
    int n;
    size_t in, out;
    const g4_tensor *w;
    const float *bias;
    float *y;
} matmul_job;

static inline const unsigned char *row_ptr(const g4_tensor *w, size_t r, size_t in) {
    return (const unsigned char *)w->data + r * in * (size_t)(g4_dtype_bits(w->dtype) / 8);
}

static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    matmul_job *j = ctx;
    const size_t in = j->in, out = j->out;
    const g4_cpu_kernels *k = j->k;
    if (j->n == 1 && j->w->dtype == G4_BF16) {
        for (int64_t r = r0; r < r1; r++) {
            float s = k->dot_bf16((const uint16_t *)row_ptr(j->w, (size_t)r, in), j->x, in);
            j->y[r] = j->bias ? s + j->bias[r] : s;
        }
        return;
    }
    /* rows of f32 weights are read in place; other types are converted a block at a time */
    const int f32 = j->w->dtype == G4_F32 && (((uintptr_t)j->w->data) & 3) == 0;
    int block = (int)(BLOCK_FLOATS / in) & ~3;
    block = block < 4 ? 4 : block > ROW_BLOCK ? ROW_BLOCK : block;
    float *wf = f32 ? NULL : g4_cpu_scratch_get(j->cpu, thread, (size_t)block * in);
    if (!f32 && !wf) return; /* out of memory: recorded in cpu->failed, the step reports it */
    for (int64_t rb = r0; rb < r1; rb += block) {
        const int nr = (int)(r1 - rb < block ? r1 - rb : block);
        const float *wr = f32 ? (const float *)j->w->data + (size_t)rb * in : wf;
        if (!f32)
            for (int i = 0; i < nr; i++) {
                const unsigned char *src = row_ptr(j->w, (size_t)(rb + i), in);
                if (j->w->dtype == G4_BF16)
                    k->bf16_to_f32((const uint16_t *)src, wf + (size_t)i * in, in);
                else
                    g4_to_f32(j->w->dtype, src, wf + (size_t)i * in, in);
            }
        for (int t = 0; t < j->n; t += 4) {
            const float *xt = j->x + (size_t)t * in;
            float *yt = j->y + (size_t)t * out + rb;
            const int full = t + 4 <= j->n;
            int r = 0;
            if (full)
                for (; r + 4 <= nr; r += 4) k->dot_tile4(wr + (size_t)r * in, in, xt, in, in, yt + r, out);
            for (int tt = 0; tt < 4 && t + tt < j->n; tt++) /* the rows and tokens the tiles leave */
                for (int rr = full ? r : 0; rr < nr; rr++)
                    yt[(size_t)tt * out + rr] = k->dot_f32(wr + (size_t)rr * in, xt + (size_t)tt * in, in);
            if (j->bias)
                for (int tt = 0; tt < 4 && t + tt < j->n; tt++)
                    for (int rr = 0; rr < nr; rr++) yt[(size_t)tt * out + rr] += j->bias[rb + rr];
        }
    }
}

void g4_cpu_matmul(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    matmul_job j = {cpu, g4_cpu_kernels_get(), x, n, (size_t)w->shape[w->ndim - 1], (size_t)w->shape[0],
                    w, bias, y};
    if (n <= 0) return;
    /* grain: enough rows per chunk that a chunk is worth a thread hand-off */
    int64_t grain = (int64_t)(16384 / (j.in * (size_t)n + 1)) + 1;
    if (grain < 4 && n > 1) grain = 4;
    g4_pool_for(cpu->pool, (int64_t)j.out, grain, matmul_rows, &j);
}
