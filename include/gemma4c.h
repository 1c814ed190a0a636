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
    int n_threads;                                   /* CPU threads; 0: all cores */
    const char *device;                              /* "cpu", "cuda"; NULL or "auto": cuda when built and present */
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
/* The backend the model runs on ("cpu" or "cuda"). */
const char *g4_model_device(const g4_model *model);
/* Backends this build contains, e.g. "cpu" or "cpu, cuda". */
const char *g4_backends(void);

/* ---------------------------------------------------------------- context */

typedef struct g4_context g4_context;

/* Element type of the KV cache. */
typedef enum g4_kv_type { G4_KV_F32 = 0, G4_KV_BF16 = 1, G4_KV_F16 = 2 } g4_kv_type;

/* The KV cache is paged: positions are kept in blocks of kv_block_size rows taken from one pool per layer
 * type. Full-attention layers hold ceil(length / kv_block_size) blocks per sequence; sliding-window layers
 * hold only the blocks their window still needs plus n_batch positions of history for roll-backs
 * (about (window + n_batch) / kv_block_size). */
typedef struct g4_context_params {
    int n_seq_max;     /* sequences that can be live at once (default 1) */
    int n_ctx;         /* maximum positions per sequence (default: model max, capped at 4096) */
    int n_batch;       /* maximum tokens in one g4_decode call (default 512) */
    g4_kv_type kv_type;/* default G4_KV_F32 */
    int kv_block_size; /* positions per block (default 32) */
    int n_kv_blocks;   /* blocks of the full-attention pool (default: every sequence can reach n_ctx);
                          fewer blocks let more sequences share memory, and a step that finds no free block
                          fails with a message that says so (nothing is changed) */
} g4_context_params;

int g4_context_new(g4_model *model, const g4_context_params *params, g4_context **out, g4_error *err);
void g4_context_free(g4_context *ctx);

/* Positions per sequence the context holds. */
int g4_context_n_ctx(const g4_context *ctx);

/* Forget everything sequence `seq` has processed (its next position is 0). */
void g4_seq_reset(g4_context *ctx, int seq);
/* Rolls sequence `seq` back to its first n positions (to reuse a shared prefix).
 * Sliding-window layers keep only the window's rows plus n_batch more, so a roll-back by more than
 * n_batch positions may be impossible: then it fails, nothing changes, and the caller resets the
 * sequence instead. */
int g4_seq_truncate(g4_context *ctx, int seq, int n, g4_error *err);
/* Number of positions sequence `seq` has processed. */
int g4_seq_length(const g4_context *ctx, int seq);
/* Free blocks of the full-attention pool (of the sliding pool for a model without full layers). */
int g4_kv_free_blocks(const g4_context *ctx);
/* Bytes the KV cache holds in backend memory. */
size_t g4_kv_bytes(const g4_context *ctx);

/* One batch step.  Tokens of one sequence must be contiguous in the batch and
 * in position order; each sequence's tokens continue at g4_seq_length(seq).
 * Rows with want_logits[i] != 0 (all rows if want_logits is NULL) get their
 * float32 logits written to `logits` in batch order, vocab floats per row;
 * with logits == NULL no logits are computed (a capture still sees the final norm). */
typedef struct g4_batch {
    int n_tokens;
    const int32_t *token;
    const int32_t *seq;          /* NULL: every token belongs to sequence 0 */
    const uint8_t *want_logits;  /* NULL: logits for every row */
} g4_batch;

int g4_decode(g4_context *ctx, const g4_batch *batch, float *logits, g4_error *err);
/* The same step, giving for each wanted row only the id of its largest logit (lowest id on ties) in `ids`:
 * greedy decoding without copying logits back from the device. */
int g4_decode_greedy(g4_context *ctx, const g4_batch *batch, int32_t *ids, g4_error *err);

/* Optional per-layer capture for tests and debugging: when set, the next
 * g4_decode copies the hidden state after every layer ([n_layers][n_tokens][H])
 * and after the final norm ([n_tokens][H]) into these buffers. */
void g4_context_capture(g4_context *ctx, float *hidden_per_layer, float *final_norm);

/* --------------------------------------------------- speculative decoding */

/* A drafter: a gemma4_assistant checkpoint (Gemma 4's multi-token-prediction assistant) loaded beside its main
 * model, on the main model's backend. It drafts tokens from the main model's own K/V cache and hidden state;
 * the main model checks a round of drafts in one step, as transformers 5.17's assisted generation does. */
typedef struct g4_drafter g4_drafter;

/* Loads DIR and checks that it can draft for `main` (hidden sizes, vocabulary, head sizes, kv heads and RoPE
 * of the layer types it reads); a mismatched pair is a one-line error. `main` must outlive the drafter. */
int g4_drafter_load(const char *dir, g4_model *main, g4_drafter **out, g4_error *err);
void g4_drafter_free(g4_drafter *d);
/* Drafts per round by default: the drafter's generation_config.json num_assistant_tokens (20 when absent). */
int g4_drafter_n_draft(const g4_drafter *d);

/* Speculative decoding of one sequence of a context whose model is the drafter's main model. */
typedef struct g4_spec g4_spec;
typedef struct g4_sampler g4_sampler;

typedef struct g4_spec_params {
    int n_draft;                /* drafts per round; 0: the drafter's default. Below the context's n_batch. */
    const int32_t *stop_ids;    /* ids that end generation (eos): drafting stops after drafting one */
    int n_stop_ids;
    volatile int *cancel;       /* checked between prefill chunks (may be NULL) */
    int raw_q;                  /* sampling: verify as transformers 5.17 does, with q = softmax of the drafter's
                                   raw logits although drafts are its argmax (favours drafts: the output is no
                                   longer distributed as the main model's); 0: q = the point mass the draft was
                                   drawn from, lossless */
} g4_spec_params;

int g4_spec_new(g4_context *ctx, int seq, g4_drafter *d, const g4_spec_params *params, g4_spec **out,
                g4_error *err);
void g4_spec_free(g4_spec *s);

/* Runs `prompt` through the sequence (continuing from its length) and keeps what the first round needs;
 * the last prompt row's logits go to `logits` (vocab floats): the caller picks the first token from them.
 * Returns 0, 1 when cancelled between chunks, or -1. */
int g4_spec_prefill(g4_spec *s, const int32_t *prompt, int n_prompt, float *logits, g4_error *err);

/* One round after `last`, the sequence's newest token (picked by the caller, not yet run through the model):
 * up to min(n_draft, budget - 1) drafts, one main-model step over [last, drafts], and the accepted drafts plus
 * one token of the main model (the correction, or a bonus when all were accepted) into out (room for
 * n_draft + 1), their count into *n_out (<= budget). smp NULL: greedy (argmax). A greedy sampler (temperature 0)
 * picks the largest adjusted logit of each row; a sampling one verifies by speculative sampling (the output is
 * distributed as the main model's with that sampler, see g4_spec_params.raw_q). smp's history
 * must hold the sequence so far (the caller accepts what it reports; a round leaves the history as it found
 * it). Afterwards the sequence holds everything but the newest token, as in plain decoding; a sequence changed
 * by other calls since (g4_decode, g4_seq_truncate, ...) needs a new g4_spec_prefill. */
int g4_spec_round(g4_spec *s, int32_t last, int budget, g4_sampler *smp, int32_t *out, int *n_out, g4_error *err);

/* Drafts k tokens after `last` from the sequence as it is, without verifying them (nothing changes but the
 * drafts a next round would have used): benchmarks, inspection. */
int g4_spec_draft(g4_spec *s, int32_t last, int k, int32_t *drafts, g4_error *err);

/* Rounds since the last prefill: *n rounds, drafted[i] and accepted[i] drafts of round i (valid until the next
 * call on s). */
void g4_spec_rounds(const g4_spec *s, const int **drafted, const int **accepted, int *n);

#ifdef __cplusplus
}
#endif
#endif
