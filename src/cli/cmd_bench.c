/* gemma4c bench (-m DIR | --random CONFIG [--type T]) [-p 512,4096] [-c 512,8192] [-n 64] [-r 3] [--kv TYPE] [-t THREADS]
 * Speed of one sequence with arbitrary token ids, like llama-bench:
 * - prefill of each P tokens (in batches of up to 512): tokens per second, and the time to the first token
 *   (the prefill with the first generated id back);
 * - decode of N tokens after each context C (greedy, ids only): ms per token, the bytes one step must read
 *   (weights, KV rows; g4_model_decode_bytes), the bandwidth that implies, and its share of the copy bandwidth
 *   of the device measured in the same run (a device-to-device copy, bytes read plus written): the roofline.
 * --random reads no weights: random values of a config's shapes are made on the device (bench on real shapes
 * without checkpoints); --type T makes the matrices packed blocks of a quantized type (q4_0, q8_0, q4_k, q6_k,
 * mlx4, mlx8, ...: g4_load_params.random_type). Each figure is the best of R repeats, after one untimed prefill of
 * the first prompt size (the first touch of the memory-mapped weights is not timed). -n 0 skips the decode
 * measurements.
 * With --draft (a gemma4_assistant drafter), after the first prompt size: the time of a draft step, of a
 * verification step of k tokens, and greedy generation of N tokens after the prompt without and with the drafter
 * (tokens per second, acceptance). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

#define MAX_SIZES 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f, "usage: gemma4c bench (-m DIR | --random CONFIG.json [--type bf16|q4_0|q8_0|q4_k|q6_k|mlx4|mlx8])\n"
               "                     [-p PROMPTS=512] [-c CONTEXTS=512] [-n DECODE=64]\n"
               "                     [-r REPEATS=3] [--kv f32|bf16|f16] [-t THREADS] [--draft DIR [--draft-n N]]\n"
               "  PROMPTS and CONTEXTS are comma-separated token counts (e.g. -p 512,4096 -c 512,8192)\n");
}

static int parse_sizes(const char *s, const char *opt, long *out, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (1 << 20) || (*end && *end != ',') || *n == MAX_SIZES)
            return cli_error("%s: expected up to %d comma-separated counts in 1..%d, got '%s'", opt, MAX_SIZES, 1 << 20, s);
        out[(*n)++] = v;
        s = *end ? end + 1 : end;
    }
    return *n ? 0 : cli_error("%s: no value", opt);
}

/* Runs ids[0..n-1] through sequence 0 in batches; the last batch returns the first generated id. */
static int prefill(g4_context *ctx, const int32_t *ids, long n, int batch, uint8_t *want, int32_t *first, g4_error *err) {
    for (long i = 0; i < n; i += batch) {
        int k = (int)(n - i < batch ? n - i : batch);
        int last = i + k == n;
        want[k - 1] = (uint8_t)last;
        g4_batch b = {.n_tokens = k, .token = ids + i, .want_logits = want};
        int rc = last ? g4_decode_greedy(ctx, &b, first, err) : g4_decode(ctx, &b, NULL, err);
        want[k - 1] = 0;
        if (rc) return -1;
    }
    return 0;
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
            g4_batch pb = {.n_tokens = k, .token = ids + i, .want_logits = want_last + i};
            if (g4_decode_greedy(ctx, &pb, out, err)) return -1;
        }
        for (have = 1; have < n; have++) {
            g4_batch d = {.n_tokens = 1, .token = out + have - 1};
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
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = P + N + k_max + 2, .n_batch = nb, .kv_type = cli_kv_type(m)};
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
            g4_batch vb = {.n_tokens = k, .token = ids + P};
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
    enum { OPT_DRAFT = 1000, OPT_DRAFT_N, OPT_TYPE };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},  {"random", required_argument, 0, 'R'},
                                         {"prompt", required_argument, 0, 'p'}, {"context", required_argument, 0, 'c'},
                                         {"n-predict", required_argument, 0, 'n'}, {"repeats", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {"draft", required_argument, 0, OPT_DRAFT},
                                         {"draft-n", required_argument, 0, OPT_DRAFT_N},
                                         {"type", required_argument, 0, OPT_TYPE}, {0, 0, 0, 0}};
    const char *dir = NULL, *random_config = NULL, *draft_dir = NULL, *type = NULL;
    long P[MAX_SIZES] = {512}, C[MAX_SIZES] = {512}, N = 64, R = 3, threads = 0, draft_n = 0;
    int nP = 1, nC = 1, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:c:n:r:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'R': random_config = optarg; break;
        case 'p': if (parse_sizes(optarg, "-p", P, &nP)) return 1; break;
        case 'c': if (parse_sizes(optarg, "-c", C, &nC)) return 1; break;
        case 'n': if (cli_parse_int(optarg, "-n", 0, 1 << 16, &N)) return 1; break;
        case 'r': if (cli_parse_int(optarg, "-r", 1, 100, &R)) return 1; break;
        case 't': if (cli_parse_int(optarg, "--threads", 0, 1024, &threads)) return 1; break;
        case OPT_DRAFT: draft_dir = optarg; break;
        case OPT_DRAFT_N: if (cli_parse_int(optarg, "--draft-n", 1, 256, &draft_n)) return 1; break;
        case OPT_TYPE: type = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return cli_bad_option("bench", argv);
        }
    }
    if (!dir == !random_config) {
        usage(stderr);
        return cli_error("bench: give a model (-m DIR) or a config for random weights (--random CONFIG.json)");
    }
    if (type && !random_config) return cli_error("bench: --type is for random weights (--random CONFIG.json)");
    if (draft_dir && N == 0) return cli_error("bench: --draft generates tokens: give -n 1 or more");
    g4_model *m = NULL;
    if (random_config) {
        g4_error err;
        g4_load_params lp = {.n_threads = (int)threads, .device = cli_device, .random_weights = 1, .random_type = type,
                             .bf16_activations = cli_bf16_act};
        if (g4_model_load(random_config, &lp, &m, &err)) return cli_error("%s", err.msg);
    } else {
        m = cli_load_model(dir, (int)threads);
    }
    if (!m) return 1;
    const g4_kv_type kv = cli_kv_type(m); /* (--kv, a global option) */
    long most = 0;
    for (int i = 0; i < nP; i++) most = P[i] > most ? P[i] : most;
    for (int i = 0; i < nC; i++) most = C[i] > most ? C[i] : most;
    const int V = g4_model_vocab_size(m), batch = 512;
    g4_error err;
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = (int)(most + N + 8), .n_batch = batch, .kv_type = kv};
    const long n_ids = most + N + 300; /* the prompts, then tokens to decode or verify */
    int32_t *ids = malloc((size_t)n_ids * sizeof *ids);
    float *logits = draft_dir ? malloc((size_t)V * sizeof(float)) : NULL;
    uint8_t *want = calloc((size_t)batch, 1);
    int rc = 1;
    if (!ids || !want || (draft_dir && !logits) || g4_context_new(m, &cp, &ctx, &err)) {
        cli_error("%s", ids && want && (logits || !draft_dir) ? err.msg : "out of memory");
        goto done;
    }
    unsigned s = 1;
    for (long i = 0; i < n_ids; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = (int32_t)(3 + (s >> 8) % (unsigned)(V - 3));
    }
    const double bw = getenv("G4_BENCH_NO_COPY") ? 0.0 : g4_model_copy_bandwidth(m);
    printf("model %s%s%s  device %s  KV %s  activations %s  copy bandwidth %.0f GB/s\n",
           random_config ? random_config : dir, type ? "  weights " : "", type ? type : "", g4_model_device(m),
           kv == G4_KV_F32 ? "f32" : kv == G4_KV_BF16 ? "bf16" : "f16",
           cli_bf16_act ? "bf16 with BF16 weights (--bf16-act)" : "f32", bw / 1e9);
    { /* warm-up, untimed: the weights' pages are touched before anything is measured */
        int32_t first;
        g4_seq_reset(ctx, 0);
        if (prefill(ctx, ids, P[0], batch, want, &first, &err)) goto fail;
    }
    for (int i = 0; i < nP; i++) {
        double best = 1e30;
        for (long r = 0; r < R; r++) {
            int32_t first;
            g4_seq_reset(ctx, 0);
            double t0 = now_s();
            if (prefill(ctx, ids, P[i], batch, want, &first, &err)) goto fail;
            double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("prefill %6ld tokens: %10.1f tok/s   time to first token %8.2f ms\n", P[i], (double)P[i] / best,
               best * 1e3);
    }
    for (int i = 0; i < nC && N > 0; i++) {
        double best = 1e30;
        for (long r = 0; r < R; r++) {
            int32_t id;
            g4_seq_reset(ctx, 0);
            if (prefill(ctx, ids, C[i], batch, want, &id, &err)) goto fail;
            for (int w = 0; w < 3; w++) { /* warm-up: the step's recording */
                g4_batch b = {.n_tokens = 1, .token = &id};
                if (g4_decode_greedy(ctx, &b, &id, &err)) goto fail;
            }
            double t0 = now_s();
            for (long j = 0; j < N; j++) {
                g4_batch b = {.n_tokens = 1, .token = &id};
                if (g4_decode_greedy(ctx, &b, &id, &err)) goto fail;
            }
            double t = (now_s() - t0) / (double)N;
            if (t < best) best = t;
        }
        const double bytes = g4_model_decode_bytes(m, (int)C[i] + 3 + (int)N / 2, kv);
        printf("decode at context %6ld: %8.3f ms/token  %7.1f tok/s  reads %.2f GB/token  %6.1f GB/s", C[i],
               best * 1e3, 1.0 / best, bytes / 1e9, bytes / best / 1e9);
        if (bw > 0) printf("  %5.1f%% of copy bandwidth", 100.0 * bytes / best / bw);
        printf("\n");
    }
    g4_context_free(ctx); /* the drafter's run has its own context */
    ctx = NULL;
    rc = draft_dir ? bench_draft(m, draft_dir, (int)draft_n, ids, (int)P[0], (int)N, (int)R, logits) : 0;
    goto done;
fail:
    cli_error("%s", err.msg);
done:
    free(ids);
    free(logits);
    free(want);
    g4_context_free(ctx);
    g4_model_free(m);
    return rc;
}
