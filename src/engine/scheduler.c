/* g4_scheduler (gemma4c.h): continuous batching of many generations on the sequences of one context
 * (docs/architecture.md, "A batch step is the unit of work"; vLLM's scheduler is the model).
 *
 * Every step builds one batch under a token budget of n_batch:
 *   1. requests cancelled since the last step leave, and their blocks go back to the pools at once;
 *   2. every running request that has its prompt's logits gets one decode token, oldest first; then those with a
 *      drafter (speculative decoding, engine/speculative.h) get their pending drafts after it, oldest first, from
 *      what budget is left (their rows are all wanted: the step verifies them);
 *   3. running requests still reading their prompt get chunks of what budget is left, oldest first;
 *   4. waiting requests are admitted in arrival order while a sequence is free, the budget is not spent and
 *      the main pool (full attention) has the blocks for their whole remaining prompt on top of what the
 *      running ones still need, plus some headroom while any run (headroom()); an admitted request first
 *      takes the longest prefix of its tokens the prefix cache holds (g4_kv_cache_reuse) and reads on from
 *      there; one whose prompt shares more whole blocks with a running request that has not read them yet
 *      waits until it has (pending_prefix: n choices of one prompt, one system prompt from many clients);
 *   5. if the step's blocks do not fit the pools, the newest request's drafts are left out, then the newest
 *      prefill chunk is halved, then dropped, then the
 *      newest running requests are preempted: their blocks are freed and they wait at the front of the queue
 *      to be recomputed (prompt and the tokens so far; the prefix cache often still has them); a request that
 *      cannot go on even alone ends with LENGTH (its tokens need more than the pool);
 *   6. the batch runs (g4_decode; g4_decode_greedy when every row that needs a token is a plain argmax;
 *      g4_decode_candidates when every such row's sampler needs only its top candidates and the logits are in
 *      device memory: only those come back, with the logits of its penalized, biased and suppressed ids), each
 *      request that got logits or candidates samples its next token (a verification keeps the drafts its rows
 *      agree with and the token after them: g4_spec_verified; then its next round's drafting and the roll-back of
 *      the rejected rows are planned, g4_spec_next; its first round starts from its prompt's first row,
 *      transformers' quirk) with its own sampler (g4_generation_take turns it into events and decides the end), and
 *      requests that ended free their sequence. A step that fails ends its requests with the error
 *      (G4_FINISH_ERROR);
 *   7. the requests that planned a drafting draft together, one drafter forward of all their rows per drafter
 *      (each drafter step reads its weights once for all of them), and roll their rejected rows back
 *      (g4_spec_draft_planned).
 * Images and audio: a request's soft tokens take their rows (the generation's) in the step that reads them, and
 * an image's tokens are never split between steps (g4_step_length: a chunk stops before an image that does not
 * fit; when it does not fit what the decode tokens left of the budget, the newest of those wait a step). A
 * placeholder id without a row (in a prompt without media, or generated) is fed as the pad id, which is what the
 * forward pass reads for it, so that it cannot break a batch of other requests' images. A token the model cannot
 * read (g4_token_read) fails its own request, at submit or when generated, not the step.
 * A request's last token is never fed to the model. Its sequence's blocks stay in the prefix cache after it
 * leaves (a later request with the same prefix, e.g. the next turn of a chat, starts from them).
 *
 * Embedding requests read their ids with every row's final hidden state kept (summed, then averaged); their
 * steps compute no logits, and they never reuse a cached prefix (the states of reused positions would be
 * missing). Generation steps and embedding steps alternate while both kinds have work.
 *
 * Threads: submit and cancel from any thread (the queue has a lock; cancel is a flag); a step on one thread
 * at a time; the callbacks run inside the step. Hot paths allocate nothing: the step's arrays are sized once,
 * the queue grows in submit. */
#include <pthread.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/context.h"
#include "engine/generation.h"
#include "engine/speculative.h"

typedef struct request {
    g4_generation *gen;
    int32_t *tokens; /* prompt, then generated ids [cap], as the model reads them: soft-token placeholders without
                        rows (in a prompt without media, or generated) are the pad id, which is what the model
                        reads for them (context.c, multimodal_rows) */
    const float *embd; /* the rows of the prompt's soft tokens, in order (the generation's), or NULL */
    int n_prompt, n_tokens, cap;
    int n_fed;       /* tokens its sequence holds (0 while waiting) */
    int seq;         /* -1 while waiting */
    int embed;
    int admitted;    /* it has run (a preempted one waits again) */
    int start;       /* the first position it fed since its admission */
    int drafting;    /* with a drafter: its prompt is read since its admission, its steps are verifications */
    g4_spec *spec;   /* while on a sequence, with a drafter: speculative decoding (made at admission), or NULL */
    double *sum;     /* embed: the running sum of the final hidden states */
} request;

struct g4_scheduler {
    g4_context *ctx;
    int n_seq, n_batch, vocab, H;
    pthread_mutex_t lock;  /* guards the waiting queue */
    request **waiting;     /* ring buffer: arrival order, preempted requests pushed in front */
    int w_head, w_count, w_cap;
    request **running;     /* [n_seq] by sequence, NULL where free */
    request **run_list;    /* [n_seq] the running requests in admission order */
    int n_running;
    int last_step_embed;
    /* one step's plan and buffers */
    request **plan_req;    /* [n_batch] requests of the step, in batch order */
    int *plan_n;           /* [n_batch] tokens each feeds (its drafts included) */
    int *plan_d;           /* [n_batch] of which drafts */
    int *plan_w;           /* [n_batch] its first wanted row (-1: none) */
    int *plan_h0;          /* [n_batch] its wanted row of a drafter's first hidden state (-1: none) */
    int n_plan;
    int32_t *tok, *seq;    /* [n_batch] */
    uint8_t *want;         /* [n_batch] */
    int32_t *ids;          /* [n_batch] greedy ids of the wanted rows */
    int32_t *round;        /* [n_batch] a verification's kept drafts and next token */
    float *logits;         /* [logit_rows][vocab] (grown for a step's drafts) */
    int logit_rows;
    int cand_max;          /* g4_context_candidates_max: 0 where every sampled row takes its logits */
    g4_candidates cand;    /* [logit_rows] rows of top candidates (rows beyond cap: their logits in `logits`) and
                              the logits of their samplers' modified ids (extra_at[w] .. extra_at[w + 1] - 1) */
    int32_t *extra_row, *extra_id, *extra_at; /* [extra_cap], [extra_cap], [logit_rows + 1] */
    float *extra_vals;                        /* [extra_cap] */
    int extra_cap;
    float *final_rows;     /* [n_batch][H]: final hidden states of an embedding step */
    float *embd;           /* [n_batch][H]: the soft tokens' rows of a step (allocated by the first that has any) */
    request **draft_req;   /* [n_seq] the requests whose next drafts a step planned, drafted together after it */
    g4_spec **draft_spec;  /* [n_seq] their states */
    int *draft_rc;         /* [n_seq] */
    g4_error *draft_err;   /* [n_seq] */
    g4_scheduler_stats stats;
};

/* ------------------------------------------------------------------ queue */

static request *queue_at(const g4_scheduler *s, int i) { return s->waiting[(s->w_head + i) % s->w_cap]; }

/* Rows of logits (and of candidates) for a step's wanted rows; 0 or -1 when out of memory. */
static int rows_reserve(g4_scheduler *s, int rows) {
    float *l = realloc(s->logits, (size_t)rows * (size_t)s->vocab * sizeof *l);
    if (!l) return -1;
    s->logits = s->cand.fallback = l;
    if (s->cand_max) {
        const size_t cap = (size_t)g4_candidates_cap(s->cand_max);
        int32_t *ids = realloc(s->cand.ids, (size_t)rows * cap * sizeof *ids);
        if (ids) s->cand.ids = ids;
        float *vals = realloc(s->cand.vals, (size_t)rows * cap * sizeof *vals);
        if (vals) s->cand.vals = vals;
        int32_t *count = realloc(s->cand.count, (size_t)rows * sizeof *count);
        if (count) s->cand.count = count;
        int32_t *at = realloc(s->extra_at, ((size_t)rows + 1) * sizeof *at);
        if (at) s->extra_at = at;
        if (!ids || !vals || !count || !at) return -1;
    }
    s->logit_rows = rows;
    return 0;
}

/* Room for n extra ids of a step (the samplers' modified ids); 0 or -1 when out of memory (then the step copies
 * whole rows). */
static int extras_reserve(g4_scheduler *s, int n) {
    int cap = s->extra_cap ? s->extra_cap : 256;
    while (cap < n) cap *= 2;
    int32_t *row = realloc(s->extra_row, (size_t)cap * sizeof *row);
    if (row) s->extra_row = row;
    int32_t *id = realloc(s->extra_id, (size_t)cap * sizeof *id);
    if (id) s->extra_id = id;
    float *vals = realloc(s->extra_vals, (size_t)cap * sizeof *vals);
    if (vals) s->extra_vals = vals;
    if (!row || !id || !vals) return -1;
    s->extra_cap = cap;
    return 0;
}

static void queue_remove(g4_scheduler *s, int i) { /* keeps the order */
    for (int j = i; j > 0; j--) s->waiting[(s->w_head + j) % s->w_cap] = s->waiting[(s->w_head + j - 1) % s->w_cap];
    s->w_head = (s->w_head + 1) % s->w_cap;
    s->w_count--;
}

/* Room for `need` waiting requests (under the lock). */
static int queue_reserve(g4_scheduler *s, int need) {
    if (need <= s->w_cap) return 0;
    int cap = s->w_cap ? s->w_cap : 16;
    while (cap < need) cap *= 2;
    request **q = malloc((size_t)cap * sizeof *q);
    if (!q) return -1;
    for (int i = 0; i < s->w_count; i++) q[i] = queue_at(s, i);
    free(s->waiting);
    s->waiting = q;
    s->w_head = 0;
    s->w_cap = cap;
    return 0;
}

/* ------------------------------------------------------------------ requests */

static void request_free(request *r) {
    if (!r) return;
    if (r->gen) g4_generation_release(r->gen);
    free(r->tokens);
    free(r->sum);
    free(r);
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const g4_kv_pool *main_pool(const g4_scheduler *s) {
    const g4_kv_pool *p = &s->ctx->kv.pool[G4_LAYER_FULL];
    return p->used ? p : &s->ctx->kv.pool[G4_LAYER_SLIDING];
}

/* Blocks of the main pool that n positions take. */
static long blocks_for(const g4_scheduler *s, int n) { return (n + s->ctx->kv.block - 1) / s->ctx->kv.block; }

/* Tokens of r's next prefill chunk: what it has left, at most max, without splitting an image's soft tokens
 * (g4_step_length); 0 when its next image does not fit max. */
static int chunk(const g4_scheduler *s, const request *r, int max) {
    const int left = r->n_tokens - r->n_fed;
    if (left <= max || !r->embd) return left < max ? left : max;
    g4_error e;
    const int k = g4_step_length(s->ctx->model, r->tokens + r->n_fed, left, max, &e);
    return k < 0 ? 0 : k;
}

static int submit(g4_scheduler *s, const int32_t *ids, int n, const g4_generation_params *params, int embed,
                  g4_event_fn on_event, void *user, g4_generation **out, g4_error *err) {
    if (!out) return g4_fail(err, "g4_scheduler_submit: out is NULL");
    *out = NULL;
    if (!s) return g4_fail(err, "g4_scheduler_submit: s is NULL");
    g4_generation *g;
    if (g4_generation_new_scheduled(s->ctx->model, s->ctx->n_ctx, ids, n, params, embed, on_event, user, &g, err))
        return -1;
    g4_spec_params spp;
    g4_drafter *d = embed ? NULL : g4_generation_drafter(g, &spp);
    if (d && g4_spec_check_scheduled(s->ctx, d, &spp, err)) { /* (its state is made at admission) */
        g4_generation_release(g);
        g4_generation_free(g);
        return -1;
    }
    ids = g4_generation_prompt(g, &n); /* with images and audio: expanded */
    const float *embd = g4_generation_embd(g);
    for (int i = 0; embd && i < n;) { /* every image fits a step */
        const int k = g4_step_length(s->ctx->model, ids + i, n - i, s->n_batch, err);
        if (k < 0) {
            g4_generation_release(g);
            g4_generation_free(g);
            return -1;
        }
        i += k;
    }
    request *r = calloc(1, sizeof *r);
    int cap = embed ? n : n + g4_generation_max_new(g);
    if (r) r->gen = g;
    if (!r || !(r->tokens = malloc((size_t)cap * sizeof *r->tokens)) ||
        (embed && !(r->sum = calloc((size_t)s->H, sizeof *r->sum)))) {
        if (!r) g4_generation_release(g);
        request_free(r);
        g4_generation_free(g);
        return g4_fail(err, "out of memory");
    }
    /* a token the model cannot read fails its request here, not a batch of others (g4_token_read) */
    for (int i = 0; i < n; i++) {
        const int32_t read = g4_token_read(s->ctx->model, ids[i], err);
        if (read < 0) {
            g4_fail_prefix(err, "prompt token %d", i);
            request_free(r);
            g4_generation_free(g);
            return -1;
        }
        r->tokens[i] = embd ? ids[i] : read;
    }
    r->embd = embd;
    r->n_prompt = r->n_tokens = n;
    r->cap = cap;
    r->seq = -1;
    r->embed = embed;
    if (blocks_for(s, n) > main_pool(s)->n_blocks) {
        g4_fail(err, "the prompt (%d tokens) needs %ld KV blocks, the pool has %d", n, blocks_for(s, n),
                main_pool(s)->n_blocks);
        request_free(r);
        g4_generation_free(g);
        return -1;
    }
    pthread_mutex_lock(&s->lock);
    int rc = queue_reserve(s, s->w_count + s->n_running + 1);
    if (rc == 0) s->waiting[(s->w_head + s->w_count++) % s->w_cap] = r;
    pthread_mutex_unlock(&s->lock);
    if (rc) {
        request_free(r);
        g4_generation_free(g);
        return g4_fail(err, "out of memory");
    }
    *out = g;
    return 0;
}

int g4_scheduler_submit(g4_scheduler *s, const int32_t *prompt, int n_prompt, const g4_generation_params *params,
                        g4_event_fn on_event, void *user, g4_generation **out, g4_error *err) {
    return submit(s, prompt, n_prompt, params, 0, on_event, user, out, err);
}

int g4_scheduler_submit_chat(g4_scheduler *s, const g4_chat *c, const g4_generation_params *params,
                             g4_event_fn on_event, void *user, g4_generation **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(s, err);
    G4_ARG(c, err);
    g4_tokens toks = {0};
    int rc = -1;
    if (g4_chat_reply_prompt(c, s->ctx->model, &toks, err) == 0) {
        g4_generation_params p = {0};
        if (params) p = *params;
        p.parse_chat = 1;
        rc = submit(s, toks.ids, (int)toks.n, &p, 0, on_event, user, out, err);
    }
    free(toks.ids);
    return rc;
}

int g4_scheduler_submit_embed(g4_scheduler *s, const int32_t *ids, int n_ids, g4_event_fn on_event, void *user,
                              g4_generation **out, g4_error *err) {
    if (out) *out = NULL;
    G4_ARG(s, err);
    return submit(s, ids, n_ids, NULL, 1, on_event, user, out, err);
}

/* ------------------------------------------------------------------ lifecycle */

int g4_scheduler_new(g4_context *ctx, g4_scheduler **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(ctx, err);
    if (ctx->scheduler) return g4_fail(err, "the context already has a scheduler (it takes every sequence)");
    g4_scheduler *s = calloc(1, sizeof *s);
    if (!s) return g4_fail(err, "out of memory");
    s->ctx = ctx;
    s->n_seq = ctx->n_seq;
    s->n_batch = ctx->n_batch;
    s->vocab = ctx->model->cfg.text.vocab_size;
    s->H = ctx->model->cfg.text.hidden_size;
    s->logit_rows = s->n_seq < s->n_batch ? s->n_seq : s->n_batch;
    pthread_mutex_init(&s->lock, NULL);
    const size_t nb = (size_t)s->n_batch;
    s->running = calloc((size_t)s->n_seq, sizeof *s->running);
    s->run_list = calloc((size_t)s->n_seq, sizeof *s->run_list);
    s->plan_req = malloc(nb * sizeof *s->plan_req);
    s->plan_n = malloc(nb * sizeof *s->plan_n);
    s->plan_d = malloc(nb * sizeof *s->plan_d);
    s->plan_w = malloc(nb * sizeof *s->plan_w);
    s->plan_h0 = malloc(nb * sizeof *s->plan_h0);
    s->tok = malloc(nb * sizeof *s->tok);
    s->seq = malloc(nb * sizeof *s->seq);
    s->want = malloc(nb);
    s->ids = malloc(nb * sizeof *s->ids);
    s->round = malloc(nb * sizeof *s->round);
    s->logits = malloc((size_t)s->logit_rows * (size_t)s->vocab * sizeof *s->logits);
    s->final_rows = malloc(nb * (size_t)s->H * sizeof *s->final_rows);
    s->draft_req = malloc((size_t)s->n_seq * sizeof *s->draft_req);
    s->draft_spec = malloc((size_t)s->n_seq * sizeof *s->draft_spec);
    s->draft_rc = malloc((size_t)s->n_seq * sizeof *s->draft_rc);
    s->draft_err = malloc((size_t)s->n_seq * sizeof *s->draft_err);
    s->cand_max = g4_context_candidates_max(ctx);
    if (s->cand_max) {
        const size_t cap = (size_t)g4_candidates_cap(s->cand_max), rows = (size_t)s->logit_rows;
        s->cand = (g4_candidates){.ids = malloc(rows * cap * sizeof(int32_t)), .count = malloc(rows * sizeof(int32_t)),
                                  .vals = malloc(rows * cap * sizeof(float)), .fallback = s->logits};
        s->extra_at = malloc((rows + 1) * sizeof(int32_t));
    }
    if (!s->running || !s->run_list || !s->plan_req || !s->plan_n || !s->plan_d || !s->plan_w || !s->plan_h0 ||
        !s->tok || !s->seq || !s->want || !s->ids || !s->round || !s->logits || !s->final_rows || !s->draft_req ||
        !s->draft_spec || !s->draft_rc || !s->draft_err ||
        (s->cand_max && (!s->cand.ids || !s->cand.count || !s->cand.vals || !s->extra_at)) ||
        queue_reserve(s, 16)) {
        g4_scheduler_free(s);
        return g4_fail(err, "out of memory for a scheduler of %d sequences", ctx->n_seq);
    }
    for (int q = 0; q < s->n_seq; q++) g4_seq_reset(ctx, q);
    ctx->scheduler = s;
    *out = s;
    return 0;
}

static void finish(g4_scheduler *s, request *r, g4_finish why);

void g4_scheduler_free(g4_scheduler *s) {
    if (!s) return;
    if (s->ctx && s->ctx->scheduler == s) s->ctx->scheduler = NULL;
    while (s->n_running > 0) finish(s, s->run_list[s->n_running - 1], G4_FINISH_CANCELLED);
    while (s->w_count > 0) {
        request *r = queue_at(s, 0);
        queue_remove(s, 0);
        finish(s, r, G4_FINISH_CANCELLED);
    }
    pthread_mutex_destroy(&s->lock);
    free(s->waiting);
    free(s->running);
    free(s->run_list);
    free(s->plan_req);
    free(s->plan_n);
    free(s->plan_d);
    free(s->plan_w);
    free(s->plan_h0);
    free(s->draft_req);
    free(s->draft_spec);
    free(s->draft_rc);
    free(s->draft_err);
    free(s->tok);
    free(s->seq);
    free(s->want);
    free(s->ids);
    free(s->round);
    free(s->logits);
    free(s->cand.ids);
    free(s->cand.count);
    free(s->cand.vals);
    free(s->extra_row);
    free(s->extra_id);
    free(s->extra_at);
    free(s->extra_vals);
    free(s->final_rows);
    free(s->embd);
    free(s);
}

void g4_scheduler_get_stats(const g4_scheduler *s, g4_scheduler_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    g4_scheduler *m = (g4_scheduler *)s;
    pthread_mutex_lock(&m->lock);
    *out = s->stats;
    out->running = s->n_running;
    out->waiting = s->w_count;
    pthread_mutex_unlock(&m->lock);
}

/* ------------------------------------------------------------------ running set */

static void admit(g4_scheduler *s, request *r, int q, int reused) {
    s->running[q] = r;
    s->run_list[s->n_running++] = r;
    r->seq = q;
    r->n_fed = r->start = reused;
    r->drafting = 0;
    g4_spec_params spp;
    g4_drafter *d = r->embed ? NULL : g4_generation_drafter(r->gen, &spp);
    g4_error e; /* (out of memory for its state: it decodes without drafts) */
    if (d && g4_spec_new_scheduled(s->ctx, d, &spp, &r->spec, &e) == 0) g4_spec_bind(r->spec, q);
    s->stats.reused_tokens += reused;
    if (!r->admitted) g4_generation_set_cached(r->gen, reused);
    r->admitted = 1;
}

/* Takes r out of the running set; its sequence's blocks go back to the pools (hashed ones stay cached). */
static void release(g4_scheduler *s, request *r) {
    if (r->seq < 0) return;
    g4_spec_free(r->spec);
    r->spec = NULL;
    g4_seq_reset(s->ctx, r->seq);
    s->running[r->seq] = NULL;
    int i = 0;
    while (s->run_list[i] != r) i++;
    memmove(s->run_list + i, s->run_list + i + 1, (size_t)(s->n_running - i - 1) * sizeof *s->run_list);
    s->n_running--;
    r->seq = -1;
    r->n_fed = 0;
}

/* r leaves: its blocks go back, its generation ends (why, unless it has ended) and hears so. */
static void finish(g4_scheduler *s, request *r, g4_finish why) {
    release(s, r);
    if (r->embed && why == G4_FINISH_STOP) {
        float *out = g4_generation_embedding_out(r->gen);
        for (int h = 0; h < s->H; h++) out[h] = (float)(r->sum[h] / r->n_tokens);
    }
    g4_generation_end(r->gen, why);
    g4_generation_deliver(r->gen);
    request_free(r);
}

/* Frees r's blocks and puts it in front of the queue, to be recomputed from its tokens so far. */
static void preempt(g4_scheduler *s, request *r) {
    release(s, r);
    if (r->embed) memset(r->sum, 0, (size_t)s->H * sizeof *r->sum);
    s->stats.preemptions++;
    pthread_mutex_lock(&s->lock); /* room: the queue holds every unfinished request */
    s->w_head = (s->w_head + s->w_cap - 1) % s->w_cap;
    s->waiting[s->w_head] = r;
    s->w_count++;
    pthread_mutex_unlock(&s->lock);
}

/* Cancelled requests leave: running ones free their blocks now, waiting ones leave the queue. */
static void drop_cancelled(g4_scheduler *s) {
    for (int i = s->n_running - 1; i >= 0; i--)
        if (g4_generation_cancelled(s->run_list[i]->gen)) finish(s, s->run_list[i], G4_FINISH_CANCELLED);
    for (;;) {
        request *r = NULL;
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < s->w_count && !r; i++)
            if (g4_generation_cancelled(queue_at(s, i)->gen)) {
                r = queue_at(s, i);
                queue_remove(s, i);
            }
        pthread_mutex_unlock(&s->lock);
        if (!r) break;
        finish(s, r, G4_FINISH_CANCELLED); /* outside the lock: the callback may submit */
    }
}

/* ------------------------------------------------------------------ one step */

static void plan_add(g4_scheduler *s, request *r, int k) {
    s->plan_req[s->n_plan] = r;
    s->plan_d[s->n_plan] = 0;
    s->plan_n[s->n_plan++] = k;
}

static void plan_remove(g4_scheduler *s, int i) {
    memmove(s->plan_req + i, s->plan_req + i + 1, (size_t)(s->n_plan - i - 1) * sizeof *s->plan_req);
    memmove(s->plan_n + i, s->plan_n + i + 1, (size_t)(s->n_plan - i - 1) * sizeof *s->plan_n);
    memmove(s->plan_d + i, s->plan_d + i + 1, (size_t)(s->n_plan - i - 1) * sizeof *s->plan_d);
    s->n_plan--;
}

/* Blocks kept free at admission for the running requests' next tokens (while some run): none when the pool lets
 * every sequence reach n_ctx (nothing can run out), else 1% of the pool (vLLM's watermark), at least one. */
static long headroom(const g4_scheduler *s) {
    const g4_kv_pool *p = main_pool(s);
    if ((long)p->n_blocks >= (long)s->n_seq * s->ctx->kv.max_blocks) return 0;
    return (p->n_blocks + 99) / 100;
}

/* The length of the prefix that r's prompt (but its last token, read for its logits) shares with a running
 * request that is still reading its tokens and has not read that far: the blocks of it the prefix cache lacks
 * now are there once that request has read them, so r waits for them rather than read them again beside it (the
 * choices of one request, many requests with one system prompt arriving together; SGLang's in-batch prefix
 * caching). Requests with images or audio (placeholders stand for different rows) and embeddings are not
 * compared. */
static int pending_prefix(const g4_scheduler *s, const request *r) {
    if (r->embed || r->embd) return 0;
    int best = 0;
    for (int i = 0; i < s->n_running; i++) {
        const request *p = s->run_list[i];
        if (p->embed || p->embd || p->n_tokens - p->n_fed <= 1) continue; /* decoding: its prompt is in */
        const int n = p->n_tokens < r->n_tokens - 1 ? p->n_tokens : r->n_tokens - 1;
        int c = 0;
        while (c < n && p->tokens[c] == r->tokens[c]) c++;
        if (c > p->n_fed && c > best) best = c;
    }
    return best;
}

/* Admits waiting requests of one kind in arrival order while a sequence, budget and blocks are free; one whose
 * prompt's blocks a running request is about to put in the prefix cache waits for them (pending_prefix). */
static void admit_waiting(g4_scheduler *s, int embed_step, int *budget) {
    g4_context *ctx = s->ctx;
    long reserve = 0; /* blocks the running requests still need for the tokens they have */
    for (int i = 0; i < s->n_running; i++)
        reserve += blocks_for(s, s->run_list[i]->n_tokens) - blocks_for(s, s->run_list[i]->n_fed);
    request *too_big = NULL;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->w_count && *budget > 0 && s->n_running < s->n_seq;) {
        request *r = queue_at(s, i);
        if (r->embed != embed_step || g4_generation_cancelled(r->gen)) {
            i++;
            continue;
        }
        int q = 0;
        while (s->running[q]) q++;
        /* at least the last token is read, for its logits */
        int reused = r->embed ? 0 : g4_seq_reuse_prefix(ctx, q, r->tokens, r->n_tokens - 1);
        if (pending_prefix(s, r) / ctx->kv.block > reused / ctx->kv.block) {
            g4_seq_reset(ctx, q);
            i++;
            continue;
        }
        long need = blocks_for(s, r->n_tokens) - reused / ctx->kv.block;
        /* the headroom is for running requests: alone, a request that fits the pool runs (else it would wait
         * forever, neither admitted nor too big, and every request behind it with it) */
        if (main_pool(s)->n_free < reserve + need + (s->n_running ? headroom(s) : 0)) {
            g4_seq_reset(ctx, q);
            if (s->n_running == 0 && need > main_pool(s)->n_free) { /* it would not fit even alone */
                too_big = r;
                queue_remove(s, i);
            }
            break;
        }
        queue_remove(s, i);
        admit(s, r, q, reused);
        reserve += need;
        const int k = chunk(s, r, *budget);
        if (k > 0) plan_add(s, r, k);
        *budget -= k;
    }
    pthread_mutex_unlock(&s->lock);
    if (too_big) finish(s, too_big, G4_FINISH_LENGTH);
}

/* 1 when the plan's blocks fit the pools. */
static int plan_fits(g4_scheduler *s) {
    long need[G4_LAYER_TYPES] = {0};
    for (int i = 0; i < s->n_plan; i++) {
        int c[G4_LAYER_TYPES];
        g4_kv_cache_cost(&s->ctx->kv, s->plan_req[i]->seq, s->plan_n[i], c);
        for (int t = 0; t < G4_LAYER_TYPES; t++) need[t] += c[t];
    }
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        if (s->ctx->kv.pool[t].used && need[t] > s->ctx->kv.pool[t].n_free) return 0;
    return 1;
}

static int decoding(const request *r) { return !r->embed && r->n_tokens - r->n_fed == 1; }

/* Shrinks the plan until its blocks fit (step 5 above). */
static void fit_plan(g4_scheduler *s) {
    while (s->n_plan > 0 && !plan_fits(s)) {
        int dr = s->n_plan - 1; /* the newest request's drafts first */
        while (dr >= 0 && !s->plan_d[dr]) dr--;
        if (dr >= 0) {
            s->plan_n[dr] -= s->plan_d[dr];
            s->plan_d[dr] = 0;
            continue;
        }
        int i = s->n_plan - 1;
        while (i >= 0 && decoding(s->plan_req[i])) i--;
        const int half = i >= 0 && s->plan_n[i] > 1 ? chunk(s, s->plan_req[i], s->plan_n[i] / 2) : 0;
        if (half > 0) {
            s->plan_n[i] = half;
            continue;
        }
        if (i >= 0 && s->n_plan > 1) {
            plan_remove(s, i);
            continue;
        }
        request *v = s->run_list[s->n_running - 1];
        for (int j = 0; j < s->n_plan; j++)
            if (s->plan_req[j] == v) {
                plan_remove(s, j);
                break;
            }
        if (s->n_running == 1) finish(s, v, G4_FINISH_LENGTH);
        else preempt(s, v);
    }
}

/* A failed step: its requests end with the error (a failed model step may fail again the same way, so they are not
 * retried); the others go on. */
static void fail_plan(g4_scheduler *s, const char *why) {
    for (int i = 0; i < s->n_plan; i++) {
        request *r = s->plan_req[i];
        g4_generation_fail(r->gen, why);
        finish(s, r, G4_FINISH_ERROR);
    }
    s->n_plan = 0;
}

enum { ROWS_IDS, ROWS_CANDIDATES, ROWS_LOGITS }; /* what a step's wanted rows gave */
enum { STEP_DRAFTS_MAX = 256 };

/* r's verification step: its newest token and d drafts, wanted rows w .. w + d (argmax ids in s->ids when the step
 * was greedy, else candidates or logits). The kept drafts and the main model's token after them go to the
 * generation, which may end on one of them; else its next round's drafting and the roll-back of its rejected rows
 * are planned (draft_planned). */
static void verified(g4_scheduler *s, request *r, int d, int w, int rows, const float *final) {
    const g4_model *m = s->ctx->model;
    g4_error e;
    const int n = g4_spec_verified(r->spec, d, rows == ROWS_IDS ? s->ids + w : NULL,
                                   rows == ROWS_LOGITS ? s->logits + (size_t)w * s->vocab : NULL,
                                   rows == ROWS_CANDIDATES ? &s->cand : NULL, w, g4_generation_sampler(r->gen),
                                   s->round, &e);
    if (n < 0) {
        g4_generation_fail(r->gen, e.msg);
        finish(s, r, G4_FINISH_STOP); /* it has ended: the reason is its own */
        return;
    }
    s->stats.draft_tokens += d;
    s->stats.accepted_tokens += n;
    g4_generation_add_round(r->gen, d, n);
    s->stats.decode_tokens += n + 1;
    for (int j = 0; j <= n && !g4_generation_finish(r->gen); j++) g4_generation_take(r->gen, s->round[j]);
    /* the kept drafts were fed (as the model reads them); the next token is fed by the next step */
    const int32_t next = g4_generation_finish(r->gen) ? 0 : g4_token_read(m, s->round[n], &e);
    if (next < 0) g4_generation_fail(r->gen, e.msg); /* it cannot be fed: it fails alone */
    if (g4_generation_finish(r->gen)) {
        finish(s, r, G4_FINISH_STOP);
        return;
    }
    for (int j = 0; j < n; j++) r->tokens[r->n_tokens++] = g4_token_read(m, s->round[j], NULL);
    r->n_fed += n;
    r->tokens[r->n_tokens++] = next;
    g4_spec_next(r->spec, final + (size_t)(w + n) * s->H, d, n, s->round[n], g4_generation_left(r->gen));
    g4_generation_deliver(r->gen);
}

/* After a step's outputs: the next drafts of every request that planned them, one drafter forward for all (a drafter
 * step of many requests reads its weights once), then their roll-backs. */
static void draft_planned(g4_scheduler *s) {
    int n = 0;
    for (int i = 0; i < s->n_running; i++) {
        request *r = s->run_list[i];
        if (r->spec && r->drafting) s->draft_req[n] = r, s->draft_spec[n++] = r->spec;
    }
    if (n == 0) return;
    const double t0 = seconds_now();
    s->stats.draft_steps += g4_spec_draft_planned(s->draft_spec, n, s->draft_rc, s->draft_err);
    s->stats.draft_seconds += seconds_now() - t0;
    for (int i = 0; i < n; i++)
        if (s->draft_rc[i]) {
            g4_generation_fail(s->draft_req[i]->gen, s->draft_err[i].msg);
            finish(s, s->draft_req[i], G4_FINISH_STOP);
        }
}

int g4_scheduler_step(g4_scheduler *s, g4_error *err) {
    G4_ARG(s, err);
    g4_error unused;
    if (!err) err = &unused; /* the failed requests get the message */
    const double t_step = seconds_now();
    g4_context *ctx = s->ctx;
    drop_cancelled(s);
    /* which kind of step: embeddings and generations alternate when both have work */
    int gen = 0, emb = 0;
    for (int i = 0; i < s->n_running; i++) *(s->run_list[i]->embed ? &emb : &gen) = 1;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->w_count; i++) *(queue_at(s, i)->embed ? &emb : &gen) = 1;
    pthread_mutex_unlock(&s->lock);
    const int embed_step = emb && (!gen || !s->last_step_embed);
    s->last_step_embed = embed_step;

    /* plan: decode tokens, prefill chunks, admissions, under the token budget */
    int budget = s->n_batch;
    s->n_plan = 0;
    for (int i = 0; i < s->n_running && budget > 0; i++)
        if (!embed_step && decoding(s->run_list[i])) plan_add(s, s->run_list[i], 1), budget--;
    /* their drafts, oldest first (up to one the model cannot read, g4_token_read), at most STEP_DRAFTS_MAX in all
     * (a sampled verification's rows come back as logits or candidates: the step's rows are bounded) */
    for (int i = 0, drafts = STEP_DRAFTS_MAX; i < s->n_plan && budget > 0; i++) {
        const g4_spec *sp = s->plan_req[i]->spec;
        int d = sp ? g4_spec_pending(sp) : 0;
        for (int j = 0; j < d; j++)
            if (g4_token_read(ctx->model, g4_spec_drafts(sp)[j], NULL) < 0) d = j;
        if (d > budget) d = budget;
        if (d > drafts) d = drafts;
        s->plan_d[i] = d;
        s->plan_n[i] += d;
        budget -= d;
        drafts -= d;
    }
    for (int i = 0; i < s->n_running; i++) {
        request *r = s->run_list[i];
        if (r->embed != embed_step || decoding(r)) continue;
        if (budget == 0) break;
        int k = chunk(s, r, budget);
        /* an image that does not fit what the decode tokens left: the newest of them wait a step (else it could
         * wait as long as others decode) */
        for (int j = s->n_plan - 1; k == 0 && r->embd && j >= 0; j--)
            if (decoding(s->plan_req[j])) {
                budget += s->plan_n[j];
                plan_remove(s, j);
                k = chunk(s, r, budget);
            }
        if (k == 0) continue;
        plan_add(s, r, k);
        budget -= k;
    }
    admit_waiting(s, embed_step, &budget);
    fit_plan(s);

    /* the batch: each request's tokens, a drafting one's drafts after its newest. Wanted rows (a generation step's
     * logits or ids, in batch order): the last row of a request that samples, and with a drafter the rows of a
     * verification and the first row its prompt's reading starts with (the first round's hidden state) */
    int n = 0, n_want = 0, all_greedy = 1, top_k = 0; /* top_k: the largest k of the rows' candidates, -1 when a
                                                        * row needs its logits */
    int n_rows = 0, n_extra = 0, n_embd = 0;
    const g4_model *m = ctx->model;
    for (int i = 0; i < s->n_plan; i++) {
        request *r = s->plan_req[i];
        const int d = s->plan_d[i], k = s->plan_n[i] - d, last = r->n_fed + k == r->n_tokens;
        const int first = !embed_step && r->spec && !r->drafting && r->n_fed == r->start;
        const int32_t *drafts = d ? g4_spec_drafts(r->spec) : NULL;
        s->plan_w[i] = s->plan_h0[i] = -1;
        for (int j = 0; j < k + d; j++) {
            s->tok[n] = j < k ? r->tokens[r->n_fed + j] : g4_token_read(m, drafts[j - k], NULL);
            s->seq[n] = r->seq;
            const int samples = last && j == k - 1, h0 = first && j == 0;
            s->want[n] = embed_step || samples || h0 || j >= k;
            if (s->want[n] && !embed_step) {
                if (h0) s->plan_h0[i] = n_rows;
                if (samples) s->plan_w[i] = n_rows;
                n_rows++;
            }
            n++;
        }
        const int n_soft = r->embd ? g4_count_soft_tokens(m, r->tokens + r->n_fed, k) : 0;
        if (n_soft) { /* the rows of the chunk's soft tokens: those before it were read by earlier steps */
            if (!s->embd && !(s->embd = malloc((size_t)s->n_batch * (size_t)s->H * sizeof *s->embd))) {
                g4_fail(err, "out of memory for a step's %d soft tokens", n_soft);
                fail_plan(s, err->msg);
                return -1;
            }
            const size_t before = (size_t)g4_count_soft_tokens(m, r->tokens, r->n_fed);
            memcpy(s->embd + (size_t)n_embd * s->H, r->embd + before * s->H, (size_t)n_soft * s->H * sizeof *s->embd);
            n_embd += n_soft;
        }
        if (!embed_step && last) {
            n_want++;
            const int argmax = g4_generation_is_argmax(r->gen);
            all_greedy &= argmax;
            /* the candidates' k and the modified ids (penalties, bias, suppression) of each wanted row's sampler: a
             * verification's row j as its sampler will be after accepting drafts 0 .. j-1 */
            g4_sampler *smp = g4_generation_sampler(r->gen);
            for (int j = 0; j <= (argmax ? 0 : d) && top_k >= 0; j++) {
                int kr = g4_generation_candidates_k(r->gen);
                const int ne = j == 0 ? g4_generation_candidate_extras(r->gen, NULL)
                                      : g4_sampler_candidate_extras_after(smp, drafts, j, NULL, &kr);
                top_k = kr == 0 || kr > s->cand_max ? -1 : kr > top_k ? kr : top_k;
                if (top_k > 0 && ne) {
                    if (n_extra + ne > s->extra_cap && extras_reserve(s, n_extra + ne)) {
                        top_k = -1;
                        break;
                    }
                    if (j == 0) g4_generation_candidate_extras(r->gen, s->extra_id + n_extra);
                    else g4_sampler_candidate_extras_after(smp, drafts, j, s->extra_id + n_extra, NULL);
                    for (int e = 0; e < ne; e++) s->extra_row[n_extra + e] = s->plan_w[i] + j;
                    n_extra += ne;
                }
            }
        }
    }
    if (!all_greedy && n_rows > s->logit_rows && rows_reserve(s, n_rows)) { /* a step's verification rows */
        g4_fail(err, "out of memory for the logits of %d rows", n_rows);
        fail_plan(s, err->msg);
        return -1;
    }
    if (n > 0) {
        g4_batch b = {.n_tokens = n, .token = s->tok, .seq = s->seq, .want_logits = s->want,
                      .embd = n_embd ? s->embd : NULL, .n_embd = n_embd};
        int rc;
        const double t_model = seconds_now();
        g4_context_capture(ctx, NULL, embed_step ? s->final_rows : NULL);
        if (embed_step || n_want == 0) rc = g4_decode(ctx, &b, NULL, err);
        else if (all_greedy) rc = g4_decode_greedy(ctx, &b, s->ids, err);
        else if (top_k > 0) {
            s->cand.k = top_k, s->cand.cap = g4_candidates_cap(top_k);
            for (int row = 0, e = 0; row <= n_rows; row++) { /* each row's extras: extra_at[row] .. [row + 1] */
                while (e < n_extra && s->extra_row[e] < row) e++;
                s->extra_at[row] = e;
            }
            s->cand.n_extra = n_extra;
            s->cand.extra_row = s->extra_row, s->cand.extra_id = s->extra_id, s->cand.extra_vals = s->extra_vals;
            s->cand.extra_at = s->extra_at;
            rc = g4_decode_candidates(ctx, &b, &s->cand, err);
        } else rc = g4_decode(ctx, &b, s->logits, err);
        g4_context_capture(ctx, NULL, NULL);
        s->stats.model_seconds += seconds_now() - t_model;
        if (rc) {
            fail_plan(s, err->msg);
            s->stats.step_seconds += seconds_now() - t_step;
            return -1;
        }
        s->stats.steps++;
    }

    /* outputs */
    const float *final = g4_step_final_rows(ctx); /* the wanted rows' final-normed states, in backend memory */
    for (int i = 0, row = 0; i < s->n_plan; i++) {
        request *r = s->plan_req[i];
        const int d = s->plan_d[i], k = s->plan_n[i] - d, w = s->plan_w[i];
        row += k + d;
        r->n_fed += k;
        if (r->embed) {
            for (int j = 0; j < k; j++)
                for (int h = 0; h < s->H; h++) r->sum[h] += s->final_rows[(size_t)(row - k + j) * s->H + h];
            if (r->n_fed == r->n_tokens) finish(s, r, G4_FINISH_STOP);
            continue;
        }
        if (s->plan_h0[i] >= 0) g4_spec_set_h0(r->spec, final + (size_t)s->plan_h0[i] * s->H);
        if (r->drafting) {
            verified(s, r, d, w, all_greedy ? ROWS_IDS : top_k > 0 ? ROWS_CANDIDATES : ROWS_LOGITS, final);
            continue;
        }
        if (r->n_fed > r->n_prompt && k == 1) s->stats.decode_tokens++;
        else s->stats.prefill_tokens += k;
        if (r->n_fed == r->n_tokens) {
            const size_t at = (size_t)w * (size_t)s->cand.cap;
            int32_t id = all_greedy ? s->ids[w]
                         : top_k > 0 && s->cand.count[w] >= 0
                             ? g4_generation_sample_candidates(r->gen, s->cand.ids + at, s->cand.vals + at,
                                                               s->cand.count[w],
                                                               s->extra_vals + s->extra_at[w])
                             : g4_generation_sample(r->gen, s->logits + (size_t)w * s->vocab);
            g4_generation_take(r->gen, id);
            g4_error e;
            const int32_t read = g4_generation_finish(r->gen) ? 0 : g4_token_read(m, id, &e);
            if (read < 0) g4_generation_fail(r->gen, e.msg); /* it cannot be fed: it fails alone */
            if (g4_generation_finish(r->gen)) {
                finish(s, r, G4_FINISH_STOP); /* it has ended: the reason is its own */
            } else {
                r->tokens[r->n_tokens++] = read; /* a generated placeholder has no row: the pad id */
                if (r->spec) { /* its prompt is read: the first round's drafts */
                    g4_spec_start(r->spec, r->start, r->n_fed, id, g4_generation_left(r->gen));
                    r->drafting = 1;
                }
                g4_generation_deliver(r->gen);
            }
        }
    }
    draft_planned(s);
    pthread_mutex_lock(&s->lock);
    int left = s->n_running + s->w_count;
    if (n > 0) s->stats.step_seconds += seconds_now() - t_step;
    pthread_mutex_unlock(&s->lock);
    return left;
}
