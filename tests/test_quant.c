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
    { /* Q2_K: d = 1, dmin = 0.5 (after scales[16] and qs[64]); scales[0] = 0x42: sc 2, m 4; scales[2] = 0x13:
       * sc 3, m 1; scales[8] = 0x05: sc 5, m 0. qs[0] = 0x0B: bits 0-1 = 3 -> y0 = 2*3 - 0.5*4 = 4, bits 2-3 = 2
       * -> y32 (sub-block 2) = 3*2 - 0.5 = 5.5, bits 4-5 = 0 -> y64 (sub-block 4, all 0) = 0; y1: q 0 -> -2;
       * qs[32] = 0x01 -> y128 (second half, sub-block 8) = 5*1 - 0 = 5 */
        memset(b, 0, sizeof b);
        put16(b + 80, H_ONE);
        put16(b + 82, H_HALF);
        b[0] = 0x42, b[2] = 0x13, b[8] = 0x05;
        b[16] = 0x0B, b[16 + 32] = 0x01;
        g4_dequant(G4_Q2_K, b, y, 256);
        int i[] = {0, 32, 64, 1, 128};
        float w[] = {4.0f, 5.5f, 0.0f, -2.0f, 5.0f};
        check_vals("Q2_K", y, i, w, 5);
    }
    { /* Q3_K: d = 1 (last); 6-bit scales u - 32: u_0 = 34 (low nibble of scales[0] = 2, bits 0-1 of scales[8]
       * = 2) -> 2; u_2 = 31 (scales[2] low 15, scales[10] bits 0-1 = 1) -> -1; u_9 = 35 (high nibble of
       * scales[1] = 3, bits 4-5 of scales[9] = 2) -> 3; the others u 0 -> -32.
       * y0: qs[0] bits 0-1 = 3, hmask[0] bit 0 set -> q 3 -> 6; y1: all 0 -> q -4 -> -8;
       * y32 (sub-block 2): qs[0] bits 2-3 = 1, hmask[0] bit 1 clear -> q -3 -> 3;
       * y144 (h 1, s 0, l 16: sub-block 9): qs[48] bits 0-1 = 2, hmask[16] bit 4 set -> q 2 -> 6;
       * y16 (sub-block 1, scale -32): hmask[16] bit 0 clear -> q -4 -> 128 */
        memset(b, 0, sizeof b);
        put16(b + 108, H_ONE);
        b[0] = 0x01, b[16] = 0x10;
        b[32] = 0x07, b[32 + 48] = 0x02;
        b[96] = 0x02, b[97] = 0x30, b[98] = 0x0F, b[104] = 0x02, b[105] = 0x20, b[106] = 0x01;
        g4_dequant(G4_Q3_K, b, y, 256);
        int i[] = {0, 1, 32, 144, 16};
        float w[] = {6.0f, -8.0f, 3.0f, 6.0f, 128.0f};
        check_vals("Q3_K", y, i, w, 5);
    }
    { /* IQ4_NL: d = 0.5, qs[0] = 0xF0: y0 = 0.5*V[0] = -63.5, y16 = 0.5*V[15] = 56.5; qs[1] = 0x08: y1 = 0.5*V[8]
       * = 0.5, y17 = -63.5 */
        memset(b, 0, sizeof b);
        put16(b, H_HALF);
        b[2] = 0xF0, b[3] = 0x08;
        g4_dequant(G4_IQ4_NL, b, y, 32);
        int i[] = {0, 16, 1, 17, 2};
        float w[] = {-63.5f, 56.5f, 0.5f, -63.5f, -63.5f};
        check_vals("IQ4_NL", y, i, w, 5);
    }
    { /* IQ4_XS: d = 1; scales_h = 0x0042, scales_l = {0x01, 0xE0}: sub-block 0: u = 1 | 2<<4 = 33 -> ls 1;
       * sub-block 3: u = 14 | 1<<4 = 30 -> -2; the others u 0 -> -32.
       * qs[0] = 0x9F: y0 = V[15] = 113, y16 = V[9] = 13; qs[48] = 0x01: y96 = -2*V[1] = 208, y112 = -2*V[0] = 254;
       * y1 = V[0] = -127; y32 (sub-block 1) = -32*-127 = 4064 */
        memset(b, 0, sizeof b);
        put16(b, H_ONE);
        put16(b + 2, 0x0042);
        b[4] = 0x01, b[5] = 0xE0;
        b[8] = 0x9F, b[8 + 48] = 0x01;
        g4_dequant(G4_IQ4_XS, b, y, 256);
        int i[] = {0, 16, 96, 112, 1, 32};
        float w[] = {113.0f, 13.0f, 208.0f, 254.0f, -127.0f, 4064.0f};
        check_vals("IQ4_XS", y, i, w, 6);
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
    /* IQ4_NL of x_j = j - 16: largest magnitude -16, d = -16/-127; x0 / d = -127 -> V[0]; x16 = 0 -> V[8] = 1
     * (nearest); x31 / d = 119.06 -> V[15] = 113 (6.06 away; 89 is 30 away) */
    CHECK(g4_quant(G4_IQ4_NL, x, b, 32) == 18);
    CHECK(g4_f16_at(b) == g4_f16_to_f32(g4_f32_to_f16(16.0f / 127.0f)));
    CHECK((b[2] & 15) == 0 && (b[2] >> 4) == 8 && (b[17] >> 4) == 15);
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
                 /* the worst cases of the rules in core/quant.c, relative to the block's max|x| (A):
                  * Q2_K: a sub-block's range <= 2A, its scale sc <= 2A/3; the 4-bit scale and min are off by at
                  *   most d/2 = sc_max/30 and dmin/2 <= A/30: half a step sc/2 + 3 d/2 + dmin/2 <= 0.41 A;
                  * Q3_K: scale s = max/3.5 <= A/3.5, codes -4..3: half a step plus the 6-bit scale's rounding
                  *   (|d|/2 = s_max/64) over 3.5 steps: 0.5 s + 2 |d| <= 0.161 A;
                  * IQ4_NL: the table's widest half gap is 12 and its top 113 is 14 below 127: 14 d, plus 113 times
                  *   the f16 rounding of d (2^-11 relative, more for subnormal scales): 0.1107 A;
                  * IQ4_XS: as IQ4_NL plus the 6-bit scale's rounding over 127 table units: 0.145 A */
                 {G4_Q2_K, 0.42f}, {G4_Q3_K, 0.17f}, {G4_IQ4_NL, 0.112f}, {G4_IQ4_XS, 0.15f},
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
    CHECK(g4_quant(G4_Q2_K, x, buf, 32) == 0 && g4_quant(G4_IQ4_XS, x, buf, 224) == 0);
    /* zeros stay zeros (no 0/0 in the scale rules) */
    static const g4_dtype zq[] = {G4_Q2_K, G4_Q3_K, G4_IQ4_NL, G4_IQ4_XS, G4_Q4_K, G4_Q6_K};
    for (size_t k = 0; k < sizeof zq / sizeof zq[0]; k++) {
        memset(x, 0, sizeof x);
        g4_quant(zq[k], x, buf, N);
        g4_dequant(zq[k], buf, y, N);
        int bad = 0;
        for (int i = 0; i < N; i++) bad |= y[i] != 0.0f;
        CHECKF(!bad, "%s: zeros do not round-trip", g4_dtype_name(zq[k]));
    }
    /* rows that are not whole blocks: llama.cpp's demotions where they apply */
    CHECK(g4_quant_row_type(G4_Q2_K, 704) == G4_IQ4_NL && g4_quant_row_type(G4_Q3_K, 704) == G4_IQ4_NL);
    CHECK(g4_quant_row_type(G4_IQ4_XS, 704) == G4_IQ4_NL && g4_quant_row_type(G4_Q4_K, 704) == G4_Q8_0);
    CHECK(g4_quant_row_type(G4_Q2_K, 100) == G4_BF16 && g4_quant_row_type(G4_Q3_K, 512) == G4_Q3_K);
    CHECK(g4_quant_row_type(G4_IQ4_NL, 64) == G4_IQ4_NL && g4_quant_row_type(G4_MLX4, 100) == G4_MLX4);
    CHECK(g4_quant_row_type(G4_BF16, 100) == G4_BF16);
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
    CHECK(g4_dtype_row_bytes(G4_Q2_K, 512) == 168 && g4_dtype_row_bytes(G4_Q3_K, 256) == 110);
    CHECK(g4_dtype_row_bytes(G4_IQ4_NL, 704) == 22 * 18 && g4_dtype_row_bytes(G4_IQ4_XS, 512) == 272);
    CHECK(g4_dtype_row_bytes(G4_IQ4_XS, 704) == 0 && !strcmp(g4_dtype_name(G4_IQ4_XS), "IQ4_XS"));
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

/* Every GGUF block type decoded from deterministic blocks (xorshift64 bytes seeded by the type's name, each f16
 * field 0x3266; IQ1_M's d in its scale words' top nibbles) against FNV-1a hashes of the float32 values llama.cpp's
 * gguf-py decodes from the same bytes: `tests/data/gguf_quant_diff.py GGUF_PY --c-hashes` printed this table (its
 * default run compares every value of random blocks, offline). 64 blocks of 256 a type: the codebook types' grids
 * are read at ~2000 places each. */
static const struct {
    g4_dtype t;
    unsigned long long fnv;
} decode_hashes[] = {
    {G4_Q4_0, 0x55adf50075c96ec7ull},
    {G4_Q4_1, 0x17f1eeeaaa226690ull},
    {G4_Q5_0, 0xd6f022ce30f3c0f5ull},
    {G4_Q5_1, 0xf4a27cb08d87aad8ull},
    {G4_Q8_0, 0x2f77eb5dbbcfb684ull},
    {G4_Q2_K, 0xfd5416d1cc7e20ffull},
    {G4_Q3_K, 0x2d4c439e704b24d6ull},
    {G4_Q4_K, 0x8ce7b3c453ab14f8ull},
    {G4_Q5_K, 0xf27f1246508be275ull},
    {G4_Q6_K, 0xa254bc29badbc23full},
    {G4_IQ4_NL, 0xb97926b93c16e9e5ull},
    {G4_IQ4_XS, 0xe4ae333161ffb926ull},
    {G4_IQ2_XXS, 0x47faf34c9f0cd8c4ull},
    {G4_IQ2_XS, 0x0e8b5be782e0deebull},
    {G4_IQ2_S, 0x6c36ebd60b90791aull},
    {G4_IQ3_XXS, 0x14a2145374d2b0d3ull},
    {G4_IQ3_S, 0x7fb4954f3b6a88a4ull},
    {G4_IQ1_S, 0x87e3d790ece12bf4ull},
    {G4_IQ1_M, 0xb240a03395865709ull},
    {G4_TQ1_0, 0xf4445c79b4cdfca5ull},
    {G4_TQ2_0, 0xb43de750ccf54f65ull},
    {G4_MXFP4, 0x98520d7885ef9c1dull},
    {G4_NVFP4, 0x0c20ba04b15bab7bull},
};
/* the f16 fields' byte offsets in a block (docs/formats.md 3.2, core/quant_codebook.c) */
static int f16_fields(g4_dtype t, int *at) {
    switch (t) {
    case G4_Q4_1: case G4_Q5_1: case G4_Q4_K: case G4_Q5_K: at[0] = 0, at[1] = 2; return 2;
    case G4_Q2_K: at[0] = 80, at[1] = 82; return 2;
    case G4_Q3_K: at[0] = 108; return 1;
    case G4_Q6_K: at[0] = 208; return 1;
    case G4_TQ1_0: at[0] = 52; return 1;
    case G4_TQ2_0: at[0] = 64; return 1;
    case G4_IQ1_M: case G4_MXFP4: case G4_NVFP4: return 0;
    default: at[0] = 0; return 1;
    }
}
static void test_decode_hashes(void) {
    enum { N = 64 * 256 };
    static unsigned char b[N / 32 * 40];
    static float y[N];
    for (size_t k = 0; k < sizeof decode_hashes / sizeof decode_hashes[0]; k++) {
        const g4_dtype t = decode_hashes[k].t;
        const char *name = g4_dtype_name(t);
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (const char *c = name; *c; c++) x = (x ^ (unsigned char)*c) * 0x100000001B3ull;
        const int qk = g4_dtype_block(t), bs = g4_dtype_block_bytes(t), nb = N / qk;
        int at[2], nf = f16_fields(t, at);
        for (int i = 0; i < nb; i++) {
            unsigned char *p = b + (size_t)i * bs;
            for (int j = 0; j < bs; j++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                p[j] = (unsigned char)(x >> 32);
            }
            for (int f = 0; f < nf; f++) p[at[f]] = 0x66, p[at[f] + 1] = 0x32;
            if (t == G4_IQ1_M)
                for (int w = 0; w < 4; w++) p[49 + 2 * w] = (unsigned char)((p[49 + 2 * w] & 15) | (0x3266 >> 4 * w & 15) << 4);
        }
        g4_dequant(t, b, y, N);
        uint64_t h = 0xCBF29CE484222325ull;
        const unsigned char *v = (const unsigned char *)y;
        for (size_t i = 0; i < sizeof y; i++) h = (h ^ v[i]) * 0x100000001B3ull;
        CHECKF(h == decode_hashes[k].fnv, "%s: the decoded values' hash %016llx, gguf-py's %016llx", name,
               (unsigned long long)h, decode_hashes[k].fnv);
        CHECKF(g4_dequant_reads(t) && g4_dtype_row_bytes(t, N) == (size_t)nb * (size_t)bs, "%s", name);
        if (g4_codebook_q6k_type(t)) { /* held as Q6_K by the CPU: every value the same */
            static unsigned char q6[N / 256 * 210];
            static float z[N];
            const g4_tensor row = {.name = "r", .dtype = t, .ndim = 2, .shape = {1, N}, .data = b};
            CHECKF(g4_transcode_exact(t, G4_Q6_K) && g4_transcode_row(&row, 0, G4_Q6_K, q6, NULL) == sizeof q6, "%s", name);
            g4_dequant(G4_Q6_K, q6, z, N);
            int same = 1;
            for (int i = 0; i < N; i++) same &= z[i] == y[i];
            CHECKF(same, "%s -> Q6_K changes values", name);
        }
        if (g4_codebook_scale32_type(t)) { /* held as CB4 by both backends: every value the same (MXFP4: group scales
                                             * within 8x of each other a block of 256; a wider spread is refused) */
            static unsigned char cb[N / 256 * 152];
            static float z[N];
            if (t == G4_MXFP4) {
                for (int i = 0; i < nb; i++) b[(size_t)i * bs] = (unsigned char)(118 + b[(size_t)i * bs] % 4);
                g4_dequant(t, b, y, N);
            }
            const g4_tensor row = {.name = "r", .dtype = t, .ndim = 2, .shape = {1, N}, .data = b};
            CHECKF(g4_transcode_exact(t, G4_CB4) && g4_transcode_row(&row, 0, G4_CB4, cb, NULL) == sizeof cb, "%s", name);
            g4_dequant(G4_CB4, cb, z, N);
            int same = 1, tables = 1;
            for (int i = 0; i < N; i++) same &= z[i] == y[i];
            for (int i = 0; i < N / 256; i++) /* each block's table: its distinct integers, ascending */
                for (int j = 1; j < 16; j++) tables &= (int8_t)cb[152 * i + j - 1] <= (int8_t)cb[152 * i + j];
            CHECKF(same && tables, "%s -> CB4 changes values", name);
            if (t == G4_MXFP4) { /* scales 2^-10 and 2^-4 in one block: no 6-bit multiples of one d */
                const unsigned char e0 = b[0], e1 = b[bs];
                b[0] = 117, b[bs] = 123;
                CHECK(g4_transcode_row(&row, 0, G4_CB4, cb, NULL) == 0);
                b[0] = e0, b[bs] = e1;
            }
        }
        if (g4_codebook_scale16_type(t)) { /* as CB4_16 (a scale per 16): every value the same (NVFP4: scales of one
                                             * exponent; a wider spread is refused) */
            static unsigned char cb[N / 256 * 162];
            static float z[N];
            if (t == G4_NVFP4) {
                for (int i = 0; i < nb; i++)
                    for (int f = 0; f < 4; f++) b[(size_t)i * bs + f] = (unsigned char)(7 << 3 | (b[(size_t)i * bs + f] & 7));
                g4_dequant(t, b, y, N);
            }
            const g4_tensor row = {.name = "r", .dtype = t, .ndim = 2, .shape = {1, N}, .data = b};
            CHECKF(g4_transcode_exact(t, G4_CB4_16) && g4_transcode_row(&row, 0, G4_CB4_16, cb, NULL) == sizeof cb, "%s",
                   name);
            g4_dequant(G4_CB4_16, cb, z, N);
            int same = 1;
            for (int i = 0; i < N; i++) same &= z[i] == y[i];
            CHECKF(same, "%s -> CB4_16 changes values", name);
            if (t == G4_NVFP4) { /* scales 2^-10 and 1/2 or more in one block: no int8 multiples of one d */
                const unsigned char s0 = b[0];
                b[0] = 0x01;
                CHECK(g4_transcode_row(&row, 0, G4_CB4_16, cb, NULL) == 0);
                b[0] = s0;
            }
        }
        if (g4_codebook_scale32_type(t)) { /* held as AF8 by the CPU: every value the same (MXFP4: scales that keep
                                             * the values finite and normal; others are refused, below) */
            static unsigned char af[N / 32 * 40];
            static float z[N];
            if (t == G4_MXFP4) {
                for (int i = 0; i < nb; i++) b[(size_t)i * bs] = (unsigned char)(100 + b[(size_t)i * bs] % 50);
                g4_dequant(t, b, y, N);
            }
            const g4_tensor row = {.name = "r", .dtype = t, .ndim = 2, .shape = {1, N}, .data = b};
            CHECKF(g4_transcode_exact(t, G4_AF8) && g4_transcode_row(&row, 0, G4_AF8, af, NULL) == sizeof af, "%s", name);
            g4_dequant(G4_AF8, af, z, N);
            int same = 1;
            for (int i = 0; i < N; i++) same &= z[i] == y[i];
            CHECKF(same, "%s -> AF8 changes values", name);
            if (t == G4_MXFP4) { /* as MXF4: the codes and the scale as an f16 d, every value the same; a scale of 2^-26
                                  * is no f16 (refused) */
                static unsigned char mx[N / 32 * 18];
                CHECK(g4_transcode_exact(t, G4_MXF4) && g4_transcode_row(&row, 0, G4_MXF4, mx, NULL) == sizeof mx);
                g4_dequant(G4_MXF4, mx, z, N);
                same = 1;
                for (int i = 0; i < N; i++) same &= z[i] == y[i];
                CHECKF(same, "MXFP4 -> MXF4 changes values");
                const unsigned char e0 = b[0];
                b[0] = 102;
                CHECK(g4_transcode_row(&row, 0, G4_MXF4, mx, NULL) == 0);
                b[0] = e0;
            }
            if (t == G4_MXFP4) { /* a scale of 2^127: values past the float range are not held as AF8 */
                b[0] = 255;
                CHECK(g4_transcode_row(&row, 0, G4_AF8, af, NULL) == 0);
            }
        }
    }
}

/* Rows re-encoded for a backend without kernels for their type: Q5_0 and IQ4_NL -> Q8_0 keep every value; other types are
 * decoded and encoded (the Q8_0 of the decoded values); the same type is a copy; rows not whole blocks are refused. */
static void test_transcode(void) {
    enum { N = 256 };
    float x[2 * N], y[N], z[N], tmp[N];
    unsigned char src[2 * 4 * N], dst[2 * N], ref[2 * N];
    for (int i = 0; i < 2 * N; i++) x[i] = frand() * (i % 5 == 0 ? 3.0f : 1.0f);
    static const g4_dtype from[] = {G4_Q5_0, G4_IQ4_NL, G4_Q4_1, G4_Q5_1, G4_Q5_K, G4_Q4_0, G4_Q8_0, G4_Q6_K,
                                    G4_Q2_K, G4_Q3_K, G4_IQ4_XS, G4_BF16};
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
    /* Q4_1 -> AF4 and Q5_1 -> AF8 (the CPU's layouts), Q3_K -> Q6_K (the CUDA backend's): every value the same */
    for (int k = 0; k < 3; k++) {
        const g4_dtype f = k == 2 ? G4_Q3_K : k ? G4_Q5_1 : G4_Q4_1, to = k == 2 ? G4_Q6_K : k ? G4_AF8 : G4_AF4;
        CHECK(g4_quant(f, x, src, N) == g4_dtype_row_bytes(f, N));
        g4_tensor t = {.name = "t", .dtype = f, .ndim = 2, .shape = {1, N}, .data = src};
        CHECK(g4_transcode_exact(f, to) && g4_transcode_row(&t, 0, to, dst, NULL) == g4_dtype_row_bytes(to, N));
        g4_dequant(f, src, y, N);
        g4_dequant(to, dst, z, N);
        CHECKF(!memcmp(y, z, sizeof y), "%s -> %s changes values", g4_dtype_name(f), g4_dtype_name(to));
    }
    CHECK(g4_transcode_exact(G4_Q5_0, G4_Q8_0) && g4_transcode_exact(G4_IQ4_NL, G4_Q8_0) &&
          !g4_transcode_exact(G4_Q5_K, G4_Q8_0) && !g4_transcode_exact(G4_IQ4_XS, G4_Q8_0));
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
    test_decode_hashes();
    test_transcode();
    test_encode_by_hand();
    test_round_trips();
    test_views();
    return g4t_done();
}
