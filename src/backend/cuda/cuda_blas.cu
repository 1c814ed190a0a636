/* Products of many tokens (prefill) on tensor cores, through cuBLAS (cuda_common.cuh: g4c_gemm_input,
 * g4c_gemm_run; a mixture's experts: g4c_gemm_experts, batched by padded token count).
 *
 * Weights stay as stored (bf16 or f16, rows padded to 8 elements); the activations are converted once per set of
 * products to the weights' 16-bit type, after the RMSNorm when the set has one. Products accumulate in f32.
 * Rounding the activations to bf16 costs about 3 significant digits, so by default the rounding remainder is
 * multiplied too (x = hi + lo, both bf16: near f32 accuracy for twice the tensor-core work); G4_CUDA_GEMM=bf16
 * or g4_load_params.bf16_activations rounds once (the usual engines' choice). f32 weights use an f32 product
 * (SGEMM). Quantized weights are decoded to bf16 tiles and, with their activations, rounded to bf16 once: the
 * file's own rounding is the larger error (their one-token products already read int8 activations), and the
 * precise form (weights and activations as hi + lo, three products) would cost 1.5-2.1x the prefill time
 * (H200, same call: 12B Q4_0 512 tokens 6601 -> 13213 tok/s, E4B Q4_0 11605 -> 19473; test_decoder's Q8_0 / MLX8
 * fixtures' closeness to transformers alike: position 0 within 0.07-0.15 and RMS 0.17-0.48x either way). The
 * precise form stays under G4_NO_INT8_ACT (comparisons of the stored weights' exact products) and
 * G4_CUDA_QGEMM=precise. The emulator computes the same products with plain loops. */
#include "backend/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>

#ifndef G4_CUDA_EMU
#include <cublas_v2.h>
#endif

#define BLAS_WS_BYTES ((size_t)32 << 20)
#define GROUP_MAX 256 /* products a batched call takes */
#define PAD_ROWS 16   /* experts' token rows are padded to a multiple of this for the batched products */

/* Whether x's hi and lo rows are multiplied by m weight rows as one product of 2n stacked rows (g4c_gemm_input lays
 * the lo rows right after the hi rows), its two halves then added: for up to c->fold_tokens tokens (G4_CUDA_FOLD_TOKENS,
 * default 2048) while the halves take at most FOLD_BYTES. The product of 2n rows takes the time of one of n rows where
 * the weights are small (H200, cuBLAS, 512 tokens: q/k/v 11-12 us either way) and less than two of n rows where they
 * are large (12288 x 1536: 60 against 70 us); E2B, 100 prompts of 128 tokens in steps of 512, kernel time 549 -> 470
 * ms with the sets' weights one product (g4c_gemm_set_stacked). */
#define FOLD_BYTES ((size_t)512 << 20)
static int stacked_parts(const g4c *c, const g4c_gemm_in *x, size_t m) {
    return x->lo && x->n <= c->fold_tokens && (size_t)2 * (size_t)x->n * m * sizeof(float) <= FOLD_BYTES &&
           x->lo == (const unsigned char *)x->hi + (size_t)x->n * (size_t)x->in * 2;
}

/* x' rows into 16-bit hi (and lo) parts, or f32 (t == G4_F32, only when normalized), or int8 blocks (t == G4_Q8_0,
 * g4c_q8_rows: codes into hi, (d, sum of q) into lo; in % 32 == 0); with res_o, each row first
 * becomes (x + rmsnorm(res_o) w) s, written to upd (the residual prologue of a set, g4c_residual's arithmetic).
 * A block a row. Rows of a multiple of 4 floats up to 4 x 1024 x CONV_NV (VEC): each thread keeps its float4s of the
 * row in registers from the one read to the writes (a row read once from memory, its loads all in flight together);
 * other rows loop over the row for each pass. */
#define CONV_NV 4
/* One block of 32 as int8 codes (d = max|v| / 127, q = rint(v / d)) held by 8 consecutive lanes, 4 values each (e):
 * every lane of the warp takes part (the shuffles); where store (the lane's values are the row's) its 4 codes go to
 * q4, and the group's first lane writes the block's (d, sum of q) to ds (gemm_convert's int8 target) */
static __device__ __forceinline__ void q8_block_8_lanes(const float e[4], bool store, signed char *q4, float2 *ds) {
    float m = fmaxf(fmaxf(fabsf(e[0]), fabsf(e[1])), fmaxf(fabsf(e[2]), fabsf(e[3])));
    for (int sh = 1; sh < 8; sh <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, sh));
    const float d = m / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[4], sq = 0;
    for (int k = 0; k < 4; k++) q[k] = __float2int_rn(e[k] * id), sq += q[k];
    for (int sh = 1; sh < 8; sh <<= 1) sq += __shfl_xor_sync(0xffffffffu, sq, sh);
    if (store) {
        *(unsigned *)q4 = (unsigned)(q[0] & 255) | (unsigned)(q[1] & 255) << 8 | (unsigned)(q[2] & 255) << 16 |
                          (unsigned)(q[3] & 255) << 24;
        if ((threadIdx.x & 7) == 0) *ds = make_float2(d, (float)sq);
    }
}
template <bool VEC>
__global__ void gemm_convert(const float *x, int in, const float *norm, float eps, int t, void *hi, void *lo,
                             const float *res_o, const float *w, float s, float *upd, int ostride) {
    __shared__ float red[32];
    g4_grid_wait();
    const size_t o = (size_t)blockIdx.x * (size_t)in, oo = (size_t)blockIdx.x * (size_t)ostride; /* x's row, hi/lo's */
    const float *xr = x + o;
    if (VEC) {
        const int n4 = in / 4;
        float4 v[CONV_NV];
#pragma unroll
        for (int j = 0; j < CONV_NV; j++) {
            const int i = threadIdx.x + j * (int)blockDim.x;
            v[j] = i < n4 ? ((const float4 *)xr)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float ss = 0.0f;
        if (res_o) {
            float4 r[CONV_NV];
#pragma unroll
            for (int j = 0; j < CONV_NV; j++) {
                const int i = threadIdx.x + j * (int)blockDim.x;
                r[j] = i < n4 ? ((const float4 *)(res_o + o))[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                ss += r[j].x * r[j].x + r[j].y * r[j].y + r[j].z * r[j].z + r[j].w * r[j].w;
            }
            const float inv_o = rsqrtf(g4_block_sum(ss, red) / (float)in + eps);
            ss = 0.0f;
#pragma unroll
            for (int j = 0; j < CONV_NV; j++) {
                const int i = threadIdx.x + j * (int)blockDim.x;
                if (i < n4) {
                    const float4 wv = ((const float4 *)w)[i];
                    v[j].x = (v[j].x + r[j].x * inv_o * wv.x) * s, v[j].y = (v[j].y + r[j].y * inv_o * wv.y) * s;
                    v[j].z = (v[j].z + r[j].z * inv_o * wv.z) * s, v[j].w = (v[j].w + r[j].w * inv_o * wv.w) * s;
                    ((float4 *)(upd + o))[i] = v[j];
                }
            }
        }
        float inv = 1.0f;
        if (norm) {
            ss = 0.0f;
#pragma unroll
            for (int j = 0; j < CONV_NV; j++) ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
            inv = rsqrtf(g4_block_sum(ss, red) / (float)in + eps);
        }
#pragma unroll
        for (int j = 0; j < CONV_NV; j++) {
            const int i = threadIdx.x + j * (int)blockDim.x;
            if (t == G4_Q8_0) { /* int8 blocks (in % 32 == 0): 8 consecutive threads hold a block's 32 elements */
                if (j * (int)blockDim.x >= n4) break; /* (whole passes past the row: the block's threads alike) */
                float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (i < n4) {
                    const float4 nv = norm ? ((const float4 *)norm)[i] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
                    e[0] = v[j].x * nv.x * inv, e[1] = v[j].y * nv.y * inv, e[2] = v[j].z * nv.z * inv;
                    e[3] = v[j].w * nv.w * inv;
                }
                q8_block_8_lanes(e, i < n4, (signed char *)hi + o + 4 * (size_t)i, (float2 *)lo + o / 32 + i / 8);
                continue;
            }
            if (i >= n4) continue;
            float e[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
            if (norm) {
                const float4 nv = ((const float4 *)norm)[i];
                e[0] *= inv * nv.x, e[1] *= inv * nv.y, e[2] *= inv * nv.z, e[3] *= inv * nv.w;
            }
            if (t == G4_F32) {
                ((float4 *)((float *)hi + oo))[i] = make_float4(e[0], e[1], e[2], e[3]);
                continue;
            }
            uint16_t h[4], l[4];
            for (int k = 0; k < 4; k++) {
                h[k] = t == G4_BF16 ? g4_f2bf(e[k]) : g4_f2h(e[k]);
                l[k] = t == G4_BF16 ? g4_f2bf(e[k] - g4_bf2f(h[k])) : g4_f2h(e[k] - g4_h2f(h[k]));
            }
            ((uint2 *)((uint16_t *)hi + oo))[i] = make_uint2((unsigned)h[0] | (unsigned)h[1] << 16,
                                                             (unsigned)h[2] | (unsigned)h[3] << 16);
            if (lo)
                ((uint2 *)((uint16_t *)lo + oo))[i] = make_uint2((unsigned)l[0] | (unsigned)l[1] << 16,
                                                                 (unsigned)l[2] | (unsigned)l[3] << 16);
        }
    } else {
        if (res_o) {
            const float *orow = res_o + o;
            float *ur = upd + o;
            const float inv_o = g4_row_inv_rms(orow, in, eps, red);
            for (int i = threadIdx.x; i < in; i += blockDim.x) ur[i] = (xr[i] + orow[i] * inv_o * w[i]) * s;
            __syncthreads(); /* (the block's own writes, read back below) */
            xr = ur;
        }
        const float inv = norm ? g4_row_inv_rms(xr, in, eps, red) : 1.0f;
        if (t == G4_Q8_0) { /* int8 blocks (in % 32 == 0): 4 elements a thread, 8 threads a block of 32 */
            for (int base = 0; base < in / 4; base += blockDim.x) {
                const int i = base + threadIdx.x; /* (every thread in each pass: the shuffles) */
                float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (i < in / 4)
                    for (int k = 0; k < 4; k++) e[k] = (norm ? xr[4 * i + k] * norm[4 * i + k] : xr[4 * i + k]) * inv;
                q8_block_8_lanes(e, i < in / 4, (signed char *)hi + o + 4 * (size_t)i, (float2 *)lo + o / 32 + i / 8);
            }
            return;
        }
        for (int i = threadIdx.x; i < in; i += blockDim.x) {
            float v = norm ? xr[i] * inv * norm[i] : xr[i];
            if (t == G4_F32) {
                ((float *)hi)[oo + i] = v;
            } else if (t == G4_BF16) {
                uint16_t h = g4_f2bf(v);
                ((uint16_t *)hi)[oo + i] = h;
                if (lo) ((uint16_t *)lo)[oo + i] = g4_f2bf(v - g4_bf2f(h));
            } else {
                uint16_t h = g4_f2h(v);
                ((uint16_t *)hi)[oo + i] = h;
                if (lo) ((uint16_t *)lo)[oo + i] = g4_f2h(v - g4_h2f(h));
            }
        }
    }
}

void g4c_q8_rows(g4c *c, const float *x, int n, int in, const float *norm, float eps, const g4_matmul_set *res,
                 signed char *xq, float2 *xd) {
    if (n <= 0) return;
    if (res && !res->res_out) res = NULL;
    const float *ro = res ? res->res_o : (const float *)NULL, *rw = res ? res->res_w : (const float *)NULL;
    float *upd = res ? res->res_out : (float *)NULL;
    const float rs = res ? res->res_scale : 1.0f;
    if (res) x = res->res_h;
    const int n4 = in / 4;
    if (((uintptr_t)x | (uintptr_t)ro | (uintptr_t)rw | (uintptr_t)upd | (uintptr_t)norm) % 16 == 0 &&
        n4 <= 1024 * CONV_NV) { /* (in % 32 == 0) a row read once, its blocks quantized by groups of 8 threads */
        const int per = (n4 + CONV_NV - 1) / CONV_NV, threads = per <= 256 ? 256 : (per + 31) / 32 * 32;
        g4c_launch(c, gemm_convert<true>, dim3((unsigned)n), dim3((unsigned)threads), 0, x, in, norm, eps, (int)G4_Q8_0,
                   (void *)xq, (void *)xd, ro, rw, rs, upd, in);
        return;
    }
    g4c_launch(c, gemm_convert<false>, dim3((unsigned)n), dim3(1024), 0, x, in, norm, eps, (int)G4_Q8_0, (void *)xq,
               (void *)xd, ro, rw, rs, upd, in);
}

static int gemm_input(g4c *c, const float *x, int n, int in, const float *norm, float eps, g4_dtype t, g4c_gemm_in *out,
                      const g4_matmul_set *res, int pairs) {
    memset(out, 0, sizeof *out);
    const int quant = g4_dtype_is_quantized(t);
    if (quant) t = G4_BF16; /* quantized weights are decoded to bf16 tiles (g4c_gemm_run) */
    out->n = n;
    out->in = in;
    out->t = t;
    if (res && !res->res_out) res = NULL;
    if (res) x = res->res_h;
    if (t == G4_F32 && !norm) {
        if (res) g4c_residual(c, res->res_h, res->res_o, res->res_w, n, in, res->eps, res->res_scale, res->res_out);
        out->hi = res ? res->res_out : x;
        return 0;
    }
    /* the lo rows right after the hi rows (one product of both, gemm_rows), or each row's lo right after its hi
     * (pairs), then 2 PAD_ROWS rows of slack: the experts' padded products read past the last row (g4c_gemm_experts) */
    const size_t esz = t == G4_F32 ? 4 : 2, rows = (size_t)n * (size_t)in * esz;
    const int split = t != G4_F32 && (quant ? c->qgemm_split : c->gemm_split);
    unsigned char *ws =
        (unsigned char *)g4c_ws(c, &c->ws_x16, (split ? 2 * rows : rows) + (size_t)2 * PAD_ROWS * (size_t)in * esz);
    if (!ws) return -1;
    out->pairs = split && pairs;
    out->hi = ws;
    out->lo = !split ? NULL : out->pairs ? ws + (size_t)in * esz : ws + rows;
    const int ostride = out->pairs ? 2 * in : in;
    const float *ro = res ? res->res_o : (const float *)NULL, *rw = res ? res->res_w : (const float *)NULL;
    float *upd = res ? res->res_out : (float *)NULL;
    const float rs = res ? res->res_scale : 1.0f;
    /* (norm weights, residual rows and scratch are 16-byte aligned allocations: rows of a multiple of 4 floats are) */
    const int n4 = in / 4, aligned = in % 4 == 0 && ((uintptr_t)x | (uintptr_t)ro | (uintptr_t)rw | (uintptr_t)upd |
                                                     (uintptr_t)norm) % 16 == 0;
    if (aligned && n4 <= 1024 * CONV_NV) {
        const int per = (n4 + CONV_NV - 1) / CONV_NV, threads = per <= 256 ? 256 : (per + 31) / 32 * 32;
        g4c_launch(c, gemm_convert<true>, dim3((unsigned)n), dim3((unsigned)threads), 0, x, in, norm, eps, (int)t,
                   (void *)out->hi, (void *)out->lo, ro, rw, rs, upd, ostride);
    } else {
        g4c_launch(c, gemm_convert<false>, dim3((unsigned)n), dim3(256), 0, x, in, norm, eps, (int)t, (void *)out->hi,
                   (void *)out->lo, ro, rw, rs, upd, ostride);
    }
    return 0;
}

int g4c_gemm_input(g4c *c, const float *x, int n, int in, const float *norm, float eps, g4_dtype t, g4c_gemm_in *out,
                   const g4_matmul_set *res) {
    return gemm_input(c, x, n, in, norm, eps, t, out, res, 0);
}

int g4c_gemm_input_pairs(g4c *c, const float *x, int n, int in, const float *norm, float eps, g4_dtype t,
                         g4c_gemm_in *out) {
    return gemm_input(c, x, n, in, norm, eps, t, out, NULL, 1);
}

/* output element r of product p's row: its sum g (+ bias), then the set's epilogue with the up sum u or the
 * multiplier m */
static __device__ __forceinline__ float fold_out(const g4c_fold_args &a, int p, int r, float g, float u, float m) {
    float y = g + (a.bias[p] ? a.bias[p][r] : 0.0f);
    if (a.geglu == 1) y = g4_gelu_tanh(y) * (u + (a.bias[1] ? a.bias[1][r] : 0.0f));
    if (a.geglu == 2) y = g4_gelu_tanh(y) * m;
    if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
    return y;
}

/* g4c_gemm_fold's kernel; V4: four outputs at a time */
template <bool V4> __global__ void gemm_fold_kernel(g4c_fold_args a) {
    g4_grid_wait();
    g4_grid_launch_dependents();
    const int ranges = a.geglu == 1 ? 1 : a.count;
    const size_t total = a.end[ranges - 1], step = (size_t)gridDim.x * blockDim.x * (V4 ? 4 : 1);
    for (size_t g = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * (V4 ? 4 : 1); g < total; g += step) {
        int p = 0;
        while (g >= a.end[p]) p++;
        const size_t i = g - (p ? a.end[p - 1] : 0), t = i / (size_t)a.out[p];
        const int r = (int)(i % (size_t)a.out[p]);
        const size_t s = t * (size_t)a.ld[p] + (size_t)r, h = (size_t)a.n * (size_t)a.ld[p]; /* hi at s, lo at h + s */
        float *d = a.y[p] + t * (size_t)a.ldy[p] + (size_t)r;
        if (V4) {
            const float4 y0 = __ldcg((const float4 *)(a.y2[p] + s)), y1 = __ldcg((const float4 *)(a.y2[p] + h + s));
            float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f), m = u;
            if (a.geglu == 1) { /* (the pair: up has gate's shape and stride) */
                const float4 u0 = __ldcg((const float4 *)(a.y2[1] + s)), u1 = __ldcg((const float4 *)(a.y2[1] + h + s));
                u = make_float4(u0.x + u1.x, u0.y + u1.y, u0.z + u1.z, u0.w + u1.w);
            }
            if (a.geglu == 2) m = *(const float4 *)(a.mul + i);
            float4 v = make_float4(fold_out(a, p, r, y0.x + y1.x, u.x, m.x), fold_out(a, p, r + 1, y0.y + y1.y, u.y, m.y),
                                   fold_out(a, p, r + 2, y0.z + y1.z, u.z, m.z), fold_out(a, p, r + 3, y0.w + y1.w, u.w, m.w));
            if (a.acc) {
                const float4 c0 = *(const float4 *)d;
                v = make_float4(c0.x + v.x, c0.y + v.y, c0.z + v.z, c0.w + v.w);
            }
            *(float4 *)d = v;
        } else {
            const float u = a.geglu == 1 ? a.y2[1][s] + a.y2[1][h + s] : 0.0f, m = a.geglu == 2 ? a.mul[i] : 0.0f;
            const float v = fold_out(a, p, r, a.y2[p][s] + a.y2[p][h + s], u, m);
            *d = a.acc ? *d + v : v;
        }
    }
}

void g4c_gemm_fold(g4c *c, g4c_fold_args *f) {
    int v4 = (uintptr_t)f->mul % 16 == 0;
    for (int i = 0; i < f->count; i++) {
        if (!f->ldy[i]) f->ldy[i] = f->out[i];
        f->end[i] = (i ? f->end[i - 1] : 0) + (size_t)f->n * (size_t)f->out[i];
        v4 &= f->out[i] % 4 == 0 && f->ld[i] % 4 == 0 && f->ldy[i] % 4 == 0 && (uintptr_t)f->y2[i] % 16 == 0 &&
              (uintptr_t)f->y[i] % 16 == 0;
    }
    const size_t total = f->end[f->geglu == 1 ? 0 : f->count - 1] / (v4 ? 4 : 1);
    unsigned blocks = (unsigned)((total + 255) / 256);
    if (blocks > (unsigned)c->n_sm * 16) blocks = (unsigned)c->n_sm * 16;
    g4c_launch(c, v4 ? gemm_fold_kernel<true> : gemm_fold_kernel<false>, dim3(blocks), dim3(256), 0, *f);
}

#ifdef G4_CUDA_EMU
static float elem(const void *p, size_t i, g4_dtype t) {
    if (t == G4_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == G4_BF16 ? g4_bf16_to_f32(h) : g4_f16_to_f32(h);
}

/* y[t, 0..m) (row stride ldc) = x' A^T (acc: y +=) for A [m, lda] of dtype t */
static void gemm_plain(g4c *c, const g4c_gemm_in *x, const void *A, g4_dtype t, int lda, int m, float *y, int ldc,
                       int acc) {
    (void)c;
    for (int tk = 0; tk < x->n; tk++)
        for (int r = 0; r < m; r++) {
            float s = 0.0f;
            for (int k = 0; k < x->in; k++) {
                float xv = elem(x->hi, (size_t)tk * x->in + k, x->t);
                if (x->lo) xv += elem(x->lo, (size_t)tk * x->in + k, x->t);
                s += elem(A, (size_t)r * (size_t)lda + k, t) * xv;
            }
            y[(size_t)tk * ldc + r] = acc ? y[(size_t)tk * ldc + r] + s : s;
        }
}

/* y2 [2n, m] = the hi rows' products, then the lo rows' (x's parts stacked) */
static void gemm_stacked(g4c *c, const g4c_gemm_in *x, const void *A, g4_dtype t, int lda, int m, float *y2) {
    const g4c_gemm_in hi = {x->hi, NULL, x->n, x->in, t, 0}, lo = {x->lo, NULL, x->n, x->in, t, 0};
    gemm_plain(c, &hi, A, t, lda, m, y2, m, 0);
    gemm_plain(c, &lo, A, t, lda, m, y2 + (size_t)x->n * m, m, 0);
}

int g4c_blas_init(g4c *c, g4_error *err) {
    (void)err;
    c->blas = NULL;
    return 0;
}
void g4c_blas_free(g4c *c) { (void)c; }
#else
static const char *blas_status(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "out of memory";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

static void blas_note(g4c *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS || c->error != cudaSuccess) return;
    c->error = cudaErrorUnknown;
    snprintf(c->error_what, sizeof c->error_what, "cuBLAS %s: %s", what, blas_status(s));
}

static const char blas_key = 0; /* the profile's entry of every product */

/* y2 [2n, m] = x' A^T for x's hi rows, then its lo rows: one product of the stacked rows (stacked_parts); A's
 * rows lda elements apart */
static void gemm_stacked(g4c *c, const g4c_gemm_in *x, const void *A, g4_dtype t, int lda, int m, float *y2) {
    const float one = 1.0f, nil = 0.0f;
    const cudaDataType_t ct = t == G4_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    if (c->profile) g4c_profile_begin(c);
    blas_note(c,
              cublasGemmEx((cublasHandle_t)c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, 2 * x->n, x->in, &one, A, ct, lda,
                           x->hi, ct, x->in, &nil, y2, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "gemm (stacked parts)");
    if (c->profile) g4c_profile_end_named(c, &blas_key, "cuBLAS (all products)");
}

/* y[t, 0..m) (row stride ldc) = x' A^T (acc: y +=) for A [m, lda] of dtype t (f32 weights: an f32 product), as
 * one product (x's lo part, when it has one, a second product accumulated onto the first) */
static void gemm_plain(g4c *c, const g4c_gemm_in *x, const void *A, g4_dtype t, int lda, int m, float *y, int ldc,
                       int acc) {
    cublasHandle_t h = (cublasHandle_t)c->blas;
    const float one = 1.0f, zero = acc ? 1.0f : 0.0f;
    if (c->profile) g4c_profile_begin(c);
    if (t == G4_F32) {
        blas_note(c,
                  cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, x->n, x->in, &one, (const float *)A, lda,
                              (const float *)x->hi, x->in, &zero, y, ldc),
                  "sgemm");
        if (c->profile) g4c_profile_end_named(c, &blas_key, "cuBLAS (all products)");
        return;
    }
    const cudaDataType_t ct = t == G4_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    blas_note(c,
              cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, x->n, x->in, &one, A, ct, lda, x->hi, ct, x->in, &zero, y,
                           CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "gemm");
    if (x->lo)
        blas_note(c,
                  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, x->n, x->in, &one, A, ct, lda, x->lo, ct, x->in, &one, y,
                               CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "gemm (low part)");
    if (c->profile) g4c_profile_end_named(c, &blas_key, "cuBLAS (all products)");
}

int g4c_blas_init(g4c *c, g4_error *err) {
    cublasHandle_t h;
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) return g4_fail(err, "cuBLAS: cannot start (%s)", blas_status(s));
    c->blas = h;
    cublasSetStream(h, c->stream);
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    /* a fixed workspace: cuBLAS then allocates nothing while a step is recorded */
    if (cudaMalloc(&c->blas_ws, BLAS_WS_BYTES) != cudaSuccess) {
        cublasDestroy(h);
        c->blas = NULL;
        return g4_fail(err, "out of GPU memory for cuBLAS's workspace");
    }
    cublasSetWorkspace(h, c->blas_ws, BLAS_WS_BYTES);
    return 0;
}

void g4c_blas_free(g4c *c) {
    if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    c->blas = NULL;
    c->blas_ws = NULL;
}
#endif

/* y[t, 0..m) (row stride ldc) = x' A^T (acc: y +=) for A [m, lda] of dtype t (f32 weights: an f32 product).
 * Activations as hi + lo parts for a few tokens (at most c->fold_tokens, the lo rows right after the hi rows, as
 * g4c_gemm_input lays them out): one product of the 2n stacked rows, so the weights are read once, then its
 * halves added (H200, E2B bf16 decode of 64 sequences: two calls read the weights twice at ~1 TB/s); the same
 * sum as the low part's product accumulated onto the high part's. */
static void gemm_rows(g4c *c, const g4c_gemm_in *x, const void *A, g4_dtype t, int lda, int m, float *y, int ldc,
                      int acc) {
    if (t != G4_F32 && stacked_parts(c, x, (size_t)m)) {
        float *y2 = (float *)g4c_ws(c, &c->ws_fold, (size_t)2 * (size_t)x->n * (size_t)m * sizeof(float));
        if (!y2) return;
        gemm_stacked(c, x, A, t, lda, m, y2);
        g4c_fold_args f;
        memset(&f, 0, sizeof f);
        f.y2[0] = y2, f.ld[0] = m, f.y[0] = y, f.ldy[0] = ldc, f.out[0] = m, f.count = 1, f.n = x->n, f.acc = acc;
        g4c_gemm_fold(c, &f);
        return;
    }
    gemm_plain(c, x, A, t, lda, m, y, ldc, acc);
}


int g4c_gemm_set_stacked(g4c *c, const g4c_gemm_in *x, const g4_tensor *const *w, int count, float **y2, int *ld) {
    size_t m_all = 0;
    for (int i = 0; i < count; i++) m_all += (size_t)w[i]->shape[0];
    if (x->t == G4_F32 || !stacked_parts(c, x, m_all)) return 0;
    const int lda = (int)(g4c_row_bytes(x->t, x->in) / 2);
    int first[G4_MATMUL_SET_MAX], rows[G4_MATMUL_SET_MAX] = {0}, col[G4_MATMUL_SET_MAX];
    size_t at[G4_MATMUL_SET_MAX + 1] = {0};
    int runs = 0;
    for (int i = 0; i < count; i++) { /* runs of weights that follow each other in memory: one product each */
        if (w[i]->dtype != x->t) return 0;
        const int m = (int)w[i]->shape[0];
        const int joins = i > 0 && w[i]->data == (const unsigned char *)w[i - 1]->data +
                                                     (size_t)w[i - 1]->shape[0] * (size_t)lda * 2;
        if (!joins) first[runs++] = i;
        col[i] = rows[runs - 1];
        rows[runs - 1] += m;
    }
    for (int r = 0; r < runs; r++) /* 256-byte starts */
        at[r + 1] = at[r] + ((size_t)2 * (size_t)x->n * (size_t)rows[r] + 63) / 64 * 64;
    float *ws = (float *)g4c_ws(c, &c->ws_fold, at[runs] * sizeof(float));
    if (!ws) return -1;
    for (int r = 0, i = 0; r < runs; r++) {
        gemm_stacked(c, x, w[first[r]]->data, x->t, lda, rows[r], ws + at[r]);
        for (; i < count && (r + 1 == runs || i < first[r + 1]); i++) y2[i] = ws + at[r] + col[i], ld[i] = rows[r];
    }
    return 1;
}

/* y_i = x_i A_i^T for i < count, of one shape: A_i [m, lda] of 16-bit type t, x_i [n, k], y_i rows ldc apart (acc:
 * +=): one batched call (cuBLAS's grouped call, which would take shapes that differ, declines f32 outputs of 16-bit
 * products: H200, cuBLAS 13, status 15); where cuBLAS declines (and in the emulator), one call a product. */
static void gemm_batched(g4c *c, int count, const void *const *A, const void *const *B, float *const *C, int m, int n,
                         int k, int lda, int ldc, g4_dtype t, int acc) {
#ifndef G4_CUDA_EMU
    static const char key = 0;
    if (count <= GROUP_MAX) {
        const void *ptrs[3 * GROUP_MAX];
        for (int i = 0; i < count; i++) ptrs[i] = A[i], ptrs[count + i] = B[i], ptrs[2 * count + i] = C[i];
        const void **dev = (const void **)g4c_ws(c, &c->ws_grp, sizeof ptrs);
        if (!dev) return;
        g4c_copy_to_device(c, dev, ptrs, (size_t)3 * (size_t)count * sizeof *ptrs);
        const cudaDataType_t ct = t == G4_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
        if (c->profile) g4c_profile_begin(c);
        const cublasStatus_t st =
            cublasGemmBatchedEx((cublasHandle_t)c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dev, ct, lda,
                                dev + count, ct, k, &beta, (void *const *)(dev + 2 * count), CUDA_R_32F, ldc, count,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (c->profile) g4c_profile_end_named(c, &key, "cuBLAS batched (experts)");
        if (st == CUBLAS_STATUS_SUCCESS) return;
    }
#endif
    for (int i = 0; i < count; i++) {
        const g4c_gemm_in xi = {B[i], NULL, n, k, t, 0};
        gemm_rows(c, &xi, A[i], t, lda, m, C[i], ldc, acc);
    }
}

/* Plain weights are multiplied where they are; quantized ones a tile of rows at a time, decoded to bf16 in a
 * workspace (at most DEQ_ELEMS weights). In their precise mode (c->qgemm_split) the decoded weights are split like
 * the activations, w = hi + lo, and y = hi (x_hi + x_lo) + lo x_hi: about 16 significant bits on both sides
 * (the exact-weights comparison of test_decoder: a weight rounded to bf16 once moves these chaotic fixtures'
 * logits by more than 1). */
#define DEQ_ELEMS ((size_t)64 << 20)
void g4c_gemm_run(g4c *c, const g4c_gemm_in *x, const g4_tensor *w, float *y) {
    g4c_gemm_run_ld(c, x, w, y, (int)w->shape[0]);
}

g4c_gemm_in g4c_gemm_in_rows(const g4c_gemm_in *x, int r0, int n) {
    g4c_gemm_in r = *x;
    const size_t off = (size_t)r0 * (x->pairs ? 2 : 1) * (size_t)x->in * (x->t == G4_F32 ? 4 : 2);
    r.hi = (const unsigned char *)x->hi + off;
    if (x->lo) r.lo = (const unsigned char *)x->lo + off;
    r.n = n;
    return r;
}

void g4c_gemm_run_ld(g4c *c, const g4c_gemm_in *x, const g4_tensor *w, float *y, int ldc) {
    const int out = (int)w->shape[0];
    if (!g4_dtype_is_quantized(w->dtype)) {
        const int lda = (int)(g4c_row_bytes(w->dtype, x->in) / (size_t)(g4_dtype_bits(w->dtype) / 8));
        gemm_rows(c, x, w->data, w->dtype, lda, out, y, ldc, 0);
        return;
    }
    size_t per = DEQ_ELEMS / (size_t)x->in & ~(size_t)63; /* tiles of 64 rows: y + r0 stays 256-byte aligned (cuBLAS
                                                            * runs misaligned outputs at a fraction of its speed) */
    if (per < 64) per = 64;
    if (per > (size_t)out) per = (size_t)out;
    const int split = c->qgemm_split;
    const size_t tile_elems = per * (size_t)x->in;
    uint16_t *tile = (uint16_t *)g4c_ws(c, &c->ws_deq, tile_elems * 2 * (split ? 2 : 1));
    if (!tile) return;
    g4c_gemm_in xhi = *x;
    xhi.lo = NULL;
    for (int r0 = 0; r0 < out; r0 += (int)per) {
        const int m = out - r0 < (int)per ? out - r0 : (int)per;
        g4c_dequant_bf16(c, w, r0, m, tile, split ? tile + tile_elems : NULL);
        gemm_rows(c, x, tile, G4_BF16, x->in, m, y + r0, ldc, 0);
        if (split) gemm_rows(c, &xhi, tile + tile_elems, G4_BF16, x->in, m, y + r0, ldc, 1);
    }
}

/* dst row p (ldd apart) = src row map[p] (cols floats), plus the row after it with pairs (a row's hi and lo parts'
 * products) */
__global__ void rows_gather_kernel(const float *src, int cols, const int32_t *map, int rows, float *dst, int ldd,
                                   int pairs) {
    g4_grid_wait();
    for (int p = blockIdx.y; p < rows; p += gridDim.y) {
        const float *s = src + (size_t)map[p] * (size_t)cols;
        float *d = dst + (size_t)p * (size_t)ldd;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x)
            d[i] = pairs ? s[i] + s[(size_t)cols + i] : s[i];
    }
}

/* Experts of the same padded row count (a multiple of PAD_ROWS) go into one batched call; their outputs into a
 * padded scratch, then gathered to y's rows. A run of quantized experts is decoded at once (with the inactive ones
 * between them: few in prefill). f32 weights: a call an expert. An input of pairs (g4c_gemm_input_pairs) is one
 * call of both parts' rows, the pairs' products added in the gather (H200, 26B-A4B decode of 100 sequences: the
 * hi and lo parts as two calls read every active expert's weights twice). */
void g4c_gemm_experts(g4c *c, const g4c_gemm_in *x, const g4_tensor *w, int na, const int32_t *act_e,
                      const int32_t *act_off, const int32_t *act_cnt, float *y, int ldc) {
    const int R = (int)w->shape[1], in = x->in, quant = g4_dtype_is_quantized(w->dtype);
    const int split = quant && c->qgemm_split; /* the decoded weights as hi + lo parts */
    const size_t rb = g4c_wrow_bytes(w), esz = x->t == G4_F32 ? 4 : 2;
    const int lda = quant ? in : (int)(g4c_row_bytes(w->dtype, in) / (size_t)(g4_dtype_bits(w->dtype) / 8));
    const g4_dtype t = quant ? G4_BF16 : w->dtype;
    if (t == G4_F32) {
        for (int i = 0; i < na; i++) {
            const g4c_gemm_in xi = g4c_gemm_in_rows(x, act_off[i], act_cnt[i]);
            gemm_rows(c, &xi, (const unsigned char *)w->data + (size_t)act_e[i] * (size_t)R * rb, t, lda, R,
                      y + (size_t)act_off[i] * (size_t)ldc, ldc, 0);
        }
        return;
    }
    for (int i0 = 0; i0 < na;) {
        int i1 = quant ? i0 + 1 : (na - i0 > GROUP_MAX ? i0 + GROUP_MAX : na);
        uint16_t *tile = NULL;
        size_t span = 0;
        if (quant) {
            while (i1 < na && i1 - i0 < GROUP_MAX && act_e[i1] > act_e[i1 - 1] &&
                   (size_t)(act_e[i1] - act_e[i0] + 1) * (size_t)R * (size_t)in <= DEQ_ELEMS)
                i1++;
            span = (size_t)(act_e[i1 - 1] - act_e[i0] + 1) * (size_t)R;
            tile = (uint16_t *)g4c_ws(c, &c->ws_deq, span * (size_t)in * 2 * (split ? 2 : 1));
            if (!tile) return;
            g4c_dequant_bf16(c, w, (int64_t)act_e[i0] * R, (int)span, tile, split ? tile + span * (size_t)in : NULL);
        }
        const int ne = i1 - i0, row0 = act_off[i0], rows = act_off[i1 - 1] + act_cnt[i1 - 1] - row0;
        const int K = x->pairs ? 2 : 1; /* rows a token has in x and in the outputs */
        int pc[GROUP_MAX], srow[GROUP_MAX], done[GROUP_MAX], padded = 0;
        for (int j = 0; j < ne; j++) {
            pc[j] = (act_cnt[i0 + j] + PAD_ROWS - 1) / PAD_ROWS * PAD_ROWS * K;
            srow[j] = padded, padded += pc[j], done[j] = 0;
        }
        float *scr = (float *)g4c_ws(c, &c->ws_pad, (size_t)padded * (size_t)R * 4);
        int32_t *map = (int32_t *)malloc((size_t)rows * sizeof *map);
        int32_t *dmap = (int32_t *)g4c_ws(c, &c->ws_map, (size_t)rows * sizeof *map);
        if (!scr || !map || !dmap) {
            free(map);
            if (map) g4c_note(c, cudaErrorMemoryAllocation, "moe: out of host memory");
            return;
        }
        for (int j = 0; j < ne; j++) { /* the batches: experts of one padded count */
            if (done[j] || !pc[j]) continue;
            const void *A[GROUP_MAX], *Al[GROUP_MAX], *B[GROUP_MAX], *Bl[GROUP_MAX];
            float *C[GROUP_MAX];
            int nb = 0;
            for (int l = j; l < ne; l++) {
                if (done[l] || pc[l] != pc[j]) continue;
                const int i = i0 + l;
                done[l] = 1;
                if (quant) {
                    A[nb] = tile + (size_t)(act_e[i] - act_e[i0]) * (size_t)R * (size_t)in;
                    Al[nb] = (const uint16_t *)A[nb] + span * (size_t)in;
                } else {
                    A[nb] = (const unsigned char *)w->data + (size_t)act_e[i] * (size_t)R * rb;
                }
                B[nb] = (const unsigned char *)x->hi + (size_t)act_off[i] * (size_t)K * (size_t)in * esz;
                Bl[nb] = x->lo ? (const unsigned char *)x->lo + (size_t)act_off[i] * (size_t)in * esz : NULL;
                C[nb++] = scr + (size_t)srow[l] * (size_t)R;
            }
            gemm_batched(c, nb, A, B, C, R, pc[j], in, lda, R, t, 0);
            if (x->lo && !x->pairs) gemm_batched(c, nb, A, Bl, C, R, pc[j], in, lda, R, t, 1);
            if (split && quant) gemm_batched(c, nb, Al, B, C, R, pc[j], in, lda, R, t, 1);
        }
        for (int j = 0; j < ne; j++)
            for (int r = 0; r < act_cnt[i0 + j]; r++) map[act_off[i0 + j] - row0 + r] = srow[j] + K * r;
        g4c_copy_to_device(c, dmap, map, (size_t)rows * sizeof *map);
        free(map);
        unsigned bx = (unsigned)((R + 255) / 256), by = (unsigned)(rows < 65535 ? rows : 65535);
        while (bx > 1 && (size_t)bx * by > (size_t)c->n_sm * 16) bx = (bx + 1) / 2;
        if (rows > 0)
            g4c_launch(c, rows_gather_kernel, dim3(bx, by), dim3(256), 0, (const float *)scr, R, (const int32_t *)dmap,
                       rows, y + (size_t)row0 * (size_t)ldc, ldc, (int)x->pairs);
        i0 = i1;
    }
}

G4_TRACE_TU(blas)
