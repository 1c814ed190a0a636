#include "core/tensor.h"

#include <math.h>
#include <stdio.h>

#include "core/quant.h"

static const struct {
    const char *name;
    int bits;        /* per element, plain types only */
    int block, bytes; /* elements per block, bytes per block */
} dtype_info[G4_DTYPE_COUNT] = {
    [G4_DTYPE_UNKNOWN] = {"?", 0, 0, 0},
    [G4_F32] = {"F32", 32, 1, 4},
    [G4_F16] = {"F16", 16, 1, 2},
    [G4_BF16] = {"BF16", 16, 1, 2},
    [G4_F64] = {"F64", 64, 1, 8},
    [G4_I8] = {"I8", 8, 1, 1},
    [G4_U8] = {"U8", 8, 1, 1},
    [G4_I16] = {"I16", 16, 1, 2},
    [G4_U16] = {"U16", 16, 1, 2},
    [G4_I32] = {"I32", 32, 1, 4},
    [G4_U32] = {"U32", 32, 1, 4},
    [G4_I64] = {"I64", 64, 1, 8},
    [G4_U64] = {"U64", 64, 1, 8},
    [G4_BOOL] = {"BOOL", 8, 1, 1},
    [G4_Q4_0] = {"Q4_0", 0, 32, 18},
    [G4_Q4_1] = {"Q4_1", 0, 32, 20},
    [G4_Q5_0] = {"Q5_0", 0, 32, 22},
    [G4_Q5_1] = {"Q5_1", 0, 32, 24},
    [G4_Q8_0] = {"Q8_0", 0, 32, 34},
    [G4_Q4_K] = {"Q4_K", 0, 256, 144},
    [G4_Q5_K] = {"Q5_K", 0, 256, 176},
    [G4_Q6_K] = {"Q6_K", 0, 256, 210},
    [G4_Q2_K] = {"Q2_K", 0, 256, 84},
    [G4_Q3_K] = {"Q3_K", 0, 256, 110},
    [G4_IQ4_NL] = {"IQ4_NL", 0, 32, 18},
    [G4_IQ4_XS] = {"IQ4_XS", 0, 256, 136},
    [G4_IQ2_XXS] = {"IQ2_XXS", 0, 256, 66},
    [G4_IQ2_XS] = {"IQ2_XS", 0, 256, 74},
    [G4_IQ2_S] = {"IQ2_S", 0, 256, 82},
    [G4_IQ3_XXS] = {"IQ3_XXS", 0, 256, 98},
    [G4_IQ3_S] = {"IQ3_S", 0, 256, 110},
    [G4_IQ1_S] = {"IQ1_S", 0, 256, 50},
    [G4_IQ1_M] = {"IQ1_M", 0, 256, 56},
    [G4_TQ1_0] = {"TQ1_0", 0, 256, 54},
    [G4_TQ2_0] = {"TQ2_0", 0, 256, 66},
    [G4_MXFP4] = {"MXFP4", 0, 32, 17},
    [G4_NVFP4] = {"NVFP4", 0, 64, 36},
    [G4_MLX2] = {"MLX2", 0, 4, 1},
    [G4_MLX3] = {"MLX3", 0, 8, 3},
    [G4_MLX4] = {"MLX4", 0, 2, 1},
    [G4_MLX5] = {"MLX5", 0, 8, 5},
    [G4_MLX6] = {"MLX6", 0, 4, 3},
    [G4_MLX8] = {"MLX8", 0, 1, 1},
    [G4_AF4] = {"AF4", 0, 32, 24},
    [G4_AF8] = {"AF8", 0, 32, 40},
    [G4_CB4] = {"CB4", 0, 256, 152},
    [G4_CB4_16] = {"CB4_16", 0, 256, 162},
    [G4_MXF4] = {"MXF4", 0, 32, 18},
};

const char *g4_dtype_name(g4_dtype t) {
    return (t > 0 && t < G4_DTYPE_COUNT) ? dtype_info[t].name : "?";
}

int g4_dtype_bits(g4_dtype t) {
    return (t > 0 && t < G4_DTYPE_COUNT) ? dtype_info[t].bits : 0;
}

int g4_dtype_block(g4_dtype t) { return (t > 0 && t < G4_DTYPE_COUNT) ? dtype_info[t].block : 0; }
int g4_dtype_block_bytes(g4_dtype t) { return (t > 0 && t < G4_DTYPE_COUNT) ? dtype_info[t].bytes : 0; }

int g4_mlx_bits(g4_dtype t) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    return g4_dtype_is_mlx(t) ? bits[t - G4_MLX2] : 0;
}

g4_dtype g4_mlx_dtype(int bits) {
    switch (bits) {
    case 2: return G4_MLX2;
    case 3: return G4_MLX3;
    case 4: return G4_MLX4;
    case 5: return G4_MLX5;
    case 6: return G4_MLX6;
    case 8: return G4_MLX8;
    default: return G4_DTYPE_UNKNOWN;
    }
}

size_t g4_dtype_row_bytes(g4_dtype t, int64_t n) {
    int b = g4_dtype_block(t);
    if (b <= 0 || n < 0 || n % b) return 0;
    return (size_t)(n / b) * (size_t)g4_dtype_block_bytes(t);
}

g4_tensor g4_tensor_rows(const g4_tensor *t, int64_t r0, int64_t n) {
    g4_tensor v = *t;
    int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    v.ndim = 2;
    memset(v.shape, 0, sizeof v.shape);
    v.shape[0] = n;
    v.shape[1] = cols;
    size_t rb = g4_dtype_row_bytes(t->dtype, cols);
    v.data = (const unsigned char *)t->data + (size_t)r0 * rb;
    v.nbytes = (size_t)n * rb;
    if (g4_dtype_is_mlx(t->dtype) && t->group > 0 && t->scales && t->biases) {
        size_t sb = (size_t)(cols / t->group) * (size_t)(g4_dtype_bits(t->scale_dtype) / 8);
        v.scales = (const unsigned char *)t->scales + (size_t)r0 * sb;
        v.biases = (const unsigned char *)t->biases + (size_t)r0 * sb;
    }
    return v;
}

g4_tensor g4_tensor_placed_rows(const g4_tensor *t, int64_t r0, int64_t n) {
    g4_tensor v = g4_tensor_rows(t, r0, n); /* the shape, and MLX scales/biases kept beside the rows (the CPU) */
    const int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = cols > 0 ? g4_tensor_numel(t) / cols : 0;
    const size_t rb = rows > 0 ? t->nbytes / (size_t)rows : 0;
    v.data = (const unsigned char *)t->data + (size_t)r0 * rb;
    v.nbytes = (size_t)n * rb;
    return v;
}

g4_tensor g4_tensor_index(const g4_tensor *t, int64_t i) {
    int64_t per = 1;
    for (int d = 1; d + 1 < t->ndim; d++) per *= t->shape[d];
    g4_tensor v = g4_tensor_rows(t, i * per, per);
    v.ndim = t->ndim - 1;
    memset(v.shape, 0, sizeof v.shape);
    for (int d = 1; d < t->ndim; d++) v.shape[d - 1] = t->shape[d];
    return v;
}

const char *g4_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

float g4_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t g4_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf (rounds past 65504) */
    if (a < 0x38800000u) {                                    /* subnormal or zero in f16 */
        if (a < 0x33000000u) return (uint16_t)sign;           /* < half the smallest subnormal */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) + ... */
        /* value = m * 2^(e-150); f16 subnormal unit = 2^-24 -> q = m >> (126 - e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits, nearest even */
    return (uint16_t)(sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ffu));
}

void g4_to_f32(g4_dtype t, const void *src, float *dst, size_t n) {
    const unsigned char *s = src;
    switch (t) {
    case G4_F32:
        memcpy(dst, src, n * 4);
        break;
    case G4_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = g4_bf16_to_f32(h);
        }
        break;
    case G4_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = g4_f16_to_f32(h);
        }
        break;
    default:
        for (size_t i = 0; i < n; i++) dst[i] = 0.0f;
        break;
    }
}

void g4_tensor_rows_f32(const g4_tensor *table, const int32_t *ids, int n, float scale, float *out) {
    size_t cols = (size_t)table->shape[table->ndim - 1];
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * cols;
        if (ids[i] < 0 || ids[i] >= table->shape[0]) { /* the argmax's -1 of a NaN row (backend.h): a NaN row */
            for (size_t k = 0; k < cols; k++) o[k] = NAN;
            continue;
        }
        g4_dequant_row(table, ids[i], o); /* one row of any dtype, quantized tables included */
        for (size_t k = 0; k < cols; k++) o[k] *= scale;
    }
}

uint64_t g4_name_seed(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)(name ? name : ""); *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

void g4_fill_random(g4_dtype t, void *dst, size_t n, int64_t row_len, uint64_t seed) {
    const float amp = sqrtf(3.0f / (float)(row_len > 0 ? row_len : 1));
    for (size_t i = 0; i < n; i++) {
        float v = g4_random_value(seed, i, amp);
        if (t == G4_F32) {
            ((float *)dst)[i] = v;
        } else {
            uint16_t h = t == G4_BF16 ? g4_f32_to_bf16(v) : g4_f32_to_f16(v);
            memcpy((unsigned char *)dst + 2 * i, &h, 2);
        }
    }
}
