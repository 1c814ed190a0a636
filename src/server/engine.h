/* The server's engine: runs the model for every request (jobs) on one thread that owns the context.
 *
 * A job is one choice of a request (a generation) or one input of an embeddings request. The HTTP side
 * submits a group of jobs (one request) and reads each job's events as they come: the worker appends them
 * under the group's lock and signals its condition variable. A group is freed when the HTTP side and every
 * job of it are done with it (reference counts), so a client that leaves never frees memory the worker
 * still writes, and the worker never waits for a client.
 *
 * The worker hands new jobs to a batching scheduler (g4_scheduler: continuous batching under the context's token
 * budget, prefix cache, preemption) and runs its steps while it has requests: --parallel N generations share
 * each batch step. A new request takes the longest prefix of its prompt that the prefix cache holds, in whole KV
 * blocks (the next turn of a chat reuses the previous turn's cache). Cancelling a job (client gone) stops it
 * before the next step, also in the middle of its prompt, and its blocks go back at once. A failed step ends
 * its requests with the error (500); the others go on. */
#ifndef G4_SERVER_ENGINE_H
#define G4_SERVER_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gemma4c.h"

#define SRV_MAX_TOP 20

/* One output event of a job, its text in the job's text buffer. */
typedef struct srv_event {
    g4_event_kind kind;
    int32_t token;        /* TOKEN: the id */
    uint32_t off, len;    /* text */
    int has_logprob;      /* TOKEN with logprobs: logprob, top[top_off .. top_off + n_top) */
    float logprob;
    uint32_t top_off;
    uint8_t n_top;
} srv_event;

typedef struct srv_group srv_group;

typedef struct srv_job {
    srv_group *group;
    int index;                   /* in the group */
    /* the input, set before submit (owned by the job) */
    int embed;
    int32_t *prompt;
    int n_prompt;
    g4_generation_params gp;
    g4_sampler_params sp;        /* gp.sampling points here */
    /* the output, under the group's lock */
    srv_event *ev;
    int n_ev, cap_ev;
    char *text;
    size_t text_len, text_cap;
    g4_token_logprob *top;
    size_t n_top, cap_top;
    int done, failed;            /* failed: errmsg holds why */
    char errmsg[512];
    g4_finish finish;
    int n_generated, n_cached;
    float *embedding;            /* embed: hidden_size floats once done */
    double t_submit, t_first, t_done; /* seconds (monotonic): submitted, first token, finished */
    /* the worker's */
    struct srv_engine *engine;
    g4_generation *gen;          /* while in the scheduler (read under the group's lock to cancel) */
    atomic_int cancel;
    struct srv_job *next_waiting;
} srv_job;

struct srv_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;      /* the HTTP side's one and each submitted, unfinished job's */
    int n_jobs, n_done;
    int stream;                /* the reader takes each event as it comes; otherwise only a job's end wakes it */
    srv_job *jobs;
    void *data;                /* what the jobs' parameters point into (the request); freed with the group */
    void (*free_data)(void *data);
};

/* A group of n jobs, zeroed (the caller fills their input). */
srv_group *srv_group_new(int n_jobs);
/* Drops the caller's reference. */
void srv_group_release(srv_group *g);
/* With g->mu held: waits until a job of g has news or `seconds` passed. */
void srv_group_wait(srv_group *g, double seconds);
/* Asks every job of the group to stop (they finish as cancelled). */
void srv_group_cancel(srv_group *g);

typedef struct srv_engine srv_engine;

typedef struct srv_engine_stats {
    int queued, running;          /* jobs waiting / on a sequence (after the last step) */
    int kv_blocks_used, kv_blocks_total;
    long long prompt_tokens, cached_tokens, generated_tokens;
    long long steps;      /* batch steps run */
    double step_seconds;  /* wall time in them */
    double model_seconds; /* of which in the model (forward pass and on-device sampling) */
    double busy_seconds;  /* the worker's time with requests: steps, and handing new requests over */
    long long draft_tokens, accepted_tokens; /* speculative decoding: drafts verified, of which kept */
    long long draft_steps;                   /* drafter steps (shared by the requests drafting together) */
    double draft_seconds;                    /* of step_seconds, in the drafter */
} srv_engine_stats;

/* on_finished (may be NULL) is called on the worker for each job that ends, outside any lock. */
typedef void (*srv_job_fn)(const srv_job *job, void *user);

/* --parallel's default: SRV_CPU_PARALLEL on the CPU (its steps are bound by compute); on a GPU as many
 * sequences as the free memory holds the KV cache of, n_ctx positions each, at most SRV_GPU_PARALLEL_MAX
 * (g4_context_fit_sequences). note: one line saying how it was sized. */
enum { SRV_CPU_PARALLEL = 4, SRV_GPU_PARALLEL_MAX = 128 };
int srv_engine_auto_parallel(const g4_model *model, const g4_drafter *drafter, int n_ctx, g4_kv_type kv_type, char *note,
                             size_t note_size);
/* drafter (NULL: none; it outlives the engine): speculative decoding, n_draft drafts per round (0: its default), for
 * every generation but those with log-probabilities or constrained output. */
int srv_engine_new(g4_model *model, g4_drafter *drafter, int n_draft, int n_seq, int n_ctx, g4_kv_type kv_type,
                   int max_queue, srv_job_fn on_finished, void *user, srv_engine **out, g4_error *err);
/* Cancels whatever is left, stops the worker, frees the context. */
void srv_engine_free(srv_engine *e);
int srv_engine_n_ctx(const srv_engine *e);
/* Queues every job of g (each takes a reference to g). Fails (nothing queued) when the queue is full. */
int srv_engine_submit(srv_engine *e, srv_group *g, g4_error *err);
void srv_engine_stats_get(srv_engine *e, srv_engine_stats *out);

#endif
