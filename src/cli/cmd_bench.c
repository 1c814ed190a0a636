/* gemma4c bench -m MODEL [-p 128] [-n 64] [-r 3]
 * Prefill and decode speed of one sequence with random token ids (no tokenizer needed),
 * measured like llama-bench: a prefill of P tokens into an empty sequence, and N decode
 * steps of one token from an empty sequence; the median of R repeats of each. Also the
 * bytes of weights one decoded token reads (every matrix once, the top-k experts' share
 * of the expert tensors, one row of each embedding table; KV cache not counted) and the
 * read rate that gives at the measured decode speed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4c bench -m MODEL [-p PROMPT_TOKENS=128] [-n DECODE_TOKENS=64] [-r REPEATS=3] [-t THREADS]\n");
}

int cmd_bench(int argc, char **argv) {
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
                                         {"n-predict", required_argument, 0, 'n'}, {"repeats", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *dir = NULL;
    long P = 128, N = 64, R = 3, threads = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:r:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'p': if (cli_parse_int(optarg, "-p", 1, 1 << 16, &P)) return 1; break;
        case 'n': if (cli_parse_int(optarg, "-n", 1, 1 << 16, &N)) return 1; break;
        case 'r': if (cli_parse_int(optarg, "-r", 1, 100, &R)) return 1; break;
        case 't': if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("bench", argv);
        }
    }
    g4_model *m = cli_load_model(dir, (int)threads);
    if (!m) return 1;
    const int V = g4_model_vocab_size(m);
    g4_error err;
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = (int)(P + N), .n_batch = (int)(P < 512 ? P : 512)};
    int32_t *ids = malloc((size_t)(P + N) * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof(float));
    uint8_t *want = calloc((size_t)cp.n_batch, 1);
    int rc = 1;
    if (!ids || !logits || !want || g4_context_new(m, &cp, &ctx, &err)) {
        cli_error("%s", ids && logits && want ? err.msg : "out of memory");
        goto done;
    }
    unsigned s = 1;
    for (long i = 0; i < P + N; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = (int32_t)(3 + (s >> 8) % (unsigned)(V - 3));
    }
    double pps[100], tgs[100];
    for (long r = 0; r < R; r++) {
        g4_seq_reset(ctx, 0);
        double t0 = now_s();
        for (long i = 0; i < P; i += cp.n_batch) {
            int k = (int)(P - i < cp.n_batch ? P - i : cp.n_batch);
            want[k - 1] = 1;
            g4_batch b = {k, ids + i, NULL, want};
            if (g4_decode(ctx, &b, logits, &err)) {
                cli_error("%s", err.msg);
                goto done;
            }
            want[k - 1] = 0;
        }
        double t1 = now_s();
        g4_seq_reset(ctx, 0);
        for (long i = 0; i < N; i++) {
            g4_batch b = {1, ids + P + i, NULL, NULL};
            if (g4_decode(ctx, &b, logits, &err)) {
                cli_error("%s", err.msg);
                goto done;
            }
        }
        double t2 = now_s();
        pps[r] = (double)P / (t1 - t0);
        tgs[r] = (double)N / (t2 - t1);
    }
    double pp = median(pps, (int)R), tg = median(tgs, (int)R), bytes = g4_model_decode_bytes(m);
    printf("model %s  threads %d  repeats %ld (medians)\n", dir, threads ? (int)threads : 0, R);
    printf("prefill %ld tokens: %.1f tok/s\ndecode %ld tokens: %.1f tok/s (%.2f ms/token)\n", P, pp, N, tg, 1000.0 / tg);
    printf("weights read per decoded token: %.3f GB, %.1f GB/s\n", bytes * 1e-9, bytes * tg * 1e-9);
    rc = 0;
done:
    free(ids);
    free(logits);
    free(want);
    g4_context_free(ctx);
    g4_model_free(m);
    return rc;
}
