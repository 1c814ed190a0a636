/* SIMD kernels of the CPU backend: a scalar fallback, AVX2+FMA and AVX-512,
 * picked at run time (the binary runs on any x86-64). */
#include <immintrin.h>
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

static float dot_bf16_scalar(const uint16_t *w, const float *x, size_t n) {
    float s = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, w + i, 2);
        s += g4_bf16_to_f32(h) * x[i];
    }
    return s;
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

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

/* y = gelu_tanh(g) * u (u NULL: gelu_tanh(g)) */
static void gelu_mul_scalar(const float *g, const float *u, float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = g[i], r = 0.5f * x * (1.0f + tanhf(GELU_C * (x + 0.044715f * x * x * x)));
        y[i] = u ? r * u[i] : r;
    }
}

static float exp_sum_scalar(float *x, size_t n, float shift) {
    float s = 0;
    for (size_t i = 0; i < n; i++) s += (x[i] = expf(x[i] - shift));
    return s;
}

/* exp by range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (Cephes expf, ~1 ulp) */
#define EXP_LO -87.33654f
#define EXP_HI 88.72283f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

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
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, w + i, 2);
        s += g4_bf16_to_f32(h) * x[i];
    }
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

__attribute__((target("avx2,fma"))) static inline __m256 exp256(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_C1), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_C2), x);
    __m256 z = _mm256_mul_ps(x, x), y = _mm256_set1_ps(EXP_P0);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P1));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P2));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P3));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P4));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P5));
    y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

__attribute__((target("avx2,fma"))) static void gelu_mul_avx2(const float *g, const float *u, float *y, size_t n) {
    const __m256 c = _mm256_set1_ps(GELU_C), c3 = _mm256_set1_ps(GELU_C * 0.044715f), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i), x2 = _mm256_mul_ps(x, x);
        __m256 mz2 = _mm256_mul_ps(_mm256_fmadd_ps(c3, x2, c), _mm256_sub_ps(_mm256_setzero_ps(), _mm256_add_ps(x, x)));
        __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, exp256(mz2))); /* mz2 = -2z */
        _mm256_storeu_ps(y + i, u ? _mm256_mul_ps(r, _mm256_loadu_ps(u + i)) : r);
    }
    gelu_mul_scalar(g + i, u ? u + i : NULL, y + i, n - i);
}

__attribute__((target("avx2,fma"))) static float exp_sum_avx2(float *x, size_t n, float shift) {
    __m256 sh = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    float s = hsum256(acc);
    for (; i < n; i++) s += (x[i] = expf(x[i] - shift));
    return s;
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
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, w + i, 2);
        s += g4_bf16_to_f32(h) * x[i];
    }
    return s;
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

__attribute__((target("avx512f"))) static inline __m512 exp512(__m512 v) {
    __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    v = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_C1), v);
    v = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_C2), v);
    __m512 z = _mm512_mul_ps(v, v), y = _mm512_set1_ps(EXP_P0);
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P1));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P2));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P3));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P4));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P5));
    y = _mm512_fmadd_ps(y, z, _mm512_add_ps(v, _mm512_set1_ps(1.0f)));
    y = _mm512_scalef_ps(y, fx); /* y * 2^fx */
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

__attribute__((target("avx512f"))) static float exp_sum_avx512(float *x, size_t n, float shift) {
    __m512 sh = _mm512_set1_ps(shift), acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
        _mm512_storeu_ps(x + i, y);
        acc = _mm512_add_ps(acc, y);
    }
    float s = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) s += (x[i] = expf(x[i] - shift));
    return s;
}

/* gelu_tanh(x) = 0.5 x (1 + tanh z) = x / (1 + exp(-2z)): no cancellation near tanh = -1, and the ends are
 * right (exp -> 0 gives x, exp -> its clamp gives ~0) */
__attribute__((target("avx512f"))) static void gelu_mul_avx512(const float *g, const float *u, float *y, size_t n) {
    const __m512 c = _mm512_set1_ps(GELU_C), c3 = _mm512_set1_ps(GELU_C * 0.044715f), one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i), x2 = _mm512_mul_ps(x, x);
        __m512 mz2 = _mm512_mul_ps(_mm512_fmadd_ps(c3, x2, c), _mm512_sub_ps(_mm512_setzero_ps(), _mm512_add_ps(x, x)));
        __m512 r = _mm512_div_ps(x, _mm512_add_ps(one, exp512(mz2))); /* mz2 = -2z */
        _mm512_storeu_ps(y + i, u ? _mm512_mul_ps(r, _mm512_loadu_ps(u + i)) : r);
    }
    gelu_mul_scalar(g + i, u ? u + i : NULL, y + i, n - i);
}

static const g4_cpu_kernels k_scalar = {"scalar",    dot_f32_scalar,   dot_bf16_scalar, bf16_to_f32_scalar,
                                        axpy_scalar, exp_sum_scalar,   gelu_mul_scalar};
static const g4_cpu_kernels k_avx2 = {"avx2",    dot_f32_avx2,   dot_bf16_avx2, bf16_to_f32_avx2,
                                      axpy_avx2, exp_sum_avx2,   gelu_mul_avx2};
static const g4_cpu_kernels k_avx512 = {"avx512",    dot_f32_avx512,   dot_bf16_avx512, bf16_to_f32_avx512,
                                        axpy_avx512, exp_sum_avx512,   gelu_mul_avx512};

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
