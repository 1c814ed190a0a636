/* Tensors: a name, a dtype, a shape and a view of bytes that someone else owns
 * (a memory-mapped file, device memory, or an arena). */
#ifndef G4_CORE_TENSOR_H
#define G4_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum g4_dtype {
    G4_DTYPE_UNKNOWN = 0,
    G4_F32,
    G4_F16,
    G4_BF16,
    G4_F64,
    G4_I8,
    G4_U8,
    G4_I16,
    G4_U16,
    G4_I32,
    G4_U32,
    G4_I64,
    G4_U64,
    G4_BOOL,
    G4_DTYPE_COUNT
} g4_dtype;

#define G4_MAX_DIMS 6

typedef struct g4_tensor {
    const char *name;              /* owned by whoever produced the tensor */
    g4_dtype dtype;
    int ndim;
    int64_t shape[G4_MAX_DIMS];    /* shape[ndim-1] varies fastest (row-major) */
    const void *data;              /* may be unaligned (MLX files) */
    size_t nbytes;
} g4_tensor;

const char *g4_dtype_name(g4_dtype t);
/* bits per element, 0 for unknown */
int g4_dtype_bits(g4_dtype t);

static inline int64_t g4_tensor_numel(const g4_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Writes "[a, b, c]" into buf. */
const char *g4_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap);

/* ---- scalar conversions ---- */
static inline float g4_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even; NaN stays NaN */
static inline uint16_t g4_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float g4_f16_to_f32(uint16_t h);
uint16_t g4_f32_to_f16(float f);

/* Converts n elements of type `src_type` (f32/f16/bf16) at possibly unaligned src to f32. */
void g4_to_f32(g4_dtype src_type, const void *src, float *dst, size_t n);

/* out[i, :] = table[ids[i], :] * scale in f32, for a host table [rows, cols] (embedding lookups). */
void g4_tensor_rows_f32(const g4_tensor *table, const int32_t *ids, int n, float scale, float *out);

#endif
