/* Dev-only helper for tests/data/gguf_quant_diff.py (the cross-check of core/quant.c's decoders against
 * llama.cpp's gguf-py): gguf-dequant FILE.gguf OUTDIR reads FILE with the engine's GGUF reader and writes each
 * tensor, decoded row by row with g4_dequant_row, as raw little-endian float32 to OUTDIR/NAME.f32 (names of
 * [A-Za-z0-9_.-] only). Built by CMake as gguf-dequant (build/tests/gguf-dequant); not installed, not part of
 * the gemma4c CLI. Exit status 1 with one line on stderr when the file does not load or a tensor's type is not
 * one the engine reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant.h"
#include "formats/gguf.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gguf-dequant FILE.gguf OUTDIR\n");
        return 2;
    }
    g4_gguf g;
    g4_error err = {{0}};
    if (g4_gguf_open(argv[1], &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < g.set.n_tensors && !rc; i++) {
        const g4_tensor *t = &g.set.tensors[i];
        if (t->dtype == G4_DTYPE_UNKNOWN || strspn(t->name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                            "0123456789_.-") != strlen(t->name)) {
            fprintf(stderr, "tensor '%s': a type the engine does not read, or an odd name\n", t->name);
            rc = 1;
            break;
        }
        const int64_t in = t->shape[t->ndim - 1], rows = g4_tensor_nrows(t);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.f32", argv[2], t->name);
        FILE *f = fopen(path, "wb");
        float *row = malloc((size_t)in * sizeof(float));
        if (!f || !row) {
            fprintf(stderr, "cannot write %s\n", path);
            rc = 1;
        }
        for (int64_t r = 0; !rc && r < rows; r++) {
            g4_dequant_row(t, r, row);
            if (fwrite(row, sizeof(float), (size_t)in, f) != (size_t)in) {
                fprintf(stderr, "cannot write %s\n", path);
                rc = 1;
            }
        }
        free(row);
        if (f && fclose(f) && !rc) {
            fprintf(stderr, "cannot write %s\n", path);
            rc = 1;
        }
    }
    g4_gguf_free(&g);
    return rc;
}
