/* Throughput of the scheduler (g4_scheduler, gemma4c.h only): C concurrent greedy requests of random prompts
 * for each C of a list, and the prefill time of a prompt found in the prefix cache against the same prompt cold.
 * bench/batch_speed.sh runs it and prints the ratios; run it alone with --help for the options.
 *
 * Per concurrency C: C requests of -p random prompt ids and -n new tokens each (greedy, eos ignored), all
 * submitted at once to a scheduler whose context has C sequences; output tok/s = C * n / wall time from submit
 * to the last token; decode tok/s = tokens made after every request had its first one / the time since;
 * tok/cpu-s = C * n / CPU seconds of the process (all threads), steadier than the wall clock on a shared machine.
 * Prefix: a prompt of --prefix ids + 16 more, cold (no cached prefix) and right after a request for the first
 * --prefix ids ran (its blocks cached): time to the first token of each, and the tokens reused. */
#include <errno.h>
#include <gemma4c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU seconds of every thread of the process: on a shared machine a steadier measure than the wall clock */
static double cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static uint64_t rng = 88172645463325252ull;
static int32_t random_id(int vocab) { /* xorshift; ids 3.. to keep clear of pad/eos/bos */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return 3 + (int32_t)(rng % (uint64_t)(vocab - 3));
}

typedef struct {
    double first; /* time of the first token, 0 before */
    int tokens;
    uint64_t hash; /* of its ids in order: two runs that print the same hashes made the same tokens */
} tracker;

static int on_event(const g4_event *ev, void *user) {
    tracker *t = user;
    if (ev->kind != G4_EVENT_TOKEN) return 0;
    if (t->tokens++ == 0) t->first = now();
    t->hash = (t->hash ^ (uint64_t)(uint32_t)ev->token) * 0x100000001b3ull; /* FNV-1a over the ids */
    return 0;
}

typedef struct {
    const char *device;
    int threads, prompt, n_new, batch, block, prefix;
    g4_kv_type kv_type;
    float temperature, top_p; /* the requests' sampling (temperature 0: greedy) */
    int top_k;
    float presence, frequency, repetition; /* penalties (OpenAI's presence / frequency, transformers' repetition) */
    int penalty_last_n;
} options;

static int run_all(g4_scheduler *s, g4_error *err) {
    int left;
    while ((left = g4_scheduler_step(s, err)) > 0) {}
    return left;
}

static int new_scheduler(g4_model *m, const options *o, int n_seq, int n_ctx, g4_context **ctx, g4_scheduler **s,
                         g4_error *err) {
    g4_context_params cp = {.n_seq_max = n_seq, .n_ctx = n_ctx, .n_batch = o->batch, .kv_history = -1,
                            .kv_block_size = o->block, .kv_type = o->kv_type};
    *s = NULL;
    if (g4_context_new(m, &cp, ctx, err)) return -1;
    if (g4_scheduler_new(*ctx, s, err)) {
        g4_context_free(*ctx);
        return -1;
    }
    return 0;
}

/* C concurrent requests; prints one line unless quiet. */
static int concurrency(g4_model *m, const options *o, int C, int quiet) {
    g4_error err;
    g4_context *ctx;
    g4_scheduler *s;
    if (new_scheduler(m, o, C, o->prompt + o->n_new + 8, &ctx, &s, &err)) {
        fprintf(stderr, "C=%d: %s\n", C, err.msg);
        return -1;
    }
    const int V = g4_model_vocab_size(m);
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = o->temperature, sp.top_k = o->top_k, sp.top_p = o->top_p;
    sp.presence_penalty = o->presence, sp.frequency_penalty = o->frequency, sp.repetition_penalty = o->repetition;
    sp.penalty_last_n = o->penalty_last_n;
    g4_generation_params gp = {.max_new_tokens = o->n_new, .sampling = &sp, .ignore_eos = 1,
                               .penalties_output_only = 1}; /* as the server: OpenAI's penalties */
    tracker *t = calloc((size_t)C, sizeof *t);
    g4_generation **g = calloc((size_t)C, sizeof *g);
    int32_t *ids = malloc((size_t)o->prompt * sizeof *ids);
    int rc = 0;
    const double t0 = now(), c0 = cpu_now();
    for (int i = 0; i < C && !rc; i++) {
        for (int j = 0; j < o->prompt; j++) ids[j] = random_id(V);
        rc = g4_scheduler_submit(s, ids, o->prompt, &gp, on_event, &t[i], &g[i], &err);
    }
    if (!rc) rc = run_all(s, &err);
    const double t1 = now(), c1 = cpu_now();
    if (rc) fprintf(stderr, "C=%d: %s\n", C, err.msg);
    long out = 0, after = 0;
    double all_first = t0;
    uint64_t hash = 0;
    for (int i = 0; i < C; i++) {
        hash += t[i].hash;
        out += t[i].tokens;
        if (t[i].first > all_first) all_first = t[i].first;
    }
    /* tokens made after every request had its first one: approximately (n - 1) per request at the end */
    for (int i = 0; i < C; i++) after += t[i].tokens - 1;
    g4_scheduler_stats st;
    g4_scheduler_get_stats(s, &st);
    double decode = t1 > all_first ? (double)after / (t1 - all_first) : 0;
    if (!rc && !quiet)
        printf("concurrency %4d  prompt %5d  new %5d  wall %8.2f s  output %10.3f tok/s  decode %10.3f tok/s  "
               "cpu %8.2f s  output %10.3f tok/cpu-s  steps %ld  in steps %.2f s  model %.2f s  ids %016llx\n",
               C, o->prompt, o->n_new, t1 - t0, (double)out / (t1 - t0), decode, c1 - c0, (double)out / (c1 - c0),
               st.steps, st.step_seconds, st.model_seconds, (unsigned long long)hash);
    for (int i = 0; i < C; i++) g4_generation_free(g[i]);
    free(t);
    free(g);
    free(ids);
    g4_scheduler_free(s);
    g4_context_free(ctx);
    return rc;
}

/* Time to the first token of one request (prefill), and the tokens it found cached. */
static double first_token(g4_scheduler *s, const int32_t *ids, int n, long *reused, g4_error *err) {
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = 1, .sampling = &sp, .ignore_eos = 1};
    g4_scheduler_stats before, after;
    g4_scheduler_get_stats(s, &before);
    tracker t = {0};
    g4_generation *g;
    const double t0 = now();
    if (g4_scheduler_submit(s, ids, n, &gp, on_event, &t, &g, err) || run_all(s, err)) return -1;
    g4_generation_free(g);
    g4_scheduler_get_stats(s, &after);
    *reused = after.reused_tokens - before.reused_tokens;
    return t.first - t0;
}

static int prefix(g4_model *m, const options *o) {
    g4_error err;
    g4_context *ctx;
    g4_scheduler *s;
    const int L = o->prefix, n = L + 16, V = g4_model_vocab_size(m);
    if (new_scheduler(m, o, 2, n + 8, &ctx, &s, &err)) {
        fprintf(stderr, "prefix: %s\n", err.msg);
        return -1;
    }
    int32_t *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    for (int j = 0; j < n; j++) a[j] = random_id(V), b[j] = random_id(V);
    long r_cold, r_first, r_hit;
    double cold = first_token(s, b, n, &r_cold, &err);  /* nothing of b is cached */
    double first = first_token(s, a, L, &r_first, &err); /* caches a's first L ids */
    double hit = first_token(s, a, n, &r_hit, &err);     /* finds them */
    int rc = cold < 0 || first < 0 || hit < 0 ? -1 : 0;
    if (rc) fprintf(stderr, "prefix: %s\n", err.msg);
    else
        printf("prefix %5d + 16  cold %8.3f s (reused %ld)  hit %8.3f s (reused %ld)  cold/hit %6.2f\n", L, cold,
               r_cold, hit, r_hit, hit > 0 ? cold / hit : 0);
    (void)first;
    free(a);
    free(b);
    g4_scheduler_free(s);
    g4_context_free(ctx);
    return rc;
}

static void usage(void) {
    fprintf(stderr, "usage: g4-batch-bench (-m DIR | --random CONFIG.json [--type bf16|q4_0|...]) [--device cpu|cuda]\n"
                    "                      [-t THREADS] [-c 1,4,16,64] [-p PROMPT_TOKENS] [-n NEW_TOKENS] [--batch N]\n"
                    "                      [--block B] [--prefix TOKENS] [--kv f32|bf16|f16] [--bf16-act 0|1]\n"
                    "                      [--temp T --top-k K --top-p P] (default: greedy)\n"
                    "                      [--presence P --frequency F --repetition R --last-n N] (penalties; last-n -1: all)\n"
                    "--random: random weights of a config's shapes, made where they live (g4_load_params.random_weights)\n"
                    "--batch: the step's token budget (default as the server's: 2048 on a GPU, 512 on the CPU)\n");
}

/* A whole number in lo..hi, or a float, for option `opt` (else a one-line error). */
static int int_arg(const char *opt, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return fprintf(stderr, "g4-batch-bench: %s must be a whole number in %ld..%ld, not '%s'\n", opt, lo, hi, v), -1;
    *out = (int)x;
    return 0;
}

static int float_arg(const char *opt, const char *v, float *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        return fprintf(stderr, "g4-batch-bench: %s must be a number, not '%s'\n", opt, v), -1;
    *out = (float)x;
    return 0;
}

int main(int argc, char **argv) {
    options o = {.prompt = 64, .n_new = 32, .batch = 0, .block = 32, .prefix = 512, .kv_type = G4_KV_F32,
                 .top_p = 1.0f, .repetition = 1.0f, .penalty_last_n = -1};
    const char *dir = NULL, *random_config = NULL, *type = NULL, *list = "1,4,16,64";
    int bf16_act = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(), 0;
        if (!v) return usage(), 2;
        if (!strcmp(a, "-m")) dir = v;
        else if (!strcmp(a, "--random")) random_config = v;
        else if (!strcmp(a, "--type")) type = v;
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "-c")) list = v;
        else if (!strcmp(a, "--kv")) {
            if (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "f16"))
                o.kv_type = !strcmp(v, "bf16") ? G4_KV_BF16 : !strcmp(v, "f16") ? G4_KV_F16 : G4_KV_F32;
            else
                return fprintf(stderr, "g4-batch-bench: --kv takes f32, bf16 or f16, not '%s'\n", v), 2;
        } else if (!strcmp(a, "--bf16-act") ? int_arg(a, v, 0, 1, &bf16_act)
                   : !strcmp(a, "--top-k")  ? int_arg(a, v, 0, 1 << 20, &o.top_k)
                   : !strcmp(a, "--last-n") ? int_arg(a, v, -1, 1 << 24, &o.penalty_last_n)
                   : !strcmp(a, "-t")       ? int_arg(a, v, 0, 1024, &o.threads)
                   : !strcmp(a, "-p")       ? int_arg(a, v, 1, 1 << 20, &o.prompt)
                   : !strcmp(a, "-n")       ? int_arg(a, v, 1, 1 << 20, &o.n_new)
                   : !strcmp(a, "--batch")  ? int_arg(a, v, 0, 1 << 20, &o.batch)
                   : !strcmp(a, "--block")  ? int_arg(a, v, 1, 1 << 16, &o.block)
                   : !strcmp(a, "--prefix") ? int_arg(a, v, 0, 1 << 20, &o.prefix)
                   : !strcmp(a, "--temp")   ? float_arg(a, v, &o.temperature)
                   : !strcmp(a, "--top-p")  ? float_arg(a, v, &o.top_p)
                   : !strcmp(a, "--presence")   ? float_arg(a, v, &o.presence)
                   : !strcmp(a, "--frequency")  ? float_arg(a, v, &o.frequency)
                   : !strcmp(a, "--repetition") ? float_arg(a, v, &o.repetition)
                   : (usage(), 1))
            return 2;
        i++;
    }
    if (!dir == !random_config || (type && !random_config) || o.prompt < 1 || o.n_new < 1 || o.prefix < 0)
        return usage(), 2;
    int conc[64], n_conc = 0; /* -c: the concurrencies */
    for (const char *p = list;;) {
        char *end;
        errno = 0;
        long C = strtol(p, &end, 10);
        if (errno || end == p || (*end && *end != ',') || C < 1 || C > 100000 || n_conc == 64)
            return fprintf(stderr, "g4-batch-bench: -c takes up to 64 concurrencies 1..100000, separated by commas, "
                                   "not '%s'\n", list), 2;
        conc[n_conc++] = (int)C;
        if (!*end) break;
        p = end + 1;
    }
    if (random_config) dir = random_config;
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = o.threads, .device = o.device, .random_weights = random_config != NULL,
                         .random_type = type, .bf16_activations = bf16_act};
    if (g4_model_load(dir, &lp, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (o.batch <= 0) o.batch = strcmp(g4_model_device(m), "cpu") ? 2048 : 512; /* as the server (src/server/engine.c) */
    printf("model %s  layers %d  hidden %d  vocab %d  kv-block %d  batch %d\n", dir, g4_model_n_layers(m),
           g4_model_hidden_size(m), g4_model_vocab_size(m), o.block, o.batch);
    int rc = 0;
    options warm = o; /* the weights paged in, the scratch grown */
    warm.prompt = 8;
    warm.n_new = 2;
    rc |= concurrency(m, &warm, 2, 1);
    for (int k = 0; k < n_conc && !rc; k++) rc |= concurrency(m, &o, conc[k], 0);
    if (!rc && o.prefix > 0) rc |= prefix(m, &o);
    fflush(stdout);
    g4_model_free(m);
    return rc ? 1 : 0;
}
