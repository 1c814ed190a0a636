#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"

static int get_int(const json_t *o, const char *key, int64_t def, int *out, int min, const char *what,
                   g4_error *err) {
    int64_t v;
    if (g4_json_int(o, key, def, &v, what, err)) return -1;
    if (v < min || v > 1000000000) return g4_fail(err, "%s: \"%s\" = %lld is out of range", what, key, (long long)v);
    *out = (int)v;
    return 0;
}

/* pad_token_id / bos_token_id: `int | None` (configuration_gemma4.py:164,166); a value outside the vocabulary
 * (the Hub has configs with pad_token_id -1) only draws a warning in transformers (configuration_utils.py
 * validate_token_ids), so the model loads. Null and negative ids are kept as -1, "none"; where an id is used
 * (a soft-token placeholder reads the pad token's embedding) one outside the tables is an error there. */
static int token_id(const json_t *o, const char *key, int64_t def, int *out, const char *what, g4_error *err) {
    int64_t v;
    if (g4_json_int(o, key, def, &v, what, err)) return -1;
    if (json_is_null(json_object_get(o, key)) || v < 0) v = -1;
    if (v > INT32_MAX) return g4_fail(err, "%s: \"%s\" = %lld is out of range", what, key, (long long)v);
    *out = (int)v;
    return 0;
}

static int parse_rope(const json_t *rp, const char *type_name, g4_rope_config *out, const char *what,
                      g4_error *err) {
    const json_t *p = json_object_get(rp, type_name);
    if (!json_is_object(p)) return g4_fail(err, "%s: rope_parameters has no \"%s\" entry", what, type_name);
    const char *rt;
    if (g4_json_str(p, "rope_type", &rt, what, err)) return -1;
    if (!rt || !strcmp(rt, "default"))
        out->type = G4_ROPE_DEFAULT;
    else if (!strcmp(rt, "proportional"))
        out->type = G4_ROPE_PROPORTIONAL;
    else
        return g4_fail(err, "%s: rope_type \"%s\" of %s is not supported (default, proportional)", what, rt,
                       type_name);
    if (g4_json_num(p, "rope_theta", 10000.0, &out->theta, what, err) ||
        g4_json_num(p, "partial_rotary_factor", 1.0, &out->partial_rotary_factor, what, err) ||
        g4_json_num(p, "factor", 1.0, &out->factor, what, err))
        return -1;
    if (!(out->theta > 0) || !(out->factor > 0) || out->partial_rotary_factor < 0 ||
        out->partial_rotary_factor > 1)
        return g4_fail(err, "%s: invalid rope parameters for %s", what, type_name);
    return 0;
}

/* The fields each transformers config class types without `| None`: its @strict dataclass refuses an explicit
 * null for them (huggingface_hub's type validator), so a null there is an error here too, not the default. */
/* Gemma4TextConfig (reference/transformers-5.17/gemma4/configuration_gemma4.py:152-180) and
 * Gemma4UnifiedTextConfig (gemma4_unified/configuration_gemma4_unified.py:124-150) */
static const char *const text_required[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_activation", "max_position_embeddings", "initializer_range",
    "rms_norm_eps", "use_cache", "tie_word_embeddings", "attention_bias", "sliding_window", "attention_k_eq_v",
    "num_kv_shared_layers", "use_double_wide_mlp", NULL};
/* Gemma4TextConfig only (configuration_gemma4.py:175-179) */
static const char *const text_required_ple_moe[] = {"vocab_size_per_layer_input", "hidden_size_per_layer_input",
                                                    "enable_moe_block", NULL};
/* Gemma4VisionConfig (configuration_gemma4.py:273-290) */
static const char *const vision_required[] = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "hidden_activation", "rms_norm_eps", "max_position_embeddings", "pooling_kernel_size", "patch_size",
    "position_embedding_size", "use_clipped_linears", "standardize", "initializer_range", NULL};
/* Gemma4Config / Gemma4UnifiedConfig (configuration_gemma4.py:354, configuration_gemma4_unified.py:314) */
static const char *const wrapper_required[] = {"tie_word_embeddings", NULL};
/* Gemma4UnifiedVisionConfig (configuration_gemma4_unified.py:229-235), Gemma4UnifiedAudioConfig (46-48) */
static const char *const unified_vision_required[] = {"patch_size", "pooling_kernel_size", "mm_embed_dim",
                                                      "mm_posemb_size", "rms_norm_eps", "output_proj_dims",
                                                      "initializer_range", NULL};
static const char *const unified_audio_required[] = {"audio_embed_dim", "rms_norm_eps", "initializer_range", NULL};
/* Gemma4AssistantConfig (gemma4_assistant/configuration_gemma4_assistant.py:70-74) */
static const char *const assistant_required[] = {"backbone_hidden_size", "use_ordered_embeddings", "num_centroids",
                                                 "centroid_intermediate_top_k", "tie_word_embeddings", NULL};

/* A text config; `unified`: Gemma4UnifiedTextConfig (docs/gemma4-unified.md 1): no per-layer embeddings or
 * MoE (their keys are not read), sliding_window 1024, use_bidirectional_attention "vision" and
 * max_position_embeddings 262144 by default. */
static int parse_text(const json_t *tc, const char *what, int unified, g4_text_config *c, g4_error *err) {
    memset(c, 0, sizeof *c);
    int64_t tmp;
    if (g4_json_reject_nulls(tc, text_required, what, err) ||
        (!unified && g4_json_reject_nulls(tc, text_required_ple_moe, what, err)))
        return -1;
    if (get_int(tc, "vocab_size", 262144, &c->vocab_size, 1, what, err) ||
        get_int(tc, "hidden_size", 2304, &c->hidden_size, 1, what, err) ||
        get_int(tc, "intermediate_size", 9216, &c->intermediate_size, 1, what, err) ||
        get_int(tc, "num_hidden_layers", 30, &c->n_layers, 1, what, err) ||
        get_int(tc, "num_attention_heads", 8, &c->n_heads, 1, what, err) ||
        get_int(tc, "num_key_value_heads", 4, &c->n_kv_heads, 1, what, err) ||
        get_int(tc, "head_dim", 256, &c->head_dim, 2, what, err) ||
        get_int(tc, "sliding_window", unified ? 1024 : 512, &c->sliding_window, 1, what, err) ||
        (!unified &&
         (get_int(tc, "vocab_size_per_layer_input", 262144, &c->vocab_size_per_layer_input, 0, what, err) ||
          get_int(tc, "hidden_size_per_layer_input", 256, &c->hidden_size_per_layer_input, 0, what, err))) ||
        get_int(tc, "num_kv_shared_layers", 0, &c->num_kv_shared_layers, 0, what, err) ||
        get_int(tc, "max_position_embeddings", unified ? 262144 : 131072, &c->max_position_embeddings, 1, what,
                err) ||
        token_id(tc, "pad_token_id", 0, &c->pad_token_id, what, err) ||
        token_id(tc, "bos_token_id", 2, &c->bos_token_id, what, err))
        return -1;
    /* eos_token_id may be an int or a list; the text model only records the first */
    const json_t *eos = json_object_get(tc, "eos_token_id");
    c->eos_token_id = 1;
    if (json_is_integer(eos)) c->eos_token_id = (int)json_integer_value(eos);
    else if (json_is_array(eos) && json_array_size(eos) && json_is_integer(json_array_get(eos, 0)))
        c->eos_token_id = (int)json_integer_value(json_array_get(eos, 0));
    if (c->n_layers > G4_MAX_LAYERS)
        return g4_fail(err, "%s: %d layers (at most %d supported)", what, c->n_layers, G4_MAX_LAYERS);
    if (g4_json_num(tc, "rms_norm_eps", 1e-6, &c->rms_norm_eps, what, err) ||
        g4_json_bool(tc, "attention_k_eq_v", 0, &c->attention_k_eq_v, what, err) ||
        (!unified && g4_json_bool(tc, "enable_moe_block", 0, &c->enable_moe_block, what, err)) ||
        g4_json_bool(tc, "use_double_wide_mlp", 0, &c->use_double_wide_mlp, what, err) ||
        g4_json_bool(tc, "attention_bias", 0, &c->attention_bias, what, err) ||
        g4_json_bool(tc, "tie_word_embeddings", 1, &c->tie_word_embeddings, what, err))
        return -1;
    if (!(c->rms_norm_eps >= 0)) return g4_fail(err, "%s: rms_norm_eps must be >= 0", what);
    c->has_softcap = g4_json_present(tc, "final_logit_softcapping");
    if (g4_json_num(tc, "final_logit_softcapping", 0.0, &c->final_logit_softcapping, what, err)) return -1;
    /* transformers computes logits / c, tanh, * c (modeling_gemma4.py:1864-1867): an odd function of c, so a
     * negative cap is the positive one (it was refused); 0 divides by zero there (NaN logits): an error here */
    if (c->has_softcap && !(fabs(c->final_logit_softcapping) > 0 && fabs(c->final_logit_softcapping) < 3e38))
        return g4_fail(err, "%s: final_logit_softcapping must be a non-zero number a float holds", what);
    c->final_logit_softcapping = fabs(c->final_logit_softcapping);

    const char *act;
    if (g4_json_str(tc, "hidden_activation", &act, what, err)) return -1;
    if (act && strcmp(act, "gelu_pytorch_tanh"))
        return g4_fail(err, "%s: hidden_activation \"%s\" is not supported (gelu_pytorch_tanh)", what, act);
    const char *bidi;
    if (g4_json_str(tc, "use_bidirectional_attention", &bidi, what, err)) return -1;
    if (unified && !json_object_get(tc, "use_bidirectional_attention")) bidi = "vision";
    if (bidi && !strcmp(bidi, "vision"))
        c->bidirectional_vision = 1;
    else if (bidi && !strcmp(bidi, "all"))
        return g4_fail(err, "%s: use_bidirectional_attention \"all\" (a non-causal encoder) is not supported "
                            "for generation", what);
    else if (bidi)
        return g4_fail(err, "%s: use_bidirectional_attention \"%s\" is not known", what, bidi);

    if (c->enable_moe_block) {
        if (get_int(tc, "num_experts", 0, &c->num_experts, 1, what, err) ||
            get_int(tc, "top_k_experts", 0, &c->top_k_experts, 1, what, err) ||
            get_int(tc, "moe_intermediate_size", 0, &c->moe_intermediate_size, 1, what, err))
            return g4_fail_prefix(err, "enable_moe_block needs num_experts, top_k_experts and "
                                       "moe_intermediate_size");
        if (c->top_k_experts > c->num_experts)
            return g4_fail(err, "%s: top_k_experts %d > num_experts %d", what, c->top_k_experts, c->num_experts);
    }
    if (c->hidden_size_per_layer_input > 0 && c->vocab_size_per_layer_input <= 0)
        return g4_fail(err, "%s: per-layer embeddings need vocab_size_per_layer_input", what);

    /* 1.2 layer types; the last layer is always full attention */
    const int L = c->n_layers;
    const json_t *lt = json_object_get(tc, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != L)
            return g4_fail(err, "%s: layer_types must list %d layer types", what, L);
        for (int l = 0; l < L; l++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)l));
            if (s && !strcmp(s, "sliding_attention"))
                c->layer_type[l] = G4_LAYER_SLIDING;
            else if (s && !strcmp(s, "full_attention"))
                c->layer_type[l] = G4_LAYER_FULL;
            else
                return g4_fail(err, "%s: layer_types[%d] must be \"sliding_attention\" or \"full_attention\"",
                               what, l);
        }
    } else {
        for (int l = 0; l < L; l++) c->layer_type[l] = (l + 1) % 6 == 0 ? G4_LAYER_FULL : G4_LAYER_SLIDING;
    }
    c->layer_type[L - 1] = G4_LAYER_FULL;

    /* 1.3 per-layer head_dim / kv heads, in both spellings */
    for (int l = 0; l < L; l++) {
        c->layer_head_dim[l] = c->head_dim;
        c->layer_kv_heads[l] = c->n_kv_heads;
    }
    const json_t *plc = json_object_get(tc, "per_layer_config");
    if (plc && !json_is_null(plc)) {
        if (!json_is_object(plc)) return g4_fail(err, "%s: per_layer_config must be an object", what);
        const char *key;
        json_t *ov;
        json_object_foreach((json_t *)plc, key, ov) {
            char *end;
            long li = strtol(key, &end, 10);
            if (!*key || *end || li < 0 || li >= L)
                return g4_fail(err, "%s: per_layer_config key \"%s\" is not a layer index", what, key);
            if (!json_is_object(ov)) return g4_fail(err, "%s: per_layer_config[\"%s\"] must be an object", what, key);
            char w2[160];
            snprintf(w2, sizeof w2, "%s per_layer_config[\"%s\"]", what, key);
            static const char *const overrides[] = {"head_dim", "num_key_value_heads", NULL};
            if (g4_json_reject_nulls(ov, overrides, w2, err) || /* a None override: the layer's head_dim is None */
                get_int(ov, "head_dim", c->head_dim, &c->layer_head_dim[li], 2, w2, err) ||
                get_int(ov, "num_key_value_heads", c->n_kv_heads, &c->layer_kv_heads[li], 1, w2, err))
                return -1;
        }
    } else {
        const json_t *ghd = json_object_get(tc, "global_head_dim");
        if (ghd && json_is_null(ghd)) return g4_fail(err, "%s: global_head_dim must not be null", what);
        if (g4_json_int(tc, "global_head_dim", 512, &tmp, what, err)) return -1;
        if (tmp < 2 || tmp > 65536) return g4_fail(err, "%s: global_head_dim %lld is out of range", what, (long long)tmp);
        int ghd_v = (int)tmp;
        int gkv = 0;
        if (c->attention_k_eq_v && g4_json_present(tc, "num_global_key_value_heads") &&
            get_int(tc, "num_global_key_value_heads", 0, &gkv, 1, what, err))
            return -1;
        for (int l = 0; l < L; l++)
            if (c->layer_type[l] == G4_LAYER_FULL) {
                c->layer_head_dim[l] = ghd_v;
                if (gkv) c->layer_kv_heads[l] = gkv;
            }
    }
    for (int t = 0; t < G4_LAYER_TYPES; t++) c->type_head_dim[t] = 0;
    for (int l = 0; l < L; l++) {
        int hd = c->layer_head_dim[l], kv = c->layer_kv_heads[l];
        if (hd % 2) return g4_fail(err, "%s: layer %d head_dim %d is odd", what, l, hd);
        if (c->n_heads % kv)
            return g4_fail(err, "%s: layer %d: %d attention heads are not a multiple of %d kv heads", what, l,
                           c->n_heads, kv);
        int t = c->layer_type[l];
        if (!c->type_head_dim[t]) c->type_head_dim[t] = hd;
        else if (c->type_head_dim[t] != hd)
            return g4_fail(err, "%s: layers of one type must share head_dim (layer %d has %d, another %d)", what, l,
                           hd, c->type_head_dim[t]);
    }

    /* 1.4 RoPE per layer type */
    const json_t *rp = json_object_get(tc, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return g4_fail(err, "%s: rope_parameters must be an object", what);
        for (int t = 0; t < G4_LAYER_TYPES; t++)
            if (c->type_head_dim[t] &&
                parse_rope(rp, t == G4_LAYER_FULL ? "full_attention" : "sliding_attention", &c->rope[t], what, err))
                return -1;
    } else {
        c->rope[G4_LAYER_SLIDING] = (g4_rope_config){G4_ROPE_DEFAULT, 10000.0, 1.0, 1.0};
        c->rope[G4_LAYER_FULL] = (g4_rope_config){G4_ROPE_PROPORTIONAL, 1000000.0, 0.25, 1.0};
    }

    /* KV sharing (3.5) and MLP width (2) */
    int first = L - c->num_kv_shared_layers;
    if (first < 0) return g4_fail(err, "%s: num_kv_shared_layers %d > num_hidden_layers %d", what,
                                  c->num_kv_shared_layers, L);
    for (int l = 0; l < L; l++) {
        int shared = c->num_kv_shared_layers > 0 && l >= first;
        c->layer_kv_shared[l] = shared;
        c->layer_kv_source[l] = l;
        if (shared) {
            int src = -1;
            for (int j = first - 1; j >= 0; j--)
                if (c->layer_type[j] == c->layer_type[l]) {
                    src = j;
                    break;
                }
            if (src < 0)
                return g4_fail(err, "%s: KV-shared layer %d has no earlier non-shared %s layer to read from", what, l,
                               c->layer_type[l] == G4_LAYER_FULL ? "full-attention" : "sliding");
            c->layer_kv_source[l] = src;
        }
        c->layer_k_eq_v[l] = c->attention_k_eq_v && c->layer_type[l] == G4_LAYER_FULL;
        c->layer_intermediate[l] =
            (c->use_double_wide_mlp && first > 0 && l >= first) ? 2 * c->intermediate_size : c->intermediate_size;
    }
    /* the engine forms these row sizes in int: they must fit (each factor alone is checked above) */
    int64_t big = (int64_t)c->n_layers * c->hidden_size_per_layer_input;
    for (int l = 0; l < L; l++) {
        int64_t q = (int64_t)c->n_heads * c->layer_head_dim[l], kv = (int64_t)c->layer_kv_heads[l] * c->layer_head_dim[l];
        if (q > big) big = q;
        if (kv > big) big = kv;
        if (c->layer_intermediate[l] > big) big = c->layer_intermediate[l];
    }
    if (c->enable_moe_block && 2 * (int64_t)c->moe_intermediate_size > big) big = 2 * (int64_t)c->moe_intermediate_size;
    if (big > INT32_MAX)
        return g4_fail(err, "%s: the dimensions are too large (a row of %lld values; at most %d)", what, (long long)big,
                       INT32_MAX);
    /* shared layers read their source's cache: geometry must agree */
    for (int l = 0; l < L; l++) {
        int s = c->layer_kv_source[l];
        if (c->layer_head_dim[s] != c->layer_head_dim[l] || c->layer_kv_heads[s] != c->layer_kv_heads[l])
            return g4_fail(err, "%s: KV-shared layer %d and its source %d differ in head_dim or kv heads", what, l, s);
    }
    return 0;
}

static int parse_vision(const json_t *vc, const char *what, g4_vision_config *v, g4_error *err) {
    memset(v, 0, sizeof *v);
    char w[600];
    snprintf(w, sizeof w, "%s vision_config", what);
    if (!json_is_object(vc)) return g4_fail(err, "%s must be an object", w);
    if (g4_json_reject_nulls(vc, vision_required, w, err)) return -1;
    if (get_int(vc, "hidden_size", 768, &v->hidden_size, 1, w, err) ||
        get_int(vc, "intermediate_size", 3072, &v->intermediate_size, 1, w, err) ||
        get_int(vc, "num_hidden_layers", 16, &v->n_layers, 1, w, err) ||
        get_int(vc, "num_attention_heads", 12, &v->n_heads, 1, w, err) ||
        get_int(vc, "num_key_value_heads", 12, &v->n_kv_heads, 1, w, err) ||
        get_int(vc, "head_dim", 64, &v->head_dim, 4, w, err) ||
        get_int(vc, "patch_size", 16, &v->patch_size, 1, w, err) ||
        get_int(vc, "pooling_kernel_size", 3, &v->pooling_kernel, 1, w, err) ||
        get_int(vc, "position_embedding_size", 10240, &v->position_embedding_size, 1, w, err) ||
        g4_json_num(vc, "rms_norm_eps", 1e-6, &v->rms_norm_eps, w, err) ||
        g4_json_bool(vc, "use_clipped_linears", 0, &v->use_clipped_linears, w, err) ||
        g4_json_bool(vc, "standardize", 0, &v->standardize, w, err))
        return -1;
    v->rope_theta = 100.0;
    const json_t *rp = json_object_get(vc, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        const char *rt;
        if (!json_is_object(rp)) return g4_fail(err, "%s: rope_parameters must be an object", w);
        if (g4_json_str(rp, "rope_type", &rt, w, err) || g4_json_num(rp, "rope_theta", 100.0, &v->rope_theta, w, err))
            return -1;
        /* 2-D RoPE over (x, y); "axial" is the class default, released configs say "default" */
        if (rt && strcmp(rt, "default") && strcmp(rt, "axial"))
            return g4_fail(err, "%s: rope_type \"%s\" is not supported (default, axial)", w, rt);
        if (!(v->rope_theta > 0)) return g4_fail(err, "%s: rope_theta must be positive", w);
    }
    const char *act;
    if (g4_json_str(vc, "hidden_activation", &act, w, err)) return -1;
    if (act && strcmp(act, "gelu_pytorch_tanh"))
        return g4_fail(err, "%s: hidden_activation \"%s\" is not supported (gelu_pytorch_tanh)", w, act);
    if (v->head_dim % 4) return g4_fail(err, "%s: head_dim %d is not a multiple of 4 (2-D RoPE)", w, v->head_dim);
    if (v->n_heads % v->n_kv_heads)
        return g4_fail(err, "%s: %d heads are not a multiple of %d kv heads", w, v->n_heads, v->n_kv_heads);
    if (v->n_layers > G4_MAX_LAYERS) return g4_fail(err, "%s: %d layers (at most %d)", w, v->n_layers, G4_MAX_LAYERS);
    if (v->patch_size > 64 || v->pooling_kernel > 8)
        return g4_fail(err, "%s: patch_size %d / pooling_kernel_size %d out of range", w, v->patch_size, v->pooling_kernel);
    if (!(v->rms_norm_eps >= 0)) return g4_fail(err, "%s: rms_norm_eps must be >= 0", w);
    return 0;
}

/* The wrapper's token ids are `int | None` too (configuration_gemma4.py:346-352): null or negative is none (-1),
 * a placeholder no token matches, as transformers' `input_ids == None` matches none; not a refused model. */
static int opt_token(const json_t *root, const char *key, int def, int *out, const char *what, g4_error *err) {
    return token_id(root, key, def, out, what, err);
}

/* The multimodal wrapper's own fields (Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration):
 * placeholder token ids and the tie flag. */
static int parse_wrapper(const json_t *root, const char *what, g4_model_config *cfg, g4_error *err) {
    int eoa = 258883;
    if (g4_json_reject_nulls(root, wrapper_required, what, err)) return -1;
    if (opt_token(root, "image_token_id", 258880, &cfg->image_token_id, what, err) ||
        opt_token(root, "audio_token_id", 258881, &cfg->audio_token_id, what, err) ||
        opt_token(root, "video_token_id", 258884, &cfg->video_token_id, what, err) ||
        opt_token(root, "boi_token_id", 255999, &cfg->boi_token_id, what, err) ||
        opt_token(root, "eoi_token_id", 258882, &cfg->eoi_token_id, what, err) ||
        opt_token(root, "boa_token_id", 256000, &cfg->boa_token_id, what, err) ||
        opt_token(root, "eoa_token_index", 258883, &eoa, what, err) ||
        opt_token(root, "eoa_token_id", eoa, &cfg->eoa_token_id, what, err))
        return -1;
    /* the wrapper's tie flag wins over the text config's (both default to true) */
    int tie;
    if (g4_json_bool(root, "tie_word_embeddings", cfg->text.tie_word_embeddings, &tie, what, err)) return -1;
    cfg->text.tie_word_embeddings = tie;
    return 0;
}

/* gemma4_unified (docs/gemma4-unified.md 1): the decoder without PLE and MoE, and the two embedders' sizes.
 * Transformers' class defaults where a key is absent. */
static int parse_unified(const json_t *root, const char *what, g4_model_config *cfg, g4_error *err) {
    snprintf(cfg->model_type, sizeof cfg->model_type, "gemma4_unified");
    snprintf(cfg->weight_prefix, sizeof cfg->weight_prefix, "model.language_model.");
    cfg->multimodal_wrapper = 1;
    cfg->unified = 1;
    const json_t *tc = json_object_get(root, "text_config"), *vc = json_object_get(root, "vision_config"),
                 *ac = json_object_get(root, "audio_config");
    json_t *empty = json_object();
    if (!empty) return g4_fail(err, "out of memory");
    int rc = -1;
    char w[600];
    if ((tc && !json_is_null(tc) && !json_is_object(tc)) || (vc && !json_is_null(vc) && !json_is_object(vc)) ||
        (ac && !json_is_null(ac) && !json_is_object(ac))) {
        g4_fail(err, "%s: text_config, vision_config and audio_config must be objects", what);
        goto done;
    }
    if (!json_is_object(tc)) tc = empty;
    if (!json_is_object(vc)) vc = empty;
    if (!json_is_object(ac)) ac = empty;
    if (parse_text(tc, what, 1, &cfg->text, err)) goto done;
    g4_unified_config *u = &cfg->uni;
    int patch = 0, kernel = 0;
    snprintf(w, sizeof w, "%s vision_config", what);
    if (g4_json_reject_nulls(vc, unified_vision_required, w, err)) goto done;
    if (get_int(vc, "patch_size", 16, &patch, 1, w, err) || get_int(vc, "pooling_kernel_size", 3, &kernel, 1, w, err) ||
        get_int(vc, "mm_embed_dim", 3840, &u->mm_embed_dim, 1, w, err) ||
        get_int(vc, "mm_posemb_size", 1120, &u->mm_posemb_size, 1, w, err) ||
        get_int(vc, "output_proj_dims", 3840, &u->output_proj_dims, 1, w, err) ||
        g4_json_num(vc, "rms_norm_eps", 1e-6, &u->vision_eps, w, err))
        goto done;
    /* model_patch_size = patch_size * pooling_kernel_size, which transformers only accepts as 48 */
    if (patch * kernel != 48) {
        g4_fail(err, "%s: patch_size %d x pooling_kernel_size %d must be 48 (the 48-pixel blocks)", w, patch, kernel);
        goto done;
    }
    u->block = 48;
    if (u->mm_embed_dim != u->output_proj_dims) {
        g4_fail(err, "%s: mm_embed_dim %d must equal output_proj_dims %d", w, u->mm_embed_dim, u->output_proj_dims);
        goto done;
    }
    /* audio_embed_dim: samples per token; hidden_size, output_proj_dims and audio_samples_per_token alias it */
    snprintf(w, sizeof w, "%s audio_config", what);
    if (g4_json_reject_nulls(ac, unified_audio_required, w, err)) goto done;
    if (get_int(ac, "audio_embed_dim", 640, &u->audio_samples, 1, w, err) ||
        g4_json_num(ac, "rms_norm_eps", 1e-6, &u->audio_eps, w, err))
        goto done;
    if (!(u->vision_eps >= 0) || !(u->audio_eps >= 0)) {
        g4_fail(err, "%s: rms_norm_eps must be >= 0", what);
        goto done;
    }
    rc = parse_wrapper(root, what, cfg, err);
done:
    json_decref(empty);
    return rc;
}

/* gemma4_assistant (docs/gemma4-assistant.md 1.1): the drafter's decoder is a gemma4_text config whose layers all
 * read the main model's K/V; validate_architecture's rules are checked here. */
static int parse_assistant(const json_t *root, const char *what, g4_model_config *cfg, g4_error *err) {
    snprintf(cfg->model_type, sizeof cfg->model_type, "gemma4_assistant");
    snprintf(cfg->weight_prefix, sizeof cfg->weight_prefix, "model.");
    cfg->assistant = 1;
    const json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) return g4_fail(err, "%s: a gemma4_assistant config needs a text_config object", what);
    const char *tmt;
    if (g4_json_str(tc, "model_type", &tmt, what, err)) return -1;
    if (tmt && strcmp(tmt, "gemma4_text"))
        return g4_fail(err, "%s: the assistant's text_config has model_type \"%s\" (expected gemma4_text)", what, tmt);
    int64_t L, shared;
    if (g4_json_reject_nulls(tc, text_required, what, err)) return -1; /* before num_kv_shared_layers is replaced */
    if (g4_json_int(tc, "num_hidden_layers", 30, &L, what, err) ||
        g4_json_int(tc, "num_kv_shared_layers", 0, &shared, what, err))
        return -1;
    if (shared != 0 && shared != L)
        return g4_fail(err, "%s: every layer of an assistant reads the main model's K/V: num_kv_shared_layers must "
                            "be %lld (or 0), not %lld", what, (long long)L, (long long)shared);
    /* parsed as a decoder without sharing, then every layer is marked as reading K/V from elsewhere */
    json_t *copy = json_deep_copy(tc);
    if (!copy || json_object_set_new(copy, "num_kv_shared_layers", json_integer(0))) {
        json_decref(copy);
        return g4_fail(err, "out of memory");
    }
    int rc = parse_text(copy, what, 0, &cfg->text, err);
    json_decref(copy);
    if (rc) return -1;
    g4_text_config *c = &cfg->text;
    if (c->hidden_size_per_layer_input || c->vocab_size_per_layer_input || c->enable_moe_block ||
        c->use_double_wide_mlp || c->bidirectional_vision)
        return g4_fail(err, "%s: an assistant's text_config must have hidden_size_per_layer_input 0, "
                            "vocab_size_per_layer_input 0, no MoE block, no double-wide MLP and no bidirectional "
                            "attention", what);
    c->num_kv_shared_layers = c->n_layers;
    for (int l = 0; l < c->n_layers; l++) c->layer_kv_shared[l] = 1;
    g4_assistant_config *a = &cfg->asst;
    int tie;
    if (g4_json_reject_nulls(root, assistant_required, what, err)) return -1;
    if (get_int(root, "backbone_hidden_size", 1536, &a->backbone_hidden_size, 1, what, err) ||
        g4_json_bool(root, "use_ordered_embeddings", 0, &a->use_ordered_embeddings, what, err) ||
        get_int(root, "num_centroids", 2048, &a->num_centroids, 1, what, err) ||
        get_int(root, "centroid_intermediate_top_k", 32, &a->centroid_top_k, 1, what, err) ||
        g4_json_bool(root, "tie_word_embeddings", c->tie_word_embeddings, &tie, what, err))
        return -1;
    c->tie_word_embeddings = tie;
    if (a->use_ordered_embeddings &&
        (c->vocab_size % a->num_centroids || a->centroid_top_k > a->num_centroids))
        return g4_fail(err, "%s: the masked embedder needs num_centroids (%d) to divide vocab_size (%d) and "
                            "centroid_intermediate_top_k (%d) <= num_centroids", what, a->num_centroids,
                       c->vocab_size, a->centroid_top_k);
    return 0;
}

int g4_config_parse(const json_t *root, const char *what, g4_model_config *cfg, g4_error *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!json_is_object(root)) return g4_fail(err, "%s: not a JSON object", what);
    const char *mt;
    if (g4_json_str(root, "model_type", &mt, what, err)) return -1;
    if (!mt) return g4_fail(err, "%s: no \"model_type\"", what);
    if (!strcmp(mt, "gemma4")) {
        snprintf(cfg->model_type, sizeof cfg->model_type, "gemma4");
        snprintf(cfg->weight_prefix, sizeof cfg->weight_prefix, "model.language_model.");
        cfg->multimodal_wrapper = 1;
        const json_t *tc = json_object_get(root, "text_config");
        json_t *empty = NULL;
        if (!tc || json_is_null(tc)) tc = empty = json_object();
        else if (!json_is_object(tc)) return g4_fail(err, "%s: text_config must be an object", what);
        int rc = parse_text(tc, what, 0, &cfg->text, err);
        json_decref(empty);
        if (rc) return -1;
        cfg->has_vision = g4_json_present(root, "vision_config");
        if (cfg->has_vision && parse_vision(json_object_get(root, "vision_config"), what, &cfg->vision, err)) return -1;
        cfg->has_audio = g4_json_present(root, "audio_config");
        return parse_wrapper(root, what, cfg, err);
    }
    if (!strcmp(mt, "gemma4_text")) {
        snprintf(cfg->model_type, sizeof cfg->model_type, "gemma4_text");
        snprintf(cfg->weight_prefix, sizeof cfg->weight_prefix, "model.");
        return parse_text(root, what, 0, &cfg->text, err);
    }
    if (!strcmp(mt, "gemma4_assistant")) return parse_assistant(root, what, cfg, err);
    if (!strcmp(mt, "gemma4_unified")) return parse_unified(root, what, cfg, err);
    return g4_fail(err, "%s: unknown model_type \"%s\" (gemma4c runs \"gemma4\", \"gemma4_text\" and \"gemma4_unified\")",
                   what, mt);
}

int g4_config_load(const char *dir, g4_model_config *cfg, g4_error *err) {
    char path[4096];
    if (g4_path_join(path, sizeof path, dir, "config.json", err)) return -1;
    struct stat st;
    if (!g4_file_exists(path) && stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return g4_fail(err, "%s: not a model folder, nor a GGUF file (its first bytes are not \"GGUF\")", dir);
    if (!g4_file_exists(path)) return g4_fail(err, "%s: no config.json (is this a model folder?)", dir);
    json_t *root;
    if (g4_json_load_file(path, &root, err)) return -1;
    int rc = g4_config_parse(root, path, cfg, err);
    json_decref(root);
    return rc;
}
