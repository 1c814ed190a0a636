/* Internals shared by the CUDA backend's files (src/backend/cuda/): the backend's state, device helpers
 * (bf16/f16 conversion, 16-byte weight loads, warp sums), the kernel launcher and the entry points of each
 * file. The kernels are C-style CUDA; the same source also builds for the CPU emulator (emu/cuda_emu.h), so
 * inline PTX appears only behind the helpers below, each with a portable path.
 *
 * Launches use programmatic dependent launch (Hopper): a kernel may start while the previous one finishes; it
 * reads only weights (never written) before g4_grid_wait(), and everything else after it, so the weight
 * stream of a GEMV overlaps the previous kernel's tail. Every kernel calls g4_grid_wait() (a kernel that
 * skipped it could finish before its predecessor and break the chain). The GEMV lets its successor launch
 * once its inputs are staged (g4_grid_launch_dependents). */
#ifndef G4_BACKEND_CUDA_COMMON_CUH
#define G4_BACKEND_CUDA_COMMON_CUH

#ifndef G4_CUDA_EMU
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "core/error.h"
#include "core/quant.h"
}

/* ---------------------------------------------------------------- device helpers */
#ifdef G4_CUDA_EMU
#define G4_DYN_SMEM(type, name) type *name = (type *)g4emu_dyn_smem()
static inline void g4_grid_wait(void) {}
#define G4_TRACE_MARK(i) ((void)0)
#define G4_TRACE_TU(name)
static inline void g4_grid_launch_dependents(void) {}
static inline uint4 g4_ld_stream(const void *p) {
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}
static inline float g4_h2f(uint16_t h) { return g4_f16_to_f32(h); }
static inline uint16_t g4_f2h(float f) { return g4_f32_to_f16(f); }
static inline void g4_cp16(void *smem, const void *gmem) { memcpy(smem, gmem, 16); }
static inline void g4_prefetch_l1(const void *p) { (void)p; }
static inline void g4_cp_wait(void) {}
static inline void g4_cp_commit(void) {}
static inline void g4_cp_wait_but_one(void) {}
static inline void g4_fence_gpu(void) {}
#else
#define G4_DYN_SMEM(type, name)                              \
    extern __shared__ __align__(16) unsigned char g4_smem[]; \
    type *name = (type *)g4_smem
#ifdef G4_CUDA_TRACE
/* Diagnostics, a build with -DG4_CUDA_TRACE only: block (0,0,0) of every kernel records the global time before and
 * after its grid wait (the wait ends when the previous kernel has finished), and at G4_TRACE_MARK(2..7) points;
 * records per translation unit (G4_TRACE_TU), merged and printed by cuda_backend.cu with G4_CUDA_TRACE=1. */
#define G4_TRACE_N 16384
static __device__ unsigned long long g4_trace_rec[G4_TRACE_N][8];
static __device__ unsigned g4_trace_ctr;
static __device__ __forceinline__ unsigned long long g4_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ bool g4_trace_block(void) {
    return threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}
static __device__ __forceinline__ unsigned &g4_trace_slot(void) {
    __shared__ unsigned slot;
    return slot;
}
static __device__ __forceinline__ void g4_grid_wait(void) {
    unsigned long long t0 = g4_trace_block() ? g4_now() : 0;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (g4_trace_block()) {
        const unsigned s = atomicAdd(&g4_trace_ctr, 1u) % G4_TRACE_N;
        g4_trace_slot() = s;
        g4_trace_rec[s][0] = t0, g4_trace_rec[s][1] = g4_now();
        for (int i = 2; i < 8; i++) g4_trace_rec[s][i] = 0;
    }
}
#define G4_TRACE_MARK(i)                                                    \
    do {                                                                    \
        if (g4_trace_block()) g4_trace_rec[g4_trace_slot()][i] = g4_now(); \
    } while (0)
#define G4_TRACE_TU(name)                                                               \
    void g4c_trace_take_##name(unsigned long long (*rec)[8], unsigned *n) {             \
        cudaMemcpyFromSymbol(rec, g4_trace_rec, sizeof g4_trace_rec);                   \
        cudaMemcpyFromSymbol(n, g4_trace_ctr, sizeof *n);                               \
    }
#else
static __device__ __forceinline__ void g4_grid_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
#define G4_TRACE_MARK(i) ((void)0)
#define G4_TRACE_TU(name)
#endif
static __device__ __forceinline__ void g4_grid_launch_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
/* A release-acquire fence at GPU scope, what a counter barrier between blocks needs (__threadfence() is a
 * sequentially consistent one: MEMBAR.SC.GPU) */
static __device__ __forceinline__ void g4_fence_gpu(void) { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
/* 16 bytes of a weight stream: read-only, not kept in L1 */
static __device__ __forceinline__ uint4 g4_ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
/* the 128-byte line of p into L1, for a read soon after */
static __device__ __forceinline__ void g4_prefetch_l1(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
/* 16 bytes global -> shared without registers (cp.async; complete after g4_cp_wait) */
static __device__ __forceinline__ void g4_cp16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void g4_cp_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* groups of copies: close the current group; wait until at most the latest group is in flight */
static __device__ __forceinline__ void g4_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
static __device__ __forceinline__ void g4_cp_wait_but_one(void) {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
}
static __device__ __forceinline__ float g4_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ uint16_t g4_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
#endif

static __device__ __forceinline__ float g4_bf2f(uint16_t h) { return __uint_as_float((unsigned)h << 16); }
static __device__ __forceinline__ uint16_t g4_f2bf(float f) { /* nearest even, NaN stays NaN */
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifdef G4_CUDA_EMU /* one exchange instead of five (the emulator switches threads at each) */
static inline float g4_warp_sum(float v) { return g4emu_warp_reduce(v, 0); }
static inline float g4_warp_max(float v) { return g4emu_warp_reduce(v, 1); }
#else
static __device__ __forceinline__ float g4_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float g4_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif

/* Sum over each aligned group of n lanes (n a power of two up to 32); every lane of the group gets its sum. */
static __device__ __forceinline__ float g4_lanes_sum(float v, int n) {
    for (int o = n >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of up to 1024 threads; every thread gets the result. red: 32 floats of shared memory. */
static __device__ __forceinline__ float g4_block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = g4_warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : 0.0f;
    return g4_warp_sum(s);
}

/* Two sums over a block of up to 1024 threads in one reduction (as g4_block_sum); every thread gets both. red: 2 x 32
 * floats of shared memory. */
static __device__ __forceinline__ void g4_block_sum2(float *a, float *b, float (*red)[32]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    const float va = g4_warp_sum(*a), vb = g4_warp_sum(*b);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[0][w] = va, red[1][w] = vb;
    __syncthreads();
    *a = g4_warp_sum(lane < nw ? red[0][lane] : 0.0f), *b = g4_warp_sum(lane < nw ? red[1][lane] : 0.0f);
}

/* c += a b for one m16n8k16 tile: a 16 x 16 bf16 (row-major fragments), b 16 x 8 bf16 (column fragments), c 16 x 8
 * f32 (PTX ISA, mma.m16n8k16 .bf16: lane l holds, with g = l / 4 and t = l % 4, a's rows g and g + 8 at columns
 * 2t, 2t + 1 and 2t + 8, 2t + 9 as a[0] (row g), a[1] (row g + 8), a[2] (row g, + 8), a[3] (row g + 8, + 8); b's
 * rows 2t, 2t + 1 (b[0]) and 2t + 8, 2t + 9 (b[1]) of column g; c's rows g (c[0], c[1]) and g + 8 (c[2], c[3]) at
 * columns 2t, 2t + 1; the lower half of a 32-bit register is the lower column or row). The emulator forms the
 * product from the lanes' fragments in scr (384 floats a warp). */
static __device__ __forceinline__ void g4_mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2], float *scr) {
#ifdef G4_CUDA_EMU
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float *A = scr, *B = scr + 256; /* A [16][16], B [16][8] (k, n) */
    for (int h = 0; h < 2; h++) {
        A[g * 16 + 2 * t + h] = g4_bf2f((uint16_t)(a[0] >> (16 * h)));
        A[(g + 8) * 16 + 2 * t + h] = g4_bf2f((uint16_t)(a[1] >> (16 * h)));
        A[g * 16 + 2 * t + 8 + h] = g4_bf2f((uint16_t)(a[2] >> (16 * h)));
        A[(g + 8) * 16 + 2 * t + 8 + h] = g4_bf2f((uint16_t)(a[3] >> (16 * h)));
        B[(2 * t + h) * 8 + g] = g4_bf2f((uint16_t)(b[0] >> (16 * h)));
        B[(2 * t + 8 + h) * 8 + g] = g4_bf2f((uint16_t)(b[1] >> (16 * h)));
    }
    __syncwarp();
    for (int k = 0; k < 16; k++) {
        c[0] += A[g * 16 + k] * B[k * 8 + 2 * t], c[1] += A[g * 16 + k] * B[k * 8 + 2 * t + 1];
        c[2] += A[(g + 8) * 16 + k] * B[k * 8 + 2 * t], c[3] += A[(g + 8) * 16 + k] * B[k * 8 + 2 * t + 1];
    }
    __syncwarp();
#else
    (void)scr;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* a's fragment of an m16n8k16 bf16 product (g4_mma_bf16) from a row-major 16-bit matrix m (ld elements a row): rows g
 * and g + 8 at columns c, c + 1 and c + 8, c + 9 (c = the tile's first column + 2t) */
static __device__ __forceinline__ void g4_frag_a16(const uint16_t *m, int ld, int g, int c, uint32_t a[4]) {
    a[0] = *(const uint32_t *)(m + (size_t)g * ld + c), a[1] = *(const uint32_t *)(m + (size_t)(g + 8) * ld + c);
    a[2] = *(const uint32_t *)(m + (size_t)g * ld + c + 8), a[3] = *(const uint32_t *)(m + (size_t)(g + 8) * ld + c + 8);
}

/* c += one step of 32 elements of a 16-row bf16 tile against an n8 tile of tokens, the mma's k order permuted alike
 * on both sides so that every load is 16 bytes: lane (g, q) holds elements 8q .. 8q + 7 of tile rows g (ra) and g + 8
 * (rb) and of token g's bf16 hi parts (bh) and, with lo, its lo parts (bl); logical k 2q, 2q + 1, 2q + 8, 2q + 9 are
 * elements 8q .. 8q + 3, the second mma's 8q + 4 .. 8q + 7; hi then lo into the same f32 sums (experts_tc_kernel,
 * gemv_tc_kernel) */
static __device__ __forceinline__ void g4_mma_bf16_step32(float c[4], uint4 ra, uint4 rb, uint4 bh, uint4 bl, bool lo,
                                                          float *scr) {
    const uint32_t a0[4] = {ra.x, rb.x, ra.y, rb.y}, a1[4] = {ra.z, rb.z, ra.w, rb.w};
    const uint32_t h0[2] = {bh.x, bh.y}, h1[2] = {bh.z, bh.w};
    g4_mma_bf16(c, a0, h0, scr);
    g4_mma_bf16(c, a1, h1, scr);
    if (lo) {
        const uint32_t l0[2] = {bl.x, bl.y}, l1[2] = {bl.z, bl.w};
        g4_mma_bf16(c, a0, l0, scr);
        g4_mma_bf16(c, a1, l1, scr);
    }
}

/* c = a b for one m16n8k32 tile of int8 (PTX ISA, mma.m16n8k32 .s8): lane l holds, with g = l / 4 and t = l % 4,
 * a's (16 x 32, row-major) bytes 4t .. 4t + 3 of rows g (a[0]) and g + 8 (a[1]) and bytes 16 + 4t .. of rows g (a[2])
 * and g + 8 (a[3]); b's (32 x 8, columns) rows 4t .. 4t + 3 (b[0]) and 16 + 4t .. (b[1]) of column g; c's (s32) rows
 * g (c[0], c[1]) and g + 8 (c[2], c[3]) at columns 2t, 2t + 1; the lowest byte of a register is the lowest index.
 * The emulator forms the product from the lanes' fragments in scr (768 ints a warp). */
static __device__ __forceinline__ void g4_mma_s8(int c[4], const uint32_t a[4], const uint32_t b[2], int *scr) {
#ifdef G4_CUDA_EMU
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int *A = scr, *B = scr + 512; /* A [16][32], B [32][8] (k, n) */
    for (int h = 0; h < 4; h++) {
        A[g * 32 + 4 * t + h] = (signed char)(a[0] >> (8 * h));
        A[(g + 8) * 32 + 4 * t + h] = (signed char)(a[1] >> (8 * h));
        A[g * 32 + 16 + 4 * t + h] = (signed char)(a[2] >> (8 * h));
        A[(g + 8) * 32 + 16 + 4 * t + h] = (signed char)(a[3] >> (8 * h));
        B[(4 * t + h) * 8 + g] = (signed char)(b[0] >> (8 * h));
        B[(16 + 4 * t + h) * 8 + g] = (signed char)(b[1] >> (8 * h));
    }
    __syncwarp();
    c[0] = c[1] = c[2] = c[3] = 0;
    for (int k = 0; k < 32; k++) {
        c[0] += A[g * 32 + k] * B[k * 8 + 2 * t], c[1] += A[g * 32 + k] * B[k * 8 + 2 * t + 1];
        c[2] += A[(g + 8) * 32 + k] * B[k * 8 + 2 * t], c[3] += A[(g + 8) * 32 + k] * B[k * 8 + 2 * t + 1];
    }
    __syncwarp();
#else
    (void)scr;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0));
#endif
}

/* 1/rms of a row of n floats, for every thread of the block (red: 32 floats of shared memory) */
static __device__ __forceinline__ float g4_row_inv_rms(const float *x, int n, float eps, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    return rsqrtf(g4_block_sum(ss, red) / (float)n + eps);
}

static __device__ __forceinline__ float g4_gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* Eight consecutive elements of a weight row of dtype DT at element k (k a multiple of 8, 16-byte aligned:
 * device rows are padded to 16 bytes). Adding a weight type is one more specialization. */
template <int DT> struct g4_wload;
template <> struct g4_wload<G4_BF16> {
    static __device__ __forceinline__ void load(const unsigned char *row, int k, float w[8]) {
        uint4 v = g4_ld_stream(row + (size_t)k * 2);
        const unsigned u[4] = {v.x, v.y, v.z, v.w};
        for (int i = 0; i < 4; i++) {
            w[2 * i] = __uint_as_float(u[i] << 16);
            w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};
template <> struct g4_wload<G4_F16> {
    static __device__ __forceinline__ void load(const unsigned char *row, int k, float w[8]) {
        uint4 v = g4_ld_stream(row + (size_t)k * 2);
        const unsigned u[4] = {v.x, v.y, v.z, v.w};
        for (int i = 0; i < 4; i++) {
            w[2 * i] = g4_h2f((uint16_t)(u[i] & 0xffffu));
            w[2 * i + 1] = g4_h2f((uint16_t)(u[i] >> 16));
        }
    }
};
template <> struct g4_wload<G4_F32> {
    static __device__ __forceinline__ void load(const unsigned char *row, int k, float w[8]) {
        uint4 a = g4_ld_stream(row + (size_t)k * 4), b = g4_ld_stream(row + (size_t)k * 4 + 16);
        w[0] = __uint_as_float(a.x), w[1] = __uint_as_float(a.y), w[2] = __uint_as_float(a.z);
        w[3] = __uint_as_float(a.w), w[4] = __uint_as_float(b.x), w[5] = __uint_as_float(b.y);
        w[6] = __uint_as_float(b.z), w[7] = __uint_as_float(b.w);
    }
};

/* ---------------------------------------------------------------- quantized weights in device memory
 * Supported: GGUF Q8_0, Q4_0, Q5_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, CB4, CB4_16, MXF4 (core/tensor.h) and
 * MLX affine 4 and 8 bit (G4C_QUANT_TYPES;
 * core/quant.h has the file layouts; other types are held as Q8_0: g4c_held_dtype). At
 * upload every row is repacked (cuda_quant.cu) so that the codes of a row come first, in runs a lane reads with
 * 16-byte loads, and the row's scales follow them (row bytes padded to 16). The bytes per weight stay those of
 * the file. Device layouts, per row of `in` elements:
 *   Q8_0: int8 codes [in]; f16 d [in/32]
 *   Q4_0: per block of 32, 16 bytes (byte i = element i | element i+16 << 4, GGUF's order); f16 d [in/32]
 *   Q5_0: per block of 32, 16 bytes of the low 4 bits as Q4_0 (GGUF's qs); then the fifth bits [in/8] (per block a
 *         32-bit word, bit i element i: GGUF's qh); f16 d [in/32]
 *   Q2_K: per 64 elements 16 bytes of 2-bit codes, byte t holding elements t, t + 16, t + 32, t + 48 (bits 0-1,
 *         2-3, 4-5, 6-7: a shift and a mask give 4 consecutive codes as bytes); the scale bytes [in/16] (sc | m << 4
 *         per 16 elements: GGUF's scales[16], already in element order); per 256-block d, dmin (f16) [in/256 * 4]
 *   Q4_K: per 32-element sub-block, 16 bytes as Q4_0; per 256-block its 16 bytes d, dmin, scales[12] (GGUF's)
 *   Q5_K: the low 4 bits as Q4_K's codes [in/2]; the fifth bits as Q5_0's [in/8] (per 32-element sub-block a word);
 *         per 256-block d, dmin, scales[12] as Q4_K
 *   IQ4_NL, MXF4: as Q4_0 (each code an index into g4_iq4_values, MXF4: g4_fp4_values)
 *   IQ4_XS: codes as IQ4_NL's [in/2]; per 256-block its 8 bytes d, scales_h, scales_l[4] (GGUF's)
 *   CB4: as IQ4_XS, each code an index into its 256-block's table: codes [in/2]; the tables [in/256 * 16]; per
 *        256-block d, scales_h, scales_l[4] [in/256 * 8]
 *   CB4_16: codes as CB4's [in/2]; the tables [in/256 * 16]; int8 scales [in/16] (one per 16 elements); f16 d
 *        [in/256]
 *   Q6_K: per 64 elements 48 bytes: low nibbles of elements 0..31 and 32..63 (Q4_0 order), then byte j holds the
 *         two high bits of elements j, j+16, j+32, j+48 (bits 0-1, 2-3, 4-5, 6-7); int8 scales [in/16] (one
 *         per 16 elements, the file's order is already element order); f16 d [in/256]
 *   MLX4 / MLX8: the file's LSB-first codes [in*bits/8]; per group (scale, bias) as a 16-bit pair (bf16 or f16,
 *         as the file) or an f32 pair.
 * An "access" is EPA elements a lane reads at once (QW 16-byte words of codes plus a word of scales); within
 * it, segments of SEG elements share one scale a and offset b: w = a * v + b with v the code minus the type's
 * zero point, so a segment's product is a * sum(v x) + b * sum(x) (b only where NEED_SUM). */
typedef struct g4c_qrow {
    int in;    /* elements of a row */
    int group; /* MLX group (elements per scale) */
    int gshift; /* log2(group) when group is a power of two, else -1 (the GEMV's group index without a division) */
    int sk;    /* MLX scale kind: 0 bf16, 1 f16, 2 f32 */
} g4c_qrow;

/* The quantized types with kernels here (each has its g4_qt below), for dispatching a template: X(G4_Q8_0) ... */
#define G4C_QUANT_TYPES(X)                                                                                         \
    X(G4_Q8_0) X(G4_Q4_0) X(G4_Q5_0) X(G4_Q2_K) X(G4_Q4_K) X(G4_Q5_K) X(G4_Q6_K) X(G4_IQ4_NL) X(G4_IQ4_XS)   \
    X(G4_CB4) X(G4_CB4_16) X(G4_MXF4) X(G4_MLX4) X(G4_MLX8)
static inline int g4c_quant_supported(g4_dtype t) {
    switch (t) {
#define G4C_SUPPORTED(T) case T:
        G4C_QUANT_TYPES(G4C_SUPPORTED) return 1;
#undef G4C_SUPPORTED
    default: return 0;
    }
}

/* The dtype a weight of type t is held as in device memory: t where this backend has kernels for it (the plain
 * float types and g4c_quant_supported); MLX 2/3-bit as MLX4 and 5/6-bit as MLX8 (the codes widened, the scales and
 * biases as they are: exact, g4c_upload_quant); Q3_K as Q6_K (exact: the same d and scales, codes widened); else the
 * first layout of MXF4, CB4, CB4_16, Q6_K, MLX4, MLX8 that holds t's values exactly (g4_transcode_exact; `skip`: how
 * many of them refused a row of the tensor at upload, which then takes the next): MXFP4 as MXF4 (4.5 bits a weight),
 * the codebook and ternary types whose runs of 32 share a scale (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S, TQ1_0, TQ2_0; MXFP4
 * where not MXF4) as CB4 (4.75), those
 * with a scale per 16 (IQ2_XS, IQ2_S, IQ1_M, NVFP4) as CB4_16 (5.1), Q4_1 as MLX4 and Q5_1 as MLX8 (groups of 32, f32
 * scales and biases: g4_transcode_row_mlx, the CPU's AF4 / AF8 blocks); Q8_0 where none is left, re-encoded row by row
 * at upload (g4_transcode_row: 8.5 bits a weight); G4_DTYPE_UNKNOWN for a type it cannot read. Rows of a held type
 * must be whole blocks of it (Q8_0, and the MLX-held GGUF types: 32; CB4, CB4_16, Q6_K: 256). */
static inline g4_dtype g4c_held_dtype(g4_dtype t, int skip) {
    if (t == G4_BF16 || t == G4_F16 || t == G4_F32 || g4c_quant_supported(t)) return t;
    if (g4_dtype_is_mlx(t)) return g4_mlx_bits(t) <= 4 ? G4_MLX4 : G4_MLX8;
    if (t == G4_Q3_K) return G4_Q6_K; /* (exact: g4_transcode_row) */
    static const g4_dtype exact[] = {G4_MXF4, G4_CB4, G4_CB4_16, G4_Q6_K, G4_MLX4, G4_MLX8};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (g4_transcode_exact(t, exact[i]) && skip-- == 0) return exact[i];
    return g4_dtype_is_quantized(t) && g4_dequant_reads(t) ? G4_Q8_0 : G4_DTYPE_UNKNOWN;
}

/* Bytes of a device row of `in` elements of weight tensor w (plain types: padded to 8 elements). */
static inline size_t g4c_qrow_bytes(g4_dtype t, int64_t in, int group, g4_dtype sdt) {
    size_t b = 0;
    const size_t n = (size_t)in, pair = sdt == G4_F32 ? 8 : 4;
    switch (t) {
    case G4_Q8_0: b = n + 2 * (n / 32); break;
    case G4_Q4_0: b = n / 2 + 2 * (n / 32); break;
    case G4_Q5_0: b = n / 2 + n / 8 + 2 * (n / 32); break;
    case G4_Q2_K: b = n / 4 + n / 16 + 4 * (n / 256); break;
    case G4_Q4_K: b = n / 2 + 16 * (n / 256); break;
    case G4_Q5_K: b = n / 2 + n / 8 + 16 * (n / 256); break;
    case G4_IQ4_NL:
    case G4_MXF4: b = n / 2 + 2 * (n / 32); break;
    case G4_IQ4_XS: b = n / 2 + 8 * (n / 256); break;
    case G4_CB4: b = n / 2 + 24 * (n / 256); break;
    case G4_CB4_16: b = n / 2 + n / 16 + 18 * (n / 256); break;
    case G4_Q6_K: b = n * 3 / 4 + n / 16 + 2 * (n / 256); break;
    case G4_MLX4: b = n / 2 + (group > 0 ? n / (size_t)group : 0) * pair; break;
    case G4_MLX8: b = n + (group > 0 ? n / (size_t)group : 0) * pair; break;
    default: return 0;
    }
    return (b + 15) & ~(size_t)15;
}
static inline size_t g4c_row_bytes(g4_dtype t, int64_t in);
static inline size_t g4c_wrow_bytes(const g4_tensor *w) {
    const int64_t in = w->ndim ? w->shape[w->ndim - 1] : 1;
    if (g4_dtype_is_quantized(w->dtype)) return g4c_qrow_bytes(w->dtype, in, w->group, w->scale_dtype);
    return g4c_row_bytes(w->dtype, in);
}
static inline g4c_qrow g4c_qrow_of(const g4_tensor *w) {
    g4c_qrow q;
    q.in = (int)(w->ndim ? w->shape[w->ndim - 1] : 1);
    q.group = w->group > 0 ? w->group : 32;
    q.gshift = -1;
    for (int b = 0; b < 16; b++)
        if (q.group == 1 << b) q.gshift = b;
    q.sk = w->scale_dtype == G4_F32 ? 2 : w->scale_dtype == G4_F16 ? 1 : 0;
    return q;
}

static __device__ __forceinline__ unsigned g4_ld_u16(const unsigned char *p) { return *(const uint16_t *)p; }
static __device__ __forceinline__ unsigned g4_ld_u32(const unsigned char *p) { return __ldg((const unsigned *)p); }
static __device__ __forceinline__ uint4 g4_ld_u4(const unsigned char *p) { return __ldg((const uint4 *)p); }

/* Four bytes of u (values < 256) as floats minus `zero`: each byte becomes the low mantissa byte of 2^23 (one
 * byte permute), the subtraction of 2^23 + zero is exact. */
static __device__ __forceinline__ void g4_bytes4(unsigned u, float zero, float *f) {
    const float m = 8388608.0f + zero;
#ifdef G4_CUDA_EMU
    for (int i = 0; i < 4; i++) f[i] = __uint_as_float(0x4B000000u | ((u >> (8 * i)) & 0xffu)) - m;
#else
    f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - m;
    f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - m;
    f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - m;
    f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - m;
#endif
}
static __device__ __forceinline__ unsigned g4_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
/* chunk j (0..3) of 8 elements of a 32-element run in Q4_0 nibble order (word v), minus zero */
static __device__ __forceinline__ void g4_nib32(const uint4 &v, int j, float zero, float *f) {
    const unsigned a = g4_word(v, (j & 1) * 2), b = g4_word(v, (j & 1) * 2 + 1);
    const int sh = j >= 2 ? 4 : 0;
    g4_bytes4((a >> sh) & 0x0F0F0F0Fu, zero, f);
    g4_bytes4((b >> sh) & 0x0F0F0F0Fu, zero, f + 4);
}

/* sum over the 4 words c of v: low nibbles of c times int8 word xl.c, high nibbles times xh.c (__dp4a) */
static __device__ __forceinline__ int g4_dot_nib(const uint4 &v, const uint4 &xl, const uint4 &xh) {
    const unsigned m = 0x0F0F0F0Fu;
    int s = __dp4a((int)(v.x & m), (int)xl.x, 0);
    s = __dp4a((int)((v.x >> 4) & m), (int)xh.x, s), s = __dp4a((int)(v.y & m), (int)xl.y, s);
    s = __dp4a((int)((v.y >> 4) & m), (int)xh.y, s), s = __dp4a((int)(v.z & m), (int)xl.z, s);
    s = __dp4a((int)((v.z >> 4) & m), (int)xh.z, s), s = __dp4a((int)(v.w & m), (int)xl.w, s);
    return __dp4a((int)((v.w >> 4) & m), (int)xh.w, s);
}
/* four bits b0..b3 -> bit 4 of each byte of a word (byte i: b_i << 4; the four shifted copies of the multiply do not
 * overlap) */
static __device__ __forceinline__ unsigned g4_hbits4(unsigned b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }
/* The int8 values code - ZERO of a word of codes in Q4_0's nibble order (low nibbles: elements 4c .. 4c+3 into *lo,
 * high nibbles: 16+4c .. into *hi), with the fifth bits h5lo and h5hi (4 bits each, bit i element i; the Q5 types) or
 * 0: (c + 128 - ZERO) ^ 128 per byte is c - ZERO as int8 for c below 128 + ZERO (g4_s8_word) */
template <int ZERO>
static __device__ __forceinline__ void g4_s8_nibbles(unsigned u, unsigned h5lo, unsigned h5hi, unsigned *lo,
                                                     unsigned *hi) {
    constexpr unsigned Z = (unsigned)(128 - ZERO) * 0x01010101u;
    *lo = (((u & 0x0f0f0f0fu) | g4_hbits4(h5lo)) + Z) ^ 0x80808080u;
    *hi = ((((u >> 4) & 0x0f0f0f0fu) | g4_hbits4(h5hi)) + Z) ^ 0x80808080u;
}
/* 5-bit codes in Q4_0 nibble order (v) with their fifth bits (qh, bit i element i): as g4_dot_nib, each nibble with
 * its fifth bit (word c's low nibbles: elements 4c.., bits 4c..; high nibbles: elements 16+4c.., bits 16+4c..) */
static __device__ __forceinline__ int g4_dot_nib5(const uint4 &v, unsigned qh, const uint4 &xl, const uint4 &xh) {
    const unsigned m = 0x0F0F0F0Fu;
    int s = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const unsigned w = g4_word(v, c);
        s = __dp4a((int)((w & m) | g4_hbits4((qh >> (4 * c)) & 15u)), (int)g4_word(xl, c), s);
        s = __dp4a((int)(((w >> 4) & m) | g4_hbits4((qh >> (16 + 4 * c)) & 15u)), (int)g4_word(xh, c), s);
    }
    return s;
}
/* chunk j (0..3) of 8 elements of a 32-element run of 5-bit codes (g4_dot_nib5's layout), minus zero */
static __device__ __forceinline__ void g4_nib5_32(const uint4 &v, unsigned qh, int j, float zero, float *f) {
    const unsigned a = g4_word(v, (j & 1) * 2), b = g4_word(v, (j & 1) * 2 + 1), hb = qh >> (8 * j);
    const int sh = j >= 2 ? 4 : 0;
    g4_bytes4(((a >> sh) & 0x0F0F0F0Fu) | g4_hbits4(hb & 15u), zero, f);
    g4_bytes4(((b >> sh) & 0x0F0F0F0Fu) | g4_hbits4((hb >> 4) & 15u), zero, f + 4);
}
/* 4-bit codes indexing a table of 16 int8 values t (bytes in order in t.x .. t.w; IQ4_NL / IQ4_XS: G4_IQ4_TABLE,
 * g4_iq4_values; CB4: its block's), the file's nibble order as Q4_0's: the signed values of word c's low nibbles
 * (elements 4c .. 4c+3) into *lo, of its high nibbles (16+4c ..) into *hi. A byte permute looks up four codes at a
 * time in a half of the table (its three low bits), a third picks the half (bit 3); the selectors take the word's
 * bytes 0-1, then 2-3 (low and high nibbles interleaved), and two more permutes sort the values into the two words. */
#define G4_IQ4_TABLE make_uint4(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u)
#define G4_FP4_TABLE make_uint4(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu) /* g4_fp4_values */
static __device__ __forceinline__ void g4_iq4_word(unsigned w, const uint4 &t, unsigned *lo, unsigned *hi) {
    unsigned v[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const unsigned s = (w >> (16 * h)) & 0xffffu, s3 = s & 0x7777u;
        v[h] = __byte_perm(__byte_perm(t.x, t.y, s3), __byte_perm(t.z, t.w, s3), 0x3210u | ((s & 0x8888u) >> 1));
    }
    *lo = __byte_perm(v[0], v[1], 0x6420u), *hi = __byte_perm(v[0], v[1], 0x7531u);
}
/* sum of value * xq over a 32-element run of such codes (v in Q4_0's nibble order) */
static __device__ __forceinline__ int g4_dot_iq4(const uint4 &v, const uint4 &t, const uint4 &xl, const uint4 &xh) {
    int s = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        unsigned lo, hi;
        g4_iq4_word(g4_word(v, c), t, &lo, &hi);
        s = __dp4a((int)lo, (int)g4_word(xl, c), s);
        s = __dp4a((int)hi, (int)g4_word(xh, c), s);
    }
    return s;
}
/* chunk j (0..3) of 8 elements of such a run, as floats */
static __device__ __forceinline__ void g4_iq4_32(const uint4 &v, const uint4 &t, int j, float *f) {
    unsigned lo0, hi0, lo1, hi1;
    g4_iq4_word(g4_word(v, (j & 1) * 2), t, &lo0, &hi0);
    g4_iq4_word(g4_word(v, (j & 1) * 2 + 1), t, &lo1, &hi1);
    g4_bytes4((j >= 2 ? hi0 : lo0) ^ 0x80808080u, 128.0f, f); /* (signed bytes as unsigned + 128) */
    g4_bytes4((j >= 2 ? hi1 : lo1) ^ 0x80808080u, 128.0f, f + 4);
}
/* a K-quant's scale a = d * sc and offset b = -dmin * m of 32-element sub-block (k / 32) % 8 from the super-block's
 * 16 bytes m (d, dmin, scales[12]; 6-bit sc, m unpacked as g4_k_scale_min) */
static __device__ __forceinline__ void g4_kmeta_seg(const uint4 &m, int k, float *a, float *b) {
    const int s = (k >> 5) & 7;
#define G4_KS(i) ((((i) < 4 ? m.y : (i) < 8 ? m.z : m.w) >> (((i) & 3) * 8)) & 0xffu)
    unsigned sc, mn;
    if (s < 4) {
        sc = G4_KS(s) & 63, mn = G4_KS(s + 4) & 63;
    } else {
        sc = (G4_KS(s + 4) & 15) | ((G4_KS(s - 4) >> 6) << 4);
        mn = (G4_KS(s + 4) >> 4) | ((G4_KS(s) >> 6) << 4);
    }
#undef G4_KS
    *a = g4_h2f((uint16_t)(m.x & 0xffffu)) * (float)sc;
    *b = -g4_h2f((uint16_t)(m.x >> 16)) * (float)mn;
}

template <int DT> struct g4_qt;
template <> struct g4_qt<G4_Q8_0> {
    enum { EPA = 32, QW = 2, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k), r[1] = g4_ld_stream(row + k + 16);
        r[2] = uint4();
        r[2].x = g4_ld_u16(row + q.in + 2 * (k / 32));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) {
        const uint4 &v = r[j >> 1]; /* int8 as unsigned + 128 */
        g4_bytes4(g4_word(v, (j & 1) * 2) ^ 0x80808080u, 128.0f, f);
        g4_bytes4(g4_word(v, (j & 1) * 2 + 1) ^ 0x80808080u, 128.0f, f + 4);
    }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int, int, float *a, float *b) {
        *a = g4_h2f((uint16_t)(r[2].x & 0xffffu)), *b = 0.0f;
    }
    /* sum of code * xq over the 32 elements (xq: int8 activations x0 = elements 0..15, x1 = 16..31) */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        int s = __dp4a((int)r[0].x, (int)x0.x, 0);
        s = __dp4a((int)r[0].y, (int)x0.y, s), s = __dp4a((int)r[0].z, (int)x0.z, s);
        s = __dp4a((int)r[0].w, (int)x0.w, s), s = __dp4a((int)r[1].x, (int)x1.x, s);
        s = __dp4a((int)r[1].y, (int)x1.y, s), s = __dp4a((int)r[1].z, (int)x1.z, s);
        return __dp4a((int)r[1].w, (int)x1.w, s);
    }
};
template <> struct g4_qt<G4_Q4_0> {
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 8, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        r[1] = uint4();
        r[1].x = g4_ld_u16(row + (unsigned)q.in / 2 + 2 * (k / 32));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_nib32(r[0], j, 8.0f, f); }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int, int, float *a, float *b) {
        *a = g4_h2f((uint16_t)(r[1].x & 0xffffu)), *b = 0.0f;
    }
    /* sum of nibble * xq (nibbles 0..15; the caller subtracts ZERO * sum(xq)): word j's low nibbles are
     * elements 4j..4j+3, its high nibbles elements 16+4j.. */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_nib(r[0], x0, x1);
    }
};
template <> struct g4_qt<G4_Q5_0> {
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 16, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        r[1] = uint4();
        r[1].x = g4_ld_u32(row + (unsigned)q.in / 2 + k / 8);
        r[1].y = g4_ld_u16(row + (unsigned)q.in / 2 + (unsigned)q.in / 8 + 2 * (k / 32));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_nib5_32(r[0], r[1].x, j, 16.0f, f); }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int, int, float *a, float *b) {
        *a = g4_h2f((uint16_t)(r[1].y & 0xffffu)), *b = 0.0f;
    }
    /* sum of code * xq (codes 0..31; the caller subtracts ZERO * sum(xq)) */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_nib5(r[0], r[1].x, x0, x1);
    }
};
/* Q2_K: an access of 64 elements, 16 bytes of codes, its 4 scale bytes (segment s: elements 16s .. 16s + 15, the
 * codes of byte t's bits 2s) and the 256-block's d, dmin. With float activations each chunk of 8 is decoded to its
 * values, d (sc & 15) u - dmin (sc >> 4), as llama.cpp's dequantize_row_q2_K computes them (seg's a and b: 1 and 0).
 * With int8 ones (seg with si < 0: a = d, b = -dmin) the min is per 16 elements where the int8 blocks' code sums
 * are per 32: dot32m returns a block's two integer sums, of sc x sum(u xq) and of m x sum(xq) over its halves. */
template <> struct g4_qt<G4_Q2_K> {
    enum { EPA = 64, QW = 1, SEG = 16, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 4);
        r[1] = uint4();
        r[1].x = g4_ld_u32(row + (unsigned)q.in / 4 + k / 16);
        r[1].y = g4_ld_u32(row + (unsigned)q.in / 4 + (unsigned)q.in / 16 + 4 * (k / 256));
    }
    /* chunk j: elements 8j .. 8j + 7, segment j / 2, bytes 8 (j & 1) .. of the codes */
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) {
        const int s = j >> 1, w = 2 * (j & 1);
        const unsigned sc = (r[1].x >> (8 * s)) & 0xffu;
        const float dl = g4_h2f((uint16_t)(r[1].y & 0xffffu)) * (float)(sc & 15u),
                    ml = g4_h2f((uint16_t)(r[1].y >> 16)) * (float)(sc >> 4);
        float u[8];
        g4_bytes4((g4_word(r[0], w) >> (2 * s)) & 0x03030303u, 0.0f, u);
        g4_bytes4((g4_word(r[0], w + 1) >> (2 * s)) & 0x03030303u, 0.0f, u + 4);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = dl * u[i] - ml;
    }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int, int si, float *a, float *b) {
        if (si < 0)
            *a = g4_h2f((uint16_t)(r[1].y & 0xffffu)), *b = -g4_h2f((uint16_t)(r[1].y >> 16));
        else
            *a = 1.0f, *b = 0.0f;
    }
    /* block b (0, 1) of the access: (sum over its halves s = 2b, 2b + 1 of sc_s sum(u xq), of m_s sum(xq)) */
    static __device__ __forceinline__ int2 dot32m(const uint4 *r, int b, const uint4 &x0, const uint4 &x1) {
        int2 p = make_int2(0, 0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 &x = h ? x1 : x0;
            const int s = 2 * b + h;
            const unsigned sc = (r[1].x >> (8 * s)) & 0xffu;
            int d = 0, n = 0;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                d = __dp4a((int)((g4_word(r[0], w) >> (2 * s)) & 0x03030303u), (int)g4_word(x, w), d);
                n = __dp4a(0x01010101, (int)g4_word(x, w), n);
            }
            p.x += (int)(sc & 15u) * d, p.y += (int)(sc >> 4) * n;
        }
        return p;
    }
};
template <> struct g4_qt<G4_Q4_K> {
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 1, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        r[1] = g4_ld_u4(row + (unsigned)q.in / 2 + 16 * (k / 256));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_nib32(r[0], j, 0.0f, f); }
    /* sub-block s = (k / 32) % 8: scale d * sc_s, offset -dmin * m_s */
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int k, int, float *a, float *b) {
        g4_kmeta_seg(r[1], k, a, b);
    }
    /* sum of nibble * xq: the codes as uploaded are in Q4_0's order (word j: elements 4j.. low, 16+4j.. high) */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_nib(r[0], x0, x1);
    }
};
template <> struct g4_qt<G4_Q5_K> {
    enum { EPA = 32, QW = 2, SEG = 32, NEED_SUM = 1, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        r[1] = uint4();
        r[1].x = g4_ld_u32(row + (unsigned)q.in / 2 + k / 8);
        r[2] = g4_ld_u4(row + (unsigned)q.in / 2 + (unsigned)q.in / 8 + 16 * (k / 256));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_nib5_32(r[0], r[1].x, j, 0.0f, f); }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int k, int, float *a, float *b) {
        g4_kmeta_seg(r[2], k, a, b);
    }
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_nib5(r[0], r[1].x, x0, x1);
    }
};
template <> struct g4_qt<G4_IQ4_NL> : g4_qt<G4_Q4_0> { /* Q4_0's layout (load, seg), each code a table index */
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_iq4_32(r[0], G4_IQ4_TABLE, j, f); }
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_iq4(r[0], G4_IQ4_TABLE, x0, x1);
    }
};
template <> struct g4_qt<G4_MXF4> : g4_qt<G4_Q4_0> { /* IQ4_NL's with MXFP4's table */
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_iq4_32(r[0], G4_FP4_TABLE, j, f); }
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_iq4(r[0], G4_FP4_TABLE, x0, x1);
    }
};
template <> struct g4_qt<G4_IQ4_XS> {
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        const uint2 m = __ldg((const uint2 *)(row + (unsigned)q.in / 2 + 8 * (k / 256)));
        r[1] = uint4();
        r[1].x = m.x, r[1].y = m.y; /* d | scales_h << 16, scales_l[4] */
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_iq4_32(r[0], G4_IQ4_TABLE, j, f); }
    /* sub-block i = (k / 32) % 8: d * (its 6-bit scale - 32) */
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int k, int, float *a, float *b) {
        const int i = (k >> 5) & 7;
        const int ls = (int)(((r[1].y >> (4 * i)) & 15u) | (((r[1].x >> (16 + 2 * i)) & 3u) << 4));
        *a = g4_h2f((uint16_t)(r[1].x & 0xffffu)) * (float)(ls - 32), *b = 0.0f;
    }
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_iq4(r[0], G4_IQ4_TABLE, x0, x1);
    }
};
template <> struct g4_qt<G4_CB4> : g4_qt<G4_IQ4_XS> { /* IQ4_XS's (seg), its 256-block's table in r[2] */
    enum { EPA = 32, QW = 2, SEG = 32, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        const unsigned char *tables = row + (unsigned)q.in / 2;
        const uint2 m = __ldg((const uint2 *)(tables + 16 * ((unsigned)q.in / 256) + 8 * (k / 256)));
        r[1] = uint4();
        r[1].x = m.x, r[1].y = m.y; /* d | scales_h << 16, scales_l[4] */
        r[2] = g4_ld_u4(tables + 16 * (k / 256));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_iq4_32(r[0], r[2], j, f); }
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        return g4_dot_iq4(r[0], r[2], x0, x1);
    }
};
template <> struct g4_qt<G4_CB4_16> { /* CB4's codes and tables, a scale per 16 elements as Q6_K's */
    enum { EPA = 32, QW = 2, SEG = 16, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        const unsigned char *tables = row + (unsigned)q.in / 2, *sc = tables + 16 * ((unsigned)q.in / 256);
        r[1] = uint4();
        r[1].x = g4_ld_u16(sc + k / 16);                                    /* the two runs' int8 scales */
        r[1].y = g4_ld_u16(sc + (unsigned)q.in / 16 + 2 * (k / 256)); /* d */
        r[2] = g4_ld_u4(tables + 16 * (k / 256));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) { g4_iq4_32(r[0], r[2], j, f); }
    /* run si (0, 1) of the access: d * its scale; with int8 activations (si < 0) d alone, the scales being integers
     * of dot32 */
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int, int si, float *a, float *b) {
        const int sc = si < 0 ? 1 : (int)(signed char)((r[1].x >> (8 * si)) & 0xffu);
        *a = g4_h2f((uint16_t)(r[1].y & 0xffffu)) * (float)sc, *b = 0.0f;
    }
    /* sum over the runs of scale x sum(value * xq): the low nibbles are elements 0-15, the high ones 16-31 */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            unsigned lo, hi;
            g4_iq4_word(g4_word(r[0], c), r[2], &lo, &hi);
            s0 = __dp4a((int)lo, (int)g4_word(x0, c), s0);
            s1 = __dp4a((int)hi, (int)g4_word(x1, c), s1);
        }
        return (int)(signed char)(r[1].x & 0xffu) * s0 + (int)(signed char)((r[1].x >> 8) & 0xffu) * s1;
    }
};
template <> struct g4_qt<G4_Q6_K> {
    enum { EPA = 64, QW = 3, SEG = 16, NEED_SUM = 0, I8 = 1, ZERO = 0, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        const unsigned char *c = row + (size_t)k * 3 / 4;
        r[0] = g4_ld_stream(c), r[1] = g4_ld_stream(c + 16), r[2] = g4_ld_stream(c + 32);
        const unsigned char *sc = row + (size_t)q.in * 3 / 4;
        r[3] = uint4();
        r[3].x = g4_ld_u32(sc + k / 16);
        r[3].y = g4_ld_u16(sc + (unsigned)q.in / 16 + 2 * (k / 256));
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) {
        const uint4 &v = r[j >> 2];
        const int jj = j & 3, sh = jj >= 2 ? 4 : 0, hs = 2 * (j >> 1);
        const unsigned a = g4_word(v, (jj & 1) * 2), b = g4_word(v, (jj & 1) * 2 + 1);
        const unsigned ha = g4_word(r[2], (j & 1) * 2), hb = g4_word(r[2], (j & 1) * 2 + 1);
        g4_bytes4(((a >> sh) & 0x0F0F0F0Fu) | (((ha >> hs) & 0x03030303u) << 4), 32.0f, f);
        g4_bytes4(((b >> sh) & 0x0F0F0F0Fu) | (((hb >> hs) & 0x03030303u) << 4), 32.0f, f + 4);
    }
    /* segment si (0..3) of 16 elements: d * scales[k/16 + si]; with int8 activations (si < 0) d alone, the scales
     * being integers of dot32 */
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &, int, int si, float *a, float *b) {
        const int sc = si < 0 ? 1 : (int)(signed char)((r[3].x >> (8 * si)) & 0xffu);
        *a = g4_h2f((uint16_t)(r[3].y & 0xffffu)) * (float)sc, *b = 0.0f;
    }
    /* block b (0, 1) of the access's 64 elements: sum over its halves of scale x sum((code - 32) * xq), all in
     * integers (|sum| < 2^24: 2 x 127 x 16 x 32 x 127); the codes of vals8 made signed bytes by __vsub4 */
    static __device__ __forceinline__ int dot32(const uint4 *r, int b, const uint4 &x0, const uint4 &x1) {
        const uint4 &v = r[b];
        const unsigned xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int half[2] = {0, 0};
#pragma unroll
        for (int jj = 0; jj < 4; jj++) { /* elements 8jj .. 8jj + 7 of the block (vals8's j = 4b + jj) */
            const int sh = jj >= 2 ? 4 : 0, hs = 4 * b + 2 * (jj >> 1);
            const unsigned a = g4_word(v, (jj & 1) * 2), c = g4_word(v, (jj & 1) * 2 + 1);
            const unsigned ha = g4_word(r[2], (jj & 1) * 2), hc = g4_word(r[2], (jj & 1) * 2 + 1);
            const unsigned ca = __vsub4(((a >> sh) & 0x0F0F0F0Fu) | (((ha >> hs) & 0x03030303u) << 4), 0x20202020u);
            const unsigned cc = __vsub4(((c >> sh) & 0x0F0F0F0Fu) | (((hc >> hs) & 0x03030303u) << 4), 0x20202020u);
            half[jj >> 1] = __dp4a((int)cc, (int)xs[2 * jj + 1], __dp4a((int)ca, (int)xs[2 * jj], half[jj >> 1]));
        }
        const int s0 = (int)(signed char)((r[3].x >> (16 * b)) & 0xffu), s1 = (int)(signed char)((r[3].x >> (16 * b + 8)) & 0xffu);
        return s0 * half[0] + s1 * half[1];
    }
};
static __device__ __forceinline__ void g4_mlx_pair(const uint4 &m, int sk, float *a, float *b) {
    if (sk == 2)
        *a = __uint_as_float(m.x), *b = __uint_as_float(m.y);
    else if (sk == 1)
        *a = g4_h2f((uint16_t)(m.x & 0xffffu)), *b = g4_h2f((uint16_t)(m.x >> 16));
    else
        *a = g4_bf2f((uint16_t)(m.x & 0xffffu)), *b = g4_bf2f((uint16_t)(m.x >> 16));
}
static __device__ __forceinline__ void g4_mlx_meta(const unsigned char *pairs, unsigned k, const g4c_qrow &q, uint4 *m) {
    const unsigned g = q.gshift >= 0 ? k >> q.gshift : k / (unsigned)q.group;
    *m = uint4();
    if (q.sk == 2) {
        const uint2 v = __ldg((const uint2 *)(pairs + 8 * (size_t)g));
        m->x = v.x, m->y = v.y;
    } else {
        m->x = g4_ld_u32(pairs + 4 * (size_t)g);
    }
}
template <> struct g4_qt<G4_MLX4> {
    enum { EPA = 32, QW = 1, SEG = 32, NEED_SUM = 1, I8 = 1, ZERO = 0, PERM = 1 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k / 2);
        g4_mlx_meta(row + (unsigned)q.in / 2, k, q, &r[1]);
    }
    /* LSB first: byte i holds elements 2i (low nibble) and 2i+1 */
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) {
        const unsigned u = g4_word(r[0], j);
        float lo[4], hi[4];
        g4_bytes4(u & 0x0F0F0F0Fu, 0.0f, lo);
        g4_bytes4((u >> 4) & 0x0F0F0F0Fu, 0.0f, hi);
        for (int i = 0; i < 4; i++) f[2 * i] = lo[i], f[2 * i + 1] = hi[i];
    }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &q, int, int, float *a, float *b) {
        g4_mlx_pair(r[1], q.sk, a, b);
    }
    /* sum of code * xq, the int8 inputs staged with PERM: per 8 elements the even ones, then the odd ones */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        uint4 xl, xh; /* word j of the codes: elements 8j.. (evens x word 2j, odds 2j+1) */
        xl.x = x0.x, xl.y = x0.z, xl.z = x1.x, xl.w = x1.z;
        xh.x = x0.y, xh.y = x0.w, xh.z = x1.y, xh.w = x1.w;
        return g4_dot_nib(r[0], xl, xh);
    }
};
template <> struct g4_qt<G4_MLX8> {
    enum { EPA = 32, QW = 2, SEG = 32, NEED_SUM = 1, I8 = 1, ZERO = -128, PERM = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, unsigned k, const g4c_qrow &q, uint4 *r) {
        r[0] = g4_ld_stream(row + k), r[1] = g4_ld_stream(row + k + 16);
        g4_mlx_meta(row + q.in, k, q, &r[2]);
    }
    static __device__ __forceinline__ void vals8(const uint4 *r, int j, float *f) {
        g4_bytes4(g4_word(r[j >> 1], (j & 1) * 2), 0.0f, f);
        g4_bytes4(g4_word(r[j >> 1], (j & 1) * 2 + 1), 0.0f, f + 4);
    }
    static __device__ __forceinline__ void seg(const uint4 *r, const g4c_qrow &q, int, int, float *a, float *b) {
        g4_mlx_pair(r[2], q.sk, a, b);
    }
    /* sum of (code - 128) * xq (the caller adds 128 * sum(xq): ZERO = -128) */
    static __device__ __forceinline__ int dot32(const uint4 *r, int, const uint4 &x0, const uint4 &x1) {
        const unsigned m = 0x80808080u;
        int s = __dp4a((int)(r[0].x ^ m), (int)x0.x, 0);
        s = __dp4a((int)(r[0].y ^ m), (int)x0.y, s), s = __dp4a((int)(r[0].z ^ m), (int)x0.z, s);
        s = __dp4a((int)(r[0].w ^ m), (int)x0.w, s), s = __dp4a((int)(r[1].x ^ m), (int)x1.x, s);
        s = __dp4a((int)(r[1].y ^ m), (int)x1.y, s), s = __dp4a((int)(r[1].z ^ m), (int)x1.z, s);
        return __dp4a((int)(r[1].w ^ m), (int)x1.w, s);
    }
};

/* Every weight type of the backend, for dispatching a template: X(G4_BF16) X(G4_F16) ... */
#define G4C_WEIGHT_TYPES(X) X(G4_BF16) X(G4_F16) X(G4_F32) G4C_QUANT_TYPES(X)

/* Word j of a 32-block's 4-bit codes in Q4_0's nibble order as the int8 values an int8 product takes (low nibbles:
 * elements 4j .. 4j + 3 into *lo, high nibbles: 16 + 4j .. into *hi): IQ4_NL / IQ4_XS and MXF4 through their
 * tables, the others code - ZERO with the Q5 types' fifth bits qh (bit i: element i; 0 for the others)
 * (experts_mmq_kernel, gemv_mmq_kernel) */
template <int DT>
static __device__ __forceinline__ void g4_s8_word(unsigned u, unsigned qh, int j, unsigned *lo, unsigned *hi) {
    if constexpr (DT == G4_IQ4_NL || DT == G4_IQ4_XS) g4_iq4_word(u, G4_IQ4_TABLE, lo, hi);
    else if constexpr (DT == G4_MXF4) g4_iq4_word(u, G4_FP4_TABLE, lo, hi);
    else g4_s8_nibbles<g4_qt<DT>::ZERO>(u, (qh >> (4 * j)) & 15u, (qh >> (16 + 4 * j)) & 15u, lo, hi);
}

/* The EPA weights of the access at element k (k a multiple of EPA) of a device row, scales applied. */
template <int DT> static __device__ __forceinline__ void g4_qdecode(const unsigned char *row, int k, const g4c_qrow &q,
                                                                  float *w) {
    typedef g4_qt<DT> T;
    uint4 r[T::QW + 1];
    T::load(row, k, q, r);
#pragma unroll
    for (int s = 0; s < T::EPA / T::SEG; s++) {
        float a, b;
        T::seg(r, q, k + s * T::SEG, s, &a, &b);
#pragma unroll
        for (int j = 0; j < T::SEG / 8; j++) {
            float f[8];
            T::vals8(r, s * (T::SEG / 8) + j, f);
#pragma unroll
            for (int i = 0; i < 8; i++) w[s * T::SEG + j * 8 + i] = fmaf(a, f[i], b);
        }
    }
}

/* Any weight type: EPA consecutive weights per access (8 for plain types: rows padded to 8; quantized: g4_qt). */
template <int DT, bool Q = (DT >= G4_Q4_0)> struct g4_wacc {
    enum { EPA = 8 };
    static __device__ __forceinline__ void decode(const unsigned char *row, int k, const g4c_qrow &, float *w) {
        g4_wload<DT>::load(row, k, w);
    }
};
template <int DT> struct g4_wacc<DT, true> {
    enum { EPA = g4_qt<DT>::EPA };
    static __device__ __forceinline__ void decode(const unsigned char *row, int k, const g4c_qrow &q, float *w) {
        g4_qdecode<DT>(row, k, q, w);
    }
};

/* Element of a KV cache row as f32. */
static __device__ __forceinline__ float g4_kv_get(const void *cache, size_t i, int kv_type) {
    if (kv_type == G4_KV_F32) return ((const float *)cache)[i];
    uint16_t h = ((const uint16_t *)cache)[i];
    return kv_type == G4_KV_BF16 ? g4_bf2f(h) : g4_h2f(h);
}
static __device__ __forceinline__ void g4_kv_put(void *cache, size_t i, float v, int kv_type) {
    if (kv_type == G4_KV_F32)
        ((float *)cache)[i] = v;
    else
        ((uint16_t *)cache)[i] = kv_type == G4_KV_BF16 ? g4_f2bf(v) : g4_f2h(v);
}

/* One head vector v[dim] per warp: optional RMSNorm (weight w or none), optional rotate-half RoPE with the
 * token's cos/sin row cs; the result goes to dst (may be v) and/or row cache_off of a KV cache (and then also to
 * the row `copy` of the cache's type, if any). */
static __device__ __forceinline__ void g4c_head_row(float *v, int dim, int norm, const float *w, float eps, const float *cs, float *dst,
                             void *cache, size_t cache_off, int kv_type, void *copy = NULL) {
    const int lane = threadIdx.x & 31, half = dim / 2;
    if ((dim & 63) == 0 && dim <= 512) { /* every load of the row, its weights and its cos/sin issued at once (one
                                           * round trip to L2 instead of one per pass: the decode attention's prep) */
        constexpr int MAXP = 8; /* pairs (k, k + half) a lane, k = lane + 32 i */
        const int np = half / 32;
        float a[MAXP], b[MAXP], wa[MAXP], wb[MAXP], co[MAXP], si[MAXP];
#pragma unroll
        for (int i = 0; i < MAXP; i++)
            if (i < np) {
                const int k = lane + 32 * i;
                a[i] = v[k], b[i] = v[k + half];
                wa[i] = norm && w ? w[k] : 1.0f, wb[i] = norm && w ? w[k + half] : 1.0f;
                co[i] = cs ? cs[k] : 1.0f, si[i] = cs ? cs[half + k] : 0.0f;
            }
        float inv = 1.0f;
        if (norm) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < MAXP; i++)
                if (i < np) s += a[i] * a[i] + b[i] * b[i];
            inv = rsqrtf(g4_warp_sum(s) / (float)dim + eps);
        }
#pragma unroll
        for (int i = 0; i < MAXP; i++)
            if (i < np) {
                const int k = lane + 32 * i;
                float x = a[i] * (inv * wa[i]), y = b[i] * (inv * wb[i]);
                if (cs) {
                    const float rx = x * co[i] - y * si[i], ry = y * co[i] + x * si[i];
                    x = rx, y = ry;
                }
                if (dst) dst[k] = x, dst[k + half] = y;
                if (cache) g4_kv_put(cache, cache_off + (size_t)k, x, kv_type),
                           g4_kv_put(cache, cache_off + (size_t)(k + half), y, kv_type);
                if (copy) g4_kv_put(copy, (size_t)k, x, kv_type), g4_kv_put(copy, (size_t)(k + half), y, kv_type);
            }
        __syncwarp();
        return;
    }
    float inv = 1.0f; /* (other sizes: loops kept small, this code sits in the decode attention's kernel) */
    if (norm) {
        float s = 0.0f;
#pragma unroll 1
        for (int i = lane; i < dim; i += 32) s += v[i] * v[i];
        inv = rsqrtf(g4_warp_sum(s) / (float)dim + eps);
    }
#pragma unroll 1
    for (int k = lane; k < half; k += 32) {
        float a = v[k], b = v[k + half];
        if (norm) {
            a *= inv * (w ? w[k] : 1.0f);
            b *= inv * (w ? w[k + half] : 1.0f);
        }
        if (cs) {
            const float co = cs[k], si = cs[half + k];
            const float ra = a * co - b * si, rb = b * co + a * si;
            a = ra, b = rb;
        }
        if (dst) dst[k] = a, dst[k + half] = b;
        if (cache) {
            g4_kv_put(cache, cache_off + (size_t)k, a, kv_type);
            g4_kv_put(cache, cache_off + (size_t)(k + half), b, kv_type);
        }
        if (copy) g4_kv_put(copy, (size_t)k, a, kv_type), g4_kv_put(copy, (size_t)(k + half), b, kv_type);
    }
    if (dim & 1) { /* odd dim: the last element has no rotation partner */
        if (lane == 0) {
            float a = v[dim - 1];
            if (norm) a *= inv * (w ? w[dim - 1] : 1.0f);
            if (dst) dst[dim - 1] = a;
            if (cache) g4_kv_put(cache, cache_off + (size_t)(dim - 1), a, kv_type);
            if (copy) g4_kv_put(copy, (size_t)(dim - 1), a, kv_type);
        }
    }
    __syncwarp();
}

/* ---------------------------------------------------------------- host side */
/* Bytes of a device row of `in` elements of dtype t: padded (with zeros) to a multiple of 8 elements, so
 * that 8-element loads stay inside the row and are 16-byte aligned. */
static inline size_t g4c_row_bytes(g4_dtype t, int64_t in) {
    return (size_t)((in + 7) & ~(int64_t)7) * (size_t)(g4_dtype_bits(t) / 8);
}

#define G4C_MAX_GRAPHS 64

typedef struct g4c_graph {
    const void *owner;
    uint64_t key;
    int seen;              /* steps run with this key (recorded at the second) */
    unsigned long used;    /* the backend's step count when last run (the least recently used goes when all are taken) */
    unsigned generation;   /* workspace generation it was recorded with */
    cudaGraphExec_t exec;  /* NULL until recorded */
} g4c_graph;

/* A device buffer that grows on demand (outside recordings; growing invalidates recordings). */
typedef struct g4c_buf {
    void *p;
    size_t cap;
} g4c_buf;

#define G4C_RESIDENT_MAX 64
struct g4c_wset { /* a block of device memory that holds a set's weights (cu_upload_weights) */
    unsigned char *base;
    size_t bytes;
    int live; /* its weights not yet released */
};

typedef struct g4c {
    struct g4c_wset *wsets; /* blocks of the sets' weights */
    int n_wsets;
    cudaStream_t stream;
    cudaDeviceProp prop;
    int n_sm;
    int pdl;              /* programmatic dependent launch on */
    cudaError_t error;    /* first error of the current step */
    char error_what[160];
    /* pinned staging for small host-to-device copies (reset at each sync) */
    unsigned char *staging;
    size_t staging_cap, staging_used;
    /* workspaces */
    g4c_buf ws_x16;       /* activations converted for tensor-core products */
    g4c_buf ws_gemm;      /* product outputs before their epilogue */
    g4c_buf ws_fold;      /* a product of stacked hi and lo activation rows, before its two halves are added */
    g4c_buf ws_attn;      /* attention split partials */
    g4c_buf ws_moe;       /* MoE routing and expert activations */
    g4c_buf ws_deq;       /* quantized weights decoded to bf16 for prefill products */
    g4c_buf ws_grp, ws_map; /* pointer arrays of batched products, row maps (g4c_gemm_experts) */
    g4c_buf ws_pad;       /* the experts' outputs at padded rows (g4c_gemm_experts) */
    g4c_buf ws_tiles;     /* row tiles of the experts' int8 products (cuda_moe.cu, mmq_tiles) */
    g4c_buf ws_rows;      /* rows of a host table as stored (g4c_rows_to_device) */
    float *host_rows;     /* rows of a host table widened on the host (g4c_rows_to_device, other dtypes) */
    size_t host_rows_cap;
    int *counters;        /* zeroed counters the "last block finishes" kernels use */
    size_t n_counters;
    unsigned generation;  /* bumped when a workspace moves */
    void *blas;           /* cublasHandle_t (NULL in the emulator) */
    void *blas_ws;
    int fold_tokens;      /* the most tokens whose hi and lo rows are one stacked product (cuda_blas.cu) */
    int gemm_split;       /* 1: activations as bf16 hi + lo parts (about f32 accuracy, twice the products) */
    int qgemm_split;      /* prefill products of quantized weights as hi + lo parts on both sides (cuda_blas.cu) */
    struct { /* blocks of a kernel (with so much dynamic shared memory) resident on a multiprocessor */
        const void *kernel;
        size_t smem;
        int blocks;
    } resident[G4C_RESIDENT_MAX];
    int n_resident;
    int float_act;        /* G4_NO_INT8_ACT set: one-token products of Q8_0/Q4_0/MLX weights with float activations
                           * (exact products of the stored weights, for comparisons) */
    size_t gemv_smem;     /* staged GEMV inputs per block: 96 KB (G4_CUDA_GEMV_SMEM_KB=8..96) */
    int gemv_balance;     /* GEMV: rows spread evenly over the multiprocessors (1; G4_CUDA_GEMV_BALANCE=0: off) */
    int att_tc;           /* prefill attention on tensor cores (1; G4_CUDA_ATT_TC=0: the per-token kernel) */
    int att_early;        /* decode attention lets the next kernel launch right after its wait (1; G4_CUDA_ATT_EARLY=0: at its end) */
    cudaStream_t side, main_stream; /* a side branch (g4c_fork), where fork_ok */
    int fork_ok;
    cudaEvent_t ev_fork, ev_join;
    int moe_fork;         /* MoE block: the dense MLP beside the routing and experts (1; G4_CUDA_MOE_FORK=0: after) */
    int moe_tc_tokens;    /* MoE block: the experts' tensor-core kernels up to this many tokens a step, bf16 experts
                           * (cuda_moe.cu; 192; G4_CUDA_MOE_TC=0: the f32 kernels up to 8 tokens, cuBLAS from 9 on).
                           * H200, 26B-A4B, output tok/s against cuBLAS: 100 sequences +7%, 200 +1%, 256 -4% (an
                           * expert's tokens past 16 take another pass over its weights) */
    int att_min_keys;     /* decode attention: keys a split-K block takes at least (8; G4_CUDA_ATT_MIN_KEYS=1..512) */
    int gemv_tc_min;      /* bf16 products of gemv_tc_min .. G4C_GEMV_MAX tokens on tensor cores (cuda_gemv.cu,
                           * gemv_tc; G4_CUDA_GEMV_TC=N, 0: off; default 3: H200, E2B, a step of 2 tokens 3.49 ms
                           * against 2.81 on the GEMV's tile, of 3 tokens 3.49 against 3.93) */
    int gemv_mmq_min;     /* the same for the quantized types of gemv_mmq (int8 tensor cores; G4_CUDA_GEMV_MMQ=N;
                           * default 5: H100, E2B Q4_0, a step of 4 tokens 3.19 ms against 2.86 on the GEMV's tile
                           * of 4, of 5 tokens 3.22 against 4.04 on the tile of 8) */
    int mmq_dense_max;    /* ... and of 9 .. mmq_dense_max tokens (up to 32) instead of bf16 tiles through cuBLAS
                           * (G4_CUDA_MMQ_DENSE=N, 0: off; default 24: H100, recorded steps, E2B Q4_0 12 tokens 4.18
                           * ms against 5.63, 24: 5.56 against 5.74, 32: 6.13 against 5.78; E4B Q4_0 24 tokens 9.45
                           * against 10.30, 32: 10.50 against 10.30) */
    int gemv_cap;         /* one-tile GEMVs: at most this many blocks a multiprocessor, each looping over row groups
                           * (so each block stages its inputs once; 4; G4_CUDA_GEMV_CAP=1..8) */
    int gemv_lanes;       /* GEMV: lanes per row group at least (8; G4_CUDA_GEMV_LANES=8, 16 or 32) */
    int gemv_lane_acc;    /* GEMV: a row's accesses a lane at most for fewer lanes a row (0: 3 x the unroll;
                           * G4_CUDA_GEMV_LANE_ACC=1..64) */
    int gemv_blocks_per_sm; /* GEMV warps per row grow until rows x warps fill this many times 8 warps a
                             * multiprocessor (G4_CUDA_GEMV_BLOCKS=1..8; 0: 2 for float weights, 1 for quantized) */
    void **retired;       /* workspaces replaced while recording (freed with the backend) */
    int n_retired;
    /* recordings */
    int graphs_on;
    g4c_graph graphs[G4C_MAX_GRAPHS];
    int n_graphs;
    unsigned long graph_clock; /* steps that asked for a recording */
    g4c_graph *recording; /* capture under way */
    int capturing;
    int in_graph_step;    /* the ops run for a recording (or its warm-up): size work for any step of the shape */
    struct g4c_profile *profile; /* G4_CUDA_PROFILE=1: time of every kernel (steps run eagerly) */
    struct g4c_step_time *step_time; /* G4_CUDA_STEP_TIME=1: where the time of replayed steps goes (cuda_backend.cu) */
#ifdef G4_CUDA_TRACE
    const void *trace_k[4096]; /* the kernels of the last recording, in order */
    int trace_nk;
#endif
} g4c;

/* Profiling (cuda_backend.cu): an event before and after each launch, summed per kernel at each sync and
 * printed when the backend is freed; library calls (cuBLAS) are summed under a key and a name of their own. */
void g4c_profile_begin(g4c *c);
void g4c_profile_end(g4c *c, const void *kernel);
void g4c_profile_end_named(g4c *c, const void *key, const char *name);

static inline g4c *g4c_of(g4_backend *be) { return (g4c *)be->impl; }

/* Copies host memory to the GPU in stream order (through the pinned staging when it has room; else returns once
 * the source is read). */
void g4c_copy_to_device(g4c *c, void *dst, const void *src, size_t bytes);
/* bytes of the pinned staging for this step's copies to the GPU (free again after the next sync), or NULL where it
 * has no room left */
unsigned char *g4c_staging_take(g4c *c, size_t bytes);

/* rows_to_device (backend.h) */
void g4c_rows_to_device(g4_backend *be, float *dst, const g4_tensor *table, const int32_t *ids, int n, float scale);

/* Records the first error of a step (the step's check() reports it). */
void g4c_note(g4c *c, cudaError_t e, const char *what);
#define G4C_CHECK_LAUNCH(c, what) g4c_note((c), cudaGetLastError(), (what))

/* Returns a workspace of at least `bytes` (NULL after noting an error). */
void *g4c_ws(g4c *c, g4c_buf *b, size_t bytes);

/* Launches kernel k on the backend's stream with programmatic dependent launch. */
#ifdef G4_CUDA_EMU
template <typename... KArgs, typename... Args>
static void g4c_launch(g4c *c, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
    (void)c;
    g4emu_launch(grid, block, smem, [&]() { k(((KArgs)args)...); });
}
#else
template <typename... KArgs, typename... Args>
static void g4c_launch(g4c *c, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = c->pdl ? 1 : 0;
    if (c->profile) g4c_profile_begin(c);
#ifdef G4_CUDA_TRACE
    if (c->capturing && c->trace_nk < 4096) c->trace_k[c->trace_nk++] = (const void *)k;
#endif
    g4c_note(c, cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...), "kernel launch");
    if (c->profile) g4c_profile_end(c, (const void *)k);
}
#endif

/* A side branch of the launches (cuda_moe.cu: the dense MLP beside the routing and the experts): after g4c_fork the
 * launches go to a second stream that starts once everything issued so far is done; after g4c_fork_end to the main
 * stream again, which does not wait for them until g4c_join. A recording captures both streams: the side branch
 * becomes a parallel branch of the step's graph. cuBLAS stays on the main stream: GEMV launches only. */
static inline void g4c_fork(g4c *c) {
    g4c_note(c, cudaEventRecord(c->ev_fork, c->stream), "branch");
    g4c_note(c, cudaStreamWaitEvent(c->side, c->ev_fork, 0), "branch");
    c->main_stream = c->stream, c->stream = c->side;
}
static inline void g4c_fork_end(g4c *c) {
    g4c_note(c, cudaEventRecord(c->ev_join, c->side), "branch");
    c->stream = c->main_stream;
}
static inline void g4c_join(g4c *c) { g4c_note(c, cudaStreamWaitEvent(c->stream, c->ev_join, 0), "branch"); }

/* Lets kernel k use as much dynamic shared memory as the device allows a block (beside its static shared
 * memory); called once at start, not while a step is recorded. A failure is noted (launches above 48 KB
 * would then fail). */
template <typename F> static void g4c_allow_smem(g4c *c, F k) {
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, k);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)c->prop.sharedMemPerBlockOptin - (int)fa.sharedSizeBytes);
    g4c_note(c, e, "allowing a kernel more shared memory");
}

/* ---------------------------------------------------------------- entry points of each file */
/* cuda_gemv.cu */
void g4c_matmul_set(g4_backend *be, const float *x, int n, const g4_matmul_set *set);
void g4c_matmul(g4_backend *be, const float *x, int n, const g4_tensor *w, const float *bias, float *y);
int g4c_gemv_max_tokens(void);
/* The experts' products of a MoE block for one token, through the GEMV (cuda_gemv.cu), for the `slots` experts
 * ex[s] (device memory): gate/up pairs when pair is NULL, y[s * rows + c] = gelu(gate_c . x') * (up_c . x') with
 * x' = rmsnorm(x) * norm (w [E, 2 rows, in] with the up rows after the gate rows, or w and up [E, rows, in]);
 * else down rows, y[pair[s] * rows + i] = pw[pair[s]] * (w_i . x[s]) (w [E, rows, in], x [slots, in]).
 * Only where g4c_gemv_experts_fit(w, rows of x) (its input fits one staged tile). */
int g4c_gemv_experts_fit(g4c *c, const g4_tensor *w, int x_rows);
void g4c_gemv_experts(g4c *c, const g4_tensor *w, const g4_tensor *up, int rows, const int32_t *ex, int slots,
                      const float *x, const float *norm, float eps, const int32_t *pair, const float *pw, float *y);
/* y[n, out] = (x' W^T) * scale with x' = rmsnorm(x) * norm (norm may be NULL): the MoE router's logits; pro (or
 * NULL): a set whose residual prologue (res_*) is done first, x then res_out (at most g4c_gemv_max_tokens()) */
void g4c_matmul_scaled(g4c *c, const float *x, int n, const g4_tensor *w, const float *norm, float eps, float scale,
                       float *y, const g4_matmul_set *pro);
/* cuda_blas.cu: products of many tokens on tensor cores. g4c_gemm_input prepares x' = x or rmsnorm(x) * norm
 * [n, in] for weights of dtype t (16-bit copies: bf16, or bf16 hi + lo parts in the precise mode; f32 as it is);
 * g4c_gemm_run computes y[n, out] = x' W^T (f32). With res (a set with a residual prologue, res_out set), x is
 * first updated as that prologue does, (res_h + rmsnorm(res_o) res_w) res_scale into res_out, in the same launch. */
typedef struct g4c_gemm_in {
    const void *hi, *lo; /* lo NULL unless split */
    int n, in;
    g4_dtype t;
    int pairs; /* each row's lo right after its hi (lo = hi + in: rows 2 in apart), for g4c_gemm_experts only */
} g4c_gemm_in;
int g4c_gemm_input(g4c *c, const float *x, int n, int in, const float *norm, float eps, g4_dtype t, g4c_gemm_in *out,
                   const g4_matmul_set *res);
/* The same with each row's hi and lo parts next to each other (pairs), where they are split: the experts' products
 * then read their rows' two parts as one block of rows, and their weights once (g4c_gemm_experts). */
int g4c_gemm_input_pairs(g4c *c, const float *x, int n, int in, const float *norm, float eps, g4_dtype t,
                         g4c_gemm_in *out);
void g4c_gemm_run(g4c *c, const g4c_gemm_in *x, const g4_tensor *w, float *y);
/* ... with output rows ldc floats apart; rows r0 .. r0+n-1 of a converted input */
void g4c_gemm_run_ld(g4c *c, const g4c_gemm_in *x, const g4_tensor *w, float *y, int ldc);
/* The products of a mixture's active experts (prefill): for i < na, rows act_off[i] .. + act_cnt[i] of the converted
 * input (g4c_gemm_input) times expert act_e[i] of w [E, R, in] (experts ascending, rows consecutive) into y (rows
 * ldc apart, from row act_off[i]): a batched tensor-core call for each padded row count (quantized experts decoded to
 * bf16 a run at a time) instead of a call an expert. Host arrays. */
void g4c_gemm_experts(g4c *c, const g4c_gemm_in *x, const g4_tensor *w, int na, const int32_t *act_e,
                      const int32_t *act_off, const int32_t *act_cnt, float *y, int ldc);
g4c_gemm_in g4c_gemm_in_rows(const g4c_gemm_in *x, int r0, int n);
/* The products of a set's plain 16-bit weights w[0 .. count) with an input whose hi and lo rows are stacked (at most
 * c->fold_tokens tokens): row t of y2[i] (a workspace, rows ld[i] floats apart) gets the hi row's product, row n + t
 * the lo row's, their halves not yet added (the caller's epilogue adds them). Weights that lie one after another in
 * memory (the backend places a set's weights so, g4c_weight_alloc) are one product: their outputs are columns of one
 * [2n, ld] block. Returns 1, 0 where the set does not take that form (nothing ran), -1 out of memory. */
int g4c_gemm_set_stacked(g4c *c, const g4c_gemm_in *x, const g4_tensor *const *w, int count, float **y2, int *ld);
/* Stacked products finished in one launch (g4c_gemm_fold): each output's hi and lo halves added, then a set's
 * epilogue (bias; a pair: y0 = gelu(gate + b0) (up + b1), its up not written; gelu(y) mul; softcap), written to y[i]
 * (rows ldy[i] floats apart, 0: out[i]) or, with acc, added to it. */
typedef struct g4c_fold_args {
    const float *y2[G4_MATMUL_SET_MAX]; /* product i's hi rows, its lo rows n rows further; rows ld[i] floats apart */
    int ld[G4_MATMUL_SET_MAX];
    float *y[G4_MATMUL_SET_MAX];
    int ldy[G4_MATMUL_SET_MAX];
    const float *bias[G4_MATMUL_SET_MAX];
    size_t end[G4_MATMUL_SET_MAX]; /* the products' outputs as one index range: product i ends at end[i] (set by
                                    * g4c_gemm_fold) */
    int out[G4_MATMUL_SET_MAX];
    int count, n, geglu; /* geglu: 0, 1 a pair (count 2, one range), 2 against mul [n, out[0]] */
    const float *mul;
    float softcap;
    int acc;
} g4c_fold_args;
void g4c_gemm_fold(g4c *c, g4c_fold_args *f);
int g4c_blas_init(g4c *c, g4_error *err);
void g4c_blas_free(g4c *c);
/* cuda_attention.cu */
void g4c_attention_init(g4c *c);
void g4c_attn_prep(g4_backend *be, const g4_attn_prep_args *a);
void g4c_attention(g4_backend *be, const g4_attention_args *a);
void g4c_kv_store(g4_backend *be, const float *k, const float *v, int n, int row, const int32_t *slot, void *k_cache,
                  void *v_cache, g4_kv_type kv_type);
/* cuda_moe.cu */
void g4c_moe_init(g4c *c);
void g4c_gemv_init(g4c *c); /* GEMV kernels may use c->gemv_smem bytes of dynamic shared memory */
void g4c_moe(g4_backend *be, const g4_moe_args *a);
/* rows of x as int8 blocks of 32 (d = max|v| / 127, q = rint(v / d), v = rmsnorm(x) * norm, or x without a norm):
 * codes xq [n, in], (d, sum of q) xd [n, in / 32]; in % 32 == 0. With res (a set whose res_out is set) the rows are
 * res's residual prologue, (res_h + rmsnorm(res_o) res_w) res_scale, written to res_out first (x unused). */
void g4c_q8_rows(g4c *c, const float *x, int n, int in, const float *norm, float eps, const g4_matmul_set *res,
                 signed char *xq, float2 *xd);
/* cuda_misc.cu: the small ops */
void g4c_embed(g4_backend *be, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out);
void g4c_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y);
void g4c_post_norm_add(g4_backend *be, float *h, const float *o, const float *w, int rows, int dim, float eps, float s);
/* out = (h + rmsnorm(o) * w) * s per row (out may be h) */
void g4c_residual(g4c *c, const float *h, const float *o, const float *w, int rows, int dim, float eps, float s,
                  float *out);
void g4c_rope_table(g4_backend *be, const int32_t *pos, int n, const float *inv_freq, int half, float *table);
void g4c_rope(g4_backend *be, float *x, int n, int heads, int dim, const float *table);
void g4c_head_norm_rope(g4_backend *be, float *x, int n, int heads, int dim, const float *w, float eps,
                        const float *table);
void g4c_gelu_mul(g4_backend *be, const float *g, const float *u, size_t n, float *y);
void g4c_add(g4_backend *be, float *y, const float *x, size_t n);
void g4c_scale(g4_backend *be, float *y, size_t n, float s);
void g4c_mul(g4_backend *be, float *y, const float *x, size_t n);
void g4c_add_scale(g4_backend *be, float *y, const float *x, size_t n, float s);
void g4c_softcap(g4_backend *be, float *y, size_t n, float c);
void g4c_get_rows(g4_backend *be, const float *src, const int32_t *idx, int n, int row, float *dst);
void g4c_transpose(g4_backend *be, const float *src, int na, int nb, int c, float *dst);
void g4c_argmax(g4_backend *be, const float *x, int rows, int n, int32_t *out);
void g4c_top_k(g4_backend *be, const float *x, int rows, int n, int k, int cap, int32_t *ids, float *vals,
               int32_t *count);
void g4c_masked_logits(g4_backend *be, const float *x, const float *scores, int rows, int n_groups, int top_k,
                       const int32_t *ordering, const g4_tensor *table, float *out);
/* cuda_towers.cu: the ops of the towers */
void g4c_towers_init(g4c *c);
void g4c_attention_dense(g4_backend *be, const g4_dense_attention_args *a);
void g4c_local_attention(g4_backend *be, const g4_local_attention_args *a);
void g4c_clamp(g4_backend *be, const float *x, float *y, size_t n, float lo, float hi);
void g4c_shift_scale_cols(g4_backend *be, float *y, int rows, int cols, const float *shift, const float *scale);
void g4c_gather_sum(g4_backend *be, const float *src, const int32_t *idx, int n, int k, int row, float s, float *dst);
void g4c_sigmoid_mul(g4_backend *be, const float *a, const float *b, size_t n, float *y);
void g4c_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
                   float *y);
void g4c_im2col(g4_backend *be, const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                int nrows, float *out);
void g4c_conv1d_causal_dw(g4_backend *be, const float *x, const float *w, int n, int c, int k, float *y);
void g4c_fill_random(g4c *c, void *dst, g4_dtype t, int64_t rows, int64_t in, size_t row_bytes, uint64_t seed);
/* cuda_quant.cu: quantized weights (upload, random packed blocks, rows decoded to bf16, embeddings, row dots);
 * g4c_upload_quant: 0, -1 on errors, -2 where a row could not be re-encoded as `held` */
int g4c_upload_quant(g4c *c, const g4_tensor *src, g4_dtype held, void *d, int64_t rows, size_t row_bytes,
                     g4_error *err);
void g4c_fill_random_quant(g4c *c, void *dst, const g4_tensor *t, int64_t rows, size_t row_bytes, uint64_t seed);
void g4c_dequant_bf16(g4c *c, const g4_tensor *w, int64_t r0, int m, uint16_t *out, uint16_t *lo);
void g4c_embed_quant(g4c *c, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out);

#endif
