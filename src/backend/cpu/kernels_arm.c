/* aarch64 NEON kernels of the CPU backend (the scalar set in kernels.c is their
 * reference). Int8 activations (every GGUF type of g4_cpu_q8_supported) use signed codes
 * with SDOT (vdotq_s32) where the CPU has the dot-product extension, else widening
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
/* ------------------------------------------------------- int8 activations */
/* Q4_0, Q8_0 and the types of G4_Q8_K_QUANTS on the plain activations (g4_q8_rows.q, d, m = d * sum q per block of
 * 32; q_pack, q_gemm and q_gemv with q_act_plain, the shape of the AVX2 set in kernels_x86.c): a row's blocks go in
 * groups of 4 (for the K-quants and IQ4_XS half a super-block) and by pairs of groups (blocks 8p .. 8p + 7: a
 * super-block, whose scales are decoded once). Codes are signed, in element order: Q4_0 nibble - 8, Q5_0 code - 16,
 * Q4_K / Q5_K and AF4 the code (their mins or biases are the offset term), Q6_K code - 32, Q3_K code - 4, IQ4 the
 * table's values,
 * Q8_0 as stored, AF8 code - 128 (offset term b + 128 s).
 * Per block the integer dot products of elements 0-15 and 16-31 (SDOT, or widening multiplies: exact either way),
 * summed per block over a group (pairwise adds), and per group
 *   v += float(block sums) * s * dx  (Q6_K: elements 0-15 and 16-31 apart, each with its scale)  +  s2 * m
 * with s2 the block's offset term (Q4_K / Q5_K: -dmin m_k; AF4: b, AF8: b + 128 s; zero for the others); acc += v
 * once a pair. Q2_K (w = s u + o per 16: the code u as it is) adds each half's min o times the activations' code sums
 * of the half (times dx), computed from the codes as the products are. */
#define N2_INLINE __attribute__((always_inline)) static inline /* (the type a constant in each entry point's copy) */
#define N2_ROWS 4        /* decode: rows at once, far apart (each its own stream) */
#define N2_PREFETCH 2048 /* decode: bytes ahead of each stream */

static inline int n2_halves(g4_dtype t) { return t == G4_Q6_K || t == G4_Q3_K || t == G4_Q2_K || t == G4_CB4_16; }


/* the low nibbles of 16 bytes (elements 0-15) and the high ones (16-31) */
N2_INLINE void n2_nibbles(const unsigned char *p, int8x16_t c[2]) {
    const uint8x16_t q = vld1q_u8(p);
    c[0] = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15)));
    c[1] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

/* 16 where bit i % 8 of byte i / 8 of the two bytes (b0, b1) is set */
N2_INLINE int8x16_t n2_bits16(unsigned b0, unsigned b1) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)b0), vdup_n_u8((uint8_t)b1));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(16)));
}

/* The codes of group g of a row of nb blocks: c[i][0] block i's elements 0-15, c[i][1] 16-31 (zeros past the row). */
N2_INLINE void n2_codes(g4_dtype type, const unsigned char *row, int g, int nb, int8x16_t c[4][2]) {
    const int8x16_t iq4 = vld1q_s8(type == G4_MXF4 ? g4_fp4_values : g4_iq4_values); /* (the type's table) */
    const uint8x16_t m4 = vdupq_n_u8(15);
    if (type == G4_Q4_K || type == G4_Q5_K) { /* qs: chunk c's 32 bytes, sub-block 2c the low nibbles, 2c+1 high */
        const unsigned char *sb = row + (size_t)(type == G4_Q4_K ? 144 : 176) * (size_t)(g / 2);
        const int h = g % 2;
        const unsigned char *qs = sb + (type == G4_Q4_K ? 16 : 48) + 64 * h;
        for (int k = 0; k < 2; k++)
            for (int e = 0; e < 2; e++) {
                const uint8x16_t q = vld1q_u8(qs + 32 * k + 16 * e);
                c[2 * k][e] = vreinterpretq_s8_u8(vandq_u8(q, m4));
                c[2 * k + 1][e] = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
            }
        if (type == G4_Q5_K) /* sub-block 4h + i's fifth bits: bit 4h + i of qh[l] */
            for (int e = 0; e < 2; e++) {
                const uint8x16_t qh = vld1q_u8(sb + 16 + 16 * e);
                for (int i = 0; i < 4; i++)
                    c[i][e] = vorrq_s8(c[i][e], vreinterpretq_s8_u8(vandq_u8(
                                                    vtstq_u8(qh, vdupq_n_u8((uint8_t)(1u << (4 * h + i)))), vdupq_n_u8(16))));
            }
    } else if (type == G4_Q6_K) { /* block i of half h: ql's low (i < 2) or high nibbles, bits 2i of qh, - 32 */
        const unsigned char *sb = row + (size_t)210 * (size_t)(g / 2);
        const int h = g % 2;
        const uint8x16_t m3 = vdupq_n_u8(3);
        for (int e = 0; e < 2; e++) {
            const uint8x16_t l0 = vld1q_u8(sb + 64 * h + 16 * e), l1 = vld1q_u8(sb + 64 * h + 32 + 16 * e),
                             qh = vld1q_u8(sb + 128 + 32 * h + 16 * e);
            const uint8x16_t lo[4] = {vandq_u8(l0, m4), vandq_u8(l1, m4), vshrq_n_u8(l0, 4), vshrq_n_u8(l1, 4)};
            const uint8x16_t hi[4] = {vandq_u8(qh, m3), vandq_u8(vshrq_n_u8(qh, 2), m3), vandq_u8(vshrq_n_u8(qh, 4), m3),
                                      vshrq_n_u8(qh, 6)};
            for (int i = 0; i < 4; i++)
                c[i][e] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo[i], vshlq_n_u8(hi[i], 4))), vdupq_n_s8(32));
        }
    } else if (type == G4_Q3_K) { /* block i of half h: bits 2i of qs[32h + l], bit 4h + i of hmask[l], - 4 */
        const unsigned char *sb = row + (size_t)110 * (size_t)(g / 2);
        const int h = g % 2;
        for (int e = 0; e < 2; e++) {
            const uint8x16_t q = vld1q_u8(sb + 32 + 32 * h + 16 * e), hm = vld1q_u8(sb + 16 * e);
            for (int i = 0; i < 4; i++) {
                const uint8x16_t lo2 = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * i))), vdupq_n_u8(3)),
                                 hb = vandq_u8(vshlq_u8(hm, vdupq_n_s8((int8_t)(-(4 * h + i)))), vdupq_n_u8(1));
                c[i][e] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo2, vshlq_n_u8(hb, 2))), vdupq_n_s8(4));
            }
        }
    } else if (type == G4_Q2_K) { /* block i of half h: bits 2i of qs[32h + l] */
        const unsigned char *sb = row + (size_t)84 * (size_t)(g / 2);
        for (int e = 0; e < 2; e++) {
            const uint8x16_t q = vld1q_u8(sb + 16 + 32 * (g % 2) + 16 * e);
            for (int i = 0; i < 4; i++)
                c[i][e] = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * i))), vdupq_n_u8(3)));
        }
    } else if (type == G4_IQ4_XS || type == G4_CB4) { /* sub-block 4h + i: 16 bytes of IQ4_NL's nibbles */
        const int cb = type == G4_CB4;
        const unsigned char *sb = row + (size_t)(cb ? 152 : 136) * (size_t)(g / 2) + (cb ? 16 : 0);
        const int8x16_t values = cb ? vld1q_s8((const int8_t *)(sb - 16)) : iq4; /* (CB4: its block's table) */
        for (int i = 0; i < 4; i++) {
            n2_nibbles(sb + 8 + 64 * (g % 2) + 16 * i, c[i]);
            for (int e = 0; e < 2; e++) c[i][e] = vqtbl1q_s8(values, vreinterpretq_u8_s8(c[i][e]));
        }
    } else if (type == G4_CB4_16) { /* the same nibbles after the table, d and the 16 scales */
        const unsigned char *sb = row + (size_t)162 * (size_t)(g / 2);
        const int8x16_t values = vld1q_s8((const int8_t *)sb);
        for (int i = 0; i < 4; i++) {
            n2_nibbles(sb + 34 + 64 * (g % 2) + 16 * i, c[i]);
            for (int e = 0; e < 2; e++) c[i][e] = vqtbl1q_s8(values, vreinterpretq_u8_s8(c[i][e]));
        }
    } else { /* blocks of 32: Q4_0, IQ4_NL, MXF4 (18 bytes), Q5_0 (22), Q8_0 (34), AF4 (24), AF8 (40) */
        const int bs = g4_q8_block_bytes(type), n = nb - 4 * g;
        const unsigned char *p = row + (size_t)bs * 4 * (size_t)g;
        for (int i = 0; i < 4; i++) {
            const unsigned char *b = p + bs * i;
            if (i >= n) {
                c[i][0] = c[i][1] = vdupq_n_s8(0);
            } else if (type == G4_Q8_0) {
                c[i][0] = vld1q_s8((const int8_t *)b + 2);
                c[i][1] = vld1q_s8((const int8_t *)b + 18);
            } else if (type == G4_AF8) { /* code - 128 (its scale's 128 x is in the offset term) */
                c[i][0] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(b + 8), vdupq_n_u8(128)));
                c[i][1] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(b + 24), vdupq_n_u8(128)));
            } else if (type == G4_AF4) {
                n2_nibbles(b + 8, c[i]);
            } else if (type == G4_Q5_0) { /* element j's fifth bit: bit j of qh */
                uint32_t qh;
                memcpy(&qh, b + 2, 4);
                n2_nibbles(b + 6, c[i]);
                c[i][0] = vsubq_s8(vorrq_s8(c[i][0], n2_bits16(qh & 255u, (qh >> 8) & 255u)), vdupq_n_s8(16));
                c[i][1] = vsubq_s8(vorrq_s8(c[i][1], n2_bits16((qh >> 16) & 255u, qh >> 24)), vdupq_n_s8(16));
            } else {
                n2_nibbles(b + 2, c[i]);
                for (int e = 0; e < 2; e++)
                    c[i][e] = type == G4_IQ4_NL || type == G4_MXF4 ? vqtbl1q_s8(iq4, vreinterpretq_u8_s8(c[i][e]))
                                                : vsubq_s8(c[i][e], vdupq_n_s8(8));
            }
        }
    }
}

/* (4 bytes - off) as floats times d */
N2_INLINE float32x4_t n2_scale4(uint32_t b, int off, float d) {
    const int32x4_t v = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(b)))));
    return vmulq_n_f32(vcvtq_f32_s32(vsubq_s32(v, vdupq_n_s32(off))), d);
}

/* The scales of pair p (groups 2p, 2p + 1) of a row of nb blocks: group h's block i in lane i of s[h][0] (its
 * elements 0-15) and s[h][1] (16-31; the same but for the types of n2_halves), and of s2[h] (its offset term); Q2_K
 * its mins in mins[h][0] and mins[h][1] (lanes as s's); zero past the row. */
N2_INLINE void n2_scales(g4_dtype type, const unsigned char *row, int p, int nb, float32x4_t s[2][2],
                             float32x4_t s2[2], float32x4_t mins[2][2]) {
    s2[0] = s2[1] = mins[0][0] = mins[0][1] = mins[1][0] = mins[1][1] = vdupq_n_f32(0);
    if (type == G4_Q2_K) { /* group h's block i: elements 0-15 scales[8h + 2i], 16-31 scales[8h + 2i + 1] */
        const unsigned char *sb = row + (size_t)84 * (size_t)p;
        const float d = g4_f16_at(sb + 80), dmin = g4_f16_at(sb + 82);
        for (int h = 0; h < 2; h++) {
            const uint8x8_t v = vld1_u8(sb + 8 * h);
            const uint8x8_t e = vuzp1_u8(v, v), o = vuzp2_u8(v, v);
            const uint8x8_t b[2] = {e, o};
            for (int k = 0; k < 2; k++) {
                const uint32x4_t w = vmovl_u16(vget_low_u16(vmovl_u8(b[k])));
                s[h][k] = vmulq_n_f32(vcvtq_f32_u32(vandq_u32(w, vdupq_n_u32(15))), d);
                mins[h][k] = vmulq_n_f32(vcvtq_f32_u32(vshrq_n_u32(w, 4)), -dmin);
            }
        }
    } else if (type == G4_Q4_K || type == G4_Q5_K) {
        const unsigned char *sb = row + (size_t)(type == G4_Q4_K ? 144 : 176) * (size_t)p;
        const float d = g4_f16_at(sb), dmin = g4_f16_at(sb + 2);
        uint64_t sc, mn;
        g4_k_scales8(sb + 4, &sc, &mn);
        for (int h = 0; h < 2; h++) {
            s[h][0] = s[h][1] = n2_scale4((uint32_t)(sc >> (32 * h)), 0, d);
            s2[h] = n2_scale4((uint32_t)(mn >> (32 * h)), 0, -dmin);
        }
    } else if (type == G4_Q6_K || type == G4_CB4_16) { /* group h's block i: elements 0-15 scales[8h + 2i], 16-31
                                                        * scales[8h + 2i + 1] */
        const int cb = type == G4_CB4_16;
        const unsigned char *sb = row + (size_t)(cb ? 162 : 210) * (size_t)p;
        const float d = g4_f16_at(sb + (cb ? 16 : 208));
        for (int h = 0; h < 2; h++) {
            const int8x8_t v = vld1_s8((const int8_t *)sb + (cb ? 18 : 192) + 8 * h);
            const int8x8_t e = vuzp1_s8(v, v), o = vuzp2_s8(v, v);
            s[h][0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(e)))), d);
            s[h][1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(o)))), d);
        }
    } else if (type == G4_Q3_K) { /* as Q6_K's: the 16 scales d * (6-bit scale - 32) */
        const unsigned char *sb = row + (size_t)110 * (size_t)p;
        const float d = g4_f16_at(sb + 108);
        uint64_t s8[2];
        g4_q3k_scales16(sb + 96, &s8[0], &s8[1]);
        for (int h = 0; h < 2; h++) {
            const int8x8_t v = vsub_s8(vreinterpret_s8_u8(vcreate_u8(s8[h])), vdup_n_s8(32));
            const int8x8_t e = vuzp1_s8(v, v), o = vuzp2_s8(v, v);
            s[h][0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(e)))), d);
            s[h][1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(o)))), d);
        }
    } else if (type == G4_IQ4_XS || type == G4_CB4) { /* sub-block k: d * (6-bit scale - 32) */
        const unsigned char *sb = row + (type == G4_CB4 ? (size_t)152 * (size_t)p + 16 : (size_t)136 * (size_t)p);
        const uint64_t ls = g4_iq4xs_scales8(sb);
        const float d = g4_f16_at(sb);
        for (int h = 0; h < 2; h++)
            s[h][0] = s[h][1] = n2_scale4((uint32_t)(ls >> (32 * h)), 32, d);
    } else if (type == G4_AF4 || type == G4_AF8) { /* the blocks' scales s and biases b (AF8: b + 128 s) */
        const int bs = g4_q8_block_bytes(type), n = nb - 8 * p;
        const unsigned char *b = row + (size_t)bs * 8 * (size_t)p;
        for (int h = 0; h < 2; h++) {
            float sv[4], bv[4];
            for (int i = 0; i < 4; i++) {
                sv[i] = bv[i] = 0.0f;
                if (4 * h + i < n) {
                    memcpy(&sv[i], b + (size_t)bs * (size_t)(4 * h + i), 4);
                    memcpy(&bv[i], b + (size_t)bs * (size_t)(4 * h + i) + 4, 4);
                }
            }
            s[h][0] = s[h][1] = vld1q_f32(sv);
            s2[h] = type == G4_AF8 ? vfmaq_n_f32(vld1q_f32(bv), s[h][0], 128.0f) : vld1q_f32(bv);
        }
    } else { /* blocks of 32: d */
        const int bs = g4_q8_block_bytes(type), n = nb - 8 * p;
        const unsigned char *b = row + (size_t)bs * 8 * (size_t)p;
        for (int h = 0; h < 2; h++) {
            float d[4];
            for (int i = 0; i < 4; i++) d[i] = 4 * h + i < n ? g4_f16_at(b + (size_t)bs * (size_t)(4 * h + i)) : 0.0f;
            s[h][0] = s[h][1] = vld1q_f32(d);
        }
    }
}

/* the integer dot products of a block's elements 0-15 (d[0]) and 16-31 (d[1]), 4 lanes each */
N2_INLINE void n2_dot_widen(const int8x16_t c[2], const int8_t *x, int32x4_t d[2]) {
    for (int e = 0; e < 2; e++) {
        const int8x16_t v = vld1q_s8(x + 16 * e);
        d[e] = vpaddlq_s16(vmlal_high_s8(vmull_s8(vget_low_s8(c[e]), vget_low_s8(v)), c[e], v));
    }
}
__attribute__((target("arch=armv8.2-a+dotprod"))) static inline void n2_dot_sdot(const int8x16_t c[2], const int8_t *x,
                                                                                int32x4_t d[2]) {
    for (int e = 0; e < 2; e++) d[e] = vdotq_s32(vdupq_n_s32(0), c[e], vld1q_s8(x + 16 * e));
}

/* group codes c times activation codes x: lane i = block i's sum over elements 0-15 (h[0]) and 16-31 (h[1]); without
 * halves, h[0] the whole block's */
N2_INLINE void n2_group_dots(const int8x16_t c[4][2], const int8_t *x, int sdot, int halves, int32x4_t h[2]) {
    int32x4_t d[4][2];
    for (int i = 0; i < 4; i++) {
        if (sdot)
            n2_dot_sdot(c[i], x + 32 * i, d[i]);
        else
            n2_dot_widen(c[i], x + 32 * i, d[i]);
        if (!halves) d[i][0] = vaddq_s32(d[i][0], d[i][1]);
    }
    for (int e = 0; e < (halves ? 2 : 1); e++)
        h[e] = vpaddq_s32(vpaddq_s32(d[0][e], d[1][e]), vpaddq_s32(d[2][e], d[3][e]));
}

/* One (row, token) step of group h of a pair, the same in q_gemm and q_gemv: v += its sums times s * dx, plus s2 * m
 * (dx, m: its blocks' d and m), and for Q2_K (mn not NULL) each half's mins times the activations' code sums of the
 * half xs (per block, the halves apart) times dx */
N2_INLINE float32x4_t n2_group_step(float32x4_t v, const int32x4_t hs[2], const float32x4_t s[2], float32x4_t s2,
                                        float32x4_t dx, float32x4_t m, int halves, const float32x4_t *mn,
                                        const int32x4_t *xs) {
    v = vfmaq_f32(v, vcvtq_f32_s32(hs[0]), vmulq_f32(s[0], dx));
    if (halves) v = vfmaq_f32(v, vcvtq_f32_s32(hs[1]), vmulq_f32(s[1], dx));
    if (mn) {
        v = vfmaq_f32(v, vcvtq_f32_s32(xs[0]), vmulq_f32(mn[0], dx));
        v = vfmaq_f32(v, vcvtq_f32_s32(xs[1]), vmulq_f32(mn[1], dx));
    }
    return vfmaq_f32(v, s2, m);
}

/* the activations' code sums of group g's blocks, elements 0-15 (xs[0]) and 16-31 (xs[1]) apart, lane i block i */
N2_INLINE void n2_code_sums(const int8_t *x, int sdot, int32x4_t xs[2]) {
    int8x16_t one[4][2];
    for (int i = 0; i < 4; i++) one[i][0] = one[i][1] = vdupq_n_s8(1);
    n2_group_dots(one, x, sdot, 1, xs);
}

N2_INLINE void q_pack_typed(g4_dtype type, const unsigned char *w, size_t row_bytes,
                                                               int nr, int nb, unsigned char *dst) {
    const int ng = (nb + 3) / 4;
    for (int r = 0; r < nr; r++) {
        const unsigned char *row = w + (size_t)r * row_bytes;
        unsigned char *o = dst + (size_t)r * ng * G4_QW_GROUP;
        float32x4_t s[2][2], s2[2], mn[2][2];
        for (int g = 0; g < ng; g++, o += G4_QW_GROUP) { /* codes (block i: 32i), s (128, 144), s2 (160), mn (176, 192) */
            if (g % 2 == 0) n2_scales(type, row, g / 2, nb, s, s2, mn);
            int8x16_t c[4][2];
            n2_codes(type, row, g, nb, c);
            for (int i = 0; i < 4; i++)
                for (int e = 0; e < 2; e++) vst1q_s8((int8_t *)o + 32 * i + 16 * e, c[i][e]);
            vst1q_f32((float *)(o + 128), s[g % 2][0]);
            vst1q_f32((float *)(o + 144), s[g % 2][1]);
            vst1q_f32((float *)(o + 160), s2[g % 2]);
            vst1q_f32((float *)(o + 176), mn[g % 2][0]);
            vst1q_f32((float *)(o + 192), mn[g % 2][1]);
        }
    }
}

static void q_pack_neon(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, int nb, unsigned char *dst) {
#define CALL(qt) q_pack_typed(qt, w, row_bytes, nr, nb, dst)
    G4_Q8_SWITCH(type, CALL) /* (each type's decoding inlined) */
#undef CALL
}

N2_INLINE void q_gemm_body(const unsigned char *wp, int nr, const g4_q8_rows *a, int t0, int nt, int ng, float *y,
                               size_t ldy, int sdot) {
    const size_t ldw = (size_t)ng * G4_QW_GROUP;
    const int halves = n2_halves(a->type), min16 = a->type == G4_Q2_K;
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const int8_t *x = a->q + (size_t)(t0 + t) * a->in_pad;
            const float *dx = a->d + (size_t)(t0 + t) * a->nb_pad, *m = a->m + (size_t)(t0 + t) * a->nb_pad;
            float32x4_t acc = vdupq_n_f32(0);
            for (int p = 0; 2 * p < ng; p++) {
                float32x4_t v = vdupq_n_f32(0);
                for (int g = 2 * p; g < 2 * p + 2 && g < ng; g++) {
                    const unsigned char *o = wp + (size_t)r * ldw + (size_t)g * G4_QW_GROUP;
                    int8x16_t c[4][2];
                    for (int i = 0; i < 4; i++)
                        for (int e = 0; e < 2; e++) c[i][e] = vld1q_s8((const int8_t *)o + 32 * i + 16 * e);
                    const float32x4_t s[2] = {vld1q_f32((const float *)(o + 128)), vld1q_f32((const float *)(o + 144))};
                    int32x4_t hs[2], xs[2];
                    n2_group_dots(c, x + 128 * (size_t)g, sdot, halves, hs);
                    const float32x4_t mn[2] = {vld1q_f32((const float *)(o + 176)), vld1q_f32((const float *)(o + 192))};
                    if (min16) n2_code_sums(x + 128 * (size_t)g, sdot, xs);
                    v = n2_group_step(v, hs, s, vld1q_f32((const float *)(o + 160)), vld1q_f32(dx + 4 * (size_t)g),
                                      vld1q_f32(m + 4 * (size_t)g), halves, min16 ? mn : NULL, xs);
                }
                acc = vaddq_f32(acc, v);
            }
            y[(size_t)t * ldy + (size_t)r] = vaddvq_f32(acc);
        }
}

static void q_gemm_neon(const unsigned char *wp, int nr, const g4_q8_rows *a, int t0, int nt, int ng, float *y,
                        size_t ldy) {
    q_gemm_body(wp, nr, a, t0, nt, ng, y, ldy, 0);
}
__attribute__((target("arch=armv8.2-a+dotprod"))) static void q_gemm_neon_dot(const unsigned char *wp, int nr,
                                                                             const g4_q8_rows *a, int t0, int nt,
                                                                             int ng, float *y, size_t ldy) {
    q_gemm_body(wp, nr, a, t0, nt, ng, y, ldy, 1);
}

/* decode: NR rows as stored, far apart (stride), times token t's row, each group decoded in registers */
N2_INLINE void q_gemv_rows(g4_dtype type, const unsigned char *w, size_t stride, int nb, const g4_q8_rows *a, int t,
                               float *y, size_t ystride, int NR, int sdot) {
    const long gb = g4_q8_group_bytes(type);
    const int ng = (nb + 3) / 4, halves = n2_halves(type), min16 = type == G4_Q2_K;
    const int8_t *x = a->q + (size_t)t * a->in_pad;
    const float *dx = a->d + (size_t)t * a->nb_pad, *m = a->m + (size_t)t * a->nb_pad;
    float32x4_t acc[N2_ROWS];
    for (int r = 0; r < NR; r++) acc[r] = vdupq_n_f32(0);
    for (int p = 0; 2 * p < ng; p++)
        for (int r = 0; r < NR; r++) {
            const unsigned char *row = w + (size_t)r * stride;
            for (long off = 0; off < 2 * gb; off += 64) __builtin_prefetch(row + (size_t)(gb * 2 * p + off) + N2_PREFETCH);
            float32x4_t s[2][2], s2[2], mn[2][2], v = vdupq_n_f32(0);
            n2_scales(type, row, p, nb, s, s2, mn);
            for (int g = 2 * p; g < 2 * p + 2 && g < ng; g++) {
                int8x16_t c[4][2];
                int32x4_t hs[2], xs[2];
                n2_codes(type, row, g, nb, c);
                n2_group_dots(c, x + 128 * (size_t)g, sdot, halves, hs);
                if (min16) n2_code_sums(x + 128 * (size_t)g, sdot, xs);
                v = n2_group_step(v, hs, s[g % 2], s2[g % 2], vld1q_f32(dx + 4 * (size_t)g), vld1q_f32(m + 4 * (size_t)g),
                                  halves, min16 ? mn[g % 2] : NULL, xs);
            }
            acc[r] = vaddq_f32(acc[r], v);
        }
    for (int r = 0; r < NR; r++) y[(size_t)r * ystride] = vaddvq_f32(acc[r]);
}

N2_INLINE void q_gemv_body(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, int nb,
                               const g4_q8_rows *a, int t, float *y, int sdot) {
    const int q = nr / N2_ROWS;
    for (int i = 0; i < q; i++)
        q_gemv_rows(type, w + (size_t)i * row_bytes, (size_t)q * row_bytes, nb, a, t, y + i, (size_t)q, N2_ROWS, sdot);
    for (int r = q * N2_ROWS; r < nr; r++) q_gemv_rows(type, w + (size_t)r * row_bytes, 0, nb, a, t, y + r, 0, 1, sdot);
}

static void q_gemv_neon(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, int nb, const g4_q8_rows *a,
                        int t, float *y) {
#define CALL(qt) q_gemv_body(qt, w, row_bytes, nr, nb, a, t, y, 0)
    G4_Q8_SWITCH(type, CALL) /* (each type's decoding inlined) */
#undef CALL
}
__attribute__((target("arch=armv8.2-a+dotprod"))) static void q_gemv_neon_dot(g4_dtype type, const unsigned char *w,
                                                                             size_t row_bytes, int nr, int nb,
                                                                             const g4_q8_rows *a, int t, float *y) {
#define CALL(qt) q_gemv_body(qt, w, row_bytes, nr, nb, a, t, y, 1)
    G4_Q8_SWITCH(type, CALL)
#undef CALL
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

static int32_t argmax_neon(const float *x, int n) { return g4_cpu_argmax_body(x, n); }

static const g4_cpu_kernels k_neon = {"neon", dot_f32_neon, dot_bf16_neon, bf16_to_f32_neon, axpy_neon,
                                      NULL, f32_tile_neon, q_pack_neon,
                                      exp_sum_neon, gelu_mul_neon, softcap_neon, pv_neon, NULL, q_gemm_neon,
                                      q_gemv_neon, NULL, NULL, 1, 1, argmax_neon, 0, NULL};
static const g4_cpu_kernels k_neon_dot = {"neon_dot", dot_f32_neon, dot_bf16_neon, bf16_to_f32_neon, axpy_neon,
                                          NULL, f32_tile_neon, q_pack_neon,
                                          exp_sum_neon, gelu_mul_neon, softcap_neon, pv_neon, NULL, q_gemm_neon_dot,
                                          q_gemv_neon_dot, NULL, NULL, 1, 1, argmax_neon, 0, NULL};

/* NEON is part of every aarch64 CPU (ARMv8-A); SDOT is the optional dot-product extension */
const g4_cpu_kernels *g4_cpu_kernels_neon(void) { return &k_neon; }

const g4_cpu_kernels *g4_cpu_kernels_neon_dot(void) {
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? &k_neon_dot : NULL;
}
#else
const g4_cpu_kernels *g4_cpu_kernels_neon(void) { return NULL; }
const g4_cpu_kernels *g4_cpu_kernels_neon_dot(void) { return NULL; }
#endif
