/* Attention on the paged KV cache (src/backend/backend.h: attention, attn_prep, kv_store), in f32 arithmetic
 * on K/V as stored (f32, bf16 or f16).
 *
 * One block serves one token and one KV head: the G = n_heads / n_kv_heads query heads that read it (GQA), so
 * every key and value row is read once for all of them. Keys are visited in tiles of ATT_TILE: the block copies
 * the tile's K and V rows to shared memory (cp.async), the next tile's copies in flight while one is used; a thread per
 * (head, key) computes the scores, the softmax runs online per head (running max and sum), and threads own
 * 4-element slices of the G x head_dim outputs for the value pass. Steps of few tokens (decode) also split the
 * keys over blocks (split-K); each block takes an equal share of the token's actual keys (computed on the
 * device, so one recording serves every length), writes its partial sums, waits for the other splits of its
 * (token, head) at a counter, and combines its share of the outputs (until 2026-12-02 the last block combined them
 * all: 7 us of E2B's 14 us a sliding layer, globaltimer trace on the H200): the whole op is one launch. Head sizes up to 512
 * (multiples of 8), windows, kv_end, kv_start and GQA are arguments. The layer's attn_prep (args.prep) runs in
 * the same launch when every block can do its share alone (one token, or a KV-shared layer): each block
 * normalizes and rotates its queries into shared memory, and the block whose keys include the token's position
 * stores the token's key and value rows (E2B decode: one launch a layer less, 1%); the first tile's copies are
 * issued before the prep, the token's own row written into the tile by the prep. */
#include "backend/cuda/cuda_common.cuh"

#define ATT_THREADS 512 /* 16 warps: a tile's scores and values are latency-bound on one block a multiprocessor */
#define ATT_TILE 32 /* keys per tile (16 for f32 caches) */
#define ATT_MAX_D 512
#define ATT_MAX_SPLITS 16 /* <= the smallest tile (the combine's weights live in the score buffer) */

typedef struct attn_args {
    const float *q;
    float *out;
    int n_heads, n_kv, D, G;
    const int32_t *seq, *pos, *kv_end, *kv_start;
    const void *k, *v;
    const int32_t *table;
    int max_blocks, B, window;
    float scale;
    int n_splits;
    float *part;   /* [tokens, n_kv, n_splits, part_stride(G, D)] */
    int *counters; /* [tokens * n_kv], zero between launches */
    int *gens;     /* [tokens * n_kv]: generations of the split barriers */
    /* attn_prep fused (one token, or KV-shared): q holds the raw rows; the block normalizes and rotates its
     * queries, and the block whose keys include the token's position stores the token's key and value rows */
    int prep, kv_shared, v_from_k;
    const float *kraw, *vraw, *q_norm, *k_norm, *rope;
    const int32_t *slot;
    void *kc, *vc;
    float eps;
} attn_args;

/* floats of one split's partials: G x D sums, then G maxima and G sums, padded to 16 bytes */
static __host__ __device__ __forceinline__ size_t part_stride(int G, int D) {
    return (size_t)G * D + (((size_t)2 * G + 3) & ~(size_t)3);
}

/* 8 (4) elements of a shared-memory row of a KV type as f32 */
template <int KVT> static __device__ __forceinline__ void row8(const unsigned char *p, float *o) {
    if (KVT == G4_KV_F32) {
        const float4 a = *(const float4 *)p, b = *(const float4 *)(p + 16);
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
        const uint4 u = *(const uint4 *)p;
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
        for (int e = 0; e < 4; e++) {
            const uint16_t lo = (uint16_t)(w[e] & 0xffffu), hi = (uint16_t)(w[e] >> 16);
            o[2 * e] = KVT == G4_KV_BF16 ? g4_bf2f(lo) : g4_h2f(lo);
            o[2 * e + 1] = KVT == G4_KV_BF16 ? g4_bf2f(hi) : g4_h2f(hi);
        }
    }
}
template <int KVT> static __device__ __forceinline__ void row4(const unsigned char *p, float *o) {
    if (KVT == G4_KV_F32) {
        const float4 a = *(const float4 *)p;
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
    } else {
        const uint2 u = *(const uint2 *)p;
        const unsigned w[2] = {u.x, u.y};
        for (int e = 0; e < 2; e++) {
            const uint16_t lo = (uint16_t)(w[e] & 0xffffu), hi = (uint16_t)(w[e] >> 16);
            o[2 * e] = KVT == G4_KV_BF16 ? g4_bf2f(lo) : g4_h2f(lo);
            o[2 * e + 1] = KVT == G4_KV_BF16 ? g4_bf2f(hi) : g4_h2f(hi);
        }
    }
}

/* shared-memory bytes of a block: queries, two buffers of K and V tiles (rows padded by 16 bytes against
 * bank conflicts), scores, softmax state, row ids */
static size_t attention_smem(int G, int D, int esz) {
    const size_t tile = esz == 4 ? ATT_TILE / 2 : ATT_TILE;
    return (size_t)G * D * 4 + 4 * tile * ((size_t)D * esz + 16) + (size_t)G * tile * 4 + 3 * (size_t)G * 4 +
           2 * tile * 4;
}

template <int NV4, int KVT> __global__ __launch_bounds__(ATT_THREADS) void attention_kernel(attn_args a) {
    G4_DYN_SMEM(unsigned char, smem);
    constexpr int ESZ = KVT == G4_KV_F32 ? 4 : 2, TILE = KVT == G4_KV_F32 ? ATT_TILE / 2 : ATT_TILE;
    const int G = a.G, D = a.D, GD = G * D, rowb = D * ESZ + 16, cpr = D * ESZ / 16;
    /* threads per score: as many as leave no thread idle, at most 4, each with a whole number of 8-element steps
     * (G x TILE x ways stays a multiple of 32, so every warp runs the shuffles whole) */
    int ways = 1;
    while (ways < 4 && G * TILE * ways * 2 <= ATT_THREADS && D % (16 * ways) == 0) ways *= 2;
    float *qs = (float *)smem;                         /* [G][D] queries times scale */
    unsigned char *kv = smem + (size_t)GD * 4;         /* [2 buffers][K, V][TILE][rowb] */
    float *sc = (float *)(kv + 4 * (size_t)TILE * rowb); /* [G][TILE] scores, then probabilities */
    float *mrow = sc + G * TILE;                       /* [G] running max */
    float *lrow = mrow + G;                            /* [G] running sum */
    float *corr = lrow + G;                            /* [G] rescale of this tile */
    int *krow = (int *)(corr + G);                     /* [2][TILE] physical cache rows */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = blockIdx.x, t = blockIdx.y, s = blockIdx.z;

    g4_grid_wait();
    const int p = a.pos[t];
    const int lo = a.kv_start ? a.kv_start[t] : a.window ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
    const int hi = a.kv_end ? a.kv_end[t] : p + 1;
    const int chunk = (hi - lo + a.n_splits - 1) / a.n_splits; /* this token's keys, shared equally */
    const int start = lo + s * chunk, end = start + chunk < hi ? start + chunk : hi;
    const int ntiles = end > start ? (end - start + TILE - 1) / TILE : 0;
    const float *qg = a.q + ((size_t)t * a.n_heads + (size_t)kh * G) * D;
    const size_t rowe = (size_t)a.n_kv * D, head = (size_t)kh * D;
    const int32_t *table = a.table + (size_t)a.seq[t] * a.max_blocks;
    /* the prep's block stores the token's key and value rows (read by this block only); the first tile's copies are
     * issued before the prep, so when the token's row is in it, the prep writes that row into the tile too */
    const int own = a.prep && !a.kv_shared && p >= start && p < end, own0 = own && p - start < TILE;
    const int skip = own0 ? p : -1;
    /* tile i's K and V rows into buffer i & 1 (copies in flight until waited for) */
#define FETCH(i)                                                                                                    \
    do {                                                                                                            \
        const int j0_ = start + (i) * TILE, nk_ = end - j0_ < TILE ? end - j0_ : TILE, b_ = (i) & 1;              \
        int *kr_ = krow + b_ * TILE;                                                                                \
        unsigned char *kb_ = kv + (size_t)(2 * b_) * TILE * rowb, *vb_ = kb_ + (size_t)TILE * rowb;                \
        for (int j = tid; j < nk_; j += ATT_THREADS) kr_[j] = table[(j0_ + j) / a.B] * a.B + (j0_ + j) % a.B;      \
        __syncthreads();                                                                                            \
        for (int c = tid; c < nk_ * cpr; c += ATT_THREADS) {                                                       \
            const int j = c / cpr, o = (c % cpr) * 16;                                                              \
            if (j0_ + j == skip) continue; /* the token's own row, written by the prep */                           \
            const size_t src = ((size_t)kr_[j] * rowe + head) * ESZ + o;                                            \
            g4_cp16(kb_ + (size_t)j * rowb + o, (const unsigned char *)a.k + src);                                 \
            g4_cp16(vb_ + (size_t)j * rowb + o, (const unsigned char *)a.v + src);                                 \
        }                                                                                                           \
        g4_cp_commit();                                                                                             \
    } while (0)

    if (ntiles > 0) FETCH(0);
    if (a.prep) { /* attn_prep's rows of this block (as attn_prep_kernel), a warp a row */
        const float *cs = a.rope ? a.rope + (size_t)t * D : NULL;
        for (int g = warp; g < G; g += ATT_THREADS / 32)
            g4c_head_row((float *)qg + (size_t)g * D, D, 1, a.q_norm, a.eps, cs, qs + (size_t)g * D, NULL, 0, 0);
        if (own && warp < 2) {
            const size_t src = ((size_t)t * a.n_kv + kh) * D, dst = (size_t)a.slot[t] * rowe + head;
            unsigned char *krow0 = own0 ? kv + (size_t)(p - start) * rowb : NULL; /* buffer 0's K row, V below */
            if (warp == 0)
                g4c_head_row((float *)(a.v_from_k ? a.kraw : a.vraw) + src, D, 1, NULL, a.eps, NULL, NULL, a.vc, dst,
                             KVT, own0 ? krow0 + (size_t)TILE * rowb : NULL);
            else
                g4c_head_row((float *)a.kraw + src, D, 1, a.k_norm, a.eps, cs, NULL, a.kc, dst, KVT, krow0);
        }
        __syncthreads(); /* (later tiles read the stored rows through cp.async by this block) */
        for (int i = tid; i < GD; i += ATT_THREADS) qs[i] *= a.scale;
    } else {
        for (int i = tid; i < GD; i += ATT_THREADS) qs[i] = qg[i] * a.scale;
    }
    for (int g = tid; g < G; g += ATT_THREADS) mrow[g] = -INFINITY, lrow[g] = 0.0f;
    G4_TRACE_MARK(2);
    float acc[NV4][4];
#pragma unroll
    for (int i = 0; i < NV4; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        const int j0 = start + it * TILE, nk = end - j0 < TILE ? end - j0 : TILE, b = it & 1;
        const unsigned char *ks = kv + (size_t)(2 * b) * TILE * rowb, *vs = ks + (size_t)TILE * rowb;
        if (it + 1 < ntiles) {
            FETCH(it + 1);
            g4_cp_wait_but_one();
        } else {
            g4_cp_wait();
        }
        __syncthreads();
        if (it == 0) G4_TRACE_MARK(3);
        /* scores: `ways` adjacent threads per (head, key), each every ways-th 8 elements, summed by shuffles; a warp
         * shares the head (its query is broadcast) */
        for (int idx = tid; idx < G * TILE * ways; idx += ATT_THREADS) {
            const int item = idx / ways, part = idx - item * ways, g = item / TILE, j = item % TILE;
            float sum = 0.0f;
            if (j < nk) {
                const float *qv = qs + (size_t)g * D;
                const unsigned char *kr = ks + (size_t)j * rowb;
                for (int d = part * 8; d < D; d += 8 * ways) {
                    float kx[8];
                    row8<KVT>(kr + (size_t)d * ESZ, kx);
                    const float4 q0 = *(const float4 *)(qv + d), q1 = *(const float4 *)(qv + d + 4);
                    sum += kx[0] * q0.x + kx[1] * q0.y + kx[2] * q0.z + kx[3] * q0.w + kx[4] * q1.x + kx[5] * q1.y +
                           kx[6] * q1.z + kx[7] * q1.w;
                }
            }
            for (int o = 1; o < ways; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (part == 0) sc[item] = sum;
        }
        __syncthreads();
        /* online softmax, a warp per head */
        for (int g = warp; g < G; g += ATT_THREADS / 32) {
            float mx = -INFINITY;
            for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, sc[g * TILE + j]);
            mx = g4_warp_max(mx);
            const float mnew = fmaxf(mrow[g], mx);
            float sum = 0.0f;
            for (int j = lane; j < nk; j += 32) {
                const float e = expf(sc[g * TILE + j] - mnew);
                sc[g * TILE + j] = e;
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
                const float *pg = sc + g * TILE;
                const unsigned char *vc = vs + (size_t)d * ESZ;
                for (int j = 0; j < nk; j++) {
                    float v[4];
                    row4<KVT>(vc + (size_t)j * rowb, v);
                    const float pj = pg[j];
                    for (int e = 0; e < 4; e++) acc[i][e] = fmaf(pj, v[e], acc[i][e]);
                }
            }
        }
        __syncthreads(); /* buffer b and the scores are free for the tile after next */
    }
#undef FETCH
    G4_TRACE_MARK(4);

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
    /* split-K: partial sums; once every split of this (token, head) has written its own, each block combines its
     * share of the outputs (all blocks of a split grid are resident: at most one a multiprocessor). The emulator
     * runs blocks one after another: there the last block to finish combines them all. */
    const size_t stride = part_stride(G, D);
    float *part = a.part + ((size_t)(t * a.n_kv + kh) * a.n_splits + s) * stride;
#pragma unroll
    for (int i = 0; i < NV4; i++) {
        const int o = (tid + ATT_THREADS * i) * 4;
        if (o < GD) *(float4 *)(part + o) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
    for (int g = tid; g < G; g += ATT_THREADS) part[GD + g] = mrow[g], part[GD + G + g] = lrow[g];
    __threadfence();
    __syncthreads();
    const int S = a.n_splits;
    int *count = a.counters + t * a.n_kv + kh;
#ifdef G4_CUDA_EMU
    __shared__ int last;
    if (tid == 0) last = atomicAdd(count, 1) == S - 1;
    __syncthreads();
    if (!last) return;
    const int o0 = 0, o1 = GD;
#else
    if (tid == 0) { /* a barrier of the S blocks: the last to arrive resets the count and moves the generation on */
        volatile int *gen = a.gens + t * a.n_kv + kh;
        const int g0 = *gen;
        __threadfence();
        if (atomicAdd(count, 1) == S - 1) {
            *count = 0;
            __threadfence();
            atomicAdd((int *)gen, 1);
        } else {
            for (long spin = 0; *gen == g0 && spin < (1L << 26); spin++) __nanosleep(32); /* (bounded: no hang) */
        }
    }
    __syncthreads();
    const int share = (GD / 4 + S - 1) / S * 4, o0 = s * share, o1 = o0 + share < GD ? o0 + share : GD;
    G4_TRACE_MARK(5);
#endif
    __threadfence();
    const float *all = a.part + (size_t)(t * a.n_kv + kh) * a.n_splits * stride;
    /* this thread's first 4 outputs: every split's partials in flight while the weights are formed */
    const int of = o0 + tid * 4;
    float4 pv[ATT_MAX_SPLITS];
#pragma unroll
    for (int q = 0; q < ATT_MAX_SPLITS; q++)
        if (q < S && of < o1) pv[q] = __ldcg((const float4 *)(all + (size_t)q * stride + of));
    /* per head: each split's weight exp(m_s - M) / sum_s exp(m_s - M) l_s, into shared memory (sc) */
    float *coef = sc; /* [S][G] (S <= TILE) */
    for (int g = warp; g < G; g += ATT_THREADS / 32) {
        const float mq = lane < S ? __ldcg(all + (size_t)lane * stride + GD + g) : -INFINITY;
        const float lq = lane < S ? __ldcg(all + (size_t)lane * stride + GD + G + g) : 0.0f;
        const float M = g4_warp_max(mq);
        const float w = mq == -INFINITY ? 0.0f : expf(mq - M); /* a split without keys weighs nothing */
        const float den = g4_warp_sum(w * lq);
        if (lane < S) coef[lane * G + g] = w / den;
    }
    __syncthreads();
    /* 4 outputs a thread (one head: D is a multiple of 8), every split's partials loaded before they are used:
     * one round trip to L2 per 4 x ATT_THREADS outputs */
    for (int o = of; o < o1; o += ATT_THREADS * 4) {
        const int g = o / D;
        if (o != of)
#pragma unroll
            for (int q = 0; q < ATT_MAX_SPLITS; q++)
                if (q < S) pv[q] = __ldcg((const float4 *)(all + (size_t)q * stride + o));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; q++)
            if (q < S) {
                const float cq = coef[q * G + g];
                v.x += cq * pv[q].x, v.y += cq * pv[q].y, v.z += cq * pv[q].z, v.w += cq * pv[q].w;
            }
        *(float4 *)(og + o) = v;
    }
#ifdef G4_CUDA_EMU
    if (tid == 0) *count = 0;
#endif
    G4_TRACE_MARK(6);
}

/* Lets every attention kernel use up to the device's shared memory per block. */
void g4c_attention_init(g4c *c) {
    g4c_allow_smem(c, attention_kernel<1, G4_KV_F32>), g4c_allow_smem(c, attention_kernel<1, G4_KV_BF16>);
    g4c_allow_smem(c, attention_kernel<1, G4_KV_F16>), g4c_allow_smem(c, attention_kernel<2, G4_KV_F32>);
    g4c_allow_smem(c, attention_kernel<2, G4_KV_BF16>), g4c_allow_smem(c, attention_kernel<2, G4_KV_F16>);
    g4c_allow_smem(c, attention_kernel<4, G4_KV_F32>), g4c_allow_smem(c, attention_kernel<4, G4_KV_BF16>);
    g4c_allow_smem(c, attention_kernel<4, G4_KV_F16>), g4c_allow_smem(c, attention_kernel<8, G4_KV_F32>);
    g4c_allow_smem(c, attention_kernel<8, G4_KV_BF16>), g4c_allow_smem(c, attention_kernel<8, G4_KV_F16>);
}

template <int KVT> static void launch_attention_kvt(g4c *c, const attn_args &x, dim3 grid, size_t smem) {
    const int nv4 = (x.G * x.D + ATT_THREADS * 4 - 1) / (ATT_THREADS * 4);
    if (nv4 <= 1)
        g4c_launch(c, attention_kernel<1, KVT>, grid, dim3(ATT_THREADS), smem, x);
    else if (nv4 <= 2)
        g4c_launch(c, attention_kernel<2, KVT>, grid, dim3(ATT_THREADS), smem, x);
    else if (nv4 <= 4)
        g4c_launch(c, attention_kernel<4, KVT>, grid, dim3(ATT_THREADS), smem, x);
    else
        g4c_launch(c, attention_kernel<8, KVT>, grid, dim3(ATT_THREADS), smem, x);
}

void g4c_attention(g4_backend *be, const g4_attention_args *a) {
    g4c *c = g4c_of(be);
    const int n = a->n_tokens;
    if (n <= 0) return;
    /* the prep in the same launch where each block can do its part: queries always; a key and value row only
     * when no other token of the step can read it (one token) */
    const g4_attn_prep_args *pp = a->prep;
    const int fuse = pp && (pp->kv_shared || n == 1) && pp->q == a->q && pp->head_dim == a->head_dim;
    if (pp && !fuse) g4c_attn_prep(be, pp);
    const int G = a->n_heads / a->n_kv_heads, D = a->head_dim;
    const size_t smem = attention_smem(G, D, (int)g4_kv_type_size(a->kv_type));
    if (D % 8 || D > ATT_MAX_D || G * D > 8 * ATT_THREADS * 4 || a->n_heads % a->n_kv_heads ||
        smem > c->prop.sharedMemPerBlockOptin) {
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
    x.kv_start = a->kv_start;
    x.k = a->k;
    x.v = a->v;
    x.table = a->block_table;
    x.max_blocks = a->max_blocks;
    x.B = a->block_size;
    x.window = a->window;
    x.scale = a->scale;
    if (fuse) {
        x.prep = 1, x.kv_shared = pp->kv_shared, x.v_from_k = pp->v_from_k;
        x.kraw = pp->k, x.vraw = pp->v, x.q_norm = pp->q_norm, x.k_norm = pp->k_norm, x.rope = pp->rope;
        x.slot = pp->slot, x.kc = pp->k_cache, x.vc = pp->v_cache, x.eps = pp->eps;
    }
    x.n_splits = 1;
    if (n <= g4c_gemv_max_tokens()) { /* few tokens: split the keys over blocks */
        const int cap = a->max_blocks * a->block_size;
        int bound = a->max_keys > 0 && !c->in_graph_step ? a->max_keys : cap; /* a recording serves every length */
        if (c->in_graph_step && a->window && !a->kv_end && !a->kv_start && a->window < bound) bound = a->window;
        if (bound > cap) bound = cap;
        int splits = c->n_sm / (a->n_kv_heads * n); /* a block per multiprocessor */
        if (splits > ATT_MAX_SPLITS) splits = ATT_MAX_SPLITS;
        const int least = c->att_min_keys; /* keys a split takes at least (32; G4_CUDA_ATT_MIN_KEYS) */
        if (splits > (bound + least - 1) / least) splits = (bound + least - 1) / least;
        if (splits > 1) {
            if ((size_t)n * a->n_kv_heads > c->n_counters / 2) {
                g4c_note(c, cudaErrorInvalidValue, "attention: too many tokens x heads for split-K");
                return;
            }
            x.n_splits = splits;
            x.part = (float *)g4c_ws(c, &c->ws_attn,
                                     (size_t)n * a->n_kv_heads * splits * part_stride(G, D) * sizeof(float));
            if (!x.part) return;
            x.counters = c->counters;
            x.gens = c->counters + c->n_counters / 2; /* (the upper half: other kernels' counters stay below) */
        }
    }
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

/* A warp per head row: block (token, group of 8 rows); rows are the values first (keys as values read the raw
 * keys), then keys (into the cache), then queries (in place). */
__global__ void attn_prep_kernel(g4_attn_prep_args a) {
    g4_grid_wait();
    const int t = blockIdx.x, D = a.head_dim, KV = a.kv_shared ? 0 : a.n_kv_heads;
    const int r = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const float *cs = a.rope ? a.rope + (size_t)t * D : NULL;
    const size_t dst = a.kv_shared ? 0 : (size_t)a.slot[t] * a.n_kv_heads * D;
    if (r < KV) { /* value head r */
        float *src = (a.v_from_k ? a.k : a.v) + ((size_t)t * a.n_kv_heads + r) * D;
        g4c_head_row(src, D, 1, NULL, a.eps, NULL, NULL, a.v_cache, dst + (size_t)r * D, (int)a.kv_type);
    } else if (r < 2 * KV) { /* key head */
        const int h = r - KV;
        float *src = a.k + ((size_t)t * a.n_kv_heads + h) * D;
        g4c_head_row(src, D, 1, a.k_norm, a.eps, cs, NULL, a.k_cache, dst + (size_t)h * D, (int)a.kv_type);
    } else if (r < 2 * KV + a.n_heads) { /* query head */
        float *q = a.q + ((size_t)t * a.n_heads + (r - 2 * KV)) * D;
        g4c_head_row(q, D, 1, a.q_norm, a.eps, cs, q, NULL, 0, 0);
    }
}

void g4c_attn_prep(g4_backend *be, const g4_attn_prep_args *a) {
    g4c *c = g4c_of(be);
    if (a->n <= 0) return;
    const int rows = a->n_heads + (a->kv_shared ? 0 : 2 * a->n_kv_heads);
    g4c_launch(c, attn_prep_kernel, dim3((unsigned)a->n, (unsigned)((rows + 7) / 8)), dim3(256), 0, *a);
}

G4_TRACE_TU(attention)
