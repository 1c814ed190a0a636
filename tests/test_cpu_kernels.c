/* The CPU backend's matmul on every weight dtype and every instruction set this machine
 * has (scalar, AVX2, AVX-512, NEON), against the plain reference: weight rows decoded by
 * core/quant.c and double-precision dot products. Q8_0/Q4_0 run with int8 activations,
 * so their reference uses the activations as the reference quantizer rounds them.
 * Shapes include row counts that are not multiples of the 4-row tile, odd block counts,
 * token counts that are not multiples of the 4-token tile, and a bias. Also the vector
 * kernels (dot, bf16 conversion, axpy) and the MoE op with split gate/up weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "check.h"
#include "core/quant.h"

static unsigned rng = 7;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* extreme: weights whose codes sit at their type's largest magnitudes (each block one value apart from the rest:
 * 1 and -0.875, so that the offset types' and the affine types' rows reach their top codes on even or odd rows)
 * and activations all 1 (int8 127), so that every product of a lane has the same sign: the integer sums' bounds
 * (AVX2 sums a lane's 8 products in int16 for the types of small codes) */
static int extreme;

/* A weight tensor of `type` with random values (or extreme ones); MLX scales/biases in BF16. */
typedef struct {
    g4_tensor t;
    unsigned char *data;
    uint16_t *sc, *bi;
} weight;

static void make_weight(weight *w, g4_dtype type, int rows, int in) {
    memset(w, 0, sizeof *w);
    float *row = malloc((size_t)in * sizeof(float));
    size_t rb = g4_dtype_row_bytes(type, in);
    w->data = calloc((size_t)rows, rb + 1);
    int bits = g4_mlx_bits(type), group = 32;
    if (bits) {
        w->sc = malloc((size_t)rows * (size_t)(in / group) * 2);
        w->bi = malloc((size_t)rows * (size_t)(in / group) * 2);
    }
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < in; i++)
            row[i] = extreme ? ((i % 32 == 0) == (r % 2 == 0) ? 1.0f : -0.875f) : frand() * (1.0f + (float)(r % 3));
        if (bits)
            g4_mlx_quant_row(bits, group, row, in, w->data + (size_t)r * rb, w->sc + (size_t)r * (in / group),
                             w->bi + (size_t)r * (in / group), G4_BF16);
        else
            g4_quant(type, row, w->data + (size_t)r * rb, in);
    }
    w->t = (g4_tensor){.name = "w", .dtype = type, .ndim = 2, .shape = {rows, in}, .data = w->data,
                       .nbytes = rb * (size_t)rows, .scales = w->sc, .biases = w->bi, .scale_dtype = G4_BF16,
                       .group = group};
    free(row);
}

static void free_weight(weight *w) {
    free(w->data);
    free(w->sc);
    free(w->bi);
}

/* reference y = x W^T + bias in double, with x rounded as the int8 path rounds it when q8 */
static void reference(const g4_tensor *w, const float *x, int n, const float *bias, int q8, double *y, double *mag) {
    const int rows = (int)w->shape[0], in = (int)w->shape[1];
    float *wr = malloc((size_t)in * sizeof(float)), *xr = malloc((size_t)n * in * sizeof(float));
    memcpy(xr, x, (size_t)n * in * sizeof(float));
    if (q8) {
        size_t nb_pad = (size_t)(in / 32 + 1) & ~(size_t)1;
        g4_q8_rows a = {.in_pad = nb_pad * 32, .nb_pad = nb_pad};
        a.q = malloc((size_t)n * a.in_pad);
        a.d = malloc((size_t)n * nb_pad * sizeof(float));
        a.m = malloc((size_t)n * nb_pad * sizeof(float));
        g4_cpu_q8_quantize(x, (size_t)in, 0, n, &a);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < in; i++) xr[(size_t)t * in + i] = (float)a.q[(size_t)t * a.in_pad + i] * a.d[(size_t)t * nb_pad + i / 32];
        free(a.q);
        free(a.d);
        free(a.m);
    }
    for (int r = 0; r < rows; r++) {
        g4_dequant_row(w, r, wr);
        for (int t = 0; t < n; t++) {
            double s = bias ? bias[r] : 0, m = 0;
            for (int i = 0; i < in; i++) {
                s += (double)wr[i] * xr[(size_t)t * in + i];
                m += fabs((double)wr[i] * xr[(size_t)t * in + i]);
            }
            y[(size_t)t * rows + r] = s;
            mag[(size_t)t * rows + r] = m + 1e-6;
        }
    }
    free(wr);
    free(xr);
}

static void test_matmul(g4_backend *be, const char *isa) {
    static const g4_dtype types[] = {G4_F32, G4_F16, G4_BF16, G4_Q8_0, G4_Q4_0, G4_Q4_K,
                                     G4_Q5_K, G4_Q6_K, G4_Q3_K, G4_MLX4, G4_MLX8, G4_MLX3};
    static const int shapes[][2] = {{13, 96}, {8, 256}, {5, 512}};
    static const int ns[] = {1, 3, 6};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < 3; si++) {
            int rows = shapes[si][0], in = shapes[si][1];
            if (g4_dtype_block(types[ti]) == 256 && in % 256) continue;
            weight w;
            make_weight(&w, types[ti], rows, in);
            /* as the engine holds it: the CPU's upload makes MLX weights AF4 / AF8 (the others stay views) */
            g4_tensor held = w.t;
            g4_error err = {0};
            const int up = be->ops->upload_weight(be, &w.t, &held, &err) == 0;
            CHECKF(up && held.dtype == (g4_dtype_is_mlx(types[ti]) ? g4_af_type(types[ti]) : types[ti]),
                   "%s %s: held as %s", isa, g4_dtype_name(types[ti]), g4_dtype_name(held.dtype));
            for (size_t ni = 0; ni < 3 && up; ni++) {
                int n = ns[ni];
                float *x = malloc((size_t)n * in * sizeof(float)), *y = malloc((size_t)n * rows * sizeof(float));
                float *bias = malloc((size_t)rows * sizeof(float));
                double *ref = malloc((size_t)n * rows * sizeof(double)), *mag = malloc((size_t)n * rows * sizeof(double));
                for (int i = 0; i < n * in; i++) x[i] = extreme ? 1.0f : frand() * (i % 5 ? 1.0f : 4.0f);
                for (int i = 0; i < rows; i++) bias[i] = frand();
                const float *b = ni == 1 ? bias : NULL;
                be->ops->matmul(be, x, n, &held, b, y);
                int q8 = g4_cpu_q8_supported(&held);
                reference(&held, x, n, b, q8, ref, mag);
                double worst = 0;
                for (int i = 0; i < n * rows; i++) {
                    double e = fabs((double)y[i] - ref[i]) / mag[i];
                    if (!(e <= worst)) worst = e;
                }
                CHECKF(worst <= 2e-6, "%s %s [%d, %d] x %d tokens: error %g of sum|w*x|", isa,
                       g4_dtype_name(types[ti]), rows, in, n, worst);
                free(x);
                free(y);
                free(bias);
                free(ref);
                free(mag);
            }
            if (up) be->ops->release_weight(be, &held);
            free_weight(&w);
        }
}

static void test_vectors(const g4_cpu_kernels *k, const char *isa) {
    enum { N = 203 };
    float a[N], b[N], y1[N], y2[N];
    uint16_t h[N];
    for (int i = 0; i < N; i++) {
        a[i] = frand();
        b[i] = frand();
        h[i] = g4_f32_to_bf16(frand());
        y1[i] = y2[i] = frand();
    }
    double ref = 0, refh = 0, mag = 0;
    for (int i = 0; i < N; i++) {
        ref += (double)a[i] * b[i];
        refh += (double)g4_bf16_to_f32(h[i]) * b[i];
        mag += fabs((double)a[i] * b[i]) + fabs((double)g4_bf16_to_f32(h[i]) * b[i]);
    }
    CHECKF(fabs(k->dot_f32(a, b, N) - ref) <= 1e-6 * mag, "%s dot_f32", isa);
    CHECKF(fabs(k->dot_bf16(h, b, N) - refh) <= 1e-6 * mag, "%s dot_bf16", isa);
    float c[N];
    k->bf16_to_f32(h, c, N);
    int same = 1;
    for (int i = 0; i < N; i++) same &= c[i] == g4_bf16_to_f32(h[i]);
    CHECKF(same, "%s bf16_to_f32", isa);
    k->axpy(y1, a, 0.5f, N);
    for (int i = 0; i < N; i++) y2[i] += 0.5f * a[i];
    float e = 0;
    for (int i = 0; i < N; i++) e = fmaxf(e, fabsf(y1[i] - y2[i]));
    CHECKF(e <= 1e-6f, "%s axpy", isa);
}

/* The kernel set's grouped activation quantization (q8_group_row) gives the bytes of the reference rule
 * (g4_cpu_q8_quantize on the scalar set): rows of 1-7 blocks (whole and partial groups), a block of zeros,
 * halves (rounding to even), large and tiny magnitudes, and groups past the row. */
static void test_q8_group_row(const g4_cpu_kernels *k, const char *isa) {
    if (!k->q8_group_row) return;
    enum { MAXB = 7 };
    float x[MAXB * 32];
    unsigned char ref[3 * G4_Q8_GROUP], got[3 * G4_Q8_GROUP];
    for (int nb = 1; nb <= MAXB; nb++) {
        for (int i = 0; i < nb * 32; i++) {
            const float scale = i / 32 == 1 ? 0.0f : i / 32 == 2 ? 1e-30f : i / 32 == 3 ? 1e20f : 1.0f;
            x[i] = scale * (i % 7 == 0 ? (float)(i % 5) - 2.5f : frand() * 3.0f);
            if (i / 32 == 4) /* max 127: scale 1, the halves round to even */
                x[i] = i % 32 == 0 ? 127.0f : (float)(i % 32) - 16.5f;
        }
        const size_t ng = 3; /* at least one group past the row when nb <= 8 */
        g4_q8_rows a = {.qg = ref, .ng = ng, .type = G4_Q4_0};
        g4_cpu_kernels_use(g4_cpu_kernels_for("scalar"));
        memset(ref, 0xAB, sizeof ref);
        g4_cpu_q8_quantize(x, (size_t)nb * 32, 0, 1, &a);
        g4_cpu_kernels_use(k);
        memset(got, 0xCD, sizeof got);
        k->q8_group_row(x, (size_t)nb * 32, got, ng);
        CHECKF(memcmp(ref, got, ng * G4_Q8_GROUP) == 0, "%s q8_group_row: %d blocks differ from the reference rule", isa,
               nb);
    }
}

/* The lane order of the grouped activations (q8_lanes_row, g4_q8_rows.ql; kernels_x86.c) built here from the
 * reference rule's plain codes: per super-group of 16 blocks, lane 4i + g holds block 4g + i; operand k < 4 its
 * codes 4k .. 4k + 3, operand 4 + k its codes 16 + 4k ..; then a and b of the weight type's mode and the scales.
 * Rows of 1-23 blocks (partial groups and super-groups), every mode. */
static void test_q8_lanes_row(const g4_cpu_kernels *k, const char *isa) {
    if (!k->q8_lanes_row) return;
    enum { MAXB = 23, NG = (MAXB + 3) / 4, NS = (NG + 3) / 4 };
    const g4_dtype types[] = {G4_Q4_0, G4_Q8_0, G4_Q4_K, G4_Q6_K, G4_CB4_16, G4_Q2_K};
    float x[MAXB * 32];
    unsigned char qg[NG * G4_Q8_GROUP], got[NS * G4_Q8_LANES], want[NS * G4_Q8_LANES];
    int8_t q[(MAXB + 1) * 32];
    float d[MAXB + 1], m[MAXB + 1];
    for (int nb = 1; nb <= MAXB; nb += 2)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const g4_dtype t = types[ti];
            const int mode = g4_q8_mode(t), ng = (nb + 3) / 4, ns = (ng + 3) / 4;
            for (int i = 0; i < nb * 32; i++) x[i] = frand() * (i / 32 == 2 ? 0.0f : 2.0f);
            g4_q8_rows ref = {.q = q, .d = d, .m = m, .in_pad = (size_t)(nb + 1) / 2 * 64, .nb_pad = (size_t)(nb + 1) / 2 * 2,
                              .type = t};
            g4_cpu_kernels_use(g4_cpu_kernels_for("scalar"));
            g4_cpu_q8_quantize(x, (size_t)nb * 32, 0, 1, &ref);
            g4_cpu_kernels_use(k);
            g4_q8_rows a = {.qg = qg, .ng = (size_t)ng, .ql = got, .type = t};
            memset(got, 0xCD, sizeof got);
            g4_cpu_q8_quantize(x, (size_t)nb * 32, 0, 1, &a);
            memset(want, 0, sizeof want);
            for (int s = 0; s < ns; s++)
                for (int lane = 0; lane < 16; lane++) {
                    const int b = 16 * s + 4 * (lane % 4) + lane / 4; /* lane 4i + g: block 4g + i */
                    if (b >= nb) continue;
                    unsigned char *o = want + (size_t)s * G4_Q8_LANES;
                    int32_t lo = 0, hi = 0, va = 0, vb = 0;
                    for (int j = 0; j < 16; j++) lo += q[32 * b + j], hi += q[32 * b + 16 + j];
                    for (int kk = 0; kk < 8; kk++) memcpy(o + 64 * kk + 4 * lane, q + 32 * b + 4 * (kk % 4) + 16 * (kk / 4), 4);
                    if (mode == G4_Q8_OFFSET) va = -g4_q8_off(t) * (lo + hi);
                    if (mode == G4_Q8_AFFINE) va = lo + hi;
                    if (mode == G4_Q8_HALVES) va = -g4_q8_half_off(t) * lo, vb = -g4_q8_half_off(t) * hi;
                    if (mode == G4_Q8_MIN16) va = lo, vb = hi;
                    memcpy(o + 512 + 4 * lane, &va, 4);
                    memcpy(o + 576 + 4 * lane, &vb, 4);
                    memcpy(o + 640 + 4 * lane, &d[b], 4);
                }
            CHECKF(memcmp(want, got, (size_t)ns * G4_Q8_LANES) == 0, "%s q8_lanes_row: %d blocks, %s: not the lane order",
                   isa, nb, g4_dtype_name(t));
        }
}

/* The MoE op with gate and up apart (MLX layout) equals the fused [E, 2Im, H] form. */
static void test_moe_split(g4_backend *be, const char *isa) {
    enum { E = 4, H = 64, Im = 32, N = 3, TK = 2 };
    float *gu = malloc(sizeof(float) * E * 2 * Im * H), *g = malloc(sizeof(float) * E * Im * H),
          *u = malloc(sizeof(float) * E * Im * H), *dn = malloc(sizeof(float) * E * H * Im);
    for (int i = 0; i < E * 2 * Im * H; i++) gu[i] = frand() * 0.2f;
    for (int i = 0; i < E * H * Im; i++) dn[i] = frand() * 0.2f;
    for (int e = 0; e < E; e++) {
        memcpy(g + (size_t)e * Im * H, gu + (size_t)e * 2 * Im * H, sizeof(float) * Im * H);
        memcpy(u + (size_t)e * Im * H, gu + (size_t)e * 2 * Im * H + Im * H, sizeof(float) * Im * H);
    }
    float rp[E * H], rs[H], pes[E], res[N * H], x2[N * H], out1[N * H], out2[N * H];
    for (int i = 0; i < E * H; i++) rp[i] = frand();
    for (int i = 0; i < H; i++) rs[i] = 1.0f + 0.1f * frand();
    for (int i = 0; i < E; i++) pes[i] = 1.0f + 0.1f * frand();
    for (int i = 0; i < N * H; i++) res[i] = frand(), x2[i] = frand();
    g4_tensor trp = {.name = "rp", .dtype = G4_F32, .ndim = 2, .shape = {E, H}, .data = rp};
    g4_tensor tgu = {.name = "gu", .dtype = G4_F32, .ndim = 3, .shape = {E, 2 * Im, H}, .data = gu};
    g4_tensor tg = {.name = "g", .dtype = G4_F32, .ndim = 3, .shape = {E, Im, H}, .data = g};
    g4_tensor tu = {.name = "u", .dtype = G4_F32, .ndim = 3, .shape = {E, Im, H}, .data = u};
    g4_tensor tdn = {.name = "d", .dtype = G4_F32, .ndim = 3, .shape = {E, H, Im}, .data = dn};
    g4_moe_args a = {.residual = res, .dense = x2, .out = out1, .n = N, .hidden = H, .n_experts = E, .top_k = TK,
                     .expert_dim = Im, .eps = 1e-6f, .pre_norm2 = rs, .post_norm1 = rs, .post_norm2 = rs,
                     .router_proj = &trp, .router_scale = rs,
                     .per_expert_scale = pes, .gate_up = &tgu, .down = &tdn};
    be->ops->moe(be, &a);
    a.out = out2;
    a.gate_up = &tg;
    a.up = &tu;
    be->ops->moe(be, &a);
    float e = 0;
    for (int i = 0; i < N * H; i++) e = fmaxf(e, fabsf(out1[i] - out2[i]));
    CHECKF(e <= 1e-5f, "%s: MoE with split gate/up differs by %g", isa, e);
    free(gu);
    free(g);
    free(u);
    free(dn);
}

int main(void) {
    g4_error err;
    int ran = 0;
    /* G4_TEST_THREADS=1: one thread only (scripts/test-aarch64: qemu-user 7.2 hangs in
     * pthread_create of these binaries on this host) */
    const int max_threads = getenv("G4_TEST_THREADS") ? atoi(getenv("G4_TEST_THREADS")) : 2;
    for (int threads = 1; threads <= max_threads; threads++) {
        g4_backend *be = g4_backend_cpu_new(threads, 0, &err);
        CHECK(be != NULL);
        if (!be) break;
        for (const char *const *isa = g4_cpu_isas; *isa; isa++) {
            const g4_cpu_kernels *k = g4_cpu_kernels_for(*isa);
            if (!k) continue;
            g4_cpu_kernels_use(k);
            if (threads == 1) test_vectors(k, *isa), test_q8_group_row(k, *isa), test_q8_lanes_row(k, *isa);
            test_matmul(be, *isa);
            extreme = 1;
            test_matmul(be, *isa);
            extreme = 0;
            test_moe_split(be, *isa);
            if (threads == 1) printf("tested the %s kernels\n", *isa);
            ran++;
        }
        g4_backend_free(be);
    }
    CHECK(ran >= 2);
    return g4t_done();
}
