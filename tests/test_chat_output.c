/* Parsing Gemma 4 output: thinking, content, tool calls; every case also streamed in pieces.  The tool-call notation is checked by a
 * round trip through the checkpoints' own templates: an assistant message with tool_calls is
 * rendered by the template (its format_argument macro writes the arguments), the rendered text
 * is parsed back, and the calls must equal the originals as JSON. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "chat/chat.h"

/* g4_chat_parse's result with the tool calls as JSON values. */
typedef struct {
    char *thinking, *content;
    json_t *tool_calls;
} parsed;

static void parsed_free(parsed *o) {
    free(o->thinking);
    free(o->content);
    json_decref(o->tool_calls);
    memset(o, 0, sizeof *o);
}

static int piece_into(g4_event_kind kind, const char *text, size_t len, void *user) {
    return g4_chat_accum_add(user, kind, text, len);
}

/* The streaming parser fed in pieces of `step` bytes (0: a pseudo-random split). */
static int parse_pieces(const char *text, size_t len, size_t step, g4_chat_message *m) {
    g4_chat_accum acc = {0};
    g4_chat_parser *p = g4_chat_parser_new(piece_into, &acc);
    g4_error err;
    int rc = p ? 0 : -1;
    unsigned seed = (unsigned)len;
    for (size_t at = 0; rc == 0 && at < len;) {
        seed = seed * 1103515245u + 12345u;
        size_t k = step ? step : 1 + (seed >> 16) % 9;
        if (k > len - at) k = len - at;
        rc = g4_chat_parser_push(p, text + at, k, &err);
        at += k;
    }
    if (rc == 0) rc = g4_chat_parser_finish(p, &err);
    if (rc == 0) rc = g4_chat_accum_message(&acc, m, &err);
    g4_chat_parser_free(p);
    g4_chat_accum_free(&acc);
    return rc;
}

static int same_message(const g4_chat_message *a, const g4_chat_message *b) {
    return !strcmp(a->content, b->content) && !strcmp(a->thinking, b->thinking) &&
           !strcmp(a->tool_calls, b->tool_calls) && a->n_tool_calls == b->n_tool_calls;
}

/* g4_chat_parse, checked against the same parser streamed byte by byte and in random pieces. */
static int parse_into(const char *text, size_t len, parsed *o, g4_error *err) {
    memset(o, 0, sizeof *o);
    g4_chat_message m, bytes, pieces;
    if (g4_chat_parse(text, len, &m, err)) return -1;
    CHECK(parse_pieces(text, len, 1, &bytes) == 0 && parse_pieces(text, len, 0, &pieces) == 0);
    CHECKF(same_message(&m, &bytes) && same_message(&m, &pieces), "streamed parse differs for [%.*s]: [%s|%s|%s]",
           (int)len, text, bytes.content, bytes.thinking, bytes.tool_calls);
    g4_chat_message_free(&bytes);
    g4_chat_message_free(&pieces);
    o->tool_calls = json_loads(m.tool_calls, 0, NULL);
    CHECKF(json_is_array(o->tool_calls) && json_array_size(o->tool_calls) == (size_t)m.n_tool_calls,
           "tool_calls %s (%d)", m.tool_calls, m.n_tool_calls);
    o->thinking = m.thinking;
    o->content = m.content;
    free(m.tool_calls);
    return 0;
}

static parsed parse(const char *text) {
    parsed o;
    g4_error err = {{0}};
    int rc = parse_into(text, strlen(text), &o, &err);
    CHECKF(rc == 0, "parse failed: %s", err.msg);
    if (rc) memset(&o, 0, sizeof o);
    return o;
}

static int json_text_equal(const json_t *v, const char *want_json) {
    json_t *w = json_loads(want_json, JSON_DECODE_ANY, NULL);
    int eq = w && json_equal((json_t *)v, w);
    if (!eq) {
        char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        fprintf(stderr, "  want %s\n  got  %s\n", want_json, got ? got : "(null)");
        free(got);
    }
    json_decref(w);
    return eq;
}

static void test_thinking(void) {
    parsed o = parse("<|channel>thought\nLet me think.\nStep 2.<channel|>The answer is 4.<turn|>");
    CHECK(o.thinking && !strcmp(o.thinking, "Let me think.\nStep 2."));
    CHECK(o.content && !strcmp(o.content, "The answer is 4."));
    CHECK(json_array_size(o.tool_calls) == 0);
    parsed_free(&o);

    o = parse("Plain answer.\n<turn|>ignored after the end");
    CHECK(!strcmp(o.thinking, "") && !strcmp(o.content, "Plain answer."));
    parsed_free(&o);

    /* the empty thought block of the no-thinking generation prompt */
    o = parse("<|channel>thought\n<channel|>Hi there!<eos>");
    CHECK(!strcmp(o.thinking, "") && !strcmp(o.content, "Hi there!"));
    parsed_free(&o);

    /* unterminated thinking (cut off by max_tokens): all of it is thinking */
    o = parse("<|channel>thought\nstill thinking about");
    CHECK(!strcmp(o.thinking, "still thinking about") && !strcmp(o.content, ""));
    parsed_free(&o);

    /* a whole model turn */
    o = parse("<|turn>model\n<|channel>thought\nA<channel|>B<turn|>");
    CHECK(!strcmp(o.thinking, "A") && !strcmp(o.content, "B"));
    parsed_free(&o);

    o = parse("");
    CHECK(o.content && !strcmp(o.content, "") && json_array_size(o.tool_calls) == 0);
    parsed_free(&o);
}

static void test_tool_calls(void) {
    parsed o = parse(
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|><|tool_response>");
    CHECK(json_array_size(o.tool_calls) == 1);
    CHECK(json_text_equal(o.tool_calls,
                          "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]"));
    CHECK(!strcmp(o.content, ""));
    parsed_free(&o);

    /* nested values; strings holding braces, commas, colons, brackets and quotes */
    o = parse("<|channel>thought\nneed two calls<channel|>"
              "<|tool_call>call:search{q:<|\"|>a, {b}: c] \"d\"<|\"|>,opts:{deep:[1,2.5,<|\"|>x,y<|\"|>,"
              "true,None,{k:false}],n:-4,e:1e-07},empty:{},list:[]}<tool_call|>"
              "<|tool_call>call:ns.tool_2{}<tool_call|>");
    CHECK(!strcmp(o.thinking, "need two calls"));
    CHECK(json_text_equal(
        o.tool_calls,
        "[{\"name\": \"search\", \"arguments\": {\"q\": \"a, {b}: c] \\\"d\\\"\", \"opts\": {\"deep\": "
        "[1, 2.5, \"x,y\", true, null, {\"k\": false}], \"n\": -4, \"e\": 1e-07}, \"empty\": {}, "
        "\"list\": []}}, {\"name\": \"ns.tool_2\", \"arguments\": {}}]"));
    parsed_free(&o);

    /* quoted keys (format_argument with escape_keys) are accepted too */
    o = parse("<|tool_call>call:f{<|\"|>a b<|\"|>:1}<tool_call|>");
    CHECK(json_text_equal(o.tool_calls, "[{\"name\": \"f\", \"arguments\": {\"a b\": 1}}]"));
    parsed_free(&o);

    /* arguments that were a JSON string (OpenAI style) come back as the object */
    o = parse("<|tool_call>call:f{{\"x\": [1, 2], \"y\": \"z\"}}<tool_call|>");
    CHECK(json_text_equal(o.tool_calls, "[{\"name\": \"f\", \"arguments\": {\"x\": [1, 2], \"y\": \"z\"}}]"));
    parsed_free(&o);

    /* text around tool calls stays content */
    o = parse("Checking.<|tool_call>call:f{a:1}<tool_call|> Done?");
    CHECK(!strcmp(o.content, "Checking. Done?"));
    CHECK(json_array_size(o.tool_calls) == 1);
    parsed_free(&o);

    /* a call cut off before <tool_call|> but complete still counts */
    o = parse("<|tool_call>call:f{a:<|\"|>v<|\"|>}");
    CHECK(json_text_equal(o.tool_calls, "[{\"name\": \"f\", \"arguments\": {\"a\": \"v\"}}]"));
    parsed_free(&o);
}

static void test_bad_tool_calls(void) {
    const char *bad[] = {
        "<|tool_call>call:f{a:}<tool_call|>",
        "<|tool_call>call:f{a:<|\"|>unterminated}<tool_call|>",
        "<|tool_call>call:{a:1}<tool_call|>",
        "<|tool_call>f{a:1}<tool_call|>",
        "<|tool_call>call:f{a:1,}<tool_call|>",
        "<|tool_call>call:f{a:1} trailing<tool_call|>",
        "<|tool_call>call:f{a:[1,2}<tool_call|>",
        "<|tool_call>call:f{a:bareword}<tool_call|>",
        "<|tool_call>call:f{a:99999999999999999999999}<tool_call|>",
        "<|tool_call>call:f{a:1",
        "<|tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        parsed o = parse(bad[i]);
        CHECKF(o.tool_calls && json_array_size(o.tool_calls) == 0, "bad call %zu parsed", i);
        CHECKF(o.content && strstr(o.content, "<|tool_call>") != NULL, "bad call %zu not kept as text: %s",
               i, o.content ? o.content : "(null)");
        parsed_free(&o);
    }
    /* garbage and deep nesting: never a crash */
    unsigned seed = 7;
    const char *atoms[] = {"<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", "call:", "f",
                           "{", "}", "[", "]", ":", ",", "<|\"|>", "1", "-2.5e3", "true", "None",
                           "x", " ", "\n", "<turn|>", "\xff", "é"};
    char buf[4096];
    for (int round = 0; round < 3000; round++) {
        size_t n = 0;
        int parts = 1 + round % 40;
        for (int k = 0; k < parts; k++) {
            seed = seed * 1103515245u + 12345u;
            const char *a = atoms[(seed >> 8) % (sizeof atoms / sizeof atoms[0])];
            size_t l = strlen(a);
            if (n + l >= sizeof buf) break;
            memcpy(buf + n, a, l);
            n += l;
        }
        parsed o;
        g4_error err;
        if (parse_into(buf, n, &o, &err) == 0) parsed_free(&o);
    }
    char *deep = malloc(200100);
    size_t n = (size_t)sprintf(deep, "<|tool_call>call:f{a:");
    for (int i = 0; i < 100000; i++) deep[n++] = '[';
    memcpy(deep + n, "<tool_call|>", 12);
    n += 12;
    parsed o;
    g4_error err;
    CHECK(parse_into(deep, n, &o, &err) == 0 && json_array_size(o.tool_calls) == 0);
    parsed_free(&o);
    free(deep);
}

/* Render tool calls with each template, parse the text back, compare with the originals. */
static void test_round_trip(void) {
    const char *calls_json =
        "[{\"id\": \"1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Saint-Petersburg, {Russia}: [north]\", \"days\": 3, "
        "\"units\": null, \"exact\": true, \"ratio\": 0.25, \"tiny\": 1e-07, \"huge\": 1e+20, "
        "\"neg\": -17, \"quote\": \"he said \\\"hi\\\" <b>\", \"unicode\": \"Толстой 日本 é\", "
        "\"empty\": \"\", \"list\": [1, \"two, three\", [false, {\"deep\": {\"er\": [null]}}]], "
        "\"nested\": {\"z\": 1, \"a\": {\"b\": \"c:d\"}, \"m\": []}, \"obj\": {}}}}, "
        "{\"id\": \"2\", \"type\": \"function\", \"function\": {\"name\": \"noop\", \"arguments\": {}}}, "
        "{\"id\": \"3\", \"type\": \"function\", \"function\": {\"name\": \"json_args\", "
        "\"arguments\": \"{\\\"q\\\": [1, 2], \\\"s\\\": \\\"x\\\"}\"}}]";
    json_t *calls = json_loads(calls_json, 0, NULL);
    CHECK(calls != NULL);
    const char *names[] = {"gemma-4-31b-it", "gemma-4-31b-it.release", "gemma-4-e2b-it.release"};
    for (size_t k = 0; k < 3 && calls; k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "chat_templates/%s.jinja", names[k]);
        g4_error err = {{0}};
        g4_chat_template *t = NULL;
        if (g4_chat_template_load_file(g4t_shared(rel), "<bos>", "<eos>", &t, &err)) {
            CHECKF(0, "%s: %s", names[k], err.msg);
            continue;
        }
        json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:O}]", "role", "user", "content", "weather?",
                                 "role", "assistant", "tool_calls", calls);
        char *text = NULL;
        size_t len = 0;
        int rc = g4_chat_template_render(t, msgs, NULL, &text, &len, &err);
        CHECKF(rc == 0, "%s: %s", names[k], err.msg);
        if (rc == 0) {
            /* the model's part: everything after the last "<|turn>model\n" */
            const char *turn = strstr(text, "<|turn>model\n");
            CHECK(turn != NULL);
            parsed o;
            rc = parse_into(turn, len - (size_t)(turn - text), &o, &err);
            CHECK(rc == 0);
            CHECKF(json_array_size(o.tool_calls) == json_array_size(calls), "%s: %zu calls parsed from %s",
                   names[k], json_array_size(o.tool_calls), turn);
            for (size_t i = 0; i < json_array_size(calls) && i < json_array_size(o.tool_calls); i++) {
                json_t *fn = json_object_get(json_array_get(calls, i), "function");
                json_t *got = json_array_get(o.tool_calls, i);
                json_t *want_args = json_object_get(fn, "arguments");
                json_t *parsed_args = NULL;
                if (json_is_string(want_args))
                    want_args = parsed_args = json_loads(json_string_value(want_args), 0, NULL);
                CHECKF(json_equal(json_object_get(got, "name"), json_object_get(fn, "name")),
                       "%s: call %zu name", names[k], i);
                int eq = json_equal(json_object_get(got, "arguments"), want_args);
                CHECKF(eq, "%s: call %zu arguments differ after the round trip", names[k], i);
                if (!eq) {
                    char *w = json_dumps(want_args, 0);
                    json_text_equal(json_object_get(got, "arguments"), w ? w : "null");
                    free(w);
                }
                json_decref(parsed_args);
            }
            CHECKF(!strcmp(o.content, ""), "%s: content [%s]", names[k], o.content);
            parsed_free(&o);
        }
        free(text);
        json_decref(msgs);
        g4_chat_template_free(t);
    }
    json_decref(calls);
}

int main(void) {
    test_thinking();
    test_tool_calls();
    test_bad_tool_calls();
    test_round_trip();
    return g4t_done();
}
