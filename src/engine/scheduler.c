/* The continuous-batching scheduler (see scheduler.h for the policy). */
#include "engine/scheduler.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct g4_sched {
    g4_context *ctx;
    int n_seq, n_batch, vocab, H;
    pthread_mutex_t lock;        /* guards the waiting queue (submit runs on any thread) */
    g4_sched_request **waiting;  /* ring buffer: arrival order, preempted requests pushed in front */
    int w_head, w_count, w_cap;
    g4_sched_request **running;  /* [n_seq] by sequence, NULL where free */
    g4_sched_request **run_list; /* [n_seq] the running requests in admission order */
    int n_running;
    uint64_t next_order;
    int last_step_embed;
    /* one step's plan and buffers, sized once */
    g4_sched_request **plan_req; /* [n_batch] requests of the step, in batch order */
    int *plan_n;                 /* [n_batch] tokens each feeds */
    int n_plan;
    int32_t *tok, *seq;          /* [n_batch] */
    uint8_t *want;               /* [n_batch] */
    int32_t *ids;                /* [n_batch] greedy ids of the wanted rows */
    float *logits;               /* [logit_rows][vocab] */
    int logit_rows;
    float *final_rows;           /* [n_batch][H]: final hidden states of an embedding step */
    g4_sched_stats stats;
};

/* ------------------------------------------------------------------ queue */

static g4_sched_request *queue_at(const g4_sched *s, int i) { return s->waiting[(s->w_head + i) % s->w_cap]; }

static void queue_remove(g4_sched *s, int i) { /* keeps the order */
    for (int j = i; j > 0; j--) s->waiting[(s->w_head + j) % s->w_cap] = s->waiting[(s->w_head + j - 1) % s->w_cap];
    s->w_head = (s->w_head + 1) % s->w_cap;
    s->w_count--;
}

/* Room for every request that can be waiting at once; called under the lock, outside steps' hot path. */
static int queue_reserve(g4_sched *s, int need) {
    if (need <= s->w_cap) return 0;
    int cap = s->w_cap ? s->w_cap : 16;
    while (cap < need) cap *= 2;
    g4_sched_request **q = malloc((size_t)cap * sizeof *q);
    if (!q) return -1;
    for (int i = 0; i < s->w_count; i++) q[i] = queue_at(s, i);
    free(s->waiting);
    s->waiting = q;
    s->w_head = 0;
    s->w_cap = cap;
    return 0;
}

/* ------------------------------------------------------------------ requests */

void g4_sched_request_free(g4_sched_request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->stop_ids);
    free(r->embedding);
    free(r->sum);
    g4_sampler_free(r->sampler);
    free(r);
}

void g4_sched_cancel(g4_sched_request *r) { atomic_store(&r->cancel, 1); }

/* Blocks of the full-attention pool (or the only pool) that n positions take. */
static int blocks_for(const g4_sched *s, int n) {
    int B = s->ctx->kv.block;
    return (n + B - 1) / B;
}

static const g4_kv_pool *main_pool(const g4_sched *s) {
    const g4_kv_pool *p = &s->ctx->kv.pool[G4_LAYER_FULL];
    return p->used ? p : &s->ctx->kv.pool[G4_LAYER_SLIDING];
}

static int enqueue(g4_sched *s, g4_sched_request *r, g4_sched_request **out, g4_error *err) {
    pthread_mutex_lock(&s->lock);
    r->order = s->next_order++;
    int rc = queue_reserve(s, s->w_count + s->n_running + 1);
    if (rc == 0) s->waiting[(s->w_head + s->w_count++) % s->w_cap] = r;
    pthread_mutex_unlock(&s->lock);
    if (rc) {
        g4_sched_request_free(r);
        return g4_fail(err, "out of memory");
    }
    *out = r;
    return 0;
}

static g4_sched_request *request_new(g4_sched *s, const int32_t *ids, int n, int cap, g4_error *err) {
    if (n <= 0 || !ids) {
        g4_fail(err, "the prompt is empty");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab) {
            g4_fail(err, "prompt token %d at %d is outside the vocabulary (0..%d)", ids[i], i, s->vocab - 1);
            return NULL;
        }
    if (blocks_for(s, n) > main_pool(s)->n_blocks) {
        g4_fail(err, "the prompt (%d tokens) needs %d KV blocks, the pool has %d", n, blocks_for(s, n),
                main_pool(s)->n_blocks);
        return NULL;
    }
    g4_sched_request *r = calloc(1, sizeof *r);
    if (!r || !(r->tokens = malloc((size_t)cap * sizeof *r->tokens))) {
        free(r);
        g4_fail(err, "out of memory");
        return NULL;
    }
    memcpy(r->tokens, ids, (size_t)n * sizeof *ids);
    r->n_prompt = r->n_tokens = n;
    r->cap = cap;
    r->seq = -1;
    atomic_init(&r->cancel, 0);
    atomic_init(&r->finish, G4_SCHED_RUNNING);
    return r;
}

int g4_sched_submit(g4_sched *s, const int32_t *prompt, int n, const g4_sched_request_params *p,
                    g4_sched_request **out, g4_error *err) {
    *out = NULL;
    const int n_ctx = s->ctx->n_ctx;
    if (n >= n_ctx)
        return g4_fail(err, "the prompt (%d tokens) does not fit the context of %d positions", n, n_ctx);
    if (!p || p->max_new_tokens <= 0 || p->n_stop_ids < 0)
        return g4_fail(err, "a request needs max_new_tokens > 0 (and n_stop_ids >= 0)");
    int max_new = p->max_new_tokens < n_ctx - n ? p->max_new_tokens : n_ctx - n;
    g4_sched_request *r = request_new(s, prompt, n, n + max_new, err);
    if (!r) return -1;
    r->max_new = max_new;
    g4_sampler_params greedy;
    g4_sampler_params_default(&greedy);
    greedy.temperature = 0;
    if (g4_sampler_new(p->sampling ? p->sampling : &greedy, s->vocab, &r->sampler, err)) {
        g4_sched_request_free(r);
        return -1;
    }
    r->greedy = g4_sampler_is_argmax(r->sampler);
    g4_sampler_accept_many(r->sampler, prompt, n);
    if (p->n_stop_ids) {
        if (!(r->stop_ids = malloc((size_t)p->n_stop_ids * sizeof *r->stop_ids))) {
            g4_sched_request_free(r);
            return g4_fail(err, "out of memory");
        }
        memcpy(r->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *r->stop_ids);
        r->n_stop_ids = p->n_stop_ids;
    }
    r->on_token = p->on_token;
    r->on_done = p->on_done;
    r->user = p->user;
    return enqueue(s, r, out, err);
}

int g4_sched_submit_embed(g4_sched *s, const int32_t *ids, int n, g4_sched_done_fn on_done, void *user,
                          g4_sched_request **out, g4_error *err) {
    *out = NULL;
    if (n > s->ctx->n_ctx)
        return g4_fail(err, "%d tokens do not fit the context of %d positions", n, s->ctx->n_ctx);
    g4_sched_request *r = request_new(s, ids, n, n, err);
    if (!r) return -1;
    r->embed = 1;
    r->embedding = malloc((size_t)s->H * sizeof *r->embedding);
    r->sum = calloc((size_t)s->H, sizeof *r->sum);
    if (!r->embedding || !r->sum) {
        g4_sched_request_free(r);
        return g4_fail(err, "out of memory");
    }
    r->on_done = on_done;
    r->user = user;
    return enqueue(s, r, out, err);
}

/* ------------------------------------------------------------------ lifecycle */

int g4_sched_new(g4_context *ctx, g4_sched **out, g4_error *err) {
    *out = NULL;
    g4_sched *s = calloc(1, sizeof *s);
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
    s->tok = malloc(nb * sizeof *s->tok);
    s->seq = malloc(nb * sizeof *s->seq);
    s->want = malloc(nb);
    s->ids = malloc(nb * sizeof *s->ids);
    s->logits = malloc((size_t)s->logit_rows * (size_t)s->vocab * sizeof *s->logits);
    s->final_rows = malloc(nb * (size_t)s->H * sizeof *s->final_rows);
    if (!s->running || !s->run_list || !s->plan_req || !s->plan_n || !s->tok || !s->seq || !s->want || !s->ids ||
        !s->logits || !s->final_rows || queue_reserve(s, 16)) {
        g4_sched_free(s);
        return g4_fail(err, "out of memory for a scheduler of %d sequences", ctx->n_seq);
    }
    for (int q = 0; q < s->n_seq; q++) g4_seq_reset(ctx, q);
    *out = s;
    return 0;
}

static void finish(g4_sched *s, g4_sched_request *r, g4_sched_finish why);

void g4_sched_free(g4_sched *s) {
    if (!s) return;
    if (s->running)
        for (int q = 0; q < s->n_seq; q++)
            if (s->running[q]) finish(s, s->running[q], G4_SCHED_CANCELLED);
    while (s->w_count > 0) {
        g4_sched_request *r = queue_at(s, 0);
        queue_remove(s, 0);
        finish(s, r, G4_SCHED_CANCELLED);
    }
    pthread_mutex_destroy(&s->lock);
    free(s->waiting);
    free(s->running);
    free(s->run_list);
    free(s->plan_req);
    free(s->plan_n);
    free(s->tok);
    free(s->seq);
    free(s->want);
    free(s->ids);
    free(s->logits);
    free(s->final_rows);
    free(s);
}

const g4_sched_stats *g4_sched_get_stats(const g4_sched *s) { return &s->stats; }

/* ------------------------------------------------------------------ running set */

static void admit(g4_sched *s, g4_sched_request *r, int q, int reused) {
    s->running[q] = r;
    s->run_list[s->n_running++] = r;
    r->seq = q;
    r->n_fed = r->n_reused = reused;
    s->stats.reused_tokens += reused;
}

/* Takes r out of the running set; its sequence's blocks go back to the pools (hashed ones stay cached). */
static void release(g4_sched *s, g4_sched_request *r) {
    if (r->seq < 0) return;
    g4_seq_reset(s->ctx, r->seq);
    s->running[r->seq] = NULL;
    int i = 0;
    while (s->run_list[i] != r) i++;
    memmove(s->run_list + i, s->run_list + i + 1, (size_t)(s->n_running - i - 1) * sizeof *s->run_list);
    s->n_running--;
    r->seq = -1;
    r->n_fed = 0;
}

static void finish(g4_sched *s, g4_sched_request *r, g4_sched_finish why) {
    release(s, r);
    if (why == G4_SCHED_DONE)
        for (int h = 0; h < s->H; h++) r->embedding[h] = (float)(r->sum[h] / r->n_tokens);
    atomic_store(&r->finish, why);
    if (r->on_done) r->on_done(r, r->user); /* may free r */
}

/* Frees r's blocks and puts it in front of the queue, to be recomputed from its tokens so far. */
static void preempt(g4_sched *s, g4_sched_request *r) {
    release(s, r);
    if (r->embed) memset(r->sum, 0, (size_t)s->H * sizeof *r->sum);
    r->n_preempted++;
    s->stats.preemptions++;
    pthread_mutex_lock(&s->lock); /* room: queue_reserve keeps w_cap >= every unfinished request */
    s->w_head = (s->w_head + s->w_cap - 1) % s->w_cap;
    s->waiting[s->w_head] = r;
    s->w_count++;
    pthread_mutex_unlock(&s->lock);
}

/* Cancelled requests leave: running ones free their blocks now, waiting ones leave the queue. */
static void drop_cancelled(g4_sched *s) {
    for (int i = s->n_running - 1; i >= 0; i--)
        if (i < s->n_running && atomic_load(&s->run_list[i]->cancel)) finish(s, s->run_list[i], G4_SCHED_CANCELLED);
    for (;;) {
        g4_sched_request *r = NULL;
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < s->w_count && !r; i++)
            if (atomic_load(&queue_at(s, i)->cancel)) {
                r = queue_at(s, i);
                queue_remove(s, i);
            }
        pthread_mutex_unlock(&s->lock);
        if (!r) break;
        finish(s, r, G4_SCHED_CANCELLED); /* outside the lock: on_done may submit */
    }
}

/* ------------------------------------------------------------------ one step */

static void plan_add(g4_sched *s, g4_sched_request *r, int k) {
    s->plan_req[s->n_plan] = r;
    s->plan_n[s->n_plan++] = k;
}

static void plan_remove(g4_sched *s, int i) {
    memmove(s->plan_req + i, s->plan_req + i + 1, (size_t)(s->n_plan - i - 1) * sizeof *s->plan_req);
    memmove(s->plan_n + i, s->plan_n + i + 1, (size_t)(s->n_plan - i - 1) * sizeof *s->plan_n);
    s->n_plan--;
}

/* Blocks of the main pool that the running requests still need for the tokens they already have. */
static long reserved_blocks(const g4_sched *s) {
    long n = 0;
    for (int i = 0; i < s->n_running; i++) {
        const g4_sched_request *r = s->run_list[i];
        n += blocks_for(s, r->n_tokens) - blocks_for(s, r->n_fed);
    }
    return n;
}

/* Admits waiting requests of one kind in arrival order while a sequence, budget and blocks are free. A request
 * that does not fit even with nothing running ends (LENGTH: its tokens so far need more than the pool). */
static void admit_waiting(g4_sched *s, int embed_step, int *budget) {
    g4_context *ctx = s->ctx;
    long reserve = reserved_blocks(s);
    g4_sched_request *too_big = NULL;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->w_count && *budget > 0 && s->n_running < s->n_seq;) {
        g4_sched_request *r = queue_at(s, i);
        if (r->embed != embed_step || atomic_load(&r->cancel)) {
            i++;
            continue;
        }
        int q = 0;
        while (s->running[q]) q++;
        /* embeddings pool every position's state: no reuse for them */
        int reused = r->embed ? 0 : g4_seq_reuse_prefix(ctx, q, r->tokens, r->n_tokens - 1);
        long need = blocks_for(s, r->n_tokens) - reused / ctx->kv.block;
        if (main_pool(s)->n_free < reserve + need + s->n_running) { /* a block of headroom per running request */
            g4_seq_reset(ctx, q);
            if (s->n_running == 0 && need > main_pool(s)->n_free) {
                too_big = r;
                queue_remove(s, i);
            }
            break;
        }
        queue_remove(s, i);
        admit(s, r, q, reused);
        reserve += need;
        int k = r->n_tokens - r->n_fed < *budget ? r->n_tokens - r->n_fed : *budget;
        plan_add(s, r, k);
        *budget -= k;
    }
    pthread_mutex_unlock(&s->lock);
    if (too_big) finish(s, too_big, G4_SCHED_LENGTH); /* outside the lock: on_done may submit */
}

/* 1 when the plan's blocks fit the pools. */
static int plan_fits(g4_sched *s) {
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

/* Shrinks the plan until its blocks fit: the newest prefill chunk is halved, then dropped, then the newest
 * running requests are preempted; a request that cannot go on even alone ends (LENGTH: the pool is full). */
static void fit_plan(g4_sched *s) {
    while (s->n_plan > 0 && !plan_fits(s)) {
        int i = s->n_plan - 1;
        while (i >= 0 && s->plan_req[i]->n_tokens - s->plan_req[i]->n_fed == 1 && !s->plan_req[i]->embed) i--;
        if (i >= 0 && s->plan_n[i] > 1) {
            s->plan_n[i] /= 2;
            continue;
        }
        if (i >= 0 && s->n_plan > 1) {
            plan_remove(s, i);
            continue;
        }
        g4_sched_request *v = s->run_list[s->n_running - 1];
        for (int j = 0; j < s->n_plan; j++)
            if (s->plan_req[j] == v) {
                plan_remove(s, j);
                break;
            }
        if (s->n_running == 1) finish(s, v, G4_SCHED_LENGTH);
        else preempt(s, v);
    }
}

/* The next token of a request that got logits (row w of the step's outputs). */
static int32_t next_token(g4_sched *s, g4_sched_request *r, int all_greedy, int w) {
    if (all_greedy) return s->ids[w];
    return g4_sampler_sample(r->sampler, s->logits + (size_t)w * (size_t)s->vocab);
}

static void take_token(g4_sched *s, g4_sched_request *r, int32_t id) {
    if (id < 0) { /* every token banned */
        finish(s, r, G4_SCHED_STOP);
        return;
    }
    g4_sampler_accept(r->sampler, id);
    r->tokens[r->n_tokens++] = id;
    int stop = 0;
    for (int i = 0; i < r->n_stop_ids; i++) stop |= r->stop_ids[i] == id;
    if (r->on_token && r->on_token(r, id, r->user)) stop = 1;
    if (stop) finish(s, r, G4_SCHED_STOP);
    else if (r->n_tokens - r->n_prompt == r->max_new) finish(s, r, G4_SCHED_LENGTH);
}

int g4_sched_step(g4_sched *s, g4_error *err) {
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
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        g4_sched_request *r = s->run_list[i];
        if (!r->embed && !embed_step && r->n_tokens - r->n_fed == 1) plan_add(s, r, 1), budget--;
    }
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        g4_sched_request *r = s->run_list[i];
        int rem = r->n_tokens - r->n_fed;
        if (r->embed != embed_step || (!r->embed && rem <= 1)) continue;
        int k = rem < budget ? rem : budget;
        plan_add(s, r, k);
        budget -= k;
    }
    admit_waiting(s, embed_step, &budget);
    fit_plan(s);

    /* the batch */
    int n = 0, n_want = 0, all_greedy = 1;
    for (int i = 0; i < s->n_plan; i++) {
        g4_sched_request *r = s->plan_req[i];
        const int k = s->plan_n[i], last = r->n_fed + k == r->n_tokens;
        for (int j = 0; j < k; j++) {
            s->tok[n] = r->tokens[r->n_fed + j];
            s->seq[n] = r->seq;
            s->want[n] = embed_step || (last && j == k - 1);
            n++;
        }
        if (!embed_step && last) {
            n_want++;
            all_greedy &= r->greedy;
        }
    }
    if (n > 0) {
        g4_batch b = {n, s->tok, s->seq, s->want};
        int rc;
        g4_context_capture(ctx, NULL, embed_step ? s->final_rows : NULL);
        if (embed_step || n_want == 0) rc = g4_decode(ctx, &b, NULL, err);
        else if (all_greedy) rc = g4_decode_greedy(ctx, &b, s->ids, err);
        else rc = g4_decode(ctx, &b, s->logits, err);
        g4_context_capture(ctx, NULL, NULL);
        if (rc) return -1;
        s->stats.steps++;
        s->stats.tokens += n;
    }

    /* outputs */
    int row = 0, w = 0;
    for (int i = 0; i < s->n_plan; i++) {
        g4_sched_request *r = s->plan_req[i];
        const int k = s->plan_n[i];
        r->n_fed += k;
        if (r->embed) {
            for (int j = 0; j < k; j++)
                for (int h = 0; h < s->H; h++) r->sum[h] += s->final_rows[(size_t)(row + j) * s->H + h];
            if (r->n_fed == r->n_tokens) finish(s, r, G4_SCHED_DONE);
        } else {
            if (k == 1 && r->n_fed > r->n_prompt) s->stats.decode_tokens++;
            else s->stats.prefill_tokens += k;
            if (r->n_fed == r->n_tokens) take_token(s, r, next_token(s, r, all_greedy, w++));
        }
        row += k;
    }
    pthread_mutex_lock(&s->lock);
    int left = s->n_running + s->w_count;
    pthread_mutex_unlock(&s->lock);
    return left;
}
