/* The chat request of `gemma4c template` (and of a server): {"messages", "tools",
 * "enable_thinking", "add_generation_prompt", "chat_template_kwargs"} read by g4_chat_new and
 * rendered with the real Gemma 4 chat templates (src/chat/).  Byte 0 picks the template. */
#include "chat/chat.h"
#include "fuzz.h"

static g4_chat_template *tpls[4];
static int n_tpls;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static const char *const names[] = {"chat_templates/gemma-4-31b-it.jinja", "chat_templates/gemma-4-31b-it.release.jinja",
                                        "chat_templates/gemma-4-e2b-it.release.jinja"};
    for (int i = 0; i < 3; i++) {
        g4_error err;
        if (g4_chat_template_load_file(fuzz_shared(names[i]), "<bos>", "<eos>", &tpls[n_tpls], &err) == 0) n_tpls++;
        else fprintf(stderr, "fuzz_chat_request: %s\n", err.msg);
    }
    if (!n_tpls) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *request = malloc(size); /* NUL-terminated: the API takes a C string */
    memcpy(request, data + 1, size - 1);
    request[size - 1] = 0;
    g4_chat *chat = NULL;
    g4_error err = {{0}};
    int rc = g4_chat_new(tpls[data[0] % n_tpls], request, &chat, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        g4_jinja_limits lim = {.max_output = 1 << 20, .max_steps = 2000000, .max_memory = 64 << 20};
        char *out = NULL;
        size_t len = 0;
        rc = g4_chat_render_limited(chat, &lim, &out, &len, &err);
        fuzz_expect_error(rc, &err);
        free(out);
        g4_chat_free(chat);
    }
    free(request);
    return 0;
}
