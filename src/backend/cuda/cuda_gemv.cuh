/* The GEMV of the CUDA backend's products (cuda_gemv.cu says what it does): its kernel templates and their launch,
 * included by the files that instantiate them. The weight types are instantiated in three files, cuda_gemv.cu (the
 * float types), cuda_gemv_quant_a.cu and cuda_gemv_quant_b.cu (the quantized ones, half each): as one file, nvcc
 * took over five minutes on it while the other cores had nothing left to compile. Each file defines, per type T of
 * its share, g4c_gemv_launch_T and g4c_gemv_allow_T (GEMV_TYPE_FUNCTIONS), which cuda_gemv.cu calls by dtype. */
#ifndef G4_BACKEND_CUDA_GEMV_CUH
#define G4_BACKEND_CUDA_GEMV_CUH

#include "backend/cuda/cuda_common.cuh"

#define G4C_GEMV_MAX 8
/* 16 warps a block: every block stages the whole input (and does the residual prologue), so fewer, larger blocks
 * read less of L2 for the same warps (H200, same call: E2B decode bf16 2.533 -> 2.389 ms, Q4_0 2.308 -> 2.060, 12B
 * Q4_0 4.940 -> 3.979 against 8 warps; staging had taken 2-9 us of a GEMV's 7-19, globaltimer trace) */
#ifndef GEMV_THREADS /* (a build may try another block size) */
#define GEMV_THREADS 512
#endif
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_UNROLL 4


typedef struct gemv_args {
    const unsigned char *w[G4_MATMUL_SET_MAX];
    const float *bias[G4_MATMUL_SET_MAX];
    float *y[G4_MATMUL_SET_MAX];
    int out[G4_MATMUL_SET_MAX];
    int count;
    size_t row_bytes;
    const float *x;
    int n, in;
    const float *norm;
    float eps;
    int geglu; /* 0 none, 1 gate/up pairs (w[0] row r with w[1] row r), 2 gelu(y0) * mul */
    const float *mul;
    float softcap;
    float scale; /* of the sums, before bias and epilogue */
    const float *res_h, *res_o, *res_w; /* residual prologue (one token, one tile): x = res_out = ... */
    float res_scale;
    float *res_out;
    int rows; /* row groups: out[0] for pairs, else the sum of out */
    int wpr;  /* warps per row group: 1, 2, 4 or 8 */
    int lpr;  /* lanes per row group: 32, or (quantized weights, wpr = 1) 16 or 8 for short rows, so that a warp has
               * several rows in flight */
    int rpb;  /* row groups a block takes a pass (<= GEMV_WARPS / wpr: the rest of its warps idle), so that every
               * multiprocessor gets the same number of rows */
    int xvec; /* x rows are 16-byte aligned */
    int ktile; /* input elements staged in shared memory at a time (a multiple of 8) */
    /* experts of a MoE block for one token (g4c_gemv_experts): row r is row r % ex_rows of the matrix of expert
     * ex[r / ex_rows] (the slot's), ex_bytes[p] apart in w[p]; with ex_pair (down): slot s reads x row s (xrows
     * rows staged) and writes row ex_pair[s] of y[0] times ex_w[ex_pair[s]] */
    const int32_t *ex, *ex_pair;
    const float *ex_w;
    size_t ex_bytes[2];
    int ex_rows;
    int xrows; /* x rows staged: n, or the slots */
    g4c_qrow q; /* quantized weights: the row's shape for the decoders */
} gemv_args;

/* One access of a lane: EPA weights in WORDS 16-byte words (plain types: 8 weights; quantized types: the codes
 * and a word of scales, cuda_common.cuh g4_qt). */
template <int DT, bool Q = (DT >= G4_Q4_0)> struct wraw {
    enum { EPA = 8, WORDS = DT == G4_F32 ? 2 : 1, QUANT = 0, SEG = 8, NEED_SUM = 0, I8 = 0, PERM = 0 };
};
template <int DT> struct wraw<DT, true> {
    enum { EPA = g4_qt<DT>::EPA, WORDS = g4_qt<DT>::QW + 1, QUANT = 1, SEG = g4_qt<DT>::SEG,
           NEED_SUM = g4_qt<DT>::NEED_SUM, I8 = g4_qt<DT>::I8,
           PERM = g4_qt<DT>::PERM };
};
/* accesses in flight per lane: about 64 bytes of codes and scales (Q4_K's scales are a whole word; ptxas
 * gave its one-token kernel 124 registers with 4) */
template <int DT> struct wunroll {
    enum { N = !wraw<DT>::QUANT ? GEMV_UNROLL : wraw<DT>::WORDS - 1 >= 3 ? 1
               : wraw<DT>::WORDS - 1 == 2 || DT == G4_Q4_K ? 2 : 4 };
};

template <int DT>
static __device__ __forceinline__ void raw_load(const unsigned char *row, int k, const g4c_qrow &q, uint4 *r) {
    if constexpr (wraw<DT>::QUANT) {
        g4_qt<DT>::load(row, k, q, r);
    } else if (DT == G4_F32) {
        r[0] = g4_ld_stream(row + (size_t)k * 4);
        r[wraw<DT>::WORDS - 1] = g4_ld_stream(row + (size_t)k * 4 + 16);
    } else {
        r[0] = g4_ld_stream(row + (size_t)k * 2);
    }
}

template <int DT> static __device__ __forceinline__ void raw_decode(const uint4 *r, float w[8]) {
    if (DT == G4_F32) {
        w[0] = __uint_as_float(r[0].x), w[1] = __uint_as_float(r[0].y), w[2] = __uint_as_float(r[0].z);
        w[3] = __uint_as_float(r[0].w);
        w[4] = __uint_as_float(r[wraw<DT>::WORDS - 1].x), w[5] = __uint_as_float(r[wraw<DT>::WORDS - 1].y);
        w[6] = __uint_as_float(r[wraw<DT>::WORDS - 1].z), w[7] = __uint_as_float(r[wraw<DT>::WORDS - 1].w);
    } else {
        const unsigned u[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
        for (int i = 0; i < 4; i++) {
            if (DT == G4_BF16) {
                w[2 * i] = __uint_as_float(u[i] << 16);
                w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
            } else {
                w[2 * i] = g4_h2f((uint16_t)(u[i] & 0xffffu));
                w[2 * i + 1] = g4_h2f((uint16_t)(u[i] >> 16));
            }
        }
    }
}

/* The accesses k, k + step, ... (UN of them, those below len) of the rows rp from element t0. */
template <int DT, int RP, int UN>
static __device__ __forceinline__ void issue(const unsigned char *const *rp, int t0, int k, int step, int len,
                                             const g4c_qrow &q, uint4 (*pre)[UN][wraw<DT>::WORDS]) {
#pragma unroll
    for (int u = 0; u < UN; u++)
#pragma unroll
        for (int r = 0; r < RP; r++)
            if (k + u * step < len) raw_load<DT>(rp[r], t0 + k + u * step, q, pre[r][u]);
}

/* Sums of 32 consecutive staged inputs (the offsets b of quantized segments multiply them). */
template <int NT, bool EX>
static __device__ __forceinline__ void stage_sums(const float *xs, int rows, int ld, int len, float *sums) {
    const int n32 = len / 32;
    for (int i = threadIdx.x; i < (EX ? rows : NT) * n32; i += GEMV_THREADS) {
        const float *p = xs + (size_t)(i / n32) * ld + (size_t)(i % n32) * 32;
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += p[j];
        sums[(size_t)(i / n32) * (ld / 32) + i % n32] = s;
    }
}

/* nb blocks of 32 inputs of each of the n token rows, load8(t, k, on, v) giving inputs k .. k+7 of row t (zeros
 * where !on) times scale[t] (if any), as int8 blocks (Q8_0 rule, as the CPU's matmul_q8.c: d = max|x|/127 per 32,
 * q = rint(x/d)): codes xq [NT][ld], per block (d, sum of q) in xd [NT][ld / 32]. Four lanes a block, eight
 * elements a lane, so a warp quantizes eight blocks at once with two shuffles per
 * reduction (every block of a GEMV does this for the whole input: with a warp a block and five-step reductions it
 * cost more instructions than the 31B's 4-bit products themselves, ncu on the H200; eight lanes a block and three
 * shuffles took 3.5 us of E2B's 4-bit down product, globaltimer trace).
 * PERM: each 8 elements stored as the even ones, then the odd ones (MLX4's code order). */
template <int NT, int PERM, bool EX, class Load8>
static __device__ __forceinline__ void quant_blocks(int nb, int n, int ld, const float *scale, signed char *xq,
                                                    float2 *xd, Load8 load8) {
    const int lane = threadIdx.x & 31, sub = lane & 3;
    for (int base = (threadIdx.x >> 5) * 8; base < (EX ? n : NT) * nb; base += GEMV_THREADS / 4) {
        const int i = base + (lane >> 2), t = i / nb, b = i - t * nb, k = b * 32 + sub * 8;
        const bool on = i < (EX ? n : NT) * nb && t < n;
        const float sc = on && scale ? scale[t] : 1.0f;
        float v[8], m = 0.0f;
        load8(t, k, on, v); /* (zeros where !on) */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[j] *= sc;
            m = fmaxf(m, fabsf(v[j]));
        }
#pragma unroll
        for (int o = 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[8], sq = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            q[j] = __float2int_rn(v[j] * id);
            sq += q[j];
        }
#pragma unroll
        for (int o = 2; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o); /* |sum| <= 4064 */
        /* elements 0-3 and 4-7 of the lane's 8, or (PERM) the even ones and the odd ones */
        unsigned w0 = 0, w1 = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int a0 = PERM ? 2 * j : j, a1 = PERM ? 2 * j + 1 : j + 4;
            w0 |= ((unsigned)q[a0] & 0xffu) << (8 * j);
            w1 |= ((unsigned)q[a1] & 0xffu) << (8 * j);
        }
        if (on) {
            uint2 w;
            w.x = w0, w.y = w1;
            *(uint2 *)(xq + (size_t)t * ld + k) = w;
            if (sub == 0) xd[(size_t)t * (ld / 32) + b] = make_float2(d, (float)sq);
        }
    }
}

/* Inputs k0 .. k0+len of the n token rows src [n][sld] (elements past `avail` are zeros), times norm[k] (if any)
 * and scale[t] (the 1/rms of token t, if any), as int8 blocks (quant_blocks). len: a multiple of 32. */
template <int NT, int PERM, bool EX>
static __device__ __forceinline__ void stage_q8(const float *src, int sld, int k0, int avail, const float *norm,
                                                int ld, int len, int n, const float *scale, signed char *xq,
                                                float2 *xd, bool vec) {
    const int nb = len / 32, rows = EX ? n : NT < n ? NT : n;
    /* vec: src rows, k0 and norm 16-byte aligned (float4 loads). The tile's lines into L1 first when the loop below
     * takes several passes (else each pass waited for its own round trip to L2: 5 us for E2B's down product) */
    if (rows * nb > GEMV_THREADS / 4 && __isGlobal(src))
        for (int i = threadIdx.x * 32; i < rows * len; i += GEMV_THREADS * 32) {
            const int t = i / len, k = i - t * len;
            if (k < avail) g4_prefetch_l1(src + (size_t)t * sld + k0 + k);
            if (t == 0 && norm && k < avail) g4_prefetch_l1(norm + k0 + k);
        }
    quant_blocks<NT, PERM, EX>(nb, n, ld, scale, xq, xd, [&](int t, int k, bool on, float *v) {
        if (vec && on && k + 8 <= avail) {
            const float *x = src + (size_t)t * sld + k0 + k;
            const float4 x0 = *(const float4 *)x, x1 = *(const float4 *)(x + 4);
            const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            const float4 w0 = norm ? *(const float4 *)(norm + k0 + k) : one;
            const float4 w1 = norm ? *(const float4 *)(norm + k0 + k + 4) : one;
            v[0] = x0.x * w0.x, v[1] = x0.y * w0.y, v[2] = x0.z * w0.z, v[3] = x0.w * w0.w;
            v[4] = x1.x * w1.x, v[5] = x1.y * w1.y, v[6] = x1.z * w1.z, v[7] = x1.w * w1.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int kk = k + j;
                v[j] = on && kk < avail ? src[(size_t)t * sld + k0 + kk] * (norm ? norm[k0 + kk] : 1.0f) : 0.0f;
            }
        }
    });
}

/* product p and its local row of a row of the set's concatenated row space */
static __device__ __forceinline__ int which_product(const gemv_args &a, int row, int *local) {
    int p = 0;
    while (p + 1 < a.count && row >= a.out[p]) row -= a.out[p++];
    *local = row;
    return p;
}

template <bool EX>
static __device__ __forceinline__ void row_pointers(const gemv_args &a, int row, int rp_n, const unsigned char **rp) {
    if constexpr (EX) {
        const int s = row / a.ex_rows;
        const size_t e = (size_t)a.ex[s], local = (size_t)(row - s * a.ex_rows);
        for (int r = 0; r < rp_n; r++) rp[r] = a.w[r] + e * a.ex_bytes[r] + local * a.row_bytes;
    } else {
        for (int r = 0; r < rp_n; r++) {
            int local, p = rp_n == 2 ? r : which_product(a, row, &local);
            if (rp_n == 2) local = row;
            rp[r] = a.w[p] + (size_t)local * a.row_bytes;
        }
    }
}

/* Stages x'[t][k0 .. k0+len) = x[t][k] * (norm ? norm[k] : 1) for t < n into xs [NT][ld], zeros past `in`. */
template <int NT, bool EX>
static __device__ __forceinline__ void stage_x(const gemv_args &a, float *xs, int ld, int k0, int len) {
    for (int t = 0; EX ? t < a.xrows : t < NT && t < a.n; t++) {
        const float *x = a.x + (size_t)t * (size_t)a.in;
        float *d = xs + (size_t)t * ld;
        if (a.xvec) {
            for (int k = threadIdx.x * 4; k < len; k += GEMV_THREADS * 4) {
                const int kk = k0 + k;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (kk + 4 <= a.in) {
                    v = *(const float4 *)(x + kk);
                    if (a.norm) {
                        const float4 w = *(const float4 *)(a.norm + kk);
                        v.x *= w.x, v.y *= w.y, v.z *= w.z, v.w *= w.w;
                    }
                }
                *(float4 *)(d + k) = v;
            }
        } else {
            for (int k = threadIdx.x; k < len; k += GEMV_THREADS) {
                const int kk = k0 + k;
                d[k] = kk < a.in ? x[kk] * (a.norm ? a.norm[kk] : 1.0f) : 0.0f;
            }
        }
    }
}

/* A block of GEMV_WARPS warps; a group of wpr warps owns a row (pairs: gate row and up row). The block stages the
 * inputs (normalized) in shared memory, one tile of ktile elements at a time; each lane streams 16 bytes of
 * weights per access, GEMV_UNROLL accesses in flight, the next ones issued before the current are used. */
template <int DT, int NT, int RP, bool FA, bool EX = false, int UN = wunroll<DT>::N>
__global__ __launch_bounds__(GEMV_THREADS) void gemv_kernel(gemv_args a) {
    constexpr int W = wraw<DT>::WORDS, EPA = wraw<DT>::EPA;
    /* [sn][ktile] floats, then (quantized types with offsets) [sn][ktile / 32] sums; int8 activations: codes
     * [sn][ktile], (d, sum) [sn][ktile / 32]; sn = max(NT, xrows) */
    G4_DYN_SMEM(float, smem);
    __shared__ float red[GEMV_WARPS][RP * NT];
    __shared__ float inv_rms[NT];
    __shared__ float ssq[GEMV_WARPS]; /* (int8 residual prologue) the warps' sums of squares of the updated stream */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* a row group: wpr warps, or (quantized weights) the lpr lanes tl = 0 .. lpr-1 of a warp (wpr = 1) */
    const int wpr = a.wpr, lpr = wraw<DT>::QUANT ? a.lpr : 32, rpb = a.rpb, sub = warp % wpr, tl = lane & (lpr - 1);
    const int g = lpr == 32 ? warp / wpr : lane / lpr * GEMV_WARPS + warp; /* (a block's first groups: one a warp) */
    const int step = wpr * lpr * EPA, k0 = (sub * lpr + tl) * EPA;
    const int kt = a.ktile, ntiles = (a.in + kt - 1) / kt;
    constexpr bool I8 = wraw<DT>::I8 && !FA; /* FA: float activations (exact products, routers) */
    const int sn = EX && a.xrows > NT ? a.xrows : NT; /* staged x rows (experts' down: one a slot) */
    signed char *xq = (signed char *)smem;
    float2 *xd = (float2 *)(xq + (size_t)sn * kt);
    float *xs = I8 ? (float *)(xd + (size_t)sn * (kt / 32)) : smem;
    float *xsum = xs + (size_t)sn * kt;
    const float *qscale = a.norm ? inv_rms : nullptr; /* int8 activations: the 1/rms is in the codes' scale */

    /* the first accesses of the first row: weights only, before waiting for the previous kernel (experts: after
     * it, which chose them) */
    int row = g < rpb ? blockIdx.x * rpb + g : a.rows; /* (a.rows: an idle group) */
    const unsigned char *rp[RP] = {};
    uint4 pre[RP][UN][W] = {};
    const int first_len = a.in < kt ? a.in : kt;
    if (row < a.rows && !EX) {
        row_pointers<EX>(a, row, RP, rp);
        issue<DT, RP, UN>(rp, 0, k0, step, first_len, a.q, pre);
    }
    g4_grid_wait();
    if (row < a.rows && EX) {
        row_pointers<EX>(a, row, RP, rp);
        issue<DT, RP, UN>(rp, 0, k0, step, first_len, a.q, pre);
    }
    if (NT == 1 && a.res_out) { /* the residual update (one token): into xs, then its 1/rms and the norm */
        float so = 0.0f;
        for (int i = threadIdx.x; i < a.in; i += GEMV_THREADS) {
            so += a.res_o[i] * a.res_o[i];
            if ((i & 31) == 0) { /* what the next pass reads, into L1 meanwhile */
                g4_prefetch_l1(a.res_h + i), g4_prefetch_l1(a.res_w + i);
                if (a.norm) g4_prefetch_l1(a.norm + i);
            }
        }
        const float inv_o = rsqrtf(g4_block_sum(so, &red[0][0]) / (float)a.in + a.eps);
        /* int8 activations: the stream's sum of squares only scales the products (after the rows, from ssq), so the
         * codes come straight from the updated stream (the codes of x and of x / rms are the same up to rounding; the
         * scale of each block, d, leaves 1/rms out), without a block reduction before them (H200 decode: E2B Q4_0
         * 1.67 -> 1.63 ms, 12B 3.44 -> 3.37, 31B 6.98 -> 6.89; float weights: 26B-A4B bf16 3.34 -> 3.38, so they keep
         * the reduction) */
        /* the updated stream's element from its parts (h + rmsnorm(o) w) scale */
        const auto upd = [&](float h, float o, float w) { return (h + o * inv_o * w) * a.res_scale; };
        float sh = 0.0f;
        if constexpr (I8) {
            const bool rvec = a.in % 8 == 0 &&
                              (((uintptr_t)a.res_h | (uintptr_t)a.res_o | (uintptr_t)a.res_w | (uintptr_t)a.res_out |
                                (uintptr_t)a.norm) & 15) == 0;
            quant_blocks<NT, wraw<DT>::PERM, EX>(kt / 32, 1, kt, nullptr, xq, xd, [&](int, int k, bool on, float *v) {
                if (on && rvec && k + 8 <= a.in) {
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float4 h = *(const float4 *)(a.res_h + k + 4 * c), o = *(const float4 *)(a.res_o + k + 4 * c);
                        const float4 w = *(const float4 *)(a.res_w + k + 4 * c);
                        float4 r;
                        r.x = upd(h.x, o.x, w.x), r.y = upd(h.y, o.y, w.y);
                        r.z = upd(h.z, o.z, w.z), r.w = upd(h.w, o.w, w.w);
                        if (blockIdx.x == 0) *(float4 *)(a.res_out + k + 4 * c) = r;
                        sh += r.x * r.x + r.y * r.y + r.z * r.z + r.w * r.w;
                        const float4 nw = a.norm ? *(const float4 *)(a.norm + k + 4 * c) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
                        v[4 * c] = r.x * nw.x, v[4 * c + 1] = r.y * nw.y, v[4 * c + 2] = r.z * nw.z, v[4 * c + 3] = r.w * nw.w;
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int i = k + j;
                        float hn = 0.0f;
                        if (on && i < a.in) {
                            hn = upd(a.res_h[i], a.res_o[i], a.res_w[i]);
                            if (blockIdx.x == 0) a.res_out[i] = hn;
                        }
                        sh += hn * hn;
                        v[j] = a.norm && on && i < a.in ? hn * a.norm[i] : hn;
                    }
                }
            });
        } else {
            for (int i = threadIdx.x; i < kt; i += GEMV_THREADS) {
                float hn = 0.0f;
                if (i < a.in) {
                    hn = upd(a.res_h[i], a.res_o[i], a.res_w[i]);
                    if (blockIdx.x == 0) a.res_out[i] = hn;
                }
                sh += hn * hn;
                xs[i] = a.norm && i < a.in ? hn * a.norm[i] : hn;
            }
        }
        if constexpr (I8) {
            sh = g4_warp_sum(sh);
            if (lane == 0) ssq[warp] = sh;
        } else {
            const float ssum = g4_block_sum(sh, &red[0][0]);
            if (threadIdx.x == 0) inv_rms[0] = rsqrtf(ssum / (float)a.in + a.eps);
        }
    } else if (a.norm) { /* 1/rms of each token's input row, all threads */
        float ss[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            ss[t] = 0.0f;
            if (t < a.n)
                for (int i = threadIdx.x; i < a.in; i += GEMV_THREADS) {
                    const float v = a.x[(size_t)t * a.in + i];
                    ss[t] += v * v;
                    if (t == 0 && (i & 31) == 0) g4_prefetch_l1(a.norm + i); /* staged next */
                }
            ss[t] = g4_warp_sum(ss[t]);
        }
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) red[warp][t] = ss[t];
        __syncthreads();
        if (threadIdx.x < NT) {
            float s = 0.0f;
            for (int w = 0; w < GEMV_WARPS; w++) s += red[w][threadIdx.x];
            inv_rms[threadIdx.x] = rsqrtf(s / (float)a.in + a.eps);
        }
    }
    if (ntiles == 1 && !(NT == 1 && a.res_out) && !I8) stage_x<NT, EX>(a, xs, kt, 0, kt);
    __syncthreads();
    if (wraw<DT>::NEED_SUM && !I8 && ntiles == 1) {
        stage_sums<NT, EX>(xs, a.xrows, kt, kt, xsum);
        __syncthreads();
    }
    if (I8 && ntiles == 1 && !(NT == 1 && a.res_out)) { /* (the residual prologue has staged its codes) */
        stage_q8<NT, wraw<DT>::PERM, EX>(a.x, a.in, 0, a.in, a.norm, kt, kt, EX ? a.xrows : a.n, qscale, xq, xd,
                                         a.xvec);
        __syncthreads();
    }
    g4_grid_launch_dependents();
    G4_TRACE_MARK(2);
    /* int8 activations with the residual prologue: the scale of the sums, the updated stream's 1/rms (else the 1/rms
     * of each token's input is in inv_rms, or with int8 activations in the codes' scale) */
    float res_rms = 1.0f;
    if (I8 && NT == 1 && a.res_out && a.norm) {
        float ss = 0.0f;
        for (int w = 0; w < GEMV_WARPS; w++) ss += ssq[w];
        res_rms = rsqrtf(ss / (float)a.in + a.eps);
    }

    for (int base = blockIdx.x * rpb; base < a.rows; base += gridDim.x * rpb) {
        row = g < rpb ? base + g : a.rows;
        const int xsel = EX && RP == 1 && row < a.rows ? row / a.ex_rows : 0; /* experts' down: the slot's x row */
        const int active = row < a.rows;
        /* (one product) the row's product and local row, and the epilogue's multiplier (GeGLU against `mul`), asked
         * for now: its latency hides behind the row's weights */
        int local = 0;
        const int p = RP == 1 && active ? which_product(a, row, &local) : 0;
        float mulv = 0.0f;
        if (RP == 1 && a.geglu == 2 && active && sub == 0 && tl < a.n && tl < NT)
            mulv = a.mul[(size_t)tl * a.out[0] + local];
        float acc[RP][NT];
#pragma unroll
        for (int r = 0; r < RP; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        for (int tile = 0; tile < ntiles; tile++) {
            const int t0 = tile * kt, len = a.in - t0 < kt ? a.in - t0 : kt;
            if (ntiles > 1) { /* (the grid covers every row once when there are several tiles) */
                if (tile > 0) __syncthreads();
                if (I8)
                    stage_q8<NT, wraw<DT>::PERM, EX>(a.x, a.in, t0, len, a.norm, kt, len, EX ? a.xrows : a.n, qscale, xq,
                                                     xd, a.xvec);
                else
                    stage_x<NT, EX>(a, xs, kt, t0, (len + 7) & ~7);
                __syncthreads();
                if (wraw<DT>::NEED_SUM && !I8) {
                    stage_sums<NT, EX>(xs, a.xrows, kt, len, xsum);
                    __syncthreads();
                }

                if (tile > 0 && active) issue<DT, RP, UN>(rp, t0, k0, step, len, a.q, pre);
            }
            if (!active) continue;
#pragma unroll 2 /* (two iterations in one body: the copy of pre into cur becomes a renaming of registers) */
            for (int k = k0; k < len; k += step * UN) {
                uint4 cur[RP][UN][W];
#pragma unroll
                for (int u = 0; u < UN; u++)
#pragma unroll
                    for (int r = 0; r < RP; r++)
#pragma unroll
                        for (int q = 0; q < W; q++) cur[r][u][q] = pre[r][u][q];
                issue<DT, RP, UN>(rp, t0, k + step * UN, step, len, a.q, pre); /* the next, before these are used */
                if constexpr (I8) {
                    /* per 32: acc += dw * dx * (sum(code * xq) - ZERO * sum(xq)), integer products (dp4a); an
                     * access of EPA = 64 (Q6_K: one scale d, its sub-scales inside dot32) is two blocks of 32 */
#pragma unroll
                    for (int u = 0; u < UN; u++) {
                        const int kk = k + u * step;
                        if (kk >= len) continue;
                        float dw[RP], bw[RP]; /* MLX: w = dw * code + bw */
#pragma unroll
                        for (int r = 0; r < RP; r++) g4_qt<DT>::seg(cur[r][u], a.q, t0 + kk, -1, &dw[r], &bw[r]);
#pragma unroll
                        for (int b = 0; b < EPA / 32; b++)
#pragma unroll
                            for (int t = 0; t < NT; t++) {
                                const uint4 x0 = *(const uint4 *)(xq + (size_t)(t + xsel) * kt + kk + 32 * b);
                                const uint4 x1 = *(const uint4 *)(xq + (size_t)(t + xsel) * kt + kk + 32 * b + 16);
                                const float2 dx = xd[(size_t)(t + xsel) * (kt / 32) + kk / 32 + b];
                                /* (integers below 2^24 in magnitude: exact in floats, no float-to-int conversion) */
                                const float off = (float)g4_qt<DT>::ZERO * dx.y;
#pragma unroll
                                for (int r = 0; r < RP; r++) {
                                    if constexpr (DT == G4_Q2_K) { /* (a min per 16: the block's two sums) */
                                        const int2 p2 = g4_qt<DT>::dot32m(cur[r][u], b, x0, x1);
                                        acc[r][t] += dx.x * fmaf(bw[r], (float)p2.y, dw[r] * (float)p2.x);
                                    } else {
                                        const float v = dw[r] * ((float)g4_qt<DT>::dot32(cur[r][u], b, x0, x1) - off);
                                        acc[r][t] += dx.x * (wraw<DT>::NEED_SUM ? fmaf(bw[r], dx.y, v) : v);
                                    }
                                }
                            }
                    }
                } else if constexpr (wraw<DT>::QUANT) {
                    /* per segment: acc += a * sum(v x) + b * sum(x), v the codes minus the zero point */
                    constexpr int SEG = wraw<DT>::SEG;
#pragma unroll
                    for (int u = 0; u < UN; u++) {
                        const int kk = k + u * step;
                        if (kk >= len) continue;
#pragma unroll
                        for (int sg = 0; sg < EPA / SEG; sg++) {
                            float sa[RP], sb[RP], part[RP][NT];
#pragma unroll
                            for (int r = 0; r < RP; r++) {
                                g4_qt<DT>::seg(cur[r][u], a.q, t0 + kk + sg * SEG, sg, &sa[r], &sb[r]);
#pragma unroll
                                for (int t = 0; t < NT; t++) part[r][t] = 0.0f;
                            }
#pragma unroll
                            for (int j = 0; j < SEG / 8; j++) {
                                const int ke = kk + sg * SEG + j * 8;
                                float f[RP][8];
#pragma unroll
                                for (int r = 0; r < RP; r++) g4_qt<DT>::vals8(cur[r][u], sg * (SEG / 8) + j, f[r]);
#pragma unroll
                                for (int t = 0; t < NT; t++) {
                                    const float4 x0 = *(const float4 *)(xs + (size_t)(t + xsel) * kt + ke);
                                    const float4 x1 = *(const float4 *)(xs + (size_t)(t + xsel) * kt + ke + 4);
#pragma unroll
                                    for (int r = 0; r < RP; r++)
                                        part[r][t] += f[r][0] * x0.x + f[r][1] * x0.y + f[r][2] * x0.z +
                                                      f[r][3] * x0.w + f[r][4] * x1.x + f[r][5] * x1.y +
                                                      f[r][6] * x1.z + f[r][7] * x1.w;
                                }
                            }
#pragma unroll
                            for (int r = 0; r < RP; r++)
#pragma unroll
                                for (int t = 0; t < NT; t++) {
                                    float v = sa[r] * part[r][t];
                                    if (wraw<DT>::NEED_SUM)
                                        v = fmaf(sb[r], xsum[(size_t)(t + xsel) * (kt / 32) + (kk + sg * SEG) / 32], v);
                                    acc[r][t] += v;
                                }
                        }
                    }
                } else {
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int kk = k + u * step;
                    if (kk < len) {
                        float w[RP][8];
#pragma unroll
                        for (int r = 0; r < RP; r++) raw_decode<DT>(cur[r][u], w[r]);
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            const float4 x0 = *(const float4 *)(xs + (size_t)(t + xsel) * kt + kk);
                            const float4 x1 = *(const float4 *)(xs + (size_t)(t + xsel) * kt + kk + 4);
#pragma unroll
                            for (int r = 0; r < RP; r++)
                                acc[r][t] += w[r][0] * x0.x + w[r][1] * x0.y + w[r][2] * x0.z + w[r][3] * x0.w +
                                             w[r][4] * x1.x + w[r][5] * x1.y + w[r][6] * x1.z + w[r][7] * x1.w;
                        }
                    }
                }
                }
            }
        }
        /* the next row group's first accesses, in flight while this one's sums are formed */
        const int next = base + (int)gridDim.x * rpb + g;
        if (g < rpb && next < a.rows) {
            row_pointers<EX>(a, next, RP, rp);
            issue<DT, RP, UN>(rp, 0, k0, step, first_len, a.q, pre);
        }
        /* the group's sums (over its lanes, then its warps) */
#pragma unroll
        for (int r = 0; r < RP; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = lpr == 32 ? g4_warp_sum(acc[r][t]) : g4_lanes_sum(acc[r][t], lpr);
        if (wpr > 1) {
            __syncthreads();
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RP; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) red[warp][r * NT + t] = acc[r][t];
            __syncthreads();
            if (sub == 0)
#pragma unroll
                for (int r = 0; r < RP; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        float s = 0.0f;
                        for (int j = 0; j < wpr; j++) s += red[warp + j][r * NT + t];
                        acc[r][t] = s;
                    }
        }
        if (active && sub == 0 && tl < a.n && tl < NT) { /* the group's lane t writes token t */
            const int t = tl;
            float v[RP];
#pragma unroll
            for (int r = 0; r < RP; r++) {
                float s = 0.0f;
#pragma unroll
                for (int q = 0; q < NT; q++)
                    if (q == t) s = acc[r][q];
                v[r] = (I8 && NT == 1 && a.res_out ? s * res_rms : a.norm && !I8 ? s * inv_rms[t] : s) * a.scale;
            }
            if (RP == 2) { /* gate/up pair */
                float gt = v[0] + (a.bias[0] ? a.bias[0][row] : 0.0f);
                float up = v[RP - 1] + (a.bias[1] ? a.bias[1][row] : 0.0f);
                float y = g4_gelu_tanh(gt) * up;
                if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
                a.y[0][(size_t)t * a.out[0] + row] = y;
            } else {
                float y = v[0] + (a.bias[p] ? a.bias[p][local] : 0.0f);
                if (a.geglu == 2) y = g4_gelu_tanh(y) * mulv;
                if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
                if (EX) { /* an expert's down row: the pair's row, times its routing weight */
                    const int pr = a.ex_pair[xsel];
                    a.y[0][(size_t)pr * a.ex_rows + (row - xsel * a.ex_rows)] = y * a.ex_w[pr];
                } else {
                    a.y[p][(size_t)t * a.out[p] + local] = y;
                }
            }
        }
    }
    G4_TRACE_MARK(3);
}

/* A weight type's constants of the kernel's templates, for the host's launch decisions */
typedef struct gemv_type {
    int epa, unroll, i8, need_sum; /* wraw<DT>::EPA, wunroll<DT>::N, wraw<DT>::I8, wraw<DT>::NEED_SUM */
} gemv_type;
static inline gemv_type gemv_type_of(g4_dtype dt) {
    gemv_type g = {8, GEMV_UNROLL, 0, 0}; /* (f32: the default of launch_gemv_dt) */
    switch (dt) {
#define TYPE(T)                                                                                                    \
    case T: g.epa = wraw<T>::EPA, g.unroll = wunroll<T>::N, g.i8 = wraw<T>::I8, g.need_sum = wraw<T>::NEED_SUM; break;
        G4C_WEIGHT_TYPES(TYPE)
#undef TYPE
    default: break;
    }
    return g;
}

/* Input elements of a tile: as much of a row as c->gemv_smem holds for nt tokens (with a sum per 32 inputs for
 * the quantized types with offsets, int8 codes and a (d, sum) pair per 32 for those with int8 activations), a
 * multiple of 256. */
static inline int gemv_most(const g4c *c, int nt, g4_dtype t, int fa) {
    const gemv_type g = gemv_type_of(t);
    /* bytes per 32 inputs of a token (int8 activations unless float ones are asked for) */
    const size_t per32 = g.i8 && !fa ? 32 + 8 : 128 + (g.need_sum ? 4 : 0);
    return (int)(c->gemv_smem * 32 / per32) / nt / 256 * 256;
}

/* Blocks of kernel k (with smem bytes of dynamic shared memory) that fit on a multiprocessor at once, asked once
 * per kernel and size (a capped grid larger than one wave would run its last blocks after the others: ncu on the
 * H200 showed 1.33 waves for the 31B's 4-bit products, 78 registers a thread leaving room for 3 blocks, not 4). */
static inline int gemv_resident(g4c *c, void (*k)(gemv_args), size_t smem) {
    for (int i = 0; i < c->n_resident; i++)
        if (c->resident[i].kernel == (const void *)k && c->resident[i].smem == smem) return c->resident[i].blocks;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, GEMV_THREADS, smem) != cudaSuccess || n < 1) n = 1;
    if (c->n_resident < G4C_RESIDENT_MAX) {
        c->resident[c->n_resident].kernel = (const void *)k;
        c->resident[c->n_resident].smem = smem;
        c->resident[c->n_resident++].blocks = n;
    }
    return n;
}

template <int DT, int RP, bool FA, bool EX = false> static void launch_gemv_nt(g4c *c, gemv_args a, unsigned row_blocks) {
    const int nt = a.n <= 1 ? 1 : a.n <= 2 ? 2 : a.n <= 4 ? 4 : 8;
    if (!a.xrows) a.xrows = a.n;
    const int sn = a.xrows > nt ? a.xrows : nt; /* rows of the staged tile */
    const int in8 = (a.in + 7) & ~7, most = gemv_most(c, sn, (g4_dtype)DT, FA);
    a.ktile = in8 <= most ? in8 : most;
    size_t smem = (size_t)sn * a.ktile * sizeof(float) + (wraw<DT>::NEED_SUM ? (size_t)sn * (a.ktile / 32) * 4 : 0);
    /* (int8 activations: the sums are those of the codes, beside each block's d) */
    if (wraw<DT>::I8 && !FA) /* codes, (d, sum) pairs */
        smem = (size_t)sn * a.ktile + (size_t)sn * (a.ktile / 32) * 8;
    void (*k)(gemv_args) = EX        ? gemv_kernel<DT, 1, RP, FA, true> /* (one token) */
                           : nt == 1 ? gemv_kernel<DT, 1, RP, FA>
                           : nt == 2 ? gemv_kernel<DT, 2, RP, FA>
                           : nt == 4 ? gemv_kernel<DT, 4, RP, FA>
                                     : gemv_kernel<DT, 8, RP, FA>;
    /* one tile: a block may own several row groups (a grid of at most one wave, gemv_cap blocks a
     * multiprocessor); several tiles: every group has its block */
    unsigned blocks = row_blocks;
    const int groups = GEMV_WARPS / a.wpr * (32 / a.lpr);
    a.rpb = groups;
    if (a.ktile == in8) {
        int per_sm = gemv_resident(c, k, smem);
        if (per_sm > c->gemv_cap) per_sm = c->gemv_cap;
        if (blocks > (unsigned)(c->n_sm * per_sm)) blocks = (unsigned)(c->n_sm * per_sm);
        /* the same rows for every multiprocessor: k blocks each, fewer row groups a block where that evens them out
         * (E2B's o product, 1536 rows: 256 blocks of 6 rows instead of 192 of 8, so no multiprocessor holds 16);
         * several passes of a full grid: passes of equal size (E2B's 4-bit gate/up, 12288 rows in groups of 8 lanes:
         * two passes of 47 rows a block, not 64 and then 29 for some blocks and none for the others; H200, decode
         * ms: 31B bf16 17.59 -> 17.21, 12B bf16 6.94 -> 6.86, 31B Q4_0 7.78 -> 7.63, E4B Q4_0 2.55 -> 2.51) */
        const int ksm = (int)((row_blocks + (unsigned)c->n_sm - 1) / (unsigned)c->n_sm);
        if (c->gemv_balance && ksm <= per_sm) {
            const int want = c->n_sm * ksm;
            a.rpb = (a.rows + want - 1) / want;
            blocks = (unsigned)((a.rows + a.rpb - 1) / a.rpb);
        } else if (c->gemv_balance) {
            const int per_block = (int)((a.rows + blocks - 1) / blocks), passes = (per_block + groups - 1) / groups;
            a.rpb = (per_block + passes - 1) / passes;
        }
    }
    g4c_launch(c, k, dim3(blocks), dim3(GEMV_THREADS), smem, a);
}

template <int DT, int RP, bool FA> static void allow_gemv_smem_fa(g4c *c) {
    g4c_allow_smem(c, gemv_kernel<DT, 1, RP, FA>), g4c_allow_smem(c, gemv_kernel<DT, 2, RP, FA>);
    g4c_allow_smem(c, gemv_kernel<DT, 4, RP, FA>), g4c_allow_smem(c, gemv_kernel<DT, 8, RP, FA>);
}
template <int DT, int RP> static void allow_gemv_smem(g4c *c) {
    allow_gemv_smem_fa<DT, RP, false>(c);
    if (wraw<DT>::I8) allow_gemv_smem_fa<DT, RP, true>(c);
    g4c_allow_smem(c, gemv_kernel<DT, 1, RP, false, true>); /* experts */
    if (wraw<DT>::I8) g4c_allow_smem(c, gemv_kernel<DT, 1, RP, true, true>);
}

/* float activations (fa) only matter for the types with int8 activations (wraw<DT>::I8); ex: experts */
template <int DT, int RP> static void launch_gemv_fa(g4c *c, const gemv_args &a, unsigned row_blocks, int fa, int ex) {
    if (ex && wraw<DT>::I8 && fa)
        launch_gemv_nt<DT, RP, true, true>(c, a, row_blocks);
    else if (ex)
        launch_gemv_nt<DT, RP, false, true>(c, a, row_blocks);
    else if (wraw<DT>::I8 && fa)
        launch_gemv_nt<DT, RP, true>(c, a, row_blocks);
    else
        launch_gemv_nt<DT, RP, false>(c, a, row_blocks);
}

/* One weight type's launch (pairs: gate/up pairs; fa: float activations; ex: a MoE block's experts) and its kernels'
 * shared-memory opt-ins (g4c_gemv_init). */
#define GEMV_TYPE_DECLARE(T)                                                                                       \
    void g4c_gemv_launch_##T(g4c *c, const gemv_args &a, unsigned row_blocks, int pairs, int fa, int ex);          \
    void g4c_gemv_allow_##T(g4c *c);
G4C_WEIGHT_TYPES(GEMV_TYPE_DECLARE)
#undef GEMV_TYPE_DECLARE
#define GEMV_TYPE_FUNCTIONS(T)                                                                                     \
    void g4c_gemv_launch_##T(g4c *c, const gemv_args &a, unsigned row_blocks, int pairs, int fa, int ex) {         \
        if (pairs)                                                                                                 \
            launch_gemv_fa<T, 2>(c, a, row_blocks, fa, ex);                                                        \
        else                                                                                                       \
            launch_gemv_fa<T, 1>(c, a, row_blocks, fa, ex);                                                        \
    }                                                                                                              \
    void g4c_gemv_allow_##T(g4c *c) { allow_gemv_smem<T, 1>(c), allow_gemv_smem<T, 2>(c); }

#endif
