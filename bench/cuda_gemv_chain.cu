// How fast can a decode step of E2B's shape go, products only? An E2B-shaped step as a chain of bf16 GEMVs (35
// layers: q/k/v, o, gate/up as one matrix, down, per-layer-input gate and projection; double-wide MLP from layer 15;
// then the 262144-row head: 211 products, 4.47 GB), each product needing the whole output of the one before; no
// attention, norms or other work. Variants:
//   A: one kernel a product, chained with programmatic dependent launch in a CUDA graph, the engine's way
//      (cuda_gemv.cu): a block's first row's first accesses issued before the grid wait, the rest streamed after it;
//   B: as A, each block first copying up to PF bytes of its rows into shared memory (cp.async) before the grid wait;
//   C: one persistent kernel (one block a multiprocessor) for the whole chain: a product's outputs announced per
//      block on a counter, the next product's first PF bytes of the block's rows copied into a second shared-memory
//      page while the block waits for that counter; modes: & 1 the announcing warp issues no copies, & 2 the release
//      add without a full fence before it;
//   D: persistent, the weights through a ring of shared-memory slots filled with bulk copies (TMA) by a producer warp
//      running ahead across the counters, consumed by the other 15 warps; modes (timing probes, wrong sums): & 1 no
//      products computed, & 2 no counters waited for;
//   E: persistent, every warp streaming its own contiguous run of the block's rows through its own slots (TMA, NS
//      copies of S bytes in flight a warp, running on into the next products' rows across the counters); inputs
//      staged conflict-free; modes as D; LA more chunks a warp asked into L2 ahead of the copies.
//   P: as A at 2 blocks a multiprocessor, every block also asking its rows of a later stage into L2 (distance, MB a
//      stage; modes: & 1 before the grid wait, & 2 one prefetch a line, & 4 the stage's own loads L2::evict_first);
//   Q: as A, a stage waiting for a counter its predecessor's blocks announce on instead of the grid dependency.
//   (H200, 2026-12-03: P slower the more it asks into L2, 61.7% -> 57.8% at 40 MB; evict_first alone 61.4 -> 63.6%;
//   Q 61.2-61.9% at 2 blocks a multiprocessor, 57% at 1: the grid dependency is not what a stage loses.)
// Prints the device-to-device copy bandwidth, then us a step, GB/s of weights and % of the copy bandwidth, and a
// checksum of the head's outputs (every variant sums in A's order: equal checksums, except D/E's timing probes).
// Built as build-cuda/g4-cuda-gemv-chain by -DGEMMA4C_CUDA=ON (or nvcc -O3 -arch=sm_90a); run:
// g4-cuda-gemv-chain [PF for B] [PF for C ...]; CHAIN_ONLY=A (A and B), P, Q, C, D or E (or several letters) runs those only.
// Results: bench/cuda_h200_results.md (sessions of 2026-12-02 22:34 UTC, 2026-12-03 02:28 UTC and 08:33 UTC).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } \
    } while (0)

struct Stage {
    const uint4 *w; // rows x cols bf16, 8 a uint4
    int rows, cols;
    const float *x;
    float *y;
};

constexpr int THREADS = 512, WARPS = THREADS / 32, XMAX = 12288;

__device__ __forceinline__ void gwait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void gtrigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ uint4 ldw(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
// w: 8 bf16 weights; a, b: their 8 inputs
__device__ __forceinline__ float dot8s(uint4 w, float4 a, float4 b) {
    const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) s += __uint_as_float(u[i] << 16) * xv[2 * i] + __uint_as_float(u[i] & 0xffff0000u) * xv[2 * i + 1];
    return s;
}
__device__ __forceinline__ float dot8(uint4 w, const float *x) { // x 32-byte aligned: two 16-byte loads, as the engine
    return dot8s(w, *(const float4 *)x, *(const float4 *)(x + 4));
}

// the rows [r0, r1) of a stage that this block computes (every variant splits a product's rows alike)
__device__ __forceinline__ void block_rows(const Stage &s, int &r0, int &r1) {
    const int per = (s.rows + gridDim.x - 1) / gridDim.x;
    r0 = min(s.rows, (int)blockIdx.x * per), r1 = min(s.rows, r0 + per);
}
// the persistent variants' counters: wait until every block has announced stage `c`, announce one
__device__ __forceinline__ void wait_announced(const unsigned *c) {
    unsigned v;
    do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
    while (v < gridDim.x);
}
__device__ __forceinline__ void announce(unsigned *c) { asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory"); }

// one row's dot product from shared memory, four 16-byte accesses a lane in flight (the sum in the order of A)
__device__ __forceinline__ float row_smem(const uint4 *row, const float *xs, int nv, int lane) {
    float acc = 0.0f;
    int v = lane;
    for (; v + 96 < nv; v += 128) {
        uint4 q[4];
#pragma unroll
        for (int u = 0; u < 4; u++) q[u] = row[v + 32 * u];
#pragma unroll
        for (int u = 0; u < 4; u++) acc += dot8(q[u], xs + 8 * (v + 32 * u));
    }
    for (; v < nv; v += 32) acc += dot8(row[v], xs + 8 * v);
    return acc;
}

// a row's dot product streamed from device memory from v on, U 16-byte accesses a lane in flight (A's order)
template <int U> __device__ __forceinline__ float row_global(const uint4 *row, const float *xs, int nv, int v, float acc) {
    for (; v < nv; v += 32 * U) {
        uint4 q[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (v + 32 * u < nv) q[u] = ldw(row + v + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (v + 32 * u < nv) acc += dot8(q[u], xs + 8 * (v + 32 * u));
    }
    return acc;
}

template <bool PF> __global__ __launch_bounds__(THREADS, 2) void gemv(Stage s, int pf_bytes) {
    extern __shared__ __align__(16) unsigned char sm[];
    float *xs = (float *)sm;
    uint4 *buf = (uint4 *)(sm + XMAX * 4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r0, r1;
    block_rows(s, r0, r1);
    const int nv = s.cols / 8; // uint4 a row
    const int inbuf = PF ? min(r1 - r0, max(0, pf_bytes / (nv * 16))) : 0; // rows in shared memory
    if (PF) {
        for (int i = threadIdx.x; i < inbuf * nv; i += THREADS) {
            const unsigned d = (unsigned)__cvta_generic_to_shared(buf + i);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(s.w + (size_t)r0 * nv + i) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    // A: the first row's first accesses before the wait
    uint4 pre[4];
    const int rfirst = r0 + inbuf + warp;
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (rfirst < r1 && lane + 32 * u < nv) pre[u] = ldw(s.w + (size_t)rfirst * nv + lane + 32 * u);
    gwait();
    for (int i = threadIdx.x; i < s.cols; i += THREADS) xs[i] = s.x[i];
    __syncthreads();
    gtrigger();
    if (PF) {
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncthreads();
        for (int r = r0 + warp; r < r0 + inbuf; r += WARPS) {
            float acc = 0.0f;
            acc = row_smem(buf + (size_t)(r - r0) * nv, xs, nv, lane);
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) s.y[r] = acc;
        }
    }
    for (int r = rfirst; r < r1; r += WARPS) {
        float acc = 0.0f;
        const uint4 *row = s.w + (size_t)r * nv;
        int v = lane;
        if (r == rfirst) {
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) acc += dot8(pre[u], xs + 8 * (v + 32 * u));
            v += 128;
        }
        acc = row_global<4>(row, xs, nv, v, acc);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s.y[r] = acc;
    }
}


// C: one persistent kernel for the whole chain. Each block keeps two pages of shared memory; while it waits for the
// counter that says the stage's input is complete, the first PF bytes of its rows of the NEXT stage are already on
// their way into the other page (cp.async), so device memory is never idle across a stage boundary; the rest of a
// block's rows stream as in A, 8 accesses a lane in flight. Stage s's outputs are announced by each block with a
// release add to done[s]; a block reads stage s's inputs after done[s-1] == gridDim.x (acquire).
template <int MODE>
__device__ __forceinline__ void pf_rows(const Stage &s, int pf_bytes, uint4 *page, int &r0, int &r1, int &inbuf) {
    const int nv = s.cols / 8;
    block_rows(s, r0, r1);
    inbuf = max(0, min(r1 - r0, pf_bytes / (nv * 16)));
    // MODE & 1: warp 0 (whose thread 0 announces and polls) issues none of the copies, so that its fence does not
    // wait for them
    const int t0 = (MODE & 1) ? 32 : 0;
    for (int i = (int)threadIdx.x - t0; i >= 0 && i < inbuf * nv; i += THREADS - t0) {
        const unsigned d = (unsigned)__cvta_generic_to_shared(page + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(s.w + (size_t)r0 * nv + i) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int MODE> __global__ __launch_bounds__(THREADS, 1) void chain_persistent(const Stage *stages, int n, unsigned *done, int pf_bytes) {
    extern __shared__ __align__(16) unsigned char sm[];
    float *xs = (float *)sm;
    uint4 *page[2] = {(uint4 *)(sm + XMAX * 4), (uint4 *)(sm + XMAX * 4 + pf_bytes)};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r0, r1, inbuf, nr0, nr1, ninbuf;
    pf_rows<MODE>(stages[0], pf_bytes, page[0], r0, r1, inbuf);
    for (int si = 0; si < n; si++) {
        const Stage s = stages[si];
        if (si + 1 < n) pf_rows<MODE>(stages[si + 1], pf_bytes, page[(si + 1) & 1], nr0, nr1, ninbuf);
        else asm volatile("cp.async.commit_group;" ::: "memory");
        if (si > 0 && threadIdx.x == 0) wait_announced(done + si - 1);
        __syncthreads();
        for (int i = threadIdx.x; i < s.cols; i += THREADS) xs[i] = __ldcg(s.x + i);
        asm volatile("cp.async.wait_group 1;" ::: "memory");
        __syncthreads();
        const int nv = s.cols / 8;
        const uint4 *buf = page[si & 1];
        for (int r = r0 + warp; r < r0 + inbuf; r += WARPS) {
            float acc = 0.0f;
            acc = row_smem(buf + (size_t)(r - r0) * nv, xs, nv, lane);
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) __stcg(s.y + r, acc);
        }
        for (int r = r0 + inbuf + warp; r < r1; r += WARPS) {
            float acc = 0.0f;
            const uint4 *row = s.w + (size_t)r * nv;
            acc = row_global<8>(row, xs, nv, lane, acc);
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) __stcg(s.y + r, acc);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (!(MODE & 2)) __threadfence(); // MODE & 2: the release add alone
            announce(done + si);
        }
        r0 = nr0, r1 = nr1, inbuf = ninbuf;
    }
}

// D: one persistent kernel whose weights stream through a ring of shared-memory slots filled by one producer warp
// with bulk copies (TMA, cp.async.bulk + mbarrier) in the order the block will consume them, as far ahead as the
// ring allows and regardless of the stage barriers; the other warps wait for each stage's inputs (the same counters
// as C), then consume the slots. A slot holds whole rows of one stage (a row is at most SLOT bytes).
constexpr int DW = 16, DCONS = DW - 1, SLOT = 24576; // warps, consumer warps, slot bytes
__device__ __forceinline__ unsigned saddr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mb_wait(unsigned mb, unsigned parity) {
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(mb), "r"(parity) : "memory");
}
__device__ __forceinline__ void slice(const Stage &s, int &r0, int &r1, int &rps) {
    block_rows(s, r0, r1);
    rps = max(1, SLOT / (s.cols * 2)); // rows a slot
}

// MODE (timing probes only, wrong results): & 1 consumers skip the products, & 2 no stage barriers
template <int MODE> __global__ __launch_bounds__(DW * 32, 1) void chain_ring(const Stage *stages, int n, unsigned *done, int nslot) {
    extern __shared__ __align__(16) unsigned char sm[];
    unsigned long long *full = (unsigned long long *)sm, *empty = full + 32;
    float *xs = (float *)(sm + 512);
    unsigned char *ring = sm + 512 + XMAX * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int i = 0; i < nslot; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(full + i)) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(empty + i)), "r"(DCONS) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == DCONS) { // the producer
        if (lane == 0) {
            unsigned k = 0; // chunks issued so far
            for (int si = 0; si < n; si++) {
                const Stage s = stages[si];
                int r0, r1, rps;
                slice(s, r0, r1, rps);
                for (int r = r0; r < r1; r += rps, k++) {
                    const int slot = k % nslot, use = k / nslot;
                    if (use > 0) mb_wait(saddr(empty + slot), (use - 1) & 1);
                    const unsigned bytes = (unsigned)(min(rps, r1 - r) * s.cols * 2);
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(full + slot)), "r"(bytes) : "memory");
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                                 ::"r"(saddr(ring + (size_t)slot * SLOT)), "l"(s.w + (size_t)r * (s.cols / 8)), "r"(bytes),
                                 "r"(saddr(full + slot)) : "memory");
                }
            }
        }
        return;
    }
    unsigned k = 0;
    for (int si = 0; si < n; si++) {
        const Stage s = stages[si];
        int r0, r1, rps;
        slice(s, r0, r1, rps);
        if (!(MODE & 2) && si > 0 && threadIdx.x == 0) wait_announced(done + si - 1);
        asm volatile("bar.sync 1, %0;" ::"r"(DCONS * 32) : "memory");
        for (int i = threadIdx.x; i < s.cols / 4; i += DCONS * 32) ((float4 *)xs)[i] = __ldcg((const float4 *)s.x + i);
        asm volatile("bar.sync 1, %0;" ::"r"(DCONS * 32) : "memory");
        const int nv = s.cols / 8;
        for (int r = r0; r < r1; r += rps, k++) {
            const int slot = k % nslot, use = k / nslot, nr = min(rps, r1 - r);
            mb_wait(saddr(full + slot), use & 1);
            const uint4 *buf = (const uint4 *)(ring + (size_t)slot * SLOT);
            // the block's rows of the stage go round the consumer warps
            for (int row = 0; row < nr; row++) {
                if ((MODE & 1) || (r - r0 + row) % DCONS != warp) continue;
                float acc = 0.0f;
                acc = row_smem(buf + (size_t)row * nv, xs, nv, lane);
                for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
                if (lane == 0) __stcg(s.y + r + row, acc);
            }
            __syncwarp();
            if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(empty + slot)) : "memory");
        }
        asm volatile("bar.sync 1, %0;" ::"r"(DCONS * 32) : "memory");
        if (threadIdx.x == 0) announce(done + si);
    }
}

// E: every warp streams its own rows. The block's rows of a stage are split into 16 contiguous runs, one a warp; a
// warp's lane 0 keeps NS bulk copies (TMA) of S bytes of its run in flight in the warp's own slots, running on into
// its rows of the next stages regardless of the stage barriers; the warp consumes its slots in order (no waiting on
// other warps but at the stage barrier). The inputs are staged as two float4 arrays (x[8v..8v+3], x[8v+4..8v+7]), so
// that a warp's reads of them are free of bank conflicts. Sums in the order of A.
struct Cur { int si; long long pos, end; };
__device__ __forceinline__ void warp_run(const Stage &s, int warp, long long &b0, long long &b1) {
    int r0, r1;
    block_rows(s, r0, r1);
    const int nr = r1 - r0;
    const long long rb = (long long)s.cols * 2;
    b0 = (r0 + (long long)nr * warp / DW) * rb, b1 = (r0 + (long long)nr * (warp + 1) / DW) * rb;
}
__device__ __forceinline__ void cur_seek(const Stage *st, int n, int warp, Cur &c) { // first non-empty run from c.si
    for (; c.si < n; c.si++) {
        warp_run(st[c.si], warp, c.pos, c.end);
        if (c.end > c.pos) return;
    }
}

template <int MODE> __global__ __launch_bounds__(DW * 32, 1) void chain_warps(const Stage *stages, int n, unsigned *done, int S, int NS, int LA) {
    extern __shared__ __align__(16) unsigned char sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long *full = (unsigned long long *)sm + warp * NS; // 16 x NS barriers (1 KB at most)
    float4 *xlo = (float4 *)(sm + 1024), *xhi = xlo + XMAX / 8;
    unsigned char *slots = sm + 1024 + XMAX * 4 + (size_t)warp * NS * S;
    if (lane == 0) {
        for (int i = 0; i < NS; i++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(full + i)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    Cur pc = {0, 0, 0};
    unsigned pk = 0, ck = 0, qk = 0; // chunks issued, consumed, asked into L2
    cur_seek(stages, n, warp, pc);
    Cur qc = pc; // LA > 0: the chunks LA past the last one issued are asked into L2 (cp.async.bulk.prefetch.L2)
    auto issue = [&]() {
        while (LA > 0 && qc.si < n && qk < pk + NS + LA) {
            const long long b = min((long long)S, qc.end - qc.pos);
            if (lane == 0)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const unsigned char *)stages[qc.si].w + qc.pos), "r"((unsigned)b) : "memory");
            qk++;
            qc.pos += b;
            if (qc.pos == qc.end) qc.si++, cur_seek(stages, n, warp, qc);
        }
        if (pc.si >= n) return;
        const Stage &s = stages[pc.si];
        const unsigned bytes = (unsigned)min((long long)S, pc.end - pc.pos);
        const int slot = pk % NS;
        if (lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(full + slot)), "r"(bytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(saddr(slots + (size_t)slot * S)), "l"((const unsigned char *)s.w + pc.pos), "r"(bytes),
                         "r"(saddr(full + slot)) : "memory");
        }
        pk++;
        pc.pos += bytes;
        if (pc.pos == pc.end) pc.si++, cur_seek(stages, n, warp, pc);
    };
    for (int i = 0; i < NS; i++) issue();
    for (int si = 0; si < n; si++) {
        const Stage s = stages[si];
        if (!(MODE & 2) && si > 0 && threadIdx.x == 0) wait_announced(done + si - 1);
        __syncthreads();
        const int nv = s.cols / 8;
        for (int i = threadIdx.x; i < nv; i += DW * 32) {
            xlo[i] = __ldcg((const float4 *)s.x + 2 * i);
            xhi[i] = __ldcg((const float4 *)s.x + 2 * i + 1);
        }
        __syncthreads();
        long long b0, b1;
        warp_run(s, warp, b0, b1);
        const int spr = nv / 32; // 512-byte segments a row
        float acc = 0.0f;
        for (long long pos = b0; pos < b1;) {
            const int slot = ck % NS, nb = (int)min((long long)S, b1 - pos);
            mb_wait(saddr(full + slot), (ck / NS) & 1);
            const uint4 *sl = (const uint4 *)(slots + (size_t)slot * S);
            if (!(MODE & 1)) {
                const long long seg0 = pos / 512; // the chunk's first segment within the matrix: its row and place
                int row = (int)(seg0 / spr), j = (int)(seg0 - (long long)row * spr);
                for (int g = 0; g < nb / 512; g++) {
                    const int v = lane + 32 * j;
                    acc += dot8s(sl[g * 32 + lane], xlo[v], xhi[v]);
                    if (++j == spr) {
                        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
                        if (lane == 0) __stcg(s.y + row, acc);
                        acc = 0.0f, j = 0, row++;
                    }
                }
            }
            __syncwarp();
            ck++;
            pos += nb;
            issue();
        }
        __syncthreads();
        if (threadIdx.x == 0) announce(done + si);
    }
}

// P: as A (2 blocks a multiprocessor), and every block also asks ITS rows of a later stage (d stages on, up to PCAP
// bytes a block from the start of its rows) into L2, so that device memory keeps streaming weights through the
// stage boundaries and the later stage's loads hit L2. MODE & 1: the prefetch before the grid wait (else after it);
// & 2: one prefetch.global.L2::evict_last a thread a 128-byte line (else bulk prefetches by thread 0); & 4: the
// stage's own weight loads marked L2::evict_first.
__device__ __forceinline__ uint4 ldw_ef(const uint4 *p) {
    uint4 v;
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    return v;
}
// P and Q: the first row of this warp and the end of its block's rows, and (issue) the first row's first four
// accesses a lane
template <bool EF> __device__ __forceinline__ void warp_rows(const Stage &s, int &rfirst, int &r1, uint4 *pre, bool issue) {
    const int lane = threadIdx.x & 31, nv = s.cols / 8;
    int r0;
    block_rows(s, r0, r1);
    rfirst = r0 + (int)(threadIdx.x >> 5);
    if (issue)
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (rfirst < r1 && lane + 32 * u < nv) pre[u] = EF ? ldw_ef(s.w + (size_t)rfirst * nv + lane + 32 * u) : ldw(s.w + (size_t)rfirst * nv + lane + 32 * u);
}
// P and Q: a warp's rows rfirst, rfirst + WARPS, ... below r1 (the first row's first four accesses already in pre
// when has_pre), four accesses a lane in flight, EF: loads marked L2::evict_first; the sums in A's order
template <bool EF>
__device__ __forceinline__ void rows_stream(const Stage &s, const float *xs, int rfirst, int r1, const uint4 *pre, bool has_pre) {
    const int lane = threadIdx.x & 31, nv = s.cols / 8;
    for (int r = rfirst; r < r1; r += WARPS) {
        float acc = 0.0f;
        const uint4 *row = s.w + (size_t)r * nv;
        int v = lane;
        if (has_pre && r == rfirst) {
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) acc += dot8(pre[u], xs + 8 * (v + 32 * u));
            v += 128;
        }
        for (; v < nv; v += 32 * 4) {
            uint4 q[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) q[u] = EF ? ldw_ef(row + v + 32 * u) : ldw(row + v + 32 * u);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) acc += dot8(q[u], xs + 8 * (v + 32 * u));
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) __stcg(s.y + r, acc);
    }
}
template <int MODE> __device__ __forceinline__ void l2_ahead(const Stage &p, int pcap) {
    int r0, r1;
    block_rows(p, r0, r1);
    const size_t rowb = (size_t)p.cols * 2;
    size_t n = min((size_t)(r1 - r0) * rowb, (size_t)pcap) & ~(size_t)127;
    const unsigned char *b = (const unsigned char *)p.w + (size_t)r0 * rowb;
    if (MODE & 2) {
        for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)THREADS * 128)
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(b + o));
    } else if (threadIdx.x == 0) {
        for (size_t o = 0; o < n; o += 32768)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(b + o), "r"((unsigned)min(n - o, (size_t)32768)) : "memory");
    }
}
template <int MODE> __global__ __launch_bounds__(THREADS, 2) void gemv_l2(Stage s, Stage p, int pcap) {
    extern __shared__ __align__(16) unsigned char sm[];
    float *xs = (float *)sm;
    int rfirst, r1;
    uint4 pre[4];
    warp_rows<(MODE & 4) != 0>(s, rfirst, r1, pre, true);
    if (MODE & 1) l2_ahead<MODE>(p, pcap);
    gwait();
    if (!(MODE & 1)) l2_ahead<MODE>(p, pcap);
    for (int i = threadIdx.x; i < s.cols; i += THREADS) xs[i] = s.x[i];
    __syncthreads();
    gtrigger();
    rows_stream<(MODE & 4) != 0>(s, xs, rfirst, r1, pre, true);
}


// Q: as A, but a stage waits for a counter that its predecessor's blocks announce on (a release add each after its
// rows) instead of the grid dependency, and lets its successor launch at its start; the inputs are read from L2
// (other blocks wrote them). MODE & 1: the first row's first accesses before the wait (as A); & 2: the weight loads
// marked L2::evict_first.
template <int MODE, int BPM> __global__ __launch_bounds__(THREADS, BPM) void gemv_cnt(Stage s, unsigned *cnt, int i, unsigned need) {
    extern __shared__ __align__(16) unsigned char sm[];
    float *xs = (float *)sm;
    gtrigger();
    int rfirst, r1;
    uint4 pre[4];
    warp_rows<(MODE & 2) != 0>(s, rfirst, r1, pre, MODE & 1);
    if (i > 0) {
        if (threadIdx.x == 0) {
            unsigned v;
            do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(cnt + i - 1) : "memory");
            while (v < need);
        }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < s.cols; j += THREADS) xs[j] = __ldcg(s.x + j);
    __syncthreads();
    rows_stream<(MODE & 2) != 0>(s, xs, rfirst, r1, pre, MODE & 1);
    __syncthreads();
    if (threadIdx.x == 0) announce(cnt + i);
}


__global__ void fill(uint4 *w, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned u[4];
        for (int j = 0; j < 4; j++) {
            unsigned h = (unsigned)(i * 4 + j) * 2654435761u ^ seed;
            h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
            const float a = ((h & 0xffff) / 65535.0f - 0.5f) * scale, b = ((h >> 16) / 65535.0f - 0.5f) * scale;
            u[j] = (__float_as_uint(a) >> 16) | (__float_as_uint(b) & 0xffff0000u);
        }
        w[i] = make_uint4(u[0], u[1], u[2], u[3]);
    }
}

int main(int argc, char **argv) {
    const int pf = argc > 1 ? atoi(argv[1]) : 65536;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int nsm = prop.multiProcessorCount;
    std::vector<Stage> st;
    float *buf[2];
    CK(cudaMalloc(&buf[0], 262144 * 4));
    CK(cudaMalloc(&buf[1], 262144 * 4));
    CK(cudaMemset(buf[0], 0, 262144 * 4));
    CK(cudaMemset(buf[1], 0, 262144 * 4));
    size_t bytes = 0;
    auto add = [&](int rows, int cols) {
        Stage s;
        uint4 *w;
        CK(cudaMalloc(&w, (size_t)rows * cols * 2));
        /* uniform weights of variance 1/cols: the outputs keep the inputs' size along the chain */
        fill<<<1024, 256>>>(w, (size_t)rows * cols / 8, (unsigned)st.size() * 7919u, sqrtf(12.0f / (float)cols));
        s.w = w, s.rows = rows, s.cols = cols;
        s.x = buf[st.size() & 1], s.y = buf[(st.size() + 1) & 1];
        st.push_back(s);
        bytes += (size_t)rows * cols * 2;
    };
    for (int l = 0; l < 35; l++) {
        const int I = l >= 15 ? 12288 : 6144;
        add(2560, 1536), add(1536, 2048), add(2 * I, 1536), add(1536, I), add(256, 1536), add(1536, 256);
    }
    add(262144, 1536);
    CK(cudaDeviceSynchronize());
    const size_t smemA = XMAX * 4, smemB = XMAX * 4 + (size_t)pf;
    CK(cudaFuncSetAttribute(gemv<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemA));
    CK(cudaFuncSetAttribute(gemv<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemB));
    int occA = 0, occB = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occA, gemv<false>, THREADS, smemA));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occB, gemv<true>, THREADS, smemB));
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    // copy bandwidth
    void *ca, *cb;
    const size_t cbytes = (size_t)1 << 30;
    CK(cudaMalloc(&ca, cbytes));
    CK(cudaMalloc(&cb, cbytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int i = 0; i < 3; i++) CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, cs));
    CK(cudaEventRecord(e0, cs));
    for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, cs));
    CK(cudaEventRecord(e1, cs));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double copy_gbs = 2.0 * cbytes * 10 / (ms * 1e-3) / 1e9;
    printf("copy bandwidth %.0f GB/s; %zu stages, %.3f GB of weights; blocks a multiprocessor A %d, B %d (PF %d)\n", copy_gbs,
           st.size(), bytes / 1e9, occA, occB, pf);
    const char *only = getenv("CHAIN_ONLY"); // A (A and B), P, C, D or E: that family only
    // record(): the launches of one step on stream cs, captured into a graph; replayed 3 times, once from a known
    // input for the checksum of the head's outputs, then 20 times timed
    auto measure = [&](auto &&record, double &us, double &sum) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        record();
        CK(cudaStreamEndCapture(cs, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, cs));
        CK(cudaStreamSynchronize(cs));
        std::vector<float> ones(262144, 0.01f), out(262144);
        CK(cudaMemcpy(buf[0], ones.data(), 262144 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(buf[1], ones.data(), 262144 * 4, cudaMemcpyHostToDevice));
        CK(cudaGraphLaunch(ge, cs));
        CK(cudaStreamSynchronize(cs));
        CK(cudaMemcpy(out.data(), st.back().y, 262144 * 4, cudaMemcpyDeviceToHost));
        sum = 0;
        for (float v : out) sum += v;
        CK(cudaEventRecord(e0, cs));
        for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, cs));
        CK(cudaEventRecord(e1, cs));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us = ms * 1e3 / 20;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    };
    auto report = [&](const char *what, double us, double sum) {
        const double gbs = bytes / (us * 1e-6) / 1e9;
        printf("%s: %8.1f us a step, %6.0f GB/s, %5.1f%% of copy; checksum %.6e\n", what, us, gbs, 100.0 * gbs / copy_gbs, sum);
    };
    // one kernel on cs with one launch attribute: programmatic dependent launch (the chains), or cooperative
    auto launch_with = [cs](cudaLaunchAttributeID id, auto kern, int grid, size_t smem, auto... args) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)grid);
        cfg.blockDim = dim3(THREADS);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = cs;
        cudaLaunchAttribute at[1];
        at[0].id = id;
        if (id == cudaLaunchAttributeCooperative)
            at[0].val.cooperative = 1;
        else
            at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, kern, args...));
    };
    auto pdl_launch = [&](auto kern, int grid, size_t smem, auto... args) {
        launch_with(cudaLaunchAttributeProgrammaticStreamSerialization, kern, grid, smem, args...);
    };
    char what[160];
    double us, sum;
    for (int variant = 0; variant < 2 && (!only || strchr(only, 'A')); variant++)
        for (int bpm = 1; bpm <= 2; bpm++) {
            measure([&] {
                for (auto &s : st) {
                    if (variant)
                        pdl_launch(gemv<true>, nsm * bpm, smemB, s, pf);
                    else
                        pdl_launch(gemv<false>, nsm * bpm, smemA, s, pf);
                }
            }, us, sum);
            snprintf(what, sizeof what, "%s, %d block(s) a multiprocessor",
                     variant ? "B (rows into shared memory before the wait)" : "A (as the engine)", bpm);
            report(what, us, sum);
        }
    // Q: A's kernels synchronized by counters instead of the grid dependency
    {
        unsigned *cnt;
        CK(cudaMalloc(&cnt, st.size() * sizeof(unsigned)));
        void (*kq[2][4])(Stage, unsigned *, int, unsigned) = {{gemv_cnt<0, 1>, gemv_cnt<1, 1>, gemv_cnt<2, 1>, gemv_cnt<3, 1>},
                                                               {gemv_cnt<0, 2>, gemv_cnt<1, 2>, gemv_cnt<2, 2>, gemv_cnt<3, 2>}};
        const int n = (int)st.size();
        for (int bpm = 1; bpm <= 2 && (!only || strchr(only, 'Q')); bpm++)
            for (int m = 0; m < 4; m++) {
                CK(cudaFuncSetAttribute(kq[bpm - 1][m], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemA));
                const int grid = nsm * bpm;
                measure([&] {
                    CK(cudaMemsetAsync(cnt, 0, n * sizeof(unsigned), cs));
                    for (int i = 0; i < n; i++) {
                        pdl_launch(kq[bpm - 1][m], grid, smemA, st[i], cnt, i, (unsigned)grid);
                    }
                }, us, sum);
                snprintf(what, sizeof what, "Q mode %d (kernels synchronized by counters), %d block(s) a multiprocessor", m, bpm);
                report(what, us, sum);
            }
    }
    // P: A at 2 blocks a multiprocessor plus each stage asking a later stage's rows into L2
    {
        void (*kp[8])(Stage, Stage, int) = {gemv_l2<0>, gemv_l2<1>, gemv_l2<2>, gemv_l2<3>, gemv_l2<4>, gemv_l2<5>, gemv_l2<6>, gemv_l2<7>};
        for (int m = 0; m < 8; m++) CK(cudaFuncSetAttribute(kp[m], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smemA));
        const int modes[] = {0, 4};
        const int dists[] = {1, 3};
        const int caps[] = {0, 4, 24}; // MB a stage, all blocks
        const int n = (int)st.size(), grid = nsm * 2;
        for (int m : modes)
            for (int d : dists)
                for (int cap : caps) {
                    if (only && !strchr(only, 'P')) break;
                    if (cap == 0 && d != 1) continue;
                    const int pcap = (int)(((size_t)cap << 20) / grid);
                    measure([&] {
                        for (int i = 0; i < n; i++) {
                            pdl_launch(kp[m], grid, smemA, st[i], st[(i + d) % n], pcap);
                        }
                    }, us, sum);
                    snprintf(what, sizeof what, "P mode %d (stage +%d's rows into L2, %2d MB a stage)", m, d, cap);
                    report(what, us, sum);
                }
    }
    // the persistent variants: the stages in device memory, one counter a stage zeroed by the graph, and the same
    // stages with no rows (the counters' cost alone)
    Stage *dst, *dempty;
    unsigned *done;
    std::vector<Stage> empty(st.size());
    for (size_t i = 0; i < st.size(); i++) empty[i] = st[i], empty[i].rows = 0, empty[i].cols = 8;
    CK(cudaMalloc(&dst, st.size() * sizeof(Stage)));
    CK(cudaMalloc(&dempty, st.size() * sizeof(Stage)));
    CK(cudaMemcpy(dst, st.data(), st.size() * sizeof(Stage), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dempty, empty.data(), st.size() * sizeof(Stage), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&done, st.size() * sizeof(unsigned)));
    const int nst = (int)st.size();
    auto persistent = [&](auto kern, size_t smem, auto... args) { // one cooperative block a multiprocessor
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return [=]() {
            CK(cudaMemsetAsync(done, 0, nst * sizeof(unsigned), cs));
            launch_with(cudaLaunchAttributeCooperative, kern, nsm, smem, args...);
        };
    };
    auto empty_report = [&](const char *what, double us) {
        printf("%s, %d empty stages: %8.1f us, %.2f us a stage\n", what, nst, us, us / nst);
    };
    // C: pages of PF bytes (argv[2..], default 16K 32K 64K)
    std::vector<int> pfs;
    for (int i = 2; i < argc; i++) pfs.push_back(atoi(argv[i]));
    if (pfs.empty()) pfs = {16384, 32768, 65536};
    void (*kc[4])(const Stage *, int, unsigned *, int) = {chain_persistent<0>, chain_persistent<1>, chain_persistent<2>, chain_persistent<3>};
    for (int mode = 0; mode < 4 && (!only || strchr(only, 'C')); mode++) {
        for (int pfc : pfs) {
            const size_t smem = XMAX * 4 + 2 * (size_t)pfc;
            if (smem > prop.sharedMemPerBlockOptin) continue;
            measure(persistent(kc[mode], smem, (const Stage *)dst, nst, done, pfc), us, sum);
            snprintf(what, sizeof what, "C mode %d (one persistent kernel, pages of %d bytes)", mode, pfc);
            report(what, us, sum);
        }
        measure(persistent(kc[mode], XMAX * 4 + 2 * (size_t)pfs[0], (const Stage *)dempty, nst, done, pfs[0]), us, sum);
        snprintf(what, sizeof what, "C mode %d", mode);
        empty_report(what, us);
    }
    // D: a ring of 3 or 7 slots of SLOT bytes
    void (*kd[4])(const Stage *, int, unsigned *, int) = {chain_ring<0>, chain_ring<1>, chain_ring<2>, chain_ring<3>};
    for (int mode = 0; mode < 4 && (!only || strchr(only, 'D')); mode++) {
        for (int nslot = 3; nslot <= 7; nslot += 4) {
            measure(persistent(kd[mode], 512 + XMAX * 4 + (size_t)nslot * SLOT, (const Stage *)dst, nst, done, nslot), us, sum);
            snprintf(what, sizeof what, "D mode %d (ring of %d slots of %d bytes, TMA)", mode, nslot, SLOT);
            report(what, us, sum);
        }
        if (mode == 0) {
            measure(persistent(kd[0], 512 + XMAX * 4 + 7 * (size_t)SLOT, (const Stage *)dempty, nst, done, 7), us, sum);
            empty_report("D", us);
        }
    }
    // E: every warp NS slots of S bytes, LA more chunks into L2
    void (*ke[4])(const Stage *, int, unsigned *, int, int, int) = {chain_warps<0>, chain_warps<1>, chain_warps<2>, chain_warps<3>};
    const std::pair<int, int> es[] = {{4096, 2}, {3072, 3}, {2048, 4}, {1536, 5}};
    const int las[] = {0, 4, 8, 16, 32};
    for (int mode = 0; mode < 4 && (!only || strchr(only, 'E')); mode++)
        for (auto e : es)
            for (int LA : las) {
                if (mode && (e.first != 3072 || LA)) continue;
                if (LA && e.first != 3072 && e.first != 2048) continue;
                const int S = e.first, NS = e.second;
                measure(persistent(ke[mode], 1024 + XMAX * 4 + (size_t)DW * NS * S, (const Stage *)dst, nst, done, S, NS, LA), us, sum);
                snprintf(what, sizeof what, "E mode %d (every warp %d slots of %d bytes, TMA; %2d more into L2)", mode, NS, S, LA);
                report(what, us, sum);
            }
    return 0;
}
