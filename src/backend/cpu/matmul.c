/* y[n, out] = x[n, in] * W^T on the CPU for float weights (F32, BF16, F16).
 * Work is split over output rows. One token (decode) streams each weight row once
 * through a fused convert+dot kernel; several tokens convert a block of weight
 * rows to f32 once and reuse it for every token. */
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/quant.h"

#define ROW_BLOCK 8

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

static inline const unsigned char *row_ptr(const g4_tensor *w, size_t r, size_t in) { return g4_tensor_row(w, (int64_t)r); }

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
    if (j->w->dtype == G4_F32 && (((uintptr_t)j->w->data) & 3) == 0) {
        const float *W = j->w->data;
        for (int64_t r = r0; r < r1; r++)
            for (int t = 0; t < j->n; t++) {
                float s = k->dot_f32(W + (size_t)r * in, j->x + (size_t)t * in, in);
                j->y[(size_t)t * out + (size_t)r] = j->bias ? s + j->bias[r] : s;
            }
        return;
    }
    /* convert a block of rows to f32 once, then reuse it for every token */
    float *wf = g4_cpu_scratch_get(j->cpu, thread, ROW_BLOCK * in);
    if (!wf) return; /* out of memory: recorded in cpu->failed, the step reports it */
    for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK) {
        int nr = (int)(r1 - rb < ROW_BLOCK ? r1 - rb : ROW_BLOCK);
        for (int i = 0; i < nr; i++) {
            const unsigned char *src = row_ptr(j->w, (size_t)(rb + i), in);
            if (j->w->dtype == G4_BF16)
                k->bf16_to_f32((const uint16_t *)src, wf + (size_t)i * in, in);
            else
                g4_dequant_row(j->w, rb + i, wf + (size_t)i * in);
        }
        for (int t = 0; t < j->n; t++) {
            const float *xt = j->x + (size_t)t * in;
            float *yt = j->y + (size_t)t * out;
            for (int i = 0; i < nr; i++) {
                float s = k->dot_f32(wf + (size_t)i * in, xt, in);
                yt[rb + i] = j->bias ? s + j->bias[rb + i] : s;
            }
        }
    }
}

void g4_cpu_matmul(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    matmul_job j = {cpu, g4_cpu_kernels_get(), x, n, (size_t)w->shape[w->ndim - 1], (size_t)w->shape[0],
                    w, bias, y};
    if (n <= 0) return;
    /* grain: enough rows per chunk that a chunk is worth a thread hand-off */
    int64_t grain = (int64_t)(16384 / (j.in * (size_t)n + 1)) + 1;
    if (grain < ROW_BLOCK && n > 1) grain = ROW_BLOCK;
    g4_pool_for(cpu->pool, (int64_t)j.out, grain, matmul_rows, &j);
}
