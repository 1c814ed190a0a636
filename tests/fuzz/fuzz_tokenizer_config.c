/* tokenizer_config.json beside a tokenizer.json: special tokens and flags (tok_load.c), and the
 * chat template and token strings the chat code takes from it (src/chat/chat.c). */
#include "chat/chat.h"
#include "fuzz_tok.h"

static char dir[600];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1);
    snprintf(dir, sizeof dir, "%s", fuzz_tmp("model"));
    mkdir(dir, 0755);
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    const char *tj =
        "{\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"special\":true},{\"id\":7,\"content\":\"<eos>\",\"special\":true}],"
        "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"_\"},"
        "\"decoder\":{\"type\":\"Replace\",\"pattern\":{\"String\":\"_\"},\"content\":\" \"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"_\":2,\"ab\":3,\"_ab\":4,\"<unk>\":5,\"<s>\":6,\"<eos>\":7},"
        "\"unk_token\":\"<unk>\",\"merges\":[[\"a\",\"b\"],[\"_\",\"ab\"]]}}";
    fuzz_write_file(p, tj, strlen(tj));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    fuzz_write_file(path, data, size);
    g4_tokenizer *tok = NULL;
    g4_error err = {{0}};
    int rc = g4_tokenizer_load_dir(dir, &tok, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        fuzz_tokenizer(tok, "ab ab<s>b a<eos>", 16, 1);
        g4_tokenizer_free(tok);
    }
    g4_chat_template *t = NULL;
    rc = g4_chat_template_load_dir(dir, &t, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        json_t *messages = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]",
                                      0, NULL);
        g4_jinja_limits lim = {.max_output = 1 << 20, .max_steps = 200000, .max_memory = 64 << 20};
        g4_chat_options opt = {.add_generation_prompt = 1, .enable_thinking = -1, .limits = &lim};
        char *out = NULL;
        rc = g4_chat_template_render(t, messages, &opt, &out, NULL, &err);
        fuzz_expect_error(rc, &err);
        free(out);
        json_decref(messages);
        g4_chat_template_free(t);
    }
    return 0;
}
