/* A context: the KV cache of up to n_seq sequences plus the scratch buffers one
 * batch step needs, sized once (hot paths allocate nothing). */
#ifndef G4_ENGINE_CONTEXT_H
#define G4_ENGINE_CONTEXT_H

#include "engine/kv_cache.h"
#include "model/model.h"

/* One batch step as the forward pass sees it: token i belongs to sequence seq[i]
 * at absolute position pos[i]; out_rows lists the rows whose logits are wanted. */
typedef struct g4_step {
    int n;
    const int32_t *ids, *seq, *pos; /* host arrays; soft-token placeholders already mapped to the pad id */
    int n_out;
    const int32_t *out_rows;
    const int32_t *kv_end;          /* host [n] or NULL: see g4_attention_args (sliding layers; every layer of
                                       gemma4_unified) */
    const int32_t *kv_start;        /* host [n] or NULL: see g4_attention_args (sliding layers) */
    const float *embd;              /* host [n_embd, H] or NULL: input rows of the embedded rows, in order */
    const uint8_t *embedded;        /* host [n]: 1 on rows that take the next embd row */
} g4_step;

typedef struct g4_scratch {
    /* backend memory */
    float *h, *h_spare, *x, *o, *q, *k, *v, *attn, *gate, *up; /* h, h_spare: the residual stream */
    float *ple, *ple_t, *ple_g, *ple_h; /* PLE inputs [n, L*P], transposed [L, n, P], gate [n, P], out [n, H] */
    float *logits;                      /* [logit_rows, V] */
    float *rope[G4_LAYER_TYPES];        /* cos/sin of the step's positions per layer type [n, head_dim] */
    int32_t *ids, *seq, *pos, *out_rows, *kv_end, *kv_start, *out_ids;
    int32_t *top_ids, *top_count;       /* [logit_rows, cap], [logit_rows]: a step's top-k candidates */
    float *top_vals;                    /* [logit_rows, cap] */
    int32_t *extra_idx;                 /* [logit_rows * G4_TOP_K_MAX]: single logits gathered (g4_candidates) */
    float *extra_vals;                  /* [logit_rows * G4_TOP_K_MAX] */
    int32_t *extra_idx_host;            /* host, the same */
    int logit_rows;
} g4_scratch;

struct g4_context {
    g4_model *model;
    int n_seq, n_ctx, n_batch;
    const void *scheduler; /* the g4_scheduler that took every sequence, or NULL */
    int max_keys[G4_LAYER_TYPES]; /* most keys a token of the step sees, per layer type (set by g4_decode) */
    int max_seq_tokens;           /* the most tokens one sequence has in the step (set by g4_decode) */
    const int32_t *step_kv_end;   /* the step's kv_end in backend memory, or NULL */
    const int32_t *step_kv_start; /* the step's kv_start in backend memory, or NULL */
    g4_kv_cache kv;
    g4_scratch s;
    int32_t *pos_host;  /* [n_batch] */
    int32_t *ids_host;  /* [n_batch] the step's ids as the embedding lookup sees them */
    int32_t *kv_end_host; /* [n_batch] */
    int32_t *kv_start_host; /* [n_batch] */
    uint8_t *embedded_host; /* [n_batch] */
    int32_t *rows_host; /* [n_batch] */
    int32_t *zero_seq;  /* [n_batch] zeros: the sequence ids of a batch that gives none */
    int *seq_added;     /* [n_seq] tokens a step adds to each sequence */
    int32_t *seq_tokens; /* [n_seq][n_ctx] the ids each sequence holds (g4_seq_tokens) */
    float *capture_hidden, *capture_final; /* host, optional */
};

/* What a token id is to the multimodal merge (docs/gemma4-towers.md 4): 0 text, 1 image, 2 video or 3 audio
 * soft-token placeholder (the model's token ids; text-only checkpoints have none). */
int g4_mm_placeholder(const g4_model *m, int32_t id);
/* The id a token (in the vocabulary) is looked up as: a placeholder as the pad token; -1 with a message where the
 * model cannot read it (no pad token for a placeholder, an id past the per-layer table). */
int32_t g4_token_read(const g4_model *m, int32_t id, g4_error *err);

/* A step's top candidates for samplers that need no more (backend.h top_k, engine/sampler.h
 * g4_sampler_sample_candidates): per output row r, count[r] ids in ascending order at ids + r * cap with their
 * logits at vals + r * cap (host arrays); count[r] = -1 where more than cap tie in (or the row holds a NaN, which
 * g4_decode_candidates reports), and then the row's whole logits are in fallback + r * V (host [n_out, V]). Besides them, the logits of n_extra (row, id) pairs (the
 * samplers' biased, suppressed and penalized ids: g4_sampler_candidate_extras) into extra_vals: rows in
 * ascending order, at most G4_TOP_K_MAX ids a row. */
typedef struct g4_candidates {
    int k, cap; /* k <= g4_context_candidates_max(); cap = g4_candidates_cap(k) */
    int32_t *ids, *count;
    float *vals, *fallback;
    int n_extra;
    const int32_t *extra_row, *extra_id; /* [n_extra] */
    float *extra_vals;                   /* [n_extra] */
    const int32_t *extra_at;             /* NULL, or [rows + 1]: row r's extras are extra_at[r] .. extra_at[r + 1] - 1
                                            (the caller's index for its samplers; g4_decode_candidates ignores it) */
} g4_candidates;
static inline int g4_candidates_cap(int k) { return k < 64 ? k + 64 : 2 * k; }

/* The largest k g4_decode_candidates takes (0: none): G4_TOP_K_MAX where the logits live in device memory, 0
 * where they are in host memory (the sampler reads the row where it is: nothing to save). The environment's
 * G4_SAMPLE_CANDIDATES overrides it: 0 never (whole rows come back), 1 on every backend (tests of the path). */
int g4_context_candidates_max(const g4_context *ctx);
/* g4_decode, with each wanted row's top candidates instead of its logits (any backend; k <= G4_TOP_K_MAX). */
int g4_decode_candidates(g4_context *ctx, const g4_batch *b, g4_candidates *cand, g4_error *err);

/* The decoder forward pass for one step (src/model/forward.c): float32 logits of the step's out_rows into the
 * host buffer `logits` [n_out, V]; or, when logits is NULL, their argmax into the host array `ids` [n_out]; or,
 * when both are NULL and cand is not, their top candidates; with all three NULL no logits are computed. */
int g4_forward(g4_context *ctx, const g4_step *step, float *logits, int32_t *ids, g4_candidates *cand,
               g4_error *err);

/* After a step: the final-normed hidden states of its wanted rows, [n_out, H] in backend memory, valid until the
 * next step (what transformers returns as hidden_states[-1]; a drafter reads them). */
static inline const float *g4_step_final_rows(const g4_context *ctx) { return ctx->s.x; }

#endif
