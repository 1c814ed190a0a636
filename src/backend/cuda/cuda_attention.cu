/* Attention on the paged KV cache (src/backend/backend.h: attention, attn_prep, kv_store), in f32 arithmetic
 * on K/V as stored (f32, bf16 or f16).
 *
 * One block serves one token and one KV head: the G = n_heads / n_kv_heads query heads that read it (GQA), so
 * every key and value row is read once for all of them. Keys are visited in tiles of ATT_TILE: the block copies
 * the tile's K and V rows to shared memory (cp.async), the next tile's copies in flight while one is used; a thread per
 * (head, key) computes the scores, the softmax runs online per head (running max and sum), and threads own
 * 4-element slices of the G x head_dim outputs for the value pass. Steps of few tokens (decode) also split the
 * keys over blocks (split-K), up to a block a multiprocessor with at least G4_CUDA_ATT_MIN_KEYS (8) keys each: the
 * work of a tile is latency on one multiprocessor (E2B, 16 splits of 32 keys: 4.5 us a tile; 64 of 8: 2.2 us), and
 * a split with fewer keys than a tile uses a smaller one, with more threads per score. Each block takes an equal
 * share of the token's actual keys (computed on the device, so one recording serves every length), writes its
 * partial sums, waits for the other splits of its (token, head) at a counter, and combines its share of the outputs
 * (a group of threads per 4 outputs, one thread per split in flight, shuffles): the whole op is one launch, and it
 * lets the next kernel launch right after its wait (its blocks load their first weights meanwhile). Head sizes up to 512
 * (multiples of 8), windows, kv_end, kv_start and GQA are arguments. The layer's attn_prep (args.prep) runs in
 * the same launch when every block can do its share alone (one token, or a KV-shared layer): each block
 * normalizes and rotates its queries into shared memory, and the block whose keys include the token's position
 * stores the token's key and value rows (E2B decode: one launch a layer less, 1%); the first tile's copies are
 * issued before the prep, the token's own row written into the tile by the prep, and then even before the kernel waits
 * for the previous one (every other row they read was written before that one began). */
#include "backend/cuda/cuda_common.cuh"

#define ATT_THREADS 512 /* 16 warps: a tile's scores and values are latency-bound on one block a multiprocessor */
#define ATT_TILE 32 /* keys per tile (16 for f32 caches) */
#define ATT_MAX_D 512
#define ATT_MAX_SPLITS 256 /* a split a multiprocessor (the combine keeps 8 of its splits' weights a lane) */

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
    int early; /* let the next kernel's blocks start (and load their first weights) right after the wait */
    int n_tokens; /* (the tensor-core kernel) */
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
    return (size_t)G * D * 4 + 4 * tile * ((size_t)D * esz + 16) + (size_t)G * tile * 4 + 3 * (size_t)G * 4;
}

template <int NV4, int KVT> __global__ __launch_bounds__(ATT_THREADS) void attention_kernel(attn_args a) {
    G4_DYN_SMEM(unsigned char, smem);
    constexpr int ESZ = KVT == G4_KV_F32 ? 4 : 2, TILE = KVT == G4_KV_F32 ? ATT_TILE / 2 : ATT_TILE;
    const int G = a.G, D = a.D, GD = G * D, rowb = D * ESZ + 16, cpr = D * ESZ / 16;
    float *qs = (float *)smem;                         /* [G][D] queries times scale */
    unsigned char *kv = smem + (size_t)GD * 4;         /* [2 buffers][K, V][TILE][rowb] */
    float *sc = (float *)(kv + 4 * (size_t)TILE * rowb); /* [G][TILE] scores, then probabilities */
    float *mrow = sc + G * TILE;                       /* [G] running max */
    float *lrow = mrow + G;                            /* [G] running sum */
    float *corr = lrow + G;                            /* [G] rescale of this tile */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = blockIdx.x, t = blockIdx.y, s = blockIdx.z;

    /* With the prep in this launch, every row the first tile copies was written before the previous kernel began
     * (earlier steps, or the source layer's kernels of this step: each kernel lets its successor start only once past
     * its own wait), the token's own row excepted: the first tile's copies are issued before the wait (H200, same
     * call: E2B bf16 decode 2.25 -> 2.22 ms, E4B 3.53 -> 3.50, 26B-A4B 3.40 -> 3.37, 12B Q4_0 3.84 -> 3.79). */
    if (!a.prep) g4_grid_wait();
    const int p = a.pos[t];
    const int lo = a.kv_start ? a.kv_start[t] : a.window ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
    const int hi = a.kv_end ? a.kv_end[t] : p + 1;
    const int chunk = (hi - lo + a.n_splits - 1) / a.n_splits; /* this token's keys, shared equally */
    const int start = lo + s * chunk, end = start + chunk < hi ? start + chunk : hi;
    const int ntiles = end > start ? (end - start + TILE - 1) / TILE : 0;
    /* keys of a tile (2^lk: fewer than TILE when the split has fewer keys, as with a split a multiprocessor), and
     * threads per score (2^lw: as many as leave no thread idle, up to a warp, each with a whole number of 8-element
     * steps; the score loop runs whole warps, so the shuffles do) */
    int lk = 0, lw = 0;
    while ((1 << lk) < TILE && (1 << lk) < end - start) lk++;
    while (lw < 5 && (G << (lk + lw + 1)) <= ATT_THREADS && D % (16 << lw) == 0) lw++;
    const int kt = 1 << lk, ways = 1 << lw;
    const float *qg = a.q + ((size_t)t * a.n_heads + (size_t)kh * G) * D;
    const size_t rowe = (size_t)a.n_kv * D, head = (size_t)kh * D;
    const int32_t *table = a.table + (size_t)a.seq[t] * a.max_blocks;
    /* the prep's block stores the token's key and value rows (read by this block only); the first tile's copies are
     * issued before the prep, so when the token's row is in it, the prep writes that row into the tile too */
    const int own = a.prep && !a.kv_shared && p >= start && p < end, own0 = own && p - start < TILE;
    const int skip = own0 ? p : -1;
    /* tile i's K and V rows into buffer i & 1 (copies in flight until waited for); the copies go to the last threads
     * first, so that the prep's warps (the first ones) are not held up by the block table's loads */
#define FETCH(i)                                                                                                    \
    do {                                                                                                            \
        const int j0_ = start + (i) * TILE, nk_ = end - j0_ < TILE ? end - j0_ : TILE, b_ = (i) & 1;              \
        unsigned char *kb_ = kv + (size_t)(2 * b_) * TILE * rowb, *vb_ = kb_ + (size_t)TILE * rowb;                \
        _Pragma("unroll 1") for (int c = ATT_THREADS - 1 - tid; c < nk_ * cpr; c += ATT_THREADS) {                 \
            const int j = c / cpr, o = (c % cpr) * 16, key = j0_ + j;                                              \
            if (key == skip) continue; /* the token's own row, written by the prep */                               \
            const size_t src = (((size_t)table[key / a.B] * a.B + key % a.B) * rowe + head) * ESZ + o;             \
            g4_cp16(kb_ + (size_t)j * rowb + o, (const unsigned char *)a.k + src);                                 \
            g4_cp16(vb_ + (size_t)j * rowb + o, (const unsigned char *)a.v + src);                                 \
        }                                                                                                           \
        g4_cp_commit();                                                                                             \
    } while (0)

    if (ntiles > 0) FETCH(0);
    if (a.prep) g4_grid_wait();
    if (a.early) g4_grid_launch_dependents();
    if (a.prep) { /* attn_prep's rows of this block (as attn_prep_kernel), a warp a row: the G queries, then (the block
                   * whose keys hold the token's position) its key and value rows, into the cache and the first tile */
        const float *cs = a.rope ? a.rope + (size_t)t * D : NULL;
        unsigned char *own_k = own0 ? kv + (size_t)(p - start) * rowb : NULL; /* buffer 0's K row, V below */
        const size_t src = ((size_t)t * a.n_kv + kh) * D, dst = own ? (size_t)a.slot[t] * rowe + head : 0;
        for (int r = warp; r < G + 2 * own; r += ATT_THREADS / 32) { /* (one call site: a smaller kernel) */
            const int q = r < G, k = r == G;
            float *v = q ? (float *)qg + (size_t)r * D : (float *)(k || a.v_from_k ? a.kraw : a.vraw) + src;
            g4c_head_row(v, D, 1, q ? a.q_norm : k ? a.k_norm : NULL, a.eps, q || k ? cs : NULL,
                         q ? qs + (size_t)r * D : NULL, q ? NULL : k ? a.kc : a.vc, dst, KVT,
                         q || !own_k ? NULL : k ? own_k : own_k + (size_t)TILE * rowb);
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
        const int items = G << lk, total = ((items << lw) + 31) & ~31;
        for (int idx = tid; idx < total; idx += ATT_THREADS) {
            const int item = idx >> lw, part = idx & (ways - 1), g = item >> lk, j = item & (kt - 1);
            float sum = 0.0f;
            if (item < items && j < nk) {
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
            if (part == 0 && item < items) sc[g * TILE + j] = sum;
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
    __syncthreads(); /* (the block's writes, then thread 0's fences release and acquire for all of it: cumulative) */
    const int S = a.n_splits;
    int *count = a.counters + t * a.n_kv + kh;
#ifdef G4_CUDA_EMU
    __shared__ int last;
    if (tid == 0) last = atomicAdd(count, 1) == S - 1;
    __syncthreads();
    if (!last) return;
    const int o0 = 0, o1 = GD;
#else
    if (tid == 0) { /* a barrier of the S blocks: the last to arrive moves the generation on, then resets the count
                     * (no block of this launch reads the count again, and the next launch begins after this one
                     * ends: the reset need not be waited for before the others are released) */
        volatile int *gen = a.gens + t * a.n_kv + kh;
        const int g0 = *gen;
        g4_fence_gpu();
        if (atomicAdd(count, 1) == S - 1) {
            g4_fence_gpu();
            atomicAdd((int *)gen, 1);
            *count = 0;
        } else {
            for (long spin = 0; *gen == g0 && spin < (1L << 26); spin++) __nanosleep(32); /* (bounded: no hang) */
            g4_fence_gpu();
        }
    }
    __syncthreads();
    const int share = (GD / 4 + S - 1) / S * 4, o0 = s * share, o1 = o0 + share < GD ? o0 + share : GD;
    G4_TRACE_MARK(5);
#endif
    const float *all = a.part + (size_t)(t * a.n_kv + kh) * a.n_splits * stride;
    /* the share's 4-output slices, T = 2^lt threads each (a pass of ATT_THREADS / T slices at a time): thread
     * `sub` of a slice sums the splits sub, sub + T, ..., the T sums then added by shuffles (and shared memory when
     * T spans warps); the first pass's partials are in flight while the weights are formed */
    const int n4 = (o1 - o0) / 4, g_lo = o0 / D, gc = o1 > o0 ? (o1 - 1) / D - g_lo + 1 : 0;
    int lt = 0;
    while (lt < 9 && (n4 << (lt + 1)) <= ATT_THREADS && (1 << lt) < S) lt++;
    const int T = 1 << lt, per = ATT_THREADS >> lt, sub = tid & (T - 1);
    float *coef = (float *)kv;                       /* [S][gc] split weights (the tile buffers are free now) */
    float4 *red4 = (float4 *)(coef + ((S * gc + 3) & ~3)); /* [warps] sums of slices spanning warps */
    float4 pv[4] = {};
    {
        const int sl = tid >> lt, o = o0 + 4 * sl;
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (sl < n4 && sub + u * T < S) pv[u] = __ldcg((const float4 *)(all + (size_t)(sub + u * T) * stride + o));
    }
    /* per head of the share, a warp: each split's weight exp(m_s - M) / sum_s exp(m_s - M) l_s */
    for (int gi = warp; gi < gc; gi += ATT_THREADS / 32) {
        const int g = g_lo + gi;
        float mq[ATT_MAX_SPLITS / 32], lq[ATT_MAX_SPLITS / 32], M = -INFINITY;
#pragma unroll
        for (int i = 0; i < ATT_MAX_SPLITS / 32; i++) {
            const int q = lane + 32 * i;
            mq[i] = q < S ? __ldcg(all + (size_t)q * stride + GD + g) : -INFINITY;
            lq[i] = q < S ? __ldcg(all + (size_t)q * stride + GD + G + g) : 0.0f;
            M = fmaxf(M, mq[i]);
        }
        M = g4_warp_max(M);
        float den = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_SPLITS / 32; i++) {
            mq[i] = mq[i] == -INFINITY ? 0.0f : expf(mq[i] - M); /* a split without keys weighs nothing */
            den += mq[i] * lq[i];
        }
        den = g4_warp_sum(den);
#pragma unroll
        for (int i = 0; i < ATT_MAX_SPLITS / 32; i++)
            if (lane + 32 * i < S) coef[(lane + 32 * i) * gc + gi] = mq[i] / den;
    }
    __syncthreads();
    for (int base = 0; base < n4; base += per) { /* (uniform: every thread runs every pass) */
        const int sl = base + (tid >> lt), o = o0 + 4 * sl, gi = sl < n4 ? o / D - g_lo : 0;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (sl < n4) {
            if (base > 0)
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (sub + u * T < S) pv[u] = __ldcg((const float4 *)(all + (size_t)(sub + u * T) * stride + o));
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (sub + u * T < S) {
                    const float cq = coef[(sub + u * T) * gc + gi];
                    v.x += cq * pv[u].x, v.y += cq * pv[u].y, v.z += cq * pv[u].z, v.w += cq * pv[u].w;
                }
            for (int q = sub + 4 * T; q < S; q += T) {
                const float4 p4 = __ldcg((const float4 *)(all + (size_t)q * stride + o));
                const float cq = coef[q * gc + gi];
                v.x += cq * p4.x, v.y += cq * p4.y, v.z += cq * p4.z, v.w += cq * p4.w;
            }
        }
        for (int off = (T < 32 ? T : 32) >> 1; off > 0; off >>= 1) {
            v.x += __shfl_xor_sync(0xffffffffu, v.x, off), v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
            v.z += __shfl_xor_sync(0xffffffffu, v.z, off), v.w += __shfl_xor_sync(0xffffffffu, v.w, off);
        }
        if (T > 32) { /* the slice spans T / 32 warps */
            if (lane == 0) red4[warp] = v;
            __syncthreads();
            if (sub == 0)
                for (int w = 1; w < T / 32; w++) {
                    const float4 r = red4[warp + w];
                    v.x += r.x, v.y += r.y, v.z += r.z, v.w += r.w;
                }
            __syncthreads();
        }
        if (sub == 0 && sl < n4) *(float4 *)(og + o) = v;
    }
#ifdef G4_CUDA_EMU
    if (tid == 0) *count = 0;
#endif
    G4_TRACE_MARK(6);
}

/* ---------------------------------------------------------------- many tokens on tensor cores */
/* Prefill with a bf16 cache: a block per KV head and 16 query rows (16 / G consecutive tokens, each with its G query
 * heads), 8 warps. Per tile of TC_KEYS keys (K and V rows copied to shared memory, the next tile's copies in flight):
 * warp w forms the scores' share of its head dimensions [w D/8, (w+1) D/8) with m16n8k16 products (the queries as
 * bf16 hi + lo parts: near f32 scores), the shares are summed in shared memory, 16 threads a row run the online
 * softmax (each row masked to its own keys: position, window, kv_start/kv_end), and warp w adds P V for its head
 * dimensions (P as hi + lo parts too). Rows of different sequences are served one sequence after another (tiles
 * through that sequence's block table): a batch of one sequence takes one pass. */
#define TC_WARPS 8
#define TC_KEYS 32
#define TC_PROW (TC_KEYS + 8) /* bf16 elements of a P row in shared memory (padded) */

static size_t attention_tc_smem(int D) {
    size_t s = (size_t)2 * 16 * (D + 8) * 2;            /* queries, hi and lo */
    s += (size_t)4 * TC_KEYS * (2 * D + 16);              /* two buffers of K and V rows */
    s += (size_t)TC_WARPS * 16 * TC_KEYS * 4;             /* the warps' shares of the scores */
    s += (size_t)2 * 16 * TC_PROW * 2;                    /* P, hi and lo */
    s += (size_t)7 * 16 * 4;                              /* per row: max, sum, rescale, first and end key, seq, done */
#ifdef G4_CUDA_EMU
    s += (size_t)TC_WARPS * 384 * 4;                      /* the emulator's product scratch */
#endif
    return s;
}

static __device__ __forceinline__ uint32_t pack_bf16(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

__global__ __launch_bounds__(TC_WARPS * 32) void attention_tc_kernel(attn_args a) {
    G4_DYN_SMEM(unsigned char, smem);
    const int G = a.G, D = a.D, QT = 16 / G, qrow = D + 8, rowb = 2 * D + 16, cpr = D / 8, Dw = D / TC_WARPS;
    uint16_t *qh = (uint16_t *)smem, *ql = qh + 16 * qrow;
    unsigned char *kv = (unsigned char *)(ql + 16 * qrow); /* [2 buffers][K, V][TC_KEYS][rowb] */
    float *red = (float *)(kv + (size_t)4 * TC_KEYS * rowb); /* [warp][16][TC_KEYS] */
    uint16_t *ph = (uint16_t *)(red + TC_WARPS * 16 * TC_KEYS), *pl = ph + 16 * TC_PROW;
    float *mrow = (float *)(pl + 16 * TC_PROW), *lrow = mrow + 16, *corr = lrow + 16;
    int *rlo = (int *)(corr + 16), *rhi = rlo + 16, *rseq = rhi + 16, *rdone = rseq + 16;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, t4 = lane & 3;
#ifdef G4_CUDA_EMU
    float *scr = (float *)(rdone + 16) + warp * 384;
#else
    float *scr = NULL;
#endif
    const int kh = blockIdx.x, t0 = blockIdx.y * QT;
    const size_t rowe = (size_t)a.n_kv * D, head = (size_t)kh * D;
    g4_grid_wait();
    if (tid < 16) { /* row tid: token t0 + tid / G, head tid % G */
        const int t = t0 + tid / G, ok = t < a.n_tokens;
        const int p = ok ? a.pos[t] : 0;
        rlo[tid] = !ok ? 0 : a.kv_start ? a.kv_start[t] : a.window ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
        rhi[tid] = !ok ? 0 : a.kv_end ? a.kv_end[t] : p + 1;
        rseq[tid] = ok ? a.seq[t] : -1;
        rdone[tid] = !ok;
        mrow[tid] = -INFINITY, lrow[tid] = 0.0f;
    }
    for (int i = tid; i < 16 * D; i += TC_WARPS * 32) {
        const int r = i / D, d = i - r * D, t = t0 + r / G;
        const float v = t < a.n_tokens ? a.q[((size_t)t * a.n_heads + (size_t)kh * G + r % G) * D + d] * a.scale : 0.0f;
        const uint16_t h = g4_f2bf(v);
        qh[r * qrow + d] = h, ql[r * qrow + d] = g4_f2bf(v - g4_bf2f(h));
    }
    float acc[8][4]; /* this warp's head dimensions of rows gq and gq + 8: Dw / 8 tiles of 8 */
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    for (;;) {
        __syncthreads();
        int cur = -1, lo = 0x7fffffff, hi = 0; /* the next sequence (the lowest id left) and its rows' keys */
        for (int r = 0; r < 16; r++)
            if (!rdone[r] && (cur < 0 || rseq[r] < cur)) cur = rseq[r];
        if (cur < 0) break;
        for (int r = 0; r < 16; r++)
            if (!rdone[r] && rseq[r] == cur) lo = rlo[r] < lo ? rlo[r] : lo, hi = rhi[r] > hi ? rhi[r] : hi;
        const int32_t *table = a.table + (size_t)cur * a.max_blocks;
        const int ntiles = hi > lo ? (hi - lo + TC_KEYS - 1) / TC_KEYS : 0;
        /* tile i's K and V rows into buffer i & 1; rows past the keys are zeros (their P is 0: no NaN from V) */
#define TC_FETCH(i)                                                                                                 \
    do {                                                                                                            \
        const int j0_ = lo + (i) * TC_KEYS, nk_ = hi - j0_ < TC_KEYS ? hi - j0_ : TC_KEYS;                          \
        unsigned char *kb_ = kv + (size_t)(2 * ((i) & 1)) * TC_KEYS * rowb, *vb_ = kb_ + (size_t)TC_KEYS * rowb;   \
        for (int c_ = tid; c_ < TC_KEYS * cpr; c_ += TC_WARPS * 32) {                                               \
            const int j_ = c_ / cpr, o_ = (c_ - j_ * cpr) * 16, key_ = j0_ + j_;                                    \
            if (j_ < nk_) {                                                                                         \
                const size_t src_ = (((size_t)table[key_ / a.B] * a.B + key_ % a.B) * rowe + head) * 2 + o_;       \
                g4_cp16(kb_ + (size_t)j_ * rowb + o_, (const unsigned char *)a.k + src_);                           \
                g4_cp16(vb_ + (size_t)j_ * rowb + o_, (const unsigned char *)a.v + src_);                           \
            } else {                                                                                                \
                *(uint4 *)(kb_ + (size_t)j_ * rowb + o_) = uint4{0u, 0u, 0u, 0u};                                     \
                *(uint4 *)(vb_ + (size_t)j_ * rowb + o_) = uint4{0u, 0u, 0u, 0u};                                     \
            }                                                                                                       \
        }                                                                                                           \
        g4_cp_commit();                                                                                             \
    } while (0)
        if (ntiles > 0) TC_FETCH(0);
        for (int it = 0; it < ntiles; it++) {
            const int j0 = lo + it * TC_KEYS;
            const unsigned char *ks = kv + (size_t)(2 * (it & 1)) * TC_KEYS * rowb, *vs = ks + (size_t)TC_KEYS * rowb;
            if (it + 1 < ntiles) {
                TC_FETCH(it + 1);
                g4_cp_wait_but_one();
            } else {
                g4_cp_wait();
            }
            __syncthreads();
            /* this warp's share of the scores: 16 rows x TC_KEYS keys over its Dw head dimensions */
            float sc[TC_KEYS / 8][4];
#pragma unroll
            for (int n = 0; n < TC_KEYS / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            for (int kk = 0; kk < Dw; kk += 16) {
                const int d0 = warp * Dw + kk + 2 * t4;
                uint32_t ah[4], al[4];
                g4_frag_a16(qh, qrow, gq, d0, ah), g4_frag_a16(ql, qrow, gq, d0, al);
#pragma unroll
                for (int n = 0; n < TC_KEYS / 8; n++) {
                    const unsigned char *kr = ks + (size_t)(n * 8 + gq) * rowb + (size_t)d0 * 2;
                    const uint32_t b[2] = {*(const uint32_t *)kr, *(const uint32_t *)(kr + 16)};
                    g4_mma_bf16(sc[n], ah, b, scr);
                    g4_mma_bf16(sc[n], al, b, scr);
                }
            }
            float *rw = red + warp * 16 * TC_KEYS;
#pragma unroll
            for (int n = 0; n < TC_KEYS / 8; n++) {
                rw[gq * TC_KEYS + n * 8 + 2 * t4] = sc[n][0], rw[gq * TC_KEYS + n * 8 + 2 * t4 + 1] = sc[n][1];
                rw[(gq + 8) * TC_KEYS + n * 8 + 2 * t4] = sc[n][2], rw[(gq + 8) * TC_KEYS + n * 8 + 2 * t4 + 1] = sc[n][3];
            }
            __syncthreads();
            { /* online softmax: 16 threads a row (two keys each), the row's lanes of one warp */
                const int r = tid >> 4, jj = (tid & 15) * 2, live = !rdone[r] && rseq[r] == cur;
                float v[2];
                for (int e = 0; e < 2; e++) {
                    const int key = j0 + jj + e;
                    float sum = 0.0f;
                    for (int w = 0; w < TC_WARPS; w++) sum += red[(w * 16 + r) * TC_KEYS + jj + e];
                    v[e] = live && key < hi && key >= rlo[r] && key < rhi[r] ? sum : -INFINITY;
                }
                float mx = fmaxf(v[0], v[1]);
                for (int o = 1; o < 16; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float mold = mrow[r], mnew = fmaxf(mold, mx);
                float p[2], s = 0.0f;
                for (int e = 0; e < 2; e++) p[e] = v[e] == -INFINITY ? 0.0f : expf(v[e] - mnew), s += p[e];
                for (int o = 1; o < 16; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                __syncwarp(); /* (every lane has read mrow[r]) */
                if ((tid & 15) == 0) {
                    const float cf = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
                    corr[r] = cf, lrow[r] = lrow[r] * cf + s, mrow[r] = mnew;
                }
                for (int e = 0; e < 2; e++) {
                    const uint16_t h = g4_f2bf(p[e]);
                    ph[r * TC_PROW + jj + e] = h, pl[r * TC_PROW + jj + e] = g4_f2bf(p[e] - g4_bf2f(h));
                }
            }
            __syncthreads();
            { /* P V into this warp's head dimensions */
                const float c0 = corr[gq], c1 = corr[gq + 8];
#pragma unroll
                for (int n = 0; n < 8; n++)
                    if (n < Dw / 8) acc[n][0] *= c0, acc[n][1] *= c0, acc[n][2] *= c1, acc[n][3] *= c1;
                for (int kk = 0; kk < TC_KEYS; kk += 16) {
                    const int j = kk + 2 * t4;
                    uint32_t ah[4], al[4];
                    g4_frag_a16(ph, TC_PROW, gq, j, ah), g4_frag_a16(pl, TC_PROW, gq, j, al);
#pragma unroll
                    for (int n = 0; n < 8; n++)
                        if (n < Dw / 8) {
                            const uint16_t *vc = (const uint16_t *)(vs + (size_t)(warp * Dw + n * 8 + gq) * 2);
                            const size_t rs = (size_t)rowb / 2; /* elements a V row */
                            const uint32_t b[2] = {pack_bf16(vc[j * rs], vc[(j + 1) * rs]),
                                                   pack_bf16(vc[(j + 8) * rs], vc[(j + 9) * rs])};
                            g4_mma_bf16(acc[n], ah, b, scr);
                            g4_mma_bf16(acc[n], al, b, scr);
                        }
                }
            }
            __syncthreads(); /* the buffer, the shares and P are free for the next tile */
        }
#undef TC_FETCH
        if (tid < 16 && rseq[tid] == cur) rdone[tid] = 1;
    }
    /* outputs: rows gq and gq + 8 of this warp's head dimensions, over their sums */
    for (int h = 0; h < 2; h++) {
        const int r = gq + 8 * h, t = t0 + r / G;
        if (t >= a.n_tokens) continue;
        const float l = lrow[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *o = a.out + ((size_t)t * a.n_heads + (size_t)kh * G + r % G) * D + warp * Dw + 2 * t4;
#pragma unroll
        for (int n = 0; n < 8; n++)
            if (n < Dw / 8) o[n * 8] = acc[n][2 * h] * inv, o[n * 8 + 1] = acc[n][2 * h + 1] * inv;
    }
}

/* Lets every attention kernel use up to the device's shared memory per block. */
void g4c_attention_init(g4c *c) {
    g4c_allow_smem(c, attention_kernel<1, G4_KV_F32>), g4c_allow_smem(c, attention_kernel<1, G4_KV_BF16>);
    g4c_allow_smem(c, attention_kernel<1, G4_KV_F16>), g4c_allow_smem(c, attention_kernel<2, G4_KV_F32>);
    g4c_allow_smem(c, attention_kernel<2, G4_KV_BF16>), g4c_allow_smem(c, attention_kernel<2, G4_KV_F16>);
    g4c_allow_smem(c, attention_kernel<4, G4_KV_F32>), g4c_allow_smem(c, attention_kernel<4, G4_KV_BF16>);
    g4c_allow_smem(c, attention_kernel<4, G4_KV_F16>), g4c_allow_smem(c, attention_kernel<8, G4_KV_F32>);
    g4c_allow_smem(c, attention_kernel<8, G4_KV_BF16>), g4c_allow_smem(c, attention_kernel<8, G4_KV_F16>);
    g4c_allow_smem(c, attention_tc_kernel);
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
    const int G = a->n_heads / a->n_kv_heads, D = a->head_dim;
    /* many tokens of bf16 keys: tensor cores (G4_CUDA_ATT_TC=0: the per-token kernel), unless they are the decode
     * tokens of as many sequences (a block's rows would share no keys: the per-token kernel splits them instead;
     * H200, E2B bf16, 16 / 64 / 100 sequences decoding, the per-token kernel against tensor cores in one call:
     * 13 / 12 / 8% more decode tokens a second) */
    const int decode_batch = a->max_seq_tokens == 1;
    const int tc = n > g4c_gemv_max_tokens() && !decode_batch && c->att_tc && a->kv_type == G4_KV_BF16 && 16 % G == 0 &&
                   D % 128 == 0 && attention_tc_smem(D) <= c->prop.sharedMemPerBlockOptin;
    const int fuse = !tc && pp && (pp->kv_shared || n == 1) && pp->q == a->q && pp->head_dim == a->head_dim;
    if (pp && !fuse) g4c_attn_prep(be, pp);
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
    x.early = c->att_early;
    if (fuse) {
        x.prep = 1, x.kv_shared = pp->kv_shared, x.v_from_k = pp->v_from_k;
        x.kraw = pp->k, x.vraw = pp->v, x.q_norm = pp->q_norm, x.k_norm = pp->k_norm, x.rope = pp->rope;
        x.slot = pp->slot, x.kc = pp->k_cache, x.vc = pp->v_cache, x.eps = pp->eps;
    }
    x.n_splits = 1;
    x.n_tokens = n;
    if (tc) {
        g4c_launch(c, attention_tc_kernel, dim3((unsigned)a->n_kv_heads, (unsigned)((n + 16 / G - 1) / (16 / G))),
                   dim3(TC_WARPS * 32), attention_tc_smem(D), x);
        return;
    }
    if (n <= g4c_gemv_max_tokens() || decode_batch) { /* few tokens: split the keys over blocks */
        const int cap = a->max_blocks * a->block_size;
        int bound = a->max_keys > 0 && !c->in_graph_step ? a->max_keys : cap; /* a recording serves every length */
        if (c->in_graph_step && a->window && !a->kv_end && !a->kv_start && a->window < bound) bound = a->window;
        if (bound > cap) bound = cap;
        int splits = c->n_sm / (a->n_kv_heads * n); /* a block per multiprocessor */
        if (splits > ATT_MAX_SPLITS) splits = ATT_MAX_SPLITS;
        const int least = c->att_min_keys; /* keys a split takes at least (G4_CUDA_ATT_MIN_KEYS) */
        if (splits > (bound + least - 1) / least) splits = (bound + least - 1) / least;
        /* the combine's split weights (and 16 float4 sums) live in the tile buffers */
        const size_t esz = g4_kv_type_size(a->kv_type), tile_floats = (esz == 4 ? ATT_TILE / 2 : ATT_TILE) *
                                                                       ((size_t)D * esz + 16);
        while (splits > 1 && (size_t)splits * G + 4 + 64 > tile_floats) splits--;
        if ((size_t)n * a->n_kv_heads > c->n_counters / 2) splits = 1; /* (the barrier counters) */
        if (splits > 1) {
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
