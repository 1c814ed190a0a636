/* y[n, out] = x[n, in] * W^T for Q8_0 and Q4_0 weights with int8 activations, as
 * llama.cpp does (docs/formats.md 3.2 for the blocks): each token row is quantized per
 * block of 32 with the Q8_0 rule (d = max|x|/127, q = round(x/d), kept with f32 d), and
 *   y[r, t] = sum_b dw[r,b] * dx[t,b] * sum_j u[r,b,j] * q[t,b,j]  -  off * sum_b dw[r,b] * dx[t,b] * sum_j q[t,b,j]
 * where u = the weight codes as unsigned bytes (Q4_0: the nibble 0..15, off = 8; Q8_0:
 * the int8 + 128, off = 128), so one unsigned x signed byte product (VNNI vpdpbusd)
 * serves both types. Work is split over rows in tiles of 4 rows x 4 tokens; each tile
 * unpacks a weight block once for 4 tokens.
 *
 * The ISA-specific tile kernels live in kernels*.c (g4_cpu_kernels.q8_tile); this file
 * quantizes the activations, tiles and threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "core/quant.h"

int g4_cpu_q8_supported(const g4_tensor *w) {
    const int64_t in = w->shape[w->ndim - 1];
    return (w->dtype == G4_Q8_0 || w->dtype == G4_Q4_0) && in % 32 == 0 && getenv("G4_CPU_NO_Q8_ACT") == NULL;
}

/* Quantizes rows [t0, t1) of x into a (the reference rule of core/quant.c, f32 scale). */
void g4_cpu_q8_quantize(const float *x, size_t in, int t0, int t1, g4_q8_rows *a) {
    const size_t nb = in / 32;
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * in;
        int8_t *q = a->q + (size_t)t * a->in_pad;
        float *d = a->d + (size_t)t * a->nb_pad, *m = a->m + (size_t)t * a->nb_pad;
        for (size_t b = 0; b < nb; b++) {
            const float *xb = xt + 32 * b;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            float db = amax / 127.0f, id = db ? 1.0f / db : 0.0f;
            int s = 0;
            for (int j = 0; j < 32; j++) {
                int v = (int)lrintf(xb[j] * id);
                q[32 * b + j] = (int8_t)v;
                s += v;
            }
            d[b] = db;
            m[b] = db * (float)s;
        }
        memset(q + in, 0, a->in_pad - in);
        for (size_t b = nb; b < a->nb_pad; b++) d[b] = m[b] = 0;
        if (!a->qp) continue;
        int8_t *qp = a->qp + (size_t)t * a->in_pad;
        float *d4 = a->d4 + (size_t)t * 4 * a->nb_pad, *m4 = a->m4 + (size_t)t * 4 * a->nb_pad;
        for (size_t b = 0; b < a->nb_pad; b++) {
            size_t g = b / 4, i = b % 4;
            memcpy(qp + 128 * g + 16 * i, q + 32 * b, 16);
            memcpy(qp + 128 * g + 64 + 16 * i, q + 32 * b + 16, 16);
            for (int k = 0; k < 4; k++) {
                d4[4 * b + (size_t)k] = d[b];
                m4[4 * b + (size_t)k] = m[b];
            }
        }
    }
}

typedef struct {
    const g4_cpu_kernels *k;
    const g4_tensor *w;
    const g4_q8_rows *a;
    int n;
    size_t in, out, row_bytes;
    const float *bias;
    float *y;
    const float *x;
} q8_job;

static void quantize_rows(void *ctx, int64_t t0, int64_t t1, int thread) {
    q8_job *j = ctx;
    g4_cpu_q8_quantize(j->x, j->in, (int)t0, (int)t1, (g4_q8_rows *)j->a);
}

static void q8_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    q8_job *j = ctx;
    const int nb = (int)(j->in / 32);
    const unsigned char *w = j->w->data;
    const int step = 4;
    if (j->a->qp) {
        for (int t = 0; t < j->n; t++)
            j->k->q4_gemv(w + (size_t)r0 * j->row_bytes, j->row_bytes, (int)(r1 - r0), j->a, t, nb,
                          j->y + (size_t)t * j->out + (size_t)r0);
        if (j->bias)
            for (int t = 0; t < j->n; t++)
                for (int64_t r = r0; r < r1; r++) j->y[(size_t)t * j->out + (size_t)r] += j->bias[r];
        return;
    }
    for (int64_t r = r0; r < r1; r += step) {
        int nr = (int)(r1 - r < step ? r1 - r : step);
        /* q8_tile only: a row's value must not depend on the batch (batch invariance, test_backend_ops) */
        for (int t = 0; t < j->n; t += 4) {
            int nt = j->n - t < 4 ? j->n - t : 4;
            j->k->q8_tile(j->w->dtype, w + (size_t)r * j->row_bytes, j->row_bytes, nr, j->a, t, nt, nb,
                          j->y + (size_t)t * j->out + (size_t)r, j->out);
        }
        if (j->bias)
            for (int t = 0; t < j->n; t++)
                for (int i = 0; i < nr; i++) j->y[(size_t)t * j->out + (size_t)r + (size_t)i] += j->bias[r + i];
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

void g4_cpu_matmul_q8(g4_cpu *cpu, const float *x, int n, const g4_tensor *w, const float *bias, float *y) {
    const size_t in = (size_t)w->shape[w->ndim - 1], out = (size_t)w->shape[0];
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    const int grouped = k->q4_gemv && w->dtype == G4_Q4_0; /* every n: rows independent of the batch */
    const size_t nb_pad = (in / 32 + 3) & ~(size_t)3, in_pad = nb_pad * 32;
    size_t need = (size_t)n * (in_pad + 2 * nb_pad * sizeof(float)) * (grouped ? 6 : 1) + 64;
    float *buf = g4_cpu_act_buf(cpu, need);
    if (!buf) return;
    g4_q8_rows a = {.in_pad = in_pad, .nb_pad = nb_pad};
    a.d = buf;
    a.m = a.d + (size_t)n * nb_pad;
    a.q = (int8_t *)(a.m + (size_t)n * nb_pad);
    if (grouped) {
        a.d4 = (float *)(void *)(a.q + (size_t)n * in_pad);
        a.m4 = a.d4 + (size_t)n * 4 * nb_pad;
        a.qp = (int8_t *)(a.m4 + (size_t)n * 4 * nb_pad);
    }
    q8_job j = {k, w, &a, n, in, out, g4_tensor_row_bytes(w), bias, y, x};
    g4_pool_for(cpu->pool, n, 1 + 65536 / (int64_t)(in + 1), quantize_rows, &j);
    /* grain: whole 16-row tiles, enough work per chunk to be worth a hand-off */
    int64_t grain = 16 * (1 + 16384 / (int64_t)(in * (size_t)n / 16 + 1));
    g4_pool_for(cpu->pool, (int64_t)out, grain, q8_rows, &j);
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
