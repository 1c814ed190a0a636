/* The encoder-free embedders of gemma4_unified, written against the op table (docs/gemma4-unified.md 4, 5;
 * see unified.h). Activations live in backend memory for the length of one call. */
#include "towers/unified.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

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

void g4_unified_bind(g4_binder *b, g4_model *m) {
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
    w->pos_table = g4_bind_matrix(b, VNAME("pos_embedding"), 3, pos);
    g4_bind_vector(b, VNAME("pos_norm.weight"), 1, &E, &w->pos_w);
    g4_bind_vector(b, VNAME("pos_norm.bias"), 1, &E, &w->pos_b);
#undef VNAME
    w->image_proj = g4_bind_matrix(b, file_names ? "model.embed_vision.embedding_projection.weight"
                                                 : "model.embed_vision.multimodal_embedder.embedding_projection.weight",
                                   2, iproj);
    w->audio_proj = g4_bind_matrix(b, "model.embed_audio.embedding_projection.weight", 2, aproj);
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
    OPS->embed(be, w->pos_table, didx, n, 1.0f, pe);
    OPS->embed(be, w->pos_table, didx + n, n, 1.0f, pe_y);
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
