/* The generation loop shared by the commands (and later the server's scheduler for
 * one sequence): prefill the prompt in batch-sized chunks, then pick one token at a
 * time and feed it back through the KV cache. */
#ifndef G4_ENGINE_GENERATE_H
#define G4_ENGINE_GENERATE_H

#include <stdint.h>

#include "gemma4c.h"

/* Chooses the next token from the last row's logits (vocab floats). */
typedef int32_t (*g4_pick_fn)(const float *logits, int vocab, void *user);
/* Sees each generated token; return non-zero to stop after it. */
typedef int (*g4_token_fn)(int32_t id, void *user);

typedef struct g4_generate_params {
    int max_new_tokens;
    g4_pick_fn pick;           /* NULL: greedy (argmax, lowest id on ties) */
    void *pick_user;
    g4_token_fn on_token;      /* may be NULL */
    void *on_token_user;
    const int32_t *stop_ids;   /* a generated id in this set ends generation (it is reported, not fed) */
    int n_stop;
    volatile int *cancel;      /* set non-zero (e.g. from a signal handler) to stop early */
    const float *embeddings;        /* soft tokens of the prompt (g4_batch), or NULL */
    const int32_t *embedding_row;   /* [n_prompt] */
} g4_generate_params;

/* Runs `prompt` through sequence `seq` (which continues from its current length), then
 * generates. Generated ids go to out (capacity max_new_tokens), their count to *n_out.
 * *stopped_by: 0 length limit, 1 stop id, 2 callback, 3 cancelled. */
int g4_generate(g4_context *ctx, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *p,
                int32_t *out, int *n_out, int *stopped_by, g4_error *err);

int32_t g4_argmax(const float *logits, int n);

#endif
