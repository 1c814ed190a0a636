/* Model output: thinking, answer and tool calls in Gemma's notation (src/chat/chat.c). */
#include "chat/chat.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    g4_chat_output out;
    g4_error err = {{0}};
    int rc = g4_chat_parse_output((const char *)data, size, &out, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        fuzz_expect(out.thinking && out.content && json_is_array(out.tool_calls));
        g4_chat_output_free(&out);
    }
    size_t used = 0;
    json_t *v = g4_chat_parse_gemma_value((const char *)data, size, &used);
    fuzz_expect(v ? used <= size : used == 0);
    json_decref(v);
    return 0;
}
