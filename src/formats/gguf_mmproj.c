/* Gemma 4 mmproj files (gguf_mmproj.h). Followed: llama.cpp as node-llama-cpp 3.22.1 bundles it (llama.cpp.info.json:
 * tag v0.5.0 of its release bundle): conversion/gemma.py Gemma4VisionAudioModel (set_gguf_parameters :973-986,
 * tensor_force_quant :991-997, modify_tensors :999-1032), conversion/base.py MmprojModel.set_gguf_parameters
 * (:2640-2661) and prepare_tensors (:1047-1049: 1-D tensors and *_norm.weight F32), gguf-py/gguf/tensor_mapping.py
 * (the v.* / mm.* names), tools/mtmd/clip.cpp (:1637-1650 the gemma4v hyper-parameters it does not read from the
 * file: rope theta 100, pooling 3 or clip.vision.projector.scale_factor; :2602-2627 the tensors it binds) and
 * tools/mtmd/models/gemma4v.cpp (the graph: head size n_embd / n_head); for the audio tower (gemma4a) the converter's
 * audio branch (gemma.py:1006-1017), clip.cpp:3273-3340 (the tensors it binds) and tools/mtmd/models/gemma4a.cpp
 * (:49-52 chunk 12 and context 12 + 1, :87 soft cap 50, hard-coded); for the 12B's encoder-free embedders
 * (gemma4uv + gemma4ua) Gemma4UnifiedVisionAudioModel (gemma.py:1035-1083) and clip.cpp's gemma4uv / gemma4ua cases.
 * Ollama's single file: ollama/ollama convert/convert_gemma4.go (KV, Tensors, Replacements). */
#include "formats/gguf_mmproj.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/quant.h"
#include "formats/gguf.h"

/* v.blk.N.<gguf> -> model.vision_tower.encoder.layers.N.<hf>. The converter renames
 * model.vision_tower.encoder. -> vision_model.model. and .linear.weight -> .weight (gemma.py:1020-1021), then
 * tensor_mapping.py maps vision_model.model.layers.{bid}.* ("# gemma4" entries) to these v.blk.{bid}.* names;
 * the clip scalars (input_min, ...) keep their suffix on the mapped base name (map_tensor_name try_suffixes,
 * gemma.py:1031). */
static const struct {
    const char *gguf, *hf;
} layer_names[] = {
    {"ln1.weight", "input_layernorm.weight"},
    {"ln2.weight", "pre_feedforward_layernorm.weight"},
    {"attn_post_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_post_norm.weight", "post_feedforward_layernorm.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
}, linear_names[] = {
    {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"}, {"attn_v", "self_attn.v_proj"},
    {"attn_out", "self_attn.o_proj"}, {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
}, global_names[] = {
    /* gemma.py:1022-1023 appends .weight to position_embedding_table; tensor_mapping.py "# gemma4" */
    {"v.patch_embd.weight", "model.vision_tower.patch_embedder.input_proj.weight"},
    {"v.position_embd.weight", "model.vision_tower.patch_embedder.position_embedding_table"},
    {"v.std_bias", "model.vision_tower.std_bias"},
    {"v.std_scale", "model.vision_tower.std_scale"},
    {"mm.input_projection.weight", "model.embed_vision.embedding_projection.weight"},
};

static const char *const clip_suffixes[] = {"weight", "input_min", "input_max", "output_min", "output_max"};

/* 1 when a tensor of the tower (names starting with prefix) is a clip bound (<name>.input_min ...) */
static int holds_clip_bound(const g4_tensor_set *set, const char *prefix) {
    for (int i = 0; i < set->n_tensors; i++) {
        const char *name = set->tensors[i].name, *dot = strrchr(name, '.');
        if (!dot || strncmp(name, prefix, strlen(prefix))) continue;
        for (size_t s = 1; s < sizeof clip_suffixes / sizeof *clip_suffixes; s++)
            if (!strcmp(dot + 1, clip_suffixes[s])) return 1;
    }
    return 0;
}

/* The HF name of a vision tensor of the file, or -1 (audio, or a name the converter does not write). */
static int hf_name(const char *g, char *out, size_t cap) {
    for (size_t i = 0; i < sizeof global_names / sizeof *global_names; i++)
        if (!strcmp(g, global_names[i].gguf)) return snprintf(out, cap, "%s", global_names[i].hf) >= (int)cap ? -1 : 0;
    int l, k = 0;
    if (sscanf(g, "v.blk.%d.%n", &l, &k) != 1 || k == 0 || l < 0) return -1;
    const char *rest = g + k;
    for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
        if (!strcmp(rest, layer_names[i].gguf))
            return snprintf(out, cap, "model.vision_tower.encoder.layers.%d.%s", l, layer_names[i].hf) >= (int)cap ? -1 : 0;
    for (size_t i = 0; i < sizeof linear_names / sizeof *linear_names; i++) {
        size_t n = strlen(linear_names[i].gguf);
        if (strncmp(rest, linear_names[i].gguf, n) || rest[n] != '.') continue;
        for (size_t s = 0; s < sizeof clip_suffixes / sizeof *clip_suffixes; s++)
            if (!strcmp(rest + n + 1, clip_suffixes[s]))
                /* HF: <p>.linear.weight for the matrix, <p>.input_min ... beside it (docs/gemma4-towers.md §1) */
                return snprintf(out, cap, "model.vision_tower.encoder.layers.%d.%s.%s%s", l, linear_names[i].hf,
                                s == 0 ? "linear." : "", clip_suffixes[s]) >= (int)cap ? -1 : 0;
    }
    return -1;
}

/* The audio tower (projector gemma4a). gemma.py:1008-1017 renames model.audio_tower. -> conformer. and .linear. ->
 * ., appends .weight to per_dim_scale; tensor_mapping.py's "# gemma4" conformer entries give these a.* names (its
 * conv_norm / norm_conv are the other way round from the HF names: clip.cpp:3300 says so too). Ollama's file
 * (convert/convert_gemma4.go Replacements) names some of them otherwise: its column (NULL: as llama.cpp). */
static const struct {
    const char *gguf, *ollama, *hf;
    int linear; /* a Gemma4ClippableLinear: HF <p>.linear.weight + <p>.input_min ... */
} audio_layer_names[] = {
    {"ffn_up", NULL, "feed_forward1.ffw_layer_1", 1}, {"ffn_down", NULL, "feed_forward1.ffw_layer_2", 1},
    {"ffn_norm", NULL, "feed_forward1.pre_layer_norm", 0}, {"ffn_post_norm", NULL, "feed_forward1.post_layer_norm", 0},
    {"ffn_up_1", NULL, "feed_forward2.ffw_layer_1", 1}, {"ffn_down_1", NULL, "feed_forward2.ffw_layer_2", 1},
    {"ffn_norm_1", NULL, "feed_forward2.pre_layer_norm", 0},
    {"ffn_post_norm_1", NULL, "feed_forward2.post_layer_norm", 0}, {"attn_q", NULL, "self_attn.q_proj", 1},
    {"attn_k", NULL, "self_attn.k_proj", 1}, {"attn_v", NULL, "self_attn.v_proj", 1},
    {"attn_out", NULL, "self_attn.post", 1}, {"attn_k_rel", "linear_pos", "self_attn.relative_k_proj", 0},
    {"per_dim_scale", NULL, "self_attn.per_dim_scale", 0}, {"attn_pre_norm", "ln1", "norm_pre_attn", 0},
    {"attn_post_norm", "ln2", "norm_post_attn", 0}, {"ln2", "layer_pre_norm", "norm_out", 0},
    {"conv_norm", NULL, "lconv1d.pre_layer_norm", 0}, {"norm_conv", NULL, "lconv1d.conv_norm", 0},
    {"conv_dw", NULL, "lconv1d.depthwise_conv1d", 0}, {"conv_pw1", NULL, "lconv1d.linear_start", 1},
    {"conv_pw2", NULL, "lconv1d.linear_end", 1},
}, audio_global_names[] = {
    {"a.conv1d.0.weight", NULL, "model.audio_tower.subsample_conv_projection.layer0.conv.weight", 0},
    {"a.conv1d.0.norm.weight", NULL, "model.audio_tower.subsample_conv_projection.layer0.norm.weight", 0},
    {"a.conv1d.1.weight", NULL, "model.audio_tower.subsample_conv_projection.layer1.conv.weight", 0},
    {"a.conv1d.1.norm.weight", NULL, "model.audio_tower.subsample_conv_projection.layer1.norm.weight", 0},
    {"a.input_projection.weight", "a.pre_encode.out.weight",
     "model.audio_tower.subsample_conv_projection.input_proj_linear.weight", 0},
    {"a.pre_encode.out.weight", "mm.a.fc.weight", "model.audio_tower.output_proj.weight", 0},
    {"a.pre_encode.out.bias", "mm.a.fc.bias", "model.audio_tower.output_proj.bias", 0},
    {"mm.a.input_projection.weight", NULL, "model.embed_audio.embedding_projection.weight", 0},
};

/* The writers of Gemma 4 towers in GGUF: llama.cpp's projector file (clip.* keys) and Ollama's model file, which
 * carries the towers beside the decoder (gemma4.vision.* / gemma4.audio.* keys, convert/convert_gemma4.go KV). */
typedef struct layout {
    int ollama;
    const char *v, *a; /* the key prefixes */
} layout;

#define GGUF_NAME(tab, i, lay) ((lay)->ollama && (tab)[i].ollama ? (tab)[i].ollama : (tab)[i].gguf)

static int audio_hf_name(const char *g, const layout *lay, char *out, size_t cap) {
    for (size_t i = 0; i < sizeof audio_global_names / sizeof *audio_global_names; i++)
        if (!strcmp(g, GGUF_NAME(audio_global_names, i, lay)))
            return snprintf(out, cap, "%s", audio_global_names[i].hf) >= (int)cap ? -1 : 0;
    int l, k = 0;
    if (sscanf(g, "a.blk.%d.%n", &l, &k) != 1 || k == 0 || l < 0) return -1;
    const char *rest = g + k;
    for (size_t i = 0; i < sizeof audio_layer_names / sizeof *audio_layer_names; i++) {
        const char *gn = GGUF_NAME(audio_layer_names, i, lay);
        size_t n = strlen(gn);
        if (strncmp(rest, gn, n) || rest[n] != '.') continue;
        const int lin = audio_layer_names[i].linear;
        for (size_t s = 0; s < (lin ? sizeof clip_suffixes / sizeof *clip_suffixes : 1); s++)
            if (!strcmp(rest + n + 1, clip_suffixes[s]))
            {
                /* per_dim_scale is a bare parameter in HF: both converters added .weight (gemma.py:1011) */
                if (!strcmp(audio_layer_names[i].gguf, "per_dim_scale"))
                    return snprintf(out, cap, "model.audio_tower.layers.%d.%s", l, audio_layer_names[i].hf) >= (int)cap
                               ? -1 : 0;
                return snprintf(out, cap, "model.audio_tower.layers.%d.%s%s%s", l, audio_layer_names[i].hf,
                                lin && s == 0 ? ".linear." : ".", clip_suffixes[s]) >= (int)cap ? -1 : 0;
            }
    }
    return -1;
}

/* A metadata key: prefix.rest */
static const char *mkey(char *buf, size_t cap, const char *prefix, const char *rest) {
    snprintf(buf, cap, "%s.%s", prefix, rest);
    return buf;
}

static const char *meta_str(const json_t *meta, const char *key) { return json_string_value(json_object_get(meta, key)); }

/* An unsigned integer key; -1 when absent, -2 when present but not a non-negative integer. */
static long long meta_int(const json_t *meta, const char *key) {
    const json_t *v = json_object_get(meta, key);
    if (!v) return -1;
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -2;
    return (long long)json_integer_value(v);
}

static int need_int(const json_t *meta, const char *key, const char *path, int *out, g4_error *err) {
    long long v = meta_int(meta, key);
    if (v == -1) return g4_fail(err, "%s: the file has no %s", path, key);
    if (v < 1 || v > (1 << 24)) return g4_fail(err, "%s: %s must be a positive integer", path, key);
    *out = (int)v;
    return 0;
}

static int opt_int(const json_t *meta, const char *key, const char *path, int dflt, int *out, g4_error *err) {
    if (meta_int(meta, key) == -1) {
        *out = dflt;
        return 0;
    }
    return need_int(meta, key, path, out, err);
}

/* The converter's pixel order: ggml's im2col reads a patch channel by channel (c, y, x) where transformers' patches
 * are (y, x, c) rasters. gemma.py:1024-1028 reshapes input_proj [D, p*p*3] to [D, p, p, 3] and permutes it to
 * [D, 3, p, p]; the unified projector (gemma.py:1056-1083) permutes patch_dense's columns and patch_ln1 the same
 * way. Back, for `rows` rows of 3 * p * p values (t's shape checked by the caller): out[r][(y*p + x)*3 + c] =
 * in[r][(c*p + y)*p + x], into a buffer `set` owns; t becomes [rows, 3 * p * p] (1-D when rows is 0). */
static int chw_to_hwc(g4_tensor *t, int64_t rows, int p, g4_tensor_set *set, const char *path, g4_error *err) {
    if (t->dtype != G4_F32 && t->dtype != G4_F16 && t->dtype != G4_BF16)
        return g4_fail(err, "%s: %s is %s; the converter writes F32 or F16", path, t->name,
                       t->dtype ? g4_dtype_name(t->dtype) : "of an unknown type");
    const size_t es = (size_t)g4_dtype_bits(t->dtype) / 8, pp = (size_t)p * (size_t)p, n = rows ? (size_t)rows : 1;
    unsigned char *out = malloc(n * 3 * pp * es);
    if (!out) return g4_fail(err, "out of memory");
    const unsigned char *in = t->data;
    for (size_t d = 0; d < n; d++)
        for (size_t c = 0; c < 3; c++)
            for (size_t yx = 0; yx < pp; yx++)
                memcpy(out + ((d * pp + yx) * 3 + c) * es, in + ((d * 3 + c) * pp + yx) * es, es);
    if (g4_tensor_set_own(set, out, err)) return -1;
    t->data = out;
    t->ndim = rows ? 2 : 1;
    t->shape[0] = rows ? rows : (int64_t)(3 * pp);
    t->shape[1] = rows ? (int64_t)(3 * pp) : 0;
    return 0;
}

/* 1 when t has exactly the shape `want` of n axes, else 0 after an error naming it. */
static int has_shape(const g4_tensor *t, const int64_t *want, int n, const char *path, g4_error *err) {
    int same = t->ndim == n;
    for (int i = 0; same && i < n; i++) same = t->shape[i] == want[i];
    if (same) return 1;
    char s1[128], s2[128];
    g4_fail(err, "%s: %s has shape %s, expected %s", path, t->name, g4_shape_str(t->shape, t->ndim, s1, sizeof s1),
            g4_shape_str(want, n, s2, sizeof s2));
    return 0;
}

/* The vision half (projector gemma4v, or Ollama's gemma4.vision.* keys): its vision_config, or NULL after an error. */
static json_t *vision_config(const g4_gguf *g, const layout *lay, const char *path, int text_hidden, int *D_out,
                             int *P_out, g4_error *err) {
    const json_t *meta = g->meta;
    char k[96];
    /* MmprojModel.set_gguf_parameters (base.py:2643-2653) and gemma.py:979; Ollama writes the same keys under
     * gemma4.vision. but projection_dim (its towers project to the model they sit in) */
    int D = 0, I = 0, L = 0, H = 1, P = 0, proj = text_hidden, KV = 0, hd = 0, pool = 0;
    if (need_int(meta, mkey(k, sizeof k, lay->v, "embedding_length"), path, &D, err) ||
        need_int(meta, mkey(k, sizeof k, lay->v, "feed_forward_length"), path, &I, err) ||
        need_int(meta, mkey(k, sizeof k, lay->v, "block_count"), path, &L, err) ||
        need_int(meta, mkey(k, sizeof k, lay->v, "attention.head_count"), path, &H, err) ||
        need_int(meta, mkey(k, sizeof k, lay->v, "patch_size"), path, &P, err) ||
        (!lay->ollama && need_int(meta, mkey(k, sizeof k, lay->v, "projection_dim"), path, &proj, err)) ||
        /* optional keys clip.cpp reads: head_count_kv (else n_head), head_dim (written when q width != n_embd;
         * else n_embd / n_head), projector.scale_factor (gemma4v: the pooling kernel, default 3, clip.cpp:1640) */
        opt_int(meta, mkey(k, sizeof k, lay->v, "attention.head_count_kv"), path, H, &KV, err) ||
        opt_int(meta, mkey(k, sizeof k, lay->v, "attention.head_dim"), path, D / H, &hd, err) ||
        opt_int(meta, mkey(k, sizeof k, lay->v, "projector.scale_factor"), path, 3, &pool, err))
        return NULL;
    const json_t *epsv = json_object_get(meta, mkey(k, sizeof k, lay->v, "attention.layer_norm_epsilon"));
    if (!json_is_number(epsv)) {
        g4_fail(err, "%s: the file has no %s", path, k);
        return NULL;
    }
    if (proj != text_hidden) {
        g4_fail(err, "%s: the projector maps to %d-wide embeddings, the text model's hidden size is %d: not this "
                     "model's projector", path, proj, text_hidden);
        return NULL;
    }
/* position_embedding_size is not in the metadata: the table's shape [2, size, D] (gemma4v.cpp reads ne[1]) */
    const g4_tensor *pos = g4_tensor_set_find(&g->set, "v.position_embd.weight");
    if (!pos) {
        g4_fail(err, "%s: the file has no v.position_embd.weight", path);
        return NULL;
    }
    if (pos->ndim != 3 || pos->shape[0] != 2 || pos->shape[2] != D) {
        char sh[128];
        g4_fail(err, "%s: v.position_embd.weight has shape %s, expected [2, n, %d]", path,
                g4_shape_str(pos->shape, pos->ndim, sh, sizeof sh), D);
        return NULL;
    }
    /* use_clipped_linears and standardize are not in the metadata either: the tensors say (clip.cpp:2604-2626
     * binds std_bias/std_scale and each linear's clamps when present; a clamp left out is unbounded, as the binders
     * of the towers take one the weights leave out) */
    const int clipped = holds_clip_bound(&g->set, "v.");
    const int standardize = g4_tensor_set_find(&g->set, "v.std_bias") != NULL;
    json_t *vc = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:i, s:i, s:I, s:b, s:b, s:{s:s, s:f}}",
                           "hidden_size", D, "intermediate_size", I, "num_hidden_layers", L, "num_attention_heads", H,
                           "num_key_value_heads", KV, "head_dim", hd, "hidden_activation", "gelu_pytorch_tanh",
                           "rms_norm_eps", json_number_value(epsv), "patch_size", P, "pooling_kernel_size", pool,
                           "position_embedding_size", (json_int_t)pos->shape[1], "use_clipped_linears", clipped,
                           "standardize", standardize, "rope_parameters", "rope_type", "default", "rope_theta",
                           100.0 /* clip.cpp:1639, as transformers' class default */);
    if (!vc) g4_fail(err, "out of memory");
    *D_out = D;
    *P_out = P;
    return vc;
}

/* The first axis of tensor `name`, or -1 after an error naming it. */
static int64_t dim0(const g4_gguf *g, const char *name, int ndim, const char *path, g4_error *err) {
    const g4_tensor *t = g4_tensor_set_find(&g->set, name);
    if (!t) return g4_fail(err, "%s: the file has no %s", path, name), -1;
    if (t->ndim != ndim) {
        char sh[128];
        return g4_fail(err, "%s: %s has shape %s, expected %d dimensions", path, name,
                       g4_shape_str(t->shape, t->ndim, sh, sizeof sh), ndim), -1;
    }
    return t->shape[0];
}

/* The audio half (projector gemma4a, or Ollama's gemma4.audio.* keys): an audio_config, or NULL after an error. The
 * conformer's attention constants are not in the file: gemma4a.cpp hard-codes transformers' values (chunk 12,
 * context 12 + 1, soft cap 50), taken here as audio_config's. */
static json_t *audio_config(const g4_gguf *g, const layout *lay, const char *path, int text_hidden, g4_error *err) {
    const json_t *meta = g->meta;
    char k[96];
    /* MmprojModel.set_gguf_parameters (base.py:2663-2671) and gemma.py:982-986; Ollama writes neither
     * projection_dim nor num_mel_bins */
    int D = 0, I = 0, L = 0, H = 0, proj = text_hidden, mels = 128;
    if (need_int(meta, mkey(k, sizeof k, lay->a, "embedding_length"), path, &D, err) ||
        need_int(meta, mkey(k, sizeof k, lay->a, "feed_forward_length"), path, &I, err) ||
        need_int(meta, mkey(k, sizeof k, lay->a, "block_count"), path, &L, err) ||
        need_int(meta, mkey(k, sizeof k, lay->a, "attention.head_count"), path, &H, err) ||
        (!lay->ollama && (need_int(meta, mkey(k, sizeof k, lay->a, "projection_dim"), path, &proj, err) ||
                          need_int(meta, mkey(k, sizeof k, lay->a, "num_mel_bins"), path, &mels, err))))
        return NULL;
    const json_t *epsv = json_object_get(meta, mkey(k, sizeof k, lay->a, "attention.layer_norm_epsilon"));
    if (!json_is_number(epsv)) {
        g4_fail(err, "%s: the file has no %s", path, k);
        return NULL;
    }
    if (proj != text_hidden) {
        g4_fail(err, "%s: the audio projector maps to %d-wide embeddings, the text model's hidden size is %d: not "
                     "this model's projector", path, proj, text_hidden);
        return NULL;
    }
    if (I != 4 * D) { /* gemma.py:969-970: intermediate_size = 4 * hidden_size, as the conformer's feed-forward */
        g4_fail(err, "%s: %s.feed_forward_length %d is not 4 x embedding_length %d", path, lay->a, I, D);
        return NULL;
    }
    if (mels != 128) { /* the feature extractor's feature_size, as transformers' default (input_feat_size) */
        g4_fail(err, "%s: %s.num_mel_bins %d: Gemma 4's feature extractor makes 128", path, lay->a, mels);
        return NULL;
    }
    /* shapes the metadata leaves out: the two subsampling convolutions' channels, the depthwise kernel, the
     * output projection's width */
    const int64_t c1 = dim0(g, "a.conv1d.0.weight", 4, path, err), c2 = c1 < 0 ? -1 : dim0(g, "a.conv1d.1.weight", 4, path, err),
                  od = c2 < 0 ? -1 : dim0(g, lay->ollama ? "mm.a.fc.weight" : "a.pre_encode.out.weight", 2, path, err);
    const g4_tensor *dw = od < 0 ? NULL : g4_tensor_set_find(&g->set, "a.blk.0.conv_dw.weight");
    if (od < 0) return NULL;
    if (!dw || dw->ndim != 2) {
        g4_fail(err, "%s: the file has no 2-D a.blk.0.conv_dw.weight", path);
        return NULL;
    }
    const int clipped = holds_clip_bound(&g->set, "a.");
    json_t *ac = json_pack("{s:i, s:i, s:i, s:s, s:[I, I], s:I, s:f, s:i, s:i, s:i, s:f, s:f, s:b, s:f, s:f, s:I}",
                           "hidden_size", D, "num_hidden_layers", L, "num_attention_heads", H, "hidden_act", "silu",
                           "subsampling_conv_channels", (json_int_t)c1, (json_int_t)c2, "conv_kernel_size",
                           (json_int_t)dw->shape[1], "residual_weight", 0.5, "attention_chunk_size", 12,
                           "attention_context_left", 13, "attention_context_right", 0, "attention_logit_cap", 50.0,
                           "attention_invalid_logits_value", -1e9, "use_clipped_linears", clipped, "rms_norm_eps",
                           json_number_value(epsv), "gradient_clipping", 1e10, "output_proj_dims", (json_int_t)od);
    if (!ac) g4_fail(err, "out of memory");
    return ac;
}

/* The unified model's projector (gemma.py Gemma4UnifiedVisionAudioModel :1035-1083, projector types gemma4uv and
 * gemma4ua; clip.cpp :1637-1650, :2628-2637, :3343-3346; models/gemma4uv.cpp, gemma4ua.cpp): the encoder-free
 * embedders under their checkpoint names (towers/unified.c binds them). The converter renames pos_norm to patch_ln3
 * and tensor_mapping.py maps model.vision_embedder.{patch_ln{bid}, patch_dense, pos_embedding} to
 * v.patch_norm.{bid}, v.patch_embd, v.position_embd; the projections are gemma4v's / gemma3n's names. */
static const struct {
    const char *gguf, *hf;
} unified_names[] = {
    {"v.patch_norm.1.weight", "model.vision_embedder.patch_ln1.weight"},
    {"v.patch_norm.1.bias", "model.vision_embedder.patch_ln1.bias"},
    {"v.patch_embd.weight", "model.vision_embedder.patch_dense.weight"},
    {"v.patch_embd.bias", "model.vision_embedder.patch_dense.bias"},
    {"v.patch_norm.2.weight", "model.vision_embedder.patch_ln2.weight"},
    {"v.patch_norm.2.bias", "model.vision_embedder.patch_ln2.bias"},
    {"v.position_embd.weight", "model.vision_embedder.pos_embedding"},
    {"v.patch_norm.3.weight", "model.vision_embedder.pos_norm.weight"},
    {"v.patch_norm.3.bias", "model.vision_embedder.pos_norm.bias"},
    {"mm.input_projection.weight", "model.embed_vision.embedding_projection.weight"},
    {"mm.a.input_projection.weight", "model.embed_audio.embedding_projection.weight"},
};

static const char *unified_hf_name(const char *g) {
    for (size_t i = 0; i < sizeof unified_names / sizeof *unified_names; i++)
        if (!strcmp(g, unified_names[i].gguf)) return unified_names[i].hf;
    return NULL;
}

/* The vision_config and audio_config of a unified projector, or -1 after an error. The converter writes the
 * vision half's embedding_length as mm_embed_dim, patch_size as the 16-px patch (clip.cpp multiplies it by the
 * pooling kernel, projector.scale_factor or 3: the 48-px block), the audio half's embedding_length as the samples
 * a frame (audio_embed_dim); feed_forward_length, block_count and head_count are 0, num_mel_bins is 128 and
 * unused (gemma4ua reads 640-sample frames). mm_posemb_size comes from the position table [2, size, E]. */
static int unified_configs(const g4_gguf *g, const char *path, int text_hidden, json_t **vc, json_t **ac, int *E_out,
                           int *block_out, g4_error *err) {
    const json_t *meta = g->meta;
    int E = 0, P = 0, k = 0, proj = 0, A = 0, aproj = 0;
    if (need_int(meta, "clip.vision.embedding_length", path, &E, err) ||
        need_int(meta, "clip.vision.patch_size", path, &P, err) ||
        need_int(meta, "clip.vision.projection_dim", path, &proj, err) ||
        opt_int(meta, "clip.vision.projector.scale_factor", path, 3, &k, err) ||
        need_int(meta, "clip.audio.embedding_length", path, &A, err) ||
        need_int(meta, "clip.audio.projection_dim", path, &aproj, err))
        return -1;
    const json_t *veps = json_object_get(meta, "clip.vision.attention.layer_norm_epsilon"),
                 *aeps = json_object_get(meta, "clip.audio.attention.layer_norm_epsilon");
    if (!json_is_number(veps))
        return g4_fail(err, "%s: the mmproj file has no clip.vision.attention.layer_norm_epsilon", path);
    if (aeps && !json_is_number(aeps))
        return g4_fail(err, "%s: clip.audio.attention.layer_norm_epsilon is not a number", path);
    if (proj != text_hidden || aproj != text_hidden)
        return g4_fail(err, "%s: the projector maps to %d-wide embeddings, the text model's hidden size is %d: not this "
                            "model's projector", path, proj != text_hidden ? proj : aproj, text_hidden);
    if ((int64_t)P * k > 4096) return g4_fail(err, "%s: patch_size %d x scale_factor %d is too large", path, P, k);
    const g4_tensor *pos = g4_tensor_set_find(&g->set, "v.position_embd.weight");
    if (!pos) return g4_fail(err, "%s: the mmproj file has no v.position_embd.weight", path);
    if (pos->ndim != 3 || pos->shape[0] != 2 || pos->shape[2] != E) {
        char sh[128];
        return g4_fail(err, "%s: v.position_embd.weight has shape %s, expected [2, n, %d]", path,
                       g4_shape_str(pos->shape, pos->ndim, sh, sizeof sh), E);
    }
    *vc = json_pack("{s:i, s:i, s:i, s:I, s:i, s:f}", "patch_size", P, "pooling_kernel_size", k, "mm_embed_dim", E,
                    "mm_posemb_size", (json_int_t)pos->shape[1], "output_proj_dims", E, "rms_norm_eps",
                    json_number_value(veps));
    /* clip.cpp :1971 takes 1e-6 whatever the file says; the converter writes 1e-6 (the audio_config has no
     * layer_norm_eps) */
    *ac = json_pack("{s:i, s:f}", "audio_embed_dim", A, "rms_norm_eps", aeps ? json_number_value(aeps) : 1e-6);
    if (!*vc || !*ac) {
        json_decref(*vc);
        json_decref(*ac);
        *vc = *ac = NULL;
        return g4_fail(err, "out of memory");
    }
    *E_out = E;
    *block_out = P * k;
    return 0;
}

/* A [2, n, E] table as [n, 2, E] (gemma.py:1050-1052 permuted the checkpoint's (1, 0, 2)), into a buffer `set`
 * owns; the shape was checked by unified_configs. */
static int swap_first_axes(g4_tensor *t, g4_tensor_set *set, const char *path, g4_error *err) {
    if (t->dtype != G4_F32 && t->dtype != G4_F16 && t->dtype != G4_BF16)
        return g4_fail(err, "%s: %s is %s; the converter writes F32 or F16", path, t->name,
                       t->dtype ? g4_dtype_name(t->dtype) : "of an unknown type");
    const size_t row = (size_t)t->shape[2] * (size_t)g4_dtype_bits(t->dtype) / 8, n = (size_t)t->shape[1];
    unsigned char *out = malloc(2 * n * row);
    if (!out) return g4_fail(err, "out of memory");
    for (size_t a = 0; a < 2; a++)
        for (size_t i = 0; i < n; i++) memcpy(out + (i * 2 + a) * row, (const unsigned char *)t->data + (a * n + i) * row, row);
    if (g4_tensor_set_own(set, out, err)) return -1;
    t->data = out;
    t->shape[0] = (int64_t)n;
    t->shape[1] = 2;
    return 0;
}

/* An owned f32 copy of a 1-D float tensor with f applied (llama.cpp writes it F32, Ollama in the checkpoint's type). */
static int map_f32(g4_tensor *t, double (*f)(double), g4_tensor_set *set, const char *gname, const char *path,
                   g4_error *err) {
    if ((t->dtype != G4_F32 && t->dtype != G4_F16 && t->dtype != G4_BF16) || t->ndim != 1)
        return g4_fail(err, "%s: %s must be a 1-D float tensor (the converters write it so)", path, gname);
    float *out = malloc(((size_t)t->shape[0] + 1) * sizeof *out);
    if (!out) return g4_fail(err, "out of memory");
    g4_dequant_row(t, 0, out);
    for (int64_t i = 0; i < t->shape[0]; i++) out[i] = (float)f(out[i]);
    if (g4_tensor_set_own(set, out, err)) return -1;
    t->data = out;
    t->dtype = G4_F32;
    t->nbytes = (size_t)t->shape[0] * sizeof *out;
    return 0;
}

/* gemma.py:1010-1012 stores softplus(per_dim_scale) (torch's, threshold 20); the tower applies softplus itself, so
 * the inverse: x = y + log(-expm1(-y)) (y > 20: x = y). */
static double inverse_softplus(double y) { return y > 20.0 ? y : y + log(-expm1(-y)); }

/* The towers of `path` into `set`: of a projector file opened here (meta NULL), or, with `meta` (Ollama's file),
 * of the model file whose metadata that is and whose tensors `set` already holds under their GGUF names: those are
 * renamed and converted in place (the file is not opened again). */
static int attach(const char *path, const json_t *model_meta, const layout *lay, int text_hidden, g4_tensor_set *set,
                  json_t **vision_config_out, json_t **audio_config_out, int *unified_out, g4_error *err) {
    *vision_config_out = *audio_config_out = NULL;
    *unified_out = 0;
    /* a projector file that fails leaves the set's tensors as they were (in place, some may be renamed) */
    const int n0 = set->n_tensors, in_place = model_meta != NULL;
    g4_gguf g = {0};
    if (in_place) /* a view for the readers of the configs (the set is sorted: finished by its loader) */
        g.meta = (json_t *)model_meta, g.set = *set;
    else if (g4_gguf_open(path, &g, err))
        return -1;
    const json_t *meta = g.meta;
    json_t *vc = NULL, *ac = NULL;
    int rc = -1, D = 0, P = 0;
    const char *arch = meta_str(meta, "general.architecture");
    if (!arch || strcmp(arch, lay->ollama ? "gemma4" : "clip")) {
        g4_fail(err, "%s: not an mmproj file (general.architecture is \"%s\", a projector's is \"clip\")%s", path,
                arch ? arch : "absent", arch && !strncmp(arch, "gemma", 5) ? ": pass the text model with -m and the "
                                                                             "projector with --mmproj" : "");
        goto done;
    }
    /* the projector types: clip.vision.projector_type and clip.audio.projector_type (mixed files, gemma.py:978,
     * 984), else clip.projector_type for the one encoder the file has; Ollama's file writes the towers' block
     * counts only (convert_gemma4.go KV: a tower without layers is not written) */
    const char *vt = meta_str(meta, "clip.vision.projector_type"), *at = meta_str(meta, "clip.audio.projector_type"),
               *pt = meta_str(meta, "clip.projector_type");
    if (lay->ollama) {
        vt = json_object_get(meta, "gemma4.vision.block_count") ? "gemma4v" : NULL;
        at = json_object_get(meta, "gemma4.audio.block_count") ? "gemma4a" : NULL;
        if (!vt && !at) {
            rc = 0; /* a text-only file */
            goto done;
        }
    } else if (!vt && !at && pt) {
        if (json_is_true(json_object_get(meta, "clip.has_audio_encoder")) &&
            !json_is_true(json_object_get(meta, "clip.has_vision_encoder")))
            at = pt;
        else
            vt = pt;
    }
    if (!vt && !at) {
        g4_fail(err, "%s: the mmproj file has no clip.vision.projector_type", path);
        goto done;
    }
    /* the unified model's projector holds both embedders (the converter asserts both configs) */
    const int unified = (vt && !strcmp(vt, "gemma4uv")) || (at && !strcmp(at, "gemma4ua"));
    if (unified && (!vt || strcmp(vt, "gemma4uv") || !at || strcmp(at, "gemma4ua"))) {
        g4_fail(err, "%s: a gemma4_unified projector holds the image and the audio embedder (projector types "
                     "\"gemma4uv\" and \"gemma4ua\"); this one has \"%s\" and \"%s\"", path, vt ? vt : "none",
                at ? at : "none");
        goto done;
    }
    if (!unified && vt && strcmp(vt, "gemma4v")) {
        g4_fail(err, "%s: projector type \"%s\" is not Gemma 4's vision tower (\"gemma4v\", or \"gemma4uv\" for 12B)",
                path, vt);
        goto done;
    }
    if (!unified && at && strcmp(at, "gemma4a")) {
        g4_fail(err, "%s: audio projector type \"%s\" is not Gemma 4's audio tower (\"gemma4a\", or \"gemma4ua\" for "
                     "12B)", path, at);
        goto done;
    }
    if (unified && unified_configs(&g, path, text_hidden, &vc, &ac, &D, &P, err)) goto done;
    if (!unified && vt && !(vc = vision_config(&g, lay, path, text_hidden, &D, &P, err))) goto done;
    if (!unified && at && !(ac = audio_config(&g, lay, path, text_hidden, err))) goto done;
    /* move the file and the towers' tensors into `set` under their HF names (in place: rename them there) */
    int fi = -1;
    if (!in_place) {
        if (g.set.n_files != 1) {
            g4_fail(err, "%s: unexpected file layout", path);
            goto done;
        }
        fi = g4_tensor_set_add_file(set, g.set.files[0], path, err);
        g.set.files[0] = (g4_mapped_file){0}; /* `set` unmaps it now (or did, failing) */
        if (fi < 0) goto done;
    }
    const int n_src = in_place ? n0 : g.set.n_tensors;
    for (int i = 0; i < n_src; i++) {
        g4_tensor t = in_place ? set->tensors[i] : g.set.tensors[i];
        char hf[256];
        const char *uname = unified ? unified_hf_name(t.name) : NULL;
        if (uname) {
            const int64_t dense[2] = {D, 3 * (int64_t)P * P}, ln1[1] = {3 * (int64_t)P * P};
            if (!strcmp(t.name, "v.patch_embd.weight")) {
                if (!has_shape(&t, dense, 2, path, err) || chw_to_hwc(&t, D, P, set, path, err)) goto done;
            } else if (!strncmp(t.name, "v.patch_norm.1.", 15)) {
                if (!has_shape(&t, ln1, 1, path, err) || chw_to_hwc(&t, 0, P, set, path, err)) goto done;
            } else if (!strcmp(t.name, "v.position_embd.weight") && swap_first_axes(&t, set, path, err)) {
                goto done;
            }
            snprintf(hf, sizeof hf, "%s", uname);
        } else if (unified) {
            continue; /* a name the converter does not write for the unified model: left out */
        } else if (vc && !hf_name(t.name, hf, sizeof hf)) {
            const int64_t patch[4] = {D, 3, P, P};
            if (!strcmp(t.name, "v.patch_embd.weight") &&
                (!has_shape(&t, patch, 4, path, err) || chw_to_hwc(&t, D, P, set, path, err)))
                goto done;
        } else if (ac && !audio_hf_name(t.name, lay, hf, sizeof hf)) {
            const size_t n = strlen(t.name);
            if (n > 15 && !strcmp(t.name + n - 15, ".conv_dw.weight")) {
                /* gemma.py:1013-1015: the depthwise kernel [C, 1, K] reshaped to [C, K]; back to [C, 1, K] */
                if (t.ndim != 2) {
                    g4_fail(err, "%s: %s must be 2-D", path, t.name);
                    goto done;
                }
                t.ndim = 3;
                t.shape[2] = t.shape[1];
                t.shape[1] = 1;
            } else if (n > 21 && !strcmp(t.name + n - 21, ".per_dim_scale.weight") &&
                       map_f32(&t, inverse_softplus, set, t.name, path, err)) {
                goto done;
            }
        } else {
            continue; /* not a tower this file declares, or a name the converter does not write: left out */
        }
        if (in_place) {
            char *name = strdup(hf);
            if (!name) {
                g4_fail(err, "out of memory");
                goto done;
            }
            free((char *)set->tensors[i].name);
            t.name = name;
            set->tensors[i] = t;
        } else {
            t.name = hf;
            if (g4_tensor_set_add(set, &t, fi, err)) goto done;
        }
    }
    *vision_config_out = vc;
    *audio_config_out = ac;
    *unified_out = unified;
    vc = ac = NULL;
    rc = 0;
done:
    json_decref(vc);
    json_decref(ac);
    if (!in_place) g4_gguf_free(&g);
    if (rc && !in_place)
        while (set->n_tensors > n0) free((char *)set->tensors[--set->n_tensors].name);
    return rc;
}

int g4_mmproj_attach(const char *path, int text_hidden, g4_tensor_set *set, json_t **vision_config,
                     json_t **audio_config, int *unified, g4_error *err) {
    static const layout llama = {0, "clip.vision", "clip.audio"};
    return attach(path, NULL, &llama, text_hidden, set, vision_config, audio_config, unified, err);
}

int g4_mmproj_attach_embedded(const char *path, const json_t *meta, int text_hidden, g4_tensor_set *set,
                              json_t **vision_config, json_t **audio_config, g4_error *err) {
    static const layout ollama = {1, "gemma4.vision", "gemma4.audio"};
    int unified;
    return attach(path, meta, &ollama, text_hidden, set, vision_config, audio_config, &unified, err);
}

int g4_mmproj_beside(const char *model_path, char *out, size_t cap) {
    char dir[4096];
    const char *slash = strrchr(model_path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - model_path), model_path);
    else snprintf(dir, sizeof dir, ".");
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    out[0] = 0;
    char first[4096] = "";
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "mmproj", 6) || len < 11 || strcmp(e->d_name + len - 5, ".gguf")) continue;
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p || !g4_gguf_is_file(p)) continue;
        if (n == 0) snprintf(first, sizeof first, "%s", p);
        else if (n == 1) snprintf(out, cap, "%s, %s", first, p);
        n++;
    }
    closedir(d);
    if (n == 1) snprintf(out, cap, "%s", first);
    return n == 1 ? 1 : n == 0 ? 0 : -1;
}
