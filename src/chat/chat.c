/* Chat template loading and rendering, and parsing of Gemma 4 model output. */
#include "chat/chat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "jinja/jinja.h"

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
    *out = NULL;
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
 * special_tokens_map. */
static json_t *tokens_from_config(const json_t *config) {
    json_t *tokens = json_object();
    if (!tokens || !config) return tokens;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)config, key, val) {
        const char *s = token_string(val);
        if (s && ends_with(key, "_token")) json_object_set_new(tokens, key, json_string(s));
    }
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
    *out = NULL;
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

int g4_chat_template_load_dir(const char *model_dir, g4_chat_template **out, g4_error *err) {
    *out = NULL;
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
                g4_fail(err, "%s: no chat template (chat_template.jinja, \"chat_template\" in "
                             "tokenizer_config.json, or chat_template.json)",
                        model_dir);
                goto done;
            }
        } else {
            if (!json_is_string(ct)) {
                g4_fail(err, "%s/tokenizer_config.json: \"chat_template\" must be a string",
                        model_dir);
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
done:
    free(src);
    json_decref(tokens);
    json_decref(config);
    return rc;
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

int g4_chat_render(const g4_chat_template *t, const json_t *messages, const g4_chat_options *opt,
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

int g4_chat_render_request(const g4_chat_template *t, const json_t *request, const g4_jinja_limits *limits,
                           char **out, size_t *len, g4_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!json_is_object(request)) return g4_fail(err, "a chat request must be a JSON object");
    const json_t *messages = json_object_get(request, "messages");
    const json_t *tools = json_object_get(request, "tools");
    const json_t *et = json_object_get(request, "enable_thinking");
    const json_t *agp = json_object_get(request, "add_generation_prompt");
    const json_t *kwargs = json_object_get(request, "chat_template_kwargs");
    if (!json_is_array(messages)) return g4_fail(err, "\"messages\" must be a list of messages");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return g4_fail(err, "\"tools\" must be a list or null");
    if (et && !json_is_null(et) && !json_is_boolean(et))
        return g4_fail(err, "\"enable_thinking\" must be true, false or null");
    if (agp && !json_is_null(agp) && !json_is_boolean(agp))
        return g4_fail(err, "\"add_generation_prompt\" must be true or false");
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs))
        return g4_fail(err, "\"chat_template_kwargs\" must be an object");
    g4_chat_options opt = {
        .tools = json_is_array(tools) ? tools : NULL,
        .add_generation_prompt = json_is_true(agp),
        .enable_thinking = json_is_boolean(et) ? json_is_true(et) : -1,
        .extra_vars = json_is_object(kwargs) ? kwargs : NULL,
        .limits = limits,
    };
    return g4_chat_render(t, messages, &opt, out, len, err);
}

/* ------------------------------------------------------------ output parsing */

#define QUOTE "<|\"|>"
#define QUOTE_LEN 5

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
} gparser;

static int gp_starts(const gparser *p, const char *lit) {
    size_t k = strlen(lit);
    return p->i + k <= p->n && memcmp(p->s + p->i, lit, k) == 0;
}

static void gp_ws(gparser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static const char *find_lit(const char *s, size_t n, size_t from, const char *lit) {
    size_t k = strlen(lit);
    if (from > n) return NULL;
    const char *hit = memmem(s + from, n - from, lit, k);
    return hit;
}

static json_t *gp_value(gparser *p);

/* A <|"|>-delimited string at p->i. */
static json_t *gp_string(gparser *p) {
    size_t start = p->i + QUOTE_LEN;
    const char *end = find_lit(p->s, p->n, start, QUOTE);
    if (!end) return NULL;
    size_t len = (size_t)(end - (p->s + start));
    p->i = (size_t)(end - p->s) + QUOTE_LEN;
    return json_stringn(p->s + start, len); /* NULL for invalid UTF-8 */
}

static int is_delim(char c) {
    return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static json_t *gp_word(gparser *p) {
    static const struct {
        const char *w;
        int kind;
    } words[] = {{"true", 1}, {"True", 1}, {"false", 2}, {"False", 2}, {"null", 3}, {"None", 3}};
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
        size_t l = strlen(words[k].w);
        if (gp_starts(p, words[k].w) && (p->i + l == p->n || is_delim(p->s[p->i + l]))) {
            p->i += l;
            return words[k].kind == 1 ? json_true() : words[k].kind == 2 ? json_false() : json_null();
        }
    }
    return NULL;
}

static json_t *gp_number(gparser *p) {
    size_t j = p->i;
    const char *s = p->s;
    int is_real = 0;
    if (j < p->n && (s[j] == '-' || s[j] == '+')) j++;
    size_t digits = j;
    while (j < p->n && s[j] >= '0' && s[j] <= '9') j++;
    if (j == digits) return NULL;
    if (j < p->n && s[j] == '.') {
        is_real = 1;
        j++;
        size_t f = j;
        while (j < p->n && s[j] >= '0' && s[j] <= '9') j++;
        if (j == f) return NULL;
    }
    if (j < p->n && (s[j] == 'e' || s[j] == 'E')) {
        is_real = 1;
        j++;
        if (j < p->n && (s[j] == '-' || s[j] == '+')) j++;
        size_t e = j;
        while (j < p->n && s[j] >= '0' && s[j] <= '9') j++;
        if (j == e) return NULL;
    }
    if (j < p->n && !is_delim(s[j])) return NULL;
    char tmp[64];
    if (j - p->i >= sizeof tmp) return NULL;
    memcpy(tmp, s + p->i, j - p->i);
    tmp[j - p->i] = 0;
    char *end;
    json_t *v;
    if (is_real) {
        double d = strtod(tmp, &end);
        v = json_real(d);
    } else {
        errno = 0;
        long long x = strtoll(tmp, &end, 10);
        if (errno == ERANGE) return NULL; /* beyond 64 bits */
        v = json_integer(x);
    }
    if (v) p->i = j;
    return v;
}

static json_t *gp_object(gparser *p) {
    p->i++; /* { */
    json_t *obj = json_object();
    if (!obj) return NULL;
    gp_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return obj;
    }
    while (1) {
        gp_ws(p);
        char *key = NULL;
        if (gp_starts(p, QUOTE)) {
            json_t *k = gp_string(p);
            if (!k) goto fail;
            key = strdup(json_string_value(k));
            json_decref(k);
        } else { /* bare key up to ':' */
            size_t st = p->i;
            while (p->i < p->n && p->s[p->i] != ':' && p->s[p->i] != '{' && p->s[p->i] != '}' &&
                   p->s[p->i] != '[' && p->s[p->i] != ']' && p->s[p->i] != ',' &&
                   p->s[p->i] != '<')
                p->i++;
            size_t en = p->i;
            while (en > st && (p->s[en - 1] == ' ' || p->s[en - 1] == '\n' || p->s[en - 1] == '\t'))
                en--;
            if (en == st) goto fail;
            key = strndup(p->s + st, en - st);
        }
        if (!key) goto fail;
        gp_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
            free(key);
            goto fail;
        }
        p->i++;
        gp_ws(p);
        json_t *v = gp_value(p);
        if (!v || json_object_set_new(obj, key, v)) { /* invalid UTF-8 key fails here too */
            free(key);
            goto fail;
        }
        free(key);
        gp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return obj;
        }
        goto fail;
    }
fail:
    json_decref(obj);
    return NULL;
}

static json_t *gp_array(gparser *p) {
    p->i++; /* [ */
    json_t *arr = json_array();
    if (!arr) return NULL;
    gp_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
        return arr;
    }
    while (1) {
        gp_ws(p);
        json_t *v = gp_value(p);
        if (!v || json_array_append_new(arr, v)) goto fail;
        gp_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return arr;
        }
        goto fail;
    }
fail:
    json_decref(arr);
    return NULL;
}

static json_t *gp_value(gparser *p) {
    if (p->depth > 500) return NULL;
    gp_ws(p);
    if (p->i >= p->n) return NULL;
    json_t *v;
    p->depth++;
    if (gp_starts(p, QUOTE))
        v = gp_string(p);
    else if (p->s[p->i] == '{')
        v = gp_object(p);
    else if (p->s[p->i] == '[')
        v = gp_array(p);
    else if ((v = gp_word(p)) == NULL)
        v = gp_number(p);
    p->depth--;
    return v;
}

json_t *g4_chat_parse_gemma_value(const char *s, size_t n, size_t *used) {
    gparser p = {s, n, 0, 0};
    json_t *v = gp_value(&p);
    if (used) *used = v ? p.i : 0;
    return v;
}

/* "call:NAME{...}" -> {"name", "arguments"}; NULL when it does not parse. */
static json_t *parse_call(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\n')) i++;
    if (n - i < 5 || memcmp(s + i, "call:", 5) != 0) return NULL;
    i += 5;
    size_t name_start = i;
    while (i < n && s[i] != '{' && s[i] != '\n' && s[i] != '<') i++;
    if (i >= n || s[i] != '{') return NULL;
    size_t name_end = i;
    while (name_end > name_start && s[name_end - 1] == ' ') name_end--;
    while (name_start < name_end && s[name_start] == ' ') name_start++;
    if (name_end == name_start) return NULL;
    json_t *name = json_stringn(s + name_start, name_end - name_start);
    if (!name) return NULL;

    size_t brace = i;
    gparser p = {s, n, brace, 0};
    json_t *args = gp_object(&p);
    if (args) {
        gp_ws(&p);
        if (p.i != n) {
            json_decref(args);
            args = NULL;
        }
    }
    if (!args) { /* arguments given as a JSON string: '{' + text + '}' */
        size_t end = n;
        while (end > brace && (s[end - 1] == ' ' || s[end - 1] == '\n')) end--;
        if (end - brace >= 2 && s[end - 1] == '}') {
            json_error_t je;
            json_t *j = json_loadb(s + brace + 1, end - brace - 2, 0, &je);
            if (json_is_object(j))
                args = j;
            else
                json_decref(j);
        }
    }
    if (!args) {
        json_decref(name);
        return NULL;
    }
    json_t *call = json_object();
    if (!call || json_object_set_new(call, "name", name) ||
        json_object_set_new(call, "arguments", args)) {
        json_decref(call);
        return NULL;
    }
    return call;
}

static void trim(const char **s, size_t *n) {
    while (*n && (**s == ' ' || **s == '\n' || **s == '\t' || **s == '\r')) {
        (*s)++;
        (*n)--;
    }
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\n' || (*s)[*n - 1] == '\t' ||
                  (*s)[*n - 1] == '\r'))
        (*n)--;
}

typedef struct {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->failed || n == 0) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static char *sb_trimmed(sbuf *b) {
    const char *s = b->p ? b->p : "";
    size_t n = b->len;
    trim(&s, &n);
    char *out = malloc(n + 1);
    if (out) {
        memcpy(out, s, n);
        out[n] = 0;
    }
    return out;
}

int g4_chat_parse_output(const char *text, size_t len, g4_chat_output *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    static const char *const stops[] = {"<turn|>", "<eos>", "<|tool_response>"};
    /* the answer ends at the first stop marker */
    size_t end = len;
    for (size_t k = 0; k < sizeof stops / sizeof stops[0]; k++) {
        const char *hit = find_lit(text, len, 0, stops[k]);
        if (hit && (size_t)(hit - text) < end) end = (size_t)(hit - text);
    }
    size_t i = 0;
    if (end >= 13 && memcmp(text, "<|turn>model\n", 13) == 0) i = 13;
    sbuf thinking = {0}, content = {0};
    json_t *calls = json_array();
    if (!calls) return g4_fail(err, "chat output: out of memory");
    /* the next of each marker, searched again only once passed (a text of many markers of one
     * kind must not be rescanned for the other kind at each of them) */
    const char *ch = find_lit(text, end, i, "<|channel>"), *tc = find_lit(text, end, i, "<|tool_call>");
    while (i < end) {
        if (ch && ch < text + i) ch = find_lit(text, end, i, "<|channel>");
        if (tc && tc < text + i) tc = find_lit(text, end, i, "<|tool_call>");
        const char *next = ch && (!tc || ch < tc) ? ch : tc;
        if (!next) {
            sb_put(&content, text + i, end - i);
            break;
        }
        size_t at = (size_t)(next - text);
        sb_put(&content, text + i, at - i);
        if (next == ch) {
            size_t body = at + strlen("<|channel>");
            const char *close = find_lit(text, end, body, "<channel|>");
            size_t body_end = close ? (size_t)(close - text) : end;
            const char *t = text + body;
            size_t tn = body_end - body;
            /* the channel name on the first line ("thought") */
            size_t w = 0;
            while (w < tn && ((t[w] >= 'a' && t[w] <= 'z') || t[w] == '_')) w++;
            if (w > 0 && (w == tn || t[w] == '\n')) {
                t += w;
                tn -= w;
            }
            trim(&t, &tn);
            if (tn) {
                if (thinking.len) sb_put(&thinking, "\n", 1);
                sb_put(&thinking, t, tn);
            }
            i = close ? body_end + strlen("<channel|>") : end;
        } else {
            size_t body = at + strlen("<|tool_call>");
            const char *close = find_lit(text, end, body, "<tool_call|>");
            size_t body_end = close ? (size_t)(close - text) : end;
            size_t block_end = close ? body_end + strlen("<tool_call|>") : end;
            json_t *call = parse_call(text + body, body_end - body);
            if (call) {
                if (json_array_append_new(calls, call)) content.failed = 1;
            } else {
                sb_put(&content, text + at, block_end - at); /* keep it as text */
            }
            i = block_end;
        }
    }
    if (thinking.failed || content.failed) {
        free(thinking.p);
        free(content.p);
        json_decref(calls);
        return g4_fail(err, "chat output: out of memory");
    }
    out->thinking = sb_trimmed(&thinking);
    out->content = sb_trimmed(&content);
    out->tool_calls = calls;
    free(thinking.p);
    free(content.p);
    if (!out->thinking || !out->content) {
        g4_chat_output_free(out);
        return g4_fail(err, "chat output: out of memory");
    }
    return 0;
}

void g4_chat_output_free(g4_chat_output *o) {
    if (!o) return;
    free(o->thinking);
    free(o->content);
    json_decref(o->tool_calls);
    memset(o, 0, sizeof *o);
}
