/* Quantized weight formats: block layouts and the plain reference encoders and
 * decoders (docs/formats.md 2.2-2.4 for MLX affine, 3.2 for GGUF blocks).
 *
 * These are the ONE definition of every layout: the writers (gemma4c quantize),
 * the loaders' checks, the tests and the op tests' plain reference all use them;
 * the SIMD kernels in backend/cpu (and the CUDA backend) read the same bytes.
 * All multi-byte fields are little-endian; `f16` is IEEE binary16. Blocks are
 * packed back to back with no padding, so a field may sit at any alignment.
 *
 * GGUF blocks (llama.cpp ggml-common.h), per block of QK elements:
 *   Q4_0  (32, 18 B): f16 d; u8 qs[16]. y[j] = (qs[j]&15)-8)*d, y[j+16] = ((qs[j]>>4)-8)*d
 *   Q4_1  (32, 20 B): f16 d; f16 m; u8 qs[16]. same nibbles, y = q*d + m
 *   Q5_0  (32, 22 B): f16 d; u32 qh; u8 qs[16]. q_j = (qs[j]&15) | bit j of qh << 4,
 *                     q_{j+16} = (qs[j]>>4) | bit j+16 of qh << 4; y = (q-16)*d
 *   Q5_1  (32, 24 B): f16 d; f16 m; u32 qh; u8 qs[16]. as Q5_0, y = q*d + m
 *   Q8_0  (32, 34 B): f16 d; i8 qs[32]. y = qs*d
 *   Q4_K (256, 144 B): f16 d; f16 dmin; u8 scales[12]; u8 qs[128]. 8 sub-blocks of 32 with
 *                     6-bit scale sc_k and min m_k (unpacking in g4_k_scale_min); chunk c
 *                     (64 outputs) uses qs[32c..32c+31]: y[64c+l] = d*sc_2c*(q&15) - dmin*m_2c,
 *                     y[64c+32+l] = d*sc_2c+1*(q>>4) - dmin*m_2c+1
 *   Q5_K (256, 176 B): f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]. as Q4_K plus
 *                     16 * bit 2c (low nibble) / bit 2c+1 (high nibble) of qh[l]
 *   Q6_K (256, 210 B): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d (last). halves h of 128:
 *                     y[128h+l+32i] = d*scales[8h+l/16+2i]*(q_i - 32), q_i 6-bit from ql/qh
 *   Q2_K (256, 84 B):  u8 scales[16]; u8 qs[64]; f16 d; f16 dmin. 16 sub-blocks of 16, sub-block k
 *                     with scale scales[k]&15 and min scales[k]>>4; element j = 128h+32s+l (h 0..1,
 *                     s 0..3, l 0..31): q = (qs[32h+l] >> 2s) & 3, y[j] = d*sc_{j/16}*q - dmin*m_{j/16}
 *   Q3_K (256, 110 B): u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d. 16 6-bit scales, k < 8: low
 *                     nibble of scales[k], k >= 8: high nibble of scales[k-8]; bits 4..5 =
 *                     (scales[8+k%4] >> 2(k/4)) & 3; sc_k = that - 32. Element j = 128h+32s+l:
 *                     q = ((qs[32h+l] >> 2s) & 3) - (bit 4h+s of hmask[l] ? 0 : 4), y[j] = d*sc_{j/16}*q
 *   IQ4_NL (32, 18 B): f16 d; u8 qs[16]. y[j] = d*V[qs[j]&15], y[j+16] = d*V[qs[j]>>4] with V =
 *                     g4_iq4_values (llama.cpp's kvalues_iq4nl)
 *   IQ4_XS (256, 136 B): f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]. 8 sub-blocks of 32, sub-block
 *                     k: ls = ((scales_l[k/2] >> 4(k%2)) & 15 | ((scales_h >> 2k) & 3) << 4) - 32, its
 *                     bytes qs[16k..16k+15] as IQ4_NL's with d*ls for d
 *   IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4: read only, their layouts in
 *                     core/quant_codebook.c
 *   CB4 (256, 152 B, the backends' own, never in a file): i8 values[16]; then an IQ4_XS block whose nibbles index
 *                     values instead of g4_iq4_values
 *   CB4_16 (256, 162 B, the backends' own): i8 values[16]; f16 d; i8 scales[16]; u8 qs[128] (IQ4_XS's order): element
 *                     32k + j = d * scales[2k + j / 16] * values[nibble] (the scale per 16)
 *   MXF4 (32, 18 B, the backends' own): IQ4_NL's block with g4_fp4_values for the table (MXFP4's, d an f16)
 *
 * MLX affine (bits b in 2,3,4,5,6,8; group gs in 32,64,128): a row of n codes is a
 * little-endian bit stream, element j at bits [j*b, (j+1)*b); w = s*q + bias with the
 * group's scale and bias (`scales`, `biases`: [rows, n/gs] in BF16/F16/F32). */
#ifndef G4_CORE_QUANT_H
#define G4_CORE_QUANT_H

#include <stdint.h>

#include "core/tensor.h"

/* The 16 values of the IQ4_NL / IQ4_XS nibbles; of the MXFP4 / NVFP4 (and MXF4) nibbles: E2M1 doubled. */
extern const int8_t g4_iq4_values[16];
extern const int8_t g4_fp4_values[16];

/* Decodes n elements of type t (plain float types or GGUF blocks; n a multiple of the
 * block) starting at a block boundary of src. */
void g4_dequant(g4_dtype t, const void *src, float *dst, int64_t n);

/* Decodes one block of a codebook, ternary or FP4 type (IQ2_XXS .. NVFP4; core/quant_codebook.c). */
void g4_dequant_codebook(g4_dtype t, const unsigned char *b, float *y);
/* 1 for the codebook types whose 32-element groups share one scale (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S, TQ1_0, TQ2_0,
 * MXFP4): each value of group k of block b is g4_codebook_scale32(t, b, k) times an integer in -128 .. 127 (IQ1_S:
 * (8 g +- 1) in units of an eighth of its scale), so g4_transcode_row to AF8 holds them exactly, and to CB4 (at most
 * 16 integers a block, tables of 6 to 16) where the group scales are multiples of one f16. */
int g4_codebook_scale32_type(g4_dtype t);
float g4_codebook_scale32(g4_dtype t, const unsigned char *b, int k);
/* 1 for the codebook, ternary and FP4 types whose 16-element runs share one scale (every type but IQ4: the
 * scale32 types, and IQ2_XS, IQ2_S, IQ1_M, NVFP4): each value of run k of block b (elements 16 k ..) is
 * g4_codebook_scale16(t, b, k) times an integer in -128 .. 127 (IQ1_M: 8 g +- 1), so CB4_16 holds them exactly
 * where a block has at most 16 integers and its run scales are multiples of one f16. */
int g4_codebook_scale16_type(g4_dtype t);
float g4_codebook_scale16(g4_dtype t, const unsigned char *b, int k);
/* 1 for the codebook types Q6_K holds exactly (IQ1_S, IQ1_M, IQ3_S, TQ1_0, TQ2_0: every value d * sc * an integer in
 * -32 .. 31, with one d a block and an integer scale sc <= 31 per 16; IQ1's d is its own / 8), and g4_codebook_q6k
 * gives a block's d and 16 scales (0 for another type). g4_transcode_row to Q6_K checks every value (d as f16 too). */
int g4_codebook_q6k_type(g4_dtype t);
int g4_codebook_q6k(g4_dtype t, const unsigned char *b, float *d, int *sc);

/* Decodes row r of any weight tensor (plain, GGUF or MLX) into dst[shape[ndim-1]]. */
void g4_dequant_row(const g4_tensor *t, int64_t r, float *dst);

/* Encodes n floats (a multiple of the block) as type t: F32, F16, BF16 or a GGUF block
 * type (Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 as llama.cpp's quantize_row_*_ref). Returns the
 * bytes written, 0 if t cannot be written or n is not whole blocks. */
size_t g4_quant(g4_dtype t, const float *src, void *dst, int64_t n);

/* The type a row of n elements of a matrix meant to be `target` is written in: target when it is not a GGUF
 * block type or its blocks divide n; else, where 32 divides n, IQ4_NL for Q2_K / Q3_K / IQ4_XS (as llama.cpp's
 * llama-quant.cpp demotes them) and Q8_0 for the others (llama.cpp takes Q5_0/Q5_1 for Q4_K/Q5_K; Q8_0 is what
 * every backend has kernels for, random weights included); BF16 otherwise. */
g4_dtype g4_quant_row_type(g4_dtype target, int64_t n);

/* 1 when g4_dequant_row decodes rows of type t (the plain float types, every GGUF block type, MLX). */
int g4_dequant_reads(g4_dtype t);

/* Row r of a weight tensor t of any type g4_dequant_reads, encoded as type `to` (one g4_quant writes) into dst
 * (g4_dtype_row_bytes(to, row length) bytes): the bytes themselves when the types are equal, the same values moved
 * into the other layout where g4_transcode_exact(t->dtype, to), else decoded (g4_dequant_row) and encoded
 * (g4_quant). tmp: scratch of a row's floats (unused by the exact cases). Returns the bytes written, 0 when t
 * cannot be read, `to` cannot be written, or the row is not whole blocks of both. For a backend without kernels
 * for a type (the CUDA backend holds such weights as Q8_0). */
size_t g4_transcode_row(const g4_tensor *t, int64_t r, g4_dtype to, void *dst, float *tmp);

/* 1 when g4_transcode_row(from -> to) keeps every value bit for bit: equal types, Q5_0 -> Q8_0 (a Q5_0 value is
 * (q - 16) * d, q < 32: the Q8_0 block of the same d and codes q - 16), IQ4_NL -> Q8_0 (d * table[nibble], the
 * table int8: the same d, codes table[nibble]), a codebook type whose groups of 32 share a scale
 * (g4_codebook_scale32_type) -> AF8 (that scale, its codes + 128) and -> CB4 (per 256 the block's integers as a
 * table, the group scales as an f16 d times 6-bit scales; rows whose values it cannot hold are refused: 0 bytes),
 * the types of g4_codebook_scale16_type -> CB4_16 (the same with a scale per 16, d times int8 scales; refused alike),
 * MXFP4 -> MXF4 (its codes, its scale as an f16 d; refused where that is no f16),
 * Q4_1 -> AF4 and Q5_1 -> AF8 (q d + m: s = d,
 * b = m, the codes), Q3_K -> Q6_K (d sc (q - 4): the same d and scales, codes q + 28), the types of
 * g4_codebook_q6k_type -> Q6_K (rows whose values it cannot hold are refused: 0 bytes), MLX -> g4_af_type (the codes, scales and biases as they are), MLX
 * -> MLX of as many bits or more (the codes widened; the scales and biases stay the source's: the CUDA backend's,
 * cuda_quant.cu); and a GGUF type held exactly as AF4 (AF8) -> MLX4 (MLX8) with groups of 32 and f32 scales
 * (g4_transcode_row_mlx, not g4_transcode_row: the CUDA backend's, as the CPU's AF). */
int g4_transcode_exact(g4_dtype from, g4_dtype to);
/* Row r of a GGUF tensor t whose type AF4 (AF8) holds exactly (g4_transcode_exact) as MLX4 (MLX8) codes (LSB
 * first) with a group of 32 and f32 scales and biases: codes [n * bits / 8], scales and biases [n / 32]. Returns the
 * code bytes, 0 where t's type is not held exactly so (g4_transcode_exact(t, MLX4 / MLX8) says when it is: the
 * CUDA backend's layout of Q4_1, Q5_1 and the codebook types whose groups of 32 share a scale). */
size_t g4_transcode_row_mlx(const g4_tensor *t, int64_t r, g4_dtype to, unsigned char *codes, float *scales,
                            float *biases);
/* The AF type (core/tensor.h) that holds an MLX type's codes exactly: AF4 up to 4 bits, AF8 above; UNKNOWN for a
 * type that is not MLX. g4_transcode_row(MLX -> it) is exact (rows of whole groups, groups of whole 32s). */
g4_dtype g4_af_type(g4_dtype mlx);

/* MLX affine: decodes n codes of a row (n a multiple of group) / encodes one row with
 * the GPU rule of docs/formats.md 2.4 (max starts at 0, half-away rounding); scales and
 * biases are stored in sdt (BF16/F16/F32). */
void g4_mlx_dequant(int bits, int group, const void *w, const void *scales, const void *biases, g4_dtype sdt,
                    float *dst, int64_t n);
void g4_mlx_quant_row(int bits, int group, const float *x, int64_t n, void *w, void *scales, void *biases,
                      g4_dtype sdt);

/* Code j of an MLX bit stream. */
static inline unsigned g4_mlx_code(const unsigned char *w, int bits, int64_t j) {
    uint64_t bp = (uint64_t)j * (uint64_t)bits;
    unsigned v = w[bp >> 3];
    if ((bp & 7) + (uint64_t)bits > 8) v |= (unsigned)w[(bp >> 3) + 1] << 8;
    return (v >> (bp & 7)) & ((1u << bits) - 1);
}

/* 6-bit scale and min of sub-block k (0..7) of a Q4_K/Q5_K block's scales[12]. */
static inline void g4_k_scale_min(const unsigned char *s, int k, int *sc, int *m) {
    if (k < 4) {
        *sc = s[k] & 63;
        *m = s[k + 4] & 63;
    } else {
        *sc = (s[k + 4] & 15) | ((s[k - 4] >> 6) << 4);
        *m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
    }
}

static inline float g4_f16_at(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return g4_f16_to_f32(h);
}

#endif
