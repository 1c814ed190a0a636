/* Matrix products of the CUDA backend (src/backend/backend.h: matmul, matmul_set).
 *
 * Up to G4C_GEMV_MAX tokens (decode, small steps): a GEMV that streams each weight row once from device
 * memory and multiplies it with every token's row. Each block stages the token rows (times the norm weight)
 * in shared memory, 40 KB at a time; a group of `wpr` warps owns a row (wpr grows when a matrix has few rows,
 * so that the grid still fills the GPU); each lane loads 16 bytes (8 weights) per access, four accesses in
 * flight, the next four issued before the current ones are used, and the group sums with shuffles and shared
 * memory. The weight loads of a block's first row are issued before the kernel waits for its predecessor (see
 * cuda_common.cuh). Fused: the input's RMSNorm (each block computes 1/rms itself: it is a dot product's
 * scale), bias, the GeGLU of gate/up pairs (a group reads gate row r and up row r together) or against a
 * given multiplier, the soft-cap.
 *
 * More tokens (prefill): tensor-core products through cuBLAS (cuda_blas.cu) and one epilogue kernel. */
#include "backend/cuda/cuda_common.cuh"

#define G4C_GEMV_MAX 8
#define GEMV_THREADS 256
#define GEMV_UNROLL 4

int g4c_gemv_max_tokens(void) { return G4C_GEMV_MAX; }

typedef struct gemv_args {
    const unsigned char *w[G4_MATMUL_SET_MAX];
    const float *bias[G4_MATMUL_SET_MAX];
    float *y[G4_MATMUL_SET_MAX];
    int out[G4_MATMUL_SET_MAX];
    int count;
    size_t row_bytes;
    const float *x;
    int n, in;
    const float *norm;
    float eps;
    int geglu; /* 0 none, 1 gate/up pairs (w[0] row r with w[1] row r), 2 gelu(y0) * mul */
    const float *mul;
    float softcap;
    float scale; /* of the sums, before bias and epilogue */
    const float *res_h, *res_o, *res_w; /* residual prologue (one token, one tile): x = res_out = ... */
    float res_scale;
    float *res_out;
    int rows; /* row groups: out[0] for pairs, else the sum of out */
    int wpr;  /* warps per row group: 1, 2, 4 or 8 */
    int xvec; /* x rows are 16-byte aligned */
    int ktile; /* input elements staged in shared memory at a time (a multiple of 8) */
} gemv_args;

/* raw 16-byte words of 8 weights, and their decoding */
template <int DT> struct wraw {
    enum { WORDS = DT == G4_F32 ? 2 : 1 };
};

template <int DT>
static __device__ __forceinline__ void raw_load(const unsigned char *row, int k, uint4 *r) {
    if (DT == G4_F32) {
        r[0] = g4_ld_stream(row + (size_t)k * 4);
        r[wraw<DT>::WORDS - 1] = g4_ld_stream(row + (size_t)k * 4 + 16);
    } else {
        r[0] = g4_ld_stream(row + (size_t)k * 2);
    }
}

template <int DT> static __device__ __forceinline__ void raw_decode(const uint4 *r, float w[8]) {
    if (DT == G4_F32) {
        w[0] = __uint_as_float(r[0].x), w[1] = __uint_as_float(r[0].y), w[2] = __uint_as_float(r[0].z);
        w[3] = __uint_as_float(r[0].w);
        w[4] = __uint_as_float(r[wraw<DT>::WORDS - 1].x), w[5] = __uint_as_float(r[wraw<DT>::WORDS - 1].y);
        w[6] = __uint_as_float(r[wraw<DT>::WORDS - 1].z), w[7] = __uint_as_float(r[wraw<DT>::WORDS - 1].w);
    } else {
        const unsigned u[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
        for (int i = 0; i < 4; i++) {
            if (DT == G4_BF16) {
                w[2 * i] = __uint_as_float(u[i] << 16);
                w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
            } else {
                w[2 * i] = g4_h2f((uint16_t)(u[i] & 0xffffu));
                w[2 * i + 1] = g4_h2f((uint16_t)(u[i] >> 16));
            }
        }
    }
}

/* The accesses k, k + step, ... (UN of them, those below len) of the rows rp from element t0. */
template <int DT, int RP, int UN>
static __device__ __forceinline__ void issue(const unsigned char *const *rp, int t0, int k, int step, int len,
                                             uint4 (*pre)[UN][wraw<DT>::WORDS]) {
#pragma unroll
    for (int u = 0; u < UN; u++)
#pragma unroll
        for (int r = 0; r < RP; r++)
            if (k + u * step < len) raw_load<DT>(rp[r], t0 + k + u * step, pre[r][u]);
}

/* product p and its local row of a row of the set's concatenated row space */
static __device__ __forceinline__ int which_product(const gemv_args &a, int row, int *local) {
    int p = 0;
    while (p + 1 < a.count && row >= a.out[p]) row -= a.out[p++];
    *local = row;
    return p;
}

static __device__ __forceinline__ void row_pointers(const gemv_args &a, int row, int rp_n, const unsigned char **rp) {
    for (int r = 0; r < rp_n; r++) {
        int local, p = rp_n == 2 ? r : which_product(a, row, &local);
        if (rp_n == 2) local = row;
        rp[r] = a.w[p] + (size_t)local * a.row_bytes;
    }
}

/* Stages x'[t][k0 .. k0+len) = x[t][k] * (norm ? norm[k] : 1) for t < n into xs [NT][ld], zeros past `in`. */
template <int NT>
static __device__ __forceinline__ void stage_x(const gemv_args &a, float *xs, int ld, int k0, int len) {
    for (int t = 0; t < NT && t < a.n; t++) {
        const float *x = a.x + (size_t)t * (size_t)a.in;
        float *d = xs + (size_t)t * ld;
        if (a.xvec) {
            for (int k = threadIdx.x * 4; k < len; k += GEMV_THREADS * 4) {
                const int kk = k0 + k;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (kk + 4 <= a.in) {
                    v = *(const float4 *)(x + kk);
                    if (a.norm) {
                        const float4 w = *(const float4 *)(a.norm + kk);
                        v.x *= w.x, v.y *= w.y, v.z *= w.z, v.w *= w.w;
                    }
                }
                *(float4 *)(d + k) = v;
            }
        } else {
            for (int k = threadIdx.x; k < len; k += GEMV_THREADS) {
                const int kk = k0 + k;
                d[k] = kk < a.in ? x[kk] * (a.norm ? a.norm[kk] : 1.0f) : 0.0f;
            }
        }
    }
}

/* A block of 8 warps; a group of wpr warps owns a row (pairs: gate row and up row). The block stages the
 * inputs (normalized) in shared memory, one tile of ktile elements at a time; each lane streams 16 bytes of
 * weights per access, GEMV_UNROLL accesses in flight, the next ones issued before the current are used. */
template <int DT, int NT, int RP, int UN = GEMV_UNROLL>
__global__ __launch_bounds__(GEMV_THREADS) void gemv_kernel(gemv_args a) {
    constexpr int W = wraw<DT>::WORDS;
    G4_DYN_SMEM(float, xs); /* [NT][ktile] */
    __shared__ float red[8][RP * NT];
    __shared__ float inv_rms[NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wpr = a.wpr, groups = 8 / wpr, g = warp / wpr, sub = warp % wpr;
    const int step = wpr * 256, k0 = (sub * 32 + lane) * 8;
    const int kt = a.ktile, ntiles = (a.in + kt - 1) / kt;

    /* prefetch the first accesses of the first row: weights only, before waiting for the previous kernel */
    int row = blockIdx.x * groups + g;
    const unsigned char *rp[RP] = {};
    uint4 pre[RP][UN][W];
    const int first_len = a.in < kt ? a.in : kt;
    if (row < a.rows) {
        row_pointers(a, row, RP, rp);
        issue<DT, RP, UN>(rp, 0, k0, step, first_len, pre);
    }
    g4_grid_wait();
    if (NT == 1 && a.res_out) { /* the residual update (one token): into xs, then its 1/rms and the norm */
        float so = 0.0f;
        for (int i = threadIdx.x; i < a.in; i += GEMV_THREADS) {
            so += a.res_o[i] * a.res_o[i];
            if ((i & 31) == 0) { /* what the next pass reads, into L1 meanwhile */
                g4_prefetch_l1(a.res_h + i), g4_prefetch_l1(a.res_w + i);
                if (a.norm) g4_prefetch_l1(a.norm + i);
            }
        }
        const float inv_o = rsqrtf(g4_block_sum(so, &red[0][0]) / (float)a.in + a.eps);
        float sh = 0.0f;
        for (int i = threadIdx.x; i < kt; i += GEMV_THREADS) {
            float hn = 0.0f;
            if (i < a.in) {
                hn = (a.res_h[i] + a.res_o[i] * inv_o * a.res_w[i]) * a.res_scale;
                if (blockIdx.x == 0) a.res_out[i] = hn;
            }
            sh += hn * hn;
            xs[i] = a.norm && i < a.in ? hn * a.norm[i] : hn;
        }
        const float ssum = g4_block_sum(sh, &red[0][0]);
        if (threadIdx.x == 0) inv_rms[0] = rsqrtf(ssum / (float)a.in + a.eps);
    } else if (a.norm) { /* 1/rms of each token's input row, all threads */
        float ss[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            ss[t] = 0.0f;
            if (t < a.n)
                for (int i = threadIdx.x; i < a.in; i += GEMV_THREADS) {
                    const float v = a.x[(size_t)t * a.in + i];
                    ss[t] += v * v;
                    if (t == 0 && (i & 31) == 0) g4_prefetch_l1(a.norm + i); /* staged next */
                }
            ss[t] = g4_warp_sum(ss[t]);
        }
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) red[warp][t] = ss[t];
        __syncthreads();
        if (threadIdx.x < NT) {
            float s = 0.0f;
            for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
            inv_rms[threadIdx.x] = rsqrtf(s / (float)a.in + a.eps);
        }
    }
    if (ntiles == 1 && !(NT == 1 && a.res_out)) stage_x<NT>(a, xs, kt, 0, kt);
    __syncthreads();
    g4_grid_launch_dependents();

    for (int base = blockIdx.x * groups; base < a.rows; base += gridDim.x * groups) {
        row = base + g;
        const int active = row < a.rows;
        float acc[RP][NT];
#pragma unroll
        for (int r = 0; r < RP; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        for (int tile = 0; tile < ntiles; tile++) {
            const int t0 = tile * kt, len = a.in - t0 < kt ? a.in - t0 : kt;
            if (ntiles > 1) { /* (the grid covers every row once when there are several tiles) */
                if (tile > 0) __syncthreads();
                stage_x<NT>(a, xs, kt, t0, (len + 7) & ~7);
                __syncthreads();
                if (tile > 0 && active) issue<DT, RP, UN>(rp, t0, k0, step, len, pre);
            }
            if (!active) continue;
            for (int k = k0; k < len; k += step * UN) {
                uint4 cur[RP][UN][W];
#pragma unroll
                for (int u = 0; u < UN; u++)
#pragma unroll
                    for (int r = 0; r < RP; r++)
#pragma unroll
                        for (int q = 0; q < W; q++) cur[r][u][q] = pre[r][u][q];
                issue<DT, RP, UN>(rp, t0, k + step * UN, step, len, pre); /* the next, before these are used */
#pragma unroll
                for (int u = 0; u < UN; u++) {
                    const int kk = k + u * step;
                    if (kk < len) {
                        float w[RP][8];
#pragma unroll
                        for (int r = 0; r < RP; r++) raw_decode<DT>(cur[r][u], w[r]);
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            const float4 x0 = *(const float4 *)(xs + (size_t)t * kt + kk);
                            const float4 x1 = *(const float4 *)(xs + (size_t)t * kt + kk + 4);
#pragma unroll
                            for (int r = 0; r < RP; r++)
                                acc[r][t] += w[r][0] * x0.x + w[r][1] * x0.y + w[r][2] * x0.z + w[r][3] * x0.w +
                                             w[r][4] * x1.x + w[r][5] * x1.y + w[r][6] * x1.z + w[r][7] * x1.w;
                        }
                    }
                }
            }
        }
        /* the next row group's first accesses, in flight while this one's sums are formed */
        const int next = base + (int)gridDim.x * groups + g;
        if (next < a.rows) {
            row_pointers(a, next, RP, rp);
            issue<DT, RP, UN>(rp, 0, k0, step, first_len, pre);
        }
        /* the group's sums */
#pragma unroll
        for (int r = 0; r < RP; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = g4_warp_sum(acc[r][t]);
        if (wpr > 1) {
            __syncthreads();
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < RP; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) red[warp][r * NT + t] = acc[r][t];
            __syncthreads();
            if (sub == 0)
#pragma unroll
                for (int r = 0; r < RP; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        float s = 0.0f;
                        for (int j = 0; j < wpr; j++) s += red[warp + j][r * NT + t];
                        acc[r][t] = s;
                    }
        }
        if (active && sub == 0 && lane < a.n && lane < NT) { /* lane t writes token t */
            const int t = lane;
            float v[RP];
#pragma unroll
            for (int r = 0; r < RP; r++) {
                float s = 0.0f;
#pragma unroll
                for (int q = 0; q < NT; q++)
                    if (q == t) s = acc[r][q];
                v[r] = (a.norm ? s * inv_rms[t] : s) * a.scale;
            }
            if (RP == 2) { /* gate/up pair */
                float gt = v[0] + (a.bias[0] ? a.bias[0][row] : 0.0f);
                float up = v[RP - 1] + (a.bias[1] ? a.bias[1][row] : 0.0f);
                float y = g4_gelu_tanh(gt) * up;
                if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
                a.y[0][(size_t)t * a.out[0] + row] = y;
            } else {
                int local, p = which_product(a, row, &local);
                float y = v[0] + (a.bias[p] ? a.bias[p][local] : 0.0f);
                if (a.geglu == 2) y = g4_gelu_tanh(y) * a.mul[(size_t)t * a.out[0] + local];
                if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
                a.y[p][(size_t)t * a.out[p] + local] = y;
            }
        }
    }
}

template <int DT, int RP> static void launch_gemv_nt(g4c *c, gemv_args a, unsigned row_blocks) {
    const int nt = a.n <= 1 ? 1 : a.n <= 2 ? 2 : a.n <= 4 ? 4 : 8;
    /* a tile of the inputs: as much of the row as c->gemv_smem holds for nt tokens */
    const int in8 = (a.in + 7) & ~7, most = (int)(c->gemv_smem / sizeof(float)) / nt / 256 * 256;
    a.ktile = in8 <= most ? in8 : most;
    const size_t smem = (size_t)nt * a.ktile * sizeof(float);
    /* one tile: a block may own several row groups (capped grid); several: every group has its block */
    unsigned blocks = row_blocks;
    if (a.ktile == in8 && blocks > (unsigned)(c->n_sm * c->gemv_cap)) blocks = (unsigned)(c->n_sm * c->gemv_cap);
    const dim3 grid(blocks);
    if (nt == 1)
        g4c_launch(c, gemv_kernel<DT, 1, RP>, grid, dim3(GEMV_THREADS), smem, a);
    else if (nt == 2)
        g4c_launch(c, gemv_kernel<DT, 2, RP>, grid, dim3(GEMV_THREADS), smem, a);
    else if (nt == 4)
        g4c_launch(c, gemv_kernel<DT, 4, RP>, grid, dim3(GEMV_THREADS), smem, a);
    else
        g4c_launch(c, gemv_kernel<DT, 8, RP>, grid, dim3(GEMV_THREADS), smem, a);
}

template <int DT, int RP> static void allow_gemv_smem(g4c *c) {
    g4c_allow_smem(c, gemv_kernel<DT, 1, RP>), g4c_allow_smem(c, gemv_kernel<DT, 2, RP>);
    g4c_allow_smem(c, gemv_kernel<DT, 4, RP>), g4c_allow_smem(c, gemv_kernel<DT, 8, RP>);
}

void g4c_gemv_init(g4c *c) {
    if (c->gemv_smem <= 48 * 1024 - 1024) return;
    allow_gemv_smem<G4_BF16, 1>(c), allow_gemv_smem<G4_BF16, 2>(c), allow_gemv_smem<G4_F16, 1>(c);
    allow_gemv_smem<G4_F16, 2>(c), allow_gemv_smem<G4_F32, 1>(c), allow_gemv_smem<G4_F32, 2>(c);
}

template <int RP> static void launch_gemv_dt(g4c *c, g4_dtype dt, const gemv_args &a, unsigned row_blocks) {
    switch (dt) {
    case G4_BF16: launch_gemv_nt<G4_BF16, RP>(c, a, row_blocks); break;
    case G4_F16: launch_gemv_nt<G4_F16, RP>(c, a, row_blocks); break;
    default: launch_gemv_nt<G4_F32, RP>(c, a, row_blocks); break;
    }
}

static void gemv(g4c *c, const float *x, int n, const g4_matmul_set *set, float scale) {
    gemv_args a;
    memset(&a, 0, sizeof a);
    a.scale = scale;
    const int in = (int)set->w[0]->shape[set->w[0]->ndim - 1];
    if (set->res_out) {
        if (n == 1 && in <= (int)(c->gemv_smem / sizeof(float)) && set->res_out != set->res_h) { /* fused */
            a.res_h = set->res_h, a.res_o = set->res_o, a.res_w = set->res_w, a.res_scale = set->res_scale;
            a.res_out = set->res_out;
        } else {
            g4c_residual(c, set->res_h, set->res_o, set->res_w, n, in, set->eps, set->res_scale, set->res_out);
        }
        x = set->res_out;
    }
    const g4_tensor *w0 = set->w[0];
    a.count = set->count;
    a.in = (int)w0->shape[w0->ndim - 1];
    a.row_bytes = g4c_row_bytes(w0->dtype, a.in);
    for (int i = 0; i < set->count; i++) {
        a.w[i] = (const unsigned char *)set->w[i]->data;
        a.bias[i] = set->bias[i];
        a.y[i] = set->y[i];
        a.out[i] = (int)set->w[i]->shape[0];
    }
    a.x = x;
    a.n = n;
    a.norm = set->norm;
    a.eps = set->eps;
    a.softcap = set->softcap;
    const int pairs = set->geglu && set->count == 2;
    a.geglu = pairs ? 1 : set->geglu ? 2 : 0;
    a.mul = set->mul;
    a.rows = 0;
    if (pairs)
        a.rows = a.out[0];
    else
        for (int i = 0; i < set->count; i++) a.rows += a.out[i];
    a.xvec = (a.in % 4 == 0) && ((uintptr_t)x % 16 == 0) && ((uintptr_t)set->norm % 16 == 0);
    /* warps per row: enough row groups for two blocks per multiprocessor; no more warps than 256-element
     * slices of a row (measured on an H200, ncu: more warps per row, for a full wave of 32 warps per
     * multiprocessor, made the E2B q/k/v and down products 20-30% slower) */
    int wpr = 1;
    while (wpr < 8 && a.rows * wpr < c->gemv_blocks_per_sm * 8 * c->n_sm && wpr * 256 < a.in) wpr *= 2;
    a.wpr = wpr;
    const int groups = 8 / wpr;
    const unsigned row_blocks = (unsigned)((a.rows + groups - 1) / groups);
    if (pairs)
        launch_gemv_dt<2>(c, w0->dtype, a, row_blocks);
    else
        launch_gemv_dt<1>(c, w0->dtype, a, row_blocks);
}

/* ---------------------------------------------------------------- prefill: epilogue after tensor-core products */
typedef struct epi_args {
    float *y0;
    const float *y1;    /* up (pairs) */
    const float *mul;   /* [n, out] (geglu with one product) */
    const float *bias0, *bias1;
    int n, out;
    int geglu;          /* 0, 1 pairs, 2 mul */
    float softcap;
    float scale;        /* of y0 before the bias */
} epi_args;

__global__ void gemm_epilogue(epi_args a) {
    g4_grid_wait();
    const size_t total = (size_t)a.n * (size_t)a.out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i % (size_t)a.out);
        float y = a.y0[i] * a.scale + (a.bias0 ? a.bias0[r] : 0.0f);
        if (a.geglu == 1) y = g4_gelu_tanh(y) * (a.y1[i] + (a.bias1 ? a.bias1[r] : 0.0f));
        if (a.geglu == 2) y = g4_gelu_tanh(y) * a.mul[i];
        if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
        a.y0[i] = y;
    }
}

static void epilogue(g4c *c, epi_args a) {
    if (a.scale == 0.0f) a.scale = 1.0f;
    const size_t total = (size_t)a.n * (size_t)a.out;
    unsigned blocks = (unsigned)((total + 255) / 256);
    if (blocks > (unsigned)c->n_sm * 16) blocks = (unsigned)c->n_sm * 16;
    g4c_launch(c, gemm_epilogue, dim3(blocks), dim3(256), 0, a);
}

static void gemm_set(g4c *c, const float *x, int n, const g4_matmul_set *set) {
    const int pairs = set->geglu && set->count == 2;
    if (set->res_out) {
        g4c_residual(c, set->res_h, set->res_o, set->res_w, n, (int)set->w[0]->shape[set->w[0]->ndim - 1], set->eps,
                     set->res_scale, set->res_out);
        x = set->res_out;
    }
    g4c_gemm_in in;
    if (g4c_gemm_input(c, x, n, (int)set->w[0]->shape[set->w[0]->ndim - 1], set->norm, set->eps, set->w[0]->dtype, &in))
        return;
    for (int i = 0; i < set->count; i++) {
        g4c_gemm_run(c, &in, set->w[i], set->y[i]);
        const int out = (int)set->w[i]->shape[0];
        if (pairs && i == 0) continue; /* the pair's epilogue runs after the up product */
        epi_args e;
        memset(&e, 0, sizeof e);
        e.y0 = pairs ? set->y[0] : set->y[i];
        e.bias0 = pairs ? set->bias[0] : set->bias[i];
        e.n = n;
        e.out = out;
        e.softcap = set->softcap;
        if (pairs) {
            e.geglu = 1;
            e.y1 = set->y[1];
            e.bias1 = set->bias[1];
        } else if (set->geglu) {
            e.geglu = 2;
            e.mul = set->mul;
        }
        if (e.geglu || e.bias0 || e.softcap > 0) epilogue(c, e);
    }
}

void g4c_matmul_set(g4_backend *be, const float *x, int n, const g4_matmul_set *set) {
    g4c *c = g4c_of(be);
    if (n <= 0 || set->count <= 0) return;
    int uniform = 1;
    for (int i = 1; i < set->count; i++) uniform &= set->w[i]->dtype == set->w[0]->dtype;
    if (!uniform) { /* weights of different types: one product at a time, then the epilogue */
        if (set->res_out) {
            g4c_residual(c, set->res_h, set->res_o, set->res_w, n, (int)set->w[0]->shape[set->w[0]->ndim - 1],
                         set->eps, set->res_scale, set->res_out);
            x = set->res_out;
        }
        for (int i = 0; i < set->count; i++) {
            g4_matmul_set one;
            memset(&one, 0, sizeof one);
            one.count = 1;
            one.w[0] = set->w[i];
            one.bias[0] = set->bias[i];
            one.y[0] = set->y[i];
            one.norm = set->norm;
            one.eps = set->eps;
            g4c_matmul_set(be, x, n, &one);
        }
        for (int i = 0; i < set->count; i++) {
            epi_args e;
            memset(&e, 0, sizeof e);
            e.y0 = set->y[i];
            e.n = n;
            e.out = (int)set->w[i]->shape[0];
            e.softcap = set->softcap;
            if (i == 0 && set->geglu) {
                e.geglu = set->count == 2 ? 1 : 2;
                e.y1 = set->y[1];
                e.mul = set->mul;
            }
            if (i > 0 && set->geglu) continue;
            if (e.geglu || e.softcap > 0) epilogue(c, e);
        }
        return;
    }
    if (n <= G4C_GEMV_MAX)
        gemv(c, x, n, set, 1.0f);
    else
        gemm_set(c, x, n, set);
}

void g4c_matmul_scaled(g4c *c, const float *x, int n, const g4_tensor *w, const float *norm, float eps, float scale,
                       float *y) {
    g4_matmul_set set;
    memset(&set, 0, sizeof set);
    set.count = 1;
    set.w[0] = w;
    set.y[0] = y;
    set.norm = norm;
    set.eps = eps;
    if (n <= G4C_GEMV_MAX) {
        gemv(c, x, n, &set, scale);
        return;
    }
    g4c_gemm_in in;
    if (g4c_gemm_input(c, x, n, (int)w->shape[w->ndim - 1], norm, eps, w->dtype, &in)) return;
    g4c_gemm_run(c, &in, w, y);
    epi_args e;
    memset(&e, 0, sizeof e);
    e.y0 = y;
    e.n = n;
    e.out = (int)w->shape[0];
    e.scale = scale;
    epilogue(c, e);
}

void g4c_matmul(g4_backend *be, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    g4_matmul_set set;
    memset(&set, 0, sizeof set);
    set.count = 1;
    set.w[0] = w;
    set.bias[0] = bias;
    set.y[0] = y;
    g4c_matmul_set(be, x, n, &set);
}
