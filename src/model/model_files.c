/* What a model folder holds beside config.json and the weights: tokenizer.json (+
 * tokenizer_config.json), the chat template and generation_config.json (gemma4c.h,
 * g4_model_load). Each is optional; one that is present must load. */
#include <stdio.h>
#include <string.h>

#include "chat/chat.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

int g4_model_load_files(g4_model *m, const char *dir, g4_error *err) {
    char path[4096];
    if (g4_path_join(path, sizeof path, dir, "tokenizer.json", err)) return -1;
    if (g4_file_exists(path) && g4_tokenizer_load(path, &m->tok, err)) return -1;
    if (m->tok && g4_tokenizer_vocab_size(m->tok) > m->cfg.text.vocab_size)
        return g4_fail(err, "%s: the tokenizer has %d tokens, the model only %d", dir, g4_tokenizer_vocab_size(m->tok),
                       m->cfg.text.vocab_size);
    if (g4_generation_config_load(dir, &m->gen_config, err)) return -1;
    return g4_chat_template_find(dir, &m->chat_template, err);
}

void g4_model_free_files(g4_model *m) {
    g4_tokenizer_free(m->tok);
    g4_chat_template_free(m->chat_template);
    g4_generation_config_free(&m->gen_config);
    m->tok = NULL;
    m->chat_template = NULL;
}

const g4_tokenizer *g4_model_tokenizer(const g4_model *m) { return m->tok; }
const g4_chat_template *g4_model_chat_template(const g4_model *m) { return m->chat_template; }

void g4_model_sampler_params(const g4_model *m, g4_sampler_params *p) { *p = m->gen_config.sampling; }

int g4_model_eos_ids(const g4_model *m, const int32_t **ids) {
    *ids = m->gen_config.eos_ids;
    return m->gen_config.n_eos;
}
