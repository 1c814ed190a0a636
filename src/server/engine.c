/* The server's engine (engine.h): one worker thread owns the context and takes turns over the running
 * generations, one model step each (g4_generation_step); embeddings run whole (g4_embed). */
#include "server/engine.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_engine {
    g4_model *model;
    g4_context *ctx;
    int n_seq, n_ctx, hidden;
    const int32_t *eos;
    int n_eos;
    pthread_t thread;
    int started;
    pthread_mutex_t mu; /* guards the waiting list, running[], stop and the stats */
    pthread_cond_t cv;
    srv_job *wait_head, *wait_tail;
    int n_waiting, max_queue;
    srv_job **running; /* [n_seq], by sequence */
    int n_running;
    int stop;
    srv_job_fn on_finished;
    void *user;
    int kv_total, kv_used;
    long long prompt_tokens, cached_tokens, generated_tokens;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ groups */

srv_group *srv_group_new(int n_jobs) {
    srv_group *g = calloc(1, sizeof *g);
    if (!g || !(g->jobs = calloc((size_t)n_jobs, sizeof *g->jobs))) {
        free(g);
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* srv_group_wait's deadlines */
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    g->refs = 1;
    g->n_jobs = n_jobs;
    for (int i = 0; i < n_jobs; i++) {
        g->jobs[i].group = g;
        g->jobs[i].index = i;
        g->jobs[i].seq = -1;
        atomic_init(&g->jobs[i].cancel, 0);
    }
    return g;
}

static void group_free(srv_group *g) {
    for (int i = 0; i < g->n_jobs; i++) {
        srv_job *j = &g->jobs[i];
        free(j->prompt);
        free(j->ev);
        free(j->text);
        free(j->top);
        free(j->embedding);
    }
    if (g->free_data) g->free_data(g->data);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->jobs);
    free(g);
}

void srv_group_release(srv_group *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left == 0) group_free(g);
}

void srv_group_wait(srv_group *g, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = ts.tv_nsec + (long long)(seconds * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
}

void srv_group_cancel(srv_group *g) {
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_jobs; i++) {
        atomic_store(&g->jobs[i].cancel, 1);
        if (g->jobs[i].gen) g4_generation_cancel(g->jobs[i].gen); /* stops a prompt between its chunks too */
    }
    pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------- job output */

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int is_eos(const srv_engine *e, int32_t id) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == id) return 1;
    return 0;
}

typedef struct {
    srv_engine *e;
    srv_job *job;
} event_ctx;

/* Appends a generation event to its job (under the group's lock; the step's end signals the reader). */
static int on_event(const g4_event *ev, void *user) {
    event_ctx *c = user;
    srv_job *j = c->job;
    srv_group *g = j->group;
    int rc = 0;
    pthread_mutex_lock(&g->mu);
    size_t cap_ev = (size_t)j->cap_ev;
    if (grow((void **)&j->ev, &cap_ev, (size_t)j->n_ev + 1, sizeof *j->ev) ||
        grow((void **)&j->text, &j->text_cap, j->text_len + ev->len + 1, 1)) {
        rc = 1; /* out of memory: the generation is cancelled */
    } else {
        j->cap_ev = (int)cap_ev;
        srv_event *out = &j->ev[j->n_ev++];
        memset(out, 0, sizeof *out);
        out->kind = ev->kind;
        out->token = ev->token;
        out->off = (uint32_t)j->text_len;
        out->len = (uint32_t)ev->len;
        memcpy(j->text + j->text_len, ev->text, ev->len);
        j->text_len += ev->len;
        j->text[j->text_len] = 0;
        g4_token_logprob chosen;
        const g4_token_logprob *top;
        int n_top;
        if (ev->kind == G4_EVENT_TOKEN) {
            if (!j->n_generated++) j->t_first = now_s();
            /* the token that ends the turn is not part of the answer: no log-probability is shown for it */
            if (j->gp.logprobs && !is_eos(c->e, ev->token) && g4_generation_logprobs(j->gen, &chosen, &top, &n_top) == 0 &&
                grow((void **)&j->top, &j->cap_top, j->n_top + (size_t)n_top, sizeof *j->top) == 0) {
                out->has_logprob = 1;
                out->logprob = chosen.logprob;
                out->top_off = (uint32_t)j->n_top;
                out->n_top = (uint8_t)n_top;
                memcpy(j->top + j->n_top, top, (size_t)n_top * sizeof *top);
                j->n_top += (size_t)n_top;
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* ---------------------------------------------------------------- worker */

static void finish_job(srv_engine *e, srv_job *j, g4_finish why, const char *failure) {
    srv_group *g = j->group;
    g4_generation *gen = j->gen;
    pthread_mutex_lock(&g->mu);
    j->gen = NULL;
    j->done = 1;
    j->finish = why;
    j->t_done = now_s();
    if (failure) {
        j->failed = 1;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", failure);
    }
    g->n_done++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    g4_generation_free(gen);
    /* a cancelled request's KV blocks go back at once (a finished one's stay, for the next turn's prefix) */
    if (why == G4_FINISH_CANCELLED && j->seq >= 0) g4_seq_reset(e->ctx, j->seq);
    pthread_mutex_lock(&e->mu);
    if (j->seq >= 0) {
        e->running[j->seq] = NULL;
        e->n_running--;
    }
    e->generated_tokens += j->n_generated;
    pthread_mutex_unlock(&e->mu);
    if (e->on_finished) e->on_finished(j, e->user);
    srv_group_release(g);
}

/* The free sequence whose cached tokens share the longest prefix with the prompt. */
static int pick_seq(srv_engine *e, const srv_job *j) {
    int best = -1, best_len = -1;
    for (int q = 0; q < e->n_seq; q++) {
        if (e->running[q]) continue;
        int n, k = 0;
        const int32_t *held = g4_seq_tokens(e->ctx, q, &n);
        while (k < n && k < j->n_prompt && held[k] == j->prompt[k]) k++;
        if (k > best_len) best = q, best_len = k;
    }
    return best;
}

static void start_job(srv_engine *e, srv_job *j) {
    g4_error err;
    if (atomic_load(&j->cancel)) {
        finish_job(e, j, G4_FINISH_CANCELLED, NULL);
        return;
    }
    pthread_mutex_lock(&e->mu);
    int q = pick_seq(e, j);
    e->running[q] = j;
    e->n_running++;
    e->prompt_tokens += j->n_prompt;
    pthread_mutex_unlock(&e->mu);
    j->seq = q;
    if (j->embed) {
        j->embedding = malloc((size_t)e->hidden * sizeof *j->embedding);
        if (!j->embedding) finish_job(e, j, G4_FINISH_STOP, "out of memory");
        else if (g4_embed(e->ctx, q, j->prompt, j->n_prompt, j->embedding, &err)) finish_job(e, j, G4_FINISH_STOP, err.msg);
        else finish_job(e, j, G4_FINISH_STOP, NULL);
        return;
    }
    g4_generation *gen;
    if (g4_generation_start(e->ctx, q, j->prompt, j->n_prompt, &j->gp, &gen, &err)) {
        finish_job(e, j, G4_FINISH_STOP, err.msg);
        return;
    }
    pthread_mutex_lock(&j->group->mu);
    j->gen = gen;
    j->n_cached = g4_generation_n_cached(gen);
    if (atomic_load(&j->cancel)) g4_generation_cancel(gen);
    pthread_mutex_unlock(&j->group->mu);
    pthread_mutex_lock(&e->mu);
    e->cached_tokens += j->n_cached;
    pthread_mutex_unlock(&e->mu);
}

static void step_job(srv_engine *e, srv_job *j) {
    g4_error err;
    event_ctx c = {e, j};
    int rc = g4_generation_step(j->gen, on_event, &c, &err);
    pthread_mutex_lock(&j->group->mu);
    pthread_cond_broadcast(&j->group->cv);
    pthread_mutex_unlock(&j->group->mu);
    if (rc < 0) finish_job(e, j, G4_FINISH_STOP, err.msg);
    else if (rc == 0) finish_job(e, j, g4_generation_finish(j->gen), NULL);
}

static void *worker(void *arg) {
    srv_engine *e = arg;
    int was_busy = 0;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (!e->n_waiting && !e->n_running && was_busy) {
            /* idle: hand the memory of finished requests back to the system */
            pthread_mutex_unlock(&e->mu);
            malloc_trim(0);
            was_busy = 0;
            continue;
        }
        while (!e->stop && !e->n_waiting && !e->n_running) pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop && !e->n_waiting && !e->n_running) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        was_busy = 1;
        while (e->n_waiting && e->n_running < e->n_seq) {
            srv_job *j = e->wait_head;
            e->wait_head = j->next_waiting;
            if (!e->wait_head) e->wait_tail = NULL;
            e->n_waiting--;
            if (e->stop) atomic_store(&j->cancel, 1);
            pthread_mutex_unlock(&e->mu);
            start_job(e, j);
            pthread_mutex_lock(&e->mu);
        }
        pthread_mutex_unlock(&e->mu);
        for (int q = 0; q < e->n_seq; q++) {
            srv_job *j = e->running[q]; /* only this thread changes running[] */
            if (!j) continue;
            if (e->stop || atomic_load(&j->cancel)) g4_generation_cancel(j->gen);
            step_job(e, j);
        }
        pthread_mutex_lock(&e->mu);
        e->kv_used = e->kv_total - g4_kv_free_blocks(e->ctx);
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* ------------------------------------------------------------------ engine */

int srv_engine_new(g4_model *model, int n_seq, int n_ctx, g4_kv_type kv_type, int max_queue, srv_job_fn on_finished, void *user,
                   srv_engine **out, g4_error *err) {
    *out = NULL;
    srv_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->running = calloc((size_t)n_seq, sizeof *e->running))) {
        free(e);
        return g4_fail(err, "out of memory");
    }
    /* On a GPU, steps of up to 2048 tokens (prompts read in fewer, larger products; H200, E2B, 100 requests of 128
     * tokens at once: output tok/s 7015-7875 -> 8556-8897 against 512), keeping the 512 positions of sliding-window
     * history the default would give (more would cost KV memory for every sequence). */
    const int gpu = strcmp(g4_model_device(model), "cpu") != 0;
    g4_context_params cp = {.n_seq_max = n_seq, .n_ctx = n_ctx, .n_batch = gpu ? 2048 : 0, .kv_history = gpu ? 512 : 0,
                            .kv_type = kv_type};
    if (g4_context_new(model, &cp, &e->ctx, err)) {
        free(e->running);
        free(e);
        return -1;
    }
    e->model = model;
    e->n_seq = n_seq;
    e->n_ctx = g4_context_n_ctx(e->ctx);
    e->hidden = g4_model_hidden_size(model);
    e->n_eos = g4_model_eos_ids(model, &e->eos);
    e->max_queue = max_queue;
    e->on_finished = on_finished;
    e->user = user;
    e->kv_total = g4_kv_free_blocks(e->ctx);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->thread, NULL, worker, e)) {
        srv_engine_free(e);
        return g4_fail(err, "cannot start the engine's thread");
    }
    e->started = 1;
    *out = e;
    return 0;
}

void srv_engine_free(srv_engine *e) {
    if (!e) return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    g4_context_free(e->ctx);
    free(e->running);
    free(e);
}

int srv_engine_n_ctx(const srv_engine *e) { return e->n_ctx; }

int srv_engine_submit(srv_engine *e, srv_group *g, g4_error *err) {
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->n_waiting + g->n_jobs > e->max_queue) {
        int stopping = e->stop;
        pthread_mutex_unlock(&e->mu);
        return g4_fail(err, stopping ? "the server is shutting down" : "the queue is full (%d requests waiting)",
                       e->max_queue);
    }
    pthread_mutex_lock(&g->mu);
    g->refs += g->n_jobs;
    pthread_mutex_unlock(&g->mu);
    const double t = now_s();
    for (int i = 0; i < g->n_jobs; i++) {
        srv_job *j = &g->jobs[i];
        j->t_submit = t;
        j->gp.sampling = &j->sp;
        j->next_waiting = NULL;
        if (e->wait_tail) e->wait_tail->next_waiting = j;
        else e->wait_head = j;
        e->wait_tail = j;
        e->n_waiting++;
    }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void srv_engine_stats_get(srv_engine *e, srv_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = (srv_engine_stats){e->n_waiting, e->n_running, e->kv_used, e->kv_total,
                              e->prompt_tokens, e->cached_tokens, e->generated_tokens};
    pthread_mutex_unlock(&e->mu);
}
