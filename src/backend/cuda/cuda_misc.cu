/* The small ops of the CUDA backend (src/backend/backend.h): embeddings, norms, RoPE, elementwise ops, row
 * gathers, argmax, top-k candidates, the drafter's masked logits (docs/gemma4-assistant.md 3.4), random weights. Each is one kernel; rows go to blocks, elements to threads. */
#include "backend/cuda/cuda_common.cuh"

static unsigned blocks_for(g4c *c, size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    size_t cap = (size_t)c->n_sm * 16;
    if (b > cap) b = cap;
    return (unsigned)(b ? b : 1);
}

/* ------------------------------------------------------------------ embed */
/* (an id outside the table's rows, the argmax's -1 of a NaN row in the drafter's chain, gives a NaN row) */
__global__ void embed_kernel(const unsigned char *table, size_t row_bytes, int dt, int cols, int rows,
                             const int32_t *ids, float scale, float *out) {
    g4_grid_wait();
    const int32_t id = ids ? ids[blockIdx.x] : (int32_t)blockIdx.x;
    const unsigned char *row = table + (size_t)id * row_bytes;
    float *o = out + (size_t)blockIdx.x * (size_t)cols;
    if (id < 0 || id >= rows) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = __int_as_float(0x7fc00000);
        return;
    }
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v;
        if (dt == G4_F32)
            v = ((const float *)row)[i];
        else if (dt == G4_BF16)
            v = g4_bf2f(((const uint16_t *)row)[i]);
        else
            v = g4_h2f(((const uint16_t *)row)[i]);
        o[i] = v * scale;
    }
}

void g4c_embed(g4_backend *be, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out) {
    g4c *c = g4c_of(be);
    if (n <= 0) return;
    if (g4_dtype_is_quantized(table->dtype)) {
        g4c_embed_quant(c, table, ids, n, scale, out);
        return;
    }
    const int cols = (int)table->shape[table->ndim - 1];
    g4c_launch(c, embed_kernel, dim3((unsigned)n), dim3(256), 0, (const unsigned char *)table->data,
               g4c_row_bytes(table->dtype, cols), (int)table->dtype, cols, (int)table->shape[0], ids, scale, out);
}

/* Rows of a table in host memory: 16- and 32-bit rows are copied as stored, gathered into the pinned staging (one
 * copy of half the bytes of floats for bf16), and widened by embed_kernel; other dtypes are widened on the host.
 * (H200, E2B decode of 100 sequences: the per-layer table's rows widened on the host, 3.6 MB a step, kept the GPU
 * idle for about 1 ms of each 6.5 ms step.) */
void g4c_rows_to_device(g4_backend *be, float *dst, const g4_tensor *table, const int32_t *ids, int n, float scale) {
    g4c *c = g4c_of(be);
    if (n <= 0) return;
    const size_t cols = (size_t)table->shape[table->ndim - 1];
    const int plain = table->dtype == G4_BF16 || table->dtype == G4_F16 || table->dtype == G4_F32;
    const size_t rb = plain ? cols * (size_t)g4_dtype_bits(table->dtype) / 8 : 0, bytes = (size_t)n * rb;
    unsigned char *s = plain && cols <= INT32_MAX ? g4c_staging_take(c, bytes) : NULL;
    if (s) {
        unsigned char *d = (unsigned char *)g4c_ws(c, &c->ws_rows, bytes);
        if (!d) return;
        for (int i = 0; i < n; i++) memcpy(s + (size_t)i * rb, (const unsigned char *)table->data + (size_t)ids[i] * rb, rb);
        g4c_note(c, cudaMemcpyAsync(d, s, bytes, cudaMemcpyHostToDevice, c->stream), "copy to the GPU");
        g4c_launch(c, embed_kernel, dim3((unsigned)n), dim3(256), 0, (const unsigned char *)d, rb, (int)table->dtype,
                   (int)cols, n, (const int32_t *)NULL, scale, dst);
        return;
    }
    const size_t fb = (size_t)n * cols * sizeof(float);
    if (fb > c->host_rows_cap) {
        float *h = (float *)realloc(c->host_rows, fb);
        if (!h) {
            g4c_note(c, cudaErrorMemoryAllocation, "rows of a host table: out of host memory");
            return;
        }
        c->host_rows = h, c->host_rows_cap = fb;
    }
    g4_tensor_rows_f32(table, ids, n, scale, c->host_rows);
    g4c_copy_to_device(c, dst, c->host_rows, fb);
}

/* ------------------------------------------------------------------ norms */
__global__ void rmsnorm_kernel(const float *x, const float *w, int dim, float eps, float *y) {
    __shared__ float red[32];
    g4_grid_wait();
    const float *xr = x + (size_t)blockIdx.x * (size_t)dim;
    float *yr = y + (size_t)blockIdx.x * (size_t)dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i] * xr[i];
    const float inv = rsqrtf(g4_block_sum(s, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

static int row_threads(int dim) { return dim >= 1024 ? 256 : dim >= 256 ? 128 : 64; }

void g4c_rmsnorm(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y) {
    g4c *c = g4c_of(be);
    if (rows <= 0) return;
    g4c_launch(c, rmsnorm_kernel, dim3((unsigned)rows), dim3(row_threads(dim)), 0, x, w, dim, eps, y);
}

/* out = (h + rmsnorm(o) * w) * s per row (out may be h) */
__global__ void post_norm_add_kernel(const float *h, const float *o, const float *w, int dim, float eps, float s,
                                     float *out) {
    __shared__ float red[32];
    g4_grid_wait();
    const size_t off = (size_t)blockIdx.x * (size_t)dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += o[off + i] * o[off + i];
    const float inv = rsqrtf(g4_block_sum(ss, red) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[off + i] = (h[off + i] + o[off + i] * inv * w[i]) * s;
}

void g4c_residual(g4c *c, const float *h, const float *o, const float *w, int rows, int dim, float eps, float s,
                  float *out) {
    if (rows <= 0) return;
    g4c_launch(c, post_norm_add_kernel, dim3((unsigned)rows), dim3(row_threads(dim)), 0, h, o, w, dim, eps, s, out);
}

void g4c_post_norm_add(g4_backend *be, float *h, const float *o, const float *w, int rows, int dim, float eps, float s) {
    g4c_residual(g4c_of(be), h, o, w, rows, dim, eps, s, h);
}

/* ------------------------------------------------------------------- rope */
__global__ void rope_table_kernel(const int32_t *pos, int n, const float *inv_freq, int half, float *table) {
    g4_grid_wait();
    const int total = n * half;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int t = i / half, k = i % half;
        const float a = inv_freq[k] * (float)pos[t]; /* fp32 angle, as the reference computes it */
        table[(size_t)t * 2 * half + k] = cosf(a);
        table[(size_t)t * 2 * half + half + k] = sinf(a);
    }
}

void g4c_rope_table(g4_backend *be, const int32_t *pos, int n, const float *inv_freq, int half, float *table) {
    g4c *c = g4c_of(be);
    if (n <= 0) return;
    g4c_launch(c, rope_table_kernel, dim3(blocks_for(c, (size_t)n * half, 256)), dim3(256), 0, pos, n, inv_freq, half,
               table);
}

__global__ void head_norm_rope_kernel(float *x, int rows, int heads, int dim, int norm, const float *w, float eps,
                                      const float *table) {
    g4_grid_wait();
    const int warps = blockDim.x >> 5;
    for (int r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        float *v = x + (size_t)r * (size_t)dim;
        g4c_head_row(v, dim, norm, w, eps, table ? table + (size_t)(r / heads) * (size_t)dim : NULL, v, NULL, 0, 0);
    }
}

void g4c_head_norm_rope(g4_backend *be, float *x, int n, int heads, int dim, const float *w, float eps,
                        const float *table) {
    g4c *c = g4c_of(be);
    const int rows = n * heads;
    if (rows <= 0) return;
    g4c_launch(c, head_norm_rope_kernel, dim3(blocks_for(c, (size_t)rows, 8)), dim3(256), 0, x, rows, heads, dim, 1,
               w, eps, table);
}

void g4c_rope(g4_backend *be, float *x, int n, int heads, int dim, const float *table) {
    g4c *c = g4c_of(be);
    const int rows = n * heads;
    if (rows <= 0) return;
    g4c_launch(c, head_norm_rope_kernel, dim3(blocks_for(c, (size_t)rows, 8)), dim3(256), 0, x, rows, heads, dim, 0,
               (const float *)NULL, 0.0f, table);
}

/* ----------------------------------------------------------- elementwise */
enum { EW_GELU_MUL, EW_GELU, EW_ADD, EW_SCALE, EW_MUL, EW_ADD_SCALE, EW_SOFTCAP };

__global__ void elementwise_kernel(int op, float *y, const float *a, const float *b, size_t n, float s) {
    g4_grid_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        switch (op) {
        case EW_GELU_MUL: y[i] = g4_gelu_tanh(a[i]) * b[i]; break;
        case EW_GELU: y[i] = g4_gelu_tanh(a[i]); break;
        case EW_ADD: y[i] += a[i]; break;
        case EW_SCALE: y[i] *= s; break;
        case EW_MUL: y[i] *= a[i]; break;
        case EW_ADD_SCALE: y[i] = (y[i] + a[i]) * s; break;
        default: y[i] = tanhf(y[i] / s) * s; break;
        }
    }
}

static void ew(g4_backend *be, int op, float *y, const float *a, const float *b, size_t n, float s) {
    g4c *c = g4c_of(be);
    if (!n) return;
    g4c_launch(c, elementwise_kernel, dim3(blocks_for(c, n, 256)), dim3(256), 0, op, y, a, b, n, s);
}

void g4c_gelu_mul(g4_backend *be, const float *g, const float *u, size_t n, float *y) {
    ew(be, u ? EW_GELU_MUL : EW_GELU, y, g, u, n, 0.0f);
}
void g4c_add(g4_backend *be, float *y, const float *x, size_t n) { ew(be, EW_ADD, y, x, NULL, n, 0.0f); }
void g4c_scale(g4_backend *be, float *y, size_t n, float s) { ew(be, EW_SCALE, y, NULL, NULL, n, s); }
void g4c_mul(g4_backend *be, float *y, const float *x, size_t n) { ew(be, EW_MUL, y, x, NULL, n, 0.0f); }
void g4c_add_scale(g4_backend *be, float *y, const float *x, size_t n, float s) { ew(be, EW_ADD_SCALE, y, x, NULL, n, s); }
void g4c_softcap(g4_backend *be, float *y, size_t n, float c) { ew(be, EW_SOFTCAP, y, NULL, NULL, n, c); }

/* ------------------------------------------------------------ row moves */
__global__ void get_rows_kernel(const float *src, const int32_t *idx, int row, float *dst) {
    g4_grid_wait();
    const float *s = src + (size_t)idx[blockIdx.x] * (size_t)row;
    float *d = dst + (size_t)blockIdx.x * (size_t)row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) d[i] = s[i];
}

/* short rows (single logits gathered for a sampler): a thread an element */
__global__ void get_short_rows_kernel(const float *src, const int32_t *idx, int n, int row, float *dst) {
    g4_grid_wait();
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n * (size_t)row) return;
    const size_t i = t / (size_t)row, j = t % (size_t)row;
    dst[t] = src[(size_t)idx[i] * (size_t)row + j];
}

void g4c_get_rows(g4_backend *be, const float *src, const int32_t *idx, int n, int row, float *dst) {
    g4c *c = g4c_of(be);
    if (n <= 0 || row <= 0) return;
    if (row < 32) {
        const size_t total = (size_t)n * (size_t)row;
        g4c_launch(c, get_short_rows_kernel, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, src, idx, n, row, dst);
    } else {
        g4c_launch(c, get_rows_kernel, dim3((unsigned)n), dim3(256), 0, src, idx, row, dst);
    }
}

/* dst[b, a, :] = src[a, b, :]: block (a, b) moves one row of c */
__global__ void transpose_kernel(const float *src, int na, int nb, int cc, float *dst) {
    g4_grid_wait();
    const int a = blockIdx.x / nb, b = blockIdx.x % nb;
    const float *s = src + ((size_t)a * nb + b) * (size_t)cc;
    float *d = dst + ((size_t)b * na + a) * (size_t)cc;
    for (int i = threadIdx.x; i < cc; i += blockDim.x) d[i] = s[i];
}

void g4c_transpose(g4_backend *be, const float *src, int na, int nb, int cc, float *dst) {
    g4c *c = g4c_of(be);
    if (na <= 0 || nb <= 0) return;
    g4c_launch(c, transpose_kernel, dim3((unsigned)(na * nb)), dim3(cc >= 256 ? 256 : 64), 0, src, na, nb, cc, dst);
}

/* ----------------------------------------------------------------- argmax */
/* Blocks (row, part) find the best of their part; the last block of a row to finish (a counter) reduces the
 * parts. Ties go to the lowest index; a NaN beats every number, so a row that holds one gives -1 (backend.h). */
#define ARGMAX_PARTS 128 /* of at least 2048 elements */

static __device__ __forceinline__ int better(float v, int i, float bv, int bi) {
    const int vn = v != v, bn = bv != bv;
    return vn != bn ? vn : (vn || v == bv) ? i < bi : v > bv;
}

/* the best (value, index) of a warp, in every lane */
static __device__ __forceinline__ void warp_best(float *bv, int *bi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
        if (better(ov, oi, *bv, *bi)) *bv = ov, *bi = oi;
    }
}

__global__ void argmax_kernel(const float *x, int n, float *part_v, int *part_i, int *counters, int32_t *out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ int last;
    g4_grid_wait();
    const int row = blockIdx.y, parts = gridDim.x;
    const float *xr = x + (size_t)row * (size_t)n;
    const int per = (n + parts - 1) / parts, b = blockIdx.x * per, e = b + per < n ? b + per : n;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = b + threadIdx.x; i < e; i += blockDim.x)
        if (better(xr[i], i, bv, bi)) bv = xr[i], bi = i;
    warp_best(&bv, &bi);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 1; j < nw; j++)
            if (better(sv[j], si[j], bv, bi)) bv = sv[j], bi = si[j];
        part_v[row * parts + blockIdx.x] = bv;
        part_i[row * parts + blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(&counters[row], 1) == parts - 1;
    }
    __syncthreads();
    if (last) { /* (block-uniform) the parts, a thread each, then the block's best */
        __threadfence();
        const volatile float *pv = part_v + row * parts;
        const volatile int *pi = part_i + row * parts;
        float v = -INFINITY;
        int i = 0x7fffffff;
        for (int j = threadIdx.x; j < parts; j += blockDim.x)
            if (better(pv[j], pi[j], v, i)) v = pv[j], i = pi[j];
        warp_best(&v, &i);
        if (lane == 0) sv[w] = v, si[w] = i;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int j = 1; j < nw; j++)
                if (better(sv[j], si[j], v, i)) v = sv[j], i = si[j];
            out[row] = v != v ? -1 : i == 0x7fffffff ? 0 : i;
            counters[row] = 0;
        }
    }
}

void g4c_argmax(g4_backend *be, const float *x, int rows, int n, int32_t *out) {
    g4c *c = g4c_of(be);
    if (rows <= 0 || n <= 0) return;
    if ((size_t)rows > c->n_counters / 2) { /* (the upper half: the attention's barrier generations) */
        g4c_note(c, cudaErrorInvalidValue, "argmax: too many rows");
        return;
    }
    int parts = n >= 2048 * ARGMAX_PARTS ? ARGMAX_PARTS : (n + 2047) / 2048;
    float *ws = (float *)g4c_ws(c, &c->ws_gemm, (size_t)rows * parts * 8);
    if (!ws) return;
    g4c_launch(c, argmax_kernel, dim3((unsigned)parts, (unsigned)rows), dim3(256), 0, x, n, ws,
               (int *)(ws + (size_t)rows * parts), c->counters, out);
}

/* ------------------------------------------------------- top-k candidates */
/* Two launches, no host round trip. (1) A block per (chunk of TOPK_CHUNK, row) keeps its chunk in registers as
 * order-preserving keys, finds the chunk's k-th largest key by radix selection (a byte a pass, a 256-bin shared
 * histogram), and appends the (index, key) pairs at or above it (at most cap a chunk) to the row's list, at a
 * place a row counter hands out; its count and key go beside. (2) A block per row stages the list in shared
 * memory (where it fits) and selects the row's k-th largest key among it the same way: every value of the row's
 * top k is there (fewer than k values of its chunk are larger). It writes those at or above it in ascending order
 * (a rank each) with their values; -1 when more than cap qualify, when a chunk had more ties than cap at a key
 * the row keeps, or when a chunk holds a NaN. It sets the row counter back to 0. Workspace: [rows, chunks] (count, key), [rows, chunks * cap]
 * (index, key). */
#define TOPK_CHUNK 4096
#define TOPK_THREADS 256
#define TOPK_MERGE_THREADS 1024
#define TOPK_STAGE 4096 /* list entries the merge keeps in shared memory */

/* the order of floats as unsigned keys; NaN and -inf (never candidates) are 0 */
static __device__ __forceinline__ unsigned topk_key(float v) {
    const unsigned u = __float_as_uint(v);
    if (v != v || v == -INFINITY) return 0u;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The k-th largest non-zero key of those the block's threads visit (each(f) calls f(key) for every key of the
 * calling thread); 1 when there are fewer than k (every non-zero key qualifies). Every thread gets it. */
template <typename Each>
static __device__ unsigned topk_kth_key(int k, Each each) {
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix;
    __shared__ int s_left;
    unsigned prefix = 0, mask = 0;
    int left = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        each([&](unsigned key) {
            if (key && (key & mask) == prefix) atomicAdd(&hist[key >> shift & 255], 1u);
        });
        __syncthreads();
        if (threadIdx.x < 32) { /* the bin where the count from the top reaches `left`: 8 bins a lane, a scan */
            const int lane = threadIdx.x;
            unsigned own = 0;
            for (int q = 0; q < 8; q++) own += hist[255 - 8 * lane - q];
            unsigned incl = own;
            for (int d = 1; d < 32; d <<= 1) {
                const unsigned o = __shfl_sync(0xffffffffu, incl, lane >= d ? lane - d : lane);
                if (lane >= d) incl += o;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, incl >= (unsigned)left);
            if (!hit) {
                if (lane == 0) s_left = -1, s_prefix = 1u;
            } else if (lane == __ffs((int)hit) - 1) {
                unsigned cum = incl - own;
                int bin = 255 - 8 * lane;
                while (cum + hist[bin] < (unsigned)left) cum += hist[bin--];
                s_left = left - (int)cum;
                s_prefix = prefix | (unsigned)bin << shift;
            }
        }
        __syncthreads();
        left = s_left, prefix = s_prefix, mask |= 255u << shift;
        if (left < 0) return 1u; /* (block-uniform) fewer than k: the first pass only */
    }
    return prefix;
}

__global__ void topk_chunk_kernel(const float *x, int n, int k, int cap, int *info, int2 *list, int *counters) {
    __shared__ int cnt, put, base, nan;
    g4_grid_wait();
    const int row = blockIdx.y, chunks = gridDim.x, c0 = blockIdx.x * TOPK_CHUNK;
    const float *xr = x + (size_t)row * (size_t)n;
    if (threadIdx.x == 0) nan = 0; /* a NaN in the chunk: the row's count is -1 (backend.h) */
    __syncthreads();
    unsigned key[TOPK_CHUNK / TOPK_THREADS];
    for (int j = 0; j < TOPK_CHUNK / TOPK_THREADS; j++) {
        const int i = c0 + j * TOPK_THREADS + (int)threadIdx.x;
        key[j] = i < n ? topk_key(xr[i]) : 0u;
        if (i < n && xr[i] != xr[i]) nan = 1; /* (read after the barriers below) */
    }
    const unsigned t = topk_kth_key(k, [&](auto f) {
        for (int j = 0; j < TOPK_CHUNK / TOPK_THREADS; j++) f(key[j]);
    });
    if (threadIdx.x == 0) cnt = 0, put = 0;
    __syncthreads();
    for (int j = 0; j < TOPK_CHUNK / TOPK_THREADS; j++)
        if (key[j] >= t) atomicAdd(&cnt, 1); /* (t >= 1: NaN and -inf never) */
    __syncthreads();
    if (threadIdx.x == 0) {
        base = atomicAdd(&counters[row], cnt < cap ? cnt : cap);
        info[2 * (row * chunks + blockIdx.x)] = nan ? 0x7fffffff : cnt; /* above cap: ties lost (or a NaN) */
        info[2 * (row * chunks + blockIdx.x) + 1] = nan ? -1 : (int)t;     /* (as unsigned: above every key) */
    }
    __syncthreads();
    int2 *out = list + (size_t)row * (size_t)chunks * (size_t)cap + base;
    for (int j = 0; j < TOPK_CHUNK / TOPK_THREADS; j++)
        if (key[j] >= t) {
            const int p = atomicAdd(&put, 1);
            if (p < cap) out[p] = make_int2(c0 + j * TOPK_THREADS + (int)threadIdx.x, (int)key[j]);
        }
}

__global__ void topk_merge_kernel(const float *x, int n, int chunks, int k, int cap, const int *info, const int2 *list,
                                  int *counters, int32_t *ids, float *vals, int32_t *count) {
    __shared__ int2 stage[TOPK_STAGE];
    __shared__ int sel[2 * G4_TOP_K_MAX];
    __shared__ int total, m, bad;
    g4_grid_wait();
    const int row = blockIdx.x;
    if (threadIdx.x == 0) total = counters[row], counters[row] = 0, m = 0, bad = 0;
    __syncthreads();
    const int2 *lr = list + (size_t)row * (size_t)chunks * (size_t)cap;
    const int staged = total <= TOPK_STAGE;
    if (staged)
        for (int s = threadIdx.x; s < total; s += blockDim.x) stage[s] = lr[s];
    __syncthreads();
    auto visit = [&](auto f) { /* every (index, key) of the list, a thread each in turn */
        for (int s = threadIdx.x; s < total; s += blockDim.x) {
            const int2 e = staged ? stage[s] : lr[s];
            f(e.x, (unsigned)e.y);
        }
    };
    const unsigned t = topk_kth_key(k, [&](auto f) { visit([&](int, unsigned key) { f(key); }); });
    for (int c = threadIdx.x; c < chunks; c += blockDim.x)
        if (info[2 * (row * chunks + c)] > cap && (unsigned)info[2 * (row * chunks + c) + 1] >= t) bad = 1;
    visit([&](int i, unsigned key) {
        if (key >= t) {
            const int p = atomicAdd(&m, 1);
            if (p < cap) sel[p] = i;
        }
    });
    __syncthreads();
    if (bad || m > cap) {
        if (threadIdx.x == 0) count[row] = -1;
        return;
    }
    const float *xr = x + (size_t)row * (size_t)n;
    for (int a = threadIdx.x; a < m; a += blockDim.x) { /* the rank of each index among the selected */
        const int i = sel[a];
        int r = 0;
        for (int b = 0; b < m; b++) r += sel[b] < i;
        ids[(size_t)row * cap + r] = i;
        vals[(size_t)row * cap + r] = xr[i];
    }
    if (threadIdx.x == 0) count[row] = m;
}

void g4c_top_k(g4_backend *be, const float *x, int rows, int n, int k, int cap, int32_t *ids, float *vals,
               int32_t *count) {
    g4c *c = g4c_of(be);
    if (rows <= 0 || n <= 0) return;
    if (k < 1 || k > G4_TOP_K_MAX || cap < k || cap > 2 * G4_TOP_K_MAX || (size_t)rows > c->n_counters / 2) {
        g4c_note(c, cudaErrorInvalidValue, "top_k: k, cap or rows out of range");
        return;
    }
    const int chunks = (n + TOPK_CHUNK - 1) / TOPK_CHUNK;
    const size_t n_info = (size_t)rows * chunks * 2, n_list = (size_t)rows * chunks * cap;
    int *ws = (int *)g4c_ws(c, &c->ws_gemm, (n_info + 2 * n_list) * sizeof(int));
    if (!ws) return;
    int2 *list = (int2 *)(ws + n_info); /* (n_info is even: 8-byte aligned) */
    g4c_launch(c, topk_chunk_kernel, dim3((unsigned)chunks, (unsigned)rows), dim3(TOPK_THREADS), 0, x, n, k, cap, ws,
               list, c->counters);
    g4c_launch(c, topk_merge_kernel, dim3((unsigned)rows), dim3(TOPK_MERGE_THREADS), 0, x, n, chunks, k, cap,
               (const int *)ws, (const int2 *)list, c->counters, ids, vals, count);
}

/* ---------------------------------------------------------- masked logits */
/* Four launches for all rows, no host round trip: (1) a block a row picks the top_k groups by score (ties -> lower
 * index) and writes the chosen groups and a flag per group; (2) a warp per selected id of a row writes
 * out[r, id] = x[r] . table[id]; (3) a block a row takes the smallest of its products; (4) every id of a row's
 * unchosen groups gets it minus 1. Workspace: sel [rows, top_k] int, taken [rows, n_groups] int, fill [rows] float. */
__global__ void masked_select_kernel(const float *scores, int n_groups, int top_k, int *sel, int *taken) {
    __shared__ float sv[32];
    __shared__ int si[32];
    G4_DYN_SMEM(unsigned char, flag);
    g4_grid_wait();
    scores += (size_t)blockIdx.x * n_groups, sel += (size_t)blockIdx.x * top_k, taken += (size_t)blockIdx.x * n_groups;
    for (int g = threadIdx.x; g < n_groups; g += blockDim.x) flag[g] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int kk = 0; kk < top_k; kk++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int g = threadIdx.x; g < n_groups; g += blockDim.x)
            if (!flag[g] && better(scores[g], g, bv, bi)) bv = scores[g], bi = g;
        warp_best(&bv, &bi);
        if (lane == 0) sv[w] = bv, si[w] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int j = 1; j < nw; j++)
                if (better(sv[j], si[j], bv, bi)) bv = sv[j], bi = si[j];
            if (bi == 0x7fffffff) /* every score NaN: the lowest untaken group */
                for (bi = 0; flag[bi]; bi++) {}
            sel[kk] = bi;
            flag[bi] = 1;
        }
        __syncthreads();
    }
    for (int g = threadIdx.x; g < n_groups; g += blockDim.x) taken[g] = flag[g];
}

template <int DT>
__global__ void masked_dot_kernel(const float *x, const int *sel, int top_k, int per, int n, int rows, int V,
                                  const int32_t *ordering, const unsigned char *table, size_t row_bytes, g4c_qrow q,
                                  float *out) {
    constexpr int EPA = g4_wacc<DT>::EPA;
    g4_grid_wait();
    const int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    for (int64_t i = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); i < (int64_t)n * rows;
         i += (int64_t)gridDim.x * warps) {
        const int r = (int)(i / n), ii = (int)(i % n);
        const int id = ordering[(size_t)sel[(size_t)r * top_k + ii / per] * per + ii % per];
        const unsigned char *row = table + (size_t)id * row_bytes;
        const float *xr = x + (size_t)r * q.in;
        float s = 0.0f;
        for (int k = lane * EPA; k < q.in; k += 32 * EPA) {
            float wv[EPA];
            g4_wacc<DT>::decode(row, k, q, wv);
            for (int j = 0; j < EPA && k + j < q.in; j++) s += wv[j] * xr[k + j];
        }
        s = g4_warp_sum(s);
        if (lane == 0) out[(size_t)r * V + id] = s;
    }
}

__global__ void masked_min_kernel(const int *sel, int top_k, int per, int n, int V, const int32_t *ordering,
                                  const float *out, float *fill) {
    __shared__ float red[32];
    g4_grid_wait();
    sel += (size_t)blockIdx.x * top_k, out += (size_t)blockIdx.x * V, fill += blockIdx.x;
    float m = INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = out[ordering[(size_t)sel[i / per] * per + i % per]];
        m = v < m ? v : m;
    }
    m = -g4_warp_max(-m);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) red[w] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 1; j < nw; j++) m = red[j] < m ? red[j] : m;
        *fill = m - 1.0f;
    }
}

__global__ void masked_fill_kernel(const int *taken, int n_groups, int per, int V, const int32_t *ordering,
                                   const float *fill, float *out) {
    g4_grid_wait();
    const int r = blockIdx.y;
    const float f = fill[r];
    taken += (size_t)r * n_groups, out += (size_t)r * V;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < V; j += gridDim.x * blockDim.x)
        if (!taken[j / per]) out[ordering[j]] = f;
}

void g4c_masked_logits(g4_backend *be, const float *x, const float *scores, int rows, int n_groups, int top_k,
                       const int32_t *ordering, const g4_tensor *table, float *out) {
    g4c *c = g4c_of(be);
    const int V = (int)table->shape[0];
    if (rows <= 0) return;
    if (n_groups <= 0 || top_k <= 0 || top_k > n_groups || V % n_groups) {
        g4c_note(c, cudaErrorInvalidValue, "masked_logits: groups do not divide the vocabulary");
        return;
    }
    if (n_groups > 48 * 1024) { /* a flag byte per group in shared memory */
        g4c_note(c, cudaErrorInvalidValue, "masked_logits: too many groups");
        return;
    }
    const int per = V / n_groups, n = top_k * per;
    const size_t R = (size_t)rows;
    int *ws = (int *)g4c_ws(c, &c->ws_gemm, R * ((size_t)top_k + (size_t)n_groups + 1) * 4);
    if (!ws) return;
    int *sel = ws, *taken = ws + R * top_k;
    float *fill = (float *)(taken + R * n_groups);
    g4c_launch(c, masked_select_kernel, dim3((unsigned)rows), dim3(1024), (size_t)n_groups, scores, n_groups, top_k,
               sel, taken);
    const g4c_qrow q = g4c_qrow_of(table);
    switch (table->dtype) {
#define DOT(T)                                                                                                       \
    case T:                                                                                                          \
        g4c_launch(c, masked_dot_kernel<T>, dim3(blocks_for(c, (size_t)n * R, 8)), dim3(256), 0, x, (const int *)sel, \
                   top_k, per, n, rows, V, ordering, (const unsigned char *)table->data, g4c_wrow_bytes(table), q,    \
                   out);                                                                                              \
        break;
        G4C_WEIGHT_TYPES(DOT)
#undef DOT
    default: break;
    }
    g4c_launch(c, masked_min_kernel, dim3((unsigned)rows), dim3(1024), 0, (const int *)sel, top_k, per, n, V, ordering,
               (const float *)out, fill);
    g4c_launch(c, masked_fill_kernel, dim3(blocks_for(c, (size_t)V, 256), (unsigned)rows), dim3(256), 0,
               (const int *)taken, n_groups, per, V, ordering, (const float *)fill, out);
}

/* ------------------------------------------------------------- random weights */
__global__ void fill_random_kernel(unsigned char *dst, int dt, int64_t rows, int64_t in, size_t row_bytes,
                                   uint64_t seed, float amp) {
    g4_grid_wait();
    const size_t esz = dt == G4_F32 ? 4 : 2, per_row = row_bytes / esz, total = (size_t)rows * per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / per_row, k = i % per_row;
        const float v = (int64_t)k < in ? g4_random_value(seed, r * (size_t)in + k, amp) : 0.0f;
        if (dt == G4_F32)
            ((float *)dst)[i] = v;
        else
            ((uint16_t *)dst)[i] = dt == G4_BF16 ? g4_f2bf(v) : g4_f2h(v);
    }
}

void g4c_fill_random(g4c *c, void *dst, g4_dtype t, int64_t rows, int64_t in, size_t row_bytes, uint64_t seed) {
    const float amp = sqrtf(3.0f / (float)(in > 0 ? in : 1));
    const size_t total = (size_t)rows * row_bytes / (t == G4_F32 ? 4 : 2);
    g4c_launch(c, fill_random_kernel, dim3(blocks_for(c, total, 256) * 4), dim3(256), 0, (unsigned char *)dst, (int)t,
               rows, in, row_bytes, seed, amp);
}

G4_TRACE_TU(misc)
