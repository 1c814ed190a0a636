/* The encoder-free embedders of gemma4_unified, written against the op table (docs/gemma4-unified.md 4, 5;
 * see unified.h). Activations live in backend memory for the length of one call. */
#include "towers/unified.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "towers/audio.h"

#define OPS (be->ops)

/* Backend buffers of one call, released together. */
typedef struct buffers {
    g4_backend *be;
    void *p[8];
    int n;
} buffers;

static void *buf(buffers *b, size_t bytes) {
    void *p = b->be->ops->alloc(b->be, bytes ? bytes : 4);
    if (p) b->p[b->n++] = p;
    return p;
}

static void buffers_release(buffers *b) {
    for (int i = 0; i < b->n; i++) b->be->ops->release(b->be, b->p[i]);
}

int g4_unified_bind(g4_binder *b, g4_model *m, g4_error *err) {
    const g4_unified_config *u = &m->cfg.uni;
    g4_unified_weights *w = &m->uni;
    const int64_t H = m->cfg.text.hidden_size, E = u->mm_embed_dim, P = 3 * (int64_t)u->block * u->block;
    const int file_names = g4_tensor_set_find(&m->weights, "model.vision_embedder.patch_ln1.weight") != NULL;
    const char *v = file_names ? "model.vision_embedder." : "model.embed_vision.";
    const int64_t dense[2] = {E, P}, pos[3] = {u->mm_posemb_size, 2, E}, iproj[2] = {H, u->output_proj_dims},
                  aproj[2] = {H, u->audio_samples};
    char n[256];
#define VNAME(x) (snprintf(n, sizeof n, "%s%s", v, x), n)
    g4_bind_vector(b, VNAME("patch_ln1.weight"), 1, &P, &w->ln1_w);
    g4_bind_vector(b, VNAME("patch_ln1.bias"), 1, &P, &w->ln1_b);
    w->dense = g4_bind_matrix(b, VNAME("patch_dense.weight"), 2, dense);
    g4_bind_vector(b, VNAME("patch_dense.bias"), 1, &E, &w->dense_b);
    g4_bind_vector(b, VNAME("patch_ln2.weight"), 1, &E, &w->ln2_w);
    g4_bind_vector(b, VNAME("patch_ln2.bias"), 1, &E, &w->ln2_b);
    const g4_tensor *pt = g4_bind_matrix(b, VNAME("pos_embedding"), 3, pos);
    if (pt) { /* rows of E as stored; a [S, 2, E] table would end at row S, half of the 2 * S rows indexed */
        w->pos_table = *pt;
        w->pos_table.ndim = 2;
        w->pos_table.shape[0] = 2 * pos[0];
        w->pos_table.shape[1] = E;
    }
    g4_bind_vector(b, VNAME("pos_norm.weight"), 1, &E, &w->pos_w);
    g4_bind_vector(b, VNAME("pos_norm.bias"), 1, &E, &w->pos_b);
#undef VNAME
    w->image_proj = g4_bind_matrix(b, file_names ? "model.embed_vision.embedding_projection.weight"
                                                 : "model.embed_vision.multimodal_embedder.embedding_projection.weight",
                                   2, iproj);
    w->audio_proj = g4_bind_matrix(b, "model.embed_audio.embedding_projection.weight", 2, aproj);
    /* the sample rate audio is decoded to: the feature extractor's (16 kHz) */
    g4_audio_features_config fx;
    if (g4_audio_features_config_load(m->dir, &fx, err)) return -1;
    m->cfg.uni.sampling_rate = fx.sampling_rate;
    g4_audio_features_config_free(&fx);
    return 0;
}

int g4_unified_embed_image(g4_model *m, const float *blocks, const int32_t *pos, int n, float *out, g4_error *err) {
    if (!m->cfg.unified) return g4_fail(err, "this model has no encoder-free image embedder");
    if (n <= 0) return 0;
    g4_backend *be = m->be;
    const g4_unified_weights *w = &m->uni;
    const g4_unified_config *u = &m->cfg.uni;
    const int P = 3 * u->block * u->block, E = u->mm_embed_dim, H = m->cfg.text.hidden_size;
    int32_t *idx = malloc(2 * (size_t)n * sizeof *idx);
    if (!idx) return g4_fail(err, "out of memory");
    /* position table rows: 2 * bx (axis 0) and 2 * by + 1 (axis 1) */
    for (int i = 0; i < n; i++) {
        int32_t bx = pos[2 * i], by = pos[2 * i + 1];
        if (bx < 0 || by < 0 || bx >= u->mm_posemb_size || by >= u->mm_posemb_size) {
            free(idx);
            return g4_fail(err, "image block %d at (%d, %d) is outside the position table (%d positions per axis)",
                           i, bx, by, u->mm_posemb_size);
        }
        idx[i] = 2 * bx;
        idx[n + i] = 2 * by + 1;
    }
    buffers b = {.be = be};
    float *x = buf(&b, (size_t)n * P * sizeof(float)), *h = buf(&b, (size_t)n * E * sizeof(float));
    float *pe = buf(&b, (size_t)n * E * sizeof(float)), *pe_y = buf(&b, (size_t)n * E * sizeof(float));
    float *y = buf(&b, (size_t)n * H * sizeof(float));
    int32_t *didx = buf(&b, 2 * (size_t)n * sizeof(int32_t));
    if (b.n < 6) {
        buffers_release(&b);
        free(idx);
        return g4_fail(err, "out of %s memory for %d image blocks", OPS->name, n);
    }
    OPS->to_device(be, x, blocks, (size_t)n * P * sizeof(float));
    OPS->to_device(be, didx, idx, 2 * (size_t)n * sizeof(int32_t));
    OPS->layernorm(be, x, w->ln1_w, w->ln1_b, n, P, 1e-5f, x);
    OPS->matmul(be, x, n, w->dense, w->dense_b, h);
    OPS->layernorm(be, h, w->ln2_w, w->ln2_b, n, E, 1e-5f, h);
    OPS->embed(be, &w->pos_table, didx, n, 1.0f, pe);
    OPS->embed(be, &w->pos_table, didx + n, n, 1.0f, pe_y);
    OPS->add(be, pe, pe_y, (size_t)n * E); /* P[bx, 0] + P[by, 1], then added to the LN2 output */
    OPS->add(be, h, pe, (size_t)n * E);
    OPS->layernorm(be, h, w->pos_w, w->pos_b, n, E, 1e-5f, h);
    OPS->rmsnorm(be, h, NULL, n, E, (float)u->vision_eps, h);
    OPS->matmul(be, h, n, w->image_proj, NULL, y);
    OPS->to_host(be, out, y, (size_t)n * H * sizeof(float));
    OPS->sync(be);
    int rc = OPS->check(be, err);
    buffers_release(&b);
    free(idx);
    return rc;
}

int g4_unified_embed_audio(g4_model *m, const float *frames, int n, float *out, g4_error *err) {
    if (!m->cfg.unified) return g4_fail(err, "this model has no encoder-free audio embedder");
    if (n <= 0) return 0;
    g4_backend *be = m->be;
    const int S = m->cfg.uni.audio_samples, H = m->cfg.text.hidden_size;
    buffers b = {.be = be};
    float *x = buf(&b, (size_t)n * S * sizeof(float)), *y = buf(&b, (size_t)n * H * sizeof(float));
    if (b.n < 2) {
        buffers_release(&b);
        return g4_fail(err, "out of %s memory for %d audio frames", OPS->name, n);
    }
    OPS->to_device(be, x, frames, (size_t)n * S * sizeof(float));
    OPS->rmsnorm(be, x, NULL, n, S, (float)m->cfg.uni.audio_eps, x);
    OPS->matmul(be, x, n, m->uni.audio_proj, NULL, y);
    OPS->to_host(be, out, y, (size_t)n * H * sizeof(float));
    OPS->sync(be);
    int rc = OPS->check(be, err);
    buffers_release(&b);
    return rc;
}

int g4_unified_audio_tokens(const g4_model *m, size_t n) {
    const size_t S = (size_t)m->cfg.uni.audio_samples;
    return (int)((n + S - 1) / S);
}

void g4_unified_audio_frames(const g4_model *m, const float *pcm, size_t n, float *out) {
    const size_t S = (size_t)m->cfg.uni.audio_samples, total = (size_t)g4_unified_audio_tokens(m, n) * S;
    memcpy(out, pcm, n * sizeof(float));
    memset(out + n, 0, (total - n) * sizeof(float));
}

/* The image processor of the model folder with the block as its patch: the same target size (multiples of
 * patch * k = 48, at most budget * k^2 16-px patches), resize and rescale, and 48-px patches in (row, col,
 * channel) order at (bx, by) are exactly the unified processor's blocks (docs/gemma4-unified.md 3). */
static int block_processor(const g4_model *m, g4_image_processor *p, g4_error *err) {
    if (g4_image_processor_load(m->dir, p, err)) return -1;
    if (p->patch_size * p->pooling_kernel != m->cfg.uni.block)
        return g4_fail(err, "%s: the image processor's patch size %d x pooling kernel %d is not the model's %d-pixel "
                            "block", m->dir, p->patch_size, p->pooling_kernel, m->cfg.uni.block);
    p->patch_size = m->cfg.uni.block;
    p->pooling_kernel = 1;
    return 0;
}

int g4_unified_image_blocks(const g4_model *m, const g4_image *img, int budget, g4_image_patches *out, g4_error *err) {
    g4_image_processor proc;
    memset(out, 0, sizeof *out);
    return block_processor(m, &proc, err) || g4_image_preprocess(&proc, img, budget, out, err) ? -1 : 0;
}

int g4_unified_image_max_tokens(const g4_model *m, int budget) {
    if (!m->uni.dense) return 0; /* no embedders in the weights (a text-only conversion) */
    if (budget > 0) return budget;
    g4_image_processor p;
    g4_error err;
    if (g4_image_processor_load(m->dir, &p, &err)) g4_image_processor_defaults(&p);
    return p.max_soft_tokens;
}

/* One block of soft tokens of a kind, rows allocated for n tokens. */
static int soft_tokens_alloc(const g4_model *m, g4_media_kind kind, int n, g4_soft_tokens *out, g4_error *err) {
    const int H = m->cfg.text.hidden_size;
    out->kind = kind;
    out->hidden = H;
    out->n_blocks = 1;
    out->n_tokens = n;
    out->block_tokens = malloc(sizeof *out->block_tokens);
    out->rows = malloc((size_t)n * H * sizeof *out->rows + 1);
    if (!out->block_tokens || !out->rows) {
        g4_soft_tokens_free(out);
        return g4_fail(err, "out of memory");
    }
    out->block_tokens[0] = n;
    return 0;
}

int g4_unified_image_encode(g4_model *m, const g4_image *img, int budget, g4_soft_tokens *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    if (!m->uni.dense) return g4_fail(err, "%s: the model has no image embedder (none in the weights)", m->dir);
    g4_image_patches pp;
    if (g4_unified_image_blocks(m, img, budget, &pp, err)) return -1;
    int rc = soft_tokens_alloc(m, G4_MEDIA_IMAGE, pp.n_patches, out, err);
    if (!rc) {
        pthread_mutex_lock(&m->backend_lock);
        rc = g4_unified_embed_image(m, pp.pixels, pp.pos, pp.n_patches, out->rows, err);
        pthread_mutex_unlock(&m->backend_lock);
        if (rc) g4_soft_tokens_free(out);
    }
    g4_image_patches_free(&pp);
    return rc;
}

int g4_unified_audio_encode(g4_model *m, const float *pcm, size_t n, g4_soft_tokens *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    if (!m->uni.audio_proj) return g4_fail(err, "%s: the model has no audio embedder (none in the weights)", m->dir);
    if (n == 0) return g4_fail(err, "the audio is empty");
    const int k = g4_unified_audio_tokens(m, n);
    float *frames = malloc((size_t)k * m->cfg.uni.audio_samples * sizeof *frames);
    if (!frames) return g4_fail(err, "out of memory for %zu audio samples", n);
    g4_unified_audio_frames(m, pcm, n, frames);
    int rc = soft_tokens_alloc(m, G4_MEDIA_AUDIO, k, out, err);
    if (!rc) {
        pthread_mutex_lock(&m->backend_lock);
        rc = g4_unified_embed_audio(m, frames, k, out->rows, err);
        pthread_mutex_unlock(&m->backend_lock);
        if (rc) g4_soft_tokens_free(out);
    }
    free(frames);
    return rc;
}
