/* Model output: thinking, answer and tool calls in Gemma's notation (src/chat/chat_output.c),
 * parsed whole (g4_chat_parse) and streamed in pieces whose sizes the input's first byte picks;
 * both must agree. */
#include "chat/chat.h"
#include "fuzz.h"

static int on_piece(g4_event_kind kind, const char *text, size_t len, void *user) {
    return g4_chat_accum_add(user, kind, text, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t step = 1 + data[0] % 16;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    g4_chat_message whole;
    g4_error err = {{0}};
    int rc = g4_chat_parse(text, len, &whole, &err);
    fuzz_expect_error(rc, &err);
    g4_chat_accum acc;
    memset(&acc, 0, sizeof acc);
    g4_chat_parser *p = g4_chat_parser_new(on_piece, &acc);
    fuzz_expect(p != NULL);
    int prc = 0;
    for (size_t i = 0; i < len && !prc; i += step)
        prc = g4_chat_parser_push(p, text + i, len - i < step ? len - i : step, &err);
    if (!prc) prc = g4_chat_parser_finish(p, &err);
    fuzz_expect_error(prc, &err);
    g4_chat_message streamed;
    if (!prc && !rc && g4_chat_accum_message(&acc, &streamed, &err) == 0) {
        fuzz_expect(!strcmp(whole.content, streamed.content) && !strcmp(whole.thinking, streamed.thinking) &&
                    !strcmp(whole.tool_calls, streamed.tool_calls));
        g4_chat_message_free(&streamed);
    }
    g4_chat_parser_free(p);
    g4_chat_accum_free(&acc);
    if (!rc) g4_chat_message_free(&whole);
    size_t used = 0;
    json_t *v = g4_chat_parse_gemma_value(text, len, &used);
    fuzz_expect(v ? used <= len : used == 0);
    json_decref(v);
    return 0;
}
