/* Core pieces: float conversions (IEEE facts), the thread pool, error messages, whole-file reads of
 * what is not a regular file. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
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

static void hung(int sig) {
    (void)sig;
    static const char m[] = "test_core: reading a FIFO waited for a writer (hung)\n";
    if (write(2, m, sizeof m - 1) < 0) _exit(1);
    _exit(1);
}

/* A FIFO (which would wait for a writer), /dev/zero (which never ends) and a folder: one clear error from
 * each whole-file reader at once, as g4_map_file gives; a regular file still reads. alarm() turns a wait
 * into a failure. */
static void test_not_regular(void) {
    const char *fifo = g4t_tmp("test_core.fifo"), *text = g4t_tmp("test_core.json");
    unlink(fifo);
    CHECK(mkfifo(fifo, 0600) == 0);
    const char *paths[] = {fifo, "/dev/zero", g4t_tmp("")};
    signal(SIGALRM, hung);
    alarm(20);
    for (int i = 0; i < 3; i++) {
        g4_error err = {{0}};
        char *buf = NULL;
        size_t len = 0;
        CHECKF(g4_read_file(paths[i], &buf, &len, &err) == -1 && strstr(err.msg, "not a regular file"),
               "g4_read_file(%s): %s", paths[i], buf ? "read" : err.msg);
        free(buf);
        json_t *j = NULL;
        memset(&err, 0, sizeof err);
        CHECKF(g4_json_load_file(paths[i], &j, &err) == -1 && !j && strstr(err.msg, "not a regular file"),
               "g4_json_load_file(%s): %s", paths[i], err.msg);
        json_decref(j);
    }
    alarm(0);
    unlink(fifo);
    FILE *f = fopen(text, "w");
    CHECK(f && fputs("{\"a\": [1, 2]}", f) >= 0 && fclose(f) == 0);
    g4_error err;
    char *buf = NULL;
    size_t len = 0;
    json_t *j = NULL;
    CHECK(g4_read_file(text, &buf, &len, &err) == 0 && len == 13 && !strcmp(buf, "{\"a\": [1, 2]}"));
    CHECK(g4_json_load_file(text, &j, &err) == 0 && json_array_size(json_object_get(j, "a")) == 2);
    json_decref(j);
    CHECK(g4_json_load_file(g4t_tmp("test_core.missing.json"), &j, &err) == -1 && !j && strstr(err.msg, "missing"));
    free(buf);
    unlink(text);
}

int main(void) {
    test_f16();
    test_bf16();
    test_pool();
    test_errors();
    test_not_regular();
    return g4t_done();
}
