/* Reference encoders and decoders of the quantized formats (layouts in core/quant.h,
 * docs/formats.md 2.2-2.4 and 3.2). Plain C, one block at a time: the definition the
 * SIMD kernels are tested against. Q8_0/Q4_0 encode exactly as llama.cpp's
 * quantize_row_*_ref; the K-quant encoders pick scales by a simpler min/max rule
 * (any encoding with the right layout is a valid file). */
#include "core/quant.h"

#include <math.h>
#include <string.h>

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

/* Q4_K / Q5_K: per sub-block of 32, scale = (max - min) / nmax and min = -min(0, min),
 * both re-quantized to 6 bits against the block's largest. */
static void q_qk(const float *x, unsigned char *b, int five) {
    const int nmax = five ? 31 : 15;
    float sc[8], mn[8], msc = 0, mmn = 0;
    for (int k = 0; k < 8; k++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * k + l]);
            hi = fmaxf(hi, x[32 * k + l]);
        }
        sc[k] = (hi - lo) / (float)nmax;
        mn[k] = -lo;
        msc = fmaxf(msc, sc[k]);
        mmn = fmaxf(mmn, mn[k]);
    }
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

/* Q6_K: per sub-block of 16, scale = max|x| / 31, the scales as int8 against the largest. */
static void q_q6_k(const float *x, unsigned char *b) {
    float sc[16], msc = 0;
    for (int k = 0; k < 16; k++) {
        float amax = 0;
        for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * k + l]));
        sc[k] = amax / 31.0f;
        msc = fmaxf(msc, sc[k]);
    }
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
        break;
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
        default: q_q6_k(src + i, d); break;
        }
    }
    return (size_t)(n / qk) * (size_t)bs;
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
            uint64_t bp = (uint64_t)(g * group + j) * (uint64_t)bits;
            unsigned v = (unsigned)q << (bp & 7);
            wb[bp >> 3] |= (unsigned char)v;
            if ((bp & 7) + (uint64_t)bits > 8) wb[(bp >> 3) + 1] |= (unsigned char)(v >> 8);
        }
        put_scale(sdt, scales, g, scale);
        put_scale(sdt, biases, g, bias);
    }
}

/* --------------------------------------------------------------- transcoding */
int g4_dequant_reads(g4_dtype t) {
    return t == G4_F32 || t == G4_F16 || t == G4_BF16 || (g4_dtype_is_quantized(t) && g4_dtype_block(t) > 0);
}

int g4_transcode_exact(g4_dtype from, g4_dtype to) { return from == to || (from == G4_Q5_0 && to == G4_Q8_0); }

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
    g4_dequant_row(t, r, tmp);
    return g4_quant(to, tmp, dst, n);
}
