/* What a model holds beside config.json and the weights: tokenizer.json (+ tokenizer_config.json), the chat
 * template and generation_config.json of a folder, or the same from a GGUF file's metadata (docs/formats.md 3.3:
 * tokenizer.ggml.*, tokenizer.chat_template; a GGUF file has no generation config: default sampling, the
 * tokenizer's eos and Gemma's end-of-turn token as stop ids, as llama.cpp takes its end-of-generation tokens, and
 * the suppressed ids of tokenizer.ggml.suppress_tokens)
 * (gemma4c.h, g4_model_load). Each is optional; one that is present must load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat/chat.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* tokenizer.ggml.suppress_tokens, where llama.cpp's converter puts generation_config.json's suppress_tokens
 * (conversion/gemma.py Gemma4UnifiedModel; llama-vocab.cpp reads an INT32 array and drops ids outside the
 * vocabulary, common/sampling.cpp sets the rest to -inf): the generation config's suppressed ids. */
static int gguf_suppress(g4_model *m, const char *path, g4_error *err) {
    const json_t *sup = json_object_get(m->gguf_meta, "tokenizer.ggml.suppress_tokens");
    if (!sup) return 0;
    if (!json_is_array(sup)) return g4_fail(err, "%s: tokenizer.ggml.suppress_tokens is not a list of token ids", path);
    int32_t *ids = malloc((json_array_size(sup) + 1) * sizeof *ids);
    if (!ids) return g4_fail(err, "out of memory");
    int n = 0;
    size_t i;
    const json_t *e;
    json_array_foreach(sup, i, e) {
        if (!json_is_integer(e)) {
            free(ids);
            return g4_fail(err, "%s: tokenizer.ggml.suppress_tokens[%zu] is not a token id", path, i);
        }
        const json_int_t id = json_integer_value(e);
        if (id >= 0 && id < m->cfg.text.vocab_size) ids[n++] = (int32_t)id;
    }
    g4_generation_config *c = &m->gen_config;
    free(c->suppress_ids);
    c->suppress_ids = ids;
    c->sampling.suppress_ids = ids;
    c->n_suppress = c->sampling.n_suppress = n;
    return 0;
}

static int gguf_files(g4_model *m, const char *path, g4_error *err) {
    if (json_object_get(m->gguf_meta, "tokenizer.ggml.tokens") &&
        g4_tokenizer_load_gguf(path, m->gguf_meta, &m->tok, err))
        return -1;
    if (g4_generation_config_load_files(NULL, NULL, &m->gen_config, err) || gguf_suppress(m, path, err)) return -1;
    if (!m->tok) return 0;
    const int32_t stops[] = {g4_tokenizer_eos_id(m->tok), g4_tokenizer_token_id(m->tok, "<turn|>")};
    for (int i = 0; i < 2; i++)
        if (stops[i] >= 0 && m->gen_config.n_eos < G4_MAX_EOS_IDS) m->gen_config.eos_ids[m->gen_config.n_eos++] = stops[i];
    return g4_chat_template_from_gguf(m->gguf_meta, m->tok, path, &m->chat_template, err);
}

int g4_model_load_files(g4_model *m, const char *dir, g4_error *err) {
    if (m->gguf_meta) {
        if (gguf_files(m, dir, err)) return -1;
    } else {
        char path[4096];
        if (g4_path_join(path, sizeof path, dir, "tokenizer.json", err)) return -1;
        if (g4_file_exists(path) && g4_tokenizer_load(path, &m->tok, err)) return -1;
        if (g4_generation_config_load(dir, &m->gen_config, err)) return -1;
        g4_warn_lines(&m->warnings, m->gen_config.warnings); /* among the model's load warnings */
        if (g4_chat_template_find(dir, &m->chat_template, &m->chat_template_error, err)) return -1;
    }
    if (m->tok && g4_tokenizer_vocab_size(m->tok) > m->cfg.text.vocab_size)
        return g4_fail(err, "%s: the tokenizer has %d tokens, the model only %d", dir, g4_tokenizer_vocab_size(m->tok),
                       m->cfg.text.vocab_size);
    return 0;
}

void g4_model_free_files(g4_model *m) {
    g4_tokenizer_free(m->tok);
    g4_chat_template_free(m->chat_template);
    g4_generation_config_free(&m->gen_config);
    free(m->chat_template_error);
    m->tok = NULL;
    m->chat_template = NULL;
    m->chat_template_error = NULL;
}

const g4_tokenizer *g4_model_tokenizer(const g4_model *m) { return m ? m->tok : NULL; }
const g4_chat_template *g4_model_chat_template(const g4_model *m) { return m ? m->chat_template : NULL; }
const char *g4_model_chat_template_error(const g4_model *m) { return m ? m->chat_template_error : NULL; }

void g4_model_sampler_params(const g4_model *m, g4_sampler_params *p) {
    if (!p) return;
    if (m) *p = m->gen_config.sampling;
    else g4_sampler_params_default(p);
}

int g4_model_eos_ids(const g4_model *m, const int32_t **ids) {
    if (ids) *ids = m ? m->gen_config.eos_ids : NULL;
    return m ? m->gen_config.n_eos : 0;
}
