#include "model/generation_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"

/* transformers' GenerationConfig._get_default_generation_params()["top_k"] */
#define G4_HF_DEFAULT_TOP_K 50

static void set_defaults(g4_generation_config *c) {
    memset(c, 0, sizeof *c);
    g4_sampler_params_default(&c->sampling);
    c->sampling.temperature = 0.0f; /* do_sample defaults to false */
    c->sampling.top_k = G4_HF_DEFAULT_TOP_K;
    c->do_sample = 0;
    c->temperature = 1.0f;
    c->max_new_tokens = -1;
    c->max_length = -1;
    c->pad_id = -1;
    c->bos_id = -1;
}

/* eos_token_id: an integer or a list of integers (null = absent). Returns 1 when read,
 * 0 when absent, -1 on error. */
static int read_eos(const json_t *obj, const char *what, g4_generation_config *c, g4_error *err) {
    const json_t *v = json_object_get(obj, "eos_token_id");
    if (!v || json_is_null(v)) return 0;
    c->n_eos = 0;
    if (json_is_integer(v)) {
        json_int_t id = json_integer_value(v);
        if (id > INT32_MAX)
            return g4_fail(err, "%s: \"eos_token_id\" %lld is not a valid token id", what, (long long)id);
        if (id >= 0) c->eos_ids[c->n_eos++] = (int32_t)id;
        return 1;
    }
    if (!json_is_array(v))
        return g4_fail(err, "%s: \"eos_token_id\" must be an integer or a list of integers", what);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e))
            return g4_fail(err, "%s: \"eos_token_id\"[%zu] must be an integer", what, i);
        json_int_t id = json_integer_value(e);
        if (id > INT32_MAX)
            return g4_fail(err, "%s: \"eos_token_id\"[%zu] = %lld is not a valid token id", what, i,
                           (long long)id);
        if (id < 0) continue; /* no token is negative: transformers only warns, and never stops on it */
        int dup = 0;
        for (int k = 0; k < c->n_eos; k++) dup |= c->eos_ids[k] == (int32_t)id;
        if (dup) continue;
        if (c->n_eos == G4_MAX_EOS_IDS)
            return g4_fail(err, "%s: \"eos_token_id\" lists more than %d distinct ids", what,
                           G4_MAX_EOS_IDS);
        c->eos_ids[c->n_eos++] = (int32_t)id;
    }
    return 1;
}

static int read_optional_id(const json_t *obj, const char *key, const char *what, int32_t *out,
                            g4_error *err) {
    int64_t v;
    if (g4_json_int(obj, key, -1, &v, what, err)) return -1;
    if (v > INT32_MAX) return g4_fail(err, "%s: \"%s\" %lld is not a valid token id", what, key, (long long)v);
    *out = v < 0 ? -1 : (int32_t)v; /* negative: none (transformers only warns, GenerationConfig.validate() 1.1) */
    return 0;
}

static int read_positive(const json_t *obj, const char *key, const char *what, int *out,
                         g4_error *err) {
    int64_t v;
    if (g4_json_int(obj, key, -1, &v, what, err)) return -1;
    if (v == -1 && !g4_json_present(obj, key)) {
        *out = -1;
        return 0;
    }
    if (v <= 0 || v > INT32_MAX)
        return g4_fail(err, "%s: \"%s\" must be a positive integer, got %lld", what, key, (long long)v);
    *out = (int)v;
    return 0;
}

/* Fields transformers 5.17 acts on that are not implemented here (generation/utils.py
 * GenerationMixin._get_logits_processor and _get_stopping_criteria, GenerationConfig.get_generation_mode): a value
 * that would change what transformers generates is a warning naming it, never silently different output. */
enum { IGN_POSITIVE, IGN_ABOVE_ONE, IGN_SET, IGN_NONEMPTY, IGN_NOT_ONE, IGN_OPEN01, IGN_TRUE };
static const struct {
    const char *key, *what;
    int kind, sampling_only;
} ignored_fields[] = {
    {"min_length", "MinLengthLogitsProcessor: no eos before that length", IGN_POSITIVE, 0},
    {"min_new_tokens", "MinNewTokensLengthLogitsProcessor: no eos before that many new tokens", IGN_POSITIVE, 0},
    {"no_repeat_ngram_size", "NoRepeatNGramLogitsProcessor", IGN_POSITIVE, 0},
    {"encoder_no_repeat_ngram_size", "EncoderNoRepeatNGramLogitsProcessor over the prompt", IGN_POSITIVE, 0},
    {"encoder_repetition_penalty", "EncoderRepetitionPenaltyLogitsProcessor over the prompt", IGN_NOT_ONE, 0},
    {"bad_words_ids", "NoBadWordsLogitsProcessor", IGN_SET, 0},
    {"sequence_bias", "SequenceBiasLogitsProcessor", IGN_SET, 0},
    {"begin_suppress_tokens", "SuppressTokensAtBeginLogitsProcessor at the first new token", IGN_NONEMPTY, 0},
    {"forced_bos_token_id", "ForcedBOSTokenLogitsProcessor", IGN_SET, 0},
    {"forced_eos_token_id", "ForcedEOSTokenLogitsProcessor at max_length", IGN_SET, 0},
    {"exponential_decay_length_penalty", "ExponentialDecayLengthPenalty", IGN_SET, 0},
    {"remove_invalid_values", "InfNanRemoveLogitsProcessor (here NaN logits count as -inf)", IGN_TRUE, 0},
    {"guidance_scale", "classifier-free guidance", IGN_NOT_ONE, 0},
    {"watermarking_config", "a watermark processor", IGN_SET, 0},
    {"stop_strings", "StopStringCriteria (give them as stop strings here)", IGN_NONEMPTY, 0},
    {"max_time", "MaxTimeCriteria", IGN_SET, 0},
    {"num_beams", "beam search", IGN_ABOVE_ONE, 0},
    {"dola_layers", "DoLa decoding", IGN_SET, 0},
    {"token_healing", "token healing", IGN_TRUE, 0},
    {"typical_p", "TypicalLogitsWarper", IGN_OPEN01, 1},
    {"epsilon_cutoff", "EpsilonLogitsWarper", IGN_OPEN01, 1},
    {"eta_cutoff", "EtaLogitsWarper", IGN_OPEN01, 1},
    {"top_h", "TopHLogitsWarper", IGN_SET, 1},
};

static void warn_ignored(const json_t *root, const char *path, int do_sample, g4_generation_config *c) {
    for (size_t i = 0; i < sizeof ignored_fields / sizeof ignored_fields[0]; i++) {
        const json_t *v = json_object_get(root, ignored_fields[i].key);
        if (!v || json_is_null(v) || (ignored_fields[i].sampling_only && !do_sample)) continue;
        const double x = json_is_number(v) ? json_number_value(v) : NAN;
        int acts;
        switch (ignored_fields[i].kind) {
        case IGN_POSITIVE: acts = !json_is_number(v) || x > 0; break;
        case IGN_ABOVE_ONE: acts = !json_is_number(v) || x > 1; break;
        case IGN_NONEMPTY: acts = !json_is_array(v) || json_array_size(v) > 0; break;
        case IGN_NOT_ONE: acts = !json_is_number(v) || x != 1.0; break;
        case IGN_OPEN01: acts = !json_is_number(v) || (x > 0 && x < 1); break;
        case IGN_TRUE: acts = !json_is_false(v); break;
        default: acts = 1; break;
        }
        if (!acts) continue;
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        g4_warn(&c->warnings, "%s: \"%s\" %.60s%s is not supported and is ignored (transformers applies %s)", path,
                ignored_fields[i].key, text ? text : "?", text && strlen(text) > 60 ? "..." : "", ignored_fields[i].what);
        free(text);
    }
    /* contrastive search (GenerationConfig.get_generation_mode: greedy, top_k > 1 and penalty_alpha > 0) */
    const json_t *alpha = json_object_get(root, "penalty_alpha");
    if (!do_sample && json_is_number(alpha) && json_number_value(alpha) > 0 && c->sampling.top_k > 1)
        g4_warn(&c->warnings,
                "%s: \"penalty_alpha\" %g asks for contrastive search, which is not supported: decoding greedily",
                path, json_number_value(alpha));
}

static int read_generation_file(const char *path, g4_generation_config *c, int *has_eos,
                                g4_error *err) {
    json_t *root;
    if (g4_json_load_file(path, &root, err)) return -1;
    int rc = -1;
    if (!json_is_object(root)) {
        g4_fail(err, "%s: the top level must be a JSON object", path);
        goto done;
    }
    int do_sample;
    double temperature, top_p, min_p, rep;
    int64_t top_k;
    if (g4_json_bool(root, "do_sample", 0, &do_sample, path, err)) goto done;
    if (g4_json_num(root, "temperature", 1.0, &temperature, path, err)) goto done;
    if (g4_json_int(root, "top_k", G4_HF_DEFAULT_TOP_K, &top_k, path, err)) goto done;
    if (g4_json_num(root, "top_p", 1.0, &top_p, path, err)) goto done;
    if (g4_json_num(root, "min_p", 0.0, &min_p, path, err)) goto done;
    if (g4_json_num(root, "repetition_penalty", 1.0, &rep, path, err)) goto done;
    /* transformers takes the JSON types as they are (GenerationConfig.__init__ stores them unconverted) and its
     * processors check them when generate() builds them (generation/logits_process.py):
     * TemperatureLogitsWarper (built with do_sample when temperature != 1.0) and RepetitionPenaltyLogitsProcessor
     * (built when repetition_penalty != 1.0) refuse anything but a Python float, TopKLogitsWarper (do_sample,
     * top_k != 0) anything but an int; TopPLogitsWarper converts with float(), MinPLogitsWarper checks the range
     * only. So "temperature": 1 and "top_k": 64 pass, "temperature": 2, "repetition_penalty": 2 and "top_k": 64.0
     * fail there, when generating. Here they are warnings and their numbers are used: the model still loads (its
     * tokenizer and template serve without them, and a request's own values override them). */
    const json_t *jt = json_object_get(root, "temperature"), *jk = json_object_get(root, "top_k"),
                 *jr = json_object_get(root, "repetition_penalty");
    if (do_sample && json_is_integer(jt) && temperature != 1.0 && temperature > 0)
        g4_warn(&c->warnings,
                "%s: \"temperature\" %g is an integer, which transformers' TemperatureLogitsWarper refuses (write "
                "%g.0); taken as %g", path, temperature, temperature, temperature);
    if (do_sample && json_is_real(jk) && top_k != 0)
        g4_warn(&c->warnings,
                "%s: \"top_k\" %g is not an integer, which transformers' TopKLogitsWarper refuses (write %lld); "
                "taken as %lld", path, json_real_value(jk), (long long)top_k, (long long)top_k);
    if (json_is_integer(jr) && rep != 1.0 && rep > 0)
        g4_warn(&c->warnings,
                "%s: \"repetition_penalty\" %g is an integer, which transformers' RepetitionPenaltyLogitsProcessor "
                "refuses (write %g.0); taken as %g", path, rep, rep, rep);
    /* temperature, top_k, top_p and min_p only act when sampling: with do_sample false transformers lets any value
     * pass (GenerationConfig.validate() 2.1 lists them as "minor issues", a warning) and decodes greedily, so
     * there an out-of-range one is ignored (its default kept for a sampling override) rather than refuse the model;
     * with do_sample true its logits warpers refuse it (TemperatureLogitsWarper: > 0 (0 is greedy here),
     * TopKLogitsWarper: > 0 or 0 = off, TopPLogitsWarper: [0, 1], MinPLogitsWarper: [0, 1]). */
    if (!isfinite(temperature) || temperature < 0) {
        if (do_sample) {
            g4_fail(err, "%s: \"temperature\" must be >= 0, got %g", path, temperature);
            goto done;
        }
        temperature = 1.0;
    }
    if (top_k < 0 || top_k > INT32_MAX) {
        if (do_sample) {
            g4_fail(err, "%s: \"top_k\" must be >= 0, got %lld", path, (long long)top_k);
            goto done;
        }
        top_k = G4_HF_DEFAULT_TOP_K;
    }
    if (!(top_p >= 0.0 && top_p <= 1.0)) {
        if (do_sample) {
            g4_fail(err, "%s: \"top_p\" must be in [0, 1], got %g", path, top_p);
            goto done;
        }
        top_p = 1.0;
    }
    if (top_p == 0.0) { /* TopPLogitsWarper keeps min_tokens_to_keep = 1 token: the most likely one, as top_k 1 */
        top_p = 1.0;
        top_k = 1;
    }
    if (!(min_p >= 0.0 && min_p <= 1.0)) {
        if (do_sample) {
            g4_fail(err, "%s: \"min_p\" must be in [0, 1], got %g", path, min_p);
            goto done;
        }
        min_p = 0.0;
    }
    if (!isfinite(rep) || !(rep > 0.0)) {
        g4_fail(err, "%s: \"repetition_penalty\" must be > 0, got %g", path, rep);
        goto done;
    }
    if (do_sample && temperature == 0.0) /* transformers raises: TemperatureLogitsWarper wants a temperature > 0 */
        g4_warn(&c->warnings,
                "%s: \"do_sample\" true with \"temperature\" 0 makes transformers refuse to generate (its "
                "TemperatureLogitsWarper needs a temperature > 0); decoding greedily", path);
    c->do_sample = do_sample;
    c->temperature = (float)temperature;
    c->sampling.temperature = do_sample ? (float)temperature : 0.0f;
    c->sampling.top_k = (int)top_k;
    c->sampling.top_p = (float)top_p;
    c->sampling.min_p = (float)min_p;
    c->sampling.repetition_penalty = (float)rep;

    const json_t *sup = json_object_get(root, "suppress_tokens");
    if (sup && !json_is_null(sup)) {
        if (!json_is_array(sup)) {
            g4_fail(err, "%s: \"suppress_tokens\" must be a list of integers", path);
            goto done;
        }
        size_t n = json_array_size(sup);
        if (n > 0) {
            c->suppress_ids = malloc(n * sizeof *c->suppress_ids);
            if (!c->suppress_ids) {
                g4_fail(err, "%s: out of memory", path);
                goto done;
            }
        }
        size_t i;
        const json_t *e;
        json_array_foreach(sup, i, e) {
            json_int_t id = json_is_integer(e) ? json_integer_value(e) : -1;
            if (!json_is_integer(e) || id < 0 || id > INT32_MAX) {
                g4_fail(err, "%s: \"suppress_tokens\"[%zu] must be a token id (an integer >= 0)", path, i);
                goto done;
            }
            c->suppress_ids[c->n_suppress++] = (int32_t)id;
        }
    }

    int r = read_eos(root, path, c, err);
    if (r < 0) goto done;
    *has_eos = r;
    if (read_optional_id(root, "pad_token_id", path, &c->pad_id, err)) goto done;
    if (read_optional_id(root, "bos_token_id", path, &c->bos_id, err)) goto done;
    if (read_positive(root, "max_new_tokens", path, &c->max_new_tokens, err)) goto done;
    if (read_positive(root, "max_length", path, &c->max_length, err)) goto done;
    warn_ignored(root, path, do_sample, c);
    rc = 0;
done:
    json_decref(root);
    return rc;
}

static int read_config_eos(const char *path, g4_generation_config *c, g4_error *err) {
    json_t *root;
    if (g4_json_load_file(path, &root, err)) return -1;
    int rc = -1;
    if (!json_is_object(root)) {
        g4_fail(err, "%s: the top level must be a JSON object", path);
        goto done;
    }
    int r = read_eos(root, path, c, err);
    if (r < 0) goto done;
    if (r == 0) {
        const json_t *text = json_object_get(root, "text_config");
        if (text && json_is_object(text) && read_eos(text, path, c, err) < 0) goto done;
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

int g4_generation_config_load_files(const char *gen_path, const char *config_path,
                                    g4_generation_config *out, g4_error *err) {
    set_defaults(out);
    int has_eos = 0;
    if (gen_path && g4_file_exists(gen_path)) {
        if (read_generation_file(gen_path, out, &has_eos, err)) {
            g4_generation_config_free(out);
            return -1;
        }
        out->from_file = 1;
    }
    if (!has_eos && config_path && g4_file_exists(config_path)) {
        if (read_config_eos(config_path, out, err)) {
            g4_generation_config_free(out);
            return -1;
        }
    }
    out->sampling.suppress_ids = out->suppress_ids;
    out->sampling.n_suppress = out->n_suppress;
    return 0;
}

int g4_generation_config_load(const char *model_dir, g4_generation_config *out, g4_error *err) {
    char gen[4096], cfg[4096];
    if (g4_path_join(gen, sizeof gen, model_dir, "generation_config.json", err) ||
        g4_path_join(cfg, sizeof cfg, model_dir, "config.json", err)) {
        set_defaults(out);
        return -1;
    }
    return g4_generation_config_load_files(gen, cfg, out, err);
}

void g4_generation_config_free(g4_generation_config *c) {
    if (!c) return;
    free(c->warnings);
    c->warnings = NULL;
    free(c->suppress_ids);
    c->suppress_ids = NULL;
    c->n_suppress = 0;
    c->sampling.suppress_ids = NULL;
    c->sampling.n_suppress = 0;
}

int g4_generation_config_is_eos(const g4_generation_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}

int g4_generation_config_max_new(const g4_generation_config *c, int prompt_len) {
    if (c->max_new_tokens > 0) return c->max_new_tokens;
    if (c->max_length > 0) return c->max_length > prompt_len ? c->max_length - prompt_len : 0;
    return -1;
}
