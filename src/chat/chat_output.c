/* Model output of Gemma 4 (docs/gemma4-text.md, chat format): thinking, answer and tool calls,
 * parsed while it streams (g4_chat_parser) and as a whole (g4_chat_parse, the same parser fed
 * at once), so a streamed reply and a parsed one always agree. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "core/error.h"
#include "core/strbuf.h"

/* ------------------------------------------------- Gemma's tool-call notation */

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

/* ------------------------------------------------------------ the parser */

#define CH_OPEN "<|channel>"
#define CH_CLOSE "<channel|>"
#define TC_OPEN "<|tool_call>"
#define TC_CLOSE "<tool_call|>"
#define MODEL_TURN "<|turn>model\n" /* a raw output may start with its own turn header */
#define STOPS "<turn|>", "<eos>", "<|tool_response>"

typedef enum { P_START, P_CONTENT, P_NAME, P_THINKING, P_TOOL, P_ENDED } pstate;

/* The markers each state looks for; a state ends at its first one. */
static const char *const CONTENT_MARKS[] = {CH_OPEN, TC_OPEN, STOPS, NULL};
static const char *const THINK_MARKS[] = {CH_CLOSE, STOPS, NULL};
static const char *const TOOL_MARKS[] = {TC_CLOSE, STOPS, NULL};

int g4_chat_reads_token(const char *piece) {
    static const char *const read[] = {CH_OPEN, CH_CLOSE, TC_OPEN, TC_CLOSE, STOPS, QUOTE};
    for (size_t i = 0; i < sizeof read / sizeof read[0]; i++)
        if (!strcmp(piece, read[i])) return 1;
    return 0;
}

struct g4_chat_parser {
    g4_chat_piece_fn fn;
    void *user;
    pstate state;
    g4_strbuf pending;    /* text not yet scanned: at most the start of a marker */
    g4_strbuf content_ws; /* the answer's trailing whitespace: shown only if more answer follows */
    g4_strbuf think_ws;   /* the same for the thinking block */
    g4_strbuf name;       /* P_NAME: the channel name read so far ("thought") */
    g4_strbuf tool;       /* P_TOOL: the call's text */
    int content_started;  /* the answer's leading whitespace is behind */
    int block_started;    /* this thinking block has shown text */
    int thinking_shown;   /* an earlier block has (blocks are joined by "\n") */
    int failed;           /* out of memory (in a callback or here) */
};

g4_chat_parser *g4_chat_parser_new(g4_chat_piece_fn fn, void *user) {
    g4_chat_parser *p = calloc(1, sizeof *p);
    if (p) {
        p->fn = fn;
        p->user = user;
    }
    return p;
}

void g4_chat_parser_free(g4_chat_parser *p) {
    if (!p) return;
    g4_strbuf_free(&p->pending);
    g4_strbuf_free(&p->content_ws);
    g4_strbuf_free(&p->think_ws);
    g4_strbuf_free(&p->name);
    g4_strbuf_free(&p->tool);
    free(p);
}

int g4_chat_parser_ended(const g4_chat_parser *p) { return p->state == P_ENDED; }

static void emit(g4_chat_parser *p, g4_event_kind kind, const char *s, size_t n) {
    if (n && !p->failed && p->fn(kind, s, n, p->user)) p->failed = 1;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Text of a trimmed run (the answer, or one thinking block): leading whitespace is dropped,
 * trailing whitespace is held in ws until more text follows. */
static void trimmed_text(g4_chat_parser *p, g4_event_kind kind, int *started, g4_strbuf *ws, const char *s,
                         size_t n) {
    if (!*started) {
        while (n && is_ws(*s)) s++, n--;
        if (!n) return;
        *started = 1;
        if (kind == G4_EVENT_THINKING) {
            if (p->thinking_shown) emit(p, kind, "\n", 1);
            p->thinking_shown = 1;
        }
    }
    size_t body = n;
    while (body && is_ws(s[body - 1])) body--;
    if (body) {
        emit(p, kind, g4_strbuf_str(ws), ws->len);
        g4_strbuf_clear(ws);
        emit(p, kind, s, body);
    }
    g4_strbuf_put(ws, s + body, n - body);
}

static void content_text(g4_chat_parser *p, const char *s, size_t n) {
    trimmed_text(p, G4_EVENT_TEXT, &p->content_started, &p->content_ws, s, n);
}

static void thinking_text(g4_chat_parser *p, const char *s, size_t n) {
    trimmed_text(p, G4_EVENT_THINKING, &p->block_started, &p->think_ws, s, n);
}

/* The first line of a channel names it ("thought"): a run of [a-z_] followed by a newline (or
 * by the block's end) is not thinking text. */
static void name_text(g4_chat_parser *p, const char *s, size_t n) {
    size_t i = 0;
    while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_')) i++;
    g4_strbuf_put(&p->name, s, i);
    if (i == n) return;
    p->state = P_THINKING;
    if (!(s[i] == '\n' && p->name.len)) thinking_text(p, g4_strbuf_str(&p->name), p->name.len);
    g4_strbuf_clear(&p->name);
    thinking_text(p, s + i, n - i);
}

static void state_text(g4_chat_parser *p, const char *s, size_t n) {
    switch (p->state) {
    case P_CONTENT: content_text(p, s, n); break;
    case P_NAME: name_text(p, s, n); break;
    case P_THINKING: thinking_text(p, s, n); break;
    case P_TOOL: g4_strbuf_put(&p->tool, s, n); break;
    default: break;
    }
}

/* Leaves the current state: a tool call is parsed (one that does not parse is answer text,
 * with its markers); a thinking block drops its trailing whitespace. */
static void close_state(g4_chat_parser *p, int tool_closed) {
    if (p->state == P_TOOL) {
        json_t *call = parse_call(g4_strbuf_str(&p->tool), p->tool.len);
        if (call) {
            char *js = json_dumps(call, JSON_COMPACT);
            if (js) emit(p, G4_EVENT_TOOL_CALL, js, strlen(js));
            else p->failed = 1;
            free(js);
            json_decref(call);
        } else {
            p->state = P_CONTENT;
            content_text(p, TC_OPEN, strlen(TC_OPEN));
            content_text(p, g4_strbuf_str(&p->tool), p->tool.len);
            if (tool_closed) content_text(p, TC_CLOSE, strlen(TC_CLOSE));
        }
        g4_strbuf_clear(&p->tool);
    } else if (p->state == P_NAME || p->state == P_THINKING) {
        g4_strbuf_clear(&p->name);
        g4_strbuf_clear(&p->think_ws);
        p->block_started = 0;
    }
}

static void take_marker(g4_chat_parser *p, const char *mark) {
    if (!strcmp(mark, CH_OPEN)) {
        p->state = P_NAME;
    } else if (!strcmp(mark, TC_OPEN)) {
        p->state = P_TOOL;
    } else if (!strcmp(mark, CH_CLOSE) || !strcmp(mark, TC_CLOSE)) {
        close_state(p, 1);
        p->state = P_CONTENT;
    } else { /* the turn ends */
        close_state(p, 0);
        p->state = P_ENDED;
    }
}

/* Scans pending text: text before the leftmost marker goes to the state, the marker moves it;
 * at the end, a tail that may be the start of a marker waits (all of it is text when final). */
static void scan(g4_chat_parser *p, int final) {
    size_t off = 0;
    while (off < p->pending.len && p->state != P_ENDED && !p->failed) {
        const char *s = p->pending.p + off;
        size_t n = p->pending.len - off;
        if (p->state == P_START) {
            size_t m = strlen(MODEL_TURN);
            if (!final && n < m && !memcmp(s, MODEL_TURN, n)) break;
            if (n >= m && !memcmp(s, MODEL_TURN, m)) off += m;
            p->state = P_CONTENT;
            continue;
        }
        const char *const *marks = p->state == P_TOOL ? TOOL_MARKS : p->state == P_CONTENT ? CONTENT_MARKS : THINK_MARKS;
        /* the leftmost marker, in one pass over the text (every marker starts with '<'): a text of
         * many markers of one kind is not rescanned for the others at each of them */
        const char *best = NULL;
        size_t at = n;
        for (const char *q = memchr(s, '<', n); q && !best; q = memchr(q + 1, '<', (size_t)(s + n - q - 1)))
            for (int k = 0; marks[k]; k++) {
                size_t ml = strlen(marks[k]);
                if ((size_t)(s + n - q) >= ml && !memcmp(q, marks[k], ml)) {
                    best = marks[k];
                    at = (size_t)(q - s);
                    break;
                }
            }
        if (best) {
            state_text(p, s, at);
            off += at + strlen(best);
            take_marker(p, best);
            continue;
        }
        int n_marks = 0;
        while (marks[n_marks]) n_marks++;
        size_t hold = final ? 0 : g4_tail_prefix_len(s, n, marks, NULL, n_marks);
        state_text(p, s, n - hold);
        off += n - hold;
        break;
    }
    if (p->state == P_ENDED) off = p->pending.len;
    memmove(p->pending.p, p->pending.p + off, p->pending.len - off);
    p->pending.len -= off;
    p->pending.p[p->pending.len] = 0;
}

int g4_chat_parser_push(g4_chat_parser *p, const char *text, size_t len, g4_error *err) {
    if (p->state == P_ENDED || !len) return p->failed ? g4_fail(err, "chat output: out of memory") : 0;
    g4_strbuf_put(&p->pending, text, len);
    if (p->pending.failed) p->failed = 1;
    else scan(p, 0);
    if (p->failed || p->name.failed || p->tool.failed || p->content_ws.failed || p->think_ws.failed)
        return g4_fail(err, "chat output: out of memory");
    return 0;
}

int g4_chat_parser_finish(g4_chat_parser *p, g4_error *err) {
    if (p->state != P_ENDED) {
        if (p->pending.len) scan(p, 1);
        if (p->state == P_START) p->state = P_CONTENT;
        close_state(p, 0);
        p->state = P_ENDED;
    }
    return p->failed ? g4_fail(err, "chat output: out of memory") : 0;
}

/* ------------------------------------------------------------ messages */

int g4_chat_accum_add(g4_chat_accum *a, g4_event_kind kind, const char *text, size_t len) {
    if (kind == G4_EVENT_TEXT) {
        g4_strbuf_put(&a->content, text, len);
    } else if (kind == G4_EVENT_THINKING) {
        g4_strbuf_put(&a->thinking, text, len);
    } else if (kind == G4_EVENT_TOOL_CALL) {
        if (a->n_calls++) g4_strbuf_put(&a->calls, ",", 1);
        g4_strbuf_put(&a->calls, text, len);
    }
    return a->content.failed || a->thinking.failed || a->calls.failed ? -1 : 0;
}

int g4_chat_accum_message(const g4_chat_accum *a, g4_chat_message *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    out->content = g4_strndup(g4_strbuf_str(&a->content), a->content.len);
    out->thinking = g4_strndup(g4_strbuf_str(&a->thinking), a->thinking.len);
    out->tool_calls = malloc(a->calls.len + 3);
    if (!out->content || !out->thinking || !out->tool_calls) {
        g4_chat_message_free(out);
        return g4_fail(err, "chat output: out of memory");
    }
    out->tool_calls[0] = '[';
    memcpy(out->tool_calls + 1, g4_strbuf_str(&a->calls), a->calls.len);
    memcpy(out->tool_calls + 1 + a->calls.len, "]", 2);
    out->n_tool_calls = a->n_calls;
    return 0;
}

void g4_chat_accum_free(g4_chat_accum *a) {
    g4_strbuf_free(&a->content);
    g4_strbuf_free(&a->thinking);
    g4_strbuf_free(&a->calls);
    a->n_calls = 0;
}

static int accum_piece(g4_event_kind kind, const char *text, size_t len, void *user) {
    return g4_chat_accum_add(user, kind, text, len);
}

int g4_chat_parse(const char *text, size_t len, g4_chat_message *out, g4_error *err) {
    G4_ARG(out, err);
    memset(out, 0, sizeof *out);
    if (!text && len) return g4_fail(err, "g4_chat_parse: text is NULL (%zu bytes)", len);
    g4_chat_accum acc = {0};
    g4_chat_parser *p = g4_chat_parser_new(accum_piece, &acc);
    int rc = !p ? g4_fail(err, "chat output: out of memory")
                : (g4_chat_parser_push(p, text, len, err) || g4_chat_parser_finish(p, err) ||
                   g4_chat_accum_message(&acc, out, err)) ? -1 : 0;
    g4_chat_parser_free(p);
    g4_chat_accum_free(&acc);
    return rc;
}

void g4_chat_message_free(g4_chat_message *m) {
    if (!m) return;
    free(m->content);
    free(m->thinking);
    free(m->tool_calls);
    memset(m, 0, sizeof *m);
}
