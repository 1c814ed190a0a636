/* The encoder-free Gemma 4 12B (gemma4_unified, docs/gemma4-unified.md) against ../shared/fixtures/unified:
 * the image embedder on the processor's pixel_values and the audio embedder on its raw frames, within 1e-3
 * relative of transformers' image_embeddings / audio_embeddings; the checkpoint under the module names other
 * exporters write; bad block positions and missing embedder tensors as one-line errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "engine/context.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "model/model.h"
#include "model_files.h"
#include "reference.h"
#include "towers/unified.h"

#define EMBED_REL_TOL 1e-3

static double rel_err(const float *a, const float *b, size_t n) {
    double m = 0, e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return m > 0 ? e / m : e;
}

typedef struct {
    g4_tensor_set set;
    float *pixels, *image_emb, *frames, *audio_emb;
    int32_t *pos;
    size_t n_pixels, n_image_emb, n_frames, n_audio_emb;
} reference;

static int load_reference(reference *r) {
    g4_error err;
    memset(r, 0, sizeof *r);
    if (g4_safetensors_add_file(&r->set, g4t_shared("fixtures/unified/reference.safetensors"), &err) ||
        g4_tensor_set_finish(&r->set, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    r->pixels = ref_f32(&r->set, "pixel_values", &r->n_pixels);
    r->pos = ref_ids(&r->set, "image_position_ids", NULL);
    r->image_emb = ref_f32(&r->set, "image_embeddings", &r->n_image_emb);
    r->frames = ref_f32(&r->set, "input_features", &r->n_frames);
    r->audio_emb = ref_f32(&r->set, "audio_embeddings", &r->n_audio_emb);
    return r->pixels && r->pos && r->image_emb && r->frames && r->audio_emb ? 0 : -1;
}

static void free_reference(reference *r) {
    free(r->pixels), free(r->pos), free(r->image_emb), free(r->frames), free(r->audio_emb);
    g4_tensor_set_free(&r->set);
}

/* The image and audio embedders of a loaded model against the reference. */
static void check_embedders(const char *label, g4_model *m, const reference *r) {
    g4_error err;
    const int H = m->cfg.text.hidden_size, P = 3 * m->cfg.uni.block * m->cfg.uni.block;
    /* the real blocks of every image (padding rows have position (-1, -1)), images in order */
    const size_t rows = r->n_pixels / (size_t)P;
    float *blocks = malloc(r->n_pixels * sizeof(float));
    int32_t *pos = malloc(rows * 2 * sizeof(int32_t));
    int n = 0;
    for (size_t i = 0; i < rows; i++) {
        if (r->pos[2 * i] == -1 && r->pos[2 * i + 1] == -1) continue;
        memcpy(blocks + (size_t)n * P, r->pixels + i * P, (size_t)P * sizeof(float));
        pos[2 * n] = r->pos[2 * i], pos[2 * n + 1] = r->pos[2 * i + 1];
        n++;
    }
    CHECKF((size_t)n * H == r->n_image_emb, "%s: %d real blocks, %zu reference rows", label, n, r->n_image_emb / H);
    float *out = malloc((size_t)n * H * sizeof(float));
    CHECKF(g4_unified_embed_image(m, blocks, pos, n, out, &err) == 0, "%s: %s", label, err.msg);
    if ((size_t)n * H == r->n_image_emb) {
        double e = rel_err(out, r->image_emb, r->n_image_emb);
        fprintf(stderr, "%s: image_embeddings (%d tokens) rel error %.3g\n", label, n, e);
        CHECKF(e <= EMBED_REL_TOL, "%s: image_embeddings rel error %.3g", label, e);
    }
    /* a block outside the position table */
    pos[0] = m->cfg.uni.mm_posemb_size;
    CHECK(g4_unified_embed_image(m, blocks, pos, 1, out, &err) == -1 && strstr(err.msg, "outside the position table"));
    free(blocks), free(pos), free(out);

    const int S = m->cfg.uni.audio_samples, nf = (int)(r->n_frames / (size_t)S);
    CHECKF((size_t)nf * H == r->n_audio_emb, "%s: %d frames, %zu reference rows", label, nf, r->n_audio_emb / H);
    out = malloc((size_t)nf * H * sizeof(float));
    CHECKF(g4_unified_embed_audio(m, r->frames, nf, out, &err) == 0, "%s: %s", label, err.msg);
    if ((size_t)nf * H == r->n_audio_emb) {
        double e = rel_err(out, r->audio_emb, r->n_audio_emb);
        fprintf(stderr, "%s: audio_embeddings (%d tokens) rel error %.3g\n", label, nf, e);
        CHECKF(e <= EMBED_REL_TOL, "%s: audio_embeddings rel error %.3g", label, e);
    }
    free(out);
}

static void test_fixture(const reference *r) {
    g4_error err;
    g4_model *m = NULL;
    CHECKF(g4_model_load(g4t_shared("fixtures/unified"), NULL, &m, &err) == 0, "%s", err.msg);
    if (!m) return;
    CHECK(m->cfg.unified && m->cfg.text.hidden_size_per_layer_input == 0 && m->cfg.uni.block == 48);
    CHECKF(!g4_model_warnings(m), "unexpected warnings: %s", g4_model_warnings(m));
    check_embedders("fixture", m, r);
    /* audio frames: ceil(n / 640), the last one zero-padded */
    CHECK(g4_unified_audio_tokens(m, 52489) == 83 && g4_unified_audio_tokens(m, 640) == 1 &&
          g4_unified_audio_tokens(m, 641) == 2 && g4_unified_audio_tokens(m, 0) == 0);
    g4_model_free(m);
}

/* The embedders' tensors under the module names (docs/gemma4-unified.md 9). */
static void test_module_names(const reference *r) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", g4t_tmp("unified-module-names"));
    static const char *const rename[] = {
        "model.vision_embedder.", "model.embed_vision.",
        "model.embed_vision.embedding_projection.", "model.embed_vision.multimodal_embedder.embedding_projection.",
    };
    resave_edit ed = {.rename = rename, .n_rename = 2};
    CHECK(resave(g4t_shared("fixtures/unified"), dir, 2, 0, &ed) == 0);
    g4_error err;
    g4_model *m = NULL;
    CHECKF(g4_model_load(dir, NULL, &m, &err) == 0, "%s", err.msg);
    if (m) {
        CHECKF(!g4_model_warnings(m), "unexpected warnings: %s", g4_model_warnings(m));
        check_embedders("module names", m, r);
        g4_model_free(m);
    }
    /* a missing embedder tensor is named */
    resave_edit drop = {.drop = "model.embed_audio.embedding_projection.weight"};
    CHECK(resave(g4t_shared("fixtures/unified"), dir, 1, 0, &drop) == 0);
    m = NULL;
    CHECK(g4_model_load(dir, NULL, &m, &err) == -1 && strstr(err.msg, "model.embed_audio.embedding_projection.weight") &&
          !strchr(err.msg, '\n'));
    g4_model_free(m);
}

int main(void) {
    reference r;
    if (load_reference(&r)) {
        fprintf(stderr, "cannot read the unified fixture's reference\n");
        return 1;
    }
    test_fixture(&r);
    test_module_names(&r);
    free_reference(&r);
    return g4t_done();
}
