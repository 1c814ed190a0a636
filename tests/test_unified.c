/* The encoder-free Gemma 4 12B (gemma4_unified, docs/gemma4-unified.md) against ../shared/fixtures/unified:
 * the 48-px blocks from the PNGs against pixel_values (exact, or within 1/255 where the resize rounds
 * differently; the differing values are counted), the raw frames from the WAV against input_features, the
 * image embedder on pixel_values and the audio embedder on the frames within 1e-3 relative of transformers'
 * image_embeddings / audio_embeddings; the decoder (vision blocks bidirectional in every layer and whole in
 * sliding layers beyond the window) on the reference soft tokens: full-prompt logits and every layer, a
 * chunked prefill, teacher-forced decode logits, 24 greedy ids; the checkpoint under the module names other
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

#define LOGIT_TOL 2e-3f
#define HIDDEN_REL_TOL 1e-3f

typedef struct {
    g4_tensor_set set;
    float *pixels, *image_emb, *frames, *audio_emb, *logits, *hidden, *decode_logits;
    int32_t *pos, *ids, *decode_ids, *greedy;
    size_t n_pixels, n_image_emb, n_frames, n_audio_emb, n_ids, n_decode, n_greedy;
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
    r->logits = ref_f32(&r->set, "logits", NULL);
    r->hidden = ref_f32(&r->set, "hidden_states", NULL);
    r->decode_logits = ref_f32(&r->set, "decode_logits", NULL);
    r->ids = ref_ids(&r->set, "input_ids", &r->n_ids);
    r->decode_ids = ref_ids(&r->set, "decode_ids", &r->n_decode);
    r->greedy = ref_ids(&r->set, "greedy_ids", &r->n_greedy);
    return r->pixels && r->pos && r->image_emb && r->frames && r->audio_emb && r->logits && r->hidden &&
                   r->decode_logits && r->ids && r->decode_ids && r->greedy
               ? 0
               : -1;
}

static void free_reference(reference *r) {
    free(r->pixels), free(r->pos), free(r->image_emb), free(r->frames), free(r->audio_emb);
    free(r->logits), free(r->hidden), free(r->decode_logits), free(r->ids), free(r->decode_ids), free(r->greedy);
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

/* The blocks the processor makes from the PNGs against pixel_values (real rows: the first n of each image). */
static void check_pixels(g4_model *m, const reference *r) {
    g4_error err;
    const int P = 3 * m->cfg.uni.block * m->cfg.uni.block, rows = (int)(r->n_pixels / (size_t)P) / 2;
    const int want_tokens[2] = {60, 66};
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, "fixtures/unified/image%d.png", i);
        g4_image img;
        if (g4_image_load(g4t_shared(name), NULL, &img, &err)) {
            CHECKF(0, "%s", err.msg);
            continue;
        }
        g4_image_patches pp;
        CHECKF(g4_unified_image_blocks(m, &img, 0, &pp, &err) == 0, "%s", err.msg);
        g4_image_free(&img);
        CHECKF(pp.n_patches == want_tokens[i], "image%d: %d blocks, transformers makes %d", i, pp.n_patches,
               want_tokens[i]);
        if (pp.n_patches != want_tokens[i]) {
            g4_image_patches_free(&pp);
            continue;
        }
        const float *ref = r->pixels + (size_t)i * rows * P;
        const int32_t *rpos = r->pos + (size_t)i * rows * 2;
        size_t off = 0, n = (size_t)pp.n_patches * P;
        float worst = 0;
        for (size_t k = 0; k < n; k++) {
            float d = fabsf(pp.pixels[k] - ref[k]);
            off += d > 0;
            if (d > worst) worst = d;
        }
        int same_pos = !memcmp(pp.pos, rpos, (size_t)pp.n_patches * 2 * sizeof(int32_t));
        fprintf(stderr, "image%d: %d blocks, %zu of %zu pixel values differ (at most %.3g = %.2f/255)\n", i,
                pp.n_patches, off, n, worst, worst * 255);
        CHECKF(worst <= 1.0f / 255 + 1e-6f, "image%d: pixel values differ by %g", i, worst);
        CHECKF(off * 100 <= n, "image%d: %zu of %zu pixel values differ", i, off, n);
        CHECKF(same_pos, "image%d: block positions differ from image_position_ids", i);
        g4_image_patches_free(&pp);
    }
}

/* The raw frames of the WAV against input_features. */
static void check_frames(g4_model *m, const reference *r) {
    g4_error err;
    float *pcm;
    size_t n;
    CHECK(g4_audio_rate(m) == 16000);
    if (g4_audio_load(g4t_shared("fixtures/unified/audio0.wav"), g4_audio_rate(m), &pcm, &n, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const int S = m->cfg.uni.audio_samples, k = g4_unified_audio_tokens(m, n);
    CHECKF((size_t)k * S == r->n_frames, "%zu samples give %d frames, transformers makes %zu", n, k,
           r->n_frames / (size_t)S);
    if ((size_t)k * S == r->n_frames) {
        float *frames = malloc(r->n_frames * sizeof(float));
        g4_unified_audio_frames(m, pcm, n, frames);
        float e = max_abs_diff(frames, r->frames, r->n_frames);
        fprintf(stderr, "audio: %zu samples, %d frames, input_features max abs error %g\n", n, k, e);
        CHECKF(e == 0, "input_features differ by %g", e);
        free(frames);
    }
    g4_free(pcm);
}

/* Runs ids through sequence 0 in steps of at most `chunk` that keep each image whole, embd taking the
 * placeholders' rows in order; the logits of every row go to `logits` (NULL: only the last row's into `last`). */
static int prefill(g4_context *ctx, g4_model *m, const reference *r, const float *embd, int chunk, float *logits,
                   float *last) {
    g4_error err;
    const int T = (int)r->n_ids, V = m->cfg.text.vocab_size, H = m->cfg.text.hidden_size;
    uint8_t want[512];
    for (int i = 0, k, used = 0; i < T; i += k) {
        if ((k = g4_step_length(m, r->ids + i, T - i, chunk, &err)) < 0) {
            CHECKF(0, "%s", err.msg);
            return -1;
        }
        for (int j = 0; j < k; j++) want[j] = logits || i + j == T - 1;
        g4_batch b = {.n_tokens = k, .token = r->ids + i, .want_logits = want, .embd = embd + (size_t)used * H,
                      .n_embd = g4_count_soft_tokens(m, r->ids + i, k)};
        used += b.n_embd;
        if (g4_decode(ctx, &b, logits ? logits + (size_t)i * V : last, &err)) {
            CHECKF(0, "%s", err.msg);
            return -1;
        }
    }
    return 0;
}

/* The decoder on the reference soft tokens (images in order, then the audio: the placeholders' order). */
static void check_decoder(g4_model *m, const reference *r) {
    g4_error err;
    const int T = (int)r->n_ids, V = m->cfg.text.vocab_size, H = m->cfg.text.hidden_size, L = m->cfg.text.n_layers;
    float *embd = malloc((r->n_image_emb + r->n_audio_emb) * sizeof(float));
    memcpy(embd, r->image_emb, r->n_image_emb * sizeof(float));
    memcpy(embd + r->n_image_emb, r->audio_emb, r->n_audio_emb * sizeof(float));
    float *logits = malloc((size_t)T * V * sizeof(float)), *hidden = malloc((size_t)L * T * H * sizeof(float));
    float *row = malloc((size_t)V * sizeof(float));
    /* 1. one forward of the whole prompt */
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 512, .n_batch = 256};
    CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0, "%s", err.msg);
    g4_context_capture(ctx, hidden, NULL);
    CHECK(prefill(ctx, m, r, embd, T, logits, NULL) == 0);
    g4_context_capture(ctx, NULL, NULL);
    float e = max_abs_diff(logits, r->logits, (size_t)T * V), worst = 0;
    for (int l = 0; l < L; l++) {
        const float *ref = r->hidden + (size_t)l * T * H;
        float rel = max_abs_diff(hidden + (size_t)l * T * H, ref, (size_t)T * H) / max_abs(ref, (size_t)T * H);
        if (!(rel <= worst)) worst = rel;
    }
    fprintf(stderr, "decoder: full-prompt logits max error %g, hidden states %g relative\n", e, worst);
    CHECKF(e <= LOGIT_TOL, "full-prompt logits differ by %g", e);
    CHECKF(worst <= HIDDEN_REL_TOL, "hidden states differ by %g relative", worst);
    g4_context_free(ctx);
    /* 2. a chunked prefill (steps of at most 70: each image whole, the audio split), teacher-forced decode
     * through a cache whose sliding blocks are recycled */
    g4_context_params sp = {.n_seq_max = 1, .n_ctx = 512, .n_batch = 70, .kv_block_size = 4};
    CHECKF(g4_context_new(m, &sp, &ctx, &err) == 0, "%s", err.msg);
    CHECK(prefill(ctx, m, r, embd, 70, NULL, row) == 0);
    e = max_abs_diff(row, r->logits + (size_t)(T - 1) * V, (size_t)V);
    float ed = 0;
    for (size_t i = 0; i < r->n_decode; i++) {
        g4_batch d = {.n_tokens = 1, .token = &r->decode_ids[i]};
        if (g4_decode(ctx, &d, row, &err)) {
            CHECKF(0, "decode step %zu: %s", i, err.msg);
            break;
        }
        float x = max_abs_diff(row, r->decode_logits + i * (size_t)V, (size_t)V);
        if (!(x <= ed)) ed = x;
    }
    fprintf(stderr, "decoder: chunked prefill last row %g, teacher-forced decode logits %g\n", e, ed);
    CHECKF(e <= LOGIT_TOL && ed <= LOGIT_TOL, "chunked prefill %g / decode logits %g", e, ed);
    /* soft tokens are recorded as -1 in the sequence's history */
    int n_seq;
    const int32_t *hist = g4_seq_tokens(ctx, 0, &n_seq);
    CHECK(n_seq == T + (int)r->n_decode && hist[5] == -1 && hist[0] == r->ids[0]);
    g4_context_free(ctx);
    /* 3. greedy: prefill, then one token at a time */
    CHECKF(g4_context_new(m, &cp, &ctx, &err) == 0, "%s", err.msg);
    CHECK(prefill(ctx, m, r, embd, T, NULL, row) == 0);
    int same = 1;
    for (size_t i = 0; i < r->n_greedy; i++) {
        int32_t id = argmax_f32(row, V);
        same &= id == r->greedy[i];
        g4_batch d = {.n_tokens = 1, .token = &id};
        if (g4_decode(ctx, &d, row, &err)) break;
    }
    CHECKF(same, "the 24 greedy ids differ from transformers'");
    g4_context_free(ctx);
    free(embd), free(logits), free(hidden), free(row);
}

static void test_fixture(const reference *r) {
    g4_error err;
    g4_model *m = NULL;
    CHECKF(g4_model_load(g4t_shared("fixtures/unified"), NULL, &m, &err) == 0, "%s", err.msg);
    if (!m) return;
    CHECK(m->cfg.unified && m->cfg.text.hidden_size_per_layer_input == 0 && m->cfg.uni.block == 48);
    CHECKF(!g4_model_warnings(m), "unexpected warnings: %s", g4_model_warnings(m));
    check_embedders("fixture", m, r);
    check_pixels(m, r);
    check_frames(m, r);
    check_decoder(m, r);
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
