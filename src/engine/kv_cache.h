/* The KV cache, by layer type (docs/gemma4-text.md section 4).
 *
 * Every non-shared layer owns K and V storage per sequence: full-attention layers
 * keep one row per position (capacity n_ctx); sliding layers keep a ring of
 * W - 1 + n_batch rows, enough to hold every row a step attends with (the W - 1
 * rows before the step plus the step's own rows), so rows are written before
 * attention and nothing is overwritten while it can still be read. The row of
 * position p is slot p % cap; a row's position follows from the sequence length.
 * KV-shared layers own nothing: they read their source layer's storage, which still
 * holds exactly the rows the source attended with in the same step. */
#ifndef G4_ENGINE_KV_CACHE_H
#define G4_ENGINE_KV_CACHE_H

#include "backend/backend.h"
#include "model/config.h"

typedef struct g4_kv_layer {
    int owner;        /* layer whose storage this layer reads (itself unless KV-shared) */
    int cap;          /* rows per sequence */
    int row;          /* floats per row: kv_heads * head_dim */
    int window;       /* 0 for full attention */
    float *k, *v;     /* [n_seq][cap][row] in backend memory (NULL for shared layers) */
    float **k_base;   /* per sequence: start of its rows (host array of backend pointers) */
    float **v_base;
} g4_kv_layer;

typedef struct g4_kv_cache {
    int n_layers, n_seq, n_ctx, n_batch;
    g4_kv_layer *layers;
    int *seq_len;     /* positions processed per sequence */
    size_t bytes;     /* backend memory held */
    g4_backend *be;
} g4_kv_cache;

int g4_kv_cache_init(g4_kv_cache *kv, const g4_text_config *c, g4_backend *be, int n_seq, int n_ctx, int n_batch,
                     g4_error *err);
void g4_kv_cache_free(g4_kv_cache *kv);

#endif
