/* The Gemma 4 audio tower (transformers' Gemma4AudioModel) and embed_audio, written once
 * against the backend op table (docs/gemma4-towers.md §3.3, §1 "Common primitives"):
 *   two stride-2 3x3 convolutions over (time, mel) with a channel LayerNorm and ReLU each,
 *   input_proj_linear; conformer layers of FF/2 - local attention - light conv - FF/2 -
 *   norm_out, every inner linear clippable; output_proj (with bias); then embed_audio
 *   (scale-less RMSNorm, projection to the text width).
 * Only the valid feature frames are run: valid outputs never depend on the padding
 * transformers adds (zeroed before each convolution, masked as keys, causal convolution),
 * so every row produced is a soft token. Activations are float32 in backend memory. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "model/model.h"
#include "towers/audio.h"
#include "towers/unified.h"

#define OPS (be->ops)
#define CONV1_CHUNK 32 /* output time rows of the second convolution per im2col block */

typedef struct clipped_linear {
    const g4_tensor *w;
    g4_tensor view;              /* a row range of a larger weight (linear_start halves) */
    float in_lo, in_hi, out_lo, out_hi; /* +-inf when the linear is not clipped */
} clipped_linear;

typedef struct audio_layer {
    const float *ff_pre[2], *ff_post[2];
    clipped_linear ff_up[2], ff_down[2];
    const float *norm_pre_attn, *norm_post_attn, *norm_out;
    clipped_linear q, k, v, post;
    const g4_tensor *rel_k;
    const float *q_dim_scale;    /* softplus(per_dim_scale) [head_dim] */
    const float *lc_pre_norm, *lc_conv_norm, *dw; /* dw [D, K] */
    clipped_linear lc_a, lc_b, lc_end; /* linear_start's halves (GLU value, gate) */
} audio_layer;

struct g4_audio_tower {
    g4_model *m;
    g4_audio_features_config fx;
    int D, heads, head_dim, n_layers, C1, C2, K, window, pos_shift, out_dims, text_hidden;
    float eps, residual, logit_cap, grad_clip;
    g4_tensor conv0, conv1;      /* [C_out, C_in*9] views of the 4-D weights */
    const float *norm0, *norm1;
    const g4_tensor *input_proj, *out_proj, *embed_proj;
    const float *out_bias;
    audio_layer *layers;
    const float *pos;            /* [window, D] row d: the position row transformers pairs with distance d */
};

/* -------------------------------------------------------------- loading */
typedef struct {
    int64_t hidden, heads, layers, channels[2], kernel, chunk, left, right, out_dims, clipped;
    double eps, residual, cap, invalid, grad_clip;
    const char *act;
} audio_config;

/* The audio_config of the folder's config.json, or the one a GGUF model's projector file gave (model->mmproj_audio,
 * formats/gguf_mmproj.h). */
static int parse_config(const g4_model *m, audio_config *c, g4_error *err) {
    char path[4096];
    json_t *root;
    if (m->mmproj_audio) {
        snprintf(path, sizeof path, "%s", m->mmproj_path);
        root = json_pack("{s:O}", "audio_config", m->mmproj_audio);
        if (!root) return g4_fail(err, "out of memory");
    } else if (g4_path_join(path, sizeof path, m->dir, "config.json", err) || g4_json_load_file(path, &root, err)) {
        return -1;
    }
    const json_t *a = json_object_get(root, "audio_config");
    int rc = -1;
    if (!json_is_object(a)) {
        g4_fail(err, "%s: no audio_config (the model does not take audio)", path);
        goto done;
    }
    /* Gemma4AudioConfig types these without `| None` (reference/transformers-5.17/gemma4/configuration_gemma4.py:55-76):
     * its @strict dataclass refuses a null, so a null is an error here, not the default */
    static const char *const required[] = {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "hidden_act", "subsampling_conv_channels",
        "conv_kernel_size", "residual_weight", "attention_chunk_size", "attention_context_left",
        "attention_context_right", "attention_logit_cap", "attention_invalid_logits_value", "use_clipped_linears",
        "rms_norm_eps", "gradient_clipping", "output_proj_dims", "initializer_range", NULL};
    char w[4200];
    snprintf(w, sizeof w, "%s audio_config", path);
    if (g4_json_reject_nulls(a, required, w, err)) goto done;
    const json_t *ch = json_object_get(a, "subsampling_conv_channels");
    c->channels[0] = 128;
    c->channels[1] = 32;
    if (ch && !json_is_null(ch)) {
        if (!json_is_array(ch) || json_array_size(ch) != 2 || !json_is_integer(json_array_get(ch, 0)) ||
            !json_is_integer(json_array_get(ch, 1))) {
            g4_fail(err, "%s: audio_config.subsampling_conv_channels must be two integers", path);
            goto done;
        }
        c->channels[0] = json_integer_value(json_array_get(ch, 0));
        c->channels[1] = json_integer_value(json_array_get(ch, 1));
    }
    int clipped;
    if (g4_json_int(a, "hidden_size", 1024, &c->hidden, path, err) ||
        g4_json_int(a, "num_attention_heads", 8, &c->heads, path, err) ||
        g4_json_int(a, "num_hidden_layers", 12, &c->layers, path, err) ||
        g4_json_int(a, "conv_kernel_size", 5, &c->kernel, path, err) ||
        g4_json_int(a, "attention_chunk_size", 12, &c->chunk, path, err) ||
        g4_json_int(a, "attention_context_left", 13, &c->left, path, err) ||
        g4_json_int(a, "attention_context_right", 0, &c->right, path, err) ||
        g4_json_int(a, "output_proj_dims", 1536, &c->out_dims, path, err) ||
        g4_json_bool(a, "use_clipped_linears", 1, &clipped, path, err) ||
        g4_json_num(a, "rms_norm_eps", 1e-6, &c->eps, path, err) ||
        g4_json_num(a, "residual_weight", 0.5, &c->residual, path, err) ||
        g4_json_num(a, "attention_logit_cap", 50.0, &c->cap, path, err) ||
        g4_json_num(a, "attention_invalid_logits_value", -1e9, &c->invalid, path, err) ||
        g4_json_num(a, "gradient_clipping", 1e10, &c->grad_clip, path, err) ||
        g4_json_str(a, "hidden_act", &c->act, path, err))
        goto done;
    c->clipped = clipped;
    if (c->act && strcmp(c->act, "silu")) {
        g4_fail(err, "%s: audio hidden_act \"%s\" is not supported (silu)", path, c->act);
        goto done;
    }
    c->act = NULL; /* points into root */
    if (c->hidden < 2 || c->hidden > 65536 || c->heads < 1 || c->hidden % c->heads || c->layers < 0 || c->layers > 256 ||
        c->channels[0] < 1 || c->channels[1] < 1 || c->channels[0] > 4096 || c->channels[1] > 4096 || c->kernel < 1 ||
        c->kernel > 1024 || c->chunk < 1 || c->left < 2 || c->out_dims < 1 || c->out_dims > 65536 || !(c->cap > 0) ||
        !(c->eps >= 0) || !(c->grad_clip > 0)) {
        g4_fail(err, "%s: invalid audio_config", path);
        goto done;
    }
    /* Gemma4AudioRelPositionalEncoding's table is 2 * (hidden // 2) wide and relative_k_proj takes hidden */
    if (c->hidden % 2) {
        g4_fail(err, "%s: audio hidden_size %lld is odd (the relative position table is one narrower)", path,
                (long long)c->hidden);
        goto done;
    }
    /* masked slots hold attention_invalid_logits_value after the cap, so they weigh exp(inval - max) with
     * max >= -cap: only a value far below -cap keeps them out of the softmax, as the valid-frames-only
     * attention here assumes */
    if (!(c->invalid + c->cap <= -30.0)) {
        g4_fail(err, "%s: audio attention_invalid_logits_value %g lets masked keys into the softmax (not supported: "
                "at most -(attention_logit_cap + 30))", path, c->invalid);
        goto done;
    }
    if (c->right != 0) {
        g4_fail(err, "%s: audio attention_context_right %lld is not supported (0)", path, (long long)c->right);
        goto done;
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}

typedef struct {
    g4_binder *b;
    int clipped;
    int absent; /* clip bounds not in the weights */
    char name[512];
} tower_binder;

static const char *nm(tower_binder *b, const char *fmt, int l, const char *tail) {
    char part[256];
    snprintf(part, sizeof part, fmt, l);
    snprintf(b->name, sizeof b->name, "%s%s", part, tail);
    return b->name;
}

static const g4_tensor *mat(tower_binder *b, const char *name, int64_t rows, int64_t cols) {
    int64_t s[2] = {rows, cols};
    return g4_bind_matrix(b->b, name, 2, s);
}

static void vec1(tower_binder *b, const char *name, int64_t n, const float **field) {
    g4_bind_vector(b->b, name, 1, &n, field);
}

/* a clip bound; one the weights leave out is the module's initial value (+-inf, counted in b->absent) */
static float bound(tower_binder *b, const char *prefix, const char *what, float absent_value) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    return g4_bind_scalar_or(b->b, name, absent_value, &b->absent);
}

/* prefix names a Gemma4ClippableLinear: prefix.linear.weight [rows, cols] and its four bounds */
static void clin(tower_binder *b, const char *prefix, int64_t rows, int64_t cols, clipped_linear *out) {
    char name[512];
    snprintf(name, sizeof name, "%s.linear.weight", prefix);
    out->w = mat(b, name, rows, cols);
    out->in_lo = out->out_lo = -INFINITY;
    out->in_hi = out->out_hi = INFINITY;
    if (!b->clipped) return;
    out->in_lo = bound(b, prefix, "input_min", -INFINITY);
    out->in_hi = bound(b, prefix, "input_max", INFINITY);
    out->out_lo = bound(b, prefix, "output_min", -INFINITY);
    out->out_hi = bound(b, prefix, "output_max", INFINITY);
}

/* rows [r0, r0 + n) of a [rows, cols] clipped linear, with the same bounds */
static void clin_rows(const clipped_linear *src, int64_t r0, int64_t n, clipped_linear *out) {
    *out = *src;
    if (!src->w) return;
    /* the rows as the backend laid them out (the file's row bytes pointed into other rows where CUDA pads them:
     * hidden_size * 2 bytes not a multiple of 16) */
    out->view = g4_tensor_placed_rows(src->w, r0, n);
    out->w = &out->view;
}

/* A 4-D [out, in, 3, 3] convolution weight as a [out, in*9] matrix. */
static void conv_weight(tower_binder *b, const char *name, int64_t out, int64_t in, g4_tensor *view) {
    int64_t s[4] = {out, in, 3, 3};
    const g4_tensor *t = g4_bind_matrix_flat(b->b, name, 4, s);
    if (t) *view = *t;
}

int g4_audio_tower_bind(g4_binder *bd, g4_model *m, g4_audio_tower **out, g4_error *err) {
    *out = NULL;
    audio_config c;
    if (parse_config(m, &c, err)) return -1;
    g4_audio_tower *t = calloc(1, sizeof *t);
    if (!t) return g4_fail(err, "out of memory");
    t->m = m;
    t->D = (int)c.hidden;
    t->heads = (int)c.heads;
    t->head_dim = (int)(c.hidden / c.heads);
    t->n_layers = (int)c.layers;
    t->C1 = (int)c.channels[0];
    t->C2 = (int)c.channels[1];
    t->K = (int)c.kernel;
    t->window = (int)c.left - 1;
    /* Gemma4AudioRelPositionalEncoding's rows hold positions P, P-1, ..., 0 with P = context_size // 2
     * (context_size = chunk + left - 1 + right); _rel_shift pairs the key at distance d with position
     * d + P - (left - 1), and with a zero row (no relative term) where that is negative. P = left - 1 only when
     * chunk is left - 1 or left (the released 12 / 13). */
    t->pos_shift = (int)((c.chunk + c.left - 1 + c.right) / 2 - (c.left - 1));
    t->out_dims = (int)c.out_dims;
    t->text_hidden = m->cfg.text.hidden_size;
    t->eps = (float)c.eps;
    t->residual = (float)c.residual;
    t->logit_cap = (float)c.cap;
    t->grad_clip = (float)(c.grad_clip < 3.4028234663852886e38 ? c.grad_clip : 3.4028234663852886e38);
    t->layers = calloc((size_t)t->n_layers + 1, sizeof *t->layers);
    if (!t->layers || g4_audio_features_config_load(m->dir, &t->fx, err)) {
        if (!t->layers) g4_fail(err, "out of memory");
        free(t->layers);
        free(t);
        return -1;
    }
    *out = t; /* the model frees it, also when binding fails later */
    const int D = t->D, dh = t->head_dim, F2 = ((t->fx.n_mels + 1) / 2 + 1) / 2;
    tower_binder b = {.b = bd, .clipped = (int)c.clipped};
    const char *S = "model.audio_tower.subsample_conv_projection.";
    char name[512];
#define NAME(tail) (snprintf(name, sizeof name, "%s%s", S, tail), name)
    conv_weight(&b, NAME("layer0.conv.weight"), t->C1, 1, &t->conv0);
    vec1(&b, NAME("layer0.norm.weight"), t->C1, &t->norm0);
    conv_weight(&b, NAME("layer1.conv.weight"), t->C2, t->C1, &t->conv1);
    vec1(&b, NAME("layer1.norm.weight"), t->C2, &t->norm1);
    t->input_proj = mat(&b, NAME("input_proj_linear.weight"), D, (int64_t)F2 * t->C2);
#undef NAME
    t->out_proj = mat(&b, "model.audio_tower.output_proj.weight", t->out_dims, D);
    vec1(&b, "model.audio_tower.output_proj.bias", t->out_dims, &t->out_bias);
    t->embed_proj = mat(&b, "model.embed_audio.embedding_projection.weight", t->text_hidden, t->out_dims);
    for (int l = 0; l < t->n_layers; l++) {
        audio_layer *y = &t->layers[l];
        const char *L = "model.audio_tower.layers.%d.";
        char p[512];
        for (int f = 0; f < 2; f++) {
            const char *ff = f ? "feed_forward2" : "feed_forward1";
            snprintf(p, sizeof p, "%s.pre_layer_norm.weight", ff);
            vec1(&b, nm(&b, L, l, p), D, &y->ff_pre[f]);
            snprintf(p, sizeof p, "%s.post_layer_norm.weight", ff);
            vec1(&b, nm(&b, L, l, p), D, &y->ff_post[f]);
            snprintf(p, sizeof p, "%s.ffw_layer_1", ff);
            clin(&b, nm(&b, L, l, p), 4 * (int64_t)D, D, &y->ff_up[f]);
            snprintf(p, sizeof p, "%s.ffw_layer_2", ff);
            clin(&b, nm(&b, L, l, p), D, 4 * (int64_t)D, &y->ff_down[f]);
        }
        vec1(&b, nm(&b, L, l, "norm_pre_attn.weight"), D, &y->norm_pre_attn);
        vec1(&b, nm(&b, L, l, "norm_post_attn.weight"), D, &y->norm_post_attn);
        vec1(&b, nm(&b, L, l, "norm_out.weight"), D, &y->norm_out);
        clin(&b, nm(&b, L, l, "self_attn.q_proj"), D, D, &y->q);
        clin(&b, nm(&b, L, l, "self_attn.k_proj"), D, D, &y->k);
        clin(&b, nm(&b, L, l, "self_attn.v_proj"), D, D, &y->v);
        clin(&b, nm(&b, L, l, "self_attn.post"), D, D, &y->post);
        y->rel_k = mat(&b, nm(&b, L, l, "self_attn.relative_k_proj.weight"), D, D);
        int64_t n_dh = dh;
        const float *pds = g4_bind_vector(bd, nm(&b, L, l, "self_attn.per_dim_scale"), 1, &n_dh, NULL);
        float *qds = pds ? g4_bind_computed(bd, (size_t)dh, &y->q_dim_scale) : NULL;
        if (qds)
            for (int i = 0; i < dh; i++) /* F.softplus (threshold 20) in fp32 */
                qds[i] = pds[i] > 20.0f ? pds[i] : log1pf(expf(pds[i]));
        vec1(&b, nm(&b, L, l, "lconv1d.pre_layer_norm.weight"), D, &y->lc_pre_norm);
        vec1(&b, nm(&b, L, l, "lconv1d.conv_norm.weight"), D, &y->lc_conv_norm);
        int64_t dws[3] = {D, 1, t->K};
        g4_bind_vector(bd, nm(&b, L, l, "lconv1d.depthwise_conv1d.weight"), 3, dws, &y->dw);
        clipped_linear start;
        clin(&b, nm(&b, L, l, "lconv1d.linear_start"), 2 * (int64_t)D, D, &start);
        clin_rows(&start, 0, D, &y->lc_a);
        clin_rows(&start, D, D, &y->lc_b);
        clin(&b, nm(&b, L, l, "lconv1d.linear_end"), D, D, &y->lc_end);
    }
    /* Gemma4AudioRelPositionalEncoding in fp32: [sin(p*inv), cos(p*inv)], inv[i] = exp(-i*ln(1e4)/(D/2-1)), for
     * the position p = d + pos_shift of distance d (a zero row where p < 0) */
    float *pos = g4_bind_computed(bd, (size_t)t->window * D, &t->pos);
    if (pos) {
        const int half = D / 2;
        const float step = (float)(-log(10000.0) / (half - 1 > 1 ? half - 1 : 1));
        for (int d = 0; d < t->window; d++) {
            const int p = d + t->pos_shift;
            for (int i = 0; i < half; i++) {
                float a = (float)p * expf((float)i * step);
                pos[(size_t)d * D + i] = p < 0 ? 0.0f : sinf(a);
                pos[(size_t)d * D + half + i] = p < 0 ? 0.0f : cosf(a);
            }
        }
    }
    g4_warn_clip_bounds_absent(m, "audio", b.absent);
    return 0;
}

void g4_audio_tower_free(g4_audio_tower *t) {
    if (!t) return;
    free(t->layers);
    g4_audio_features_config_free(&t->fx);
    free(t);
}

const g4_audio_features_config *g4_audio_tower_features(const g4_audio_tower *t) { return &t->fx; }

int g4_audio_tower_n_tokens(const g4_audio_tower *t, int frames) { return (frames + 3) / 4; }

/* -------------------------------------------------------------- forward */
typedef struct {
    float *h, *x, *tmp, *big, *big2, *q, *k, *v, *att, *rel;
} audio_scratch;

/* y = clamp(W clamp(x)) with the linear's bounds; tmp receives the clamped input */
static void linear(g4_backend *be, const clipped_linear *cl, const float *x, int n, float *tmp, float *y) {
    const size_t in = (size_t)cl->w->shape[1];
    OPS->clamp(be, x, tmp, (size_t)n * in, cl->in_lo, cl->in_hi);
    OPS->matmul(be, tmp, n, cl->w, NULL, y);
    OPS->clamp(be, y, y, (size_t)n * (size_t)cl->w->shape[0], cl->out_lo, cl->out_hi);
}

/* h += residual_weight * post_norm(clip(down(silu(up(pre_norm(clip(h))))))) */
static void feed_forward(g4_audio_tower *t, const audio_layer *y, int f, audio_scratch *s, int n) {
    g4_backend *be = t->m->be;
    const size_t nd = (size_t)n * t->D;
    OPS->clamp(be, s->h, s->x, nd, -t->grad_clip, t->grad_clip);
    OPS->rmsnorm(be, s->x, y->ff_pre[f], n, t->D, t->eps, s->x);
    linear(be, &y->ff_up[f], s->x, n, s->tmp, s->big);
    OPS->sigmoid_mul(be, s->big, s->big, nd * 4, s->big);
    linear(be, &y->ff_down[f], s->big, n, s->big2, s->x);
    OPS->clamp(be, s->x, s->x, nd, -t->grad_clip, t->grad_clip);
    OPS->rmsnorm(be, s->x, y->ff_post[f], n, t->D, t->eps, s->x);
    OPS->scale(be, s->x, nd, t->residual);
    OPS->add(be, s->h, s->x, nd);
}

static void attention(g4_audio_tower *t, const audio_layer *y, audio_scratch *s, int n) {
    g4_backend *be = t->m->be;
    const size_t nd = (size_t)n * t->D;
    OPS->clamp(be, s->h, s->x, nd, -t->grad_clip, t->grad_clip);
    OPS->rmsnorm(be, s->x, y->norm_pre_attn, n, t->D, t->eps, s->x);
    linear(be, &y->q, s->x, n, s->tmp, s->q);
    linear(be, &y->k, s->x, n, s->tmp, s->k);
    linear(be, &y->v, s->x, n, s->tmp, s->v);
    OPS->matmul(be, t->pos, t->window, y->rel_k, NULL, s->rel);
    g4_local_attention_args a = {
        .q = s->q, .k = s->k, .v = s->v, .rel = s->rel, .q_dim_scale = y->q_dim_scale, .out = s->att, .n = n,
        .heads = t->heads, .head_dim = t->head_dim, .window = t->window,
        .q_scale = (float)(pow((double)t->head_dim, -0.5) / log(2.0)), .k_scale = (float)(log1p(exp(1.0)) / log(2.0)),
        .logit_cap = t->logit_cap,
    };
    OPS->local_attention(be, &a);
    linear(be, &y->post, s->att, n, s->tmp, s->x);
    OPS->clamp(be, s->x, s->x, nd, -t->grad_clip, t->grad_clip);
    OPS->rmsnorm(be, s->x, y->norm_post_attn, n, t->D, t->eps, s->x);
    OPS->add(be, s->h, s->x, nd);
}

/* h += linear_end(silu(conv_norm(clip(dwconv(glu(linear_start(pre_norm(h)))))))) */
static void light_conv(g4_audio_tower *t, const audio_layer *y, audio_scratch *s, int n) {
    g4_backend *be = t->m->be;
    const size_t nd = (size_t)n * t->D;
    OPS->rmsnorm(be, s->h, y->lc_pre_norm, n, t->D, t->eps, s->x);
    linear(be, &y->lc_a, s->x, n, s->tmp, s->q);
    linear(be, &y->lc_b, s->x, n, s->tmp, s->k);
    OPS->sigmoid_mul(be, s->q, s->k, nd, s->q);
    OPS->conv1d_causal_dw(be, s->q, y->dw, n, t->D, t->K, s->x);
    OPS->clamp(be, s->x, s->x, nd, -t->grad_clip, t->grad_clip);
    OPS->rmsnorm(be, s->x, y->lc_conv_norm, n, t->D, t->eps, s->x);
    OPS->sigmoid_mul(be, s->x, s->x, nd, s->x);
    linear(be, &y->lc_end, s->x, n, s->tmp, s->v);
    OPS->add(be, s->h, s->v, nd);
}

int g4_audio_tower_encode(g4_audio_tower *t, const float *features, int frames, float *embeddings, float *tower_out,
                          g4_error *err) {
    g4_backend *be = t->m->be;
    const int F0 = t->fx.n_mels, D = t->D, C1 = t->C1, C2 = t->C2;
    if (frames <= 0) return g4_fail(err, "the audio is too short for one feature frame");
    const int T1 = (frames - 1) / 2 + 1, F1 = (F0 - 1) / 2 + 1, T2 = (T1 - 1) / 2 + 1, F2 = (F1 - 1) / 2 + 1;
    const int n = T2;
    /* one block of backend memory for the whole clip */
    const size_t nd = (size_t)n * D, chunk = CONV1_CHUNK < T2 ? CONV1_CHUNK : (size_t)T2;
    size_t cols = (size_t)T1 * F1 * 9;
    if (chunk * F2 * C1 * 9 > cols) cols = chunk * F2 * C1 * 9;
    size_t y0 = (size_t)frames * F0 > (size_t)T1 * F1 * C1 ? (size_t)frames * F0 : (size_t)T1 * F1 * C1;
    size_t wide = nd * 4 > (size_t)n * t->out_dims ? nd * 4 : (size_t)n * t->out_dims;
    if (wide < (size_t)n * t->text_hidden) wide = (size_t)n * t->text_hidden;
    const size_t total = cols + y0 + (size_t)T2 * F2 * C2 + 7 * nd + 2 * wide + (size_t)t->window * D;
    float *mem = OPS->alloc(be, total * sizeof(float));
    if (!mem) return g4_fail(err, "out of memory for the audio tower (%d frames)", frames);
    float *col = mem, *a0 = col + cols, *a1 = a0 + y0;
    audio_scratch s = {.h = a1 + (size_t)T2 * F2 * C2};
    s.x = s.h + nd;
    s.tmp = s.x + nd;
    s.q = s.tmp + nd;
    s.k = s.q + nd;
    s.v = s.k + nd;
    s.att = s.v + nd;
    s.big = s.att + nd;
    s.big2 = s.big + wide;
    s.rel = s.big2 + wide;

    /* subsampling: [frames, F0, 1] -> conv0 -> [T1, F1, C1] -> conv1 -> [T2, F2, C2] (channels last) */
    OPS->to_device(be, a0, features, (size_t)frames * F0 * sizeof(float));
    OPS->im2col(be, a0, frames, F0, 1, 3, 3, 2, 1, 0, T1, col);
    OPS->matmul(be, col, T1 * F1, &t->conv0, NULL, a0);
    OPS->layernorm(be, a0, t->norm0, NULL, T1 * F1, C1, t->eps, a0);
    OPS->clamp(be, a0, a0, (size_t)T1 * F1 * C1, 0.0f, INFINITY);
    for (int r = 0; r < T2; r += (int)chunk) {
        int nr = T2 - r < (int)chunk ? T2 - r : (int)chunk;
        OPS->im2col(be, a0, T1, F1, C1, 3, 3, 2, 1, r, nr, col);
        OPS->matmul(be, col, nr * F2, &t->conv1, NULL, a1 + (size_t)r * F2 * C2);
    }
    OPS->layernorm(be, a1, t->norm1, NULL, T2 * F2, C2, t->eps, a1);
    OPS->clamp(be, a1, a1, (size_t)T2 * F2 * C2, 0.0f, INFINITY);
    OPS->matmul(be, a1, n, t->input_proj, NULL, s.h);

    for (int l = 0; l < t->n_layers; l++) {
        const audio_layer *y = &t->layers[l];
        feed_forward(t, y, 0, &s, n);
        attention(t, y, &s, n);
        light_conv(t, y, &s, n);
        feed_forward(t, y, 1, &s, n);
        OPS->clamp(be, s.h, s.h, nd, -t->grad_clip, t->grad_clip);
        OPS->rmsnorm(be, s.h, y->norm_out, n, D, t->eps, s.h);
    }
    OPS->matmul(be, s.h, n, t->out_proj, t->out_bias, s.big);
    if (tower_out) OPS->to_host(be, tower_out, s.big, (size_t)n * t->out_dims * sizeof(float));
    OPS->rmsnorm(be, s.big, NULL, n, t->out_dims, t->eps, s.big);
    OPS->matmul(be, s.big, n, t->embed_proj, NULL, s.big2);
    OPS->to_host(be, embeddings, s.big2, (size_t)n * t->text_hidden * sizeof(float));
    OPS->sync(be);
    OPS->release(be, mem);
    return OPS->check(be, err);
}

/* ------------------------------------------------------------- public API */
int g4_audio_rate(const g4_model *m) {
    return !m ? 0 : m->audio ? m->audio->fx.sampling_rate : m->cfg.unified ? m->cfg.uni.sampling_rate : 0;
}

int g4_audio_encode(g4_model *m, const float *pcm, size_t n, g4_soft_tokens *out, g4_error *err) {
    G4_ARG(out, err);
    memset(out, 0, sizeof *out);
    G4_ARG(m, err);
    if (n && !pcm) return g4_fail(err, "g4_audio_encode: pcm is NULL (%zu samples)", n);
    if (m->cfg.unified) return g4_unified_audio_encode(m, pcm, n, out, err);
    memset(out, 0, sizeof *out);
    g4_audio_tower *t = m->audio;
    if (!t) return g4_fail(err, "%s: this model does not take audio (no audio_config, or no audio tower in the weights)", m->dir);
    const size_t clip = (size_t)t->fx.max_samples;
    int n_clips = 0, total = 0;
    for (size_t at = 0; at < n; at += clip) { /* a tail too short for a frame gives no clip */
        int fr = g4_audio_n_frames(&t->fx, n - at < clip ? n - at : clip);
        if (fr > 0) {
            n_clips++;
            total += g4_audio_tower_n_tokens(t, fr);
        }
    }
    if (!n_clips)
        return g4_fail(err, "the audio is too short: %zu samples at %d Hz (at least %d needed)", n,
                       t->fx.sampling_rate, t->fx.frame_length / 2 + 1);
    out->kind = G4_MEDIA_AUDIO;
    out->hidden = t->text_hidden;
    out->block_tokens = calloc((size_t)n_clips, sizeof *out->block_tokens);
    out->rows = malloc((size_t)total * t->text_hidden * sizeof *out->rows);
    float *feat = malloc((size_t)g4_audio_n_frames(&t->fx, clip < n ? clip : n) * t->fx.n_mels * sizeof *feat + 1);
    if (!out->block_tokens || !out->rows || !feat) {
        free(feat);
        g4_soft_tokens_free(out);
        return g4_fail(err, "out of memory");
    }
    int rc = 0;
    pthread_mutex_lock(&m->backend_lock);
    for (size_t at = 0; at < n && !rc; at += clip) {
        size_t len = n - at < clip ? n - at : clip;
        int fr = g4_audio_n_frames(&t->fx, len);
        if (fr <= 0) continue;
        int k = g4_audio_tower_n_tokens(t, fr);
        rc = g4_audio_features(&t->fx, pcm + at, len, feat, err) ||
             g4_audio_tower_encode(t, feat, fr, out->rows + (size_t)out->n_tokens * t->text_hidden, NULL, err);
        out->block_tokens[out->n_blocks++] = k;
        out->n_tokens += k;
    }
    pthread_mutex_unlock(&m->backend_lock);
    free(feat);
    if (rc) g4_soft_tokens_free(out);
    return rc ? -1 : 0;
}
