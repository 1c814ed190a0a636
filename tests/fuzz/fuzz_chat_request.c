/* The chat request of `gemma4c template` (and of a server): {"messages", "tools",
 * "enable_thinking", "add_generation_prompt", "chat_template_kwargs"} rendered with the real
 * Gemma 4 chat templates (src/chat/chat.c g4_chat_render_request).  Byte 0 picks the template. */
#include <jansson.h>

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
    json_t *req = json_loadb((const char *)data + 1, size - 1, JSON_ALLOW_NUL, NULL);
    if (!req) return 0; /* not JSON: jansson's business */
    g4_jinja_limits lim = {.max_output = 1 << 20, .max_steps = 2000000, .max_memory = 64 << 20};
    char *out = NULL;
    size_t len = 0;
    g4_error err = {{0}};
    int rc = g4_chat_render_request(tpls[data[0] % n_tpls], req, &lim, &out, &len, &err);
    fuzz_expect_error(rc, &err);
    free(out);
    json_decref(req);
    return 0;
}
