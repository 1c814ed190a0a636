/* Matrix products of the CUDA backend (src/backend/backend.h: matmul, matmul_set).
 *
 * Up to G4C_GEMV_MAX tokens (decode, small steps): a GEMV that streams each weight row once from device
 * memory and multiplies it with every token's row. Each block stages the token rows (times the norm weight)
 * in shared memory, 96 KB at a time (G4_CUDA_GEMV_SMEM_KB); a group of `wpr` warps owns a row (wpr grows when a
 * matrix has few rows, so that the grid still fills the GPU; a block takes fewer groups than it has warps for when
 * that gives every multiprocessor the same number of rows: H200, E4B bf16 decode 3.70 -> 3.57 ms); each lane loads
 * 16 bytes (8 weights) per access, four accesses in flight, the next four issued before the current ones are used,
 * and the group sums with shuffles and shared memory. The weight loads of a block's first row are issued before the
 * kernel waits for its predecessor (see cuda_common.cuh). Fused: the input's RMSNorm (each block computes 1/rms
 * itself: it is a dot product's scale), bias, the GeGLU of gate/up pairs (a group reads gate row r and up row r
 * together) or against a given multiplier, the soft-cap.
 *
 * Quantized weights (cuda_common.cuh, g4_qt) go through the same kernel: an access of a lane is then a run of
 * EPA codes (32 or 64, 16-32 bytes of 16-byte loads) and the word of its scales, fewer accesses in flight (about
 * 64 bytes of codes per lane); each segment of codes sharing a scale is summed as sum(v x) with the codes turned
 * into floats by a byte permute and one subtraction (no int-to-float conversions), then scaled, plus the
 * segment's offset times sum(x) (per 32 inputs, computed once per block when the inputs are staged). Every
 * quantized type here (G4C_QUANT_TYPES) instead reads the inputs as int8 blocks (the Q8_0 rule of the CPU's matmul_q8.c, as llama.cpp: d =
 * max|x|/127 per 32 of the normalized input, q = rint(x/d)), quantized by each block while it stages them (no
 * float copy, so a tile holds about 3x the inputs), and multiply them with __dp4a (4 byte products an
 * instruction; Q4_0's nibbles unpacked by masks and shifts of 32-bit words, its -8 taken as 8 * sum(q) per
 * block; MLX4's inputs staged as the even then the odd elements of each 8, its codes' order; MLX8's codes
 * taken as code - 128, then + 128 * sum(q); Q4_K's codes, uploaded in Q4_0's order, as Q4_0's; Q5_0's and Q5_K's
 * as Q4_0's nibbles with each one's fifth bit moved to bit 4 of its byte; Q6_K's as signed bytes code - 32, each
 * half's integer sum times its integer scale): per 32 weights
 * acc += d * (dw * integer sum + bw * sum(q)) (bw the MLX bias, Q4_K's -dmin * min; Q2_K, whose min is per 16,
 * takes each half's sum(q) times its integer min in a second integer sum, dot32m), the same arithmetic per token for any step size. With G4_NO_INT8_ACT set (c->float_act, as the
 * CPU: comparisons of the stored weights' exact products) they take the float path too. The router of the MoE
 * block (g4c_matmul_scaled) always multiplies float activations (int8 ones picked other experts on the moe
 * fixture) and stays on this GEMV in steps of G4C_GEMV_MAX tokens for every step size when it is quantized,
 * so that it reads exact weights.
 *
 * The experts of a MoE block for one token (g4c_gemv_experts, cuda_moe.cu) run through the same kernel (EX): row r
 * is a row of the matrix of the expert its slot chose (read on the device after the wait, so no weight is loaded
 * before it), and down's slots each read their own staged input row.
 *
 * bf16 weights with 3 to 8 tokens (speculative verification, a few sequences' decode) take tensor cores instead
 * (gemv_tc below): the inputs converted once to bf16 hi + lo parts, each weight read once for all the tokens; so do
 * the quantized types of one scale per 32-block with 5 to 24 tokens (gemv_mmq: int8 products of the inputs' int8
 * blocks; c->gemv_mmq_min, c->mmq_dense_max).
 *
 * More tokens (prefill): tensor-core products through cuBLAS (cuda_blas.cu; quantized weights decoded to bf16
 * tiles first) and one epilogue kernel. */
#include "backend/cuda/cuda_gemv.cuh"

int g4c_gemv_max_tokens(void) { return G4C_GEMV_MAX; }

/* the float types' launches (the quantized ones': cuda_gemv_quant_a.cu, cuda_gemv_quant_b.cu) */
GEMV_TYPE_FUNCTIONS(G4_BF16)
GEMV_TYPE_FUNCTIONS(G4_F16)
GEMV_TYPE_FUNCTIONS(G4_F32)

void g4c_gemv_init(g4c *c) {
    if (c->gemv_smem <= 48 * 1024 - 1024) return;
#define ALLOW(T) g4c_gemv_allow_##T(c);
    G4C_WEIGHT_TYPES(ALLOW)
#undef ALLOW
}

static void launch_gemv_dt(g4c *c, g4_dtype dt, const gemv_args &a, unsigned row_blocks, int pairs, int fa, int ex) {
    switch (dt) {
#define LAUNCH(T)                                                                                                  \
    case T: g4c_gemv_launch_##T(c, a, row_blocks, pairs, fa, ex); break;
        G4C_WEIGHT_TYPES(LAUNCH)
#undef LAUNCH
    default: g4c_gemv_launch_G4_F32(c, a, row_blocks, pairs, fa, ex); break;
    }
}

/* Warps per row: enough row groups for 16 warps a multiprocessor with float weights, 8 with quantized ones
 * (G4_CUDA_GEMV_BLOCKS x 8; with 16-warp blocks, H200: E2B Q4_0 decode 2.077 ms at 16, 1.999 at 8; bf16 2.396 at 16,
 * 2.515 at 8); no more warps than 256-element slices of a row (measured on an H200, ncu: more warps per row, for a
 * full wave of 32 warps per multiprocessor, made the E2B q/k/v and down products 20-30% slower). Then the launch. */
static void gemv_launch(g4c *c, gemv_args *a, g4_dtype dt, int pairs, int fa) {
    const int ex = a->ex != NULL, quant = g4_dtype_is_quantized(dt);
    const int bps = c->gemv_blocks_per_sm ? c->gemv_blocks_per_sm : quant ? 1 : 2;
    int wpr = 1;
    const gemv_type gt = gemv_type_of(dt);
    const int epa = gt.epa;
    while (wpr < 8 && a->rows * wpr < bps * 8 * c->n_sm && wpr * 32 * epa < a->in) wpr *= 2;
    a->wpr = wpr;
    /* lanes per row (quantized weights: a plain type's row is 4 times as many accesses): fewer than a warp while
     * there are rows enough for every group and a lane's share of a row stays within 3 x the unroll (about 192
     * bytes of codes), so that every warp has more of its rows' weights in flight (a warp's row of 1536 4-bit weights
     * is 1.5 accesses a lane). H200, Q4_0 decode ms, whole warps / at most 2 x the unroll / 3 x (both with the
     * balanced passes of launch_gemv_nt): E2B 1.840 / 1.717 / 1.718, E4B 2.620 / 2.514 / 2.446, 26B-A4B 2.916 / 2.571
     * / 2.468, 12B 3.739 / 3.618 / 3.617, 31B 7.763 / 7.628 / 7.232 */
    int lpr = 32;
    const int acc = (a->in + epa - 1) / epa, warps = c->n_sm * GEMV_WARPS * bps, un = gt.unroll;
    const int most = c->gemv_lane_acc ? c->gemv_lane_acc : 3 * un;
    while (quant && wpr == 1 && lpr > c->gemv_lanes && (acc + lpr / 2 - 1) / (lpr / 2) <= most &&
           (long)a->rows > (long)warps * (32 / lpr))
        lpr /= 2;
    a->lpr = lpr;
    /* float4 staging of the inputs (the scalar loop made every bf16 product 7-11% slower, H200) */
    a->xvec = (a->in % 4 == 0) && ((uintptr_t)a->x % 16 == 0) && ((uintptr_t)a->norm % 16 == 0);
    const int groups = GEMV_WARPS / wpr * (32 / lpr);
    const unsigned row_blocks = (unsigned)((a->rows + groups - 1) / groups);
    launch_gemv_dt(c, dt, *a, row_blocks, pairs, fa, ex);
}

/* The arguments of a set's products of n tokens common to the GEMV and gemv_tc (the inputs, the residual prologue
 * and the launch shape are each's own); returns whether the set is a gate/up pair */
static int set_args(gemv_args *a, const g4_matmul_set *set, int n, float scale) {
    memset(a, 0, sizeof *a);
    const g4_tensor *w0 = set->w[0];
    a->scale = scale;
    a->count = set->count;
    a->in = (int)w0->shape[w0->ndim - 1];
    a->row_bytes = g4c_wrow_bytes(w0);
    a->q = g4c_qrow_of(w0);
    for (int i = 0; i < set->count; i++) {
        a->w[i] = (const unsigned char *)set->w[i]->data;
        a->bias[i] = set->bias[i];
        a->y[i] = set->y[i];
        a->out[i] = (int)set->w[i]->shape[0];
    }
    a->n = n;
    a->softcap = set->softcap;
    const int pairs = set->geglu && set->count == 2;
    a->geglu = pairs ? 1 : set->geglu ? 2 : 0;
    a->mul = set->mul;
    for (int i = 0; i < (pairs ? 1 : set->count); i++) a->rows += a->out[i];
    return pairs;
}

static void gemv(g4c *c, const float *x, int n, const g4_matmul_set *set, float scale, int fa) {
    gemv_args a;
    const int pairs = set_args(&a, set, n, scale);
    if (set->res_out) {
        if (n == 1 && a.in <= gemv_most(c, 1, set->w[0]->dtype, fa) && set->res_out != set->res_h) { /* fused */
            a.res_h = set->res_h, a.res_o = set->res_o, a.res_w = set->res_w, a.res_scale = set->res_scale;
            a.res_out = set->res_out;
        } else {
            g4c_residual(c, set->res_h, set->res_o, set->res_w, n, a.in, set->eps, set->res_scale, set->res_out);
        }
        x = set->res_out;
    }
    const g4_tensor *w0 = set->w[0];
    a.x = x;
    a.norm = set->norm;
    a.eps = set->eps;
    gemv_launch(c, &a, w0->dtype, pairs, fa);
}

/* The experts' products of a MoE block for one token through the GEMV (cuda_common.cuh): the inputs as for the
 * dense products (int8 blocks for Q8_0, Q4_0, MLX4 and MLX8 unless c->float_act, as the CPU's experts). */
int g4c_gemv_experts_fit(g4c *c, const g4_tensor *w, int x_rows) {
    const int64_t in = w->shape[w->ndim - 1];
    return in % 32 == 0 && in <= gemv_most(c, x_rows, w->dtype, c->float_act);
}

void g4c_gemv_experts(g4c *c, const g4_tensor *w, const g4_tensor *up, int rows, const int32_t *ex, int slots,
                      const float *x, const float *norm, float eps, const int32_t *pair, const float *pw, float *y) {
    gemv_args a;
    memset(&a, 0, sizeof a);
    const int down = pair != NULL;
    a.scale = 1.0f;
    a.in = (int)w->shape[w->ndim - 1];
    a.row_bytes = g4c_wrow_bytes(w);
    a.q = g4c_qrow_of(w);
    a.count = down ? 1 : 2;
    a.w[0] = (const unsigned char *)w->data;
    a.w[1] = up ? (const unsigned char *)up->data : a.w[0] + (size_t)rows * a.row_bytes; /* up rows after gate's */
    a.ex_bytes[0] = (size_t)w->shape[w->ndim - 2] * a.row_bytes; /* one expert's matrix */
    a.ex_bytes[1] = up ? (size_t)up->shape[up->ndim - 2] * a.row_bytes : a.ex_bytes[0];
    a.ex = ex, a.ex_rows = rows, a.ex_pair = pair, a.ex_w = pw;
    a.y[0] = y;
    a.rows = a.out[0] = slots * rows;
    a.x = x, a.n = 1, a.xrows = down ? slots : 1;
    a.norm = norm, a.eps = eps;
    a.geglu = !down;
    gemv_launch(c, &a, w->dtype, !down, c->float_act);
}

/* ------------------------------------------------------- few tokens, bf16 weights: products on tensor cores */
/* Products of 3 to 8 tokens (c->gemv_tc_min: speculative verification, batched decode of a few sequences) with bf16
 * weights: the one-token GEMV widened to 8 token rows multiplies every weight with every row on CUDA cores and reads
 * the rows from shared memory for each weight, so that its time grows with the tokens (H100, E2B decode step of 8
 * tokens 2.96x one token's). Here the token rows are converted once (g4c_gemm_input: the RMSNorm, the residual
 * prologue, bf16 hi and lo parts) and multiplied on tensor cores as experts_tc_kernel (cuda_moe.cu) does: a warp
 * takes an m16 tile of weight rows (16 rows of the set's products, or the gate rows of 8 pairs (tile rows 0-7)
 * and their up rows (8-15), whose sums meet in each lane for the GeGLU) against the n8 tile of the tokens (columns
 * past n read zeros); within a step of 32 elements lane (g, q) holds elements 8q .. 8q + 7 of its rows and of its
 * token, the mma's k order permuted alike on both sides, so every load is 16 bytes; GTC_U steps of weights in flight.
 * A group of `split` warps of a block shares a tile, each a contiguous range of its steps, and sums through shared
 * memory; the group's first warp applies the epilogue (scale, bias, GeGLU pairs or against mul, soft-cap). Rows are
 * multiples of 8 elements (the caller checks). H200, random bf16 weights, a recorded step of P tokens (`gemma4c bench
 * --random CONFIG -p P -c 64 -n 1 -r 5`), against the GEMV's token tiles: E2B P = 2 / 3 / 4 / 5 / 8: 3.49 / 3.49 /
 * 3.50 / 3.57 / 3.57 ms against 2.81 / 3.93 / 4.09 / 6.53 / 7.15 (one token: 2.14); E4B P = 4 / 8: 5.91 / 6.04 against
 * 7.35 / 12.72; 26B-A4B P = 8: 8.08 against 11.65. E2B batched decode (bench/batch_speed.sh, 64 new tokens each): 4
 * sequences 967 against 808 tok/s, 8 sequences 1937 against 948. Still short of a one-token step: the conversion
 * is a launch of its own for each product, and gate/up took 30 us a call against the one-token GEMV's 22 (eager
 * profile). */
#define GTC_WARPS 8
#define GTC_U 4

/* The end of a warp's tile (gemv_tc_kernel, gemv_mmq_kernel): the sums of a tile's `split` warps added through
 * shared memory (red, a float4 a lane of each warp) into its group's first warp (every thread of the block calls it),
 * then that warp applies the epilogue (scale, bias, GeGLU pairs or against mul, soft-cap). Lane (g, q) holds tile
 * rows g (sums 0, 1) and g + 8 (2, 3) for tokens t0 + 2q and t0 + 2q + 1; the tile's rows start at r0 (row pairs:
 * gate rows g, up rows g + 8). */
static __device__ __forceinline__ void tc_split_sum(float acc[4], int split, float4 (*red)[32]) {
    if (split == 1) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    red[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp % split == 0)
        for (int j = 1; j < split; j++) {
            const float4 v = red[warp + j][lane];
            acc[0] += v.x, acc[1] += v.y, acc[2] += v.z, acc[3] += v.w;
        }
    __syncthreads(); /* (red is free for the next tile of tokens) */
}
template <int RP>
static __device__ __forceinline__ void tc_epilogue(const gemv_args &a, const float acc[4], int r0, int t0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int t = t0 + 2 * q + c;
        if (t >= a.n) continue;
        if (RP == 2) {
            const int row = r0 + g;
            if (row >= a.rows) continue;
            const float gt = acc[c] * a.scale + (a.bias[0] ? a.bias[0][row] : 0.0f);
            const float up = acc[2 + c] * a.scale + (a.bias[1] ? a.bias[1][row] : 0.0f);
            float y = g4_gelu_tanh(gt) * up;
            if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
            a.y[0][(size_t)t * a.out[0] + row] = y;
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = r0 + g + 8 * h;
                if (row >= a.rows) continue;
                int local;
                const int p = which_product(a, row, &local);
                float y = acc[2 * h + c] * a.scale + (a.bias[p] ? a.bias[p][local] : 0.0f);
                if (a.geglu == 2) y = g4_gelu_tanh(y) * a.mul[(size_t)t * a.out[0] + local];
                if (a.softcap > 0) y = tanhf(y / a.softcap) * a.softcap;
                a.y[p][(size_t)t * a.out[p] + local] = y;
            }
        }
    }
}

/* A tile's warps (gemv_tc, gemv_mmq): doubled while the grid stays within one wave of blocks (two a
 * multiprocessor) and each warp keeps at least 2 x `unroll` steps */
static int tc_split(const g4c *c, int tiles, int steps, int unroll) {
    int split = 1;
    while (split < GTC_WARPS && (tiles * split * 2 + GTC_WARPS - 1) / GTC_WARPS <= 2 * c->n_sm &&
           steps >= split * 2 * unroll)
        split *= 2;
    return split;
}

/* a tile's rows g and g + 8 (row pairs: gate row g, up row g), past the last row the last one (its sums are not
 * written) */
template <int RP>
static __device__ __forceinline__ void tc_rows(const gemv_args &a, int r0, int g, const unsigned char **ar) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = RP == 2 ? r0 + g : r0 + g + 8 * h;
        row = row < a.rows ? row : a.rows - 1;
        int local = row;
        const int p = RP == 2 ? h : which_product(a, row, &local);
        ar[h] = a.w[p] + (size_t)local * a.row_bytes;
    }
}
template <int RP>
__global__ __launch_bounds__(32 * GTC_WARPS, 2) void gemv_tc_kernel(gemv_args a, const uint16_t *xh, const uint16_t *xl,
                                                                    int split) {
#ifdef G4_CUDA_EMU
    __shared__ float scr[GTC_WARPS][384];
#else
    float *scr[GTC_WARPS] = {};
#endif
    __shared__ float4 red[GTC_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int sub = warp % split, tile = blockIdx.x * (GTC_WARPS / split) + warp / split;
    const int r0 = tile * (RP == 2 ? 8 : 16), K = a.in, steps = (K + 31) / 32;
    /* the warp's steps: a contiguous share of the tile's */
    const int per = (steps + split - 1) / split, kb = sub * per * 32;
    const int ke = (sub + 1) * per * 32 < K ? (sub + 1) * per * 32 : K;
    const unsigned char *ar[2];
    tc_rows<RP>(a, r0, g, ar);
    ar[0] += 16 * q, ar[1] += 16 * q;
    uint4 w[GTC_U][2];
    const auto load = [&](int k0) { /* GTC_U steps of both rows from k0 */
#pragma unroll
        for (int u = 0; u < GTC_U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                w[u][h] = k0 + 32 * u + 8 * q < ke ? g4_ld_stream(ar[h] + 2 * (size_t)(k0 + 32 * u)) : uint4();
    };
    load(kb);
    g4_grid_wait(); /* (the weights are in flight: the inputs are the previous kernel's) */
    g4_grid_launch_dependents();
    /* token g's row of hi parts and of lo parts (xl NULL: bf16 inputs only, G4_CUDA_GEMM=bf16) */
    const size_t xo = (size_t)g * K + 8 * q;
    const uint16_t *bhr = g < a.n ? xh + xo : (const uint16_t *)NULL, *blr = g < a.n && xl ? xl + xo : bhr;
    const int lo = xl != NULL;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = kb; k0 < ke; k0 += 32 * GTC_U) {
        if (k0 != kb) load(k0);
#pragma unroll
        for (int u = 0; u < GTC_U; u++) {
            const int k = k0 + 32 * u;
            if (k >= ke) break;
            uint4 bh = uint4(), bl = uint4();
            if (bhr && k + 8 * q < ke) {
                bh = __ldg((const uint4 *)(bhr + k));
                if (lo) bl = __ldg((const uint4 *)(blr + k));
            }
            g4_mma_bf16_step32(acc, w[u][0], w[u][1], bh, bl, lo, scr[warp]);
        }
    }
    tc_split_sum(acc, split, red);
    if (warp % split == 0) tc_epilogue<RP>(a, acc, r0, 0);
}

/* The set's products of n tokens (c->gemv_tc_min <= n <= G4C_GEMV_MAX) on gemv_tc_kernel where its weights are bf16
 * with rows of a multiple of 8 elements; returns 0 where the set does not take that form (nothing ran), -1 out of
 * memory. A tile's warps: as many as keep the grid within one wave of blocks (two a multiprocessor), up to
 * GTC_WARPS and a step of 32 a warp at least GTC_U times. */
static int gemv_tc(g4c *c, const float *x, int n, const g4_matmul_set *set) {
    const g4_tensor *w0 = set->w[0];
    const int in = (int)w0->shape[w0->ndim - 1];
    if (c->gemv_tc_min < 2 || n < c->gemv_tc_min || n > G4C_GEMV_MAX || w0->dtype != G4_BF16 || in % 8 != 0 ||
        g4c_wrow_bytes(w0) % 16 != 0)
        return 0;
    g4c_gemm_in hl;
    if (g4c_gemm_input(c, x, n, in, set->norm, set->eps, G4_BF16, &hl, set)) return -1;
    gemv_args a; /* (the inputs' norm and residual are in the converted rows) */
    const int pairs = set_args(&a, set, n, 1.0f);
    const int tiles = (a.rows + (pairs ? 7 : 15)) / (pairs ? 8 : 16), steps = (in + 31) / 32;
    const int split = tc_split(c, tiles, steps, GTC_U);
    const unsigned blocks = (unsigned)((tiles + GTC_WARPS / split - 1) / (GTC_WARPS / split));
    if (pairs)
        g4c_launch(c, gemv_tc_kernel<2>, dim3(blocks), dim3(32 * GTC_WARPS), 0, a, (const uint16_t *)hl.hi,
                   (const uint16_t *)hl.lo, split);
    else
        g4c_launch(c, gemv_tc_kernel<1>, dim3(blocks), dim3(32 * GTC_WARPS), 0, a, (const uint16_t *)hl.hi,
                   (const uint16_t *)hl.lo, split);
    return 1;
}

/* ------------------------------------------------- few tokens, quantized weights: int8 products on tensor cores */
/* Products of 5 to 8 tokens (c->gemv_mmq_min; and of 9 to c->mmq_dense_max below) with weights of one scale (and offset) per 32-block
 * (MMQ_DENSE_TYPES): on the GEMV's token tiles every 4 codes took a __dp4a for each token. Here the token rows are
 * made int8 blocks once (g4c_q8_rows: the residual prologue, the RMSNorm, the rule of the GEMV's int8 activations)
 * and a warp multiplies an m16 tile of weight rows (or 8 gate/up pairs, as gemv_tc) with the tokens' n8 tile on
 * tensor cores, a block of 32 a step (mma.m16n8k32 .s8: lane (g, t) gives elements 4t .. 4t + 3 and 16 + 4t .. 16 +
 * 4t + 3 of rows g and g + 8 and of token g, which in Q4_0's nibble order is word t of the block's codes, its low
 * and high nibbles); each step's integer sums times the weight's and the token's scales into f32 sums (plus the
 * offset times the token block's sum of codes: the K-quants), the integer products of exactly the GEMV's codes. A
 * lane loads its 4-byte words of several blocks of both rows ahead (the quad's four words of a row are one 16-byte
 * piece); the tile's steps split over warps and the epilogue as gemv_tc. */
#define MMQ_DENSE_TYPES(X) X(G4_Q8_0) X(G4_Q4_0) X(G4_Q5_0) X(G4_IQ4_NL) X(G4_MXF4) X(G4_Q4_K) X(G4_Q5_K)

/* A lane's words of block b of a weight row (in elements) for lane t of a quad (load: W words, U blocks of both rows
 * in flight), then its int8 values of elements 4t .. 4t + 3 (lo) and 16 + 4t .. (hi) and the block's scale and
 * offset (vals: w = a code + b; OFFSET: b is not 0, the K-quants' -dmin * min) */
template <int DT> struct mmq_frag { /* Q4_0's layout: the row's 16-byte blocks of nibbles, then its f16 scales */
    enum { W = 2, U = 8, OFFSET = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, int in, int b, int t, unsigned *r) {
        r[0] = g4_ld_u32(row + 16 * (size_t)b + 4 * t), r[1] = g4_ld_u16(row + in / 2 + 2 * (size_t)b);
    }
    static __device__ __forceinline__ float2 vals(const unsigned *r, int, int, uint32_t *lo, uint32_t *hi) {
        g4_s8_word<DT>(r[0], 0u, 0, lo, hi); /* (Q4_0, IQ4_NL, MXF4) */
        return make_float2(g4_h2f((uint16_t)r[1]), 0.0f);
    }
};
template <> struct mmq_frag<G4_Q8_0> { /* the row's 32-byte blocks of int8 codes, then its f16 scales */
    enum { W = 3, U = 8, OFFSET = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, int in, int b, int t, unsigned *r) {
        const unsigned char *p = row + 32 * (size_t)b + 4 * t;
        r[0] = g4_ld_u32(p), r[1] = g4_ld_u32(p + 16), r[2] = g4_ld_u16(row + in + 2 * (size_t)b);
    }
    static __device__ __forceinline__ float2 vals(const unsigned *r, int, int, uint32_t *lo, uint32_t *hi) {
        *lo = r[0], *hi = r[1];
        return make_float2(g4_h2f((uint16_t)r[2]), 0.0f);
    }
};
template <> struct mmq_frag<G4_Q5_0> { /* Q4_0's nibbles, then a word of fifth bits a block, then the f16 scales */
    enum { W = 3, U = 8, OFFSET = 0 };
    static __device__ __forceinline__ void load(const unsigned char *row, int in, int b, int t, unsigned *r) {
        r[0] = g4_ld_u32(row + 16 * (size_t)b + 4 * t), r[1] = g4_ld_u32(row + in / 2 + 4 * (size_t)b);
        r[2] = g4_ld_u16(row + in / 2 + in / 8 + 2 * (size_t)b);
    }
    static __device__ __forceinline__ float2 vals(const unsigned *r, int, int t, uint32_t *lo, uint32_t *hi) {
        g4_s8_word<G4_Q5_0>(r[0], r[1], t, lo, hi);
        return make_float2(g4_h2f((uint16_t)r[2]), 0.0f);
    }
};
/* Q4_K, Q5_K as uploaded: the codes in Q4_0's order (Q5_K: then a word of fifth bits a block), then each
 * super-block's 16 bytes (d, dmin, 12 bytes of 6-bit scales and mins) */
template <> struct mmq_frag<G4_Q4_K> {
    enum { W = 5, U = 4, OFFSET = 1 };
    static __device__ __forceinline__ void load(const unsigned char *row, int in, int b, int t, unsigned *r) {
        r[0] = g4_ld_u32(row + 16 * (size_t)b + 4 * t);
        const uint4 m = g4_ld_u4(row + in / 2 + 16 * (size_t)(b / 8));
        r[1] = m.x, r[2] = m.y, r[3] = m.z, r[4] = m.w;
    }
    static __device__ __forceinline__ float2 vals(const unsigned *r, int b, int, uint32_t *lo, uint32_t *hi) {
        g4_s8_word<G4_Q4_K>(r[0], 0u, 0, lo, hi);
        float2 s;
        g4_kmeta_seg(make_uint4(r[1], r[2], r[3], r[4]), 32 * b, &s.x, &s.y);
        return s;
    }
};
template <> struct mmq_frag<G4_Q5_K> {
    enum { W = 6, U = 4, OFFSET = 1 };
    static __device__ __forceinline__ void load(const unsigned char *row, int in, int b, int t, unsigned *r) {
        r[0] = g4_ld_u32(row + 16 * (size_t)b + 4 * t), r[1] = g4_ld_u32(row + in / 2 + 4 * (size_t)b);
        const uint4 m = g4_ld_u4(row + in / 2 + in / 8 + 16 * (size_t)(b / 8));
        r[2] = m.x, r[3] = m.y, r[4] = m.z, r[5] = m.w;
    }
    static __device__ __forceinline__ float2 vals(const unsigned *r, int b, int t, uint32_t *lo, uint32_t *hi) {
        g4_s8_word<G4_Q5_K>(r[0], r[1], t, lo, hi);
        float2 s;
        g4_kmeta_seg(make_uint4(r[2], r[3], r[4], r[5]), 32 * b, &s.x, &s.y);
        return s;
    }
};

/* NT n8 tiles of tokens: each weight fragment multiplies them all (up to 32 tokens, c->mmq_dense_max; 4 tiles:
 * blocks of up to 255 registers a thread, 128 spilled the sums). 8 tiles (64 tokens, one block of 8 warps a
 * multiprocessor) took 11.1 ms for an E2B Q4_0 step against cuBLAS's 6.8 on bf16 tiles (H100): not built. */
template <int DT, int RP, int NT>
__global__ __launch_bounds__(32 * GTC_WARPS, NT < 4 ? 2 : 1) void gemv_mmq_kernel(gemv_args a, const signed char *xq,
                                                                     const float2 *xd, int split) {
#ifdef G4_CUDA_EMU
    __shared__ int scr[GTC_WARPS][768];
#else
    int *scr[GTC_WARPS] = {};
#endif
    __shared__ float4 red[GTC_WARPS][32];
    typedef mmq_frag<DT> F;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x * (GTC_WARPS / split) + warp / split, r0 = tile * (RP == 2 ? 8 : 16);
    /* the warp's blocks of 32: a contiguous share of the tile's */
    const int nb = a.in / 32, per = (nb + split - 1) / split, b0 = warp % split * per;
    const int b1 = b0 + per < nb ? b0 + per : nb;
    const unsigned char *ar[2];
    tc_rows<RP>(a, r0, g, ar);
    constexpr int U = NT == 1 ? F::U : NT == 2 && F::U > 4 ? 4 : 2; /* (registers: the tiles' sums) */
    unsigned w[U][2][F::W] = {};
    const auto load = [&](int bb) { /* U blocks of both rows from bb */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (bb + u < b1) F::load(ar[h], a.in, bb + u, t, w[u][h]);
    };
    load(b0);
    g4_grid_wait(); /* (the weights are in flight: the inputs are the previous kernel's) */
    g4_grid_launch_dependents();
    float acc[NT][4] = {};
    for (int bb = b0; bb < b1; bb += U) {
        if (bb != b0) load(bb);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = bb + u;
            if (b >= b1) break;
            uint32_t A[4];
            const float2 s0 = F::vals(w[u][0], b, t, &A[0], &A[2]), s1 = F::vals(w[u][1], b, t, &A[1], &A[3]);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                /* token 8j + g's codes (the products' column g), tokens 8j + 2t and 8j + 2t + 1's scales (the sums'
                 * columns) */
                const int tg = 8 * j + g, te = 8 * j + 2 * t;
                uint32_t B[2] = {0u, 0u};
                if (tg < a.n) {
                    const unsigned char *p = (const unsigned char *)xq + (size_t)tg * a.in + 32 * (size_t)b + 4 * t;
                    B[0] = g4_ld_u32(p), B[1] = g4_ld_u32(p + 16);
                }
                const float2 z = make_float2(0.0f, 0.0f);
                const float2 e0 = te < a.n ? __ldg(xd + (size_t)te * nb + b) : z;
                const float2 e1 = te + 1 < a.n ? __ldg(xd + (size_t)(te + 1) * nb + b) : z;
                int ci[4];
                g4_mma_s8(ci, A, B, scr[warp]);
                float *c = acc[j];
                if constexpr (F::OFFSET) { /* sum w x = dx (a sum(code q) + b sum(q)) */
                    c[0] += e0.x * fmaf(s0.x, (float)ci[0], s0.y * e0.y);
                    c[1] += e1.x * fmaf(s0.x, (float)ci[1], s0.y * e1.y);
                    c[2] += e0.x * fmaf(s1.x, (float)ci[2], s1.y * e0.y);
                    c[3] += e1.x * fmaf(s1.x, (float)ci[3], s1.y * e1.y);
                } else {
                    c[0] += (float)ci[0] * (s0.x * e0.x), c[1] += (float)ci[1] * (s0.x * e1.x);
                    c[2] += (float)ci[2] * (s1.x * e0.x), c[3] += (float)ci[3] * (s1.x * e1.x);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        tc_split_sum(acc[j], split, red);
        if (warp % split == 0) tc_epilogue<RP>(a, acc[j], r0, 8 * j);
    }
}

template <int DT>
static void mmq_launch(g4c *c, const gemv_args &a, int pairs, int nt, unsigned blocks, const signed char *xq,
                       const float2 *xd, int split) {
    const dim3 grid(blocks), block(32 * GTC_WARPS);
#define L(R, N) g4c_launch(c, gemv_mmq_kernel<DT, R, N>, grid, block, 0, a, xq, xd, split)
    if (pairs) {
        if (nt == 1) L(2, 1); else if (nt == 2) L(2, 2); else L(2, 4);
    } else {
        if (nt == 1) L(1, 1); else if (nt == 2) L(1, 2); else L(1, 4);
    }
#undef L
}

/* The set's products of n tokens (c->gemv_mmq_min <= n <= G4C_GEMV_MAX, or up to c->mmq_dense_max and 32) on
 * gemv_mmq_kernel where its weights are of MMQ_DENSE_TYPES with rows of whole blocks and the activations int8 (not
 * c->float_act); returns 0 where the set does not take that form (nothing ran), -1 out of memory. */
static int gemv_mmq(g4c *c, const float *x, int n, const g4_matmul_set *set) {
    const g4_tensor *w0 = set->w[0];
    const int in = (int)w0->shape[w0->ndim - 1];
    if (n <= G4C_GEMV_MAX ? c->gemv_mmq_min < 2 || n < c->gemv_mmq_min : n > c->mmq_dense_max || n > 32) return 0;
    if (c->float_act || in % 32 != 0) return 0;
    switch (w0->dtype) {
#define TAKES(T) case T:
        MMQ_DENSE_TYPES(TAKES) break;
#undef TAKES
    default: return 0;
    }
    const size_t codes = ((size_t)n * (size_t)in + 15) & ~(size_t)15, nb = (size_t)in / 32;
    signed char *xq = (signed char *)g4c_ws(c, &c->ws_x16, codes + (size_t)n * nb * sizeof(float2));
    if (!xq) return -1;
    float2 *xd = (float2 *)(xq + codes);
    g4c_q8_rows(c, x, n, in, set->norm, set->eps, set, xq, xd);
    gemv_args a; /* (the inputs' norm and residual are in the codes) */
    const int pairs = set_args(&a, set, n, 1.0f), nt = n <= 8 ? 1 : n <= 16 ? 2 : 4;
    const int tiles = (a.rows + (pairs ? 7 : 15)) / (pairs ? 8 : 16), split = tc_split(c, tiles, (int)nb, 8);
    const unsigned blocks = (unsigned)((tiles + GTC_WARPS / split - 1) / (GTC_WARPS / split));
    switch (w0->dtype) {
#define MMQ(T)                                                                                                     \
    case T: mmq_launch<T>(c, a, pairs, nt, blocks, xq, xd, split); break;
        MMQ_DENSE_TYPES(MMQ)
#undef MMQ
    default: break;
    }
    return 1;
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
    g4c_gemm_in in; /* (the residual prologue, when the set has one, in the same launch) */
    if (g4c_gemm_input(c, x, n, (int)set->w[0]->shape[set->w[0]->ndim - 1], set->norm, set->eps, set->w[0]->dtype, &in,
                       set))
        return;
    g4c_fold_args f;
    memset(&f, 0, sizeof f);
    const int stacked = g4c_gemm_set_stacked(c, &in, set->w, set->count, (float **)f.y2, f.ld);
    if (stacked < 0) return;
    if (stacked) { /* the products' halves added and their epilogues in one launch */
        f.count = set->count, f.n = n, f.geglu = pairs ? 1 : set->geglu ? 2 : 0, f.mul = set->mul;
        f.softcap = set->softcap;
        for (int i = 0; i < set->count; i++)
            f.y[i] = set->y[i], f.bias[i] = set->bias[i], f.out[i] = (int)set->w[i]->shape[0];
        g4c_gemm_fold(c, &f);
        return;
    }
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
    for (int i = 1; i < set->count; i++) /* (MLX: also the same group and scale type) */
        uniform &= set->w[i]->dtype == set->w[0]->dtype && set->w[i]->group == set->w[0]->group &&
                   set->w[i]->scale_dtype == set->w[0]->scale_dtype;
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
    if (n <= G4C_GEMV_MAX) {
        if (!gemv_tc(c, x, n, set) && !gemv_mmq(c, x, n, set)) gemv(c, x, n, set, 1.0f, c->float_act);
    } else if (!gemv_mmq(c, x, n, set)) {
        gemm_set(c, x, n, set);
    }
}

void g4c_matmul_scaled(g4c *c, const float *x, int n, const g4_tensor *w, const float *norm, float eps, float scale,
                       float *y, const g4_matmul_set *pro) {
    g4_matmul_set set;
    memset(&set, 0, sizeof set);
    set.count = 1;
    set.w[0] = w;
    set.y[0] = y;
    set.norm = norm;
    set.eps = eps;
    if (pro && pro->res_out) { /* (few tokens only: the caller makes the residual first for more) */
        set.res_h = pro->res_h, set.res_o = pro->res_o, set.res_w = pro->res_w, set.res_scale = pro->res_scale;
        set.res_out = pro->res_out;
    }
    if (n <= G4C_GEMV_MAX) {
        gemv(c, x, n, &set, scale, 1); /* the router: float activations (int8 ones can pick other experts) */
        return;
    }
    if (g4_dtype_is_quantized(w->dtype)) { /* the router: exact weights (bf16 tiles could pick other experts) */
        const int in = (int)w->shape[w->ndim - 1], out = (int)w->shape[0];
        for (int t = 0; t < n; t += G4C_GEMV_MAX) {
            set.y[0] = y + (size_t)t * out;
            gemv(c, x + (size_t)t * in, n - t < G4C_GEMV_MAX ? n - t : G4C_GEMV_MAX, &set, scale, 1);
        }
        return;
    }
    g4c_gemm_in in;
    if (g4c_gemm_input(c, x, n, (int)w->shape[w->ndim - 1], norm, eps, w->dtype, &in, NULL)) return;
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

G4_TRACE_TU(gemv)
