/* SIMD kernels of the CPU backend: a scalar fallback, AVX2+FMA and AVX-512,
 * picked at run time (the binary runs on any x86-64). */
#include <immintrin.h>
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

/* ------------------------------------------------------------- AVX2+FMA */
__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) static float dot_f32_avx2(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

__attribute__((target("avx2,fma"))) static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const uint16_t *w, const float *x, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(load_bf16x8(w + i + 16), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(load_bf16x8(w + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += bf16_at(w, i) * x[i];
    return s;
}

__attribute__((target("avx2,fma"))) static void bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(src + i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i, 2);
        dst[i] = g4_bf16_to_f32(h);
    }
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, const float *x, float a, size_t n) {
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* ---------------------------------------------------------------- AVX-512 */
__attribute__((target("avx512f"))) static float dot_f32_avx512(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f"))) static inline __m512 load_bf16x16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f"))) static float dot_bf16_avx512(const uint16_t *w, const float *x, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(load_bf16x16(w + i), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(load_bf16x16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(load_bf16x16(w + i), _mm512_loadu_ps(x + i), s0);
    if (i < n) { /* the tail as dot_f32_avx512 takes it: zeros in the lanes past the end */
        uint16_t tail[16] = {0};
        memcpy(tail, w + i, (n - i) * sizeof(uint16_t));
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(load_bf16x16(tail), _mm512_maskz_loadu_ps(m, x + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f"))) static void bf16_to_f32_avx512(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(src + i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i, 2);
        dst[i] = g4_bf16_to_f32(h);
    }
}

__attribute__((target("avx512f"))) static void axpy_avx512(float *y, const float *x, float a, size_t n) {
    __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static const g4_cpu_kernels k_scalar = {"scalar", dot_f32_scalar, dot_bf16_scalar, bf16_to_f32_scalar,
                                        axpy_scalar};
static const g4_cpu_kernels k_avx2 = {"avx2", dot_f32_avx2, dot_bf16_avx2, bf16_to_f32_avx2, axpy_avx2};
static const g4_cpu_kernels k_avx512 = {"avx512", dot_f32_avx512, dot_bf16_avx512, bf16_to_f32_avx512,
                                        axpy_avx512};

const g4_cpu_kernels *g4_cpu_kernels_get(void) {
    static const g4_cpu_kernels *chosen;
    if (chosen) return chosen;
    const char *force = getenv("G4_CPU_ISA"); /* "scalar", "avx2" or "avx512": for tests and comparisons */
    __builtin_cpu_init();
    int has512 = __builtin_cpu_supports("avx512f");
    int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const g4_cpu_kernels *k = has512 ? &k_avx512 : has2 ? &k_avx2 : &k_scalar;
    if (force) {
        if (!strcmp(force, "scalar")) k = &k_scalar;
        else if (!strcmp(force, "avx2") && has2) k = &k_avx2;
        else if (!strcmp(force, "avx512") && has512) k = &k_avx512;
    }
    chosen = k;
    return k;
}
