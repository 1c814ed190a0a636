/* Continuous batching: a scheduler runs many requests on the sequences of one context (docs/architecture.md,
 * "A batch step is the unit of work"; vLLM's scheduler is the model).
 *
 * Every step (g4_sched_step) builds one batch under a token budget of n_batch:
 *   1. requests cancelled since the last step leave and their blocks go back to the pools at once;
 *   2. every running request that has produced its prompt's logits gets one decode token, oldest first;
 *   3. running requests still in their prompt get chunks of what budget is left, oldest first;
 *   4. waiting requests are admitted in arrival order while a sequence is free, the budget is not spent and the
 *      full-attention pool has the blocks for their whole remaining prompt; an admitted request first takes
 *      the longest prefix of its tokens the prefix cache holds (g4_kv_cache_reuse) and prefills from there;
 *   5. if the step's blocks do not fit the pools, the newest prefill chunks are dropped from it, then the
 *      newest running requests are preempted: their blocks are freed and they wait at the front of the queue
 *      to be recomputed (prompt and the tokens generated so far; the prefix cache often still has them);
 *   6. the batch runs (g4_decode, or g4_decode_greedy when every row that needs a token is plain argmax), each
 *      request that got logits samples its next token with its own sampler and seed, and requests that reached
 *      a stop id, their token limit or the end of the context finish and free their sequence.
 * A request's last token is never fed to the model. Its sequence's blocks stay in the prefix cache after it
 * leaves (a later request with the same prefix, e.g. the next turn of a chat, starts from them).
 *
 * Embedding requests (prompt only, no sampling) prefill with every row's final hidden state kept (mean-pooled);
 * their steps carry no logits and they do not reuse cached prefixes (the pooled states of reused positions would
 * be missing). Generation steps and embedding steps alternate when both are waiting.
 *
 * Equal outputs: a request's tokens do not depend on what it was batched with, preempted or resumed from the
 * prefix cache, as long as the backend's ops are batch invariant (the CPU's are: tests/test_backend_ops.c).
 *
 * Threads: g4_sched_submit and g4_sched_cancel may be called from any thread; g4_sched_step runs on one
 * thread at a time, and the callbacks run inside it. */
#ifndef G4_ENGINE_SCHEDULER_H
#define G4_ENGINE_SCHEDULER_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/context.h"
#include "engine/sampler.h"

typedef struct g4_sched g4_sched;
typedef struct g4_sched_request g4_sched_request;

typedef enum {
    G4_SCHED_RUNNING = 0,   /* waiting or running */
    G4_SCHED_STOP = 1,      /* a stop id, or the token callback asked to stop */
    G4_SCHED_LENGTH = 2,    /* max_new_tokens, or the context (or a KV pool) is full */
    G4_SCHED_CANCELLED = 3, /* g4_sched_cancel */
    G4_SCHED_DONE = 4,      /* an embedding was computed */
} g4_sched_finish;

/* Sees each generated token (every one, a final stop id included); return non-zero to stop after it. */
typedef int (*g4_sched_token_fn)(g4_sched_request *r, int32_t id, void *user);
/* Called once when the request has finished (any reason); the request may be freed from here on. */
typedef void (*g4_sched_done_fn)(g4_sched_request *r, void *user);

typedef struct g4_sched_request_params {
    int max_new_tokens;                 /* > 0; capped by the context */
    const g4_sampler_params *sampling;  /* NULL: greedy */
    const int32_t *stop_ids;            /* a generated id in this set ends the request (copied) */
    int n_stop_ids;
    g4_sched_token_fn on_token;         /* may be NULL */
    g4_sched_done_fn on_done;           /* may be NULL */
    void *user;
} g4_sched_request_params;

struct g4_sched_request {
    int32_t *tokens;   /* prompt, then generated ids [cap] */
    int n_prompt, n_tokens, cap;
    int n_fed;         /* tokens its sequence holds (0 while waiting) */
    int n_reused;      /* tokens taken from the prefix cache at the last admission */
    int max_new;
    int seq;           /* -1 while waiting */
    int embed;         /* an embedding request */
    float *embedding;  /* embed: hidden_size floats, the mean of the final hidden states once done */
    double *sum;       /* embed: the running sum */
    g4_sampler *sampler;
    int greedy;        /* plain argmax: no sampler work at all */
    int32_t *stop_ids;
    int n_stop_ids;
    g4_sched_token_fn on_token;
    g4_sched_done_fn on_done;
    void *user;
    uint64_t order;    /* arrival number (admission order = arrival order, preempted ones first) */
    int n_preempted;   /* times it was preempted */
    atomic_int cancel;
    atomic_int finish; /* g4_sched_finish */
    g4_sched_request *next; /* in the incoming list */
};

typedef struct g4_sched_stats {
    long steps, tokens, decode_tokens, prefill_tokens, reused_tokens, preemptions;
} g4_sched_stats;

/* The scheduler uses every sequence of ctx (which it does not own). For many requests sharing memory, create
 * the context with kv_history -1 and n_kv_blocks sized to the memory. */
int g4_sched_new(g4_context *ctx, g4_sched **out, g4_error *err);
/* Frees the scheduler; requests still in it finish as cancelled (their on_done runs). */
void g4_sched_free(g4_sched *s);

/* Queues a generation request for prompt[0..n-1] (copied). *out is the request, owned by the caller from its
 * on_done on (free it with g4_sched_request_free). Fails on an empty prompt, ids outside the vocabulary, a
 * prompt that leaves no room in the context or needs more blocks than the full-attention pool has. */
int g4_sched_submit(g4_sched *s, const int32_t *prompt, int n, const g4_sched_request_params *p,
                    g4_sched_request **out, g4_error *err);
/* Queues an embedding request: the mean of the final hidden states of ids[0..n-1]. */
int g4_sched_submit_embed(g4_sched *s, const int32_t *ids, int n, g4_sched_done_fn on_done, void *user,
                          g4_sched_request **out, g4_error *err);
/* Ends a request at the next step (its blocks are freed then); safe from any thread. */
void g4_sched_cancel(g4_sched_request *r);
void g4_sched_request_free(g4_sched_request *r);

/* Runs one step. Returns the number of requests still waiting or running after it (0: idle), or -1 when the
 * step failed (a backend error: the requests of the step are unchanged and a later step may retry). */
int g4_sched_step(g4_sched *s, g4_error *err);

const g4_sched_stats *g4_sched_get_stats(const g4_sched *s);

#endif
