/* What the scheduler (scheduler.c) uses of a generation (generation.c): a generation it runs
 * with its own model steps. It samples from the generation's sampler (or takes the argmax when
 * g4_generation_is_argmax), hands the token to g4_generation_take, which turns it into events
 * and may end the generation, and delivers the events to the generation's callback with
 * g4_generation_deliver after each step. The last event of a scheduled generation is
 * G4_EVENT_FINISH. The caller's handle and the scheduler each hold a reference: g4_generation_free
 * (the caller's, which also cancels) and g4_generation_release (the scheduler's) free it when
 * both are done. */
#ifndef G4_ENGINE_GENERATION_H
#define G4_ENGINE_GENERATION_H

#include "gemma4c.h"

/* A generation of prompt[0..n_prompt-1] for a context of n_ctx positions; embed: an embedding
 * request (no tokens; g4_generation_embedding_out gets the result before it ends with STOP). */
int g4_generation_new_scheduled(const g4_model *m, int n_ctx, const int32_t *prompt, int n_prompt,
                                const g4_generation_params *params, int embed, g4_event_fn on_event, void *user,
                                g4_generation **out, g4_error *err);
int g4_generation_max_new(const g4_generation *g);
/* Tokens it may still take (its limit less those it took). */
int g4_generation_left(const g4_generation *g);
/* Its drafter (NULL: none) and the parameters of the speculative state the scheduler makes for it (drafts per
 * round, stop ids); the drafts and kept drafts of each round it verified (g4_generation_rounds). */
g4_drafter *g4_generation_drafter(const g4_generation *g, g4_spec_params *p);
void g4_generation_add_round(g4_generation *g, int drafted, int accepted);
g4_sampler *g4_generation_sampler(g4_generation *g);
int g4_generation_is_argmax(const g4_generation *g);
int g4_generation_cancelled(const g4_generation *g);
/* The next id from one row of logits with the generation's sampler (-1: every id banned); with logprobs it keeps
 * the step's log-probabilities, with json_object it masks the row in place first. */
int32_t g4_generation_sample(g4_generation *g, float *logits);
/* The prompt as the model reads it (images and audio expanded to their soft tokens) and the rows of its soft
 * tokens in order ([soft tokens, hidden_size], NULL without media). */
const int32_t *g4_generation_prompt(const g4_generation *g, int *n);
const float *g4_generation_embd(const g4_generation *g);
/* The k of the top candidates its sampler can draw from instead of a row (engine/sampler.h
 * g4_sampler_candidates_k; 0: it needs the row, as for log-probabilities or a JSON constraint), the ids whose
 * logits it needs besides (g4_sampler_candidate_extras), and the draw. */
int g4_generation_candidates_k(const g4_generation *g);
int g4_generation_candidate_extras(const g4_generation *g, int32_t *ids);
int32_t g4_generation_sample_candidates(g4_generation *g, const int32_t *ids, const float *vals, int n,
                                        const float *extra_vals);
/* The next token: its events; the generation may end (stop id or string, token limit; an error
 * ends it with G4_FINISH_ERROR). */
void g4_generation_take(g4_generation *g, int32_t id);
/* Ends it (no-op when it has ended): held-back text, then the FINISH event. */
void g4_generation_end(g4_generation *g, g4_finish why);
/* Ends it with G4_FINISH_ERROR and `why` as its error (no-op when it has ended). */
void g4_generation_fail(g4_generation *g, const char *why);
/* Calls the callback with the queued events (not once the caller freed its handle), then clears them. */
void g4_generation_deliver(g4_generation *g);
/* Prompt tokens found in the prefix cache when it was first admitted (g4_generation_n_cached). */
void g4_generation_set_cached(g4_generation *g, int n_cached);
/* The scheduler lets it go. */
void g4_generation_release(g4_generation *g);
/* An embedding request's result buffer (hidden_size floats). */
float *g4_generation_embedding_out(g4_generation *g);
/* The token ids of a conversation's reply prompt (rendered with a generation prompt). */
int g4_chat_reply_prompt(const g4_chat *c, const g4_model *m, g4_tokens *toks, g4_error *err);

#endif
