/* Every op of the backend table (src/backend/backend.h) on every backend this build and machine have, against
 * a plain double-precision reference written here, over odd shapes (ggml's test-backend-ops is the model).
 *
 * Backends: the CPU with the instruction set G4_CPU_ISA names (ctest runs this program once with the best set
 * the CPU has, avx512 or neon_dot, and once per lower set: scalar, avx2, neon; one the machine lacks is
 * skipped), and CUDA when built in and a GPU is present.
 * Inputs are random (fixed seeds), uploaded to the backend, the op runs, the result comes back and is compared
 * with the reference: max |got - ref| <= tol * max(1, max |ref|). Tolerances: 1e-5 relative for f32 arithmetic
 * on the host; a backend that computes products in lower precision (bf16 tensor cores) states its own factor in
 * backend_tol(). Every case prints nothing when it passes; failures name the op, the backend and the shape.
 *
 * Quantized weights (GGUF blocks, MLX affine; core/quant.h): random values encoded by the reference encoders of
 * core/quant.c (random block bytes with sane scales for the types it does not write), and the reference reads
 * them through the reference decoder (checked against hand-computed values in test_quant.c). Where a backend
 * multiplies with activations rounded to int8 blocks (the CPU for Q8_0/Q4_0 and, with the AVX-512, AVX2 and NEON
 * sets, the K-quants, Q5_0 and IQ4, as llama.cpp does: g4_cpu_q8_supported; CUDA's GEMV for Q8_0/Q4_0/MLX4/MLX8 in dense products of up to 8 tokens, cuda_gemv.cu), the
 * reference rounds x by the same rule (d = max|x|/127 per 32, q = rint(x/d)), so
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

/* The scale fields of block b of a type without an encoder (random codes) set so that its values stay near [-a, a]:
 * an f16 d (and Q4_1 / Q5_1's m) over the largest multiple of d the type's codes reach (core/quant_codebook.c for
 * the codebook, ternary and FP4 types). */
static void sane_scales(g4_dtype t, unsigned char *b, float a) {
    const float u = uniform(0.2f, 1.0f);
    const float reach = t == G4_IQ2_XXS || t == G4_IQ2_XS || t == G4_IQ2_S ? 167.0f
                        : t == G4_IQ3_XXS || t == G4_IQ3_S             ? 481.0f
                        : t == G4_IQ1_S || t == G4_IQ1_M               ? 17.0f
                        : t == G4_TQ1_0 || t == G4_TQ2_0               ? 2.0f
                                                                       : 16.0f;
    const uint16_t d = g4_f32_to_f16(u * a / reach), m = g4_f32_to_f16(uniform(-a, 0));
    switch (t) {
    case G4_TQ1_0: memcpy(b + 52, &d, 2); break;
    case G4_TQ2_0: memcpy(b + 64, &d, 2); break;
    case G4_IQ1_M: /* d in the top nibbles of the four scale words */
        for (int k = 0; k < 4; k++) b[49 + 2 * k] = (unsigned char)((b[49 + 2 * k] & 15) | (d >> 4 * k & 15) << 4);
        break;
    case G4_MXFP4: b[0] = (unsigned char)(128 + (int)floorf(log2f(a / 12.0f)) - (int)(next_u32() % 3)); break;
    case G4_NVFP4: /* UE4M3 scales (halved) in [2^-4, 2^-3) a */
        for (int k = 0; k < 4; k++) b[k] = (unsigned char)((4 + (int)floorf(log2f(a))) << 3 | (int)(next_u32() & 7));
        break;
    default:
        memcpy(b, &d, 2);
        if (t == G4_Q4_1 || t == G4_Q5_1) memcpy(b + 2, &m, 2);
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
            /* no encoder: random codes, f16 d (and m) of a sane size */
            for (size_t i = 0; i < row_bytes; i++) row[i] = (unsigned char)next_u32();
            for (size_t k = 0; k < row_bytes / bs; k++) sane_scales(t, row + k * bs, a);
        }
        w->host.data = b;
        w->host.nbytes = (size_t)rows * row_bytes;
    }
    w->ref = malloc((size_t)rows * (size_t)cols * sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        g4_dequant_row(&w->host, r, v);
        for (int64_t c = 0; c < cols; c++) w->ref[(size_t)r * (size_t)cols + (size_t)c] = v[c];
    }
    weight_upload(w);
    if (!g4_transcode_exact(w->host.dtype, w->dev.dtype)) { /* held as another type whose values differ
                                                             * (upload_weight): the reference reads those values,
                                                             * test_transcoded_weights checks them against the
                                                             * file's */
        unsigned char *row = malloc(g4_dtype_row_bytes(w->dev.dtype, cols));
        float *tmp = malloc((size_t)cols * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            CHECK(g4_transcode_row(&w->host, r, w->dev.dtype, row, tmp) > 0);
            g4_dequant(w->dev.dtype, row, v, cols);
            for (int64_t c = 0; c < cols; c++) w->ref[(size_t)r * (size_t)cols + (size_t)c] = v[c];
        }
        free(row), free(tmp);
    }
    free(v);
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

/* The weights of a set placed again, together (upload_weights: one block, so that the backend may multiply the ones
 * that follow each other as one product), where the backend can. */
static void weights_place_together(weight *w, int count) {
    if (!be->ops->upload_weights || count < 2) return;
    const g4_tensor *src[G4_MATMUL_SET_MAX];
    g4_tensor *dst[G4_MATMUL_SET_MAX];
    for (int i = 0; i < count; i++) {
        if (w[i].dev.data != w[i].host.data) be->ops->release_weight(be, &w[i].dev);
        src[i] = &w[i].host;
        dst[i] = &w[i].dev;
    }
    g4_error err;
    if (be->ops->upload_weights(be, src, dst, count, &err)) {
        CHECKF(0, "%s: upload_weights: %s", be_label, err.msg);
        for (int i = 0; i < count; i++) weight_upload(&w[i]);
    }
}

static const g4_dtype dtypes[] = {G4_F32, G4_BF16, G4_F16};
/* Whether the backend takes quantized weights (any type); a type a backend does not read must be refused at
 * upload_weight with a one-line error (then its cases are skipped on that backend). */
static int takes_quantized;
static signed char qtaken[G4_DTYPE_COUNT]; /* 0 not probed, 1 taken, -1 refused */
static g4_dtype qheld[G4_DTYPE_COUNT];     /* a taken type: the type the backend holds it as (upload_weight) */
static g4_dtype held(g4_dtype t) { return t > 0 && t < G4_DTYPE_COUNT && qheld[t] ? qheld[t] : t; }
static int takes(g4_dtype t) {
    if (!g4_dtype_is_quantized(t)) return 1;
    if (!qtaken[t]) {
        static uint8_t zeros[4096];
        g4_tensor host = {.name = "probe", .dtype = t, .ndim = 2, .shape = {1, 256}, .data = zeros, .nbytes = 256},
                  dv;
        if (g4_dtype_is_mlx(t))
            host.scales = host.biases = zeros, host.scale_dtype = G4_BF16, host.group = 64;
        g4_error err = {0};
        qtaken[t] = be->ops->upload_weight(be, &host, &dv, &err) == 0 ? 1 : -1;
        if (qtaken[t] > 0) {
            qheld[t] = dv.dtype;
            be->ops->release_weight(be, &dv);
        } else {
            CHECKF(err.msg[0] && !strchr(err.msg, '\n'), "%s: refusing %s without a one-line error", be_label,
                   g4_dtype_name(t));
            fprintf(stderr, "%s: %s refused (%s): its cases are skipped\n", be_label, g4_dtype_name(t), err.msg);
        }
    }
    return qtaken[t] > 0;
}

static const g4_dtype qtypes[] = {G4_Q8_0, G4_Q4_0, G4_Q4_1, G4_Q5_0, G4_Q5_1, G4_Q4_K, G4_Q5_K, G4_Q6_K,
                                  G4_Q2_K, G4_Q3_K, G4_IQ4_NL, G4_IQ4_XS, G4_MLX2, G4_MLX3, G4_MLX4, G4_MLX5,
                                  G4_MLX6, G4_MLX8};
#define N_QTYPES (sizeof qtypes / sizeof qtypes[0])

/* Whether CUDA's product of n tokens with w reads int8 blocks of x (dense: a matmul / matmul_set product, not
 * an expert's): its GEMV for every type it holds (Q8_0, Q4_0, Q5_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, CB4,
 * CB4_16, MXF4, MLX4, MLX8: at most 8 tokens; experts: one token), and the int8 tensor-core products for Q8_0,
 * Q4_0, Q5_0, Q4_K, Q5_K, IQ4_NL, IQ4_XS, CB4 and MXF4 (experts of more than 8 tokens; dense products of up to
 * G4_CUDA_MMQ_DENSE tokens, default 24 and at most 32, as the backend reads it, but IQ4_XS and CB4). */
static int cuda_reads_int8(const g4_tensor *w, int n, int dense) {
    const int64_t in = w->shape[w->ndim - 1];
    const g4_dtype dt = held(w->dtype); /* (a type held as another is read as that) */
    const int q = dt == G4_Q8_0 || dt == G4_Q4_0, gemv = q || dt == G4_Q5_0 || dt == G4_Q4_K || dt == G4_Q5_K ||
                                                    dt == G4_Q6_K || dt == G4_IQ4_NL || dt == G4_IQ4_XS ||
                                                    dt == G4_CB4 || dt == G4_CB4_16 || dt == G4_MXF4 ||
                                                    dt == G4_MLX4 || dt == G4_MLX8 || dt == G4_Q2_K;
    const int dense_mmq = q || dt == G4_Q5_0 || dt == G4_Q4_K || dt == G4_Q5_K || dt == G4_IQ4_NL || dt == G4_MXF4;
    const int mmq = dense_mmq || dt == G4_IQ4_XS || dt == G4_CB4;
    const int dense_max = getenv("G4_CUDA_MMQ_DENSE") ? atoi(getenv("G4_CUDA_MMQ_DENSE")) : 24;
    return !strcmp(be->ops->name, "cuda") && in % 32 == 0 && !getenv("G4_NO_INT8_ACT") &&
           (((dense ? n <= 8 : n == 1) && gemv) || (!dense && n > 8 && mmq) ||
            (dense && n > 8 && dense_mmq && n <= dense_max && n <= 32));
}
/* Tolerance factor of a product with given inputs: 1 where CUDA reads them as int8 blocks (integer products
 * of exactly the codes the reference rounds to, then f32 sums); 4 for its products of 16-bit and f32 weights with up
 * to 8 tokens (f32 arithmetic on the GEMV, or bf16 weights on tensor cores with the inputs as bf16 hi + lo parts:
 * their sums' rounding; inputs rounded to bf16 once would be about 100 times off); else backend_tol(). */
static double product_tol(const g4_tensor *w, int n) {
    if (cuda_reads_int8(w, n, 1)) return 1.0;
    const g4_dtype dt = held(w->dtype);
    if (!strcmp(be->ops->name, "cuda") && n <= 8 && (dt == G4_F32 || dt == G4_BF16 || dt == G4_F16)) return 4.0;
    return backend_tol();
}

static int be_bf16_act; /* be was made with bf16_act (g4_load_params.bf16_activations) */

/* x[n, in] as the backend's product with w reads it (dense: see cuda_reads_int8): rounded to int8 blocks where
 * the CPU does so, and where CUDA's GEMV does; rounded to bf16 (nearest even) for BF16 weights on a CPU backend
 * made with bf16_act, and for quantized weights that CUDA decodes to bf16 tiles for a tensor-core product of more
 * than 8 tokens (cuda_blas.cu: their activations are rounded to bf16 once). */
static int reads_int8(const g4_tensor *w, int n, int dense) {
    g4_tensor h = *w;
    h.dtype = held(w->dtype); /* (the CPU holds MLX weights as AF4 / AF8) */
    return (!strcmp(be->ops->name, "cpu") && g4_cpu_q8_supported(&h)) || cuda_reads_int8(w, n, dense);
}
static void x_as_read(const float *x, int n, int in, const g4_tensor *w, int dense, double *xr) {
    const int rounds = reads_int8(w, n, dense);
    const int bf16_tiles = !strcmp(be->ops->name, "cuda") && n > 8 && g4_dtype_is_quantized(w->dtype) && !rounds;
    if ((be_bf16_act && w->dtype == G4_BF16) || bf16_tiles) {
        for (size_t i = 0; i < (size_t)n * (size_t)in; i++) xr[i] = g4_bf16_to_f32(g4_f32_to_bf16(x[i]));
        return;
    }
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

static double gelu_tanh_ref(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/* ------------------------------------------------------------- matmul */
static void ref_matmul(const float *x, int n, const weight *w, const float *bias, double *y) {
    int out = (int)w->host.shape[0], in = (int)w->host.shape[1];
    double *xr = malloc((size_t)n * in * sizeof(double));
    x_as_read(x, n, in, &w->host, 1, xr);
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
    EXPECT_CLOSE(y, ref, (size_t)n * out, 1e-5 * sqrt(in) * product_tol(&w->host, n), "matmul %s n=%d in=%d out=%d bias=%d",
                 g4_dtype_name(w->host.dtype), n, in, out, with_bias);
    if (be->ops->host_memory && n > 1) {
        /* the CPU's rows do not depend on the batch: each row alone gives the same bits (the scheduler's batched
         * greedy outputs equal single requests' because of it) */
        int same = 1;
        float *row = malloc((size_t)out * sizeof(float));
        for (int t = 0; t < n; t++) {
            be->ops->matmul(be, dx + (size_t)t * in, 1, &w->dev, with_bias ? db : NULL, dy);
            back(row, dy, (size_t)out * sizeof(float));
            same &= memcmp(row, y + (size_t)t * out, (size_t)out * sizeof(float)) == 0;
        }
        free(row);
        CHECKF(same, "%s: matmul %s n=%d in=%d out=%d: a row alone differs from the same row in the batch", be_label,
               g4_dtype_name(w->host.dtype), n, in, out);
    }
    rel(dx), rel(db), rel(dy);
    free(x), free(bias), free(ref), free(y);
}

/* Every dtype: decode (1 token), the small-batch tiles and prefill (17 tokens), rows that are not a multiple of
 * the kernels' row tiles, rows of one and several blocks. */
static void test_matmul(void) {
    const int ns[] = {1, 2, 5, 17}, outs[] = {1, 13, 130};
    for (size_t di = 0; di < (takes_quantized ? 3 + N_QTYPES : 3); di++) {
        const g4_dtype t = di < 3 ? dtypes[di] : qtypes[di - 3];
        if (!takes(t)) continue;
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
        if (di >= 3) { /* many short rows (CUDA: quantized weights, a warp's lanes split over several rows); 23
                        * tokens (CUDA's int8 tensor-core products: four tiles of tokens, one partial, one empty) */
            weight w;
            make_any(&w, t, 2, (int64_t[]){4500, 2 * bk}, 1.0f);
            check_product(&w, 5, 1);
            check_product(&w, 23, 0);
            weight_free(&w);
        }
        if (di < 3) /* rows of 2048 for 3 and 8 tokens (CUDA, bf16 on tensor cores: a tile's steps shared by 8 warps,
                     * two rounds of loads each) */
            for (int n = 3; n <= 8; n += 5) {
                weight w;
                make_any(&w, t, 2, (int64_t[]){70, 2048}, 1.0f);
                check_product(&w, n, n == 3);
                weight_free(&w);
            }
        if (t != G4_F32) /* long rows: inputs staged in several tiles (CUDA: one token's float tile holds 24576) */
            for (int n = 1; n <= 3; n += 2) {
                weight w;
                make_any(&w, t, 2, (int64_t[]){5, 112 * 256}, 1.0f);
                check_product(&w, n, n == 3);
                weight_free(&w);
            }
    }
}

/* Weights of a type the backend holds as another (upload_weight: CUDA holds every type it has no kernels for as
 * Q8_0, core/quant.h g4_transcode_row): per type, products of 1, 5 and 13 tokens
 * - against the reference on the file's own decoded values: exactly as any product where the values are kept
 *   (g4_transcode_exact: Q5_0), else within that error plus the re-encoding's, sum |x| * d / 2 per output (d: the
 *   held Q8_0 block's scale);
 * - bit for bit equal to the same product with the held values uploaded as that type (a Q5_0 file's values as a
 *   Q8_0 weight): the backend's re-encoding is g4_transcode_row's. */
/* The types read but not written (no encoder: random codes, sane scales), beside qtypes */
static const g4_dtype read_only_qtypes[] = {G4_IQ2_XXS, G4_IQ2_XS, G4_IQ2_S, G4_IQ3_XXS, G4_IQ3_S, G4_IQ1_S,
                                            G4_IQ1_M, G4_TQ1_0, G4_TQ2_0, G4_MXFP4, G4_NVFP4};
#define N_RO_QTYPES (sizeof read_only_qtypes / sizeof read_only_qtypes[0])
static void test_transcoded_weights(void) {
    int any = 0;
    for (size_t qi = 0; takes_quantized && qi < N_QTYPES + N_RO_QTYPES; qi++) {
        const g4_dtype t = qi < N_QTYPES ? qtypes[qi] : read_only_qtypes[qi - N_QTYPES];
        if (!takes(t)) continue;
        if (held(t) == t) { /* (a read-only type held as it is: the products of test_matmul's shapes, briefly) */
            for (int n = 1; qi >= N_QTYPES && n <= 17; n += 4) {
                weight w;
                make_any(&w, t, 2, (int64_t[]){13, 512}, 1.0f);
                check_product(&w, n, n & 1);
                weight_free(&w);
            }
            continue;
        }
        any = 1;
        const g4_dtype h = held(t);
        const int out = 40, in = 512;
        weight w, hw;
        make_any(&w, t, 2, (int64_t[]){out, in}, 1.0f);
        CHECKF(w.dev.dtype == h, "%s: %s held as %s, not %s", be_label, g4_dtype_name(t), g4_dtype_name(w.dev.dtype),
               g4_dtype_name(h));
        /* the held values as a weight of that type (a GGUF type held as MLX: g4_transcode_row_mlx's codes, groups of
         * 32 and f32 scales and biases) */
        const int as_mlx = g4_dtype_is_mlx(h) && !g4_dtype_is_mlx(t);
        const size_t hrb = as_mlx ? (size_t)in * (size_t)g4_mlx_bits(h) / 8 : g4_dtype_row_bytes(h, in);
        memset(&hw, 0, sizeof hw);
        hw.data = malloc((size_t)out * hrb);
        float *tmp = malloc((size_t)in * sizeof(float)), *src = malloc((size_t)out * in * sizeof(float));
        double *half_d = malloc((size_t)out * in * sizeof(double)); /* half the held block's step per weight */
        if (as_mlx) hw.scales = malloc((size_t)out * (in / 32) * sizeof(float)), hw.biases = malloc((size_t)out * (in / 32) * sizeof(float));
        for (int r = 0; r < out; r++) {
            unsigned char *row = (unsigned char *)hw.data + (size_t)r * hrb;
            if (as_mlx)
                CHECK(g4_transcode_row_mlx(&w.host, r, h, row, (float *)hw.scales + (size_t)r * (in / 32),
                                           (float *)hw.biases + (size_t)r * (in / 32)) == hrb);
            else
                CHECK(g4_transcode_row(&w.host, r, h, row, tmp) == hrb);
            g4_dequant_row(&w.host, r, src + (size_t)r * in);
            for (int i = 0; i < in; i++)
                half_d[(size_t)r * in + i] = h == G4_Q8_0 ? 0.5 * g4_f16_at(row + 34 * (i / 32)) : 0.0;
        }
        hw.host = (g4_tensor){.name = "held", .dtype = h, .ndim = 2, .shape = {out, in}, .data = hw.data,
                              .nbytes = (size_t)out * hrb};
        if (as_mlx)
            hw.host.scales = hw.scales, hw.host.biases = hw.biases, hw.host.scale_dtype = G4_F32, hw.host.group = 32;
        else if (g4_dtype_is_mlx(h)) /* (MLX held as MLX of more bits: the codes widened, the same scales and biases) */
            hw.host.scales = w.host.scales, hw.host.biases = w.host.biases, hw.host.scale_dtype = w.host.scale_dtype,
            hw.host.group = w.host.group;
        weight_upload(&hw);
        CHECK(hw.dev.dtype == h);
        const int exact = g4_transcode_exact(t, h);
        for (int ni = 0; ni < 3; ni++) {
            const int n = (int[]){1, 5, 13}[ni];
            float *x = malloc((size_t)n * in * sizeof(float)), *y = malloc((size_t)n * out * sizeof(float)),
                  *yh = malloc((size_t)n * out * sizeof(float));
            double *xr = malloc((size_t)n * in * sizeof(double)), *ref = malloc((size_t)n * out * sizeof(double));
            fill(x, (size_t)n * in, -1, 1);
            x_as_read(x, n, in, &w.host, 1, xr);
            float *dx = devf(x, (size_t)n * in), *dy = devf(NULL, (size_t)n * out);
            be->ops->matmul(be, dx, n, &w.dev, NULL, dy);
            back(y, dy, (size_t)n * out * sizeof(float));
            be->ops->matmul(be, dx, n, &hw.dev, NULL, dy);
            back(yh, dy, (size_t)n * out * sizeof(float));
            CHECKF(!memcmp(y, yh, (size_t)n * out * sizeof(float)),
                   "%s: %s weights (held as %s), %d tokens: not the product of the same values as %s", be_label,
                   g4_dtype_name(t), g4_dtype_name(h), n, g4_dtype_name(h));
            double worst = 0, m = 1; /* error beyond the bound, relative as rel_err */
            for (int k = 0; k < n; k++)
                for (int r = 0; r < out; r++) {
                    double s = 0, b = 0;
                    for (int i = 0; i < in; i++) {
                        s += xr[(size_t)k * in + i] * src[(size_t)r * in + i];
                        b += fabs(xr[(size_t)k * in + i]) * half_d[(size_t)r * in + i];
                    }
                    ref[(size_t)k * out + r] = s;
                    m = fabs(s) > m ? fabs(s) : m;
                    double e = fabs((double)y[(size_t)k * out + r] - s) - (exact ? 0 : b);
                    worst = e > worst || e != e ? e : worst;
                }
            const double tol = 1e-5 * sqrt(in) * product_tol(&w.host, n);
            CHECKF(worst / m <= tol, "%s: %s weights (held as %s%s), %d tokens: error %.3g beyond the re-encoding's > %.3g",
                   be_label, g4_dtype_name(t), g4_dtype_name(h), exact ? ", exactly" : "", n, worst / m, tol);
            if (exact) EXPECT_CLOSE(y, ref, (size_t)n * out, tol, "%s as %s, %d tokens", g4_dtype_name(t), g4_dtype_name(h), n);
            rel(dx), rel(dy);
            free(x), free(y), free(yh), free(xr), free(ref);
        }
        free(tmp), free(src), free(half_d);
        weight_free(&hw);
        weight_free(&w);
    }
    /* the CPU: the types its int8 kernels read are held as they are (Q2_K: the per-16 mode, not re-encoded) */
    if (!strcmp(be->ops->name, "cpu") && g4_cpu_kernels_get()->q8_k_quants && !getenv("G4_NO_INT8_ACT"))
        CHECKF(takes(G4_Q2_K) && takes(G4_Q3_K) && takes(G4_Q4_K) && takes(G4_Q4_1) && takes(G4_IQ2_XS) &&
                   takes(G4_IQ2_XXS) && takes(G4_MXFP4) && takes(G4_IQ1_M) && held(G4_Q2_K) == G4_Q2_K &&
                   held(G4_Q3_K) == G4_Q3_K && held(G4_Q4_K) == G4_Q4_K && held(G4_Q4_1) == G4_AF4 &&
                   held(G4_IQ2_XS) == G4_CB4_16 && held(G4_IQ2_XXS) == G4_CB4 && held(G4_MXFP4) == G4_MXF4 &&
                   held(G4_IQ1_M) == G4_CB4_16,
               "%s: Q2_K, Q3_K, Q4_K held as they are, Q4_1 as AF4, IQ2_XXS as CB4, MXFP4 as MXF4, IQ2_XS and IQ1_M "
               "as CB4_16 (Q2_K as %s, IQ2_XXS as %s, IQ2_XS as %s)", be_label, g4_dtype_name(held(G4_Q2_K)),
               g4_dtype_name(held(G4_IQ2_XXS)), g4_dtype_name(held(G4_IQ2_XS)));
    /* an IQ1_S weight with a block whose d / 8 is no f16 (neither CB4 nor Q6_K can hold it) is held as the next
     * exact layout, the CPU's AF8, CUDA's MLX8 (CB4 refused at upload, then again), alone and in a set beside an
     * IQ2_XXS weight CB4 holds */
    if (takes(G4_IQ1_S) && takes(G4_IQ2_XXS) && held(G4_IQ1_S) == G4_CB4) {
        const g4_dtype next = !strcmp(be->ops->name, "cpu") ? G4_AF8 : G4_MLX8;
        weight w[2];
        make_any(&w[0], G4_IQ1_S, 2, (int64_t[]){13, 512}, 1.0f);
        make_any(&w[1], G4_IQ2_XXS, 2, (int64_t[]){13, 512}, 1.0f);
        be->ops->release_weight(be, &w[0].dev);
        const uint16_t tiny = 0x0001; /* 2^-24: an eighth of it is no f16 */
        memcpy((unsigned char *)w[0].host.data + 50, &tiny, 2); /* row 0, block 1 */
        float v[512];
        g4_dequant_row(&w[0].host, 0, v);
        for (int c = 0; c < 512; c++) w[0].ref[c] = v[c];
        weight_upload(&w[0]);
        CHECKF(w[0].dev.dtype == next, "%s: IQ1_S with a d CB4 and Q6_K cannot hold: held as %s, not %s", be_label,
               g4_dtype_name(w[0].dev.dtype), g4_dtype_name(next));
        check_product(&w[0], 3, 0);
        weights_place_together(w, 2);
        CHECKF(w[0].dev.dtype == next && w[1].dev.dtype == G4_CB4, "%s: a set of IQ1_S and IQ2_XXS held as %s, %s",
               be_label, g4_dtype_name(w[0].dev.dtype), g4_dtype_name(w[1].dev.dtype));
        for (int i = 0; i < 2; i++) check_product(&w[i], 3, 0);
        weight_free(&w[0]), weight_free(&w[1]);
    }
    /* an NVFP4 weight with a block whose run scales no CB4_16 holds (64 beside about 2^-4: no int8 multiples of one
     * d) is re-encoded as Q8_0, on every backend: its products are those of the Q8_0 rows g4_transcode_row makes */
    if (takes(G4_NVFP4) && held(G4_NVFP4) == G4_CB4_16) {
        enum { OUT = 13, IN = 512 };
        weight w, q;
        make_any(&w, G4_NVFP4, 2, (int64_t[]){OUT, IN}, 1.0f);
        be->ops->release_weight(be, &w.dev);
        ((unsigned char *)w.host.data)[0] = 0x70; /* row 0, block 0, run 0: 2^7 halved (the others about 2^-4) */
        weight_upload(&w);
        CHECKF(w.dev.dtype == G4_Q8_0, "%s: NVFP4 with scales CB4_16 cannot hold: held as %s, not Q8_0", be_label,
               g4_dtype_name(w.dev.dtype));
        memset(&q, 0, sizeof q);
        const size_t rb = g4_dtype_row_bytes(G4_Q8_0, IN);
        q.data = malloc(OUT * rb);
        float tmp[IN];
        for (int r = 0; r < OUT; r++) CHECK(g4_transcode_row(&w.host, r, G4_Q8_0, (unsigned char *)q.data + r * rb, tmp) == rb);
        q.host = (g4_tensor){.name = "q8", .dtype = G4_Q8_0, .ndim = 2, .shape = {OUT, IN}, .data = q.data,
                             .nbytes = OUT * rb};
        weight_upload(&q);
        for (int n = 1; n <= 5; n += 4) {
            float x[5 * IN], y[5 * OUT], yq[5 * OUT];
            fill(x, (size_t)n * IN, -1, 1);
            float *dx = devf(x, (size_t)n * IN), *dy = devf(NULL, (size_t)n * OUT);
            be->ops->matmul(be, dx, n, &w.dev, NULL, dy);
            back(y, dy, (size_t)n * OUT * sizeof(float));
            be->ops->matmul(be, dx, n, &q.dev, NULL, dy);
            back(yq, dy, (size_t)n * OUT * sizeof(float));
            CHECKF(!memcmp(y, yq, (size_t)n * OUT * sizeof(float)), "%s: NVFP4 held as Q8_0, %d tokens: not the Q8_0 "
                   "rows' product", be_label, n);
            rel(dx), rel(dy);
        }
        weight_free(&q);
        weight_free(&w);
    }
    /* Q5_0 and IQ4_NL are held exactly where they are held as another type */
    if (any && takes(G4_Q5_0) && held(G4_Q5_0) != G4_Q5_0) CHECK(g4_transcode_exact(G4_Q5_0, held(G4_Q5_0)));
    if (any && takes(G4_IQ4_NL) && held(G4_IQ4_NL) != G4_IQ4_NL) CHECK(g4_transcode_exact(G4_IQ4_NL, held(G4_IQ4_NL)));
    if (!strcmp(be->ops->name, "cuda"))
        CHECKF(any && held(G4_Q5_0) == G4_Q5_0 && held(G4_Q5_K) == G4_Q5_K && held(G4_IQ4_NL) == G4_IQ4_NL &&
                   held(G4_IQ4_XS) == G4_IQ4_XS && held(G4_Q4_1) == G4_MLX4 && held(G4_Q5_1) == G4_MLX8 &&
                   held(G4_IQ2_XXS) == G4_CB4 && held(G4_MXFP4) == G4_MXF4 && held(G4_IQ2_XS) == G4_CB4_16 &&
                   held(G4_IQ1_M) == G4_CB4_16 && held(G4_Q3_K) == G4_Q6_K && held(G4_Q2_K) == G4_Q2_K &&
                   held(G4_MLX3) == G4_MLX4 && held(G4_MLX6) == G4_MLX8,
               "%s: Q5_0, Q5_K, IQ4_NL, IQ4_XS and Q2_K held as they are, Q4_1 as MLX4, Q5_1 as MLX8, IQ2_XXS as "
               "CB4, MXFP4 as MXF4, IQ2_XS and IQ1_M as CB4_16, Q3_K as Q6_K, MLX3 as MLX4, MLX6 as MLX8", be_label);
    /* MLX weights are held exactly wherever they are held as another type (the CPU: AF4 / AF8) */
    for (size_t qi = 0; takes_quantized && qi < N_QTYPES; qi++)
        if (g4_dtype_is_mlx(qtypes[qi]) && takes(qtypes[qi]))
            CHECKF(g4_transcode_exact(qtypes[qi], held(qtypes[qi])), "%s: %s held as %s, not exactly", be_label,
                   g4_dtype_name(qtypes[qi]), g4_dtype_name(held(qtypes[qi])));
}

/* bf16 activations (a CPU backend made with bf16_act): products with BF16 weights take x rounded to bf16 once;
 * x_as_read rounds the reference's x the same way, and a product of two bf16 values is exact in f32, so the
 * only error left is f32 summation: the f32 tolerance holds (AVX512_BF16: vdpbf16ps; other sets: the rounded
 * x through the f32 kernels). Rows alone equal rows in a batch (check_product). The mode must be in effect:
 * against unrounded x the error is far larger. */
static void test_matmul_bf16_act(void) {
    const int ns[] = {1, 2, 5, 17}, outs[] = {1, 13, 130}, ins[] = {7, 64, 259, 1552};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 4; b++)
            for (size_t c = 0; c < 3; c++) {
                weight w;
                make_any(&w, G4_BF16, 2, (int64_t[]){outs[c], ins[b]}, 1.0f);
                check_product(&w, ns[a], (int)((a + b + c) & 1));
                weight_free(&w);
            }
    weight w;
    const int n = 5, out = 13, in = 1552;
    make_any(&w, G4_BF16, 2, (int64_t[]){out, in}, 1.0f);
    float *x = malloc((size_t)n * in * sizeof(float)), *y = malloc((size_t)n * out * sizeof(float));
    double *ref = malloc((size_t)n * out * sizeof(double));
    fill(x, (size_t)n * in, -1, 1);
    be_bf16_act = 0; /* the reference on x as given */
    ref_matmul(x, n, &w, NULL, ref);
    be_bf16_act = 1;
    float *dx = devf(x, (size_t)n * in), *dy = devf(NULL, (size_t)n * out);
    be->ops->matmul(be, dx, n, &w.dev, NULL, dy);
    back(y, dy, (size_t)n * out * sizeof(float));
    double e = rel_err(y, ref, (size_t)n * out);
    CHECKF(e > 1e-4, "%s: bf16 activations: error %.3g against unrounded x: x was not rounded?", be_label, e);
    rel(dx), rel(dy);
    free(x), free(y), free(ref);
    weight_free(&w);
}

static void test_matmul_set(void) {
    for (int quantized = 0; quantized < 1 + takes_quantized; quantized++)
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
                EXPECT_CLOSE(y, ref, (size_t)n * outs[i], 1e-5 * sqrt(in) * product_tol(&w[i].host, n),
                             "matmul_set count=%d n=%d product %d (%s)", count, n, i, g4_dtype_name(w[i].host.dtype));
                free(ref), free(y);
                rel(set.y[i]);
                weight_free(&w[i]);
            }
            rel(dx), rel(db);
            free(x), free(bias);
        }
}

static void ref_rms_row(const float *x, const float *w, int dim, float eps, double *y) {
    double ms = 0;
    for (int i = 0; i < dim; i++) ms += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ms / dim + eps);
    for (int i = 0; i < dim; i++) y[i] = x[i] * inv * (w ? w[i] : 1.0);
}

/* matmul_set with its fusions: the input's RMSNorm, GeGLU of a gate/up pair or against a multiplier, soft-cap;
 * step sizes on both sides of the backends' small-step paths */
static const g4_dtype fused_qtypes[] = {G4_Q8_0, G4_Q4_0, G4_Q5_0, G4_Q4_K, G4_Q5_K, G4_Q6_K, G4_IQ4_NL, G4_IQ4_XS,
                                        G4_MLX4, G4_MLX8};
static void test_matmul_set_fused(void) {
    const int ns[] = {1, 3, 8, 9, 21}, ins[] = {77, 256, 4100, 16392}, qins[] = {0, 256, 4128, 16416};
    /* plain types, then (on a backend that takes them) the quantized ones with rows of whole blocks; 40 rows, and
     * for one and eight tokens 3000 and 4500 in modes 1, 2 and 4 with quantized weights of each of CUDA's GEMV paths
     * (int8 activations, quantized with offsets, MLX's order) (CUDA: a warp's lanes split over several rows, 16 and
     * 8 lanes a row) */
    for (size_t di = 0; di < 3 + sizeof fused_qtypes / sizeof fused_qtypes[0]; di++)
        for (size_t ni = 0; ni < 5; ni++)
            for (size_t ii = di < 3 ? 0 : 1; ii < 4; ii++)
                for (int mi = 0; mi < 12; mi++) {
                    const g4_dtype wt = di < 3 ? dtypes[di] : fused_qtypes[di - 3];
                    /* wide rows (CUDA's conversion of many tokens' inputs: several float4s a thread, or none fit),
                     * a norm with or without the residual prologue: plain types, nine tokens; Q8_0 and Q4_0 (whole
                     * blocks), 8, 9 and 21 tokens (CUDA: int8 blocks for its int8 tensor-core products) */
                    if (ii >= 2 && (mi != 0 && mi != 4 && mi != 5)) continue;
                    if (ii >= 2 && di < 3 && ns[ni] != 9) continue;
                    if (ii >= 2 && di >= 3 && (ns[ni] < 8 || (wt != G4_Q8_0 && wt != G4_Q4_0))) continue;
                    if (mi >= 6 && (ii != 1 || (ns[ni] != 1 && ns[ni] != 8) || (mi != 7 && mi != 8 && mi != 10) ||
                                    (wt != G4_Q8_0 && wt != G4_Q4_0 && wt != G4_Q5_0 && wt != G4_Q4_K && wt != G4_Q5_K &&
                                     wt != G4_Q6_K && wt != G4_MLX4)))
                        continue;
                    if (!takes_quantized && di >= 3) continue;
                    if (!takes(wt)) continue;
                    /* 0 norm+3 products; 1 norm+geglu pair; 2 geglu mul; 3 softcap; 4 residual prologue + norm + 2
                     * products (into another buffer); 5 the same in place; 6-11: the same with 3000 or 4500 rows */
                    const int n = ns[ni], in = di < 3 ? ins[ii] : qins[ii];
                    const int out = mi < 6 ? 40 : n == 1 ? 3000 : 4500, mode = mi % 6;
                    const int count = mode == 0 ? 3 : mode == 1 || mode >= 4 ? 2 : 1, with_norm = mode <= 1 || mode >= 4;
                    weight w[3];
                    float *x = malloc((size_t)n * in * sizeof(float)), *nw = malloc((size_t)in * sizeof(float));
                    float *bias = malloc((size_t)(out + 8) * sizeof(float)), *mul = malloc((size_t)n * out * sizeof(float));
                    fill(x, (size_t)n * in, -2, 2);
                    fill(nw, (size_t)in, 0.5f, 1.5f);
                    fill(bias, (size_t)out + 8, -1, 1);
                    fill(mul, (size_t)n * out, -2, 2);
                    float *dx = devf(x, (size_t)n * in), *dnw = devf(nw, (size_t)in), *db = devf(bias, (size_t)out + 8);
                    float *dmul = devf(mul, (size_t)n * out);
                    g4_matmul_set set = {.count = count, .norm = with_norm ? dnw : NULL, .eps = 1e-6f,
                                         .geglu = mode == 1 || mode == 2, .mul = mode == 2 ? dmul : NULL,
                                         .softcap = mode == 3 ? 1.5f : 0.0f};
                    /* residual prologue: h (random), o = x, weight rw, scale 0.75 */
                    float *h = malloc((size_t)n * in * sizeof(float)), *rw = malloc((size_t)in * sizeof(float));
                    fill(h, (size_t)n * in, -3, 3);
                    fill(rw, (size_t)in, 0.5f, 1.5f);
                    float *dh = devf(h, (size_t)n * in), *drw = devf(rw, (size_t)in);
                    float *dout = mode == 5 ? dh : devf(NULL, (size_t)n * in);
                    if (mode >= 4) {
                        set.res_h = dh, set.res_o = dx, set.res_w = drw, set.res_scale = 0.75f, set.res_out = dout;
                        for (int t = 0; t < n; t++) { /* the products' input: the updated stream */
                            double *o = malloc((size_t)in * sizeof(double));
                            ref_rms_row(x + (size_t)t * in, rw, in, 1e-6f, o);
                            for (int k = 0; k < in; k++) {
                                const size_t i = (size_t)t * in + k;
                                h[i] = (float)(((double)h[i] + o[k]) * 0.75);
                            }
                            free(o);
                        }
                    }
                    for (int i = 0; i < count; i++) {
                        make_any(&w[i], wt, 2, (int64_t[]){out + (mode == 0 ? 3 * i : 0), in}, 1.0f);
                        set.w[i] = &w[i].dev;
                        set.bias[i] = mode == 0 && i == 1 ? db : NULL;
                        set.y[i] = devf(NULL, (size_t)n * (out + 3 * i));
                    }
                    if (ni % 2 == 0) weights_place_together(w, count); /* (CUDA: bf16/f16 sets of 9+ tokens one product
                                                                         * where a weight's rows end on 256 bytes) */
                    be->ops->matmul_set(be, dx, n, &set);
                    /* reference: x' then the products and epilogues in double */
                    float *xn = malloc((size_t)n * in * sizeof(float));
                    double *row = malloc((size_t)in * sizeof(double));
                    const float *xin = mode >= 4 ? h : x;
                    for (int t = 0; t < n; t++) {
                        if (with_norm) {
                            ref_rms_row(xin + (size_t)t * in, nw, in, 1e-6f, row);
                            for (int k = 0; k < in; k++) xn[(size_t)t * in + k] = (float)row[k];
                        } else {
                            memcpy(xn + (size_t)t * in, xin + (size_t)t * in, (size_t)in * sizeof(float));
                        }
                    }
                    const int checked = mode == 1 ? 1 : count; /* a pair's up output is scratch */
                    if (mode >= 4) { /* the updated stream */
                        float *got = malloc((size_t)n * in * sizeof(float));
                        double *ref = malloc((size_t)n * in * sizeof(double));
                        for (size_t k = 0; k < (size_t)n * in; k++) ref[k] = h[k];
                        back(got, dout, (size_t)n * in * sizeof(float));
                        EXPECT_CLOSE(got, ref, (size_t)n * in, 1e-5, "matmul_set residual mode=%d n=%d in=%d", mode, n, in);
                        free(got), free(ref);
                    }
                    for (int i = 0; i < checked; i++) {
                        const int oi = (int)w[i].host.shape[0];
                        double *ref = malloc((size_t)n * oi * sizeof(double)), *up = NULL;
                        ref_matmul(xn, n, &w[i], set.bias[i] ? bias : NULL, ref);
                        if (mode == 1) {
                            up = malloc((size_t)n * oi * sizeof(double));
                            ref_matmul(xn, n, &w[1], NULL, up);
                        }
                        /* a backend that reads int8 blocks may round one code of a product the other way where its
                         * f32 norm or residual differs from the reference's by an ulp: one code step of the input's
                         * largest block times the largest weight (through the epilogue's slope), twice, is allowed
                         * on top */
                        double flip = 0;
                        if (reads_int8(&w[i].host, n, 1)) {
                            /* (plain comparisons: gcc 12 for aarch64 stops with an internal error vectorizing
                             * these maxima as fmax reductions) */
                            double wmax = 0, xmax = 0, slope = 1;
                            for (size_t k = 0; k < (size_t)oi * in; k++)
                                if (fabs(w[i].ref[k]) > wmax) wmax = fabs(w[i].ref[k]);
                            for (size_t k = 0; k < (size_t)n * in; k++)
                                if (fabsf(xn[k]) > xmax) xmax = fabsf(xn[k]);
                            if (mode == 1 || mode == 2) { /* d(gelu(g) u) = gelu'(g) u dg + gelu(g) du, |gelu'| < 1.13 */
                                double um = 0, gm = 0;
                                for (size_t k = 0; k < (size_t)n * oi; k++) {
                                    const double u = fabs(mode == 1 ? up[k] : (double)mul[k]);
                                    const double gk = fabs(gelu_tanh_ref(ref[k]));
                                    if (u > um) um = u;
                                    if (gk > gm) gm = gk;
                                }
                                slope = 1.13 * um + (mode == 1 ? gm : 0);
                            }
                            flip = 2 * (xmax / 127) * wmax * slope;
                        }
                        for (size_t k = 0; k < (size_t)n * oi; k++) {
                            if (mode == 1) ref[k] = gelu_tanh_ref(ref[k]) * up[k];
                            if (mode == 2) ref[k] = gelu_tanh_ref(ref[k]) * mul[k];
                            if (mode == 3) ref[k] = tanh(ref[k] / 1.5) * 1.5;
                        }
                        float *y = malloc((size_t)n * oi * sizeof(float));
                        back(y, set.y[i], (size_t)n * oi * sizeof(float));
                        /* the normalized input is rounded to f32 here, as a backend does; a backend that reads
                         * int8 blocks may round one code of a product the other way where its f32 norm or residual
                         * differs from the reference's by an ulp: one code step d of the input's largest block
                         * times the largest weight, twice, on top (CUDA's int8 products are then held to the f32
                         * tolerance: integer products of the reference's codes; its others to backend_tol) */
                        const double tol_f = cuda_reads_int8(&w[i].host, n, 1) ? 1.0 : backend_tol();
                        double m = 1; /* (flip is an absolute error: rel_err's scale) */
                        for (size_t k = 0; k < (size_t)n * oi; k++) m = fabs(ref[k]) > m ? fabs(ref[k]) : m;
                        EXPECT_CLOSE(y, ref, (size_t)n * oi, 1e-5 * sqrt(in) * 4 * tol_f + flip / m,
                                     "matmul_set fused %s mode=%d n=%d in=%d product %d", g4_dtype_name(wt), mode,
                                     n, in, i);
                        free(ref), free(up), free(y);
                    }
                    for (int i = 0; i < count; i++) rel(set.y[i]), weight_free(&w[i]);
                    rel(dx), rel(dnw), rel(db), rel(dmul), rel(dh), rel(drw);
                    if (dout != dh) rel(dout);
                    free(x), free(nw), free(bias), free(mul), free(xn), free(row), free(h), free(rw);
                }
}

/* ------------------------------------------------------------- embed */
static void test_embed(void) {
    for (size_t di = 0; di < (takes_quantized ? 3 + N_QTYPES : 3); di++) {
        const int rows = 50, n = 11;
        weight w;
        if (di >= 3 && !takes(qtypes[di - 3])) continue;
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
        /* the same rows of the table kept on the host (rows_to_device: host ids): the file's values, where the
         * placed table holds them as another type */
        if (w.dev.dtype != w.host.dtype) {
            float v[256];
            for (int i = 0; i < n; i++) {
                g4_dequant_row(&w.host, ids[i], v);
                for (int c = 0; c < cols; c++) ref[i * cols + c] = v[c] * (double)0.75f;
            }
        }
        memset(out, 0, sizeof out);
        be->ops->to_device(be, dout, out, (size_t)n * cols * sizeof(float));
        be->ops->rows_to_device(be, dout, &w.host, ids, n, 0.75f);
        back(out, dout, (size_t)n * cols * sizeof(float));
        EXPECT_CLOSE(out, ref, (size_t)n * cols, 1e-6, "rows_to_device %s", g4_dtype_name(w.host.dtype));
        /* ids outside the table (the argmax's -1 of a NaN row, in the drafter's chain): rows of NaN */
        const int32_t bad_ids[2] = {-1, rows};
        be->ops->to_device(be, dids, bad_ids, sizeof bad_ids);
        be->ops->embed(be, &w.dev, dids, 2, 0.75f, dout);
        back(out, dout, 2 * (size_t)cols * sizeof(float));
        int nan_rows = 1;
        for (int i = 0; i < 2 * cols; i++) nan_rows &= out[i] != out[i];
        CHECKF(nan_rows, "%s: embed %s of ids -1 and %d: not NaN rows", be_label, g4_dtype_name(w.host.dtype), rows);
        rel(dids), rel(dout);
        weight_free(&w);
    }
}

/* ------------------------------------------------------------- norms */

/* LayerNorm with eps 1e-5, weight w and bias b (each may be NULL) */
static void ref_layernorm(const float *x, const float *w, const float *b, int rows, int dim, double *y) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++) mean += xr[i];
        mean /= dim;
        for (int i = 0; i < dim; i++) var += (xr[i] - mean) * (xr[i] - mean);
        const double inv = 1.0 / sqrt(var / dim + 1e-5);
        for (int i = 0; i < dim; i++) y[(size_t)r * dim + i] = (xr[i] - mean) * inv * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    }
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
                /* layernorm with weight and bias (the first dim values of h) or neither, out of place and in place */
                be->ops->to_device(be, dx, x, n * sizeof(float));
                be->ops->to_device(be, dh, h, (size_t)dim * sizeof(float));
                ref_layernorm(x, with_w ? w : NULL, with_w ? h : NULL, rows, dim, ref);
                be->ops->layernorm(be, dx, with_w ? dw : NULL, with_w ? dh : NULL, rows, dim, 1e-5f, dy);
                back(y, dy, n * sizeof(float));
                EXPECT_CLOSE(y, ref, n, 1e-5, "layernorm rows=%d dim=%d w,b=%d", rows, dim, with_w);
                be->ops->layernorm(be, dx, with_w ? dw : NULL, with_w ? dh : NULL, rows, dim, 1e-5f, dx);
                back(y, dx, n * sizeof(float));
                EXPECT_CLOSE(y, ref, n, 1e-5, "layernorm in place rows=%d dim=%d", rows, dim);
                rel(dx), rel(dw), rel(dy), rel(dh);
                free(x), free(w), free(h), free(y), free(ref);
            }
}

/* layernorm of wide rows far from zero mean (48x48x3 pixel blocks in [0, 1]): the mean must keep its low bits */
static void test_layernorm_offset(void) {
    const int rows = 3, dim = 6912;
    const size_t n = (size_t)rows * dim;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = 0.6f + uniform(-0.004f, 0.004f);
    ref_layernorm(x, NULL, NULL, rows, dim, ref);
    float *dx = devf(x, n), *dy = devf(NULL, n);
    be->ops->layernorm(be, dx, NULL, NULL, rows, dim, 1e-5f, dy);
    back(y, dy, n * sizeof(float));
    EXPECT_CLOSE(y, ref, n, 1e-4, "layernorm of rows with mean 0.6 and spread 0.004, dim %d", dim);
    rel(dx), rel(dy);
    free(x), free(y), free(ref);
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
    /* single elements and short rows (the sampler's modified ids gathered from rows of logits), many of them */
    {
        const int rows_of[3] = {1, 3, 31}, m = 300;
        int32_t gidx[300];
        for (int w = 0; w < 3; w++) {
            const int r = rows_of[w], avail = (int)(sizeof src / sizeof src[0]) / r;
            for (int i = 0; i < m; i++) gidx[i] = (int32_t)((i * 7919 + w) % avail);
            int32_t *dg = dev(gidx, sizeof gidx);
            float *dgo = devf(NULL, (size_t)m * r), *go = malloc((size_t)m * r * sizeof(float));
            double *gref = malloc((size_t)m * r * sizeof(double));
            be->ops->get_rows(be, dsrc, dg, m, r, dgo);
            back(go, dgo, (size_t)m * r * sizeof(float));
            for (int i = 0; i < m; i++)
                for (int k = 0; k < r; k++) gref[(size_t)i * r + k] = src[(size_t)gidx[i] * r + k];
            EXPECT_CLOSE(go, gref, (size_t)m * r, 0, "get_rows of %d-float rows", r);
            rel(dg), rel(dgo);
            free(go), free(gref);
        }
    }
    /* argmax: ties go to the lowest index, -inf and huge values, long rows; a row that holds a NaN (anywhere,
     * first or last, beside +inf) gives -1 */
    const int V = 70001, R = 7;
    float *x = malloc((size_t)R * V * sizeof(float));
    fill(x, (size_t)R * V, -30, 30);
    for (int i = 0; i < V; i++) x[6 * V + i] = -INFINITY; /* every value -inf: the first */
    x[0 * V + 123] = 50, x[0 * V + 60000] = 50;  /* tie: 123 */
    x[1 * V + V - 1] = 1e30f;                     /* last element */
    for (int i = 0; i < V; i++) x[2 * V + i] = -INFINITY;
    x[2 * V + 7] = -1e30f;
    x[3 * V + 0] = NAN;
    x[4 * V + V - 1] = NAN, x[4 * V + 5] = INFINITY;
    x[5 * V + 33333] = NAN;
    int32_t want[7] = {123, V - 1, 7, -1, -1, -1, 0}, got[7] = {-2, -2, -2, -2, -2, -2, -2};
    float *dx = devf(x, (size_t)R * V);
    int32_t *dids = dev(NULL, sizeof got);
    be->ops->argmax(be, dx, R, V, dids);
    back(got, dids, sizeof got);
    CHECKF(!memcmp(got, want, sizeof got), "%s: argmax gave %d %d %d %d %d %d %d", be_label, got[0], got[1], got[2],
           got[3], got[4], got[5], got[6]);
    /* rows shorter than a vector, and of 17..47 (a vector's worth and a tail), and around a CPU pass of 64, the
     * largest value anywhere, with a tie after it */
    for (int len = 1; len < 210; len += len < 48 ? 3 : 11) {
        float xs[210];
        for (int at = 0; at < len; at++) {
            for (int i = 0; i < len; i++) xs[i] = (float)(i % 5) - 10.0f;
            xs[at] = 3.0f;
            if (at + 2 < len) xs[at + 2] = 3.0f; /* a tie after it */
            float *dr = devf(xs, (size_t)len);
            int32_t *di = dev(NULL, sizeof(int32_t)), id = -2;
            be->ops->argmax(be, dr, 1, len, di);
            back(&id, di, sizeof id);
            CHECKF(id == at, "%s: argmax of a row of %d with its largest at %d gave %d", be_label, len, at, id);
            rel(dr), rel(di);
        }
    }
    rel(dsrc), rel(dout), rel(didx), rel(dx), rel(dids);
    free(x);
}

/* ------------------------------------------------------------- top-k candidates */
static int cmp_desc_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The indices of every value >= the k-th largest finite-or-+inf value (-inf never), ascending: how many, or -1
 * above cap and for a row that holds a NaN. */
static int ref_top_k(const float *x, int n, int k, int cap, int32_t *ids, float *scratch) {
    int f = 0;
    for (int i = 0; i < n; i++)
        if (x[i] != x[i]) return -1;
    for (int i = 0; i < n; i++)
        if (x[i] != -INFINITY) scratch[f++] = x[i];
    qsort(scratch, (size_t)f, sizeof *scratch, cmp_desc_f);
    const float t = f == 0 ? INFINITY : f < k ? scratch[f - 1] : scratch[k - 1];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i] && x[i] != -INFINITY && x[i] >= t) {
            if (m < cap) ids[m] = i;
            m++;
        }
    return m > cap ? -1 : m;
}

/* Rows of several lengths (one chunk of the GPU's, several, a ragged last one) with -inf and +inf, ties at the
 * k-th value, fewer finite values than k, ties beyond cap, a NaN (in the last chunk) or NaN only, and k from 1 to
 * G4_TOP_K_MAX. */
static void test_top_k(void) {
    const int ns[] = {1, 7, 300, 4096, 4097, 70001}, ks[] = {1, 5, 64, 200, G4_TOP_K_MAX}, R = 7;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int n = ns[ni], k = ks[ki], cap = k < 64 ? k + 64 : 2 * k;
            float *x = malloc((size_t)R * n * sizeof(float)), *scratch = malloc((size_t)n * sizeof(float));
            float *vals = malloc((size_t)R * cap * sizeof(float));
            int32_t *ids = malloc((size_t)R * cap * sizeof(int32_t)), *want = malloc((size_t)cap * sizeof(int32_t));
            int32_t count[7];
            fill(x, (size_t)R * n, -20, 20);
            float *r1 = x + n, *r2 = x + 2 * (size_t)n, *r3 = x + 3 * (size_t)n, *r4 = x + 4 * (size_t)n,
                  *r5 = x + 5 * (size_t)n, *r6 = x + 6 * (size_t)n;
            for (int i = 0; i < n; i += 3) r1[i] = -INFINITY; /* -inf */
            r1[n / 2] = INFINITY;
            if (n == 300)
                for (int i = 0; i < n; i++) r1[i] = -INFINITY; /* nothing qualifies */
            for (int i = 0; i < n; i++) r2[i] = (float)(i % 97) * 0.25f; /* many ties everywhere */
            for (int i = 0; i < n; i++) r3[i] = -INFINITY;                 /* a few finite values, fewer than k */
            for (int i = 0; i < n; i += 11) r3[i] = uniform(-3, 3);
            for (int i = 0; i < n; i++) r4[i] = 1.5f;                      /* all tie: beyond cap where n is */
            r5[n - 1] = NAN;                                               /* one NaN: the row comes back */
            if (n == 7)
                for (int i = 0; i < n; i++) r5[i] = NAN;
            for (int i = 0; i < n; i++) r6[i] = -3.0f + (float)(i % 13) * 1e-7f; /* close values, negative */
            r6[n - 1] = -1e30f;
            float *dx = devf(x, (size_t)R * n), *dvals = devf(NULL, (size_t)R * cap);
            int32_t *dids = dev(NULL, (size_t)R * cap * sizeof(int32_t)), *dcount = dev(NULL, sizeof count);
            be->ops->top_k(be, dx, R, n, k, cap, dids, dvals, dcount);
            back(ids, dids, (size_t)R * cap * sizeof(int32_t));
            back(vals, dvals, (size_t)R * cap * sizeof(float));
            back(count, dcount, sizeof count);
            for (int r = 0; r < R; r++) {
                const float *xr = x + (size_t)r * n;
                const int m = ref_top_k(xr, n, k, cap, want, scratch);
                int ok = count[r] == m;
                for (int i = 0; ok && i < m; i++)
                    ok = ids[(size_t)r * cap + i] == want[i] &&
                         !memcmp(&vals[(size_t)r * cap + i], &xr[want[i]], sizeof(float));
                CHECKF(ok, "%s: top_k n=%d k=%d cap=%d row %d: count %d, want %d", be_label, n, k, cap, r, count[r], m);
            }
            rel(dx), rel(dvals), rel(dids), rel(dcount);
            free(x), free(scratch), free(vals), free(ids), free(want);
        }
}

/* ------------------------------------------------------------- masked logits */
/* The drafter's masked embedder: top-k groups by score (ties -> lower index), products with their table rows,
 * min - 1 everywhere else; groups tie at the top_k boundary, and top_k = every group; one row and three rows at once
 * (each its own input, scores and choice of groups). */
static void test_masked_logits(void) {
    enum { G = 12, per = 37, V = G * per, dim = 53, RMAX = 3 };
    const int topks[] = {1, 5, 12}, row_counts[] = {1, RMAX};
    for (size_t di = 0; di < 3; di++)
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t ri = 0; ri < 2; ri++) {
                const int top_k = topks[ti], rows = row_counts[ri];
                weight w;
                int64_t shape[2] = {V, dim};
                weight_make(&w, dtypes[di], 2, shape, 1.0f);
                float x[RMAX * dim], scores[RMAX * G], *out = malloc((size_t)rows * V * sizeof(float));
                double *ref = malloc((size_t)rows * V * sizeof(double));
                int32_t ordering[V];
                fill(x, (size_t)rows * dim, -1, 1);
                for (int i = 0; i < V; i++) ordering[i] = i;
                for (int i = V - 1; i > 0; i--) { /* a random permutation */
                    int j = (int)(next_u32() % (uint32_t)(i + 1));
                    int32_t t = ordering[i];
                    ordering[i] = ordering[j], ordering[j] = t;
                }
                for (int r = 0; r < rows; r++) {
                    /* top_k - 1 groups score above 1, two groups tie at 0.25 (the boundary: the lower is taken), the
                     * rest below 0; the tied pair differs by row */
                    const int t1 = (3 + 4 * r) % G, t2 = (9 + 4 * r) % G;
                    float *sc = scores + r * G;
                    for (int g = 0, above = 0; g < G; g++)
                        sc[g] = g == t1 || g == t2 ? 0.25f : above++ < top_k - 1 ? uniform(1, 3) : uniform(-3, 0);
                    int taken[G] = {0};
                    double mn = INFINITY, *rr = ref + (size_t)r * V;
                    for (int v = 0; v < V; v++) rr[v] = NAN;
                    for (int kk = 0; kk < top_k; kk++) {
                        int best = -1;
                        for (int g = 0; g < G; g++)
                            if (!taken[g] && (best < 0 || sc[g] > sc[best])) best = g;
                        taken[best] = 1;
                        for (int i = 0; i < per; i++) {
                            int id = ordering[best * per + i];
                            double d = 0;
                            for (int k = 0; k < dim; k++) d += w.ref[(size_t)id * dim + k] * x[r * dim + k];
                            rr[id] = d;
                            mn = d < mn ? d : mn;
                        }
                    }
                    for (int v = 0; v < V; v++)
                        if (isnan(rr[v])) rr[v] = mn - 1.0;
                }
                float *dx = devf(x, (size_t)rows * dim), *ds = devf(scores, (size_t)rows * G);
                float *dout = devf(NULL, (size_t)rows * V);
                int32_t *dord = dev(ordering, sizeof ordering);
                be->ops->masked_logits(be, dx, ds, rows, G, top_k, dord, &w.dev, dout);
                back(out, dout, (size_t)rows * V * sizeof(float));
                EXPECT_CLOSE(out, ref, (size_t)rows * V, 1e-5 * backend_tol(), "masked_logits %s top_k %d, %d rows",
                             g4_dtype_name(dtypes[di]), top_k, rows);
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
/* many: a prefill-sized step (16 tokens: the last 12 positions of one sequence, 3 of another, 1 decode token) */
/* decode_hint: the step claims one token a sequence (max_seq_tokens 1, a kernel-choosing hint: results must not
 * depend on it) */
static void test_attention_case_n(g4_kv_type kt, int n_heads, int n_kv, int D, int B, int window, int with_kv_end,
                                  int with_kv_start, int many, int decode_hint) {
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
            if (!window || (b + 1) * B > len[s] - window - B - (with_kv_start ? 9 : 0))
                table[s * max_blocks + b] = perm[used++]; /* slid-out: none */
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
    int32_t tseq[16], tpos[16], tend[16], tstart[16];
    int nt = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int p = len[s] - (s == 2 ? (many ? 12 : 5) : s == 1 && many ? 3 : 1); p < len[s]; p++) {
            tseq[nt] = s, tpos[nt] = p;
            /* kv_end: some tokens see a few later positions (an image block), never past the sequence */
            tend[nt] = with_kv_end && p + 3 <= len[s] && (nt & 1) ? p + 3 : p + 1;
            /* kv_start: some tokens see a few positions below their window (an image longer than it) */
            int wlo = window ? (p - window + 1 > 0 ? p - window + 1 : 0) : 0;
            tstart[nt] = with_kv_start && (nt % 3) != 1 ? (wlo - 7 > 0 ? wlo - 7 : 0) : wlo;
            nt++;
        }
    const size_t nq = (size_t)nt * n_heads * D;
    float *q = malloc(nq * sizeof(float)), *out = malloc(nq * sizeof(float));
    double *ref = malloc(nq * sizeof(double));
    fill(q, nq, -1, 1);
    const float scale = 0.37f;
    int max_keys = 0;
    for (int t = 0; t < nt; t++) {
        int lo = tstart[t], hi = tend[t];
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
    int32_t *dstart = dev(tstart, (size_t)nt * 4);
    int32_t *dtable = dev(table, (size_t)NSEQ * max_blocks * 4);
    g4_attention_args a = {
        .q = dq, .out = dout, .n_tokens = nt, .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = D,
        .seq = dseq, .pos = dpos, .kv_end = with_kv_end ? dend : NULL, .kv_start = with_kv_start ? dstart : NULL, .k = dk, .v = dv, .kv_type = kt,
        .block_table = dtable, .max_blocks = max_blocks, .block_size = B, .window = window, .max_keys = max_keys,
        .max_seq_tokens = decode_hint, .scale = scale,
    };
    be->ops->attention(be, &a);
    back(out, dout, nq * sizeof(float));
    EXPECT_CLOSE(out, ref, nq, 2e-5 * backend_tol(),
                 "attention kv=%s heads=%d/%d D=%d block=%d window=%d kv_end=%d kv_start=%d tokens=%d hint=%d",
                 kv_name(kt), n_heads, n_kv, D, B, window, with_kv_end, with_kv_start, nt, decode_hint);
    rel(dk), rel(dv), rel(dq), rel(dout), rel(dseq), rel(dpos), rel(dend), rel(dstart), rel(dtable);
    free(kref), free(vref), free(kin), free(vin), free(q), free(out), free(ref);
}

static void test_attention_case(g4_kv_type kt, int n_heads, int n_kv, int D, int B, int window, int with_kv_end,
                                int with_kv_start) {
    test_attention_case_n(kt, n_heads, n_kv, D, B, window, with_kv_end, with_kv_start, 0, 0);
}

static void test_attention(void) {
    const g4_kv_type kts[] = {G4_KV_F32, G4_KV_BF16, G4_KV_F16};
    /* prefill-sized steps (CUDA, bf16 cache, 16 % G == 0 and D % 128 == 0: the tensor-core kernel; rows of three
     * sequences in one block) */
    for (int k = 0; k < 3; k++) {
        test_attention_case_n(kts[k], 8, 1, 256, 32, 0, 0, 0, 1, 0);  /* E2B: two tokens a block */
        test_attention_case_n(kts[k], 8, 1, 512, 16, 0, 0, 0, 1, 0);  /* E2B's full layers */
        test_attention_case_n(kts[k], 4, 2, 256, 32, 20, 1, 0, 1, 0); /* a window, a kv_end ahead */
        test_attention_case_n(kts[k], 2, 1, 512, 8, 13, 1, 1, 1, 0);  /* G 2 (31B), keys below the window */
        test_attention_case_n(kts[k], 1, 1, 128, 7, 0, 0, 0, 1, 0);   /* sixteen tokens a block */
        test_attention_case_n(kts[k], 10, 2, 256, 8, 9, 0, 0, 1, 0); /* G 5: the per-token kernel */
        /* 16 tokens as a decode batch (the hint): the per-token kernel, keys split over blocks */
        test_attention_case_n(kts[k], 8, 1, 256, 32, 0, 0, 0, 1, 1);
        test_attention_case_n(kts[k], 4, 2, 256, 32, 20, 1, 1, 1, 1);
    }
    for (int k = 0; k < 3; k++) {
        test_attention_case(kts[k], 4, 1, 64, 16, 0, 0, 0);
        test_attention_case(kts[k], 8, 1, 256, 32, 0, 0, 0); /* E2B's grouping: two items of 4 heads per token */
        test_attention_case(kts[k], 10, 2, 40, 8, 9, 0, 0);  /* groups of 4 and 1 heads, D not a multiple of 16 */
        test_attention_case(kts[k], 8, 2, 256, 32, 0, 0, 0);
        test_attention_case(kts[k], 2, 2, 512, 4, 0, 0, 0);
        test_attention_case(kts[k], 6, 3, 32, 7, 13, 0, 0);  /* sliding window, odd block size */
        test_attention_case(kts[k], 4, 2, 128, 16, 20, 1, 0); /* window with a kv_end that reaches ahead */
        test_attention_case(kts[k], 3, 1, 8, 1, 0, 1, 0);
        test_attention_case(kts[k], 4, 2, 64, 8, 12, 1, 1);   /* a whole image seen beyond the window */
    }
}

/* attn_prep: q/k/v norms, RoPE, keys as values and the KV store in one op */
static void test_attn_prep(void) {
    const g4_kv_type kts[] = {G4_KV_F32, G4_KV_BF16, G4_KV_F16};
    const int dims[] = {64, 256, 512};
    for (int ki = 0; ki < 3; ki++)
        for (int dd = 0; dd < 3; dd++)
            for (int mode = 0; mode < 3; mode++) { /* 0 k and v; 1 keys as values; 2 KV-shared (q only) */
                const g4_kv_type kt = kts[ki];
                const int n = 3, NH = 4, KV = 2, D = dims[dd], half = D / 2, rows = 8, row = KV * D;
                const size_t nq = (size_t)n * NH * D, nk = (size_t)n * KV * D;
                float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
                float *qn = malloc((size_t)D * sizeof(float)), *kn = malloc((size_t)D * sizeof(float));
                float *tab = malloc((size_t)n * D * sizeof(float));
                fill(q, nq, -2, 2), fill(k, nk, -2, 2), fill(v, nk, -2, 2);
                fill(qn, (size_t)D, 0.5f, 1.5f), fill(kn, (size_t)D, 0.5f, 1.5f);
                for (int t = 0; t < n; t++)
                    for (int j = 0; j < half; j++) {
                        float a = uniform(-3.14f, 3.14f);
                        tab[(size_t)t * D + j] = cosf(a), tab[(size_t)t * D + half + j] = sinf(a);
                    }
                int32_t slot[3] = {5, 0, 2};
                const size_t esz = g4_kv_type_size(kt), cache_bytes = (size_t)rows * row * esz;
                unsigned char *zero = calloc(1, cache_bytes);
                float *dq = devf(q, nq), *dk = devf(k, nk), *dv = devf(v, nk), *dqn = devf(qn, (size_t)D);
                float *dkn = devf(kn, (size_t)D), *dtab = devf(tab, (size_t)n * D);
                int32_t *dslot = dev(slot, sizeof slot);
                void *kc = dev(zero, cache_bytes), *vc = dev(zero, cache_bytes);
                g4_attn_prep_args a = {.q = dq, .k = dk, .v = dv, .n = n, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
                                       .kv_shared = mode == 2, .v_from_k = mode == 1, .q_norm = dqn, .k_norm = dkn,
                                       .eps = 1e-6f, .rope = dtab, .slot = dslot, .k_cache = kc, .v_cache = vc,
                                       .kv_type = kt};
                be->ops->attn_prep(be, &a);
                /* reference: per head row, rms * weight, then rotate-half with the table */
                double *qref = malloc(nq * sizeof(double)), *kref = calloc((size_t)rows * row, sizeof(double));
                double *vref = calloc((size_t)rows * row, sizeof(double)), *tmp = malloc((size_t)D * sizeof(double));
                for (int t = 0; t < n; t++) {
                    const float *cs = tab + (size_t)t * D, *sn = cs + half;
                    for (int h = 0; h < NH + 2 * KV; h++) {
                        const int is_q = h < NH, is_k = h >= NH && h < NH + KV, hh = is_q ? h : is_k ? h - NH : h - NH - KV;
                        const float *src = is_q ? q + ((size_t)t * NH + hh) * D
                                                : (is_k || mode == 1 ? k : v) + ((size_t)t * KV + hh) * D;
                        ref_rms_row(src, is_q ? qn : is_k ? kn : NULL, D, 1e-6f, tmp);
                        double *dst = is_q ? qref + ((size_t)t * NH + hh) * D
                                           : (is_k ? kref : vref) + (size_t)slot[t] * row + (size_t)hh * D;
                        for (int j = 0; j < half; j++) {
                            double x0 = tmp[j], x1 = tmp[j + half];
                            if (is_q || is_k)
                                dst[j] = x0 * cs[j] - x1 * sn[j], dst[j + half] = x1 * cs[j] + x0 * sn[j];
                            else
                                dst[j] = x0, dst[j + half] = x1;
                        }
                    }
                }
                float *got = malloc(((size_t)rows * row > nq ? (size_t)rows * row : nq) * sizeof(float));
                back(got, dq, nq * sizeof(float));
                EXPECT_CLOSE(got, qref, nq, 1e-5, "attn_prep q kv=%s D=%d mode=%d", kv_name(kt), D, mode);
                unsigned char *cache = malloc(cache_bytes);
                for (int c = 0; c < 2; c++) {
                    back(cache, c ? vc : kc, cache_bytes);
                    double *ref = c ? vref : kref;
                    for (size_t i = 0; i < (size_t)rows * row; i++) {
                        if (mode == 2) ref[i] = 0; /* nothing stored */
                        else ref[i] = kv_round(kt, (float)ref[i]);
                        if (kt == G4_KV_F32) memcpy(&got[i], cache + i * 4, 4);
                        else {
                            uint16_t hv;
                            memcpy(&hv, cache + i * 2, 2);
                            got[i] = kt == G4_KV_BF16 ? g4_bf16_to_f32(hv) : g4_f16_to_f32(hv);
                        }
                    }
                    /* one rounding step of the cache type when our f32 value lands on the other side */
                    EXPECT_CLOSE(got, ref, (size_t)rows * row, kt == G4_KV_F32 ? 1e-5 : 1e-2,
                                 "attn_prep %s cache kv=%s D=%d mode=%d", c ? "V" : "K", kv_name(kt), D, mode);
                }
                rel(dq), rel(dk), rel(dv), rel(dqn), rel(dkn), rel(dtab), rel(dslot), rel(kc), rel(vc);
                free(q), free(k), free(v), free(qn), free(kn), free(tab), free(zero), free(qref), free(kref), free(vref);
                free(tmp), free(got), free(cache);
            }
}

/* attention with its prep (g4_attention_args.prep), as a decode step runs it: one token whose raw q, k and v rows
 * the op normalizes, rotates and stores before attending over the paged cache of the earlier positions (keys
 * spread over several blocks of a split where the backend splits). mode: 0 k and v; 1 keys as values; 2 KV-shared
 * (the cache already holds the token's rows; q only). The reference attends over the cache rows read back, after
 * checking the token's stored rows against the reference prep. */
/* A step of n tokens (positions len-n .. len-1 of one sequence) with the prep in the attention op: raw q/k/v rows,
 * norms and a RoPE row per token; the keys before the step are in the cache already (KV-shared: all of them). */
static void test_attention_prep_case(g4_kv_type kt, int NH, int KV, int D, int len, int window, int mode, int n) {
    const int B = 16, max_blocks = (len + B - 1) / B, row = KV * D, half = D / 2, p0 = len - n;
    const float eps = 1e-6f, scale = 0.37f;
    int32_t table[64];
    for (int b = 0; b < max_blocks; b++) table[b] = max_blocks - 1 - b; /* physical blocks in reverse order */
    const size_t esz = g4_kv_type_size(kt), cache_elems = (size_t)max_blocks * B * row;
    const int stored = mode == 2 ? len : p0;
    float *kin = malloc((size_t)len * row * sizeof(float)), *vin = malloc((size_t)len * row * sizeof(float));
    int32_t *slots = malloc((size_t)len * sizeof(int32_t));
    for (int j = 0; j < len; j++) slots[j] = table[j / B] * B + j % B;
    fill(kin, (size_t)len * row, -1, 1), fill(vin, (size_t)len * row, -1, 1);
    void *dk = dev(NULL, cache_elems * esz), *dv = dev(NULL, cache_elems * esz);
    float *dkin = devf(kin, (size_t)len * row), *dvin = devf(vin, (size_t)len * row);
    int32_t *dslots = dev(slots, (size_t)len * sizeof(int32_t));
    if (stored > 0) be->ops->kv_store(be, dkin, dvin, stored, row, dslots, dk, dv, kt);
    /* the step's raw rows, norms and RoPE table rows */
    const size_t nq = (size_t)n * NH * D, nkv = (size_t)n * row;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nkv * sizeof(float));
    float *v = malloc(nkv * sizeof(float)), *qn = malloc((size_t)D * sizeof(float));
    float *kn = malloc((size_t)D * sizeof(float)), *tab = malloc((size_t)n * D * sizeof(float));
    fill(q, nq, -2, 2), fill(k, nkv, -2, 2), fill(v, nkv, -2, 2);
    fill(qn, (size_t)D, 0.5f, 1.5f), fill(kn, (size_t)D, 0.5f, 1.5f);
    for (int j = 0; j < n * half; j++) {
        const float ang = uniform(-3.14f, 3.14f);
        tab[(j / half) * D + j % half] = cosf(ang), tab[(j / half) * D + half + j % half] = sinf(ang);
    }
    /* reference prep: rms * weight, then rotate-half (values: rms only) */
    double *qref = malloc(nq * sizeof(double)), *kvref = malloc((size_t)2 * nkv * sizeof(double));
    double *tmp = malloc((size_t)D * sizeof(double));
    for (int t = 0; t < n; t++)
        for (int h = 0; h < NH + 2 * KV; h++) {
            const int is_q = h < NH, is_k = h >= NH && h < NH + KV, hh = is_q ? h : is_k ? h - NH : h - NH - KV;
            const float *src = is_q ? q + ((size_t)t * NH + hh) * D : (is_k || mode == 1 ? k : v) + (size_t)t * row + (size_t)hh * D;
            const float *cs = tab + (size_t)t * D;
            ref_rms_row(src, is_q ? qn : is_k ? kn : NULL, D, eps, tmp);
            double *dst = is_q ? qref + ((size_t)t * NH + hh) * D : kvref + (size_t)(is_k ? 0 : nkv) + (size_t)t * row + (size_t)hh * D;
            for (int j = 0; j < half; j++) {
                const double x0 = tmp[j], x1 = tmp[j + half];
                if (is_q || is_k)
                    dst[j] = x0 * cs[j] - x1 * cs[half + j], dst[j + half] = x1 * cs[j] + x0 * cs[half + j];
                else
                    dst[j] = x0, dst[j + half] = x1;
            }
        }
    float *dq = devf(q, nq), *dkr = devf(k, nkv), *dvr = devf(v, nkv);
    float *dqn = devf(qn, (size_t)D), *dkn = devf(kn, (size_t)D), *dtab = devf(tab, (size_t)n * D);
    float *dout = devf(NULL, nq);
    int32_t seq[64], pos[64];
    for (int t = 0; t < n; t++) seq[t] = 0, pos[t] = p0 + t;
    int32_t *dseq = dev(seq, (size_t)n * 4), *dpos = dev(pos, (size_t)n * 4), *dtable = dev(table, (size_t)max_blocks * 4);
    const int lo0 = window && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
    g4_attn_prep_args prep = {.q = dq, .k = dkr, .v = dvr, .n = n, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
                              .kv_shared = mode == 2, .v_from_k = mode == 1, .q_norm = dqn, .k_norm = dkn, .eps = eps,
                              .rope = dtab, .slot = dslots + p0, .k_cache = dk, .v_cache = dv, .kv_type = kt};
    g4_attention_args a = {.q = dq, .out = dout, .n_tokens = n, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
                           .seq = dseq, .pos = dpos, .k = dk, .v = dv, .kv_type = kt, .block_table = dtable,
                           .max_blocks = max_blocks, .block_size = B, .window = window, .max_keys = len - lo0,
                           .scale = scale, .prep = &prep};
    be->ops->attention(be, &a);
    /* the cache read back as f32: the step's rows against the reference prep (one rounding step of the cache
     * type where our f32 value lands on the other side), then every key and value the reference reads */
    unsigned char *cache = malloc(cache_elems * esz);
    float *kc = malloc(cache_elems * sizeof(float)), *vc = malloc(cache_elems * sizeof(float));
    for (int c = 0; c < 2; c++) {
        back(cache, c ? dv : dk, cache_elems * esz);
        float *dst = c ? vc : kc;
        for (size_t i = 0; i < cache_elems; i++) {
            if (kt == G4_KV_F32) {
                memcpy(&dst[i], cache + i * 4, 4);
            } else {
                uint16_t hv;
                memcpy(&hv, cache + i * 2, 2);
                dst[i] = kt == G4_KV_BF16 ? g4_bf16_to_f32(hv) : g4_f16_to_f32(hv);
            }
        }
    }
    if (mode != 2)
        for (int t = 0; t < n; t++) {
            const size_t tok = (size_t)slots[p0 + t] * row;
            EXPECT_CLOSE(kc + tok, kvref + (size_t)t * row, (size_t)row, kt == G4_KV_F32 ? 1e-5 : 1e-2,
                         "attention+prep K row kv=%s D=%d mode=%d n=%d", kv_name(kt), D, mode, n);
            EXPECT_CLOSE(vc + tok, kvref + nkv + (size_t)t * row, (size_t)row, kt == G4_KV_F32 ? 1e-5 : 1e-2,
                         "attention+prep V row kv=%s D=%d mode=%d n=%d", kv_name(kt), D, mode, n);
        }
    double *ref = malloc(nq * sizeof(double)), *sc = malloc((size_t)len * sizeof(double));
    for (int t = 0; t < n; t++) {
        const int p = p0 + t, lo = window && p - window + 1 > 0 ? p - window + 1 : 0;
        for (int h = 0; h < NH; h++) {
            const int kh = h / (NH / KV);
            const double *qv = qref + ((size_t)t * NH + h) * D;
            double mx = -DBL_MAX, sum = 0;
            for (int j = lo; j <= p; j++) {
                const float *kr = kc + (size_t)slots[j] * row + (size_t)kh * D;
                double d = 0;
                for (int i = 0; i < D; i++) d += qv[i] * kr[i];
                sc[j] = d * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = lo; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
            double *o = ref + ((size_t)t * NH + h) * D;
            for (int i = 0; i < D; i++) o[i] = 0;
            for (int j = lo; j <= p; j++)
                for (int i = 0; i < D; i++) o[i] += sc[j] / sum * vc[(size_t)slots[j] * row + (size_t)kh * D + i];
        }
    }
    float *out = malloc(nq * sizeof(float));
    back(out, dout, nq * sizeof(float));
    EXPECT_CLOSE(out, ref, nq, 2e-5 * backend_tol(),
                 "attention+prep kv=%s heads=%d/%d D=%d len=%d window=%d mode=%d n=%d", kv_name(kt), NH, KV, D, len,
                 window, mode, n);
    rel(dk), rel(dv), rel(dkin), rel(dvin), rel(dslots), rel(dq), rel(dkr), rel(dvr), rel(dqn), rel(dkn), rel(dtab);
    rel(dout), rel(dseq), rel(dpos), rel(dtable);
    free(kin), free(vin), free(slots), free(q), free(k), free(v), free(qn), free(kn), free(tab), free(qref), free(kvref);
    free(tmp), free(cache), free(kc), free(vc), free(ref), free(sc), free(out);
}

static void test_attention_prep(void) {
    const g4_kv_type kts[] = {G4_KV_F32, G4_KV_BF16, G4_KV_F16};
    for (int i = 0; i < 3; i++) {
        test_attention_prep_case(kts[i], 8, 1, 256, 300, 0, 0, 1); /* E2B's grouping, keys over several splits */
        test_attention_prep_case(kts[i], 8, 2, 512, 200, 64, 1, 1); /* keys as values, sliding window */
        test_attention_prep_case(kts[i], 4, 2, 256, 150, 0, 2, 1); /* KV-shared: q only */
        test_attention_prep_case(kts[i], 6, 3, 64, 1, 0, 0, 1);   /* the first position: its own key only */
        /* steps of many tokens (CUDA, bf16 keys: the tensor-core kernel after a separate prep) */
        test_attention_prep_case(kts[i], 8, 1, 256, 90, 0, 2, 20);  /* KV-shared (E2B's later layers) */
        test_attention_prep_case(kts[i], 8, 2, 128, 70, 24, 1, 17); /* keys as values, a window */
        test_attention_prep_case(kts[i], 4, 1, 512, 40, 0, 0, 40);  /* a first chunk: no key stored before */
    }
}

/* ------------------------------------------------------------- mixture of experts */
/* One MoE block over n tokens: the router in rt, gate and up in gt (one [E, 2Im, H] tensor, or two [E, Im, H]
 * when split), down in dt; out = rmsnorm(dense) * post_norm1 + rmsnorm(sum of experts) * post_norm2, the
 * experts reading x2 = rmsnorm(residual) * pre_norm2. The reference reads every product's input as the backend
 * does (x_as_read of x2 rounded to float); down's input (the activations the backend computed in float) is rounded
 * the same way where the backend reads them as int8 blocks (CUDA's one-token experts, the CPU's Q4_K and Q6_K
 * experts; a rare flip of one step where the two computations of an activation straddle a rounding boundary would
 * show here: none in these cases).
 * E experts, TK a token (E <= 256, TK <= 32); ties (a float32 router): experts 2j and 2j + 1 get equal router rows,
 * so every pick is a tie of two, taken by the lower expert id. */
static void moe_case_e(int n, int H, int Im, g4_dtype rt, g4_dtype gt, int split, g4_dtype dt, int E, int TK,
                       int ties, int mlp) {
    weight router, gu, up, dn;
    make_any(&router, rt, 2, (int64_t[]){E, H}, 1.0f);
    if (ties) { /* (float32: the host bytes are the values) */
        float *rw = (float *)router.host.data;
        for (int e = 1; e < E; e += 2)
            for (size_t i = (size_t)e * H; i < (size_t)(e + 1) * H; i++) rw[i] = rw[i - H], router.ref[i] = rw[i];
        if (router.dev.data != router.host.data) be->ops->release_weight(be, &router.dev);
        weight_upload(&router);
    }
    make_any(&gu, gt, 3, (int64_t[]){E, (split ? 1 : 2) * (int64_t)Im, H}, 0.5f);
    if (split) make_any(&up, gt, 3, (int64_t[]){E, Im, H}, 0.5f);
    make_any(&dn, dt, 3, (int64_t[]){E, H, Im}, 0.5f);
    const size_t nh = (size_t)n * H;
    float *r = malloc(nh * sizeof(float)), *dense = malloc(nh * sizeof(float)), *x2 = calloc(nh, sizeof(float));
    float *rscale = malloc((size_t)H * sizeof(float)), pes[256], *out = malloc(nh * sizeof(float));
    float *pn2 = malloc((size_t)H * sizeof(float)), *qn1 = malloc((size_t)H * sizeof(float));
    float *qn2 = malloc((size_t)H * sizeof(float));
    fill(r, nh, -2, 2);
    fill(dense, nh, -1, 1);
    fill(rscale, (size_t)H, 0.5f, 1.5f);
    fill(pes, (size_t)E, 0.5f, 2.0f);
    fill(pn2, (size_t)H, 0.5f, 1.5f), fill(qn1, (size_t)H, 0.5f, 1.5f), fill(qn2, (size_t)H, 0.5f, 1.5f);
    const float eps = 1e-6f;
    /* mlp 1: the dense MLP in the op (gate/up [Id, H] with norm pn1, down [H, Id], BF16); mlp 2: also the residual
     * prologue r = (h + rmsnorm(o) * rw) * 0.75 */
    const int Id = 48;
    weight mg = {0}, mu = {0}, md = {0};
    float *h = malloc(nh * sizeof(float)), *o = malloc(nh * sizeof(float)), *rw = malloc((size_t)H * sizeof(float));
    float *pn1 = malloc((size_t)H * sizeof(float));
    fill(h, nh, -2, 2), fill(o, nh, -2, 2), fill(rw, (size_t)H, 0.5f, 1.5f), fill(pn1, (size_t)H, 0.5f, 1.5f);
    if (mlp) {
        make_any(&mg, G4_BF16, 2, (int64_t[]){Id, H}, 0.5f);
        make_any(&mu, G4_BF16, 2, (int64_t[]){Id, H}, 0.5f);
        make_any(&md, G4_BF16, 2, (int64_t[]){H, Id}, 0.5f);
        double *row = malloc((size_t)H * sizeof(double));
        if (mlp == 2)
            for (int t = 0; t < n; t++) {
                ref_rms_row(o + (size_t)t * H, rw, H, eps, row);
                for (int i = 0; i < H; i++) r[(size_t)t * H + i] = (float)(((double)h[(size_t)t * H + i] + row[i]) * 0.75);
            }
        float *x1 = malloc(nh * sizeof(float)), *actd = malloc((size_t)n * Id * sizeof(float));
        double *g = malloc((size_t)n * Id * sizeof(double)), *u = malloc((size_t)n * Id * sizeof(double));
        double *dd = malloc(nh * sizeof(double));
        for (int t = 0; t < n; t++) {
            ref_rms_row(r + (size_t)t * H, pn1, H, eps, row);
            for (int i = 0; i < H; i++) x1[(size_t)t * H + i] = (float)row[i];
        }
        ref_matmul(x1, n, &mg, NULL, g), ref_matmul(x1, n, &mu, NULL, u);
        for (size_t k = 0; k < (size_t)n * Id; k++) actd[k] = (float)(gelu_tanh_ref(g[k]) * u[k]);
        ref_matmul(actd, n, &md, NULL, dd);
        for (size_t k = 0; k < nh; k++) dense[k] = (float)dd[k];
        free(row), free(x1), free(actd), free(g), free(u), free(dd);
    }
    double *ref = calloc(nh, sizeof(double)), *esum = calloc(nh, sizeof(double)), *z = malloc((size_t)H * sizeof(double));
    double *xg = malloc(nh * sizeof(double)), *act = malloc((size_t)Im * sizeof(double));
    double *tmp = malloc((size_t)H * sizeof(double));
    float *actf = malloc((size_t)Im * sizeof(float));
    for (int t = 0; t < n; t++) {
        ref_rms_row(r + (size_t)t * H, pn2, H, eps, tmp);
        for (int i = 0; i < H; i++) x2[(size_t)t * H + i] = (float)tmp[i];
    }
    /* (the weights as held: a layout can depend on the rows, MXFP4 rows of 96 not CB4 but AF8 / MLX8) */
    g4_tensor gu_held = gu.host, dn_held = dn.host;
    gu_held.dtype = gu.dev.dtype, dn_held.dtype = dn.dev.dtype;
    x_as_read(x2, n, H, &gu_held, 0, xg);
    for (int t = 0; t < n; t++) {
        double lg[256], ms = 0;
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
        int ids[32];
        double w[32], wsum = 0;
        for (int k = 0; k < TK; k++) { /* the best not taken yet, ties to the lower id */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= ids[j] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
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
            if (reads_int8(&dn_held, n, 0)) { /* down reads the activations as int8 blocks */
                for (int c = 0; c < Im; c++) actf[c] = (float)act[c];
                x_as_read(actf, 1, Im, &dn_held, 0, act);
            }
            for (int i = 0; i < H; i++) {
                double d = 0;
                for (int c = 0; c < Im; c++) d += act[c] * dn.ref[((size_t)e * H + i) * Im + c];
                esum[t * H + i] += wk * d;
            }
        }
        /* out = rmsnorm(dense) * qn1 + rmsnorm(sum) * qn2 */
        double es = 0;
        for (int i = 0; i < H; i++) es += esum[t * H + i] * esum[t * H + i];
        const double einv = 1 / sqrt(es / H + eps);
        ref_rms_row(dense + (size_t)t * H, qn1, H, eps, tmp);
        for (int i = 0; i < H; i++) ref[t * H + i] = tmp[i] + esum[t * H + i] * einv * qn2[i];
    }
    float *dr = devf(mlp == 2 ? NULL : r, nh), *ddense = devf(mlp ? NULL : dense, nh);
    float *dout = (n & 1) ? ddense : devf(NULL, nh); /* in place for odd n */
    float *dh = devf(h, nh), *dop = devf(o, nh), *drw = devf(rw, (size_t)H), *dpn1 = devf(pn1, (size_t)H);
    float *dg = devf(NULL, (size_t)n * Id), *dup = devf(NULL, (size_t)n * Id);
    float *drs = devf(rscale, (size_t)H), *dpes = devf(pes, (size_t)E), *dpn2 = devf(pn2, (size_t)H);
    float *dqn1 = devf(qn1, (size_t)H), *dqn2 = devf(qn2, (size_t)H);
    g4_moe_args a = {.residual = dr, .dense = ddense, .out = dout, .n = n, .hidden = H, .n_experts = E, .top_k = TK,
                     .expert_dim = Im, .eps = eps, .pre_norm2 = dpn2, .post_norm1 = dqn1, .post_norm2 = dqn2,
                     .router_proj = &router.dev, .router_scale = drs, .per_expert_scale = dpes, .gate_up = &gu.dev,
                     .up = split ? &up.dev : NULL, .down = &dn.dev};
    if (mlp) {
        g4_matmul_set gset = {2, {&mg.dev, &mu.dev}, {NULL, NULL}, {dg, dup}, .norm = dpn1, .eps = eps, .geglu = 1};
        if (mlp == 2) gset.res_h = dh, gset.res_o = dop, gset.res_w = drw, gset.res_scale = 0.75f, gset.res_out = dr;
        a.mlp = gset, a.mlp_down = &md.dev;
    }
    be->ops->moe(be, &a);
    back(out, dout, nh * sizeof(float));
    /* (16-bit and f32 experts: f32 activations on every backend, CUDA's tensor-core products as hi + lo parts) */
    const int q_exp = g4_dtype_is_quantized(gt) || g4_dtype_is_quantized(dt);
    EXPECT_CLOSE(out, ref, nh, 2e-5 * (q_exp ? backend_tol() : 1.0),
                 "moe n=%d router %s, gate/up %s%s, down %s, top %d of %d%s%s",
                 n, g4_dtype_name(rt), g4_dtype_name(gt), split ? " (split)" : "", g4_dtype_name(dt), TK, E,
                 ties ? " (ties)" : "", mlp == 1 ? ", dense MLP in the op" : mlp == 2 ? ", MLP and residual in the op" : "");
    if (mlp == 2) { /* the residual the op made */
        float *got = malloc(nh * sizeof(float));
        double *rr = malloc(nh * sizeof(double));
        back(got, dr, nh * sizeof(float));
        for (size_t k = 0; k < nh; k++) rr[k] = r[k];
        EXPECT_CLOSE(got, rr, nh, 1e-5, "moe n=%d: the residual of the prologue", n);
        free(got), free(rr);
    }
    if (mlp) weight_free(&mg), weight_free(&mu), weight_free(&md);
    rel(dh), rel(dop), rel(drw), rel(dpn1), rel(dg), rel(dup);
    free(h), free(o), free(rw), free(pn1);
    rel(dr), rel(ddense), rel(drs), rel(dpes), rel(dpn2), rel(dqn1), rel(dqn2);
    if (dout != ddense) rel(dout);
    weight_free(&router), weight_free(&gu), weight_free(&dn);
    if (split) weight_free(&up);
    free(r), free(dense), free(x2), free(rscale), free(out), free(pn2), free(qn1), free(qn2);
    free(ref), free(esum), free(z), free(xg), free(act), free(tmp), free(actf);
}

static void moe_case(int n, int H, int Im, g4_dtype rt, g4_dtype gt, int split, g4_dtype dt) {
    moe_case_e(n, H, Im, rt, gt, split, dt, 6, 2, 0, 0);
}

static void test_moe(void) {
    for (int n = 1; n <= 13; n += n == 1 ? 4 : 8) /* one token (decode), both sides of the small-step paths */
        for (size_t di = 0; di < 3; di++) moe_case(n, 24, 10, dtypes[di], dtypes[di], 0, dtypes[di]);
    moe_case(5, 24, 10, G4_BF16, G4_BF16, 1, G4_F16); /* gate and up apart */
    moe_case(1, 64, 96, G4_BF16, G4_BF16, 1, G4_BF16);
    /* quantized experts (routers stay F32 in GGUF files: a rounded router could pick other experts) */
    static const struct {
        int n, H, Im;
        g4_dtype rt, gt;
        int split;
        g4_dtype dt;
    } qc[] = {{5, 64, 32, G4_F32, G4_Q8_0, 0, G4_Q4_1},   {5, 64, 32, G4_F32, G4_Q4_0, 1, G4_MLX4},
              {5, 64, 64, G4_MLX8, G4_MLX4, 1, G4_Q5_0},  {5, 256, 256, G4_F32, G4_Q4_K, 1, G4_Q6_K},
              {13, 64, 64, G4_MLX8, G4_MLX8, 0, G4_MLX4}, {13, 256, 256, G4_F32, G4_Q6_K, 0, G4_Q4_K},
              {1, 256, 256, G4_F32, G4_MLX4, 0, G4_Q6_K}, {1, 256, 256, G4_F32, G4_Q4_K, 1, G4_MLX8},
              /* one token with Q8_0 / Q4_0 experts: not on the CPU (x_as_read does not model its one-token path) */
              {1, 64, 32, G4_F32, G4_Q8_0, 0, G4_Q4_0},   {1, 256, 256, G4_Q8_0, G4_Q4_0, 1, G4_Q8_0},
              /* the 5-bit and IQ4 types on CUDA's int8 tensor-core experts (13 tokens) and its GEMV (1), Q5_1 / Q4_1
               * held as Q8_0 (test_transcoded_weights); a Q4_K_M file's experts (26B-A4B: Q4_K gate/up, Q5_0 down of
               * 704 = 22 blocks of 32, here 3) */
              {13, 256, 256, G4_F32, G4_Q5_K, 0, G4_Q5_0}, {5, 256, 64, G4_F32, G4_Q5_1, 1, G4_Q4_1},
              {13, 256, 96, G4_F32, G4_Q4_K, 1, G4_Q5_0},  {1, 256, 96, G4_F32, G4_Q4_K, 0, G4_Q5_0},
              {13, 256, 256, G4_F32, G4_IQ4_XS, 0, G4_IQ4_NL}, {1, 256, 96, G4_F32, G4_IQ4_XS, 1, G4_IQ4_NL},
              {1, 256, 256, G4_F32, G4_Q5_K, 1, G4_Q5_K},
              /* Q2_K experts (CUDA: bf16 tiles for 13 tokens, the int8 GEMV's dot32m for one) */
              {13, 256, 256, G4_F32, G4_Q2_K, 1, G4_Q2_K}, {1, 256, 256, G4_F32, G4_Q2_K, 0, G4_Q2_K},
              /* codebook and FP4 experts held as CB4 / MXF4 (CUDA: its int8 tensor-core experts, its GEMV), as CB4_16
               * (a scale per 16: CUDA's bf16 tiles, its GEMV), MXFP4 down rows of 96 (no whole CB4 blocks: MXF4) */
              {13, 256, 256, G4_F32, G4_IQ2_XXS, 0, G4_IQ3_XXS}, {1, 256, 256, G4_F32, G4_MXFP4, 1, G4_IQ3_S},
              {13, 256, 256, G4_F32, G4_IQ2_XS, 1, G4_IQ1_M}, {1, 256, 256, G4_F32, G4_NVFP4, 0, G4_IQ2_S},
              {13, 256, 96, G4_F32, G4_MXFP4, 0, G4_MXFP4}};
    /* (CUDA reads split gate and up of one type and MLX group, as files have them: not this test's MLX weights,
     * whose groups take turns.) Each case draws from its own seed: which cases ran before it on a backend does not
     * move its inputs (CUDA's n=13 Q6_K/Q4_K case measured 4.8e-3 to 7.0e-3 over 12 seeds, against its 8e-3) */
    for (size_t i = 0; takes_quantized && i < sizeof qc / sizeof qc[0]; i++)
        if (takes(qc[i].rt) && takes(qc[i].gt) && takes(qc[i].dt) && (qc[i].n > 1 || i < 8 || !be->ops->host_memory) &&
            (be->ops->host_memory || !qc[i].split || !g4_dtype_is_mlx(qc[i].gt))) {
            rng = 0x9e3779b97f4a7c15ull + 7919u * (unsigned)(i + 1);
            moe_case(qc[i].n, qc[i].H, qc[i].Im, qc[i].rt, qc[i].gt, qc[i].split, qc[i].dt);
        }
    /* experts over several lanes (CUDA: E / 32 a lane), top-k over several groups of 8 rows (the combine's loads);
     * then ties in every pick (CUDA's GEMV computes equal rows alike; the CPU's kernels need not: its row tiles) */
    for (int n = 1; n <= 5; n += 4) moe_case_e(n, 64, 96, G4_F32, G4_BF16, 0, G4_BF16, 40, 10, 0, 0);
    if (!strcmp(be->ops->name, "cuda"))
        for (int n = 1; n <= 5; n += 4) moe_case_e(n, 64, 96, G4_F32, G4_BF16, 1, G4_BF16, 64, 5, 1, 0);
    /* one token, eight experts of many rows (CUDA: a warp's lanes split over several rows of the experts) */
    if (takes_quantized && takes(G4_Q4_0) && !be->ops->host_memory) /* (CUDA only, as above) */
        moe_case_e(1, 576, 320, G4_F32, G4_Q4_0, 1, G4_Q4_0, 16, 8, 0, 0);
    /* the dense MLP in the op (CUDA: beside the experts up to 8 tokens), with and without the residual prologue */
    for (int mlp = 1; mlp <= 2; mlp++)
        for (int n = 1; n <= 9; n += 4) moe_case_e(n, 64, 96, G4_F32, G4_BF16, 0, G4_BF16, 8, 2, 0, mlp);
    if (takes_quantized && takes(G4_Q4_0) && takes(G4_Q8_0) && !be->ops->host_memory) /* (CUDA only, as above) */
        moe_case_e(1, 256, 256, G4_F32, G4_Q4_0, 1, G4_Q8_0, 8, 2, 0, 2);
    /* many tokens a few experts: token counts of several multiples of 16 (CUDA: the experts' tensor-core kernels up
     * to 192 tokens, then a batched cuBLAS product per count) */
    moe_case_e(40, 64, 96, G4_F32, G4_BF16, 0, G4_BF16, 6, 2, 0, 0);
    moe_case_e(300, 64, 96, G4_F32, G4_BF16, 0, G4_BF16, 6, 2, 0, 0);
    /* CUDA's tensor-core experts: experts of more than 16 tokens (several passes), k of 72 and 40 (a step of 32 cut
     * short), 40 gate/up rows and 72 down rows (tiles cut short), gate and up apart */
    moe_case_e(100, 72, 40, G4_F32, G4_BF16, 1, G4_BF16, 4, 2, 0, 0);
    moe_case_e(17, 64, 96, G4_F32, G4_BF16, 0, G4_BF16, 64, 5, 1, 0);
    if (takes_quantized && takes(G4_Q4_0) && takes(G4_Q8_0) && !be->ops->host_memory) /* (the CPU: as above) */
        moe_case_e(40, 64, 64, G4_F32, G4_Q4_0, 1, G4_Q8_0, 6, 2, 0, 0);
    /* CUDA's int8 tensor-core experts (Q4_0 / Q8_0, more than 8 tokens): experts of more than 32 pairs (several row
     * tiles), 320 gate/up rows (a partial tile of 128), k of 9 and 5 blocks of 32 (a partial stage of 4) */
    if (takes_quantized && takes(G4_Q4_0) && takes(G4_Q8_0) && !be->ops->host_memory) {
        moe_case_e(64, 288, 160, G4_F32, G4_Q8_0, 0, G4_Q4_0, 4, 2, 0, 0);
        moe_case_e(24, 288, 160, G4_F32, G4_Q4_0, 0, G4_Q4_0, 4, 3, 0, 1);
    }
    if (takes_quantized && takes(G4_Q4_K) && takes(G4_Q6_K) && !be->ops->host_memory) { /* Q4_K (k of 256s); a Q6_K
                                                                                           * down: bf16 tiles beside */
        moe_case_e(40, 512, 256, G4_F32, G4_Q4_K, 0, G4_Q4_K, 4, 2, 0, 0);
        moe_case_e(24, 512, 256, G4_F32, G4_Q4_K, 1, G4_Q6_K, 4, 2, 0, 0);
        moe_case_e(24, 512, 256, G4_F32, G4_Q6_K, 0, G4_Q4_K, 5, 2, 0, 0); /* the tiles outlive gate/up's cuBLAS */
    }
}

/* ------------------------------------------------------------- tower ops */
/* attention_dense: bidirectional GQA over contiguous keys, optional bias (shared or per head) and key mask */
static void test_attention_dense_case(int nq, int nk, int H, int HKV, int D, int bias_heads, int mask) {
    const size_t qn = (size_t)nq * H * D, kn = (size_t)nk * HKV * D, bn = (size_t)(bias_heads ? bias_heads : 1) * nq * nk;
    float *q = malloc(qn * sizeof(float)), *k = malloc(kn * sizeof(float)), *v = malloc(kn * sizeof(float));
    float *bias = malloc(bn * sizeof(float)), *out = malloc(qn * sizeof(float));
    double *ref = malloc(qn * sizeof(double)), *s = malloc((size_t)nk * sizeof(double));
    int32_t *valid = malloc((size_t)nk * sizeof(int32_t));
    fill(q, qn, -2, 2), fill(k, kn, -2, 2), fill(v, kn, -1, 1), fill(bias, bn, -3, 3);
    for (int j = 0; j < nk; j++) valid[j] = (j % 3) != 1;
    if (bias_heads && nq > 1) /* a query that sees no key gets zeros */
        for (int h = 0; h < bias_heads; h++)
            for (int j = 0; j < nk; j++) bias[((size_t)h * nq + 1) * nk + j] = -INFINITY;
    const float scale = 0.7f;
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < H; h++) {
            const int hkv = h / (H / HKV);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < nk; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double)q[((size_t)i * H + h) * D + c] * k[((size_t)j * HKV + hkv) * D + c];
                d *= scale;
                if (bias_heads) d += bias[((size_t)(bias_heads > 1 ? h : 0) * nq + i) * nk + j];
                if (mask && !valid[j]) d = -INFINITY;
                s[j] = d;
                if (d > mx) mx = d;
            }
            for (int j = 0; j < nk; j++) sum += (s[j] = mx == -INFINITY ? 0 : exp(s[j] - mx));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int j = 0; j < nk; j++) o += s[j] / (sum > 0 ? sum : 1) * v[((size_t)j * HKV + hkv) * D + c];
                ref[((size_t)i * H + h) * D + c] = o;
            }
        }
    float *dq = devf(q, qn), *dk = devf(k, kn), *dv = devf(v, kn), *db = devf(bias, bn), *dout = devf(NULL, qn);
    int32_t *dvalid = dev(valid, (size_t)nk * sizeof(int32_t));
    g4_dense_attention_args a = {.q = dq, .k = dk, .v = dv, .out = dout, .n_q = nq, .n_k = nk, .n_heads = H,
                                 .n_kv_heads = HKV, .head_dim = D, .scale = scale, .key_valid = mask ? dvalid : NULL,
                                 .bias = bias_heads ? db : NULL, .bias_heads = bias_heads};
    be->ops->attention_dense(be, &a);
    back(out, dout, qn * sizeof(float));
    EXPECT_CLOSE(out, ref, qn, 2e-5 * backend_tol(), "attention_dense nq=%d nk=%d heads=%d/%d D=%d bias=%d mask=%d", nq,
                 nk, H, HKV, D, bias_heads, mask);
    rel(dq), rel(dk), rel(dv), rel(db), rel(dout), rel(dvalid);
    free(q), free(k), free(v), free(bias), free(out), free(ref), free(s), free(valid);
}

static void test_attention_dense(void) {
    test_attention_dense_case(70, 70, 4, 4, 16, 0, 0);    /* the fixture's vision tower */
    test_attention_dense_case(130, 133, 12, 12, 64, 0, 0); /* E4B heads, keys not a multiple of the tiles */
    test_attention_dense_case(67, 45, 16, 16, 72, 1, 1);   /* 31B heads, shared bias, masked keys */
    test_attention_dense_case(5, 9, 8, 2, 24, 8, 0);       /* GQA, a bias per head */
    test_attention_dense_case(3, 5, 1, 1, 16, 1, 0);       /* a query without keys */
}

/* clamp, shift_scale_cols and gather_sum: exact in f32 (one rounding, or sums in the listed order) */
static void test_tower_elementwise(void) {
    const int rows = 7, cols = 13;
    const size_t n = (size_t)rows * cols;
    float x[7 * 13], sh[13], sc[13], y[7 * 13];
    double ref[7 * 13];
    fill(x, n, -4, 4), fill(sh, (size_t)cols, -1, 1), fill(sc, (size_t)cols, -2, 2);
    float *dx = devf(x, n), *dy = devf(NULL, n), *dsh = devf(sh, (size_t)cols), *dsc = devf(sc, (size_t)cols);
    be->ops->clamp(be, dx, dy, n, -1.5f, 0.25f);
    back(y, dy, sizeof y);
    for (size_t i = 0; i < n; i++) ref[i] = fminf(fmaxf(x[i], -1.5f), 0.25f);
    EXPECT_CLOSE(y, ref, n, 0, "clamp");
    be->ops->clamp(be, dy, dy, n, 0.0f, INFINITY); /* in place, ReLU */
    back(y, dy, sizeof y);
    for (size_t i = 0; i < n; i++) ref[i] = ref[i] > 0 ? ref[i] : 0;
    EXPECT_CLOSE(y, ref, n, 0, "clamp (ReLU, in place)");
    be->ops->shift_scale_cols(be, dx, rows, cols, dsh, dsc);
    back(y, dx, sizeof y);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) ref[r * cols + c] = (float)(x[r * cols + c] + sh[c]) * sc[c];
    EXPECT_CLOSE(y, ref, n, 0, "shift_scale_cols");
    be->ops->shift_scale_cols(be, dx, rows, cols, NULL, dsc); /* scale only */
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) ref[r * cols + c] = (float)((float)ref[r * cols + c] * sc[c]);
    back(y, dx, sizeof y);
    EXPECT_CLOSE(y, ref, n, 0, "shift_scale_cols (scale only)");
    /* gather_sum: 3 outputs of 2 rows each, in the listed order */
    const int32_t idx[6] = {4, 0, 6, 6, 2, 3};
    int32_t *didx = dev(idx, sizeof idx);
    be->ops->to_device(be, dx, x, sizeof x);
    be->ops->gather_sum(be, dx, didx, 3, 2, cols, 0.5f, dy);
    back(y, dy, 3 * (size_t)cols * sizeof(float));
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < cols; c++)
            ref[i * cols + c] = (float)(x[idx[2 * i] * cols + c] * 0.5f) + (float)(x[idx[2 * i + 1] * cols + c] * 0.5f);
    EXPECT_CLOSE(y, ref, 3 * (size_t)cols, 1e-7, "gather_sum");
    rel(dx), rel(dy), rel(dsh), rel(dsc), rel(didx);
}

/* The audio tower's ops (backend.h, "ops of the towers"): sigmoid_mul, im2col, conv1d_causal_dw and
 * local_attention against double references, on odd sizes (head sizes and channels not multiples of 4, windows
 * longer than the sequence, one key). */
static void test_audio_tower_ops(void) {
    /* sigmoid_mul: a * sigmoid(b), out of place and in place (SiLU: a == b) */
    const size_t n = 1003;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    fill(a, n, -6, 6), fill(b, n, -9, 9);
    float *da = devf(a, n), *db = devf(b, n), *dy = devf(NULL, n);
    for (size_t i = 0; i < n; i++) ref[i] = a[i] / (1.0 + exp(-(double)b[i]));
    be->ops->sigmoid_mul(be, da, db, n, dy);
    back(y, dy, n * sizeof(float));
    EXPECT_CLOSE(y, ref, n, 1e-6 * backend_tol(), "sigmoid_mul n=%zu", n);
    for (size_t i = 0; i < n; i++) ref[i] = a[i] / (1.0 + exp(-(double)a[i]));
    be->ops->sigmoid_mul(be, da, da, n, da);
    back(y, da, n * sizeof(float));
    EXPECT_CLOSE(y, ref, n, 1e-6 * backend_tol(), "sigmoid_mul in place (SiLU) n=%zu", n);
    rel(da), rel(db), rel(dy);
    free(a), free(b), free(y), free(ref);

    /* im2col: exact copies (zeros outside), several geometries, part of the output rows */
    static const int geo[][8] = {/* h, w, c, kh, kw, stride, pad, row0 */
                                 {9, 7, 3, 3, 3, 2, 1, 0}, {9, 7, 3, 3, 3, 2, 1, 2}, {5, 11, 1, 3, 3, 2, 1, 1},
                                 {4, 4, 5, 2, 3, 1, 0, 0}, {1, 1, 2, 3, 3, 2, 1, 0}, {6, 5, 130, 3, 3, 2, 1, 1}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        const int h = geo[gi][0], w = geo[gi][1], c = geo[gi][2], kh = geo[gi][3], kw = geo[gi][4];
        const int st = geo[gi][5], pad = geo[gi][6], row0 = geo[gi][7];
        const int oh = (h + 2 * pad - kh) / st + 1, ow = (w + 2 * pad - kw) / st + 1, nrows = oh - row0;
        const size_t xn = (size_t)h * w * c, cols = (size_t)c * kh * kw, on = (size_t)nrows * ow * cols;
        float *x = malloc(xn * sizeof(float)), *out = malloc(on * sizeof(float));
        double *r = malloc(on * sizeof(double));
        fill(x, xn, -1, 1);
        for (int oy = row0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int ch = 0; ch < c; ch++)
                    for (int i = 0; i < kh; i++)
                        for (int j = 0; j < kw; j++) {
                            const int iy = oy * st - pad + i, ix = ox * st - pad + j;
                            r[((size_t)(oy - row0) * ow + ox) * cols + ((size_t)ch * kh + i) * kw + j] =
                                iy >= 0 && iy < h && ix >= 0 && ix < w ? x[((size_t)iy * w + ix) * c + ch] : 0.0;
                        }
        float *dx = devf(x, xn), *dout = devf(NULL, on);
        be->ops->im2col(be, dx, h, w, c, kh, kw, st, pad, row0, nrows, dout);
        back(out, dout, on * sizeof(float));
        EXPECT_CLOSE(out, r, on, 0, "im2col h=%d w=%d c=%d k=%dx%d stride=%d pad=%d rows %d..%d", h, w, c, kh, kw, st,
                     pad, row0, oh - 1);
        rel(dx), rel(dout);
        free(x), free(out), free(r);
    }

    /* conv1d_causal_dw: y[t, ch] = sum_j w[ch, j] x[t - k + 1 + j, ch] */
    static const int cv[][3] = {{17, 6, 5}, {3, 18, 5}, {40, 4, 2}, {9, 1024, 5}, {5, 7, 1}, {2, 9, 8}};
    for (size_t ci = 0; ci < sizeof cv / sizeof cv[0]; ci++) {
        const int T = cv[ci][0], C = cv[ci][1], K = cv[ci][2];
        const size_t xn = (size_t)T * C;
        float *x = malloc(xn * sizeof(float)), *w = malloc((size_t)C * K * sizeof(float)), *out = malloc(xn * sizeof(float));
        double *r = malloc(xn * sizeof(double));
        fill(x, xn, -2, 2), fill(w, (size_t)C * K, -1, 1);
        for (int t = 0; t < T; t++)
            for (int ch = 0; ch < C; ch++) {
                double acc = 0;
                for (int j = 0; j < K; j++)
                    if (t - K + 1 + j >= 0) acc += (double)w[(size_t)ch * K + j] * x[(size_t)(t - K + 1 + j) * C + ch];
                r[(size_t)t * C + ch] = acc;
            }
        float *dx = devf(x, xn), *dw = devf(w, (size_t)C * K), *dout = devf(NULL, xn);
        be->ops->conv1d_causal_dw(be, dx, dw, T, C, K, dout);
        back(out, dout, xn * sizeof(float));
        EXPECT_CLOSE(out, r, xn, 1e-6 * backend_tol(), "conv1d_causal_dw n=%d c=%d k=%d", T, C, K);
        rel(dx), rel(dw), rel(dout);
        free(x), free(w), free(out), free(r);
    }

    /* local_attention: token t, head h over the keys t - d, d < min(window, t + 1), with the relative key of d,
     * a cap on the logits, q and k scales and an optional per-dimension q scale */
    static const int la[][5] = {/* n, heads, head_dim, window, per-dim scale */
                                {30, 4, 16, 12, 1}, {25, 3, 6, 12, 1}, {7, 1, 4, 10, 0}, {1, 2, 8, 12, 1},
                                {40, 8, 128, 13, 1}, {19, 2, 5, 1, 0}};
    for (size_t li = 0; li < sizeof la / sizeof la[0]; li++) {
        const int N = la[li][0], H = la[li][1], D = la[li][2], W = la[li][3], pd = la[li][4];
        const size_t row = (size_t)H * D, qn = (size_t)N * row, rn = (size_t)W * row;
        float *q = malloc(qn * sizeof(float)), *k = malloc(qn * sizeof(float)), *v = malloc(qn * sizeof(float));
        float *rk = malloc(rn * sizeof(float)), *dsc = malloc((size_t)D * sizeof(float)), *out = malloc(qn * sizeof(float));
        double *r = malloc(qn * sizeof(double)), *sc = malloc((size_t)W * sizeof(double));
        fill(q, qn, -2, 2), fill(k, qn, -2, 2), fill(v, qn, -1, 1), fill(rk, rn, -1, 1), fill(dsc, (size_t)D, 0.2f, 1.5f);
        const float qs = 0.6f, ks = 1.3f, cap = 7.0f;
        for (int t = 0; t < N; t++)
            for (int h = 0; h < H; h++) {
                const int nk = t + 1 < W ? t + 1 : W;
                double mx = -INFINITY, sum = 0;
                for (int d = 0; d < nk; d++) {
                    double sk = 0, sr = 0;
                    for (int e = 0; e < D; e++) {
                        const double qe = (double)q[(size_t)t * row + (size_t)h * D + e] * qs * (pd ? dsc[e] : 1.0f);
                        sk += qe * k[(size_t)(t - d) * row + (size_t)h * D + e];
                        sr += qe * rk[(size_t)d * row + (size_t)h * D + e];
                    }
                    sc[d] = cap * tanh((sk * ks + sr) / cap);
                    if (sc[d] > mx) mx = sc[d];
                }
                for (int d = 0; d < nk; d++) sum += (sc[d] = exp(sc[d] - mx));
                for (int e = 0; e < D; e++) {
                    double o = 0;
                    for (int d = 0; d < nk; d++) o += sc[d] / sum * v[(size_t)(t - d) * row + (size_t)h * D + e];
                    r[(size_t)t * row + (size_t)h * D + e] = o;
                }
            }
        float *dq = devf(q, qn), *dk = devf(k, qn), *dv = devf(v, qn), *drk = devf(rk, rn);
        float *dd = devf(dsc, (size_t)D), *dout = devf(NULL, qn);
        g4_local_attention_args args = {.q = dq, .k = dk, .v = dv, .rel = drk, .q_dim_scale = pd ? dd : NULL,
                                        .out = dout, .n = N, .heads = H, .head_dim = D, .window = W, .q_scale = qs,
                                        .k_scale = ks, .logit_cap = cap};
        be->ops->local_attention(be, &args);
        back(out, dout, qn * sizeof(float));
        EXPECT_CLOSE(out, r, qn, 2e-6 * backend_tol(), "local_attention n=%d heads=%d D=%d window=%d dim scale=%d", N,
                     H, D, W, pd);
        rel(dq), rel(dk), rel(dv), rel(drk), rel(dd), rel(dout);
        free(q), free(k), free(v), free(rk), free(dsc), free(out), free(r), free(sc);
    }
}

/* The CPU's SIMD exp and gelu kernels (of the instruction set under test) over their whole range. */
static void test_cpu_kernels(void) {
    const g4_cpu_kernels *k = g4_cpu_kernels_get();
    enum { N = 2001 };
    static float x[N], y[N], u[N];
    for (int i = 0; i < N; i++) x[i] = -100.0f + 100.0f * i / (N - 1); /* -100 .. 0, past the underflow */
    x[3] = -INFINITY;
    memcpy(y, x, sizeof x);
    float sum = k->exp_sum(y, N, 0.0f);
    double worst = 0, want_sum = 0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)x[i]);
        want_sum += want;
        double e = want > 1e-30 ? fabs(y[i] - want) / want : fabs(y[i] - want);
        if (!(e <= worst)) worst = e;
    }
    CHECKF(worst < 4e-7 && y[3] == 0.0f, "%s: exp_sum: max relative error %g", be_label, worst);
    CHECKF(fabs(sum - want_sum) / want_sum < 1e-6, "%s: exp_sum: sum %g, want %g", be_label, sum, want_sum);
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * i / (N - 1);
        u[i] = 0.5f + (float)(i % 7);
    }
    k->gelu_mul(x, u, y, N);
    worst = 0;
    for (int i = 0; i < N; i++) {
        double want = gelu_tanh_ref(x[i]) * u[i], e = fabs(y[i] - want) / (1.0 + fabs(want));
        if (!(e <= worst)) worst = e;
    }
    CHECKF(worst < 1e-6, "%s: gelu_mul kernel: max error %g", be_label, worst);
    k->gelu_mul(x, NULL, x, N); /* without u, in place: the ends are 0 and x */
    CHECK(isfinite(x[0]) && x[0] > -1e-6f && fabsf(x[N - 1] - 12.0f) < 1e-5f);
    /* pv: o += p * V for 1..4 heads, against a double sum (d with a tail past the vectors) */
    {
        enum { NV = 37, D = 83, LDV = 90 };
        static float p[4 * NV], v[NV * LDV], o[4 * D];
        for (int i = 0; i < 4 * NV; i++) p[i] = uniform(0, 1);
        for (int i = 0; i < NV * LDV; i++) v[i] = uniform(-2, 2);
        for (int no = 1; no <= 4; no++) {
            for (int i = 0; i < 4 * D; i++) o[i] = 0.25f * (float)(i % 5);
            k->pv(o, D, no, p, NV, v, LDV, NV, D);
            double err = 0;
            for (int h = 0; h < 4; h++)
                for (int c = 0; c < D; c++) {
                    double want = 0.25 * ((h * D + c) % 5);
                    if (h < no)
                        for (int i = 0; i < NV; i++) want += (double)p[h * NV + i] * v[i * LDV + c];
                    double e = fabs(o[h * D + c] - want);
                    if (!(e <= err)) err = e;
                }
            CHECKF(err < 2e-5, "%s: pv kernel, %d heads: max error %g", be_label, no, err);
        }
    }
    /* softcap c * tanh(y / c): relative error over the whole range (tiny values, both branches of the tanh,
     * its saturation, infinities) */
    for (int i = 0; i < N; i++) {
        float t = (float)(i - N / 2) / (N / 2); /* -1 .. 1 */
        x[i] = t * t * t * 40.0f;
    }
    x[1] = 1e-30f, x[2] = -3e-8f, x[4] = 1e4f, x[5] = -INFINITY, x[6] = INFINITY, x[7] = NAN, x[N - 1] = -NAN;
    memcpy(y, x, sizeof x);
    k->softcap(y, N, 3.0f);
    /* a NaN stays NaN, as tanh keeps it (transformers' logits are NaN there): not a finite +-c */
    CHECKF(isnan(y[7]) && isnan(y[N - 1]), "%s: softcap kernel: NaN became %g, %g", be_label, y[7], y[N - 1]);
    worst = 0;
    for (int i = 0; i < N; i++) {
        if (isnan(x[i])) continue;
        double want = 3.0 * tanh((double)x[i] / 3.0), e = want != 0 ? fabs(y[i] - want) / fabs(want) : fabs(y[i]);
        if (!(e <= worst)) worst = e;
    }
    CHECKF(worst < 3e-7, "%s: softcap kernel: max relative error %g", be_label, worst);
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
    /* a large copy (the CPU's runs on its threads: whole 1 MiB chunks and an odd tail) */
    {
        const size_t n = ((size_t)9 << 18) + 3;
        float *h = malloc(n * sizeof *h), *got = malloc(n * sizeof *got);
        CHECK(h && got);
        if (h && got) {
            for (size_t i = 0; i < n; i++) h[i] = (float)i;
            float *s1 = devf(h, n), *s2 = devf(NULL, n);
            be->ops->copy(be, s2, s1, n * sizeof(float));
            back(got, s2, n * sizeof(float));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) bad += got[i] != h[i];
            CHECKF(bad == 0, "%s: copy of %zu bytes: %zu floats differ", be_label, n * sizeof(float), bad);
            rel(s1), rel(s2);
        }
        free(h);
        free(got);
    }
    /* what memory the backend has: a device's free memory falls by what is allocated in it */
    size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0;
    CHECKF(be->ops->memory && be->ops->memory(be, &f0, &t0) == 0 && t0 > 0 && f0 <= t0, "%s: memory %zu of %zu",
           be_label, f0, t0);
    if (!be->ops->host_memory && f0 > ((size_t)256 << 20)) {
        void *big = be->ops->alloc(be, (size_t)64 << 20);
        CHECKF(big && be->ops->memory(be, &f1, &t1) == 0 && t1 == t0 && f1 + ((size_t)64 << 20) <= f0,
               "%s: free memory %zu before 64 MiB were allocated, %zu after", be_label, f0, f1);
        be->ops->release(be, big);
    }
    g4_error err;
    CHECKF(be->ops->check(be, &err) == 0, "%s: check after the ops: %s", be_label, err.msg);
}

static void probe_quantized(void) {
    memset(qtaken, 0, sizeof qtaken);
    memset(qheld, 0, sizeof qheld);
    takes_quantized = 0;
    for (size_t i = 0; i < N_QTYPES; i++) takes_quantized |= takes(qtypes[i]);
}


/* ------------------------------------------------------------- recorded steps */
/* A decode layer's chain of one-token ops (q product with its norm, attention, o product, the gate/up pair with
 * the residual prologue, down product) run as a step through graph_begin / graph_end six times with new inputs
 * each time: eagerly, recorded, then replayed (CUDA: a graph of kernels that start before their predecessors end,
 * programmatic dependent launch), so that every replay must read what the op before it wrote in that replay; each
 * run against the reference. */
static void test_recorded_chain(void) {
    enum { H = 320, NH = 4, KV = 1, D = 64, I = 192, LEN = 45, B = 16, RUNS = 6 };
    const int max_blocks = (LEN + B - 1) / B, row = KV * D;
    const float eps = 1e-6f, scale = 0.125f;
    weight wq, wo, wg, wu, wd;
    weight_make(&wq, G4_BF16, 2, (int64_t[]){NH * D, H}, 0.1f);
    weight_make(&wo, G4_BF16, 2, (int64_t[]){H, NH * D}, 0.1f);
    weight_make(&wg, G4_BF16, 2, (int64_t[]){I, H}, 0.1f);
    weight_make(&wu, G4_BF16, 2, (int64_t[]){I, H}, 0.1f);
    weight_make(&wd, G4_BF16, 2, (int64_t[]){H, I}, 0.1f);
    float nq[H], n2[H], rw[H];
    fill(nq, H, 0.5f, 1.5f), fill(n2, H, 0.5f, 1.5f), fill(rw, H, 0.5f, 1.5f);
    /* the cache: LEN keys and values in f32, blocks in reverse order */
    int32_t table[8], slots[LEN], seq = 0, pos = LEN - 1;
    for (int b = 0; b < max_blocks; b++) table[b] = max_blocks - 1 - b;
    for (int j = 0; j < LEN; j++) slots[j] = table[j / B] * B + j % B;
    float *kin = malloc((size_t)LEN * row * sizeof(float)), *vin = malloc((size_t)LEN * row * sizeof(float));
    fill(kin, (size_t)LEN * row, -1, 1), fill(vin, (size_t)LEN * row, -1, 1);
    const size_t cache = (size_t)max_blocks * B * row * sizeof(float);
    void *dk = dev(NULL, cache), *dv = dev(NULL, cache);
    float *dkin = devf(kin, (size_t)LEN * row), *dvin = devf(vin, (size_t)LEN * row);
    int32_t *dslots = dev(slots, sizeof slots), *dtable = dev(table, (size_t)max_blocks * 4);
    int32_t *dseq = dev(&seq, 4), *dpos = dev(&pos, 4);
    be->ops->kv_store(be, dkin, dvin, LEN, row, dslots, dk, dv, G4_KV_F32);
    float *dnq = devf(nq, H), *dn2 = devf(n2, H), *drw = devf(rw, H);
    float *dx = devf(NULL, H), *dh = devf(NULL, H), *dq = devf(NULL, NH * D), *datt = devf(NULL, NH * D);
    float *dout = devf(NULL, H), *dh2 = devf(NULL, H), *dg = devf(NULL, I), *dup = devf(NULL, I), *dy = devf(NULL, H);
    static const char owner; /* the recording's owner */
    for (int run = 0; run < RUNS; run++) {
        float x[H], h[H];
        fill(x, H, -2, 2), fill(h, H, -2, 2);
        be->ops->to_device(be, dx, x, sizeof x);
        be->ops->to_device(be, dh, h, sizeof h);
        if (!be->ops->graph_begin || !be->ops->graph_begin(be, &owner, 1)) {
            g4_matmul_set qs = {.count = 1, .w = {&wq.dev}, .y = {dq}, .norm = dnq, .eps = eps};
            be->ops->matmul_set(be, dx, 1, &qs);
            g4_attention_args a = {.q = dq, .out = datt, .n_tokens = 1, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
                                   .seq = dseq, .pos = dpos, .k = dk, .v = dv, .kv_type = G4_KV_F32,
                                   .block_table = dtable, .max_blocks = max_blocks, .block_size = B, .max_keys = LEN,
                                   .scale = scale};
            be->ops->attention(be, &a);
            be->ops->matmul(be, datt, 1, &wo.dev, NULL, dout);
            g4_matmul_set gu = {.count = 2, .w = {&wg.dev, &wu.dev}, .y = {dg, dup}, .norm = dn2, .eps = eps, .geglu = 1,
                                .res_h = dh, .res_o = dout, .res_w = drw, .res_scale = 1.0f, .res_out = dh2};
            be->ops->matmul_set(be, dh2, 1, &gu);
            be->ops->matmul(be, dg, 1, &wd.dev, NULL, dy);
            if (be->ops->graph_end) be->ops->graph_end(be);
        }
        float y[H], h2[H];
        back(y, dy, sizeof y);
        back(h2, dh2, sizeof h2);
        /* reference (the products' inputs rounded to f32, as a backend stages them) */
        double xn[H], q[NH * D], att[NH * D], o[H], h2r[H], g[I], up[I], yr[H], t[H];
        float f[H];
        ref_rms_row(x, nq, H, eps, xn);
        for (int i = 0; i < H; i++) f[i] = (float)xn[i];
        ref_matmul(f, 1, &wq, NULL, q);
        for (int hd = 0; hd < NH; hd++) {
            double sc[LEN], mx = -DBL_MAX, sum = 0;
            for (int j = 0; j < LEN; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += q[hd * D + i] * kin[(size_t)j * row + i];
                sc[j] = d * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j < LEN; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < D; i++) {
                double v = 0;
                for (int j = 0; j < LEN; j++) v += sc[j] / sum * vin[(size_t)j * row + i];
                att[hd * D + i] = v;
            }
        }
        for (int i = 0; i < NH * D; i++) f[i] = (float)att[i];
        ref_matmul(f, 1, &wo, NULL, o);
        for (int i = 0; i < H; i++) f[i] = (float)o[i];
        ref_rms_row(f, rw, H, eps, t);
        for (int i = 0; i < H; i++) h2r[i] = h[i] + t[i], f[i] = (float)h2r[i];
        ref_rms_row(f, n2, H, eps, t);
        for (int i = 0; i < H; i++) f[i] = (float)t[i];
        ref_matmul(f, 1, &wg, NULL, g);
        ref_matmul(f, 1, &wu, NULL, up);
        float gf[I];
        for (int r = 0; r < I; r++) gf[r] = (float)(gelu_tanh_ref(g[r]) * up[r]);
        ref_matmul(gf, 1, &wd, NULL, yr);
        EXPECT_CLOSE(h2, h2r, H, 1e-5 * backend_tol(), "recorded step run %d: the residual stream", run);
        EXPECT_CLOSE(y, yr, H, 1e-5 * sqrt(H) * backend_tol(), "recorded step run %d: the last product", run);
    }
    if (be->ops->graph_forget) be->ops->graph_forget(be, &owner);
    rel(dk), rel(dv), rel(dkin), rel(dvin), rel(dslots), rel(dtable), rel(dseq), rel(dpos), rel(dnq), rel(dn2), rel(drw);
    rel(dx), rel(dh), rel(dq), rel(datt), rel(dout), rel(dh2), rel(dg), rel(dup), rel(dy);
    weight_free(&wq), weight_free(&wo), weight_free(&wg), weight_free(&wu), weight_free(&wd);
    free(kin), free(vin);
}

/* G4_OP_TESTS=name,name: only those test functions (e.g. test_audio_tower_ops under compute-sanitizer) */
static int op_test_wanted(const char *name) {
    const char *want = getenv("G4_OP_TESTS");
    if (!want || !*want) return 1;
    const size_t n = strlen(name);
    for (const char *p = strstr(want, name); p; p = strstr(p + 1, name))
        if ((p == want || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}
#define RUN_OP_TEST(f) (op_test_wanted(#f) ? f() : (void)0)

static void run_all(void) {
    probe_quantized();
    RUN_OP_TEST(test_memory);
    RUN_OP_TEST(test_embed);
    RUN_OP_TEST(test_matmul);
    RUN_OP_TEST(test_transcoded_weights);
    RUN_OP_TEST(test_matmul_set);
    RUN_OP_TEST(test_matmul_set_fused);
    RUN_OP_TEST(test_norms);
    RUN_OP_TEST(test_layernorm_offset);
    RUN_OP_TEST(test_rope);
    RUN_OP_TEST(test_elementwise);
    RUN_OP_TEST(test_rows_transpose_argmax);
    RUN_OP_TEST(test_top_k);
    RUN_OP_TEST(test_masked_logits);
    RUN_OP_TEST(test_attention);
    RUN_OP_TEST(test_attn_prep);
    RUN_OP_TEST(test_attention_prep);
    RUN_OP_TEST(test_moe);
    RUN_OP_TEST(test_attention_dense);
    RUN_OP_TEST(test_tower_elementwise);
    RUN_OP_TEST(test_audio_tower_ops);
    RUN_OP_TEST(test_recorded_chain);
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
    be = g4_backend_new("cpu", getenv("G4_TEST_THREADS") ? atoi(getenv("G4_TEST_THREADS")) : 2, 0, &err);
    CHECKF(be != NULL, "cpu backend: %s", err.msg);
    if (be) {
        run_all();
        test_cpu_kernels();
        g4_backend_free(be);
    }
    /* the same CPU with bf16 activations */
    static char label2[80] = "";
    be = g4_backend_new("cpu", getenv("G4_TEST_THREADS") ? atoi(getenv("G4_TEST_THREADS")) : 2, 1, &err);
    CHECKF(be != NULL, "cpu backend (bf16 activations): %s", err.msg);
    if (be) {
        snprintf(label2, sizeof label2, ", cpu/%s bf16-act%s", isa, g4_cpu_kernels_get()->bf16x_tile ? " (vdpbf16ps)" : "");
        be_label = label2 + 2;
        be_bf16_act = 1;
        test_matmul_bf16_act();
        be_bf16_act = 0;
        be_label = label;
        g4_backend_free(be);
    }
#ifdef G4_WITH_CUDA
    if (g4_cuda_available() && (!want || !strcmp(want, "avx512") || !strcmp(want, isa))) {
        be_label = "cuda";
        be = g4_backend_new("cuda", 0, 0, &err);
        CHECKF(be != NULL, "cuda backend: %s", err.msg);
        if (be) {
            run_all();
            g4_backend_free(be);
        }
    } else {
        fprintf(stderr, "cuda: no GPU here, not run\n");
    }
#endif
    fprintf(stderr, "backends tested: %s%s%s\n", label, label2,
#ifdef G4_WITH_CUDA
            g4_cuda_available() ? ", cuda" : ""
#else
            ""
#endif
    );
    return g4t_done();
}
