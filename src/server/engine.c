/* The server's engine (engine.h): one worker thread owns the context and its batching scheduler (g4_scheduler):
 * it hands new jobs to the scheduler and runs its steps while it has requests. */
#include "server/engine.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srv_engine {
    g4_model *model;
    g4_drafter *drafter; /* speculative decoding of the generations that can take it (NULL: none) */
    int n_draft;
    g4_context *ctx;
    g4_scheduler *sched;
    int n_seq, n_ctx, hidden;
    const int32_t *eos;
    int n_eos;
    pthread_t thread;
    int started;
    pthread_mutex_t mu; /* guards the list of new jobs, stop and the stats */
    pthread_cond_t cv;
    srv_job *new_head, *new_tail; /* submitted, not yet handed to the scheduler */
    int n_unfinished, max_queue;  /* submitted and not finished */
    int n_running;                /* on a sequence (the scheduler's count after its last step) */
    int stop;
    srv_job_fn on_finished;
    void *user;
    int kv_total, kv_used;
    long long prompt_tokens, cached_tokens, generated_tokens;
    long long steps;                 /* the scheduler's batch steps */
    long long draft_tokens, accepted_tokens; /* drafts verified, of which kept */
    long long draft_steps;
    double draft_s;
    double step_s, model_s, busy_s;  /* in those steps; of which in the model; the worker's time with work */
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

static void finish_job(srv_engine *e, srv_job *j, g4_finish why, const char *failure);

/* A scheduled generation's event (on the worker, inside a scheduler step): appended to its job under the group's
 * lock; a streaming reader wakes for the text events (a token's text follows its TOKEN event in the same step),
 * every reader for the job's end. */
static int on_event(const g4_event *ev, void *user) {
    srv_job *j = user;
    srv_engine *e = j->engine;
    srv_group *g = j->group;
    if (ev->kind == G4_EVENT_FINISH) {
        g4_finish why = g4_generation_finish(j->gen);
        const char *failure = why == G4_FINISH_ERROR ? g4_generation_error(j->gen) : NULL;
        j->n_cached = g4_generation_n_cached(j->gen);
        if (j->embed && why == G4_FINISH_STOP) {
            const float *v = g4_generation_embedding(j->gen);
            if (!(j->embedding = malloc((size_t)e->hidden * sizeof *j->embedding))) failure = "out of memory";
            else memcpy(j->embedding, v, (size_t)e->hidden * sizeof *j->embedding);
        }
        finish_job(e, j, why == G4_FINISH_ERROR ? G4_FINISH_STOP : why, failure);
        return 0;
    }
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
            if (j->gp.logprobs && !is_eos(e, ev->token) && g4_generation_logprobs(j->gen, &chosen, &top, &n_top) == 0 &&
                grow((void **)&j->top, &j->cap_top, j->n_top + (size_t)n_top, sizeof *j->top) == 0) {
                out->has_logprob = 1;
                out->logprob = chosen.logprob;
                out->top_off = (uint32_t)j->n_top;
                out->n_top = (uint8_t)n_top;
                if (n_top) memcpy(j->top + j->n_top, top, (size_t)n_top * sizeof *top); /* j->top may be NULL */
                j->n_top += (size_t)n_top;
            }
        } else if (g->stream) {
            pthread_cond_broadcast(&g->cv);
        }
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* ---------------------------------------------------------------- worker */

/* The job is done (on the worker): the reader hears it, the generation and the job's reference go. */
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
    g4_generation_free(gen); /* inside its FINISH event: allowed on the stepping thread */
    pthread_mutex_lock(&e->mu);
    e->n_unfinished--;
    e->generated_tokens += j->n_generated;
    e->cached_tokens += j->n_cached;
    pthread_mutex_unlock(&e->mu);
    if (e->on_finished) e->on_finished(j, e->user);
    srv_group_release(g);
}

/* A new job goes to the scheduler (or ends: cancelled, refused). */
static void hand_over(srv_engine *e, srv_job *j) {
    g4_error err;
    if (atomic_load(&j->cancel)) {
        finish_job(e, j, G4_FINISH_CANCELLED, NULL);
        return;
    }
    g4_generation *gen;
    /* the handle is set before the first step can deliver an event: steps run on this thread */
    int rc = j->embed ? g4_scheduler_submit_embed(e->sched, j->prompt, j->n_prompt, on_event, j, &gen, &err)
                      : g4_scheduler_submit(e->sched, j->prompt, j->n_prompt, &j->gp, on_event, j, &gen, &err);
    if (rc) {
        finish_job(e, j, G4_FINISH_STOP, err.msg);
        return;
    }
    pthread_mutex_lock(&j->group->mu);
    j->gen = gen;
    if (atomic_load(&j->cancel)) g4_generation_cancel(gen); /* srv_group_cancel found no handle yet */
    pthread_mutex_unlock(&j->group->mu);
    pthread_mutex_lock(&e->mu);
    e->prompt_tokens += j->n_prompt;
    pthread_mutex_unlock(&e->mu);
}

static void *worker(void *arg) {
    srv_engine *e = arg;
    int busy = 0, was_busy = 0; /* busy: the scheduler has requests */
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (!e->new_head && !busy && was_busy) {
            /* idle: hand the memory of finished requests back to the system */
            pthread_mutex_unlock(&e->mu);
            malloc_trim(0);
            was_busy = 0;
            continue;
        }
        while (!e->stop && !e->new_head && !busy) pthread_cond_wait(&e->cv, &e->mu);
        const int stop = e->stop;
        const double t_busy = now_s();
        srv_job *j = e->new_head;
        e->new_head = e->new_tail = NULL;
        pthread_mutex_unlock(&e->mu);
        while (j) {
            srv_job *next = j->next_waiting;
            if (stop) atomic_store(&j->cancel, 1);
            hand_over(e, j);
            j = next;
        }
        if (stop) break; /* g4_scheduler_free ends the rest as cancelled */
        was_busy = 1;
        g4_error err;
        int left = g4_scheduler_step(e->sched, &err);
        if (left < 0) { /* the step's requests ended with the error; the others go on */
            fprintf(stderr, "gemma4c serve: a batch step failed: %s\n", err.msg);
            left = 1;
        }
        g4_scheduler_stats st;
        g4_scheduler_get_stats(e->sched, &st);
        busy = left > 0;
        pthread_mutex_lock(&e->mu);
        e->n_running = st.running;
        e->kv_used = e->kv_total - g4_kv_free_blocks(e->ctx);
        e->steps = st.steps, e->step_s = st.step_seconds, e->model_s = st.model_seconds;
        e->draft_tokens = st.draft_tokens, e->accepted_tokens = st.accepted_tokens;
        e->draft_steps = st.draft_steps, e->draft_s = st.draft_seconds;
        e->busy_s += now_s() - t_busy;
        pthread_mutex_unlock(&e->mu);
    }
    g4_scheduler_free(e->sched);
    e->sched = NULL;
    return NULL;
}

/* ------------------------------------------------------------------ engine */

/* The engine's context: on a GPU, steps of up to 2048 tokens (prompts read in fewer, larger products; H200, E2B,
 * 100 requests of 128 tokens at once: output tok/s 7015-7875 -> 8556-8897 against 512); on the CPU the library's
 * default, or an image's soft tokens where they are more (an image is read in one step). A scheduler rolls back
 * only a verification's rejected drafts: no sliding-window history is kept but the rows a drafter reads
 * (g4_drafter_kv_history). */
static g4_context_params context_params(const g4_model *model, const g4_drafter *drafter, int n_seq, int n_ctx,
                                        g4_kv_type kv_type) {
    const int gpu = strcmp(g4_model_device(model), "cpu") != 0;
    const int image = g4_image_max_tokens(model, 0);
    g4_context_params cp = {.n_seq_max = n_seq, .n_ctx = n_ctx, .n_batch = gpu ? 2048 : image > 512 ? image : 0,
                            .kv_history = drafter ? g4_drafter_kv_history(drafter) : -1, .kv_type = kv_type};
    if (gpu && image > 2048) cp.n_batch = image;
    return cp;
}

int srv_engine_auto_parallel(const g4_model *model, const g4_drafter *drafter, int n_ctx, g4_kv_type kv_type, char *note,
                             size_t note_size) {
    snprintf(note, note_size, "the CPU's default");
    if (!strcmp(g4_model_device(model), "cpu")) return SRV_CPU_PARALLEL;
    g4_error err;
    size_t free_b = 0, total = 0, kv = 0;
    const g4_context_params cp = context_params(model, drafter, 1, n_ctx, kv_type);
    const int n = g4_context_fit_sequences(model, &cp, SRV_GPU_PARALLEL_MAX, &kv, &err);
    if (n < 0 || g4_model_memory(model, &free_b, &total, &err)) {
        snprintf(note, note_size, "%s", err.msg);
        return SRV_CPU_PARALLEL;
    }
    snprintf(note, note_size, "KV cache %.2f GB; %.2f GB of %.2f GB were free", (double)kv / 1e9, (double)free_b / 1e9,
             (double)total / 1e9);
    return n;
}

int srv_engine_new(g4_model *model, g4_drafter *drafter, int n_draft, int n_seq, int n_ctx, g4_kv_type kv_type,
                   int max_queue, srv_job_fn on_finished, void *user, srv_engine **out, g4_error *err) {
    *out = NULL;
    srv_engine *e = calloc(1, sizeof *e);
    if (!e) return g4_fail(err, "out of memory");
    g4_context_params cp = context_params(model, drafter, n_seq, n_ctx, kv_type);
    if (g4_context_new(model, &cp, &e->ctx, err)) {
        free(e);
        return -1;
    }
    if (g4_scheduler_new(e->ctx, &e->sched, err)) {
        g4_context_free(e->ctx);
        free(e);
        return -1;
    }
    e->model = model;
    e->drafter = drafter;
    e->n_draft = n_draft;
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
    g4_scheduler_free(e->sched); /* (the worker freed it, unless it never started) */
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    g4_context_free(e->ctx);
    free(e);
}

int srv_engine_n_ctx(const srv_engine *e) { return e->n_ctx; }

int srv_engine_submit(srv_engine *e, srv_group *g, g4_error *err) {
    pthread_mutex_lock(&e->mu);
    if (e->stop || e->n_unfinished - e->n_running + g->n_jobs > e->max_queue) {
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
        j->engine = e;
        j->t_submit = t;
        j->gp.sampling = &j->sp;
        if (e->drafter && !j->embed && !j->gp.logprobs && !j->gp.json_object && !j->gp.grammar) {
            j->gp.drafter = e->drafter; /* (log-probabilities and constrained output decode one token a step) */
            j->gp.n_draft = e->n_draft;
        }
        j->next_waiting = NULL;
        if (e->new_tail) e->new_tail->next_waiting = j;
        else e->new_head = j;
        e->new_tail = j;
        e->n_unfinished++;
    }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void srv_engine_stats_get(srv_engine *e, srv_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = (srv_engine_stats){e->n_unfinished - e->n_running, e->n_running, e->kv_used, e->kv_total,
                              e->prompt_tokens, e->cached_tokens, e->generated_tokens,
                              e->steps, e->step_s, e->model_s, e->busy_s, e->draft_tokens, e->accepted_tokens,
                              e->draft_steps, e->draft_s};
    pthread_mutex_unlock(&e->mu);
}
