/* Gemma 4 configuration: config.json of Gemma4ForConditionalGeneration (model_type
 * "gemma4", text fields under "text_config"), Gemma4ForCausalLM ("gemma4_text") or
 * Gemma4UnifiedForConditionalGeneration ("gemma4_unified", docs/gemma4-unified.md 1),
 * in both spellings (global_head_dim / per_layer_config), resolved per layer
 * (docs/gemma4-text.md section 1). */
#ifndef G4_MODEL_CONFIG_H
#define G4_MODEL_CONFIG_H

#include "gemma4c.h"

#define G4_MAX_LAYERS 256

typedef enum { G4_LAYER_SLIDING = 0, G4_LAYER_FULL = 1, G4_LAYER_TYPES = 2 } g4_layer_type;
typedef enum { G4_ROPE_DEFAULT = 0, G4_ROPE_PROPORTIONAL = 1 } g4_rope_type;

typedef struct g4_rope_config {
    g4_rope_type type;
    double theta;
    double partial_rotary_factor; /* proportional only (default 1.0) */
    double factor;                /* proportional only (default 1.0) */
} g4_rope_config;

typedef struct g4_text_config {
    int vocab_size, hidden_size, intermediate_size, n_layers, n_heads;
    int n_kv_heads, head_dim; /* the global values; per layer below */
    double rms_norm_eps;
    int sliding_window;
    int has_softcap;
    double final_logit_softcapping;
    int bidirectional_vision; /* use_bidirectional_attention == "vision" */
    int vocab_size_per_layer_input, hidden_size_per_layer_input; /* PLE: P > 0 */
    int attention_k_eq_v, num_kv_shared_layers, enable_moe_block, use_double_wide_mlp;
    int num_experts, top_k_experts, moe_intermediate_size;
    int attention_bias, tie_word_embeddings;
    int pad_token_id, bos_token_id, eos_token_id;
    int max_position_embeddings;
    g4_rope_config rope[G4_LAYER_TYPES];
    /* per layer, resolved */
    g4_layer_type layer_type[G4_MAX_LAYERS];
    int layer_head_dim[G4_MAX_LAYERS];
    int layer_kv_heads[G4_MAX_LAYERS];
    int layer_intermediate[G4_MAX_LAYERS];
    int layer_kv_shared[G4_MAX_LAYERS]; /* reads another layer's K/V */
    int layer_kv_source[G4_MAX_LAYERS]; /* layer whose K/V it attends with (itself if not shared) */
    int layer_k_eq_v[G4_MAX_LAYERS];    /* V comes from k_proj (no v_proj) */
    int type_head_dim[G4_LAYER_TYPES];  /* 0 if no layer has the type */
} g4_text_config;

/* vision_config of Gemma4ForConditionalGeneration (docs/gemma4-towers.md 1): transformers' class defaults
 * where a key is absent. */
typedef struct g4_vision_config {
    int hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim;
    double rms_norm_eps, rope_theta;
    int patch_size, pooling_kernel, position_embedding_size;
    int use_clipped_linears, standardize;
} g4_vision_config;

/* A gemma4_assistant checkpoint (a drafter for speculative decoding, docs/gemma4-assistant.md 1.1): its decoder
 * is `text`, every layer of which reads the main model's K/V (layer_kv_shared = 1, no K/V projections). */
typedef struct g4_assistant_config {
    int backbone_hidden_size;   /* Hb: the main model's hidden_size */
    int use_ordered_embeddings; /* logits through the centroid masked embedder */
    int num_centroids, centroid_top_k;
} g4_assistant_config;

/* The encoder-free embedders of gemma4_unified (docs/gemma4-unified.md 1, 4, 5). */
typedef struct g4_unified_config {
    int block;                         /* model_patch_size: 48-pixel blocks, one soft token each */
    int mm_embed_dim, output_proj_dims; /* the image embedder's width (equal) */
    int mm_posemb_size;                /* rows of the factorized position table [pos, 2, mm_embed_dim] */
    double vision_eps;                 /* the pre-projection RMSNorm (the LayerNorms use 1e-5) */
    int audio_samples;                 /* audio_embed_dim: samples per audio token (640 = 40 ms) */
    int sampling_rate;                 /* the feature extractor's (processor config), set when the model loads */
    double audio_eps;
} g4_unified_config;

typedef struct g4_model_config {
    char model_type[32];       /* "gemma4", "gemma4_text" or "gemma4_assistant" */
    char weight_prefix[64];    /* "model.language_model." or "model." */
    int multimodal_wrapper;    /* Gemma4ForConditionalGeneration layout */
    int has_vision, has_audio; /* vision_config / audio_config present */
    int image_token_id, audio_token_id, video_token_id, boi_token_id, eoi_token_id, boa_token_id,
        eoa_token_id;
    g4_text_config text;
    g4_vision_config vision;   /* when has_vision */
    int assistant;             /* model_type "gemma4_assistant" */
    int unified;               /* model_type "gemma4_unified": images and audio through `uni`'s embedders */
    g4_unified_config uni;
    g4_assistant_config asst;
} g4_model_config;

/* Reads DIR/config.json. Unknown model types and invalid geometry are errors. */
int g4_config_load(const char *dir, g4_model_config *cfg, g4_error *err);
/* Parses an already loaded config object (for tests); `what` names it in errors. */
struct json_t;
int g4_config_parse(const struct json_t *root, const char *what, g4_model_config *cfg, g4_error *err);

#endif
