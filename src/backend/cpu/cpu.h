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

/* The ops of dense.c. */
void g4_cpu_attention_dense(g4_backend *be, const g4_dense_attention_args *a);
void g4_cpu_clamp(g4_backend *be, const float *x, float *y, size_t n, float lo, float hi);
void g4_cpu_shift_scale_cols(g4_backend *be, float *y, int rows, int cols, const float *shift, const float *scale);
void g4_cpu_gather_sum(g4_backend *be, const float *src, const int32_t *idx, int n, int k, int row, float s,
                       float *dst);
/* The audio tower's ops (cpu_tower_ops.c). */
void g4_cpu_sigmoid_mul(g4_backend *be, const float *a, const float *b, size_t n, float *y);
void g4_cpu_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
                      float *y);
void g4_cpu_im2col(g4_backend *be, const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                   int nrows, float *out);
void g4_cpu_conv1d_causal_dw(g4_backend *be, const float *x, const float *w, int n, int c, int k, float *y);
void g4_cpu_local_attention(g4_backend *be, const g4_local_attention_args *a);

/* SIMD kernels, chosen once at start-up by the CPU's features. */
typedef struct g4_cpu_kernels {
    const char *isa;
    float (*dot_f32)(const float *a, const float *b, size_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, size_t n); /* w may be unaligned */
    void (*bf16_to_f32)(const uint16_t *src, float *dst, size_t n);
    void (*axpy)(float *y, const float *x, float a, size_t n);     /* y += a * x */
    /* x[i] = exp(x[i] - shift) in place (0 below about -87.3); returns the sum (softmax numerators) */
    float (*exp_sum)(float *x, size_t n, float shift);
    /* y = gelu_tanh(g) * u (u NULL: gelu_tanh(g)); in place allowed */
    void (*gelu_mul)(const float *g, const float *u, float *y, size_t n);
} g4_cpu_kernels;

const g4_cpu_kernels *g4_cpu_kernels_get(void);

#endif
