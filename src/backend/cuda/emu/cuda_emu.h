/* A CPU emulator for the CUDA backend's kernels: enough of the CUDA runtime and device language to run
 * the .cu files of src/backend/cuda on a machine without a GPU (configure with -DG4_CUDA_EMULATE=ON). It exists so that
 * the kernels are tested where no GPU is (this machine, CI): test_backend_ops and the fixture tests run them.
 *
 * Every thread of a block is a fiber (its own stack); a block runs to completion before the next one starts.
 * Fibers switch only at barriers: __syncthreads() waits for the live threads of the block, the warp
 * primitives (__shfl_*_sync, __syncwarp, __ballot_sync) for the live lanes of the warp. Shared memory is
 * static storage (one copy, used by one block at a time). Device memory is host memory (malloc), so
 * AddressSanitizer sees out-of-bounds accesses of kernels. What it cannot show: races between blocks,
 * timing, the async memory model (PDL, cp.async complete at once), and inline PTX (the kernels provide a
 * portable path for each use). A kernel that shuffles with an exited lane or waits at different barriers
 * stops the program with a message: on a GPU that is undefined behaviour. */
#ifndef G4_CUDA_EMU_H
#define G4_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#define G4_CUDA_EMU 1

/* ---------------------------------------------------------------- language */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct __align__(16) uint4 { unsigned x, y, z, w; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) float2 { float x, y; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(8) int2 { int x, y; };
static inline int2 make_int2(int a, int b) { return int2{a, b}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct __align__(16) int4 { int x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return float2{a, b}; }

typedef struct g4emu_thread g4emu_thread;
struct g4emu_thread {
    uint3 tid;
    int warp, lane;
    int done;
    int waiting;         /* 0 runnable, 1 block barrier, 2 warp barrier */
    unsigned long gen;   /* barrier generation it waits on */
    void *sp;            /* saved stack pointer */
    void *stack;         /* base of its stack */
    size_t stack_size;
    void *fake_stack;    /* AddressSanitizer fiber bookkeeping */
};

extern g4emu_thread *g4emu_cur;
extern uint3 g4emu_block_idx;
extern dim3 g4emu_block_dim, g4emu_grid_dim;

#define threadIdx (g4emu_cur->tid)
#define blockIdx (g4emu_block_idx)
#define blockDim (g4emu_block_dim)
#define gridDim (g4emu_grid_dim)
#define warpSize 32

void __syncthreads(void);
void g4emu_warp_sync(unsigned mask);
/* exchanges one 8-byte value per lane of the warp: returns the value lane src put in */
uint64_t g4emu_warp_exchange(unsigned mask, uint64_t v, int src);
unsigned g4emu_warp_ballot(unsigned mask, int pred);
/* sum / max over the 32 lanes of a full warp in one exchange (the same value in every lane) */
float g4emu_warp_reduce(float v, int op);
void *g4emu_dyn_smem(void);

static inline void __syncwarp(unsigned mask = 0xffffffffu) { g4emu_warp_sync(mask); }
template <typename T> static inline uint64_t g4emu_pack(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T> static inline T g4emu_unpack(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    int lane = g4emu_cur->lane, src = lane ^ m;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return g4emu_unpack<T>(g4emu_warp_exchange(mask, g4emu_pack(v), src));
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int lane = g4emu_cur->lane;
    return g4emu_unpack<T>(g4emu_warp_exchange(mask, g4emu_pack(v), (lane & ~(width - 1)) + (src & (width - 1))));
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = g4emu_cur->lane, src = lane + (int)d;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return g4emu_unpack<T>(g4emu_warp_exchange(mask, g4emu_pack(v), src));
}
static inline unsigned __ballot_sync(unsigned mask, int p) { return g4emu_warp_ballot(mask, p); }
static inline int __any_sync(unsigned mask, int p) { return g4emu_warp_ballot(mask, p) != 0; }
static inline int __all_sync(unsigned mask, int p) { return g4emu_warp_ballot(mask, p) == (g4emu_warp_ballot(mask, 1)); }

/* one block runs at a time and fibers switch only at barriers: plain read-modify-write is atomic */
template <typename T> static inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}
template <typename T> static inline T atomicMax(T *p, T v) {
    T o = *p;
    if (v > o) *p = v;
    return o;
}
template <typename T> static inline T atomicMin(T *p, T v) {
    T o = *p;
    if (v < o) *p = v;
    return o;
}
template <typename T> static inline T atomicExch(T *p, T v) {
    T o = *p;
    *p = v;
    return o;
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) {
    T o = *p;
    if (o == cmp) *p = v;
    return o;
}
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline unsigned __isGlobal(const void *p) { return p != NULL; } /* (prefetches are no-ops here) */
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; } /* a product rounded on its own */
static inline float __saturatef(float x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
static inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
/* four signed byte products of a and b summed into c */
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
/* byte n of the result: byte (s >> 4n) & 7 of the 8 bytes of y:x (x the low four) */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
    return r;
}
/* per byte a - b, modulo 256 */
static inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
    return r;
}
static inline int __float2int_rn(float x) { return (int)lrintf(x); } /* round half to even */

/* ---------------------------------------------------------------- runtime */
typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNotSupported = 801,
};
typedef struct g4emu_stream *cudaStream_t;
typedef struct g4emu_event *cudaEvent_t;
typedef struct g4emu_graph *cudaGraph_t;
typedef struct g4emu_graph_exec *cudaGraphExec_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
#define cudaStreamNonBlocking 1
#define cudaHostAllocDefault 0
#define cudaEventDefault 0

struct cudaDeviceProp {
    char name[256];
    int multiProcessorCount;
    size_t totalGlobalMem;
    int l2CacheSize;
    size_t sharedMemPerBlockOptin;
    int major, minor;
    int memoryClockRate, memoryBusWidth;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                              cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *e);
#define cudaEventDisableTiming 2
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
/* graphs: not emulated (the backend runs such steps eagerly when capture fails) */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode m);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
struct cudaFuncAttributes {
    size_t sharedSizeBytes;
};
template <typename F> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F) {
    a->sharedSizeBytes = 0;
    return cudaSuccess;
}

template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int, size_t) {
    *n = 4;
    return cudaSuccess;
}

/* Runs body once per thread of every block of the grid (the launch helper of cuda_common.cuh calls it). */
void g4emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

#endif
