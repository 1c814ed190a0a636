/* The ops of the towers on the GPU (src/backend/backend.h, "ops of the towers"; docs/gemma4-towers.md 2.6 and
 * 3.3): bidirectional attention over contiguous keys, the audio conformer's local attention, clamp, per-column
 * shift and scale, row gathers with sums, sigmoid products, LayerNorm, im2col and the causal depthwise conv1d.
 * Plain kernels (a thread per element, a block per row or per query and head): the towers run once per image or
 * clip, so these are written for clarity; the decoder's hot ops are elsewhere. */
#include <float.h>

#include "backend/cuda/cuda_common.cuh"

static unsigned grid_for(g4c *c, size_t n) {
    size_t b = (n + 255) / 256, cap = (size_t)c->n_sm * 16;
    return (unsigned)(b > cap ? cap : b ? b : 1);
}

/* the largest of v over a block (every thread gets it); red: 32 floats of shared memory */
static __device__ __forceinline__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = g4_warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    return g4_warp_max(lane < nw ? red[lane] : -INFINITY);
}

/* ------------------------------------------------------------ elementwise */
__global__ void clamp_kernel(const float *x, float *y, size_t n, float lo, float hi) {
    g4_grid_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        v = v < lo ? lo : v; /* torch.clamp: NaN stays NaN */
        y[i] = v > hi ? hi : v;
    }
}

void g4c_clamp(g4_backend *be, const float *x, float *y, size_t n, float lo, float hi) {
    g4c *c = g4c_of(be);
    if (n) g4c_launch(c, clamp_kernel, dim3(grid_for(c, n)), dim3(256), 0, x, y, n, lo, hi);
}

__global__ void shift_scale_kernel(float *y, size_t n, int cols, const float *shift, const float *scale) {
    g4_grid_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int col = (int)(i % (size_t)cols);
        float v = y[i];
        if (shift) v += shift[col];
        if (scale) v *= scale[col];
        y[i] = v;
    }
}

void g4c_shift_scale_cols(g4_backend *be, float *y, int rows, int cols, const float *shift, const float *scale) {
    g4c *c = g4c_of(be);
    const size_t n = (size_t)(rows > 0 ? rows : 0) * (size_t)(cols > 0 ? cols : 0);
    if (n) g4c_launch(c, shift_scale_kernel, dim3(grid_for(c, n)), dim3(256), 0, y, n, cols, shift, scale);
}

__global__ void sigmoid_mul_kernel(const float *a, const float *b, size_t n, float *y) {
    g4_grid_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] / (1.0f + expf(-b[i]));
}

void g4c_sigmoid_mul(g4_backend *be, const float *a, const float *b, size_t n, float *y) {
    g4c *c = g4c_of(be);
    if (n) g4c_launch(c, sigmoid_mul_kernel, dim3(grid_for(c, n)), dim3(256), 0, a, b, n, y);
}

/* dst[i, :] = sum_j src[idx[i * k + j], :] * s, in j order: a block per output row */
__global__ void gather_sum_kernel(const float *src, const int32_t *idx, int k, int row, float s, float *dst) {
    g4_grid_wait();
    const int i = blockIdx.x;
    for (int col = threadIdx.x; col < row; col += blockDim.x) {
        float d = 0.0f;
        for (int j = 0; j < k; j++) d += __fmul_rn(src[(size_t)idx[(size_t)i * k + j] * row + col], s); /* no FMA: as the CPU */
        dst[(size_t)i * row + col] = d;
    }
}

void g4c_gather_sum(g4_backend *be, const float *src, const int32_t *idx, int n, int k, int row, float s, float *dst) {
    g4c *c = g4c_of(be);
    if (n > 0 && row > 0) g4c_launch(c, gather_sum_kernel, dim3((unsigned)n), dim3(256), 0, src, idx, k, row, s, dst);
}

/* ------------------------------------------------------------ LayerNorm: a block per row */
__global__ void layernorm_kernel(const float *x, const float *w, const float *b, int dim, float eps, float *y) {
    __shared__ float red[32];
    g4_grid_wait();
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *yr = y + (size_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    const float mean = g4_block_sum(s, red) / (float)dim;
    float v = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / sqrtf(g4_block_sum(v, red) / (float)dim + eps);
    __syncthreads(); /* every thread has read x before y (maybe x) is written */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float o = (xr[i] - mean) * inv;
        if (w) o *= w[i];
        if (b) o += b[i];
        yr[i] = o;
    }
}

void g4c_layernorm(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
                   float *y) {
    g4c *c = g4c_of(be);
    if (rows > 0 && dim > 0) g4c_launch(c, layernorm_kernel, dim3((unsigned)rows), dim3(256), 0, x, w, b, dim, eps, y);
}

/* ------------------------------------------------------------ im2col and conv1d */
__global__ void im2col_kernel(const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                              int ow, size_t n, float *out) {
    g4_grid_wait();
    const size_t cols = (size_t)c * kh * kw;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t p = e / cols;
        const int col = (int)(e % cols), ch = col / (kh * kw), i = col / kw % kh, j = col % kw;
        const int oy = row0 + (int)(p / (size_t)ow), ox = (int)(p % (size_t)ow);
        const int iy = oy * stride - pad + i, ix = ox * stride - pad + j;
        out[e] = iy >= 0 && iy < h && ix >= 0 && ix < w ? x[((size_t)iy * w + ix) * c + ch] : 0.0f;
    }
}

void g4c_im2col(g4_backend *be, const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                int nrows, float *out) {
    g4c *cc = g4c_of(be);
    const int ow = (w + 2 * pad - kw) / stride + 1;
    if (nrows <= 0 || ow <= 0) return;
    const size_t n = (size_t)nrows * ow * c * kh * kw;
    g4c_launch(cc, im2col_kernel, dim3(grid_for(cc, n)), dim3(256), 0, x, h, w, c, kh, kw, stride, pad, row0, ow, n,
               out);
}

__global__ void conv1d_causal_dw_kernel(const float *x, const float *w, int n, int c, int k, float *y) {
    g4_grid_wait();
    const size_t total = (size_t)n * c;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(e / (size_t)c), ch = (int)(e % (size_t)c);
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            const int src = t - k + 1 + j;
            if (src >= 0) s += w[(size_t)ch * k + j] * x[(size_t)src * c + ch];
        }
        y[e] = s;
    }
}

void g4c_conv1d_causal_dw(g4_backend *be, const float *x, const float *w, int n, int c, int k, float *y) {
    g4c *cc = g4c_of(be);
    const size_t total = (size_t)(n > 0 ? n : 0) * (size_t)(c > 0 ? c : 0);
    if (total) g4c_launch(cc, conv1d_causal_dw_kernel, dim3(grid_for(cc, total)), dim3(256), 0, x, w, n, c, k, y);
}

/* ------------------------------------------------------------ attention of the towers */
/* A block per (query, head): scores of every key in shared memory, softmax, then each thread a few output
 * elements. Dense: keys [n_k, n_kv_heads, D], an optional bias [bias_heads, n_q, n_k] and key mask. */
__global__ void attention_dense_kernel(g4_dense_attention_args a) {
    __shared__ float red[32];
    G4_DYN_SMEM(float, sc); /* [n_k] */
    g4_grid_wait();
    const int i = blockIdx.x, h = blockIdx.y, D = a.head_dim, G = a.n_heads / a.n_kv_heads;
    const float *q = a.q + ((size_t)i * a.n_heads + h) * D;
    const size_t krow = (size_t)a.n_kv_heads * D, koff = (size_t)(h / G) * D;
    const float *bias = a.bias ? a.bias + ((size_t)(a.bias_heads > 1 ? h : 0) * a.n_q + i) * a.n_k : NULL;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < a.n_k; j += blockDim.x) {
        float s = -INFINITY;
        if (!a.key_valid || a.key_valid[j]) {
            const float *k = a.k + (size_t)j * krow + koff;
            float d = 0.0f;
            for (int e = 0; e < D; e++) d += q[e] * k[e];
            s = d * a.scale + (bias ? bias[j] : 0.0f);
        }
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < a.n_k; j += blockDim.x) {
        const float e = mx == -INFINITY ? 0.0f : expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = g4_block_sum(sum, red); /* (its barriers also make every score visible) */
    float *o = a.out + ((size_t)i * a.n_heads + h) * D;
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < a.n_k; j++) acc += sc[j] * a.v[(size_t)j * krow + koff + e];
        o[e] = sum > 0.0f ? acc / sum : 0.0f; /* no valid key: zeros */
    }
}

void g4c_attention_dense(g4_backend *be, const g4_dense_attention_args *a) {
    g4c *c = g4c_of(be);
    if (a->n_q <= 0 || a->n_heads <= 0) return;
    /* (4 floats of slack: the value loop's unrolled shared loads may read up to 3 scores past the last key) */
    const size_t smem = ((size_t)(a->n_k > 0 ? a->n_k : 1) + 4) * sizeof(float);
    if (smem > c->prop.sharedMemPerBlockOptin || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads) {
        g4c_note(c, cudaErrorInvalidValue, "attention_dense: too many keys for one block, or heads not a multiple "
                                           "of the KV heads");
        return;
    }
    g4c_launch(c, attention_dense_kernel, dim3((unsigned)a->n_q, (unsigned)a->n_heads), dim3(128), smem, *a);
}

/* Local attention: token t and head h over the window's keys t - d, d < window (d <= t). */
__global__ void local_attention_kernel(g4_local_attention_args a) {
    __shared__ float red[32];
    G4_DYN_SMEM(float, qs); /* [D] scaled query, then [window] scores */
    g4_grid_wait();
    const int t = blockIdx.x, h = blockIdx.y, D = a.head_dim, W = a.window;
    const size_t row = (size_t)a.heads * D, off = (size_t)h * D;
    float *sc = qs + D;
    const float *q = a.q + (size_t)t * row + off;
    for (int e = threadIdx.x; e < D; e += blockDim.x)
        qs[e] = a.q_dim_scale ? q[e] * a.q_scale * a.q_dim_scale[e] : q[e] * a.q_scale;
    __syncthreads();
    const int nk = t + 1 < W ? t + 1 : W;
    float mx = -INFINITY;
    for (int d = threadIdx.x; d < nk; d += blockDim.x) {
        const float *k = a.k + (size_t)(t - d) * row + off, *r = a.rel + (size_t)d * row + off;
        float sk = 0.0f, sr = 0.0f;
        for (int e = 0; e < D; e++) sk += qs[e] * k[e], sr += qs[e] * r[e];
        const float s = a.logit_cap * tanhf((sk * a.k_scale + sr) / a.logit_cap);
        sc[d] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int d = threadIdx.x; d < nk; d += blockDim.x) {
        const float e = expf(sc[d] - mx);
        sc[d] = e;
        sum += e;
    }
    sum = g4_block_sum(sum, red);
    float *o = a.out + (size_t)t * row + off;
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float acc = 0.0f;
        for (int d = 0; d < nk; d++) acc += sc[d] * a.v[(size_t)(t - d) * row + off + e];
        o[e] = sum > 0.0f ? acc / sum : 0.0f;
    }
}

void g4c_local_attention(g4_backend *be, const g4_local_attention_args *a) {
    g4c *c = g4c_of(be);
    if (a->n <= 0 || a->heads <= 0) return;
    /* (4 floats of slack, as attention_dense: the value loop's unrolled shared loads may read up to 3 scores past
     * the last key; compute-sanitizer saw 12-byte reads past the window's end on the H200) */
    const size_t smem = ((size_t)a->head_dim + (size_t)(a->window > 0 ? a->window : 1) + 4) * sizeof(float);
    if (smem > c->prop.sharedMemPerBlockOptin) {
        g4c_note(c, cudaErrorInvalidValue, "local_attention: head size plus window too large for one block");
        return;
    }
    g4c_launch(c, local_attention_kernel, dim3((unsigned)a->n, (unsigned)a->heads), dim3(128), smem, *a);
}

/* Lets the attention kernels of the towers use up to the device's shared memory per block. */
void g4c_towers_init(g4c *c) {
    g4c_allow_smem(c, attention_dense_kernel);
    g4c_allow_smem(c, local_attention_kernel);
}

G4_TRACE_TU(towers)
