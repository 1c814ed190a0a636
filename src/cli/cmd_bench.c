/* gemma4c bench -m MODEL [-p 128] [-n 64] [-r 3] [--draft DIR [--draft-n N]]
 * Prefill and decode speed of one sequence with random token ids (no tokenizer needed),
 * measured like llama-bench: a prefill of P tokens into an empty sequence, and N decode
 * steps of one token from an empty sequence (-p 0 / -n 0 skip one); after a warm-up of each (the
 * prefill, one decode step), the median of R repeats. Also the
 * bytes of weights one decoded token reads (every matrix once, the top-k experts' share
 * of the expert tensors, one row of each embedding table; KV cache not counted) and the
 * read rate that gives at the measured decode speed.
 * With --draft (a gemma4_assistant drafter): the time of a draft step, of a verification step of k tokens, and
 * greedy generation of N tokens after the prompt without and with the drafter (tokens per second, acceptance). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    fprintf(f, "usage: gemma4c bench -m MODEL [-p PROMPT_TOKENS=128] [-n DECODE_TOKENS=64] [-r REPEATS=3] [-t THREADS]\n"
               "                     [--draft DIR [--draft-n DRAFTS_PER_ROUND]]\n");
}

/* Greedy generation of n tokens after the prompt (ids[0..P-1]), plain (spec NULL) or speculative; seconds. */
static double generate(g4_context *ctx, int n_batch, g4_spec *spec, const int32_t *ids, int P, int n, int V,
                       float *logits, const uint8_t *want_last, int32_t *out, g4_error *err) {
    g4_seq_reset(ctx, 0);
    double t0 = now_s();
    int have = 0;
    if (spec) {
        if (g4_spec_prefill(spec, ids, P, logits, err)) return -1;
        int32_t best = 0;
        for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
        out[have++] = best;
        while (have < n) {
            int k;
            if (g4_spec_round(spec, out[have - 1], n - have, NULL, out + have, &k, err)) return -1;
            have += k;
        }
    } else {
        for (int i = 0; i < P; i += n_batch) { /* the prompt in batches, the last row's argmax */
            int k = P - i < n_batch ? P - i : n_batch;
            g4_batch pb = {k, ids + i, NULL, want_last + i};
            if (g4_decode_greedy(ctx, &pb, out, err)) return -1;
        }
        for (have = 1; have < n; have++) {
            g4_batch d = {1, out + have - 1, NULL, NULL};
            if (g4_decode_greedy(ctx, &d, out + have, err)) return -1;
        }
    }
    return now_s() - t0;
}

/* The drafter's costs and speculative generation against plain generation. */
static int bench_draft(g4_model *m, const char *draft_dir, int n_draft, const int32_t *ids, int P, int N, int R,
                       float *logits) {
    g4_error err;
    g4_drafter *d = NULL;
    g4_context *ctx = NULL;
    g4_spec *spec = NULL;
    int32_t *a = malloc((size_t)(N + 300) * sizeof *a), *b = malloc((size_t)(N + 300) * sizeof *b);
    uint8_t *want = malloc((size_t)P);
    int rc = 1;
    if (!a || !b || !want || g4_drafter_load(draft_dir, m, &d, &err)) {
        cli_error("%s", a && b && want ? err.msg : "out of memory");
        goto done;
    }
    const int V = g4_model_vocab_size(m), k_max = n_draft ? n_draft : g4_drafter_n_draft(d);
    int nb = P < 512 ? P : 512;
    if (nb < k_max + 1) nb = k_max + 1;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = P + N + k_max + 2, .n_batch = nb};
    g4_spec_params sp = {.n_draft = n_draft};
    if (g4_context_new(m, &cp, &ctx, &err) || g4_spec_new(ctx, 0, d, &sp, &spec, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    /* after one prefill: a draft step (k_max steps, per step), and a verification step of k tokens at position P,
     * rolled back each time */
    double best_step = 1e30, best_one = 1e30;
    g4_seq_reset(ctx, 0);
    if (g4_spec_prefill(spec, ids, P, logits, &err)) goto fail;
    for (int r = 0; r < R; r++) {
        double t0 = now_s();
        if (k_max && g4_spec_draft(spec, ids[P], k_max, a, &err)) goto fail;
        double t = (now_s() - t0) / (k_max ? k_max : 1);
        best_step = t < best_step ? t : best_step;
    }
    printf("drafter %s: %d drafts per round\n", draft_dir, k_max);
    printf("%-28s %10s %10s\n", "step", "ms", "x 1 token");
    for (int k = 1; k <= k_max + 1; k = k < 4 ? k + 1 : k * 2 > k_max + 1 && k < k_max + 1 ? k_max + 1 : k * 2) {
        double best = 1e30;
        for (int r = 0; r < R; r++) {
            g4_batch vb = {k, ids + P, NULL, NULL};
            double t0 = now_s();
            if (g4_decode_greedy(ctx, &vb, b, &err) || g4_seq_truncate(ctx, 0, P, &err)) goto fail;
            double t = now_s() - t0;
            best = t < best ? t : best;
        }
        if (k == 1) best_one = best;
        char what[64];
        snprintf(what, sizeof what, "verify %d token%s", k, k > 1 ? "s" : "");
        printf("%-28s %10.3f %10.2f\n", what, 1e3 * best, best / best_one);
    }
    printf("%-28s %10.3f %10.2f\n", "draft step", 1e3 * best_step, best_step / best_one);
    /* greedy generation without and with the drafter (same prompt, same output) */
    double t_plain = 1e30, t_spec = 1e30;
    for (int i = 0; i < P; i++) want[i] = i == P - 1;
    for (int r = 0; r < R; r++) {
        double tp = generate(ctx, nb, NULL, ids, P, N, V, logits, want, a, &err);
        double ts = tp < 0 ? -1 : generate(ctx, nb, spec, ids, P, N, V, logits, want, b, &err);
        if (tp < 0 || ts < 0) goto fail;
        t_plain = tp < t_plain ? tp : t_plain;
        t_spec = ts < t_spec ? ts : t_spec;
    }
    const int *drafted, *accepted;
    int n_rounds;
    long sd = 0, sa = 0;
    g4_spec_rounds(spec, &drafted, &accepted, &n_rounds);
    for (int i = 0; i < n_rounds; i++) sd += drafted[i], sa += accepted[i];
    int same = !memcmp(a, b, (size_t)N * sizeof *a);
    printf("greedy %d tokens after %d (prefill included): plain %.1f tok/s, speculative %.1f tok/s (x%.2f); "
           "%d rounds, %ld of %ld drafts accepted (%.1f%%), %.2f tokens per round; outputs %s\n",
           N, P, N / t_plain, N / t_spec, t_plain / t_spec, n_rounds, sa, sd, sd ? 100.0 * sa / sd : 0.0,
           n_rounds ? (double)N / (n_rounds + 1) : 0.0, same ? "identical" : "DIFFER");
    rc = 0;
    goto done;
fail:
    cli_error("%s", err.msg);
done:
    g4_spec_free(spec);
    g4_context_free(ctx);
    g4_drafter_free(d);
    free(a);
    free(b);
    free(want);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    enum { OPT_DRAFT = 1000, OPT_DRAFT_N };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
                                         {"n-predict", required_argument, 0, 'n'}, {"repeats", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {"draft", required_argument, 0, OPT_DRAFT},
                                         {"draft-n", required_argument, 0, OPT_DRAFT_N}, {0, 0, 0, 0}};
    const char *dir = NULL, *draft_dir = NULL;
    long P = 128, N = 64, R = 3, threads = 0, draft_n = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:r:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'p': if (cli_parse_int(optarg, "-p", 0, 1 << 16, &P)) return 1; break;
        case 'n': if (cli_parse_int(optarg, "-n", 0, 1 << 16, &N)) return 1; break;
        case 'r': if (cli_parse_int(optarg, "-r", 1, 100, &R)) return 1; break;
        case 't': if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1; break;
        case OPT_DRAFT: draft_dir = optarg; break;
        case OPT_DRAFT_N: if (cli_parse_int(optarg, "--draft-n", 1, 256, &draft_n)) return 1; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("bench", argv);
        }
    }
    g4_model *m = cli_load_model(dir, (int)threads);
    if (!m) return 1;
    const int V = g4_model_vocab_size(m);
    g4_error err;
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = (int)(P + N + 1), .n_batch = (int)(P < 1 ? 1 : P < 512 ? P : 512)};
    int32_t *ids = malloc((size_t)(P + N + 300) * sizeof *ids); /* the prompt, then tokens to decode or verify */
    float *logits = malloc((size_t)V * sizeof(float));
    uint8_t *want = calloc((size_t)cp.n_batch, 1);
    int rc = 1;
    if (!ids || !logits || !want || g4_context_new(m, &cp, &ctx, &err)) {
        cli_error("%s", ids && logits && want ? err.msg : "out of memory");
        goto done;
    }
    unsigned s = 1;
    for (long i = 0; i < P + N + 300; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = (int32_t)(3 + (s >> 8) % (unsigned)(V - 3));
    }
    double pps[100], tgs[100];
    for (long r = -1; r < R; r++) { /* r = -1: a warm-up (the prefill, one decode step), as llama-bench does */
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
        for (long i = 0; i < (r < 0 && N ? 1 : N); i++) {
            g4_batch b = {1, ids + P + i, NULL, NULL};
            if (g4_decode(ctx, &b, logits, &err)) {
                cli_error("%s", err.msg);
                goto done;
            }
        }
        double t2 = now_s();
        if (r < 0) continue;
        pps[r] = (double)P / (t1 - t0);
        tgs[r] = (double)N / (t2 - t1);
    }
    double pp = median(pps, (int)R), tg = median(tgs, (int)R), bytes = g4_model_decode_bytes(m);
    printf("model %s  threads %d  repeats %ld (medians)\n", dir, threads ? (int)threads : 0, R);
    if (P) printf("prefill %ld tokens: %.1f tok/s\n", P, pp);
    if (N) printf("decode %ld tokens: %.1f tok/s (%.2f ms/token)\n", N, tg, 1000.0 / tg);
    printf("weights read per decoded token: %.3f GB", bytes * 1e-9);
    if (N) printf(", %.1f GB/s", bytes * tg * 1e-9);
    printf("\n");
    rc = draft_dir ? bench_draft(m, draft_dir, (int)draft_n, ids, (int)P, (int)N, (int)R, logits) : 0;
done:
    free(ids);
    free(logits);
    free(want);
    g4_context_free(ctx);
    g4_model_free(m);
    return rc;
}
