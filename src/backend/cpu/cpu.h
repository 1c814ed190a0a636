/* Internals shared by the CPU backend's files. */
#ifndef G4_BACKEND_CPU_CPU_H
#define G4_BACKEND_CPU_CPU_H

#include <stddef.h>

#include "backend/backend.h"
#include "core/threadpool.h"

#define G4_CPU_MAX_THREADS 256

/* Per-thread scratch that grows on demand (each thread touches only its own). */
typedef struct g4_cpu_scratch {
    float *buf;
    size_t cap; /* floats */
} g4_cpu_scratch;

typedef struct g4_cpu {
    g4_pool *pool;
    int n_threads;
    g4_cpu_scratch scratch[G4_CPU_MAX_THREADS];
    int failed; /* set when an op could not get memory; the forward step reports it */
    /* buffers the MoE op reuses between calls */
    float *moe_buf;
    size_t moe_cap;
    /* the masked_logits op's selected ids */
    int32_t *sel_buf;
    size_t sel_cap;
} g4_cpu;

/* Returns thread `t`'s scratch with at least n floats, or NULL when out of memory. */
float *g4_cpu_scratch_get(g4_cpu *cpu, int t, size_t n);

/* y[n, out] = x[n, in] * W^T (+ bias). W: F32, BF16 or F16, [out, in]. */
void g4_cpu_matmul(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y);

/* SIMD kernels, chosen once at start-up by the CPU's features. */
typedef struct g4_cpu_kernels {
    const char *isa;
    float (*dot_f32)(const float *a, const float *b, size_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, size_t n); /* w may be unaligned */
    void (*bf16_to_f32)(const uint16_t *src, float *dst, size_t n);
    void (*axpy)(float *y, const float *x, float a, size_t n);     /* y += a * x */
} g4_cpu_kernels;

const g4_cpu_kernels *g4_cpu_kernels_get(void);

#endif
