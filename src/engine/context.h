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
    const int32_t *ids, *seq, *pos; /* host arrays */
    int n_out;
    const int32_t *out_rows;
    const int32_t *kv_end;          /* host [n] or NULL: see g4_attention_args (sliding layers only) */
} g4_step;

typedef struct g4_scratch {
    /* backend memory */
    float *h, *x, *o, *q, *k, *v, *attn, *gate, *up, *moe_x2, *moe_out;
    float *ple, *ple_t, *ple_g, *ple_h; /* PLE inputs [n, L*P], transposed [L, n, P], gate [n, P], out [n, H] */
    float *logits;                      /* [logit_rows, V] */
    float *rope[G4_LAYER_TYPES];        /* cos/sin of the step's positions per layer type [n, head_dim] */
    int32_t *ids, *seq, *pos, *out_rows, *kv_end, *out_ids;
    float *host_rows;                   /* host [n, L*P]: rows of a table the model keeps on the host */
    int logit_rows;
} g4_scratch;

struct g4_context {
    g4_model *model;
    int n_seq, n_ctx, n_batch;
    int max_keys[G4_LAYER_TYPES]; /* most keys a token of the step sees, per layer type (set by g4_decode) */
    const int32_t *step_kv_end;   /* the step's kv_end in backend memory, or NULL */
    g4_kv_cache kv;
    g4_scratch s;
    int32_t *pos_host;  /* [n_batch] */
    int32_t *rows_host; /* [n_batch] */
    int32_t *zero_seq;  /* [n_batch] zeros: the sequence ids of a batch that gives none */
    int *seq_added;     /* [n_seq] tokens a step adds to each sequence */
    int32_t *seq_tokens; /* [n_seq][n_ctx] the ids each sequence holds (g4_seq_tokens) */
    float *capture_hidden, *capture_final; /* host, optional */
};

/* The decoder forward pass for one step (src/model/forward.c): float32 logits of the step's out_rows into the
 * host buffer `logits` [n_out, V], or, when logits is NULL, their argmax into the host array `ids` [n_out];
 * with both NULL no logits are computed. */
int g4_forward(g4_context *ctx, const g4_step *step, float *logits, int32_t *ids, g4_error *err);

/* After a step: the final-normed hidden states of its wanted rows, [n_out, H] in backend memory, valid until the
 * next step (what transformers returns as hidden_states[-1]; a drafter reads them). */
static inline const float *g4_step_final_rows(const g4_context *ctx) { return ctx->s.x; }

#endif
