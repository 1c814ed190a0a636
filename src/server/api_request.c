/* Parsing and checking OpenAI request bodies (api.h; platform.openai.com/docs/api-reference/chat/create,
 * completions/create, embeddings/create). Field names, types and ranges follow the reference; the
 * extensions vLLM and llama.cpp clients send (top_k, min_p, repetition_penalty, ignore_eos,
 * chat_template_kwargs) are read too. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/api.h"

int srv_fail(srv_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    for (char *p = e->msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return -1;
}

char *srv_error_json(const srv_error *e) {
    /* a message quoting bytes that are not UTF-8 keeps its ASCII part */
    json_t *msg = json_stringn(e->msg, strlen(e->msg));
    if (!msg) {
        char ascii[sizeof e->msg];
        size_t i = 0;
        for (const char *p = e->msg; *p && i + 1 < sizeof ascii; p++) ascii[i++] = (unsigned char)*p < 128 ? *p : '?';
        ascii[i] = 0;
        msg = json_string(ascii);
    }
    json_t *o = json_pack("{s:{s:o,s:s,s:o,s:o}}", "error", "message", msg, "type", e->type, "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code[0] ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

int srv_check_api_key(const char *header, const char *key) {
    static const char bearer[] = "Bearer ";
    if (!header || strncmp(header, bearer, sizeof bearer - 1)) return 0;
    const char *got = header + sizeof bearer - 1;
    size_t ng = strlen(got), nk = strlen(key);
    /* every byte of the key is compared whatever the header holds: the time says nothing but its length */
    unsigned char diff = (unsigned char)(ng != nk);
    for (size_t i = 0; i < nk; i++) diff |= (unsigned char)(key[i] ^ (i < ng ? got[i] : 0));
    return diff == 0;
}

/* ------------------------------------------------------------------ fields */

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int bad_type(srv_error *e, const char *field, const json_t *v, const char *want) {
    return srv_fail(e, 400, field, "invalid_type", "Invalid type for '%s': expected %s, but got %s instead.", field,
                    want, type_name(v));
}

/* Optional fields: absent or null leaves *out and *given unchanged (given may be NULL). */
static int get_bool(const json_t *o, const char *k, int *out, srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad_type(e, k, v, "a boolean");
    *out = json_is_true(v);
    return 0;
}

static int get_int(const json_t *o, const char *k, long long lo, long long hi, long long *out, int *given,
                   srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return bad_type(e, k, v, "an integer");
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_fail(e, 400, k, "invalid_value", "Invalid '%s': %lld is outside %lld..%lld.", k, x, lo, hi);
    *out = x;
    if (given) *given = 1;
    return 0;
}

static int get_num(const json_t *o, const char *k, double lo, double hi, float *out, int *given, srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad_type(e, k, v, "a number");
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return srv_fail(e, 400, k, "invalid_value", "Invalid '%s': %g is outside %g..%g.", k, x, lo, hi);
    *out = (float)x;
    if (given) *given = 1;
    return 0;
}

/* o[k] as a string (left as it is when absent or null); param: the field's name in an error (NULL: k) */
static int get_str(const json_t *o, const char *k, const char *param, const char **out, srv_error *e) {
    const json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return bad_type(e, param ? param : k, v, "a string");
    *out = json_string_value(v);
    return 0;
}

static char *dup_str(const json_t *v) {
    size_t n = json_string_length(v);
    char *s = malloc(n + 1);
    if (s) memcpy(s, json_string_value(v), n), s[n] = 0;
    return s;
}

static int oom(srv_error *e) { return srv_fail(e, 500, NULL, NULL, "out of memory"); }

/* ------------------------------------------------------------ shared fields */

static int parse_stop(const json_t *o, srv_request *r, srv_error *e) {
    enum { MAX_STOPS = 16 };
    const json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) && !json_is_array(v)) return bad_type(e, "stop", v, "a string or an array of strings");
    size_t n = json_is_string(v) ? 1 : json_array_size(v);
    if (n > MAX_STOPS) return srv_fail(e, 400, "stop", "invalid_value", "'stop' has %zu strings; at most %d", n, MAX_STOPS);
    if (!(r->stops = calloc(n ? n : 1, sizeof *r->stops))) return oom(e);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(s)) return bad_type(e, "stop", s, "a string");
        if (json_string_length(s) == 0) /* it would match before the first token: refused, as vLLM and the CLI do */
            return srv_fail(e, 400, "stop", "invalid_value", "stop strings must not be empty");
        if (json_string_length(s) > 1024 || memchr(json_string_value(s), 0, json_string_length(s)))
            return srv_fail(e, 400, "stop", "invalid_value", "a stop string is longer than 1024 bytes or holds NUL");
        if (!(r->stops[r->n_stops++] = dup_str(s))) return oom(e);
    }
    return 0;
}

static int parse_logit_bias(const json_t *o, const srv_limits *lim, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(o, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return bad_type(e, "logit_bias", v, "an object");
    size_t n = json_object_size(v);
    if (n > 1024) return srv_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias' has %zu entries; at most 1024", n);
    r->bias_ids = malloc((n ? n : 1) * sizeof *r->bias_ids);
    r->bias_values = malloc((n ? n : 1) * sizeof *r->bias_values);
    if (!r->bias_ids || !r->bias_values) return oom(e);
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        char *end;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id >= lim->vocab_size)
            return srv_fail(e, 400, "logit_bias", "invalid_value",
                            "logit_bias key '%.40s' is not a token id in 0..%d", key, lim->vocab_size - 1);
        if (!json_is_number(val)) return bad_type(e, "logit_bias", val, "a number");
        double b = json_number_value(val);
        if (!(b >= -100 && b <= 100))
            return srv_fail(e, 400, "logit_bias", "invalid_value", "logit_bias values must be in -100..100, got %g", b);
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias++] = (float)b;
    }
    return 0;
}

/* The fields every generating endpoint shares. */
static int parse_sampling(const json_t *o, const srv_limits *lim, srv_request *r, srv_error *e) {
    long long x = 0;
    int given = 0;
    if (get_bool(o, "stream", &r->stream, e)) return -1;
    const json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad_type(e, "stream_options", so, "an object");
        if (!r->stream)
            return srv_fail(e, 400, "stream_options", "invalid_value", "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    r->n = 1;
    if (get_int(o, "n", 1, lim->max_n, &x, &given, e)) return -1;
    if (given) r->n = (int)x;
    const long long max_tok = lim->max_tokens > 0 ? lim->max_tokens : 1LL << 30;
    given = 0;
    if (get_int(o, "max_tokens", 1, max_tok, &x, &given, e)) return -1;
    if (given) r->max_tokens = (int)x;
    given = 0;
    if (get_int(o, "max_completion_tokens", 1, max_tok, &x, &given, e)) return -1;
    if (given) r->max_tokens = (int)x;
    if (get_num(o, "temperature", 0, 2, &r->temperature, &r->have_temperature, e) ||
        get_num(o, "top_p", 0, 1, &r->top_p, &r->have_top_p, e) ||
        get_num(o, "min_p", 0, 1, &r->min_p, &r->have_min_p, e) ||
        get_num(o, "presence_penalty", -2, 2, &r->presence_penalty, NULL, e) ||
        get_num(o, "frequency_penalty", -2, 2, &r->frequency_penalty, NULL, e) ||
        get_num(o, "repetition_penalty", 0.01, 100, &r->repetition_penalty, &r->have_repetition, e))
        return -1;
    if (r->have_top_p && r->top_p <= 0)
        return srv_fail(e, 400, "top_p", "invalid_value", "Invalid 'top_p': it must be above 0 and at most 1.");
    given = 0;
    if (get_int(o, "top_k", -1, 1 << 30, &x, &given, e)) return -1;
    if (given) r->have_top_k = 1, r->top_k = x < 0 ? 0 : (int)x; /* -1 and 0: off */
    given = 0;
    if (get_int(o, "seed", INT64_MIN, INT64_MAX, &x, &given, e)) return -1;
    if (given) r->have_seed = 1, r->seed = (uint64_t)x;
    if (get_bool(o, "ignore_eos", &r->ignore_eos, e)) return -1;
    const json_t *best_of = json_object_get(o, "best_of");
    if (best_of && !json_is_null(best_of) && !(json_is_integer(best_of) && json_integer_value(best_of) == r->n))
        return srv_fail(e, 400, "best_of", "unsupported_value", "'best_of' is not supported (only best_of == n)");
    return parse_stop(o, r, e) || parse_logit_bias(o, lim, r, e) ? -1 : 0;
}

/* --------------------------------------------------------------- chat */

/* Standard base64 (padding optional) into a new buffer; -1 when it is not base64. ASCII whitespace anywhere is
 * skipped (MIME's 76-column lines), as Python's base64.b64decode, which transformers and vLLM use, discards it;
 * any other character outside the alphabet is refused. */
static int base64_decode(const char *in, size_t n, unsigned char **out, size_t *len) {
    static signed char val[256];
    if (!val['B'])
        for (int i = 0; i < 256; i++)
            val[i] = (signed char)(i >= 'A' && i <= 'Z' ? i - 'A' : i >= 'a' && i <= 'z' ? i - 'a' + 26
                                   : i >= '0' && i <= '9' ? i - '0' + 52 : i == '+' ? 62 : i == '/' ? 63
                                   : i == ' ' || (i >= '\t' && i <= '\r') ? -2 : -1);
    while (n > 0 && (in[n - 1] == '=' || val[(unsigned char)in[n - 1]] == -2)) n--;
    unsigned char *b = malloc(n / 4 * 3 + 3);
    if (!b) return -1;
    size_t k = 0, m = 0; /* m: the alphabet's characters so far */
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        const int v = val[(unsigned char)in[i]];
        if (v == -2) continue;
        if (v < 0) {
            free(b);
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (m++ % 4 == 3) b[k++] = (unsigned char)(acc >> 16), b[k++] = (unsigned char)(acc >> 8), b[k++] = (unsigned char)acc;
    }
    if (m % 4 == 1) {
        free(b);
        return -1;
    }
    if (m % 4 == 2) b[k++] = (unsigned char)(acc >> 4);
    if (m % 4 == 3) b[k++] = (unsigned char)(acc >> 10), b[k++] = (unsigned char)(acc >> 2);
    *out = b;
    *len = k;
    return 0;
}

/* Where a media URL's bytes come from: 'd' a base64 data URL, 'r' an http(s) URL (fetched later, by the
 * endpoint), or -1 with e filled. kind names the part in messages ("image_url", "audio_url"). */
static int url_source(const char *url, const char *kind, const char *where, const srv_limits *lim, srv_error *e) {
    if (!strncasecmp(url, "data:", 5)) {
        const char *comma = strchr(url, ',');
        if (!comma || comma - url < 12 || strncmp(comma - 7, ";base64", 7))
            return srv_fail(e, 400, where, "invalid_value", "%s: a data URL must be base64 (data:image/png;base64,...)",
                            kind);
        return 'd';
    }
    const size_t scheme = strcspn(url, ":/?#"); /* (RFC 3986: the scheme ends at the first ':') */
    if (url[scheme] != ':')
        return srv_fail(e, 400, where, "invalid_value", "%s: '%.60s' is not a URL (data:, http:// or https://)", kind, url);
    if (!(scheme == 4 && !strncasecmp(url, "http", 4)) && !(scheme == 5 && !strncasecmp(url, "https", 5)))
        return srv_fail(e, 400, where, "invalid_value", "%s: URLs of scheme '%.*s' are not read (data:, http:// and "
                        "https:// are)", kind, (int)(scheme > 20 ? 20 : scheme), url);
    if (!lim->allow_remote_media)
        return srv_fail(e, 400, where, "invalid_value", "%s: this server does not fetch remote media (--no-remote-media); "
                                                        "send a data URL", kind);
    return 'r';
}

/* An image_url or audio_url part ({"url": "data:...;base64,..." or "http(s)://..."}, or the URL as a string) or an
 * input_audio part ({"data": base64, "format": "wav" | "mp3" | ...}): its bytes, or its URL, into r->media. */
static int media_part(const json_t *part, const char *type, const char *where, const srv_limits *lim, srv_request *r,
                      srv_error *e) {
    const int audio = strcmp(type, "image_url") != 0;
    const json_t *v = json_object_get(part, type);
    const char *b64 = NULL, *url = NULL;
    size_t b64_len = 0;
    if (strcmp(type, "input_audio")) {
        const json_t *u = json_is_object(v) ? json_object_get(v, "url") : v;
        if (!json_is_string(u))
            return bad_type(e, where, u ? u : json_null(), audio ? "an audio_url with a 'url' string"
                                                                 : "an image_url with a 'url' string");
        const int src = url_source(json_string_value(u), type, where, lim, e);
        if (src < 0) return -1;
        if (src == 'd') b64 = strchr(json_string_value(u), ',') + 1, b64_len = strlen(b64);
        else url = json_string_value(u);
    } else {
        const json_t *d = json_object_get(v, "data");
        if (!json_is_object(v) || !json_is_string(d))
            return bad_type(e, where, d ? d : json_null(), "an input_audio with base64 'data'");
        b64 = json_string_value(d), b64_len = json_string_length(d);
    }
    srv_media *m = realloc(r->media, (size_t)(r->n_media + 1) * sizeof *m);
    if (!m) return oom(e);
    r->media = m;
    m += r->n_media;
    *m = (srv_media){.audio = audio};
    if (url) {
        if (!(m->url = strdup(url))) return oom(e);
    } else if (base64_decode(b64, b64_len, &m->data, &m->len) || m->len == 0) {
        free(m->data);
        return srv_fail(e, 400, where, "invalid_value", "%s: the data is not base64 (or empty)", type);
    }
    r->n_media++;
    return 0;
}

/* A content part the template reads: {"type": "text", "text": ...}; an image or audio part becomes the template's
 * {"type": "image"} / {"type": "audio"} (its placeholder), its bytes kept in r->media. */
static int convert_part(const json_t *part, const char *where, const srv_limits *lim, srv_request *r, json_t *out,
                        srv_error *e) {
    if (!json_is_object(part)) return bad_type(e, where, part, "an object");
    const char *type = NULL;
    if (get_str(part, "type", "messages.content.type", &type, e)) return -1;
    if (!type) return srv_fail(e, 400, where, "missing_required_parameter", "a content part needs a 'type'");
    if (!strcmp(type, "text") || !strcmp(type, "refusal")) {
        const json_t *t = json_object_get(part, type);
        if (!json_is_string(t)) return bad_type(e, where, t ? t : json_null(), "a string in 'text'");
        return json_array_append_new(out, json_pack("{s:s,s:O}", "type", "text", "text", t)) ? oom(e) : 0;
    }
    if (!strcmp(type, "image_url") || !strcmp(type, "input_audio") || !strcmp(type, "audio_url")) {
        int image = !strcmp(type, "image_url");
        if (r->n_media >= lim->max_media)
            return srv_fail(e, 400, where, "invalid_value", "at most %d image and audio parts per request", lim->max_media);
        if (image ? !lim->have_vision : !lim->have_audio)
            return srv_fail(e, 400, where, "unsupported_content", "this model reads no %s (%s parts)",
                            image ? "images" : "audio", type);
        if (media_part(part, type, where, lim, r, e)) return -1;
        return json_array_append_new(out, json_pack("{s:s}", "type", image ? "image" : "audio")) ? oom(e) : 0;
    }
    return srv_fail(e, 400, where, "invalid_value",
                    "content part type '%.40s' is not supported (text, image_url, input_audio, audio_url)", type);
}

/* Message content: a string, null, or a list of parts; *out gets what the template reads (NULL: none). */
static int convert_content(const json_t *c, const char *where, const srv_limits *lim, srv_request *r, json_t **out,
                           srv_error *e) {
    *out = NULL;
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return 0;
    }
    if (!json_is_array(c)) return bad_type(e, where, c, "a string or an array of content parts");
    json_t *parts = json_array();
    if (!parts) return oom(e);
    size_t i;
    const json_t *p;
    json_array_foreach(c, i, p) {
        if (convert_part(p, where, lim, r, parts, e)) {
            json_decref(parts);
            return -1;
        }
    }
    *out = parts;
    return 0;
}

/* The text of a tool message's content (a string or text parts). */
static int content_text(const json_t *c, const char *where, json_t **out, srv_error *e) {
    if (json_is_string(c)) {
        *out = json_incref((json_t *)c);
        return 0;
    }
    if (!json_is_array(c)) return bad_type(e, where, c ? c : json_null(), "a string or an array of text parts");
    size_t i, len = 0;
    const json_t *p;
    json_array_foreach(c, i, p) {
        const json_t *t = json_object_get(p, "text");
        if (!json_is_string(t)) return srv_fail(e, 400, where, "invalid_value", "tool message content must be text");
        len += json_string_length(t);
    }
    char *s = malloc(len + 1);
    if (!s) return oom(e);
    len = 0;
    json_array_foreach(c, i, p) {
        const json_t *t = json_object_get(p, "text");
        memcpy(s + len, json_string_value(t), json_string_length(t));
        len += json_string_length(t);
    }
    *out = json_stringn_nocheck(s, len);
    free(s);
    return *out ? 0 : oom(e);
}

/* An assistant's tool_calls with the arguments as objects (the template writes them in Gemma's notation). */
static int convert_tool_calls(const json_t *calls, json_t *msg, srv_error *e) {
    if (!json_is_array(calls)) return bad_type(e, "messages.tool_calls", calls, "an array");
    json_t *out = json_array();
    if (!out || json_object_set_new(msg, "tool_calls", out)) return oom(e);
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        const json_t *id = json_object_get(c, "id");
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name))
            return srv_fail(e, 400, "messages.tool_calls", "invalid_value",
                            "a tool call needs {\"function\": {\"name\": ..., \"arguments\": ...}}");
        json_t *obj;
        if (json_is_string(args)) {
            obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
            if (!json_is_object(obj)) {
                json_decref(obj);
                return srv_fail(e, 400, "messages.tool_calls", "invalid_value",
                                "tool call '%.60s': 'arguments' is not a JSON object", json_string_value(name));
            }
        } else if (json_is_object(args)) {
            obj = json_incref((json_t *)args);
        } else if (!args || json_is_null(args)) {
            obj = json_object();
        } else {
            return bad_type(e, "messages.tool_calls.function.arguments", args, "a JSON string");
        }
        json_t *call = json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function", "name", name, "arguments", obj);
        if (!call) return oom(e);
        if (json_is_string(id)) json_object_set(call, "id", (json_t *)id);
        if (json_array_append_new(out, call)) return oom(e);
    }
    return 0;
}

/* The name of the function a tool call id belongs to, in the assistant messages so far. */
static const json_t *call_name(const json_t *messages, const json_t *id) {
    for (size_t i = json_array_size(messages); i-- > 0;) {
        const json_t *calls = json_object_get(json_array_get(messages, i), "tool_calls");
        size_t j;
        const json_t *c;
        json_array_foreach(calls, j, c) {
            if (id && json_equal(json_object_get(c, "id"), (json_t *)id))
                return json_object_get(json_object_get(c, "function"), "name");
        }
    }
    return NULL;
}

/* A role "tool" message for a template that does not read them: a tool_responses entry
 * {"name", "response"} on the assistant message before it (the response parsed when it is JSON). */
static int add_tool_response(json_t *messages, const json_t *m, srv_error *e) {
    json_t *prev = json_array_get(messages, json_array_size(messages) - 1);
    const char *role = json_string_value(json_object_get(prev, "role"));
    if (!prev || !role || strcmp(role, "assistant"))
        return srv_fail(e, 400, "messages", "invalid_value",
                        "a 'tool' message must follow the assistant message whose tool call it answers");
    const json_t *own = json_object_get(m, "name");
    if (own && !json_is_null(own) && !json_is_string(own)) return bad_type(e, "messages.name", own, "a string");
    json_t *text;
    if (content_text(json_object_get(m, "content"), "messages.content", &text, e)) return -1;
    json_t *value = json_loadb(json_string_value(text), json_string_length(text), JSON_DECODE_ANY, NULL);
    const json_t *name = call_name(messages, json_object_get(m, "tool_call_id"));
    if (!name) name = json_object_get(m, "name");
    json_t *resp = json_pack("{s:s,s:o}", "name", json_is_string(name) ? json_string_value(name) : "unknown",
                             "response", value ? value : json_incref(text));
    json_decref(text);
    json_t *list = json_object_get(prev, "tool_responses");
    if (!list) {
        list = json_array();
        if (!list || json_object_set_new(prev, "tool_responses", list)) {
            json_decref(resp);
            return oom(e);
        }
    }
    return !resp || json_array_append_new(list, resp) ? oom(e) : 0;
}

static int convert_messages(const json_t *in, const srv_limits *lim, int tool_role, srv_request *r, srv_error *e) {
    json_t *chat = r->chat;
    const json_t *msgs = json_object_get(in, "messages");
    if (!msgs) return srv_fail(e, 400, "messages", "missing_required_parameter", "Missing required parameter: 'messages'.");
    if (!json_is_array(msgs)) return bad_type(e, "messages", msgs, "an array");
    if (json_array_size(msgs) == 0)
        return srv_fail(e, 400, "messages", "invalid_value", "'messages' must hold at least one message");
    json_t *out = json_array();
    if (!out || json_object_set_new(chat, "messages", out)) return oom(e);
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) return bad_type(e, "messages", m, "an object");
        const char *role = NULL;
        if (get_str(m, "role", "messages.role", &role, e)) return -1;
        if (!role) return srv_fail(e, 400, "messages.role", "missing_required_parameter", "messages[%zu] has no 'role'", i);
        if (!strcmp(role, "developer")) role = "system";
        const int is_tool = !strcmp(role, "tool");
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && !is_tool)
            return srv_fail(e, 400, "messages.role", "invalid_value",
                            "messages[%zu]: role '%.40s' is not one of system, developer, user, assistant, tool", i, role);
        if (is_tool && !tool_role) {
            if (add_tool_response(out, m, e)) return -1;
            continue;
        }
        json_t *msg = json_pack("{s:s}", "role", role), *content;
        if (!msg || json_array_append_new(out, msg)) return oom(e);
        if (convert_content(json_object_get(m, "content"), "messages.content", lim, r, &content, e)) return -1;
        if (content && json_object_set_new(msg, "content", content)) return oom(e);
        const json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && !json_is_array(calls))
            return bad_type(e, "messages.tool_calls", calls, "an array");
        if (json_array_size(calls) && convert_tool_calls(calls, msg, e)) return -1;
        if (!strcmp(role, "assistant")) {
            /* the thinking that led to the calls: templates that keep it within a tool-calling turn (31B's)
             * read "reasoning_content" (the field our replies carry) or "reasoning" (vLLM's) */
            static const char *const thinking[] = {"reasoning_content", "reasoning"};
            for (int k = 0; k < 2; k++) {
                const json_t *t = json_object_get(m, thinking[k]);
                if (!t || json_is_null(t)) continue;
                if (!json_is_string(t)) return bad_type(e, "messages.reasoning_content", t, "a string");
                if (json_object_set(msg, thinking[k], (json_t *)t)) return oom(e);
            }
        }
        if (is_tool) {
            const json_t *id = json_object_get(m, "tool_call_id");
            if (id && !json_is_string(id)) return bad_type(e, "messages.tool_call_id", id, "a string");
            if (id) json_object_set(msg, "tool_call_id", (json_t *)id);
            const json_t *name = call_name(out, id), *own = json_object_get(m, "name");
            if (own && !json_is_null(own) && !json_is_string(own)) return bad_type(e, "messages.name", own, "a string");
            if (!name && json_is_string(own)) name = own; /* no call of that id: the function the message names */
            if (name) json_object_set(msg, "name", (json_t *)name);
        }
        if (!content && !json_object_get(msg, "tool_calls") && strcmp(role, "assistant"))
            return srv_fail(e, 400, "messages.content", "missing_required_parameter", "messages[%zu] has no content", i);
    }
    return 0;
}

/* tool_choice "required" or {"type": "function", "function": {"name": N}}: the output is tool calls (of N, one),
 * at most one with parallel_tool_calls false (json_schema.c). */
static int forced_tool_calls(const json_t *in, const json_t *tools, const char *name, srv_request *r, srv_error *e) {
    if (!json_array_size(tools))
        return srv_fail(e, 400, "tool_choice", "invalid_value", "tool_choice '%s' needs tools", name ? name : "required");
    int parallel = 1;
    if (get_bool(in, "parallel_tool_calls", &parallel, e)) return -1;
    char *text = json_dumps(tools, JSON_COMPACT);
    if (!text) return oom(e);
    g4_error err = {0};
    const int rc = g4_grammar_tool_calls(text, name, name || !parallel ? 1 : 0, &r->grammar, &err);
    free(text);
    return rc ? srv_fail(e, 400, "tools", "invalid_value", "%s", err.msg) : 0;
}

static int parse_tools(const json_t *in, json_t *chat, srv_request *r, srv_error *e) {
    const json_t *tools = json_object_get(in, "tools");
    const json_t *choice = json_object_get(in, "tool_choice");
    const char *forced = NULL; /* "required", or the function's name */
    if (choice && !json_is_null(choice)) {
        const char *c = json_string_value(choice);
        if (!c && !json_is_object(choice)) return bad_type(e, "tool_choice", choice, "a string or an object");
        if (c && strcmp(c, "auto") && strcmp(c, "none") && strcmp(c, "required"))
            return srv_fail(e, 400, "tool_choice", "invalid_value",
                            "tool_choice must be \"none\", \"auto\", \"required\" or an object naming a function, not "
                            "\"%.100s\"", c);
        if (!c) {
            const json_t *fn = json_object_get(choice, "function");
            const char *type = json_string_value(json_object_get(choice, "type"));
            forced = json_string_value(json_object_get(fn, "name"));
            if (!type || strcmp(type, "function") || !forced)
                return srv_fail(e, 400, "tool_choice", "invalid_value",
                                "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        } else if (!strcmp(c, "required")) {
            forced = c;
        }
    }
    const int hide = choice && json_is_string(choice) && !strcmp(json_string_value(choice), "none");
    if (!tools || json_is_null(tools)) return forced ? forced_tool_calls(in, NULL, NULL, r, e) : 0;
    if (!json_is_array(tools)) return bad_type(e, "tools", tools, "an array");
    json_t *seen = json_object(); /* name -> index: the model calls a tool by its name, so names are unique */
    if (!seen) return oom(e);
    int rc = 0;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn) || !name) {
            rc = srv_fail(e, 400, "tools", "invalid_value",
                          "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            break;
        }
        if (!json_is_string(name)) {
            rc = bad_type(e, "tools.function.name", name, "a string");
            break;
        }
        const char *s = json_string_value(name);
        const size_t len = json_string_length(name);
        if (len == 0) {
            rc = srv_fail(e, 400, "tools.function.name", "invalid_value", "tools[%zu].function.name is empty", i);
            break;
        }
        const json_t *prev = json_object_getn(seen, s, len);
        if (prev) {
            rc = srv_fail(e, 400, "tools.function.name", "invalid_value",
                          "tools[%lld] and tools[%zu] have the same function name '%.64s'",
                          (long long)json_integer_value(prev), i, s);
            break;
        }
        if (json_object_setn_new_nocheck(seen, s, len, json_integer((json_int_t)i))) {
            rc = oom(e);
            break;
        }
        const json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params)) {
            rc = bad_type(e, "tools.function.parameters", params, "an object");
            break;
        }
    }
    json_decref(seen);
    if (rc) return rc;
    if (forced && forced_tool_calls(in, json_is_array(tools) ? tools : NULL, strcmp(forced, "required") ||
                                    json_is_object(choice) ? forced : NULL, r, e))
        return -1;
    if (hide) return 0; /* tool_choice none: the model is not told of the tools */
    return json_array_size(tools) && json_object_set(chat, "tools", (json_t *)tools) ? oom(e) : 0;
}

/* Constraints of other servers' APIs, one per request (with response_format and a forced tool call): llama.cpp's
 * "grammar" (GBNF) and "json_schema", vLLM's "guided_json", "guided_regex", "guided_choice", "guided_grammar" and
 * "structured_outputs" {"json" | "regex" | "choice" | "grammar"}. */
static int parse_constraints(const json_t *in, srv_request *r, srv_error *e) {
    static const struct {
        const char *field, *kind;
    } fields[] = {{"grammar", "grammar"},         {"json_schema", "json"},        {"guided_json", "json"},
                  {"guided_regex", "regex"},      {"guided_choice", "choice"},    {"guided_grammar", "grammar"},
                  {"structured_outputs", NULL}};
    const char *field = NULL, *kind = NULL;
    const json_t *v = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const json_t *x = json_object_get(in, fields[i].field);
        if (!x || json_is_null(x)) continue;
        if (field || r->grammar || r->format != SRV_FORMAT_TEXT)
            return srv_fail(e, 400, fields[i].field, "invalid_value",
                            "'%s' and '%s' both constrain the output: give one", field ? field : "response_format",
                            fields[i].field);
        field = fields[i].field, kind = fields[i].kind, v = x;
    }
    if (!field) return 0;
    if (!kind) { /* structured_outputs: one of its keys */
        static const char *const keys[] = {"json", "regex", "choice", "grammar"};
        const json_t *so = v;
        if (!json_is_object(so)) return bad_type(e, field, so, "an object");
        v = NULL;
        for (size_t i = 0; i < 4; i++) {
            const json_t *x = json_object_get(so, keys[i]);
            if (!x || json_is_null(x)) continue;
            if (v) return srv_fail(e, 400, field, "invalid_value", "structured_outputs takes one of json, regex, choice, grammar");
            v = x, kind = keys[i];
        }
        if (!v) return srv_fail(e, 400, field, "invalid_value", "structured_outputs needs json, regex, choice or grammar");
    }
    g4_error err = {0};
    int rc;
    if (!strcmp(kind, "json")) { /* a schema object, or its JSON text (vLLM takes both) */
        char *text = json_is_string(v) ? strdup(json_string_value(v)) : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text) return oom(e);
        rc = g4_grammar_json_schema(text, &r->grammar, &err);
        free(text);
    } else if (!strcmp(kind, "choice")) {
        if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > 4096)
            return bad_type(e, field, v, "an array of 1 to 4096 strings");
        const char **list = calloc(json_array_size(v), sizeof *list);
        if (!list) return oom(e);
        size_t i;
        const json_t *x;
        json_array_foreach(v, i, x) list[i] = json_string_value(x);
        rc = 0;
        for (i = 0; i < json_array_size(v) && !rc; i++)
            if (!list[i]) rc = bad_type(e, field, json_array_get(v, i), "a string");
        if (!rc) rc = g4_grammar_choice(list, (int)json_array_size(v), &r->grammar, &err);
        free(list);
        if (rc && !err.msg[0]) return -1;
    } else {
        if (!json_is_string(v)) return bad_type(e, field, v, "a string");
        rc = !strcmp(kind, "regex") ? g4_grammar_regex(json_string_value(v), &r->grammar, &err)
                                    : g4_grammar_gbnf(json_string_value(v), &r->grammar, &err);
    }
    return rc ? srv_fail(e, 400, field, "invalid_value", "%s", err.msg) : 0;
}

static int parse_chat(const json_t *in, const srv_limits *lim, int tool_role, srv_request *r, srv_error *e) {
    if (!(r->chat = json_object())) return oom(e);
    if (convert_messages(in, lim, tool_role, r, e) || parse_tools(in, r->chat, r, e)) return -1;
    const char *effort = NULL;
    if (get_str(in, "reasoning_effort", NULL, &effort, e)) return -1;
    if (effort) {
        int off = !strcmp(effort, "none") || !strcmp(effort, "minimal");
        if (!off && strcmp(effort, "low") && strcmp(effort, "medium") && strcmp(effort, "high"))
            return srv_fail(e, 400, "reasoning_effort", "invalid_value",
                            "reasoning_effort must be none, minimal, low, medium or high");
        json_object_set_new(r->chat, "enable_thinking", json_boolean(!off));
    }
    const json_t *kw = json_object_get(in, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) return bad_type(e, "chat_template_kwargs", kw, "an object");
        json_object_set(r->chat, "chat_template_kwargs", (json_t *)kw);
        const json_t *et = json_object_get(kw, "enable_thinking"); /* the template's switch, said either way */
        if (json_is_boolean(et)) json_object_set(r->chat, "enable_thinking", (json_t *)et);
    }
    if (get_bool(in, "logprobs", &r->logprobs, e)) return -1;
    long long x;
    int given = 0;
    if (get_int(in, "top_logprobs", 0, 20, &x, &given, e)) return -1;
    if (given && !r->logprobs)
        return srv_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs' to be true");
    if (given) r->top_logprobs = (int)x;
    const json_t *rf = json_object_get(in, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !type) return bad_type(e, "response_format", rf, "an object with a 'type'");
        if (strcmp(type, "text") && r->grammar)
            return srv_fail(e, 400, "response_format", "invalid_value",
                            "response_format '%.40s' and a forced tool call (tool_choice) exclude each other", type);
        if (!strcmp(type, "json_object")) {
            r->format = SRV_FORMAT_JSON_OBJECT;
        } else if (!strcmp(type, "json_schema")) { /* {"json_schema": {"name", "schema", "strict"}} */
            const json_t *js = json_object_get(rf, "json_schema");
            const json_t *schema = json_object_get(js, "schema");
            if (!json_is_object(js) || (!json_is_object(schema) && !json_is_boolean(schema)))
                return srv_fail(e, 400, "response_format.json_schema", "invalid_value",
                                "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
            char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!text) return oom(e);
            g4_error err = {0};
            const int rc = g4_grammar_json_schema(text, &r->grammar, &err);
            free(text);
            if (rc) return srv_fail(e, 400, "response_format.json_schema.schema", "invalid_value", "%s", err.msg);
        } else if (strcmp(type, "text"))
            return srv_fail(e, 400, "response_format", "invalid_value", "response_format type '%.40s' is unknown", type);
    }
    if (parse_constraints(in, r, e)) return -1;
    const json_t *mod = json_object_get(in, "modalities");
    size_t i;
    const json_t *v;
    json_array_foreach(mod, i, v) {
        if (!json_is_string(v) || strcmp(json_string_value(v), "text"))
            return srv_fail(e, 400, "modalities", "unsupported_value", "only the text modality can be generated");
    }
    return 0;
}

/* ------------------------------------------------- completions, embeddings */

static int ids_from(const json_t *arr, const char *field, const srv_limits *lim, srv_prompt *p, srv_error *e) {
    size_t n = json_array_size(arr);
    if (!(p->ids = malloc((n ? n : 1) * sizeof *p->ids))) return oom(e);
    size_t i;
    const json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v)) return bad_type(e, field, v, "an integer token id");
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= lim->vocab_size)
            return srv_fail(e, 400, field, "invalid_value", "token id %lld is outside the vocabulary (0..%d)",
                            (long long)id, lim->vocab_size - 1);
        p->ids[i] = (int32_t)id;
    }
    p->n_ids = (int)n;
    return 0;
}

/* "prompt" / "input": a string, a list of strings, a list of token ids, or a list of such lists. */
static int parse_prompts(const json_t *in, const char *field, const srv_limits *lim, srv_request *r, srv_error *e) {
    const json_t *v = json_object_get(in, field);
    if (!v) return srv_fail(e, 400, field, "missing_required_parameter", "Missing required parameter: '%s'.", field);
    const char *want = "a string, an array of strings, an array of token ids or an array of such arrays";
    if (!json_is_string(v) && !json_is_array(v)) return bad_type(e, field, v, want);
    const int flat_ids = json_is_array(v) && json_is_integer(json_array_get(v, 0));
    size_t n = json_is_string(v) || flat_ids ? 1 : json_array_size(v);
    if (n == 0) return srv_fail(e, 400, field, "invalid_value", "'%s' is empty", field);
    if (n > (size_t)lim->max_prompts)
        return srv_fail(e, 400, field, "invalid_value", "'%s' holds %zu prompts; at most %d", field, n, lim->max_prompts);
    if (!(r->prompts = calloc(n, sizeof *r->prompts))) return oom(e);
    r->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_is_string(v) || flat_ids ? v : json_array_get(v, i);
        if (json_is_string(p)) {
            if (json_string_length(p) == 0 && r->kind == SRV_EMBEDDING)
                return srv_fail(e, 400, field, "invalid_value", "'%s' must not be an empty string", field);
            if (!(r->prompts[i].text = dup_str(p))) return oom(e);
        } else if (json_is_array(p)) {
            if (ids_from(p, field, lim, &r->prompts[i], e)) return -1;
            if (!r->prompts[i].n_ids) return srv_fail(e, 400, field, "invalid_value", "'%s' holds an empty list", field);
        } else {
            return bad_type(e, field, p, want);
        }
    }
    return 0;
}

static int parse_completion(const json_t *in, const srv_limits *lim, srv_request *r, srv_error *e) {
    r->max_tokens = 16; /* OpenAI's default for completions */
    if (parse_prompts(in, "prompt", lim, r, e) || parse_sampling(in, lim, r, e) || get_bool(in, "echo", &r->echo, e))
        return -1;
    long long x;
    int given = 0;
    if (get_int(in, "logprobs", 0, 20, &x, &given, e)) return -1;
    if (given) r->logprobs = 1, r->top_logprobs = (int)x;
    if (r->echo && r->logprobs)
        return srv_fail(e, 400, "echo", "unsupported_value", "'echo' with 'logprobs' is not supported");
    const json_t *suffix = json_object_get(in, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return srv_fail(e, 400, "suffix", "unsupported_value", "'suffix' is not supported");
    return parse_constraints(in, r, e);
}

static int parse_embedding(const json_t *in, const srv_limits *lim, srv_request *r, srv_error *e) {
    r->n = 1;
    if (parse_prompts(in, "input", lim, r, e)) return -1;
    const char *fmt = NULL;
    if (get_str(in, "encoding_format", NULL, &fmt, e)) return -1;
    if (fmt && strcmp(fmt, "float") && strcmp(fmt, "base64"))
        return srv_fail(e, 400, "encoding_format", "invalid_value", "encoding_format must be \"float\" or \"base64\"");
    r->base64 = fmt && !strcmp(fmt, "base64");
    long long dims;
    int given = 0;
    if (get_int(in, "dimensions", 1, 1 << 20, &dims, &given, e)) return -1;
    if (given && dims != lim->hidden_size)
        return srv_fail(e, 400, "dimensions", "unsupported_value", "this model's embeddings have %d dimensions",
                        lim->hidden_size);
    return 0;
}

/* ------------------------------------------------------------------ entry */

int srv_parse_request(srv_kind kind, const char *body, size_t len, const srv_limits *lim, int tool_role,
                      srv_request *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    json_error_t je;
    json_t *in = json_loadb(body, len, 0, &je);
    if (!in)
        return srv_fail(e, 400, NULL, "invalid_json",
                        "We could not parse the JSON body of your request: %s (line %d, column %d).", je.text, je.line,
                        je.column);
    int rc = -1;
    const char *model = NULL;
    if (!json_is_object(in)) {
        bad_type(e, "body", in, "a JSON object");
    } else if (get_str(in, "model", NULL, &model, e) == 0) {
        if (!model) srv_fail(e, 400, "model", "missing_required_parameter", "Missing required parameter: 'model'.");
        else if (!(out->model = strdup(model))) oom(e);
        else if (kind == SRV_CHAT) rc = parse_chat(in, lim, tool_role, out, e) || parse_sampling(in, lim, out, e) ? -1 : 0;
        else if (kind == SRV_COMPLETION) rc = parse_completion(in, lim, out, e);
        else rc = parse_embedding(in, lim, out, e);
    }
    json_decref(in);
    if (rc) srv_request_free(out);
    return rc;
}

void srv_request_free(srv_request *r) {
    free(r->model);
    free(r->bias_ids);
    free(r->bias_values);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    json_decref(r->chat);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int i = 0; i < r->n_media; i++) free(r->media[i].data), free(r->media[i].url);
    free(r->media);
    free(r->soft); /* (the endpoint frees what its entries hold: free_request) */
    g4_grammar_free(r->grammar);
    memset(r, 0, sizeof *r);
}
