/* The token sampler: turns one row of logits into the next token id.
 *
 * The order of operations follows transformers' generate() (LogitsProcessorList
 * built by _get_logits_processor, then the sampling warpers):
 *
 *   1. logit bias (added; -INFINITY bans a token)         ~ SequenceBiasLogitsProcessor
 *   2. repetition penalty over the history window          ~ RepetitionPenaltyLogitsProcessor
 *      (logit > 0 ? logit / p : logit * p for every id seen at least once)
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

typedef struct g4_sampler_params {
    float temperature;        /* 0 = greedy (argmax; ties -> lowest id, like torch); values below
                                 1e-5 are treated as 0 (the scaled logits would overflow) */
    int top_k;                /* 0 = off */
    float top_p;              /* 1.0 = off; must be in (0, 1] */
    float min_p;              /* 0 = off; must be in [0, 1] */
    float repetition_penalty; /* 1.0 = off; > 0. HF semantics: logit > 0 ? logit/p : logit*p,
                                 applied once to every id in the history window */
    float presence_penalty;   /* 0 = off; logit -= presence if count > 0 */
    float frequency_penalty;  /* 0 = off; logit -= frequency * count */
    int penalty_last_n;       /* how many of the latest accepted ids the three penalties look at;
                                 -1 = all of them, 0 = none (penalties off) */
    uint64_t seed;
    /* Logit bias: bias_values[i] is added to the logit of bias_ids[i] (repeated ids add up);
     * -INFINITY bans the id. The arrays are copied by g4_sampler_new. */
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias;
    /* Ids set to -INFINITY at every step (generation_config suppress_tokens). Copied. */
    const int32_t *suppress_ids;
    int n_suppress;
} g4_sampler_params;

/* Neutral settings: temperature 1, top_k 0, top_p 1, min_p 0, no penalties
 * (repetition 1, presence 0, frequency 0, penalty_last_n -1), seed 0, no bias,
 * nothing suppressed: plain sampling from softmax(logits). */
void g4_sampler_params_default(g4_sampler_params *p);

/* Checks the parameters (vocab_size <= 0 skips the id range checks). Returns 0 or -1 with
 * a one-line message naming the bad field. */
int g4_sampler_params_check(const g4_sampler_params *p, int vocab_size, g4_error *err);

typedef struct g4_sampler g4_sampler;

/* Validates p (clear errors for a negative or non-finite temperature, top_p outside (0,1],
 * ids outside the vocabulary, ...) and allocates every buffer sample() needs. */
int g4_sampler_new(const g4_sampler_params *p, int vocab_size, g4_sampler **out, g4_error *err);
void g4_sampler_free(g4_sampler *s);

/* Appends one id to the history the penalties look at: feed the prompt tokens, then every
 * generated token. Ids outside [0, vocab_size) are ignored. A no-op when no penalty is on. */
void g4_sampler_accept(g4_sampler *s, int32_t id);
void g4_sampler_accept_many(g4_sampler *s, const int32_t *ids, int n);

/* Takes the last n accepted ids back out of the history (speculative decoding tries drafts and keeps some).
 * The history can go back G4_SAMPLER_REWIND_MAX ids behind the longest it has been: 0, or -1 beyond that or
 * beyond its start (nothing changes). */
#define G4_SAMPLER_REWIND_MAX 256
int g4_sampler_rewind(g4_sampler *s, int n);

/* Clears the history. The random generator keeps its state (a new sequence gets fresh
 * draws); call g4_sampler_seed to restart the random sequence too. */
void g4_sampler_reset(g4_sampler *s);
void g4_sampler_seed(g4_sampler *s, uint64_t seed);

/* Draws the next id from one row of vocab_size logits. Does not modify logits (it works in
 * the sampler's own scratch) and does not accept the id into the history. NaN logits count
 * as -INFINITY; if some logits are +INFINITY the lowest such id is returned. Returns -1 when
 * no token can be drawn (every logit -INFINITY or NaN after bias/suppression). */
int32_t g4_sampler_sample(g4_sampler *s, const float *logits);

/* The exact distribution sample() draws from for this row and history: writes vocab_size
 * probabilities (0 for filtered tokens; greedy gives a one-hot row) and returns how many are
 * non-zero, or -1 as above (then probs is all zero). Consumes no random numbers. */
int g4_sampler_probs(g4_sampler *s, const float *logits, float *probs);

/* 1 when the sampler picks the largest adjusted logit (temperature 0); *plain (may be NULL) is then 1 when nothing
 * adjusts the logits (no bias, suppression or penalty): the pick is the argmax of the raw row. */
int g4_sampler_is_greedy(const g4_sampler *s, int *plain);

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
