/* The vision tower and the multimodal decoder against the transformers references of
 * ../shared/fixtures/vision: vision_tower_output and image_embeddings from image0.png / image1.png, the
 * full-prompt logits with the soft tokens merged and the bidirectional image mask, teacher-forced decode
 * logits and the 24 greedy ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/context.h"
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
    g4_vision *vis = model->vision;
    g4_image_processor proc;
    if (!vis || g4_image_processor_load(dir, &proc, &err)) {
        fprintf(stderr, "vision: %s\n", vis ? err.msg : "no vision tower");
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

    /* the whole prompt: placeholders take the soft tokens, the image mask is bidirectional on sliding layers */
    size_t T = 0, n_greedy = 0, n_dec = 0;
    int32_t *ids = ref_ids(&ref, "input_ids", &T), *greedy = ref_ids(&ref, "greedy_ids", &n_greedy);
    int32_t *dec_ids = ref_ids(&ref, "decode_ids", &n_dec);
    float *want_logits = ref_f32(&ref, "logits", NULL), *want_hidden = ref_f32(&ref, "hidden_states", NULL);
    float *want_dec = ref_f32(&ref, "decode_logits", NULL);
    const int V = g4_model_vocab_size(model), L = g4_model_n_layers(model);
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 256, .n_batch = 160};
    if (g4_context_new(model, &cp, &ctx, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float *logits = malloc(T * V * sizeof(float)), *hidden = malloc((size_t)L * T * Ht * sizeof(float));
    g4_context_capture(ctx, hidden, NULL);
    g4_batch b = {.n_tokens = (int)T, .token = ids, .embd = emb, .n_embd = tokens};
    CHECKF(g4_decode(ctx, &b, logits, &err) == 0, "%s", err.msg);
    g4_context_capture(ctx, NULL, NULL);
    float e_logits = max_abs_diff(logits, want_logits, T * V), worst_hidden = 0;
    for (int l = 0; l < L; l++) {
        float e = rel_err(hidden + (size_t)l * T * Ht, want_hidden + (size_t)l * T * Ht, T * Ht);
        if (!(e <= worst_hidden)) worst_hidden = e;
    }
    fprintf(stderr, "full prompt of %zu tokens: logits max error %.3g, hidden states max rel error %.3g\n", T, e_logits,
            worst_hidden);
    CHECKF(e_logits <= LOGIT_TOL, "full-prompt logits differ by %g", e_logits);
    CHECKF(worst_hidden <= EMB_REL_TOL, "hidden states differ by %g relative", worst_hidden);
    /* the same prompt with a causal mask on the images differs: the test sees the bidirectional mask */
    {
        g4_context *c2;
        if (g4_context_new(model, &cp, &c2, &err)) return 1;
        float *l2 = malloc(T * V * sizeof(float));
        model->cfg.text.bidirectional_vision = 0;
        CHECKF(g4_decode(c2, &b, l2, &err) == 0, "%s", err.msg);
        model->cfg.text.bidirectional_vision = 1;
        float e_causal = max_abs_diff(l2, want_logits, T * V);
        fprintf(stderr, "  (with a causal mask on the images instead: logits max error %.3g)\n", e_causal);
        CHECK(e_causal > 10 * LOGIT_TOL);
        free(l2);
        g4_context_free(c2);
    }
    /* teacher-forced decode after the prefill: plain causal steps through the cache */
    float e_dec = 0;
    for (size_t i = 0; i < n_dec; i++) {
        g4_batch d = {.n_tokens = 1, .token = &dec_ids[i]};
        CHECKF(g4_decode(ctx, &d, logits, &err) == 0, "%s", err.msg);
        float e = max_abs_diff(logits, want_dec + i * V, (size_t)V);
        if (!(e <= e_dec)) e_dec = e;
    }
    fprintf(stderr, "teacher-forced decode of %zu tokens: logits max error %.3g\n", n_dec, e_dec);
    CHECKF(e_dec <= LOGIT_TOL, "decode logits differ by %g", e_dec);
    g4_context_free(ctx);

    /* greedy generation with prefill steps of at most 100 tokens: the second image (positions 71..136) must
     * not be split, so the steps are 71 and 72 tokens. The generation gets the prompt as the chat template
     * writes it (one <|image|> per image) and the two images' soft tokens, and expands it itself. */
    cp.n_batch = 100;
    if (g4_context_new(model, &cp, &ctx, &err)) return 1;
    const g4_model_config *mc = &model->cfg;
    int32_t *unexpanded = malloc(T * sizeof(int32_t));
    int n_un = 0, counts[2] = {0, 0}, n_img = 0;
    for (size_t i = 0; i < T; i++) {
        if (ids[i] == mc->image_token_id) {
            if (i > 0 && ids[i - 1] == mc->image_token_id) counts[n_img - 1]++;
            else if (n_img < 2) counts[n_img++] = 1;
        } else if (ids[i] != mc->boi_token_id && ids[i] != mc->eoi_token_id) {
            unexpanded[n_un++] = ids[i];
        }
        if (ids[i] == mc->boi_token_id) unexpanded[n_un++] = mc->image_token_id;
    }
    CHECK(n_img == 2 && counts[0] + counts[1] == tokens);
    g4_soft_tokens media[2];
    for (int i = 0; i < 2; i++)
        media[i] = (g4_soft_tokens){.kind = G4_MEDIA_IMAGE, .n_blocks = 1, .block_tokens = &counts[i],
                                    .n_tokens = counts[i], .hidden = Ht,
                                    .rows = emb + (size_t)(i ? counts[0] : 0) * Ht};
    g4_sampler_params sp;
    g4_sampler_params_default(&sp);
    sp.temperature = 0;
    g4_generation_params gp = {.max_new_tokens = 24, .sampling = &sp, .ignore_eos = 1, .media = media, .n_media = 2};
    g4_generation *gen;
    int32_t got[24];
    int n_got = 0;
    if (g4_generation_start(ctx, 0, unexpanded, n_un, &gp, &gen, &err) == 0) {
        CHECKF(g4_generation_run(gen, NULL, NULL, &err) == 0, "%s", err.msg);
        const int32_t *out = g4_generation_tokens(gen, &n_got);
        memcpy(got, out, (size_t)(n_got < 24 ? n_got : 24) * sizeof(int32_t));
        g4_generation_free(gen);
    } else {
        CHECKF(0, "%s", err.msg);
    }
    int same = n_got == (int)n_greedy;
    for (int i = 0; same && i < n_got; i++) same = got[i] == greedy[i];
    fprintf(stderr, "greedy: %d ids, %s the reference\n", n_got, same ? "identical to" : "DIFFERENT from");
    CHECKF(same, "the 24 greedy ids differ from the reference");
    /* the sequence holds -1 where the soft tokens went: a new generation over the same prompt reuses at most
     * the text before the first image */
    int n_held;
    const int32_t *held = g4_seq_tokens(ctx, 0, &n_held);
    CHECK(n_held >= (int)T && held[0] == ids[0]);
    int first_soft = 0;
    while (ids[first_soft] != mc->image_token_id) first_soft++;
    CHECK(held[first_soft] == -1 && held[first_soft - 1] == ids[first_soft - 1]);
    if (g4_generation_start(ctx, 0, unexpanded, n_un, &gp, &gen, &err) == 0) {
        CHECKF(g4_generation_n_cached(gen) <= first_soft, "prefix reuse kept %d tokens, the first image is at %d",
               g4_generation_n_cached(gen), first_soft);
        g4_generation_free(gen);
    }
    /* an image longer than a step, and a count mismatch: clear errors */
    g4_seq_reset(ctx, 0);
    cp.n_batch = 50;
    g4_context *small;
    if (g4_context_new(model, &cp, &small, &err)) return 1;
    int failed = g4_generation_start(small, 0, unexpanded, n_un, &gp, &gen, &err) != 0;
    if (!failed) {
        g4_event ev;
        failed = g4_generation_next(gen, &ev, &err) == -1;
        g4_generation_free(gen);
    }
    CHECK(failed && strstr(err.msg, "does not fit"));
    fprintf(stderr, "  an image longer than the batch -> %s\n", err.msg);
    gp.n_media = 1;
    CHECK(g4_generation_start(small, 0, unexpanded, n_un, &gp, &gen, &err) == -1 && strstr(err.msg, "placeholder"));
    fprintf(stderr, "  two image placeholders for one image -> %s\n", err.msg);
    free(unexpanded);
    g4_batch bad = {.n_tokens = 70, .token = ids, .embd = emb, .n_embd = 59};
    CHECK(g4_decode(ctx, &bad, logits, &err) == -1 && strstr(err.msg, "placeholders"));
    fprintf(stderr, "  59 rows for 60 placeholders -> %s\n", err.msg);
    g4_context_free(small);
    g4_context_free(ctx);
    free(logits), free(hidden), free(ids), free(greedy), free(dec_ids), free(want_logits), free(want_hidden);
    free(want_dec);

    free(tower);
    free(emb);
    free(want_tower);
    free(want_emb);
    g4_model_free(model);
    g4_tensor_set_free(&ref);
    return g4t_done();
}
