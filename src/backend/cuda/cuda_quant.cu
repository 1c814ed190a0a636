/* Quantized weights on the GPU (src/backend/backend.h: upload_weight; core/quant.h for the file layouts,
 * cuda_common.cuh for the device layouts and the decoders g4_qt): the repacking at upload, random packed
 * weights for benchmarks (g4c_fill_random), rows decoded to bf16 tiles for the prefill products
 * (g4c_dequant_bf16: bf16, or bf16 hi + lo parts) and embedding rows of a quantized table (g4c_embed).
 *
 * Repacking keeps the bytes of every block (no weight is decoded): codes are moved into runs a lane reads
 * with 16-byte loads, and the scales of a row follow its codes. MLX 2/3/5/6-bit codes are widened to MLX4 / MLX8.
 * Another type without kernels here is first moved into one that has them (g4c_held_dtype: CB4, CB4_16, Q6_K, MLX4
 * or MLX8 exactly where they hold it, else re-encoded as Q8_0), row by row on the host (g4c_upload_quant). */
#include "backend/cuda/cuda_common.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "core/quant.h"
}

/* ---------------------------------------------------------------- repacking (host) */
static void put16(unsigned char *p, const unsigned char *q) { p[0] = q[0], p[1] = q[1]; }

/* 32 values < 16 in element order -> 16 bytes in Q4_0 order (byte i = v[i] | v[i+16] << 4) */
static void nib32(const unsigned char *v, unsigned char *out) {
    for (int i = 0; i < 16; i++) out[i] = (unsigned char)(v[i] | v[i + 16] << 4);
}

/* Device row `dst` (g4c_qrow_bytes of type held, zeroed by the caller) from row r of the host tensor t, of type
 * held or (MLX) of as many bits or fewer (MLX 2/3 as MLX4, 5/6 as MLX8: each code widened, LSB first as MLX packs). */
static void repack_row(const g4_tensor *t, int64_t r, g4_dtype held, unsigned char *dst) {
    const int64_t in = t->shape[t->ndim - 1];
    if (g4_dtype_is_mlx(t->dtype)) {
        const int bits = g4_mlx_bits(t->dtype), to = g4_mlx_bits(held), ng = (int)(in / t->group);
        const size_t cb = (size_t)in * (size_t)to / 8, ss = t->scale_dtype == G4_F32 ? 4 : 2;
        const unsigned char *codes = (const unsigned char *)t->data + (size_t)r * ((size_t)in * (size_t)bits / 8);
        if (to == bits)
            memcpy(dst, codes, cb);
        else
            g4_transcode_row(t, r, held, dst, NULL); /* (the codes widened) */
        const unsigned char *sc = (const unsigned char *)t->scales + (size_t)r * (size_t)ng * ss;
        const unsigned char *bi = (const unsigned char *)t->biases + (size_t)r * (size_t)ng * ss;
        for (int g = 0; g < ng; g++) {
            memcpy(dst + cb + (size_t)g * 2 * ss, sc + (size_t)g * ss, ss);
            memcpy(dst + cb + (size_t)g * 2 * ss + ss, bi + (size_t)g * ss, ss);
        }
        return;
    }
    const unsigned char *src = g4_tensor_row(t, r);
    const int64_t nb32 = in / 32, nb256 = in / 256;
    switch (t->dtype) {
    case G4_Q8_0:
        for (int64_t b = 0; b < nb32; b++) {
            memcpy(dst + 32 * b, src + 34 * b + 2, 32);
            put16(dst + in + 2 * b, src + 34 * b);
        }
        break;
    case G4_Q4_0:
    case G4_IQ4_NL:
    case G4_MXF4: /* (the same block: d, qs[16]) */
        for (int64_t b = 0; b < nb32; b++) {
            memcpy(dst + 16 * b, src + 18 * b + 2, 16);
            put16(dst + in / 2 + 2 * b, src + 18 * b);
        }
        break;
    case G4_Q5_0: /* d, qh[4], qs[16] a block: qs as Q4_0's codes, qh as the block's word of fifth bits */
        for (int64_t b = 0; b < nb32; b++) {
            memcpy(dst + 16 * b, src + 22 * b + 6, 16);
            memcpy(dst + in / 2 + 4 * b, src + 22 * b + 2, 4);
            put16(dst + in / 2 + in / 8 + 2 * b, src + 22 * b);
        }
        break;
    case G4_IQ4_XS: /* d, scales_h, scales_l[4], qs[128] (sub-block i's 16 bytes at 16 i, Q4_0's order) */
        for (int64_t b = 0; b < nb256; b++) {
            memcpy(dst + 128 * b, src + 136 * b + 8, 128);
            memcpy(dst + in / 2 + 8 * b, src + 136 * b, 8);
        }
        break;
    case G4_CB4: /* values[16], then IQ4_XS's block: the codes as IQ4_XS's, the tables, then d, scales_h, scales_l[4] */
        for (int64_t b = 0; b < nb256; b++) {
            memcpy(dst + 128 * b, src + 152 * b + 24, 128);
            memcpy(dst + in / 2 + 16 * b, src + 152 * b, 16);
            memcpy(dst + in / 2 + 16 * nb256 + 8 * b, src + 152 * b + 16, 8);
        }
        break;
    case G4_CB4_16: /* values[16], d, scales[16], qs[128]: the codes as CB4's, the tables, the scales, then d */
        for (int64_t b = 0; b < nb256; b++) {
            memcpy(dst + 128 * b, src + 162 * b + 34, 128);
            memcpy(dst + in / 2 + 16 * b, src + 162 * b, 16);
            memcpy(dst + in / 2 + 16 * nb256 + 16 * b, src + 162 * b + 18, 16);
            put16(dst + in / 2 + 16 * nb256 + in / 16 + 2 * b, src + 162 * b + 16);
        }
        break;
    case G4_Q5_K: /* d, dmin, scales[12], qh[32], qs[128]: sub-block s's element l is the s & 1 nibble of
                   * qs[32 (s / 2) + l] with bit s of qh[l] as its fifth bit */
        for (int64_t b = 0; b < nb256; b++) {
            const unsigned char *blk = src + 176 * b, *qh = blk + 16, *qs = blk + 48;
            memcpy(dst + in / 2 + in / 8 + 16 * b, blk, 16);
            for (int s = 0; s < 8; s++) {
                unsigned char v[32];
                uint32_t hb = 0;
                for (int l = 0; l < 32; l++) {
                    v[l] = (unsigned char)(s & 1 ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 15);
                    hb |= (uint32_t)((qh[l] >> s) & 1) << l;
                }
                nib32(v, dst + 128 * b + 16 * s);
                memcpy(dst + in / 2 + 32 * b + 4 * s, &hb, 4); /* (little-endian: bit l in byte l / 8) */
            }
        }
        break;
    case G4_Q2_K: /* scales[16], qs[64], d, dmin: element 128h + 32i + l is bits 2i of qs[32h + l]; on the device
                   * element 64g + 16j + t (of the block) is bits 2j of byte 16g + t */
        for (int64_t b = 0; b < nb256; b++) {
            const unsigned char *blk = src + 84 * b;
            unsigned char *codes = dst + 64 * b;
            memset(codes, 0, 64);
            for (int e = 0; e < 256; e++) {
                const int h = e / 128, i = (e % 128) / 32, l = e % 32;
                codes[16 * (e / 64) + e % 16] |= (unsigned char)(((blk[16 + 32 * h + l] >> (2 * i)) & 3) << (2 * ((e % 64) / 16)));
            }
            memcpy(dst + in / 4 + 16 * b, blk, 16);
            memcpy(dst + in / 4 + in / 16 + 4 * b, blk + 80, 4);
        }
        break;
    case G4_Q4_K:
        for (int64_t b = 0; b < nb256; b++) {
            const unsigned char *blk = src + 144 * b, *qs = blk + 16;
            memcpy(dst + in / 2 + 16 * b, blk, 16); /* d, dmin, scales[12] */
            for (int s = 0; s < 8; s++) {           /* sub-block s: nibbles of qs[32 (s/2) + l], low for even s */
                unsigned char v[32];
                for (int l = 0; l < 32; l++) v[l] = (unsigned char)(s & 1 ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 15);
                nib32(v, dst + 128 * b + 16 * s);
            }
        }
        break;
    case G4_Q6_K:
        for (int64_t b = 0; b < nb256; b++) {
            const unsigned char *blk = src + 210 * b;
            unsigned char q[256];
            for (int h = 0; h < 2; h++) {
                const unsigned char *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                for (int l = 0; l < 32; l++) {
                    q[128 * h + l] = (unsigned char)((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
                    q[128 * h + l + 32] = (unsigned char)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
                    q[128 * h + l + 64] = (unsigned char)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                    q[128 * h + l + 96] = (unsigned char)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
                }
            }
            for (int u = 0; u < 4; u++) { /* 64 elements: two nibble runs, then the high bits */
                unsigned char *o = dst + 192 * b + 48 * u, lo[64];
                const unsigned char *v = q + 64 * u;
                for (int e = 0; e < 64; e++) lo[e] = v[e] & 15;
                nib32(lo, o), nib32(lo + 32, o + 16);
                for (int j = 0; j < 16; j++)
                    o[32 + j] = (unsigned char)((v[j] >> 4) | (v[j + 16] >> 4) << 2 | (v[j + 32] >> 4) << 4 |
                                                (v[j + 48] >> 4) << 6);
            }
            memcpy(dst + in * 3 / 4 + 16 * b, blk + 192, 16);
            put16(dst + in * 3 / 4 + in / 16 + 2 * b, blk + 208);
        }
        break;
    default: break;
    }
}

/* Rows [r0, r1) of src into buf (row r at (r - r0) * row_bytes, zeroed), as type `held`: repacked, after a
 * re-encoding (g4_transcode_row into a file-layout row of the held type) where held is another type. */
typedef struct {
    const g4_tensor *src;
    g4_dtype held;
    int64_t r0, r1;
    size_t row_bytes;
    unsigned char *buf;
    int failed;
} repack_part;

static void *repack_rows(void *arg) {
    repack_part *p = (repack_part *)arg;
    const g4_tensor *src = p->src;
    const int64_t in = src->shape[src->ndim - 1];
    if (p->held == src->dtype || g4_dtype_is_mlx(src->dtype)) { /* (MLX: held as MLX, widened in repack_row) */
        for (int64_t r = p->r0; r < p->r1; r++)
            repack_row(src, r, p->held, p->buf + (size_t)(r - p->r0) * p->row_bytes);
        return NULL;
    }
    const int as_mlx = g4_dtype_is_mlx(p->held); /* (a GGUF type held as MLX: g4_transcode_row_mlx) */
    unsigned char *row = (unsigned char *)malloc(as_mlx ? (size_t)in : g4_dtype_row_bytes(p->held, in));
    float *tmp = (float *)malloc((size_t)in * sizeof(float)), *bias = (float *)malloc((size_t)in / 32 * sizeof(float));
    g4_tensor one; /* the re-encoded row, as a one-row tensor of the held type */
    memset(&one, 0, sizeof one);
    one.name = src->name, one.dtype = p->held, one.ndim = 2, one.shape[0] = 1, one.shape[1] = in, one.data = row;
    if (as_mlx) one.scales = tmp, one.biases = bias, one.scale_dtype = G4_F32, one.group = 32;
    if (!row || !tmp || !bias) p->failed = 2;
    for (int64_t r = p->r0; !p->failed && r < p->r1; r++) {
        if (as_mlx ? g4_transcode_row_mlx(src, r, p->held, row, tmp, bias) : g4_transcode_row(src, r, p->held, row, tmp))
            repack_row(&one, 0, p->held, p->buf + (size_t)(r - p->r0) * p->row_bytes);
        else
            p->failed = 1;
    }
    free(row), free(tmp), free(bias);
    return NULL;
}

/* Copies src (a quantized host tensor) into device memory d of rows x row_bytes as type `held` (g4c_held_dtype),
 * repacked: the one place a weight changes type. A chunk of rows (64 MB) at a time, its rows split among up to 16
 * host threads (re-encoding a row costs 1 to 8 ns a weight on one core: a 26B Q5_K_M file's 20G Q5_K weights take
 * minutes on one); nothing holds more than a chunk. */
#define UPLOAD_THREADS 16
int g4c_upload_quant(g4c *c, const g4_tensor *src, g4_dtype held, void *d, int64_t rows, size_t row_bytes,
                     g4_error *err) {
    const size_t chunk_rows = (size_t)((64u << 20) / row_bytes) > 0 ? (size_t)((64u << 20) / row_bytes) : 1;
    const size_t n = chunk_rows < (size_t)rows ? chunk_rows : (size_t)rows;
    unsigned char *buf = (unsigned char *)malloc(n * row_bytes);
    if (!buf) return g4_fail(err, "out of memory repacking '%s'", src->name);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int max_threads = cores > UPLOAD_THREADS ? UPLOAD_THREADS : cores > 1 ? (int)cores : 1;
    for (int64_t r0 = 0; r0 < rows; r0 += (int64_t)n) {
        const int64_t m = rows - r0 < (int64_t)n ? rows - r0 : (int64_t)n;
        memset(buf, 0, (size_t)m * row_bytes);
        /* parts of at least 64 rows; part 0 on this thread, and any part whose thread did not start */
        const int np = (int)(m / 64 < max_threads ? (m / 64 > 1 ? m / 64 : 1) : max_threads);
        repack_part parts[UPLOAD_THREADS];
        pthread_t th[UPLOAD_THREADS];
        int started[UPLOAD_THREADS] = {0}, failed = 0;
        for (int i = 0; i < np; i++) {
            const int64_t a = m * i / np, b = m * (i + 1) / np;
            parts[i].src = src, parts[i].held = held, parts[i].r0 = r0 + a, parts[i].r1 = r0 + b;
            parts[i].row_bytes = row_bytes, parts[i].buf = buf + (size_t)a * row_bytes, parts[i].failed = 0;
            if (i > 0) started[i] = pthread_create(&th[i], NULL, repack_rows, &parts[i]) == 0;
        }
        for (int i = 0; i < np; i++)
            if (!started[i]) repack_rows(&parts[i]);
        for (int i = 0; i < np; i++) {
            if (started[i]) pthread_join(th[i], NULL);
            failed |= parts[i].failed;
        }
        if (failed) {
            free(buf);
            if (failed & 2) return g4_fail(err, "out of memory repacking '%s'", src->name);
            g4_fail(err, "tensor '%s': cannot re-encode %s rows of %lld as %s", src->name, g4_dtype_name(src->dtype),
                    (long long)src->shape[src->ndim - 1], g4_dtype_name(held));
            return -2;
        }
        /* on the backend's stream, and waited for: a plain cudaMemcpy from pageable memory may return before its DMA
         * lands (CUDA runtime, API synchronization behavior), on the legacy stream, which the backend's non-blocking
         * stream does not wait for: a product launched right after could read stale weights */
        cudaError_t e = cudaMemcpyAsync((unsigned char *)d + (size_t)r0 * row_bytes, buf, (size_t)m * row_bytes,
                                        cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) {
            free(buf);
            return g4_fail(err, "tensor '%s': copy to the GPU failed: %s", src->name, cudaGetErrorString(e));
        }
    }
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- random packed weights */
static __device__ __forceinline__ unsigned rand_byte(uint64_t seed, uint64_t i) {
    uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned)((z ^ (z >> 31)) >> 56);
}

/* Byte o of the scales of a device row: values uniform in about +-amp (random codes, fixed scales). */
static __device__ unsigned meta_byte(int dt, size_t o, int64_t in, int sk, int group, float amp) {
    const size_t n = (size_t)in;
    uint16_t h = 0;
    switch (dt) {
    case G4_Q8_0:
    case G4_Q4_0:
    case G4_Q5_0:
    case G4_IQ4_NL:
    case G4_MXF4:
        if (o >= 2 * (n / 32)) return 0;
        h = g4_f2h(dt == G4_Q8_0 || dt == G4_IQ4_NL ? amp / 127.0f : dt == G4_MXF4 ? amp / 12.0f : dt == G4_Q5_0 ? amp / 16.0f : amp / 8.0f);
        return o & 1 ? h >> 8 : h & 0xff;
    case G4_Q2_K: /* sc = m = 1 per 16: w = d u - dmin, d = 2 amp / 3, dmin = amp */
        if (o < n / 16) return 0x11u;
        o -= n / 16;
        if (o >= 4 * (n / 256)) return 0;
        h = g4_f2h(o % 4 < 2 ? 2.0f * amp / 3.0f : amp);
        return o & 1 ? h >> 8 : h & 0xff;
    case G4_CB4_16: /* the tables as CB4's, every scale 16, d * 16 * 120 = amp */
        if (o < 16 * (n / 256)) return (unsigned)(-120 + 16 * (int)(o % 16)) & 0xffu;
        o -= 16 * (n / 256);
        if (o < n / 16) return 16u;
        o -= n / 16;
        if (o >= 2 * (n / 256)) return 0;
        h = g4_f2h(amp / (16.0f * 120.0f));
        return o & 1 ? h >> 8 : h & 0xff;
    case G4_CB4: /* the tables: -120, -104, .., 120 (then the meta as IQ4_XS's, d * 16 * 120 = amp) */
        if (o < 16 * (n / 256)) return (unsigned)(-120 + 16 * (int)(o % 16)) & 0xffu;
        o -= 16 * (n / 256);
        [[fallthrough]];
    case G4_IQ4_XS: { /* every sub-block's scale 48 - 32 = 16: d * 16 * 127 = amp */
        if (o >= 8 * (n / 256)) return 0;
        const size_t i = o % 8;
        h = g4_f2h(amp / (16.0f * (dt == G4_CB4 ? 120.0f : 127.0f)));
        return i < 2 ? (i & 1 ? h >> 8 : h & 0xff) : i < 4 ? 0xffu : 0u;
    }
    case G4_Q4_K:
    case G4_Q5_K: { /* d * 32 = 2 amp / (2^bits - 1), dmin * 32 = amp: sc = m = 32 in every sub-block */
        if (o >= 16 * (n / 256)) return 0;
        const size_t i = o % 16;
        if (i < 4) {
            h = g4_f2h(i < 2 ? amp / ((dt == G4_Q5_K ? 31.0f : 15.0f) * 16.0f) : amp / 32.0f);
            return i & 1 ? h >> 8 : h & 0xff;
        }
        return i < 12 ? 0xA0u : 0u;
    }
    case G4_Q6_K:
        if (o < n / 16) return 16u; /* d * 16 * 32 = amp */
        o -= n / 16;
        if (o >= 2 * (n / 256)) return 0;
        h = g4_f2h(amp / 512.0f);
        return o & 1 ? h >> 8 : h & 0xff;
    default: { /* MLX: scale 2 amp / (2^bits - 1), bias -amp */
        const size_t pair = sk == 2 ? 8 : 4, ng = n / (size_t)group;
        if (o >= ng * pair) return 0;
        const size_t i = o % pair, half = pair / 2;
        const float v = i < half ? 2.0f * amp / (dt == G4_MLX4 ? 15.0f : 255.0f) : -amp;
        if (sk == 2) return (__float_as_uint(v) >> (8 * (i % 4))) & 0xff;
        h = sk == 1 ? g4_f2h(v) : g4_f2bf(v);
        return i % 2 ? h >> 8 : h & 0xff;
    }
    }
}

__global__ void fill_random_quant_kernel(unsigned char *dst, int dt, int64_t rows, int64_t in, size_t row_bytes,
                                         size_t code_bytes, int sk, int group, uint64_t seed, float amp) {
    g4_grid_wait();
    const size_t total = (size_t)rows * row_bytes;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t o = i % row_bytes;
        dst[i] = (unsigned char)(o < code_bytes ? rand_byte(seed, i) : meta_byte(dt, o - code_bytes, in, sk, group, amp));
    }
}

void g4c_fill_random_quant(g4c *c, void *dst, const g4_tensor *t, int64_t rows, size_t row_bytes, uint64_t seed) {
    const int64_t in = t->shape[t->ndim - 1];
    const float amp = sqrtf(3.0f / (float)(in > 0 ? in : 1));
    const size_t code_bytes = t->dtype == G4_Q8_0 || t->dtype == G4_MLX8   ? (size_t)in
                              : t->dtype == G4_Q6_K                        ? (size_t)in * 3 / 4
                              : t->dtype == G4_Q5_0 || t->dtype == G4_Q5_K ? (size_t)in / 2 + (size_t)in / 8
                              : t->dtype == G4_Q2_K                        ? (size_t)in / 4
                                                                           : (size_t)in / 2;
    const g4c_qrow q = g4c_qrow_of(t);
    size_t blocks = ((size_t)rows * row_bytes + 255) / 256;
    if (blocks > (size_t)c->n_sm * 64) blocks = (size_t)c->n_sm * 64;
    g4c_launch(c, fill_random_quant_kernel, dim3((unsigned)(blocks ? blocks : 1)), dim3(256), 0, (unsigned char *)dst,
               (int)t->dtype, rows, in, row_bytes, code_bytes, q.sk, q.group, seed, amp);
}

/* ---------------------------------------------------------------- decoding rows */
/* rows [r0, r0 + m) of a quantized matrix as bf16 [m, in] (and the rounding remainders in lo): the tile is a run
 * of accesses (EPA weights each, row after row); a block decodes DEQ_THREADS consecutive accesses, a thread each,
 * into shared memory, then writes them out as 16-byte stores of consecutive addresses (a thread's own stores, EPA x
 * 2 bytes apart from its neighbours', wrote 4 bytes of each 32-byte sector a store: H200, 31B Q4_0 prefill of 512
 * tokens 471 -> 1943 tok/s with this, tiles of 64-row multiples and twice the tile). */
#define DEQ_THREADS 128
template <int DT>
__global__ __launch_bounds__(DEQ_THREADS) void dequant_bf16_kernel(const unsigned char *w, size_t row_bytes,
                                                                   g4c_qrow q, int64_t r0, int m, uint16_t *out,
                                                                   uint16_t *lo) {
    constexpr int EPA = g4_qt<DT>::EPA, CHUNK = DEQ_THREADS * EPA; /* weights a block decodes per pass */
    __shared__ __align__(16) uint16_t sh[2][CHUNK];
    g4_grid_wait();
    const unsigned per_row = (unsigned)(q.in / EPA), total = (unsigned)m * per_row;
    for (unsigned base = blockIdx.x * DEQ_THREADS; base < total; base += gridDim.x * DEQ_THREADS) {
        const unsigned i = base + threadIdx.x;
        if (i < total) {
            const unsigned r = i / per_row;
            float v[EPA];
            g4_qdecode<DT>(w + (size_t)(r0 + (int64_t)r) * row_bytes, (int)(i - r * per_row) * EPA, q, v);
#pragma unroll
            for (int j = 0; j < EPA; j++) {
                const uint16_t h = g4_f2bf(v[j]);
                sh[0][threadIdx.x * EPA + j] = h;
                if (lo) sh[1][threadIdx.x * EPA + j] = g4_f2bf(v[j] - g4_bf2f(h));
            }
        }
        __syncthreads();
        const unsigned n16 = ((total - base < DEQ_THREADS ? total - base : DEQ_THREADS) * EPA) / 8; /* 16-byte runs */
        for (unsigned k = threadIdx.x; k < n16; k += DEQ_THREADS) {
            ((uint4 *)(out + (size_t)base * EPA))[k] = ((const uint4 *)sh[0])[k];
            if (lo) ((uint4 *)(lo + (size_t)base * EPA))[k] = ((const uint4 *)sh[1])[k];
        }
        __syncthreads();
    }
}

#define G4C_QUANT_CASE(T) \
    case T: LAUNCH(T); break;
#define G4C_QUANT_SWITCH(dt)                   \
    switch (dt) {                              \
        G4C_QUANT_TYPES(G4C_QUANT_CASE)        \
    default: break;                            \
    }

void g4c_dequant_bf16(g4c *c, const g4_tensor *w, int64_t r0, int m, uint16_t *out, uint16_t *lo) {
    const g4c_qrow q = g4c_qrow_of(w);
    const size_t rb = g4c_wrow_bytes(w), total = (size_t)m * (size_t)(q.in / 32); /* (accesses of 32 or more) */
    size_t blocks = (total + DEQ_THREADS - 1) / DEQ_THREADS;
    if (blocks > (size_t)c->n_sm * 16) blocks = (size_t)c->n_sm * 16;
    const dim3 grid((unsigned)(blocks ? blocks : 1));
#define LAUNCH(T)                                                                                                     \
    g4c_launch(c, dequant_bf16_kernel<T>, grid, dim3(DEQ_THREADS), 0, (const unsigned char *)w->data, rb, q, r0, m, out, \
               lo)
    G4C_QUANT_SWITCH(w->dtype)
#undef LAUNCH
}

/* out[i, :] = table[ids[i], :] * scale: a block per row, a thread per access */
template <int DT>
__global__ void embed_quant_kernel(const unsigned char *table, size_t row_bytes, int rows, g4c_qrow q,
                                   const int32_t *ids, float scale, float *out) {
    constexpr int EPA = g4_qt<DT>::EPA;
    g4_grid_wait();
    const int32_t id = ids[blockIdx.x];
    const unsigned char *row = table + (size_t)id * row_bytes;
    float *o = out + (size_t)blockIdx.x * (size_t)q.in;
    if (id < 0 || id >= rows) { /* (as embed_kernel) */
        for (int k = threadIdx.x; k < q.in; k += blockDim.x) o[k] = __int_as_float(0x7fc00000);
        return;
    }
    for (int k = threadIdx.x * EPA; k < q.in; k += blockDim.x * EPA) {
        float v[EPA];
        g4_qdecode<DT>(row, k, q, v);
#pragma unroll
        for (int j = 0; j < EPA; j++) o[k + j] = v[j] * scale;
    }
}

void g4c_embed_quant(g4c *c, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out) {
    const g4c_qrow q = g4c_qrow_of(table);
    const size_t rb = g4c_wrow_bytes(table);
#define LAUNCH(T)                                                                                                  \
    g4c_launch(c, embed_quant_kernel<T>, dim3((unsigned)n), dim3(128), 0, (const unsigned char *)table->data, rb,   \
               (int)table->shape[0], q, ids, scale, out)
    G4C_QUANT_SWITCH(table->dtype)
#undef LAUNCH
}

G4_TRACE_TU(quant)
