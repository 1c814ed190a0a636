// How fast can a decode step of E2B's shape go as one kernel a matrix product? An E2B-shaped step as a chain of bf16
// GEMVs (35 layers: q/k/v, o, gate/up as one matrix, down, per-layer-input gate and projection; double-wide MLP from
// layer 15; then the 262144-row head: 211 products, 4.47 GB), one kernel a product chained with programmatic
// dependent launch and recorded as a CUDA graph; no attention, norms or other kernels. Two variants:
//   A: the engine's way (cuda_gemv.cu): the first accesses of a block's first row issued before the grid wait, the
//      rest streamed after it;
//   B: each block copies up to PF bytes of its rows into shared memory (cp.async) before the grid wait, so that a
//      kernel's weights stream while the one before it finishes (the next kernel's blocks are resident meanwhile
//      where two fit a multiprocessor); rows past PF streamed as in A.
// Prints the device-to-device copy bandwidth, then us a step, GB/s of weights and % of the copy bandwidth for 1 and
// 2 blocks a multiprocessor, and a checksum of the head's outputs (A and B sum in the same order: equal).
// Built as build-cuda/g4-cuda-gemv-chain by -DGEMMA4C_CUDA=ON (or nvcc -O3 -arch=sm_90a); run: g4-cuda-gemv-chain [PF]
// (bench/cuda_h200_results.md, session of 2026-12-02 22:34 UTC: A reaches 61.8% at best, B does not beat it).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
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
__device__ __forceinline__ float dot8(uint4 w, const float *x) {
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) s += __uint_as_float(u[i] << 16) * x[2 * i] + __uint_as_float(u[i] & 0xffff0000u) * x[2 * i + 1];
    return s;
}

template <bool PF> __global__ __launch_bounds__(THREADS, 2) void gemv(Stage s, int pf_bytes) {
    extern __shared__ __align__(16) unsigned char sm[];
    float *xs = (float *)sm;
    uint4 *buf = (uint4 *)(sm + XMAX * 4);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = (s.rows + gridDim.x - 1) / gridDim.x, r0 = blockIdx.x * per;
    const int r1 = min(s.rows, r0 + per), nv = s.cols / 8; // uint4 a row
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
            for (int v = lane; v < nv; v += 32) acc += dot8(buf[(size_t)(r - r0) * nv + v], xs + 8 * v);
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
        for (; v < nv; v += 128) {
            uint4 q[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) q[u] = ldw(row + v + 32 * u);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v + 32 * u < nv) acc += dot8(q[u], xs + 8 * (v + 32 * u));
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s.y[r] = acc;
    }
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
    for (int variant = 0; variant < 2; variant++)
        for (int bpm = 1; bpm <= 2; bpm++) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
            for (auto &s : st) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3((unsigned)(nsm * bpm));
                cfg.blockDim = dim3(THREADS);
                cfg.dynamicSmemBytes = variant ? smemB : smemA;
                cfg.stream = cs;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at, cfg.numAttrs = 1;
                if (variant)
                    CK(cudaLaunchKernelEx(&cfg, gemv<true>, s, pf));
                else
                    CK(cudaLaunchKernelEx(&cfg, gemv<false>, s, pf));
            }
            CK(cudaStreamEndCapture(cs, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaMemset(buf[0], 0, 262144 * 4));
            CK(cudaMemset(buf[1], 0, 262144 * 4));
            for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, cs));
            CK(cudaStreamSynchronize(cs));
            // checksum of one replay from a known input
            std::vector<float> ones(262144, 0.01f), out(262144);
            CK(cudaMemcpy(buf[0], ones.data(), 262144 * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(buf[1], ones.data(), 262144 * 4, cudaMemcpyHostToDevice));
            CK(cudaGraphLaunch(ge, cs));
            CK(cudaStreamSynchronize(cs));
            CK(cudaMemcpy(out.data(), st.back().y, 262144 * 4, cudaMemcpyDeviceToHost));
            double sum = 0;
            for (float v : out) sum += v;
            CK(cudaEventRecord(e0, cs));
            for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, cs));
            CK(cudaEventRecord(e1, cs));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = ms * 1e3 / 20, gbs = bytes / (us * 1e-6) / 1e9;
            printf("%s, %d block(s) a multiprocessor: %8.1f us a step, %6.0f GB/s, %5.1f%% of copy; checksum %.6e\n",
                   variant ? "B (rows into shared memory before the wait)" : "A (as the engine)", bpm, us, gbs,
                   100.0 * gbs / copy_gbs, sum);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    return 0;
}
