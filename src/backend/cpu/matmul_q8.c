/* y[n, out] = x[n, in] * W^T for Q8_0 and Q4_0 weights (and, with the AVX-512, AVX2 and NEON sets, Q5_0, Q4_K,
 * Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS, CB4, AF4, AF8) with int8 activations, as llama.cpp does (docs/formats.md 3.2 for the blocks): each
 * token row is quantized per block of 32 with the Q8_0 rule (d = max|x|/127, q = round(x/d), kept with f32 d), and
 *   y[r, t] = sum_b dw[r,b] * dx[t,b] * sum_j u[r,b,j] * q[t,b,j]  -  off * sum_b dw[r,b] * dx[t,b] * sum_j q[t,b,j]
 * where u = the weight codes as unsigned bytes (Q4_0: the nibble 0..15, off = 8; Q8_0:
 * the int8 + 128, off = 128), so one unsigned x signed byte product (VNNI vpdpbusd)
 * serves both types (Q5_0: the 5-bit code, off = 16; IQ4_NL / IQ4_XS / CB4: the table's value + 128, off = 128, with
 * IQ4_XS's and CB4's d times its 6-bit sub-block scale for dw; CB4: its block's table). Q4_K / Q5_K (w = d sc u -
 * dmin m per sub-block of 32) take
 * the same sums with dw = d sc and, in place of the offset, + sum_b (-dmin m)[r,b] * dx[t,b] * sum_j q[t,b,j];
 * AF4 / AF8 (MLX affine as the CPU holds it, w = s u + b per block) the same with dw = s and b for -dmin m;
 * Q6_K (w = d sc (u - 32) per 16) and Q3_K (d sc (u - 4) per 16) sum each
 * half of a block apart, from -32 (-4) x its code sums, times its own scale; Q2_K (d sc u - dmin m per 16) each half
 * apart times d sc, plus -dmin m times the half's activation code sums (cpu.h g4_q8_mode). Super-blocks are read
 * as two groups of 4 blocks (half a super-block each). Two shapes, by the kernel set (kernels*.c):
 * - q8_tile (scalar; Q8_0 and Q4_0 only): tiles of 4 rows x 4 tokens on the blocks as stored;
 * - q_pack + q_gemm (AVX-512 VNNI, AVX2, NEON): each block of 16 rows is unpacked once into groups of 4
 *   blocks and register tiles pass over every token. AVX-512: unsigned codes in lane order (a super-group of
 *   4 groups, one block a 32-bit lane: 8 vpdpbusd per 512 products, then the float steps once per 16 blocks),
 *   the activations in the same order beside the groups (g4_q8_rows.ql, q8_lanes_row); the offset term starts
 *   the integer sums, so no correction follows. AVX2 (no VNNI) and NEON: the plain activations
 *   (q_act_plain), vpmaddubsw + vpmaddwd (AVX2) or SDOT / widening multiplies (NEON), one multiply-add
 *   a group (kernels_x86.c, kernels_arm.c); AVX2's q_gemm reads each group's codes in quarter order
 *   (q_act_quarters, g4_q8_rows.qq), so that a lane's products add up vertically.
 *   Below 4 tokens (decode) q_gemv unpacks each group in registers instead: the same arithmetic,
 *   the same bits (AVX-512: each group's sums in element order, g4_q8_rows.qg, added into lane order).
 * Either way a row's value does not depend on the batch (the same tiles and order for one
 * token or many). This file quantizes the activations, tiles and threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/quant.h"

int g4_cpu_q8_supported(const g4_tensor *w) {
    const int64_t in = w->shape[w->ndim - 1];
    if (getenv("G4_NO_INT8_ACT")) return 0;
    if (w->dtype == G4_Q8_0 || w->dtype == G4_Q4_0) return in % 32 == 0;
    if (!g4_cpu_kernels_get()->q8_k_quants) return 0;
    switch (w->dtype) {
#define BLOCK(t, blk, _)                                                                                               \
    case t: return in % (blk) == 0;
        G4_Q8_K_QUANTS(BLOCK, _)
#undef BLOCK
    default: return 0;
    }
}

/* Quantizes rows [t0, t1) of x into a (the reference rule of core/quant.c, f32 scale): the plain
 * fields when a->q is set, the grouped ones when a->qg is set. */
void g4_cpu_q8_quantize(const float *x, size_t in, int t0, int t1, g4_q8_rows *a) {
    const size_t nb = in / 32;
    const g4_cpu_kernels *ks = g4_cpu_kernels_get();
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * in;
        int8_t *q = a->q ? a->q + (size_t)t * a->in_pad : NULL;
        float *d = a->q ? a->d + (size_t)t * a->nb_pad : NULL, *m = a->q ? a->m + (size_t)t * a->nb_pad : NULL;
        unsigned char *const qg_row = a->qg ? a->qg + (size_t)t * a->ng * G4_Q8_GROUP : NULL, *qg = qg_row;
        if (qg && ks->q8_group_row) { /* the kernel set's own (the same bytes) */
            ks->q8_group_row(xt, in, qg, a->ng);
            qg = NULL;
        }
        if (qg) memset(qg, 0, a->ng * G4_Q8_GROUP);
        if (a->qq) /* (the blocks past the row in the last group, and the groups past it) */
            memset(a->qq + (size_t)t * a->in_pad + 128 * (nb / 4), 0, a->in_pad - 128 * (nb / 4));
        for (size_t b = 0; b < (q || qg ? nb : 0); b++) {
            const float *xb = xt + 32 * b;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            float db = amax / 127.0f, id = db ? 1.0f / db : 0.0f;
            int8_t qb[32];
            int s = 0;
            for (int j = 0; j < 32; j++) {
                int v = (int)lrintf(xb[j] * id);
                qb[j] = (int8_t)v;
                s += v;
            }
            if (a->qq) /* the quarters of block b%4 of group b/4 */
                for (int h = 0; h < 2; h++)
                    for (int j = 0; j < 4; j++)
                        memcpy(a->qq + (size_t)t * a->in_pad + 128 * (b / 4) + 32 * j + 4 * (b % 4 + 4 * h),
                               qb + 16 * h + 4 * j, 4);
            if (q) {
                memcpy(q + 32 * b, qb, 32);
                d[b] = db;
                m[b] = db * (float)s;
            }
            if (qg) { /* group b/4, block b%4: codes 0-15 and 16-31, 4 scale lanes */
                unsigned char *gp = qg + (b / 4) * G4_Q8_GROUP;
                const size_t i = b % 4;
                memcpy(gp + 16 * i, qb, 16);
                memcpy(gp + 64 + 16 * i, qb + 16, 16);
                for (int l = 0; l < 4; l++) memcpy(gp + 128 + 4 * (4 * i + (size_t)l), &db, 4);
            }
        }
        if (q) {
            memset(q + in, 0, a->in_pad - in);
            for (size_t b = nb; b < a->nb_pad; b++) d[b] = m[b] = 0;
        }
        if (a->ql) ks->q8_lanes_row(qg_row, a->ng, a->type, a->ql + (size_t)t * ((a->ng + 3) / 4) * G4_Q8_LANES);
    }
}

#define PACK_ROWS 16 /* rows packed at once (a multiple of G4_Q_TR); work items are blocks of them */
#define TOKEN_BLOCK 64 /* tokens whose activations stay in cache while a packed block passes over them */

/* Several products in one pool job: the work items are the blocks of PACK_ROWS rows of every product in turn
 * (first[i] = product i's first block), so a matmul set or a layer's experts cost one hand-off, not one each. */
typedef struct {
    g4_cpu *cpu;
    const g4_cpu_kernels *k;
    const g4_q8_product *p;
    int count;
    int64_t first[G4_Q8_MAX_PRODUCTS + 1];
} q8_job;

typedef struct {
    const float *x;
    size_t in;
    g4_q8_rows *a;
} quantize_job;

static void quantize_rows(void *ctx, int64_t t0, int64_t t1, int thread) {
    quantize_job *j = ctx;
    g4_cpu_q8_quantize(j->x, j->in, (int)t0, (int)t1, j->a);
}

static void add_bias(const g4_q8_product *p, size_t out, int64_t r0, int64_t r1) {
    if (p->bias)
        for (int t = 0; t < p->n; t++)
            for (int64_t r = r0; r < r1; r++) p->y[(size_t)t * out + (size_t)r] += p->bias[r];
}

/* rows [r0, r1) of product p, plain activations: tiles of 4 rows x 4 tokens (q8_tile) */
static void q8_rows(const q8_job *j, const g4_q8_product *p, int64_t r0, int64_t r1) {
    const size_t in = (size_t)p->w->shape[p->w->ndim - 1], out = (size_t)p->w->shape[0];
    const size_t row_bytes = g4_tensor_row_bytes(p->w);
    const int nb = (int)(in / 32);
    const unsigned char *w = p->w->data;
    for (int64_t r = r0; r < r1; r += 4) {
        int nr = (int)(r1 - r < 4 ? r1 - r : 4);
        /* q8_tile only: a row's value must not depend on the batch (batch invariance, test_backend_ops) */
        for (int t = 0; t < p->n; t += 4) {
            int nt = p->n - t < 4 ? p->n - t : 4;
            j->k->q8_tile(p->w->dtype, w + (size_t)r * row_bytes, row_bytes, nr, p->a, p->t0 + t, nt, nb,
                          p->y + (size_t)t * out + (size_t)r, out);
        }
    }
    add_bias(p, out, r0, r1);
}

/* rows [r0, r1) of product p, grouped activations: each block of PACK_ROWS rows is packed once (q_pack), then
 * register tiles of G4_Q_TR rows x G4_Q_TT tokens (q_gemm) pass over every token */
static void qg_rows(const q8_job *j, const g4_q8_product *p, int64_t r0, int64_t r1, int thread) {
    const size_t in = (size_t)p->w->shape[p->w->ndim - 1], out = (size_t)p->w->shape[0];
    const size_t row_bytes = g4_tensor_row_bytes(p->w);
    const int nb = (int)(in / 32), ng = (int)p->a->ng;
    const unsigned char *w = p->w->data;
    if (p->n < G4_Q_TT) { /* a few tokens: each group unpacked in registers per token (q_gemv), no packing */
        for (int t = 0; t < p->n; t++)
            j->k->q_gemv(p->w->dtype, w + (size_t)r0 * row_bytes, row_bytes, (int)(r1 - r0), nb, p->a, p->t0 + t,
                         p->y + (size_t)t * out + (size_t)r0);
        add_bias(p, out, r0, r1);
        return;
    }
    const size_t ldw = g4_cpu_q_packed_row_bytes(j->k, (size_t)ng);
    unsigned char *wp = (unsigned char *)g4_cpu_scratch_get(j->cpu, thread, PACK_ROWS * ldw / sizeof(float));
    if (!wp) return; /* out of memory: recorded in cpu->failed, the step reports it */
    for (int64_t rb = r0; rb < r1; rb += PACK_ROWS) {
        const int nrb = (int)(r1 - rb < PACK_ROWS ? r1 - rb : PACK_ROWS);
        j->k->q_pack(p->w->dtype, w + (size_t)rb * row_bytes, row_bytes, nrb, nb, wp);
        for (int tb = 0; tb < p->n; tb += TOKEN_BLOCK) {
            const int te = p->n - tb < TOKEN_BLOCK ? p->n : tb + TOKEN_BLOCK;
            for (int i = 0; i < nrb; i += G4_Q_TR)
                for (int t = tb; t < te; t += G4_Q_TT)
                    j->k->q_gemm(wp + (size_t)i * ldw, nrb - i < G4_Q_TR ? nrb - i : G4_Q_TR, p->a, p->t0 + t,
                                 te - t < G4_Q_TT ? te - t : G4_Q_TT, ng, p->y + (size_t)t * out + (size_t)(rb + i),
                                 out);
        }
    }
    add_bias(p, out, r0, r1);
}

/* blocks [b0, b1) of the job: the part of each product they cover */
static void product_blocks(void *ctx, int64_t b0, int64_t b1, int thread) {
    q8_job *j = ctx;
    for (int i = 0; i < j->count && b0 < b1; i++) {
        if (b0 >= j->first[i + 1]) continue;
        const g4_q8_product *p = &j->p[i];
        const int64_t out = p->w->shape[0], e = b1 < j->first[i + 1] ? b1 : j->first[i + 1];
        const int64_t r0 = (b0 - j->first[i]) * PACK_ROWS, r1 = (e - j->first[i]) * PACK_ROWS;
        if (j->k->q_gemm)
            qg_rows(j, p, r0, r1 < out ? r1 : out, thread);
        else
            q8_rows(j, p, r0, r1 < out ? r1 : out);
        b0 = e;
    }
}

void *g4_cpu_act_buf(g4_cpu *cpu, size_t need) {
    if (cpu->act_cap < need) {
        void *nbuf = NULL;
        if (posix_memalign(&nbuf, 64, need)) {
            cpu->failed = 1;
            return NULL;
        }
        free(cpu->act_buf);
        cpu->act_buf = nbuf;
        cpu->act_cap = need;
    }
    return cpu->act_buf;
}

int g4_cpu_q8_prepare(g4_cpu *cpu, const float *x, int n, size_t in, g4_dtype type, g4_q8_rows *a) {
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    memset(a, 0, sizeof *a);
    a->type = type;
    a->ng = (in / 32 + 3) / 4;
    if (k->q_gemm && !k->q_act_plain) {
        const size_t lanes = k->q8_lanes_row ? (size_t)n * ((a->ng + 3) / 4) * G4_Q8_LANES : 0;
        a->qg = g4_cpu_act_buf(cpu, (size_t)n * a->ng * G4_Q8_GROUP + lanes);
        if (!a->qg) return -1;
        a->ql = lanes ? a->qg + (size_t)n * a->ng * G4_Q8_GROUP : NULL;
    } else {
        a->nb_pad = (in / 32 + 7) & ~(size_t)7;
        a->in_pad = a->nb_pad * 32;
        const size_t quarters = k->q_act_quarters ? (size_t)n * a->in_pad : 0;
        float *buf = g4_cpu_act_buf(cpu, (size_t)n * (a->in_pad + 2 * a->nb_pad * sizeof(float)) + quarters);
        if (!buf) return -1;
        a->d = buf;
        a->m = a->d + (size_t)n * a->nb_pad;
        a->q = (int8_t *)(a->m + (size_t)n * a->nb_pad);
        a->qq = quarters ? a->q + (size_t)n * a->in_pad : NULL;
    }
    quantize_job qj = {x, in, a};
    g4_pool_for(cpu->pool, n, 1 + 65536 / (int64_t)(in + 1), quantize_rows, &qj);
    return 0;
}

void g4_cpu_q8_products(g4_cpu *cpu, const g4_q8_product *p, int count) {
    q8_job j = {cpu, g4_cpu_kernels_get(), p, count, {0}};
    int64_t work = 0; /* multiply-adds */
    for (int i = 0; i < count; i++) {
        const int64_t out = p[i].w->shape[0];
        j.first[i + 1] = j.first[i] + (p[i].n > 0 ? (out + PACK_ROWS - 1) / PACK_ROWS : 0);
        work += out * p[i].w->shape[p[i].w->ndim - 1] * p[i].n;
    }
    const int64_t blocks = j.first[count];
    if (!blocks) return;
    /* grain: enough work per chunk (about 16384 multiply-adds or more) to be worth a hand-off */
    const int64_t per_block = work / blocks + 1, grain = 1 + 16384 / (per_block + 1);
    g4_pool_for(cpu->pool, blocks, grain, product_blocks, &j);
}

void g4_cpu_matmul_q8_set(g4_cpu *cpu, const float *x, int n, int count, const g4_tensor *const *w,
                          const float *const *bias, float *const *y) {
    const size_t in = (size_t)w[0]->shape[w[0]->ndim - 1];
    g4_q8_rows a;
    if (g4_cpu_q8_prepare(cpu, x, n, in, w[0]->dtype, &a)) return;
    g4_q8_product p[G4_Q8_MAX_PRODUCTS];
    for (int i = 0; i < count; i++) p[i] = (g4_q8_product){w[i], bias ? bias[i] : NULL, y[i], &a, 0, n};
    g4_cpu_q8_products(cpu, p, count);
}

void g4_cpu_matmul_q8(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    g4_cpu_matmul_q8_set(cpu, x, n, 1, &w, &bias, &y);
}

/* ------------------------------------------------------------ scalar tile */
static inline void unpack_u8(g4_dtype t, const unsigned char *b, uint8_t u[32]) {
    if (t == G4_Q4_0) {
        for (int j = 0; j < 16; j++) {
            u[j] = b[2 + j] & 15;
            u[j + 16] = b[2 + j] >> 4;
        }
    } else {
        for (int j = 0; j < 32; j++) u[j] = (uint8_t)(b[2 + j] ^ 0x80);
    }
}

void g4_cpu_q8_tile_scalar(g4_dtype type, const unsigned char *w, size_t row_bytes, int nr, const g4_q8_rows *a,
                           int t0, int nt, int nb, float *y, size_t ldy) {
    const size_t bs = type == G4_Q4_0 ? 18 : 34;
    const float off = type == G4_Q4_0 ? 8.0f : 128.0f;
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const int8_t *q = a->q + (size_t)(t0 + t) * a->in_pad;
            const float *d = a->d + (size_t)(t0 + t) * a->nb_pad, *m = a->m + (size_t)(t0 + t) * a->nb_pad;
            float s = 0;
            for (int b = 0; b < nb; b++) {
                const unsigned char *blk = w + (size_t)r * row_bytes + (size_t)b * bs;
                uint8_t u[32];
                unpack_u8(type, blk, u);
                int32_t dot = 0;
                for (int k = 0; k < 32; k++) dot += (int32_t)u[k] * q[32 * b + k];
                float dw = g4_f16_at(blk);
                s += dw * (d[b] * (float)dot - off * m[b]);
            }
            y[(size_t)t * ldy + (size_t)r] = s;
        }
}
