/* Gemma 4 names and hyper-parameters in GGUF (docs/formats.md 3.3, llama.cpp
 * conversion/gemma.py and src/models/gemma4.cpp). One table maps names both ways. */
#include "formats/gguf_gemma4.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const struct {
    const char *gguf, *hf;
} global_names[] = {
    {"token_embd.weight", "embed_tokens.weight"},
    {"output_norm.weight", "norm.weight"},
    {"per_layer_token_embd.weight", "embed_tokens_per_layer.weight"},
    {"per_layer_model_proj.weight", "per_layer_model_projection.weight"},
    {"per_layer_proj_norm.weight", "per_layer_projection_norm.weight"},
    /* the drafter (gemma4-assistant: conversion/gemma.py Gemma4AssistantModel, constants.py NEXTN_PROJ_*) */
    {"nextn.pre_projection.weight", "pre_projection.weight"},
    {"nextn.post_projection.weight", "post_projection.weight"},
}, layer_names[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    {"ffn_gate_inp.weight", "router.proj.weight"},
    {"ffn_gate_inp.scale", "router.scale"},
    {"ffn_gate_up_exps.weight", "experts.gate_up_proj"},
    {"ffn_gate_exps.weight", "experts.gate_proj"},
    {"ffn_up_exps.weight", "experts.up_proj"},
    {"ffn_down_exps.weight", "experts.down_proj"},
    {"ffn_down_exps.scale", "router.per_expert_scale"},
    {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"},
    {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"},
    {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"},
    {"inp_gate.weight", "per_layer_input_gate.weight"},
    {"proj.weight", "per_layer_projection.weight"},
    {"post_norm.weight", "post_per_layer_input_norm.weight"},
    {"layer_output_scale.weight", "layer_scalar"},
};

#define N_OF(a) (sizeof a / sizeof a[0])

static int map_name(const char *in, char *out, size_t cap, int to_hf) {
    if (!strcmp(in, to_hf ? "output.weight" : "lm_head.weight"))
        return snprintf(out, cap, "%s", to_hf ? "lm_head.weight" : "output.weight") < (int)cap ? 0 : -1;
    for (size_t i = 0; i < N_OF(global_names); i++)
        if (!strcmp(in, to_hf ? global_names[i].gguf : global_names[i].hf))
            return snprintf(out, cap, "%s", to_hf ? global_names[i].hf : global_names[i].gguf) < (int)cap ? 0 : -1;
    int l, n = 0;
    if (sscanf(in, to_hf ? "blk.%d.%n" : "layers.%d.%n", &l, &n) != 1 || !n || l < 0) return -1;
    const char *rest = in + n;
    for (size_t i = 0; i < N_OF(layer_names); i++)
        if (!strcmp(rest, to_hf ? layer_names[i].gguf : layer_names[i].hf))
            return snprintf(out, cap, to_hf ? "layers.%d.%s" : "blk.%d.%s", l,
                            to_hf ? layer_names[i].hf : layer_names[i].gguf) < (int)cap ? 0 : -1;
    return -1;
}

int g4_gemma4_hf_name(const char *gguf_name, char *out, size_t cap) { return map_name(gguf_name, out, cap, 1); }
int g4_gemma4_gguf_name(const char *hf_name, char *out, size_t cap) { return map_name(hf_name, out, cap, 0); }

/* ------------------------------------------------------- metadata -> config */
/* the architecture's key prefix: "gemma4", or "gemma4-assistant" for a drafter (llama.cpp's LLM_ARCH names) */
static const char *arch_of(const g4_gguf *g) {
    const char *a = json_string_value(json_object_get(g->meta, "general.architecture"));
    return a ? a : "gemma4";
}

static json_t *key(const g4_gguf *g, const char *k) {
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch_of(g), k);
    return json_object_get(g->meta, full);
}

static int num_key(const g4_gguf *g, const char *k, int required, double *out, g4_error *err) {
    const json_t *v = key(g, k);
    if (!v) {
        if (required) return g4_fail(err, "GGUF: no %s.%s", arch_of(g), k);
        return 1;
    }
    if (!json_is_number(v)) return g4_fail(err, "GGUF: %s.%s must be a number", arch_of(g), k);
    *out = json_number_value(v);
    return 0;
}

/* A per-layer integer: scalar or array of L. */
static int layer_int(const g4_gguf *g, const char *k, int l, int L, int *out, g4_error *err) {
    const json_t *v = key(g, k);
    if (!v) return g4_fail(err, "GGUF: no %s.%s", arch_of(g), k);
    if (json_is_array(v)) {
        if ((int)json_array_size(v) != L) return g4_fail(err, "GGUF: %s.%s must have %d entries", arch_of(g), k, L);
        v = json_array_get(v, (size_t)l);
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
        return g4_fail(err, "GGUF: %s.%s is not a valid integer", arch_of(g), k);
    *out = (int)json_integer_value(v);
    return 0;
}

static const g4_tensor *find(const g4_gguf *g, const char *name) { return g4_tensor_set_find(&g->set, name); }

static json_t *build_config(const g4_gguf *g, g4_error *err) {
    const json_t *arch = json_object_get(g->meta, "general.architecture");
    if (!json_is_string(arch)) {
        g4_fail(err, "GGUF: no general.architecture");
        return NULL;
    }
    const int assistant = !strcmp(json_string_value(arch), "gemma4-assistant");
    if (strcmp(json_string_value(arch), "gemma4") && !assistant) {
        g4_fail(err, "GGUF: architecture '%s' is not gemma4 (nor gemma4-assistant, a drafter)", json_string_value(arch));
        return NULL;
    }
    double L_ = 0, H = 0, NH = 0, kswa = 0, kfull = 0, eps = 0, win = 0, nshared = 0, ctx = 131072, ple = 0, fb = 1e6, fbs = 1e4, cap = 0;
    if (num_key(g, "block_count", 1, &L_, err) < 0 || num_key(g, "embedding_length", 1, &H, err) < 0 ||
        num_key(g, "attention.head_count", 1, &NH, err) < 0 ||
        num_key(g, "attention.key_length_swa", 1, &kswa, err) < 0 ||
        num_key(g, "attention.key_length", 1, &kfull, err) < 0 ||
        num_key(g, "attention.layer_norm_rms_epsilon", 1, &eps, err) < 0 ||
        num_key(g, "attention.sliding_window", 1, &win, err) < 0 ||
        num_key(g, "attention.shared_kv_layers", 0, &nshared, err) < 0 ||
        num_key(g, "context_length", 0, &ctx, err) < 0 ||
        num_key(g, "embedding_length_per_layer_input", 0, &ple, err) < 0 ||
        num_key(g, "rope.freq_base", 0, &fb, err) < 0 || num_key(g, "rope.freq_base_swa", 0, &fbs, err) < 0)
        return NULL;
    /* the sizes are cast to integers below: a value no int holds (1e30, -1, 2.5) is refused first (the casts of such
     * values are undefined behaviour; they gave "hidden_size = -9223372036854775808 is out of range") */
    const struct {
        const char *k;
        double v;
    } sizes[] = {{"block_count", L_}, {"embedding_length", H}, {"attention.head_count", NH},
                 {"attention.key_length_swa", kswa}, {"attention.key_length", kfull}, {"attention.sliding_window", win},
                 {"attention.shared_kv_layers", nshared}, {"context_length", ctx},
                 {"embedding_length_per_layer_input", ple}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!(sizes[i].v >= 0 && sizes[i].v <= 2147483647.0 && sizes[i].v == floor(sizes[i].v))) {
            g4_fail(err, "GGUF: %s.%s = %g is not a valid size", arch_of(g), sizes[i].k, sizes[i].v);
            return NULL;
        }
    const int cap_rc = num_key(g, "final_logit_softcapping", 0, &cap, err); /* absent: no soft-cap */
    if (cap_rc < 0) return NULL;
    const int has_cap = cap_rc == 0;
    const int L = (int)L_;
    if (L < 1 || L > G4_MAX_LAYERS) {
        g4_fail(err, "GGUF: %s.block_count %d is out of range", arch_of(g), L);
        return NULL;
    }
    const g4_tensor *emb = find(g, "token_embd.weight");
    if (!emb || emb->ndim != 2) {
        g4_fail(err, "GGUF: no token_embd.weight");
        return NULL;
    }
    json_t *c = json_object(), *lt = json_array(), *plc = json_object();
    if (!c || !lt || !plc) goto oom;
    json_object_set_new(c, "model_type", json_string("gemma4_text"));
    json_object_set_new(c, "vocab_size", json_integer(emb->shape[0]));
    json_object_set_new(c, "hidden_size", json_integer((json_int_t)H));
    json_object_set_new(c, "num_hidden_layers", json_integer(L));
    json_object_set_new(c, "num_attention_heads", json_integer((json_int_t)NH));
    json_object_set_new(c, "head_dim", json_integer((json_int_t)kswa));
    json_object_set_new(c, "rms_norm_eps", json_real(eps));
    json_object_set_new(c, "sliding_window", json_integer((json_int_t)win));
    json_object_set_new(c, "num_kv_shared_layers", json_integer((json_int_t)nshared));
    json_object_set_new(c, "max_position_embeddings", json_integer((json_int_t)ctx));
    json_object_set_new(c, "hidden_size_per_layer_input", json_integer((json_int_t)ple));
    const g4_tensor *pemb = find(g, "per_layer_token_embd.weight");
    json_object_set_new(c, "vocab_size_per_layer_input", json_integer(pemb ? pemb->shape[0] : 0));
    if (has_cap) json_object_set_new(c, "final_logit_softcapping", json_real(cap));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(!find(g, "output.weight")));
    /* layer types, per-layer head size and KV heads, MLP widths */
    const json_t *swa = key(g, "attention.sliding_window_pattern");
    if (!json_is_array(swa) || (int)json_array_size(swa) != L) {
        g4_fail(err, "GGUF: %s.attention.sliding_window_pattern must list %d layers", arch_of(g), L);
        goto fail;
    }
    int ff_min = 0, ff_max = 0, k_eq_v = 0, kv0 = 0;
    for (int l = 0; l < L; l++) {
        int sliding = json_is_true(json_array_get(swa, (size_t)l)), kv, ff;
        if (layer_int(g, "attention.head_count_kv", l, L, &kv, err) ||
            layer_int(g, "feed_forward_length", l, L, &ff, err))
            goto fail;
        json_array_append_new(lt, json_string(sliding ? "sliding_attention" : "full_attention"));
        json_t *o = json_object();
        json_object_set_new(o, "head_dim", json_integer((json_int_t)(sliding ? kswa : kfull)));
        json_object_set_new(o, "num_key_value_heads", json_integer(kv));
        char li[16];
        snprintf(li, sizeof li, "%d", l);
        json_object_set_new(plc, li, o);
        if (!l) kv0 = kv;
        ff_min = l == 0 || ff < ff_min ? ff : ff_min;
        ff_max = ff > ff_max ? ff : ff_max;
        char n1[64], n2[64];
        snprintf(n1, sizeof n1, "blk.%d.attn_k.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.attn_v.weight", l);
        if (!sliding && find(g, n1) && !find(g, n2)) k_eq_v = 1;
    }
    json_object_set_new(c, "num_key_value_heads", json_integer(kv0));
    json_object_set_new(c, "layer_types", lt);
    lt = NULL;
    json_object_set_new(c, "per_layer_config", plc);
    plc = NULL;
    json_object_set_new(c, "intermediate_size", json_integer(ff_min));
    json_object_set_new(c, "use_double_wide_mlp", json_boolean(ff_max == 2 * ff_min && ff_max != ff_min));
    json_object_set_new(c, "attention_k_eq_v", json_boolean(k_eq_v));
    double ne = 0, nu = 0, fe = 0;
    if (num_key(g, "expert_count", 0, &ne, err) < 0 || num_key(g, "expert_used_count", 0, &nu, err) < 0 ||
        num_key(g, "expert_feed_forward_length", 0, &fe, err) < 0)
        goto fail;
    if (!(ne >= 0 && ne <= 1e9 && ne == floor(ne)) || !(nu >= 0 && nu <= 1e9 && nu == floor(nu)) ||
        !(fe >= 0 && fe <= 1e9 && fe == floor(fe))) {
        g4_fail(err, "GGUF: %s.expert_count / expert_used_count / expert_feed_forward_length (%g / %g / %g) are "
                     "not valid sizes", arch_of(g), ne, nu, fe);
        goto fail;
    }
    json_object_set_new(c, "enable_moe_block", json_boolean(ne > 0));
    if (ne > 0) {
        json_object_set_new(c, "num_experts", json_integer((json_int_t)ne));
        json_object_set_new(c, "top_k_experts", json_integer((json_int_t)nu));
        json_object_set_new(c, "moe_intermediate_size", json_integer((json_int_t)fe));
    }
    /* RoPE: rope_freqs (llama.cpp divides each pair's frequency by its value: the proportional RoPE's factor,
     * 1 unless the config set one, for the rotated pairs; 1e30 for the rest) gives the rotary fraction and the
     * factor of full layers */
    json_t *rp = json_object(), *full = json_object(), *slid = json_object();
    json_object_set_new(slid, "rope_type", json_string("default"));
    json_object_set_new(slid, "rope_theta", json_real(fbs));
    json_object_set_new(full, "rope_theta", json_real(fb));
    const g4_tensor *rf = find(g, "rope_freqs.weight");
    if (rf && rf->dtype == G4_F32 && g4_tensor_numel(rf) == (int64_t)kfull / 2) {
        int ones = 0;
        float factor = 1.0f;
        for (int64_t i = 0; i < g4_tensor_numel(rf); i++) {
            float f;
            memcpy(&f, (const char *)rf->data + 4 * i, 4);
            if (f >= 1e20f) continue;
            const char *bad = !(f > 0.0f) ? "is not a frequency divisor" : ones && f != factor ?
                "differs from the other rotated pairs' (a proportional RoPE divides them alike)" : NULL;
            if (bad) {
                g4_fail(err, "GGUF: rope_freqs.weight[%lld] = %g %s", (long long)i, f, bad);
                json_decref(rp);
                json_decref(full);
                json_decref(slid);
                goto fail;
            }
            factor = f;
            ones++;
        }
        json_object_set_new(full, "rope_type", json_string("proportional"));
        json_object_set_new(full, "partial_rotary_factor", json_real(2.0 * ones / kfull));
        if (factor != 1.0f) json_object_set_new(full, "factor", json_real(factor));
    } else {
        json_object_set_new(full, "rope_type", json_string("default"));
    }
    json_object_set_new(rp, "full_attention", full);
    json_object_set_new(rp, "sliding_attention", slid);
    json_object_set_new(c, "rope_parameters", rp);
    static const char *ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                   {"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                   {"tokenizer.ggml.padding_token_id", "pad_token_id"}};
    for (size_t i = 0; i < 3; i++) {
        const json_t *v = json_object_get(g->meta, ids[i][0]);
        if (json_is_integer(v)) json_object_set(c, ids[i][1], (json_t *)v);
    }
    if (assistant) {
        /* Gemma4AssistantModel.set_gguf_parameters: embedding_length_out is the main model's width (the drafter's
         * backbone_hidden_size); the converter leaves the masked embedding out (filter_tensors), so the drafter runs
         * on its full tied head, as llama.cpp's gemma4-assistant.cpp does */
        double out_w = 0;
        if (num_key(g, "embedding_length_out", 1, &out_w, err) < 0) goto fail;
        if (!(out_w >= 1 && out_w <= 1e6 && out_w == floor(out_w))) {
            g4_fail(err, "GGUF: %s.embedding_length_out = %g is not a valid size", arch_of(g), out_w);
            goto fail;
        }
        json_t *a = json_pack("{s:s, s:o, s:I, s:b, s:b}", "model_type", "gemma4_assistant", "text_config", c,
                              "backbone_hidden_size", (json_int_t)out_w, "use_ordered_embeddings", 0,
                              "tie_word_embeddings", 1);
        if (!a) {
            c = NULL; /* json_pack's "o" took it */
            goto oom;
        }
        return a;
    }
    return c;
oom:
    g4_fail(err, "out of memory");
fail:
    json_decref(c);
    json_decref(lt);
    json_decref(plc);
    return NULL;
}

int g4_gemma4_gguf_open(const char *path, g4_gguf *g, json_t **config, g4_error *err) {
    *config = NULL;
    if (g4_gguf_open(path, g, err)) return -1;
    json_t *c = build_config(g, err);
    if (!c) {
        g4_error e2;
        snprintf(e2.msg, sizeof e2.msg, "%s: %s", path, err->msg);
        *err = e2;
        g4_gguf_free(g);
        return -1;
    }
    /* rename to HF names; names we do not know keep their GGUF spelling (reported as unused) */
    for (int i = 0; i < g->set.n_tensors; i++) {
        g4_tensor *t = &g->set.tensors[i];
        char hf[256], full[300];
        if (g4_gemma4_hf_name(t->name, hf, sizeof hf)) continue;
        const int top = !strcmp(hf, "lm_head.weight") || !strcmp(hf, "pre_projection.weight") ||
                        !strcmp(hf, "post_projection.weight"); /* outside the decoder's model.* */
        snprintf(full, sizeof full, "%s%s", top ? "" : "model.", hf);
        char *nn = strdup(full);
        if (!nn) {
            json_decref(c);
            g4_gguf_free(g);
            return g4_fail(err, "out of memory");
        }
        free((char *)t->name);
        t->name = nn;
    }
    if (g4_tensor_set_finish(&g->set, err)) {
        json_decref(c);
        g4_gguf_free(g);
        return -1;
    }
    *config = c;
    return 0;
}

/* ------------------------------------------------------- config -> metadata */
void g4_gemma4_gguf_write_meta(g4_gguf_writer *w, const g4_text_config *c, const g4_assistant_config *asst) {
    const char *arch = asst ? "gemma4-assistant" : "gemma4";
    char k[128];
#define K(x) (snprintf(k, sizeof k, "%s.%s", arch, x), k)
    const int L = c->n_layers;
    int32_t ff[G4_MAX_LAYERS], kv[G4_MAX_LAYERS], swa[G4_MAX_LAYERS];
    int ff_same = 1, kv_same = 1, full_hd = c->type_head_dim[G4_LAYER_FULL], swa_hd = c->type_head_dim[G4_LAYER_SLIDING];
    for (int l = 0; l < L; l++) {
        ff[l] = c->layer_intermediate[l];
        kv[l] = c->layer_kv_heads[l];
        swa[l] = c->layer_type[l] == G4_LAYER_SLIDING;
        ff_same &= ff[l] == ff[0];
        kv_same &= kv[l] == kv[0];
    }
    if (!full_hd) full_hd = swa_hd;
    if (!swa_hd) swa_hd = full_hd;
    g4_gguf_add_str(w, "general.architecture", arch);
    g4_gguf_add_u32(w, K("block_count"), (uint32_t)L);
    g4_gguf_add_u32(w, K("context_length"), (uint32_t)c->max_position_embeddings);
    g4_gguf_add_u32(w, K("embedding_length"), (uint32_t)c->hidden_size);
    if (ff_same)
        g4_gguf_add_u32(w, K("feed_forward_length"), (uint32_t)ff[0]);
    else
        g4_gguf_add_arr(w, K("feed_forward_length"), G4_GGUF_I32, ff, (size_t)L);
    g4_gguf_add_u32(w, K("attention.head_count"), (uint32_t)c->n_heads);
    if (kv_same)
        g4_gguf_add_u32(w, K("attention.head_count_kv"), (uint32_t)kv[0]);
    else
        g4_gguf_add_arr(w, K("attention.head_count_kv"), G4_GGUF_I32, kv, (size_t)L);
    g4_gguf_add_u32(w, K("attention.key_length"), (uint32_t)full_hd);
    g4_gguf_add_u32(w, K("attention.value_length"), (uint32_t)full_hd);
    g4_gguf_add_u32(w, K("attention.key_length_swa"), (uint32_t)swa_hd);
    g4_gguf_add_u32(w, K("attention.value_length_swa"), (uint32_t)swa_hd);
    g4_gguf_add_f32(w, K("attention.layer_norm_rms_epsilon"), (float)c->rms_norm_eps);
    g4_gguf_add_u32(w, K("attention.sliding_window"), (uint32_t)c->sliding_window);
    g4_gguf_add_arr(w, K("attention.sliding_window_pattern"), G4_GGUF_BOOL, swa, (size_t)L);
    g4_gguf_add_u32(w, K("attention.shared_kv_layers"), (uint32_t)c->num_kv_shared_layers);
    g4_gguf_add_u32(w, K("embedding_length_per_layer_input"), (uint32_t)c->hidden_size_per_layer_input);
    g4_gguf_add_f32(w, K("rope.freq_base"), (float)c->rope[G4_LAYER_FULL].theta);
    g4_gguf_add_f32(w, K("rope.freq_base_swa"), (float)c->rope[G4_LAYER_SLIDING].theta);
    g4_gguf_add_u32(w, K("rope.dimension_count"), (uint32_t)full_hd);
    g4_gguf_add_u32(w, K("rope.dimension_count_swa"), (uint32_t)swa_hd);
    if (c->has_softcap) g4_gguf_add_f32(w, K("final_logit_softcapping"), (float)c->final_logit_softcapping);
    if (c->enable_moe_block) {
        g4_gguf_add_u32(w, K("expert_count"), (uint32_t)c->num_experts);
        g4_gguf_add_u32(w, K("expert_used_count"), (uint32_t)c->top_k_experts);
        g4_gguf_add_u32(w, K("expert_feed_forward_length"), (uint32_t)c->moe_intermediate_size);
    }
    if (asst) { /* Gemma4AssistantModel.set_gguf_parameters */
        g4_gguf_add_u32(w, K("embedding_length_out"), (uint32_t)asst->backbone_hidden_size);
        g4_gguf_add_u32(w, K("nextn_predict_layers"), (uint32_t)L);
    }
#undef K
    g4_gguf_add_u32(w, "general.quantization_version", 2);
}
