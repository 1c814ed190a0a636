/* The token sampler: turns one row of logits into the next token id.
 *
 * The order of operations follows transformers' generate() (LogitsProcessorList
 * built by _get_logits_processor, then the sampling warpers):
 *
 *   1. logit bias (added; -INFINITY bans a token)         ~ SequenceBiasLogitsProcessor
 *   2. repetition penalty over the history window          ~ RepetitionPenaltyLogitsProcessor
 *      (logit > 0 ? logit / p : logit * p for every id seen at least once, and for the prompt ids
 *      of g4_sampler_accept_prompt)
 *   3. presence / frequency penalties (OpenAI semantics)   logit -= presence*(count>0) + frequency*count
 *   4. suppressed ids set to -INFINITY                      ~ SuppressTokensLogitsProcessor
 *   -- temperature == 0: greedy, argmax of the above (ties -> lowest id, like torch.argmax)
 *   5. temperature: logits / T                              ~ TemperatureLogitsWarper
 *   6. top-k: keep every token >= the k-th largest value    ~ TopKLogitsWarper (ties at the k-th
 *      value are all kept, as `scores < topk(...)[-1]` does)
 *   7. top-p: in descending order keep tokens while the probability mass before them is < top_p
 *      (the smallest prefix whose cumulative probability reaches top_p; at least one token)
 *                                                           ~ TopPLogitsWarper
 *   8. min-p: keep tokens with p >= min_p * p_max          ~ MinPLogitsWarper
 *      (top-p renormalizes over the top-k survivors; min-p compares to the top token)
 *   9. draw from the softmax of what is left.
 *
 * Steps 1-4 change only the few ids that carry a bias, a suppression or a history count, so
 * sample() never copies the vocabulary row for the top-k path: it selects the k + |modified|
 * largest raw logits in one pass and then patches the modified ids (see sampler.c).
 *
 * Determinism: the random numbers come from xoshiro256** seeded through splitmix64; the
 * exponentials use one fixed polynomial evaluated with the same float operations on every
 * path (SSE2, AVX2 or plain C), and sums are accumulated in double in a fixed order, so the
 * same seed and logits give the same ids on every machine.
 *
 * A sampler is not thread-safe; use one per sequence.
 */
#ifndef G4_ENGINE_SAMPLER_H
#define G4_ENGINE_SAMPLER_H

#include <stdint.h>

#include "gemma4c.h"

/* g4_sampler_params, g4_sampler_new/free/sample/accept/reset/seed are declared in gemma4c.h
 * (the public API); below, what the engine and the tests use besides.
 *
 * sample() does not modify logits (it works in the sampler's own scratch). NaN logits count as
 * -INFINITY; if some logits are +INFINITY the lowest such id is returned. Penalty history ids
 * outside [0, vocab_size) are ignored; accepting is a no-op when no penalty is on. */

/* Checks the parameters (vocab_size <= 0 skips the id range checks). Returns 0 or -1 with
 * a one-line message naming the bad field. */
int g4_sampler_params_check(const g4_sampler_params *p, int vocab_size, g4_error *err);

/* Prompt ids that only the repetition penalty looks at, as vLLM's sampler does for OpenAI requests
 * (vllm/model_executor/layers/utils.py apply_penalties: repetition_penalty over the prompt's and the output's ids,
 * frequency_penalty and presence_penalty over the output's counts only). They stay until g4_sampler_reset, outside
 * penalty_last_n's window and g4_sampler_rewind. A no-op unless a repetition penalty is on; ids outside the
 * vocabulary are ignored. Returns 0, or -1 out of memory (nothing else changes). */
int g4_sampler_accept_prompt(g4_sampler *s, const int32_t *ids, int n);

/* Takes the last n accepted ids back out of the history (speculative decoding tries drafts and keeps some).
 * The history can go back G4_SAMPLER_REWIND_MAX ids behind the longest it has been: 0, or -1 beyond that or
 * beyond its start (nothing changes). */
#define G4_SAMPLER_REWIND_MAX 256
int g4_sampler_rewind(g4_sampler *s, int n);

/* The exact distribution sample() draws from for this row and history: writes vocab_size
 * probabilities (0 for filtered tokens; greedy gives a one-hot row) and returns how many are
 * non-zero, or -1 as above (then probs is all zero). Consumes no random numbers. */
int g4_sampler_probs(g4_sampler *s, const float *logits, float *probs);

/* Sampling from a row's top candidates instead of the whole row (the backend's top_k op finds them where the
 * logits are, so only they come back from a GPU).
 * g4_sampler_candidates_k: the k such candidates must be found for (0 when the sampler needs the whole row: no
 * top-k, or more than G4_SAMPLER_CANDIDATES_MAX): 1 for greedy, top_k (at most the vocabulary) for top-k sampling;
 * with biased, suppressed or penalized ids (the "modified" ids of sampler.c) at least k + their number, rounded up
 * to a power of two (it grows with the penalty history, a step at a time).
 * g4_sampler_candidate_extras: those modified ids of this step (NULL: only counts them), whose raw logits the
 * draw needs besides the candidates; returns their number (< the candidates' k). Valid until the next accept.
 * g4_sampler_sample_candidates: ids [n] in ascending order with their logits vals: every id whose logit is >= the
 * row's K-th largest (NaN and -inf left out, every tie kept) for some K >= candidates_k; extra_vals: the raw logits
 * of the extras' ids, in their order (NULL when there are none). Returns the id sample() would return for the
 * whole row, from the same random numbers; -1 where candidates_k is 0, extras are missing or an id is out of range. */
#define G4_SAMPLER_CANDIDATES_MAX 1024
int g4_sampler_candidates_k(const g4_sampler *s);
int g4_sampler_candidate_extras(const g4_sampler *s, int32_t *ids);
/* g4_sampler_candidate_extras and (into *k) g4_sampler_candidates_k as they will be after accepting ids[0 .. n-1]
 * (a verification row after drafts; n <= G4_SAMPLER_REWIND_MAX): the sampler is left as it was, but the order of its
 * modified ids may change (match extras by id). */
int g4_sampler_candidate_extras_after(g4_sampler *s, const int32_t *ids, int n, int32_t *extras, int *k);
int32_t g4_sampler_sample_candidates(g4_sampler *s, const int32_t *ids, const float *vals, int n,
                                     const float *extra_vals);
/* g4_sampler_probs from the candidates (as g4_sampler_sample_candidates takes them): the same distribution. */
int g4_sampler_probs_candidates(g4_sampler *s, const int32_t *ids, const float *vals, int n, const float *extra_vals,
                                float *probs);

/* 1 when sample() is the plain argmax of the logits (greedy, no bias, suppression or penalty),
 * so a model step may pick the id itself (g4_decode_greedy). */
int g4_sampler_is_argmax(const g4_sampler *s);

/* 1 when the sampler picks the largest adjusted logit (temperature 0). */
int g4_sampler_is_greedy(const g4_sampler *s);

/* A uniform number in [0, 1) from the sampler's random sequence. */
double g4_sampler_uniform(g4_sampler *s);

/* Draws an id from vocab_size non-negative weights (they need not sum to 1) with the sampler's random sequence;
 * -1 when every weight is 0. */
int32_t g4_sampler_draw(g4_sampler *s, const float *probs);

/* The parameters the sampler was created with (arrays point at its own copies). */
const g4_sampler_params *g4_sampler_get_params(const g4_sampler *s);

/* For tests: out[i] = exp((v[i] - m) * inv_t) for values <= m and their sum (prefix: NULL or
 * n/256 + 2 doubles of block prefix sums) with the plain C (0), SSE2 (1) or AVX2 (2) code;
 * returns the variant that ran (one the machine lacks falls back to 0). All variants must
 * agree bit for bit. */
int g4_sampler_exp_row_variant(const float *v, float *out, int n, float m, float inv_t, int variant,
                               double *sum, double *prefix);

#endif
