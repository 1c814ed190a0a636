/* The mixture-of-experts block on the GPU (src/backend/backend.h: moe; docs/gemma4-text.md 3.7): routing,
 * grouping and the experts' products without a host round trip, reading only the chosen experts' weights.
 *
 * 0. the dense MLP when it is part of the op (args.mlp): for up to 8 tokens on a side branch (g4c_fork) after the
 *    router, which makes the residual in its prologue, so that its two products run beside the top-k and the
 *    experts (H200, 26B-A4B decode: bf16 3.60 -> 3.34-3.37 ms, Q4_0 2.99 -> 2.90, MLX4 3.55 -> 3.41); the combine
 *    waits for it (g4c_join). More tokens: first, through cuBLAS on the main stream.
 * 1. route: the router's logits from the normalized residual (a GEMV), then per token softmax, top-k (ties to
 *    the lower expert id), weights renormalized and scaled per expert;
 * 2. group: the (token, k) pairs sorted by expert, the list of active experts with their pairs' range;
 * For many tokens (prefill) steps 3 and 4 are tensor-core products of the active experts (moe_experts_gemm, cuBLAS);
 * for steps of 2 to c->moe_tc_tokens tokens with bf16 experts (batched decode) they are tensor-core kernels of our own
 * (experts_tc_kernel: no host round trip, each expert's weights read once a pass of 16 tokens);
 * for one token (decode) they are the GEMV's (cuda_gemv.cu, g4c_gemv_experts: a grid of one wave whose
 * warps stream the chosen experts' rows, as for the dense products), the activations in the slots' order.
 * 3. gate_up (steps of up to 8 tokens whose experts the tensor-core kernels do not take: quantized or 16-bit float
 *    experts, rows not of multiples of 8): a block per (active expert, 8 rows): the expert's token rows staged in
 *    shared memory 8 at a time, a warp per intermediate row reads that expert's gate row and up row once per 8 pairs
 *    and writes gelu(gate) * up;
 * 4. down: likewise, a warp per 4 output rows, times the pair's routing weight;
 * 5. combine: per token, the sum of its k pairs' rows (in k order), then the branch's norms and the add:
 *    out = rmsnorm(dense) * post_norm1 + rmsnorm(sum) * post_norm2.
 * x2 = rmsnorm(residual) * pre_norm2 is stored only as the tensor-core kernels' hi/lo rows: the other experts' kernels
 * normalize the rows they stage.
 * Experts may be quantized (the decoders of cuda_common.cuh: a lane reads an access of EPA codes at a time), and
 * gate and up may be one tensor [E, 2 Im, H] or two [E, Im, H] (MLX files).
 * Grids are sized by the most experts a step can touch (min(E, n * top_k)); blocks of experts beyond the
 * active count return at once, so the launch does not depend on the routing. */
#include "backend/cuda/cuda_common.cuh"

#define MOE_NT 8

typedef struct moe_ws {
    int32_t *ids;     /* [n*TK] expert of each pair */
    float *w;         /* [n*TK] routing weight of each pair */
    int32_t *n_active;
    int32_t *act_e, *act_off, *act_cnt; /* [E] */
    int32_t *pairs;   /* [n*TK] pair ids (t*TK + k) grouped by expert, experts ascending */
    float *act;       /* [n*TK, Im] */
    float *dn;        /* [n*TK, H] */
    float *logits;    /* [n, E] router logits */
    float *inv2;      /* [n] 1/rms of the residual rows (for x2) */
    uint16_t *xhl;    /* (experts_tc) [n, 2 H] x2 as bf16 hi and lo parts, interleaved by 8 (hl_put) */
    uint16_t *ahl;    /* (experts_tc) [n*TK, 2 Im] the activations of the pairs in slot order, likewise */
} moe_ws;

typedef struct moe_args {
    const float *residual, *dense;
    float *out;
    const float *pre_norm2, *post_norm1, *post_norm2;
    int n, H, E, TK, Im;
    float eps;
    const unsigned char *gate_up, *down;
    const unsigned char *up; /* NULL: up rows follow the gate rows of each expert in gate_up */
    size_t gu_row, dn_row; /* bytes of a row */
    g4c_qrow qgu, qdn;     /* quantized experts: the rows' shapes for the decoders */
    const float *per_expert_scale;
    moe_ws ws;
} moe_args;

/* element i of a row of bf16 hi and lo parts interleaved by 8 (elements 8b .. 8b + 7 of the hi part, then of the lo
 * part): v = hi + lo to about 16 significant bits, as the products' activations elsewhere (cuda_blas.cu) */
static __device__ __forceinline__ void hl_put(uint16_t *row, int i, float v) {
    const uint16_t h = g4_f2bf(v);
    row[(i >> 3) * 16 + (i & 7)] = h;
    row[(i >> 3) * 16 + 8 + (i & 7)] = g4_f2bf(v - g4_bf2f(h));
}
/* elements 8b .. 8b + 7 of such a row at once (two 16-byte stores; the row 16-byte aligned) */
static __device__ __forceinline__ void hl_put8(uint16_t *row, int b, const float v[8]) {
    uint32_t hw[4], lw[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint16_t h0 = g4_f2bf(v[2 * i]), h1 = g4_f2bf(v[2 * i + 1]);
        hw[i] = (uint32_t)h0 | (uint32_t)h1 << 16;
        lw[i] = (uint32_t)g4_f2bf(v[2 * i] - g4_bf2f(h0)) | (uint32_t)g4_f2bf(v[2 * i + 1] - g4_bf2f(h1)) << 16;
    }
    uint4 *o = (uint4 *)row + 2 * b;
    o[0] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
    o[1] = make_uint4(lw[0], lw[1], lw[2], lw[3]);
}

/* 1. softmax and top-k of the router's logits: a warp per token, each lane holding E/32 logits */
#define MOE_MAX_E 256
__global__ void moe_topk_kernel(moe_args a, const float *logits) {
    __shared__ float red[32];
    g4_grid_wait();
    g4_grid_launch_dependents(); /* (a few blocks: the experts' GEMV may take its place on the GPU meanwhile) */
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    /* 1/rms of the residual row (all threads): x2 = residual * inv2 * pre_norm2, made where the experts' kernels read
     * it (the GEMV of one token's experts normalizes its staged row itself: no inv2, one warp) */
    if (a.ws.inv2) {
        const float *r = a.residual + (size_t)t * a.H;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < a.H; i += blockDim.x) ss += r[i] * r[i];
        ss = g4_block_sum(ss, red);
        const float inv = rsqrtf(ss / (float)a.H + a.eps);
        if (threadIdx.x == 0) a.ws.inv2[t] = inv;
        if (a.ws.xhl) /* x2's row as the tensor-core experts read it, 8 elements a thread (H % 8 == 0) */
            for (int b = threadIdx.x; b < a.H / 8; b += blockDim.x) {
                const float4 r0 = ((const float4 *)r)[2 * b], r1 = ((const float4 *)r)[2 * b + 1];
                const float4 w0 = ((const float4 *)a.pre_norm2)[2 * b], w1 = ((const float4 *)a.pre_norm2)[2 * b + 1];
                const float v[8] = {r0.x * (inv * w0.x), r0.y * (inv * w0.y), r0.z * (inv * w0.z), r0.w * (inv * w0.w),
                                    r1.x * (inv * w1.x), r1.y * (inv * w1.y), r1.z * (inv * w1.z), r1.w * (inv * w1.w)};
                hl_put8(a.ws.xhl + (size_t)t * 2 * a.H, b, v);
            }
    }
    if (threadIdx.x >= 32) return;
    const float *lg = logits + (size_t)t * a.E;
    float v[MOE_MAX_E / 32];
    int taken = 0; /* bit i: element lane + 32 i is chosen */
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < MOE_MAX_E / 32; i++) {
        const int e = lane + 32 * i;
        v[i] = e < a.E ? lg[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = g4_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MOE_MAX_E / 32; i++) {
        const int e = lane + 32 * i;
        v[i] = e < a.E ? expf(v[i] - mx) : -1.0f; /* probabilities before the division; -1: no expert */
        sum += e < a.E ? v[i] : 0.0f;
    }
    sum = g4_warp_sum(sum);
    int32_t *ids = a.ws.ids + (size_t)t * a.TK;
    float *w = a.ws.w + (size_t)t * a.TK;
    float wsum = 0.0f;
    for (int k = 0; k < a.TK; k++) {
        float bv = -2.0f;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MOE_MAX_E / 32; i++) {
            const int e = lane + 32 * i;
            if (!(taken >> i & 1) && e < a.E && (v[i] > bv || (v[i] == bv && e < be))) bv = v[i], be = e;
        }
        for (int o = 16; o > 0; o >>= 1) { /* the best of the warp; ties to the lower expert id */
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (ov > bv || (ov == bv && oe < be)) bv = ov, be = oe;
        }
        if ((be & 31) == lane) taken |= 1 << (be >> 5);
        const float pk = bv / sum;
        if (lane == 0) ids[k] = be, w[k] = pk;
        wsum += pk;
    }
    __syncwarp();
    if (lane < a.TK) w[lane] = w[lane] / wsum * a.per_expert_scale[ids[lane]];
    if (gridDim.x == 1) { /* one token: its experts, ascending, are the active list (no grouping kernel) */
        __syncwarp();
        if (lane < a.TK) {
            const int e = ids[lane];
            int rank = 0;
            for (int k = 0; k < a.TK; k++) rank += ids[k] < e;
            a.ws.act_e[rank] = e, a.ws.act_off[rank] = rank, a.ws.act_cnt[rank] = 1, a.ws.pairs[rank] = lane;
        }
        if (lane == 0) *a.ws.n_active = a.TK;
    }
}

/* 2. one block of MOE_GROUP_WARPS warps: each warp takes a contiguous share of the (token, k) pairs, 32 at a time,
 * and finds for each lane how many lanes before it picked the same expert (shuffles); pass 1 counts each expert's
 * pairs per warp, then the experts' offsets and each warp's start within them, pass 2 writes every pair to its slot:
 * each expert's pairs in (token, k) order. (The experts' ids staged in shared memory first when they fit.) H200,
 * 26B-A4B, 100 tokens (800 pairs): a thread an expert scanning every pair took 70 us. */
#define MOE_GROUP_WARPS 8
static __device__ __forceinline__ void group_rank(int my, int &rank, int &tot) {
    const int lane = threadIdx.x & 31;
    rank = 0, tot = 0;
    for (int j = 0; j < 32; j++) {
        const int v = __shfl_sync(0xffffffffu, my, j);
        tot += v == my;
        rank += v == my && j < lane;
    }
}

__global__ void moe_group_kernel(moe_args a, int staged) {
    G4_DYN_SMEM(int, cnt); /* [E], wcnt [MOE_GROUP_WARPS][E], then (staged) [n * TK] */
    g4_grid_wait();
    const int np = a.n * a.TK, E = a.E, w = threadIdx.x / 32, lane = threadIdx.x & 31;
    int *wcnt = cnt + E;
    const int32_t *ids = a.ws.ids;
    if (staged) {
        int *s = wcnt + MOE_GROUP_WARPS * E;
        for (int p = threadIdx.x; p < np; p += blockDim.x) s[p] = ids[p];
        ids = s;
    }
    for (int i = threadIdx.x; i < MOE_GROUP_WARPS * E; i += blockDim.x) wcnt[i] = 0;
    __syncthreads();
    const int seg = (np + MOE_GROUP_WARPS - 1) / MOE_GROUP_WARPS, p0 = w * seg, p1 = p0 + seg < np ? p0 + seg : np;
    int *mine = wcnt + w * E;
    for (int c0 = p0; c0 < p1; c0 += 32) { /* pass 1: the warp's count of each expert */
        const int p = c0 + lane, my = p < p1 ? ids[p] : -1;
        int rank, tot;
        group_rank(my, rank, tot);
        if (my >= 0 && rank == 0) mine[my] += tot;
        __syncwarp();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int t = 0;
        for (int v = 0; v < MOE_GROUP_WARPS; v++) t += wcnt[v * E + e];
        cnt[e] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* active experts ascending, their offsets */
        int na = 0, off = 0;
        for (int e = 0; e < E; e++) {
            if (!cnt[e]) continue;
            a.ws.act_e[na] = e;
            a.ws.act_off[na] = off;
            a.ws.act_cnt[na] = cnt[e];
            cnt[e] = off; /* now the expert's first slot */
            off += a.ws.act_cnt[na];
            na++;
        }
        *a.ws.n_active = na;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) { /* each warp's first slot of each expert */
        int at = cnt[e];
        for (int v = 0; v < MOE_GROUP_WARPS; v++) {
            const int t = wcnt[v * E + e];
            wcnt[v * E + e] = at;
            at += t;
        }
    }
    __syncthreads();
    for (int c0 = p0; c0 < p1; c0 += 32) { /* pass 2: every pair to its slot */
        const int p = c0 + lane, my = p < p1 ? ids[p] : -1;
        int rank, tot;
        group_rank(my, rank, tot);
        const int slot = my >= 0 ? mine[my] + rank : 0;
        __syncwarp();
        if (my >= 0) {
            a.ws.pairs[slot] = p;
            if (rank == 0) mine[my] += tot;
        }
        __syncwarp();
    }
}

/* 8 floats of a shared-memory row */
static __device__ __forceinline__ void srow8(const float *p, float *o) {
    const float4 u = *(const float4 *)p, v = *(const float4 *)(p + 4);
    o[0] = u.x, o[1] = u.y, o[2] = u.z, o[3] = u.w, o[4] = v.x, o[5] = v.y, o[6] = v.z, o[7] = v.w;
}

/* Copies up to MOE_NT rows of `in` floats (row pairs[j] / row_div of src) into xs [MOE_NT][ld], zero past
 * `in` (ld is `in` rounded up to 8); with a norm weight, row r times inv[r] * norm[k]. */
static __device__ __forceinline__ void stage_rows(float *xs, int ld, const float *src, int in, const int32_t *pairs,
                                                  int np, int row_div, const float *inv, const float *norm) {
    for (int i = threadIdx.x; i < np * ld; i += blockDim.x) {
        const int j = i / ld, k = i % ld, r = pairs[j] / row_div;
        float v = k < in ? src[(size_t)r * in + k] : 0.0f;
        if (norm && k < in) v *= inv[r] * norm[k];
        xs[i] = v;
    }
}

/* 3. gate/up of an active expert: block (8 intermediate rows, active slot); the expert's token rows are staged
 * in shared memory MOE_NT at a time, and a warp per row c reads gate row c and up row c once per chunk */
template <int DT> __global__ __launch_bounds__(256) void moe_gate_up_kernel(moe_args a) {
    G4_DYN_SMEM(float, xs); /* [MOE_NT][ldh] */
    g4_grid_wait();
    const int slot = blockIdx.y;
    if (slot >= *a.ws.n_active) return;
    const int lane = threadIdx.x & 31, c = blockIdx.x * 8 + (threadIdx.x >> 5), ldh = (a.H + 7) & ~7;
    const int e = a.ws.act_e[slot], off = a.ws.act_off[slot], cnt = a.ws.act_cnt[slot];
    const unsigned char *gr, *ur;
    if (a.up) {
        gr = a.gate_up + ((size_t)e * a.Im + c) * a.gu_row;
        ur = a.up + ((size_t)e * a.Im + c) * a.gu_row;
    } else {
        const unsigned char *base = a.gate_up + (size_t)e * 2 * a.Im * a.gu_row;
        gr = base + (size_t)c * a.gu_row, ur = base + (size_t)(a.Im + c) * a.gu_row;
    }
    float wg[4][8], wu[4][8];
    /* the first four chunks' weights of the first rows: in flight while the inputs are staged */
    if constexpr (DT < G4_Q4_0)
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (c < a.Im && lane * 8 + q * 256 < a.H) {
                g4_wload<DT>::load(gr, lane * 8 + q * 256, wg[q]);
                g4_wload<DT>::load(ur, lane * 8 + q * 256, wu[q]);
            }
    for (int p0 = 0; p0 < cnt; p0 += MOE_NT) {
        const int np = cnt - p0 < MOE_NT ? cnt - p0 : MOE_NT;
        __syncthreads();
        stage_rows(xs, ldh, a.residual, a.H, a.ws.pairs + off + p0, np, a.TK, a.ws.inv2, a.pre_norm2);
        __syncthreads();
        if (c >= a.Im) continue;
        float g[MOE_NT], u[MOE_NT];
#pragma unroll
        for (int j = 0; j < MOE_NT; j++) g[j] = u[j] = 0.0f;
        if constexpr (DT >= G4_Q4_0) { /* quantized: an access (EPA weights) per lane at a time, by segments */
            typedef g4_qt<DT> T;
            for (int k = lane * T::EPA; k < a.H; k += 32 * T::EPA) {
                uint4 rg[T::QW + 1], ru[T::QW + 1];
                T::load(gr, k, a.qgu, rg);
                T::load(ur, k, a.qgu, ru);
#pragma unroll
                for (int sg = 0; sg < T::EPA / T::SEG; sg++) {
                    float ag, bg, au, bu;
                    T::seg(rg, a.qgu, k + sg * T::SEG, sg, &ag, &bg);
                    T::seg(ru, a.qgu, k + sg * T::SEG, sg, &au, &bu);
#pragma unroll
                    for (int jc = 0; jc < T::SEG / 8; jc++) {
                        float fg[8], fu[8];
                        T::vals8(rg, sg * (T::SEG / 8) + jc, fg);
                        T::vals8(ru, sg * (T::SEG / 8) + jc, fu);
#pragma unroll
                        for (int i = 0; i < 8; i++) fg[i] = fmaf(ag, fg[i], bg), fu[i] = fmaf(au, fu[i], bu);
                        const int ke = k + sg * T::SEG + jc * 8;
#pragma unroll
                        for (int j = 0; j < MOE_NT; j++) {
                            if (j >= np) break;
                            float xv[8];
                            srow8(xs + (size_t)j * ldh + ke, xv);
#pragma unroll
                            for (int i = 0; i < 8; i++) {
                                g[j] = fmaf(fg[i], xv[i], g[j]);
                                u[j] = fmaf(fu[i], xv[i], u[j]);
                            }
                        }
                    }
                }
            }
        } else {
        for (int k4 = lane * 8; k4 < a.H; k4 += 4 * 256) { /* four chunks' loads in flight together */
            if (p0 > 0 || k4 > lane * 8)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (k4 + q * 256 < a.H) {
                        g4_wload<DT>::load(gr, k4 + q * 256, wg[q]);
                        g4_wload<DT>::load(ur, k4 + q * 256, wu[q]);
                    }
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int k = k4 + q * 256;
                if (k >= a.H) break;
#pragma unroll
                for (int j = 0; j < MOE_NT; j++) {
                    if (j >= np) break;
                    float xv[8];
                    srow8(xs + (size_t)j * ldh + k, xv);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        g[j] = fmaf(wg[q][i], xv[i], g[j]);
                        u[j] = fmaf(wu[q][i], xv[i], u[j]);
                    }
                }
            }
        }
        }
#pragma unroll
        for (int j = 0; j < MOE_NT; j++) {
            if (j >= np) break;
            const float gv = g4_warp_sum(g[j]), uv = g4_warp_sum(u[j]);
            if (lane == 0) a.ws.act[(size_t)a.ws.pairs[off + p0 + j] * a.Im + c] = g4_gelu_tanh(gv) * uv;
        }
    }
}

/* 4. down of an active expert: a warp per DOWN_ROWS output rows (more weight bytes in flight per lane, the
 * inputs staged once per 8 x DOWN_ROWS rows), times the routing weight */
#define DOWN_ROWS 4
template <int DT> __global__ __launch_bounds__(256) void moe_down_kernel(moe_args a) {
    G4_DYN_SMEM(float, xs); /* [MOE_NT][ldi] */
    g4_grid_wait();
    const int slot = blockIdx.y;
    if (slot >= *a.ws.n_active) return;
    const int lane = threadIdx.x & 31, ldi = (a.Im + 7) & ~7;
    const int i0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * DOWN_ROWS;
    const int e = a.ws.act_e[slot], off = a.ws.act_off[slot], cnt = a.ws.act_cnt[slot];
    const unsigned char *row = a.down + ((size_t)e * a.H + i0) * a.dn_row;
    float w[DOWN_ROWS][2][8];
    /* the first two chunks of each row: in flight while the inputs are staged */
    if constexpr (DT < G4_Q4_0)
#pragma unroll
        for (int r = 0; r < DOWN_ROWS; r++)
#pragma unroll
            for (int q = 0; q < 2; q++)
                if (i0 + r < a.H && lane * 8 + q * 256 < a.Im)
                    g4_wload<DT>::load(row + (size_t)r * a.dn_row, lane * 8 + q * 256, w[r][q]);
    for (int p0 = 0; p0 < cnt; p0 += MOE_NT) {
        const int np = cnt - p0 < MOE_NT ? cnt - p0 : MOE_NT;
        __syncthreads();
        stage_rows(xs, ldi, a.ws.act, a.Im, a.ws.pairs + off + p0, np, 1, (const float *)NULL, (const float *)NULL);
        __syncthreads();
        if (i0 >= a.H) continue;
        float d[DOWN_ROWS][MOE_NT];
#pragma unroll
        for (int r = 0; r < DOWN_ROWS; r++)
#pragma unroll
            for (int j = 0; j < MOE_NT; j++) d[r][j] = 0.0f;
        if constexpr (DT >= G4_Q4_0) { /* quantized: an access (EPA weights) of each row per lane at a time */
            typedef g4_qt<DT> T;
            for (int k = lane * T::EPA; k < a.Im; k += 32 * T::EPA) {
                uint4 rw[DOWN_ROWS][T::QW + 1];
#pragma unroll
                for (int r = 0; r < DOWN_ROWS; r++)
                    if (i0 + r < a.H) T::load(row + (size_t)r * a.dn_row, k, a.qdn, rw[r]);
#pragma unroll
                for (int r = 0; r < DOWN_ROWS; r++) {
                    if (i0 + r >= a.H) break;
#pragma unroll
                    for (int sg = 0; sg < T::EPA / T::SEG; sg++) {
                        float sa, sb;
                        T::seg(rw[r], a.qdn, k + sg * T::SEG, sg, &sa, &sb);
#pragma unroll
                        for (int jc = 0; jc < T::SEG / 8; jc++) {
                            float f[8];
                            T::vals8(rw[r], sg * (T::SEG / 8) + jc, f);
#pragma unroll
                            for (int z = 0; z < 8; z++) f[z] = fmaf(sa, f[z], sb);
                            const int ke = k + sg * T::SEG + jc * 8;
#pragma unroll
                            for (int j = 0; j < MOE_NT; j++) {
                                if (j >= np) break;
                                float xv[8];
                                srow8(xs + (size_t)j * ldi + ke, xv);
#pragma unroll
                                for (int z = 0; z < 8; z++) d[r][j] = fmaf(f[z], xv[z], d[r][j]);
                            }
                        }
                    }
                }
            }
        } else {
        for (int k2 = lane * 8; k2 < a.Im; k2 += 2 * 256) { /* two chunks of each row in flight together */
            if (p0 > 0 || k2 > lane * 8)
#pragma unroll
                for (int r = 0; r < DOWN_ROWS; r++)
#pragma unroll
                    for (int q = 0; q < 2; q++)
                        if (i0 + r < a.H && k2 + q * 256 < a.Im)
                            g4_wload<DT>::load(row + (size_t)r * a.dn_row, k2 + q * 256, w[r][q]);
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int k = k2 + q * 256;
                if (k >= a.Im) break;
#pragma unroll
                for (int j = 0; j < MOE_NT; j++) {
                    if (j >= np) break;
                    float xv[8];
                    srow8(xs + (size_t)j * ldi + k, xv);
#pragma unroll
                    for (int r = 0; r < DOWN_ROWS; r++)
#pragma unroll
                        for (int z = 0; z < 8; z++) d[r][j] = fmaf(w[r][q][z], xv[z], d[r][j]);
                }
            }
        }
        }
#pragma unroll
        for (int j = 0; j < MOE_NT; j++) {
            if (j >= np) break;
            const int pr = a.ws.pairs[off + p0 + j];
#pragma unroll
            for (int r = 0; r < DOWN_ROWS; r++) {
                const float dv = g4_warp_sum(d[r][j]);
                if (lane == 0 && i0 + r < a.H) a.ws.dn[(size_t)pr * a.H + i0 + r] = a.ws.w[pr] * dv;
            }
        }
    }
}

/* 3 and 4 on tensor cores (bf16 experts, steps of 2 to c->moe_tc_tokens tokens: batched decode). Block (ETC_WARPS
 * warps, active slot); a warp takes one m16 tile of weight rows: the gate rows of 8 intermediate rows (tile rows
 * 0-7) and their up rows (8-15), whose sums meet in each lane for gelu(gate) * up (gate/up), or 16 rows (down). The
 * rows stream from memory into registers, ETC_U steps of 32 elements at a time, 16 bytes of a row a lane (no shared
 * memory, no block barrier); the expert's token rows (x2, or the pairs' activations) are bf16 hi and lo parts read
 * through L1, in passes of up to 8 ETC_NT tokens (n8 tiles of mma.m16n8k16, hi and lo into the same f32 sums: about
 * f32 activations). Within a step of 32, lane (g, q) holds elements 8q .. 8q + 7 of its rows and of its token: the k
 * order of the mma is permuted alike on both sides (its logical k 2q, 2q + 1, 2q + 8, 2q + 9 are elements 8q .. 8q +
 * 3, the second mma's 8q + 4 .. 8q + 7), so every load is 16 bytes. K is a multiple of 8 (the tail of a step reads
 * zeros). gate/up writes the pairs' activations as bf16 hi and lo parts (ahl, slot order); down writes dn[pair] =
 * the routing weight times its rows. H200, 26B-A4B, decode steps of 100 sequences (every expert active): gate/up 278
 * us a layer (87% of the copy bandwidth), down 144 us (84%); with two tiles a warp, fewer registers a lane or more
 * steps in flight, or the next steps' loads issued before the products (register double buffer): 293-423 us and
 * 142-314 us. cuBLAS's batched products were at about 90%, but with the gather, conversions, GeGLU, scatter and a
 * host round trip around them the step took 10% longer (decode 4797-4842 tok/s against 5315-5344). From 2 to 8
 * tokens they replace the kernels below (3, 4: f32 arithmetic on CUDA cores, 8 tokens staged at a time): 8 sequences
 * 224 + 131 -> 120 + 62 us a layer, decode 303 / 368 / 415 -> 367 / 504 / 581 tok/s at 2 / 4 / 8 sequences. */
#define ETC_WARPS 4
#define ETC_U 4
#define ETC_NT 2
template <bool GU> __global__ __launch_bounds__(32 * ETC_WARPS) void experts_tc_kernel(moe_args a, int split) {
#ifdef G4_CUDA_EMU
    __shared__ float scr[ETC_WARPS][384];
#else
    float *scr[ETC_WARPS] = {};
#endif
    g4_grid_wait();
    const int slot = blockIdx.y;
    if (slot >= *a.ws.n_active) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int K = GU ? a.H : a.Im, R = GU ? a.Im : a.H;
    const int r0 = (blockIdx.x * ETC_WARPS + warp) * (GU ? 8 : 16); /* the warp's first output row */
    if (r0 >= R) return;
    const int e = a.ws.act_e[slot], off = a.ws.act_off[slot], cnt = a.ws.act_cnt[slot];
    const size_t rb = GU ? a.gu_row : a.dn_row;
    const unsigned char *mg, *mu; /* the expert's row 0 of gate and of up (down: of down, twice) */
    if (!GU)
        mg = mu = a.down + (size_t)e * a.H * rb;
    else if (a.up)
        mg = a.gate_up + (size_t)e * a.Im * rb, mu = a.up + (size_t)e * a.Im * rb;
    else
        mg = a.gate_up + (size_t)e * 2 * a.Im * rb, mu = mg + (size_t)a.Im * rb;
    /* tile rows g and g + 8 (past R: the last row, its sums not written) */
    const int rg = r0 + g < R ? r0 + g : R - 1, rg8 = GU ? rg : (r0 + g + 8 < R ? r0 + g + 8 : R - 1);
    const unsigned char *ar[2] = {mg + (size_t)rg * rb + 16 * q, mu + (size_t)rg8 * rb + 16 * q};
    const uint16_t *xb = GU ? a.ws.xhl : a.ws.ahl;
    for (int p0 = 0; p0 < cnt; p0 += 8 * ETC_NT) {
        const int ntl = cnt - p0 >= 8 * ETC_NT ? ETC_NT : (cnt - p0 + 7) / 8;
        const uint16_t *br[ETC_NT]; /* token g of each n8 tile (NULL past the expert's tokens) */
#pragma unroll
        for (int j = 0; j < ETC_NT; j++) {
            const int tk = p0 + 8 * j + g;
            br[j] = j < ntl && tk < cnt
                        ? xb + (size_t)(GU ? a.ws.pairs[off + tk] / a.TK : off + tk) * 2 * K + 16 * q
                        : (const uint16_t *)NULL;
        }
        float acc[ETC_NT][4];
#pragma unroll
        for (int j = 0; j < ETC_NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += 32 * ETC_U) {
            uint4 w[ETC_U][2]; /* ETC_U steps' weights in flight together */
#pragma unroll
            for (int u = 0; u < ETC_U; u++)
#pragma unroll
                for (int i = 0; i < 2; i++)
                    w[u][i] = k0 + 32 * u + 8 * q < K ? g4_ld_stream(ar[i] + 2 * (size_t)(k0 + 32 * u)) : uint4();
#pragma unroll
            for (int u = 0; u < ETC_U; u++) {
                const int k = k0 + 32 * u;
                if (k >= K) break;
                uint4 bh[ETC_NT], bl[ETC_NT];
#pragma unroll
                for (int j = 0; j < ETC_NT; j++) {
                    bh[j] = bl[j] = uint4();
                    if (br[j] && k + 8 * q < K) {
                        bh[j] = __ldg((const uint4 *)(br[j] + 2 * (size_t)k));
                        if (split) bl[j] = __ldg((const uint4 *)(br[j] + 2 * (size_t)k + 8));
                    }
                }
#pragma unroll
                for (int j = 0; j < ETC_NT; j++) { /* (w[u][0], w[u][1]: tile rows g, g + 8) */
                    if (j >= ntl) break;
                    g4_mma_bf16_step32(acc[j], w[u][0], w[u][1], bh[j], bl[j], split, scr[warp]);
                }
            }
        }
        /* lane (g, q) holds tile rows g (sums 0, 1) and g + 8 (2, 3) for tokens 2q, 2q + 1 of each n8 tile */
#pragma unroll
        for (int j = 0; j < ETC_NT; j++) {
            if (j >= ntl) break;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int tk = p0 + 8 * j + 2 * q + c;
                if (tk >= cnt) continue;
                if (GU) {
                    if (r0 + g < R)
                        hl_put(a.ws.ahl + (size_t)(off + tk) * 2 * a.Im, r0 + g,
                               g4_gelu_tanh(acc[j][c]) * acc[j][2 + c]);
                } else {
                    const int pr = a.ws.pairs[off + tk];
                    const float wt = a.ws.w[pr];
                    float *row = a.ws.dn + (size_t)pr * a.H;
                    if (r0 + g < R) row[r0 + g] = wt * acc[j][c];
                    if (r0 + g + 8 < R) row[r0 + g + 8] = wt * acc[j][2 + c];
                }
            }
        }
    }
}

/* 5. per token: out = rmsnorm(dense) * post_norm1 + rmsnorm(sum over k of the pair rows) * post_norm2. A thread takes
 * up to MOE_CPT elements of the row, the loads of all of them (and of eight pair rows) issued before any is summed:
 * one round trip to memory for rows of up to MOE_CPT x 1024 elements; both sums of squares in one block reduction. */
#define MOE_CPT 4
__global__ __launch_bounds__(1024) void moe_combine_kernel(moe_args a) {
    G4_DYN_SMEM(float, sum); /* [H] */
    __shared__ float red[2][32];
    g4_grid_wait();
    g4_grid_launch_dependents(); /* (a block a token: the next layer's first blocks load their weights meanwhile) */
    const int t = blockIdx.x, nt = blockDim.x;
    const float *d = a.dense + (size_t)t * a.H, *dn = a.ws.dn + (size_t)t * a.TK * a.H;
    float ss = 0.0f, sd = 0.0f;
    for (int i0 = threadIdx.x; i0 < a.H; i0 += MOE_CPT * nt) {
        float v[MOE_CPT] = {};
        for (int k0 = 0; k0 < a.TK; k0 += 8) {
            float part[MOE_CPT][8];
#pragma unroll
            for (int u = 0; u < MOE_CPT; u++)
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const int i = i0 + u * nt;
                    part[u][k] = i < a.H && k0 + k < a.TK ? dn[(size_t)(k0 + k) * a.H + i] : 0.0f;
                }
#pragma unroll
            for (int u = 0; u < MOE_CPT; u++)
#pragma unroll
                for (int k = 0; k < 8; k++) v[u] += part[u][k];
        }
#pragma unroll
        for (int u = 0; u < MOE_CPT; u++) {
            const int i = i0 + u * nt;
            const float x = i < a.H ? d[i] : 0.0f;
            if (i < a.H) sum[i] = v[u];
            ss += v[u] * v[u];
            sd += x * x;
        }
    }
    g4_block_sum2(&ss, &sd, red);
    const float inv_s = rsqrtf(ss / (float)a.H + a.eps), inv_d = rsqrtf(sd / (float)a.H + a.eps);
    for (int i = threadIdx.x; i < a.H; i += nt)
        a.out[(size_t)t * a.H + i] = d[i] * inv_d * a.post_norm1[i] + sum[i] * inv_s * a.post_norm2[i];
}

/* ---------------------------------------------------------------- many tokens: tensor-core products per expert */
/* xg[j] = the residual row of pair j (pairs grouped by expert) */
__global__ void moe_gather_kernel(moe_args a, float *xg) {
    g4_grid_wait();
    const float *r = a.residual + (size_t)(a.ws.pairs[blockIdx.x] / a.TK) * a.H;
    float *o = xg + (size_t)blockIdx.x * a.H;
    for (int i = threadIdx.x; i < a.H; i += blockDim.x) o[i] = r[i];
}

/* act[j][c] = gelu(gu[j][c]) * gu[j][Im + c] */
__global__ void moe_geglu_kernel(moe_args a, const float *gu, int np) {
    g4_grid_wait();
    const size_t total = (size_t)np * a.Im;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / a.Im, k = i % a.Im;
        a.ws.act[i] = g4_gelu_tanh(gu[j * 2 * a.Im + k]) * gu[j * 2 * a.Im + a.Im + k];
    }
}

/* dn[pair j] = its routing weight times d[j] */
__global__ void moe_scatter_kernel(moe_args a, const float *d) {
    g4_grid_wait();
    const int pr = a.ws.pairs[blockIdx.x];
    const float w = a.ws.w[pr];
    for (int i = threadIdx.x; i < a.H; i += blockDim.x)
        a.ws.dn[(size_t)pr * a.H + i] = w * d[(size_t)blockIdx.x * a.H + i];
}

/* Steps 3 and 4 for many tokens (prefill): the active experts and their pair counts come to the host (one
 * synchronization a layer), the pairs' inputs are gathered in expert order and converted once, and the active
 * experts multiply their rows in batched cuBLAS calls (g4c_gemm_experts: gate/up, the GeGLU, down), scattered back by
 * pair. gu: [np, 2 Im]. */
/* ---- many tokens of Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / IQ4_NL / IQ4_XS / CB4 / MXF4 experts (MMQ_TYPES): int8 tensor-core
 * products of the codes as stored
 * The activations are int8 blocks as the one-token GEMV and the CPU read them (the Q8_0 rule: d = max|x|/127 per 32,
 * q = rint(x/d)); a weight block's signed codes (code - ZERO of its g4_qt: Q4_0 nibble - 8, Q5_0 code - 16; Q4_K,
 * Q5_K: the code; IQ4: the table's value) times a block of q is an exact integer
 * (mma m16n8k32), scaled by the two blocks' d into an f32 sum (Q4_K, Q5_K: w = a code + b per 32, so
 * sum w x = dx (a sum(code q) + b sum(q))). No decoded copy of the weights is written or read: the bytes a
 * product reads are the codes themselves (cuBLAS on bf16 tiles read and wrote 2-3 bytes a weight per step). */
#define MMQ_BM 32   /* pair rows (tokens of one expert) a block */
#define MMQ_BN 128  /* weight rows a block */
#define MMQ_KB 4    /* blocks of 32 of k a stage */
#define MMQ_LD (MMQ_KB * 32 + 16) /* bytes of a staged row (16 more: lanes of a fragment load hit distinct banks) */

typedef struct mmq_args {
    const signed char *xq; /* [pair rows, in] */
    const float2 *xd;      /* [pair rows, in / 32]: (d, sum of q) */
    const unsigned char *w;
    size_t row_bytes, ex_bytes; /* expert e's row r at w + e * ex_bytes + r * row_bytes */
    int in, R;
    const int32_t *tiles; /* per block row: expert, first pair row, pair rows (<= MMQ_BM) */
    float *y;
    int ldc;
} mmq_args;

/* y[pair row][r] = sum_k x[pair row][k] w_e[r][k] for a tile of MMQ_BM pair rows of expert e and MMQ_BN rows r.
 * 8 warps: warp w takes pair rows 16 (w & 1) .. + 16 and weight rows 32 (w >> 1) .. + 32 (four n8 tiles). A stage
 * holds MMQ_KB blocks of k of both sides in shared memory (weights unpacked to int8); the next stage's loads are in
 * registers while this one is multiplied. */
template <int DT> __global__ __launch_bounds__(256) void experts_mmq_kernel(mmq_args a) {
    __shared__ __align__(16) signed char xs[MMQ_BM][MMQ_LD];
    __shared__ __align__(16) signed char ws[MMQ_BN][MMQ_LD];
    __shared__ float2 xsd[MMQ_BM][MMQ_KB], wsd[MMQ_BN][MMQ_KB]; /* (d, sum q); (a, b): w = a code + b */
#ifdef G4_CUDA_EMU
    __shared__ int scr[8][768];
#else
    int *scr[8] = {};
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp & 1, wn = warp >> 1, nb = a.in / 32;
    const int e = a.tiles[3 * blockIdx.y], p0 = a.tiles[3 * blockIdx.y + 1], cnt = a.tiles[3 * blockIdx.y + 2];
    const int n0 = blockIdx.x * MMQ_BN;
    const unsigned char *we = a.w + (size_t)e * a.ex_bytes;
    typedef g4_qt<DT> T; /* (types of 32-element accesses) */
    g4c_qrow q = g4c_qrow();
    q.in = a.in, q.group = 32, q.gshift = 5;
    /* this thread's share of a stage: x bytes [xr][16 xp ..), the x scales of thread tid < MMQ_BM * MMQ_KB, and the
     * weight blocks tid and tid + 256 (row item / MMQ_KB, block item % MMQ_KB), as the type's access words */
    const int xr = tid >> 3, xp = tid & 7;
    uint4 xv, wr[2][T::QW + 1];
    float2 xdv = make_float2(0.0f, 0.0f);
    auto load = [&](int kb0) {
        const int b = kb0 + (xp >> 1);
        xv = uint4();
        if (xr < cnt && b < nb) xv = *(const uint4 *)(a.xq + (size_t)(p0 + xr) * a.in + (size_t)kb0 * 32 + xp * 16);
        if (tid < MMQ_BM * MMQ_KB) {
            const int r = tid / MMQ_KB, bb = kb0 + tid % MMQ_KB;
            xdv = r < cnt && bb < nb ? a.xd[(size_t)(p0 + r) * nb + bb] : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int item = tid + 256 * i, r = item / MMQ_KB, bb = kb0 + item % MMQ_KB;
#pragma unroll
            for (int w = 0; w <= T::QW; w++) wr[i][w] = uint4(); /* (past the row: zero scales, so a = b = 0) */
            if (n0 + r < a.R && bb < nb) T::load(we + (size_t)(n0 + r) * a.row_bytes, (unsigned)bb * 32, q, wr[i]);
        }
    };
    auto store = [&](int kb0) {
        *(uint4 *)&xs[xr][xp * 16] = xv;
        if (tid < MMQ_BM * MMQ_KB) xsd[tid / MMQ_KB][tid % MMQ_KB] = xdv;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int item = tid + 256 * i, r = item / MMQ_KB, bb = item % MMQ_KB;
            float2 ab; /* w = a code + b (b: the affine types' offset) */
            T::seg(wr[i], q, (kb0 + bb) * 32, 0, &ab.x, &ab.y);
            wsd[r][bb] = ab;
            uint4 lv, hv; /* signed codes of elements 0-15 and 16-31 (code - ZERO) */
            if constexpr (DT == G4_Q8_0) {
                lv = wr[i][0], hv = wr[i][1];
            } else {
                unsigned lo[4], hi[4];
#pragma unroll
                for (int j = 0; j < 4; j++) { /* word j: elements 4j .. (low nibbles), 16 + 4j .. (high) */
                    const unsigned u = g4_word(wr[i][0], j);
                    if constexpr (DT == G4_CB4) /* (its block's table: the access's last word) */
                        g4_iq4_word(u, wr[i][T::QW], &lo[j], &hi[j]);
                    else /* (the Q5 types' fifth bits: the access's second word) */
                        g4_s8_word<DT>(u, DT == G4_Q5_0 || DT == G4_Q5_K ? wr[i][1].x : 0u, j, &lo[j], &hi[j]);
                }
                lv = make_uint4(lo[0], lo[1], lo[2], lo[3]), hv = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            }
            *(uint4 *)&ws[r][bb * 32] = lv;
            *(uint4 *)&ws[r][bb * 32 + 16] = hv;
        }
    };
    float acc[4][4] = {};
    g4_grid_wait();
    load(0);
    for (int kb0 = 0; kb0 < nb; kb0 += MMQ_KB) {
        __syncthreads(); /* the previous stage is multiplied */
        store(kb0);
        __syncthreads();
        if (kb0 + MMQ_KB < nb) load(kb0 + MMQ_KB); /* in flight while this stage is multiplied */
#pragma unroll
        for (int b = 0; b < MMQ_KB; b++) {
            if (kb0 + b >= nb) break;
            const int ra = wm * 16 + g;
            uint32_t af[4];
            af[0] = *(const uint32_t *)&xs[ra][b * 32 + 4 * t];
            af[1] = *(const uint32_t *)&xs[ra + 8][b * 32 + 4 * t];
            af[2] = *(const uint32_t *)&xs[ra][b * 32 + 16 + 4 * t];
            af[3] = *(const uint32_t *)&xs[ra + 8][b * 32 + 16 + 4 * t];
            const float2 d0 = xsd[ra][b], d1 = xsd[ra + 8][b];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int cb = wn * 32 + nt * 8;
                const uint32_t bf[2] = {*(const uint32_t *)&ws[cb + g][b * 32 + 4 * t],
                                        *(const uint32_t *)&ws[cb + g][b * 32 + 16 + 4 * t]};
                int ci[4];
                g4_mma_s8(ci, af, bf, scr[warp]);
                const float2 e0 = wsd[cb + 2 * t][b], e1 = wsd[cb + 2 * t + 1][b];
                if constexpr (T::NEED_SUM) {
                    acc[nt][0] += d0.x * fmaf(e0.x, (float)ci[0], e0.y * d0.y);
                    acc[nt][1] += d0.x * fmaf(e1.x, (float)ci[1], e1.y * d0.y);
                    acc[nt][2] += d1.x * fmaf(e0.x, (float)ci[2], e0.y * d1.y);
                    acc[nt][3] += d1.x * fmaf(e1.x, (float)ci[3], e1.y * d1.y);
                } else {
                    acc[nt][0] += (float)ci[0] * (d0.x * e0.x), acc[nt][1] += (float)ci[1] * (d0.x * e1.x);
                    acc[nt][2] += (float)ci[2] * (d1.x * e0.x), acc[nt][3] += (float)ci[3] * (d1.x * e1.x);
                }
            }
        }
    }
    g4_grid_launch_dependents();
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = wm * 16 + g + 8 * h, col = n0 + wn * 32 + nt * 8 + 2 * t;
            if (r >= cnt) continue;
            float *y = a.y + (size_t)(p0 + r) * a.ldc;
            if (col < a.R) y[col] = acc[nt][2 * h];
            if (col + 1 < a.R) y[col + 1] = acc[nt][2 * h + 1];
        }
}

/* The types experts_mmq_kernel takes: blocks of 32 under one scale (not Q6_K: a scale per 16; not MLX: per group) */
#define MMQ_TYPES(X) X(G4_Q8_0) X(G4_Q4_0) X(G4_Q5_0) X(G4_Q4_K) X(G4_Q5_K) X(G4_IQ4_NL) X(G4_IQ4_XS) X(G4_CB4) X(G4_MXF4)
static int mmq_takes(const g4c *c, const g4_tensor *w) {
    if (c->float_act) return 0;
    switch (w->dtype) {
#define TAKES(T) case T:
        MMQ_TYPES(TAKES) return w->shape[w->ndim - 1] % g4_dtype_block(w->dtype) == 0;
#undef TAKES
    default: return 0;
    }
}

/* The row tiles of the experts' int8 products (per tile: expert, first pair row, rows <= MMQ_BM) in a workspace,
 * made once for a step's gate/up and down products; the count, 0 when there is none (or after noting an error). */
static int mmq_tiles(g4c *c, int na, const int32_t *act_e, const int32_t *act_off, const int32_t *act_cnt,
                     const int32_t **tiles) {
    int most = 0;
    for (int i = 0; i < na; i++) most += (act_cnt[i] + MMQ_BM - 1) / MMQ_BM;
    int32_t *host = most ? (int32_t *)malloc((size_t)most * 3 * sizeof(int32_t)) : NULL;
    int32_t *dev = most ? (int32_t *)g4c_ws(c, &c->ws_tiles, (size_t)most * 3 * sizeof(int32_t)) : NULL;
    if (most && !host) g4c_note(c, cudaErrorMemoryAllocation, "moe: out of host memory");
    if (!host || !dev) {
        free(host);
        return 0;
    }
    int nt = 0;
    for (int i = 0; i < na; i++)
        for (int m0 = 0; m0 < act_cnt[i]; m0 += MMQ_BM, nt++) {
            host[3 * nt] = act_e[i], host[3 * nt + 1] = act_off[i] + m0;
            host[3 * nt + 2] = act_cnt[i] - m0 < MMQ_BM ? act_cnt[i] - m0 : MMQ_BM;
        }
    g4c_copy_to_device(c, dev, host, (size_t)nt * 3 * sizeof(int32_t));
    free(host);
    *tiles = dev;
    return nt;
}

/* the experts' products of the pair rows of nt tiles (mmq_tiles): x's rows as int8 blocks (xq, xd) into y (ldc
 * apart) */
static void experts_mmq(g4c *c, const g4_tensor *w, const signed char *xq, const float2 *xd, const int32_t *tiles,
                        int nt, float *y, int ldc) {
    if (!nt) return;
    mmq_args m;
    m.xq = xq, m.xd = xd, m.w = (const unsigned char *)w->data;
    m.row_bytes = g4c_wrow_bytes(w);
    m.R = (int)w->shape[1];
    m.ex_bytes = (size_t)m.R * m.row_bytes;
    m.in = (int)w->shape[2];
    m.tiles = tiles, m.y = y, m.ldc = ldc;
    const dim3 grid((unsigned)((m.R + MMQ_BN - 1) / MMQ_BN), (unsigned)nt);
    switch (w->dtype) {
#define MMQ(T)                                                                                                     \
    case T: g4c_launch(c, experts_mmq_kernel<T>, grid, dim3(256), 0, m); break;
        MMQ_TYPES(MMQ)
#undef MMQ
    default: break;
    }
}

static void moe_experts_gemm(g4c *c, const g4_moe_args *m, const moe_args &a, int np, float *xg, float *gu) {
    const int E = a.E, H = a.H, Im = a.Im;
    int32_t host[1 + 3 * MOE_MAX_E]; /* n_active, act_e, act_off, act_cnt (consecutive in the workspace) */
    g4c_note(c, cudaMemcpyAsync(host, a.ws.n_active, (size_t)(1 + 3 * E) * 4, cudaMemcpyDeviceToHost, c->stream),
             "moe: copying the expert counts");
    g4c_note(c, cudaStreamSynchronize(c->stream), "moe: routing");
    if (c->error != cudaSuccess) return;
    const int na = host[0];
    const int32_t *act_e = host + 1, *act_off = host + 1 + E, *act_cnt = host + 1 + 2 * E;
    g4c_launch(c, moe_gather_kernel, dim3((unsigned)np), dim3(256), 0, a, xg);
    /* experts of MMQ_TYPES: int8 blocks of x2 (then of the activations) after gu, [np, max(H, Im)] codes, then the
     * scales; other types: cuBLAS on bf16 tiles */
    const int qgu = mmq_takes(c, m->gate_up) && (!m->up || mmq_takes(c, m->up)), qdn = mmq_takes(c, m->down);
    signed char *xq = (signed char *)(((uintptr_t)(gu + (size_t)np * 2 * Im) + 255) & ~(uintptr_t)255);
    float2 *xd = (float2 *)(xq + (size_t)np * (H > Im ? H : Im));
    g4c_gemm_in in;
    const int32_t *tiles = NULL;
    const int nt = qgu || qdn ? mmq_tiles(c, na, act_e, act_off, act_cnt, &tiles) : 0;
    if (qgu) {
        g4c_q8_rows(c, xg, (int)np, H, m->pre_norm2, m->eps, NULL, xq, xd);
        experts_mmq(c, m->gate_up, xq, xd, tiles, nt, gu, 2 * Im);
        if (m->up) experts_mmq(c, m->up, xq, xd, tiles, nt, gu + Im, 2 * Im);
    } else {
        if (g4c_gemm_input_pairs(c, xg, np, H, m->pre_norm2, m->eps, m->gate_up->dtype, &in)) return;
        g4c_gemm_experts(c, &in, m->gate_up, na, act_e, act_off, act_cnt, gu, 2 * Im);
        if (m->up) g4c_gemm_experts(c, &in, m->up, na, act_e, act_off, act_cnt, gu + Im, 2 * Im);
    }
    unsigned blocks = (unsigned)(((size_t)np * Im + 255) / 256);
    if (blocks > (unsigned)c->n_sm * 16) blocks = (unsigned)c->n_sm * 16;
    g4c_launch(c, moe_geglu_kernel, dim3(blocks), dim3(256), 0, a, (const float *)gu, np);
    float *d = xg; /* (the gathered rows were converted above) */
    if (qdn) {
        g4c_q8_rows(c, a.ws.act, (int)np, Im, NULL, 0.0f, NULL, xq, xd);
        experts_mmq(c, m->down, xq, xd, tiles, nt, d, H);
    } else {
        if (g4c_gemm_input_pairs(c, a.ws.act, np, Im, NULL, 0.0f, m->down->dtype, &in)) return;
        g4c_gemm_experts(c, &in, m->down, na, act_e, act_off, act_cnt, d, H);
    }
    g4c_launch(c, moe_scatter_kernel, dim3((unsigned)np), dim3(256), 0, a, (const float *)d);
}

/* Steps 3 and 4 with the experts' kernels (a few tokens, or a step being recorded): grids sized by the most experts
 * the step can touch. 0, or -1 after noting an error. */
static int moe_experts_kernels(g4c *c, const g4_moe_args *m, const moe_args &a, size_t np) {
    const int E = a.E, H = a.H, Im = a.Im;
    const unsigned max_active = (unsigned)(np < (size_t)E ? np : (size_t)E);
    const dim3 gu_grid((unsigned)((Im + 7) / 8), max_active);
    const dim3 dn_grid((unsigned)((H + 8 * DOWN_ROWS - 1) / (8 * DOWN_ROWS)), max_active);
    const size_t gu_smem = (size_t)MOE_NT * ((H + 7) & ~7) * 4, dn_smem = (size_t)MOE_NT * ((Im + 7) & ~7) * 4;
    if (gu_smem > c->prop.sharedMemPerBlockOptin || dn_smem > c->prop.sharedMemPerBlockOptin) {
        g4c_note(c, cudaErrorInvalidValue, "moe: hidden size too large for the expert kernels");
        return -1;
    }
    switch (m->gate_up->dtype) {
#define GU(T) \
    case T: g4c_launch(c, moe_gate_up_kernel<T>, gu_grid, dim3(256), gu_smem, a); break;
        G4C_WEIGHT_TYPES(GU)
#undef GU
    default: break;
    }
    switch (m->down->dtype) {
#define DN(T) \
    case T: g4c_launch(c, moe_down_kernel<T>, dn_grid, dim3(256), dn_smem, a); break;
        G4C_WEIGHT_TYPES(DN)
#undef DN
    default: break;
    }
    return 0;
}

/* Whether the experts' tensor-core kernels take a step of n tokens (2 .. c->moe_tc_tokens; one token: the GEMV's):
 * bf16 experts, rows of multiples of 8 elements
 * (the residual and its norm weight 16-byte aligned: the top-k kernel reads them 8 floats at a time). */
static int experts_tc_takes(const g4c *c, const g4_moe_args *m, int n) {
    return n > 1 && n <= c->moe_tc_tokens && m->gate_up->dtype == G4_BF16 &&
           m->down->dtype == G4_BF16 && (!m->up || m->up->dtype == G4_BF16) && m->hidden % 8 == 0 &&
           m->expert_dim % 8 == 0 && ((uintptr_t)m->residual | (uintptr_t)m->pre_norm2) % 16 == 0;
}

/* Steps 3 and 4 on the experts' tensor-core kernels (x2's hi and lo rows made by the top-k kernel) */
static void moe_experts_tc(g4c *c, const moe_args &a, size_t np) {
    const unsigned max_active = (unsigned)(np < (size_t)a.E ? np : (size_t)a.E);
    g4c_launch(c, experts_tc_kernel<true>, dim3((unsigned)((a.Im + 8 * ETC_WARPS - 1) / (8 * ETC_WARPS)), max_active),
               dim3(32 * ETC_WARPS), 0, a, c->gemm_split);
    g4c_launch(c, experts_tc_kernel<false>, dim3((unsigned)((a.H + 16 * ETC_WARPS - 1) / (16 * ETC_WARPS)), max_active),
               dim3(32 * ETC_WARPS), 0, a, c->gemm_split);
}

/* Lets the expert kernels stage up to MOE_NT rows of the hidden size in shared memory (once, at start). */
void g4c_moe_init(g4c *c) {
#define ALLOW(T) g4c_allow_smem(c, moe_gate_up_kernel<T>), g4c_allow_smem(c, moe_down_kernel<T>);
    G4C_WEIGHT_TYPES(ALLOW)
#undef ALLOW
    g4c_allow_smem(c, moe_combine_kernel);
    g4c_allow_smem(c, moe_group_kernel);
}

void g4c_moe(g4_backend *be, const g4_moe_args *m) {
    g4c *c = g4c_of(be);
    const int n = m->n, E = m->n_experts, TK = m->top_k, H = m->hidden, Im = m->expert_dim;
    if (n <= 0) return;
    if (TK <= 0 || TK > E || TK > 32 || E > MOE_MAX_E) {
        g4c_note(c, cudaErrorInvalidValue, "moe: at most 256 experts and top_k in 1..min(32, n_experts)");
        return;
    }
    if ((size_t)H * 4 > c->prop.sharedMemPerBlockOptin) {
        g4c_note(c, cudaErrorInvalidValue, "moe: hidden size too large for the combine kernel");
        return;
    }
    moe_args a;
    memset(&a, 0, sizeof a);
    a.residual = m->residual;
    a.dense = m->dense;
    a.out = m->out;
    a.pre_norm2 = m->pre_norm2, a.post_norm1 = m->post_norm1, a.post_norm2 = m->post_norm2;
    a.n = n, a.H = H, a.E = E, a.TK = TK, a.Im = Im;
    a.eps = m->eps;
    a.gate_up = (const unsigned char *)m->gate_up->data;
    a.down = (const unsigned char *)m->down->data;
    a.up = m->up ? (const unsigned char *)m->up->data : NULL;
    if (m->up && (m->up->dtype != m->gate_up->dtype || m->up->group != m->gate_up->group ||
                  m->up->scale_dtype != m->gate_up->scale_dtype)) {
        g4c_note(c, cudaErrorInvalidValue, "moe: gate and up experts of different types");
        return;
    }
    a.gu_row = g4c_wrow_bytes(m->gate_up);
    a.dn_row = g4c_wrow_bytes(m->down);
    a.qgu = g4c_qrow_of(m->gate_up);
    a.qdn = g4c_qrow_of(m->down);
    a.per_expert_scale = m->per_expert_scale;
    const size_t np = (size_t)n * TK;
    /* many tokens: the experts' products through cuBLAS (not while a step is recorded: it reads counts back) */
    const int tc = experts_tc_takes(c, m, n);
    const int gemm = n > g4c_gemv_max_tokens() && !c->capturing && !c->in_graph_step && !tc;
    const size_t ints = np * 2 + 1 + 3 * (size_t)E,
                 need = ((ints + 3) & ~(size_t)3) * 4 + np * 4 + np * ((size_t)Im + H) * 4 + (size_t)n * (E + 1) * 4 +
                        (gemm ? np * ((size_t)H + 2 * (size_t)Im) * 4 + np * (size_t)(H > Im ? H : Im) * 5 / 4 + 256
                              : 0) +
                        (tc ? ((size_t)n * H + np * (size_t)Im) * 4 + 16 : 0);
    unsigned char *ws = (unsigned char *)g4c_ws(c, &c->ws_moe, need);
    if (!ws) return;
    int32_t *iw = (int32_t *)ws;
    a.ws.ids = iw;
    a.ws.pairs = iw + np;
    a.ws.n_active = iw + 2 * np;
    a.ws.act_e = a.ws.n_active + 1;
    a.ws.act_off = a.ws.act_e + E;
    a.ws.act_cnt = a.ws.act_off + E;
    float *fw = (float *)(ws + ((ints + 3) & ~(size_t)3) * 4);
    a.ws.w = fw;
    a.ws.act = fw + np;
    a.ws.dn = a.ws.act + np * Im;
    a.ws.logits = a.ws.dn + np * H;
    a.ws.inv2 = a.ws.logits + (size_t)n * E;
    float *xg = a.ws.inv2 + n, *gu = xg + np * H; /* (gemm) [np, H], [np, 2 Im] */
    if (tc) {
        a.ws.xhl = (uint16_t *)(((uintptr_t)(a.ws.inv2 + n) + 15) & ~(uintptr_t)15);
        a.ws.ahl = a.ws.xhl + (size_t)n * 2 * H;
    }

    /* The dense MLP (when it is part of the op): few tokens, beside the routing and the experts (a side branch after
     * the router, which makes the residual in its prologue: both read it); else first. */
    const g4_matmul_set *mlp = m->mlp.count ? &m->mlp : NULL;
    const int fork = mlp && n <= g4c_gemv_max_tokens() && c->moe_fork && c->fork_ok && !c->profile;
    if (mlp && !fork) {
        g4c_matmul_set(be, m->residual, n, mlp);
        g4c_matmul(be, mlp->y[0], n, m->mlp_down, NULL, m->dense);
    }
    /* router: rmsnorm(r) * router_scale * H^-0.5, times router_proj^T */
    g4c_matmul_scaled(c, m->residual, n, m->router_proj, m->router_scale, m->eps, 1.0f / sqrtf((float)H), a.ws.logits,
                      fork ? mlp : NULL);
    if (fork) {
        g4_matmul_set d = *mlp;
        d.res_h = d.res_o = d.res_w = NULL, d.res_out = NULL;
        g4c_fork(c);
        g4c_matmul_set(be, m->residual, n, &d);
        g4c_matmul(be, mlp->y[0], n, m->mlp_down, NULL, m->dense);
        g4c_fork_end(c);
    }
    const int gemv_experts = n == 1 && g4c_gemv_experts_fit(c, m->gate_up, 1) && g4c_gemv_experts_fit(c, m->down, TK);
    moe_args ta = a;
    if (gemv_experts) ta.ws.inv2 = NULL;
    g4c_launch(c, moe_topk_kernel, dim3((unsigned)n), dim3(gemv_experts ? 32 : 256), 0, ta, (const float *)a.ws.logits);
    if (gemv_experts) {
        /* one token: the experts' rows through the GEMV, the slots' activations in act */
        g4c_gemv_experts(c, m->gate_up, m->up, Im, a.ws.act_e, TK, m->residual, m->pre_norm2, m->eps, NULL, NULL,
                         a.ws.act);
        g4c_gemv_experts(c, m->down, NULL, H, a.ws.act_e, TK, a.ws.act, NULL, 0.0f, a.ws.pairs, a.ws.w, a.ws.dn);
    } else {
        if (n > 1) {
            const size_t counts = (size_t)E * (1 + MOE_GROUP_WARPS) * sizeof(int), staged = counts + np * sizeof(int);
            const int st = staged <= c->prop.sharedMemPerBlockOptin;
            g4c_launch(c, moe_group_kernel, dim3(1), dim3(32 * MOE_GROUP_WARPS), st ? staged : counts, a, st);
        }
        if (gemm)
            moe_experts_gemm(c, m, a, (int)np, xg, gu);
        else if (tc)
            moe_experts_tc(c, a, np);
        else if (moe_experts_kernels(c, m, a, np)) {
            if (fork) g4c_join(c);
            return;
        }
    }
    if (fork) g4c_join(c);
    g4c_launch(c, moe_combine_kernel, dim3((unsigned)n), dim3(1024), (size_t)H * 4, a);
}

G4_TRACE_TU(moe)
