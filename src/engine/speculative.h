/* Speculative decoding with a Gemma 4 assistant (docs/gemma4-assistant.md): the drafter beside its main model,
 * the per-sequence state of the draft/verify loop, and the drafter forward (src/model/drafter.c).
 *
 * A round (section 4): the drafter runs k steps at one position p = c - 1 from the main model's last token and
 * final-normed hidden state, reading the K/V rows of the main model's last non-shared full and sliding layers
 * straight from the paged cache; the main model verifies [last, drafts] in one g4_decode; the longest matching
 * prefix and one token of the main model are kept; the rejected rows are rolled back (g4_seq_truncate).
 * Which rows the drafter reads depends on the main call before it (4.3), so, as the spec's engine recipe says,
 * the next round is drafted right after a verification and before its roll-back; the drafts wait in the state
 * for the next g4_spec_round. */
#ifndef G4_ENGINE_SPECULATIVE_H
#define G4_ENGINE_SPECULATIVE_H

#include "engine/context.h"
#include "engine/sampler.h"

typedef enum { G4_SCHEDULE_CONSTANT = 0, G4_SCHEDULE_HEURISTIC, G4_SCHEDULE_HEURISTIC_TRANSIENT } g4_draft_schedule;


/* Rows of the main cache a draft round attends to, per layer type: positions lo .. hi-1 (section 4.3). */
typedef struct g4_draft_rows {
    int lo[G4_LAYER_TYPES], hi[G4_LAYER_TYPES];
} g4_draft_rows;

/* For tests: host copies of what the draft steps saw and made, one slot per drafting (a round's drafts are made by
 * one drafting, at the end of the round before it), the first max_draftings of them. */
typedef struct g4_spec_capture {
    int max_draftings, max_steps;
    int n;                  /* draftings recorded */
    float *inputs;          /* [max_draftings][max_steps][2*Hb] the drafter's input x (embedding, hidden) */
    float *hidden;          /* [max_draftings][max_steps][Hb] post_projection outputs */
    float *logits;          /* [max_draftings][max_steps][V] */
    int *position, *steps;  /* [max_draftings] */
    g4_draft_rows *rows;    /* [max_draftings] */
} g4_spec_capture;

/* Drafted and accepted drafts per round. */
typedef struct g4_round_log {
    int *drafted, *accepted;
    int n, cap;
} g4_round_log;
int g4_round_log_add(g4_round_log *l, int drafted, int accepted, g4_error *err);
void g4_round_log_free(g4_round_log *l);

/* Backend buffers of the drafter forward (g4_drafter_forward) for up to `rows` requests drafted together and
 * `steps` steps a round: a state's own (rows 1, every step's logits kept) or its drafter's, shared by the requests a
 * scheduler drafts in one forward. ints holds per row: the sequence, the position, per layer type the attention's
 * query position, kv_end and kv_start, then one token per step and one more (slot S of row i: ints[S * rows + i]). */
enum { G4_DRAFT_SEQ = 0, G4_DRAFT_POS = 1, G4_DRAFT_ATTN_POS = 2, G4_DRAFT_KV_END = G4_DRAFT_ATTN_POS + G4_LAYER_TYPES,
       G4_DRAFT_KV_START = G4_DRAFT_KV_END + G4_LAYER_TYPES, G4_DRAFT_TOKENS = G4_DRAFT_KV_START + G4_LAYER_TYPES };
typedef struct g4_draft_ws {
    int rows, steps, keep_logits;
    float *xin;              /* [rows, 2*Hb]: the main model's scaled embedding of the step's token, then the hidden
                                vector */
    float *pair;             /* [2, rows, Hb] (rows > 1): the embeddings, then the hidden vectors, concatenated into
                                xin by a transpose (rows 1: xin itself) */
    float *z, *xn, *o, *zn;  /* [rows, Ha] */
    float *q, *attn;         /* [rows, NHa * largest head_dim] */
    float *gate, *up;        /* [rows, Ia] */
    float *cl;               /* [rows, num_centroids] */
    float *logits;           /* keep_logits: [steps, V] every step's; else [rows, V] the last step's */
    float *rope[G4_LAYER_TYPES]; /* [rows, head_dim] */
    int32_t *ints;           /* [(G4_DRAFT_TOKENS + steps + 1) * rows] */
    int32_t *ints_host;      /* the same, on the host */
    const void *reads[G4_LAYER_TYPES][3]; /* what the backend's recordings of these draftings read of the context:
                                             per layer type its caches' K, V and block table (g4_drafter_forward) */
    int read_shape[G4_LAYER_TYPES + 2]; /* and their shapes: per layer type blocks a sequence, then rows a block and
                                           the cache type */
} g4_draft_ws;

struct g4_drafter {
    g4_model *m;                  /* the assistant checkpoint, on main's backend */
    const g4_model *main;
    int src[G4_LAYER_TYPES];      /* main layer whose K/V the drafter's layers of each type read (-1: no such layer) */
    int n_draft;                  /* num_assistant_tokens (the heuristic schedule writes it back) */
    g4_draft_schedule schedule;
    g4_draft_ws batch;            /* the buffers of a scheduler's draftings (g4_spec_draft_planned), under the main
                                     model's backend lock */
};

/* One request's drafting: k steps at position p after token `tok`, from the hidden state h0 (backend memory: the
 * state's h0, or a scheduler's step's final row, valid until its next step) and the cache rows `rows`. */
typedef struct g4_draft_job {
    g4_spec *s;
    const float *h0;
    int32_t tok;
    int p, k;
    g4_draft_rows rows;
} g4_draft_job;

struct g4_spec {
    g4_context *ctx;
    int seq;
    g4_drafter *d;
    int cap;                 /* most drafts a round can hold (buffers) */
    int n_draft;             /* drafts per round now */
    int32_t *stop_ids;
    int n_stop;
    int (*cancelled)(void *user);
    void *cancelled_user;
    int raw_q;               /* speculative sampling with transformers 5.17's q (g4_spec_params.raw_q) */
    int scheduled;           /* a scheduler's (g4_spec_new_scheduled): no buffers of its own (its drafter's batch),
                                no verification buffers */
    g4_draft_ws ws;          /* not scheduled: its own drafter buffers */
    float *h0;               /* backend [Hb] the main model's final-normed state for the next round's first step */
    /* host */
    int32_t *drafts;         /* [cap] drafts waiting for the next round */
    int n_pending;           /* how many (-1: none) */
    int32_t pending_after;   /* the token they continue */
    int q0, q1;              /* positions the last main call processed (4.3); q0 == q1 once rolled back */
    int ready;               /* h0 and q0/q1 describe the sequence's last main call */
    g4_draft_job planned;    /* scheduled: the drafting g4_spec_start or g4_spec_next planned (k 0: none) */
    int roll_back_to;        /* scheduled: the length its sequence is cut to after that drafting (-1: none) */
    float *vlogits;          /* [cap + 1, V] verification logits (picks that are not a plain argmax) */
    float *dlogits;          /* [cap, V] drafter logits (speculative sampling with raw_q) */
    float *probs, *resid;    /* [V] */
    int32_t *vids;           /* [cap + 1] the verification's argmax ids */
    int32_t *vtoks;          /* [cap + 1] the verification's tokens */
    int32_t *seqs;           /* [n_batch] the sequence id, for batches */
    uint8_t *want;           /* [n_batch] */
    g4_round_log log;        /* per round since the prefill (not kept for a scheduler's: g4_generation_add_round) */
    g4_spec_capture *capture;
};

/* The drafter forward (section 3) of n requests at once (jobs sorted by k, the most first; a request drops out after
 * its k steps): the drafts go to each job's s->drafts (a NaN row's -1), the logits stay in ws (its keep_logits).
 * ws must hold n rows and jobs[0].k steps (g4_draft_ws_reserve). */
void g4_drafter_forward(g4_drafter *d, g4_draft_ws *ws, const g4_draft_job *jobs, int n);
/* ws holds at least rows x steps (released and made again when smaller), or -1 out of memory (ws then empty). */
int g4_draft_ws_reserve(const g4_drafter *d, g4_draft_ws *ws, int rows, int steps, int keep_logits);
void g4_draft_ws_release(const g4_drafter *d, g4_draft_ws *ws);
/* g4_spec_prefill with the rows of the prompt's soft-token placeholders (embd [soft tokens, hidden] in prompt
 * order, as g4_batch.embd; NULL: none): images and audio in the prompt. */
int g4_spec_prefill_embd(g4_spec *s, const int32_t *prompt, int n_prompt, const float *embd, float *logits,
                         g4_error *err);

/* A request of a context's scheduler (scheduler.c): its drafts are verified in the scheduler's batch steps, which
 * hand the outputs here. The scheduler's cache keeps only kv_history rows beyond what a step reads, so the context
 * needs g4_drafter_kv_history(d). g4_spec_check_scheduled says at submit whether one can be made (drafts per round
 * below the batch are taken as the batch allows); the scheduler makes one at admission and frees it at release. */
int g4_spec_check_scheduled(g4_context *ctx, g4_drafter *d, const g4_spec_params *params, g4_error *err);
int g4_spec_new_scheduled(g4_context *ctx, g4_drafter *d, const g4_spec_params *params, g4_spec **out,
                          g4_error *err);
/* The request runs on sequence seq from now (admitted again after a preemption: drafting waits for g4_spec_start). */
void g4_spec_bind(g4_spec *s, int seq);
/* The drafts waiting for the request's newest token (0: none; they are verified in its next step) and where. */
int g4_spec_pending(const g4_spec *s);
const int32_t *g4_spec_drafts(const g4_spec *s);
/* The state the first round starts from: the final-normed row of the prompt's first position fed (4.2, row 0 of
 * the prefill; final_row in backend memory, valid until the next step). */
void g4_spec_set_h0(g4_spec *s, const float *final_row);
/* The request read positions q0 .. q1-1 since its admission and sampled `next`: its first round's drafting is planned
 * (at most left - 1 drafts: the tokens the generation may still take; g4_spec_draft_planned makes them). */
void g4_spec_start(g4_spec *s, int q0, int q1, int32_t next, int left);
/* A verification step of the newest token and its first k drafts (the scheduler's rows: argmax ids vids, logits
 * vlogits [k + 1][V], or rows w .. w + k of cand, a step's top candidates with no extra ids, for smp): the kept
 * drafts and the token after them go to out; returns how many drafts were kept, or -1. */
int g4_spec_verified(g4_spec *s, int k, const int32_t *vids, float *vlogits, const g4_candidates *cand, int w,
                     g4_sampler *smp, int32_t *out, g4_error *err);
/* Then, unless the generation ended on them: the next round's drafting and the roll-back of the rejected rows are
 * planned (final_row: the verification's row n, the state that produced `next`; left: the tokens the generation may
 * still take). */
void g4_spec_next(g4_spec *s, const float *final_row, int k, int n, int32_t next, int left);
/* After a step: the planned draftings of n requests of one context, in one drafter forward per drafter (a failed
 * drafting is none: the round goes on without drafts), then each one's roll-back; rc[i] 0, or -1 when request i's
 * roll-back failed (errs[i] says why). Returns the drafter steps run. */
int g4_spec_draft_planned(g4_spec *const *specs, int n, int *rc, g4_error *errs);

#endif
