/* Reference encoders and decoders of the quantized formats (layouts in core/quant.h,
 * docs/formats.md 2.2-2.4 and 3.2). Plain C, one block at a time: the definition the
 * SIMD kernels are tested against. Q8_0/Q4_0 encode exactly as llama.cpp's
 * quantize_row_*_ref; the K-quant and IQ4 encoders pick scales by a simpler min/max rule
 * (any encoding with the right layout is a valid file; llama.cpp searches scales iteratively). */
#include "core/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const int8_t g4_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void put_f16(unsigned char *p, float v) {
    uint16_t h = g4_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* --------------------------------------------------------------- decoding */
static void dq_q4_0(const unsigned char *b, float *y) {
    float d = g4_f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 15) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

/* AF4 / AF8 (core/tensor.h): the CPU's layout of MLX affine weights, w = s * code + b as g4_mlx_dequant computes it */
static void dq_af(const unsigned char *b, float *y, int eight) {
    float s, m;
    memcpy(&s, b, 4);
    memcpy(&m, b + 4, 4);
    for (int j = 0; j < 16; j++) {
        y[j] = s * (float)(eight ? b[8 + j] : b[8 + j] & 15) + m;
        y[j + 16] = s * (float)(eight ? b[24 + j] : b[8 + j] >> 4) + m;
    }
}

static void dq_q4_1(const unsigned char *b, float *y) {
    float d = g4_f16_at(b), m = g4_f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(b[4 + j] & 15) * d + m;
        y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

static void dq_q5(const unsigned char *b, float *y, int has_min) {
    float d = g4_f16_at(b), m = has_min ? g4_f16_at(b + 2) : 0.0f;
    const unsigned char *p = b + (has_min ? 4 : 2);
    uint32_t qh;
    memcpy(&qh, p, 4);
    const unsigned char *qs = p + 4;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        if (has_min) {
            y[j] = (float)lo * d + m;
            y[j + 16] = (float)hi * d + m;
        } else {
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

static void dq_q8_0(const unsigned char *b, float *y) {
    float d = g4_f16_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void dq_qk(const unsigned char *b, float *y, int five) {
    float d = g4_f16_at(b), dmin = g4_f16_at(b + 2);
    const unsigned char *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++) {
        int s0, m0, s1, m1;
        g4_k_scale_min(sc, 2 * c, &s0, &m0);
        g4_k_scale_min(sc, 2 * c + 1, &s1, &m1);
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
            if (five) {
                lo += ((qh[l] >> (2 * c)) & 1) << 4;
                hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            y[64 * c + l] = d * (float)s0 * (float)lo - dmin * (float)m0;
            y[64 * c + 32 + l] = d * (float)s1 * (float)hi - dmin * (float)m1;
        }
    }
}

static void dq_q6_k(const unsigned char *b, float *y) {
    const unsigned char *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = g4_f16_at(b + 208);
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            int i = l / 16;
            int q1 = (ql[l] & 15) | ((qh[l] >> 0) & 3) << 4;
            int q2 = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4;
            int q3 = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            int q4 = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
            y[l] = d * (float)sc[i] * (float)(q1 - 32);
            y[l + 32] = d * (float)sc[i + 2] * (float)(q2 - 32);
            y[l + 64] = d * (float)sc[i + 4] * (float)(q3 - 32);
            y[l + 96] = d * (float)sc[i + 6] * (float)(q4 - 32);
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

/* Q2_K: 16 sub-blocks of 16; element j = 128h + 32s + l takes bits 2s..2s+1 of qs[32h + l] */
static void dq_q2_k(const unsigned char *b, float *y) {
    const unsigned char *sc = b, *qs = b + 16;
    float d = g4_f16_at(b + 80), dmin = g4_f16_at(b + 82);
    for (int j = 0; j < 256; j++) {
        int h = j / 128, s = (j / 32) % 4, l = j % 32, k = j / 16;
        float dl = d * (float)(sc[k] & 15), ml = dmin * (float)(sc[k] >> 4);
        y[j] = dl * (float)((qs[32 * h + l] >> (2 * s)) & 3) - ml;
    }
}

/* 6-bit signed scale k (0..15) of a Q3_K block's scales[12] */
static int q3_k_scale(const unsigned char *s, int k) {
    int lo = k < 8 ? s[k] & 15 : s[k - 8] >> 4, hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* Q3_K: element j = 128h + 32s + l: low bits 2s..2s+1 of qs[32h + l], minus 4 unless bit 4h+s of hmask[l] */
static void dq_q3_k(const unsigned char *b, float *y) {
    const unsigned char *hm = b, *qs = b + 32, *sc = b + 96;
    float d = g4_f16_at(b + 108);
    for (int j = 0; j < 256; j++) {
        int h = j / 128, s = (j / 32) % 4, l = j % 32;
        int q = ((qs[32 * h + l] >> (2 * s)) & 3) - ((hm[l] >> (4 * h + s)) & 1 ? 0 : 4);
        float dl = d * (float)q3_k_scale(sc, j / 16);
        y[j] = dl * (float)q;
    }
}

/* an IQ4_NL block whose nibbles index `values` (IQ4_NL: g4_iq4_values; MXF4: g4_fp4_values) */
static void dq_iq4_nl(const unsigned char *b, const int8_t *values, float *y) {
    float d = g4_f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)values[b[2 + j] & 15];
        y[j + 16] = d * (float)values[b[2 + j] >> 4];
    }
}

/* 6-bit signed scale of sub-block k (0..7) of an IQ4_XS block */
static int iq4_xs_scale(const unsigned char *b, int k) {
    uint16_t h;
    memcpy(&h, b + 2, 2);
    return (((b[4 + k / 2] >> (4 * (k % 2))) & 15) | ((h >> (2 * k)) & 3) << 4) - 32;
}

/* an IQ4_XS block whose nibbles index `values` (IQ4_XS: g4_iq4_values; CB4: the block's own table) */
static void dq_iq4_xs(const unsigned char *b, const int8_t *values, float *y) {
    float d = g4_f16_at(b);
    const unsigned char *qs = b + 8;
    for (int k = 0; k < 8; k++) {
        float dl = d * (float)iq4_xs_scale(b, k);
        for (int j = 0; j < 16; j++) {
            y[32 * k + j] = dl * (float)values[qs[16 * k + j] & 15];
            y[32 * k + 16 + j] = dl * (float)values[qs[16 * k + j] >> 4];
        }
    }
}

/* element 32 k + j of a CB4_16 block (core/quant.h) */
static void dq_cb4_16(const unsigned char *b, float *y) {
    const float d = g4_f16_at(b + 16);
    const int8_t *values = (const int8_t *)b, *sc = (const int8_t *)(b + 18);
    const unsigned char *qs = b + 34;
    for (int k = 0; k < 8; k++) {
        const float d0 = d * (float)sc[2 * k], d1 = d * (float)sc[2 * k + 1];
        for (int j = 0; j < 16; j++) {
            y[32 * k + j] = d0 * (float)values[qs[16 * k + j] & 15];
            y[32 * k + 16 + j] = d1 * (float)values[qs[16 * k + j] >> 4];
        }
    }
}

void g4_dequant(g4_dtype t, const void *src, float *dst, int64_t n) {
    const unsigned char *s = src;
    const int qk = g4_dtype_block(t), bs = g4_dtype_block_bytes(t);
    if (t == G4_F32 || t == G4_F16 || t == G4_BF16) {
        g4_to_f32(t, src, dst, (size_t)n);
        return;
    }
    for (int64_t i = 0; qk > 0 && i + qk <= n; i += qk, s += bs) {
        float *y = dst + i;
        switch (t) {
        case G4_Q4_0: dq_q4_0(s, y); break;
        case G4_Q4_1: dq_q4_1(s, y); break;
        case G4_Q5_0: dq_q5(s, y, 0); break;
        case G4_Q5_1: dq_q5(s, y, 1); break;
        case G4_Q8_0: dq_q8_0(s, y); break;
        case G4_Q4_K: dq_qk(s, y, 0); break;
        case G4_Q5_K: dq_qk(s, y, 1); break;
        case G4_Q6_K: dq_q6_k(s, y); break;
        case G4_Q2_K: dq_q2_k(s, y); break;
        case G4_Q3_K: dq_q3_k(s, y); break;
        case G4_IQ4_NL: dq_iq4_nl(s, g4_iq4_values, y); break;
        case G4_MXF4: dq_iq4_nl(s, g4_fp4_values, y); break;
        case G4_IQ4_XS: dq_iq4_xs(s, g4_iq4_values, y); break;
        case G4_CB4: dq_iq4_xs(s + 16, (const int8_t *)s, y); break;
        case G4_CB4_16: dq_cb4_16(s, y); break;
        case G4_AF4: dq_af(s, y, 0); break;
        case G4_AF8: dq_af(s, y, 1); break;
        case G4_IQ2_XXS: case G4_IQ2_XS: case G4_IQ2_S: case G4_IQ3_XXS: case G4_IQ3_S: case G4_IQ1_S: case G4_IQ1_M:
        case G4_TQ1_0: case G4_TQ2_0: case G4_MXFP4: case G4_NVFP4: g4_dequant_codebook(t, s, y); break;
        default: memset(y, 0, (size_t)qk * sizeof(float)); break;
        }
    }
}

static float scale_at(g4_dtype sdt, const void *p, int64_t i) {
    const unsigned char *b = p;
    if (sdt == G4_F32) {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, b + 2 * i, 2);
    return sdt == G4_BF16 ? g4_bf16_to_f32(h) : g4_f16_to_f32(h);
}

void g4_mlx_dequant(int bits, int group, const void *w, const void *scales, const void *biases, g4_dtype sdt,
                    float *dst, int64_t n) {
    for (int64_t g = 0; g < n / group; g++) {
        float s = scale_at(sdt, scales, g), b = scale_at(sdt, biases, g);
        for (int64_t j = g * group; j < (g + 1) * group; j++) dst[j] = s * (float)g4_mlx_code(w, bits, j) + b;
    }
}

void g4_dequant_row(const g4_tensor *t, int64_t r, float *dst) {
    int64_t n = t->shape[t->ndim - 1];
    if (g4_dtype_is_mlx(t->dtype)) {
        g4_tensor v = g4_tensor_rows(t, r, 1);
        g4_mlx_dequant(g4_mlx_bits(t->dtype), t->group, v.data, v.scales, v.biases, t->scale_dtype, dst, n);
        return;
    }
    g4_dequant(t->dtype, g4_tensor_row(t, r), dst, n);
}

/* --------------------------------------------------------------- encoding */
static void q_q8_0(const float *x, unsigned char *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    put_f16(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (unsigned char)(int8_t)roundf(x[j] * id);
}

static void q_q4_0(const float *x, unsigned char *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
    put_f16(b, d);
    for (int j = 0; j < 16; j++) {
        int a = (int8_t)(x[j] * id + 8.5f), c = (int8_t)(x[j + 16] * id + 8.5f);
        a = a < 15 ? a : 15;
        c = c < 15 ? c : 15;
        b[2 + j] = (unsigned char)(a | c << 4);
    }
}

/* Q4_1 / Q5_1 / Q5_0: llama.cpp's quantize_row_*_ref */
static void q_q4_1(const float *x, unsigned char *b) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
    float d = (hi - lo) / 15.0f, id = d ? 1.0f / d : 0.0f;
    put_f16(b, d);
    put_f16(b + 2, lo);
    for (int j = 0; j < 16; j++) {
        int a = (int8_t)((x[j] - lo) * id + 0.5f), c = (int8_t)((x[j + 16] - lo) * id + 0.5f);
        a = a < 15 ? a : 15;
        c = c < 15 ? c : 15;
        b[4 + j] = (unsigned char)(a | c << 4);
    }
}

static void q_q5(const float *x, unsigned char *b, int has_min) {
    float d, lo = 0;
    if (has_min) {
        float hi = x[0];
        lo = x[0];
        for (int j = 1; j < 32; j++) lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
        d = (hi - lo) / 31.0f;
        put_f16(b, d);
        put_f16(b + 2, lo);
    } else {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        d = max / -16.0f;
        put_f16(b, d);
    }
    const float id = d ? 1.0f / d : 0.0f;
    unsigned char *qs = b + (has_min ? 8 : 6);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int a, c;
        if (has_min) {
            a = (uint8_t)((x[j] - lo) * id + 0.5f);
            c = (uint8_t)((x[j + 16] - lo) * id + 0.5f);
        } else {
            a = (int8_t)(x[j] * id + 16.5f), c = (int8_t)(x[j + 16] * id + 16.5f);
            a = a < 31 ? a : 31;
            c = c < 31 ? c : 31;
        }
        qs[j] = (unsigned char)((a & 15) | (c & 15) << 4);
        qh |= (uint32_t)((a >> 4) & 1) << j | (uint32_t)((c >> 4) & 1) << (j + 16);
    }
    memcpy(qs - 4, &qh, 4);
}

static int nearest(float v) { return (int)lrintf(v); }

/* Scales and mins of n sub-blocks of len (the asymmetric K-quants): sc[k] = (max - min) / nmax over the sub-block
 * with 0 in its range, mn[k] = -min(0, min); the largest of each in *msc, *mmn. */
static void scales_mins(const float *x, int n, int len, float nmax, float *sc, float *mn, float *msc, float *mmn) {
    *msc = *mmn = 0;
    for (int k = 0; k < n; k++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < len; l++) {
            lo = fminf(lo, x[len * k + l]);
            hi = fmaxf(hi, x[len * k + l]);
        }
        sc[k] = (hi - lo) / nmax;
        mn[k] = -lo;
        *msc = fmaxf(*msc, sc[k]);
        *mmn = fmaxf(*mmn, mn[k]);
    }
}

/* Q4_K / Q5_K: per sub-block of 32, scale = (max - min) / nmax and min = -min(0, min),
 * both re-quantized to 6 bits against the block's largest. */
static void q_qk(const float *x, unsigned char *b, int five) {
    const int nmax = five ? 31 : 15;
    float sc[8], mn[8], msc, mmn;
    scales_mins(x, 8, 32, (float)nmax, sc, mn, &msc, &mmn);
    float d = msc / 63.0f, dmin = mmn / 63.0f;
    put_f16(b, d);
    put_f16(b + 2, dmin);
    d = g4_f16_at(b);
    dmin = g4_f16_at(b + 2);
    unsigned char *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    memset(s, 0, 12);
    if (five) memset(qh, 0, 32);
    int isc[8], imn[8];
    for (int k = 0; k < 8; k++) {
        isc[k] = d ? nearest(sc[k] / d) : 0;
        imn[k] = dmin ? nearest(mn[k] / dmin) : 0;
        isc[k] = isc[k] > 63 ? 63 : isc[k];
        imn[k] = imn[k] > 63 ? 63 : imn[k];
        if (k < 4) {
            s[k] |= (unsigned char)isc[k];
            s[k + 4] |= (unsigned char)imn[k];
        } else {
            s[k + 4] = (unsigned char)((isc[k] & 15) | (imn[k] & 15) << 4);
            s[k - 4] |= (unsigned char)((isc[k] >> 4) << 6);
            s[k] |= (unsigned char)((imn[k] >> 4) << 6);
        }
    }
    for (int k = 0; k < 8; k++) {
        float dk = d * (float)isc[k], mk = dmin * (float)imn[k];
        for (int l = 0; l < 32; l++) {
            int q = dk ? nearest((x[32 * k + l] + mk) / dk) : 0;
            q = q < 0 ? 0 : q > nmax ? nmax : q;
            int c = k / 2, pos = 32 * c + l;
            if (k & 1)
                qs[pos] = (unsigned char)((qs[pos] & 15) | (q & 15) << 4);
            else
                qs[pos] = (unsigned char)(q & 15);
            if (five && (q & 16)) qh[l] |= (unsigned char)(1u << k);
        }
    }
}

/* The scales of a 256-block's 16 sub-blocks of 16: sc[k] = max|x| of sub-block k / steps; returns the largest. */
static float scales16(const float *x, float steps, float sc[16]) {
    float msc = 0;
    for (int k = 0; k < 16; k++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * k + l]));
        sc[k] = amax / steps;
        msc = fmaxf(msc, sc[k]);
    }
    return msc;
}

/* Q6_K: per sub-block of 16, scale = max|x| / 31, the scales as int8 against the largest. */
static void q_q6_k(const float *x, unsigned char *b) {
    float sc[16];
    const float msc = scales16(x, 31.0f, sc);
    float d = msc / 127.0f;
    put_f16(b + 208, d);
    d = g4_f16_at(b + 208);
    int8_t *s = (int8_t *)(b + 192);
    unsigned char *ql = b, *qh = b + 128;
    memset(b, 0, 192);
    for (int k = 0; k < 16; k++) {
        int v = d ? nearest(sc[k] / d) : 0;
        s[k] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int j = 0; j < 256; j++) {
        float dk = d * (float)s[j / 16];
        int q = dk ? nearest(x[j] / dk) : 0;
        q = (q < -32 ? -32 : q > 31 ? 31 : q) + 32;
        /* inverse of the decoder: half h, l in 0..31, quarter i in 0..3 */
        int h = j / 128, r = j % 128, i = r / 32, l = r % 32;
        unsigned char *lq = ql + 64 * h + l + (i & 1) * 32;
        if (i < 2)
            *lq = (unsigned char)((*lq & 0xf0) | (q & 15));
        else
            *lq = (unsigned char)((*lq & 0x0f) | (q & 15) << 4);
        qh[32 * h + l] |= (unsigned char)((q >> 4) << (2 * i));
    }
}

/* Q2_K: per sub-block of 16, scale = (max - min) / 3 and min = -min(0, min) as in q_qk, re-quantized to 4 bits
 * against the block's largest (d = max scale / 15, dmin = max min / 15, nearest); codes the nearest of 0..3. */
static void q_q2_k(const float *x, unsigned char *b) {
    float sc[16], mn[16], msc, mmn;
    scales_mins(x, 16, 16, 3.0f, sc, mn, &msc, &mmn);
    put_f16(b + 80, msc / 15.0f);
    put_f16(b + 82, mmn / 15.0f);
    float d = g4_f16_at(b + 80), dmin = g4_f16_at(b + 82);
    unsigned char *s = b, *qs = b + 16;
    memset(qs, 0, 64);
    for (int k = 0; k < 16; k++) {
        int is = d ? nearest(sc[k] / d) : 0, im = dmin ? nearest(mn[k] / dmin) : 0;
        is = is > 15 ? 15 : is;
        im = im > 15 ? 15 : im;
        s[k] = (unsigned char)(is | im << 4);
        float dk = d * (float)is, mk = dmin * (float)im;
        for (int l = 0; l < 16; l++) {
            int j = 16 * k + l, q = dk ? nearest((x[j] + mk) / dk) : 0;
            q = q < 0 ? 0 : q > 3 ? 3 : q;
            qs[32 * (j / 128) + j % 32] |= (unsigned char)(q << (2 * ((j / 32) % 4)));
        }
    }
}

/* Q3_K: per sub-block of 16, scale = max|x| / 3.5 (codes -4..3 cover +-3.5 steps); the scales as 6-bit signed
 * values against the largest, d = -(largest) / 32 (so it is code -32; the others -32..0); codes the nearest. */
static void q_q3_k(const float *x, unsigned char *b) {
    float sc[16];
    const float msc = scales16(x, 3.5f, sc);
    put_f16(b + 108, -msc / 32.0f);
    float d = g4_f16_at(b + 108);
    unsigned char *hm = b, *qs = b + 32, *s = b + 96;
    memset(b, 0, 108);
    for (int k = 0; k < 16; k++) {
        int ls = d ? nearest(sc[k] / d) : 0;
        ls = ls < -32 ? -32 : ls > 31 ? 31 : ls;
        int u = ls + 32; /* the inverse of q3_k_scale */
        s[k % 8] |= (unsigned char)((u & 15) << (4 * (k / 8)));
        s[8 + k % 4] |= (unsigned char)((u >> 4) << (2 * (k / 4)));
        float dl = d * (float)ls;
        for (int l = 0; l < 16; l++) {
            int j = 16 * k + l, q = dl ? nearest(x[j] / dl) : 0;
            q = (q < -4 ? -4 : q > 3 ? 3 : q) + 4; /* 0..7: low 2 bits in qs, bit 2 in hmask (set: no -4) */
            int h = j / 128, sh = (j / 32) % 4, i = j % 32;
            qs[32 * h + i] |= (unsigned char)((q & 3) << (2 * sh));
            if (q & 4) hm[i] |= (unsigned char)(1u << (4 * h + sh));
        }
    }
}

/* index of the IQ4 table value nearest v (the lower one on ties) */
static int iq4_index(float v) {
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(v - (float)g4_iq4_values[i]) < fabsf(v - (float)g4_iq4_values[best])) best = i;
    return best;
}

/* 32 IQ4 codes of x at scale dl into 16 bytes (low nibbles elements 0..15, high nibbles 16..31) */
static void iq4_codes(const float *x, float dl, unsigned char *qs) {
    for (int j = 0; j < 16; j++) {
        int a = dl ? iq4_index(x[j] / dl) : 8, c = dl ? iq4_index(x[j + 16] / dl) : 8;
        qs[j] = (unsigned char)(a | c << 4);
    }
}

/* the signed value of largest magnitude (the first on ties) over n, divided by -127: the IQ4 scale that makes it
 * the table's -127 exactly */
static float iq4_scale(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max / -127.0f;
}

/* IQ4_NL: d = iq4_scale (f16), each code the nearest table value to x / d. */
static void q_iq4_nl(const float *x, unsigned char *b) {
    put_f16(b, iq4_scale(x, 32));
    iq4_codes(x, g4_f16_at(b), b + 2);
}

/* IQ4_XS: the sub-blocks' iq4_scale as 6-bit signed values against the one of largest magnitude s,
 * d = s / -32 (it is code -32; the others -32..31), each code the nearest table value to x / (d * ls). */
static void q_iq4_xs(const float *x, unsigned char *b) {
    float sc[8], smax = 0;
    for (int k = 0; k < 8; k++) {
        sc[k] = iq4_scale(x + 32 * k, 32);
        if (fabsf(sc[k]) > fabsf(smax)) smax = sc[k];
    }
    put_f16(b, smax / -32.0f);
    float d = g4_f16_at(b);
    uint16_t sh = 0;
    memset(b + 4, 0, 4);
    for (int k = 0; k < 8; k++) {
        int ls = d ? nearest(sc[k] / d) : 0;
        ls = ls < -32 ? -32 : ls > 31 ? 31 : ls;
        int u = ls + 32; /* the inverse of iq4_xs_scale */
        b[4 + k / 2] |= (unsigned char)((u & 15) << (4 * (k % 2)));
        sh |= (uint16_t)((u >> 4) << (2 * k));
        iq4_codes(x + 32 * k, d * (float)ls, b + 8 + 16 * k);
    }
    memcpy(b + 2, &sh, 2);
}

size_t g4_quant(g4_dtype t, const float *src, void *dst, int64_t n) {
    unsigned char *d = dst;
    const int qk = g4_dtype_block(t), bs = g4_dtype_block_bytes(t);
    if (qk <= 0 || n % qk) return 0;
    switch (t) {
    case G4_F32: memcpy(dst, src, (size_t)n * 4); return (size_t)n * 4;
    case G4_F16:
    case G4_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = t == G4_F16 ? g4_f32_to_f16(src[i]) : g4_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return (size_t)n * 2;
    case G4_Q4_0: case G4_Q4_1: case G4_Q5_0: case G4_Q5_1: case G4_Q8_0: case G4_Q4_K: case G4_Q5_K: case G4_Q6_K:
    case G4_Q2_K: case G4_Q3_K: case G4_IQ4_NL: case G4_IQ4_XS: break;
    default: return 0;
    }
    for (int64_t i = 0; i < n; i += qk, d += bs) {
        switch (t) {
        case G4_Q4_0: q_q4_0(src + i, d); break;
        case G4_Q4_1: q_q4_1(src + i, d); break;
        case G4_Q5_0: q_q5(src + i, d, 0); break;
        case G4_Q5_1: q_q5(src + i, d, 1); break;
        case G4_Q8_0: q_q8_0(src + i, d); break;
        case G4_Q4_K: q_qk(src + i, d, 0); break;
        case G4_Q5_K: q_qk(src + i, d, 1); break;
        case G4_Q2_K: q_q2_k(src + i, d); break;
        case G4_Q3_K: q_q3_k(src + i, d); break;
        case G4_IQ4_NL: q_iq4_nl(src + i, d); break;
        case G4_IQ4_XS: q_iq4_xs(src + i, d); break;
        default: q_q6_k(src + i, d); break;
        }
    }
    return (size_t)(n / qk) * (size_t)bs;
}

g4_dtype g4_quant_row_type(g4_dtype t, int64_t n) {
    if (!g4_dtype_is_quantized(t) || g4_dtype_is_mlx(t) || (g4_dtype_block(t) > 0 && n % g4_dtype_block(t) == 0))
        return t;
    if (n % 32) return G4_BF16;
    return t == G4_Q2_K || t == G4_Q3_K || t == G4_IQ4_XS ? G4_IQ4_NL : G4_Q8_0;
}

static void put_scale(g4_dtype sdt, void *p, int64_t i, float v) {
    unsigned char *b = p;
    if (sdt == G4_F32) {
        memcpy(b + 4 * i, &v, 4);
        return;
    }
    uint16_t h = sdt == G4_BF16 ? g4_f32_to_bf16(v) : g4_f32_to_f16(v);
    memcpy(b + 2 * i, &h, 2);
}

/* ORs code j (< 2^bits) into an MLX bit stream of zeros, LSB first (g4_mlx_code reads it) */
static void mlx_put_code(unsigned char *w, int bits, int64_t j, unsigned code) {
    const uint64_t bp = (uint64_t)j * (uint64_t)bits;
    const unsigned v = code << (bp & 7);
    w[bp >> 3] |= (unsigned char)v;
    if ((bp & 7) + (uint64_t)bits > 8) w[(bp >> 3) + 1] |= (unsigned char)(v >> 8);
}

void g4_mlx_quant_row(int bits, int group, const float *x, int64_t n, void *w, void *scales, void *biases,
                      g4_dtype sdt) {
    const float qmax = (float)((1 << bits) - 1), eps = 1e-7f;
    unsigned char *wb = w;
    memset(wb, 0, (size_t)(n * bits / 8));
    for (int64_t g = 0; g < n / group; g++) {
        const float *xg = x + g * group;
        float wmax = 0, wmin = INFINITY;
        for (int j = 0; j < group; j++) {
            wmax = fmaxf(wmax, xg[j]);
            wmin = fminf(wmin, xg[j]);
        }
        float s = fmaxf((wmax - wmin) / qmax, eps);
        int neg = fabsf(wmin) > fabsf(wmax);
        float edge = neg ? wmin : wmax, scale = neg ? s : -s, bias = 0;
        float q0 = roundf(edge / scale);
        if (q0 != 0) {
            scale = edge / q0;
            bias = edge;
        }
        for (int j = 0; j < group; j++) {
            float q = roundf((xg[j] - bias) / scale);
            q = q < 0 ? 0 : q > qmax ? qmax : q;
            mlx_put_code(wb, bits, g * group + j, (unsigned)q);
        }
        put_scale(sdt, scales, g, scale);
        put_scale(sdt, biases, g, bias);
    }
}

/* --------------------------------------------------------------- transcoding */
int g4_dequant_reads(g4_dtype t) {
    return t == G4_F32 || t == G4_F16 || t == G4_BF16 || (g4_dtype_is_quantized(t) && g4_dtype_block(t) > 0);
}

int g4_transcode_exact(g4_dtype from, g4_dtype to) {
    if (!g4_dtype_is_mlx(from) && (to == G4_MLX4 || to == G4_MLX8)) /* (g4_transcode_row_mlx) */
        return g4_transcode_exact(from, to == G4_MLX4 ? G4_AF4 : G4_AF8) && from != G4_AF4 && from != G4_AF8;
    return from == to || ((from == G4_Q5_0 || from == G4_IQ4_NL) && to == G4_Q8_0) ||
           (g4_codebook_scale32_type(from) && (to == G4_AF8 || to == G4_CB4)) ||
           (g4_codebook_scale16_type(from) && to == G4_CB4_16) || (from == G4_MXFP4 && to == G4_MXF4) ||
           (from == G4_Q4_1 && to == G4_AF4) ||
           ((from == G4_Q3_K || g4_codebook_q6k_type(from)) && to == G4_Q6_K) ||
           (from == G4_Q5_1 && to == G4_AF8) ||
           (g4_dtype_is_mlx(from) &&
            (to == g4_af_type(from) || (g4_dtype_is_mlx(to) && g4_mlx_bits(to) >= g4_mlx_bits(from))));
}

g4_dtype g4_af_type(g4_dtype mlx) {
    const int bits = g4_mlx_bits(mlx);
    return bits == 0 ? G4_DTYPE_UNKNOWN : bits <= 4 ? G4_AF4 : G4_AF8;
}

/* row r of an MLX tensor as AF4 / AF8 blocks: each block's scale and bias (its group's) as f32, its codes */
static size_t mlx_to_af(const g4_tensor *t, int64_t r, g4_dtype to, unsigned char *d) {
    const int64_t n = t->shape[t->ndim - 1];
    const int bits = g4_mlx_bits(t->dtype), bs = g4_dtype_block_bytes(to);
    if (t->group <= 0 || t->group % 32 || n % t->group || to != g4_af_type(t->dtype)) return 0;
    const g4_tensor v = g4_tensor_rows(t, r, 1);
    for (int64_t b = 0; b < n / 32; b++, d += bs) {
        const float s = scale_at(t->scale_dtype, v.scales, b * 32 / t->group),
                    m = scale_at(t->scale_dtype, v.biases, b * 32 / t->group);
        memcpy(d, &s, 4);
        memcpy(d + 4, &m, 4);
        for (int j = 0; j < 16; j++) {
            const unsigned lo = g4_mlx_code(v.data, bits, 32 * b + j), hi = g4_mlx_code(v.data, bits, 32 * b + 16 + j);
            if (to == G4_AF4)
                d[8 + j] = (unsigned char)(lo | hi << 4);
            else
                d[8 + j] = (unsigned char)lo, d[24 + j] = (unsigned char)hi;
        }
    }
    return (size_t)(n / 32) * (size_t)bs;
}

/* A Q6_K block (docs/formats.md 3.2) of 256 codes u (0..63; w = d * sc[e / 16] * (u - 32)), 16 scales, f16 d */
static void put_q6_k(unsigned char *b, const int *u, const int *sc, uint16_t d) {
    memset(b, 0, 192);
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, i = (e / 32) % 4, l = e % 32;
        b[64 * h + l + 32 * (i % 2)] |= (unsigned char)((u[e] & 15) << (4 * (i / 2)));
        b[128 + 32 * h + l] |= (unsigned char)((u[e] >> 4) << (2 * i));
    }
    for (int k = 0; k < 16; k++) b[192 + k] = (unsigned char)(int8_t)sc[k];
    memcpy(b + 208, &d, 2);
}

/* row r of Q3_K (d sc (q - 4): the same d and scales, codes q + 28) or of a codebook type with g4_codebook_q6k (its d
 * and 16 scales, codes value / (d sc) + 32, each checked to give back the value bit for bit: 0 bytes written
 * otherwise) as Q6_K */
static size_t to_q6_k(const g4_tensor *t, int64_t r, unsigned char *dst) {
    const int64_t n = t->shape[t->ndim - 1];
    const int bs = g4_dtype_block_bytes(t->dtype);
    const unsigned char *s = g4_tensor_row(t, r);
    int u[256], sc[16];
    float y[256];
    for (int64_t b = 0; b < n / 256; b++, s += bs, dst += 210) {
        if (t->dtype == G4_Q3_K) {
            for (int e = 0; e < 256; e++) { /* (Q3_K and Q6_K number elements alike) */
                const int h = e / 128, i = (e / 32) % 4, l = e % 32;
                u[e] = ((s[32 + 32 * h + l] >> (2 * i)) & 3) - ((s[l] >> (4 * h + i)) & 1 ? 0 : 4) + 32;
            }
            for (int k = 0; k < 16; k++) sc[k] = q3_k_scale(s + 96, k);
            put_q6_k(dst, u, sc, (uint16_t)(s[108] | s[109] << 8));
            continue;
        }
        float d;
        if (!g4_codebook_q6k(t->dtype, s, &d, sc)) return 0;
        const uint16_t dh = g4_f32_to_f16(d);
        if (g4_f16_to_f32(dh) != d) return 0;
        g4_dequant_codebook(t->dtype, s, y);
        for (int e = 0; e < 256; e++) {
            const float step = d * (float)sc[e / 16], q = step != 0.0f ? rintf(y[e] / step) : 0.0f;
            if (!(q >= -32.0f && q <= 31.0f) || step * q != y[e]) return 0;
            u[e] = (int)q + 32;
        }
        put_q6_k(dst, u, sc, dh);
    }
    return (size_t)(n / 256) * 210;
}

/* row r of a codebook type whose groups of 32 share a scale s (g4_codebook_scale32) as AF8: s, bias -128 s, codes
 * value / s + 128 (every value checked to be exactly s times its code: 0 bytes written otherwise) */
static size_t codebook_to_af8(const g4_tensor *t, int64_t r, unsigned char *d) {
    const int64_t n = t->shape[t->ndim - 1];
    const int qk = g4_dtype_block(t->dtype), bs = g4_dtype_block_bytes(t->dtype);
    const unsigned char *s = g4_tensor_row(t, r);
    float y[256];
    for (int64_t b = 0; b < n / qk; b++, s += bs) {
        g4_dequant_codebook(t->dtype, s, y);
        for (int k = 0; k < qk / 32; k++, d += 40) {
            const float sc = g4_codebook_scale32(t->dtype, s, k), bias = -128.0f * sc;
            memcpy(d, &sc, 4);
            memcpy(d + 4, &bias, 4);
            for (int j = 0; j < 32; j++) {
                const float v = y[32 * k + j], c = sc != 0.0f ? rintf(v / sc) : 0.0f; /* (1 / sc may overflow) */
                /* (what dq_af computes: -128 sc or sc code may overflow where v does not) */
                if (!(c >= -128.0f && c <= 127.0f) || sc * (c + 128.0f) + bias != v) return 0;
                d[8 + j] = (unsigned char)(int)(c + 128.0f);
            }
        }
    }
    return (size_t)(n / 32) * 40;
}

/* Block c of 256 elements of row s (of a type with g4_codebook_scale32 / scale16) as CB4 / CB4_16 (`to`, core/quant.h):
 * 0 where the block's values do not fit (more than 16 integers, one outside -127 .. 127, run scales that are no d (an
 * f16) times integers of the layout's scales (CB4: -32 .. 31, CB4_16: -127 .. 127), or a value the block does not
 * give back bit for bit). The integers are each value over its run's scale (halved while all are even); d is the
 * smallest run scale over 1 .. 31 that divides every other (IQ2_XXS: its d / 8 times 2 s + 1; MXFP4: the smallest
 * power of two, the others up to 16 times it). */
static int cb4_block(g4_dtype t, const unsigned char *s, int64_t c, g4_dtype to, unsigned char *d) {
    const int qk = g4_dtype_block(t), bs = g4_dtype_block_bytes(t), per16 = to == G4_CB4_16, G = per16 ? 16 : 8,
              L = 256 / G, lmax = per16 ? 127 : 31, lmin = per16 ? -127 : -32;
    float y[256], sc[16], back[256];
    int v[256], table[16], nt = 0;
    for (int e = 0; e < 256; e += qk) { /* the source blocks of elements 256 c .. 256 c + 255 (qk 32, 64 or 256) */
        const unsigned char *b = s + (size_t)((256 * c + e) / qk) * (size_t)bs;
        g4_dequant_codebook(t, b, y + e);
        for (int g = 0; g < qk / L; g++)
            sc[e / L + g] = per16 ? g4_codebook_scale16(t, b, g) : g4_codebook_scale32(t, b, g);
    }
    for (int k = 0; k < G; k++) {
        int any = 0;
        for (int j = L * k; j < L * k + L; j++) {
            const float q = sc[k] != 0.0f ? rintf(y[j] / sc[k]) : 0.0f;
            if (!(q >= -127.0f && q <= 127.0f) || sc[k] * q != y[j]) return 0;
            v[j] = (int)q, any |= q != 0.0f;
        }
        if (!any) sc[k] = 0.0f; /* (any scale holds a run of zeros) */
    }
    /* integers with a common factor 2 halved, their scales doubled (IQ3_XXS's grid values are even: its d / 2, not
     * d / 4, is the d below, an f16 for smaller d) */
    for (;;) {
        int odd = 0, any = 0;
        for (int e = 0; e < 256; e++) odd |= v[e] & 1, any |= v[e] != 0;
        if (odd || !any) break;
        for (int e = 0; e < 256; e++) v[e] /= 2;
        for (int k = 0; k < G; k++) sc[k] *= 2.0f;
    }
    for (int e = 0; e < 256; e++) { /* the distinct integers, ascending */
        int i = 0;
        while (i < nt && table[i] < v[e]) i++;
        if (i < nt && table[i] == v[e]) continue;
        if (nt == 16) return 0;
        memmove(table + i + 1, table + i, (size_t)(nt - i) * sizeof(int));
        table[i] = v[e], nt++;
    }
    float smin = 0.0f;
    for (int k = 0; k < G; k++)
        if (sc[k] != 0.0f && (smin == 0.0f || fabsf(sc[k]) < smin)) smin = fabsf(sc[k]);
    int ls[16] = {0}, found = smin == 0.0f;
    uint16_t dh = 0;
    for (int j = 1; j <= 31 && !found; j++) {
        dh = g4_f32_to_f16(smin / (float)j);
        const float dd = g4_f16_to_f32(dh);
        found = dd != 0.0f;
        for (int k = 0; k < G && found; k++) {
            const float l = rintf(sc[k] / dd);
            found = l >= (float)lmin && l <= (float)lmax && dd * l == sc[k];
            ls[k] = (int)l;
        }
    }
    if (!found) return 0;
    memset(d, 0, (size_t)g4_dtype_block_bytes(to));
    for (int i = 0; i < 16; i++) d[i] = (unsigned char)(int8_t)table[i < nt ? i : nt - 1];
    unsigned char *x = d + 16, *qs = per16 ? d + 34 : x + 8; /* (CB4: the IQ4_XS block from x) */
    memcpy(x, &dh, 2);
    if (per16) {
        for (int k = 0; k < 16; k++) x[2 + k] = (unsigned char)(int8_t)ls[k];
    } else {
        uint16_t sh = 0;
        for (int k = 0; k < 8; k++) {
            const unsigned u = (unsigned)(ls[k] + 32);
            x[4 + k / 2] |= (unsigned char)((u & 15) << (4 * (k % 2)));
            sh |= (uint16_t)((u >> 4) << (2 * k));
        }
        memcpy(x + 2, &sh, 2);
    }
    for (int e = 0; e < 256; e++) {
        int i = 0;
        while (table[i] != v[e]) i++;
        const int k = e / 32, j = e % 32;
        qs[16 * k + j % 16] |= (unsigned char)(i << (j < 16 ? 0 : 4));
    }
    if (per16)
        dq_cb4_16(d, back);
    else
        dq_iq4_xs(x, (const int8_t *)d, back);
    for (int e = 0; e < 256; e++)
        if (back[e] != y[e]) return 0;
    return 1;
}

size_t g4_transcode_row(const g4_tensor *t, int64_t r, g4_dtype to, void *dst, float *tmp) {
    const int64_t n = t->ndim ? t->shape[t->ndim - 1] : 1;
    const int qk = g4_dtype_block(to);
    if (!g4_dequant_reads(t->dtype) || qk <= 0 || n % qk ||
        (g4_dtype_is_mlx(t->dtype) ? t->group <= 0 || n % t->group : n % g4_dtype_block(t->dtype)))
        return 0;
    if (t->dtype == to && !g4_dtype_is_mlx(to)) {
        const size_t rb = g4_dtype_row_bytes(to, n);
        memcpy(dst, g4_tensor_row(t, r), rb);
        return rb;
    }
    if (g4_dtype_is_mlx(t->dtype) && (to == G4_AF4 || to == G4_AF8)) return mlx_to_af(t, r, to, dst);
    if (g4_dtype_is_mlx(t->dtype) && g4_dtype_is_mlx(to) && g4_mlx_bits(to) > g4_mlx_bits(t->dtype)) {
        /* the codes widened (LSB first, as MLX packs them); the scales and biases are the source's */
        const int bits = g4_mlx_bits(t->dtype), wide = g4_mlx_bits(to);
        const unsigned char *codes = g4_tensor_rows(t, r, 1).data;
        unsigned char *d = dst;
        const size_t rb = g4_dtype_row_bytes(to, n);
        memset(d, 0, rb);
        for (int64_t j = 0; j < n; j++) mlx_put_code(d, wide, j, g4_mlx_code(codes, bits, j));
        return rb;
    }
    if (t->dtype == G4_Q5_0 && to == G4_Q8_0) { /* (q - 16) * d: the same d, codes q - 16 */
        const unsigned char *s = g4_tensor_row(t, r);
        unsigned char *d = dst;
        for (int64_t b = 0; b < n / 32; b++, s += 22, d += 34) {
            uint32_t qh;
            memcpy(&qh, s + 2, 4);
            d[0] = s[0], d[1] = s[1];
            for (int j = 0; j < 16; j++) {
                d[2 + j] = (unsigned char)(int8_t)(((s[6 + j] & 15) | (int)((qh >> j) & 1) << 4) - 16);
                d[18 + j] = (unsigned char)(int8_t)(((s[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16);
            }
        }
        return (size_t)(n / 32) * 34;
    }
    if (t->dtype == G4_IQ4_NL && to == G4_Q8_0) { /* d * table[nibble]: the same d, codes table[nibble] (int8) */
        const unsigned char *s = g4_tensor_row(t, r);
        unsigned char *d = dst;
        for (int64_t b = 0; b < n / 32; b++, s += 18, d += 34) {
            d[0] = s[0], d[1] = s[1];
            for (int j = 0; j < 16; j++) {
                d[2 + j] = (unsigned char)g4_iq4_values[s[2 + j] & 15];
                d[18 + j] = (unsigned char)g4_iq4_values[s[2 + j] >> 4];
            }
        }
        return (size_t)(n / 32) * 34;
    }
    if (g4_codebook_scale32_type(t->dtype) && to == G4_AF8) return codebook_to_af8(t, r, dst);
    if (t->dtype == G4_MXFP4 && to == G4_MXF4) { /* the codes as they are, the scale as an f16 where it is one */
        const unsigned char *s = g4_tensor_row(t, r);
        unsigned char *d = dst;
        for (int64_t b = 0; b < n / 32; b++, s += 17, d += 18) {
            const float sc = g4_codebook_scale32(G4_MXFP4, s, 0);
            uint16_t h = g4_f32_to_f16(sc);
            int zeros = 1; /* (codes 0 and 8: every value 0, whatever the scale) */
            for (int j = 0; j < 16; j++) zeros &= (s[1 + j] & 0x77) == 0;
            if (zeros) h = 0;
            else if (g4_f16_to_f32(h) != sc) return 0;
            memcpy(d, &h, 2);
            memcpy(d + 2, s + 1, 16);
        }
        return (size_t)(n / 32) * 18;
    }
    if ((to == G4_CB4 || to == G4_CB4_16) && g4_transcode_exact(t->dtype, to) && t->dtype != to) {
        const size_t bs = (size_t)g4_dtype_block_bytes(to);
        for (int64_t c = 0; c < n / 256; c++)
            if (!cb4_block(t->dtype, g4_tensor_row(t, r), c, to, (unsigned char *)dst + bs * (size_t)c)) return 0;
        return (size_t)(n / 256) * bs;
    }
    if (to == G4_Q6_K && g4_transcode_exact(t->dtype, G4_Q6_K) && t->dtype != G4_Q6_K) return to_q6_k(t, r, dst);
    if ((t->dtype == G4_Q4_1 && to == G4_AF4) || (t->dtype == G4_Q5_1 && to == G4_AF8)) {
        /* q d + m: s = d, b = m (as f32), the codes as they are (Q4_1's nibbles are AF4's order) */
        const int five = t->dtype == G4_Q5_1, bs = five ? 24 : 20, ds = five ? 40 : 24;
        const unsigned char *s = g4_tensor_row(t, r);
        unsigned char *d = dst;
        for (int64_t b = 0; b < n / 32; b++, s += bs, d += ds) {
            const float sc = g4_f16_at(s), m = g4_f16_at(s + 2);
            memcpy(d, &sc, 4);
            memcpy(d + 4, &m, 4);
            if (!five) {
                memcpy(d + 8, s + 4, 16);
                continue;
            }
            uint32_t qh;
            memcpy(&qh, s + 4, 4);
            for (int j = 0; j < 16; j++) {
                d[8 + j] = (unsigned char)((s[8 + j] & 15) | ((qh >> j) & 1) << 4);
                d[24 + j] = (unsigned char)((s[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
            }
        }
        return (size_t)(n / 32) * (size_t)ds;
    }
    g4_dequant_row(t, r, tmp);
    return g4_quant(to, tmp, dst, n);
}

size_t g4_transcode_row_mlx(const g4_tensor *t, int64_t r, g4_dtype to, unsigned char *codes, float *scales,
                            float *biases) {
    const g4_dtype af = to == G4_MLX4 ? G4_AF4 : G4_AF8;
    const int64_t n = t->ndim ? t->shape[t->ndim - 1] : 1;
    if ((to != G4_MLX4 && to != G4_MLX8) || !g4_transcode_exact(t->dtype, to) || n % 32) return 0;
    const int bs = g4_dtype_block_bytes(af);
    unsigned char *row = malloc((size_t)(n / 32) * (size_t)bs);
    if (!row || !g4_transcode_row(t, r, af, row, NULL)) {
        free(row);
        return 0;
    }
    for (int64_t b = 0; b < n / 32; b++) {
        const unsigned char *a = row + (size_t)b * (size_t)bs;
        memcpy(&scales[b], a, 4);
        memcpy(&biases[b], a + 4, 4);
        for (int j = 0; j < 32; j++) { /* AF4: byte k = element k | element k + 16 << 4; MLX4: element j at bits 4j */
            const unsigned c = af == G4_AF8 ? a[8 + j] : j < 16 ? a[8 + j] & 15u : (unsigned)a[8 + j - 16] >> 4;
            if (af == G4_AF8)
                codes[b * 32 + j] = (unsigned char)c;
            else
                codes[(b * 32 + j) / 2] = (unsigned char)(j % 2 ? codes[(b * 32 + j) / 2] | c << 4 : c);
        }
    }
    free(row);
    return (size_t)n * (size_t)g4_mlx_bits(to) / 8;
}
