/* The paged KV cache, by layer type (docs/gemma4-text.md section 4; docs/architecture.md, "The KV cache knows
 * layer types, and is paged").
 *
 * Positions of a sequence are grouped in blocks of `block` rows. Each layer type (sliding, full) has one pool
 * of physical blocks; every non-shared layer of that type has K and V storage [n_blocks][block][row] in backend
 * memory, and one physical block id means the same positions in every layer of the type, so a sequence has one
 * block table per layer type: logical block b (positions b*block .. b*block+block-1) -> physical block or -1.
 *
 * - Full-attention layers take blocks as a sequence grows and keep them.
 * - Sliding layers: a step whose first position for a sequence is p0 reads positions >= p0 - W + 1 (W the
 *   window). A sequence keeps the rows a step starting up to n_batch positions before its end would read (so
 *   that it can be rolled back by n_batch positions, e.g. to reuse a chat prefix): before a step that ends
 *   at p1, blocks wholly below p1 - n_batch - W + 1 are returned to the pool. A sequence thus holds at most
 *   W - 1 + n_batch rows, ceil((W - 1 + n_batch) / block) + 1 sliding blocks.
 * - KV-shared layers own nothing: they read their source layer's storage through the same table, which still
 *   holds exactly the rows the source attended with in the same step.
 * - Blocks are reference-counted, so sequences can share a prefix's blocks; a step that would write into a
 *   shared block first copies it (copy on write).
 *
 * The host keeps the tables; a step copies them to backend memory when they changed, with the per-token write
 * slots of the step (kv_cache_prepare). */
#ifndef G4_ENGINE_KV_CACHE_H
#define G4_ENGINE_KV_CACHE_H

#include "backend/backend.h"
#include "model/config.h"

typedef struct g4_kv_layer {
    int owner;        /* layer whose storage this layer reads (itself unless KV-shared) */
    int type;         /* G4_LAYER_SLIDING or G4_LAYER_FULL: which pool and table */
    int row;          /* elements per row: kv_heads * head_dim */
    int window;       /* 0 for full attention */
    void *k, *v;      /* [n_blocks][block][row] of the KV type in backend memory (the owner's, for shared layers) */
} g4_kv_layer;

typedef struct g4_kv_pool {
    int used;          /* some layer has this type */
    int n_blocks;      /* physical blocks */
    int max_blocks;    /* logical blocks per sequence: ceil(n_ctx / block) */
    int n_free;
    int32_t *free_ids; /* stack of free physical blocks [n_blocks] */
    int32_t *ref;      /* [n_blocks] sequences holding each block */
    int32_t *table;    /* host [n_seq][max_blocks], -1 where none */
    int32_t *table_dev;/* backend copy of table */
    int32_t *slot_dev; /* [n_batch] write slot of each token of the step */
    int32_t *slot;     /* host [n_batch] */
    int dirty;         /* table changed since the last copy */
} g4_kv_pool;

typedef struct g4_kv_cache {
    int n_layers, n_seq, n_ctx, n_batch, block;
    int window;       /* sliding window W (0 when no layer slides) */
    g4_kv_type type;
    g4_kv_layer *layers;
    g4_kv_pool pool[G4_LAYER_TYPES];
    int *seq_len;     /* positions processed per sequence */
    size_t bytes;     /* backend memory held by K/V storage */
    g4_backend *be;
} g4_kv_cache;

/* n_full_blocks: blocks of the full-attention pool, 0 for "every sequence can reach n_ctx". */
int g4_kv_cache_init(g4_kv_cache *kv, const g4_text_config *c, g4_backend *be, int n_seq, int n_ctx, int n_batch,
                     g4_kv_type type, int block, int n_full_blocks, g4_error *err);
void g4_kv_cache_free(g4_kv_cache *kv);

/* Before a step: for each sequence s with add[s] > 0 new positions seq_len[s] .. seq_len[s]+add[s]-1, releases
 * sliding blocks it no longer keeps, takes blocks for the new positions (copying shared blocks it writes
 * into), fills the per-type write slots of the step's tokens (seq[i], pos[i], i < n) and copies tables and slots
 * to backend memory. Fails with nothing taken when a pool has too few free blocks. */
int g4_kv_cache_prepare(g4_kv_cache *kv, const int *add, int n, const int32_t *seq, const int32_t *pos,
                        g4_error *err);

/* Drops sequence s's blocks at and after position n (keeps 0..n-1); for n == 0 all of them. */
void g4_kv_cache_drop(g4_kv_cache *kv, int s, int n);

/* 1 when sequence s still holds every row a step starting at position n would read (roll-back check). */
int g4_kv_cache_can_resume(const g4_kv_cache *kv, int s, int n);

/* Makes sequence dst share the blocks of src's positions 0..n-1 (full blocks and a partial last block alike;
 * a later write into a shared block copies it first). dst must be empty. Fails when src does not hold them
 * (sliding blocks already released). */
int g4_kv_cache_share(g4_kv_cache *kv, int dst, int src, int n, g4_error *err);

#endif
