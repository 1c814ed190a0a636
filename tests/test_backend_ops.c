/* Backend ops against plain references (double-precision loops written here): attention_dense (GQA,
 * head sizes 16/64/72, key counts that are not multiples of the tiles, a bias per head or shared, masked
 * keys, a query that sees no key), clamp, shift_scale_cols, gather_sum; and the CPU's SIMD exp kernel
 * against expf. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "check.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static float *buf(g4_backend *be, size_t n, float amp) {
    float *host = malloc(n * sizeof(float) + 4), *dev = be->ops->alloc(be, n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) host[i] = frand() * amp;
    be->ops->to_device(be, dev, host, n * sizeof(float));
    free(host);
    return dev;
}

static float *host_copy(g4_backend *be, const float *dev, size_t n) {
    float *h = malloc(n * sizeof(float) + 4);
    be->ops->to_host(be, h, dev, n * sizeof(float));
    be->ops->sync(be);
    return h;
}

static void check_attention_dense(g4_backend *be, int nq, int nk, int H, int HKV, int D, int bias_heads, int mask) {
    const size_t qn = (size_t)nq * H * D, kn = (size_t)nk * HKV * D;
    float *q = buf(be, qn, 2.0f), *k = buf(be, kn, 2.0f), *v = buf(be, kn, 1.0f), *out = buf(be, qn, 0.0f);
    float *bias = bias_heads ? buf(be, (size_t)bias_heads * nq * nk, 3.0f) : NULL;
    int32_t *valid = NULL, *valid_h = NULL;
    if (mask) {
        valid_h = malloc((size_t)nk * sizeof(int32_t));
        for (int j = 0; j < nk; j++) valid_h[j] = (j % 3) != 1;
        valid = be->ops->alloc(be, (size_t)nk * sizeof(int32_t));
        be->ops->to_device(be, valid, valid_h, (size_t)nk * sizeof(int32_t));
    }
    const float scale = 0.7f;
    g4_dense_attention_args a = {.q = q, .k = k, .v = v, .out = out, .n_q = nq, .n_k = nk, .n_heads = H,
                                 .n_kv_heads = HKV, .head_dim = D, .scale = scale, .key_valid = valid,
                                 .bias = bias, .bias_heads = bias_heads};
    be->ops->attention_dense(be, &a);
    float *hq = host_copy(be, q, qn), *hk = host_copy(be, k, kn), *hv = host_copy(be, v, kn), *ho = host_copy(be, out, qn);
    float *hb = bias ? host_copy(be, bias, (size_t)bias_heads * nq * nk) : NULL;
    double worst = 0;
    double *s = malloc((size_t)nk * sizeof(double));
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < H; h++) {
            const int hkv = h / (H / HKV);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double)hq[((size_t)i * H + h) * D + c] * hk[((size_t)j * HKV + hkv) * D + c];
                d *= scale;
                if (hb) d += hb[((size_t)(bias_heads > 1 ? h : 0) * nq + i) * nk + j];
                if (valid_h && !valid_h[j]) d = -INFINITY;
                s[j] = d;
                if (d > mx) mx = d;
            }
            for (int j = 0; j < nk; j++) sum += (s[j] = mx == -INFINITY ? 0 : exp(s[j] - mx));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int j = 0; j < nk; j++) o += s[j] / (sum > 0 ? sum : 1) * hv[((size_t)j * HKV + hkv) * D + c];
                double e = fabs(o - ho[((size_t)i * H + h) * D + c]);
                if (!(e <= worst)) worst = e;
            }
        }
    CHECKF(worst < 2e-5, "attention_dense nq=%d nk=%d H=%d/%d D=%d bias=%d mask=%d: max error %g", nq, nk, H, HKV, D,
           bias_heads, mask, worst);
    free(s);
    free(hq), free(hk), free(hv), free(ho), free(hb), free(valid_h);
    be->ops->release(be, q), be->ops->release(be, k), be->ops->release(be, v), be->ops->release(be, out);
    if (bias) be->ops->release(be, bias);
    if (valid) be->ops->release(be, valid);
}

/* a query whose keys are all masked gets zeros, never NaN */
static void check_attention_no_keys(g4_backend *be) {
    const int nq = 3, nk = 5, D = 16;
    float *q = buf(be, (size_t)nq * D, 1), *k = buf(be, (size_t)nk * D, 1), *v = buf(be, (size_t)nk * D, 1);
    float *out = buf(be, (size_t)nq * D, 1), *bias = buf(be, (size_t)nq * nk, 1);
    float *hb = host_copy(be, bias, (size_t)nq * nk);
    for (int j = 0; j < nk; j++) hb[1 * nk + j] = -INFINITY; /* query 1 sees nothing */
    be->ops->to_device(be, bias, hb, (size_t)nq * nk * sizeof(float));
    g4_dense_attention_args a = {.q = q, .k = k, .v = v, .out = out, .n_q = nq, .n_k = nk, .n_heads = 1,
                                 .n_kv_heads = 1, .head_dim = D, .scale = 1, .bias = bias, .bias_heads = 1};
    be->ops->attention_dense(be, &a);
    float *ho = host_copy(be, out, (size_t)nq * D);
    int zeros = 1, finite = 1;
    for (int c = 0; c < D; c++) zeros &= ho[D + c] == 0.0f;
    for (int i = 0; i < nq * D; i++) finite &= isfinite(ho[i]);
    CHECKF(zeros && finite, "attention_dense: a query without keys must give zeros");
    free(hb), free(ho);
    be->ops->release(be, q), be->ops->release(be, k), be->ops->release(be, v), be->ops->release(be, out);
    be->ops->release(be, bias);
}

static void check_small_ops(g4_backend *be) {
    const int rows = 7, cols = 13;
    const size_t n = (size_t)rows * cols;
    float *x = buf(be, n, 4), *y = buf(be, n, 0), *sh = buf(be, cols, 1), *sc = buf(be, cols, 2);
    float *hx = host_copy(be, x, n);
    be->ops->clamp(be, x, y, n, -1.5f, 0.25f);
    float *hy = host_copy(be, y, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += hy[i] != fminf(fmaxf(hx[i], -1.5f), 0.25f);
    CHECKF(bad == 0, "clamp: %d values wrong", bad);
    be->ops->clamp(be, x, x, n, -INFINITY, INFINITY); /* in place, unbounded: unchanged */
    free(hy);
    hy = host_copy(be, x, n);
    CHECK(memcmp(hy, hx, n * sizeof(float)) == 0);
    float *hsh = host_copy(be, sh, cols), *hsc = host_copy(be, sc, cols);
    be->ops->shift_scale_cols(be, x, rows, cols, sh, sc);
    free(hy);
    hy = host_copy(be, x, n);
    bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) bad += hy[r * cols + c] != (hx[r * cols + c] + hsh[c]) * hsc[c];
    CHECKF(bad == 0, "shift_scale_cols: %d values wrong", bad);
    be->ops->shift_scale_cols(be, x, rows, cols, NULL, sc); /* scale only */
    float *hz = host_copy(be, x, n);
    bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) bad += hz[r * cols + c] != hy[r * cols + c] * hsc[c];
    CHECKF(bad == 0, "shift_scale_cols (scale only): %d values wrong", bad);
    /* gather_sum: 3 outputs of 2 rows each, in the listed order */
    const int32_t idx_h[6] = {4, 0, 6, 6, 2, 3};
    int32_t *idx = be->ops->alloc(be, sizeof idx_h);
    be->ops->to_device(be, idx, idx_h, sizeof idx_h);
    be->ops->gather_sum(be, y, idx, 3, 2, cols, 0.5f, x);
    float *hg = host_copy(be, x, 3 * (size_t)cols), *hy2 = host_copy(be, y, n);
    bad = 0;
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < cols; c++) {
            float want = 0.0f;
            want += hy2[idx_h[2 * i] * cols + c] * 0.5f;
            want += hy2[idx_h[2 * i + 1] * cols + c] * 0.5f;
            bad += hg[i * cols + c] != want;
        }
    CHECKF(bad == 0, "gather_sum: %d values wrong", bad);
    free(hx), free(hy), free(hz), free(hsh), free(hsc), free(hg), free(hy2);
    be->ops->release(be, x), be->ops->release(be, y), be->ops->release(be, sh), be->ops->release(be, sc);
    be->ops->release(be, idx);
}

/* matmul over the tile paths and their edges: token and row counts off the 4 x 4 tiles, several token
 * blocks, F32/BF16/F16 weights, with and without bias */
static void check_matmul(g4_backend *be, int n, int in, int out, g4_dtype dt, int with_bias) {
    const size_t esz = dt == G4_F32 ? 4 : 2;
    unsigned char *wdata = malloc((size_t)out * in * esz + 4);
    float *wf = malloc((size_t)out * in * sizeof(float));
    for (size_t i = 0; i < (size_t)out * in; i++) {
        float v = frand();
        if (dt == G4_BF16) {
            uint16_t h = g4_f32_to_bf16(v);
            memcpy(wdata + 2 * i, &h, 2);
            wf[i] = g4_bf16_to_f32(h);
        } else if (dt == G4_F16) {
            uint16_t h = g4_f32_to_f16(v);
            memcpy(wdata + 2 * i, &h, 2);
            wf[i] = g4_f16_to_f32(h);
        } else {
            memcpy(wdata + 4 * i, &v, 4);
            wf[i] = v;
        }
    }
    g4_tensor w = {.name = "w", .dtype = dt, .ndim = 2, .shape = {out, in}, .data = wdata, .nbytes = (size_t)out * in * esz};
    float *x = buf(be, (size_t)n * in, 1), *y = buf(be, (size_t)n * out, 0), *bias = with_bias ? buf(be, out, 1) : NULL;
    be->ops->matmul(be, x, n, &w, bias, y);
    float *hx = host_copy(be, x, (size_t)n * in), *hy = host_copy(be, y, (size_t)n * out);
    float *hb = bias ? host_copy(be, bias, out) : NULL;
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < out; r++) {
            double s = hb ? hb[r] : 0;
            for (int i = 0; i < in; i++) s += (double)hx[(size_t)t * in + i] * wf[(size_t)r * in + i];
            double e = fabs(s - hy[(size_t)t * out + r]) / (1.0 + fabs(s));
            if (!(e <= worst)) worst = e;
        }
    CHECKF(worst < 1e-5, "matmul n=%d in=%d out=%d %s bias=%d: max error %g", n, in, out, g4_dtype_name(dt), with_bias,
           worst);
    free(wdata), free(wf), free(hx), free(hy), free(hb);
    be->ops->release(be, x), be->ops->release(be, y);
    if (bias) be->ops->release(be, bias);
}

static void check_exp_kernel(void) {
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    enum { N = 1000 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = -100.0f + 100.0f * i / (N - 1); /* -100 .. 0, past the underflow */
    x[3] = -INFINITY;
    memcpy(y, x, sizeof x);
    float sum = k->exp_sum(y, N, 0.0f);
    double worst = 0, want_sum = 0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)x[i]);
        want_sum += want;
        double rel = want > 1e-30 ? fabs(y[i] - want) / want : fabs(y[i] - want);
        if (!(rel <= worst)) worst = rel;
    }
    CHECKF(worst < 4e-7 && y[3] == 0.0f, "exp_sum (%s): max relative error %g", k->isa, worst);
    CHECKF(fabs(sum - want_sum) / want_sum < 1e-6, "exp_sum (%s): sum %g, want %g", k->isa, sum, want_sum);
}

static void check_gelu_kernel(void) {
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    enum { N = 2001 };
    static float g[N], u[N], y[N];
    for (int i = 0; i < N; i++) {
        g[i] = -12.0f + 24.0f * i / (N - 1);
        u[i] = 0.5f + (float)(i % 7);
    }
    k->gelu_mul(g, u, y, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double x = g[i], want = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) * u[i];
        double e = fabs(y[i] - want) / (1.0 + fabs(want));
        if (!(e <= worst)) worst = e;
    }
    CHECKF(worst < 1e-6, "gelu_mul (%s): max error %g", k->isa, worst);
    k->gelu_mul(g, NULL, y, N); /* without u, in place */
    CHECK(isfinite(y[0]) && y[0] > -1e-6f && fabsf(y[N - 1] - 12.0f) < 1e-5f);
}

int main(void) {
    g4_error err;
    g4_backend *be = g4_backend_cpu_new(2, &err);
    if (!be) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    check_exp_kernel();
    check_gelu_kernel();
    static const int mm[][3] = {{1, 64, 9}, {3, 13, 7}, {5, 770, 33}, {70, 64, 12}, {131, 100, 17}, {4, 16, 4}};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
        for (int d = 0; d < 3; d++)
            check_matmul(be, mm[i][0], mm[i][1], mm[i][2], d == 0 ? G4_F32 : d == 1 ? G4_BF16 : G4_F16, (int)(i % 2));
    check_attention_dense(be, 70, 70, 4, 4, 16, 0, 0);   /* the fixture's vision tower */
    check_attention_dense(be, 130, 133, 12, 12, 64, 0, 0); /* E4B heads, keys not a multiple of 8 */
    check_attention_dense(be, 67, 45, 16, 16, 72, 1, 1);  /* 31B heads, shared bias, masked keys */
    check_attention_dense(be, 5, 9, 8, 2, 24, 8, 0);      /* GQA, a bias per head */
    check_attention_no_keys(be);
    check_small_ops(be);
    g4_backend_free(be);
    return g4t_done();
}
