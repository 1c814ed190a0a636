/* A checkpoint's generation_config.json: decoding defaults and the stop ids.
 *
 * What is read (transformers 5.x GenerationConfig semantics):
 *   do_sample (false)     false -> greedy: sampling.temperature = 0
 *   temperature (1.0)     used when do_sample is true (0 there also means greedy)
 *   top_k (50)            transformers' global default when the file does not set it; 0 = off
 *   top_p (1.0), min_p (off), repetition_penalty (1.0)
 *                         (temperature/top_k/top_p/min_p out of range: an error with do_sample true, ignored
 *                         with do_sample false, as transformers only warns there; top_p 0 keeps one token)
 *   suppress_tokens       ids set to -inf at every step (greedy included)
 *   eos_token_id          int or list; when absent, config.json's top-level eos_token_id, else
 *                         text_config.eos_token_id (the stop set is the file's list as is;
 *                         it is not merged with config.json's; negative ids never match and are dropped)
 *   pad_token_id, bos_token_id, max_new_tokens, max_length
 * Not supported: begin_suppress_tokens, bad_words_ids, sequence_bias, no_repeat_ngram_size, min_length,
 * min_new_tokens, forced_bos/eos_token_id, stop_strings, num_beams, typical_p and the other processors of
 * transformers' _get_logits_processor: a value that would change transformers' output is a line in `warnings`
 * (the model's load warnings), never ignored silently. Types as transformers' processors check them: with
 * do_sample an integer temperature other than 1 or a float top_k is an error, as is an integer
 * repetition_penalty other than 1; do_sample with temperature 0 (transformers refuses it) decodes greedily with
 * a warning.
 *
 * A missing generation_config.json is not an error: greedy defaults plus the eos ids from
 * config.json (also absent: no eos ids). A malformed file is an error with a one-line message.
 */
#ifndef G4_MODEL_GENERATION_CONFIG_H
#define G4_MODEL_GENERATION_CONFIG_H

#include <stdint.h>

#include "gemma4c.h"

#define G4_MAX_EOS_IDS 16

typedef struct g4_generation_config {
    g4_sampler_params sampling; /* suppress_ids points into this struct's own array */
    int do_sample;              /* the file's do_sample */
    float temperature;          /* the file's temperature (1.0 when absent), even when greedy */
    int32_t eos_ids[G4_MAX_EOS_IDS];
    int n_eos;
    int32_t *suppress_ids; /* owned */
    int n_suppress;
    int max_new_tokens; /* -1 when absent */
    int max_length;     /* prompt + generated, -1 when absent */
    int32_t pad_id;     /* -1 when absent */
    int32_t bos_id;     /* -1 when absent */
    int from_file;      /* 1 when generation_config.json was found and read */
    char *warnings;     /* owned: lines ending in '\n' (fields read but not acted on), or NULL */
} g4_generation_config;

/* Reads model_dir/generation_config.json (and model_dir/config.json for the eos fallback). */
int g4_generation_config_load(const char *model_dir, g4_generation_config *out, g4_error *err);
/* Same from explicit paths; either may be NULL (treated as missing). */
int g4_generation_config_load_files(const char *gen_path, const char *config_path,
                                    g4_generation_config *out, g4_error *err);
void g4_generation_config_free(g4_generation_config *c);

int g4_generation_config_is_eos(const g4_generation_config *c, int32_t id);

/* How many tokens may still be generated after a prompt of prompt_len tokens:
 * max_new_tokens when set, else max_length - prompt_len (not below 0), else -1 (no limit).
 * (transformers: max_new_tokens takes precedence over max_length.) */
int g4_generation_config_max_new(const g4_generation_config *c, int prompt_len);

#endif
