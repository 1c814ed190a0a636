/* model.safetensors.index.json of a sharded checkpoint (src/formats/safetensors.c): the weight
 * map is checked against two small shards in the folder. */
#include "formats/safetensors.h"
#include "fuzz.h"

static char dir[600];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(dir, sizeof dir, "%s", fuzz_tmp("sharded"));
    mkdir(dir, 0755);
    static const float a[2] = {1, 2};
    static const uint16_t b[4] = {1, 2, 3, 4}, c[3] = {5, 6, 7};
    g4_tensor s1[2] = {{.name = "model.a", .dtype = G4_F32, .ndim = 1, .shape = {2}, .data = a, .nbytes = 8},
                       {.name = "model.b", .dtype = G4_BF16, .ndim = 2, .shape = {2, 2}, .data = b, .nbytes = 8}};
    g4_tensor s2[1] = {{.name = "model.c", .dtype = G4_F16, .ndim = 1, .shape = {3}, .data = c, .nbytes = 6}};
    char p[700];
    g4_error err;
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    if (g4_safetensors_write(p, s1, 2, &err)) abort();
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    if (g4_safetensors_write(p, s2, 1, &err)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    fuzz_write_file(path, data, size);
    g4_tensor_set set;
    g4_error err = {{0}};
    int rc = g4_safetensors_open_dir(dir, &set, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        fuzz_expect(set.n_tensors <= 3); /* the tensors of the shards the index names */
        g4_tensor_set_free(&set);
    }
    return 0;
}
