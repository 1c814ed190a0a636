/* Every op of the backend table (src/backend/backend.h) on every backend this build and machine have, against
 * a plain double-precision reference written here, over odd shapes (ggml's test-backend-ops is the model).
 *
 * Backends: the CPU with the instruction set G4_CPU_ISA names (ctest runs this program once per instruction
 * set: scalar, avx2, avx512; one the machine lacks is skipped), and CUDA when built in and a GPU is present.
 * Inputs are random (fixed seeds), uploaded to the backend, the op runs, the result comes back and is compared
 * with the reference: max |got - ref| <= tol * max(1, max |ref|). Tolerances: 1e-5 relative for f32 arithmetic
 * on the host; a backend that computes products in lower precision (bf16 tensor cores) states its own factor in
 * backend_tol(). Every case prints nothing when it passes; failures name the op, the backend and the shape.
 *
 * Quantized weights (GGUF blocks, MLX affine; core/quant.h): random values encoded by the reference encoders of
 * core/quant.c (random block bytes with sane scales for the types it does not write), and the reference reads
 * them through the reference decoder (checked against hand-computed values in test_quant.c). Where a backend
 * multiplies with activations rounded to int8 blocks (the CPU for Q8_0/Q4_0, as llama.cpp does:
 * g4_cpu_q8_supported), the reference rounds x by the same rule (d = max|x|/127 per 32, q = rint(x/d)), so
 * the products are still checked to float precision. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "check.h"
#include "core/error.h"
#include "core/quant.h"

/* ------------------------------------------------------------- helpers */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() & 0xffffff) / 16777216.0f; }
static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
}

static g4_backend *be;
static const char *be_label;

/* Extra tolerance factor of a backend whose products round inputs to bf16 (1 for exact-f32 backends). */
static double backend_tol(void) { return be->ops->host_memory ? 1.0 : 400.0; }

static void *dev(const void *host, size_t bytes) {
    void *d = be->ops->alloc(be, bytes ? bytes : 4);
    if (d && host) be->ops->to_device(be, d, host, bytes);
    return d;
}
static float *devf(const float *host, size_t n) { return dev(host, n * sizeof(float)); }
static void back(void *host, const void *d, size_t bytes) {
    be->ops->to_host(be, host, d, bytes);
    be->ops->sync(be);
}
static void rel(void *d) { be->ops->release(be, d); }

/* max |got - ref| / max(1, max |ref|) */
static double rel_err(const float *got, const double *ref, size_t n) {
    double m = 1, e = 0;
    for (size_t i = 0; i < n; i++) m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d; /* NaN counts as an error */
    }
    return e / m;
}

#define EXPECT_CLOSE(got, ref, n, tol, ...)                                                                  \
    do {                                                                                                     \
        double e_ = rel_err(got, ref, n);                                                                    \
        CHECKF(e_ <= (tol), "%s: error %.3g > %.3g: ", be_label, e_, (double)(tol));                         \
        if (!(e_ <= (tol))) fprintf(stderr, __VA_ARGS__), fputc('\n', stderr);                              \
    } while (0)

/* A host weight [rows, cols] of a dtype with random values in [-a, a]; ref gets the values as read. */
typedef struct {
    g4_tensor host, dev;
    void *data, *scales, *biases;
    double *ref;
} weight;

static void weight_upload(weight *w) {
    g4_error err;
    if (be->ops->upload_weight(be, &w->host, &w->dev, &err)) {
        CHECKF(0, "%s: upload_weight: %s", be_label, err.msg);
        w->dev = w->host;
    }
}

/* A quantized weight (rows of shape[ndim-1], a multiple of the type's block or group) of values in [-a, a]. */
static void qweight_make(weight *w, g4_dtype t, int ndim, const int64_t *shape, float a) {
    memset(w, 0, sizeof *w);
    const int64_t cols = shape[ndim - 1];
    int64_t rows = 1;
    for (int i = 0; i + 1 < ndim; i++) rows *= shape[i];
    w->host = (g4_tensor){.name = "w", .dtype = t, .ndim = ndim};
    for (int i = 0; i < ndim; i++) w->host.shape[i] = shape[i];
    float *v = malloc((size_t)cols * sizeof(float));
    if (g4_dtype_is_mlx(t)) {
        static int turn;
        const int groups[3] = {32, 64, 128}, bits = g4_mlx_bits(t);
        int group = groups[turn++ % 3];
        while (cols % group) group /= 2;
        const size_t row_bytes = (size_t)cols * (size_t)bits / 8, ng = (size_t)(cols / group);
        w->data = malloc((size_t)rows * row_bytes + 1);
        w->scales = malloc((size_t)rows * ng * 2);
        w->biases = malloc((size_t)rows * ng * 2);
        unsigned char *codes = (unsigned char *)w->data + 1; /* unaligned, as in MLX files */
        for (int64_t r = 0; r < rows; r++) {
            fill(v, (size_t)cols, -a, a);
            g4_mlx_quant_row(bits, group, v, cols, codes + (size_t)r * row_bytes, (uint16_t *)w->scales + (size_t)r * ng,
                             (uint16_t *)w->biases + (size_t)r * ng, G4_BF16);
        }
        w->host.data = codes;
        w->host.nbytes = (size_t)rows * row_bytes;
        w->host.scales = w->scales;
        w->host.biases = w->biases;
        w->host.scale_dtype = G4_BF16;
        w->host.group = group;
    } else {
        const size_t row_bytes = g4_dtype_row_bytes(t, cols), bs = (size_t)g4_dtype_block_bytes(t);
        w->data = malloc((size_t)rows * row_bytes + 1);
        unsigned char *b = (unsigned char *)w->data + 1;
        for (int64_t r = 0; r < rows; r++) {
            unsigned char *row = b + (size_t)r * row_bytes;
            fill(v, (size_t)cols, -a, a);
            if (g4_quant(t, v, row, cols)) continue;
            /* no encoder (Q4_1, Q5_0, Q5_1): random codes, f16 d (and m) of a sane size */
            for (size_t i = 0; i < row_bytes; i++) row[i] = (unsigned char)next_u32();
            for (size_t k = 0; k < row_bytes / bs; k++) {
                uint16_t d = g4_f32_to_f16(uniform(0.2f, 1.0f) * a / 16), m = g4_f32_to_f16(uniform(-a, 0));
                memcpy(row + k * bs, &d, 2);
                if (t == G4_Q4_1 || t == G4_Q5_1) memcpy(row + k * bs + 2, &m, 2);
            }
        }
        w->host.data = b;
        w->host.nbytes = (size_t)rows * row_bytes;
    }
    w->ref = malloc((size_t)rows * (size_t)cols * sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        g4_dequant_row(&w->host, r, v);
        for (int64_t c = 0; c < cols; c++) w->ref[(size_t)r * (size_t)cols + (size_t)c] = v[c];
    }
    free(v);
    weight_upload(w);
}

static void weight_make(weight *w, g4_dtype t, int ndim, const int64_t *shape, float a) {
    memset(w, 0, sizeof *w);
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    size_t esz = (size_t)g4_dtype_bits(t) / 8;
    w->data = malloc(n * esz + 1);
    w->ref = malloc(n * sizeof(double));
    unsigned char *bytes = (unsigned char *)w->data + 1; /* deliberately unaligned, as in MLX files */
    if (t == G4_F32) bytes = w->data;
    for (size_t i = 0; i < n; i++) {
        float v = uniform(-a, a);
        if (t == G4_BF16) {
            uint16_t h = g4_f32_to_bf16(v);
            memcpy(bytes + i * 2, &h, 2);
            w->ref[i] = g4_bf16_to_f32(h);
        } else if (t == G4_F16) {
            uint16_t h = g4_f32_to_f16(v);
            memcpy(bytes + i * 2, &h, 2);
            w->ref[i] = g4_f16_to_f32(h);
        } else {
            memcpy(bytes + i * 4, &v, 4);
            w->ref[i] = v;
        }
    }
    w->host = (g4_tensor){.name = "w", .dtype = t, .ndim = ndim, .data = bytes, .nbytes = n * esz};
    for (int i = 0; i < ndim; i++) w->host.shape[i] = shape[i];
    weight_upload(w);
}
static void weight_free(weight *w) {
    if (w->dev.data != w->host.data) be->ops->release_weight(be, &w->dev);
    free(w->data);
    free(w->scales);
    free(w->biases);
    free(w->ref);
}

static void make_any(weight *w, g4_dtype t, int ndim, const int64_t *shape, float a) {
    if (g4_dtype_is_quantized(t))
        qweight_make(w, t, ndim, shape, a);
    else
        weight_make(w, t, ndim, shape, a);
}

static const g4_dtype dtypes[] = {G4_F32, G4_BF16, G4_F16};
static const g4_dtype qtypes[] = {G4_Q8_0, G4_Q4_0, G4_Q4_1, G4_Q5_0, G4_Q5_1, G4_Q4_K, G4_Q5_K, G4_Q6_K,
                                  G4_MLX2, G4_MLX3, G4_MLX4, G4_MLX5, G4_MLX6, G4_MLX8};
#define N_QTYPES (sizeof qtypes / sizeof qtypes[0])

/* x[n, in] as the backend's product with w reads it: rounded to int8 blocks where the CPU does so. */
static void x_as_read(const float *x, int n, int in, const g4_tensor *w, double *xr) {
    int rounds = !strcmp(be->ops->name, "cpu") && g4_cpu_q8_supported(w);
    for (int t = 0; t < n; t++)
        for (int b = 0; b < in; b += 32) {
            const float *xb = x + (size_t)t * in + b;
            double *ob = xr + (size_t)t * in + b;
            int m = in - b < 32 ? in - b : 32;
            float amax = 0;
            for (int j = 0; j < m; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            for (int j = 0; j < m; j++) ob[j] = rounds ? (double)d * (double)lrintf(xb[j] * id) : (double)xb[j];
        }
}

/* ------------------------------------------------------------- matmul */
static void ref_matmul(const float *x, int n, const weight *w, const float *bias, double *y) {
    int out = (int)w->host.shape[0], in = (int)w->host.shape[1];
    double *xr = malloc((size_t)n * in * sizeof(double));
    x_as_read(x, n, in, &w->host, xr);
    for (int t = 0; t < n; t++)
        for (int r = 0; r < out; r++) {
            double s = bias ? bias[r] : 0;
            for (int i = 0; i < in; i++) s += xr[(size_t)t * in + i] * w->ref[(size_t)r * in + i];
            y[(size_t)t * out + r] = s;
        }
    free(xr);
}

/* One product y = x w^T (+ bias) of a made weight against the reference. */
static void check_product(weight *w, int n, int with_bias) {
    const int out = (int)w->host.shape[0], in = (int)w->host.shape[1];
    float *x = malloc((size_t)n * in * sizeof(float)), *bias = malloc((size_t)out * sizeof(float));
    fill(x, (size_t)n * in, -1, 1);
    fill(bias, (size_t)out, -1, 1);
    double *ref = malloc((size_t)n * out * sizeof(double));
    ref_matmul(x, n, w, with_bias ? bias : NULL, ref);
    float *dx = devf(x, (size_t)n * in), *db = devf(bias, (size_t)out), *dy = devf(NULL, (size_t)n * out);
    be->ops->matmul(be, dx, n, &w->dev, with_bias ? db : NULL, dy);
    float *y = malloc((size_t)n * out * sizeof(float));
    back(y, dy, (size_t)n * out * sizeof(float));
    EXPECT_CLOSE(y, ref, (size_t)n * out, 1e-5 * sqrt(in) * backend_tol(), "matmul %s n=%d in=%d out=%d bias=%d",
                 g4_dtype_name(w->host.dtype), n, in, out, with_bias);
    rel(dx), rel(db), rel(dy);
    free(x), free(bias), free(ref), free(y);
}

/* Every dtype: decode (1 token), the small-batch tiles and prefill (17 tokens), rows that are not a multiple of
 * the kernels' row tiles, rows of one and several blocks. */
static void test_matmul(void) {
    const int ns[] = {1, 2, 5, 17}, outs[] = {1, 13, 130};
    for (size_t di = 0; di < 3 + N_QTYPES; di++) {
        const g4_dtype t = di < 3 ? dtypes[di] : qtypes[di - 3];
        const int bk = g4_dtype_block(t) >= 256 ? 256 : 64; /* whole blocks and MLX groups */
        const int ins[] = {di < 3 ? 7 : bk, di < 3 ? 64 : 2 * bk, di < 3 ? 259 : 3 * bk};
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 3; b++)
                for (size_t c = 0; c < 3; c++) {
                    weight w;
                    make_any(&w, t, 2, (int64_t[]){outs[c], ins[b]}, 1.0f);
                    check_product(&w, ns[a], (int)((a + b + c) & 1));
                    weight_free(&w);
                }
    }
}

static void test_matmul_set(void) {
    for (int quantized = 0; quantized < 2; quantized++)
    for (int count = 1; count <= G4_MATMUL_SET_MAX; count++)
        for (int n = 1; n <= 17; n += 8) {
            const int in = quantized ? 256 : 77, outs[3] = {31, 5, 18};
            const g4_dtype qset[3] = {G4_Q8_0, G4_Q4_K, G4_Q4_0};
            weight w[3];
            g4_matmul_set set = {.count = count};
            float *x = malloc((size_t)n * in * sizeof(float)), *bias = malloc(64 * sizeof(float));
            fill(x, (size_t)n * in, -1, 1);
            fill(bias, 64, -1, 1);
            float *dx = devf(x, (size_t)n * in), *db = devf(bias, 64);
            for (int i = 0; i < count; i++) {
                if (quantized)
                    qweight_make(&w[i], qset[i], 2, (int64_t[]){outs[i], in}, 1.0f);
                else
                    weight_make(&w[i], dtypes[i], 2, (int64_t[]){outs[i], in}, 1.0f);
                set.w[i] = &w[i].dev;
                set.bias[i] = i == 1 ? db : NULL;
                set.y[i] = devf(NULL, (size_t)n * outs[i]);
            }
            be->ops->matmul_set(be, dx, n, &set);
            for (int i = 0; i < count; i++) {
                double *ref = malloc((size_t)n * outs[i] * sizeof(double));
                float *y = malloc((size_t)n * outs[i] * sizeof(float));
                ref_matmul(x, n, &w[i], i == 1 ? bias : NULL, ref);
                back(y, set.y[i], (size_t)n * outs[i] * sizeof(float));
                EXPECT_CLOSE(y, ref, (size_t)n * outs[i], 1e-5 * sqrt(in) * backend_tol(),
                             "matmul_set count=%d n=%d product %d (%s)", count, n, i, g4_dtype_name(w[i].host.dtype));
                free(ref), free(y);
                rel(set.y[i]);
                weight_free(&w[i]);
            }
            rel(dx), rel(db);
            free(x), free(bias);
        }
}

/* ------------------------------------------------------------- embed */
static void test_embed(void) {
    for (size_t di = 0; di < 3 + N_QTYPES; di++) {
        const int rows = 50, n = 11;
        weight w;
        if (di < 3)
            weight_make(&w, dtypes[di], 2, (int64_t[]){rows, 37}, 2.0f);
        else
            qweight_make(&w, qtypes[di - 3], 2, (int64_t[]){rows, 256}, 2.0f);
        const int cols = (int)w.host.shape[1];
        int32_t ids[11];
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(next_u32() % rows);
        ids[3] = rows - 1;
        ids[4] = 0;
        double ref[11 * 256];
        for (int i = 0; i < n; i++)
            for (int c = 0; c < cols; c++) ref[i * cols + c] = w.ref[(size_t)ids[i] * cols + c] * (double)0.75f;
        int32_t *dids = dev(ids, sizeof ids);
        float *dout = devf(NULL, (size_t)n * cols), out[11 * 256];
        be->ops->embed(be, &w.dev, dids, n, 0.75f, dout);
        back(out, dout, (size_t)n * cols * sizeof(float));
        EXPECT_CLOSE(out, ref, (size_t)n * cols, 1e-6, "embed %s", g4_dtype_name(w.host.dtype));
        rel(dids), rel(dout);
        weight_free(&w);
    }
}

/* ------------------------------------------------------------- norms */
static void ref_rms_row(const float *x, const float *w, int dim, float eps, double *y) {
    double ms = 0;
    for (int i = 0; i < dim; i++) ms += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ms / dim + eps);
    for (int i = 0; i < dim; i++) y[i] = x[i] * inv * (w ? w[i] : 1.0);
}

static void test_norms(void) {
    const int dims[] = {1, 7, 128, 257, 1536};
    for (size_t di = 0; di < 5; di++)
        for (int rows = 1; rows <= 9; rows += 4)
            for (int with_w = 0; with_w <= 1; with_w++) {
                const int dim = dims[di];
                const size_t n = (size_t)rows * dim;
                float *x = malloc(n * sizeof(float)), *w = malloc((size_t)dim * sizeof(float)), *h = malloc(n * sizeof(float));
                float *y = malloc(n * sizeof(float));
                double *ref = malloc(n * sizeof(double));
                fill(x, n, -3, 3);
                fill(w, (size_t)dim, -2, 2);
                fill(h, n, -3, 3);
                const float eps = 1e-6f;
                float *dx = devf(x, n), *dw = devf(w, (size_t)dim), *dy = devf(NULL, n), *dh = devf(h, n);
                /* rmsnorm, out of place and in place */
                for (int r = 0; r < rows; r++) ref_rms_row(x + (size_t)r * dim, with_w ? w : NULL, dim, eps, ref + (size_t)r * dim);
                be->ops->rmsnorm(be, dx, with_w ? dw : NULL, rows, dim, eps, dy);
                back(y, dy, n * sizeof(float));
                EXPECT_CLOSE(y, ref, n, 1e-5, "rmsnorm rows=%d dim=%d w=%d", rows, dim, with_w);
                be->ops->rmsnorm(be, dx, with_w ? dw : NULL, rows, dim, eps, dx);
                back(y, dx, n * sizeof(float));
                EXPECT_CLOSE(y, ref, n, 1e-5, "rmsnorm in place rows=%d dim=%d", rows, dim);
                /* post_norm_add: h = (h + rmsnorm(o) w) s, with o = x */
                be->ops->to_device(be, dx, x, n * sizeof(float));
                for (size_t i = 0; i < n; i++) ref[i] = ((double)h[i] + ref[i]) * 0.5;
                if (!with_w) { /* the op always has a weight: use all-ones */
                    for (int i = 0; i < dim; i++) w[i] = 1.0f;
                    be->ops->to_device(be, dw, w, (size_t)dim * sizeof(float));
                }
                be->ops->post_norm_add(be, dh, dx, dw, rows, dim, eps, 0.5f);
                back(y, dh, n * sizeof(float));
                EXPECT_CLOSE(y, ref, n, 1e-5, "post_norm_add rows=%d dim=%d", rows, dim);
                rel(dx), rel(dw), rel(dy), rel(dh);
                free(x), free(w), free(h), free(y), free(ref);
            }
}

/* ------------------------------------------------------------- rope */
static void ref_rope_table(const int32_t *pos, int n, const float *inv_freq, int half, double *table) {
    for (int t = 0; t < n; t++)
        for (int k = 0; k < half; k++) {
            float a = inv_freq[k] * (float)pos[t]; /* the angle is an fp32 product in the contract */
            table[(size_t)t * 2 * half + k] = cos((double)a);
            table[(size_t)t * 2 * half + half + k] = sin((double)a);
        }
}

static void test_rope(void) {
    const int dims[] = {4, 64, 256, 512};
    for (size_t di = 0; di < 4; di++) {
        const int dim = dims[di], half = dim / 2, n = 6, heads = 3;
        int32_t pos[6] = {0, 1, 17, 511, 4095, 131071};
        float *inv = malloc((size_t)half * sizeof(float));
        for (int k = 0; k < half; k++) inv[k] = k >= half * 3 / 4 ? 0.0f : 1.0f / powf(10000.0f, (float)(2 * k) / dim);
        double *tref = malloc((size_t)n * dim * sizeof(double));
        ref_rope_table(pos, n, inv, half, tref);
        int32_t *dpos = dev(pos, sizeof pos);
        float *dinv = devf(inv, (size_t)half), *dtab = devf(NULL, (size_t)n * dim);
        be->ops->rope_table(be, dpos, n, dinv, half, dtab);
        float *tab = malloc((size_t)n * dim * sizeof(float));
        back(tab, dtab, (size_t)n * dim * sizeof(float));
        /* cos/sin of angles up to ~1e5 rad: fp32 sin/cos are accurate to a few ulp of the result */
        EXPECT_CLOSE(tab, tref, (size_t)n * dim, 2e-6, "rope_table dim=%d", dim);
        /* rope and head_norm_rope with the backend's own table */
        const size_t nx = (size_t)n * heads * dim;
        float *x = malloc(nx * sizeof(float)), *w = malloc((size_t)dim * sizeof(float)), *y = malloc(nx * sizeof(float));
        double *ref = malloc(nx * sizeof(double)), *normed = malloc((size_t)dim * sizeof(double));
        fill(x, nx, -2, 2);
        fill(w, (size_t)dim, -1, 1);
        for (int mode = 0; mode < 4; mode++) { /* 0 rope; 1 norm+w+rope; 2 norm no w + rope; 3 norm+w, no rope */
            for (int t = 0; t < n; t++)
                for (int h = 0; h < heads; h++) {
                    const float *v = x + ((size_t)t * heads + h) * dim;
                    double *o = ref + ((size_t)t * heads + h) * dim;
                    if (mode == 0)
                        for (int i = 0; i < dim; i++) normed[i] = v[i];
                    else
                        ref_rms_row(v, mode == 2 ? NULL : w, dim, 1e-6f, normed);
                    const float *cs = tab + (size_t)t * dim, *sn = cs + half;
                    for (int k = 0; k < half; k++) {
                        if (mode == 3) {
                            o[k] = normed[k], o[k + half] = normed[k + half];
                            continue;
                        }
                        o[k] = normed[k] * cs[k] - normed[k + half] * sn[k];
                        o[k + half] = normed[k + half] * cs[k] + normed[k] * sn[k];
                    }
                }
            float *dx = devf(x, nx), *dw = devf(w, (size_t)dim);
            if (mode == 0)
                be->ops->rope(be, dx, n, heads, dim, dtab);
            else
                be->ops->head_norm_rope(be, dx, n, heads, dim, mode == 2 ? NULL : dw, 1e-6f, mode == 3 ? NULL : dtab);
            back(y, dx, nx * sizeof(float));
            EXPECT_CLOSE(y, ref, nx, 1e-5, "%s dim=%d mode=%d", mode ? "head_norm_rope" : "rope", dim, mode);
            rel(dx), rel(dw);
        }
        rel(dpos), rel(dinv), rel(dtab);
        free(inv), free(tref), free(tab), free(x), free(w), free(y), free(ref), free(normed);
    }
}

/* ------------------------------------------------------------- elementwise */
static double gelu_tanh_ref(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static void test_elementwise(void) {
    const size_t sizes[] = {1, 15, 1000, 100003};
    for (size_t si = 0; si < 4; si++) {
        const size_t n = sizes[si];
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        double *ref = malloc(n * sizeof(double));
        fill(a, n, -6, 6);
        fill(b, n, -3, 3);
        float *da = devf(a, n), *db = devf(b, n), *dy = devf(NULL, n);
        for (int op = 0; op < 7; op++) {
            be->ops->to_device(be, da, a, n * sizeof(float));
            const char *name = "";
            for (size_t i = 0; i < n; i++) {
                double x = a[i], u = b[i];
                switch (op) {
                case 0: ref[i] = gelu_tanh_ref(x) * u, name = "gelu_mul"; break;
                case 1: ref[i] = gelu_tanh_ref(x), name = "gelu"; break;
                case 2: ref[i] = x + u, name = "add"; break;
                case 3: ref[i] = x * (double)-1.25f, name = "scale"; break;
                case 4: ref[i] = x * u, name = "mul"; break;
                case 5: ref[i] = (x + u) * (double)0.7071f, name = "add_scale"; break;
                case 6: ref[i] = tanh(x / 2.5) * 2.5, name = "softcap"; break;
                }
            }
            switch (op) {
            case 0: be->ops->gelu_mul(be, da, db, n, dy); break;
            case 1: be->ops->gelu_mul(be, da, NULL, n, dy); break;
            case 2: be->ops->add(be, da, db, n); break;
            case 3: be->ops->scale(be, da, n, -1.25f); break;
            case 4: be->ops->mul(be, da, db, n); break;
            case 5: be->ops->add_scale(be, da, db, n, 0.7071f); break;
            case 6: be->ops->softcap(be, da, n, 2.5f); break;
            }
            back(y, op <= 1 ? dy : da, n * sizeof(float));
            EXPECT_CLOSE(y, ref, n, 2e-6, "%s n=%zu", name, n);
        }
        rel(da), rel(db), rel(dy);
        free(a), free(b), free(y), free(ref);
    }
}

static void test_rows_transpose_argmax(void) {
    const int na = 5, nb = 7, c = 9, row = 13, n = 6;
    float src[5 * 7 * 9], out[5 * 7 * 9];
    double ref[5 * 7 * 9];
    fill(src, sizeof src / sizeof src[0], -1, 1);
    float *dsrc = devf(src, sizeof src / sizeof src[0]), *dout = devf(NULL, sizeof out / sizeof out[0]);
    be->ops->transpose(be, dsrc, na, nb, c, dout);
    back(out, dout, sizeof out);
    for (int a = 0; a < na; a++)
        for (int b = 0; b < nb; b++)
            for (int k = 0; k < c; k++) ref[((size_t)b * na + a) * c + k] = src[((size_t)a * nb + b) * c + k];
    EXPECT_CLOSE(out, ref, sizeof out / sizeof out[0], 0, "transpose");
    int32_t idx[6] = {4, 0, 4, 3, 1, 2};
    int32_t *didx = dev(idx, sizeof idx);
    be->ops->get_rows(be, dsrc, didx, n, row, dout);
    back(out, dout, (size_t)n * row * sizeof(float));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < row; k++) ref[(size_t)i * row + k] = src[(size_t)idx[i] * row + k];
    EXPECT_CLOSE(out, ref, (size_t)n * row, 0, "get_rows");
    /* argmax: ties go to the lowest index, -inf and huge values, long rows */
    const int V = 70001, R = 3;
    float *x = malloc((size_t)R * V * sizeof(float));
    fill(x, (size_t)R * V, -30, 30);
    x[0 * V + 123] = 50, x[0 * V + 60000] = 50;  /* tie: 123 */
    x[1 * V + V - 1] = 1e30f;                     /* last element */
    for (int i = 0; i < V; i++) x[2 * V + i] = -INFINITY;
    x[2 * V + 7] = -1e30f;
    int32_t want[3] = {123, V - 1, 7}, got[3] = {-1, -1, -1};
    float *dx = devf(x, (size_t)R * V);
    int32_t *dids = dev(NULL, sizeof got);
    be->ops->argmax(be, dx, R, V, dids);
    back(got, dids, sizeof got);
    CHECKF(got[0] == want[0] && got[1] == want[1] && got[2] == want[2], "%s: argmax gave %d %d %d", be_label, got[0],
           got[1], got[2]);
    rel(dsrc), rel(dout), rel(didx), rel(dx), rel(dids);
    free(x);
}

/* ------------------------------------------------------------- masked logits */
/* The drafter's masked embedder: top-k groups by score (ties -> lower index), products with their table rows,
 * min - 1 everywhere else; groups tie at the top_k boundary, and top_k = every group. */
static void test_masked_logits(void) {
    const int G = 12, per = 37, V = G * per, dim = 53, topks[] = {1, 5, 12};
    for (size_t di = 0; di < 3; di++)
        for (size_t ti = 0; ti < 3; ti++) {
            const int top_k = topks[ti];
            weight w;
            int64_t shape[2] = {V, dim};
            weight_make(&w, dtypes[di], 2, shape, 1.0f);
            float x[53], scores[12], *out = malloc((size_t)V * sizeof(float));
            double *ref = malloc((size_t)V * sizeof(double));
            int32_t ordering[12 * 37];
            fill(x, (size_t)dim, -1, 1);
            /* top_k - 1 groups score above 1, groups 3 and 9 tie at 0.25 (the boundary: 3 is taken), the rest below 0 */
            for (int g = 0, above = 0; g < G; g++)
                scores[g] = g == 3 || g == 9 ? 0.25f : above++ < top_k - 1 ? uniform(1, 3) : uniform(-3, 0);
            for (int i = 0; i < V; i++) ordering[i] = i;
            for (int i = V - 1; i > 0; i--) { /* a random permutation */
                int j = (int)(next_u32() % (uint32_t)(i + 1));
                int32_t t = ordering[i];
                ordering[i] = ordering[j], ordering[j] = t;
            }
            int taken[12] = {0};
            double mn = INFINITY;
            for (int v = 0; v < V; v++) ref[v] = NAN;
            for (int kk = 0; kk < top_k; kk++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!taken[g] && (best < 0 || scores[g] > scores[best])) best = g;
                taken[best] = 1;
                for (int i = 0; i < per; i++) {
                    int id = ordering[best * per + i];
                    double d = 0;
                    for (int k = 0; k < dim; k++) d += w.ref[(size_t)id * dim + k] * x[k];
                    ref[id] = d;
                    mn = d < mn ? d : mn;
                }
            }
            for (int v = 0; v < V; v++)
                if (isnan(ref[v])) ref[v] = mn - 1.0;
            float *dx = devf(x, (size_t)dim), *ds = devf(scores, (size_t)G), *dout = devf(NULL, (size_t)V);
            int32_t *dord = dev(ordering, sizeof ordering);
            be->ops->masked_logits(be, dx, ds, G, top_k, dord, &w.dev, dout);
            back(out, dout, (size_t)V * sizeof(float));
            EXPECT_CLOSE(out, ref, (size_t)V, 1e-5 * backend_tol(), "masked_logits %s top_k %d", g4_dtype_name(dtypes[di]),
                         top_k);
            rel(dx), rel(ds), rel(dout), rel(dord);
            weight_free(&w);
            free(out);
            free(ref);
        }
}

/* ------------------------------------------------------------- KV cache and attention */
static double kv_round(g4_kv_type t, float v) {
    return t == G4_KV_F32 ? v : t == G4_KV_BF16 ? g4_bf16_to_f32(g4_f32_to_bf16(v)) : g4_f16_to_f32(g4_f32_to_f16(v));
}
static const char *kv_name(g4_kv_type t) { return t == G4_KV_F32 ? "f32" : t == G4_KV_BF16 ? "bf16" : "f16"; }

/* A random paged cache: n_seq sequences of len[s] positions with scrambled physical blocks; K/V values as the
 * cache holds them (rounded to the KV type) are kept in kref/vref [s][p][row]. */
static void test_attention_case(g4_kv_type kt, int n_heads, int n_kv, int D, int B, int window, int with_kv_end) {
    enum { NSEQ = 3, MAXLEN = 80 };
    const int len[NSEQ] = {1, 37, 80}, row = n_kv * D;
    const int max_blocks = (MAXLEN + B - 1) / B, n_blocks = NSEQ * max_blocks + 3;
    int32_t table[NSEQ * MAXLEN];
    int32_t perm[300];
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(next_u32() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < NSEQ * max_blocks; i++) table[i] = -1;
    int used = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int b = 0; b * B < len[s]; b++)
            if (!window || (b + 1) * B > len[s] - window - B) table[s * max_blocks + b] = perm[used++]; /* slid-out: none */
    /* store every position's K/V through kv_store, in chunks, via slots */
    const size_t cache_elems = (size_t)n_blocks * B * row;
    void *dk = dev(NULL, cache_elems * g4_kv_type_size(kt)), *dv = dev(NULL, cache_elems * g4_kv_type_size(kt));
    double *kref = malloc((size_t)NSEQ * MAXLEN * row * sizeof(double));
    double *vref = malloc((size_t)NSEQ * MAXLEN * row * sizeof(double));
    float *kin = malloc((size_t)MAXLEN * row * sizeof(float)), *vin = malloc((size_t)MAXLEN * row * sizeof(float));
    int32_t slot[MAXLEN];
    for (int s = 0; s < NSEQ; s++) {
        int n = 0;
        for (int p = 0; p < len[s]; p++) {
            int32_t blk = table[s * max_blocks + p / B];
            if (blk < 0) continue;
            slot[n] = blk * B + p % B;
            for (int i = 0; i < row; i++) {
                float kv = uniform(-1, 1), vv = uniform(-1, 1);
                kin[(size_t)n * row + i] = kv, vin[(size_t)n * row + i] = vv;
                kref[((size_t)s * MAXLEN + p) * row + i] = kv_round(kt, kv);
                vref[((size_t)s * MAXLEN + p) * row + i] = kv_round(kt, vv);
            }
            n++;
        }
        float *dkin = devf(kin, (size_t)n * row), *dvin = devf(vin, (size_t)n * row);
        int32_t *dslot = dev(slot, (size_t)n * sizeof(int32_t));
        be->ops->kv_store(be, dkin, dvin, n, row, dslot, dk, dv, kt);
        rel(dkin), rel(dvin), rel(dslot);
    }
    /* queries: the last few positions of each sequence (a prefill chunk) and decode tokens */
    int32_t tseq[16], tpos[16], tend[16];
    int nt = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int p = len[s] - (s == 2 ? 5 : 1); p < len[s]; p++) {
            tseq[nt] = s, tpos[nt] = p;
            /* kv_end: some tokens see a few later positions (an image block), never past the sequence */
            tend[nt] = with_kv_end && p + 3 <= len[s] && (nt & 1) ? p + 3 : p + 1;
            nt++;
        }
    const size_t nq = (size_t)nt * n_heads * D;
    float *q = malloc(nq * sizeof(float)), *out = malloc(nq * sizeof(float));
    double *ref = malloc(nq * sizeof(double));
    fill(q, nq, -1, 1);
    const float scale = 0.37f;
    int max_keys = 0;
    for (int t = 0; t < nt; t++) {
        int p = tpos[t], lo = window ? (p - window + 1 > 0 ? p - window + 1 : 0) : 0, hi = tend[t];
        if (hi - lo > max_keys) max_keys = hi - lo;
        for (int h = 0; h < n_heads; h++) {
            const float *qv = q + ((size_t)t * n_heads + h) * D;
            int kh = h / (n_heads / n_kv);
            double sc[MAXLEN], mx = -DBL_MAX, sum = 0;
            for (int j = lo; j < hi; j++) {
                const double *kr = kref + ((size_t)tseq[t] * MAXLEN + j) * row + (size_t)kh * D;
                double d = 0;
                for (int i = 0; i < D; i++) d += qv[i] * kr[i];
                sc[j - lo] = d * scale;
                if (sc[j - lo] > mx) mx = sc[j - lo];
            }
            for (int j = lo; j < hi; j++) sum += (sc[j - lo] = exp(sc[j - lo] - mx));
            double *o = ref + ((size_t)t * n_heads + h) * D;
            for (int i = 0; i < D; i++) o[i] = 0;
            for (int j = lo; j < hi; j++) {
                const double *vr = vref + ((size_t)tseq[t] * MAXLEN + j) * row + (size_t)kh * D;
                for (int i = 0; i < D; i++) o[i] += sc[j - lo] / sum * vr[i];
            }
        }
    }
    float *dq = devf(q, nq), *dout = devf(NULL, nq);
    int32_t *dseq = dev(tseq, (size_t)nt * 4), *dpos = dev(tpos, (size_t)nt * 4), *dend = dev(tend, (size_t)nt * 4);
    int32_t *dtable = dev(table, (size_t)NSEQ * max_blocks * 4);
    g4_attention_args a = {
        .q = dq, .out = dout, .n_tokens = nt, .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = D,
        .seq = dseq, .pos = dpos, .kv_end = with_kv_end ? dend : NULL, .k = dk, .v = dv, .kv_type = kt,
        .block_table = dtable, .max_blocks = max_blocks, .block_size = B, .window = window, .max_keys = max_keys,
        .scale = scale,
    };
    be->ops->attention(be, &a);
    back(out, dout, nq * sizeof(float));
    EXPECT_CLOSE(out, ref, nq, 2e-5 * backend_tol(), "attention kv=%s heads=%d/%d D=%d block=%d window=%d kv_end=%d",
                 kv_name(kt), n_heads, n_kv, D, B, window, with_kv_end);
    rel(dk), rel(dv), rel(dq), rel(dout), rel(dseq), rel(dpos), rel(dend), rel(dtable);
    free(kref), free(vref), free(kin), free(vin), free(q), free(out), free(ref);
}

static void test_attention(void) {
    const g4_kv_type kts[] = {G4_KV_F32, G4_KV_BF16, G4_KV_F16};
    for (int k = 0; k < 3; k++) {
        test_attention_case(kts[k], 4, 1, 64, 16, 0, 0);
        test_attention_case(kts[k], 8, 2, 256, 32, 0, 0);
        test_attention_case(kts[k], 2, 2, 512, 4, 0, 0);
        test_attention_case(kts[k], 6, 3, 32, 7, 13, 0);  /* sliding window, odd block size */
        test_attention_case(kts[k], 4, 2, 128, 16, 20, 1); /* window with a kv_end that reaches ahead */
        test_attention_case(kts[k], 3, 1, 8, 1, 0, 1);
    }
}

/* ------------------------------------------------------------- mixture of experts */
/* One MoE block: the router in rt, gate and up in gt (one [E, 2Im, H] tensor, or two [E, Im, H] when split),
 * down in dt. The reference reads every product's input as the backend does (x_as_read); down's input (the
 * activations the backend computed in float) must then not be rounded to int8 blocks, so dt is never such a
 * type here. */
static void moe_case(int H, int Im, g4_dtype rt, g4_dtype gt, int split, g4_dtype dt) {
    const int n = 5, E = 6, TK = 2;
    weight router, gu, up, dn;
    make_any(&router, rt, 2, (int64_t[]){E, H}, 1.0f);
    make_any(&gu, gt, 3, (int64_t[]){E, (split ? 1 : 2) * (int64_t)Im, H}, 0.5f);
    if (split) make_any(&up, gt, 3, (int64_t[]){E, Im, H}, 0.5f);
    make_any(&dn, dt, 3, (int64_t[]){E, H, Im}, 0.5f);
    float *r = malloc((size_t)n * H * sizeof(float)), *x2 = malloc((size_t)n * H * sizeof(float));
    float *rscale = malloc((size_t)H * sizeof(float)), pes[6], *out = malloc((size_t)n * H * sizeof(float));
    fill(r, (size_t)n * H, -2, 2);
    fill(x2, (size_t)n * H, -1, 1);
    fill(rscale, (size_t)H, 0.5f, 1.5f);
    fill(pes, (size_t)E, 0.5f, 2.0f);
    const float eps = 1e-6f;
    double *ref = calloc((size_t)n * H, sizeof(double)), *z = malloc((size_t)H * sizeof(double));
    double *xg = malloc((size_t)n * H * sizeof(double)), *act = malloc((size_t)Im * sizeof(double));
    x_as_read(x2, n, H, &gu.host, xg);
    for (int t = 0; t < n; t++) {
        double lg[6], ms = 0;
        for (int i = 0; i < H; i++) ms += (double)r[t * H + i] * r[t * H + i];
        double inv = 1 / sqrt(ms / H + eps);
        for (int i = 0; i < H; i++) z[i] = r[t * H + i] * inv * rscale[i] / sqrt((double)H);
        double mx = -DBL_MAX, sum = 0;
        for (int e = 0; e < E; e++) {
            lg[e] = 0;
            for (int i = 0; i < H; i++) lg[e] += z[i] * router.ref[e * H + i];
            mx = lg[e] > mx ? lg[e] : mx;
        }
        for (int e = 0; e < E; e++) sum += (lg[e] = exp(lg[e] - mx));
        for (int e = 0; e < E; e++) lg[e] /= sum;
        int ids[2];
        double w[2], wsum = 0;
        for (int k = 0; k < TK; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if ((k == 0 || e != ids[0]) && (best < 0 || lg[e] > lg[best])) best = e;
            ids[k] = best, w[k] = lg[best], wsum += lg[best];
        }
        for (int k = 0; k < TK; k++) {
            int e = ids[k];
            double wk = w[k] / wsum * pes[e];
            for (int c = 0; c < Im; c++) {
                const double *grow = gu.ref + ((size_t)e * (split ? 1 : 2) * Im + c) * H;
                const double *urow = split ? up.ref + ((size_t)e * Im + c) * H : grow + (size_t)Im * H;
                double g = 0, u = 0;
                for (int i = 0; i < H; i++) {
                    g += xg[t * H + i] * grow[i];
                    u += xg[t * H + i] * urow[i];
                }
                act[c] = gelu_tanh_ref(g) * u;
            }
            for (int i = 0; i < H; i++) {
                double d = 0;
                for (int c = 0; c < Im; c++) d += act[c] * dn.ref[((size_t)e * H + i) * Im + c];
                ref[t * H + i] += wk * d;
            }
        }
    }
    float *dr = devf(r, (size_t)n * H), *dx2 = devf(x2, (size_t)n * H), *dout = devf(NULL, (size_t)n * H);
    float *drs = devf(rscale, (size_t)H), *dpes = devf(pes, (size_t)E);
    g4_moe_args a = {.residual = dr, .x2 = dx2, .out = dout, .n = n, .hidden = H, .n_experts = E, .top_k = TK,
                     .expert_dim = Im, .eps = eps, .router_proj = &router.dev, .router_scale = drs,
                     .per_expert_scale = dpes, .gate_up = &gu.dev, .up = split ? &up.dev : NULL, .down = &dn.dev};
    be->ops->moe(be, &a);
    back(out, dout, (size_t)n * H * sizeof(float));
    EXPECT_CLOSE(out, ref, (size_t)n * H, 2e-5 * backend_tol(), "moe router %s, gate/up %s%s, down %s", g4_dtype_name(rt),
                 g4_dtype_name(gt), split ? " (split)" : "", g4_dtype_name(dt));
    rel(dr), rel(dx2), rel(dout), rel(drs), rel(dpes);
    weight_free(&router), weight_free(&gu), weight_free(&dn);
    if (split) weight_free(&up);
    free(r), free(x2), free(rscale), free(out), free(ref), free(z), free(xg), free(act);
}

static void test_moe(void) {
    for (size_t di = 0; di < 3; di++) moe_case(24, 10, dtypes[di], dtypes[di], 0, dtypes[di]);
    moe_case(24, 10, G4_BF16, G4_BF16, 1, G4_F16);
    /* quantized experts (routers stay F32 in GGUF files: a rounded router could pick other experts) */
    moe_case(64, 32, G4_F32, G4_Q8_0, 0, G4_Q4_1);
    moe_case(64, 32, G4_F32, G4_Q4_0, 1, G4_MLX4);
    moe_case(64, 64, G4_MLX8, G4_MLX4, 1, G4_Q5_0);
    moe_case(256, 256, G4_F32, G4_Q4_K, 1, G4_Q6_K);
}

/* ------------------------------------------------------------- memory ops */
static void test_memory(void) {
    float a[100], b[100];
    double ref[60];
    fill(a, 100, -1, 1);
    float *d1 = devf(a, 100), *d2 = devf(NULL, 100);
    be->ops->copy(be, d2, d1 + 10, 60 * sizeof(float));
    back(b, d2, 60 * sizeof(float));
    for (int i = 0; i < 60; i++) ref[i] = a[10 + i];
    EXPECT_CLOSE(b, ref, 60, 0, "copy");
    rel(d1), rel(d2);
    g4_error err;
    CHECKF(be->ops->check(be, &err) == 0, "%s: check after the ops: %s", be_label, err.msg);
}

static void run_all(void) {
    test_memory();
    test_embed();
    test_matmul();
    test_matmul_set();
    test_norms();
    test_rope();
    test_elementwise();
    test_rows_transpose_argmax();
    test_masked_logits();
    test_attention();
    test_moe();
    g4_error err;
    CHECKF(be->ops->check(be, &err) == 0, "%s: check: %s", be_label, err.msg);
}

int main(void) {
    g4_error err;
    /* the CPU, with the instruction set this run was asked for */
    const char *want = getenv("G4_CPU_ISA");
    const char *isa = g4_cpu_kernels_get()->isa;
    if (want && *want && strcmp(want, isa)) {
        fprintf(stderr, "skipped: this CPU has no %s (it would run %s)\n", want, isa);
        return 77;
    }
    static char label[64];
    snprintf(label, sizeof label, "cpu/%s", isa);
    be_label = label;
    /* 2 threads, or G4_TEST_THREADS (scripts/test-aarch64 runs one thread under qemu-user) */
    be = g4_backend_new("cpu", getenv("G4_TEST_THREADS") ? atoi(getenv("G4_TEST_THREADS")) : 2, &err);
    CHECKF(be != NULL, "cpu backend: %s", err.msg);
    if (be) {
        run_all();
        g4_backend_free(be);
    }
#ifdef G4_WITH_CUDA
    if (g4_cuda_available() && (!want || !strcmp(want, "avx512") || !strcmp(want, isa))) {
        be_label = "cuda";
        be = g4_backend_new("cuda", 0, &err);
        CHECKF(be != NULL, "cuda backend: %s", err.msg);
        if (be) {
            run_all();
            g4_backend_free(be);
        }
    } else {
        fprintf(stderr, "cuda: no GPU here, not run\n");
    }
#endif
    fprintf(stderr, "backends tested: %s%s\n", label,
#ifdef G4_WITH_CUDA
            g4_cuda_available() ? ", cuda" : ""
#else
            ""
#endif
    );
    return g4t_done();
}
