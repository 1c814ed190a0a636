/* A GGUF file (src/formats/gguf.c): the header, the metadata, the tensor infos and the data they describe. What
 * opens must only point inside the file; every tensor of a type the engine reads is decoded (its first rows,
 * core/quant.c and quant_codebook.c: any bytes are a valid block) and moved into the layouts the backends hold
 * it in (g4_transcode_row to AF4 / AF8 / Q6_K / Q8_0, g4_transcode_row_mlx), which must keep every value where
 * g4_transcode_exact says so. The same bytes as a projector file (formats/gguf_mmproj.h) of a 4-wide text model, and
 * as a model file carrying its towers as Ollama writes them (renamed and converted in the file's own tensor set):
 * what they add to or change in a tensor set must lie inside the file or the buffers the set owns. Its vocabulary,
 * read where the file holds it (gguf.h), as the tokenizer (tokenizer/tok_gguf.c, without the cache): one that
 * loads must tokenize and decode. */
#include <math.h>

#include "core/quant.h"
#include "formats/gguf.h"
#include "formats/gguf_mmproj.h"
#include "fuzz.h"
#include "fuzz_tok.h"

#define MAX_IN 8192 /* elements of a row decoded (longer rows: skipped) */

static float a[MAX_IN], b[MAX_IN];
static unsigned char held[MAX_IN / 32 * 40 + 64], codes[MAX_IN];
static float sc[MAX_IN / 32], bi[MAX_IN / 32];

/* the values of a row held as `to` equal the file's where the move is exact (NaN for NaN) */
static void check_held(const g4_tensor *t, g4_dtype to, int64_t in) {
    if (!g4_transcode_exact(t->dtype, to) || !g4_transcode_row(t, 0, to, held, b)) return;
    g4_dequant_row(t, 0, a);
    g4_dequant(to, held, b, in);
    for (int64_t i = 0; i < in; i++) {
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))))
            fprintf(stderr, "%s as %s: element %lld %.9g, held %.9g\n", g4_dtype_name(t->dtype), g4_dtype_name(to),
                    (long long)i, a[i], b[i]);
        fuzz_expect(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])));
    }
}

/* every tensor's first and last byte can be read */
static void touch(const g4_tensor_set *set) {
    for (int i = 0; i < set->n_tensors; i++) {
        const g4_tensor *t = &set->tensors[i];
        if (!t->nbytes) continue;
        volatile unsigned s = ((const volatile uint8_t *)t->data)[0] + ((const volatile uint8_t *)t->data)[t->nbytes - 1];
        (void)s;
    }
}

static void projector(const char *path) {
    g4_tensor_set set = {0};
    json_t *vc = NULL, *ac = NULL;
    int unified = 0;
    g4_error err = {{0}};
    const int rc = g4_mmproj_attach(path, 4, &set, &vc, &ac, &unified, &err);
    fuzz_expect_error(rc, &err);
    if (!rc) {
        touch(&set);
        json_decref(vc);
        json_decref(ac);
    }
    g4_tensor_set_free(&set);
}

/* the file's own towers (Ollama's layout), in its tensor set; then the set sorts again (a clash of names: one line) */
static void embedded_towers(const char *path, g4_gguf *g) {
    json_t *vc = NULL, *ac = NULL;
    g4_error err = {{0}};
    const int rc = g4_mmproj_attach_embedded(path, g->meta, 4, &g->set, &vc, &ac, &err);
    fuzz_expect_error(rc, &err);
    if (!rc) {
        touch(&g->set);
        json_decref(vc);
        json_decref(ac);
        if (g4_tensor_set_finish(&g->set, &err)) fuzz_expect_error(-1, &err);
    }
}

static void vocabulary(const char *path, const g4_gguf *g) {
    if (!json_object_get(g->meta, "tokenizer.ggml.tokens")) return;
    g4_tokenizer *tok = NULL;
    g4_error err = {{0}};
    const int rc = g4_tokenizer_load_gguf(path, g->meta, &tok, &err);
    fuzz_expect_error(rc, &err);
    if (rc) return;
    static const char text[] = "Hello, world!  ab ba\n\t<s><bos> \xc3\xa9t\xc3\xa9 \xe2\x96\x81x \xf0\x9f\x98\x80";
    fuzz_tokenizer(tok, text, sizeof text - 1, 1);
    g4_tokenizer_free(tok);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("G4_NO_TOKENIZER_CACHE", "1", 1); /* (every input's vocabulary would be a cache of its own) */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_tmp("model.gguf");
    fuzz_write_file(path, data, size);
    projector(path);
    g4_gguf g;
    g4_error err = {{0}};
    const int rc = g4_gguf_open(path, &g, &err);
    fuzz_expect_error(rc, &err);
    if (rc) return 0;
    for (int i = 0; i < g.set.n_tensors; i++) {
        const g4_tensor *t = &g.set.tensors[i];
        if (t->nbytes) { /* inside the file */
            volatile unsigned s = ((const volatile uint8_t *)t->data)[0] + ((const volatile uint8_t *)t->data)[t->nbytes - 1];
            (void)s;
        }
        const int64_t in = t->ndim ? t->shape[t->ndim - 1] : 1;
        if (!g4_dequant_reads(t->dtype) || in <= 0 || in > MAX_IN || !t->nbytes || in % g4_dtype_block(t->dtype)) continue;
        g4_dequant_row(t, 0, a);
        static const g4_dtype tos[] = {G4_AF8, G4_AF4, G4_Q6_K, G4_Q8_0};
        for (size_t k = 0; k < sizeof tos / sizeof tos[0]; k++)
            if (in % g4_dtype_block(tos[k]) == 0) check_held(t, tos[k], in);
        for (int m = 0; m < 2; m++) { /* the CUDA backend's MLX layouts of a GGUF type */
            const g4_dtype to = m ? G4_MLX8 : G4_MLX4;
            if (!g4_transcode_row_mlx(t, 0, to, codes, sc, bi)) continue;
            g4_dequant_row(t, 0, a);
            g4_mlx_dequant(g4_mlx_bits(to), 32, codes, sc, bi, G4_F32, b, in);
            for (int64_t j = 0; j < in; j++) fuzz_expect(a[j] == b[j] || (isnan(a[j]) && isnan(b[j])));
        }
    }
    vocabulary(path, &g);
    embedded_towers(path, &g);
    g4_gguf_free(&g);
    return 0;
}
