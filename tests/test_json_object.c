/* Constrained decoding to a JSON object (src/engine/json_object.h): the automaton accepts every prefix of
 * objects RFC 8259 allows and refuses the first byte that breaks one (jansson, an independent parser, agrees
 * on each document); token bytes follow the decoder chain; on the example model, greedy and sampled
 * generations with json_object are objects jansson parses, or (cut by max_new_tokens) prefixes whose only
 * fault for jansson is their end. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "check.h"
#include "engine/json_object.h"
#include "gemma4c.h"
#include "tokenizer/tokenizer.h"

/* How far the automaton reads s: its length when every byte is accepted. */
static size_t accepted(const char *s, int *done) {
    g4_json_state st;
    g4_json_start(&st);
    size_t i = 0;
    while (s[i] && g4_json_feed(&st, s + i, 1) == 0) i++;
    *done = g4_json_done(&st);
    return i;
}

static void test_automaton(void) {
    static const char *const valid[] = {
        "{}", "{\"a\":1}", "{ \"a\" : [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, \"x\\n\\u00e9\\\"\", {}, []] }",
        "{\"k\":{\"n\":{\"m\":[[[]]]}},\"s\":\"\xc3\xa9\\/\"}", "{\"a\":-0.5,\"b\":[{\"c\":\"d\"}]}",
        "{\n\t\"z\": 1234567890, \"y\": 1.23456789012345678901234567890\r\n}",
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        int done;
        size_t n = accepted(valid[i], &done);
        json_t *j = json_loads(valid[i], 0, NULL);
        CHECKF(n == strlen(valid[i]) && done && json_is_object(j), "valid: %s (read %zu, done %d)", valid[i], n, done);
        json_decref(j);
    }
    /* the automaton stops at the byte that makes the prefix impossible */
    static const struct {
        const char *doc;
        size_t at;
    } invalid[] = {
        {"[1]", 0},         {"{a:1}", 1},        {"{\"a\" 1}", 5},     {"{\"a\":01}", 6},
        {"{\"a\":1.}", 7}, {"{\"a\":-}", 6},   {"{\"a\":1e}", 7},   {"{\"a\":tru}", 8},   {"{\"a\":nul1}", 8},
        {"{\"a\":[1,]}", 8}, {"{\"a\":1,}", 7}, {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\u12g4\"}", 10},
        {"{\"a\":\"\n\"}", 6}, {"{\"a\":1]", 6}, {"{}{", 2},         {"{\"a\":[}", 6},
        {"{\"a\":+1}", 5},
    };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        int done;
        size_t n = accepted(invalid[i].doc, &done);
        CHECKF(n == invalid[i].at, "invalid: %s stops at %zu, want %zu", invalid[i].doc, n, invalid[i].at);
        json_t *j = json_loads(invalid[i].doc, 0, NULL); /* jansson refuses them too */
        CHECKF(!json_is_object(j), "jansson accepts %s", invalid[i].doc);
        json_decref(j);
    }
    /* what JSON allows but the constraint does not: blanks before the object, anything after it */
    int d;
    CHECK(accepted(" {}", &d) == 0 && accepted("{} ", &d) == 2 && d);
    /* nesting and blanks are bounded */
    char deep[200] = "{\"a\":";
    for (int i = 0; i < 70; i++) strcat(deep, "[");
    int done;
    CHECK(accepted(deep, &done) == 5 + 63); /* depth 64 with the object */
    char blanks[64] = "{";
    memset(blanks + 1, ' ', 30);
    CHECK(accepted(blanks, &done) == 21);
}

static void test_tokens(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s", g4t_shared("tokenizer/tokenizer.json"));
    g4_tokenizer *tok;
    g4_error err;
    if (g4_tokenizer_load(path, &tok, &err)) {
        printf("no tokenizer (%s): token tests skipped\n", err.msg);
        return;
    }
    /* a token's bytes are what decoding it shows: "▁the" -> " the", a byte-fallback token -> its byte */
    char buf[64];
    int32_t the = g4_tokenizer_token_id(tok, "\xe2\x96\x81the"), nl = g4_tokenizer_token_id(tok, "<0x0A>");
    int n = g4_tokenizer_token_bytes(tok, the, buf, sizeof buf);
    CHECK(the >= 0 && n == 4 && !memcmp(buf, " the", 4));
    n = g4_tokenizer_token_bytes(tok, nl, buf, sizeof buf);
    CHECK(nl >= 0 && n == 1 && buf[0] == '\n');
    int32_t e9 = g4_tokenizer_token_id(tok, "<0xE9>");
    CHECK(e9 >= 0 && g4_tokenizer_token_bytes(tok, e9, buf, sizeof buf) == 1 && (unsigned char)buf[0] == 0xE9);
    /* the mask: after "{" only tokens that continue an object; special tokens never */
    const int V = g4_tokenizer_vocab_size(tok);
    g4_json_tokens *jt;
    CHECK(g4_json_tokens_new(tok, V, &jt, &err) == 0);
    float *logits = calloc((size_t)V, sizeof *logits);
    g4_json_state st;
    g4_json_start(&st);
    g4_json_mask(jt, &st, logits);
    int allowed = 0, ok = 1;
    for (int id = 0; id < V; id++) {
        if (logits[id] == -INFINITY) continue;
        allowed++;
        n = g4_tokenizer_token_bytes(tok, id, buf, sizeof buf);
        ok &= n > 0 && buf[0] == '{' && !g4_tokenizer_is_special(tok, id);
    }
    CHECKF(allowed > 0 && ok, "%d tokens may start the output", allowed);
    int32_t brace = g4_tokenizer_token_id(tok, "{");
    CHECK(brace >= 0 && logits[brace] == 0 && g4_json_accept(jt, &st, brace) == 0);
    memset(logits, 0, (size_t)V * sizeof *logits);
    g4_json_mask(jt, &st, logits);
    int32_t quote = g4_tokenizer_token_id(tok, "\""), eos = g4_tokenizer_eos_id(tok);
    CHECK(quote >= 0 && logits[quote] == 0 && logits[the] == -INFINITY && (eos < 0 || logits[eos] == -INFINITY));
    /* the masks kept for the states met last: along a text's tokens (more than the 16 kept states, some met again
     * after others pushed them out) every mask equals the one computed token by token from the state */
    const char *text = "{\"a\": [1, 2.5e-3, true, null, {\"b\": \"x y z\"}], \"cc\": -0.75, \"d\": [[], {}], "
                       "\"e\": \"\\u00e9\\n\", \"f\": false, \"g\": [[[1]]], \"h\": 12345}";
    g4_tokens toks = {0};
    CHECK(g4_tokenize(tok, text, strlen(text), 0, &toks, &err) == 0);
    g4_json_tokens *fresh;
    CHECK(g4_json_tokens_new(tok, V, &fresh, &err) == 0);
    g4_json_start(&st);
    int steps_ok = 0, pos = 0;
    for (size_t i = 0; i < toks.n; i++) {
        memset(logits, 0, (size_t)V * sizeof *logits);
        g4_json_mask(fresh, &st, logits);
        int same = 1;
        for (int id = 0; id < V; id++) {
            g4_json_state probe = st;
            n = g4_tokenizer_is_special(tok, id) ? -1 : g4_tokenizer_token_bytes(tok, id, buf, sizeof buf);
            const int may = n > 0 && g4_json_feed(&probe, buf, (size_t)n) == 0;
            same &= may == (logits[id] == 0);
        }
        steps_ok += same;
        n = g4_tokenizer_token_bytes(tok, toks.ids[i], buf, sizeof buf);
        CHECKF(logits[toks.ids[i]] == 0 && g4_json_accept(fresh, &st, toks.ids[i]) == 0, "token %zu", i);
        pos += n;
    }
    CHECKF(steps_ok == (int)toks.n && g4_json_done(&st), "%d of %zu masks equal the state's own", steps_ok, toks.n);
    g4_json_tokens_free(fresh);
    free(toks.ids);
    free(logits);
    g4_json_tokens_free(jt);
    g4_tokenizer_free(tok);
}

/* Generations on the example model (when unpacked in models/): objects, or prefixes cut by the limit. */
static void test_generation(void) {
    char dir[4096], cmd[9000];
    const char *src = getenv("G4_SOURCE_DIR"), *tmp = getenv("G4_TMP");
    snprintf(dir, sizeof dir, "%s/json_object", tmp ? tmp : "/tmp");
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && tar -xJf '%s/models/tolstoy-tiny.tar.xz' -C '%s'", dir, dir,
             src ? src : ".", dir);
    if (system(cmd) != 0) {
        CHECKF(0, "cannot unpack the example model: %s", cmd);
        return;
    }
    strcat(dir, "/tolstoy-tiny");
    g4_model *m;
    g4_error err;
    g4_load_params lp = {.n_threads = 2, .device = "cpu"};
    if (g4_model_load(dir, &lp, &m, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    g4_context *ctx;
    g4_context_params cp = {.n_ctx = 512};
    CHECK(g4_context_new(m, &cp, &ctx, &err) == 0);
    g4_chat *chat;
    CHECK(g4_chat_new(g4_model_chat_template(m), NULL, &chat, &err) == 0 &&
          g4_chat_add(chat, "user", "Describe Pierre in JSON.", &err) == 0);
    int closed = 0;
    const int runs = getenv("G4_SANITIZE") ? 2 : 4, max_new = getenv("G4_SANITIZE") ? 40 : 120;
    for (int k = 0; k < runs; k++) {
        g4_sampler_params sp;
        g4_sampler_params_default(&sp);
        sp.temperature = k == 0 ? 0.0f : 1.0f;
        sp.seed = (uint64_t)k;
        g4_generation_params gp = {.max_new_tokens = max_new, .sampling = &sp, .json_object = 1};
        g4_generation *g;
        if (g4_chat_start(chat, ctx, 0, &gp, &g, &err)) {
            CHECKF(0, "%s", err.msg);
            continue;
        }
        CHECKF(g4_generation_run(g, NULL, NULL, &err) == 0, "%s", err.msg);
        g4_chat_message msg;
        CHECK(g4_generation_message(g, &msg, &err) == 0);
        json_error_t je;
        json_t *j = json_loads(msg.content, 0, &je);
        const int stopped = g4_generation_finish(g) == G4_FINISH_STOP;
        closed += stopped;
        CHECKF(stopped ? json_is_object(j) : (!j && (size_t)je.position >= strlen(msg.content) && msg.content[0] == '{'),
               "json_object output (%s): %s [%s at %d]", stopped ? "stop" : "length", msg.content, je.text, je.position);
        json_decref(j);
        g4_chat_message_free(&msg);
        g4_generation_free(g);
    }
    printf("json_object: %d of %d generations closed their object within %d tokens\n", closed, runs, max_new);
    g4_chat_free(chat);
    g4_context_free(ctx);
    g4_model_free(m);
}

int main(void) {
    test_automaton();
    test_tokens();
    test_generation();
    return g4t_done();
}
