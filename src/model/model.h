/* A loaded Gemma 4 text model: configuration, weights bound by the architecture,
 * and the backend that runs it. */
#ifndef G4_MODEL_MODEL_H
#define G4_MODEL_MODEL_H

#include <pthread.h>

#include "backend/backend.h"
#include "formats/tensor_set.h"
#include "model/config.h"
#include "model/generation_config.h"

/* A weight matrix the backend reads directly (a view into the checkpoint). */
typedef g4_tensor g4_weight;

typedef struct g4_layer {
    /* attention */
    const g4_weight *q_proj, *k_proj, *v_proj, *o_proj; /* k/v NULL on KV-shared layers; v NULL on k_eq_v */
    /* vectors live in backend memory */
    const float *q_bias, *k_bias, *v_bias, *o_bias;     /* attention_bias only */
    const float *q_norm, *k_norm;                       /* [D] */
    const float *input_norm, *post_attn_norm, *pre_ff_norm, *post_ff_norm; /* [H] */
    float layer_scalar;
    /* dense MLP */
    const g4_weight *gate_proj, *up_proj, *down_proj;
    /* per-layer embeddings (PLE) */
    const g4_weight *ple_gate, *ple_proj; /* [P, H], [H, P] */
    const float *ple_post_norm;           /* [H] */
    /* mixture of experts */
    const g4_weight *router_proj, *experts_gate_up, *experts_down;
    const g4_weight *experts_up; /* NULL: experts_gate_up holds gate then up; else gate and up apart */
    const float *router_scale, *per_expert_scale, *pre_ff_norm2, *post_ff_norm1, *post_ff_norm2;
} g4_layer;

/* A bound vector: its f32 host copy and the field that points at the copy the backend reads. */
typedef struct g4_vec_slot {
    float *host;
    size_t n;
    const float **field;
} g4_vec_slot;

/* The encoder-free embedders of gemma4_unified (docs/gemma4-unified.md 4, 5; src/towers/unified.c). */
typedef struct g4_unified_weights {
    const float *ln1_w, *ln1_b;   /* patch_ln1 [3 * block^2] */
    const g4_weight *dense;       /* patch_dense [E, 3 * block^2] */
    const float *dense_b;         /* [E] */
    const float *ln2_w, *ln2_b;   /* patch_ln2 [E] */
    g4_weight pos_table;          /* pos_embedding [mm_posemb_size, 2, E] viewed as [2 * mm_posemb_size, E]:
                                   * row 2 * p + axis (the embed op reads rows below shape[0] only) */
    const float *pos_w, *pos_b;   /* pos_norm [E] */
    const g4_weight *image_proj;  /* embed_vision embedding_projection [H, E] */
    const g4_weight *audio_proj;  /* embed_audio embedding_projection [H, audio_samples] */
} g4_unified_weights;

struct g4_model {
    g4_model_config cfg;
    g4_tensor_set weights;           /* host views of the checkpoint's tensors */
    g4_backend *be;
    g4_tensor *placed;               /* [weights.n_tensors]: the backend's copy of each bound matrix */
    unsigned char *uploaded;         /* [weights.n_tensors]: placed[i] was made by upload_weight */
    int ple_on_host;                 /* ple_embed is a host view, gathered per step on the host */
    const g4_weight *embed;          /* [V, H] */
    const g4_weight *lm_head;        /* == embed when tied */
    const g4_weight *ple_embed;      /* [Vp, L*P] (host view when ple_on_host) */
    const g4_weight *ple_model_proj; /* [L*P, H] */
    const float *ple_proj_norm;      /* [P] */
    const float *final_norm;         /* [H] */
    g4_layer *layers;
    struct g4_vision *vision;        /* NULL without vision_config (src/towers/vision.c) */
    struct g4_audio_tower *audio;    /* NULL without audio_config (src/towers/audio_tower.c) */
    /* one job at a time on the backend (its thread pool and scratch serve one caller): a batch step of any of
     * the model's contexts (g4_decode), a drafter's round, an image or audio clip through a tower. Recursive. */
    pthread_mutex_t backend_lock;
    float *inv_freq[G4_LAYER_TYPES]; /* [head_dim/2] per layer type (backend memory) */
    float embed_scale;               /* fp32(sqrt(H)) */
    g4_vec_slot *vecs;               /* small vectors (norm weights, scales) as bound */
    int n_vecs;
    float *vec_arena;                /* their backend copies (NULL on a host-memory backend) */
    int random;                      /* random weights: no files (g4_load_params.random_weights) */
    g4_dtype random_type;            /* their matrices' type (g4_load_params.random_type) */
    g4_tensor **made;                /* random mode: tensors made by the binder, then their placed copies */
    int n_made;
    void *host_table;                /* random mode: the host-kept per-layer embedding table */
    char *warnings;                  /* NULL or lines ending in '\n' */
    struct json_t *gguf_meta;        /* metadata of a .gguf model (tokenizer), else NULL */
    struct json_t *mmproj_audio;     /* a GGUF model's projector file with an audio tower: its audio_config */
    char mmproj_path[4096];          /* that projector file (messages) */
    /* beside the weights (model_files.c) */
    g4_tokenizer *tok;               /* NULL when there is none (tokenizer.json, or a GGUF file's metadata) */
    void *constrain;                 /* constrained decoding's tables (the tokens in byte order, json_object's
                                        grammar), made by the first generation that needs them (engine/generation.c),
                                        freed with the model by constrain_free */
    void (*constrain_free)(void *);
    g4_chat_template *chat_template; /* NULL when it has no chat template */
    char *chat_template_error;       /* why a template it has cannot be used, or NULL */
    g4_generation_config gen_config;
    char dir[1024];
    int borrowed_be;                 /* be belongs to another model (a drafter runs on its main model's) */
    /* gemma4_assistant only (docs/gemma4-assistant.md 2); `embed` is its output head Ea */
    const g4_weight *pre_projection;  /* [Ha, 2*Hb] */
    const g4_weight *post_projection; /* [Hb, Ha] */
    const g4_weight *centroids;       /* [num_centroids, Ha] (use_ordered_embeddings) */
    int32_t *token_ordering;          /* [V] backend memory (use_ordered_embeddings) */
    g4_unified_weights uni;           /* gemma4_unified only */
};

/* The binder (model.c) as the towers use it while the model loads: each tower binds its weights through it
 * (src/towers/), so that their matrices are placed with upload_weight and their vectors live in the model's
 * vector block in backend memory, like the decoder's. Names are full tensor names. A tensor that is absent
 * is recorded (the load then fails listing every missing tensor) and gives NULL; a wrong shape or dtype is a
 * hard error. */
typedef struct g4_binder g4_binder;
/* A matrix of any rank the ops read: the backend's copy. */
const g4_tensor *g4_bind_matrix(g4_binder *b, const char *name, int ndim, const int64_t *shape);
/* The same, placed as the matrix [shape[0], product of the other dimensions] (convolution kernels read as one
 * product): a view reshaped after placing would not match a backend's row layout. */
const g4_tensor *g4_bind_matrix_flat(g4_binder *b, const char *name, int ndim, const int64_t *shape);
/* A small tensor converted to f32: returns the host copy (valid while the model lives); *field points at
 * the backend's copy once binding is done (field NULL: the host copy is all there is). */
const float *g4_bind_vector(g4_binder *b, const char *name, int ndim, const int64_t *shape, const float **field);
/* A scalar tensor (shape [] or [1]); 0 when absent. */
float g4_bind_scalar(g4_binder *b, const char *name);
/* A scalar buffer a checkpoint may leave out: transformers then keeps the value the module was made with (the
 * clip bounds of Gemma4ClippableLinear: -inf / +inf, _init_weights). absent_value when it is not in the weights,
 * counted in *n_absent. */
float g4_bind_scalar_or(g4_binder *b, const char *name, float absent_value, int *n_absent);
/* The one load warning for the n_absent clip bounds of a tower ("vision", "audio") g4_bind_scalar_or left unbounded
 * (nothing when none). */
void g4_warn_clip_bounds_absent(g4_model *m, const char *tower, int n_absent);
/* A vector the tower computes (n floats to fill now, on the host), placed with the others into *field. */
float *g4_bind_computed(g4_binder *b, size_t n, const float **field);
/* 1 once binding has hit a hard error (later calls do nothing). */
int g4_bind_failed(const g4_binder *b);

/* Loads a gemma4_assistant checkpoint (a drafter) onto the backend of another model, which must outlive it
 * (g4_model_load refuses assistant checkpoints). */
int g4_model_load_assistant(const char *dir, g4_backend *be, g4_model **out, g4_error *err);
/* A main model or a drafter, whichever the folder or file holds (quantize reads both). */
int g4_model_load_either(const char *dir, const g4_load_params *params, g4_model **out, g4_error *err);

/* Inverse RoPE frequencies of a layer type (docs/gemma4-text.md 3.3); out has head_dim/2 floats. */
void g4_rope_inv_freq(const g4_rope_config *rc, int head_dim, float *out);

/* Every weight the architecture of cfg binds, in binding order: full names, shapes,
 * dtype BF16, no data (for writers and random checkpoints). Experts are listed fused
 * (experts.gate_up_proj) unless `have` holds them as experts.gate_proj / up_proj. The
 * caller frees each name and the list. */
int g4_model_tensor_list(const g4_model_config *cfg, const g4_tensor_set *have, g4_tensor **list, int *n,
                         g4_error *err);

/* What the folder holds beside the weights: tokenizer, chat template, generation_config.json
 * (model_files.c); g4_model_load reads them first. */
int g4_model_load_files(g4_model *m, const char *dir, g4_error *err);
void g4_model_free_files(g4_model *m);

#endif
