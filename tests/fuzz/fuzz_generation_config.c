/* generation_config.json, with config.json's eos ids as the fallback
 * (src/engine/generation_config.c). */
#include "model/generation_config.h"
#include "fuzz.h"

static char config_path[600];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(config_path, sizeof config_path, "%s", fuzz_tmp("config.json"));
    const char *cfg = "{\"model_type\": \"gemma4\", \"eos_token_id\": [1, 106], \"text_config\": {\"eos_token_id\": 1}}";
    fuzz_write_file(config_path, cfg, strlen(cfg));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_tmp("generation_config.json");
    fuzz_write_file(path, data, size);
    g4_generation_config gc;
    g4_error err = {{0}};
    int rc = g4_generation_config_load_files(path, config_path, &gc, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        fuzz_expect(gc.n_eos >= 0 && gc.n_eos <= G4_MAX_EOS_IDS);
        for (int i = 0; i < gc.n_eos; i++) fuzz_expect(g4_generation_config_is_eos(&gc, gc.eos_ids[i]));
        g4_generation_config_max_new(&gc, 100);
        g4_generation_config_free(&gc);
    }
    return 0;
}
