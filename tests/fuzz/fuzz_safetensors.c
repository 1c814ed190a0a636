/* A .safetensors file: the 8-byte length, the JSON header (dtypes, shapes, offsets, metadata)
 * and the data it describes (src/formats/safetensors.c).  What opens must only point inside
 * the file. */
#include "formats/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_tmp("model.safetensors");
    fuzz_write_file(path, data, size);
    g4_tensor_set set = {0};
    g4_error err = {{0}};
    int rc = g4_safetensors_add_file(&set, path, &err);
    if (rc == 0) rc = g4_tensor_set_finish(&set, &err);
    fuzz_expect_error(rc, &err);
    if (rc == 0) {
        unsigned sum = 0;
        for (int i = 0; i < set.n_tensors; i++) {
            const g4_tensor *t = &set.tensors[i];
            fuzz_expect(g4_tensor_set_find(&set, t->name) == t);
            if (t->nbytes) sum += ((const volatile uint8_t *)t->data)[0] + ((const volatile uint8_t *)t->data)[t->nbytes - 1];
        }
        (void)sum;
    }
    g4_tensor_set_free(&set);
    return 0;
}
