/* Attention on the paged KV cache (src/backend/backend.h: attention, attn_prep, kv_store), in f32 arithmetic
 * on K/V as stored (f32, bf16 or f16).
 *
 * One block serves one token and one KV head: the G = n_heads / n_kv_heads query heads that read it (GQA), so
 * every key and value row is read once for all of them. Keys are visited in tiles of ATT_TILE: warps compute
 * the tile's scores (a warp per key, lanes over head_dim, one shuffle sum per query head), the softmax runs
 * online per head (running max and sum), and threads own 4-element slices of the G x head_dim outputs for the
 * value pass. Steps of few tokens (decode) also split the keys over blocks (split-K): each block writes its
 * partial sums and the last block of a (token, head) to finish, found with a counter, combines them, so the
 * whole op is one launch. Head sizes up to 512 (multiples of 8), windows, kv_end and GQA are arguments. */
#include "backend/cuda/cuda_common.cuh"

#define ATT_THREADS 256
#define ATT_TILE 64
#define ATT_MAX_D 512
#define ATT_MAX_SPLITS 16

typedef struct attn_args {
    const float *q;
    float *out;
    int n_heads, n_kv, D, G;
    const int32_t *seq, *pos, *kv_end;
    const void *k, *v;
    const int32_t *table;
    int max_blocks, B, window;
    float scale;
    int n_splits, chunk;
    float *part;   /* [tokens, n_kv, n_splits, G*D + 2G] */
    int *counters; /* [tokens * n_kv] */
} attn_args;

template <int KVT> static __device__ __forceinline__ void load8(const void *cache, size_t i, float *o) {
    if (KVT == G4_KV_F32) {
        const float4 a = *(const float4 *)((const float *)cache + i), b = *(const float4 *)((const float *)cache + i + 4);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
        const uint4 u = *(const uint4 *)((const uint16_t *)cache + i);
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
        for (int e = 0; e < 4; e++) {
            const uint16_t lo = (uint16_t)(w[e] & 0xffffu), hi = (uint16_t)(w[e] >> 16);
            o[2 * e] = KVT == G4_KV_BF16 ? g4_bf2f(lo) : g4_h2f(lo);
            o[2 * e + 1] = KVT == G4_KV_BF16 ? g4_bf2f(hi) : g4_h2f(hi);
        }
    }
}

template <int KVT> static __device__ __forceinline__ void load4(const void *cache, size_t i, float *o) {
    if (KVT == G4_KV_F32) {
        const float4 a = *(const float4 *)((const float *)cache + i);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
    } else {
        const uint2 u = *(const uint2 *)((const uint16_t *)cache + i);
        const unsigned w[2] = {u.x, u.y};
        for (int e = 0; e < 2; e++) {
            const uint16_t lo = (uint16_t)(w[e] & 0xffffu), hi = (uint16_t)(w[e] >> 16);
            o[2 * e] = KVT == G4_KV_BF16 ? g4_bf2f(lo) : g4_h2f(lo);
            o[2 * e + 1] = KVT == G4_KV_BF16 ? g4_bf2f(hi) : g4_h2f(hi);
        }
    }
}

template <int NV4, int KVT> __global__ __launch_bounds__(ATT_THREADS) void attention_kernel(attn_args a) {
    G4_DYN_SMEM(float, sm);
    const int G = a.G, D = a.D, GD = G * D;
    float *qs = sm;                /* [G][D] queries times scale */
    float *sc = qs + GD;           /* [G][TILE] scores, then probabilities */
    float *mrow = sc + G * ATT_TILE; /* [G] running max */
    float *lrow = mrow + G;        /* [G] running sum */
    float *corr = lrow + G;        /* [G] rescale of this tile */
    int *krow = (int *)(corr + G); /* [TILE] physical cache rows */
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = blockIdx.x, t = blockIdx.y, s = blockIdx.z;

    g4_grid_wait();
    const int p = a.pos[t];
    const int lo = a.window ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
    const int hi = a.kv_end ? a.kv_end[t] : p + 1;
    const int start = lo + s * a.chunk;
    const int end = a.n_splits == 1 ? hi : (start + a.chunk < hi ? start + a.chunk : hi);
    const float *qg = a.q + ((size_t)t * a.n_heads + (size_t)kh * G) * D;
    for (int i = tid; i < GD; i += ATT_THREADS) qs[i] = qg[i] * a.scale;
    for (int g = tid; g < G; g += ATT_THREADS) mrow[g] = -INFINITY, lrow[g] = 0.0f;
    float acc[NV4][4];
#pragma unroll
    for (int i = 0; i < NV4; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    const int32_t *table = a.table + (size_t)a.seq[t] * a.max_blocks;
    const size_t rowe = (size_t)a.n_kv * D, head = (size_t)kh * D;
    __syncthreads();

    for (int j0 = start; j0 < end; j0 += ATT_TILE) {
        const int nk = end - j0 < ATT_TILE ? end - j0 : ATT_TILE;
        for (int j = tid; j < nk; j += ATT_THREADS) {
            const int kp = j0 + j;
            krow[j] = table[kp / a.B] * a.B + kp % a.B;
        }
        __syncthreads();
        /* scores: a warp per key */
        for (int j = warp; j < nk; j += ATT_THREADS / 32) {
            const size_t base = (size_t)krow[j] * rowe + head;
            float kr[2][8];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int d = lane * 8 + 256 * i;
                if (d < D)
                    load8<KVT>(a.k, base + d, kr[i]);
                else
                    for (int e = 0; e < 8; e++) kr[i][e] = 0.0f;
            }
            for (int g = 0; g < G; g++) {
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int d = lane * 8 + 256 * i;
                    if (d < D)
#pragma unroll
                        for (int e = 0; e < 8; e++) sum += kr[i][e] * qs[g * D + d + e];
                }
                sum = g4_warp_sum(sum);
                if (lane == 0) sc[g * ATT_TILE + j] = sum;
            }
        }
        __syncthreads();
        /* online softmax, a warp per head */
        for (int g = warp; g < G; g += ATT_THREADS / 32) {
            float mx = -INFINITY;
            for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, sc[g * ATT_TILE + j]);
            mx = g4_warp_max(mx);
            const float mnew = fmaxf(mrow[g], mx);
            float sum = 0.0f;
            for (int j = lane; j < nk; j += 32) {
                const float e = expf(sc[g * ATT_TILE + j] - mnew);
                sc[g * ATT_TILE + j] = e;
                sum += e;
            }
            sum = g4_warp_sum(sum);
            if (lane == 0) {
                const float cf = expf(mrow[g] - mnew);
                corr[g] = cf;
                lrow[g] = lrow[g] * cf + sum;
                mrow[g] = mnew;
            }
        }
        __syncthreads();
        /* values: each thread its 4-element slices of the G x D outputs */
#pragma unroll
        for (int i = 0; i < NV4; i++) {
            const int o = (tid + ATT_THREADS * i) * 4;
            if (o < GD) {
                const int g = o / D, d = o % D;
                const float cf = corr[g];
                for (int e = 0; e < 4; e++) acc[i][e] *= cf;
                for (int j = 0; j < nk; j++) {
                    const float pj = sc[g * ATT_TILE + j];
                    float v[4];
                    load4<KVT>(a.v, (size_t)krow[j] * rowe + head + d, v);
                    for (int e = 0; e < 4; e++) acc[i][e] = fmaf(pj, v[e], acc[i][e]);
                }
            }
        }
        __syncthreads();
    }

    float *og = a.out + ((size_t)t * a.n_heads + (size_t)kh * G) * D;
    if (a.n_splits == 1) {
#pragma unroll
        for (int i = 0; i < NV4; i++) {
            const int o = (tid + ATT_THREADS * i) * 4;
            if (o < GD) {
                const float inv = 1.0f / lrow[o / D];
                for (int e = 0; e < 4; e++) og[o + e] = acc[i][e] * inv;
            }
        }
        return;
    }
    /* split-K: partial sums, then the last block of this (token, head) combines */
    const size_t stride = (size_t)GD + 2 * (size_t)G;
    float *part = a.part + ((size_t)(t * a.n_kv + kh) * a.n_splits + s) * stride;
#pragma unroll
    for (int i = 0; i < NV4; i++) {
        const int o = (tid + ATT_THREADS * i) * 4;
        if (o < GD)
            for (int e = 0; e < 4; e++) part[o + e] = acc[i][e];
    }
    for (int g = tid; g < G; g += ATT_THREADS) part[GD + g] = mrow[g], part[GD + G + g] = lrow[g];
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&a.counters[t * a.n_kv + kh], 1) == a.n_splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float *all = a.part + (size_t)(t * a.n_kv + kh) * a.n_splits * stride;
    for (int o = tid; o < GD; o += ATT_THREADS) {
        const int g = o / D;
        float M = -INFINITY;
        for (int q = 0; q < a.n_splits; q++) M = fmaxf(M, all[q * stride + GD + g]);
        float num = 0.0f, den = 0.0f;
        for (int q = 0; q < a.n_splits; q++) {
            const float mq = all[q * stride + GD + g];
            if (mq == -INFINITY) continue; /* a split without keys */
            const float w = expf(mq - M);
            num += w * all[q * stride + o];
            den += w * all[q * stride + GD + G + g];
        }
        og[o] = num / den;
    }
    if (tid == 0) a.counters[t * a.n_kv + kh] = 0;
}

template <int KVT> static void launch_attention_kvt(g4c *c, const attn_args &x, dim3 grid, size_t smem) {
    const int nv4 = (x.G * x.D + ATT_THREADS * 4 - 1) / (ATT_THREADS * 4);
    if (nv4 <= 1) {
        g4c_smem_limit(attention_kernel<1, KVT>, smem);
        g4c_launch(c, attention_kernel<1, KVT>, grid, dim3(ATT_THREADS), smem, x);
    } else if (nv4 <= 2) {
        g4c_smem_limit(attention_kernel<2, KVT>, smem);
        g4c_launch(c, attention_kernel<2, KVT>, grid, dim3(ATT_THREADS), smem, x);
    } else if (nv4 <= 4) {
        g4c_smem_limit(attention_kernel<4, KVT>, smem);
        g4c_launch(c, attention_kernel<4, KVT>, grid, dim3(ATT_THREADS), smem, x);
    } else {
        g4c_smem_limit(attention_kernel<8, KVT>, smem);
        g4c_launch(c, attention_kernel<8, KVT>, grid, dim3(ATT_THREADS), smem, x);
    }
}

void g4c_attention(g4_backend *be, const g4_attention_args *a) {
    g4c *c = g4c_of(be);
    const int n = a->n_tokens;
    if (n <= 0) return;
    const int G = a->n_heads / a->n_kv_heads, D = a->head_dim;
    if (D % 8 || D > ATT_MAX_D || G * D > 8 * ATT_THREADS * 4 || a->n_heads % a->n_kv_heads) {
        g4c_note(c, cudaErrorInvalidValue, "attention: head_dim must be a multiple of 8 up to 512, and heads x head_dim "
                                           "per KV head at most 8192");
        return;
    }
    attn_args x;
    memset(&x, 0, sizeof x);
    x.q = a->q;
    x.out = a->out;
    x.n_heads = a->n_heads;
    x.n_kv = a->n_kv_heads;
    x.D = D;
    x.G = G;
    x.seq = a->seq;
    x.pos = a->pos;
    x.kv_end = a->kv_end;
    x.k = a->k;
    x.v = a->v;
    x.table = a->block_table;
    x.max_blocks = a->max_blocks;
    x.B = a->block_size;
    x.window = a->window;
    x.scale = a->scale;
    x.n_splits = 1;
    x.chunk = 1 << 30;
    if (n <= g4c_gemv_max_tokens()) { /* few tokens: split the keys over blocks */
        const int cap = a->max_blocks * a->block_size;
        int bound = a->max_keys > 0 && !c->in_graph_step ? a->max_keys : cap; /* a recording serves every length */
        if (c->in_graph_step && a->window && !a->kv_end && a->window < bound) bound = a->window;
        if (bound > cap) bound = cap;
        int want = 2 * c->n_sm / (a->n_kv_heads * n);
        if (want > ATT_MAX_SPLITS) want = ATT_MAX_SPLITS;
        if (want < 1) want = 1;
        int chunk = (bound + want - 1) / want;
        chunk = chunk < 16 ? 16 : (chunk + 15) / 16 * 16;
        const int splits = (bound + chunk - 1) / chunk;
        if (splits > 1) {
            if ((size_t)n * a->n_kv_heads > c->n_counters) {
                g4c_note(c, cudaErrorInvalidValue, "attention: too many tokens x heads for split-K");
                return;
            }
            x.n_splits = splits;
            x.chunk = chunk;
            x.part = (float *)g4c_ws(c, &c->ws_attn,
                                     (size_t)n * a->n_kv_heads * splits * ((size_t)G * D + 2 * (size_t)G) * sizeof(float));
            if (!x.part) return;
            x.counters = c->counters;
        }
    }
    const size_t smem = ((size_t)G * D + (size_t)G * ATT_TILE + 3 * (size_t)G + ATT_TILE) * sizeof(float);
    const dim3 grid((unsigned)a->n_kv_heads, (unsigned)n, (unsigned)x.n_splits);
    switch (a->kv_type) {
    case G4_KV_F32: launch_attention_kvt<G4_KV_F32>(c, x, grid, smem); break;
    case G4_KV_BF16: launch_attention_kvt<G4_KV_BF16>(c, x, grid, smem); break;
    default: launch_attention_kvt<G4_KV_F16>(c, x, grid, smem); break;
    }
}

/* ---------------------------------------------------------------- KV store and attention prep */
__global__ void kv_store_kernel(const float *k, const float *v, int row, const int32_t *slot, void *kc, void *vc,
                                int kv_type) {
    g4_grid_wait();
    const size_t src = (size_t)blockIdx.x * (size_t)row, dst = (size_t)slot[blockIdx.x] * (size_t)row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        g4_kv_put(kc, dst + i, k[src + i], kv_type);
        g4_kv_put(vc, dst + i, v[src + i], kv_type);
    }
}

void g4c_kv_store(g4_backend *be, const float *k, const float *v, int n, int row, const int32_t *slot, void *k_cache,
                  void *v_cache, g4_kv_type kv_type) {
    g4c *c = g4c_of(be);
    if (n <= 0) return;
    g4c_launch(c, kv_store_kernel, dim3((unsigned)n), dim3(256), 0, k, v, row, slot, k_cache, v_cache, (int)kv_type);
}

/* One block per token: a warp per head row. Values first (keys as values read the raw keys), then keys (into
 * the cache) and queries (in place). */
__global__ void attn_prep_kernel(g4_attn_prep_args a) {
    g4_grid_wait();
    const int t = blockIdx.x, warp = threadIdx.x >> 5, warps = blockDim.x >> 5, D = a.head_dim;
    const float *cs = a.rope ? a.rope + (size_t)t * D : NULL;
    const size_t row = (size_t)a.n_kv_heads * D;
    if (!a.kv_shared) {
        const size_t dst = (size_t)a.slot[t] * row;
        for (int h = warp; h < a.n_kv_heads; h += warps) {
            float *src = (a.v_from_k ? a.k : a.v) + ((size_t)t * a.n_kv_heads + h) * D;
            g4c_head_row(src, D, 1, NULL, a.eps, NULL, NULL, a.v_cache, dst + (size_t)h * D, (int)a.kv_type);
        }
        for (int h = warp; h < a.n_kv_heads; h += warps) {
            float *src = a.k + ((size_t)t * a.n_kv_heads + h) * D;
            g4c_head_row(src, D, 1, a.k_norm, a.eps, cs, NULL, a.k_cache, dst + (size_t)h * D, (int)a.kv_type);
        }
    }
    for (int h = warp; h < a.n_heads; h += warps) {
        float *q = a.q + ((size_t)t * a.n_heads + h) * D;
        g4c_head_row(q, D, 1, a.q_norm, a.eps, cs, q, NULL, 0, 0);
    }
}

void g4c_attn_prep(g4_backend *be, const g4_attn_prep_args *a) {
    g4c *c = g4c_of(be);
    if (a->n <= 0) return;
    g4c_launch(c, attn_prep_kernel, dim3((unsigned)a->n), dim3(256), 0, *a);
}
