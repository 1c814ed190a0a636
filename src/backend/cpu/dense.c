/* CPU ops over dense activations (backend.h): bidirectional attention over contiguous keys and values
 * (the vision tower, docs/gemma4-towers.md 2.6), clamp (clipped linears), per-column shift and scale
 * (patch input, standardize) and gathered row sums (the vision pooler).
 *
 * attention_dense works per (head, block of queries): the head's keys are packed in groups of 8
 * ([group][dim][8]) so that a tile of 4 queries x 32 keys accumulates in registers; the softmax uses the
 * SIMD exp kernel and divides the output row by the sum; P V takes 4 queries x 32 columns at a time.
 * GCC vector types and target_clones give the AVX-512, AVX2 and baseline versions of the tiles (x86-64; one
 * baseline version elsewhere). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

#define QBLOCK 64 /* queries per work item */
#define QTILE 4   /* queries per register tile */

typedef float v8 __attribute__((vector_size(32), aligned(4))); /* loads need no alignment */

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES /* elsewhere the vector types compile to the baseline SIMD (NEON on aarch64) */
#endif

/* Accumulators are named variables (an array would be kept in memory by GCC). */
#define ROW4(a, x0, x1, x2, x3) (a##0 += (x0), a##1 += (x1), a##2 += (x2), a##3 += (x3))

/* s[t][j] = q_t . k_j for QTILE = 4 queries and the keys of packed groups of 8, four groups (32 keys) at a
 * time (n_groups % 4 == 0): 16 accumulators, 4 key loads and 4 query broadcasts per 16 FMAs */
CLONES static void qk_tile(const float *const *q, const float *kp, int D, int n_groups, float *const *s) {
    const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    for (int g = 0; g < n_groups; g += 4) {
        const v8 *k = (const v8 *)(const void *)(kp + (size_t)g * D * 8);
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0};
        for (int d = 0; d < D; d++) {
            const v8 k0 = k[d], k1 = k[D + d], k2 = k[2 * D + d], k3 = k[3 * D + d];
            ROW4(a, q0[d] * k0, q0[d] * k1, q0[d] * k2, q0[d] * k3);
            ROW4(b, q1[d] * k0, q1[d] * k1, q1[d] * k2, q1[d] * k3);
            ROW4(c, q2[d] * k0, q2[d] * k1, q2[d] * k2, q2[d] * k3);
            ROW4(d, q3[d] * k0, q3[d] * k1, q3[d] * k2, q3[d] * k3);
        }
        v8 *s0 = (v8 *)(void *)(s[0] + 8 * g), *s1 = (v8 *)(void *)(s[1] + 8 * g);
        v8 *s2 = (v8 *)(void *)(s[2] + 8 * g), *s3 = (v8 *)(void *)(s[3] + 8 * g);
        s0[0] = a0, s0[1] = a1, s0[2] = a2, s0[3] = a3;
        s1[0] = b0, s1[1] = b1, s1[2] = b2, s1[3] = b3;
        s2[0] = c0, s2[1] = c1, s2[2] = c2, s2[3] = c3;
        s3[0] = d0, s3[1] = d1, s3[2] = d2, s3[3] = d3;
    }
}

/* o_t = sum_j p_t[j] v[j] for QTILE = 4 queries (D % 8 == 0): 32 columns at a time (16 accumulators, 4 value
 * loads and 4 probability broadcasts per 16 FMAs), then 8 */
CLONES static void pv_tile(const float *const *p, const float *v, size_t v_stride, int n_k, int D,
                           float *const *o) {
    const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    int c = 0;
    for (; c + 32 <= D; c += 32) {
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        v8 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0};
        for (int j = 0; j < n_k; j++) {
            const v8 *vj = (const v8 *)(const void *)(v + (size_t)j * v_stride + c);
            const v8 v0 = vj[0], v1 = vj[1], v2 = vj[2], v3 = vj[3];
            ROW4(a, p0[j] * v0, p0[j] * v1, p0[j] * v2, p0[j] * v3);
            ROW4(b, p1[j] * v0, p1[j] * v1, p1[j] * v2, p1[j] * v3);
            ROW4(c, p2[j] * v0, p2[j] * v1, p2[j] * v2, p2[j] * v3);
            ROW4(d, p3[j] * v0, p3[j] * v1, p3[j] * v2, p3[j] * v3);
        }
        v8 *o0 = (v8 *)(void *)(o[0] + c), *o1 = (v8 *)(void *)(o[1] + c), *o2 = (v8 *)(void *)(o[2] + c);
        v8 *o3 = (v8 *)(void *)(o[3] + c);
        o0[0] = a0, o0[1] = a1, o0[2] = a2, o0[3] = a3;
        o1[0] = b0, o1[1] = b1, o1[2] = b2, o1[3] = b3;
        o2[0] = c0, o2[1] = c1, o2[2] = c2, o2[3] = c3;
        o3[0] = d0, o3[1] = d1, o3[2] = d2, o3[3] = d3;
    }
    for (; c < D; c += 8) {
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int j = 0; j < n_k; j++) {
            const v8 vv = *(const v8 *)(const void *)(v + (size_t)j * v_stride + c);
            ROW4(a, p0[j] * vv, p1[j] * vv, p2[j] * vv, p3[j] * vv);
        }
        *(v8 *)(void *)(o[0] + c) = a0, *(v8 *)(void *)(o[1] + c) = a1;
        *(v8 *)(void *)(o[2] + c) = a2, *(v8 *)(void *)(o[3] + c) = a3;
    }
}

typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));

/* s[j] = s[j] * scale (+ bias[j]), -inf where valid[j] == 0; returns the largest */
CLONES static float scores_prepare(float *s, int n, float scale, const float *bias, const int32_t *valid) {
    const v8 ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    v8 mv = ninf;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8 x = *(v8 *)(void *)(s + j) * scale;
        if (bias) x += *(const v8 *)(const void *)(bias + j);
        if (valid) {
            v8i keep = *(const v8i *)(const void *)(valid + j) != 0;
            x = (v8)(((v8i)x & keep) | ((v8i)ninf & ~keep));
        }
        *(v8 *)(void *)(s + j) = x;
        v8i gt = x > mv;
        mv = (v8)(((v8i)x & gt) | ((v8i)mv & ~gt));
    }
    float mx = -INFINITY;
    for (int i = 0; i < 8; i++) mx = mv[i] > mx ? mv[i] : mx;
    for (; j < n; j++) {
        float x = s[j] * scale;
        if (bias) x += bias[j];
        if (valid && !valid[j]) x = -INFINITY;
        s[j] = x;
        mx = x > mx ? x : mx;
    }
    return mx;
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
    const int ng = (nk + 31) / 32 * 4, nkp = ng * 8, Dp = (D + 7) & ~7; /* key groups: a multiple of 4 */
    const size_t q_stride = (size_t)H * D, kv_stride = (size_t)a->n_kv_heads * D;
    /* scratch: packed keys [ng][D][8], values with padded columns [nk][Dp], scores [QBLOCK][nkp], a zero query,
     * output rows [QTILE][Dp] */
    float *kp = g4_cpu_scratch_get(j->cpu, thread, (size_t)nkp * D + (size_t)nk * Dp + (size_t)QBLOCK * nkp +
                                                       (size_t)D + (size_t)QTILE * Dp);
    if (!kp) return;
    float *vp = kp + (size_t)nkp * D, *sc = vp + (size_t)nk * Dp, *zero = sc + (size_t)QBLOCK * nkp;
    float *orow = zero + D, inv[QBLOCK];
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
            float *s = sc + (size_t)t * nkp;
            const float *bias = a->bias ? a->bias + ((size_t)(a->bias_heads > 1 ? h : 0) * a->n_q + q0 + t) * nk : NULL;
            const float mx = scores_prepare(s, nk, a->scale, bias, a->key_valid);
            /* softmax numerators; the division by their sum is applied to the output row */
            inv[t] = mx == -INFINITY ? 0.0f : 1.0f / kn->exp_sum(s, (size_t)nk, mx); /* 0: no key to attend to */
            if (mx == -INFINITY) memset(s, 0, (size_t)nk * sizeof(float));
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
                float *o = a->out + (size_t)(q0 + t0 + t) * q_stride + (size_t)h * D;
                for (int d = 0; d < D; d++) o[d] = os[t][d] * inv[t0 + t];
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
