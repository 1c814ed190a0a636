#include "core/tensor.h"

#include <stdio.h>

static const struct {
    const char *name;
    int bits;
} dtype_info[G4_DTYPE_COUNT] = {
    [G4_DTYPE_UNKNOWN] = {"?", 0}, [G4_F32] = {"F32", 32}, [G4_F16] = {"F16", 16},
    [G4_BF16] = {"BF16", 16},      [G4_F64] = {"F64", 64}, [G4_I8] = {"I8", 8},
    [G4_U8] = {"U8", 8},           [G4_I16] = {"I16", 16}, [G4_U16] = {"U16", 16},
    [G4_I32] = {"I32", 32},        [G4_U32] = {"U32", 32}, [G4_I64] = {"I64", 64},
    [G4_U64] = {"U64", 64},        [G4_BOOL] = {"BOOL", 8},
};

const char *g4_dtype_name(g4_dtype t) {
    return (t > 0 && t < G4_DTYPE_COUNT) ? dtype_info[t].name : "?";
}

int g4_dtype_bits(g4_dtype t) {
    return (t > 0 && t < G4_DTYPE_COUNT) ? dtype_info[t].bits : 0;
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
    size_t esz = (size_t)g4_dtype_bits(table->dtype) / 8;
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * cols;
        g4_to_f32(table->dtype, (const unsigned char *)table->data + (size_t)ids[i] * cols * esz, o, cols);
        for (size_t k = 0; k < cols; k++) o[k] *= scale;
    }
}
