/* The public API (gemma4c.h) on a fixture (no tokenizer: ids only): greedy generation equals
 * transformers' greedy ids, stop ids and limits, the cached prefix of a later request, the
 * embedding equals the mean of transformers' final hidden states, cancellation (before the
 * prompt, from the callback, from another thread while generating) returns promptly and, in
 * the sanitizer build, leaks nothing; step-by-step generation; log-probabilities equal the
 * log-softmax of transformers' logits; penalties on the output only; bad requests are one-line errors. The text side (chat,
 * streaming) runs on the example model in test_api_examples.sh and the Python tests. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gemma4c.h"
#include "reference.h"

static const char *FIXTURE = "fixtures/dense-ple";

typedef struct {
    g4_tensor_set set;
    int32_t *ids, *greedy;
    size_t n_ids, n_greedy;
    float *final_norm, *logits; /* [T][H], [T][V] */
} reference;

static int load_reference(reference *r) {
    char path[4096];
    g4_error err;
    snprintf(path, sizeof path, "%s/reference.safetensors", g4t_shared(FIXTURE));
    memset(r, 0, sizeof *r);
    if (g4_safetensors_add_file(&r->set, path, &err) || g4_tensor_set_finish(&r->set, &err)) return -1;
    r->ids = ref_ids(&r->set, "input_ids", &r->n_ids);
    r->greedy = ref_ids(&r->set, "greedy_ids", &r->n_greedy);
    r->final_norm = ref_f32(&r->set, "final_norm", NULL);
    r->logits = ref_f32(&r->set, "logits", NULL);
    return r->ids && r->greedy && r->final_norm && r->logits ? 0 : -1;
}

static void free_reference(reference *r) {
    free(r->ids);
    free(r->greedy);
    free(r->final_norm);
    free(r->logits);
    g4_tensor_set_free(&r->set);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int one_line(const g4_error *err) { return err->msg[0] && !strchr(err->msg, '\n'); }

static g4_sampler_params greedy_params(void) {
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    return sp;
}

/* Runs a generation to its end; returns the number of tokens (or -1 on error). */
static int run_all(g4_generation *g, int32_t *tokens, int cap) {
    g4_event ev;
    g4_error err;
    int n = 0, rc;
    while ((rc = g4_generation_next(g, &ev, &err)) == 1) {
        CHECK(ev.text != NULL && ev.text[ev.len] == 0);
        if (ev.kind == G4_EVENT_TOKEN && n < cap) tokens[n++] = ev.token;
        CHECKF(ev.kind == G4_EVENT_TOKEN, "a model without a tokenizer makes text events (%d)", ev.kind);
    }
    CHECKF(rc == 0, "generation failed: %s", err.msg);
    return rc ? -1 : n;
}

static void test_version(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", G4_VERSION_MAJOR, G4_VERSION_MINOR, G4_VERSION_PATCH);
    CHECK(!strcmp(g4_version(), G4_VERSION) && !strcmp(want, G4_VERSION));
}

static void test_generation(g4_model *m, const reference *r) {
    g4_error err;
    g4_context *ctx;
    /* n_batch 64: the sliding layers' ring (window - 1 + n_batch rows) can roll back a reply */
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 256, .n_batch = 64};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    /* the KV bytes a context would take, said before it is made; the backend's memory */
    CHECKF(g4_kv_bytes_needed(m, &cp, &err) == g4_kv_bytes(ctx) && g4_kv_bytes(ctx) > 0, "%zu bytes said, %zu taken",
           g4_kv_bytes_needed(m, &cp, &err), g4_kv_bytes(ctx));
    g4_context_params bad = {.n_seq_max = -1};
    CHECK(g4_kv_bytes_needed(m, &bad, &err) == 0 && strstr(err.msg, "negative"));
    size_t mem_free = 0, mem_total = 0, fit_kv = 0;
    CHECK(g4_model_memory(m, &mem_free, &mem_total, &err) == 0 && mem_total > 0 && mem_free <= mem_total);
    /* sequences that fit: their KV cache, and the reserve for the steps, within the free memory (or just one) */
    const int fit = g4_context_fit_sequences(m, &cp, 3, &fit_kv, &err);
    g4_context_params fit_cp = cp;
    fit_cp.n_seq_max = fit;
    CHECKF(fit >= 1 && fit <= 3 && fit_kv == g4_kv_bytes_needed(m, &fit_cp, &err) &&
               (fit == 1 || fit_kv + G4_STEP_RESERVE_BYTES <= mem_free),
           "%d sequences fit, %zu bytes, %zu free", fit, fit_kv, mem_free);
    const int n_prompt = (int)r->n_ids, n_greedy = (int)r->n_greedy;
    g4_sampler_params sp = greedy_params();
    g4_generation_params gp = {.max_new_tokens = n_greedy, .sampling = &sp, .ignore_eos = 1};
    int32_t got[64];

    /* greedy: transformers' ids, finish LENGTH, the events mirror g4_generation_tokens */
    g4_generation *g;
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    CHECK(g4_generation_finish(g) == G4_FINISH_NONE && g4_generation_n_cached(g) == 0);
    int n = run_all(g, got, 64);
    int nt;
    const int32_t *toks = g4_generation_tokens(g, &nt);
    CHECKF(n == n_greedy && nt == n && !memcmp(got, r->greedy, (size_t)n * sizeof *got) &&
               !memcmp(toks, got, (size_t)n * sizeof *got),
           "%d greedy tokens, want %d", n, n_greedy);
    CHECK(g4_generation_finish(g) == G4_FINISH_LENGTH);
    g4_event ev;
    CHECK(g4_generation_next(g, &ev, &err) == 0); /* finished stays finished */
    /* the last token is not fed: the sequence holds the prompt and all but the last token */
    int held;
    const int32_t *seq_ids = g4_seq_tokens(ctx, 0, &held);
    CHECK(held == n_prompt + n_greedy - 1 && !memcmp(seq_ids, r->ids, (size_t)n_prompt * sizeof *seq_ids));
    g4_generation_free(g);

    /* the same request again: the whole prompt is cached but its last token (for the logits) */
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    CHECK(g4_generation_n_cached(g) == n_prompt - 1);
    CHECK(run_all(g, got, 64) == n_greedy && !memcmp(got, r->greedy, (size_t)n_greedy * sizeof *got));
    g4_generation_free(g);

    /* the prompt plus 5 greedy tokens continues with the rest of the greedy ids, the prompt cached */
    int32_t longer[512];
    memcpy(longer, r->ids, (size_t)n_prompt * sizeof *longer);
    memcpy(longer + n_prompt, r->greedy, 5 * sizeof *longer);
    gp.max_new_tokens = n_greedy - 5;
    CHECK(g4_generation_start(ctx, 0, longer, n_prompt + 5, &gp, &g, &err) == 0);
    CHECKF(g4_generation_n_cached(g) == n_prompt + 4, "cached %d of %d", g4_generation_n_cached(g), n_prompt + 5);
    CHECK(run_all(g, got, 64) == n_greedy - 5 && !memcmp(got, r->greedy + 5, (size_t)(n_greedy - 5) * sizeof *got));
    g4_generation_free(g);

    /* another sequence of the same context is independent */
    gp.max_new_tokens = 6;
    CHECK(g4_generation_start(ctx, 1, r->ids, n_prompt, &gp, &g, &err) == 0);
    CHECK(g4_generation_n_cached(g) == 0 && run_all(g, got, 64) == 6 && !memcmp(got, r->greedy, 6 * sizeof *got));
    g4_generation_free(g);

    /* a stop id ends it after that token (reported, finish STOP) */
    gp.max_new_tokens = 0;
    gp.stop_ids = &r->greedy[3];
    gp.n_stop_ids = 1;
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    int first = 0;
    while (first < 3 && r->greedy[first] != r->greedy[3]) first++;
    CHECK(run_all(g, got, 64) == first + 1 && g4_generation_finish(g) == G4_FINISH_STOP);
    g4_generation_free(g);
    gp.stop_ids = NULL;
    gp.n_stop_ids = 0;

    g4_context_free(ctx);
}

/* ---------------------------------------------------------------- cancel */

typedef struct {
    int tokens, stop_at;
} counting;

static int count_tokens(const g4_event *ev, void *user) {
    counting *c = user;
    if (ev->kind == G4_EVENT_TOKEN) c->tokens++;
    return c->stop_at && c->tokens == c->stop_at;
}

typedef struct {
    g4_generation *g;
    atomic_int tokens;
    double end;
    int rc;
} runner;

/* A top-k sampler fed each step's top candidates (G4_SAMPLE_CANDIDATES=1: the path the logits in device memory
 * take, here on the CPU) draws what it draws from whole rows (=0), from the same seed; with penalties and a bias
 * too (the logits of those ids gathered besides the candidates). */
static void sampled_candidates(g4_model *m, const reference *r, int mods) {
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 256, .n_batch = 64};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 1.2f, sp.top_k = 20, sp.top_p = 0.9f, sp.seed = 7;
    int32_t bias_ids[2] = {3, 9};
    float bias_vals[2] = {2.5f, -INFINITY};
    if (mods) {
        sp.repetition_penalty = 1.5f, sp.frequency_penalty = 0.3f, sp.penalty_last_n = -1;
        sp.n_bias = 2, sp.bias_ids = bias_ids, sp.bias_values = bias_vals;
    }
    g4_generation_params gp = {.max_new_tokens = 24, .sampling = &sp, .ignore_eos = 1};
    int32_t got[2][64];
    int n[2];
    for (int pass = 0; pass < 2; pass++) {
        setenv("G4_SAMPLE_CANDIDATES", pass ? "1" : "0", 1);
        g4_generation *g;
        CHECK(g4_generation_start(ctx, 0, r->ids, (int)r->n_ids, &gp, &g, &err) == 0);
        n[pass] = run_all(g, got[pass], 64);
        g4_generation_free(g);
    }
    unsetenv("G4_SAMPLE_CANDIDATES");
    CHECKF(n[0] == 24 && n[1] == 24 && !memcmp(got[0], got[1], 24 * sizeof(int32_t)),
           "sampled from candidates (modified ids: %d): %d tokens, from rows: %d, or they differ", mods, n[1], n[0]);
    g4_context_free(ctx);
}

static void *generate_in_thread(void *arg) {
    runner *r = arg;
    g4_event ev;
    g4_error err;
    while ((r->rc = g4_generation_next(r->g, &ev, &err)) == 1)
        if (ev.kind == G4_EVENT_TOKEN) atomic_fetch_add(&r->tokens, 1);
    r->end = now_s();
    return NULL;
}

static void test_cancel(g4_model *m, const reference *r) {
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_ctx = 4096, .n_batch = 16};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const int n_prompt = (int)r->n_ids;
    g4_sampler_params sp = greedy_params();
    g4_generation_params gp = {.sampling = &sp, .ignore_eos = 1};
    g4_generation *g;

    /* cancelled before it starts: the prompt is not even run */
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    g4_generation_cancel(g);
    g4_event ev;
    CHECK(g4_generation_next(g, &ev, &err) == 0 && g4_generation_finish(g) == G4_FINISH_CANCELLED);
    CHECK(g4_seq_length(ctx, 0) == 0);
    g4_generation_free(g);

    /* the callback asks to stop at the 7th token: nothing more is generated */
    counting c = {0, 7};
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    CHECK(g4_generation_run(g, count_tokens, &c, &err) == 0);
    int n;
    g4_generation_tokens(g, &n);
    CHECKF(n == 7 && c.tokens == 7 && g4_generation_finish(g) == G4_FINISH_CANCELLED, "%d tokens after cancel at 7", n);
    g4_generation_free(g);

    /* from another thread, in the middle of a long generation (up to ~4000 tokens) */
    runner run = {0};
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &run.g, &err) == 0);
    pthread_t th;
    pthread_create(&th, NULL, generate_in_thread, &run);
    while (atomic_load(&run.tokens) < 20) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    double t0 = now_s();
    g4_generation_cancel(run.g);
    pthread_join(th, NULL);
    double latency = run.end - t0;
    g4_generation_tokens(run.g, &n);
    printf("cancelled from another thread after %d tokens; returned %.1f ms after the cancel\n", n, 1e3 * latency);
    CHECK(run.rc == 0 && g4_generation_finish(run.g) == G4_FINISH_CANCELLED);
    CHECKF(n >= 20 && n < 4096 - n_prompt, "%d tokens", n);
    CHECKF(latency < 2.0, "the cancel took %.3f s", latency); /* one model step of a tiny model */
    g4_generation_free(run.g);

    /* freed while running: the sequence keeps what was processed and can be reused */
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    for (int i = 0; i < 10; i++) CHECK(g4_generation_next(g, &ev, &err) == 1);
    g4_generation_free(g);
    gp.max_new_tokens = 4;
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
    CHECK(g4_generation_n_cached(g) == n_prompt - 1);
    int32_t got[8];
    CHECK(run_all(g, got, 8) == 4 && !memcmp(got, r->greedy, 4 * sizeof *got));
    g4_generation_free(g);

    /* its sequence reset or truncated while it runs: the next step is an error, not tokens from another state */
    gp.max_new_tokens = 0;
    for (int how = 0; how < 2; how++) {
        g4_seq_reset(ctx, 0);
        CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == 0);
        for (int i = 0; i < 5; i++) CHECK(g4_generation_next(g, &ev, &err) == 1);
        if (how == 0) g4_seq_reset(ctx, 0);
        else CHECK(g4_seq_truncate(ctx, 0, n_prompt - 2, &err) == 0);
        int rc;
        while ((rc = g4_generation_next(g, &ev, &err)) == 1 && ev.kind != G4_EVENT_TOKEN) {
        }
        CHECKF(rc == -1 && strstr(err.msg, "changed under its generation") && one_line(&err), "%s: rc %d, %s",
               how ? "truncated" : "reset", rc, err.msg);
        g4_generation_free(g);
    }
    g4_context_free(ctx);
}

/* ------------------------------------- step by step, log-probabilities, penalties */

typedef struct {
    int tokens, events;
    int32_t ids[64];
} step_count;

static int count_step_events(const g4_event *ev, void *user) {
    step_count *c = user;
    c->events++;
    if (ev->kind == G4_EVENT_TOKEN && c->tokens < 64) c->ids[c->tokens++] = ev->token;
    return 0;
}

static void test_steps_logprobs(g4_model *m, const reference *r) {
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 256, .n_batch = 64};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const int T = (int)r->n_ids, V = g4_model_vocab_size(m), n_greedy = (int)r->n_greedy;
    g4_sampler_params sp = greedy_params();
    g4_generation_params gp = {.max_new_tokens = n_greedy, .sampling = &sp, .ignore_eos = 1, .logprobs = 1,
                               .top_logprobs = 20};
    g4_generation *g;
    CHECK(g4_generation_start(ctx, 0, r->ids, T, &gp, &g, &err) == 0);
    g4_token_logprob chosen;
    const g4_token_logprob *top;
    int n_top, rc, steps = 0;
    CHECK(g4_generation_logprobs(g, &chosen, &top, &n_top) == -1); /* nothing generated yet */
    step_count c = {0};
    /* one step, one token: the first one's log-probabilities are the log-softmax of transformers' last row */
    while ((rc = g4_generation_step(g, count_step_events, &c, &err)) >= 0) {
        steps++;
        CHECKF(c.tokens == steps, "step %d made %d tokens in all", steps, c.tokens);
        CHECK(g4_generation_logprobs(g, &chosen, &top, &n_top) == 0 && chosen.token == c.ids[c.tokens - 1]);
        CHECK(n_top == 20 && top[0].token == chosen.token && top[0].logprob == chosen.logprob);
        for (int i = 1; i < n_top; i++) CHECK(top[i].logprob <= top[i - 1].logprob && top[i].logprob <= 0);
        if (steps == 1) {
            const float *row = r->logits + (size_t)(T - 1) * V;
            double mx = row[0], sum = 0;
            for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            float worst = 0;
            for (int i = 0; i < n_top; i++) {
                float want = (float)(row[top[i].token] - mx - log(sum)), d = fabsf(top[i].logprob - want);
                worst = d > worst ? d : worst;
            }
            printf("logprobs: top 20 within %.2e of transformers' log-softmax\n", worst);
            CHECKF(worst < 2e-3f, "first token's log-probabilities differ from transformers' by %.3e", worst);
            /* the reference's own top 20, in order */
            int ok = 1;
            for (int i = 0; i < n_top && ok; i++) {
                int better = 0;
                for (int v = 0; v < V; v++) better += row[v] > row[top[i].token];
                ok = better <= i;
            }
            CHECK(ok);
        }
        if (rc == 0) break;
    }
    CHECKF(steps == n_greedy && c.tokens == n_greedy && !memcmp(c.ids, r->greedy, (size_t)n_greedy * sizeof *c.ids),
           "%d steps, %d tokens, want %d greedy tokens", steps, c.tokens, n_greedy);
    CHECK(g4_generation_step(g, count_step_events, &c, &err) == 0 && c.tokens == n_greedy); /* finished */
    g4_generation_free(g);
    gp.top_logprobs = 21;
    CHECK(g4_generation_start(ctx, 0, r->ids, T, &gp, &g, &err) == -1 && one_line(&err));

    /* penalties on the output only: a huge presence penalty makes every generated token new, and
       the first token is the greedy one whatever the prompt holds */
    sp.presence_penalty = 1e4f;
    gp = (g4_generation_params){.max_new_tokens = 16, .sampling = &sp, .ignore_eos = 1, .penalties_output_only = 1};
    CHECK(g4_generation_start(ctx, 1, r->ids, T, &gp, &g, &err) == 0);
    int32_t got[64];
    int n = run_all(g, got, 64), distinct = 1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) distinct &= got[i] != got[j];
    CHECKF(n == 16 && got[0] == r->greedy[0] && distinct, "output-only penalties: %d tokens, first %d", n, got[0]);
    g4_generation_free(g);
    int in_prompt = 0;
    for (int i = 0; i < T; i++) in_prompt |= r->ids[i] == r->greedy[0];
    if (in_prompt) { /* with the prompt in the history the first greedy token is penalized */
        gp.penalties_output_only = 0;
        CHECK(g4_generation_start(ctx, 1, r->ids, T, &gp, &g, &err) == 0);
        CHECK(run_all(g, got, 64) == 16 && got[0] != r->greedy[0]);
        g4_generation_free(g);
    }
    /* the repetition penalty looks at the prompt with output-only penalties too (vLLM's apply_penalties:
       repetition over the prompt's and the output's ids, presence and frequency over the output's): alone, the
       flag changes nothing, and a prompt token that is the greedy first token is penalized */
    sp.presence_penalty = 0.0f, sp.repetition_penalty = 100.0f;
    int32_t with_flag[64];
    int n_flag = -1, n_plain = -1;
    for (int flag = 1; flag >= 0; flag--) {
        gp = (g4_generation_params){.max_new_tokens = 12, .sampling = &sp, .ignore_eos = 1, .penalties_output_only = flag};
        CHECK(g4_generation_start(ctx, 1, r->ids, T, &gp, &g, &err) == 0);
        if (flag) n_flag = run_all(g, with_flag, 64);
        else n_plain = run_all(g, got, 64);
        g4_generation_free(g);
    }
    CHECKF(n_flag == 12 && n_plain == 12 && !memcmp(with_flag, got, 12 * sizeof *got) &&
               (!in_prompt || with_flag[0] != r->greedy[0]),
           "repetition penalty with output-only penalties: %d and %d tokens, first %d (greedy %d, in the prompt: %d)",
           n_flag, n_plain, with_flag[0], r->greedy[0], in_prompt);
    g4_context_free(ctx);
}

/* --------------------------------------------------------------- embeddings */

static void test_embed(g4_model *m, const reference *r) {
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_ctx = 128, .n_batch = 8}; /* several chunks */
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const int H = g4_model_hidden_size(m), T = (int)r->n_ids;
    float *got = malloc((size_t)H * sizeof *got), *want = calloc((size_t)H, sizeof *want);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) want[h] += r->final_norm[(size_t)t * H + h] / (float)T;
    CHECKF(g4_embed(ctx, 0, r->ids, T, got, &err) == 0, "%s", err.msg);
    float rel = max_abs_diff(got, want, (size_t)H) / max_abs(want, (size_t)H);
    printf("embedding: max error %.2e relative to the mean final hidden state\n", rel);
    CHECKF(rel < 1e-3f, "embedding differs from the mean of transformers' final_norm: %.3e", rel);
    CHECK(g4_seq_length(ctx, 0) == 0);
    CHECK(g4_embed(ctx, 0, r->ids, 0, got, &err) == -1 && one_line(&err));
    CHECK(g4_embed(ctx, 3, r->ids, T, got, &err) == -1 && one_line(&err));
    int32_t bad = 100000;
    CHECK(g4_embed(ctx, 0, &bad, 1, got, &err) == -1 && one_line(&err));
    free(got);
    free(want);
    g4_context_free(ctx);
}

/* ------------------------------------------------ contexts of one model in threads */

typedef struct {
    g4_model *m;
    const reference *r;
    int rounds, same;
} ctx_thread;

static void *generate_on_own_context(void *arg) {
    ctx_thread *t = arg;
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_ctx = 128, .n_batch = 16};
    if (g4_context_new(t->m, &cp, &ctx, &err)) return NULL;
    g4_sampler_params sp = greedy_params();
    g4_generation_params gp = {.max_new_tokens = (int)t->r->n_greedy, .sampling = &sp, .ignore_eos = 1};
    for (int i = 0; i < t->rounds; i++) {
        g4_generation *g;
        int32_t got[64];
        if (g4_generation_start(ctx, 0, t->r->ids, (int)t->r->n_ids, &gp, &g, &err)) break;
        g4_seq_reset(ctx, 0); /* the whole prompt again (no cached prefix) */
        int n = run_all(g, got, 64);
        t->same += n == (int)t->r->n_greedy && !memcmp(got, t->r->greedy, (size_t)n * sizeof *got);
        g4_generation_free(g);
        g4_seq_reset(ctx, 0);
    }
    g4_context_free(ctx);
    return NULL;
}

/* "A model may be used from several threads at once": contexts of one model generating in threads at the same
 * time each get transformers' greedy ids (they shared the backend's thread pool and scratch, and got garbage). */
static void test_threads(g4_model *m, const reference *r) {
    enum { N = 3 };
    pthread_t th[N];
    ctx_thread t[N];
    for (int i = 0; i < N; i++) {
        t[i] = (ctx_thread){m, r, 4, 0};
        pthread_create(&th[i], NULL, generate_on_own_context, &t[i]);
    }
    for (int i = 0; i < N; i++) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 120; /* seconds here; the shared pool could also spin forever */
        if (pthread_timedjoin_np(th[i], NULL, &until)) {
            fprintf(stderr, "FAIL: contexts of one model in threads did not finish in 2 minutes\n");
            _exit(1);
        }
        CHECKF(t[i].same == t[i].rounds, "thread %d: %d of %d generations gave the greedy ids", i, t[i].same,
               t[i].rounds);
    }
}

/* ------------------------------------------------------------------ errors */

static void test_errors(g4_model *m, const reference *r) {
    g4_error err;
    g4_model *m2 = NULL;
    g4_load_params lp = {.device = "tpu"};
    CHECK(g4_model_load(g4t_shared(FIXTURE), &lp, &m2, &err) == -1 && !m2 && one_line(&err));
    CHECK(g4_model_load("/does/not/exist", NULL, &m2, &err) == -1 && one_line(&err));
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_ctx = 64, .kv_type = (g4_kv_type)7};
    CHECK(g4_context_new(m, &cp, &ctx, &err) == -1 && !ctx && one_line(&err));
    cp.kv_type = G4_KV_F32;
    CHECK(g4_context_new(m, &cp, &ctx, &err) == 0);
    CHECK(g4_model_tokenizer(m) == NULL && g4_model_chat_template(m) == NULL);

    g4_generation *g = NULL;
    const int n_prompt = (int)r->n_ids;
    CHECK(g4_generation_start(ctx, 1, r->ids, n_prompt, NULL, &g, &err) == -1 && !g && one_line(&err));
    CHECK(g4_generation_start(ctx, 0, r->ids, 0, NULL, &g, &err) == -1 && one_line(&err));
    int32_t bad[2] = {2, 512};
    CHECK(g4_generation_start(ctx, 0, bad, 2, NULL, &g, &err) == -1 && one_line(&err));
    int32_t *big = calloc(64, sizeof *big);
    CHECK(g4_generation_start(ctx, 0, big, 64, NULL, &g, &err) == -1 && one_line(&err)); /* no room */
    free(big);
    const char *stop = "x";
    g4_generation_params gp = {.stop_strings = &stop, .n_stop_strings = 1};
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == -1 && one_line(&err)); /* no tokenizer */
    g4_sampler_params sp = greedy_params();
    sp.top_p = 2;
    gp = (g4_generation_params){.sampling = &sp};
    CHECK(g4_generation_start(ctx, 0, r->ids, n_prompt, &gp, &g, &err) == -1 && one_line(&err));
    g4_chat *chat = NULL;
    CHECK(g4_chat_new(NULL, NULL, &chat, &err) == -1 && !chat && one_line(&err));
    g4_context_free(ctx);

    g4_chat_message msg;
    const char *out = "<|channel>thought\nhm<channel|> Yes. <|tool_call>call:f{a:1}<tool_call|>";
    CHECK(g4_chat_parse(out, strlen(out), &msg, &err) == 0);
    CHECK(!strcmp(msg.thinking, "hm") && !strcmp(msg.content, "Yes.") && msg.n_tool_calls == 1 &&
          !strcmp(msg.tool_calls, "[{\"name\":\"f\",\"arguments\":{\"a\":1}}]"));
    g4_chat_message_free(&msg);
}

int main(void) {
    reference r;
    if (load_reference(&r)) {
        printf("no %s reference: skipped\n", FIXTURE);
        return 77;
    }
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = 2, .device = "cpu"};
    if (g4_model_load(g4t_shared(FIXTURE), &lp, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_version();
    test_generation(m, &r);
    test_cancel(m, &r);
    sampled_candidates(m, &r, 0);
    sampled_candidates(m, &r, 1);
    test_steps_logprobs(m, &r);
    test_embed(m, &r);
    test_threads(m, &r);
    test_errors(m, &r);
    g4_model_free(m);
    free_reference(&r);
    return g4t_done();
}
