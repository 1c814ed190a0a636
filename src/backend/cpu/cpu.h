/* Internals shared by the CPU backend's files. */
#ifndef G4_BACKEND_CPU_CPU_H
#define G4_BACKEND_CPU_CPU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "core/threadpool.h"

#define G4_CPU_MAX_THREADS 256

/* Per-thread scratch that grows on demand (each thread touches only its own). */
typedef struct g4_cpu_scratch {
    float *buf;
    size_t cap; /* floats */
} g4_cpu_scratch;

typedef struct g4_cpu {
    g4_pool *pool;
    int n_threads;
    g4_cpu_scratch scratch[G4_CPU_MAX_THREADS];
    int failed; /* set when an op could not get memory; the forward step reports it */
    /* g4_load_params.bf16_activations: products with BF16 weights round the activations to bf16 (RNE) once per
     * matmul (matmul.c) */
    int bf16_act;
    /* buffers the MoE op reuses between calls */
    float *moe_buf;
    size_t moe_cap;
    /* int8 activations of the current quantized matmul */
    void *act_buf;
    size_t act_cap;
    /* normalized inputs of a matmul_set with a norm */
    float *set_buf;
    size_t set_cap;
    /* weights this backend filled with random values (released with the backend or release_weight) */
    void **owned;
    int n_owned, cap_owned;
    /* the masked_logits op's selected ids */
    void *sel_buf; /* bytes */
    size_t sel_cap;
} g4_cpu;

/* int8 activations of n token rows (matmul_q8.c), quantized per block of 32 with the Q8_0 rule.
 * Plain (kernels with q8_tile, or q_gemm and q_act_plain; set when q is set): q [n][in_pad] (zero past in), the
 * block scales d and d * sum(q) per block [n][nb_pad]; nb_pad a multiple of 8 (zeros past the row).
 * Grouped (kernels with q_gemm; set when qg is set): per token, ng groups of 4 blocks, each
 * G4_Q8_GROUP bytes: 64 int8 of the blocks' elements 0-15, 64 of elements 16-31 and 16 floats of the
 * block scales (each block's in 4 lanes); blocks past the row are zeros; the AVX-512 set also keeps them in lane
 * order (ql, below), with the sums that each weight type's mode takes (g4_q8_off, g4_q8_mode):
 * - G4_Q8_OFFSET (Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS, CB4, MXF4): off is the type's unsigned offset (Q4_0: 8, Q5_0:
 *   16, Q8_0 and the IQ4 / CB4 / FP4 tables' values: 128), so a block's integer dot product with the weights'
 *   unsigned codes starts from -off x its code sum and ends exact;
 * - G4_Q8_AFFINE (Q4_K, Q5_K, AF4, AF8: w = s1 * u + s2 per block): off = -1, the code sums multiply the weights'
 *   s2;
 * - G4_Q8_HALVES (Q6_K: w = s * (u - 32), a scale per 16 elements; Q3_K: w = s * (u - 4), taken as u + 28; CB4_16:
 *   w = s * (u - 128), u its table's value + 128): off = 0, each half's dot product is taken apart and its -32 (CB4_16:
 *   -128, g4_q8_half_off) x code sums computed from the codes;
 * - G4_Q8_MIN16 (Q2_K: w = s * u + o, a scale and a min per 16 elements): off = 0, each half's dot product taken
 *   apart times its s, plus its o times the half's activation code sums (computed from the codes). */
#define G4_Q8_GROUP 192
/* a packed weight group: 64 + 64 unsigned codes, 16 float lanes s1 (the scales), 16 s2 (see g4_q8_mode) */
#define G4_QW_GROUP 256
/* lane order (kernel sets with q8_lanes_row, kernels_x86.c): a super-group of 4 groups, one block a 32-bit lane;
 * activations: 8 x 64 int8 codes, 16 int32 a, 16 int32 b, 16 float scales; packed weights: 8 x 64 unsigned codes,
 * 4 x 16 float scales */
#define G4_Q8_LANES 704
#define G4_QW_LANES 768
enum { G4_Q8_OFFSET, G4_Q8_AFFINE, G4_Q8_HALVES, G4_Q8_MIN16 };
static inline int g4_q8_mode(g4_dtype t) {
    return t == G4_Q4_K || t == G4_Q5_K || t == G4_AF4 || t == G4_AF8 ? G4_Q8_AFFINE
           : t == G4_Q6_K || t == G4_Q3_K || t == G4_CB4_16          ? G4_Q8_HALVES
           : t == G4_Q2_K                                            ? G4_Q8_MIN16
                                                                     : G4_Q8_OFFSET;
}
/* the halves mode's offset of the unsigned codes u (see above) */
static inline int g4_q8_half_off(g4_dtype t) { return t == G4_CB4_16 ? 128 : 32; }
/* the grouped layout's off for weights of type t (see above) */
static inline int g4_q8_off(g4_dtype t) {
    const int mode = g4_q8_mode(t);
    return mode == G4_Q8_AFFINE                          ? -1
           : mode == G4_Q8_HALVES || mode == G4_Q8_MIN16 ? 0
           : t == G4_Q4_0                                ? 8
           : t == G4_Q5_0                                ? 16
                                                         : 128;
}
typedef struct g4_q8_rows {
    int8_t *q;
    float *d, *m;
    size_t in_pad, nb_pad;
    unsigned char *qg;
    size_t ng;
    /* with q_act_quarters: q's codes again, each group of 4 blocks (128 bytes) in quarter order: byte
     * 32 j + 4 (i + 4 h) + e = block i's element 16 h + 4 j + e (kernels_x86.c, AVX2's q_gemm) */
    int8_t *qq;
    /* with q8_lanes_row: qg's rows again in lane order, ceil(ng / 4) super-groups of G4_Q8_LANES bytes a token
     * (kernels_x86.c, AVX-512's q_gemm; its q_gemv takes the sums and scales) */
    unsigned char *ql;
    g4_dtype type; /* the weights' type the rows were prepared for (g4_q8_mode, g4_q8_off) */
} g4_q8_rows;

/* The weight types beside Q8_0 and Q4_0 that a kernel set with q8_k_quants reads on int8 activations, each with
 * the elements a row must be a multiple of: X(type, block) (g4_cpu_q8_supported, and the type switches of the
 * AVX-512 kernels). */
#define G4_Q8_K_QUANTS(X, A)                                                                                           \
    X(G4_Q5_0, 32, A) X(G4_IQ4_NL, 32, A) X(G4_MXF4, 32, A) X(G4_Q4_K, 256, A) X(G4_Q5_K, 256, A) X(G4_Q6_K, 256, A) X(G4_IQ4_XS, 256, A) \
    X(G4_AF4, 32, A) X(G4_AF8, 32, A) X(G4_Q3_K, 256, A) X(G4_Q2_K, 256, A) X(G4_CB4, 256, A) X(G4_CB4_16, 256, A)

/* switch (type) calling CALL(the type as a constant) for Q4_0, each type of G4_Q8_K_QUANTS and (default) Q8_0: the
 * kernels' entry points, so that each type's decoding is inlined into a copy of its own */
#define G4_Q8_CASE(t, blk, CALL)                                                                                       \
    case t: CALL(t); break;
#define G4_Q8_SWITCH(type, CALL)                                                                                       \
    switch (type) {                                                                                                    \
    case G4_Q4_0: CALL(G4_Q4_0); break;                                                                                \
        G4_Q8_K_QUANTS(G4_Q8_CASE, CALL)                                                                               \
    default: CALL(G4_Q8_0); break;                                                                                     \
    }

/* bytes of a block of the kernels' types with blocks of 32 (core/tensor.h's, as a constant where t is one) */
static inline int g4_q8_block_bytes(g4_dtype t) {
    return t == G4_Q8_0 ? 34 : t == G4_Q5_0 ? 22 : t == G4_AF4 ? 24 : t == G4_AF8 ? 40 : 18; /* Q4_0, IQ4_NL, MXF4 */
}

/* bytes of a row a group of 4 blocks of 32 spans on average (the SIMD sets' prefetch steps) */
static inline long g4_q8_group_bytes(g4_dtype type) {
    return type == G4_Q4_0 || type == G4_Q4_K || type == G4_IQ4_NL || type == G4_MXF4 ? 72
           : type == G4_IQ4_XS                                      ? 68
           : type == G4_CB4                                         ? 76
           : type == G4_CB4_16                                      ? 81
           : type == G4_Q5_K || type == G4_Q5_0                     ? 88
           : type == G4_Q6_K                                        ? 105
           : type == G4_Q3_K                                        ? 55
           : type == G4_Q2_K                                        ? 42
           : type == G4_AF4                                         ? 96
           : type == G4_AF8                                         ? 160
                                                                    : 136; /* Q8_0 */
}

/* The 8 scales (*sc) and mins (*mn) of a Q4_K / Q5_K super-block's scales[12] (g4_k_scale_min), sub-block k in
 * byte k: taken from the 12 as 32-bit words (sub-blocks 0-3 the low 6 bits of bytes 0-3 and 4-7; 4-7 the nibbles of
 * bytes 8-11 with the top 2 bits of bytes 0-3 and 4-7 above them). */
static inline void g4_k_scales8(const unsigned char *s, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    *sc = (u0 & 0x3f3f3f3fu) | (uint64_t)((u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4)) << 32;
    *mn = (u1 & 0x3f3f3f3fu) | (uint64_t)(((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4)) << 32;
}

/* The 8 sub-block scales of an IQ4_XS super-block (sb: f16 d, u16 scales_h, u8 scales_l[4]) as 6-bit values (the
 * scale + 32), sub-block k in byte k */
static inline uint64_t g4_iq4xs_scales8(const unsigned char *sb) {
    uint16_t sh;
    uint32_t sl;
    memcpy(&sh, sb + 2, 2);
    memcpy(&sl, sb + 4, 4);
    /* nibble k of scales_l to the low bits of byte k, 2-bit field k of scales_h to bits 4-5 of byte k: spread by
     * halving shifts (a bit deposit without BMI2) */
    uint64_t lo = sl, hi = sh;
    lo = (lo | lo << 16) & 0x0000ffff0000ffffull;
    lo = (lo | lo << 8) & 0x00ff00ff00ff00ffull;
    lo = (lo | lo << 4) & 0x0f0f0f0f0f0f0f0full;
    hi = (hi | hi << 24) & 0x000000ff000000ffull;
    hi = (hi | hi << 12) & 0x000f000f000f000full;
    hi = (hi | hi << 6) & 0x0303030303030303ull;
    return lo | hi << 4;
}

/* The 16 6-bit scales of a Q3_K super-block's scales[12] as unsigned bytes (the signed scale + 32), sub-block k in
 * byte k % 8 of lo (k < 8) or hi: k < 8 the low nibbles of bytes 0-7, the others their high nibbles, each with its
 * 2-bit field of bytes 8-11 above (bits 2 (k / 4) of byte 8 + k % 4); llama.cpp's word form of it. */
static inline void g4_q3k_scales16(const unsigned char *s, uint64_t *lo, uint64_t *hi) {
    uint32_t a0, a1, t;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&t, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    *lo = (uint64_t)((a0 & m4) | (t & m2) << 4) | (uint64_t)((a1 & m4) | ((t >> 2) & m2) << 4) << 32;
    *hi = (uint64_t)(((a0 >> 4) & m4) | ((t >> 4) & m2) << 4) | (uint64_t)(((a1 >> 4) & m4) | ((t >> 6) & m2) << 4)
                                                                     << 32;
}

/* Q8_0 / Q4_0 weights with rows of whole 32-blocks, and those of G4_Q8_K_QUANTS (rows of whole blocks) where the
 * kernels take them (q8_k_quants: AVX-512 VNNI, AVX2, NEON); int8 activations not switched off by G4_NO_INT8_ACT (for
 * comparisons). */
int g4_cpu_q8_supported(const g4_tensor *w);
void g4_cpu_matmul_q8(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y);
/* The products of a matmul set on one input, one int8 quantization of x and one pool job: every w[i] Q8_0 or
 * Q4_0 (g4_cpu_q8_supported) of the same type and input size; bias NULL or per product (entries may be NULL). */
void g4_cpu_matmul_q8_set(g4_cpu *cpu, const float *x, int n, int count, const g4_tensor *const *w,
                          const float *const *bias, float *const *y);

/* One product of g4_cpu_q8_products: y[n, out] = activation rows t0 .. t0+n-1 of a times w^T (+ bias). */
typedef struct g4_q8_product {
    const g4_tensor *w;
    const float *bias;
    float *y;
    const struct g4_q8_rows *a;
    int t0, n;
} g4_q8_product;
#define G4_Q8_MAX_PRODUCTS 256
/* x[n, in] quantized into a (in cpu->act_buf, valid until the next call) for weights of `type`; -1 when out of
 * memory (cpu->failed set). */
int g4_cpu_q8_prepare(g4_cpu *cpu, const float *x, int n, size_t in, g4_dtype type, struct g4_q8_rows *a);
/* count <= G4_Q8_MAX_PRODUCTS products as one pool job over their blocks of rows; each (row, token) gets the same
 * bits as a product of its own */
void g4_cpu_q8_products(g4_cpu *cpu, const g4_q8_product *p, int count);
void g4_cpu_q8_quantize(const float *x, size_t in, int t0, int t1, g4_q8_rows *a);

/* cpu->act_buf with at least `bytes` (64-byte aligned), NULL (and cpu->failed) when out of memory. */
void *g4_cpu_act_buf(g4_cpu *cpu, size_t bytes);

/* Returns thread `t`'s scratch with at least n floats, or NULL when out of memory. */
float *g4_cpu_scratch_get(g4_cpu *cpu, int t, size_t n);

/* y[n, out] = x[n, in] * W^T (+ bias), W [out, in] of any dtype (matmul.c); g4_cpu_matmul_f32: with the
 * activations as they are (f32) for every type, where g4_cpu_matmul takes int8 activations (g4_cpu_q8_supported):
 * the MoE router, whose logits choose the experts. */
void g4_cpu_matmul(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y);
void g4_cpu_matmul_f32(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y);

/* The ops of dense.c. */
void g4_cpu_attention_dense(g4_backend *be, const g4_dense_attention_args *a);
void g4_cpu_clamp(g4_backend *be, const float *x, float *y, size_t n, float lo, float hi);
void g4_cpu_shift_scale_cols(g4_backend *be, float *y, int rows, int cols, const float *shift, const float *scale);
void g4_cpu_gather_sum(g4_backend *be, const float *src, const int32_t *idx, int n, int k, int row, float s,
                       float *dst);
/* The audio tower's ops (cpu_tower_ops.c). */
void g4_cpu_sigmoid_mul(g4_backend *be, const float *a, const float *b, size_t n, float *y);
void g4_cpu_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
                      float *y);
void g4_cpu_im2col(g4_backend *be, const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                   int nrows, float *out);
void g4_cpu_conv1d_causal_dw(g4_backend *be, const float *x, const float *w, int n, int c, int k, float *y);
void g4_cpu_local_attention(g4_backend *be, const g4_local_attention_args *a);

/* SIMD kernels, chosen once at start-up by the CPU's features. */
typedef struct g4_cpu_kernels {
    const char *isa;
    float (*dot_f32)(const float *a, const float *b, size_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, size_t n); /* w may be unaligned */
    void (*bf16_to_f32)(const uint16_t *src, float *dst, size_t n);
    void (*axpy)(float *y, const float *x, float a, size_t n);     /* y += a * x */
    /* NULL (sets with q_gemm), or y[t * ldy + r] = row r (< nr <= 4) of a Q8_0/Q4_0 matrix (rows of nb blocks,
     * row_bytes apart) times activation row t0 + t (t < nt <= 4); see matmul_q8.c */
    void (*q8_tile)(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, const g4_q8_rows *a, int t0,
                    int nt, int nb, float *y, size_t ldy);
    /* y[t * ldy + r] = dot(w row r, x row t) for f32 rows (w: nr <= 4 rows of n, ldw apart;
     * x: nt <= 4 rows of n, ldx apart) */
    void (*f32_tile)(const float *w, size_t ldw, int nr, const float *x, size_t ldx, int nt, size_t n, float *y,
                     size_t ldy);
    /* NULL, or (with q_gemm) packs nr rows of a Q8_0 / Q4_0 matrix (or a type of q8_k_quants; nb blocks of 32,
     * row_bytes apart) into ng = ceil(nb / 4) groups of G4_QW_GROUP bytes per row, rows ng * G4_QW_GROUP apart
     * (sets with q8_lanes_row: in lane order, g4_cpu_q_packed_row_bytes apart):
     * each group's unsigned codes (Q4_0 nibbles, Q8_0 int8 + 128, the 5- and 6-bit codes, IQ4's table values + 128)
     * in the order of g4_q8_rows.qg, s1 and s2 (g4_q8_mode) in 4 lanes a block (zero past the row); a set with
     * q_act_plain packs its own layout (its codes in element order and lane scales: kernels_x86.c, kernels_arm.c) */
    void (*q_pack)(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, int nb, unsigned char *dst);
    /* x[i] = exp(x[i] - shift) in place (0 below about -87.3); returns the sum (softmax numerators) */
    float (*exp_sum)(float *x, size_t n, float shift);
    /* y = gelu_tanh(g) * u (u NULL: gelu_tanh(g)); in place allowed */
    void (*gelu_mul)(const float *g, const float *u, float *y, size_t n);
    /* y[i] = c * tanh(y[i] / c) in place (the logit soft-cap) */
    void (*softcap)(float *y, size_t n, float c);
    /* attention's weighted sum of value rows: o[h * ldo + x] += sum over i < nv, in order, of
     * p[h * ldp + i] * v[i * ldv + x] (one multiply-add per term), for h < no <= 4 and x < d; each value
     * row is read once for the no heads */
    void (*pv)(float *o, size_t ldo, int no, const float *p, size_t ldp, const float *v, size_t ldv, int nv, size_t d);
    /* NULL, or f32_tile on bf16 weights as stored (w: nr <= 4 rows of n bf16, ldw apart), each (row,
     * token) the same bits as f32_tile on the rows converted to f32 */
    void (*bf16_tile)(const uint16_t *w, size_t ldw, int nr, const float *x, size_t ldx, int nt, size_t n,
                      float *y, size_t ldy);
    /* NULL, or y[t * ldy + r] = packed row r (< nr <= 4, q_pack) times grouped (or, with q_act_plain, plain)
     * activation row t0 + t (t < nt <= 4); ng groups */
    void (*q_gemm)(const unsigned char *wp, int nr, const g4_q8_rows *a, int t0, int nt, int ng, float *y,
                   size_t ldy);
    /* NULL, or (with q_gemm) y[r] = row r (< nr) of a matrix q_pack reads, as stored, times activation row t
     * (as q_gemm reads it), the same bits as q_gemm gives (decode) */
    void (*q_gemv)(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, int nb, const g4_q8_rows *a,
                   int t, float *y);
    /* NULL, or y[t * ldy + r] = dot(w row r, x row t) with both in bf16 (w: nr <= 4 rows of n, ldw apart; x: nt
     * <= G4_BF16X_TT rows of n, ldx apart), products of element pairs summed in f32 (vdpbf16ps); each (row, token) the
     * same bits for every tile shape (batch invariance). Sets without it multiply the rounded activations,
     * widened to f32, by bf16_tile. */
    void (*bf16x_tile)(const uint16_t *w, size_t ldw, int nr, const uint16_t *x, size_t ldx, int nt, size_t n,
                       float *y, size_t ldy);
    /* NULL, or (with q_gemm) one row x[in] quantized into the grouped layout of g4_q8_rows.qg (ng groups, offset
     * off), the same bytes as g4_cpu_q8_quantize's reference rule */
    void (*q8_group_row)(const float *x, size_t in, unsigned char *qg, size_t ng);
    /* q_pack and q_gemv also take the types of G4_Q8_K_QUANTS (g4_cpu_q8_supported) */
    int q8_k_quants;
    /* q_gemm and q_gemv read the plain activation layout (g4_q8_rows.q, d, m), not the grouped one */
    int q_act_plain;
    /* the first index of the largest of x[n], -1 when x holds a NaN (every value -inf: 0) */
    int32_t (*argmax)(const float *x, int n);
    /* q_gemm reads g4_q8_rows.qq (the plain codes in quarter order) beside the plain layout */
    int q_act_quarters;
    /* NULL, or one token's grouped row (qg, ng groups) in lane order (g4_q8_rows.ql) for weights of type t; q_pack
     * then packs ceil(ng / 4) super-groups of G4_QW_LANES bytes a row, in lane order (g4_cpu_q_packed_row_bytes) */
    void (*q8_lanes_row)(const unsigned char *qg, size_t ng, g4_dtype t, unsigned char *ql);
} g4_cpu_kernels;

/* the bytes of a row of ng groups as k's q_pack packs it */
static inline size_t g4_cpu_q_packed_row_bytes(const g4_cpu_kernels *k, size_t ng) {
    return k->q8_lanes_row ? (ng + 3) / 4 * G4_QW_LANES : ng * G4_QW_GROUP;
}

/* the most tokens of one bf16x_tile call */
#ifndef G4_BF16X_TT
#define G4_BF16X_TT 6
#endif

/* the register tile of q_gemm (rows x tokens) */
#define G4_Q_TR 4
#define G4_Q_TT 4



/* the scalar exp_sum, gelu_mul and softcap (sets without their own, and the SIMD sets' tails) */
float g4_cpu_exp_sum_scalar(float *x, size_t n, float shift);
void g4_cpu_gelu_mul_scalar(const float *g, const float *u, float *y, size_t n);
int32_t g4_cpu_argmax_scalar(const float *x, int n);
void g4_cpu_softcap_scalar(float *y, size_t n, float c);
void g4_cpu_pv_scalar(float *o, size_t ldo, int no, const float *p, size_t ldp, const float *v, size_t ldv, int nv,
                      size_t d);

/* Constants of the SIMD exp, gelu and tanh (every instruction set computes them the same way).
 * exp: range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial (Cephes expf, ~1 ulp); 0 below EXP_LO.
 * gelu_tanh(x) = 0.5 x (1 + tanh z) = x / (1 + exp(-2z)), z = GELU_C (x + 0.044715 x^3): no cancellation
 * near tanh = -1, and the ends are right (exp -> 0 gives x, exp -> its clamp gives ~0).
 * tanh(a): a * P(a^2) for |a| < TANH_SMALL (P: degree 5, a least-squares fit of tanh(a)/a weighted by relative
 * error, 1.2e-8 in exact arithmetic), else sign(a) (1 - e) / (1 + e) with e = exp(-2 min(|a|, 9)) <= 0.29
 * (no cancellation); measured against double tanh: relative error below 3e-7 (tests/test_backend_ops.c). */
#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
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
#define TANH_SMALL 0.625f
#define TANH_BIG 9.0f /* tanh is 1 in float beyond */
#define TANH_P0 9.999999971e-01f
#define TANH_P1 -3.333327568e-01f
#define TANH_P2 1.333147831e-01f
#define TANH_P3 -5.374899748e-02f
#define TANH_P4 2.068056387e-02f
#define TANH_P5 -5.759500935e-03f
void g4_cpu_q8_tile_scalar(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, const g4_q8_rows *a,
                           int t0, int nt, int nb, float *y, size_t ldy);

/* The SIMD sets, NULL where this CPU (or architecture) lacks them. */
const g4_cpu_kernels *g4_cpu_kernels_avx2(void);
const g4_cpu_kernels *g4_cpu_kernels_avxvnni(void); /* AVX2 with AVX-VNNI (vpdpbusd on 256 bits), no AVX-512 */
const g4_cpu_kernels *g4_cpu_kernels_avx512(void);
const g4_cpu_kernels *g4_cpu_kernels_neon(void);     /* aarch64: NEON, widening int8 products */
const g4_cpu_kernels *g4_cpu_kernels_neon_dot(void); /* aarch64: NEON with SDOT (dot-product extension) */

/* The names of every instruction set, NULL-terminated: "scalar", "avx2", "avxvnni", "avx512", "neon", "neon_dot".
 * The avx512 set has bf16x_tile where the CPU has AVX512_BF16. */
extern const char *const g4_cpu_isas[];

/* The kernel table of an instruction set (a name of g4_cpu_isas), NULL if this CPU or build
 * lacks it; g4_cpu_kernels_use makes one the table every op uses (tests). */
const g4_cpu_kernels *g4_cpu_kernels_for(const char *isa);
void g4_cpu_kernels_use(const g4_cpu_kernels *k);

const g4_cpu_kernels *g4_cpu_kernels_get(void);

/* The argmax kernel's body (g4_cpu_kernels.argmax), compiled into each set with its target (kernels_x86.c,
 * kernels_arm.c): the first index of a row's largest value, -1 when the row holds a NaN, in one pass. Four
 * accumulators of 16 lanes (GCC's vector extensions; four chains of compares in flight) keep each lane's largest
 * value, the first index that held it and whether a NaN went by; then the largest of the 64 with the lowest index.
 * A row of Gemma's 262144 logits from memory: about 0.11 ms with AVX-512 (0.19 ms for a max pass and a search for
 * its index; 0.6-0.75 ms for either built for plain x86-64, where the library's generic code was). */
typedef float argmax_f16 __attribute__((vector_size(64)));
typedef int32_t argmax_i16 __attribute__((vector_size(64)));
enum { ARGMAX_LANES = 16, ARGMAX_ACC = 4, ARGMAX_STEP = ARGMAX_LANES * ARGMAX_ACC };

__attribute__((always_inline)) static inline int32_t g4_cpu_argmax_body(const float *v, int n) {
    int i = 0, nan = 0;
    float m = -INFINITY;
    int32_t at = 0;
    if (n >= ARGMAX_STEP) {
        const argmax_i16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        argmax_f16 mv[ARGMAX_ACC];
        argmax_i16 iv[ARGMAX_ACC], bad = {0};
        for (int u = 0; u < ARGMAX_ACC; u++) {
            memcpy(&mv[u], v + u * ARGMAX_LANES, sizeof mv[u]);
            iv[u] = lane + u * ARGMAX_LANES;
            bad |= mv[u] != mv[u];
        }
        for (i = ARGMAX_STEP; i + ARGMAX_STEP <= n; i += ARGMAX_STEP)
            for (int u = 0; u < ARGMAX_ACC; u++) {
                argmax_f16 a;
                memcpy(&a, v + i + u * ARGMAX_LANES, sizeof a);
                const argmax_i16 gt = a > mv[u]; /* (false for NaN: the NaN test catches it) */
                bad |= a != a;
                mv[u] = (argmax_f16)((gt & (argmax_i16)a) | (~gt & (argmax_i16)mv[u]));
                iv[u] = (gt & (lane + (i + u * ARGMAX_LANES))) | (~gt & iv[u]);
            }
        m = mv[0][0], at = iv[0][0];
        for (int u = 0; u < ARGMAX_ACC; u++)
            for (int j = 0; j < ARGMAX_LANES; j++) {
                nan |= bad[j] != 0;
                if (mv[u][j] > m || (mv[u][j] == m && iv[u][j] < at)) m = mv[u][j], at = iv[u][j];
            }
    }
    for (int t = i; t < n; t++) { /* (a later index wins no tie) */
        nan |= v[t] != v[t];
        if (v[t] > m) m = v[t], at = t;
    }
    return nan ? -1 : at; /* (every value -inf: the first) */
}


#endif
