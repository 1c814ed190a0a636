/* config.json (src/model/config.c): both spellings, per-layer overrides, RoPE, KV sharing. */
#include <jansson.h>

#include "fuzz.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!root) return 0; /* not JSON: jansson's business */
    g4_model_config cfg;
    g4_error err = {{0}};
    int rc = g4_config_parse(root, "config.json", &cfg, &err);
    fuzz_expect_error(rc, &err);
    json_decref(root);
    return 0;
}
