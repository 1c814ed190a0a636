/* The paged KV cache, by layer type, with a prefix cache (docs/gemma4-text.md sections 3.5 and 4;
 * docs/architecture.md, "The KV cache knows layer types, and is paged").
 *
 * Positions of a sequence are grouped in blocks of `block` rows. Each layer type (sliding, full) has one pool
 * of physical blocks; every non-shared layer of that type has K and V storage [n_blocks][block][row] in backend
 * memory, and one physical block id means the same positions in every layer of the type, so a sequence has one
 * block table per layer type: logical block b (positions b*block .. b*block+block-1) -> physical block or -1.
 *
 * - Full-attention layers take blocks as a sequence grows and keep them.
 * - Sliding layers: a step whose first position for a sequence is p0 reads positions >= p0 - W + 1 (W the
 *   window). A sequence also keeps `history` positions of rows for roll-backs (g4_seq_truncate, reusing a chat
 *   prefix): before a step that adds positions p0 .. p1-1, blocks wholly below min(p0, p1 - history) - W + 1 are
 *   returned to the pool (p1 less the step's tentative positions, see below). With history = n_batch (the default) a sequence can always be rolled back by n_batch
 *   positions; a scheduler that never rolls back uses 0, so many sequences hold only their windows.
 * - KV-shared layers own nothing: they read their source layer's storage through the same table, which still
 *   holds exactly the rows the source attended with in the same step.
 * - Blocks are reference-counted, so sequences can share a prefix's blocks; a step that would write into a
 *   shared block first copies it (copy on write).
 *
 * Prefix cache. Once a logical block of a sequence is full (all its positions processed), it gets a content
 * hash chained over the sequence's blocks: h(b) = H(h(b-1), the block's token ids), so equal hashes mean equal
 * prefixes up to the block's end (the K/V of a position depend on the tokens up to it and on nothing else). The
 * physical blocks that hold it (one per pool) are entered in that pool's table hash -> block, with the block's
 * tokens and parent hash, which a lookup compares too (a false hit needs a 64-bit collision of a parent chain).
 * A hashed block is immutable: it is never written again while hashed (a sequence rolled back into one drops
 * the hash before writing; a shared one is copied). When its last holder lets it go, a hashed block stays in
 * the table as a cached free block: it counts as free, is handed out only after every block that holds no
 * cached content, least recently freed first (LRU eviction; eviction drops the hash), and a lookup can take it
 * back. So nothing outside a sequence holds a reference: the cache is exactly the free blocks not yet reused.
 *
 * Which positions can be reused: a request for tokens t0..tn-1 can start at position k*block (k whole blocks)
 * when the full pool holds every block 0..k-1 of that prefix and the sliding pool holds the blocks covering
 * positions max(0, k*block - W + 1) .. k*block - 1 (what the next position's sliding attention reads); sliding
 * blocks below those are not needed, so a prefix longer than the window is reusable although its early sliding
 * blocks were recycled. Partial blocks are never reused (their rows are still being written by their owner).
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
    int n_free;        /* free blocks: plain ones plus cached ones */
    int n_plain;       /* free blocks holding no cached content: the stack free_ids[0 .. n_plain-1] */
    int32_t *free_ids; /* [n_blocks] */
    int32_t *ref;      /* [n_blocks] sequences holding each block */
    int32_t *table;    /* host [n_seq][max_blocks], -1 where none */
    int32_t *table_dev;/* backend copy of table */
    int32_t *slot_dev; /* [n_batch] write slot of each token of the step */
    int32_t *slot;     /* host [n_batch] */
    int dirty;         /* table changed since the last copy */
    /* prefix cache */
    uint8_t *hashed;   /* [n_blocks] 1 when the block is in the hash table */
    uint64_t *hash;    /* [n_blocks] its chained content hash */
    uint64_t *parent;  /* [n_blocks] the hash of the block before it in its sequence (0 for block 0) */
    int32_t *tokens;   /* [n_blocks][block] its token ids */
    int32_t *bucket;   /* [n_buckets] first block of each hash bucket, -1 */
    int32_t *chain;    /* [n_blocks] next block in the same bucket */
    int n_buckets;     /* a power of two */
    int32_t *lru_prev, *lru_next; /* [n_blocks] cached free blocks, least recently freed first */
    int32_t lru_head, lru_tail;   /* -1 when none */
} g4_kv_pool;

typedef struct g4_kv_cache {
    int n_layers, n_seq, n_ctx, n_batch, block;
    int max_blocks;   /* logical blocks per sequence: ceil(n_ctx / block) */
    int window;       /* sliding window W (0 when no layer slides) */
    int history;      /* sliding positions kept for roll-backs (see above) */
    int tentative;    /* positions at the end of the next step that will likely be rolled back (a speculative
                         verification's drafts): that step releases sliding blocks as one ending before them
                         would, so that after the roll-back the sequence holds what a plain run's would */
    g4_kv_type type;
    g4_kv_layer *layers;
    g4_kv_pool pool[G4_LAYER_TYPES];
    int *seq_len;     /* positions processed per sequence */
    uint64_t *seq_hash; /* [n_seq][max_blocks] chained hash of each full block of each sequence */
    int *seq_hashed;  /* [n_seq] leading blocks of each sequence whose seq_hash is set */
    uint64_t *lookup; /* [max_blocks] scratch of g4_kv_cache_lookup */
    size_t bytes;     /* backend memory held by K/V storage */
    g4_backend *be;
} g4_kv_cache;

/* n_full_blocks: blocks of the full-attention pool, 0 for "every sequence can reach n_ctx". history < 0: n_batch.
 * n_sliding_blocks: blocks of the sliding pool (at least what one sequence's window and history span, else an
 * error), 0 for enough for every sequence's window plus history, one batch
 * of new rows, and a window per sequence more for the prefix cache. */
int g4_kv_cache_init(g4_kv_cache *kv, const g4_text_config *c, g4_backend *be, int n_seq, int n_ctx, int n_batch,
                     int history, g4_kv_type type, int block, int n_full_blocks, int n_sliding_blocks,
                     g4_error *err);
void g4_kv_cache_free(g4_kv_cache *kv);
/* The bytes g4_kv_cache_init would allocate for the keys and values with these arguments (SIZE_MAX when they
 * overflow). */
size_t g4_kv_cache_bytes(const g4_text_config *c, int n_seq, int n_ctx, int n_batch, int history, g4_kv_type type,
                         int block, int n_full_blocks, int n_sliding_blocks);

/* Blocks of pool t that sequence s adding `add` positions would take, less those it would release (plain
 * count per pool; both may be negative). */
void g4_kv_cache_cost(const g4_kv_cache *kv, int s, int add, int cost[G4_LAYER_TYPES]);

/* Before a step: for each sequence s with add[s] > 0 new positions seq_len[s] .. seq_len[s]+add[s]-1, releases
 * sliding blocks it no longer keeps, takes blocks for the new positions (copying shared blocks it writes
 * into), fills the per-type write slots of the step's tokens (seq[i], pos[i], i < n) and copies tables and slots
 * to backend memory. Fails with nothing taken when a pool has too few free blocks. */
int g4_kv_cache_prepare(g4_kv_cache *kv, const int *add, int n, const int32_t *seq, const int32_t *pos,
                        g4_error *err);

/* After a step: sequence s now holds positions 0..n-1 with ids tokens[0..n-1]; hashes the blocks that became
 * full and enters them in the prefix cache (a block whose hash is already there stays out of it). A block with a
 * negative id (a soft token: rows fed as embeddings) is never cached, and neither is any block after it. */
void g4_kv_cache_commit(g4_kv_cache *kv, int s, const int32_t *tokens, int n);

/* Drops sequence s's blocks at and after position n (keeps 0..n-1); for n == 0 all of them. Hashed blocks that
 * no sequence holds any more stay cached. */
void g4_kv_cache_drop(g4_kv_cache *kv, int s, int n);

/* 1 when sequence s still holds every row a step starting at position n would read (roll-back check). */
int g4_kv_cache_can_resume(const g4_kv_cache *kv, int s, int n);

/* Makes sequence dst share the blocks of src's positions 0..n-1 (full blocks and a partial last block alike;
 * a later write into a shared block copies it first). dst must be empty. Fails when src does not hold them
 * (sliding blocks already released). */
int g4_kv_cache_share(g4_kv_cache *kv, int dst, int src, int n, g4_error *err);

/* The longest prefix of tokens[0..n-1] the prefix cache can resume from: a multiple of the block size (see
 * "Which positions can be reused" above), 0 when none. */
int g4_kv_cache_lookup(g4_kv_cache *kv, const int32_t *tokens, int n);

/* Makes the empty sequence s start with the longest cached prefix of tokens[0..n-1] (g4_kv_cache_lookup): it
 * takes references on those blocks (cached free blocks leave the free list). Returns the positions it now
 * holds. */
int g4_kv_cache_reuse(g4_kv_cache *kv, int s, const int32_t *tokens, int n);

#endif
