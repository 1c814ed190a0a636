/* The mixture-of-experts pieces that cuda_moe.cu's kernels and the one-token experts' GEMV (cuda_gemv.cu) share:
 * the routing of one token by one warp, and the combine of a token's expert rows by one block. The one-token
 * decode step of the MoE block is three kernels (cuda_moe.cu): the router's GEMV, the experts' gate/up GEMV (each
 * block routes the token itself after its grid wait; block 0 writes the routing for the next kernel), the
 * experts' down GEMV (its last block to finish combines the rows: out = rmsnorm(dense) * post_norm1 +
 * rmsnorm(sum of the rows) * post_norm2). */
#ifndef G4_BACKEND_CUDA_MOE_CUH
#define G4_BACKEND_CUDA_MOE_CUH

#include "backend/cuda/cuda_common.cuh"

#define G4C_MOE_MAX_E 256 /* experts a lane holds E / 32 of */
#define G4C_MOE_MAX_TK 32 /* experts a token takes: a lane each */

/* The softmax and top-TK of a token's E router logits lg by one warp (all 32 lanes, each holding E / 32 of them),
 * ties to the lower expert id: ids[k] the k-th best, w[k] its probability renormalized over the chosen ones and
 * times scale[ids[k]] (k < TK). ids and w (shared or global memory) are written by the warp, which sees them on
 * return. Every caller runs this one arithmetic, so each computes the same routing. */
static __device__ void g4c_moe_topk_warp(const float *lg, int E, int TK, const float *scale, int32_t *ids, float *w) {
    const int lane = threadIdx.x & 31;
    float v[G4C_MOE_MAX_E / 32];
    int taken = 0; /* bit i: element lane + 32 i is chosen */
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < G4C_MOE_MAX_E / 32; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? lg[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = g4_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < G4C_MOE_MAX_E / 32; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? expf(v[i] - mx) : -1.0f; /* probabilities before the division; -1: no expert */
        sum += e < E ? v[i] : 0.0f;
    }
    sum = g4_warp_sum(sum);
    float wsum = 0.0f;
    for (int k = 0; k < TK; k++) {
        float bv = -2.0f;
        int be = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < G4C_MOE_MAX_E / 32; i++) {
            const int e = lane + 32 * i;
            if (!(taken >> i & 1) && e < E && (v[i] > bv || (v[i] == bv && e < be))) bv = v[i], be = e;
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
    if (lane < TK) w[lane] = w[lane] / wsum * scale[ids[lane]];
    __syncwarp();
}

/* One token, after g4c_moe_topk_warp (the same warp): its experts in ascending order are the active list of the
 * experts' kernels. Lane k < TK puts expert ids[k] at its rank r among them: act_e[r] = ids[k], act_off[r] = r,
 * act_cnt[r] = 1, pairs[r] = k; lane 0 sets *n_active = TK. Each pointer may be NULL (not written). */
static __device__ __forceinline__ void g4c_moe_one_token(const int32_t *ids, int TK, int32_t *act_e, int32_t *act_off,
                                                         int32_t *act_cnt, int32_t *pairs, int32_t *n_active) {
    const int lane = threadIdx.x & 31;
    if (lane < TK) {
        const int e = ids[lane];
        int rank = 0;
        for (int k = 0; k < TK; k++) rank += ids[k] < e; /* (the chosen experts are distinct) */
        if (act_e) act_e[rank] = e;
        if (act_off) act_off[rank] = rank;
        if (act_cnt) act_cnt[rank] = 1;
        if (pairs) pairs[rank] = lane;
    }
    if (lane == 0 && n_active) *n_active = TK;
}

/* Sum over the block of PER values a thread, the block of blockDim.x threads summing as blockDim.x * PER = 1024
 * threads would (value j of thread i is thread i + j * blockDim.x's), so the result does not depend on PER:
 * g4_block_sum's order for 1024 threads. red: 32 floats of shared memory. */
template <int PER> static __device__ __forceinline__ float g4c_moe_block_sum(const float (&v)[PER], float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float s[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) s[j] = g4_warp_sum(v[j]);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < PER; j++) red[w + j * nw] = s[j];
    __syncthreads();
    return g4_warp_sum(lane < nw * PER ? red[lane] : 0.0f);
}

/* The combine of one token by one block of 1024 / PER threads: out = rmsnorm(d) * pn1 + rmsnorm(s) * pn2 with
 * s = the sum over k < TK of the rows dn[k] ([TK, H], in k order), its rows read from L2 (__ldcg: other blocks
 * may have written them). sum: H floats of scratch (shared memory, or global memory the block owns; it may be
 * dn's first row, each element read before it is written); out may be d (each element read, then written).
 * red: 32 floats of shared memory. */
template <int PER>
static __device__ void g4c_moe_combine(const float *d, const float *dn, int TK, int H, float eps, const float *pn1,
                                       const float *pn2, float *out, float *sum, float *red) {
    float ss[PER], sd[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        ss[j] = sd[j] = 0.0f;
        for (int i = threadIdx.x + j * blockDim.x; i < H; i += PER * blockDim.x) {
            float part[8], v = 0.0f;
            for (int k0 = 0; k0 < TK; k0 += 8) { /* eight rows' loads in flight together */
#pragma unroll
                for (int k = 0; k < 8; k++) part[k] = k0 + k < TK ? __ldcg(dn + (size_t)(k0 + k) * H + i) : 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) v += part[k];
            }
            sum[i] = v;
            ss[j] += v * v;
            sd[j] += d[i] * d[i];
        }
    }
    const float inv_s = rsqrtf(g4c_moe_block_sum<PER>(ss, red) / (float)H + eps);
    const float inv_d = rsqrtf(g4c_moe_block_sum<PER>(sd, red) / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[i] = d[i] * inv_d * pn1[i] + sum[i] * inv_s * pn2[i];
}

/* What the one-token experts' GEMVs do beside their products (g4c_gemv_experts; zeros: nothing).
 * route (gate/up, logits set): every block routes the token from logits [E] (g4c_moe_topk_warp with scale) and
 * takes slot s's expert as the s-th chosen in ascending order; block 0 writes ids, w [TK] and act_e, act_off,
 * act_cnt, pairs, n_active as moe_topk_kernel does for one token (the down GEMV reads act_e, pairs and w).
 * combine (down, out set): after its rows, each block counts itself in *counter (zero before, zero again after);
 * the last one runs g4c_moe_combine of the TK rows the GEMV wrote (y [TK, H]) with dense, post_norm1, post_norm2
 * into out (sum_smem: its scratch in the kernel's dynamic shared memory, else y's first row). */
typedef struct g4c_moe_fuse {
    const float *logits, *scale;
    int E, TK;
    int32_t *ids, *act_e, *act_off, *act_cnt, *pairs, *n_active;
    float *w;
    const float *dense, *post_norm1, *post_norm2;
    float *out;
    float eps;
    int *counter;
    int sum_smem;
} g4c_moe_fuse;

/* The experts' products of a MoE block for one token, through the GEMV (cuda_gemv.cu), for the `slots` experts
 * ex[s] (device memory; with f->logits the kernel routes them itself and ex is not read): gate/up pairs when pair
 * is NULL, y[s * rows + c] = gelu(gate_c . x') * (up_c . x') with x' = rmsnorm(x) * norm (w [E, 2 rows, in] with
 * the up rows after the gate rows, or w and up [E, rows, in]); else down rows, y[pair[s] * rows + i] = pw[pair[s]]
 * * (w_i . x[s]) (w [E, rows, in], x [slots, in]). f (may be NULL): g4c_moe_fuse.
 * Only where g4c_gemv_experts_fit(w, rows of x) (its input fits one staged tile). */
int g4c_gemv_experts_fit(g4c *c, const g4_tensor *w, int x_rows);
void g4c_gemv_experts(g4c *c, const g4_tensor *w, const g4_tensor *up, int rows, const int32_t *ex, int slots,
                      const float *x, const float *norm, float eps, const int32_t *pair, const float *pw, float *y,
                      const g4c_moe_fuse *f);

#endif
