/* y[n, out] = x[n, in] * W^T on the CPU for every weight dtype (core/tensor.h).
 * - Q8_0 / Q4_0 (and Q5_0 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS / CB4 / AF4 / AF8 with the AVX-512, AVX2 and
 *   NEON sets):
 *   int8 activations and integer dot products (matmul_q8.c). MLX affine weights arrive as AF4 / AF8 (cpu_backend.c,
 *   upload_weight).
 * - BF16 (where the kernels have bf16_tile) and aligned F32: register tiles of 4 rows x 4
 *   tokens on the weights as stored (bf16 widened to f32 in registers), all in f32.
 * - otherwise (F16, Q4_1, Q5_1; the types above with the scalar set; every type in g4_cpu_matmul_f32,
 *   the MoE router's product): a block of rows
 *   is decoded to f32 once (g4_dequant_row, or read in place for aligned F32) and
 *   multiplied with every token by register tiles of 4 rows x 4 tokens, so each loaded
 *   weight vector serves 4 tokens and each token vector 4 rows. All in f32: the result
 *   is what the dequantized weights give, up to summation order.
 * - BF16 with bf16 activations (g4_cpu.bf16_act, g4_load_params.bf16_activations, off by default): the
 *   activations are rounded to bf16 (nearest even) once per matmul, then tiles of 4 rows x G4_BF16X_TT tokens
 *   of bf16 products summed in f32 (bf16x_tile: vdpbf16ps) over slices of at most 2048 columns, as llama.cpp
 *   multiplies BF16 weights; sets without bf16x_tile run the rounded activations (widened to f32) through
 *   bf16_tile, the same products in another summation order.
 * One token (decode) on the weights as stored in f32 products: each tile takes 4 rows a quarter of the thread's
 * range apart, so each row is its own sequential stream (4 adjacent rows in one tile read at about half the rate
 * here).
 * Work is split over output rows; nothing here dequantizes a whole matrix. A row's value does not depend on
 * the batch (one token or many: the same tiles, the same order), so the scheduler's batched greedy outputs equal
 * single requests'. */
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/quant.h"
#include "core/tensor.h"

#define ROW_BLOCK 16 /* rows decoded at once (a multiple of the 4-row tile) */

typedef struct {
    g4_cpu *cpu;
    const g4_cpu_kernels *k;
    const float *x;
    const uint16_t *xb; /* the activations rounded to bf16, for bf16x_tile (NULL: none) */
    int n;
    size_t in, out;
    const g4_tensor *w;
    const float *bias;
    float *y;
} matmul_job;

/* bf16x_tile over slices of at most BF16X_KC columns, so that a slice of G4_BF16X_TT activation rows stays in
 * L1 while it meets every 4-row tile of the block (rows of 6144 or 12288 columns otherwise stream both operands
 * from L2); each slice's sums are added to y in slice order, the same for every row and token (batch invariance) */
#define BF16X_KC 2048
static size_t bf16x_slice(size_t in) {
    const size_t ns = (in + BF16X_KC - 1) / BF16X_KC;
    return ((in + ns - 1) / ns + 31) & ~(size_t)31;
}
static void tiles_bf16x(const matmul_job *j, const uint16_t *w, size_t ldw, int64_t r0, int nr) {
    const size_t in = j->in, kc = bf16x_slice(in);
    float part[G4_BF16X_TT * 4];
    for (size_t k0 = 0; k0 < in; k0 += kc) {
        const size_t len = in - k0 < kc ? in - k0 : kc;
        for (int t = 0; t < j->n; t += G4_BF16X_TT) {
            const int nt = j->n - t < G4_BF16X_TT ? j->n - t : G4_BF16X_TT;
            for (int i = 0; i < nr; i += 4) {
                const int ni = nr - i < 4 ? nr - i : 4;
                const uint16_t *wt = w + (size_t)i * ldw + k0, *xt = j->xb + (size_t)t * in + k0;
                float *yt = j->y + (size_t)t * j->out + (size_t)r0 + (size_t)i;
                if (k0 == 0) {
                    j->k->bf16x_tile(wt, ldw, ni, xt, in, nt, len, yt, j->out);
                    continue;
                }
                j->k->bf16x_tile(wt, ldw, ni, xt, in, nt, len, part, 4);
                for (int u = 0; u < nt; u++)
                    for (int r = 0; r < ni; r++) yt[(size_t)u * j->out + (size_t)r] += part[u * 4 + r];
            }
        }
    }
}

/* rows r0.. (nr of them, ldw elements apart) as f32, or as bf16 (bf16_tile, or bf16x_tile with j->xb) when
 * bf16 is set */
static void tiles(const matmul_job *j, const void *w, int bf16, size_t ldw, int64_t r0, int nr) {
    if (bf16 && j->xb) {
        tiles_bf16x(j, w, ldw, r0, nr);
    } else {
        for (int t = 0; t < j->n; t += 4) {
            int nt = j->n - t < 4 ? j->n - t : 4;
            for (int i = 0; i < nr; i += 4) {
                const int ni = nr - i < 4 ? nr - i : 4;
                const float *xt = j->x + (size_t)t * j->in;
                float *yt = j->y + (size_t)t * j->out + (size_t)r0 + (size_t)i;
                if (bf16)
                    j->k->bf16_tile((const uint16_t *)w + (size_t)i * ldw, ldw, ni, xt, j->in, nt, j->in, yt, j->out);
                else
                    j->k->f32_tile((const float *)w + (size_t)i * ldw, ldw, ni, xt, j->in, nt, j->in, yt, j->out);
            }
        }
    }
    if (j->bias)
        for (int t = 0; t < j->n; t++)
            for (int i = 0; i < nr; i++) j->y[(size_t)t * j->out + (size_t)r0 + (size_t)i] += j->bias[r0 + i];
}

/* One token, 4 rows ldw elements apart (the decode's far-apart rows): their products with the token, as tiles()
 * computes them (with bf16 activations: tiles_bf16x's column slices, so the bits match the batch path) */
static void decode_rows4(const matmul_job *j, const void *w, size_t ldw, int bf16, float y4[4]) {
    const size_t in = j->in;
    if (j->xb) {
        const size_t kc = bf16x_slice(in);
        float part[4];
        for (size_t k0 = 0; k0 < in; k0 += kc) {
            const size_t len = in - k0 < kc ? in - k0 : kc;
            j->k->bf16x_tile((const uint16_t *)w + k0, ldw, 4, j->xb + k0, in, 1, len, k0 ? part : y4, 1);
            if (k0)
                for (int r = 0; r < 4; r++) y4[r] += part[r];
        }
    } else if (bf16) {
        j->k->bf16_tile(w, ldw, 4, j->x, in, 1, in, y4, 1);
    } else {
        j->k->f32_tile(w, ldw, 4, j->x, in, 1, in, y4, 1);
    }
}

static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    matmul_job *j = ctx;
    const size_t in = j->in;
    const g4_cpu_kernels *k = j->k;
    const int bf16 = j->w->dtype == G4_BF16 && (k->bf16_tile || j->xb);
    if (bf16 || (j->w->dtype == G4_F32 && (((uintptr_t)j->w->data) & 3) == 0)) { /* the weights as stored */
        if (j->n == 1) { /* decode: tiles of 4 rows a quarter of the range apart, each its own sequential stream */
            const int64_t q = (r1 - r0) / 4;
            const size_t ldw = (size_t)q * in;
            for (int64_t i = 0; i < q; i++) {
                float y4[4];
                decode_rows4(j, g4_tensor_row(j->w, r0 + i), ldw, bf16, y4);
                for (int r = 0; r < 4; r++) j->y[r0 + i + r * q] = y4[r] + (j->bias ? j->bias[r0 + i + r * q] : 0.0f);
            }
            r0 += 4 * q;
            if (r0 < r1) tiles(j, g4_tensor_row(j->w, r0), bf16, in, r0, (int)(r1 - r0));
            return;
        }
        for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK)
            tiles(j, g4_tensor_row(j->w, rb), bf16, in, rb, (int)(r1 - rb < ROW_BLOCK ? r1 - rb : ROW_BLOCK));
        return;
    }
    /* decode a block of rows to f32 once, then reuse it for every token */
    float *wf = g4_cpu_scratch_get(j->cpu, thread, ROW_BLOCK * in);
    if (!wf) return; /* out of memory: recorded in cpu->failed, the step reports it */
    for (int64_t rb = r0; rb < r1; rb += ROW_BLOCK) {
        int nr = (int)(r1 - rb < ROW_BLOCK ? r1 - rb : ROW_BLOCK);
        for (int i = 0; i < nr; i++) {
            if (j->w->dtype == G4_BF16)
                k->bf16_to_f32((const uint16_t *)g4_tensor_row(j->w, rb + i), wf + (size_t)i * in, in);
            else
                g4_dequant_row(j->w, rb + i, wf + (size_t)i * in);
        }
        tiles(j, wf, 0, in, rb, nr);
    }
}

/* the activations rounded to bf16 (nearest even), kept as bf16 (xb) or widened back to f32 (xf) */
typedef struct {
    const float *x;
    size_t in;
    uint16_t *xb;
    float *xf;
} round_job;

static void round_rows(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const round_job *r = ctx;
    for (size_t i = (size_t)t0 * r->in; i < (size_t)t1 * r->in; i++) {
        const uint16_t h = g4_f32_to_bf16(r->x[i]);
        if (r->xb)
            r->xb[i] = h;
        else
            r->xf[i] = g4_bf16_to_f32(h);
    }
}

void g4_cpu_matmul(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    if (n > 0 && g4_cpu_q8_supported(w))
        g4_cpu_matmul_q8(cpu, x, n, w, bias, y);
    else
        g4_cpu_matmul_f32(cpu, x, n, w, bias, y);
}

void g4_cpu_matmul_f32(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    if (n <= 0) return;
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    const size_t in = (size_t)w->shape[w->ndim - 1], out = (size_t)w->shape[0];
    /* grain: enough rows per chunk that a chunk is worth a thread hand-off */
    int64_t grain = (int64_t)(16384 / (in * (size_t)n + 1)) + 1;
    matmul_job j = {cpu, k, x, NULL, n, in, out, w, bias, y};
    if (cpu->bf16_act && w->dtype == G4_BF16) {
        const int native = k->bf16x_tile != NULL;
        void *buf = g4_cpu_act_buf(cpu, (size_t)n * in * (native ? sizeof(uint16_t) : sizeof(float)));
        if (!buf) return; /* cpu->failed is set */
        round_job r = {x, in, native ? buf : NULL, native ? NULL : buf};
        g4_pool_for(cpu->pool, n, (int64_t)(65536 / in) + 1, round_rows, &r);
        if (native)
            j.xb = buf;
        else
            j.x = buf;
    }
    if (grain < ROW_BLOCK && n > 1) grain = ROW_BLOCK;
    g4_pool_for(cpu->pool, (int64_t)j.out, grain, matmul_rows, &j);
}
