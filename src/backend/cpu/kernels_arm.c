/* aarch64 NEON kernels of the CPU backend (the scalar set in kernels.c is their
 * reference). Int8 activations use the signed codes directly (Q4_0 nibble - 8, Q8_0 as
 * stored) with SDOT (vdotq_s32) where the CPU has the dot-product extension, else widening
 * multiplies; f32 tiles keep 4 rows x 4 tokens in registers. Compiles to nothing elsewhere. */
#include "backend/cpu/cpu.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <string.h>
#include <sys/auxv.h>

#include "core/quant.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif

static float dot_f32_neon(const float *a, const float *b, size_t n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline float32x4_t bf16x4(const uint16_t *p) {
    uint16_t t[4];
    memcpy(t, p, 8); /* bf16 rows may sit at any alignment */
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(t), 16));
}

static float dot_bf16_neon(const uint16_t *w, const float *x, size_t n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vfmaq_f32(s0, bf16x4(w + i), vld1q_f32(x + i));
        s1 = vfmaq_f32(s1, bf16x4(w + i + 4), vld1q_f32(x + i + 4));
    }
    float s = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, w + i, 2);
        s += g4_bf16_to_f32(h) * x[i];
    }
    return s;
}

static void bf16_to_f32_neon(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, bf16x4(src + i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i, 2);
        dst[i] = g4_bf16_to_f32(h);
    }
}

static void axpy_neon(float *y, const float *x, float a, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] += a * x[i];
}

static inline void f32_tile_fixed(const float *w, size_t ldw, const float *x, size_t ldx, size_t n, float *y,
                                  size_t ldy, const int NR, const int NT) {
    float32x4_t acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = vdupq_n_f32(0);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t wv[4], xv[4];
        for (int r = 0; r < NR; r++) wv[r] = vld1q_f32(w + (size_t)r * ldw + i);
        for (int t = 0; t < NT; t++) xv[t] = vld1q_f32(x + (size_t)t * ldx + i);
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < NT; t++) acc[r][t] = vfmaq_f32(acc[r][t], wv[r], xv[t]);
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) {
            float s = vaddvq_f32(acc[r][t]);
            for (size_t k = i; k < n; k++) s += w[(size_t)r * ldw + k] * x[(size_t)t * ldx + k];
            y[(size_t)t * ldy + (size_t)r] = s;
        }
}

static void f32_tile_neon(const float *w, size_t ldw, int nr, const float *x, size_t ldx, int nt, size_t n, float *y,
                          size_t ldy) {
    if (nr == 4 && nt == 4) f32_tile_fixed(w, ldw, x, ldx, n, y, ldy, 4, 4);
    else
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++)
                f32_tile_fixed(w + (size_t)r * ldw, ldw, x + (size_t)t * ldx, ldx, n, y + (size_t)t * ldy + r, ldy, 1, 1);
}

/* the 32 signed codes of a block */
static inline void codes(g4_dtype type, const unsigned char *b, int8x16_t *c0, int8x16_t *c1) {
    if (type == G4_Q4_0) {
        uint8x16_t q = vld1q_u8(b + 2);
        *c0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vdupq_n_s8(8));
        *c1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), vdupq_n_s8(8));
    } else {
        *c0 = vld1q_s8((const int8_t *)b + 2);
        *c1 = vld1q_s8((const int8_t *)b + 18);
    }
}

static inline int32_t dot32_widen(int8x16_t a0, int8x16_t a1, int8x16_t b0, int8x16_t b1) {
    int16x8_t p = vmull_s8(vget_low_s8(a0), vget_low_s8(b0));
    p = vmlal_s8(p, vget_high_s8(a0), vget_high_s8(b0));
    int16x8_t q = vmull_s8(vget_low_s8(a1), vget_low_s8(b1));
    q = vmlal_s8(q, vget_high_s8(a1), vget_high_s8(b1));
    return vaddlvq_s16(p) + vaddlvq_s16(q);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static inline int32_t dot32_sdot(int8x16_t a0, int8x16_t a1,
                                                                                  int8x16_t b0, int8x16_t b1) {
    return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), a0, b0), a1, b1));
}

static inline void q8_tile_body(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, const g4_q8_rows *a,
                                int t0, int nt, int nb, float *y, size_t ldy, int sdot) {
    const size_t bs = type == G4_Q4_0 ? 18 : 34;
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const int8_t *q = a->q + (size_t)(t0 + t) * a->in_pad;
            const float *d = a->d + (size_t)(t0 + t) * a->nb_pad;
            float s = 0;
            for (int b = 0; b < nb; b++) {
                const unsigned char *blk = w + (size_t)r * row_bytes + (size_t)b * bs;
                int8x16_t c0, c1;
                codes(type, blk, &c0, &c1);
                int8x16_t x0 = vld1q_s8(q + 32 * b), x1 = vld1q_s8(q + 32 * b + 16);
                int32_t dot = sdot ? dot32_sdot(c0, c1, x0, x1) : dot32_widen(c0, c1, x0, x1);
                s += g4_f16_at(blk) * d[b] * (float)dot;
            }
            y[(size_t)t * ldy + (size_t)r] = s;
        }
}

static void q8_tile_neon(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, const g4_q8_rows *a, int t0,
                         int nt, int nb, float *y, size_t ldy) {
    q8_tile_body(type, w, row_bytes, nr, a, t0, nt, nb, y, ldy, 0);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void q8_tile_neon_dot(g4_dtype type, const unsigned char *w,
                                                                              size_t row_bytes, int nr,
                                                                              const g4_q8_rows *a, int t0, int nt,
                                                                              int nb, float *y, size_t ldy) {
    q8_tile_body(type, w, row_bytes, nr, a, t0, nt, nb, y, ldy, 1);
}

/* exp, gelu and tanh: the constants and the method are in cpu.h (the x86 sets compute the same) */
static inline float32x4_t exp_neon(float32x4_t x) {
    uint32x4_t under = vcltq_f32(x, vdupq_n_f32(EXP_LO));
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(EXP_LO)), vdupq_n_f32(EXP_HI));
    float32x4_t fx = vrndmq_f32(vfmaq_f32(vdupq_n_f32(0.5f), x, vdupq_n_f32(EXP_LOG2E)));
    x = vfmsq_f32(x, fx, vdupq_n_f32(EXP_C1));
    x = vfmsq_f32(x, fx, vdupq_n_f32(EXP_C2));
    float32x4_t z = vmulq_f32(x, x), y = vdupq_n_f32(EXP_P0);
    y = vfmaq_f32(vdupq_n_f32(EXP_P1), y, x);
    y = vfmaq_f32(vdupq_n_f32(EXP_P2), y, x);
    y = vfmaq_f32(vdupq_n_f32(EXP_P3), y, x);
    y = vfmaq_f32(vdupq_n_f32(EXP_P4), y, x);
    y = vfmaq_f32(vdupq_n_f32(EXP_P5), y, x);
    y = vfmaq_f32(vaddq_f32(x, vdupq_n_f32(1.0f)), y, z);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(fx), vdupq_n_s32(127)), 23);
    y = vmulq_f32(y, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), under));
}

static float exp_sum_neon(float *x, size_t n, float shift) {
    float32x4_t sh = vdupq_n_f32(shift), acc = vdupq_n_f32(0);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = exp_neon(vsubq_f32(vld1q_f32(x + i), sh));
        vst1q_f32(x + i, v);
        acc = vaddq_f32(acc, v);
    }
    return vaddvq_f32(acc) + g4_cpu_exp_sum_scalar(x + i, n - i, shift);
}

static void gelu_mul_neon(const float *g, const float *u, float *y, size_t n) {
    const float32x4_t c = vdupq_n_f32(GELU_C), c3 = vdupq_n_f32(GELU_C * 0.044715f), one = vdupq_n_f32(1.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t x = vld1q_f32(g + i);
        float32x4_t mz2 = vmulq_f32(vfmaq_f32(c, c3, vmulq_f32(x, x)), vmulq_f32(x, vdupq_n_f32(-2.0f))); /* -2z */
        float32x4_t r = vdivq_f32(x, vaddq_f32(one, exp_neon(mz2)));
        vst1q_f32(y + i, u ? vmulq_f32(r, vld1q_f32(u + i)) : r);
    }
    g4_cpu_gelu_mul_scalar(g + i, u ? u + i : NULL, y + i, n - i);
}

static void softcap_neon(float *y, size_t n, float c) {
    const float32x4_t inv = vdupq_n_f32(1.0f / c), cc = vdupq_n_f32(c), one = vdupq_n_f32(1.0f);
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t a = vmulq_f32(vld1q_f32(y + i), inv), ax = vabsq_f32(a), s = vmulq_f32(a, a);
        float32x4_t p = vdupq_n_f32(TANH_P5);
        p = vfmaq_f32(vdupq_n_f32(TANH_P4), p, s);
        p = vfmaq_f32(vdupq_n_f32(TANH_P3), p, s);
        p = vfmaq_f32(vdupq_n_f32(TANH_P2), p, s);
        p = vfmaq_f32(vdupq_n_f32(TANH_P1), p, s);
        p = vfmaq_f32(vdupq_n_f32(TANH_P0), p, s);
        float32x4_t e = exp_neon(vmulq_f32(vminq_f32(ax, vdupq_n_f32(TANH_BIG)), vdupq_n_f32(-2.0f)));
        float32x4_t big = vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e));
        big = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(big), vandq_u32(vreinterpretq_u32_f32(a), sign)));
        float32x4_t t = vbslq_f32(vcltq_f32(ax, vdupq_n_f32(TANH_SMALL)), vmulq_f32(a, p), big);
        t = vbslq_f32(vceqq_f32(a, a), t, a); /* NaN stays NaN */
        vst1q_f32(y + i, vmulq_f32(t, cc));
    }
    g4_cpu_softcap_scalar(y + i, n - i, c);
}

/* attention's p * V (see cpu.h): 16 output columns per head in registers over all value rows; the rest as the
 * scalar set */
static inline void pv_neon_fixed(float *o, size_t ldo, const float *p, size_t ldp, const float *v, size_t ldv, int nv,
                                 size_t d, const int NO) {
    size_t x = 0;
    for (; x + 16 <= d; x += 16) {
        float32x4_t acc[4][4];
        for (int h = 0; h < NO; h++)
            for (int c = 0; c < 4; c++) acc[h][c] = vld1q_f32(o + (size_t)h * ldo + x + 4 * (size_t)c);
        for (int i = 0; i < nv; i++) {
            float32x4_t vv[4];
            for (int c = 0; c < 4; c++) vv[c] = vld1q_f32(v + (size_t)i * ldv + x + 4 * (size_t)c);
            for (int h = 0; h < NO; h++) {
                float32x4_t ph = vdupq_n_f32(p[(size_t)h * ldp + (size_t)i]);
                for (int c = 0; c < 4; c++) acc[h][c] = vfmaq_f32(acc[h][c], ph, vv[c]);
            }
        }
        for (int h = 0; h < NO; h++)
            for (int c = 0; c < 4; c++) vst1q_f32(o + (size_t)h * ldo + x + 4 * (size_t)c, acc[h][c]);
    }
    if (x < d) g4_cpu_pv_scalar(o + x, ldo, NO, p, ldp, v + x, ldv, nv, d - x);
}

static void pv_neon(float *o, size_t ldo, int no, const float *p, size_t ldp, const float *v, size_t ldv, int nv,
                    size_t d) {
    switch (no) {
    case 4: pv_neon_fixed(o, ldo, p, ldp, v, ldv, nv, d, 4); break;
    case 3: pv_neon_fixed(o, ldo, p, ldp, v, ldv, nv, d, 3); break;
    case 2: pv_neon_fixed(o, ldo, p, ldp, v, ldv, nv, d, 2); break;
    default: pv_neon_fixed(o, ldo, p, ldp, v, ldv, nv, d, 1); break;
    }
}

static const g4_cpu_kernels k_neon = {"neon", dot_f32_neon, dot_bf16_neon, bf16_to_f32_neon, axpy_neon,
                                      q8_tile_neon, f32_tile_neon, NULL,
                                      exp_sum_neon, gelu_mul_neon, softcap_neon, pv_neon, NULL, NULL, NULL, NULL, NULL, 0, 0};
static const g4_cpu_kernels k_neon_dot = {"neon_dot", dot_f32_neon, dot_bf16_neon, bf16_to_f32_neon, axpy_neon,
                                          q8_tile_neon_dot, f32_tile_neon, NULL,
                                          exp_sum_neon, gelu_mul_neon, softcap_neon, pv_neon, NULL, NULL, NULL, NULL, NULL, 0, 0};

/* NEON is part of every aarch64 CPU (ARMv8-A); SDOT is the optional dot-product extension */
const g4_cpu_kernels *g4_cpu_kernels_neon(void) { return &k_neon; }

const g4_cpu_kernels *g4_cpu_kernels_neon_dot(void) {
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? &k_neon_dot : NULL;
}
#else
const g4_cpu_kernels *g4_cpu_kernels_neon(void) { return NULL; }
const g4_cpu_kernels *g4_cpu_kernels_neon_dot(void) { return NULL; }
#endif
