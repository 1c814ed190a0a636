/* CPU ops over dense activations (backend.h): bidirectional attention over contiguous keys and values
 * (the vision tower, docs/gemma4-towers.md 2.6), clamp (clipped linears), per-column shift and scale
 * (patch input, standardize) and gathered row sums (the vision pooler).
 *
 * attention_dense works per (head, block of queries): the head's keys are packed in groups of 8
 * ([group][dim][8]) so that a tile of 4 queries x 8 keys accumulates in registers; the softmax uses the
 * SIMD exp kernel; P V runs over 8-wide column chunks of V. GCC vector types and target_clones give the
 * AVX-512, AVX2 and baseline versions of the tiles. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

#define QBLOCK 64 /* queries per work item */
#define QTILE 4   /* queries per register tile */

typedef float v8 __attribute__((vector_size(32), aligned(4))); /* loads need no alignment */

#define CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))

/* s[t][j] = q_t . k_j for QTILE queries and the keys of packed groups [g0, g1) */
CLONES static void qk_tile(const float *const *q, const float *kp, int D, int n_groups, float *const *s) {
    for (int g = 0; g < n_groups; g++) {
        const v8 *k = (const v8 *)(const void *)(kp + (size_t)g * D * 8);
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int d = 0; d < D; d++) {
            v8 kv = k[d];
            a0 += q[0][d] * kv;
            a1 += q[1][d] * kv;
            a2 += q[2][d] * kv;
            a3 += q[3][d] * kv;
        }
        memcpy(s[0] + 8 * g, &a0, sizeof a0);
        memcpy(s[1] + 8 * g, &a1, sizeof a1);
        memcpy(s[2] + 8 * g, &a2, sizeof a2);
        memcpy(s[3] + 8 * g, &a3, sizeof a3);
    }
}

/* o_t[c..c+8) = sum_j p_t[j] v[j][c..c+8) for QTILE queries, each 8-column chunk of D (D % 8 == 0) */
CLONES static void pv_tile(const float *const *p, const float *v, size_t v_stride, int n_k, int D,
                           float *const *o) {
    for (int c = 0; c < D; c += 8) {
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int j = 0; j < n_k; j++) {
            v8 vv;
            memcpy(&vv, v + (size_t)j * v_stride + c, sizeof vv);
            a0 += p[0][j] * vv;
            a1 += p[1][j] * vv;
            a2 += p[2][j] * vv;
            a3 += p[3][j] * vv;
        }
        memcpy(o[0] + c, &a0, sizeof a0);
        memcpy(o[1] + c, &a1, sizeof a1);
        memcpy(o[2] + c, &a2, sizeof a2);
        memcpy(o[3] + c, &a3, sizeof a3);
    }
}

typedef struct {
    g4_cpu *cpu;
    const g4_dense_attention_args *a;
    int n_qblocks;
} dense_job;

static void dense_items(void *ctx, int64_t b, int64_t e, int thread) {
    dense_job *j = ctx;
    const g4_dense_attention_args *a = j->a;
    const g4_cpu_kernels *kn = g4_cpu_kernels_get();
    const int D = a->head_dim, H = a->n_heads, G = H / a->n_kv_heads, nk = a->n_k;
    const int ng = (nk + 7) / 8, nkp = ng * 8, Dp = (D + 7) & ~7;
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)a->n_kv_heads * D;
    /* scratch: packed keys [ng][D][8], values with padded columns [nk][Dp], scores [QBLOCK][nkp], a zero query,
     * output rows [QTILE][Dp] */
    float *kp = g4_cpu_scratch_get(j->cpu, thread, (size_t)nkp * D + (size_t)nk * Dp + (size_t)QBLOCK * nkp +
                                                       (size_t)D + (size_t)QTILE * Dp);
    if (!kp) return;
    float *vp = kp + (size_t)nkp * D, *sc = vp + (size_t)nk * Dp, *zero = sc + (size_t)QBLOCK * nkp;
    float *orow = zero + D;
    memset(zero, 0, (size_t)D * sizeof(float));
    int packed_head = -1;
    for (int64_t it = b; it < e; it++) {
        const int h = (int)(it / j->n_qblocks), q0 = (int)(it % j->n_qblocks) * QBLOCK;
        const int nq = a->n_q - q0 < QBLOCK ? a->n_q - q0 : QBLOCK, hk = h / G;
        if (hk != packed_head) { /* pack this KV head's keys and values once for consecutive items */
            for (int jj = 0; jj < nkp; jj++)
                for (int d = 0; d < D; d++)
                    kp[((size_t)(jj / 8) * D + d) * 8 + jj % 8] =
                        jj < nk ? a->k[(size_t)jj * kv_stride + (size_t)hk * D + d] : 0.0f;
            for (int jj = 0; jj < nk; jj++) {
                float *dst = vp + (size_t)jj * Dp;
                memcpy(dst, a->v + (size_t)jj * kv_stride + (size_t)hk * D, (size_t)D * sizeof(float));
                for (int d = D; d < Dp; d++) dst[d] = 0.0f;
            }
            packed_head = hk;
        }
        /* scores, softmax numerators, one row per query */
        for (int t0 = 0; t0 < nq; t0 += QTILE) {
            const float *qs[QTILE];
            float *ss[QTILE];
            for (int t = 0; t < QTILE; t++) {
                qs[t] = t0 + t < nq ? a->q + (size_t)(q0 + t0 + t) * q_stride + (size_t)h * D : zero;
                ss[t] = sc + (size_t)((t0 + t) % QBLOCK) * nkp;
            }
            qk_tile(qs, kp, D, ng, ss);
        }
        for (int t = 0; t < nq; t++) {
            float *s = sc + (size_t)t * nkp, mx = -INFINITY;
            const float *bias = a->bias ? a->bias + ((size_t)(a->bias_heads > 1 ? h : 0) * a->n_q + q0 + t) * nk : NULL;
            for (int jj = 0; jj < nk; jj++) {
                float x = s[jj] * a->scale;
                if (bias) x += bias[jj];
                if (a->key_valid && !a->key_valid[jj]) x = -INFINITY;
                s[jj] = x;
                if (x > mx) mx = x;
            }
            float *o = a->out + (size_t)(q0 + t) * q_stride + (size_t)h * D;
            if (mx == -INFINITY) { /* no key to attend to */
                memset(o, 0, (size_t)D * sizeof(float));
                s[0] = NAN; /* marks the row as done */
                continue;
            }
            float inv = 1.0f / kn->exp_sum(s, (size_t)nk, mx);
            for (int jj = 0; jj < nk; jj++) s[jj] *= inv;
        }
        /* out = P V */
        for (int t0 = 0; t0 < nq; t0 += QTILE) {
            const float *ps[QTILE];
            float *os[QTILE];
            for (int t = 0; t < QTILE; t++) {
                ps[t] = sc + (size_t)((t0 + t) % QBLOCK) * nkp;
                os[t] = orow + (size_t)t * Dp;
            }
            if (t0 + QTILE > nq) /* rows past the block's end hold stale scores; their output is dropped */
                for (int t = nq - t0; t < QTILE; t++) ps[t] = ps[0];
            pv_tile(ps, vp, (size_t)Dp, nk, Dp, os);
            for (int t = 0; t < QTILE && t0 + t < nq; t++) {
                const float *s = sc + (size_t)(t0 + t) * nkp;
                if (isnan(s[0])) continue;
                memcpy(a->out + (size_t)(q0 + t0 + t) * q_stride + (size_t)h * D, os[t], (size_t)D * sizeof(float));
            }
        }
    }
}

void g4_cpu_attention_dense(g4_backend *be, const g4_dense_attention_args *a) {
    g4_cpu *cpu = be->impl;
    if (a->n_q <= 0) return;
    if (a->n_k <= 0) {
        memset(a->out, 0, (size_t)a->n_q * a->n_heads * a->head_dim * sizeof(float));
        return;
    }
    dense_job j = {cpu, a, (a->n_q + QBLOCK - 1) / QBLOCK};
    /* items of one head are consecutive, so a thread packs each head's keys once */
    g4_pool_for(cpu->pool, (int64_t)a->n_heads * j.n_qblocks, j.n_qblocks, dense_items, &j);
}

/* ------------------------------------------------------------ elementwise */
void g4_cpu_clamp(g4_backend *be, const float *x, float *y, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        v = v < lo ? lo : v; /* torch.clamp: NaN stays NaN */
        y[i] = v > hi ? hi : v;
    }
}

void g4_cpu_shift_scale_cols(g4_backend *be, float *y, int rows, int cols, const float *shift, const float *scale) {
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * cols;
        if (shift)
            for (int c = 0; c < cols; c++) row[c] += shift[c];
        if (scale)
            for (int c = 0; c < cols; c++) row[c] *= scale[c];
    }
}

void g4_cpu_gather_sum(g4_backend *be, const float *src, const int32_t *idx, int n, int k, int row, float s,
                       float *dst) {
    for (int i = 0; i < n; i++) {
        float *d = dst + (size_t)i * row;
        memset(d, 0, (size_t)row * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *x = src + (size_t)idx[(size_t)i * k + j] * row;
            for (int c = 0; c < row; c++) d[c] += x[c] * s;
        }
    }
}
