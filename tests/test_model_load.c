/* Loading models: config.json in both spellings resolves the per-layer geometry the
 * docs describe; bad folders (unknown model type, missing or wrongly shaped tensors,
 * unsupported dtypes, broken config) give one clear error; tensors absent or ignored
 * by design are not reported, unused ones are. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "gemma4c.h"
#include "formats/gguf.h"
#include "formats/gguf_gemma4.h"
#include "engine/context.h"
#include "model/config.h"
#include "model/model.h"
#include "model_files.h"

static int parse(const char *json, g4_model_config *cfg, g4_error *err) {
    json_error_t je;
    json_t *root = json_loads(json, 0, &je);
    if (!root) {
        snprintf(err->msg, sizeof err->msg, "test JSON: %s", je.text);
        return -1;
    }
    int rc = g4_config_parse(root, "config", cfg, err);
    json_decref(root);
    return rc;
}

static int load_config_file(const char *rel, g4_model_config *cfg, g4_error *err) {
    json_t *root;
    json_error_t je;
    root = json_load_file(g4t_shared(rel), 0, &je);
    if (!root) return -1;
    int rc = g4_config_parse(root, rel, cfg, err);
    json_decref(root);
    return rc;
}

static void test_spellings(void) {
    g4_model_config c;
    g4_error err;
    /* released spelling without global_head_dim: full layers get 512; num_global_key_value_heads
     * only counts with attention_k_eq_v */
    CHECKF(parse("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":6,\"head_dim\":256,\"num_key_value_heads\":4,"
                 "\"num_attention_heads\":8,\"num_global_key_value_heads\":1}",
                 &c, &err) == 0,
           "%s", err.msg);
    CHECK(c.text.layer_type[5] == G4_LAYER_FULL && c.text.layer_type[4] == G4_LAYER_SLIDING);
    CHECK(c.text.layer_head_dim[5] == 512 && c.text.layer_head_dim[0] == 256);
    CHECK(c.text.layer_kv_heads[5] == 4);
    CHECK(!strcmp(c.weight_prefix, "model."));
    /* default layer types: full at (l+1) % 6 == 0, and the last layer forced to full */
    CHECKF(parse("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":8,\"num_attention_heads\":8}", &c, &err) == 0,
           "%s", err.msg);
    CHECK(c.text.layer_type[5] == G4_LAYER_FULL && c.text.layer_type[6] == G4_LAYER_SLIDING &&
          c.text.layer_type[7] == G4_LAYER_FULL && c.text.layer_head_dim[7] == 512);
    /* with k_eq_v the global kv heads apply to full layers */
    CHECKF(parse("{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":2,\"attention_k_eq_v\":true,"
                 "\"global_head_dim\":64,\"num_global_key_value_heads\":1,\"num_attention_heads\":4,"
                 "\"num_key_value_heads\":2,\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]}",
                 &c, &err) == 0,
           "%s", err.msg);
    CHECK(c.text.layer_type[1] == G4_LAYER_FULL && c.text.layer_head_dim[1] == 64 && c.text.layer_kv_heads[1] == 1 &&
          c.text.layer_k_eq_v[1] && !c.text.layer_k_eq_v[0]);
    /* 5.17 spelling: per_layer_config with zero-padded keys; global_* keys ignored */
    CHECKF(parse("{\"model_type\":\"gemma4\",\"text_config\":{\"num_hidden_layers\":12,\"num_attention_heads\":4,"
                 "\"num_key_value_heads\":2,\"head_dim\":32,\"global_head_dim\":999,"
                 "\"per_layer_config\":{\"05\":{\"head_dim\":64,\"num_key_value_heads\":1},"
                 "\"11\":{\"head_dim\":64,\"num_key_value_heads\":1}}}}",
                 &c, &err) == 0,
           "%s", err.msg);
    CHECK(c.text.layer_head_dim[5] == 64 && c.text.layer_kv_heads[5] == 1 && c.text.layer_head_dim[4] == 32 &&
          c.text.layer_head_dim[11] == 64);
    CHECK(!strcmp(c.weight_prefix, "model.language_model.") && c.multimodal_wrapper);
    /* text_config null: all defaults */
    CHECKF(parse("{\"model_type\":\"gemma4\",\"text_config\":null}", &c, &err) == 0, "%s", err.msg);
    CHECK(c.text.n_layers == 30 && c.text.hidden_size == 2304 && c.text.hidden_size_per_layer_input == 256);
    /* default RoPE: proportional 0.25 on full layers */
    CHECK(c.text.rope[G4_LAYER_FULL].type == G4_ROPE_PROPORTIONAL &&
          c.text.rope[G4_LAYER_FULL].partial_rotary_factor == 0.25 && c.text.rope[G4_LAYER_SLIDING].theta == 10000.0);

    /* invalid configurations */
    struct {
        const char *json, *want;
    } bad[] = {
        {"{\"model_type\":\"llama\"}", "unknown model_type \"llama\""},
        {"{\"model_type\":\"gemma4_unified\",\"vision_config\":{\"patch_size\":14}}", "must be 48"},
        {"{\"model_type\":\"gemma4_unified\",\"vision_config\":{\"mm_embed_dim\":64}}", "must equal"},
        {"{\"model_type\":\"gemma4_unified\",\"audio_config\":[]}", "must be objects"},
        {"{\"hidden_size\":8}", "no \"model_type\""},
        {"{\"model_type\":\"gemma4_text\",\"hidden_size\":\"big\"}", "must be an integer"},
        {"{\"model_type\":\"gemma4_text\",\"global_head_dim\":null}", "global_head_dim"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":2,\"layer_types\":[\"sliding_attention\"]}",
         "layer_types"},
        {"{\"model_type\":\"gemma4_text\",\"use_bidirectional_attention\":\"all\"}", "not supported"},
        {"{\"model_type\":\"gemma4_text\",\"hidden_activation\":\"relu\"}", "relu"},
        {"{\"model_type\":\"gemma4_text\",\"enable_moe_block\":true}", "num_experts"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":2,\"num_kv_shared_layers\":3}", "num_kv_shared_layers"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":2,\"num_kv_shared_layers\":1,"
         "\"layer_types\":[\"sliding_attention\",\"full_attention\"]}",
         "no earlier non-shared"},
        {"{\"model_type\":\"gemma4_text\",\"num_attention_heads\":6,\"num_key_value_heads\":4}", "not a multiple"},
        {"{\"model_type\":\"gemma4_text\",\"per_layer_config\":{\"x\":{}}}", "not a layer index"},
        {"{\"model_type\":\"gemma4_text\",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"yarn\"},"
         "\"sliding_attention\":{}}}",
         "yarn"},
        {"{\"model_type\":\"gemma4_text\",\"rope_parameters\":{\"full_attention\":{}}}", "no \"sliding_attention\""},
        {"[1]", "not a JSON object"},
        /* rows the engine sizes in int (issue 16) */
        {"{\"model_type\":\"gemma4_text\",\"num_attention_heads\":100000,\"num_key_value_heads\":100000,"
         "\"head_dim\":100000,\"global_head_dim\":60000}",
         "too large"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":100,\"hidden_size_per_layer_input\":100000000}",
         "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(bad[i].json, &c, &err);
        CHECKF(rc != 0 && strstr(err.msg, bad[i].want), "bad config %zu: rc %d, '%s' lacks '%s'", i, rc,
               rc ? err.msg : "", bad[i].want);
    }
}

/* The real model shapes of ../shared/configs, against the facts docs/gemma4-text.md states. */
static void test_real_configs(void) {
    g4_model_config c;
    g4_error err;
    CHECKF(load_config_file("configs/gemma-4-e2b.json", &c, &err) == 0, "%s", err.msg);
    const g4_text_config *t = &c.text;
    CHECK(t->n_layers == 35 && t->hidden_size == 1536 && t->hidden_size_per_layer_input == 256);
    int full_ok = 1;
    for (int l = 0; l < 35; l++) full_ok &= (t->layer_type[l] == G4_LAYER_FULL) == ((l + 1) % 5 == 0);
    CHECK(full_ok);
    CHECK(t->layer_head_dim[4] == 512 && t->layer_head_dim[3] == 256 && t->layer_kv_heads[4] == 1);
    /* E2B: 20 shared layers; sliding ones read layer 13, full ones layer 14; double-wide MLP there */
    int share_ok = 1;
    for (int l = 0; l < 35; l++) {
        int want = l < 15 ? l : (t->layer_type[l] == G4_LAYER_FULL ? 14 : 13);
        share_ok &= t->layer_kv_source[l] == want && t->layer_kv_shared[l] == (l >= 15);
        share_ok &= t->layer_intermediate[l] == (l >= 15 ? 12288 : 6144);
    }
    CHECK(share_ok);
    CHECK(t->has_softcap && t->final_logit_softcapping == 30.0 && t->sliding_window == 512);

    CHECKF(load_config_file("configs/gemma-4-31b.json", &c, &err) == 0, "%s", err.msg);
    CHECK(c.text.n_layers == 60 && c.text.attention_k_eq_v && c.text.layer_k_eq_v[5] && !c.text.layer_k_eq_v[4]);
    CHECK(c.text.layer_head_dim[5] == 512 && c.text.layer_kv_heads[5] == 4 && c.text.layer_kv_heads[4] == 16);
    CHECK(c.text.hidden_size_per_layer_input == 0);

    CHECKF(load_config_file("configs/gemma-4-26b-a4b.json", &c, &err) == 0, "%s", err.msg);
    CHECK(c.text.enable_moe_block && c.text.num_experts == 128 && c.text.top_k_experts == 8);

    CHECKF(load_config_file("configs/gemma-4-e4b.json", &c, &err) == 0, "%s", err.msg);
    CHECK(c.text.hidden_size == 2560 && c.text.num_kv_shared_layers > 0);

    /* the encoder-free 12B (docs/gemma4-unified.md 1): no PLE although the file names a PLE vocabulary */
    CHECKF(load_config_file("configs/gemma-4-12b.json", &c, &err) == 0, "%s", err.msg);
    CHECK(c.unified && c.multimodal_wrapper && c.text.n_layers == 48 && c.text.hidden_size == 3840);
    CHECK(c.text.hidden_size_per_layer_input == 0 && !c.text.enable_moe_block && c.text.bidirectional_vision);
    CHECK(c.text.sliding_window == 1024 && c.text.layer_k_eq_v[5] && c.text.layer_kv_heads[5] == 1 &&
          c.text.layer_head_dim[5] == 512 && c.text.layer_kv_heads[4] == 8);
    CHECK(c.uni.block == 48 && c.uni.mm_embed_dim == 3840 && c.uni.mm_posemb_size == 1120 && c.uni.audio_samples == 640);
    CHECK(c.image_token_id == 258880 && c.audio_token_id == 258881 && c.eoa_token_id == 258883);
}

static void test_rope_tables(void) {
    /* values given in docs/gemma4-text.md 3.3 */
    float inv[256];
    g4_rope_config sl = {G4_ROPE_DEFAULT, 10000.0, 0.25 /* ignored */, 1.0};
    g4_rope_inv_freq(&sl, 256, inv);
    CHECKF(fabsf(inv[1] - 0.93057204f) <= 2e-7f && fabsf(inv[127] - 1.0746078e-4f) <= 1e-10f, "%.9g %.9g", inv[1],
           inv[127]);
    g4_rope_config fu = {G4_ROPE_PROPORTIONAL, 1000000.0, 0.25, 1.0};
    g4_rope_inv_freq(&fu, 512, inv);
    CHECKF(fabsf(inv[1] - 0.94746353f) <= 2e-7f && fabsf(inv[63] - 0.033376247f) <= 1e-8f, "%.9g %.9g", inv[1],
           inv[63]);
    int zeros = 1;
    for (int k = 64; k < 256; k++) zeros &= inv[k] == 0.0f;
    CHECK(zeros);
}

/* Loads dir and expects an error containing `want` (or success if want is NULL). */
static g4_model *load_expect(const char *what, const char *dir, const char *want) {
    g4_model *m = NULL;
    g4_error err = {{0}};
    g4_load_params lp = {.n_threads = 1};
    int rc = g4_model_load(dir, &lp, &m, &err);
    if (want) {
        CHECKF(rc != 0 && strstr(err.msg, want), "%s: rc %d, '%s' lacks '%s'", what, rc, rc ? err.msg : "", want);
        CHECKF(strchr(err.msg, '\n') == NULL, "%s: not one line", what);
        if (rc == 0) g4_model_free(m);
        return NULL;
    }
    CHECKF(rc == 0, "%s: %s", what, err.msg);
    return rc == 0 ? m : NULL;
}

/* Rewrites dir/config.json with its first `from` replaced by `to`; 0 when it held `from`. */
static int edit_config(const char *dir, const char *from, const char *to) {
    char path[4200], *text, *out;
    size_t len;
    g4_error err;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (g4_read_file(path, &text, &len, &err)) return -1;
    char *hit = strstr(text, from);
    int rc = -1;
    if (hit && (out = malloc(len + strlen(to) + 1))) {
        size_t at = (size_t)(hit - text);
        memcpy(out, text, at);
        strcpy(out + at, to);
        strcat(out, hit + strlen(from));
        rc = write_text(path, out);
        free(out);
    }
    free(text);
    return rc;
}

/* A config that disagrees with the weights is refused with one line naming a tensor: its shape against the one
 * the config implies, or a tensor the weights hold that the config leaves out (a different model would run). */
static void test_config_mismatch(void) {
    char src[4096], moe[4096], dir[4096];
    snprintf(src, sizeof src, "%s", g4t_shared("fixtures/dense-ple"));
    snprintf(moe, sizeof moe, "%s", g4t_shared("fixtures/moe"));
    snprintf(dir, sizeof dir, "%s", g4t_tmp("mismatch-model"));
    static const struct {
        const char *what, *from, *to, *want;
    } cases[] = {
        {"num_attention_heads", "\"num_attention_heads\": 4", "\"num_attention_heads\": 8",
         "q_proj.weight' has shape [128, 128], the config implies [256, 128]"},
        {"head_dim", "\"head_dim\": 32", "\"head_dim\": 16", "q_proj.weight' has shape [128, 128], the config implies [64, 128]"},
        {"num_key_value_heads", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 1",
         "k_proj.weight' has shape [64, 128], the config implies [32, 128]"},
        {"hidden_size_per_layer_input 0", "\"hidden_size_per_layer_input\": 16", "\"hidden_size_per_layer_input\": 0",
         "embed_tokens_per_layer.weight' is in the weights but the config leaves it out (hidden_size_per_layer_input is 0)"},
        {"attention_k_eq_v", "\"attention_k_eq_v\": false", "\"attention_k_eq_v\": true",
         "layers.2.self_attn.v_proj.weight' is in the weights but the config leaves it out (attention_k_eq_v"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(resave(src, dir, 1, 0, NULL) == 0);
        CHECKF(edit_config(dir, cases[i].from, cases[i].to) == 0, "%s: fixture config lacks %s", cases[i].what,
               cases[i].from);
        load_expect(cases[i].what, dir, cases[i].want);
    }
    CHECK(resave(moe, dir, 1, 0, NULL) == 0);
    CHECK(edit_config(dir, "\"enable_moe_block\": true", "\"enable_moe_block\": false") == 0);
    load_expect("enable_moe_block false", dir, "is in the weights but the config leaves it out (enable_moe_block is false)");
    char vision[4096];
    snprintf(vision, sizeof vision, "%s", g4t_shared("fixtures/vision"));
    CHECK(resave(vision, dir, 1, 0, NULL) == 0);
    CHECK(edit_config(dir, "\"num_hidden_layers\": 2,", "\"num_hidden_layers\": 1,") == 0); /* vision_config's */
    load_expect("vision_config.num_hidden_layers", dir, "vision_tower.encoder.layers.1.");
    load_expect("vision_config.num_hidden_layers", dir, "(vision_config.num_hidden_layers is 1)");

    /* a layer past num_hidden_layers (8) */
    static uint16_t zeros[256 * 128];
    char name[256];
    snprintf(name, sizeof name, "model.language_model.layers.8.mlp.up_proj.weight");
    g4_tensor extra = {.name = name, .dtype = G4_BF16, .ndim = 2, .shape = {256, 128}, .data = zeros, .nbytes = sizeof zeros};
    resave_edit more = {.extra = &extra, .n_extra = 1};
    CHECK(resave(src, dir, 1, 0, &more) == 0);
    load_expect("a layer past num_hidden_layers", dir, "layers.8.mlp.up_proj.weight' is in the weights but the config "
                                                      "leaves it out (num_hidden_layers is 8)");
}

static void test_bad_folders(void) {
    char src[4096];
    snprintf(src, sizeof src, "%s", g4t_shared("fixtures/dense-ple"));
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", g4t_tmp("bad-model"));
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const char *P = "model.language_model.";
    char name[256];

    /* a missing tensor, named */
    snprintf(name, sizeof name, "%slayers.3.mlp.up_proj.weight", P);
    resave_edit drop = {.drop = name};
    CHECK(resave(src, dir, 1, 0, &drop) == 0);
    load_expect("missing tensor", dir, "layers.3.mlp.up_proj.weight");

    /* a tensor of the wrong shape */
    static uint16_t zeros[128 * 128];
    snprintf(name, sizeof name, "%slayers.2.self_attn.q_norm.weight", P);
    g4_tensor wrong = {.name = name, .dtype = G4_BF16, .ndim = 1, .shape = {63}, .data = zeros, .nbytes = 126};
    resave_edit shape = {.extra = &wrong, .n_extra = 1};
    CHECK(resave(src, dir, 1, 0, &shape) == 0);
    load_expect("wrong shape", dir, "[63], the config implies [64]");

    /* a weight in a dtype the engine does not read */
    snprintf(name, sizeof name, "%slayers.0.self_attn.q_norm.weight", P);
    g4_tensor i32 = {.name = name, .dtype = G4_I32, .ndim = 1, .shape = {32}, .data = zeros, .nbytes = 128};
    resave_edit dt = {.extra = &i32, .n_extra = 1};
    CHECK(resave(src, dir, 1, 0, &dt) == 0);
    load_expect("integer weight", dir, "dtype I32");

    /* unused tensors are reported; k/v of a KV-shared layer (5) are ignored by design */
    char n1[256], n2[256], n3[256];
    snprintf(n1, sizeof n1, "%slayers.0.self_attn.extra.weight", P);
    snprintf(n2, sizeof n2, "%slayers.5.self_attn.k_proj.weight", P);
    snprintf(n3, sizeof n3, "model.vision_tower.patch.weight");
    g4_tensor extra[3] = {
        {.name = n1, .dtype = G4_BF16, .ndim = 1, .shape = {4}, .data = zeros, .nbytes = 8},
        {.name = n2, .dtype = G4_BF16, .ndim = 2, .shape = {128, 128}, .data = zeros, .nbytes = 2 * 128 * 128},
        {.name = n3, .dtype = G4_BF16, .ndim = 1, .shape = {4}, .data = zeros, .nbytes = 8},
    };
    resave_edit more = {.extra = extra, .n_extra = 3};
    CHECK(resave(src, dir, 1, 0, &more) == 0);
    g4_model *m = load_expect("extra tensors", dir, NULL);
    if (m) {
        const char *w = g4_model_warnings(m);
        CHECKF(w && strstr(w, "layers.0.self_attn.extra.weight"), "warnings: %s", w ? w : "(none)");
        CHECKF(w && !strstr(w, "layers.5.self_attn.k_proj"), "shared-layer k_proj reported: %s", w ? w : "");
        CHECKF(w && !strstr(w, "vision_tower"), "tower tensor reported: %s", w ? w : "");
        g4_model_free(m);
    }

    /* config problems */
    CHECK(resave(src, dir, 1, 0, NULL) == 0);
    CHECK(write_text(cfg, "{\"model_type\": \"mistral\"}") == 0);
    load_expect("unknown model_type", dir, "unknown model_type \"mistral\"");
    CHECK(write_text(cfg, "{\"model_type\": \"gemma4\", ") == 0);
    load_expect("truncated config", dir, "invalid JSON");
    remove(cfg);
    load_expect("no config", dir, "no config.json");
    load_expect("no folder", g4t_tmp("no-such-model"), "no config.json");
    /* a file that is neither a folder nor a GGUF file (the weights file itself, a GGUF cut before its magic) */
    char notdir[4200];
    snprintf(notdir, sizeof notdir, "%s/weights.bin", dir);
    CHECK(write_text(notdir, "GGU") == 0);
    load_expect("a file, not a folder", notdir, "not a model folder, nor a GGUF file");

    /* a config that disagrees with the weights: the first misfit is named */
    CHECK(resave(src, dir, 1, 0, NULL) == 0);
    char *text;
    size_t len;
    g4_error err;
    CHECK(g4_read_file(cfg, &text, &len, &err) == 0);
    char *hit = strstr(text, "\"hidden_size\": 128");
    if (hit) {
        memcpy(hit, "\"hidden_size\": 256", 18);
        CHECK(write_text(cfg, text) == 0);
        load_expect("hidden size mismatch", dir, "the config implies");
    } else {
        CHECKF(0, "fixture config lacks \"hidden_size\": 128");
    }
    free(text);

    /* a text-only (gemma4_text) config beside a multimodal checkpoint's weights: the missing tensors say why */
    CHECK(resave(src, dir, 1, 0, NULL) == 0);
    json_t *root = json_load_file(cfg, 0, NULL), *tc = json_incref(json_object_get(root, "text_config"));
    CHECK(tc && json_object_set_new(tc, "model_type", json_string("gemma4_text")) == 0 && json_dump_file(tc, cfg, 0) == 0);
    json_decref(tc);
    json_decref(root);
    load_expect("text-only config, multimodal weights", dir, "the weights name them model.language_model.*");

    /* a corrupt weights file */
    CHECK(resave(src, dir, 1, 0, NULL) == 0);
    char st[4200];
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    FILE *f = fopen(st, "r+b");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    CHECK(truncate(st, size / 2) == 0);
    load_expect("truncated weights", dir, "truncated");
}

/* A tower the config names but the weights leave out altogether (a text-only conversion: mlx-lm keeps the
 * config's vision_config and drops the tower) is absent by design: the text model loads, with a warning, and
 * images are refused. A tower that is only partly there is still an error; mlx-vlm's tower names (no outer
 * "model.") bind as HF's. */
static void test_towers(void) {
    char vision[4096], dir[4096];
    snprintf(vision, sizeof vision, "%s", g4t_shared("fixtures/vision"));
    snprintf(dir, sizeof dir, "%s", g4t_tmp("towers-model"));
    resave_edit no_tower = {.drop_prefix = "model.vision_tower."};
    CHECK(resave(vision, dir, 1, 0, &no_tower) == 0);
    load_expect("embed_vision without its tower", dir, "model.vision_tower.patch_embedder.input_proj.weight");
    static const char *const both[] = {"model.vision_tower.", "dropped.vision_tower.", "model.embed_vision.",
                                       "dropped.embed_vision."};
    resave_edit text_only = {.drop_prefix = "dropped.", .rename = both, .n_rename = 2};
    CHECK(resave(vision, dir, 1, 0, &text_only) == 0);
    g4_model *m = load_expect("no vision tower in the weights", dir, NULL);
    if (m) {
        const char *w = g4_model_warnings(m);
        CHECKF(w && strstr(w, "no vision tower"), "warnings: %s", w ? w : "(none)");
        CHECKF(m->vision == NULL, "a vision tower without weights");
        g4_model_free(m);
    }
    resave_edit partial = {.drop = "model.vision_tower.patch_embedder.input_proj.weight"};
    CHECK(resave(vision, dir, 1, 0, &partial) == 0);
    load_expect("a vision tower without its input projection", dir, "patch_embedder.input_proj.weight");
    static const char *const mlx_vlm[] = {"model.language_model.", "language_model.model.", "model.vision_tower.",
                                          "vision_tower.", "model.embed_vision.", "embed_vision."};
    resave_edit vlm = {.rename = mlx_vlm, .n_rename = 3};
    CHECK(resave(vision, dir, 1, 0, &vlm) == 0);
    m = load_expect("mlx-vlm names", dir, NULL);
    if (m) {
        const char *w = g4_model_warnings(m);
        CHECKF(!w, "warnings: %s", w);
        CHECKF(m->vision != NULL, "mlx-vlm's vision tower was not bound");
        g4_model_free(m);
    }
}

/* A generation_config.json field transformers acts on and this engine does not is a load warning (the CLI and the
 * server print them), not silently different output; the fixture's own file draws none. */
static void test_generation_config_warnings(void) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s", g4t_tmp("genconfig-model"));
    CHECK(resave(g4t_shared("fixtures/dense-ple"), dir, 1, 0, NULL) == 0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    CHECK(copy_file(g4t_shared("fixtures/dense-ple/generation_config.json"), path) == 0);
    g4_model *m = load_expect("the fixture's generation_config.json", dir, NULL);
    if (m) {
        CHECKF(!g4_model_warnings(m), "warnings: %s", g4_model_warnings(m));
        g4_model_free(m);
    }
    CHECK(write_text(path, "{\"eos_token_id\": 1, \"no_repeat_ngram_size\": 3, \"min_new_tokens\": 2}") == 0);
    m = load_expect("no_repeat_ngram_size and min_new_tokens", dir, NULL);
    if (m) {
        const char *w = g4_model_warnings(m);
        CHECKF(w && strstr(w, "\"no_repeat_ngram_size\" 3") && strstr(w, "\"min_new_tokens\" 2"), "warnings: %s",
               w ? w : "(none)");
        g4_model_free(m);
    }
}

static int count_finish(const g4_event *ev, void *user) {
    if (ev->kind == G4_EVENT_FINISH) ++*(int *)user;
    return 0;
}

/* NaN in the weights: transformers computes NaN logits; the batch step reports them as an error (the soft-cap
 * must not turn NaN into a finite +-cap on the way), and the embedding's hidden states likewise. */
static void test_nan_weights(void) {
    char src[4096], dir[4096];
    snprintf(src, sizeof src, "%s", g4t_shared("fixtures/dense-ple"));
    snprintf(dir, sizeof dir, "%s", g4t_tmp("nan-model"));
    static uint16_t w[256 * 128];
    char name[256];
    snprintf(name, sizeof name, "model.language_model.layers.1.mlp.down_proj.weight");
    g4_tensor_set set;
    g4_error err = {{0}};
    CHECK(g4_safetensors_open_dir(src, &set, &err) == 0);
    const g4_tensor *t = g4_tensor_set_find(&set, name);
    CHECK(t && t->nbytes == sizeof w);
    if (t) memcpy(w, t->data, sizeof w);
    g4_tensor_set_free(&set);
    w[5] = 0x7fc0; /* bf16 NaN */
    g4_tensor nan_t = {.name = name, .dtype = G4_BF16, .ndim = 2, .shape = {128, 256}, .data = w, .nbytes = sizeof w};
    resave_edit ed = {.extra = &nan_t, .n_extra = 1};
    CHECK(resave(src, dir, 1, 0, &ed) == 0);
    g4_model *m = load_expect("NaN weights", dir, NULL);
    if (!m) return;
    g4_context *ctx;
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 16, .n_batch = 8};
    if (g4_context_new(m, &cp, &ctx, &err) == 0) {
        int32_t ids[3] = {2, 328, 298};
        float logits[3 * 512], emb[128];
        g4_batch b = {.n_tokens = 3, .token = ids};
        CHECK(g4_decode(ctx, &b, logits, &err) != 0);
        CHECKF(strstr(err.msg, "NaN logits") != NULL, "%s", err.msg);
        CHECK(g4_embed(ctx, 0, ids, 3, emb, &err) != 0);
        CHECKF(strstr(err.msg, "NaN hidden states") != NULL, "%s", err.msg);
        /* the step's argmax (greedy ids) and its top-k candidates say so too, rather than skip the NaN */
        int32_t got[3] = {0, 0, 0};
        CHECK(g4_decode_greedy(ctx, &b, got, &err) != 0);
        CHECKF(strstr(err.msg, "NaN logits") != NULL, "greedy: %s", err.msg);
        int32_t cids[3 * 74], count[3];
        float cvals[3 * 74], fallback[3 * 512];
        g4_candidates cand = {.k = 10, .cap = g4_candidates_cap(10), .ids = cids, .count = count, .vals = cvals,
                              .fallback = fallback};
        CHECK(g4_decode_candidates(ctx, &b, &cand, &err) != 0);
        CHECKF(strstr(err.msg, "NaN logits") != NULL, "candidates: %s", err.msg);
        g4_context_free(ctx);
    } else {
        CHECKF(0, "context: %s", err.msg);
    }
    /* under a scheduler the failed step ends its requests with the error (they would fail the same way again),
     * each with its FINISH event; the scheduler is then idle */
    g4_context_params sp = {.n_seq_max = 2, .n_ctx = 16, .n_batch = 8, .kv_history = -1};
    g4_scheduler *s = NULL;
    if (g4_context_new(m, &sp, &ctx, &err) == 0 && g4_scheduler_new(ctx, &s, &err) == 0) {
        int32_t ids[3] = {2, 328, 298};
        g4_generation *g[2] = {NULL, NULL};
        int finished[2] = {0, 0};
        for (int i = 0; i < 2; i++)
            CHECKF(g4_scheduler_submit(s, ids, 3 - i, NULL, count_finish, &finished[i], &g[i], &err) == 0, "%s", err.msg);
        CHECK(g4_scheduler_step(s, &err) == -1);
        CHECKF(strstr(err.msg, "NaN logits") != NULL, "scheduler: %s", err.msg);
        for (int i = 0; i < 2; i++) {
            CHECK(finished[i] == 1 && g4_generation_finish(g[i]) == G4_FINISH_ERROR);
            CHECKF(g4_generation_error(g[i]) && strstr(g4_generation_error(g[i]), "NaN logits"), "request %d: %s", i,
                   g4_generation_error(g[i]) ? g4_generation_error(g[i]) : "no error");
            g4_generation_free(g[i]);
        }
        CHECK(g4_scheduler_step(s, &err) == 0);
    } else {
        CHECKF(0, "scheduler: %s", err.msg);
    }
    g4_scheduler_free(s);
    g4_context_free(ctx);
    g4_model_free(m);
}

/* An Ollama GGUF keeps its vision and audio towers in the file (v.*, a.*, mm.*): the text model loads without a
 * warning per tower tensor, as the towers of an HF checkpoint. */
static void test_gguf_towers(void) {
    char src[4096], path[4096];
    snprintf(src, sizeof src, "%s", g4t_shared("fixtures/dense-ple"));
    snprintf(path, sizeof path, "%s", g4t_tmp("ollama-towers.gguf"));
    g4_tensor_set set;
    g4_model_config cfg;
    g4_error err = {{0}};
    if (g4_safetensors_open_dir(src, &set, &err) || g4_config_load(src, &cfg, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    g4_gguf_writer w = {0};
    g4_gemma4_gguf_write_meta(&w, &cfg.text, NULL);
    static const char *const towers[] = {"v.blk.0.attn_q.weight", "a.conv1d.0.weight", "mm.input_projection.weight"};
    const float zeros[4] = {0};
    const int64_t four = 4;
    const g4_tensor **order = calloc((size_t)set.n_tensors, sizeof *order);
    size_t *bytes = calloc((size_t)set.n_tensors + 3, sizeof *bytes);
    int n = 0;
    const size_t pl = strlen("model.language_model.");
    for (int i = 0; order && bytes && i < set.n_tensors; i++) {
        const g4_tensor *t = &set.tensors[i];
        char name[256];
        if (strncmp(t->name, "model.language_model.", pl) || g4_gemma4_gguf_name(t->name + pl, name, sizeof name)) continue;
        bytes[n] = g4_gguf_add_tensor(&w, name, t->dtype, t->ndim, t->shape);
        order[n++] = t;
    }
    for (int k = 0; k < 3 && bytes; k++) bytes[n + k] = g4_gguf_add_tensor(&w, towers[k], G4_F32, 1, &four);
    FILE *f = fopen(path, "wb");
    int ok = f && order && bytes && g4_gguf_write_header(&w, f, &err) == 0;
    for (int i = 0; ok && i < n; i++)
        ok = g4_gguf_write_data(f, order[i]->data, bytes[i], &err) == 0 && g4_gguf_write_pad(f, bytes[i], &err) == 0;
    for (int k = 0; ok && k < 3; k++)
        ok = g4_gguf_write_data(f, zeros, bytes[n + k], &err) == 0 && g4_gguf_write_pad(f, bytes[n + k], &err) == 0;
    if (f) fclose(f);
    CHECKF(ok, "writing %s: %s", path, err.msg);
    g4_gguf_writer_free(&w);
    free(order);
    free(bytes);
    g4_tensor_set_free(&set);
    g4_model *m = ok ? load_expect("an Ollama GGUF with its towers", path, NULL) : NULL;
    if (m) {
        const char *warn = g4_model_warnings(m);
        CHECKF(!warn, "warnings: %s", warn);
        g4_model_free(m);
    }
}

/* An explicit null: transformers' config classes are @strict dataclasses (huggingface_hub), whose type validator
 * refuses None for a field typed without `| None` (reference/transformers-5.17/gemma4/configuration_gemma4.py:152-180,
 * 273-290, 354; gemma4_unified/configuration_gemma4_unified.py:46-48, 124-150, 229-235, 314;
 * gemma4_assistant/configuration_gemma4_assistant.py:70-74): such a null is an error, never the default (a null
 * sliding_window ran with a window of 512 instead of refusing). A field typed `X | None` takes None as "none":
 * final_logit_softcapping None is no soft-cap (modeling_gemma4.py:1864), rope_parameters / layer_types None the
 * defaults (configuration_gemma4.py:190-208), the unified model's use_bidirectional_attention None is causal
 * (configuration_gemma4_unified.py:147: its default "vision" applies only when the key is absent). */
static void test_nulls(void) {
    g4_model_config c;
    g4_error err;
    static const struct {
        const char *json, *key;
    } bad[] = {
        {"{\"model_type\":\"gemma4_text\",\"sliding_window\":null}", "sliding_window"},
        {"{\"model_type\":\"gemma4_text\",\"num_hidden_layers\":6,\"per_layer_config\":{\"5\":{\"head_dim\":null}}}",
         "head_dim"},
        {"{\"model_type\":\"gemma4\",\"text_config\":{\"hidden_size_per_layer_input\":null}}",
         "hidden_size_per_layer_input"},
        {"{\"model_type\":\"gemma4\",\"text_config\":{\"rms_norm_eps\":null}}", "rms_norm_eps"},
        {"{\"model_type\":\"gemma4\",\"text_config\":{\"attention_k_eq_v\":null}}", "attention_k_eq_v"},
        {"{\"model_type\":\"gemma4\",\"text_config\":{\"num_kv_shared_layers\":null}}", "num_kv_shared_layers"},
        {"{\"model_type\":\"gemma4\",\"text_config\":{\"enable_moe_block\":null}}", "enable_moe_block"},
        {"{\"model_type\":\"gemma4\",\"tie_word_embeddings\":null}", "tie_word_embeddings"},
        {"{\"model_type\":\"gemma4\",\"vision_config\":{\"head_dim\":null}}", "head_dim"},
        {"{\"model_type\":\"gemma4_unified\",\"text_config\":{\"sliding_window\":null}}", "sliding_window"},
        {"{\"model_type\":\"gemma4_unified\",\"vision_config\":{\"mm_posemb_size\":null}}", "mm_posemb_size"},
        {"{\"model_type\":\"gemma4_unified\",\"audio_config\":{\"audio_embed_dim\":null}}", "audio_embed_dim"},
        {"{\"model_type\":\"gemma4_assistant\",\"num_centroids\":null,\"text_config\":{"
         "\"hidden_size_per_layer_input\":0,\"vocab_size_per_layer_input\":0}}",
         "num_centroids"},
        {"{\"model_type\":\"gemma4_assistant\",\"text_config\":{\"num_kv_shared_layers\":null,"
         "\"hidden_size_per_layer_input\":0,\"vocab_size_per_layer_input\":0}}",
         "num_kv_shared_layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(bad[i].json, &c, &err);
        char want[128];
        snprintf(want, sizeof want, "\"%s\" is null", bad[i].key);
        CHECKF(rc != 0 && strstr(err.msg, want), "null %zu: rc %d, '%s' lacks '%s'", i, rc, rc ? err.msg : "", want);
    }
    /* `| None` fields: null is "none" */
    CHECKF(parse("{\"model_type\":\"gemma4_text\",\"final_logit_softcapping\":null,\"rope_parameters\":null,"
                 "\"layer_types\":null,\"use_bidirectional_attention\":null,\"pad_token_id\":null,\"bos_token_id\":null,"
                 "\"eos_token_id\":null,\"num_experts\":null,\"top_k_experts\":null,\"moe_intermediate_size\":null,"
                 "\"num_hidden_layers\":6,\"attention_dropout\":null}",
                 &c, &err) == 0,
           "%s", err.msg);
    CHECK(!c.text.has_softcap && c.text.rope[G4_LAYER_FULL].type == G4_ROPE_PROPORTIONAL &&
          c.text.layer_type[5] == G4_LAYER_FULL && c.text.layer_type[4] == G4_LAYER_SLIDING &&
          !c.text.bidirectional_vision);
    /* a negative soft-cap is the positive one (logits / c, tanh, * c is odd in c: modeling_gemma4.py:1864-1867); 0
     * divides by zero in transformers, and 1e308 is infinite as the float32 it is applied in (NaN logits there) */
    CHECKF(parse("{\"model_type\":\"gemma4_text\",\"final_logit_softcapping\":-30.0}", &c, &err) == 0, "%s", err.msg);
    CHECK(c.text.has_softcap && c.text.final_logit_softcapping == 30.0);
    CHECK(parse("{\"model_type\":\"gemma4_text\",\"final_logit_softcapping\":0}", &c, &err) != 0 &&
          strstr(err.msg, "final_logit_softcapping"));
    CHECK(parse("{\"model_type\":\"gemma4_text\",\"final_logit_softcapping\":1e308}", &c, &err) != 0 &&
          strstr(err.msg, "final_logit_softcapping"));
    CHECKF(parse("{\"model_type\":\"gemma4_unified\",\"text_config\":{\"use_bidirectional_attention\":null}}", &c,
                 &err) == 0,
           "%s", err.msg);
    CHECK(!c.text.bidirectional_vision && c.text.sliding_window == 1024);
    CHECKF(parse("{\"model_type\":\"gemma4_unified\",\"text_config\":{}}", &c, &err) == 0, "%s", err.msg);
    CHECK(c.text.bidirectional_vision);
    /* the wrapper's token ids are `int | None` (configuration_gemma4.py:346-352): null or -1 is none, not the
     * default id (null gave 258880) nor a refused model (-1 was "out of range") */
    CHECKF(parse("{\"model_type\":\"gemma4\",\"image_token_id\":null,\"audio_token_id\":-1}", &c, &err) == 0, "%s",
           err.msg);
    CHECK(c.image_token_id == -1 && c.audio_token_id == -1 && c.video_token_id == 258884);
    /* a multimodal wrapper's null towers are absent towers (configuration_gemma4.py:363-371) */
    CHECKF(parse("{\"model_type\":\"gemma4\",\"vision_config\":null,\"audio_config\":null}", &c, &err) == 0, "%s",
           err.msg);
    CHECK(!c.has_vision && !c.has_audio);
    /* Gemma4AudioConfig (configuration_gemma4.py:55-76), read with the audio tower */
    char src[4096], dir[4096];
    snprintf(src, sizeof src, "%s", g4t_shared("fixtures/audio"));
    snprintf(dir, sizeof dir, "%s", g4t_tmp("null-audio"));
    CHECK(resave(src, dir, 1, 0, NULL) == 0);
    CHECK(edit_config(dir, "\"residual_weight\": 0.5", "\"residual_weight\": null") == 0);
    load_expect("audio_config null", dir, "audio_config: \"residual_weight\" is null");
}

/* Ids outside an embedding table: transformers' nn.Embedding refuses them (an IndexError), we read past the table
 * (NaN logits blamed on the weights, or a fault). A placeholder's row reads the pad token's embedding
 * (reference/transformers-5.17/gemma4/modeling_gemma4.py:2308); pad_token_id is `int | None` and one outside the
 * vocabulary (-1 is on the Hub) only draws a warning at load (configuration_utils.py validate_token_ids), so the
 * model loads and text runs. The per-layer table has vocab_size_per_layer_input rows (modeling_gemma4.py:1591-1593). */
static int count_tokens(const g4_event *ev, void *user) {
    if (ev->kind == G4_EVENT_TOKEN) ++*(int *)user;
    return 0;
}

/* A scheduler is given a prompt the model cannot read (bad) beside one it can (ok): the bad one is refused at
 * submit with `want`, the good one runs to its end (or, where it generates an id the model cannot read back, ends
 * alone with that error). */
static void scheduled_alone(const char *label, g4_model *m, const int32_t *bad, const int32_t *ok, const char *want) {
    g4_error err = {{0}};
    g4_context *ctx = NULL;
    g4_scheduler *s = NULL;
    g4_context_params cp = {.n_seq_max = 2, .n_ctx = 16, .n_batch = 8, .kv_history = -1};
    if (g4_context_new(m, &cp, &ctx, &err) || g4_scheduler_new(ctx, &s, &err)) {
        CHECKF(0, "%s: %s", label, err.msg);
        g4_context_free(ctx);
        return;
    }
    g4_generation_params gp = {.max_new_tokens = 3, .ignore_eos = 1};
    g4_generation *good = NULL, *refused = NULL;
    int n_good = 0, n_bad = 0;
    CHECKF(g4_scheduler_submit(s, ok, 3, &gp, count_tokens, &n_good, &good, &err) == 0, "%s: %s", label, err.msg);
    CHECK(g4_scheduler_submit(s, bad, 3, &gp, count_tokens, &n_bad, &refused, &err) != 0 && !refused);
    CHECKF(strstr(err.msg, want), "%s: '%s' lacks '%s'", label, err.msg, want);
    int left;
    while ((left = g4_scheduler_step(s, &err)) > 0) {}
    const char *why = g4_generation_error(good);
    CHECKF(left == 0 && ((n_good == 3 && g4_generation_finish(good) == G4_FINISH_LENGTH) ||
                         (n_good > 0 && why && strstr(why, "outside the per-layer embedding table"))),
           "%s: %d tokens, %s", label, n_good, left < 0 ? err.msg : why ? why : "");
    printf("%s: the good request gave %d tokens%s%s\n", label, n_good, why ? ", then: " : "", why ? why : "");
    g4_generation_free(good);
    g4_scheduler_free(s);
    g4_context_free(ctx);
}

static void test_token_tables(void) {
    char src[4096], dir[4096], name[256];
    snprintf(src, sizeof src, "%s", g4t_shared("fixtures/dense-ple"));
    snprintf(dir, sizeof dir, "%s", g4t_tmp("token-tables"));
    g4_error err = {{0}};
    g4_context_params cp = {.n_seq_max = 1, .n_ctx = 16, .n_batch = 8};
    static float logits[3 * 512];
    /* a per-layer table of 256 rows under a vocabulary of 512 */
    static uint16_t zeros[256 * 128];
    snprintf(name, sizeof name, "model.language_model.embed_tokens_per_layer.weight");
    g4_tensor ple = {.name = name, .dtype = G4_BF16, .ndim = 2, .shape = {256, 128}, .data = zeros, .nbytes = sizeof zeros};
    resave_edit ed = {.extra = &ple, .n_extra = 1};
    CHECK(resave(src, dir, 1, 0, &ed) == 0);
    CHECK(edit_config(dir, "\"vocab_size_per_layer_input\": 512", "\"vocab_size_per_layer_input\": 256") == 0);
    g4_model *m = load_expect("per-layer table of 256 rows", dir, NULL);
    g4_context *ctx;
    if (m && g4_context_new(m, &cp, &ctx, &err) == 0) {
        int32_t ok[3] = {2, 17, 255}, bad[3] = {2, 17, 400};
        g4_batch b = {.n_tokens = 3, .token = ok};
        CHECKF(g4_decode(ctx, &b, logits, &err) == 0, "%s", err.msg);
        g4_seq_reset(ctx, 0);
        b.token = bad;
        CHECK(g4_decode(ctx, &b, logits, &err) != 0);
        CHECKF(strstr(err.msg, "batch row 2: token id 400 is outside the per-layer embedding table "
                               "(vocab_size_per_layer_input 256)"), "%s", err.msg);
        g4_context_free(ctx);
        /* under a scheduler such a prompt is refused alone, not in a step with others */
        scheduled_alone("per-layer table", m, bad, ok, "prompt token 2: token id 400 is outside the per-layer");
    }
    g4_model_free(m);
    /* pad_token_id outside the vocabulary, and -1 (refused at load before) */
    static const struct {
        const char *to, *want;
    } pads[] = {{"\"pad_token_id\": 100000", "pad_token_id 100000 is outside the vocabulary (0..511)"},
                {"\"pad_token_id\": -1", "no pad_token_id (null or negative)"},
                {"\"pad_token_id\": null", "no pad_token_id (null or negative)"}};
    for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++) {
        CHECK(resave(src, dir, 1, 0, NULL) == 0);
        CHECK(edit_config(dir, "\"pad_token_id\": 0", pads[i].to) == 0);
        m = load_expect(pads[i].to, dir, NULL);
        if (!m || g4_context_new(m, &cp, &ctx, &err)) {
            g4_model_free(m);
            continue;
        }
        int32_t text[3] = {2, 17, 99}, image[3] = {2, 500, 17}; /* 500: the fixture's image_token_id */
        g4_batch b = {.n_tokens = 3, .token = text};
        CHECKF(g4_decode(ctx, &b, logits, &err) == 0, "%s: text: %s", pads[i].to, err.msg);
        g4_seq_reset(ctx, 0);
        b.token = image;
        CHECK(g4_decode(ctx, &b, logits, &err) != 0);
        CHECKF(strstr(err.msg, pads[i].want), "%s: '%s' lacks '%s'", pads[i].to, err.msg, pads[i].want);
        g4_context_free(ctx);
        scheduled_alone(pads[i].to, m, image, text, pads[i].want);
        g4_model_free(m);
    }
}

/* Sizes a config may give (each up to 1e9) that no machine holds: random weights (bench --random) and random
 * checkpoints (quantize --random) are made from the config alone, so the config is all that stops them. Made
 * weights that cannot fit memory, or an output larger than its disk's free space, are refused before anything
 * is allocated or written (they were allocated and filled until the OOM killer, or a 353 GB file was written
 * until the disk was full). 256 layers of hidden size 1e7: about 6 TB in BF16. */
static void test_huge_random(void) {
    char cfg[4096], out[4096];
    snprintf(cfg, sizeof cfg, "%s", g4t_tmp("huge-config.json"));
    CHECK(write_text(cfg, "{\"model_type\": \"gemma4_text\", \"vocab_size\": 512, \"hidden_size\": 10000000, "
                          "\"num_hidden_layers\": 256, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, "
                          "\"head_dim\": 32, \"global_head_dim\": 32, \"intermediate_size\": 256, "
                          "\"hidden_size_per_layer_input\": 0}") == 0);
    g4_model *m = NULL;
    g4_error err = {{0}};
    g4_load_params lp = {.n_threads = 1, .random_weights = 1, .device = "cpu"};
    int rc = g4_model_load(cfg, &lp, &m, &err);
    CHECKF(rc != 0 && strstr(err.msg, "random weights of this config need") && strstr(err.msg, "GB of memory"),
           "random model: rc %d '%s'", rc, rc ? err.msg : "");
    if (!rc) g4_model_free(m);
    static const char *types[] = {"q8_0", "mlx4", "bf16"};
    for (int i = 0; i < 3; i++) {
        snprintf(out, sizeof out, "%s%s", g4t_tmp("huge-out"), i ? "" : ".gguf");
        char file[4200];
        snprintf(file, sizeof file, "%s%s", out, i ? "/model.safetensors" : "");
        remove(file); /* left by an earlier run */
        g4_quantize_params qp = {.random_config = cfg, .out = out, .type = types[i]};
        rc = g4_quantize(&qp, &err);
        CHECKF(rc != 0 && strstr(err.msg, "the output needs") && strstr(err.msg, "GB free"), "quantize %s: rc %d '%s'",
               types[i], rc, rc ? err.msg : "");
        struct stat st;
        CHECKF(stat(file, &st) != 0, "quantize %s left %s", types[i], file);
    }
}

int main(void) {
    test_spellings();
    test_nulls();
    test_token_tables();
    test_huge_random();
    test_real_configs();
    test_rope_tables();
    test_bad_folders();
    test_config_mismatch();
    test_towers();
    test_generation_config_warnings();
    test_nan_weights();
    test_gguf_towers();
    return g4t_done();
}
