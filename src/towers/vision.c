/* The Gemma 4 vision tower and embed_vision (contract in vision.h; docs/gemma4-towers.md 2.6, 1). */
#include "towers/vision.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "towers/unified.h"

#define OPS (be->ops)
#define MLP_ROWS 1024 /* patches per MLP chunk: bounds the [rows, intermediate] buffers */

/* A clippable linear (2.6): clamp(x, in) -> x W^T -> clamp(out); unclipped: bounds are +-inf. */
typedef struct clip_linear {
    const g4_tensor *w; /* [out, in] */
    float in_min, in_max, out_min, out_max;
    int clipped;
} clip_linear;

typedef struct vision_layer {
    clip_linear q, k, v, o, gate, up, down;
    const float *input_norm, *post_attn_norm, *pre_ff_norm, *post_ff_norm; /* [D] */
    const float *q_norm, *k_norm;                                          /* [head_dim] */
} vision_layer;

/* Activations in backend memory for up to `cap` patches. */
typedef struct vision_scratch {
    int cap;
    float *px, *h, *x, *t, *q, *k, *v, *attn, *rot, *o, *pe, *gate, *up, *rope_x, *rope_y, *pool, *pool_n, *emb;
    int32_t *pos_x, *pos_y, *pool_idx;
    int32_t *host_pos, *host_idx; /* host: [2 * cap], [cap] */
} vision_scratch;

struct g4_vision {
    g4_vision_config cfg;
    int text_hidden;
    g4_backend *be;
    const g4_tensor *input_proj; /* [D, 3 p^2] */
    g4_tensor pos_table[2];      /* [position_embedding_size, D]: x, y */
    const g4_tensor *embed_proj; /* [D_t, D] */
    vision_layer *layers;
    const float *std_shift, *std_scale; /* -std_bias, std_scale (standardize only) */
    const float *patch_shift, *patch_scale; /* -0.5, 2: x = 2 (p - 0.5) */
    const float *inv_freq;              /* [head_dim / 4] */
    vision_scratch s;
};

/* ---------------------------------------------------------------- binding */
static const char *vname(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static const char *vname(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}

static const g4_tensor *bind2(g4_binder *b, const char *name, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return g4_bind_matrix(b, name, 2, s);
}

static void bind_vec(g4_binder *b, const char *name, int64_t n, const float **field) {
    g4_bind_vector(b, name, 1, &n, field);
}

/* A computed vector: n copies of c, or c * from[i]. */
static void computed_vec(g4_binder *b, int n, float c, const float *from, const float **field) {
    float *host = g4_bind_computed(b, (size_t)n, field);
    if (host)
        for (int i = 0; i < n; i++) host[i] = from ? c * from[i] : c;
}

/* A Gemma4ClippableLinear; a bound the weights leave out is the module's initial +-inf (counted in *absent). */
static void bind_linear(g4_binder *b, const g4_vision *v, clip_linear *l, const char *prefix, int64_t out, int64_t in,
                        int *absent) {
    char n[512];
    l->w = bind2(b, vname(n, sizeof n, "%s.linear.weight", prefix), out, in);
    l->clipped = v->cfg.use_clipped_linears;
    l->in_min = l->out_min = -INFINITY;
    l->in_max = l->out_max = INFINITY;
    if (!l->clipped) return;
    l->in_min = g4_bind_scalar_or(b, vname(n, sizeof n, "%s.input_min", prefix), -INFINITY, absent);
    l->in_max = g4_bind_scalar_or(b, vname(n, sizeof n, "%s.input_max", prefix), INFINITY, absent);
    l->out_min = g4_bind_scalar_or(b, vname(n, sizeof n, "%s.output_min", prefix), -INFINITY, absent);
    l->out_max = g4_bind_scalar_or(b, vname(n, sizeof n, "%s.output_max", prefix), INFINITY, absent);
}

int g4_vision_bind(g4_binder *b, g4_model *m, g4_vision **out, g4_error *err) {
    *out = NULL;
    g4_vision *v = calloc(1, sizeof *v);
    if (!v) return g4_fail(err, "out of memory");
    v->cfg = m->cfg.vision;
    v->text_hidden = m->cfg.text.hidden_size;
    v->be = m->be;
    const g4_vision_config *c = &v->cfg;
    const int D = c->hidden_size, I = c->intermediate_size, H = c->n_heads, KV = c->n_kv_heads, dh = c->head_dim;
    const int P = c->patch_size;
    v->layers = calloc((size_t)c->n_layers + 1, sizeof *v->layers);
    if (!v->layers) {
        g4_vision_free(v);
        return g4_fail(err, "out of memory");
    }
    *out = v; /* the model frees it, also when binding fails later */
    v->input_proj = bind2(b, "model.vision_tower.patch_embedder.input_proj.weight", D, (int64_t)3 * P * P);
    int64_t ps[3] = {2, c->position_embedding_size, D};
    const g4_tensor *pt = g4_bind_matrix(b, "model.vision_tower.patch_embedder.position_embedding_table", 3, ps);
    if (pt) /* two [size, D] views: the x table, then the y table */
        for (int a = 0; a < 2; a++) {
            v->pos_table[a] = *pt;
            v->pos_table[a].ndim = 2;
            v->pos_table[a].shape[0] = c->position_embedding_size;
            v->pos_table[a].shape[1] = D;
            v->pos_table[a].nbytes = pt->nbytes / 2;
            v->pos_table[a].data = (const unsigned char *)pt->data + (size_t)a * (pt->nbytes / 2);
        }
    int absent = 0; /* clip bounds not in the weights */
    for (int l = 0; l < c->n_layers; l++) {
        vision_layer *y = &v->layers[l];
        char p[256];
#define L(s) vname(p, sizeof p, "model.vision_tower.encoder.layers.%d.%s", l, s)
        bind_linear(b, v, &y->q, L("self_attn.q_proj"), (int64_t)H * dh, D, &absent);
        bind_linear(b, v, &y->k, L("self_attn.k_proj"), (int64_t)KV * dh, D, &absent);
        bind_linear(b, v, &y->v, L("self_attn.v_proj"), (int64_t)KV * dh, D, &absent);
        bind_linear(b, v, &y->o, L("self_attn.o_proj"), D, (int64_t)H * dh, &absent);
        bind_linear(b, v, &y->gate, L("mlp.gate_proj"), I, D, &absent);
        bind_linear(b, v, &y->up, L("mlp.up_proj"), I, D, &absent);
        bind_linear(b, v, &y->down, L("mlp.down_proj"), D, I, &absent);
        bind_vec(b, L("self_attn.q_norm.weight"), dh, &y->q_norm);
        bind_vec(b, L("self_attn.k_norm.weight"), dh, &y->k_norm);
        bind_vec(b, L("input_layernorm.weight"), D, &y->input_norm);
        bind_vec(b, L("post_attention_layernorm.weight"), D, &y->post_attn_norm);
        bind_vec(b, L("pre_feedforward_layernorm.weight"), D, &y->pre_ff_norm);
        bind_vec(b, L("post_feedforward_layernorm.weight"), D, &y->post_ff_norm);
#undef L
    }
    if (c->standardize) {
        int64_t n = D;
        bind_vec(b, "model.vision_tower.std_scale", D, &v->std_scale);
        /* (y - b) == (y + (-b)) exactly */
        const float *bias = g4_bind_vector(b, "model.vision_tower.std_bias", 1, &n, NULL);
        if (bias) computed_vec(b, D, -1.0f, bias, &v->std_shift);
    }
    v->embed_proj = bind2(b, "model.embed_vision.embedding_projection.weight", v->text_hidden, D);
    computed_vec(b, 3 * P * P, -0.5f, NULL, &v->patch_shift);
    computed_vec(b, 3 * P * P, 2.0f, NULL, &v->patch_scale);
    /* 2-D RoPE: each half of a head rotates like a head of dh/2 (theta^(-2k/(dh/2)), 2.6) */
    g4_rope_config rc = {G4_ROPE_DEFAULT, c->rope_theta, 1.0, 1.0};
    float *inv = g4_bind_computed(b, (size_t)(dh / 4), &v->inv_freq);
    if (inv) g4_rope_inv_freq(&rc, dh / 2, inv);
    g4_warn_clip_bounds_absent(m, "vision", absent);
    return 0;
}

static void scratch_release(g4_vision *v) {
    vision_scratch *s = &v->s;
    void *bufs[] = {s->px,     s->h,      s->x,     s->t,    s->q,      s->k,      s->v,      s->attn,
                    s->rot,    s->o,      s->pe,    s->gate, s->up,     s->rope_x, s->rope_y, s->pool,
                    s->pool_n, s->emb,    s->pos_x, s->pos_y, s->pool_idx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) v->be->ops->release(v->be, bufs[i]);
    free(s->host_pos);
    free(s->host_idx);
    memset(s, 0, sizeof *s);
}

void g4_vision_free(g4_vision *v) {
    if (!v) return;
    scratch_release(v);
    free(v->layers);
    free(v);
}

int g4_vision_patch_size(const g4_vision *v) { return v->cfg.patch_size; }
int g4_vision_pooling_kernel(const g4_vision *v) { return v->cfg.pooling_kernel; }

/* Buffers for n patches (kept for later images of at most that size). */
static int scratch_reserve(g4_vision *v, int n, g4_error *err) {
    if (n <= v->s.cap) return 0;
    scratch_release(v);
    const g4_vision_config *c = &v->cfg;
    const size_t N = (size_t)n, D = (size_t)c->hidden_size, QD = (size_t)c->n_heads * c->head_dim;
    const size_t KD = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->intermediate_size;
    const size_t PD = (size_t)3 * c->patch_size * c->patch_size, kk = (size_t)c->pooling_kernel * c->pooling_kernel;
    const size_t T = N / kk + 1, rows = N < MLP_ROWS ? N : MLP_ROWS;
    const size_t TD = (size_t)v->text_hidden, big = QD > D ? QD : D;
    g4_backend *be = v->be;
    vision_scratch *s = &v->s;
#define ALLOC(f, count) if (!(s->f = OPS->alloc(be, (count) * sizeof *s->f))) goto oom
    ALLOC(px, N * PD);
    ALLOC(h, N * D);
    ALLOC(x, N * D);
    ALLOC(t, N * (big > I ? big : I)); /* a clamped copy of a linear's input */
    ALLOC(q, N * QD);
    ALLOC(k, N * KD);
    ALLOC(v, N * KD);
    ALLOC(attn, N * QD);
    ALLOC(rot, N * QD);
    ALLOC(o, N * D);
    ALLOC(pe, N * D);
    ALLOC(gate, rows * I);
    ALLOC(up, rows * I);
    ALLOC(rope_x, N * (size_t)(c->head_dim / 2));
    ALLOC(rope_y, N * (size_t)(c->head_dim / 2));
    ALLOC(pool, T * D);
    ALLOC(pool_n, T * D);
    ALLOC(emb, T * TD);
    ALLOC(pos_x, N);
    ALLOC(pos_y, N);
    ALLOC(pool_idx, N);
#undef ALLOC
    s->host_pos = malloc(2 * N * sizeof(int32_t));
    s->host_idx = malloc(N * sizeof(int32_t));
    if (!s->host_pos || !s->host_idx) goto oom;
    s->cap = n;
    return 0;
oom:
    scratch_release(v);
    return g4_fail(err, "out of memory for the vision tower's activations (%d patches)", n);
}

/* ---------------------------------------------------------------- forward */
/* y[n, out] = clamp(clamp(x, in) W^T, out) */
static void linear(g4_vision *v, const clip_linear *l, const float *x, int n, float *y) {
    g4_backend *be = v->be;
    if (l->clipped) {
        const size_t in = (size_t)l->w->shape[1];
        OPS->clamp(be, x, v->s.t, (size_t)n * in, l->in_min, l->in_max);
        x = v->s.t;
    }
    OPS->matmul(be, x, n, l->w, NULL, y);
    if (l->clipped) OPS->clamp(be, y, y, (size_t)n * (size_t)l->w->shape[0], l->out_min, l->out_max);
}

/* 2-D RoPE in place on x [n, heads, dh]: the first half of each head turns with the column, the second
 * with the row. As [n * heads, 2, dh/2] -> [2, n * heads, dh/2], each half is an ordinary rotate-half RoPE. */
static void rope2d(g4_vision *v, float *x, int n, int heads) {
    g4_backend *be = v->be;
    const int half = v->cfg.head_dim / 2;
    const size_t block = (size_t)n * heads * half;
    OPS->transpose(be, x, n * heads, 2, half, v->s.rot);
    OPS->rope(be, v->s.rot, n, heads, half, v->s.rope_x);
    OPS->rope(be, v->s.rot + block, n, heads, half, v->s.rope_y);
    OPS->transpose(be, v->s.rot, 2, n * heads, half, x);
}

static void encoder_layer(g4_vision *v, const vision_layer *y, int n) {
    g4_backend *be = v->be;
    vision_scratch *s = &v->s;
    const g4_vision_config *c = &v->cfg;
    const int D = c->hidden_size, H = c->n_heads, KV = c->n_kv_heads, dh = c->head_dim, I = c->intermediate_size;
    const float eps = (float)c->rms_norm_eps;
    OPS->rmsnorm(be, s->h, y->input_norm, n, D, eps, s->x);
    linear(v, &y->q, s->x, n, s->q);
    linear(v, &y->k, s->x, n, s->k);
    linear(v, &y->v, s->x, n, s->v);
    OPS->rmsnorm(be, s->q, y->q_norm, n * H, dh, eps, s->q);
    OPS->rmsnorm(be, s->k, y->k_norm, n * KV, dh, eps, s->k);
    OPS->rmsnorm(be, s->v, NULL, n * KV, dh, eps, s->v);
    rope2d(v, s->q, n, H);
    rope2d(v, s->k, n, KV);
    g4_dense_attention_args a = {.q = s->q, .k = s->k, .v = s->v, .out = s->attn, .n_q = n, .n_k = n,
                                 .n_heads = H, .n_kv_heads = KV, .head_dim = dh, .scale = 1.0f};
    OPS->attention_dense(be, &a);
    linear(v, &y->o, s->attn, n, s->o);
    OPS->rmsnorm(be, s->o, y->post_attn_norm, n, D, eps, s->o);
    OPS->add(be, s->h, s->o, (size_t)n * D);
    OPS->rmsnorm(be, s->h, y->pre_ff_norm, n, D, eps, s->x);
    for (int r0 = 0; r0 < n; r0 += MLP_ROWS) {
        const int m = n - r0 < MLP_ROWS ? n - r0 : MLP_ROWS;
        const size_t off = (size_t)r0 * D;
        linear(v, &y->gate, s->x + off, m, s->gate);
        linear(v, &y->up, s->x + off, m, s->up);
        OPS->gelu_mul(be, s->gate, s->up, (size_t)m * I, s->gate);
        linear(v, &y->down, s->gate, m, s->o + off);
    }
    OPS->rmsnorm(be, s->o, y->post_ff_norm, n, D, eps, s->o);
    OPS->add(be, s->h, s->o, (size_t)n * D);
}

int g4_vision_encode(g4_vision *v, const g4_image_patches *pp, float *out, float *tower_out, g4_error *err) {
    const g4_vision_config *c = &v->cfg;
    const int n = pp->n_patches, D = c->hidden_size, k = c->pooling_kernel, kk = k * k;
    const int PD = 3 * c->patch_size * c->patch_size;
    if (pp->patch_dim != PD)
        return g4_fail(err, "image patches of %d values, the vision tower takes %d (patch size %d)", pp->patch_dim, PD,
                       c->patch_size);
    if (n <= 0 || pp->grid_w % k || pp->grid_h % k)
        return g4_fail(err, "a %dx%d patch grid does not pool in %dx%d blocks", pp->grid_w, pp->grid_h, k, k);
    if (pp->grid_w > c->position_embedding_size || pp->grid_h > c->position_embedding_size)
        return g4_fail(err, "a %dx%d patch grid exceeds the position table of %d", pp->grid_w, pp->grid_h,
                       c->position_embedding_size);
    if (scratch_reserve(v, n, err)) return -1;
    g4_backend *be = v->be;
    vision_scratch *s = &v->s;
    const int T = n / kk, half = c->head_dim / 4;
    /* positions (x, y) and, per soft token, its k*k patches in patch order (2.6 pooler) */
    int32_t *hx = s->host_pos, *hy = s->host_pos + n, *fill = s->host_idx;
    for (int i = 0; i < n; i++) {
        hx[i] = pp->pos[2 * i];
        hy[i] = pp->pos[2 * i + 1];
    }
    OPS->to_device(be, s->pos_x, hx, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->pos_y, hy, (size_t)n * sizeof(int32_t));
    OPS->sync(be);
    int32_t *idx = s->host_pos; /* reused: the positions are on the device now */
    memset(fill, 0, (size_t)T * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        const int tok = (pp->pos[2 * i + 1] / k) * (pp->grid_w / k) + pp->pos[2 * i] / k;
        idx[(size_t)tok * kk + fill[tok]++] = i;
    }
    OPS->to_device(be, s->pool_idx, idx, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->px, pp->pixels, (size_t)n * PD * sizeof(float));

    /* patch embedding: (2 (p - 0.5)) W^T + T_x[x] + T_y[y] */
    OPS->shift_scale_cols(be, s->px, n, PD, v->patch_shift, v->patch_scale);
    OPS->matmul(be, s->px, n, v->input_proj, NULL, s->h);
    OPS->embed(be, &v->pos_table[0], s->pos_x, n, 1.0f, s->pe);
    OPS->embed(be, &v->pos_table[1], s->pos_y, n, 1.0f, s->o);
    OPS->add(be, s->pe, s->o, (size_t)n * D);
    OPS->add(be, s->h, s->pe, (size_t)n * D);
    OPS->rope_table(be, s->pos_x, n, v->inv_freq, half, s->rope_x);
    OPS->rope_table(be, s->pos_y, n, v->inv_freq, half, s->rope_y);
    for (int l = 0; l < c->n_layers; l++) encoder_layer(v, &v->layers[l], n);

    /* pooler: mean of each k x k block (sum of x * fl32(1/k^2)), * sqrt(D), standardize */
    OPS->gather_sum(be, s->h, s->pool_idx, T, kk, D, 1.0f / (float)kk, s->pool);
    OPS->scale(be, s->pool, (size_t)T * D, sqrtf((float)D));
    if (c->standardize) OPS->shift_scale_cols(be, s->pool, T, D, v->std_shift, v->std_scale);
    if (tower_out) OPS->to_host(be, tower_out, s->pool, (size_t)T * D * sizeof(float));
    /* embed_vision: scale-less RMSNorm, projection to the text width */
    OPS->rmsnorm(be, s->pool, NULL, T, D, (float)c->rms_norm_eps, s->pool_n);
    OPS->matmul(be, s->pool_n, T, v->embed_proj, NULL, s->emb);
    OPS->to_host(be, out, s->emb, (size_t)T * v->text_hidden * sizeof(float));
    OPS->sync(be);
    return OPS->check(be, err);
}

/* ------------------------------------------------------------- public API */
/* The model folder's image processor, checked against the tower's patch geometry. */
static int processor_for(const g4_model *m, g4_image_processor *p, g4_error *err) {
    if (g4_image_processor_load(m->dir, p, err)) return -1;
    const g4_vision_config *v = &m->cfg.vision;
    if (m->gguf_meta) {
        /* a GGUF model (a text file and its mmproj) has no processor file: llama.cpp's mtmd cuts the patches
         * the projector says (clip.vision.patch_size, the pooling kernel clip.cpp takes for gemma4v), not
         * transformers' class defaults 16 / 3 */
        p->patch_size = v->patch_size;
        p->pooling_kernel = v->pooling_kernel;
        return 0;
    }
    if (p->patch_size != v->patch_size || p->pooling_kernel != v->pooling_kernel)
        return g4_fail(err, "%s: the image processor's patch size %d / pooling kernel %d differ from the vision "
                            "tower's %d / %d", m->dir, p->patch_size, p->pooling_kernel, v->patch_size,
                       v->pooling_kernel);
    return 0;
}

int g4_image_max_tokens(const g4_model *m, int budget) {
    if (!m) return 0;
    if (m->cfg.unified) return g4_unified_image_max_tokens(m, budget);
    if (!m->vision) return 0;
    if (budget > 0) return budget;
    g4_image_processor p;
    g4_error err;
    if (g4_image_processor_load(m->dir, &p, &err)) g4_image_processor_defaults(&p);
    return p.max_soft_tokens;
}

int g4_image_encode(g4_model *m, const g4_image *img, int budget, g4_soft_tokens *out, g4_error *err) {
    G4_ARG(out, err);
    memset(out, 0, sizeof *out);
    G4_ARG(m, err);
    G4_ARG(img, err);
    if (m->cfg.unified) return g4_unified_image_encode(m, img, budget, out, err);
    memset(out, 0, sizeof *out);
    if (!m->vision) return g4_fail(err, "%s: the model has no vision tower (no vision_config, or none in the weights)", m->dir);
    g4_image_processor proc;
    g4_image_patches pp;
    if (processor_for(m, &proc, err) || g4_image_preprocess(&proc, img, budget, &pp, err)) return -1;
    const int H = m->cfg.text.hidden_size;
    out->kind = G4_MEDIA_IMAGE;
    out->hidden = H;
    out->block_tokens = malloc(sizeof *out->block_tokens);
    out->rows = malloc((size_t)pp.n_tokens * H * sizeof *out->rows + 1);
    if (!out->block_tokens || !out->rows) {
        g4_image_patches_free(&pp);
        g4_soft_tokens_free(out);
        return g4_fail(err, "out of memory");
    }
    pthread_mutex_lock(&m->backend_lock);
    int rc = g4_vision_encode(m->vision, &pp, out->rows, NULL, err);
    pthread_mutex_unlock(&m->backend_lock);
    out->n_blocks = 1;
    out->block_tokens[0] = out->n_tokens = pp.n_tokens;
    g4_image_patches_free(&pp);
    if (rc) g4_soft_tokens_free(out);
    return rc;
}
