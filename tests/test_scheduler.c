/* The continuous-batching scheduler (src/engine/scheduler.h) on the fixtures and on tolstoy-tiny:
 * - 16 concurrent greedy requests (mixed lengths, some longer than the sliding window, some sharing prefixes)
 *   give exactly the tokens each gives alone (one sequence, one chunked prefill, then one token per step);
 *   among them the fixture's own prompt, whose tokens must be transformers' greedy_ids;
 * - the same with fewer sequences than requests (queueing, prefix reuse between waves), with requests cancelled
 *   while they run or wait (their blocks return at once, the others are unchanged), with preemption forced by a
 *   small pool, and a second round that finds the first round's prefixes in the cache;
 * - sampled requests, each with its own temperature, top-k and seed, give what the same sampler gives alone;
 * - embedding requests give the mean of transformers' final_norm rows. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/context.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "reference.h"

#define N_REQ 16
#define MAX_PROMPT 600
#define MAX_NEW 40

typedef struct {
    int32_t ids[MAX_PROMPT];
    int n, max_new;
    int32_t alone[MAX_NEW]; /* the first MAX_NEW tokens it gives alone */
    int n_alone;
} prompt;

typedef struct {
    g4_sched_request *r;
    int32_t got[MAX_NEW];
    int n_got, done, cancel_at; /* cancel_at: cancel after that many tokens (-1: never) */
} slot;

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* 16 prompts: the reference prompt first, then random ids; lengths from 2 to about 4 sliding windows; half of
 * them share three quarters of the one before (two of those shared prefixes are longer than the window). */
static void make_prompts(prompt *p, int vocab, int window, const int32_t *ref, int n_ref, int n_ctx) {
    rng_state = 12345;
    const int lens[N_REQ] = {0, 2, 7, window - 1, window, window + 1, 2 * window + 3, 5, 3 * window, 3 * window + 9,
                             window / 2, 4 * window + 7, 3, 2 * window, 2 * window + 9, window + 5};
    for (int i = 0; i < N_REQ; i++) {
        prompt *q = &p[i];
        q->max_new = i == 0 ? 24 : 8 + (int)(rnd() % (MAX_NEW - 8));
        q->n = i == 0 ? n_ref : lens[i];
        if (q->n > n_ctx - q->max_new) q->n = n_ctx - q->max_new;
        if (q->n > MAX_PROMPT) q->n = MAX_PROMPT;
        for (int j = 0; j < q->n; j++) q->ids[j] = i == 0 ? ref[j] : 3 + (int32_t)(rnd() % (uint32_t)(vocab - 3));
        if (i % 4 == 1 || i % 4 == 2) { /* shares a prefix with the one before */
            int share = p[i - 1].n < q->n ? p[i - 1].n : q->n;
            share = share * 3 / 4;
            memcpy(q->ids, p[i - 1].ids, (size_t)share * sizeof *q->ids);
        }
    }
}

/* The request alone: one sequence, prefill in chunks of 64, then one token per step. */
static int alone(g4_model *m, const int32_t *ids, int n, int max_new, const g4_sampler_params *sp, int32_t *out) {
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = n + max_new, .n_batch = 64};
    if (g4_context_new(m, &cp, &ctx, &err)) return -1;
    const int V = g4_model_vocab_size(m);
    float *logits = malloc((size_t)V * sizeof(float));
    g4_sampler *smp = NULL;
    if (sp) {
        g4_sampler_new(sp, V, &smp, &err);
        g4_sampler_accept_many(smp, ids, n);
    }
    uint8_t want[64];
    int k = 0, rc = 0;
    for (int i = 0; i < n && !rc; i += 64) {
        int c = n - i < 64 ? n - i : 64;
        for (int j = 0; j < c; j++) want[j] = i + j == n - 1;
        g4_batch b = {c, ids + i, NULL, want};
        rc = g4_decode(ctx, &b, logits, &err);
    }
    while (!rc && k < max_new) {
        int32_t id = smp ? g4_sampler_sample(smp, logits) : argmax_f32(logits, V);
        if (smp) g4_sampler_accept(smp, id);
        out[k++] = id;
        if (k == max_new) break;
        g4_batch b = {1, &id, NULL, NULL};
        rc = g4_decode(ctx, &b, logits, &err);
    }
    if (rc) fprintf(stderr, "alone: %s\n", err.msg);
    g4_sampler_free(smp);
    free(logits);
    g4_context_free(ctx);
    return rc ? -1 : k;
}

static int on_token(g4_sched_request *r, int32_t id, void *user) {
    slot *sl = user;
    sl->got[sl->n_got++] = id;
    if (sl->cancel_at >= 0 && sl->n_got >= sl->cancel_at) g4_sched_cancel(r);
    return 0;
}

static void on_done(g4_sched_request *r, void *user) {
    slot *sl = user;
    sl->done = 1;
}

typedef struct {
    int n_seq, n_batch, n_kv_blocks, n_kv_sliding_blocks;
    int max_new;          /* every request's token limit, or 0 for the prompt's own */
    int cancel;           /* cancel some requests while they run, one while it waits */
    const g4_sampler_params *sampling; /* per request (seed = index) or NULL for greedy */
    int rounds;           /* 2: submit everything again once the first round is done */
} sched_case;

/* Runs the 16 prompts through a scheduler; returns the stats of the last round. */
static g4_sched_stats run_case(const char *label, g4_model *m, const prompt *p, const sched_case *sc, int n_ctx) {
    g4_error err;
    g4_sched_stats none = {0};
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = sc->n_seq, .n_ctx = n_ctx, .n_batch = sc->n_batch, .kv_history = -1,
                            .kv_block_size = 8, .n_kv_blocks = sc->n_kv_blocks,
                            .n_kv_sliding_blocks = sc->n_kv_sliding_blocks};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s: context: %s", label, err.msg);
        return none;
    }
    g4_sched *s;
    if (g4_sched_new(ctx, &s, &err)) {
        CHECKF(0, "%s: scheduler: %s", label, err.msg);
        g4_context_free(ctx);
        return none;
    }
    const int free0 = g4_kv_free_blocks(ctx);
    g4_sched_stats st = none, before = none;
    for (int round = 0; round < sc->rounds; round++) {
        slot sl[N_REQ];
        g4_sampler_params sp[N_REQ];
        memset(sl, 0, sizeof sl);
        for (int i = 0; i < N_REQ; i++) {
            sl[i].cancel_at = sc->cancel && i % 5 == 3 ? 2 + i % 3 : -1;
            g4_sched_request_params rp = {.max_new_tokens = sc->max_new ? sc->max_new : p[i].max_new, .on_token = on_token, .on_done = on_done,
                                          .user = &sl[i]};
            if (sc->sampling) {
                sp[i] = *sc->sampling;
                sp[i].seed = (uint64_t)i;
                rp.sampling = &sp[i];
            }
            CHECKF(g4_sched_submit(s, p[i].ids, p[i].n, &rp, &sl[i].r, &err) == 0, "%s: submit: %s", label, err.msg);
        }
        /* one request is cancelled before it runs */
        const int waiting_cancel = sc->cancel ? N_REQ - 1 : -1;
        if (waiting_cancel >= 0) g4_sched_cancel(sl[waiting_cancel].r);
        int left, steps = 0;
        while ((left = g4_sched_step(s, &err)) > 0 && steps < 100000) {
            steps++;
            /* a cancelled request's blocks are back right after the step that saw the cancel */
            for (int i = 0; i < N_REQ; i++)
                if (sl[i].r && atomic_load(&sl[i].r->finish) == G4_SCHED_CANCELLED)
                    CHECK(sl[i].r->seq < 0);
        }
        CHECKF(left == 0, "%s: the scheduler did not finish (%d left after %d steps): %s", label, left, steps,
               left < 0 ? err.msg : "");
        int same = 0, cancelled = 0;
        for (int i = 0; i < N_REQ; i++) {
            CHECK(sl[i].done);
            int fin = atomic_load(&sl[i].r->finish);
            if (sl[i].cancel_at >= 0 || i == waiting_cancel) {
                cancelled++;
                CHECKF(fin == G4_SCHED_CANCELLED, "%s: request %d finished %d, not cancelled", label, i, fin);
                /* what it made before the cancel is the start of what it makes alone */
                CHECK(sl[i].n_got <= p[i].n_alone &&
                      !memcmp(sl[i].got, p[i].alone, (size_t)sl[i].n_got * sizeof(int32_t)));
                if (i == waiting_cancel) CHECK(sl[i].n_got == 0);
            } else {
                const int want = sc->max_new ? sc->max_new : p[i].max_new;
                int eq = fin == G4_SCHED_LENGTH && sl[i].n_got == want && want <= p[i].n_alone &&
                         !memcmp(sl[i].got, p[i].alone, (size_t)sl[i].n_got * sizeof(int32_t));
                CHECKF(eq, "%s: request %d (%d prompt tokens) differs from its output alone (%d vs %d tokens)",
                       label, i, p[i].n, sl[i].n_got, want);
                same += eq;
            }
            g4_sched_request_free(sl[i].r);
        }
        st = *g4_sched_get_stats(s); /* this round's */
        st.steps -= before.steps, st.decode_tokens -= before.decode_tokens;
        st.prefill_tokens -= before.prefill_tokens, st.reused_tokens -= before.reused_tokens;
        st.preemptions -= before.preemptions;
        before = *g4_sched_get_stats(s);
        printf("%-12s seq %2d batch %3d blocks %4d%s%s round %d: %2d/%2d same, %d cancelled; %ld steps, %ld decode + "
               "%ld prefill tokens, %ld reused, %ld preemptions\n",
               label, sc->n_seq, sc->n_batch, free0, sc->cancel ? " cancel" : "", sc->sampling ? " sampled" : "",
               round, same, N_REQ - cancelled, cancelled, st.steps, st.decode_tokens, st.prefill_tokens,
               st.reused_tokens, st.preemptions);
        CHECK(g4_kv_free_blocks(ctx) == free0); /* everything back (cached blocks count as free) */
    }
    g4_sched_free(s);
    g4_context_free(ctx);
    return st;
}

static void check_embeddings(const char *label, g4_model *m, const g4_tensor_set *ref) {
    size_t n_ids = 0, n_fin = 0;
    int32_t *ids = ref_ids(ref, "input_ids", &n_ids);
    float *fin = ref_f32(ref, "final_norm", &n_fin);
    if (!ids || !fin) {
        free(ids);
        free(fin);
        return;
    }
    const int H = g4_model_hidden_size(m), T = (int)n_ids;
    g4_error err;
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 3, .n_ctx = 256, .n_batch = 16, .kv_history = -1};
    g4_sched *s;
    if (g4_context_new(m, &cp, &ctx, &err) || g4_sched_new(ctx, &s, &err)) {
        CHECKF(0, "%s: %s", label, err.msg);
        return;
    }
    /* the prompt three times, and once a generation on the same prompt in between (steps alternate) */
    g4_sched_request *e[3], *g;
    slot gs = {.cancel_at = -1};
    g4_sched_request_params rp = {.max_new_tokens = 4, .on_token = on_token, .on_done = on_done, .user = &gs};
    for (int i = 0; i < 3; i++) {
        CHECK(g4_sched_submit_embed(s, ids, T - i, NULL, NULL, &e[i], &err) == 0);
        if (i == 0) CHECK(g4_sched_submit(s, ids, T, &rp, &g, &err) == 0);
    }
    int left;
    while ((left = g4_sched_step(s, &err)) > 0) {}
    CHECK(left == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(atomic_load(&e[i]->finish) == G4_SCHED_DONE);
        double scale = 0, diff = 0;
        for (int h = 0; h < H; h++) {
            double mean = 0;
            for (int t = 0; t < T - i; t++) mean += fin[(size_t)t * H + h];
            mean /= T - i;
            if (fabs(mean) > scale) scale = fabs(mean);
            if (fabs(mean - e[i]->embedding[h]) > diff) diff = fabs(mean - e[i]->embedding[h]);
        }
        CHECKF(diff <= 1e-3 * scale, "%s: embedding of %d tokens differs by %g (scale %g)", label, T - i, diff, scale);
        if (i == 0) printf("%-12s embedding: max diff %.2e of %.2e\n", label, diff, scale);
        g4_sched_request_free(e[i]);
    }
    CHECK(atomic_load(&g->finish) == G4_SCHED_LENGTH && gs.n_got == 4);
    g4_sched_request_free(g);
    g4_sched_free(s);
    g4_context_free(ctx);
    free(ids);
    free(fin);
}

static void check_model(const char *label, const char *dir) {
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = 2};
    if (g4_model_load(dir, &lp, &m, &err)) {
        CHECKF(0, "%s: load: %s", label, err.msg);
        return;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    g4_tensor_set ref = {0};
    size_t n_ref = 0, n_greedy = 0;
    int32_t *ref_prompt = NULL, *greedy = NULL;
    if (g4_safetensors_add_file(&ref, path, &err) == 0 && g4_tensor_set_finish(&ref, &err) == 0) {
        ref_prompt = ref_ids(&ref, "input_ids", &n_ref);
        greedy = ref_ids(&ref, "greedy_ids", &n_greedy);
    }
    CHECKF(ref_prompt && greedy, "%s: no reference prompt / greedy ids", label);
    if (!ref_prompt || !greedy) goto done;
    const int V = g4_model_vocab_size(m), W = m->cfg.text.sliding_window;
    const int n_ctx = 4 * W + 7 + MAX_NEW > 256 ? 4 * W + 7 + MAX_NEW : 256;
    prompt *p = calloc(N_REQ, sizeof *p);
    make_prompts(p, V, W, ref_prompt, (int)n_ref, n_ctx);
    for (int i = 0; i < N_REQ; i++) p[i].n_alone = alone(m, p[i].ids, p[i].n, MAX_NEW, NULL, p[i].alone);
    /* anchor: the reference prompt alone gives transformers' greedy ids */
    CHECKF(p[0].n_alone == MAX_NEW && (size_t)24 <= n_greedy && !memcmp(p[0].alone, greedy, 24 * sizeof(int32_t)),
           "%s: the reference prompt's greedy ids differ from transformers'", label);

    const sched_case all = {.n_seq = N_REQ, .n_batch = 64, .rounds = 1};
    run_case(label, m, p, &all, n_ctx);
    /* fewer sequences than requests, and pools large enough to keep everything: the second round finds every
     * prompt (less its last token) in the cache, in whole blocks */
    const sched_case queued = {.n_seq = 5, .n_batch = 32, .n_kv_blocks = 1000, .n_kv_sliding_blocks = 1000,
                               .rounds = 2};
    g4_sched_stats st = run_case(label, m, p, &queued, n_ctx);
    long cacheable = 0;
    for (int i = 0; i < N_REQ; i++) cacheable += (p[i].n - 1) / 8 * 8;
    CHECKF(st.reused_tokens == cacheable, "%s: the second round reused %ld tokens, not %ld", label, st.reused_tokens,
           cacheable);
    /* the same with a sliding pool that holds little more than the running windows: the cache keeps every full
     * block, but a prefix resumes only where its window's sliding blocks are still cached */
    const int W_blocks = (W - 1 + 7) / 8 + 2;
    const sched_case tight = {.n_seq = 5, .n_batch = 32, .n_kv_blocks = 1000,
                              .n_kv_sliding_blocks = 5 * W_blocks + 32 / 8, .rounds = 2};
    st = run_case(label, m, p, &tight, n_ctx);
    CHECKF(st.reused_tokens < cacheable, "%s: a tight sliding pool kept every window", label);
    const sched_case cancels = {.n_seq = 6, .n_batch = 48, .cancel = 1, .rounds = 1};
    run_case(label, m, p, &cancels, n_ctx);
    /* every request generating MAX_NEW tokens in a pool of a third of what they need together: preemption */
    int need = 0, biggest = 0;
    for (int i = 0; i < N_REQ; i++) {
        int b = (p[i].n + MAX_NEW + 7) / 8;
        need += b;
        biggest = b > biggest ? b : biggest;
    }
    const sched_case small = {.n_seq = N_REQ, .n_batch = 64, .n_kv_blocks = need / 3 > biggest ? need / 3 : biggest,
                              .max_new = MAX_NEW, .rounds = 1};
    st = run_case(label, m, p, &small, n_ctx);
    CHECKF(st.preemptions > 0, "%s: the small pool forced no preemption", label);

    /* sampling: per-request temperature/top-k and seeds */
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0.9f;
    sp.top_k = 40;
    sp.repetition_penalty = 1.1f;
    for (int i = 0; i < N_REQ; i++) {
        g4_sampler_params one = sp;
        one.seed = (uint64_t)i;
        p[i].n_alone = alone(m, p[i].ids, p[i].n, MAX_NEW, &one, p[i].alone);
    }
    const sched_case sampled = {.n_seq = 8, .n_batch = 40, .sampling = &sp, .rounds = 1};
    run_case(label, m, p, &sampled, n_ctx);
    check_embeddings(label, m, &ref);
    free(p);
done:
    free(ref_prompt);
    free(greedy);
    g4_tensor_set_free(&ref);
    g4_model_free(m);
}

int main(void) {
    const char *fixtures[] = {"dense-ple", "dense-keqv", "moe"};
#ifdef __SANITIZE_ADDRESS__
    /* under the sanitizers (ten times slower) one fixture runs every case: the same code paths */
    const size_t n_fixtures = 1;
#else
    const size_t n_fixtures = sizeof fixtures / sizeof *fixtures;
#endif
    for (size_t i = 0; i < n_fixtures; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "fixtures/%s", fixtures[i]);
        check_model(fixtures[i], g4t_shared(rel));
    }
#ifdef __SANITIZE_ADDRESS__
    return g4t_done();
#endif
    /* the example model: the real vocabulary, a window of 128 */
    const char *tmp = g4t_tmp("scheduler-tolstoy");
    char cmd[4096], dir[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && tar -xJf '%s' -C '%s'", tmp, tmp,
             g4t_shared("models/tolstoy-tiny.tar.xz"), tmp);
    snprintf(dir, sizeof dir, "%s/tolstoy-tiny", tmp);
    CHECKF(system(cmd) == 0, "cannot unpack tolstoy-tiny");
    check_model("tolstoy-tiny", dir);
    return g4t_done();
}
