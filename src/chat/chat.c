/* Chat template loading and rendering (chat.h). */
#include "chat/chat.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "jinja/jinja.h"
#include "tokenizer/tokenizer.h"

struct g4_chat_template {
    g4_jinja *tpl;
    json_t *tokens; /* object: variable name -> token string (bos_token, eos_token, ...) */
};

/* ------------------------------------------------------------------ loading */

static int make_template(const char *source, size_t len, json_t *tokens, g4_chat_template **out,
                         g4_error *err) {
    *out = NULL;
    g4_chat_template *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(tokens);
        return g4_fail(err, "chat template: out of memory");
    }
    t->tokens = tokens;
    if (g4_jinja_parse(source, len, &t->tpl, err)) {
        g4_chat_template_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

static json_t *token_object(const char *bos, const char *eos) {
    json_t *o = json_object();
    if (!o) return NULL;
    if (bos) json_object_set_new(o, "bos_token", json_string(bos));
    if (eos) json_object_set_new(o, "eos_token", json_string(eos));
    return o;
}

int g4_chat_template_load_string(const char *source, size_t len, const char *bos_token,
                                 const char *eos_token, g4_chat_template **out, g4_error *err) {
    json_t *tokens = token_object(bos_token, eos_token);
    if (!tokens) return g4_fail(err, "chat template: out of memory");
    return make_template(source, len, tokens, out, err);
}

int g4_chat_template_load_file(const char *jinja_path, const char *bos_token,
                               const char *eos_token, g4_chat_template **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(jinja_path, err);
    char *src;
    size_t len;
    if (g4_read_file(jinja_path, &src, &len, err)) return -1;
    int rc = g4_chat_template_load_string(src, len, bos_token, eos_token, out, err);
    free(src);
    if (rc) g4_fail_prefix(err, "%s", jinja_path);
    return rc;
}

/* A special token in tokenizer_config.json: "<bos>" or {"content": "<bos>", ...}. */
static const char *token_string(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Every "*_token" entry of tokenizer_config.json becomes a template variable, as in HF's
 * special_tokens_map; the special tokens it leaves out (or a folder without the file) take GemmaTokenizer's
 * defaults, as transformers builds that class for a gemma4 config (tokenization_gemma.py: bos_token "<bos>", ...). */
static json_t *tokens_from_config(const json_t *config) {
    static const char *const defaults[][2] = {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"unk_token", "<unk>"},
                                              {"pad_token", "<pad>"}, {"mask_token", "<mask>"}};
    json_t *tokens = json_object();
    if (!tokens) return NULL;
    const char *key;
    json_t *val;
    if (config)
        json_object_foreach((json_t *)config, key, val) {
            const char *s = token_string(val);
            if (s && ends_with(key, "_token")) json_object_set_new(tokens, key, json_string(s));
        }
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (!config || !json_object_get(config, defaults[i][0]))
            json_object_set_new(tokens, defaults[i][0], json_string(defaults[i][1]));
    return tokens;
}

static int load_config(const char *path, json_t **config, g4_error *err) {
    if (g4_json_load_file(path, config, err)) return -1;
    if (!json_is_object(*config)) {
        json_decref(*config);
        *config = NULL;
        return g4_fail(err, "%s: not a JSON object", path);
    }
    return 0;
}

int g4_chat_template_load_file_config(const char *jinja_path, const char *tokenizer_config,
                                      g4_chat_template **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(jinja_path, err);
    G4_ARG(tokenizer_config, err);
    json_t *config = NULL;
    if (load_config(tokenizer_config, &config, err)) return -1;
    json_t *tokens = tokens_from_config(config);
    json_decref(config);
    if (!tokens) return g4_fail(err, "chat template: out of memory");
    char *src;
    size_t len;
    if (g4_read_file(jinja_path, &src, &len, err)) {
        json_decref(tokens);
        return -1;
    }
    int rc = make_template(src, len, tokens, out, err);
    free(src);
    if (rc) g4_fail_prefix(err, "%s", jinja_path);
    return rc;
}

/* optional: a folder without any template gives 0 and *out NULL */
static int load_dir(const char *model_dir, int optional, g4_chat_template **out, char **why, g4_error *err) {
    *out = NULL;
    int broken = 0; /* a template is there but cannot be used: `why`, when optional */
    char path[4096];
    json_t *config = NULL;
    if (g4_path_join(path, sizeof path, model_dir, "tokenizer_config.json", err)) return -1;
    if (g4_file_exists(path) && load_config(path, &config, err)) return -1;
    json_t *tokens = tokens_from_config(config);
    if (!tokens) {
        json_decref(config);
        return g4_fail(err, "chat template: out of memory");
    }

    char *src = NULL;
    size_t len = 0;
    int rc = -1;
    if (g4_path_join(path, sizeof path, model_dir, "chat_template.jinja", err)) goto done;
    if (g4_file_exists(path)) {
        if (g4_read_file(path, &src, &len, err)) goto done;
    } else {
        const json_t *ct = config ? json_object_get(config, "chat_template") : NULL;
        if (json_is_null(ct)) ct = NULL; /* "chat_template": null is no template (tokenizer_config.json as saved
                                          * by a tokenizer without one) */
        if (json_is_array(ct)) { /* [{name, template}, ...]: the default one */
            const json_t *found = NULL;
            size_t i;
            const json_t *item;
            json_array_foreach(ct, i, item) {
                const json_t *name = json_object_get(item, "name");
                if (json_is_string(name) && !strcmp(json_string_value(name), "default"))
                    found = json_object_get(item, "template");
            }
            if (!json_is_string(found)) {
                g4_fail(err, "%s/tokenizer_config.json: chat_template list has no \"default\" entry",
                        model_dir);
                broken = 1;
                goto done;
            }
            ct = found;
        }
        if (!ct) { /* processor-style chat_template.json */
            json_t *pj = NULL;
            if (g4_path_join(path, sizeof path, model_dir, "chat_template.json", err)) goto done;
            if (g4_file_exists(path)) {
                if (g4_json_load_file(path, &pj, err)) goto done;
                const json_t *c = json_object_get(pj, "chat_template");
                if (json_is_string(c)) {
                    len = json_string_length(c);
                    src = malloc(len + 1);
                    if (src) memcpy(src, json_string_value(c), len + 1);
                }
                json_decref(pj);
            }
            if (!src) {
                if (optional) {
                    rc = 0;
                    goto done;
                }
                g4_fail(err, "%s: no chat template (chat_template.jinja, \"chat_template\" in "
                             "tokenizer_config.json, or chat_template.json)",
                        model_dir);
                goto done;
            }
        } else {
            if (!json_is_string(ct)) {
                g4_fail(err, "%s/tokenizer_config.json: \"chat_template\" must be a string",
                        model_dir);
                broken = 1;
                goto done;
            }
            len = json_string_length(ct);
            src = malloc(len + 1);
            if (!src) {
                g4_fail(err, "chat template: out of memory");
                goto done;
            }
            memcpy(src, json_string_value(ct), len + 1);
        }
    }
    rc = make_template(src, len, tokens, out, err);
    tokens = NULL;
    if (rc) g4_fail_prefix(err, "%s chat template", model_dir);
    broken = rc != 0;
done:
    /* transformers reads a tokenizer's chat template only in apply_chat_template: one that cannot be used fails
     * there, not the loading of the tokenizer (or model); the reason is kept for the commands that render chats */
    if (rc && optional && broken && why) {
        *why = strdup(err->msg);
        rc = 0;
    }
    free(src);
    json_decref(tokens);
    json_decref(config);
    return rc;
}

int g4_chat_template_from_gguf(const json_t *meta, const g4_tokenizer *tok, const char *path, g4_chat_template **out,
                               g4_error *err) {
    *out = NULL;
    const char *tpl = json_string_value(json_object_get(meta, "tokenizer.chat_template"));
    if (!tpl) return 0;
    const int32_t b = g4_tokenizer_bos_id(tok), e = g4_tokenizer_eos_id(tok);
    if (g4_chat_template_load_string(tpl, strlen(tpl), b >= 0 ? g4_tokenizer_piece(tok, b) : NULL,
                                     e >= 0 ? g4_tokenizer_piece(tok, e) : NULL, out, err))
        return g4_fail_prefix(err, "%s: tokenizer.chat_template", path);
    return 0;
}

/* A GGUF file's template, as g4_model_load takes it (its own tokenizer's bos / eos strings). */
static int load_gguf(const char *path, g4_chat_template **out, g4_error *err) {
    g4_gguf g;
    if (g4_gguf_open(path, &g, err)) return -1;
    g4_tokenizer *tok = NULL;
    int rc = json_object_get(g.meta, "tokenizer.ggml.tokens") ? g4_tokenizer_load_gguf(path, g.meta, &tok, err) : 0;
    if (!rc) rc = g4_chat_template_from_gguf(g.meta, tok, path, out, err);
    if (!rc && !*out) rc = g4_fail(err, "%s: the file has no chat template (tokenizer.chat_template)", path);
    g4_tokenizer_free(tok);
    g4_gguf_free(&g);
    return rc;
}

int g4_chat_template_load_dir(const char *model_dir, g4_chat_template **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(model_dir, err);
    if (g4_gguf_is_file(model_dir)) return load_gguf(model_dir, out, err);
    return load_dir(model_dir, 0, out, NULL, err);
}

int g4_chat_template_find(const char *model_dir, g4_chat_template **out, char **why, g4_error *err) {
    if (why) *why = NULL;
    return load_dir(model_dir, 1, out, why, err);
}

void g4_chat_template_free(g4_chat_template *t) {
    if (!t) return;
    g4_jinja_free(t->tpl);
    json_decref(t->tokens);
    free(t);
}

const char *g4_chat_template_bos(const g4_chat_template *t) {
    return json_string_value(json_object_get(t->tokens, "bos_token"));
}

const char *g4_chat_template_eos(const g4_chat_template *t) {
    return json_string_value(json_object_get(t->tokens, "eos_token"));
}

/* ---------------------------------------------------------------- rendering */

int g4_chat_template_render(const g4_chat_template *t, const json_t *messages, const g4_chat_options *opt,
                            char **out, size_t *len, g4_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!json_is_array(messages)) return g4_fail(err, "chat: \"messages\" must be a JSON array");
    g4_chat_options none = {NULL, 0, -1, NULL, NULL};
    if (!opt) opt = &none;
    if (opt->tools && !json_is_array(opt->tools) && !json_is_null(opt->tools))
        return g4_fail(err, "chat: \"tools\" must be a JSON array");
    if (opt->extra_vars && !json_is_object(opt->extra_vars))
        return g4_fail(err, "chat: extra template variables must be a JSON object");
    json_t *ctx = json_object();
    if (!ctx) return g4_fail(err, "chat: out of memory");
    /* the order of apply_chat_template's render(): messages, tools, documents,
     * add_generation_prompt, then the special tokens and the caller's keyword arguments */
    int bad = json_object_set(ctx, "messages", (json_t *)messages);
    bad |= json_object_set_new(ctx, "tools", opt->tools ? json_incref((json_t *)opt->tools) : json_null());
    bad |= json_object_set_new(ctx, "documents", json_null());
    bad |= json_object_set_new(ctx, "add_generation_prompt", json_boolean(opt->add_generation_prompt));
    bad |= json_object_update(ctx, t->tokens);
    if (opt->enable_thinking >= 0)
        bad |= json_object_set_new(ctx, "enable_thinking", json_boolean(opt->enable_thinking));
    if (opt->extra_vars) bad |= json_object_update(ctx, (json_t *)opt->extra_vars);
    if (bad) {
        json_decref(ctx);
        return g4_fail(err, "chat: out of memory");
    }
    int rc = g4_jinja_render_ex(t->tpl, ctx, opt->limits, out, len, err);
    json_decref(ctx);
    return rc;
}
