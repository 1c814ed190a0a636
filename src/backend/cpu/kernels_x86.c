/* x86-64 SIMD kernels of the CPU backend (the scalar set in kernels.c is their
 * reference): AVX2+FMA+F16C (with AVX-VNNI: the avxvnni set, vpdpbusd on 256 bits), and AVX-512 (F, BW, VL, VNNI)
 * with vpdpbusd for int8 activations and, where the CPU has AVX512_BF16, vdpbf16ps for bf16 activations. Each
 * function carries its target attribute, so the file builds for any x86-64 and the set is
 * used only where the CPU reports the features. */
#include "backend/cpu/cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/quant.h"

/* A block's f16 scale bits: blocks need not be 2-byte aligned (a GGUF of alignment 1, views at any byte) */
static inline unsigned short block_d(const unsigned char *p) {
    unsigned short h;
    memcpy(&h, p, 2);
    return h;
}

/* ------------------------------------------------------------- AVX2+FMA */
__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) static float dot_f32_avx2(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

__attribute__((target("avx2,fma"))) static inline __m256 load_bf16x8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const uint16_t *w, const float *x, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, w + i, 2);
        s += g4_bf16_to_f32(h) * x[i];
    }
    return s;
}

__attribute__((target("avx2,fma"))) static void bf16_to_f32_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_bf16x8(src + i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i, 2);
        dst[i] = g4_bf16_to_f32(h);
    }
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, const float *x, float a, size_t n) {
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* ---------------------------------------------------------------- AVX-512 */
__attribute__((target("avx512f"))) static float dot_f32_avx512(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f"))) static inline __m512 load_bf16x16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f"))) static float dot_bf16_avx512(const uint16_t *w, const float *x, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(load_bf16x16(w + i), _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(load_bf16x16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(load_bf16x16(w + i), _mm512_loadu_ps(x + i), s0);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, w + i, 2);
        s += g4_bf16_to_f32(h) * x[i];
    }
    return s;
}

__attribute__((target("avx512f"))) static void bf16_to_f32_avx512(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16x16(src + i));
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + i, 2);
        dst[i] = g4_bf16_to_f32(h);
    }
}

__attribute__((target("avx512f"))) static void axpy_avx512(float *y, const float *x, float a, size_t n) {
    __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}


/* ------------------------------------------------------- f32 and bf16 tiles */
/* y[t * ldy + r] = dot(w row r, x row t) for f32 activations and weights of type WT (f32, or bf16 widened in
 * registers by WLOAD; WAT reads one for the tail): 4 rows x TT tokens per pass. The f32 and bf16 tiles do
 * the same float operations in the same order per (row, token) for every tile shape, so a bf16 row is the
 * number its f32 conversion gives, alone or in a batch (batch invariance). */
#define TILE(NAME, TARGET, WT, VEC, W, WLOAD, LOAD, FMA, ZERO, HSUM, WAT, TT)                                         \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_fixed(const WT *w, size_t ldw,          \
                                                                                  const float *x, size_t ldx,      \
                                                                                  size_t n, float *y, size_t ldy,  \
                                                                                  const int NR, const int NT) {    \
        VEC acc[4][4];                                                                                               \
        for (int r = 0; r < NR; r++)                                                                                 \
            for (int t = 0; t < NT; t++) acc[r][t] = ZERO;                                                           \
        size_t i = 0;                                                                                                \
        for (; i + W <= n; i += W) {                                                                                 \
            VEC wv[4], xv[4];                                                                                        \
            for (int r = 0; r < NR; r++) wv[r] = WLOAD(w + (size_t)r * ldw + i);                                     \
            for (int t = 0; t < NT; t++) xv[t] = LOAD(x + (size_t)t * ldx + i);                                      \
            for (int r = 0; r < NR; r++)                                                                             \
                for (int t = 0; t < NT; t++) acc[r][t] = FMA(wv[r], xv[t], acc[r][t]);                              \
        }                                                                                                            \
        for (int r = 0; r < NR; r++)                                                                                 \
            for (int t = 0; t < NT; t++) {                                                                           \
                float s = HSUM(acc[r][t]);                                                                           \
                for (size_t k = i; k < n; k++) s += WAT(w + (size_t)r * ldw, k) * x[(size_t)t * ldx + k];            \
                y[(size_t)t * ldy + (size_t)r] = s;                                                                  \
            }                                                                                                        \
    }                                                                                                                \
    __attribute__((target(TARGET))) static void NAME(const WT *w, size_t ldw, int nr, const float *x, size_t ldx,     \
                                                     int nt, size_t n, float *y, size_t ldy) {                        \
        if (nr == 4 && nt == 4 && TT == 4) NAME##_fixed(w, ldw, x, ldx, n, y, ldy, 4, 4);                            \
        else if (nr == 4 && nt == 4) {                                                                               \
            NAME##_fixed(w, ldw, x, ldx, n, y, ldy, 4, 2);                                                           \
            NAME##_fixed(w, ldw, x + 2 * ldx, ldx, n, y + 2 * ldy, ldy, 4, 2);                                       \
        } else if (nr == 4 && nt == 1) NAME##_fixed(w, ldw, x, ldx, n, y, ldy, 4, 1);                                \
        else                                                                                                         \
            for (int r = 0; r < nr; r++)                                                                             \
                for (int t = 0; t < nt; t++)                                                                         \
                    NAME##_fixed(w + (size_t)r * ldw, ldw, x + (size_t)t * ldx, ldx, n, y + (size_t)t * ldy + r, ldy, \
                                 1, 1);                                                                              \
    }

static inline float f32_at(const float *w, size_t k) { return w[k]; }
static inline float bf16_at(const uint16_t *w, size_t k) {
    uint16_t h;
    memcpy(&h, w + k, 2);
    return g4_bf16_to_f32(h);
}
__attribute__((target("avx512f"))) static inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }
TILE(f32_tile_avx2, "avx2,fma", float, __m256, 8, _mm256_loadu_ps, _mm256_loadu_ps, _mm256_fmadd_ps,
     _mm256_setzero_ps(), hsum256, f32_at, 2)
TILE(f32_tile_avx512, "avx512f", float, __m512, 16, _mm512_loadu_ps, _mm512_loadu_ps, _mm512_fmadd_ps,
     _mm512_setzero_ps(), hsum512, f32_at, 4)
TILE(bf16_tile_avx2, "avx2,fma", uint16_t, __m256, 8, load_bf16x8, _mm256_loadu_ps, _mm256_fmadd_ps,
     _mm256_setzero_ps(), hsum256, bf16_at, 2)
TILE(bf16_tile_avx512, "avx512f", uint16_t, __m512, 16, load_bf16x16, _mm512_loadu_ps, _mm512_fmadd_ps,
     _mm512_setzero_ps(), hsum512, bf16_at, 4)

/* ------------------------------------------------ int8 activations, shared */
/* Both sets read a row's blocks in groups of 4 (128 elements; for the K-quants and IQ4_XS half a super-block). */

/* Decode (q_gemv) takes GEMV_ROWS rows at once, far apart (one from each GEMV_ROWS-th of the range), so that each
 * is its own sequential stream for the hardware prefetchers (rows next to each other, interleaved in one page, read
 * at half the bandwidth from memory here), and prefetches each stream GEMV_PREFETCH bytes ahead, every line of it
 * (the hardware prefetchers stop at page boundaries: one AVX-512 thread, in CPU time, reads Q4_0 at 32 GB/s, Q8_0
 * at 27-33 GB/s, against 16-17 and 12-13 before these changes). */
#define GEMV_PREFETCH 2048
#define GEMV_ROWS 4
/* q_pack reads the rows PACK_PREFETCH bytes ahead (one AVX-512 thread packing for 8 tokens, in CPU time: 5.7-6.7 GB/s
 * of Q4_0 weights against 4.7-5.4 without) */
#define PACK_PREFETCH 4096

/* -------------------------------------------------- int8 activations, AVX2 */
/* Without VNNI: the integer dot product of a block of 32 is vpmaddubsw (unsigned x signed byte pairs into int16)
 * and vpmaddwd by ones (into 8 int32 lanes: lanes 0-3 elements 0-15, 4-7 elements 16-31), exact when the pairs
 * fit int16: the unsigned codes (Q4_0, Q5_0, Q4_K, Q5_K, AF4: at most 31) as they are, the signed ones (Q8_0,
 * IQ4_NL, IQ4_XS, CB4: the table's values, Q6_K: code - 32, Q3_K: code - 4, AF8: code - 128) as |w| times x with w's
 * sign (vpsignb). The
 * activations are the plain layout (g4_q8_rows.q, d, m = d * sum q per block of 32; nb_pad a multiple of 8). Groups go by pairs (8
 * blocks; a K-quant's super-block, whose scales are decoded once), and per pair
 *   acc += float(group 0's lanes: block i's elements 0-15 in lane i, 16-31 in 4 + i) * s[0] * dx[0]  + (group 1's)
 *          + s2 * m
 * with s[h] the scale of each lane's 16 elements and s2 (lane k) block k's offset term: Q4_0 -8 d, Q5_0 -16 d,
 * Q4_K / Q5_K -dmin m_k, AF4 the bias b, AF8 b + 128 s, zero for the other signed types. One fused multiply-add a
 * group instead of one a block. */
#define T2 "avx2,fma,f16c"

/* A group as q_pack stores it (G4_QW_GROUP bytes): the 4 blocks' codes in quarter order (q2_quarters: 4 x 32
 * bytes, the order of the activations' g4_q8_rows.qq, so that q_gemm sums a lane's products without horizontal adds;
 * q_gemv, which decodes each group in registers, keeps element order and three vphaddd a group), then its s
 * (8 floats: lane i / 4 + i the scale of block i's elements 0-15 / 16-31), in the first group of each pair
 * (groups 2p, 2p + 1) the pair's s2 (8 floats: lane k block 8p + k's offset term), and for Q2_K its mins (8 floats
 * at 192, lanes as s's); 224 bytes. Blocks past the row's end: zero codes and scales.
 * Q2_K (w = s u + o per 16, G4_Q8_MIN16) adds to each group's sums its mins o times the activations' sums per 16
 * (of the codes, times dx), computed from the activation codes as the products are. */

/* the types whose codes are signed (|w| times x with w's sign) */
static inline int q2_signed(g4_dtype t) {
    return t == G4_Q8_0 || t == G4_IQ4_NL || t == G4_MXF4 || t == G4_IQ4_XS || t == G4_CB4 || t == G4_CB4_16 ||
           t == G4_Q6_K || t == G4_Q3_K || t == G4_AF8;
}

/* the f32 at p (unaligned) */
static inline float g4_f32_at(const unsigned char *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* 32 nibbles of 16 bytes in element order: the low ones 0-15, the high ones 16-31 (the 16 bytes loaded into both
 * halves and the upper half shifted: no cross-lane insert, whose one port the group dots' vphaddd also need) */
__attribute__((target(T2), always_inline)) static inline __m256i q2_nibbles(const unsigned char *p) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* IQ4's (CB4: its block's) values of 32 nibbles (vpshufb: the table in both 128-bit lanes) */
__attribute__((target(T2), always_inline)) static inline __m256i q2_iq4(__m256i nibbles, const int8_t *values) {
    const __m128i t = _mm_loadu_si128((const __m128i *)values);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles);
}

/* The offset Q6_K (32) and Q3_K (4) take from their stored codes: with `raw`, q2_codes leaves it in (unsigned codes,
 * no vpsignb), and the decode GEMV takes offset x the activations' sums per 16 from the integer sums (the same
 * integers) */
static inline int q2_code_shift(g4_dtype t) { return t == G4_Q6_K ? 5 : t == G4_Q3_K ? 2 : 0; }

/* The codes of group g of a row of nb blocks of 32 (raw: Q6_K's and Q3_K's without their offset). */
__attribute__((target(T2), always_inline)) static inline void q2_codes(g4_dtype type, const unsigned char *row, int g,
                                                                       int nb, __m256i c[4], const int raw) {
    const __m256i m4 = _mm256_set1_epi8(15);
    if (type == G4_Q4_K || type == G4_Q5_K) { /* qs: chunk c's 32 bytes, sub-block 2c the low nibbles, 2c+1 high */
        const unsigned char *sb = row + (size_t)(type == G4_Q4_K ? 144 : 176) * (size_t)(g / 2);
        const int h = g % 2;
        const unsigned char *qs = sb + (type == G4_Q4_K ? 16 : 48) + 64 * h;
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)qs), q1 = _mm256_loadu_si256((const __m256i *)(qs + 32));
        c[0] = _mm256_and_si256(q0, m4);
        c[1] = _mm256_and_si256(_mm256_srli_epi16(q0, 4), m4);
        c[2] = _mm256_and_si256(q1, m4);
        c[3] = _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4);
        if (type == G4_Q5_K) { /* sub-block k's fifth bits: bit k of qh[l] */
            const __m256i qh = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(sb + 16)), _mm_cvtsi32_si128(4 * h));
            const __m256i one = _mm256_set1_epi8(1);
            c[0] = _mm256_or_si256(c[0], _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
            c[1] = _mm256_or_si256(c[1], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
            c[2] = _mm256_or_si256(c[2], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), one), 4));
            c[3] = _mm256_or_si256(c[3], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 3), one), 4));
        }
    } else if (type == G4_Q6_K) { /* block i of half h: ql's low (i < 2) or high nibbles, bits 2i of qh, - 32 */
        const unsigned char *sb = row + (size_t)210 * (size_t)(g / 2);
        const int h = g % 2;
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(sb + 64 * h)),
                      ql1 = _mm256_loadu_si256((const __m256i *)(sb + 64 * h + 32)),
                      qh = _mm256_loadu_si256((const __m256i *)(sb + 128 + 32 * h));
        const __m256i m3 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
        const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
        const __m256i hi[4] = {_mm256_and_si256(qh, m3), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 4), m3),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 6), m3)};
        for (int i = 0; i < 4; i++) {
            c[i] = _mm256_or_si256(lo[i], _mm256_slli_epi16(hi[i], 4));
            if (!raw) c[i] = _mm256_sub_epi8(c[i], c32);
        }
    } else if (type == G4_Q3_K) { /* block i of half h: bits 2i of qs[32h + l], bit 4h + i of hmask[l], - 4 */
        const unsigned char *sb = row + (size_t)110 * (size_t)(g / 2);
        const int h = g % 2;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(sb + 32 + 32 * h)),
                      hm = _mm256_loadu_si256((const __m256i *)sb);
        const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), c4 = _mm256_set1_epi8(4);
        for (int i = 0; i < 4; i++) {
            const __m256i lo2 = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * i)), m3),
                          hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + i)), one);
            c[i] = _mm256_or_si256(lo2, _mm256_slli_epi16(hb, 2));
            if (!raw) c[i] = _mm256_sub_epi8(c[i], c4);
        }
    } else if (type == G4_Q2_K) { /* block i of half h: bits 2i of qs[32h + l] */
        const unsigned char *sb = row + (size_t)84 * (size_t)(g / 2);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(sb + 16 + 32 * (g % 2))), m3 = _mm256_set1_epi8(3);
        for (int i = 0; i < 4; i++) c[i] = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * i)), m3);
    } else if (type == G4_IQ4_XS || type == G4_CB4) { /* sub-block 4h + i: 16 bytes of IQ4_NL's nibbles */
        const int cb = type == G4_CB4;
        const unsigned char *sb = row + (size_t)(cb ? 152 : 136) * (size_t)(g / 2) + (cb ? 16 : 0);
        const int8_t *values = cb ? (const int8_t *)(sb - 16) : g4_iq4_values;
        for (int i = 0; i < 4; i++) c[i] = q2_iq4(q2_nibbles(sb + 8 + 64 * (g % 2) + 16 * i), values);
    } else if (type == G4_CB4_16) { /* the same nibbles after the table, d and the 16 scales */
        const unsigned char *sb = row + (size_t)162 * (size_t)(g / 2);
        for (int i = 0; i < 4; i++) c[i] = q2_iq4(q2_nibbles(sb + 34 + 64 * (g % 2) + 16 * i), (const int8_t *)sb);
    } else { /* blocks of 32: Q4_0, IQ4_NL, MXF4 (18 bytes), Q5_0 (22), Q8_0 (34), AF4 (24), AF8 (40) */
        const int bs = g4_q8_block_bytes(type), n = nb - 4 * g;
        const unsigned char *p = row + (size_t)bs * 4 * (size_t)g;
        const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull),
                      spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                                3, 3, 3, 3, 3, 3, 3);
        for (int i = 0; i < 4; i++) {
            const unsigned char *b = p + bs * i;
            if (i >= n) {
                c[i] = _mm256_setzero_si256();
            } else if (type == G4_Q8_0) {
                c[i] = _mm256_loadu_si256((const __m256i *)(b + 2));
            } else if (type == G4_AF8) { /* code - 128, signed (its scale's 128 x is in the offset term) */
                c[i] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 8)), _mm256_set1_epi8((char)0x80));
            } else if (type == G4_AF4) {
                c[i] = q2_nibbles(b + 8);
            } else if (type == G4_Q5_0) { /* element j's fifth bit: bit j of qh (one byte a bit, then 16) */
                uint32_t qh;
                memcpy(&qh, b + 2, 4);
                const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
                const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bits), bits);
                c[i] = _mm256_or_si256(q2_nibbles(b + 6), _mm256_and_si256(set, _mm256_set1_epi8(16)));
            } else {
                c[i] = q2_nibbles(b + 2);
                if (type == G4_IQ4_NL || type == G4_MXF4)
                    c[i] = q2_iq4(c[i], type == G4_MXF4 ? g4_fp4_values : g4_iq4_values);
            }
        }
    }
}

/* The scales of pair p (groups 2p and 2p + 1: blocks 8p .. 8p + 7, for the K-quants and IQ4_XS super-block p) of a
 * row of nb blocks: s[h] those of group 2p + h, lane i / 4 + i = its block i's elements 0-15 / 16-31; lane k of s2 =
 * block 8p + k's offset term; zero past the row. Q2_K: mins[h] those of group 2p + h, lanes as s[h]'s. */
__attribute__((target(T2), always_inline)) static inline void q2_scales(g4_dtype type, const unsigned char *row, int p,
                                                                        int nb, __m256 s[2], __m256 *s2, __m256 mins[2]) {
    __m256 v, m = _mm256_setzero_ps(); /* the 8 blocks' scales and offset terms */
    mins[0] = mins[1] = m;
    if (type == G4_Q2_K) { /* group h's block i: elements 0-15 scales[8h + 2i], 16-31 scales[8h + 2i + 1] */
        const unsigned char *sb = row + (size_t)84 * (size_t)p;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(block_d(sb + 80))), dmin = _mm256_set1_ps(-_cvtsh_ss(block_d(sb + 82)));
        const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        for (int h = 0; h < 2; h++) {
            const __m256i b = _mm256_permutevar8x32_epi32(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 8 * h))), order);
            s[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), d);
            mins[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), dmin);
        }
        *s2 = m;
        return;
    } else if (type == G4_Q4_K || type == G4_Q5_K) {
        const unsigned char *sb = row + (size_t)(type == G4_Q4_K ? 144 : 176) * (size_t)p;
        uint64_t sc, mn;
        g4_k_scales8(sb + 4, &sc, &mn);
        v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc))),
                          _mm256_set1_ps(_cvtsh_ss(block_d(sb))));
        m = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))),
                          _mm256_set1_ps(-_cvtsh_ss(block_d(sb + 2))));
    } else if (type == G4_Q6_K || type == G4_CB4_16) { /* per 16: half h's block i elements 0-15 scales[8h + 2i], 16-31
                                                        * scales[8h + 2i + 1] */
        const int cb = type == G4_CB4_16;
        const unsigned char *sb = row + (size_t)(cb ? 162 : 210) * (size_t)p;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(block_d(sb + (cb ? 16 : 208))));
        const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        for (int h = 0; h < 2; h++)
            s[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(
                                     _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sb + (cb ? 18 : 192) + 8 * h))),
                                     order)),
                                 d);
        *s2 = m;
        return;
    } else if (type == G4_Q3_K) { /* as Q6_K's: the 16 scales d * (6-bit scale - 32) */
        const unsigned char *sb = row + (size_t)110 * (size_t)p;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(block_d(sb + 108)));
        const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        uint64_t s8[2];
        g4_q3k_scales16(sb + 96, &s8[0], &s8[1]);
        for (int h = 0; h < 2; h++)
            s[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(
                                     _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)s8[h])),
                                                      _mm256_set1_epi32(32)),
                                     order)),
                                 d);
        *s2 = m;
        return;
    } else if (type == G4_IQ4_XS || type == G4_CB4) { /* sub-block k: d * (6-bit scale - 32) */
        const unsigned char *sb = row + (type == G4_CB4 ? (size_t)152 * (size_t)p + 16 : (size_t)136 * (size_t)p);
        const uint64_t ls = g4_iq4xs_scales8(sb);
        v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ls)),
                                                              _mm256_set1_epi32(32))),
                          _mm256_set1_ps(_cvtsh_ss(block_d(sb))));
    } else if (type == G4_AF4 || type == G4_AF8) { /* the blocks' scales s and biases b (AF8: b + 128 s) */
        const int bs = g4_q8_block_bytes(type), n = nb - 8 * p;
        const unsigned char *b = row + (size_t)bs * 8 * (size_t)p;
#define F_AT(i, o) (i < n ? g4_f32_at(b + (size_t)bs * i + o) : 0.0f) /* (no store and load: see below) */
        v = _mm256_setr_ps(F_AT(0, 0), F_AT(1, 0), F_AT(2, 0), F_AT(3, 0), F_AT(4, 0), F_AT(5, 0), F_AT(6, 0), F_AT(7, 0));
        m = _mm256_setr_ps(F_AT(0, 4), F_AT(1, 4), F_AT(2, 4), F_AT(3, 4), F_AT(4, 4), F_AT(5, 4), F_AT(6, 4), F_AT(7, 4));
#undef F_AT
        if (type == G4_AF8) m = _mm256_fmadd_ps(v, _mm256_set1_ps(128.0f), m);
    } else { /* blocks of 32: d; Q4_0 / Q5_0 offset terms -8 d / -16 d */
        const int bs = g4_q8_block_bytes(type), n = nb - 8 * p;
        const unsigned char *b = row + (size_t)bs * 8 * (size_t)p;
        /* (gathered in two general registers: a store of the 8 and a load would stall store forwarding, and eight
         * vpinsrw take the shuffle port the group dots need) */
#define D_AT(i) (i < n ? (uint64_t)block_d(b + (size_t)bs * i) << (16 * (i % 4)) : 0)
        const uint64_t lo = D_AT(0) | D_AT(1) | D_AT(2) | D_AT(3), hi = D_AT(4) | D_AT(5) | D_AT(6) | D_AT(7);
#undef D_AT
        v = _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
        if (type == G4_Q4_0 || type == G4_Q5_0) m = _mm256_mul_ps(v, _mm256_set1_ps(type == G4_Q4_0 ? -8.0f : -16.0f));
    }
    s[0] = _mm256_permute2f128_ps(v, v, 0x00); /* group h: its 4 blocks' scales in lanes i and 4 + i */
    s[1] = _mm256_permute2f128_ps(v, v, 0x11);
    *s2 = m;
}

/* AVX-VNNI (the avxvnni set: the AVX2 kernels with vpdpbusd, VEX-encoded, as Alder Lake and later cores without
 * AVX-512 have it): acc + the sums of 4 products unsigned u x signed s a lane, exact; the same integers as
 * vpmaddubsw + vpmaddwd where those do not saturate (as this file uses them), so the same bits. By inline assembly,
 * so that one source serves both sets (the compiler's intrinsic would need the avxvnni target on every caller). */
__attribute__((target(T2), always_inline)) static inline __m256i q2_vnni(__m256i acc, __m256i u, __m256i s) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
}

/* the int8 dot products of a block: 8 lanes of 4 products each (signed codes: |w| times x with w's sign) */
__attribute__((target(T2), always_inline)) static inline __m256i q2_dot(__m256i w, __m256i x, const int sgn,
                                                                        const int vnni) {
    const __m256i u = sgn ? _mm256_sign_epi8(w, w) : w, v = sgn ? _mm256_sign_epi8(x, w) : x;
    if (vnni) return q2_vnni(_mm256_setzero_si256(), u, v);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1));
}

/* group codes c times activation codes q: lane i / 4 + i = block i's elements 0-15 / 16-31 (three horizontal adds
 * of the blocks' lanes) */
__attribute__((target(T2), always_inline)) static inline __m256i q2_group_dots(const __m256i c[4], const int8_t *q,
                                                                               const int sgn, const int vnni) {
    __m256i d[4];
    for (int i = 0; i < 4; i++) d[i] = q2_dot(c[i], _mm256_loadu_si256((const __m256i *)(q + 32 * i)), sgn, vnni);
    return _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
}

/* A group's codes from element order (c[i] = block i) into quarter order (c[j]: lane i + 4 h = block i's elements
 * 16 h + 4 j .. + 3): a 4 x 4 transpose of the 32-bit lanes within each 128-bit half. A lane's sum over the four
 * quarters is the lane of q2_group_dots, by vertical adds (q_gemm; the activations in g4_q8_rows.qq). */
__attribute__((target(T2), always_inline)) static inline void q2_quarters(__m256i c[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(c[0], c[1]), t1 = _mm256_unpackhi_epi32(c[0], c[1]),
                  t2 = _mm256_unpacklo_epi32(c[2], c[3]), t3 = _mm256_unpackhi_epi32(c[2], c[3]);
    c[0] = _mm256_unpacklo_epi64(t0, t2);
    c[1] = _mm256_unpackhi_epi64(t0, t2);
    c[2] = _mm256_unpacklo_epi64(t1, t3);
    c[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* the types whose codes are at most 32 in magnitude (as vpmaddubsw takes them): a lane's four pair sums of 2 x 32 x
 * 127 at most fit int16 */
static inline int q2_small(g4_dtype t) {
    return t == G4_Q4_0 || t == G4_Q5_0 || t == G4_Q4_K || t == G4_Q5_K || t == G4_AF4 || t == G4_Q2_K ||
           t == G4_Q6_K || t == G4_Q3_K || t == G4_MXF4;
}

/* token t's pair p: its 8 blocks' codes, group h's d in lanes i and 4 + i (dx[h]), m of block 8p + k in lane k, and
 * with min16 (Q2_K) group h's code sums per 16 times dx (sx[h], lanes as dx's; zero past the row) */
typedef struct {
    const int8_t *q;
    __m256 dx[2], m, sx[2];
} q2_x;
__attribute__((target(T2), always_inline)) static inline q2_x q2_xload(const g4_q8_rows *a, int t, int p,
                                                                       const int min16, const int vnni) {
    const size_t b = (size_t)t * a->nb_pad + 8 * (size_t)p;
    const __m256 d = _mm256_loadu_ps(a->d + b);
    q2_x x = {a->q + (size_t)t * a->in_pad + 256 * (size_t)p,
              {_mm256_permute2f128_ps(d, d, 0x00), _mm256_permute2f128_ps(d, d, 0x11)},
              _mm256_loadu_ps(a->m + b),
              {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    if (min16) {
        const __m256i one[4] = {_mm256_set1_epi8(1), _mm256_set1_epi8(1), _mm256_set1_epi8(1), _mm256_set1_epi8(1)};
        for (int h = 0; h < 2; h++) /* (the activations are zero past the row) */
            x.sx[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(q2_group_dots(one, x.q + 128 * h, 0, vnni)), x.dx[h]);
    }
    return x;
}

/* One (row, token) step of a pair of groups, the same in q_gemm and q_gemv: each group's sums (h1: none past the
 * row) times their scales s[h] * dx, plus the 8 blocks' offset terms s2 * m, and with min16 each group's mins
 * mn[h] times the activations' sums per 16, added to acc (one add on the chain of acc a pair, not three fused
 * multiply-adds) */
__attribute__((target(T2), always_inline)) static inline __m256 q2_pair_step(__m256 acc, __m256i h0, __m256i h1,
                                                                             const int two, const __m256 s[2],
                                                                             __m256 s2, const __m256 mn[2],
                                                                             const q2_x *x, const int min16) {
    __m256 v = _mm256_fmadd_ps(s2, x->m, _mm256_mul_ps(_mm256_cvtepi32_ps(h0), _mm256_mul_ps(s[0], x->dx[0])));
    if (two) v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h1), _mm256_mul_ps(s[1], x->dx[1]), v);
    if (min16) {
        v = _mm256_fmadd_ps(mn[0], x->sx[0], v);
        if (two) v = _mm256_fmadd_ps(mn[1], x->sx[1], v);
    }
    return _mm256_add_ps(acc, v);
}

__attribute__((target(T2), always_inline)) static inline void q_pack_avx2_typed(g4_dtype type, const unsigned char *w,
                                                                                size_t row_bytes, int nr, int nb,
                                                                                unsigned char *dst) {
    const long gb = g4_q8_group_bytes(type);
    const int ng = (nb + 3) / 4;
    for (int r = 0; r < nr; r++) {
        const unsigned char *row = w + (size_t)r * row_bytes;
        unsigned char *o = dst + (size_t)r * ng * G4_QW_GROUP;
        __m256 sc[2], s2 = _mm256_setzero_ps(), mn[2];
        for (int g = 0; g < ng; g++, o += G4_QW_GROUP) {
            _mm_prefetch((const char *)row + (size_t)gb * g + PACK_PREFETCH, _MM_HINT_T0);
            if (gb > 64) _mm_prefetch((const char *)row + (size_t)gb * g + 64 + PACK_PREFETCH, _MM_HINT_T0);
            if (g % 2 == 0) q2_scales(type, row, g / 2, nb, sc, &s2, mn);
            _mm256_storeu_ps((float *)(o + 128), sc[g % 2]);
            _mm256_storeu_ps((float *)(o + 160), s2);
            _mm256_storeu_ps((float *)(o + 192), mn[g % 2]);
            __m256i c[4];
            q2_codes(type, row, g, nb, c, 0);
            q2_quarters(c);
            for (int j = 0; j < 4; j++) _mm256_storeu_si256((__m256i *)(o + 32 * j), c[j]);
        }
    }
}

__attribute__((target(T2))) static void q_pack_avx2(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr,
                                                   int nb, unsigned char *dst) {
#define CALL(qt) q_pack_avx2_typed(qt, w, row_bytes, nr, nb, dst)
    G4_Q8_SWITCH(type, CALL) /* (each type's decoding inlined) */
#undef CALL
}

/* packed row wp times tokens t0 .. t0 + NT - 1 (NT <= 2), the group dots from quarters (q2_quarters): each lane's
 * four quarters summed vertically, in int16 before the one vpmaddwd when they fit (small), then q2_pair_step (the
 * same integers and float steps as q_gemv: the same bits). (Tiles of 2 x 2 and 1 x 4 measured no faster on a
 * Sapphire Rapids core.) */
__attribute__((target(T2), always_inline)) static inline void q_gemm_avx2_tile(const unsigned char *wp,
                                                                               const g4_q8_rows *a, int t0, int ng,
                                                                               float *y, size_t ldy, const int NT,
                                                                               const int sgn, const int min16,
                                                                               const int small, const int vnni) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int p = 0; 2 * p < ng; p++) {
        const unsigned char *g0 = wp + (size_t)2 * p * G4_QW_GROUP, *g1 = g0 + G4_QW_GROUP;
        const int two = 2 * p + 1 < ng;
        __m256i h[2][2]; /* [group][token] */
        for (int g = 0; g < 1 + two; g++)
            for (int j = 0; j < 4; j++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(g0 + (size_t)g * G4_QW_GROUP + 32 * j));
                for (int t = 0; t < NT; t++) {
                    const __m256i xv = _mm256_loadu_si256(
                        (const __m256i *)(a->qq + (size_t)(t0 + t) * a->in_pad + 256 * (size_t)p + 128 * g + 32 * j));
                    if (vnni) { /* (one vpdpbusd a quarter into the lane's int32 sums) */
                        h[g][t] = q2_vnni(j ? h[g][t] : _mm256_setzero_si256(), sgn ? _mm256_sign_epi8(w, w) : w,
                                          sgn ? _mm256_sign_epi8(xv, w) : xv);
                        continue;
                    }
                    const __m256i d = sgn ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w))
                                          : _mm256_maddubs_epi16(w, xv);
                    if (small)
                        h[g][t] = j ? _mm256_add_epi16(h[g][t], d) : d;
                    else
                        h[g][t] = j ? _mm256_add_epi32(h[g][t], _mm256_madd_epi16(d, ones)) : _mm256_madd_epi16(d, ones);
                }
            }
        const __m256 s[2] = {_mm256_loadu_ps((const float *)(g0 + 128)),
                             two ? _mm256_loadu_ps((const float *)(g1 + 128)) : _mm256_setzero_ps()},
                     s2 = _mm256_loadu_ps((const float *)(g0 + 160));
        const __m256 mn[2] = {min16 ? _mm256_loadu_ps((const float *)(g0 + 192)) : _mm256_setzero_ps(),
                              min16 && two ? _mm256_loadu_ps((const float *)(g1 + 192)) : _mm256_setzero_ps()};
        for (int t = 0; t < NT; t++) {
            const q2_x x = q2_xload(a, t0 + t, p, min16, vnni);
            const __m256i h0 = small && !vnni ? _mm256_madd_epi16(h[0][t], ones) : h[0][t];
            const __m256i h1 = !two ? h0 : small && !vnni ? _mm256_madd_epi16(h[1][t], ones) : h[1][t];
            acc[t] = q2_pair_step(acc[t], h0, h1, two, s, s2, mn, &x, min16);
        }
    }
    for (int t = 0; t < NT; t++) y[(size_t)t * ldy] = hsum256(acc[t]);
}

__attribute__((target(T2), always_inline)) static inline void q_gemm_avx2_sgn(const unsigned char *wp, int nr,
                                                                              const g4_q8_rows *a, int t0, int nt,
                                                                              int ng, float *y, size_t ldy,
                                                                              const int sgn, const int min16,
                                                                              const int small, const int vnni) {
    const size_t ldw = (size_t)ng * G4_QW_GROUP;
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t += 2) {
            if (nt - t >= 2)
                q_gemm_avx2_tile(wp + (size_t)r * ldw, a, t0 + t, ng, y + (size_t)t * ldy + r, ldy, 2, sgn, min16, small, vnni);
            else
                q_gemm_avx2_tile(wp + (size_t)r * ldw, a, t0 + t, ng, y + (size_t)t * ldy + r, ldy, 1, sgn, min16, small, vnni);
        }
}

__attribute__((target(T2), always_inline)) static inline void q_gemm_avx2_set(const unsigned char *wp, int nr,
                                                                              const g4_q8_rows *a, int t0, int nt,
                                                                              int ng, float *y, size_t ldy,
                                                                              const int vnni) {
    if (q2_signed(a->type) && q2_small(a->type))
        q_gemm_avx2_sgn(wp, nr, a, t0, nt, ng, y, ldy, 1, 0, 1, vnni);
    else if (q2_signed(a->type))
        q_gemm_avx2_sgn(wp, nr, a, t0, nt, ng, y, ldy, 1, 0, 0, vnni);
    else if (g4_q8_mode(a->type) == G4_Q8_MIN16)
        q_gemm_avx2_sgn(wp, nr, a, t0, nt, ng, y, ldy, 0, 1, 1, vnni);
    else if (q2_small(a->type))
        q_gemm_avx2_sgn(wp, nr, a, t0, nt, ng, y, ldy, 0, 0, 1, vnni);
    else
        q_gemm_avx2_sgn(wp, nr, a, t0, nt, ng, y, ldy, 0, 0, 0, vnni);
}
__attribute__((target(T2))) static void q_gemm_avx2(const unsigned char *wp, int nr, const g4_q8_rows *a, int t0,
                                                   int nt, int ng, float *y, size_t ldy) {
    q_gemm_avx2_set(wp, nr, a, t0, nt, ng, y, ldy, 0);
}
__attribute__((target(T2))) static void q_gemm_avxvnni(const unsigned char *wp, int nr, const g4_q8_rows *a, int t0,
                                                      int nt, int ng, float *y, size_t ldy) {
    q_gemm_avx2_set(wp, nr, a, t0, nt, ng, y, ldy, 1);
}

/* decode: NR rows as stored, far apart (stride), times token t's row, each group decoded in registers */
__attribute__((target(T2), always_inline)) static inline void q_gemv_avx2_fixed(g4_dtype type, const unsigned char *w,
                                                                                size_t stride, int nb,
                                                                                const g4_q8_rows *a, int t, float *y,
                                                                                size_t ystride, const int NR,
                                                                                const int vnni) {
    const long gb = g4_q8_group_bytes(type);
    const int ng = (nb + 3) / 4;
    __m256 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    const int shift = q2_code_shift(type), sgn = q2_signed(type) && !shift;
    for (int p = 0; 2 * p < ng; p++) { /* pairs of groups (super-blocks): their scales decoded once */
        const int min16 = g4_q8_mode(type) == G4_Q8_MIN16;
        const q2_x x = q2_xload(a, t, p, min16, vnni);
        const int two = 2 * p + 1 < ng;
        __m256i xoff[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}; /* the offset x the sums per 16 */
        if (shift) {
            const __m256i one[4] = {_mm256_set1_epi8(1), _mm256_set1_epi8(1), _mm256_set1_epi8(1), _mm256_set1_epi8(1)};
            for (int h = 0; h < 1 + two; h++)
                xoff[h] = _mm256_slli_epi32(q2_group_dots(one, x.q + 128 * h, 0, vnni), shift);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const unsigned char *row = w + (size_t)r * stride;
            for (long off = 0; off < 2 * gb; off += 64)
                _mm_prefetch((const char *)row + (size_t)(gb * 2 * p + off) + GEMV_PREFETCH, _MM_HINT_T0);
            __m256 s[2], s2, mn[2];
            __m256i c[4], h0, h1;
            q2_scales(type, row, p, nb, s, &s2, mn);
            q2_codes(type, row, 2 * p, nb, c, shift != 0);
            h0 = h1 = _mm256_sub_epi32(q2_group_dots(c, x.q, sgn, vnni), xoff[0]);
            if (two) {
                q2_codes(type, row, 2 * p + 1, nb, c, shift != 0);
                h1 = _mm256_sub_epi32(q2_group_dots(c, x.q + 128, sgn, vnni), xoff[1]);
            }
            acc[r] = q2_pair_step(acc[r], h0, h1, two, s, s2, mn, &x, min16);
        }
    }
    for (int r = 0; r < NR; r++) y[(size_t)r * ystride] = hsum256(acc[r]);
}

__attribute__((target(T2), always_inline)) static inline void q_gemv_avx2_typed(g4_dtype type, const unsigned char *w,
                                                                                size_t row_bytes, int nr, int nb,
                                                                                const g4_q8_rows *a, int t, float *y,
                                                                                const int vnni) {
#define Q2_ROWS 4


    const int q = nr / Q2_ROWS;
    for (int i = 0; i < q; i++)
        q_gemv_avx2_fixed(type, w + (size_t)i * row_bytes, (size_t)q * row_bytes, nb, a, t, y + i, (size_t)q, Q2_ROWS,
                          vnni);
    for (int r = q * Q2_ROWS; r < nr; r++) q_gemv_avx2_fixed(type, w + (size_t)r * row_bytes, 0, nb, a, t, y + r, 0, 1, vnni);
}

__attribute__((target(T2))) static void q_gemv_avx2(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr,
                                                   int nb, const g4_q8_rows *a, int t, float *y) {
#define CALL(qt) q_gemv_avx2_typed(qt, w, row_bytes, nr, nb, a, t, y, 0)
    G4_Q8_SWITCH(type, CALL) /* (each type's decoding inlined) */
#undef CALL
}
__attribute__((target(T2))) static void q_gemv_avxvnni(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr,
                                                      int nb, const g4_q8_rows *a, int t, float *y) {
#define CALL(qt) q_gemv_avx2_typed(qt, w, row_bytes, nr, nb, a, t, y, 1)
    G4_Q8_SWITCH(type, CALL)
#undef CALL
}

/* ----------------------------------------------- int8 activations, AVX-512 */
#define T512 "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi,f16c"

/* Packs Q4_0 / Q8_0 rows into groups of 4 blocks (g4_cpu_kernels.q_pack): vpermi2b gathers each
 * group's code bytes and its 4 scales (as 16 halves, each block's in 4 lanes) from the loaded bytes;
 * loads past the row's end are masked (zeros: codes 0 with scale 0). */
__attribute__((target(T512))) static inline __m512i load_upto(const unsigned char *p, long n) {
    if (n >= 64) return _mm512_loadu_si512(p);
    return _mm512_maskz_loadu_epi8(n > 0 ? (1ull << n) - 1 : 0, p);
}

/* the permutations that gather a group (of 4 blocks) of Q4_0 or Q8_0 */
typedef struct {
    __m512i lo, hi, c, d;
} q_perm;

__attribute__((target(T512))) static inline q_perm q_perms(g4_dtype type) {
    const int bs = type == G4_Q4_0 ? 18 : 34;
    uint8_t ilo[64], ihi[64], ic[64], id[64];
    for (int i = 0; i < 64; i++) {
        ilo[i] = (uint8_t)(bs * (i / 16) + 2 + i % 16);          /* block i/16's byte i%16 */
        ihi[i] = (uint8_t)((bs * (i / 16) + 18 + i % 16) & 127); /* Q8_0: its byte 16 + i%16 */
        ic[i] = (uint8_t)(i >= 56 ? i - 56 : 0);                 /* Q8_0: block 3's last 8 bytes */
        id[i] = (uint8_t)(bs * (i / 8 % 4) + i % 2);             /* half i/2 (of 16): block i/8's d */
    }
    return (q_perm){_mm512_loadu_si512(ilo), _mm512_loadu_si512(ihi), _mm512_loadu_si512(ic), _mm512_loadu_si512(id)};
}

/* group g of a row (rem = the row's bytes from the group on): unsigned codes lo (elements 0-15 of the 4
 * blocks) and hi (16-31), and the scales as f16 into the halves of dh that m selects (bytes 2h, 2h + 1 of half h),
 * half h taking block h / 4 % 4's: all 16 halves give each block's in 4 lanes, m = 0x03030303 << 2g the lane
 * order's position g; past the row's end zeros with scale 0 */
__attribute__((target(T512), always_inline)) static inline void q_group(g4_dtype type, const q_perm *pm,
                                                                        const unsigned char *p, long rem, __m512i *lo,
                                                                        __m512i *hi, __m512i *dh, __mmask64 m) {
    const int q4 = type == G4_Q4_0;
    __m512i A, B, C = _mm512_setzero_si512();
    if (rem >= (q4 ? 72 : 136)) { /* a whole group: fixed masks */
        A = _mm512_loadu_si512(p);
        B = q4 ? _mm512_maskz_loadu_epi8(0xff, p + 64) : _mm512_loadu_si512(p + 64);
        if (!q4) C = _mm512_maskz_loadu_epi8(0xff, p + 128);
    } else {
        A = load_upto(p, rem), B = load_upto(p + 64, rem - 64);
        if (!q4) C = load_upto(p + 128, rem - 128);
    }
    const __m512i codes = _mm512_permutex2var_epi8(A, pm->lo, B);
    if (q4) {
        const __m512i lo4 = _mm512_set1_epi8(15);
        *lo = _mm512_and_si512(codes, lo4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), lo4);
    } else {
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
        *lo = _mm512_xor_si512(codes, x80);
        *hi = _mm512_xor_si512(
            _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(A, pm->hi, B), 0xff00000000000000ull, pm->c, C), x80);
    }
    *dh = q4 ? _mm512_mask_permutexvar_epi8(*dh, m, pm->d, A) /* (Q4_0's 4 scales are in its first 64 bytes) */
             : _mm512_mask_mov_epi8(*dh, m, _mm512_permutex2var_epi8(A, pm->d, B));
}
/* f16 halves to floats */
__attribute__((target(T512), always_inline)) static inline __m512 halves_ps(__m512i dh) {
    return _mm512_cvtph_ps(_mm512_castsi512_si256(dh));
}

/* permutex2var indices of 64 bytes from a group of 4 blocks of bs bytes (128 bytes loaded): lane i takes byte
 * off + i % 16 of block i / 16 (modulo 128) */
#define BLOCK_BYTE(bs, off, b, j) (uint8_t)(((bs) * (b) + (off) + (j)) & 127)
#define BLOCK_BYTES16(bs, off, b)                                                                                      \
    BLOCK_BYTE(bs, off, b, 0), BLOCK_BYTE(bs, off, b, 1), BLOCK_BYTE(bs, off, b, 2), BLOCK_BYTE(bs, off, b, 3),         \
        BLOCK_BYTE(bs, off, b, 4), BLOCK_BYTE(bs, off, b, 5), BLOCK_BYTE(bs, off, b, 6), BLOCK_BYTE(bs, off, b, 7),     \
        BLOCK_BYTE(bs, off, b, 8), BLOCK_BYTE(bs, off, b, 9), BLOCK_BYTE(bs, off, b, 10), BLOCK_BYTE(bs, off, b, 11),   \
        BLOCK_BYTE(bs, off, b, 12), BLOCK_BYTE(bs, off, b, 13), BLOCK_BYTE(bs, off, b, 14), BLOCK_BYTE(bs, off, b, 15)
#define BLOCK_BYTES(bs, off)                                                                                           \
    {BLOCK_BYTES16(bs, off, 0), BLOCK_BYTES16(bs, off, 1), BLOCK_BYTES16(bs, off, 2), BLOCK_BYTES16(bs, off, 3)}

/* The decoders of the types below (core/quant.h), each into the layout of q_group: unsigned codes lo (elements 0-15
 * of the group's 4 blocks of 32) and hi (16-31), and lane vectors of floats, 4 lanes a block. For the K-quants and
 * IQ4_XS, group g of a row is half g % 2 of super-block g / 2 (128 elements):
 * - Q4_K, Q5_K (affine: w = s1 * u + s2): s1 = d * sc_k, s2 = -dmin * m_k of the block's sub-block k;
 * - Q6_K (w = s * (u - 32) per sub-block of 16): s1 = d * sc of each block's elements 0-15, s2 of 16-31. */

/* lanes 4i .. 4i+3 = v[first + i] (i < 4): each block's value in its 4 lanes */
__attribute__((target(T512), always_inline)) static inline __m512 block_lanes(__m512 v, int first) {
    return _mm512_permutexvar_ps(
        _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), _mm512_set1_epi32(first)), v);
}

/* the per-16 scales of a half: lanes 4i .. 4i+3 of s1 = sc[first + 2i] (block i's elements 0-15), of s2 =
 * sc[first + 2i + 1] (16-31) */
__attribute__((target(T512), always_inline)) static inline void halves_lanes(__m512 sc, int first, __m512 *s1,
                                                                             __m512 *s2) {
    const __m512i e = _mm512_add_epi32(_mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0),
                                       _mm512_set1_epi32(first));
    *s1 = _mm512_permutexvar_ps(e, sc);
    *s2 = _mm512_permutexvar_ps(_mm512_add_epi32(e, _mm512_set1_epi32(1)), sc);
}

/* Q4_K / Q5_K: the low 4 bits of half a super-block's codes from its 64 bytes qs (block 0 the low nibbles of bytes
 * 0-31, 1 their high ones, 2 and 3 of bytes 32-63) */
__attribute__((target(T512), always_inline)) static inline void qk_nibbles(const unsigned char *qs, __m512i *lo,
                                                                           __m512i *hi) {
    const __m512i q = _mm512_loadu_si512(qs), m4 = _mm512_set1_epi8(15);
    const __m512i L = _mm512_and_si512(q, m4), N = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    /* 128-bit lanes: L = blocks 0 (elements 0-15, 16-31) and 2, N = blocks 1 and 3 */
    *lo = _mm512_permutex2var_epi64(L, _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), N);
    *hi = _mm512_permutex2var_epi64(L, _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15), N);
}

/* Q4_K / Q5_K: half h's s1 = d * sc and s2 = -dmin * m of super-block sb (sub-block 4h + i in lanes 4i .. 4i + 3),
 * each by one byte permute of the 8 scales and 8 mins (few shuffles: the shuffle port is the decode GEMV's
 * bottleneck; there both halves are taken at once, the decoding of the 12 bytes shared) */
__attribute__((target(T512), always_inline)) static inline void qk_scales(const unsigned char *sb, int h, __m512 *s1,
                                                                          __m512 *s2) {
    uint64_t sc8, mn8;
    g4_k_scales8(sb + 4, &sc8, &mn8);
    uint32_t dd;
    memcpy(&dd, sb, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)); /* d, dmin */
    const __m512 d = _mm512_broadcastss_ps(dm), mdmin = _mm512_sub_ps(_mm512_setzero_ps(),
                                                                      _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
    const __m512i v = _mm512_castsi128_si512(_mm_set_epi64x((long long)mn8, (long long)sc8));
    const __m512i is = _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                        _mm512_set1_epi32(4 * h));
    const __mmask64 byte0 = 0x1111111111111111ull; /* each lane's low byte: the scale, zero above */
    *s1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(byte0, is, v)), d);
    *s2 = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(byte0, _mm512_add_epi32(is, _mm512_set1_epi32(8)), v)), mdmin);
}

/* Q4_K / Q5_K half h of super-block sb: the codes (Q5_K: with their fifth bits, bit 4h + i of qh[l] for block i's
 * element l) */
__attribute__((target(T512), always_inline)) static inline void qk_codes(g4_dtype type, const unsigned char *sb, int h,
                                                                         __m512i *lo, __m512i *hi) {
    if (type == G4_Q4_K) {
        qk_nibbles(sb + 16 + 64 * h, lo, hi);
        return;
    }
    const __m512i shifts = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0,
                                            0, 0, 0, 0, 0, 0, 0),
                  sh = _mm512_add_epi16(shifts, _mm512_set1_epi16((short)(4 * h))), m1 = _mm512_set1_epi8(1);
    const __m128i qh0 = _mm_loadu_si128((const __m128i *)(sb + 16)), qh1 = _mm_loadu_si128((const __m128i *)(sb + 32));
    const __m512i blo = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(qh0), sh), m1),
                  bhi = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(qh1), sh), m1);
    qk_nibbles(sb + 48 + 64 * h, lo, hi);
    *lo = _mm512_or_si512(*lo, _mm512_slli_epi16(blo, 4));
    *hi = _mm512_or_si512(*hi, _mm512_slli_epi16(bhi, 4));
}

/* Q5_0 (w = d (u - 16), u 5-bit: offset mode, off 16): group g's 4 blocks of 22 bytes (fewer at the row's end:
 * loads masked, the missing blocks' scales 0), the fifth bits from each block's u32 as byte masks */
__attribute__((target(T512), always_inline)) static inline void q5_0_group(const unsigned char *row, size_t row_bytes,
                                                                           int g, __m512i *lo, __m512i *hi,
                                                                           __m512 *s1) {
    const unsigned char *p = row + (size_t)88 * (size_t)g;
    const long rem = (long)row_bytes - 88L * g;
    const __m512i A = load_upto(p, rem), B = load_upto(p + 64, rem - 64);
    /* ic: block i/16's nibble byte i%16; id: half i/2 (of 16) is block i/8's d */
    static const uint8_t ic[64] = BLOCK_BYTES(22, 6);
    static const uint8_t id[64] = {0,  1,  0,  1,  0,  1,  0,  1,  22, 23, 22, 23, 22, 23, 22, 23,
                                   44, 45, 44, 45, 44, 45, 44, 45, 66, 67, 66, 67, 66, 67, 66, 67,
                                   0,  1,  0,  1,  0,  1,  0,  1,  22, 23, 22, 23, 22, 23, 22, 23,
                                   44, 45, 44, 45, 44, 45, 44, 45, 66, 67, 66, 67, 66, 67, 66, 67};
    const __m512i codes = _mm512_permutex2var_epi8(A, _mm512_loadu_si512(ic), B), m4 = _mm512_set1_epi8(15);
    /* the fifth bits: block i's u32 (bytes 2-5) as bits 16i .. 16i + 15 of mlo (elements 0-15) and mhi (16-31) */
    static const uint8_t iqh[64] = {2, 3, 24, 25, 46, 47, 68, 69, 4, 5, 26, 27, 48, 49, 70, 71};
    const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi8(A, _mm512_loadu_si512(iqh), B));
    const uint64_t mlo = (uint64_t)_mm_cvtsi128_si64(qh), mhi = (uint64_t)_mm_extract_epi64(qh, 1);
    const __m512i c16 = _mm512_set1_epi8(16);
    *lo = _mm512_or_si512(_mm512_and_si512(codes, m4), _mm512_maskz_mov_epi8(mlo, c16));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(codes, 4), m4), _mm512_maskz_mov_epi8(mhi, c16));
    *s1 = halves_ps(_mm512_permutex2var_epi8(A, _mm512_loadu_si512(id), B));
}

/* IQ4_NL / IQ4_XS: the nibbles index llama.cpp's table (g4_iq4_values; CB4: its block's own); as unsigned codes
 * value + 128 (the offset mode of Q8_0, off 128), looked up per byte (vpshufb: the table in every 128-bit lane) */
__attribute__((target(T512), always_inline)) static inline __m512i iq4_codes(__m512i nibbles,
                                                                           const int8_t *values) {
    const __m128i t = _mm_xor_si128(_mm_loadu_si128((const __m128i *)values), _mm_set1_epi8((char)0x80));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), nibbles);
}

/* IQ4_XS (CB4: after its table) half h of a super-block (sub-blocks 4h .. 4h+3, each 16 bytes of qs: elements 0-15
 * the low nibbles, 16-31 the high ones, so the 64 bytes are already in the groups' order); s1 = d * (6-bit scale -
 * 32) */
/* IQ4_XS / CB4 half h of super-block sb: the table's values of its nibbles */
__attribute__((target(T512), always_inline)) static inline void iq4xs_codes(g4_dtype type, const unsigned char *sb,
                                                                            int h, __m512i *lo, __m512i *hi) {
    const int8_t *values = type == G4_CB4 ? (const int8_t *)(sb - 16) : g4_iq4_values;
    const __m512i q = _mm512_loadu_si512(sb + 8 + 64 * h), m4 = _mm512_set1_epi8(15);
    *lo = iq4_codes(_mm512_and_si512(q, m4), values);
    *hi = iq4_codes(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4), values);
}
/* IQ4_XS / CB4 half h: s1 = d * (6-bit scale - 32) of sub-blocks 4h .. 4h + 3 (the super-block's 8 computed alike
 * for both halves) */
__attribute__((target(T512), always_inline)) static inline void iq4xs_scales(const unsigned char *sb, int h,
                                                                             __m512 *s1) {
    const __m256 v = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)g4_iq4xs_scales8(sb))),
                                            _mm256_set1_epi32(32))),
        _mm256_set1_ps(_cvtsh_ss(block_d(sb))));
    *s1 = block_lanes(_mm512_castps256_ps512(v), 4 * h);
}

/* Q6_K half h of super-block sb: the codes (low 4 bits: ql[64h ..], block 0 the low nibbles of bytes 0-31, 1 of
 * 32-63, 2 and 3 their high nibbles; high 2 bits: qh[32h + l] >> 2i of block i, element l) */
__attribute__((target(T512), always_inline)) static inline void q6k_codes(const unsigned char *sb, int h, __m512i *lo,
                                                                          __m512i *hi) {
    const __m512i q = _mm512_loadu_si512(sb + 64 * h), m4 = _mm512_set1_epi8(15);
    const __m512i L = _mm512_and_si512(q, m4), N = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    const __m128i qh0 = _mm_loadu_si128((const __m128i *)(sb + 128 + 32 * h)),
                  qh1 = _mm_loadu_si128((const __m128i *)(sb + 144 + 32 * h));
    const __m512i shifts = _mm512_set_epi16(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 0,
                                            0, 0, 0, 0, 0, 0, 0),
                  m3 = _mm512_set1_epi8(3);
    const __m512i hlo = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(qh0), shifts), m3),
                  hhi = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(qh1), shifts), m3);
    /* 128-bit lanes: L = blocks 0 (elements 0-15, 16-31) and 1, N = blocks 2 and 3 */
    *lo = _mm512_or_si512(_mm512_permutex2var_epi64(L, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), N),
                          _mm512_slli_epi16(hlo, 4));
    *hi = _mm512_or_si512(_mm512_permutex2var_epi64(L, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), N),
                          _mm512_slli_epi16(hhi, 4));
}

/* Q6_K half h of super-block sb: s1 = d * sc of each block's elements 0-15, s2 of 16-31 (from the super-block's 16
 * scales times d, the same for both halves: the decode GEMV computes it once) */
__attribute__((target(T512), always_inline)) static inline __m512 q6k_scale16(const unsigned char *sb) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sb + 192)))),
                         _mm512_set1_ps(_cvtsh_ss(block_d(sb + 208))));
}
__attribute__((target(T512), always_inline)) static inline void q6k_scales(const unsigned char *sb, int h, __m512 *s1,
                                                                           __m512 *s2) {
    halves_lanes(q6k_scale16(sb), 8 * h, s1, s2);
}


/* CB4_16 half h of a block (162 bytes: values[16], d, scales[16], qs[128] in IQ4_XS's order): the codes as IQ4's
 * (value + 128, the halves mode's offset 128), s1 / s2 the scales of each block's elements 0-15 / 16-31 as Q6_K's */
__attribute__((target(T512), always_inline)) static inline void cb4_16_group(const unsigned char *row, int g,
                                                                             __m512i *lo, __m512i *hi, __m512 *s1,
                                                                             __m512 *s2) {
    const unsigned char *sb = row + (size_t)162 * (size_t)(g / 2);
    const int h = g % 2;
    const __m512i q = _mm512_loadu_si512(sb + 34 + 64 * h), m4 = _mm512_set1_epi8(15);
    *lo = iq4_codes(_mm512_and_si512(q, m4), (const int8_t *)sb);
    *hi = iq4_codes(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4), (const int8_t *)sb);
    const __m512 sc = _mm512_mul_ps(
        _mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 18 + 8 * h))))),
        _mm512_set1_ps(_cvtsh_ss(block_d(sb + 16))));
    halves_lanes(sc, 0, s1, s2);
}

/* Q3_K half h of a super-block (110 bytes: hmask[32], qs[64], scales[12], d; w = d (sc - 32) (u - 4) per 16): block
 * i's element l < 16 has bits 2i of qs[32h + l] with bit 4h + i of hmask[l] above them, its element 16 + l those of
 * qs[32h + 16 + l] and hmask[16 + l]; as codes of the halves mode (offset 32): u + 28; s1, s2 Q6_K's */
/* Q3_K half h of super-block sb: the codes u + 28 */
__attribute__((target(T512), always_inline)) static inline void q3k_codes(const unsigned char *sb, int h, __m512i *lo,
                                                                          __m512i *hi) {
    const __m512i sh = _mm512_set_epi16(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0,
                                        0, 0, 0, 0, 0),
                  hs = _mm512_add_epi16(_mm512_srli_epi16(sh, 1), _mm512_set1_epi16((short)(4 * h)));
    const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), c28 = _mm512_set1_epi8(28);
    for (int e = 0; e < 2; e++) {
        const __m512i q = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(sb + 32 + 32 * h + 16 * e))),
                      m = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(sb + 16 * e)));
        const __m512i u = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(q, sh), m3),
                                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(m, hs), one), 2));
        *(e ? hi : lo) = _mm512_add_epi8(u, c28);
    }
}
/* Q3_K half h: s1 / s2 = d * (scale - 32) of each block's elements 0-15 / 16-31 (the super-block's 16 computed alike
 * for both halves) */
__attribute__((target(T512), always_inline)) static inline __m512 q3k_scale16(const unsigned char *sb) {
    uint64_t sl, sh8;
    g4_q3k_scales16(sb + 96, &sl, &sh8);
    return _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_set_epi64x((long long)sh8, (long long)sl)),
                                            _mm512_set1_epi32(32))),
        _mm512_set1_ps(_cvtsh_ss(block_d(sb + 108))));
}
__attribute__((target(T512), always_inline)) static inline void q3k_scales(const unsigned char *sb, int h, __m512 *s1,
                                                                           __m512 *s2) {
    halves_lanes(q3k_scale16(sb), 8 * h, s1, s2);
}

/* Q2_K half h of a super-block (84 bytes: scales[16], qs[64], d, dmin; w = d (sc & 15) u - dmin (sc >> 4) per 16,
 * llama.cpp's dequantize_row_q2_K): block i's element l < 16 is bits 2i of qs[32h + l], its element 16 + l those of
 * qs[32h + 16 + l]; the scale bytes of its elements 0-15 and 16-31 are scales[8h + 2i] and [8h + 2i + 1]. For the
 * per-16 mode (G4_Q8_MIN16): the codes u as they are; s1 holds the group's 16 factors, lanes 0-3 / 4-7 the scales
 * d sc of blocks 0-3's elements 0-15 / 16-31, lanes 8-11 / 12-15 their mins -dmin m (lanes_scales spreads them); s2 zero */
__attribute__((target(T512), always_inline)) static inline void q2k_group(const unsigned char *row, int g, __m512i *lo,
                                                                          __m512i *hi, __m512 *s1, __m512 *s2) {
    const unsigned char *sb = row + (size_t)84 * (size_t)(g / 2);
    const int h = g % 2;
    const __m512i sh = _mm512_set_epi16(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0,
                                        0, 0, 0, 0, 0),
                  m3 = _mm512_set1_epi8(3);
    for (int e = 0; e < 2; e++) {
        const __m512i q = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(sb + 16 + 32 * h + 16 * e)));
        *(e ? hi : lo) = _mm512_and_si512(_mm512_srlv_epi16(q, sh), m3);
    }
    const __m256i v = _mm256_permutevar8x32_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sb + 8 * h))),
                                                  _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    const __m256 sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))),
                                    _mm256_set1_ps(_cvtsh_ss(block_d(sb + 80)))),
                 mn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)),
                                    _mm256_set1_ps(-_cvtsh_ss(block_d(sb + 82))));
    *s1 = _mm512_insertf32x8(_mm512_castps256_ps512(sc), mn, 1);
    *s2 = _mm512_setzero_ps();
}

/* AF4 / AF8 (core/tensor.h: blocks of 32 of 24 / 40 bytes, an f32 scale and bias, then the codes; affine: s1 the
 * scales, s2 the biases): group g's 4 blocks (fewer at the row's end: loads masked, the missing blocks zeros) */
__attribute__((target(T512), always_inline)) static inline void af_group(g4_dtype type, const unsigned char *row,
                                                                         size_t row_bytes, int g, __m512i *lo,
                                                                         __m512i *hi, __m512 *s1, __m512 *s2) {
    const int eight = type == G4_AF8;
    const long gb = g4_q8_group_bytes(type), rem = (long)row_bytes - gb * g;
    const unsigned char *p = row + (size_t)gb * (size_t)g;
    const __m512i A = load_upto(p, rem), B = load_upto(p + 64, rem - 64);
    /* block i/16's code byte i%16 (AF8: and 16 + i%16; block 3's from C, the indices' low 6 bits) */
    static const uint8_t i4[64] = BLOCK_BYTES(24, 8), i8lo[64] = BLOCK_BYTES(40, 8), i8hi[64] = BLOCK_BYTES(40, 24);
    if (eight) {
        const __m512i C = load_upto(p + 128, rem - 128), il = _mm512_loadu_si512(i8lo), ih = _mm512_loadu_si512(i8hi);
        const __mmask64 b3 = 0xffff000000000000ull;
        *lo = _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(A, il, B), b3, il, C);
        *hi = _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(A, ih, B), b3, ih, C);
    } else {
        const __m512i codes = _mm512_permutex2var_epi8(A, _mm512_loadu_si512(i4), B), m4 = _mm512_set1_epi8(15);
        *lo = _mm512_and_si512(codes, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
    }
    /* block i's scale is float bs / 4 * i of the group, its bias the next: lanes 4i .. 4i + 3 */
    const __m512i is = _mm512_mullo_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
                                                                             3, 2, 1, 0), 2),
                                          _mm512_set1_epi32(eight ? 10 : 6));
    *s1 = _mm512_permutex2var_ps(_mm512_castsi512_ps(A), is, _mm512_castsi512_ps(B));
    *s2 = _mm512_permutex2var_ps(_mm512_castsi512_ps(A), _mm512_add_epi32(is, _mm512_set1_epi32(1)),
                                 _mm512_castsi512_ps(B));
}

/* The super-block types read by halves (group g: half g % 2 of super-block g / 2), codes and scales apart so that
 * the decode GEMV decodes a super-block's scales once for both: Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS, CB4 */
static inline int sb_halves(g4_dtype t) {
    return t == G4_Q4_K || t == G4_Q5_K || t == G4_Q6_K || t == G4_Q3_K || t == G4_IQ4_XS || t == G4_CB4;
}
/* super-block p of a row (CB4: past its table) */
static inline const unsigned char *sb_at(g4_dtype type, const unsigned char *row, int p) {
    return row + (size_t)(2 * g4_q8_group_bytes(type)) * (size_t)p + (type == G4_CB4 ? 16 : 0);
}
__attribute__((target(T512), always_inline)) static inline void sb_codes(g4_dtype type, const unsigned char *sb, int h,
                                                                         __m512i *lo, __m512i *hi) {
    if (type == G4_Q6_K)
        q6k_codes(sb, h, lo, hi);
    else if (type == G4_Q3_K)
        q3k_codes(sb, h, lo, hi);
    else if (type == G4_IQ4_XS || type == G4_CB4)
        iq4xs_codes(type, sb, h, lo, hi);
    else
        qk_codes(type, sb, h, lo, hi);
}
__attribute__((target(T512), always_inline)) static inline void sb_scales(g4_dtype type, const unsigned char *sb, int h,
                                                                          __m512 *s1, __m512 *s2) {
    if (type == G4_Q6_K) {
        q6k_scales(sb, h, s1, s2);
    } else if (type == G4_Q3_K) {
        q3k_scales(sb, h, s1, s2);
    } else if (type == G4_IQ4_XS || type == G4_CB4) {
        iq4xs_scales(sb, h, s1);
        *s2 = _mm512_setzero_ps();
    } else {
        qk_scales(sb, h, s1, s2);
    }
}

/* The scale vectors of super-group s (super-blocks 2s and 2s + 1; nsb of them in the row, a missing one zeros) of a
 * super-block type in lane order, for both super-blocks at once: lane 4i + g is block i of half g % 2 of super-block
 * g / 2, i.e. its sub-block 4 (g % 2) + i (Q4_K, Q5_K: s1 its scale d sc, s2 its min -dmin m; IQ4_XS, CB4: s1
 * d (sc - 32), s2 zero) or its halves' sub-blocks of 16, 8 (g % 2) + 2i and + 1 (Q6_K, Q3_K: s1, s2). The values
 * of sb_scales (the same multiply of the same operands), without a half's permutes and the blends of lanes_scales. */
__attribute__((target(T512), always_inline)) static inline void sg_scales(g4_dtype type, const unsigned char *row,
                                                                          int s, int nsb, __m512 *s1, __m512 *s2) {
    const unsigned char *b[2] = {sb_at(type, row, 2 * s), sb_at(type, row, 2 * s + (nsb > 1))};
    const __m512i blk = _mm512_set_epi32(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0), /* lane 4i + g: g */
        sub = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);            /* i */
    const __m512i half = _mm512_and_si512(blk, _mm512_set1_epi32(1)), sbi = _mm512_srli_epi32(blk, 1);
    if (type == G4_Q6_K || type == G4_Q3_K) { /* 16 scales a super-block: lane 4i + g takes 16 (g / 2) + 8 (g % 2) + 2i */
        __m512 v[2];
        for (int k = 0; k < 2; k++)
            v[k] = k < nsb ? (type == G4_Q6_K ? q6k_scale16(b[k]) : q3k_scale16(b[k])) : _mm512_setzero_ps();
        const __m512i idx = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(sbi, 4), _mm512_slli_epi32(half, 3)),
                                             _mm512_slli_epi32(sub, 1));
        *s1 = _mm512_permutex2var_ps(v[0], idx, v[1]);
        *s2 = _mm512_permutex2var_ps(v[0], _mm512_add_epi32(idx, _mm512_set1_epi32(1)), v[1]);
        return;
    }
    /* 8 sub-blocks a super-block: lane j of the 16 below is super-block j / 8's sub-block j % 8; lane 4i + g takes
     * 8 (g / 2) + 4 (g % 2) + i */
    const __m512i idx = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(sbi, 3), _mm512_slli_epi32(half, 2)), sub);
    uint64_t sc8[2] = {0, 0}, mn8[2] = {0, 0};
    float d[2] = {0, 0}, dmin[2] = {0, 0};
    for (int k = 0; k < nsb; k++) {
        if (type == G4_IQ4_XS || type == G4_CB4) {
            sc8[k] = g4_iq4xs_scales8(b[k]);
            d[k] = _cvtsh_ss(block_d(b[k]));
        } else {
            g4_k_scales8(b[k] + 4, &sc8[k], &mn8[k]);
            d[k] = _cvtsh_ss(block_d(b[k])), dmin[k] = _cvtsh_ss(block_d(b[k] + 2));
        }
    }
    const __mmask16 second = 0xff00;
    const __m512 dv = _mm512_mask_blend_ps(second, _mm512_set1_ps(d[0]), _mm512_set1_ps(d[1]));
    __m512i sc = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)sc8[1], (long long)sc8[0]));
    if (type == G4_IQ4_XS || type == G4_CB4) {
        sc = _mm512_sub_epi32(sc, _mm512_set1_epi32(32));
        if (nsb < 2) sc = _mm512_maskz_mov_epi32((__mmask16)~second, sc); /* (a missing super-block: zeros) */
        *s1 = _mm512_permutexvar_ps(idx, _mm512_mul_ps(_mm512_cvtepi32_ps(sc), dv));
        *s2 = _mm512_setzero_ps();
        return;
    }
    const __m512 mdmin = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mask_blend_ps(second, _mm512_set1_ps(dmin[0]),
                                                                                  _mm512_set1_ps(dmin[1])));
    const __m512i mn = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)mn8[1], (long long)mn8[0]));
    *s1 = _mm512_permutexvar_ps(idx, _mm512_mul_ps(_mm512_cvtepi32_ps(sc), dv));
    *s2 = _mm512_permutexvar_ps(idx, _mm512_mul_ps(_mm512_cvtepi32_ps(mn), mdmin));
}

/* Group g of a row of any type q_pack / q_gemv read: the unsigned codes lo and hi, and s1 (the scales) and s2
 * (Q4_K, Q5_K: the mins; AF4, AF8: the biases; Q6_K, Q3_K: the second half's scales; Q4_0 / Q5_0 / Q8_0: zero,
 * their offset is in the activations) */
__attribute__((target(T512), always_inline)) static inline void qw_group(g4_dtype type, const q_perm *pm,
                                                                         const unsigned char *row, size_t row_bytes,
                                                                         int g, __m512i *lo, __m512i *hi, __m512 *s1,
                                                                         __m512 *s2) {
    if (sb_halves(type)) {
        const unsigned char *sb = sb_at(type, row, g / 2);
        sb_codes(type, sb, g % 2, lo, hi);
        sb_scales(type, sb, g % 2, s1, s2);
    } else if (type == G4_Q5_0) {
        q5_0_group(row, row_bytes, g, lo, hi, s1);
        *s2 = _mm512_setzero_ps();
    } else if (type == G4_IQ4_NL || type == G4_MXF4) { /* Q4_0's blocks with the table's values */
        const int8_t *values = type == G4_MXF4 ? g4_fp4_values : g4_iq4_values;
        __m512i dh = _mm512_setzero_si512();
        q_group(G4_Q4_0, pm, row + 72L * g, (long)row_bytes - 72L * g, lo, hi, &dh, ~0ull);
        *lo = iq4_codes(*lo, values), *hi = iq4_codes(*hi, values), *s1 = halves_ps(dh);
        *s2 = _mm512_setzero_ps();
    } else if (type == G4_AF4 || type == G4_AF8) {
        af_group(type, row, row_bytes, g, lo, hi, s1, s2);
    } else if (type == G4_Q2_K) {
        q2k_group(row, g, lo, hi, s1, s2);
    } else if (type == G4_CB4_16) {
        cb4_16_group(row, g, lo, hi, s1, s2);
    } else {
        const long gb = type == G4_Q4_0 ? 72 : 136;
        __m512i dh = _mm512_setzero_si512();
        q_group(type, pm, row + gb * g, (long)row_bytes - gb * g, lo, hi, &dh, ~0ull);
        *s1 = halves_ps(dh);
        *s2 = _mm512_setzero_ps();
    }
}


/* One activation row into groups (g4_cpu_kernels.q8_group_row): per block of 32, d = max|x| / 127 and
 * q = x * (1/d) rounded to nearest even (vcvtps2dq, as lrintf), the codes and the scales as g4_cpu_q8_quantize lays
 * them out. */
__attribute__((target(T512))) static void q8_group_row_avx512(const float *x, size_t in, unsigned char *qg,
                                                             size_t ng) {
    const size_t nb = in / 32;
    if (nb % 4) memset(qg + (nb / 4) * G4_Q8_GROUP, 0, G4_Q8_GROUP); /* blocks past the row: zeros */
    if (ng > (nb + 3) / 4) memset(qg + (nb + 3) / 4 * G4_Q8_GROUP, 0, (ng - (nb + 3) / 4) * G4_Q8_GROUP);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (size_t b = 0; b < nb; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_and_ps(x1, abs_mask)));
        const float db = amax / 127.0f, id = db ? 1.0f / db : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
        unsigned char *gp = qg + (b / 4) * G4_Q8_GROUP + 16 * (b % 4);
        _mm_storeu_si128((__m128i *)gp, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(gp + 64), _mm512_cvtepi32_epi8(q1));
        _mm_storeu_ps((float *)(gp + 128), _mm_set1_ps(db));
    }
}

/* Lane order (q_gemm; q_pack writes it, q_gemv ends in it): a super-group of 4 groups (16 blocks, 512 elements) with
 * one block in each 32-bit lane, so that a block's 32 products add up in its lane (8 vpdpbusd) before the float
 * steps: one conversion, one scale product and one fused add per 16 blocks (per 4 in a group's layout, where each
 * block's products sit in 4 lanes; those float steps bound q_gemm at 2 vector operations a cycle). Lane 4i + g
 * (128-bit lane i, position g) holds block 4g + i of the super-group, i.e. block i of group g, whose values a
 * group's layout holds in 128-bit lane i: moving them is a transpose within each 128-bit lane. Operand k < 4 holds
 * in each lane its block's codes 4k .. 4k + 3, operand 4 + k its codes 16 + 4k .. 16 + 4k + 3.
 * - activations (g4_q8_rows.ql, G4_Q8_LANES bytes a super-group): the 8 operands of int8 codes, 16 int32 a, 16 int32
 *   b, 16 floats dx (the block scales). OFFSET: a = -off x the block's code sum; AFFINE: a = the code sum; HALVES:
 *   a, b = -hoff x the code sums of elements 0-15 and 16-31; MIN16: a, b = those two sums.
 * - packed weights (q_pack, G4_QW_LANES bytes a super-group): the 8 operands of unsigned codes, then 4 x 16 floats
 *   s1 .. s4: s1 and s2 of g4_q8_mode per block; MIN16: the scales of elements 0-15 and 16-31, then their mins.
 * Groups past the row are zeros. q_gemv decodes rows as stored, takes each group's dot products in its 4-lane
 * pieces (element order, g4_q8_rows.qg) and adds them into lane order (lanes_sum4): the same integers, then the
 * same float steps (lanes_step), so the same bits as q_gemm. */

/* in place: v[k] position g = v[g] position k, within each 128-bit lane */
__attribute__((target(T512), always_inline)) static inline void lanes_transpose(__m512i *v) {
    const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]),
                  t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* position g of each 128-bit lane = the sum of the 4 positions of p[g] there (a group's 4-lane pieces of a block
 * into the block's lane) */
__attribute__((target(T512), always_inline)) static inline __m512i lanes_sum4(const __m512i *p) {
    const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1])),
                  b = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* position g of each 128-bit lane from v[g] (a group's per-block values, alike in the block's 4 lanes) */
__attribute__((target(T512), always_inline)) static inline __m512 lanes_pick(const __m512 *v) {
    __m512 r = _mm512_mask_blend_ps(0x2222, v[0], v[1]);
    r = _mm512_mask_blend_ps(0x4444, r, v[2]);
    return _mm512_mask_blend_ps(0x8888, r, v[3]);
}

/* the 4 (MIN16) or 2 scale vectors of a super-group in lane order from its groups' s1, s2 (qw_group) */
__attribute__((target(T512), always_inline)) static inline void lanes_scales(const __m512 *s1, const __m512 *s2,
                                                                             const int mode, __m512 *sc) {
    if (mode == G4_Q8_MIN16) { /* a group's s1: the scales of blocks 0-3's elements 0-15, 16-31, then the mins */
        for (int f = 0; f < 4; f++) {
            const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                                 _mm512_set1_epi32(4 * f));
            __m512 v[4];
            for (int g = 0; g < 4; g++) v[g] = _mm512_permutexvar_ps(idx, s1[g]);
            sc[f] = lanes_pick(v);
        }
        return;
    }
    sc[0] = lanes_pick(s1);
    sc[1] = lanes_pick(s2);
}

/* a token's super-group, loaded once for every row it meets: a and b, and as floats where the mode multiplies
 * them (AFFINE: a; MIN16: a and b), the scales dx */
typedef struct {
    __m512i a, b;
    __m512 fa, fb, dx;
} q_xlanes;

__attribute__((target(T512), always_inline)) static inline q_xlanes lanes_xload(const unsigned char *xl,
                                                                               const int mode) {
    q_xlanes v;
    v.a = _mm512_loadu_si512(xl + 512);
    v.b = _mm512_loadu_si512(xl + 576);
    v.dx = _mm512_loadu_ps(xl + 640);
    v.fa = v.fb = _mm512_setzero_ps();
    if (mode == G4_Q8_AFFINE || mode == G4_Q8_MIN16) v.fa = _mm512_cvtepi32_ps(v.a);
    if (mode == G4_Q8_MIN16) v.fb = _mm512_cvtepi32_ps(v.b);
    return v;
}

/* one (row, token) step of a super-group, the same in q_gemm and q_gemv, from exact integer sums in lane order:
 * s the whole block's (OFFSET: from a, so the offset term is in), or (HALVES, MIN16) s and sh those of elements 0-15
 * and 16-31 (HALVES: from a and b); sc the row's scale vectors:
 * - offset (Q4_0, Q5_0, Q8_0, IQ4, CB4, MXF4): one multiply-add by s1 x dx;
 * - affine (Q4_K, Q5_K, AF4, AF8): s1 x dx times s, plus s2 x dx times the activations' code sums;
 * - halves (Q6_K, Q3_K, CB4_16): each half times its own scale x dx;
 * - per 16 (Q2_K): each half times its scale plus its min times the half's activation code sums, all times dx. */
__attribute__((target(T512), always_inline)) static inline __m512 lanes_step(__m512 acc, __m512i s, __m512i sh,
                                                                             const __m512 *sc, const q_xlanes *x,
                                                                             const int mode) {
    if (mode == G4_Q8_MIN16) {
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), sc[0]);
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), sc[1], t);
        t = _mm512_fmadd_ps(x->fa, sc[2], t);
        t = _mm512_fmadd_ps(x->fb, sc[3], t);
        return _mm512_fmadd_ps(t, x->dx, acc);
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc[0], x->dx), acc);
    if (mode == G4_Q8_HALVES) return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), _mm512_mul_ps(sc[1], x->dx), acc);
    if (mode == G4_Q8_AFFINE) return _mm512_fmadd_ps(x->fa, _mm512_mul_ps(sc[1], x->dx), acc);
    return acc;
}
static inline int lanes_split(int mode) { return mode == G4_Q8_HALVES || mode == G4_Q8_MIN16; }

/* One token's grouped row (qg, ng groups) in lane order (g4_cpu_kernels.q8_lanes_row) */
__attribute__((target(T512))) static void q8_lanes_row_avx512(const unsigned char *qg, size_t ng, g4_dtype type,
                                                             unsigned char *ql) {
    const int mode = g4_q8_mode(type), off = g4_q8_off(type), hoff = g4_q8_half_off(type);
    const __m512i one = _mm512_set1_epi8(1), z = _mm512_setzero_si512();
    for (size_t s = 0; s < (ng + 3) / 4; s++, ql += G4_Q8_LANES) {
        __m512i lo[4], hi[4], plo[4], phi[4];
        __m512 dx[4];
        for (size_t g = 0; g < 4; g++) {
            const unsigned char *p = qg + (4 * s + g) * G4_Q8_GROUP;
            const int in = 4 * s + g < ng;
            lo[g] = in ? _mm512_loadu_si512(p) : z;
            hi[g] = in ? _mm512_loadu_si512(p + 64) : z;
            dx[g] = in ? _mm512_loadu_ps(p + 128) : _mm512_setzero_ps();
            plo[g] = _mm512_dpbusd_epi32(z, one, lo[g]);
            phi[g] = _mm512_dpbusd_epi32(z, one, hi[g]);
        }
        const __m512i slo = lanes_sum4(plo), shi = lanes_sum4(phi);
        __m512i a = _mm512_add_epi32(slo, shi), b = z;
        if (mode == G4_Q8_OFFSET) a = _mm512_mullo_epi32(a, _mm512_set1_epi32(-off));
        if (mode == G4_Q8_HALVES)
            a = _mm512_mullo_epi32(slo, _mm512_set1_epi32(-hoff)), b = _mm512_mullo_epi32(shi, _mm512_set1_epi32(-hoff));
        if (mode == G4_Q8_MIN16) a = slo, b = shi;
        lanes_transpose(lo);
        lanes_transpose(hi);
        for (int k = 0; k < 4; k++) {
            _mm512_storeu_si512(ql + 64 * k, lo[k]);
            _mm512_storeu_si512(ql + 256 + 64 * k, hi[k]);
        }
        _mm512_storeu_si512(ql + 512, a);
        _mm512_storeu_si512(ql + 576, b);
        _mm512_storeu_ps(ql + 640, lanes_pick(dx));
    }
}

__attribute__((target(T512), always_inline)) static inline void q_pack_typed(g4_dtype type, const unsigned char *w,
                                                                             size_t row_bytes, int nr, int nb,
                                                                             unsigned char *dst) {
    const long gb = g4_q8_group_bytes(type);
    const int ng = (nb + 3) / 4, nsg = (ng + 3) / 4, mode = g4_q8_mode(type);
    const q_perm pm = q_perms(type == G4_Q8_0 ? G4_Q8_0 : G4_Q4_0);
    for (int r = 0; r < nr; r++) {
        const unsigned char *row = w + (size_t)r * row_bytes;
        unsigned char *o = dst + (size_t)r * nsg * G4_QW_LANES;
        for (int s = 0; s < nsg; s++, o += G4_QW_LANES) {
            __m512i lo[4], hi[4];
            __m512 s1[4], s2[4], sc[4];
            for (int g = 0; g < 4; g++) {
                lo[g] = hi[g] = _mm512_setzero_si512();
                s1[g] = s2[g] = _mm512_setzero_ps();
                if (4 * s + g >= ng) continue;
                for (long off = 0; off < gb; off += 64)
                    _mm_prefetch((const char *)row + (size_t)gb * (4 * s + g) + off + PACK_PREFETCH, _MM_HINT_T0);
                qw_group(type, &pm, row, row_bytes, 4 * s + g, &lo[g], &hi[g], &s1[g], &s2[g]);
            }
            lanes_transpose(lo);
            lanes_transpose(hi);
            if (sb_halves(type))
                sg_scales(type, row, s, (ng - 4 * s) / 2 < 2 ? (ng - 4 * s) / 2 : 2, &sc[0], &sc[1]);
            else
                lanes_scales(s1, s2, mode, sc);
            for (int k = 0; k < 4; k++) {
                _mm512_storeu_si512(o + 64 * k, lo[k]);
                _mm512_storeu_si512(o + 256 + 64 * k, hi[k]);
            }
            for (int f = 0; f < (mode == G4_Q8_MIN16 ? 4 : 2); f++) _mm512_storeu_ps(o + 512 + 64 * f, sc[f]);
        }
    }
}

__attribute__((target(T512))) static void q_pack_avx512(g4_dtype type, const unsigned char *w, size_t row_bytes,
                                                       int nr, int nb, unsigned char *dst) {
#define CALL(qt) q_pack_typed(qt, w, row_bytes, nr, nb, dst)
    G4_Q8_SWITCH(type, CALL) /* (each type's decoding inlined) */
#undef CALL
}

/* decode: rows as stored times one activation row, each group unpacked in registers and its dot products taken in
 * element order (qg), then added into lane order for the same float steps as q_gemm: the same bits. GEMV_ROWS rows
 * at once (far apart) share each super-group's activation loads and keep independent chains in flight. */

/* super-group s of NR rows, of which NG groups are in the row (the rest zeros, as q_pack writes them) */
__attribute__((target(T512), always_inline)) static inline void gemv_super(g4_dtype type, const q_perm *pm,
                                                                           const unsigned char *w, size_t stride,
                                                                           size_t row_bytes, int s,
                                                                           const unsigned char *xg,
                                                                           const unsigned char *xl, __m512 *acc,
                                                                           const int NR, const int NG) {
    const long gb = g4_q8_group_bytes(type);
    const int mode = g4_q8_mode(type), split = lanes_split(mode),
              lane_scales = type == G4_Q4_0 || type == G4_Q8_0 || type == G4_IQ4_NL || type == G4_MXF4;
    const __m512i z = _mm512_setzero_si512();
    const q_xlanes x = lanes_xload(xl + (size_t)s * G4_Q8_LANES, mode);
    const unsigned char *xs = xg + (size_t)(4 * s) * G4_Q8_GROUP;
#pragma GCC unroll 1 /* (the rows one after another: a quarter of the code, the same speed) */
    for (int r = 0; r < NR; r++) {
        const unsigned char *row = w + (size_t)r * stride;
        for (long off = 0; off < NG * gb; off += 64)
            _mm_prefetch((const char *)row + (size_t)(4 * gb) * (size_t)s + off + GEMV_PREFETCH, _MM_HINT_T0);
        __m512i plo[4], phi[4], lo, hi;
        __m512 s1[4], s2[4], sc[4];
        for (int g = NG; g < 4; g++) plo[g] = phi[g] = z, s1[g] = s2[g] = _mm512_setzero_ps();
        if (sb_halves(type)) { /* a super-block (two groups) at a time, the scales of both at once */
            sg_scales(type, row, s, NG / 2, &sc[0], &sc[1]);
            for (int g = 0; g < NG; g += 2) {
                const unsigned char *sb = sb_at(type, row, 2 * s + g / 2);
                for (int h = 0; h < 2; h++) {
                    const unsigned char *xp = xs + (size_t)(g + h) * G4_Q8_GROUP;
                    sb_codes(type, sb, h, &lo, &hi);
                    plo[g + h] = _mm512_dpbusd_epi32(z, lo, _mm512_loadu_si512(xp));
                    phi[g + h] = _mm512_dpbusd_epi32(split ? z : plo[g + h], hi, _mm512_loadu_si512(xp + 64));
                }
            }
        } else if (lane_scales) { /* Q4_0's and Q8_0's blocks (IQ4_NL, MXF4: Q4_0's with a table): each group's f16
                                   * scales into their lanes of one vector */
            const g4_dtype qt = type == G4_Q8_0 ? G4_Q8_0 : G4_Q4_0;
            __m512i dh = z;
            for (int g = 0; g < NG; g++) {
                const unsigned char *xp = xs + (size_t)g * G4_Q8_GROUP;
                const long at = gb * (4 * s + g);
                q_group(qt, pm, row + at, (long)row_bytes - at, &lo, &hi, &dh, 0x03030303ull << (2 * g));
                if (type == G4_IQ4_NL || type == G4_MXF4) {
                    const int8_t *values = type == G4_MXF4 ? g4_fp4_values : g4_iq4_values;
                    lo = iq4_codes(lo, values), hi = iq4_codes(hi, values);
                }
                plo[g] = _mm512_dpbusd_epi32(z, lo, _mm512_loadu_si512(xp));
                phi[g] = _mm512_dpbusd_epi32(plo[g], hi, _mm512_loadu_si512(xp + 64));
            }
            sc[0] = halves_ps(dh);
        } else {
            for (int g = 0; g < NG; g++) {
                const unsigned char *xp = xs + (size_t)g * G4_Q8_GROUP;
                qw_group(type, pm, row, row_bytes, 4 * s + g, &lo, &hi, &s1[g], &s2[g]);
                plo[g] = _mm512_dpbusd_epi32(z, lo, _mm512_loadu_si512(xp));
                phi[g] = _mm512_dpbusd_epi32(split ? z : plo[g], hi, _mm512_loadu_si512(xp + 64));
            }
        }
        if (!lane_scales && !sb_halves(type)) lanes_scales(s1, s2, mode, sc);
        __m512i sum = lanes_sum4(phi), sumh = z; /* (not split: phi holds the whole group's) */
        if (split) sumh = sum, sum = lanes_sum4(plo);
        if (mode == G4_Q8_OFFSET || mode == G4_Q8_HALVES) sum = _mm512_add_epi32(sum, x.a);
        if (mode == G4_Q8_HALVES) sumh = _mm512_add_epi32(sumh, x.b);
        acc[r] = lanes_step(acc[r], sum, sumh, sc, &x, mode);
    }
}

__attribute__((target(T512), always_inline)) static inline void q_gemv_fixed(g4_dtype type, const q_perm *pm,
                                                                             const unsigned char *w, size_t stride,
                                                                             size_t row_bytes, int ng,
                                                                             const unsigned char *xg,
                                                                             const unsigned char *xl, float *y,
                                                                             size_t ystride, const int NR) {
    __m512 acc[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    int s = 0;
    for (; 4 * s + 4 <= ng; s++) gemv_super(type, pm, w, stride, row_bytes, s, xg, xl, acc, NR, 4);
    if (ng % 4) /* (the last, partial super-group: its group count not a constant, one copy of the code) */
        gemv_super(type, pm, w, stride, row_bytes, s, xg, xl, acc, NR, ng % 4);
    for (int r = 0; r < NR; r++) y[(size_t)r * ystride] = _mm512_reduce_add_ps(acc[r]);
}

__attribute__((target(T512), always_inline)) static inline void q_gemv_typed(g4_dtype type, const unsigned char *w,
                                                                             size_t row_bytes, int nr, int nb,
                                                                             const g4_q8_rows *a, int t, float *y) {
    const int ng = (nb + 3) / 4, q = nr / GEMV_ROWS;
    const q_perm pm = q_perms(type == G4_Q8_0 ? G4_Q8_0 : G4_Q4_0);
    const unsigned char *xg = a->qg + (size_t)t * a->ng * G4_Q8_GROUP,
                        *xl = a->ql + (size_t)t * ((a->ng + 3) / 4) * G4_Q8_LANES;
    for (int i = 0; i < q; i++)
        q_gemv_fixed(type, &pm, w + (size_t)i * row_bytes, (size_t)q * row_bytes, row_bytes, ng, xg, xl, y + i,
                     (size_t)q, GEMV_ROWS);
    for (int r = q * GEMV_ROWS; r < nr; r++) /* (a row left over: GEMV_ROWS times the same row, one copy of the code) */
        q_gemv_fixed(type, &pm, w + (size_t)r * row_bytes, 0, row_bytes, ng, xg, xl, y + r, 0, GEMV_ROWS);
}

__attribute__((target(T512))) static void q_gemv_avx512(g4_dtype type, const unsigned char *w, size_t row_bytes,
                                                       int nr, int nb, const g4_q8_rows *a, int t, float *y) {
#define CALL(qt) q_gemv_typed(qt, w, row_bytes, nr, nb, a, t, y)
    G4_Q8_SWITCH(type, CALL) /* (each type's decoding inlined) */
#undef CALL
}

/* NR packed rows x NT (<= 2) activation rows in lane order: per super-group, the 8 operands k in turn against every
 * (row, token) (their integer sums in registers), then lanes_step on each. Every (row, token) sees the same
 * operations in the same order whatever NR and NT are, so a row's value does not depend on the batch. */
__attribute__((target(T512), always_inline)) static inline void q_gemm_fixed(const unsigned char *wp, size_t ldw,
                                                                             const g4_q8_rows *a, int t0, int nsg,
                                                                             float *y, size_t ldy, int nr,
                                                                             const int NT, const int mode) {
    const int NR = G4_Q_TR; /* (fewer rows: the last one again, its sums not stored; one copy of the code) */
    __m512 acc[G4_Q_TR][2];
    const unsigned char *xt[2];
    const int split = lanes_split(mode), nsc = mode == G4_Q8_MIN16 ? 4 : 2;
    for (int t = 0; t < NT; t++) xt[t] = a->ql + (size_t)(t0 + t) * nsg * G4_Q8_LANES;
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int s = 0; s < nsg; s++) {
        const unsigned char *px[2], *pw[G4_Q_TR];
        q_xlanes x[2];
        __m512i sum[G4_Q_TR][2], sumh[G4_Q_TR][2];
        for (int t = 0; t < NT; t++) px[t] = xt[t] + (size_t)s * G4_Q8_LANES, x[t] = lanes_xload(px[t], mode);
        for (int r = 0; r < NR; r++) pw[r] = wp + (size_t)(r < nr ? r : nr - 1) * ldw + (size_t)s * G4_QW_LANES;
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < NT; t++) {
                sum[r][t] = mode == G4_Q8_OFFSET || mode == G4_Q8_HALVES ? x[t].a : _mm512_setzero_si512();
                sumh[r][t] = mode == G4_Q8_HALVES ? x[t].b : _mm512_setzero_si512();
            }
        for (int k = 0; k < 8; k++) {
            __m512i wv[G4_Q_TR], xv[2];
            for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_si512(px[t] + 64 * k);
            for (int r = 0; r < NR; r++) wv[r] = _mm512_loadu_si512(pw[r] + 64 * k);
            for (int r = 0; r < NR; r++)
                for (int t = 0; t < NT; t++) {
                    if (split && k >= 4)
                        sumh[r][t] = _mm512_dpbusd_epi32(sumh[r][t], wv[r], xv[t]);
                    else
                        sum[r][t] = _mm512_dpbusd_epi32(sum[r][t], wv[r], xv[t]);
                }
        }
        for (int r = 0; r < NR; r++) {
            __m512 sc[4];
            for (int f = 0; f < nsc; f++) sc[f] = _mm512_loadu_ps(pw[r] + 512 + 64 * f);
            for (int t = 0; t < NT; t++) acc[r][t] = lanes_step(acc[r][t], sum[r][t], sumh[r][t], sc, &x[t], mode);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < NT; t++) y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc[r][t]);
}

__attribute__((target(T512), always_inline)) static inline void q_gemm_mode(const unsigned char *wp, int nr,
                                                                            const g4_q8_rows *a, int t0, int nt,
                                                                            int ng, float *y, size_t ldy,
                                                                            const int mode) {
    const int nsg = (ng + 3) / 4;
    const size_t ldw = (size_t)nsg * G4_QW_LANES;
    for (int t = 0; t < nt; t += 2) /* tokens two at a time (the registers of 4 x 2 sums) */
        if (nt - t >= 2)
            q_gemm_fixed(wp, ldw, a, t0 + t, nsg, y + (size_t)t * ldy, ldy, nr, 2, mode);
        else
            q_gemm_fixed(wp, ldw, a, t0 + t, nsg, y + (size_t)t * ldy, ldy, nr, 1, mode);
}

__attribute__((target(T512))) static void q_gemm_avx512(const unsigned char *wp, int nr, const g4_q8_rows *a, int t0,
                                                       int nt, int ng, float *y, size_t ldy) {
    switch (g4_q8_mode(a->type)) {
    case G4_Q8_AFFINE: q_gemm_mode(wp, nr, a, t0, nt, ng, y, ldy, G4_Q8_AFFINE); break;
    case G4_Q8_HALVES: q_gemm_mode(wp, nr, a, t0, nt, ng, y, ldy, G4_Q8_HALVES); break;
    case G4_Q8_MIN16: q_gemm_mode(wp, nr, a, t0, nt, ng, y, ldy, G4_Q8_MIN16); break;
    default: q_gemm_mode(wp, nr, a, t0, nt, ng, y, ldy, G4_Q8_OFFSET); break;
    }
}

/* ------------------------------------------- bf16 activations, AVX512_BF16 */
/* bf16x_tile: vdpbf16ps multiplies the bf16 pairs (2i, 2i+1) of a weight vector and an activation vector and
 * adds both products to f32 lane i. Weights and activations are rows of consecutive elements, so a pair is the
 * same two columns on both sides and each lane sums whole products of one (row, token): no packing is needed.
 * 32 columns per step, 4 rows x NT tokens (16 accumulators, 8 operand registers), the columns past the last
 * whole 32 by masked loads (zeros add nothing). Every (row, token) sees the same instructions in the same order
 * for every NR and NT (batch invariance). */
#define TBF16 "avx512f,avx512bw,avx512bf16"
/* the sums of the lanes of a0..a3 in lanes 0..3; each sum's additions are the same whatever the other inputs are */
__attribute__((target(TBF16), always_inline)) static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    const __m256 c01 = _mm256_hadd_ps(HALVES(a0), HALVES(a1)), c23 = _mm256_hadd_ps(HALVES(a2), HALVES(a3));
#undef HALVES
    const __m256 d = _mm256_hadd_ps(c01, c23); /* per 128-bit half: the 4 inputs' sums of that half */
    return _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}
__attribute__((target(TBF16), always_inline)) static inline void bf16x_fixed(const uint16_t *w, size_t ldw,
                                                                            const uint16_t *x, size_t ldx, size_t n,
                                                                            float *y, size_t ldy, const int NR,
                                                                            const int NT) {
    __m512 acc[4][G4_BF16X_TT];
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i wv[4];
        for (int r = 0; r < NR; r++) wv[r] = _mm512_loadu_si512(w + (size_t)r * ldw + i);
        for (int t = 0; t < NT; t++) {
            const __m512i xv = _mm512_loadu_si512(x + (size_t)t * ldx + i);
            for (int r = 0; r < NR; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv);
        }
    }
    if (i < n) {
        const __mmask32 m = (__mmask32)((1ull << (n - i)) - 1);
        __m512i wv[4], xv[G4_BF16X_TT];
        for (int r = 0; r < NR; r++) wv[r] = _mm512_maskz_loadu_epi16(m, w + (size_t)r * ldw + i);
        for (int t = 0; t < NT; t++) xv[t] = _mm512_maskz_loadu_epi16(m, x + (size_t)t * ldx + i);
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)wv[r], (__m512bh)xv[t]);
    }
    for (int t = 0; t < NT; t++) { /* the 4 rows' sums at once (a 1-row tile: zeros beside it, the same bits) */
        const __m512 z = _mm512_setzero_ps();
        const __m128 s = hsum4(acc[0][t], NR > 1 ? acc[1][t] : z, NR > 2 ? acc[2][t] : z, NR > 3 ? acc[3][t] : z);
        if (NR == 4) {
            _mm_storeu_ps(y + (size_t)t * ldy, s);
        } else {
            float v[4];
            _mm_storeu_ps(v, s);
            for (int r = 0; r < NR; r++) y[(size_t)t * ldy + (size_t)r] = v[r];
        }
    }
}

__attribute__((target(TBF16))) static void bf16x_tile_avx512(const uint16_t *w, size_t ldw, int nr, const uint16_t *x,
                                                            size_t ldx, int nt, size_t n, float *y, size_t ldy) {
    if (nr == 4) {
        switch (nt) {
#if G4_BF16X_TT >= 8
        case 8: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 8); return;
        case 7: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 7); return;
#endif
#if G4_BF16X_TT >= 6
        case 6: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 6); return;
        case 5: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 5); return;
#endif
        case 4: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 4); return;
        case 3: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 3); return;
        case 2: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 2); return;
        case 1: bf16x_fixed(w, ldw, x, ldx, n, y, ldy, 4, 1); return;
        }
    }
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++)
            bf16x_fixed(w + (size_t)r * ldw, ldw, x + (size_t)t * ldx, ldx, n, y + (size_t)t * ldy + r, ldy, 1, 1);
}

/* exp, gelu and tanh: the constants and the method are in cpu.h */

__attribute__((target("avx2,fma"))) static inline __m256 exp256(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_C1), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(EXP_C2), x);
    __m256 z = _mm256_mul_ps(x, x), y = _mm256_set1_ps(EXP_P0);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P1));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P2));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P3));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P4));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(EXP_P5));
    y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

__attribute__((target("avx2,fma"))) static void gelu_mul_avx2(const float *g, const float *u, float *y, size_t n) {
    const __m256 c = _mm256_set1_ps(GELU_C), c3 = _mm256_set1_ps(GELU_C * 0.044715f), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i), x2 = _mm256_mul_ps(x, x);
        __m256 mz2 = _mm256_mul_ps(_mm256_fmadd_ps(c3, x2, c), _mm256_sub_ps(_mm256_setzero_ps(), _mm256_add_ps(x, x)));
        __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, exp256(mz2))); /* mz2 = -2z */
        _mm256_storeu_ps(y + i, u ? _mm256_mul_ps(r, _mm256_loadu_ps(u + i)) : r);
    }
    g4_cpu_gelu_mul_scalar(g + i, u ? u + i : NULL, y + i, n - i);
}

__attribute__((target("avx2,fma"))) static float exp_sum_avx2(float *x, size_t n, float shift) {
    __m256 sh = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
        _mm256_storeu_ps(x + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    float s = hsum256(acc);
    for (; i < n; i++) s += (x[i] = expf(x[i] - shift));
    return s;
}

__attribute__((target("avx2,fma"))) static void softcap_avx2(float *y, size_t n, float c) {
    const __m256 inv = _mm256_set1_ps(1.0f / c), cc = _mm256_set1_ps(c), sign = _mm256_set1_ps(-0.0f);
    const __m256 one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(y + i), inv), ax = _mm256_andnot_ps(sign, a), s = _mm256_mul_ps(a, a);
        __m256 p = _mm256_set1_ps(TANH_P5);
        p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(TANH_P4));
        p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(TANH_P3));
        p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(TANH_P2));
        p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(TANH_P1));
        p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(TANH_P0));
        __m256 e = exp256(_mm256_mul_ps(_mm256_min_ps(ax, _mm256_set1_ps(TANH_BIG)), _mm256_set1_ps(-2.0f)));
        __m256 big = _mm256_or_ps(_mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e)), _mm256_and_ps(sign, a));
        __m256 t = _mm256_blendv_ps(big, _mm256_mul_ps(a, p), _mm256_cmp_ps(ax, _mm256_set1_ps(TANH_SMALL), _CMP_LT_OQ));
        t = _mm256_blendv_ps(t, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q)); /* NaN stays NaN (min() dropped it) */
        _mm256_storeu_ps(y + i, _mm256_mul_ps(t, cc));
    }
    g4_cpu_softcap_scalar(y + i, n - i, c);
}

__attribute__((target("avx512f"))) static inline __m512 exp512(__m512 v) {
    __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(EXP_LOG2E), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    v = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_C1), v);
    v = _mm512_fnmadd_ps(fx, _mm512_set1_ps(EXP_C2), v);
    __m512 z = _mm512_mul_ps(v, v), y = _mm512_set1_ps(EXP_P0);
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P1));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P2));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P3));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P4));
    y = _mm512_fmadd_ps(y, v, _mm512_set1_ps(EXP_P5));
    y = _mm512_fmadd_ps(y, z, _mm512_add_ps(v, _mm512_set1_ps(1.0f)));
    y = _mm512_scalef_ps(y, fx); /* y * 2^fx */
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

__attribute__((target("avx512f"))) static float exp_sum_avx512(float *x, size_t n, float shift) {
    __m512 sh = _mm512_set1_ps(shift), acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
        _mm512_storeu_ps(x + i, y);
        acc = _mm512_add_ps(acc, y);
    }
    float s = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) s += (x[i] = expf(x[i] - shift));
    return s;
}

__attribute__((target("avx512f"))) static void gelu_mul_avx512(const float *g, const float *u, float *y, size_t n) {
    const __m512 c = _mm512_set1_ps(GELU_C), c3 = _mm512_set1_ps(GELU_C * 0.044715f), one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i), x2 = _mm512_mul_ps(x, x);
        __m512 mz2 = _mm512_mul_ps(_mm512_fmadd_ps(c3, x2, c), _mm512_sub_ps(_mm512_setzero_ps(), _mm512_add_ps(x, x)));
        __m512 r = _mm512_div_ps(x, _mm512_add_ps(one, exp512(mz2))); /* mz2 = -2z */
        _mm512_storeu_ps(y + i, u ? _mm512_mul_ps(r, _mm512_loadu_ps(u + i)) : r);
    }
    g4_cpu_gelu_mul_scalar(g + i, u ? u + i : NULL, y + i, n - i);
}

__attribute__((target("avx512f"))) static void softcap_avx512(float *y, size_t n, float c) {
    const __m512 inv = _mm512_set1_ps(1.0f / c), cc = _mm512_set1_ps(c), one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(y + i), inv), ax = _mm512_abs_ps(a), s = _mm512_mul_ps(a, a);
        __m512 p = _mm512_set1_ps(TANH_P5);
        p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(TANH_P4));
        p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(TANH_P3));
        p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(TANH_P2));
        p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(TANH_P1));
        p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(TANH_P0));
        __m512 e = exp512(_mm512_mul_ps(_mm512_min_ps(ax, _mm512_set1_ps(TANH_BIG)), _mm512_set1_ps(-2.0f)));
        __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
        big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(big),
                                                  _mm512_and_si512(_mm512_castps_si512(a), sign)));
        __mmask16 small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(TANH_SMALL), _CMP_LT_OQ);
        __m512 t = _mm512_mask_blend_ps(small, big, _mm512_mul_ps(a, p));
        t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), t, a); /* NaN stays NaN (min() dropped it) */
        _mm512_storeu_ps(y + i, _mm512_mul_ps(t, cc));
    }
    g4_cpu_softcap_scalar(y + i, n - i, c);
}

/* attention's p * V: C vectors of the output per head stay in registers over all nv value rows (each row read
 * once for the NO heads); the columns past the last whole vector take the scalar set's path (fmaf, same order) */
#define PV(NAME, TARGET, VEC, W, C, LOAD, STORE, SET1, FMA)                                                          \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_fixed(                                  \
        float *o, size_t ldo, const float *p, size_t ldp, const float *v, size_t ldv, int nv, size_t d, const int NO) { \
        size_t x = 0;                                                                                                \
        for (; x + (size_t)(C * W) <= d; x += (size_t)(C * W)) {                                                     \
            VEC acc[4][C];                                                                                           \
            for (int h = 0; h < NO; h++)                                                                             \
                for (int c = 0; c < C; c++) acc[h][c] = LOAD(o + (size_t)h * ldo + x + (size_t)(c * W));              \
            for (int i = 0; i < nv; i++) {                                                                           \
                VEC vv[C];                                                                                           \
                for (int c = 0; c < C; c++) vv[c] = LOAD(v + (size_t)i * ldv + x + (size_t)(c * W));                 \
                for (int h = 0; h < NO; h++) {                                                                       \
                    VEC ph = SET1(p[(size_t)h * ldp + (size_t)i]);                                                   \
                    for (int c = 0; c < C; c++) acc[h][c] = FMA(ph, vv[c], acc[h][c]);                               \
                }                                                                                                    \
            }                                                                                                        \
            for (int h = 0; h < NO; h++)                                                                             \
                for (int c = 0; c < C; c++) STORE(o + (size_t)h * ldo + x + (size_t)(c * W), acc[h][c]);              \
        }                                                                                                            \
        if (x < d) g4_cpu_pv_scalar(o + x, ldo, NO, p, ldp, v + x, ldv, nv, d - x);                                  \
    }                                                                                                                \
    __attribute__((target(TARGET))) static void NAME(float *o, size_t ldo, int no, const float *p, size_t ldp,        \
                                                     const float *v, size_t ldv, int nv, size_t d) {                 \
        switch (no) {                                                                                                \
        case 4: NAME##_fixed(o, ldo, p, ldp, v, ldv, nv, d, 4); break;                                               \
        case 3: NAME##_fixed(o, ldo, p, ldp, v, ldv, nv, d, 3); break;                                               \
        case 2: NAME##_fixed(o, ldo, p, ldp, v, ldv, nv, d, 2); break;                                               \
        default: NAME##_fixed(o, ldo, p, ldp, v, ldv, nv, d, 1); break;                                              \
        }                                                                                                            \
    }
PV(pv_avx2, "avx2,fma", __m256, 8, 2, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps)
PV(pv_avx512, "avx512f", __m512, 16, 4, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps)

__attribute__((target("avx2,fma"))) static int32_t argmax_avx2(const float *x, int n) { return g4_cpu_argmax_body(x, n); }
__attribute__((target("avx512f"))) static int32_t argmax_avx512(const float *x, int n) {
    return g4_cpu_argmax_body(x, n);
}

static const g4_cpu_kernels k_avx2 = {"avx2", dot_f32_avx2, dot_bf16_avx2, bf16_to_f32_avx2,
                                      axpy_avx2, NULL, f32_tile_avx2, q_pack_avx2, exp_sum_avx2, gelu_mul_avx2,
                                      softcap_avx2, pv_avx2, bf16_tile_avx2, q_gemm_avx2, q_gemv_avx2, NULL, NULL, 1,
                                      1, argmax_avx2, 1, NULL};
static const g4_cpu_kernels k_avxvnni = {"avxvnni", dot_f32_avx2, dot_bf16_avx2, bf16_to_f32_avx2,
                                         axpy_avx2, NULL, f32_tile_avx2, q_pack_avx2, exp_sum_avx2, gelu_mul_avx2,
                                         softcap_avx2, pv_avx2, bf16_tile_avx2, q_gemm_avxvnni, q_gemv_avxvnni, NULL,
                                         NULL, 1, 1, argmax_avx2, 1, NULL};
static const g4_cpu_kernels k_avx512 = {"avx512", dot_f32_avx512, dot_bf16_avx512, bf16_to_f32_avx512,
                                        axpy_avx512, NULL, f32_tile_avx512, q_pack_avx512,
                                        exp_sum_avx512, gelu_mul_avx512, softcap_avx512, pv_avx512,
                                        bf16_tile_avx512, q_gemm_avx512, q_gemv_avx512, NULL,
                                        q8_group_row_avx512, 1, 0, argmax_avx512, 0, q8_lanes_row_avx512};
static const g4_cpu_kernels k_avx512_bf16 = {"avx512", dot_f32_avx512, dot_bf16_avx512, bf16_to_f32_avx512,
                                             axpy_avx512, NULL, f32_tile_avx512, q_pack_avx512,
                                             exp_sum_avx512, gelu_mul_avx512, softcap_avx512, pv_avx512,
                                             bf16_tile_avx512, q_gemm_avx512, q_gemv_avx512, bf16x_tile_avx512,
                                             q8_group_row_avx512, 1, 0, argmax_avx512, 0, q8_lanes_row_avx512};

const g4_cpu_kernels *g4_cpu_kernels_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &k_avx2 : NULL;
}

const g4_cpu_kernels *g4_cpu_kernels_avxvnni(void) {
    unsigned a = 0, b = 0, c = 0, d = 0; /* AVX-VNNI: CPUID leaf 7, subleaf 1, EAX bit 4 (not every compiler's
                                          * __builtin_cpu_supports knows it); the OS's AVX state as avx2's */
    return g4_cpu_kernels_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1) ? &k_avxvnni : NULL;
}

const g4_cpu_kernels *g4_cpu_kernels_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi")
               ? (__builtin_cpu_supports("avx512bf16") ? &k_avx512_bf16 : &k_avx512)
               : NULL;
}
#else
const g4_cpu_kernels *g4_cpu_kernels_avx2(void) { return NULL; }
const g4_cpu_kernels *g4_cpu_kernels_avxvnni(void) { return NULL; }
const g4_cpu_kernels *g4_cpu_kernels_avx512(void) { return NULL; }
#endif
