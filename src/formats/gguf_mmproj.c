/* Gemma 4 mmproj files (gguf_mmproj.h). Followed: llama.cpp as node-llama-cpp 3.22.1 bundles it (llama.cpp.info.json:
 * tag v0.5.0 of its release bundle): conversion/gemma.py Gemma4VisionAudioModel (set_gguf_parameters :973-986,
 * tensor_force_quant :991-997, modify_tensors :999-1032), conversion/base.py MmprojModel.set_gguf_parameters
 * (:2640-2661) and prepare_tensors (:1047-1049: 1-D tensors and *_norm.weight F32), gguf-py/gguf/tensor_mapping.py
 * (the v.* / mm.* names), tools/mtmd/clip.cpp (:1637-1650 the gemma4v hyper-parameters it does not read from the
 * file: rope theta 100, pooling 3 or clip.vision.projector.scale_factor; :2602-2627 the tensors it binds) and
 * tools/mtmd/models/gemma4v.cpp (the graph: head size n_embd / n_head). */
#include "formats/gguf_mmproj.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
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
    if (v == -1) return g4_fail(err, "%s: the mmproj file has no %s", path, key);
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

/* gemma.py:1024-1028: input_proj [D, p*p*3] (inner order row, column, channel: docs/gemma4-towers.md 2.5) was
 * reshaped to [D, p, p, 3] and permuted to [D, 3, p, p] (channel, row, column) for ggml_conv_2d; its ne is
 * {p, p, 3, D}, our reader's row-major shape [D, 3, p, p]. Back: out[d][(y*p + x)*3 + c] = in[d][c][y][x]. */
static int unpermute_patch(g4_tensor *t, int D, int p, g4_tensor_set *set, const char *path, g4_error *err) {
    const int64_t want[4] = {D, 3, p, p};
    int same = t->ndim == 4;
    for (int i = 0; same && i < 4; i++) same = t->shape[i] == want[i];
    if (!same) {
        char s1[128], s2[128];
        return g4_fail(err, "%s: v.patch_embd.weight has shape %s, expected %s (embedding_length %d, patch_size %d)",
                       path, g4_shape_str(t->shape, t->ndim, s1, sizeof s1), g4_shape_str(want, 4, s2, sizeof s2), D,
                       p);
    }
    if (t->dtype != G4_F32 && t->dtype != G4_F16 && t->dtype != G4_BF16)
        return g4_fail(err, "%s: v.patch_embd.weight is %s; the converter writes F32 or F16", path,
                       t->dtype ? g4_dtype_name(t->dtype) : "of an unknown type");
    const size_t es = (size_t)g4_dtype_bits(t->dtype) / 8, pp = (size_t)p * (size_t)p;
    unsigned char *out = malloc((size_t)D * 3 * pp * es);
    if (!out) return g4_fail(err, "out of memory");
    const unsigned char *in = t->data;
    for (size_t d = 0; d < (size_t)D; d++)
        for (size_t c = 0; c < 3; c++)
            for (size_t yx = 0; yx < pp; yx++)
                memcpy(out + ((d * pp + yx) * 3 + c) * es, in + ((d * 3 + c) * pp + yx) * es, es);
    if (g4_tensor_set_own(set, out, err)) return -1;
    t->data = out;
    t->ndim = 2;
    t->shape[0] = D;
    t->shape[1] = (int64_t)3 * (int64_t)pp;
    return 0;
}

int g4_mmproj_attach(const char *path, int text_hidden, g4_tensor_set *set, json_t **vision_config, int *has_audio,
                     g4_error *err) {
    *vision_config = NULL;
    *has_audio = 0;
    g4_gguf g;
    if (g4_gguf_open(path, &g, err)) return -1;
    const json_t *meta = g.meta;
    json_t *vc = NULL;
    int rc = -1;
    const char *arch = meta_str(meta, "general.architecture");
    if (!arch || strcmp(arch, "clip")) {
        g4_fail(err, "%s: not an mmproj file (general.architecture is \"%s\", a projector's is \"clip\")%s", path,
                arch ? arch : "absent", arch && !strncmp(arch, "gemma", 5) ? ": pass the text model with -m and the "
                                                                             "projector with --mmproj" : "");
        goto done;
    }
    /* the vision projector type: clip.vision.projector_type (mixed vision + audio files, gemma.py:978), else
     * clip.projector_type */
    const char *pt = meta_str(meta, "clip.vision.projector_type");
    if (!pt) pt = meta_str(meta, "clip.projector_type");
    if (!pt) {
        g4_fail(err, "%s: the mmproj file has no clip.vision.projector_type", path);
        goto done;
    }
    if (strcmp(pt, "gemma4v")) {
        g4_fail(err, "%s: projector type \"%s\" is not Gemma 4's vision tower (\"gemma4v\")%s", path, pt,
                !strcmp(pt, "gemma4uv") ? ": the gemma4_unified projector is not read from GGUF yet" : "");
        goto done;
    }
    const char *at = meta_str(meta, "clip.audio.projector_type");
    *has_audio = (at && *at) || json_is_true(json_object_get(meta, "clip.has_audio_encoder"));
    /* MmprojModel.set_gguf_parameters (base.py:2643-2653) and gemma.py:979 */
    int D = 0, I = 0, L = 0, H = 1, P = 0, proj = 0, KV = 0, hd = 0, pool = 0;
    if (need_int(meta, "clip.vision.embedding_length", path, &D, err) ||
        need_int(meta, "clip.vision.feed_forward_length", path, &I, err) ||
        need_int(meta, "clip.vision.block_count", path, &L, err) ||
        need_int(meta, "clip.vision.attention.head_count", path, &H, err) ||
        need_int(meta, "clip.vision.patch_size", path, &P, err) ||
        need_int(meta, "clip.vision.projection_dim", path, &proj, err) ||
        /* optional keys clip.cpp reads: head_count_kv (else n_head), head_dim (written when q width != n_embd;
         * else n_embd / n_head), projector.scale_factor (gemma4v: the pooling kernel, default 3, clip.cpp:1640) */
        opt_int(meta, "clip.vision.attention.head_count_kv", path, H, &KV, err) ||
        opt_int(meta, "clip.vision.attention.head_dim", path, D / H, &hd, err) ||
        opt_int(meta, "clip.vision.projector.scale_factor", path, 3, &pool, err))
        goto done;
    const json_t *epsv = json_object_get(meta, "clip.vision.attention.layer_norm_epsilon");
    if (!json_is_number(epsv)) {
        g4_fail(err, "%s: the mmproj file has no clip.vision.attention.layer_norm_epsilon", path);
        goto done;
    }
    if (proj != text_hidden) {
        g4_fail(err, "%s: the projector maps to %d-wide embeddings, the text model's hidden size is %d: not this "
                     "model's projector", path, proj, text_hidden);
        goto done;
    }
    if (!meta_str(meta, "clip.vision.projector_type") && !json_is_true(json_object_get(meta, "clip.has_vision_encoder"))) {
        g4_fail(err, "%s: the mmproj file has no vision encoder (clip.has_vision_encoder)", path);
        goto done;
    }
    /* position_embedding_size is not in the metadata: the table's shape [2, size, D] (gemma4v.cpp reads ne[1]) */
    const g4_tensor *pos = g4_tensor_set_find(&g.set, "v.position_embd.weight");
    if (!pos) {
        g4_fail(err, "%s: the mmproj file has no v.position_embd.weight", path);
        goto done;
    }
    if (pos->ndim != 3 || pos->shape[0] != 2 || pos->shape[2] != D) {
        char s[128];
        g4_fail(err, "%s: v.position_embd.weight has shape %s, expected [2, n, %d]", path,
                g4_shape_str(pos->shape, pos->ndim, s, sizeof s), D);
        goto done;
    }
    /* use_clipped_linears and standardize are not in the metadata either: the tensors say (clip.cpp:2604-2626
     * binds std_bias/std_scale and each linear's clamps when present) */
    const int clipped = g4_tensor_set_find(&g.set, "v.blk.0.attn_q.input_max") != NULL;
    const int standardize = g4_tensor_set_find(&g.set, "v.std_bias") != NULL;
    vc = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:i, s:i, s:I, s:b, s:b, s:{s:s, s:f}}", "hidden_size", D,
                   "intermediate_size", I, "num_hidden_layers", L, "num_attention_heads", H, "num_key_value_heads", KV,
                   "head_dim", hd, "hidden_activation", "gelu_pytorch_tanh", "rms_norm_eps", json_number_value(epsv),
                   "patch_size", P, "pooling_kernel_size", pool, "position_embedding_size", (json_int_t)pos->shape[1],
                   "use_clipped_linears", clipped, "standardize", standardize, "rope_parameters", "rope_type",
                   "default", "rope_theta", 100.0 /* clip.cpp:1639, as transformers' class default */);
    if (!vc) {
        g4_fail(err, "out of memory");
        goto done;
    }
    /* move the file and the vision tensors into `set` under their HF names */
    if (g.set.n_files != 1) {
        g4_fail(err, "%s: unexpected file layout", path);
        goto done;
    }
    const int fi = g4_tensor_set_add_file(set, g.set.files[0], path, err);
    if (fi < 0) {
        g.set.files[0] = (g4_mapped_file){0};
        goto done;
    }
    g.set.files[0] = (g4_mapped_file){0}; /* the set unmaps it now */
    for (int i = 0; i < g.set.n_tensors; i++) {
        g4_tensor t = g.set.tensors[i];
        char hf[256];
        if (!strncmp(t.name, "a.", 2)) { /* the audio tower (gemma4a): not read yet */
            *has_audio = 1;
            continue;
        }
        if (hf_name(t.name, hf, sizeof hf)) continue; /* kept under its own name: reported as not used */
        if (!strcmp(t.name, "v.patch_embd.weight") && unpermute_patch(&t, D, P, set, path, err)) goto done;
        t.name = hf;
        if (g4_tensor_set_add(set, &t, fi, err)) goto done;
    }
    *vision_config = vc;
    vc = NULL;
    rc = 0;
done:
    json_decref(vc);
    g4_gguf_free(&g);
    return rc;
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
