/* Tensors: a name, a dtype, a shape and a view of bytes that someone else owns
 * (a memory-mapped file, device memory, or an arena).
 *
 * Quantized weights are ONE tensor whose dtype says how to read its bytes
 * (docs/formats.md 2 and 3.2; block layouts in core/quant.h). Quantization runs
 * along the last axis: a row of shape[ndim-1] elements is a whole number of
 * blocks, rows are contiguous, and leading axes (experts, vocabulary) just
 * multiply the row count. MLX affine tensors carry their per-group scales and
 * biases on the same tensor (`scales`, `biases`, `group`), laid out [rows,
 * in/group] in `scale_dtype`; g4_tensor_rows / g4_tensor_index slice both. */
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
    /* GGUF blocks (llama.cpp ggml types): 32 elements per block unless noted */
    G4_Q4_0, /* 18 B: f16 d, 16 B nibbles */
    G4_Q4_1, /* 20 B: f16 d, f16 m, 16 B nibbles */
    G4_Q5_0, /* 22 B: f16 d, u32 high bits, 16 B nibbles */
    G4_Q5_1, /* 24 B: f16 d, f16 m, u32 high bits, 16 B nibbles */
    G4_Q8_0, /* 34 B: f16 d, 32 x int8 */
    G4_Q4_K, /* 256 per block, 144 B */
    G4_Q5_K, /* 256 per block, 176 B */
    G4_Q6_K, /* 256 per block, 210 B */
    G4_Q2_K, /* 256 per block, 84 B */
    G4_Q3_K, /* 256 per block, 110 B */
    G4_IQ4_NL, /* 18 B: f16 d, 16 B nibbles indexing a fixed table */
    G4_IQ4_XS, /* 256 per block, 136 B */
    /* codebook, ternary and FP4 types, read only (core/quant_codebook.c has their layouts) */
    G4_IQ2_XXS, /* 256 per block, 66 B */
    G4_IQ2_XS,  /* 256, 74 B */
    G4_IQ2_S,   /* 256, 82 B */
    G4_IQ3_XXS, /* 256, 98 B */
    G4_IQ3_S,   /* 256, 110 B */
    G4_IQ1_S,   /* 256, 50 B */
    G4_IQ1_M,   /* 256, 56 B */
    G4_TQ1_0,   /* 256, 54 B */
    G4_TQ2_0,   /* 256, 66 B */
    G4_MXFP4,   /* 32, 17 B */
    G4_NVFP4,   /* 64, 36 B */
    /* MLX affine: `bits`-bit unsigned codes packed LSB-first, w = scale * q + bias per group */
    G4_MLX2,
    G4_MLX3,
    G4_MLX4,
    G4_MLX5,
    G4_MLX6,
    G4_MLX8,
    /* The CPU backend's layout of MLX affine weights (backend/cpu, upload_weight: g4_transcode_row, exact): blocks
     * of 32, f32 scale, f32 bias, then the codes (AF4: 16 B, byte k = element k | element k + 16 << 4, Q4_0's
     * order; AF8: 32 B, one a byte); w = scale * code + bias. Never in a file. */
    G4_AF4, /* 24 B */
    G4_AF8, /* 40 B */
    /* The backends' layout of the codebook, ternary and FP4 types whose groups of 32 share a scale (IQ2_XXS, IQ3_XXS,
     * IQ3_S, IQ1_S, TQ1_0, TQ2_0, MXFP4; g4_transcode_row, exact where it holds a row): per 256 elements a table of
     * 16 int8 values, then an IQ4_XS block (f16 d, the 6-bit scales, 128 bytes of nibbles) whose nibbles index that
     * table instead of IQ4's: w = d * (scale - 32) * table[nibble]. Never in a file. */
    G4_CB4, /* 256 per block, 152 B */
    /* CB4 with a scale per 16 (IQ2_XS, IQ2_S, IQ1_M, NVFP4): per 256 the table, f16 d, 16 int8 scales, the 128 bytes
     * of nibbles in IQ4_XS's order; w = d * scale * table[nibble]. Never in a file. */
    G4_CB4_16, /* 256 per block, 162 B */
    /* The backends' layout of MXFP4: IQ4_NL's block (f16 d, 16 bytes of nibbles) whose nibbles index g4_fp4_values
     * (E2M1 doubled) instead of IQ4's, d the block's E8M0 scale halved (an f16 for 2^-24 .. 2^15). Never in a file. */
    G4_MXF4, /* 32 per block, 18 B */
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
    /* MLX affine types only: [rows, shape[ndim-1] / group] scales and biases */
    const void *scales, *biases;
    g4_dtype scale_dtype;          /* BF16, F16 or F32 */
    int group;                     /* 32, 64 or 128 */
} g4_tensor;

const char *g4_dtype_name(g4_dtype t);
/* bits per element of plain types, 0 for block types and unknown */
int g4_dtype_bits(g4_dtype t);
/* Elements per block (1 for plain types, 32 or 256 for GGUF blocks, 32/bits*... for MLX:
 * the number of elements in a whole number of bytes, 8 for 3/5-bit, 4 for 6-bit) and the
 * bytes of one such block; 0 for unknown types. */
int g4_dtype_block(g4_dtype t);
int g4_dtype_block_bytes(g4_dtype t);
static inline int g4_dtype_is_quantized(g4_dtype t) { return t >= G4_Q4_0 && t <= G4_MXF4; }
static inline int g4_dtype_is_mlx(g4_dtype t) { return t >= G4_MLX2 && t <= G4_MLX8; }
/* bits of an MLX type (2..8), 0 otherwise */
int g4_mlx_bits(g4_dtype t);
g4_dtype g4_mlx_dtype(int bits); /* G4_DTYPE_UNKNOWN if not 2,3,4,5,6,8 */

/* Bytes of a row of n elements (n a multiple of the block), 0 if it is not. */
size_t g4_dtype_row_bytes(g4_dtype t, int64_t n);

/* Rows of a tensor: the product of all but the last axis; and the bytes of one row. */
static inline int64_t g4_tensor_nrows(const g4_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i + 1 < t->ndim; i++) n *= t->shape[i];
    return n;
}
static inline size_t g4_tensor_row_bytes(const g4_tensor *t) {
    return g4_dtype_row_bytes(t->dtype, t->ndim ? t->shape[t->ndim - 1] : 1);
}
/* Start of row r's bytes (any dtype). */
static inline const unsigned char *g4_tensor_row(const g4_tensor *t, int64_t r) {
    return (const unsigned char *)t->data + (size_t)r * g4_tensor_row_bytes(t);
}
/* A 2-D view [n, cols] of rows r0..r0+n of t (any dtype; MLX scales/biases follow). */
g4_tensor g4_tensor_rows(const g4_tensor *t, int64_t r0, int64_t n);
/* The same view of a weight a backend placed (upload_weight, backend/backend.h): its rows lie t->nbytes / rows
 * apart in the backend's layout (CUDA pads and repacks them), not the file's row bytes apart. */
g4_tensor g4_tensor_placed_rows(const g4_tensor *t, int64_t r0, int64_t n);
/* The view of index i of the first axis (one expert of a stacked [E, out, in] tensor). */
g4_tensor g4_tensor_index(const g4_tensor *t, int64_t i);

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

/* Functions the CUDA kernels share with the host (compiled for both there). */
#if defined(__CUDACC__) || defined(G4_CUDA_EMU)
#define G4_HOST_DEVICE __host__ __device__
#else
#define G4_HOST_DEVICE
#endif

/* Random weights (benchmarks of real shapes, tests): element i of a tensor with seed s is uniform in
 * +-amp, amp = sqrt(3 / row length), from a hash of (s, i) alone, so that every backend fills the same values. */
static inline G4_HOST_DEVICE float g4_random_value(uint64_t seed, uint64_t i, float amp) {
    uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return amp * ((float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
}
/* The seed of a tensor: a hash of its name. */
uint64_t g4_name_seed(const char *name);
/* Fills n elements of dtype F32, BF16 or F16 (rows of row_len) with g4_random_value. */
void g4_fill_random(g4_dtype t, void *dst, size_t n, int64_t row_len, uint64_t seed);

/* Converts n elements of type `src_type` (f32/f16/bf16) at possibly unaligned src to f32. */
void g4_to_f32(g4_dtype src_type, const void *src, float *dst, size_t n);

/* out[i, :] = table[ids[i], :] * scale in f32, for a host table [rows, cols] of any dtype (embedding lookups); an id
 * outside 0 .. rows-1 gives a row of NaN. */
void g4_tensor_rows_f32(const g4_tensor *table, const int32_t *ids, int n, float scale, float *out);

#endif
