/* Core pieces: float conversions (IEEE facts), the thread pool, error messages. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "check.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/threadpool.h"

static void test_f16(void) {
    CHECK(g4_f32_to_f16(1.0f) == 0x3c00 && g4_f32_to_f16(-2.0f) == 0xc000);
    CHECK(g4_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(g4_f32_to_f16(65520.0f) == 0x7c00); /* rounds past the largest finite value */
    CHECK(g4_f32_to_f16(ldexpf(1, -24)) == 0x0001);
    CHECK(g4_f32_to_f16(ldexpf(1, -25)) == 0x0000);     /* tie to even */
    CHECK(g4_f32_to_f16(ldexpf(3, -26)) == 0x0001);     /* 0.75 ulp -> 1 */
    CHECK(g4_f32_to_f16(ldexpf(3, -25)) == 0x0002);     /* 1.5 ulp -> 2 (even) */
    CHECK(g4_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00); /* tie to even */
    CHECK(g4_f32_to_f16(1.0f + ldexpf(3, -11)) == 0x3c02);
    CHECK(g4_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(g4_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(isinf(g4_f16_to_f32(0x7c00)) && isnan(g4_f16_to_f32(0x7e00)));
    int round_trip = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = g4_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        round_trip &= g4_f32_to_f16(f) == h;
    }
    CHECK(round_trip);
}

static void test_bf16(void) {
    CHECK(g4_f32_to_bf16(1.0f) == 0x3f80 && g4_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(g4_f32_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80);      /* tie to even: down */
    CHECK(g4_f32_to_bf16(1.0f + ldexpf(3, -8)) == 0x3f82);      /* tie to even: up */
    CHECK(g4_f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)) == 0x3f81);
    CHECK(g4_bf16_to_f32(g4_f32_to_bf16(sqrtf(1536.0f))) == 39.25f); /* docs/gemma4-text.md 3.1 */
    CHECK(isnan(g4_bf16_to_f32(g4_f32_to_bf16(NAN))));
}

static void add_range(void *ctx, int64_t b, int64_t e, int thread) {
    atomic_llong *sum = ctx;
    long long s = 0;
    for (int64_t i = b; i < e; i++) s += i;
    atomic_fetch_add(sum, s);
}

static void test_pool(void) {
    for (int nt = 1; nt <= 4; nt++) {
        g4_pool *p = g4_pool_new(nt);
        CHECK(p && g4_pool_threads(p) == nt);
        int ok = 1;
        for (int job = 0; job < 2000; job++) { /* many short jobs: the hand-off must never lose one */
            atomic_llong sum = 0;
            int64_t n = 1 + job % 997;
            g4_pool_for(p, n, 1, add_range, &sum);
            ok &= sum == n * (n - 1) / 2;
        }
        CHECK(ok);
        g4_pool_free(p);
    }
    atomic_llong sum = 0;
    g4_pool_for(NULL, 10, 1, add_range, &sum);
    CHECK(sum == 45);
}

static void test_errors(void) {
    g4_error err;
    CHECK(g4_fail(&err, "bad %s\nsecond line", "thing") == -1);
    CHECK(!strcmp(err.msg, "bad thing second line"));
    CHECK(g4_fail_prefix(&err, "loading %d", 3) == -1);
    CHECK(!strcmp(err.msg, "loading 3: bad thing second line"));
    CHECK(g4_fail(NULL, "ignored") == -1);
    size_t out;
    CHECK(!g4_mul_ok(SIZE_MAX / 2, 3, &out) && g4_mul_ok(1000, 1000, &out) && out == 1000000);
}

int main(void) {
    test_f16();
    test_bf16();
    test_pool();
    test_errors();
    return g4t_done();
}
