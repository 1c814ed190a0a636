/* The quantized formats of core/quant.h (docs/formats.md 2.2-2.4, 3.2): every block type
 * decoded from bytes written by hand, with the values worked out by hand from the layout;
 * encoders checked on hand examples and by round trips within the format's step; row and
 * expert views of every dtype. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/quant.h"

static void put16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }

#define H_ONE 0x3C00  /* f16 1.0 */
#define H_HALF 0x3800 /* f16 0.5 */
#define H_TWO 0x4000  /* f16 2.0 */
#define H_MONE 0xBC00 /* f16 -1.0 */

static void check_vals(const char *what, const float *y, const int *idx, const float *want, int n) {
    for (int i = 0; i < n; i++)
        CHECKF(y[idx[i]] == want[i], "%s: y[%d] = %g, want %g", what, idx[i], y[idx[i]], want[i]);
}

static void test_decode_by_hand(void) {
    unsigned char b[256];
    float y[256];
    { /* Q8_0: d = 0.5, qs = 1, -2, 127, -128 */
        memset(b, 0, sizeof b);
        put16(b, H_HALF);
        b[2] = 1, b[3] = 0xFE, b[4] = 127, b[5] = 0x80;
        g4_dequant(G4_Q8_0, b, y, 32);
        int i[] = {0, 1, 2, 3, 4};
        float w[] = {0.5f, -1.0f, 63.5f, -64.0f, 0.0f};
        check_vals("Q8_0", y, i, w, 5);
    }
    { /* Q4_0: d = 2, qs[0] = 0x9F: low 15 -> (15-8)*2 = 14 at y0, high 9 -> 2 at y16; zero bytes -> -16 */
        memset(b, 0, sizeof b);
        put16(b, H_TWO);
        b[2] = 0x9F;
        g4_dequant(G4_Q4_0, b, y, 32);
        int i[] = {0, 16, 1, 31};
        float w[] = {14.0f, 2.0f, -16.0f, -16.0f};
        check_vals("Q4_0", y, i, w, 4);
    }
    { /* Q4_1: d = 1, m = -1, qs[0] = 0x52: y0 = 2 - 1, y16 = 5 - 1 */
        memset(b, 0, sizeof b);
        put16(b, H_ONE);
        put16(b + 2, H_MONE);
        b[4] = 0x52;
        g4_dequant(G4_Q4_1, b, y, 32);
        int i[] = {0, 16, 1};
        float w[] = {1.0f, 4.0f, -1.0f};
        check_vals("Q4_1", y, i, w, 3);
    }
    { /* Q5_0: d = 1, qh bits 0 and 16, qs[0] = 0x21: y0 = (1|16)-16 = 1, y16 = (2|16)-16 = 2, y1 = -16 */
        memset(b, 0, sizeof b);
        put16(b, H_ONE);
        uint32_t qh = 1u | 1u << 16;
        memcpy(b + 2, &qh, 4);
        b[6] = 0x21;
        g4_dequant(G4_Q5_0, b, y, 32);
        int i[] = {0, 16, 1};
        float w[] = {1.0f, 2.0f, -16.0f};
        check_vals("Q5_0", y, i, w, 3);
    }
    { /* Q5_1: d = 0.5, m = 1, qh bit 17, qs[1] = 0x30: y1 = 0*0.5+1 = 1, y17 = (3|16)*0.5+1 = 10.5 */
        memset(b, 0, sizeof b);
        put16(b, H_HALF);
        put16(b + 2, H_ONE);
        uint32_t qh = 1u << 17;
        memcpy(b + 4, &qh, 4);
        b[9] = 0x30;
        g4_dequant(G4_Q5_1, b, y, 32);
        int i[] = {1, 17};
        float w[] = {1.0f, 10.5f};
        check_vals("Q5_1", y, i, w, 2);
    }
    for (int five = 0; five < 2; five++) {
        /* Q4_K/Q5_K: d = 1, dmin = 0.5; sub-block 0: sc 2, m 4; sub-block 1: sc 3, m 1;
         * sub-block 4: sc 1 | 16 (high bits in scales[0] bits 6-7) = 17, m 2.
         * qs[0] = 0x75: y0 = 2*5 - 0.5*4 = 8, y32 = 3*7 - 0.5*1 = 20.5;
         * qs[64] = 0x03 (chunk 2, low nibble = sub-block 4): y128 = 17*3 - 0.5*2 = 50.
         * Q5_K: qh[0] bit 0 adds 16 to y0: 2*21 - 2 = 40. */
        memset(b, 0, sizeof b);
        put16(b, H_ONE);
        put16(b + 2, H_HALF);
        unsigned char *s = b + 4, *qs = b + (five ? 48 : 16);
        s[0] = 2 | 0x40, s[4] = 4, s[1] = 3, s[5] = 1, s[8] = 0x21;
        qs[0] = 0x75, qs[64] = 0x03;
        if (five) b[16] = 1;
        g4_dequant(five ? G4_Q5_K : G4_Q4_K, b, y, 256);
        int i[] = {0, 32, 128, 1};
        float w[] = {five ? 40.0f : 8.0f, 20.5f, 50.0f, -2.0f};
        check_vals(five ? "Q5_K" : "Q4_K", y, i, w, 4);
    }
    { /* Q6_K: d = 1 (last); scales[0] = 2, scales[2] = -1, scales[8] = 3.
       * ql[0] = 0x05, qh[0] = 0x02: q1 = 5 | 2<<4 = 37 -> y0 = 2*(37-32) = 10;
       * ql[32] = 0x0A: q2 = 10 -> y32 = -1*(10-32) = 22;
       * second half: ql[64] = 0x01, qh[32] = 0x03: q = 1 | 3<<4 = 49 -> y128 = 3*17 = 51;
       * y1: q = 0 -> 2*(0-32) = -64 */
        memset(b, 0, sizeof b);
        put16(b + 208, H_ONE);
        b[192] = 2, b[194] = 0xFF, b[200] = 3;
        b[0] = 0x05, b[128] = 0x02, b[32] = 0x0A, b[64] = 0x01, b[160] = 0x03;
        g4_dequant(G4_Q6_K, b, y, 256);
        int i[] = {0, 32, 128, 1};
        float w[] = {10.0f, 22.0f, 51.0f, -64.0f};
        check_vals("Q6_K", y, i, w, 4);
    }
    { /* MLX 4-bit, group 32: word 0x87654321 -> codes 1..8; scale 0.5, bias -1 (bf16) */
        unsigned char w[16] = {0x21, 0x43, 0x65, 0x87};
        unsigned char sc[2], bi[2];
        put16(sc, 0x3F00), put16(bi, 0xBF80);
        g4_mlx_dequant(4, 32, w, sc, bi, G4_BF16, y, 32);
        int i[] = {0, 7, 8};
        float want[] = {-0.5f, 3.0f, -1.0f};
        check_vals("MLX4", y, i, want, 3);
    }
    { /* MLX 3-bit: code 2 is bits 6-7 of byte 0 and bit 0 of byte 1: 0xC0, 0x01 -> 7; codes 0, 1 = 0 */
        unsigned char w[12] = {0xC0, 0x01};
        unsigned char sc[2], bi[2];
        put16(sc, H_ONE), put16(bi, 0);
        g4_mlx_dequant(3, 32, w, sc, bi, G4_F16, y, 32);
        int i[] = {0, 1, 2, 3};
        float want[] = {0, 0, 7, 0};
        check_vals("MLX3", y, i, want, 4);
    }
    { /* MLX 8-bit: byte 200, scale 0.25 (f32), bias 1 -> 51 */
        unsigned char w[32] = {200};
        float sc = 0.25f, bi = 1.0f;
        g4_mlx_dequant(8, 32, w, &sc, &bi, G4_F32, y, 32);
        CHECK(y[0] == 51.0f && y[1] == 1.0f);
    }
}

static void test_encode_by_hand(void) {
    float x[32];
    unsigned char b[64];
    /* Q8_0 of x_j = j: d = 31/127, q_j = round(j * 127/31): q1 = round(4.097) = 4, q31 = 127 */
    for (int j = 0; j < 32; j++) x[j] = (float)j;
    CHECK(g4_quant(G4_Q8_0, x, b, 32) == 34);
    CHECK(b[2] == 0 && b[3] == 4 && b[2 + 31] == 127);
    CHECK(g4_f16_at(b) == g4_f16_to_f32(g4_f32_to_f16(31.0f / 127.0f)));
    /* Q4_0 of x_j = j - 16: largest magnitude -16, d = -16/-8 = 2, q = (int)(x/2 + 8.5) capped at 15:
     * x0 = -16 -> 0, x16 = 0 -> 8, x31 = 15 -> (int)16 = 16 -> 15; x1 = -15 -> (int)1 = 1 */
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    CHECK(g4_quant(G4_Q4_0, x, b, 32) == 18);
    CHECK(g4_f16_at(b) == 2.0f);
    CHECK((b[2] & 15) == 0 && (b[2] >> 4) == 8 && (b[3] & 15) == 1 && (b[17] >> 4) == 15);
    /* MLX 4-bit, group 32, x_j = j/10: max 3.1 wins, scale = 3.1/-15, bias = 3.1 (GPU rule):
     * x0 -> round((0 - 3.1)/(-0.2067)) = 15, x31 -> 0, x16 = 1.6 -> round(7.26) = 7 */
    for (int j = 0; j < 32; j++) x[j] = (float)j / 10.0f;
    unsigned char w[16];
    uint16_t sc, bi;
    g4_mlx_quant_row(4, 32, x, 32, w, &sc, &bi, G4_BF16);
    CHECK(g4_mlx_code(w, 4, 0) == 15 && g4_mlx_code(w, 4, 31) == 0 && g4_mlx_code(w, 4, 16) == 7);
    CHECK(sc == g4_f32_to_bf16(3.1f / -15.0f) && bi == g4_f32_to_bf16(3.1f));
    /* a group of equal values: q0 = 0 keeps the bias 0 */
    for (int j = 0; j < 32; j++) x[j] = 0.0f;
    g4_mlx_quant_row(8, 32, x, 32, b, &sc, &bi, G4_F16);
    CHECK(bi == 0);
}

static unsigned rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* Encode then decode random rows: every value within the format's worst-case step. */
static void test_round_trips(void) {
    enum { N = 512 };
    float x[N], y[N];
    unsigned char buf[4 * N];
    struct {
        g4_dtype t;
        float tol; /* relative to max|x| */
    } types[] = {{G4_F32, 0}, {G4_F16, 1e-3f}, {G4_BF16, 4e-3f}, {G4_Q8_0, 1.0f / 127},
                 {G4_Q4_0, 1.0f / 8},  {G4_Q4_K, 0.09f}, {G4_Q5_K, 0.045f},  {G4_Q6_K, 0.03f},
                 {G4_Q4_1, 0.07f},     {G4_Q5_0, 0.065f}, {G4_Q5_1, 0.035f}};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        for (int trial = 0; trial < 4; trial++) {
            float amp = trial == 3 ? 1e-3f : 1.0f + (float)trial;
            for (int i = 0; i < N; i++) x[i] = frand() * amp * (i % 7 == 0 ? 3.0f : 1.0f);
            size_t nb = g4_quant(types[k].t, x, buf, N);
            CHECKF(nb == g4_dtype_row_bytes(types[k].t, N), "%s: %zu bytes", g4_dtype_name(types[k].t), nb);
            g4_dequant(types[k].t, buf, y, N);
            float amax = 0, err = 0;
            for (int i = 0; i < N; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
                err = fmaxf(err, fabsf(x[i] - y[i]));
            }
            CHECKF(err <= types[k].tol * amax, "%s round trip: error %g of %g", g4_dtype_name(types[k].t), err, amax);
        }
    }
    CHECK(g4_quant(G4_Q4_K, x, buf, 32) == 0);  /* not whole 256-blocks */
    CHECK(g4_quant(G4_MLX4, x, buf, 32) == 0);  /* not writable */
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    for (int bi = 0; bi < 6; bi++)
        for (int gs = 32; gs <= 128; gs *= 2) {
            for (int i = 0; i < N; i++) x[i] = frand() * (float)(1 + bi);
            unsigned char w[N];
            float sc[N / 32], bs[N / 32];
            /* the edge value is exact; the opposite end may clamp, so at most one step */
            g4_mlx_quant_row(bits[bi], gs, x, N, w, sc, bs, G4_F32);
            g4_mlx_dequant(bits[bi], gs, w, sc, bs, G4_F32, y, N);
            float worst = 0;
            for (int g = 0; g < N / gs; g++)
                for (int j = 0; j < gs; j++)
                    worst = fmaxf(worst, fabsf(x[g * gs + j] - y[g * gs + j]) / fabsf(sc[g]));
            CHECKF(worst <= 1.0001f, "MLX%d/%d: error %g steps", bits[bi], gs, worst);
        }
}

/* Row and expert views: bytes per row of every dtype, and MLX scales following the rows. */
static void test_views(void) {
    CHECK(g4_dtype_row_bytes(G4_Q4_0, 64) == 36 && g4_dtype_row_bytes(G4_Q8_0, 32) == 34);
    CHECK(g4_dtype_row_bytes(G4_Q6_K, 512) == 420 && g4_dtype_row_bytes(G4_Q4_K, 128) == 0);
    CHECK(g4_dtype_row_bytes(G4_MLX3, 64) == 24 && g4_dtype_row_bytes(G4_MLX6, 32) == 24);
    CHECK(g4_dtype_row_bytes(G4_BF16, 10) == 20);
    /* [E=3, out=2, in=64] MLX 4-bit, group 32: rows of 32 bytes, 2 scales per row */
    unsigned char w[3 * 2 * 32];
    uint16_t sc[3 * 2 * 2], bs[3 * 2 * 2];
    for (int i = 0; i < 12; i++) sc[i] = g4_f32_to_bf16((float)i), bs[i] = g4_f32_to_bf16(-(float)i);
    memset(w, 0x11, sizeof w); /* every code 1 */
    g4_tensor t = {.name = "x", .dtype = G4_MLX4, .ndim = 3, .shape = {3, 2, 64}, .data = w, .nbytes = sizeof w,
                   .scales = sc, .biases = bs, .scale_dtype = G4_BF16, .group = 32};
    g4_tensor e = g4_tensor_index(&t, 2);
    CHECK(e.ndim == 2 && e.shape[0] == 2 && e.shape[1] == 64 && e.data == w + 128);
    float y[64];
    g4_dequant_row(&e, 1, y); /* global row 5: scales 10, 11 and biases -10, -11 -> 10*1-10, 11*1-11 */
    CHECK(y[0] == 0.0f && y[32] == 0.0f);
    g4_tensor r = g4_tensor_rows(&t, 3, 2);
    g4_dequant_row(&r, 0, y); /* global row 3: scales 6, 7, biases -6, -7 */
    CHECK(r.shape[0] == 2 && y[0] == 0.0f && y[63] == 0.0f && r.scales == (const void *)(sc + 6));
    unsigned char q[2 * 34];
    g4_tensor tq = {.name = "q", .dtype = G4_Q8_0, .ndim = 2, .shape = {2, 32}, .data = q};
    CHECK(g4_tensor_row(&tq, 1) == q + 34 && g4_tensor_nrows(&tq) == 2);
}

/* Rows re-encoded for a backend without kernels for their type: Q5_0 -> Q8_0 keeps every value; other types are
 * decoded and encoded (the Q8_0 of the decoded values); the same type is a copy; rows not whole blocks are refused. */
static void test_transcode(void) {
    enum { N = 256 };
    float x[2 * N], y[N], z[N], tmp[N];
    unsigned char src[2 * 4 * N], dst[2 * N], ref[2 * N];
    for (int i = 0; i < 2 * N; i++) x[i] = frand() * (i % 5 == 0 ? 3.0f : 1.0f);
    static const g4_dtype from[] = {G4_Q5_0, G4_Q4_1, G4_Q5_1, G4_Q5_K, G4_Q4_0, G4_Q8_0, G4_Q6_K, G4_BF16};
    for (size_t k = 0; k < sizeof from / sizeof from[0]; k++) {
        const size_t rb = g4_dtype_row_bytes(from[k], N);
        CHECK(g4_quant(from[k], x, src, N) == rb && g4_quant(from[k], x + N, src + rb, N) == rb);
        g4_tensor t = {.name = "t", .dtype = from[k], .ndim = 2, .shape = {2, N}, .data = src};
        CHECKF(g4_dequant_reads(from[k]), "%s", g4_dtype_name(from[k]));
        CHECK(g4_transcode_row(&t, 1, G4_Q8_0, dst, tmp) == g4_dtype_row_bytes(G4_Q8_0, N));
        g4_dequant(from[k], src + rb, y, N);
        g4_dequant(G4_Q8_0, dst, z, N);
        if (g4_transcode_exact(from[k], G4_Q8_0)) {
            CHECKF(!memcmp(y, z, sizeof y), "%s -> Q8_0 is not exact", g4_dtype_name(from[k]));
        } else {
            g4_quant(G4_Q8_0, y, ref, N);
            CHECKF(!memcmp(dst, ref, g4_dtype_row_bytes(G4_Q8_0, N)), "%s -> Q8_0 is not the Q8_0 of the values",
                   g4_dtype_name(from[k]));
        }
    }
    CHECK(g4_transcode_exact(G4_Q5_0, G4_Q8_0) && !g4_transcode_exact(G4_Q5_K, G4_Q8_0));
    /* MLX: a row's scales and biases come with it */
    unsigned char w[2 * N / 2];
    float sc[2 * N / 64], bs[2 * N / 64];
    for (int r = 0; r < 2; r++) g4_mlx_quant_row(4, 64, x + r * N, N, w + r * N / 2, sc + r * 4, bs + r * 4, G4_F32);
    g4_tensor m = {.name = "m", .dtype = G4_MLX4, .ndim = 2, .shape = {2, N}, .data = w, .scales = sc, .biases = bs,
                   .scale_dtype = G4_F32, .group = 64};
    CHECK(g4_transcode_row(&m, 1, G4_Q8_0, dst, tmp) == g4_dtype_row_bytes(G4_Q8_0, N));
    g4_dequant_row(&m, 1, y);
    g4_quant(G4_Q8_0, y, ref, N);
    CHECK(!memcmp(dst, ref, g4_dtype_row_bytes(G4_Q8_0, N)));
    /* rows of 48: not whole 32-blocks of Q8_0 */
    g4_tensor b = {.name = "b", .dtype = G4_BF16, .ndim = 2, .shape = {1, 48}, .data = src};
    CHECK(g4_transcode_row(&b, 0, G4_Q8_0, dst, tmp) == 0);
    CHECK(!g4_dequant_reads(G4_DTYPE_UNKNOWN));
}

int main(void) {
    test_decode_by_hand();
    test_transcode();
    test_encode_by_hand();
    test_round_trips();
    test_views();
    return g4t_done();
}
