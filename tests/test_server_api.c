/* The server's request parser (src/server/api.h), no model and no network: OpenAI's fields become the
 * engine's parameters and the chat template's conversation; every bad field is a 4xx naming it with a
 * one-line message; the API key comparison. */
#include <string.h>

#include "check.h"
#include "server/api.h"

static const srv_limits LIM = {.max_tokens = 100, .max_n = 4, .max_prompts = 3, .max_media = 1, .vocab_size = 1000,
                               .hidden_size = 64};

static int parse(srv_kind kind, const char *body, int tool_role, srv_request *r, srv_error *e) {
    memset(e, 0, sizeof *e);
    return srv_parse_request(kind, body, strlen(body), &LIM, tool_role, r, e);
}

/* A body that must fail with this status and param. */
static void bad(srv_kind kind, const char *body, int status, const char *param) {
    srv_request r;
    srv_error e;
    int rc = parse(kind, body, 0, &r, &e);
    CHECKF(rc == -1 && e.status == status && (!param || !strcmp(e.param, param)) && e.msg[0] && !strchr(e.msg, '\n'),
           "%s -> %d %s '%s' (want %d %s)", body, e.status, e.param, e.msg, status, param ? param : "");
    if (rc == 0) srv_request_free(&r);
}

static json_t *messages_of(const srv_request *r) { return json_object_get(r->chat, "messages"); }

static int str_is(const json_t *v, const char *s) { return json_is_string(v) && !strcmp(json_string_value(v), s); }

static void test_chat(void) {
    srv_request r;
    srv_error e;
    const char *body =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}], \"name\": \"bob\"},"
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
        "\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"ok\\\": true}\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
        "\"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 20, \"min_p\": 0.1, \"seed\": -3, \"n\": 2, \"max_tokens\": 7,"
        "\"presence_penalty\": 1.5, \"frequency_penalty\": -0.5, \"stop\": \"END\", \"logprobs\": true, \"top_logprobs\": 4,"
        "\"logit_bias\": {\"17\": -100}, \"stream\": true, \"stream_options\": {\"include_usage\": true},"
        "\"reasoning_effort\": \"low\", \"unknown_field\": [1, 2]}";
    CHECKF(parse(SRV_CHAT, body, 0, &r, &e) == 0, "%s", e.msg);
    CHECK(!strcmp(r.model, "m") && r.stream && r.include_usage && r.n == 2 && r.max_tokens == 7);
    CHECK(r.have_temperature && r.temperature == 0.5f && r.have_top_p && r.top_p == 0.9f && r.have_top_k && r.top_k == 20);
    CHECK(r.have_min_p && r.have_seed && r.seed == (uint64_t)-3 && r.presence_penalty == 1.5f && r.frequency_penalty == -0.5f);
    CHECK(r.n_stops == 1 && !strcmp(r.stops[0], "END") && r.logprobs && r.top_logprobs == 4);
    CHECK(r.n_bias == 1 && r.bias_ids[0] == 17 && r.bias_values[0] == -100.0f);
    CHECK(json_is_true(json_object_get(r.chat, "enable_thinking")) && json_array_size(json_object_get(r.chat, "tools")) == 1);
    json_t *m = messages_of(&r);
    /* developer -> system; parts kept; the tool result on the assistant message (release templates) */
    CHECK(json_array_size(m) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(m, 0), "role")), "system"));
    CHECK(json_is_array(json_object_get(json_array_get(m, 1), "content")) && !json_object_get(json_array_get(m, 1), "name"));
    json_t *asst = json_array_get(m, 2);
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(asst, "tool_calls"), 0), "function"), "arguments");
    CHECK(json_is_object(args) && json_integer_value(json_object_get(args, "a")) == 1);
    json_t *resp = json_array_get(json_object_get(asst, "tool_responses"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(resp, "name")), "f") &&
          json_is_true(json_object_get(json_object_get(resp, "response"), "ok")));
    srv_request_free(&r);

    /* a template that reads role "tool": the message stays, with the function's name */
    CHECK(parse(SRV_CHAT, body, 1, &r, &e) == 0);
    m = messages_of(&r);
    json_t *tool = json_array_get(m, 3);
    CHECK(json_array_size(m) == 4 && !strcmp(json_string_value(json_object_get(tool, "role")), "tool") &&
          !strcmp(json_string_value(json_object_get(tool, "name")), "f") &&
          !strcmp(json_string_value(json_object_get(tool, "tool_call_id")), "c1"));
    srv_request_free(&r);

    /* an assistant's thinking goes to the template (31B's writes it within a tool-calling turn); a tool message
     * whose tool_call_id answers no call keeps the function name it gives */
    CHECKF(parse(SRV_CHAT,
                 "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"},"
                 "{\"role\": \"assistant\", \"reasoning_content\": \"think\", \"reasoning\": \"again\", \"tool_calls\": "
                 "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},"
                 "{\"role\": \"tool\", \"name\": \"g\", \"content\": \"ok\"}]}",
                 1, &r, &e) == 0,
           "%s", e.msg);
    m = messages_of(&r);
    CHECK(str_is(json_object_get(json_array_get(m, 1), "reasoning_content"), "think") &&
          str_is(json_object_get(json_array_get(m, 1), "reasoning"), "again") &&
          str_is(json_object_get(json_array_get(m, 2), "name"), "g"));
    srv_request_free(&r);

    /* chat_template_kwargs pass through; their enable_thinking is the template's switch; tool_choice none hides tools */
    CHECK(parse(SRV_CHAT,
                "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"none\","
                "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
                "\"chat_template_kwargs\": {\"enable_thinking\": false, \"k\": 1}, \"max_completion_tokens\": 3}",
                0, &r, &e) == 0);
    CHECK(json_is_false(json_object_get(r.chat, "enable_thinking")) && !json_object_get(r.chat, "tools") &&
          json_object_get(json_object_get(r.chat, "chat_template_kwargs"), "k") && r.max_tokens == 3 && r.n == 1);
    srv_request_free(&r);

    /* tools of distinct names pass as they are (names are compared whole: "f" is not "f2") */
    CHECKF(parse(SRV_CHAT,
                 "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": ["
                 "{\"type\": \"function\", \"function\": {\"name\": \"f\"}},"
                 "{\"type\": \"function\", \"function\": {\"name\": \"f2\", \"parameters\": null}}]}",
                 0, &r, &e) == 0,
           "%s", e.msg);
    CHECK(json_array_size(json_object_get(r.chat, "tools")) == 2);
    srv_request_free(&r);
}

static void test_prompts(void) {
    srv_request r;
    srv_error e;
    CHECK(parse(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": \"hello\"}", 0, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && !strcmp(r.prompts[0].text, "hello") && r.max_tokens == 16 && !r.logprobs);
    srv_request_free(&r);
    CHECK(parse(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": [1, 2, 3], \"logprobs\": 2, \"echo\": false}", 0, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && !r.prompts[0].text && r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 3 && r.logprobs &&
          r.top_logprobs == 2);
    srv_request_free(&r);
    CHECK(parse(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": [[5], \"a\", [6, 7]]}", 0, &r, &e) == 0);
    CHECK(r.n_prompts == 3 && r.prompts[0].ids[0] == 5 && !strcmp(r.prompts[1].text, "a") && r.prompts[2].n_ids == 2);
    srv_request_free(&r);
    /* completions take the constraints too (llama-server's grammar) */
    CHECK(parse(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": \"x\", \"grammar\": \"root ::= [0-9]+\"}", 0, &r, &e) == 0 &&
          r.grammar);
    srv_request_free(&r);
    CHECK(parse(SRV_EMBEDDING, "{\"model\": \"m\", \"input\": [\"a\", \"b\"], \"encoding_format\": \"base64\", \"dimensions\": 64}",
                0, &r, &e) == 0);
    CHECK(r.n_prompts == 2 && r.base64);
    srv_request_free(&r);
}

static void test_errors(void) {
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [", 400, NULL);
    bad(SRV_CHAT, "[]", 400, "body");
    bad(SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 400, "model");
    bad(SRV_CHAT, "{\"model\": \"m\"}", 400, "messages");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": []}", 400, "messages");
    const char *head = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], ";
    static const struct {
        const char *field, *param;
    } cases[] = {
        {"\"temperature\": 3", "temperature"},      {"\"temperature\": \"1\"", "temperature"},
        {"\"top_p\": 0", "top_p"},                  {"\"n\": 5", "n"},
        {"\"max_tokens\": 101", "max_tokens"},      {"\"max_tokens\": 2.0", "max_tokens"},
        {"\"seed\": 1.5", "seed"},                  {"\"stop\": [1]", "stop"},
        {"\"stop\": \"\"", "stop"},                  {"\"stop\": [\"END\", \"\"]", "stop"},
        {"\"logit_bias\": {\"1000\": 1}", "logit_bias"}, {"\"logit_bias\": {\"1\": 101}", "logit_bias"},
        {"\"stream_options\": {}", "stream_options"}, {"\"top_logprobs\": 2", "top_logprobs"},
        {"\"tool_choice\": \"required\"", "tool_choice"}, {"\"tools\": [{\"type\": \"x\"}]", "tools"},
        {"\"response_format\": {\"type\": \"json_schema\"}", "response_format.json_schema"},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
         "{\"type\": \"string\", \"pattern\": \"a+\"}}}", "response_format.json_schema.schema"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
         "\"function\", \"function\": {\"name\": \"g\"}}", "tools"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
         "\"function\"}", "tool_choice"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\", "
         "\"response_format\": {\"type\": \"json_object\"}", "response_format"},
        {"\"response_format\": {\"type\": \"json_object\"}, \"grammar\": \"root ::= \\\"x\\\"\"", "grammar"},
        {"\"guided_regex\": \"a\", \"guided_choice\": [\"a\"]", "guided_choice"},
        {"\"grammar\": \"root ::= undefined\"", "grammar"}, {"\"guided_choice\": \"a\"", "guided_choice"},
        {"\"guided_choice\": [\"a\", 1]", "guided_choice"}, {"\"guided_regex\": \"(a\"", "guided_regex"},
        {"\"structured_outputs\": {\"regex\": \"a\", \"choice\": [\"a\"]}", "structured_outputs"},
        {"\"json_schema\": {\"type\": \"strng\"}", "json_schema"},
        {"\"reasoning_effort\": \"extreme\"", "reasoning_effort"}, {"\"best_of\": 2", "best_of"},
        {"\"modalities\": [\"audio\"]", "modalities"},
        /* sampling values outside what vLLM and OpenAI take: top_k -1 and 0 are off, below is an error */
        {"\"top_k\": -2", "top_k"},                {"\"top_k\": 2147483648", "top_k"},
        {"\"top_k\": 40.5", "top_k"},              {"\"min_p\": 1.5", "min_p"},
        {"\"min_p\": -0.1", "min_p"},              {"\"top_p\": 1.01", "top_p"},
        {"\"temperature\": -0.5", "temperature"},  {"\"repetition_penalty\": 0", "repetition_penalty"},
        {"\"presence_penalty\": 2.5", "presence_penalty"}, {"\"frequency_penalty\": -3", "frequency_penalty"},
        {"\"logit_bias\": {\"1\": \"x\"}", "logit_bias"}, {"\"logit_bias\": {\"-1\": 1}", "logit_bias"},
        /* tools are checked also when tool_choice "none" hides them */
        {"\"tool_choice\": \"none\", \"tools\": \"f\"", "tools"},
        /* a tool the model could not call by name: empty, not a string, or two of one name */
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"\"}}]", "tools.function.name"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": 7}}]", "tools.function.name"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": null}}]", "tools.function.name"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", "
         "\"function\": {\"name\": \"g\"}}, {\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
         "tools.function.name"},
    };
    char body[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "%s%s}", head, cases[i].field);
        bad(SRV_CHAT, body, 400, cases[i].param);
    }
    /* constrained output: a schema, or forced tool calls, become the request's grammar */
    static const char *const grammars[] = {
        "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", \"strict\": true, "
        "\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}}}",
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"x\": {\"type\": \"string\"}}}}}], \"tool_choice\": \"required\"",
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": "
        "\"function\", \"function\": {\"name\": \"f\"}}, \"parallel_tool_calls\": false",
        /* llama.cpp's and vLLM's fields */
        "\"grammar\": \"root ::= [a-z]+\"", "\"json_schema\": {\"type\": \"integer\"}",
        "\"guided_json\": \"{\\\"type\\\": \\\"boolean\\\"}\"", "\"guided_regex\": \"\\\\d+\"",
        "\"guided_choice\": [\"yes\", \"no\"]", "\"guided_grammar\": \"root ::= \\\"x\\\"\"",
        "\"structured_outputs\": {\"choice\": [\"a\"]}"};
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
        srv_request r;
        srv_error e2;
        snprintf(body, sizeof body, "%s%s}", head, grammars[i]);
        CHECKF(parse(SRV_CHAT, body, 0, &r, &e2) == 0 && r.grammar, "%s: %s", grammars[i], e2.msg);
        srv_request_free(&r);
    }
    /* NaN and numbers no double holds are not JSON (RFC 8259; jansson refuses them): a 400, one line */
    static const char *const not_json[] = {"\"temperature\": NaN", "\"temperature\": Infinity", "\"top_p\": 1e999",
                                           "\"temperature\": -1e999"};
    for (size_t i = 0; i < sizeof not_json / sizeof not_json[0]; i++) {
        snprintf(body, sizeof body, "%s%s}", head, not_json[i]);
        bad(SRV_CHAT, body, 400, NULL);
    }
    /* the edges that are valid: a tiny temperature (greedy below 1e-5), min_p 1 (the top tokens only), a top_k
     * far beyond the vocabulary (all of it), top_k -1 (off) */
    static const char *const edges[] = {"\"temperature\": 1e-9, \"min_p\": 1", "\"top_k\": 1073741824",
                                        "\"top_k\": -1, \"top_p\": 1e-9"};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        srv_request r;
        srv_error e2;
        snprintf(body, sizeof body, "%s%s}", head, edges[i]);
        CHECKF(parse(SRV_CHAT, body, 0, &r, &e2) == 0, "%s: %s", edges[i], e2.msg);
        srv_request_free(&r);
    }
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
                  "\"image_url\": {\"url\": \"data:image/png;base64,AAAA\"}}]}]}", 400, "messages.content");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_audio\"}, "
                  "{\"type\": \"input_audio\"}]}]}", 400, "messages.content");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", 400, "messages");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": 7, \"content\": \"x\"}]}", 400, "messages.role");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": 1}]}]}", 400,
        "messages.content.type");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
                  "\"bogus\"}", 400, "tool_choice");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": "
                  "{\"name\": \"f\", \"arguments\": \"[1]\"}}]}]}", 400, "messages.tool_calls");
    /* tool_calls that are not a list, thinking that is not text, a tool message's name that is not a string */
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"tool_calls\": {}}]}", 400,
        "messages.tool_calls");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"content\": \"a\", "
                  "\"reasoning_content\": 1}]}", 400, "messages.reasoning_content");
    bad(SRV_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
                  "\"tool_calls\": [{\"id\": \"c\", \"function\": {\"name\": \"f\"}}]}, {\"role\": \"tool\", \"name\": 3, "
                  "\"content\": \"x\"}]}", 400, "messages.name");
    bad(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": [1000]}", 400, "prompt");
    bad(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": [\"a\", \"b\", \"c\", \"d\"]}", 400, "prompt");
    bad(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": []}", 400, "prompt");
    bad(SRV_COMPLETION, "{\"model\": \"m\", \"prompt\": \"a\", \"echo\": true, \"logprobs\": 1}", 400, "echo");
    bad(SRV_EMBEDDING, "{\"model\": \"m\", \"input\": \"\"}", 400, "input");
    bad(SRV_EMBEDDING, "{\"model\": \"m\", \"input\": \"a\", \"dimensions\": 3}", 400, "dimensions");

    /* the error body: OpenAI's shape, also for a message quoting bytes that are not UTF-8 */
    srv_error e;
    srv_fail(&e, 400, "x", "c", "bad \xff value\nsecond line");
    char *js = srv_error_json(&e);
    json_t *o = js ? json_loads(js, 0, NULL) : NULL;
    json_t *err = json_object_get(o, "error");
    CHECKF(err && json_is_string(json_object_get(err, "message")) &&
               !strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error") &&
               !strcmp(json_string_value(json_object_get(err, "param")), "x") && !strchr(e.msg, '\n'),
           "%s", js ? js : "NULL");
    json_decref(o);
    free(js);
    srv_fail(&e, 503, NULL, NULL, "busy");
    js = srv_error_json(&e);
    CHECK(js && strstr(js, "\"server_error\"") && strstr(js, "\"param\":null") && strstr(js, "\"code\":null"));
    free(js);

    /* bytes that are not JSON at all, and every prefix of a valid body, fail cleanly */
    const char *valid = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                        "\"text\": \"x\"}]}], \"stop\": [\"a\"], \"logit_bias\": {\"3\": 1}}";
    for (size_t n = 0; n < strlen(valid); n++) {
        srv_request r;
        if (srv_parse_request(SRV_CHAT, valid, n, &LIM, 0, &r, &e) == 0) srv_request_free(&r);
    }
    srv_request r;
    CHECK(srv_parse_request(SRV_CHAT, valid, strlen(valid), &LIM, 0, &r, &e) == 0);
    srv_request_free(&r);
}

static void test_api_key(void) {
    CHECK(srv_check_api_key("Bearer sk-123", "sk-123"));
    CHECK(!srv_check_api_key("Bearer sk-1234", "sk-123"));
    CHECK(!srv_check_api_key("Bearer sk-12", "sk-123"));
    CHECK(!srv_check_api_key("Bearer ", "sk-123"));
    CHECK(!srv_check_api_key("bearer sk-123", "sk-123"));
    CHECK(!srv_check_api_key("sk-123", "sk-123"));
    CHECK(!srv_check_api_key(NULL, "sk-123"));
}

/* Image and audio parts for a model with both towers: their bytes, base64-decoded (RFC 4648's test vectors, section
 * 10, with and without padding, and with ASCII whitespace inside, as Python's b64decode discards it), in message
 * order, the template's {"type": "image"} / {"type": "audio"} parts in their place; http(s) URLs (image_url,
 * audio_url) kept to be fetched; a remote URL where fetching is off, other schemes, a data URL that is not base64,
 * bad base64, an input_audio without data, and more parts than max_media are 400s. */
static void test_media(void) {
    const srv_limits lim = {.max_tokens = 100, .max_n = 4, .max_prompts = 3, .max_media = 3, .vocab_size = 1000,
                            .hidden_size = 64, .have_vision = 1, .have_audio = 1};
    static const char *const vectors[][2] = {{"Zg==", "f"}, {"Zm8=", "fo"}, {"Zm9v", "foo"}, {"Zm9vYg==", "foob"},
                                             {"Zm9vYmE=", "fooba"}, {"Zm9vYmFy", "foobar"}, {"Zm9vYg", "foob"},
                                             {"Zm9vYmE", "fooba"}, {"Zm9v\\r\\nYmFy\\n", "foobar"},
                                             {" Zm 9v\\tYg =\\n=", "foob"}};
    const size_t n_vectors = sizeof vectors / sizeof vectors[0];
    char body[1024];
    for (size_t v = 0; v < n_vectors; v++) {
        snprintf(body, sizeof body,
                 "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                 "\"a\"}, {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,%s\"}}, "
                 "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"%s\", \"format\": \"wav\"}}]}]}",
                 vectors[v][0], vectors[(v + 1) % n_vectors][0]);
        srv_request r;
        srv_error e = {0};
        int rc = srv_parse_request(SRV_CHAT, body, strlen(body), &lim, 0, &r, &e);
        CHECKF(rc == 0, "%s: %s", vectors[v][0], e.msg);
        if (rc) continue;
        const char *a = vectors[v][1], *b = vectors[(v + 1) % n_vectors][1];
        CHECKF(r.n_media == 2 && !r.media[0].audio && r.media[0].len == strlen(a) && !memcmp(r.media[0].data, a, strlen(a)) &&
                   r.media[1].audio && r.media[1].len == strlen(b) && !memcmp(r.media[1].data, b, strlen(b)),
               "%s: %d parts", vectors[v][0], r.n_media);
        const json_t *parts = json_object_get(json_array_get(messages_of(&r), 0), "content");
        CHECK(json_array_size(parts) == 3 && str_is(json_object_get(json_array_get(parts, 1), "type"), "image") &&
              str_is(json_object_get(json_array_get(parts, 2), "type"), "audio"));
        srv_request_free(&r);
    }
    static const char *const wrong[] = {
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"https://example.com/a.png\"}}", /* fetching is off */
        "{\"type\": \"audio_url\", \"audio_url\": {\"url\": \"http://example.com/a.wav\"}}",
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,Zm9v\\u000bYg-\"}}",
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,Zm9v\\u00a0\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"Zm9v\\u001fYg==\"}}",
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png,Zm9v\"}}",
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,Zm9v!\"}}",
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,Z\"}}",
        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"format\": \"wav\"}}",
        "{\"type\": \"input_audio\", \"input_audio\": \"Zm9v\"}",
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"Zm9v\"}}, {\"type\": \"input_audio\", "
        "\"input_audio\": {\"data\": \"Zm9v\"}}, {\"type\": \"input_audio\", \"input_audio\": {\"data\": \"Zm9v\"}}, "
        "{\"type\": \"input_audio\", \"input_audio\": {\"data\": \"Zm9v\"}}",
    };
    for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
        snprintf(body, sizeof body, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [%s]}]}",
                 wrong[w]);
        srv_request r;
        srv_error e = {0};
        int rc = srv_parse_request(SRV_CHAT, body, strlen(body), &lim, 0, &r, &e);
        CHECKF(rc == -1 && e.status == 400 && !strcmp(e.param, "messages.content") && !strchr(e.msg, '\n'),
               "media case %zu -> %d %s '%s'", w, e.status, e.param, e.msg);
        if (rc == 0) srv_request_free(&r);
    }
    /* with fetching on: http(s) URLs are kept, in order with the data; other schemes are refused */
    srv_limits on = lim;
    on.allow_remote_media = 1;
    snprintf(body, sizeof body,
             "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
             "\"image_url\": {\"url\": \"HTTPS://example.com/a.png?x=1\"}}, {\"type\": \"input_audio\", \"input_audio\": "
             "{\"data\": \"Zm9v\"}}, {\"type\": \"audio_url\", \"audio_url\": {\"url\": \"http://example.com/a.wav\"}}]}]}");
    srv_request r;
    srv_error e = {0};
    int rc = srv_parse_request(SRV_CHAT, body, strlen(body), &on, 0, &r, &e);
    CHECKF(rc == 0, "http(s) URLs: %s", e.msg);
    if (rc == 0) {
        CHECK(r.n_media == 3 && !r.media[0].audio && r.media[0].url && !r.media[0].data &&
              !strcmp(r.media[0].url, "HTTPS://example.com/a.png?x=1") && r.media[1].audio && !r.media[1].url &&
              r.media[1].len == 3 && r.media[2].audio && r.media[2].url && !strcmp(r.media[2].url, "http://example.com/a.wav"));
        const json_t *parts = json_object_get(json_array_get(messages_of(&r), 0), "content");
        CHECK(str_is(json_object_get(json_array_get(parts, 2), "type"), "audio"));
        srv_request_free(&r);
    }
    static const char *const schemes[] = {"ftp://example.com/a.png", "file:///etc/passwd", "gopher://example.com/",
                                          "a.png", "//example.com/a.png", "httpx://example.com/a.png"};
    for (size_t w = 0; w < sizeof schemes / sizeof schemes[0]; w++) {
        snprintf(body, sizeof body,
                 "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
                 "\"image_url\": {\"url\": \"%s\"}}]}]}", schemes[w]);
        memset(&e, 0, sizeof e);
        rc = srv_parse_request(SRV_CHAT, body, strlen(body), &on, 0, &r, &e);
        CHECKF(rc == -1 && e.status == 400 && !strcmp(e.param, "messages.content") && !strchr(e.msg, '\n'),
               "%s -> %d %s '%s'", schemes[w], e.status, e.param, e.msg);
        if (rc == 0) srv_request_free(&r);
    }
}

int main(void) {
    test_chat();
    test_media();
    test_prompts();
    test_errors();
    test_api_key();
    return g4t_done();
}
