/* gemma4c - an inference engine for Google's Gemma 4 models.
 *
 * The public C API: load a model, create a context (KV cache + scratch), run
 * batch steps that mix prefill chunks and decode tokens of many sequences,
 * and free everything.  Every function that can fail returns 0 on success and
 * -1 on failure, with a one-line message in the caller's g4_error.
 * Nothing in the library calls exit() or abort() on bad input.
 */
#ifndef GEMMA4C_H
#define GEMMA4C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define G4_VERSION "0.1.0"

typedef struct g4_error {
    char msg[512];
} g4_error;

/* ------------------------------------------------------------------ model */

typedef struct g4_model g4_model;

typedef struct g4_load_params {
    int n_threads;                                   /* 0: all cores */
    /* Called while weights are bound/paged in; fraction in [0,1]. May be NULL. */
    void (*progress)(float fraction, const char *what, void *user);
    void *progress_user;
} g4_load_params;

/* Loads a model folder (config.json + *.safetensors [+ index]). */
int g4_model_load(const char *dir, const g4_load_params *params, g4_model **out, g4_error *err);
void g4_model_free(g4_model *model);

int g4_model_vocab_size(const g4_model *model);
int g4_model_n_layers(const g4_model *model);
int g4_model_hidden_size(const g4_model *model);

/* ---------------------------------------------------------------- context */

typedef struct g4_context g4_context;

typedef struct g4_context_params {
    int n_seq_max;   /* sequences that can be live at once (default 1) */
    int n_ctx;       /* maximum positions per sequence (default: model max, capped at 4096) */
    int n_batch;     /* maximum tokens in one g4_decode call (default 512) */
} g4_context_params;

int g4_context_new(g4_model *model, const g4_context_params *params, g4_context **out, g4_error *err);
void g4_context_free(g4_context *ctx);

/* Positions per sequence the context holds. */
int g4_context_n_ctx(const g4_context *ctx);

/* Forget everything sequence `seq` has processed (its next position is 0). */
void g4_seq_reset(g4_context *ctx, int seq);
/* Rolls sequence `seq` back to its first n positions (to reuse a shared prefix).
 * Sliding-window layers keep a ring, so a roll-back of more than n_batch positions
 * may be impossible: then it fails and the caller resets the sequence instead. */
int g4_seq_truncate(g4_context *ctx, int seq, int n, g4_error *err);
/* Number of positions sequence `seq` has processed. */
int g4_seq_length(const g4_context *ctx, int seq);

/* One batch step.  Tokens of one sequence must be contiguous in the batch and
 * in position order; each sequence's tokens continue at g4_seq_length(seq).
 * Rows with want_logits[i] != 0 (all rows if want_logits is NULL) get their
 * float32 logits written to `logits` in batch order, vocab floats per row. */
typedef struct g4_batch {
    int n_tokens;
    const int32_t *token;
    const int32_t *seq;          /* NULL: every token belongs to sequence 0 */
    const uint8_t *want_logits;  /* NULL: logits for every row */
    /* Soft tokens (the output of an image or audio tower): when `embeddings` is set, row i
     * with embedding_row[i] >= 0 enters the decoder as row embedding_row[i] of `embeddings`
     * (float32, hidden_size per row) instead of the embedding of token[i], which still names
     * the placeholder (e.g. <|audio|>); its per-layer input takes the pad token's row, as in
     * transformers. embedding_row[i] < 0: the token's own embedding. */
    const float *embeddings;
    const int32_t *embedding_row;
} g4_batch;

int g4_decode(g4_context *ctx, const g4_batch *batch, float *logits, g4_error *err);

/* Optional per-layer capture for tests and debugging: when set, the next
 * g4_decode copies the hidden state after every layer ([n_layers][n_tokens][H])
 * and after the final norm ([n_tokens][H]) into these buffers. */
void g4_context_capture(g4_context *ctx, float *hidden_per_layer, float *final_norm);

#ifdef __cplusplus
}
#endif
#endif
