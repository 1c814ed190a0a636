/* Jinja templates (src/jinja/): parse, then render with a chat-like context under small limits
 * (runaway templates must stop at them, hostile ones with a one-line error). */
#include <jansson.h>

#include "fuzz.h"
#include "jinja/jinja.h"

static json_t *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ctx = json_loads(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"You are nice.\"}, {\"role\": \"user\", \"content\": "
        "[{\"type\": \"text\", \"text\": \"hi\"}, {\"type\": \"image\"}]}, {\"role\": \"assistant\", \"content\": \"\", "
        "\"reasoning_content\": \"hmm\", \"tool_calls\": [{\"id\": \"a\", \"type\": \"function\", \"function\": {\"name\": "
        "\"f\", \"arguments\": {\"x\": [1, 2.5, {\"y\": null}], \"s\": \"q\\\"\"}}}]}, {\"role\": \"tool\", "
        "\"tool_call_id\": \"a\", \"content\": \"ok\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
        "\"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": "
        "\"array\", \"items\": {\"type\": \"number\"}}, \"s\": {\"type\": \"string\", \"enum\": [\"a\", \"b\"]}}, "
        "\"required\": [\"x\"]}}}], \"bos_token\": \"<bos>\", \"eos_token\": \"<eos>\", \"add_generation_prompt\": true, "
        "\"enable_thinking\": true, \"n\": null, \"big\": 9223372036854775807, \"f\": -0.0, \"e\": \"\"}",
        0, NULL);
    if (!ctx) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_jinja *t = NULL;
    g4_error err = {{0}};
    int rc = g4_jinja_parse((const char *)data, size, &t, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        g4_jinja_limits lim = {.max_output = 1 << 20, .max_steps = 300000, .max_depth = 60, .max_memory = 64 << 20};
        char *out = NULL;
        size_t len = 0;
        rc = g4_jinja_render_ex(t, ctx, &lim, &out, &len, &err);
        fuzz_expect_error(rc, &err);
        if (rc == 0) fuzz_expect(out && strlen(out) <= len && len <= lim.max_output);
        free(out);
        g4_jinja_free(t);
    }
    return 0;
}
