/* The continuous-batching scheduler (g4_scheduler, src/engine/scheduler.c) on the fixtures and on tolstoy-tiny:
 * - 16 concurrent greedy requests (mixed lengths, some longer than the sliding window, some sharing prefixes)
 *   give exactly the tokens each gives alone (one sequence, one chunked prefill, then one token per step);
 *   among them the fixture's own prompt, whose tokens must be transformers' greedy_ids;
 * - the same with fewer sequences than requests (queueing, prefix reuse between waves), with requests cancelled
 *   while they run or wait (their blocks return at once, the others are unchanged), with preemption forced by a
 *   small pool, and a second round that finds the first round's prefixes in the cache;
 * - sampled requests, each with its own temperature, top-k and seed, give what the same sampler gives alone;
 *   top-k samplers fed each row's top candidates instead of its logits draw what they draw from the rows;
 * - embedding requests give the mean of transformers' final_norm rows;
 * - log-probabilities, JSON objects, images and audio (vision and unified fixtures) give what they give alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/context.h"
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
    g4_generation *g;
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
        g4_batch b = {.n_tokens = c, .token = ids + i, .want_logits = want};
        rc = g4_decode(ctx, &b, logits, &err);
    }
    while (!rc && k < max_new) {
        int32_t id = smp ? g4_sampler_sample(smp, logits) : argmax_f32(logits, V);
        if (smp) g4_sampler_accept(smp, id);
        out[k++] = id;
        if (k == max_new) break;
        g4_batch b = {.n_tokens = 1, .token = &id};
        rc = g4_decode(ctx, &b, logits, &err);
    }
    if (rc) fprintf(stderr, "alone: %s\n", err.msg);
    g4_sampler_free(smp);
    free(logits);
    g4_context_free(ctx);
    return rc ? -1 : k;
}

/* The callback: tokens, the finish; cancels when told to (from inside the step, as a server would). */
static int on_event(const g4_event *ev, void *user) {
    slot *sl = user;
    if (ev->kind == G4_EVENT_FINISH) {
        CHECK(!sl->done);
        sl->done = 1;
        return 0;
    }
    if (ev->kind != G4_EVENT_TOKEN) return 0;
    CHECK(!sl->done && sl->n_got < MAX_NEW);
    if (sl->n_got < MAX_NEW) sl->got[sl->n_got++] = ev->token;
    return sl->cancel_at >= 0 && sl->n_got >= sl->cancel_at; /* non-zero: cancel */
}

typedef struct {
    int n_seq, n_batch, n_kv_blocks, n_kv_sliding_blocks;
    int max_new;          /* every request's token limit, or 0 for the prompt's own */
    int cancel;           /* cancel some requests while they run, one while it waits */
    const g4_sampler_params *sampling; /* per request (seed = index) or NULL for greedy */
    int rounds;           /* 2: submit everything again once the first round is done */
    prompt *record;       /* non-NULL: each request's tokens go to its alone[] there instead of being compared */
    int may_differ;       /* requests that may differ from alone (sampled on a GPU: see check_sampling) */
} sched_case;

/* Runs the 16 prompts through a scheduler; returns the stats of the last round. */
static g4_scheduler_stats run_case(const char *label, g4_model *m, const prompt *p, const sched_case *sc, int n_ctx) {
    g4_error err;
    g4_scheduler_stats none = {0};
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = sc->n_seq, .n_ctx = n_ctx, .n_batch = sc->n_batch, .kv_history = -1,
                            .kv_block_size = 8, .n_kv_blocks = sc->n_kv_blocks,
                            .n_kv_sliding_blocks = sc->n_kv_sliding_blocks};
    if (g4_context_new(m, &cp, &ctx, &err)) {
        CHECKF(0, "%s: context: %s", label, err.msg);
        return none;
    }
    g4_scheduler *s;
    if (g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s: scheduler: %s", label, err.msg);
        g4_context_free(ctx);
        return none;
    }
    const int free0 = g4_kv_free_blocks(ctx);
    g4_scheduler_stats st = none, before = none;
    for (int round = 0; round < sc->rounds; round++) {
        slot sl[N_REQ];
        g4_sampler_params sp[N_REQ];
        memset(sl, 0, sizeof sl);
        for (int i = 0; i < N_REQ; i++) {
            sl[i].cancel_at = sc->cancel && i % 5 == 3 ? 2 + i % 3 : -1;
            g4_sampler_params_default(&sp[i]);
            sp[i].temperature = 0;
            if (sc->sampling) sp[i] = *sc->sampling;
            sp[i].seed = (uint64_t)i;
            g4_generation_params gp = {.max_new_tokens = sc->max_new ? sc->max_new : p[i].max_new,
                                       .sampling = &sp[i], .ignore_eos = 1};
            CHECKF(g4_scheduler_submit(s, p[i].ids, p[i].n, &gp, on_event, &sl[i], &sl[i].g, &err) == 0,
                   "%s: submit: %s", label, err.msg);
        }
        /* one request is cancelled before it runs */
        const int waiting_cancel = sc->cancel ? N_REQ - 1 : -1;
        if (waiting_cancel >= 0) g4_generation_cancel(sl[waiting_cancel].g);
        int left, steps = 0;
        while ((left = g4_scheduler_step(s, &err)) > 0 && steps < 100000) steps++;
        CHECKF(left == 0, "%s: the scheduler did not finish (%d left after %d steps): %s", label, left, steps,
               left < 0 ? err.msg : "");
        int same = 0, cancelled = 0, may_differ = sc->may_differ;
        long cached = 0; /* prompt tokens each found in the cache at its first admission */
        for (int i = 0; i < N_REQ; i++) {
            cached += g4_generation_n_cached(sl[i].g);
            CHECK(sl[i].done);
            g4_finish fin = g4_generation_finish(sl[i].g);
            int n_tok;
            const int32_t *toks = g4_generation_tokens(sl[i].g, &n_tok);
            CHECK(n_tok == sl[i].n_got && !memcmp(toks, sl[i].got, (size_t)n_tok * sizeof *toks));
            if (sl[i].cancel_at >= 0 || i == waiting_cancel) {
                cancelled++;
                CHECKF(fin == G4_FINISH_CANCELLED, "%s: request %d finished %d, not cancelled", label, i, (int)fin);
                /* what it made before the cancel is the start of what it makes alone */
                CHECK(sl[i].n_got <= p[i].n_alone &&
                      !memcmp(sl[i].got, p[i].alone, (size_t)sl[i].n_got * sizeof(int32_t)));
                if (i == waiting_cancel) CHECK(sl[i].n_got == 0);
                else CHECK(sl[i].n_got == sl[i].cancel_at);
            } else if (sc->record) {
                memcpy(sc->record[i].alone, sl[i].got, (size_t)sl[i].n_got * sizeof(int32_t));
                sc->record[i].n_alone = sl[i].n_got;
                same++;
            } else {
                const int want = sc->max_new ? sc->max_new : p[i].max_new;
                int eq = fin == G4_FINISH_LENGTH && sl[i].n_got == want && want <= p[i].n_alone &&
                         !memcmp(sl[i].got, p[i].alone, (size_t)sl[i].n_got * sizeof(int32_t));
                CHECKF(eq || may_differ-- > 0,
                       "%s: request %d (%d prompt tokens) differs from its output alone (%d vs %d tokens)", label, i,
                       p[i].n, sl[i].n_got, want);
                same += eq;
            }
            g4_generation_free(sl[i].g);
        }
        g4_scheduler_get_stats(s, &st); /* this round's */
        CHECK(st.running == 0 && st.waiting == 0);
        /* the time of the steps so far, and of the model within them */
        CHECKF(st.steps > 0 && st.model_seconds > 0 && st.model_seconds <= st.step_seconds &&
                   st.step_seconds > before.step_seconds,
               "%s: %ld steps, %.6f s in steps, %.6f s in the model", label, st.steps, st.step_seconds,
               st.model_seconds);
        g4_scheduler_stats total = st;
        st.steps -= before.steps, st.decode_tokens -= before.decode_tokens;
        st.prefill_tokens -= before.prefill_tokens, st.reused_tokens -= before.reused_tokens;
        st.preemptions -= before.preemptions;
        before = total;
        /* without preemptions (re-admissions) the scheduler reused what the generations say they found */
        CHECKF(st.preemptions > 0 || cached == st.reused_tokens, "%s: n_cached %ld, reused %ld", label, cached,
               st.reused_tokens);
        printf("%-12s seq %2d batch %3d blocks %4d%s%s round %d: %2d/%2d same, %d cancelled; %ld steps, %ld decode + "
               "%ld prefill tokens, %ld reused, %ld preemptions\n",
               label, sc->n_seq, sc->n_batch, free0, sc->cancel ? " cancel" : "", sc->sampling ? " sampled" : "",
               round, same, N_REQ - cancelled, cancelled, st.steps, st.decode_tokens, st.prefill_tokens,
               st.reused_tokens, st.preemptions);
        CHECK(g4_kv_free_blocks(ctx) == free0); /* everything back (cached blocks count as free) */
    }
    g4_scheduler_free(s);
    g4_context_free(ctx);
    return st;
}

/* A cancelled request's blocks are back after the next step, and a freed unfinished one gets no more events. */
static void check_cancel_frees(const char *label, g4_model *m, const prompt *p, int n_ctx) {
    g4_error err;
    g4_context *ctx;
    g4_scheduler *s;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = n_ctx, .n_batch = 16, .kv_history = -1, .kv_block_size = 8};
    if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s: %s", label, err.msg);
        return;
    }
    const int free0 = g4_kv_free_blocks(ctx);
    slot a = {.cancel_at = -1}, b = {.cancel_at = -1};
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = MAX_NEW, .sampling = &sp, .ignore_eos = 1};
    CHECK(g4_scheduler_submit(s, p[11].ids, p[11].n, &gp, on_event, &a, &a.g, &err) == 0);
    CHECK(g4_scheduler_submit(s, p[6].ids, p[6].n, &gp, on_event, &b, &b.g, &err) == 0);
    while (a.n_got < 3 && g4_scheduler_step(s, &err) > 0) {}
    CHECK(a.n_got == 3 && g4_kv_free_blocks(ctx) < free0);
    g4_generation_cancel(a.g);
    g4_generation_free(b.g); /* unfinished: cancelled too, and it hears nothing more */
    int nb = b.n_got;
    CHECK(g4_scheduler_step(s, &err) == 0);
    CHECK(a.done && !b.done && b.n_got == nb && g4_generation_finish(a.g) == G4_FINISH_CANCELLED);
    CHECK(g4_kv_free_blocks(ctx) == free0);
    g4_generation_free(a.g);
    g4_scheduler_free(s);
    g4_context_free(ctx);
}

/* Four requests of one prompt submitted together (a request's n choices, one system prompt arriving from many
 * clients): one reads the prompt, the others wait a step or so and take its blocks from the prefix cache, and
 * all four give the tokens the prompt gives alone. */
static void check_shared_prompt(const char *label, g4_model *m, const prompt *p, int n_ctx) {
    g4_error err;
    g4_context *ctx;
    g4_scheduler *s;
    g4_context_params cp = {.n_seq_max = 4, .n_ctx = n_ctx, .n_batch = 256, .kv_history = -1, .kv_block_size = 8};
    if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s: %s", label, err.msg);
        return;
    }
    const prompt *q = &p[0];
    for (int i = 1; i < N_REQ; i++)
        if (p[i].n > q->n) q = &p[i]; /* the longest */
    slot sl[4];
    memset(sl, 0, sizeof sl);
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = MAX_NEW, .sampling = &sp, .ignore_eos = 1};
    for (int i = 0; i < 4; i++) {
        sl[i].cancel_at = -1;
        CHECK(g4_scheduler_submit(s, q->ids, q->n, &gp, on_event, &sl[i], &sl[i].g, &err) == 0);
    }
    while (g4_scheduler_step(s, &err) > 0) {}
    g4_scheduler_stats st;
    g4_scheduler_get_stats(s, &st);
    const long cached = (long)(q->n - 1) / 8 * 8;
    CHECKF(st.reused_tokens == 3 * cached && st.prefill_tokens == q->n + 3 * (q->n - cached),
           "%s: 4 requests of one prompt of %d tokens: %ld reused (want %ld), %ld read", label, q->n,
           st.reused_tokens, 3 * cached, st.prefill_tokens);
    for (int i = 0; i < 4; i++) {
        CHECKF(sl[i].done && sl[i].n_got == MAX_NEW && q->n_alone > 0 &&
                   !memcmp(sl[i].got, q->alone, (size_t)q->n_alone * sizeof(int32_t)),
               "%s: request %d of the shared prompt: %d tokens, not those of the prompt alone", label, i, sl[i].n_got);
        g4_generation_free(sl[i].g);
    }
    printf("%-12s one prompt of %d tokens x 4: %ld steps, %ld reused\n", label, q->n, st.steps, st.reused_tokens);
    g4_scheduler_free(s);
    g4_context_free(ctx);
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
    g4_scheduler *s;
    if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s: %s", label, err.msg);
        return;
    }
    /* the prompt and two prefixes of it, and a generation on the prompt in between (steps alternate) */
    g4_generation *e[3], *g;
    slot es[3], gs = {.cancel_at = -1};
    memset(es, 0, sizeof es);
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = 4, .sampling = &sp, .ignore_eos = 1};
    for (int i = 0; i < 3; i++) {
        CHECK(g4_scheduler_submit_embed(s, ids, T - i, on_event, &es[i], &e[i], &err) == 0);
        if (i == 0) CHECK(g4_scheduler_submit(s, ids, T, &gp, on_event, &gs, &g, &err) == 0);
    }
    int left;
    while ((left = g4_scheduler_step(s, &err)) > 0) {}
    CHECK(left == 0);
    for (int i = 0; i < 3; i++) {
        const float *got = g4_generation_embedding(e[i]);
        CHECK(es[i].done && es[i].n_got == 0 && g4_generation_finish(e[i]) == G4_FINISH_STOP && got);
        if (!got) continue;
        double scale = 0, diff = 0;
        for (int h = 0; h < H; h++) {
            double mean = 0; /* the final hidden states of a prefix are the reference's first rows */
            for (int t = 0; t < T - i; t++) mean += fin[(size_t)t * H + h];
            mean /= T - i;
            if (fabs(mean) > scale) scale = fabs(mean);
            if (fabs(mean - got[h]) > diff) diff = fabs(mean - got[h]);
        }
        CHECKF(diff <= 1e-3 * scale, "%s: embedding of %d tokens differs by %g (scale %g)", label, T - i, diff, scale);
        if (i == 0) printf("%-12s embedding: max diff %.2e of %.2e\n", label, diff, scale);
        g4_generation_free(e[i]);
    }
    CHECK(g4_generation_embedding(g) == NULL);
    CHECK(g4_generation_finish(g) == G4_FINISH_LENGTH && gs.n_got == 4 && gs.done);
    g4_generation_free(g);
    g4_scheduler_free(s);
    g4_context_free(ctx);
    free(ids);
    free(fin);
}

/* Fewer sequences than requests, and pools large enough to keep everything: the second round finds every prompt
 * (less its last token) in the cache, in whole blocks. Then a sliding pool that holds little more than the running
 * windows: the cache keeps every full block, but a prefix resumes only where its window's sliding blocks are still
 * cached (a lookup that ignored the window would resume on missing rows, and the outputs would differ). */
static void check_prefix_cache(const char *label, g4_model *m, const prompt *p, int n_ctx, int W) {
    const sched_case queued = {.n_seq = 5, .n_batch = 32, .n_kv_blocks = 1000, .n_kv_sliding_blocks = 1000,
                               .rounds = 2};
    g4_scheduler_stats st = run_case(label, m, p, &queued, n_ctx);
    long cacheable = 0;
    for (int i = 0; i < N_REQ; i++) cacheable += (p[i].n - 1) / 8 * 8;
    CHECKF(st.reused_tokens == cacheable, "%s: the second round reused %ld tokens, not %ld", label, st.reused_tokens,
           cacheable);
    const int W_blocks = (W - 1 + 7) / 8 + 2;
    const sched_case tight = {.n_seq = 5, .n_batch = 32, .n_kv_blocks = 1000,
                              .n_kv_sliding_blocks = 5 * W_blocks + 32 / 8, .rounds = 2};
    st = run_case(label, m, p, &tight, n_ctx);
    CHECKF(st.reused_tokens < cacheable, "%s: a tight sliding pool kept every window", label);
}

/* Every request generating MAX_NEW tokens in a pool of a third of what they need together: preemption. */
static void check_preemption(const char *label, g4_model *m, const prompt *p, int n_ctx) {
    int need = 0, biggest = 0;
    for (int i = 0; i < N_REQ; i++) {
        int b = (p[i].n + MAX_NEW + 7) / 8;
        need += b;
        biggest = b > biggest ? b : biggest;
    }
    const sched_case small = {.n_seq = N_REQ, .n_batch = 64, .n_kv_blocks = need / 3 > biggest ? need / 3 : biggest,
                              .max_new = MAX_NEW, .rounds = 1};
    g4_scheduler_stats st = run_case(label, m, p, &small, n_ctx);
    CHECKF(st.preemptions > 0, "%s: the small pool forced no preemption", label);
}

/* A prompt that needs every block of a small full-attention pool: alone, it is admitted (the admission's headroom is
 * for running requests), makes the tokens its blocks hold room for and ends with LENGTH; the request queued behind
 * it runs after it. (The headroom used to apply to it too: neither admitted nor too big, it waited forever, and so
 * did every request behind it.) */
static void check_whole_pool(const char *label, g4_model *m, const prompt *p, int n_ctx) {
    enum { B = 8, BLOCKS = 4, N_BIG = BLOCKS * B - 3, N_SMALL = 5 };
    g4_error err;
    g4_context *ctx;
    g4_scheduler *s;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = n_ctx, .n_batch = 16, .kv_history = -1, .kv_block_size = B,
                            .n_kv_blocks = BLOCKS};
    if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s: %s", label, err.msg);
        return;
    }
    const prompt *src = &p[11]; /* the longest prompt */
    CHECK(src->n >= N_BIG);
    int32_t want_big[MAX_NEW], want_small[MAX_NEW];
    int n_big = alone(m, src->ids, N_BIG, MAX_NEW, NULL, want_big);
    int n_small = alone(m, src->ids + 1, N_SMALL, 3, NULL, want_small);
    slot big = {.cancel_at = -1}, small = {.cancel_at = -1};
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = MAX_NEW, .sampling = &sp, .ignore_eos = 1};
    CHECK(g4_scheduler_submit(s, src->ids, N_BIG, &gp, on_event, &big, &big.g, &err) == 0);
    gp.max_new_tokens = 3;
    CHECK(g4_scheduler_submit(s, src->ids + 1, N_SMALL, &gp, on_event, &small, &small.g, &err) == 0);
    int left = 1, steps = 0;
    while (steps < 1000 && (left = g4_scheduler_step(s, &err)) > 0) steps++;
    CHECKF(left == 0, "%s: a prompt of the whole pool's %d blocks: %d requests left after %d steps", label, BLOCKS,
           left, steps);
    /* its blocks hold N_BIG + 3 fed positions: 4 tokens (the last one is never fed) */
    CHECKF(big.done && g4_generation_finish(big.g) == G4_FINISH_LENGTH && big.n_got == 4 && n_big >= 4 &&
               !memcmp(big.got, want_big, 4 * sizeof(int32_t)),
           "%s: the whole-pool prompt made %d tokens (finish %d), not its first 4 alone", label, big.n_got,
           (int)g4_generation_finish(big.g));
    CHECKF(small.done && g4_generation_finish(small.g) == G4_FINISH_LENGTH && small.n_got == 3 && n_small == 3 &&
               !memcmp(small.got, want_small, 3 * sizeof(int32_t)),
           "%s: the request behind it made %d tokens, not its 3 alone", label, small.n_got);
    g4_generation_free(big.g);
    g4_generation_free(small.g);
    g4_scheduler_free(s);
    g4_context_free(ctx);
}

/* A sliding pool of exactly what one sequence's window spans (blocks of 8, no history): every request still gives
 * its tokens alone (fewer requests run at once, the others are preempted); one block fewer is an error at once
 * (it used to be taken, and then no step fitted: the scheduler ended requests with LENGTH, often with no token). */
static void check_least_sliding_pool(const char *label, g4_model *m, const prompt *p, int n_ctx, int W) {
    const int least = (W - 1 + 7) / 8 + 1;
    g4_error err;
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 4, .n_ctx = n_ctx, .n_batch = 16, .kv_history = -1, .kv_block_size = 8,
                            .n_kv_sliding_blocks = least - 1};
    int rc = g4_context_new(m, &cp, &ctx, &err);
    CHECKF(rc != 0 && strstr(err.msg, "window"), "%s: a sliding pool of %d blocks of 8 (window %d) was taken", label,
           least - 1, W);
    if (rc == 0) g4_context_free(ctx);
    const sched_case at_least = {.n_seq = 4, .n_batch = 16, .n_kv_sliding_blocks = least, .rounds = 1};
    run_case(label, m, p, &at_least, n_ctx);
}

/* Per-request temperature, top-k, repetition penalty and seeds: what the same sampler gives alone. Where the
 * backend's memory is not the host's (a GPU), a batch's products round differently from one sequence's (other
 * kernels: the logits agree to about 1e-3 of transformers' either way), and a draw whose random number falls that
 * close to a boundary of the distribution takes the neighbouring token: there two of the 16 requests may differ
 * (greedy requests may not; check_sampling_candidates compares sampled requests exactly). */
static void check_sampling(const char *label, g4_model *m, prompt *p, int n_ctx) {
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
    const sched_case sampled = {.n_seq = 8, .n_batch = 40, .sampling = &sp, .rounds = 1,
                                .may_differ = m->be->ops->host_memory ? 0 : 2};
    run_case(label, m, p, &sampled, n_ctx);
}

/* Top-k samplers fed each row's top candidates (context.h g4_decode_candidates; G4_SAMPLE_CANDIDATES=1 takes
 * that path on the CPU too) draw what the same samplers draw from whole rows (=0) in the same scheduled batches: the
 * same logits, so the same ids on every backend (a GPU's batched products round differently from one sequence's
 * alone, which a sampled draw can tell). mods: with penalties over the last 48 ids, a bias and a suppressed id
 * (their logits gathered besides the candidates), greedy or sampled. */
static void check_sampling_candidates(const char *label, g4_model *m, prompt *p, int n_ctx, int mods) {
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = mods == 2 ? 0.0f : 1.1f;
    sp.top_k = 40;
    sp.top_p = 0.9f;
    int32_t bias_ids[3] = {2, 11, 1}, sup_ids[1] = {5};
    float bias_vals[3] = {4.0f, -INFINITY, -1.5f};
    if (mods) {
        sp.repetition_penalty = 1.3f, sp.presence_penalty = 0.5f, sp.frequency_penalty = 0.2f, sp.penalty_last_n = 48;
        sp.n_bias = 3, sp.bias_ids = bias_ids, sp.bias_values = bias_vals;
        sp.n_suppress = 1, sp.suppress_ids = sup_ids;
    }
    prompt *rows = malloc(N_REQ * sizeof *rows);
    if (!rows) return;
    memcpy(rows, p, N_REQ * sizeof *rows);
    char l[300];
    snprintf(l, sizeof l, "%s (whole rows)", label);
    setenv("G4_SAMPLE_CANDIDATES", "0", 1);
    const sched_case recorded = {.n_seq = 8, .n_batch = 40, .sampling = &sp, .rounds = 1, .record = rows};
    run_case(l, m, p, &recorded, n_ctx);
    snprintf(l, sizeof l, "%s (top candidates)", label);
    setenv("G4_SAMPLE_CANDIDATES", "1", 1);
    const sched_case sampled = {.n_seq = 8, .n_batch = 40, .sampling = &sp, .rounds = 1};
    run_case(l, m, rows, &sampled, n_ctx);
    unsetenv("G4_SAMPLE_CANDIDATES");
    free(rows);
}

static g4_model *load(const char *label, const char *dir) {
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = 2};
    if (g4_model_load(dir, &lp, &m, &err) == 0) return m;
    CHECKF(0, "%s: load: %s", label, err.msg);
    return NULL;
}

/* full: every case; otherwise those the issue lists (all at once, cancellations, preemption). */
static void check_model(const char *label, const char *dir, int full) {
    g4_error err;
    g4_model *m = load(label, dir);
    if (!m) return;
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
    prompt *p = calloc(N_REQ, sizeof *p);
    if (ref_prompt && greedy && p) {
        const int V = g4_model_vocab_size(m), W = m->cfg.text.sliding_window;
        const int n_ctx = 4 * W + 7 + MAX_NEW > 256 ? 4 * W + 7 + MAX_NEW : 256;
        make_prompts(p, V, W, ref_prompt, (int)n_ref, n_ctx);
        for (int i = 0; i < N_REQ; i++) p[i].n_alone = alone(m, p[i].ids, p[i].n, MAX_NEW, NULL, p[i].alone);
        /* anchor: the reference prompt alone gives transformers' greedy ids */
        CHECKF(p[0].n_alone == MAX_NEW && n_greedy >= 24 && !memcmp(p[0].alone, greedy, 24 * sizeof(int32_t)),
               "%s: the reference prompt's greedy ids differ from transformers'", label);
        const sched_case all = {.n_seq = N_REQ, .n_batch = 64, .rounds = 1};
        run_case(label, m, p, &all, n_ctx);
        check_cancel_frees(label, m, p, n_ctx);
        check_shared_prompt(label, m, p, n_ctx);
        if (full) check_prefix_cache(label, m, p, n_ctx, W);
        if (full) check_least_sliding_pool(label, m, p, n_ctx, W);
        const sched_case cancels = {.n_seq = 6, .n_batch = 48, .cancel = 1, .rounds = 1};
        run_case(label, m, p, &cancels, n_ctx);
        check_preemption(label, m, p, n_ctx);
        check_whole_pool(label, m, p, n_ctx);
        if (full) {
            check_sampling(label, m, p, n_ctx);
            for (int mods = 0; mods < 3; mods++) check_sampling_candidates(label, m, p, n_ctx, mods);
            check_embeddings(label, m, &ref);
        }
    }
    free(p);
    free(ref_prompt);
    free(greedy);
    g4_tensor_set_free(&ref);
    g4_model_free(m);
}

/* ------------------------------------------------------------------ generation features */

/* What a generation gave: tokens, each token's log-probability and its step's most likely token, the finish. */
typedef struct {
    g4_generation *g;
    int32_t ids[MAX_NEW], top_id[MAX_NEW];
    float lp[MAX_NEW], top_lp[MAX_NEW];
    int n, n_lp, done;
    g4_finish finish;
} feat_out;

static int feat_event(const g4_event *ev, void *user) {
    feat_out *o = user;
    if (ev->kind == G4_EVENT_FINISH) {
        CHECK(!o->done);
        o->done = 1;
        o->finish = g4_generation_finish(o->g);
        return 0;
    }
    if (ev->kind != G4_EVENT_TOKEN || o->n >= MAX_NEW) return 0;
    g4_token_logprob ch;
    const g4_token_logprob *top;
    int n_top;
    if (g4_generation_logprobs(o->g, &ch, &top, &n_top) == 0) {
        CHECK(ch.token == ev->token && n_top == 3);
        o->lp[o->n] = ch.logprob;
        o->top_id[o->n] = top[0].token;
        o->top_lp[o->n] = top[0].logprob;
        o->n_lp++;
    }
    o->ids[o->n++] = ev->token;
    return 0;
}

/* Log-probabilities, JSON objects, images and audio through the scheduler: five requests on four sequences, with
 * a step budget that makes the media prompts' chunks stop before an image, give what each gives alone with
 * g4_generation_start (the same tokens and log-probabilities; on the CPU bit for bit). A prompt that holds an
 * image placeholder id without an image reads it as the pad id (as alone) and breaks nobody's batch. */
static void check_features(const char *label, g4_model *m, const g4_soft_tokens *image, const g4_soft_tokens *audio,
                           int json) {
    g4_error err;
    const int V = g4_model_vocab_size(m), cpu = !strcmp(g4_model_device(m), "cpu");
    const int img_tokens = image ? image->n_tokens : 0;
    const int n_batch = img_tokens + 24 > 48 ? img_tokens + 24 : 48;
    enum { N = 5 };
    int32_t ids[N][160];
    int n[N];
    g4_generation_params gp[N];
    g4_sampler_params sp[N];
    rng_state = 777;
    for (int r = 0; r < N; r++) {
        n[r] = r == 4 ? 150 : 40 + 7 * r;
        ids[r][0] = 2;
        for (int i = 1; i < n[r]; i++) ids[r][i] = 3 + (int32_t)(rnd() % (uint32_t)(V - 3));
        g4_model_sampler_params(m, &sp[r]);
        sp[r].temperature = 0;
        gp[r] = (g4_generation_params){.max_new_tokens = 6, .sampling = &sp[r], .ignore_eos = 1};
    }
    /* 0: an image after 40 text tokens; 1: sampled with log-probabilities; 2: an image placeholder id without an
     * image; 3: audio then an image; 4: a long prompt, greedy with log-probabilities (or a JSON object) */
    if (image) {
        ids[0][40 - 1] = m->cfg.image_token_id;
        gp[0].media = image, gp[0].n_media = 1;
        ids[2][20] = m->cfg.image_token_id;
    }
    static g4_soft_tokens both[2];
    if (image && audio) {
        both[0] = *audio, both[1] = *image;
        ids[3][5] = m->cfg.audio_token_id;
        ids[3][30] = m->cfg.image_token_id;
        gp[3].media = both, gp[3].n_media = 2;
    }
    sp[1].temperature = 0.9f, sp[1].seed = 7, sp[1].top_k = 0, sp[1].top_p = 1;
    gp[1].logprobs = 1, gp[1].top_logprobs = 3;
    gp[4].logprobs = 1, gp[4].top_logprobs = 3;
    if (json) gp[4].json_object = 1, gp[4].logprobs = 0, gp[4].max_new_tokens = 24;

    feat_out alone_out[N], sched_out[N];
    memset(alone_out, 0, sizeof alone_out);
    memset(sched_out, 0, sizeof sched_out);
    for (int r = 0; r < N; r++) {
        g4_context *ctx;
        g4_context_params cp = {.n_seq_max = 1, .n_ctx = 512, .n_batch = n_batch};
        CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0, "%s: %s", label, err.msg);
        if (g4_generation_start(ctx, 0, ids[r], n[r], &gp[r], &alone_out[r].g, &err) == 0) {
            CHECKF(g4_generation_run(alone_out[r].g, feat_event, &alone_out[r], &err) == 0, "%s alone %d: %s", label,
                   r, err.msg);
            alone_out[r].finish = g4_generation_finish(alone_out[r].g);
            g4_generation_free(alone_out[r].g);
        } else {
            CHECKF(0, "%s alone %d: %s", label, r, err.msg);
        }
        g4_context_free(ctx);
    }
    g4_context *ctx;
    g4_scheduler *s;
    g4_context_params cp = {.n_seq_max = 4, .n_ctx = 512, .n_batch = n_batch, .kv_history = -1};
    CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0, "%s: %s", label, err.msg);
    CHECKF(g4_scheduler_new(ctx, &s, &err) == 0, "%s: %s", label, err.msg);
    for (int r = 0; r < N; r++)
        CHECKF(g4_scheduler_submit(s, ids[r], n[r], &gp[r], feat_event, &sched_out[r], &sched_out[r].g, &err) == 0,
               "%s submit %d: %s", label, r, err.msg);
    int left, steps = 0;
    while ((left = g4_scheduler_step(s, &err)) > 0 && steps < 1000) steps++;
    CHECKF(left == 0, "%s: %s", label, left < 0 ? err.msg : "steps left");
    printf("%-12s features: %d steps of at most %d tokens (an image of %d soft tokens); tokens a request:", label, steps,
           n_batch, img_tokens);
    for (int r = 0; r < N; r++) printf(" %d", sched_out[r].n);
    printf("\n");
    for (int r = 0; r < N; r++) {
        feat_out *a = &alone_out[r], *b = &sched_out[r];
        CHECKF(b->done && b->finish == a->finish && b->n == a->n && a->n > 0 &&
                   !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids),
               "%s request %d: %d tokens through the scheduler (finish %d), %d alone (finish %d)", label, r, b->n,
               b->finish, a->n, a->finish);
        CHECKF(a->n_lp == b->n_lp && (a->n_lp == 0 || a->n_lp == a->n), "%s request %d: %d / %d log-probabilities",
               label, r, b->n_lp, a->n_lp);
        float worst = 0;
        for (int i = 0; i < a->n_lp && i < b->n_lp; i++) {
            float d = fabsf(a->lp[i] - b->lp[i]), d2 = fabsf(a->top_lp[i] - b->top_lp[i]);
            worst = d > worst ? d : worst;
            worst = d2 > worst ? d2 : worst;
            CHECKF(a->top_id[i] == b->top_id[i], "%s request %d token %d: top %d / %d", label, r, i, b->top_id[i],
                   a->top_id[i]);
        }
        CHECKF(cpu ? worst == 0 : worst < 2e-3f, "%s request %d: log-probabilities %g from alone", label, r, worst);
        g4_generation_free(b->g);
    }
    g4_scheduler_free(s);
    g4_context_free(ctx);
}

/* An image whose tokens do not fit what the decode tokens leave of a step: the newest decode tokens wait a step
 * for it, rather than the image waiting as long as others decode. Four text requests decode 30 tokens each on a
 * step budget of the image's tokens + 2; an image request that comes after their prompts ends long before them,
 * with the tokens it gives alone. */
static void check_image_not_starved(const char *label, g4_model *m, const g4_soft_tokens *image) {
    g4_error err;
    const int V = g4_model_vocab_size(m), n_batch = image->n_tokens + 2;
    int32_t ids[5][32];
    rng_state = 99;
    for (int r = 0; r < 5; r++) {
        ids[r][0] = 2;
        for (int i = 1; i < 32; i++) ids[r][i] = 3 + (int32_t)(rnd() % (uint32_t)(V - 3));
    }
    ids[4][10] = m->cfg.image_token_id;
    g4_sampler_params sp;
    g4_model_sampler_params(m, &sp);
    sp.temperature = 0;
    g4_generation_params text = {.max_new_tokens = 30, .sampling = &sp, .ignore_eos = 1};
    g4_generation_params img = {.max_new_tokens = 4, .sampling = &sp, .ignore_eos = 1, .media = image, .n_media = 1};
    feat_out alone = {0}, out[5];
    memset(out, 0, sizeof out);
    g4_context *ctx;
    g4_context_params cp1 = {.n_seq_max = 1, .n_ctx = 256, .n_batch = n_batch};
    CHECKF(g4_context_new(m, &cp1, &ctx, &err) == 0, "%s: %s", label, err.msg);
    if (g4_generation_start(ctx, 0, ids[4], 32, &img, &alone.g, &err) == 0) {
        CHECKF(g4_generation_run(alone.g, feat_event, &alone, &err) == 0, "%s: %s", label, err.msg);
        g4_generation_free(alone.g);
    }
    g4_context_free(ctx);
    g4_scheduler *s;
    g4_context_params cp = {.n_seq_max = 6, .n_ctx = 256, .n_batch = n_batch, .kv_history = -1};
    CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0 && g4_scheduler_new(ctx, &s, &err) == 0, "%s: %s", label, err.msg);
    for (int r = 0; r < 4; r++) CHECK(g4_scheduler_submit(s, ids[r], 32, &text, feat_event, &out[r], &out[r].g, &err) == 0);
    int steps = 0, image_done = -1, left;
    while ((left = g4_scheduler_step(s, &err)) > 0 && steps < 500) {
        if (++steps == 4) CHECK(g4_scheduler_submit(s, ids[4], 32, &img, feat_event, &out[4], &out[4].g, &err) == 0);
        if (out[4].done && image_done < 0) image_done = steps;
    }
    CHECKF(left == 0, "%s: %s", label, left < 0 ? err.msg : "steps left");
    CHECKF(image_done > 0 && image_done < 20 && out[0].n == 30,
           "%s: the image request ended at step %d of %d (submitted at 4)", label, image_done, steps);
    CHECKF(out[4].n == alone.n && alone.n == 4 && !memcmp(out[4].ids, alone.ids, sizeof alone.ids[0] * 4),
           "%s: the image request's tokens differ from alone", label);
    printf("%-12s an image of %d tokens on steps of %d beside 4 decoding requests: done at step %d of %d\n", label,
           image->n_tokens, n_batch, image_done, steps);
    for (int r = 0; r < 5; r++) g4_generation_free(out[r].g);
    g4_scheduler_free(s);
    g4_context_free(ctx);
}

static void check_media_model(const char *label, const char *dir, int with_audio) {
    g4_error err;
    g4_model *m = load(label, dir);
    if (!m) return;
    char path[4200];
    g4_image img;
    g4_soft_tokens image = {0}, audio = {0};
    snprintf(path, sizeof path, "%s/image0.png", dir);
    CHECKF(g4_image_load(path, NULL, &img, &err) == 0 && g4_image_encode(m, &img, 0, &image, &err) == 0, "%s: %s", label,
           err.msg);
    g4_image_free(&img);
    if (with_audio) {
        float *pcm;
        size_t n;
        snprintf(path, sizeof path, "%s/audio0.wav", dir);
        CHECKF(g4_audio_load(path, g4_audio_rate(m), &pcm, &n, &err) == 0 && g4_audio_encode(m, pcm, n, &audio, &err) == 0,
               "%s: %s", label, err.msg);
        free(pcm);
    }
    check_features(label, m, &image, with_audio ? &audio : NULL, 0);
    check_image_not_starved(label, m, &image);
    g4_soft_tokens_free(&image);
    g4_soft_tokens_free(&audio);
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
        check_model(fixtures[i], g4t_shared(rel), 1);
    }
    check_media_model("vision", g4t_shared("fixtures/vision"), 0);
    check_media_model("unified", g4t_shared("fixtures/unified"), 1);
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
    check_model("tolstoy-tiny", dir, 0); /* the fixtures ran the other cases; these are the slow ones here */
    g4_model *m = load("tolstoy-tiny", dir); /* a JSON object (the tokenizer's bytes) */
    if (m) check_features("tolstoy-tiny json", m, NULL, NULL, 1);
    g4_model_free(m);
    return g4t_done();
}
