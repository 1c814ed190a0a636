/* Kernels of the CPU backend: the portable scalar set (the plain reference the SIMD sets
 * are tested against) and the choice of a set at run time. The SIMD sets are split by
 * architecture: kernels_x86.c (AVX2+FMA, AVX-512 with VNNI), kernels_arm.c (NEON with
 * dot-product instructions); each file compiles to nothing on other architectures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/tensor.h"

/* ---------------------------------------------------------------- scalar */
static float dot_f32_scalar(const float *a, const float *b, size_t n) {
    float s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* The bf16 dot products below do exactly the float operations of the dot_f32 of their instruction set on the
 * converted weights (same accumulators, same order, same tail), so that a matmul row is the same number whether
 * it ran alone (decode, the fused kernel) or in a batch (rows converted once, then dot_f32): batch invariance,
 * which lets a request's greedy output not depend on what else the scheduler batched with it. */
static inline float bf16_at(const uint16_t *w, size_t i) { /* w may be unaligned */
    uint16_t h;
    memcpy(&h, w + i, 2);
    return g4_bf16_to_f32(h);
}

static float dot_bf16_scalar(const uint16_t *w, const float *x, size_t n) {
    float s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += bf16_at(w, i + j) * x[i + j];
    for (; i < n; i++) s[0] += bf16_at(w, i) * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void bf16_to_f32_scalar(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i, 2);
        dst[i] = g4_bf16_to_f32(h);
    }
}

static void axpy_scalar(float *y, const float *x, float a, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* y = gelu_tanh(g) * u (u NULL: gelu_tanh(g)) */
void g4_cpu_gelu_mul_scalar(const float *g, const float *u, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = g[i], r = 0.5f * x * (1.0f + tanhf(GELU_C * (x + 0.044715f * x * x * x)));
        y[i] = u ? r * u[i] : r;
    }
}

void g4_cpu_softcap_scalar(float *y, size_t n, float c) {
    for (size_t i = 0; i < n; i++) y[i] = tanhf(y[i] / c) * c;
}

void g4_cpu_pv_scalar(float *o, size_t ldo, int no, const float *p, size_t ldp, const float *v, size_t ldv, int nv,
                      size_t d) {
    for (int h = 0; h < no; h++)
        for (size_t x = 0; x < d; x++) {
            float acc = o[(size_t)h * ldo + x];
            for (int i = 0; i < nv; i++) acc = fmaf(p[(size_t)h * ldp + (size_t)i], v[(size_t)i * ldv + x], acc);
            o[(size_t)h * ldo + x] = acc;
        }
}

float g4_cpu_exp_sum_scalar(float *x, size_t n, float shift) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += (x[i] = expf(x[i] - shift));
    return s;
}

static void f32_tile_scalar(const float *w, size_t ldw, int nr, const float *x, size_t ldx, int nt, size_t n,
                            float *y, size_t ldy) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[(size_t)t * ldy + (size_t)r] = dot_f32_scalar(w + (size_t)r * ldw, x + (size_t)t * ldx, n);
}

int32_t g4_cpu_argmax_scalar(const float *x, int n) {
    float m = -INFINITY;
    int32_t at = 0;
    int nan = 0;
    for (int i = 0; i < n; i++) {
        nan |= x[i] != x[i];
        if (x[i] > m) m = x[i], at = i;
    }
    return nan ? -1 : at;
}

static void bf16_tile_scalar(const uint16_t *w, size_t ldw, int nr, const float *x, size_t ldx, int nt, size_t n,
                             float *y, size_t ldy) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) y[(size_t)t * ldy + (size_t)r] = dot_bf16_scalar(w + (size_t)r * ldw, x + (size_t)t * ldx, n);
}

static const g4_cpu_kernels k_scalar = {"scalar", dot_f32_scalar, dot_bf16_scalar, bf16_to_f32_scalar,
                                        axpy_scalar, g4_cpu_q8_tile_scalar, f32_tile_scalar, NULL,
                                        g4_cpu_exp_sum_scalar, g4_cpu_gelu_mul_scalar, g4_cpu_softcap_scalar,
                                        g4_cpu_pv_scalar, bf16_tile_scalar, NULL, NULL, NULL, NULL, 0, 0,
                                        g4_cpu_argmax_scalar, 0, NULL};

static const g4_cpu_kernels *chosen;

const char *const g4_cpu_isas[] = {"scalar", "avx2", "avxvnni", "avx512", "neon", "neon_dot", NULL};

const g4_cpu_kernels *g4_cpu_kernels_for(const char *isa) {
    if (!strcmp(isa, "scalar")) return &k_scalar;
    if (!strcmp(isa, "avx2")) return g4_cpu_kernels_avx2();
    if (!strcmp(isa, "avxvnni")) return g4_cpu_kernels_avxvnni();
    if (!strcmp(isa, "avx512")) return g4_cpu_kernels_avx512();
    if (!strcmp(isa, "neon")) return g4_cpu_kernels_neon();
    if (!strcmp(isa, "neon_dot")) return g4_cpu_kernels_neon_dot();
    return NULL;
}

void g4_cpu_kernels_use(const g4_cpu_kernels *k) { chosen = k; }

const g4_cpu_kernels *g4_cpu_kernels_get(void) {
    if (chosen) return chosen;
    /* the best set this CPU has; G4_CPU_ISA=scalar|avx2|avxvnni|avx512|neon|neon_dot picks a lower one (comparisons) */
    const g4_cpu_kernels *k = g4_cpu_kernels_avx512();
    if (!k) k = g4_cpu_kernels_avxvnni();
    if (!k) k = g4_cpu_kernels_avx2();
    if (!k) k = g4_cpu_kernels_neon_dot();
    if (!k) k = g4_cpu_kernels_neon();
    if (!k) k = &k_scalar;
    const char *force = getenv("G4_CPU_ISA");
    if (force && g4_cpu_kernels_for(force)) k = g4_cpu_kernels_for(force);
    chosen = k;
    return k;
}
