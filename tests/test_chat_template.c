/* Chat rendering against Hugging Face: every case of tokenizer/fixtures/public/chat.jsonl is
 * rendered with the template it names and compared byte for byte with transformers' text.
 * Also: loading a model folder's template (chat_template.jinja, or "chat_template" in
 * tokenizer_config.json as a string or a named list). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/mapped_file.h"
#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

#define MAX_TEMPLATES 16

static struct {
    char name[128];
    g4_chat_template *t;
} cache[MAX_TEMPLATES];
static int ncache = 0;
static const char *bos, *eos;

static g4_chat_template *template_named(const char *name) {
    for (int i = 0; i < ncache; i++)
        if (!strcmp(cache[i].name, name)) return cache[i].t;
    if (ncache == MAX_TEMPLATES || strlen(name) >= sizeof cache[0].name || strchr(name, '/'))
        return NULL;
    char rel[256];
    snprintf(rel, sizeof rel, "chat_templates/%s.jinja", name);
    g4_error err = {{0}};
    g4_chat_template *t = NULL;
    if (g4_chat_template_load_file(g4t_shared(rel), bos, eos, &t, &err)) {
        fprintf(stderr, "load %s: %s\n", name, err.msg);
        return NULL;
    }
    snprintf(cache[ncache].name, sizeof cache[0].name, "%s", name);
    cache[ncache++].t = t;
    return t;
}

/* Shows where two texts first differ. */
static void show_diff(const char *want, const char *got, size_t got_len) {
    size_t i = 0, wl = strlen(want);
    while (i < wl && i < got_len && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  want: ...%.80s\n  got:  ...%.80s\n", i,
            want + from, got + from);
}

static void test_fixtures(void) {
    json_error_t je;
    json_t *config = json_load_file(g4t_shared("tokenizer/tokenizer_config.json"), 0, &je);
    CHECKF(config != NULL, "tokenizer_config.json: %s", je.text);
    if (!config) return;
    bos = json_string_value(json_object_get(config, "bos_token"));
    eos = json_string_value(json_object_get(config, "eos_token"));
    CHECK(bos && eos);

    FILE *f = fopen(g4t_shared("tokenizer/fixtures/public/chat.jsonl"), "r");
    CHECKF(f != NULL, "cannot open chat.jsonl");
    if (!f) {
        json_decref(config);
        return;
    }
    /* the rendered text, encoded without added special tokens, must give the fixture's ids */
    g4_tokenizer *tok = NULL;
    g4_error terr;
    CHECKF(g4_tokenizer_load(g4t_shared("tokenizer/tokenizer.json"), &tok, &terr) == 0, "tokenizer: %s", terr.msg);
    char *line = NULL;
    size_t cap = 0;
    int n = 0, passed = 0, ids_passed = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *c = json_loads(line, 0, &je);
        CHECKF(c != NULL, "chat.jsonl line %d: %s", n + 1, je.text);
        if (!c) continue;
        n++;
        const char *name = json_string_value(json_object_get(c, "template"));
        const char *want = json_string_value(json_object_get(c, "text"));
        g4_chat_template *t = name ? template_named(name) : NULL;
        CHECKF(t != NULL && want != NULL, "case %d: template %s", n, name ? name : "(none)");
        if (!t || !want) {
            json_decref(c);
            continue;
        }
        const json_t *et = json_object_get(c, "enable_thinking");
        const json_t *agp = json_object_get(c, "add_generation_prompt");
        const json_t *tools = json_object_get(c, "tools");
        g4_chat_options opt = {
            .tools = json_is_array(tools) ? tools : NULL,
            .add_generation_prompt = json_is_true(agp),
            .enable_thinking = json_is_boolean(et) ? json_is_true(et) : -1,
        };
        char *got = NULL;
        size_t got_len = 0;
        g4_error err = {{0}};
        int rc = g4_chat_template_render(t, json_object_get(c, "messages"), &opt, &got, &got_len, &err);
        CHECKF(rc == 0, "case %d (%s): %s", n, name, err.msg);
        if (rc == 0) {
            int same = got_len == strlen(want) && memcmp(got, want, got_len) == 0;
            CHECKF(same, "case %d (%s): rendered text differs", n, name);
            if (!same) show_diff(want, got, got_len);
            passed += same;
            const json_t *want_ids = json_object_get(c, "ids");
            g4_tokens toks = {0};
            if (tok && json_is_array(want_ids) && g4_tokenize(tok, got, got_len, 0, &toks, &err) == 0) {
                int ids_same = toks.n == json_array_size(want_ids);
                for (size_t i = 0; ids_same && i < toks.n; i++)
                    ids_same = toks.ids[i] == json_integer_value(json_array_get(want_ids, i));
                CHECKF(ids_same, "case %d (%s): token ids differ (%zu ids, expected %zu)", n, name, toks.n,
                       json_array_size(want_ids));
                ids_passed += ids_same;
            } else {
                CHECKF(0, "case %d (%s): no ids to compare (%s)", n, name, tok ? err.msg : "no tokenizer");
            }
            free(toks.ids);
        }
        free(got);
        json_decref(c);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "chat.jsonl: %d of %d cases match transformers byte for byte, %d of %d in token ids\n", passed, n,
            ids_passed, n);
    if (tok) g4_tokenizer_free(tok);
    CHECKF(n >= 51, "expected at least 51 fixture cases, found %d", n);
    /* keep bos/eos alive until every template is loaded */
    for (int i = 0; i < ncache; i++) g4_chat_template_free(cache[i].t);
    ncache = 0;
    json_decref(config);
}

static int write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* A model folder: the template from chat_template.jinja, tokens from tokenizer_config.json,
 * compared with the first fixture case of the E2B template. */
static void test_load_dir(void) {
    char *tpl_src = NULL, *cfg_src = NULL;
    size_t tpl_len = 0, cfg_len = 0;
    g4_error err = {{0}};
    CHECK(g4_read_file(g4t_shared("chat_templates/gemma-4-e2b-it.release.jinja"), &tpl_src,
                       &tpl_len, &err) == 0);
    CHECK(g4_read_file(g4t_shared("tokenizer/tokenizer_config.json"), &cfg_src, &cfg_len, &err) == 0);
    if (!tpl_src || !cfg_src) {
        free(tpl_src);
        free(cfg_src);
        return;
    }
    json_error_t je;
    json_t *cfg = json_loadb(cfg_src, cfg_len, 0, &je);
    CHECK(cfg != NULL);

    /* the reference: the first e2b fixture case */
    json_t *ref = NULL;
    FILE *f = fopen(g4t_shared("tokenizer/fixtures/public/chat.jsonl"), "r");
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        json_t *c = json_loads(line, 0, &je);
        const char *name = c ? json_string_value(json_object_get(c, "template")) : NULL;
        if (name && !strcmp(name, "gemma-4-e2b-it.release") &&
            json_is_false(json_object_get(c, "enable_thinking")) &&
            !json_is_array(json_object_get(c, "tools"))) {
            ref = c;
            break;
        }
        json_decref(c);
    }
    free(line);
    if (f) fclose(f);
    CHECK(ref != NULL);

    const char *dir = g4t_tmp("chat_dir_a");
    mkdir(dir, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    CHECK(write_file(path, tpl_src, tpl_len) == 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(write_file(path, cfg_src, cfg_len) == 0);

    /* the same template inside tokenizer_config.json: as a string, then as a named list */
    const char *dir_b = g4t_tmp("chat_dir_b");
    const char *dir_c = g4t_tmp("chat_dir_c");
    mkdir(dir_b, 0755);
    mkdir(dir_c, 0755);
    json_t *cfg_b = json_deep_copy(cfg);
    json_object_set_new(cfg_b, "chat_template", json_stringn(tpl_src, tpl_len));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir_b);
    CHECK(json_dump_file(cfg_b, path, 0) == 0);
    json_t *cfg_c = json_deep_copy(cfg);
    json_t *list = json_array();
    json_t *other = json_object();
    json_object_set_new(other, "name", json_string("tool_use"));
    json_object_set_new(other, "template", json_string("WRONG"));
    json_array_append_new(list, other);
    json_t *def = json_object();
    json_object_set_new(def, "name", json_string("default"));
    json_object_set_new(def, "template", json_stringn(tpl_src, tpl_len));
    json_array_append_new(list, def);
    json_object_set_new(cfg_c, "chat_template", list);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir_c);
    CHECK(json_dump_file(cfg_c, path, 0) == 0);

    /* chat_template.jinja without tokenizer_config.json: GemmaTokenizer's default special tokens (<bos>, <eos>),
     * as transformers builds that class for a gemma4 folder; the prompt still starts with <bos> */
    const char *dir_e = g4t_tmp("chat_dir_e");
    mkdir(dir_e, 0755);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir_e);
    unlink(path);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir_e);
    CHECK(write_file(path, tpl_src, tpl_len) == 0);

    const char *dirs[] = {dir, dir_b, dir_c, dir_e};
    for (int k = 0; k < 4 && ref; k++) {
        g4_chat_template *t = NULL;
        int rc = g4_chat_template_load_dir(dirs[k], &t, &err);
        CHECKF(rc == 0, "load_dir %s: %s", dirs[k], err.msg);
        if (rc) continue;
        CHECK(g4_chat_template_bos(t) && !strcmp(g4_chat_template_bos(t), "<bos>"));
        CHECK(g4_chat_template_eos(t) && !strcmp(g4_chat_template_eos(t), "<eos>"));
        g4_chat_options opt = {NULL, 1, 0, NULL, NULL};
        char *got = NULL;
        size_t got_len;
        rc = g4_chat_template_render(t, json_object_get(ref, "messages"), &opt, &got, &got_len, &err);
        CHECKF(rc == 0, "render: %s", err.msg);
        const char *want = json_string_value(json_object_get(ref, "text"));
        CHECKF(rc == 0 && want && !strcmp(got, want), "load_dir variant %d renders differently", k);
        free(got);
        g4_chat_template_free(t);
    }

    /* a folder without any template: a clear error */
    const char *dir_d = g4t_tmp("chat_dir_d");
    mkdir(dir_d, 0755);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir_d);
    unlink(path); /* left by an earlier run */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir_d);
    CHECK(write_file(path, "{\"bos_token\": \"<bos>\"}", 22) == 0);
    g4_chat_template *t = NULL;
    err.msg[0] = 0;
    CHECK(g4_chat_template_load_dir(dir_d, &t, &err) == -1 && t == NULL);
    CHECKF(strstr(err.msg, "no chat template") != NULL, "message: %s", err.msg);
    /* "chat_template": null is no template, as transformers reads it (the tokenizer's chat_template None): the
     * model still loads (g4_chat_template_find) and a chat_template.json beside it is used; it was refused with
     * '"chat_template" must be a string', and so was the whole model, even for generate --ids */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir_d);
    CHECK(write_file(path, "{\"chat_template\": null}", 23) == 0);
    err.msg[0] = 0;
    CHECK(g4_chat_template_load_dir(dir_d, &t, &err) == -1 && t == NULL);
    CHECKF(strstr(err.msg, "no chat template") != NULL, "null: %s", err.msg);
    char *why = NULL;
    CHECKF(g4_chat_template_find(dir_d, &t, &why, &err) == 0 && t == NULL && !why, "find, null: %s", err.msg);
    snprintf(path, sizeof path, "%s/chat_template.json", dir_d);
    CHECK(write_file(path, "{\"chat_template\": \"T{{ bos_token }}\"}", 37) == 0);
    CHECKF(g4_chat_template_load_dir(dir_d, &t, &err) == 0 && t, "null, chat_template.json: %s", err.msg);
    g4_chat_template_free(t);
    t = NULL;
    unlink(path);
    /* a broken template: the error names the line */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir_d);
    CHECK(write_file(path, "ok\n{% if x %}\n{{ x }", 21) == 0);
    err.msg[0] = 0;
    CHECK(g4_chat_template_load_dir(dir_d, &t, &err) == -1 && t == NULL);
    CHECKF(strstr(err.msg, "line 3") != NULL, "message: %s", err.msg);
    /* the model's own lookup loads it without a template and keeps why: transformers reads a tokenizer's template
     * only in apply_chat_template, so a broken one fails chats, not the loading of the tokenizer (generate --ids
     * and tokenize ran no more on such a folder) */
    CHECKF(g4_chat_template_find(dir_d, &t, &why, &err) == 0 && t == NULL && why && strstr(why, "line 3"),
           "find, broken: %s", why ? why : err.msg);
    free(why);
    why = NULL;
    remove(path);
    /* a named list without "default": transformers' get_chat_template raises only when a chat is rendered */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir_d);
    const char *named = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}]}";
    CHECK(write_file(path, named, strlen(named)) == 0);
    CHECK(g4_chat_template_load_dir(dir_d, &t, &err) == -1 && strstr(err.msg, "no \"default\" entry"));
    CHECKF(g4_chat_template_find(dir_d, &t, &why, &err) == 0 && t == NULL && why && strstr(why, "no \"default\" entry"),
           "find, no default: %s", why ? why : err.msg);
    free(why);
    /* messages must be a list */
    g4_chat_template *t2 = NULL;
    CHECK(g4_chat_template_load_string("{{ messages }}", 14, "<bos>", NULL, &t2, &err) == 0);
    if (t2) {
        char *got = NULL;
        json_t *notlist = json_object();
        CHECK(g4_chat_template_render(t2, notlist, NULL, &got, NULL, &err) == -1 && got == NULL);
        json_decref(notlist);
        g4_chat_template_free(t2);
    }

    json_decref(cfg);
    json_decref(cfg_b);
    json_decref(cfg_c);
    json_decref(ref);
    free(tpl_src);
    free(cfg_src);
}

/* The variables apply_chat_template passes: tools=None, documents=None, the special tokens,
 * enable_thinking only when given, extra keyword arguments. */
static void test_variables(void) {
    const char *src =
        "{{ tools is none }}|{{ documents is none }}|{{ enable_thinking is defined }}|"
        "{{ add_generation_prompt }}|{{ bos_token }}{{ eos_token }}|{{ custom | default('-') }}";
    g4_error err = {{0}};
    g4_chat_template *t = NULL;
    CHECK(g4_chat_template_load_string(src, strlen(src), "<bos>", "<eos>", &t, &err) == 0);
    if (!t) return;
    json_t *msgs = json_array();
    char *out = NULL;
    CHECK(g4_chat_template_render(t, msgs, NULL, &out, NULL, &err) == 0);
    CHECKF(out && !strcmp(out, "True|True|False|False|<bos><eos>|-"), "got %s", out ? out : err.msg);
    free(out);
    json_t *extra = json_pack("{s:s}", "custom", "x");
    json_t *tools = json_pack("[{s:s}]", "type", "function");
    g4_chat_options opt = {tools, 1, 1, extra, NULL};
    CHECK(g4_chat_template_render(t, msgs, &opt, &out, NULL, &err) == 0);
    CHECKF(out && !strcmp(out, "False|True|True|True|<bos><eos>|x"), "got %s", out ? out : err.msg);
    free(out);
    json_decref(extra);
    json_decref(tools);
    json_decref(msgs);
    g4_chat_template_free(t);
}

int main(void) {
    test_fixtures();
    test_load_dir();
    test_variables();
    return g4t_done();
}
