/* The paged KV cache (see kv_cache.h for the layout and the rules). */
#include "engine/kv_cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

/* Sliding blocks of the pool: each sequence holds at most W - 1 + history rows between steps, plus one block of
 * slack for alignment and one being filled; a step adds at most n_batch rows over all sequences; and as much
 * again as the sequences' windows, so that the windows of recently finished sequences can stay in the prefix
 * cache (a later request resumes from a prefix only where the window before its end is cached). */
static int sliding_blocks(const g4_kv_cache *kv, int window) {
    long per_seq = ceil_div((long)window - 1 + kv->history, kv->block) + 2;
    long cached = ceil_div((long)window - 1, kv->block) + 1;
    long max = kv->max_blocks;
    long n = (long)kv->n_seq * ((per_seq < max ? per_seq : max) + (cached < max ? cached : max)) +
             ceil_div(kv->n_batch, kv->block);
    return n < (long)kv->n_seq * max ? (int)n : (int)((long)kv->n_seq * max);
}

/* The blocks of pool t (kv's n_seq, n_batch, history, block and max_blocks set). */
static int pool_blocks(const g4_kv_cache *kv, const g4_text_config *c, int t, int n_full_blocks,
                       int n_sliding_blocks) {
    if (t == G4_LAYER_SLIDING) return n_sliding_blocks > 0 ? n_sliding_blocks : sliding_blocks(kv, c->sliding_window);
    return n_full_blocks > 0 ? n_full_blocks : kv->n_seq * kv->max_blocks;
}

/* Bytes of a layer's keys or values in a pool of n_blocks (0 when it overflows). */
static size_t layer_bytes(long n_blocks, int block, int row, size_t esz) {
    size_t n;
    if (!g4_mul_ok((size_t)n_blocks, (size_t)block, &n) || !g4_mul_ok(n, (size_t)row, &n) || !g4_mul_ok(n, esz, &n))
        return 0;
    return n;
}

size_t g4_kv_cache_bytes(const g4_text_config *c, int n_seq, int n_ctx, int n_batch, int history, g4_kv_type type,
                         int block, int n_full_blocks, int n_sliding_blocks) {
    g4_kv_cache kv = {.n_seq = n_seq, .n_batch = n_batch, .history = history < 0 ? n_batch : history,
                      .block = block, .max_blocks = ceil_div(n_ctx, block)};
    size_t bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kv_source[l] != l) continue; /* shared */
        const int t = c->layer_type[l];
        const size_t n = layer_bytes(pool_blocks(&kv, c, t, n_full_blocks, n_sliding_blocks), block,
                                     c->layer_kv_heads[l] * c->layer_head_dim[l], g4_kv_type_size(type));
        if (!n || bytes + 2 * n < bytes) return SIZE_MAX;
        bytes += 2 * n;
    }
    return bytes;
}

int g4_kv_cache_init(g4_kv_cache *kv, const g4_text_config *c, g4_backend *be, int n_seq, int n_ctx, int n_batch,
                     int history, g4_kv_type type, int block, int n_full_blocks, int n_sliding_blocks,
                     g4_error *err) {
    memset(kv, 0, sizeof *kv);
    if (n_sliding_blocks > 0) { /* a sequence's step reads its window (and keeps its history): fewer blocks than
                                 * that and no step of any sequence fits (the scheduler ended every request with
                                 * LENGTH, often with no token) */
        int sliding = 0;
        for (int l = 0; l < c->n_layers; l++) sliding |= c->layer_type[l] == G4_LAYER_SLIDING;
        const int h = history < 0 ? n_batch : history;
        const long rows = (long)c->sliding_window - 1 + (h > 0 ? h : 1), most = ceil_div(n_ctx, block);
        long least = ceil_div(rows - 1, block) + 1;
        if (least > most) least = most;
        if (sliding && n_sliding_blocks < least)
            return g4_fail(err, "%d sliding-window KV blocks cannot hold one sequence's window: a window of %d "
                                "positions%s needs %ld blocks of %d", n_sliding_blocks, c->sliding_window,
                           h > 0 ? " and its history" : "", least, block);
    }
    kv->be = be;
    kv->n_layers = c->n_layers;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->n_batch = n_batch;
    kv->history = history < 0 ? n_batch : history;
    kv->block = block;
    kv->type = type;
    kv->layers = calloc((size_t)c->n_layers, sizeof *kv->layers);
    kv->seq_len = calloc((size_t)n_seq, sizeof *kv->seq_len);
    kv->seq_hashed = calloc((size_t)n_seq, sizeof *kv->seq_hashed);
    const int max_blocks = kv->max_blocks = ceil_div(n_ctx, block);
    kv->seq_hash = malloc((size_t)n_seq * (size_t)max_blocks * sizeof *kv->seq_hash);
    kv->lookup = malloc((size_t)max_blocks * sizeof *kv->lookup);
    if (!kv->layers || !kv->seq_len || !kv->seq_hashed || !kv->seq_hash || !kv->lookup) goto oom;
    for (int l = 0; l < c->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        y->owner = c->layer_kv_source[l];
        y->type = c->layer_type[l];
        y->row = c->layer_kv_heads[l] * c->layer_head_dim[l];
        y->window = y->type == G4_LAYER_SLIDING ? c->sliding_window : 0;
        kv->pool[y->type].used = 1;
        if (y->window) kv->window = y->window;
    }
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        p->max_blocks = max_blocks;
        p->n_blocks = pool_blocks(kv, c, t, n_full_blocks, n_sliding_blocks);
        size_t tab = (size_t)n_seq * (size_t)p->max_blocks;
        p->free_ids = malloc((size_t)p->n_blocks * sizeof(int32_t));
        p->ref = calloc((size_t)p->n_blocks, sizeof(int32_t));
        p->table = malloc(tab * sizeof(int32_t));
        p->slot = malloc((size_t)n_batch * sizeof(int32_t));
        p->table_dev = be->ops->alloc(be, tab * sizeof(int32_t));
        p->slot_dev = be->ops->alloc(be, (size_t)n_batch * sizeof(int32_t));
        const size_t nb = (size_t)p->n_blocks;
        for (p->n_buckets = 16; p->n_buckets < 2 * p->n_blocks; p->n_buckets *= 2) {}
        p->hashed = calloc(nb, 1);
        p->hash = malloc(nb * sizeof *p->hash);
        p->parent = malloc(nb * sizeof *p->parent);
        p->tokens = malloc(nb * (size_t)block * sizeof *p->tokens);
        p->bucket = malloc((size_t)p->n_buckets * sizeof *p->bucket);
        p->chain = malloc(nb * sizeof *p->chain);
        p->lru_prev = malloc(nb * sizeof *p->lru_prev);
        p->lru_next = malloc(nb * sizeof *p->lru_next);
        if (!p->free_ids || !p->ref || !p->table || !p->slot || !p->table_dev || !p->slot_dev || !p->hashed ||
            !p->hash || !p->parent || !p->tokens || !p->bucket || !p->chain || !p->lru_prev || !p->lru_next)
            goto oom;
        for (size_t i = 0; i < tab; i++) p->table[i] = -1;
        for (int b = 0; b < p->n_blocks; b++) p->free_ids[b] = p->n_blocks - 1 - b; /* block 0 on top */
        for (int i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
        p->n_free = p->n_plain = p->n_blocks;
        p->lru_head = p->lru_tail = -1;
        p->dirty = 1;
    }
    const size_t esz = g4_kv_type_size(type);
    for (int l = 0; l < c->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        if (y->owner != l) continue; /* shared: filled in below */
        const size_t n = layer_bytes(kv->pool[y->type].n_blocks, block, y->row, esz);
        if (!n) goto oom;
        y->k = be->ops->alloc(be, n);
        y->v = be->ops->alloc(be, n);
        if (!y->k || !y->v) goto oom;
        kv->bytes += 2 * n;
    }
    for (int l = 0; l < c->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        if (y->owner == l) continue;
        y->k = kv->layers[y->owner].k;
        y->v = kv->layers[y->owner].v;
    }
    return 0;
oom:
    g4_kv_cache_free(kv);
    return g4_fail(err, "out of memory for the KV cache (%d sequences x %d positions)", n_seq, n_ctx);
}

void g4_kv_cache_free(g4_kv_cache *kv) {
    g4_backend *be = kv->be;
    if (kv->layers) {
        for (int l = 0; l < kv->n_layers; l++) {
            g4_kv_layer *y = &kv->layers[l];
            if (y->owner != l) continue;
            if (y->k) be->ops->release(be, y->k);
            if (y->v) be->ops->release(be, y->v);
        }
    }
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        free(p->free_ids);
        free(p->ref);
        free(p->hashed);
        free(p->hash);
        free(p->parent);
        free(p->tokens);
        free(p->bucket);
        free(p->chain);
        free(p->lru_prev);
        free(p->lru_next);
        free(p->table);
        free(p->slot);
        if (p->table_dev) be->ops->release(be, p->table_dev);
        if (p->slot_dev) be->ops->release(be, p->slot_dev);
    }
    free(kv->layers);
    free(kv->seq_len);
    free(kv->seq_hashed);
    free(kv->seq_hash);
    free(kv->lookup);
    memset(kv, 0, sizeof *kv);
}

static int32_t *table_row(g4_kv_pool *p, int s) { return p->table + (size_t)s * (size_t)p->max_blocks; }
static const int32_t *table_row_c(const g4_kv_pool *p, int s) {
    return p->table + (size_t)s * (size_t)p->max_blocks;
}

/* ------------------------------------------------------------ prefix cache */

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Chained content hash of one block of token ids after the block whose hash is `parent`. */
static uint64_t block_hash(uint64_t parent, const int32_t *ids, int n) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)ids[i]);
    return h;
}

static void lru_remove(g4_kv_pool *p, int32_t b) {
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
}

static void lru_append(g4_kv_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
}

/* The block holding hash h after `parent` with these ids, or -1. */
static int32_t cache_find(const g4_kv_pool *p, uint64_t h, uint64_t parent, const int32_t *ids, int B) {
    for (int32_t b = p->bucket[h & (uint64_t)(p->n_buckets - 1)]; b >= 0; b = p->chain[b])
        if (p->hash[b] == h && p->parent[b] == parent &&
            !memcmp(p->tokens + (size_t)b * (size_t)B, ids, (size_t)B * sizeof *ids))
            return b;
    return -1;
}

static void cache_insert(g4_kv_pool *p, int32_t b, uint64_t h, uint64_t parent, const int32_t *ids, int B) {
    size_t k = h & (uint64_t)(p->n_buckets - 1);
    p->hashed[b] = 1;
    p->hash[b] = h;
    p->parent[b] = parent;
    memcpy(p->tokens + (size_t)b * (size_t)B, ids, (size_t)B * sizeof *ids);
    p->chain[b] = p->bucket[k];
    p->bucket[k] = b;
}

/* Takes block b out of the hash table (its content is about to change or it is evicted). */
static void cache_remove(g4_kv_pool *p, int32_t b) {
    int32_t *at = &p->bucket[p->hash[b] & (uint64_t)(p->n_buckets - 1)];
    while (*at != b) at = &p->chain[*at];
    *at = p->chain[b];
    p->hashed[b] = 0;
}

/* ------------------------------------------------------------ blocks */

static void unref(g4_kv_pool *p, int32_t *entry) {
    int32_t b = *entry;
    if (b < 0) return;
    if (--p->ref[b] == 0) {
        if (p->hashed[b]) lru_append(p, b); /* cached: reusable until evicted */
        else p->free_ids[p->n_plain++] = b;
        p->n_free++;
    }
    *entry = -1;
    p->dirty = 1;
}

/* A free block: one without cached content, else the least recently freed cached one (evicted). */
static int32_t take(g4_kv_pool *p) {
    int32_t b;
    if (p->n_plain > 0) {
        b = p->free_ids[--p->n_plain];
    } else {
        b = p->lru_head;
        lru_remove(p, b);
        cache_remove(p, b);
    }
    p->n_free--;
    p->ref[b] = 1;
    p->dirty = 1;
    return b;
}

/* Adds a reference to a block found in the cache (a cached free block leaves the free list). */
static void take_cached(g4_kv_pool *p, int32_t b) {
    if (p->ref[b]++ == 0) {
        lru_remove(p, b);
        p->n_free--;
    }
    p->dirty = 1;
}

/* Copies physical block src to dst in every layer that owns storage of this pool's type. */
static void copy_block(g4_kv_cache *kv, int type, int32_t dst, int32_t src) {
    const size_t esz = g4_kv_type_size(kv->type);
    for (int l = 0; l < kv->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        if (y->owner != l || y->type != type) continue;
        size_t bytes = (size_t)kv->block * (size_t)y->row * esz;
        kv->be->ops->copy(kv->be, (char *)y->k + (size_t)dst * bytes, (const char *)y->k + (size_t)src * bytes, bytes);
        kv->be->ops->copy(kv->be, (char *)y->v + (size_t)dst * bytes, (const char *)y->v + (size_t)src * bytes, bytes);
    }
}

/* First logical block a sliding layer needs for a step starting at position p0. */
static int first_needed_block(const g4_kv_cache *kv, int p0) {
    int lo = p0 - kv->window + 1;
    return lo > 0 ? lo / kv->block : 0;
}

/* Sliding blocks below this one are released before a step adding positions p0 .. p1-1. */
static int first_kept_block(const g4_kv_cache *kv, int p0, int p1) {
    int end = p1 - kv->tentative > p0 ? p1 - kv->tentative : p0 + 1;
    return first_needed_block(kv, end - kv->history < p0 ? end - kv->history : p0);
}

void g4_kv_cache_cost(const g4_kv_cache *kv, int s, int add, int cost[G4_LAYER_TYPES]) {
    const int B = kv->block, p0 = kv->seq_len[s], p1 = p0 + add;
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        const g4_kv_pool *p = &kv->pool[t];
        cost[t] = 0;
        if (!p->used || add <= 0) continue;
        const int32_t *row = table_row_c(p, s);
        if (t == G4_LAYER_SLIDING)
            for (int b = 0, keep = first_kept_block(kv, p0, p1); b < keep; b++)
                if (row[b] >= 0 && p->ref[row[b]] == 1) cost[t]--;
        for (int b = p0 / B; b <= (p1 - 1) / B; b++)
            if (row[b] < 0 || p->ref[row[b]] > 1) cost[t]++;
    }
}

int g4_kv_cache_prepare(g4_kv_cache *kv, const int *add, int n, const int32_t *seq, const int32_t *pos,
                        g4_error *err) {
    const int B = kv->block;
    /* count what the step needs per pool (new blocks and copies of shared ones) against what is free or
     * released by it, before changing anything */
    long need[G4_LAYER_TYPES] = {0};
    for (int s = 0; s < kv->n_seq; s++) {
        if (!add[s]) continue;
        int c[G4_LAYER_TYPES];
        g4_kv_cache_cost(kv, s, add[s], c);
        for (int t = 0; t < G4_LAYER_TYPES; t++) need[t] += c[t];
    }
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        if (kv->pool[t].used && need[t] > kv->pool[t].n_free)
            return g4_fail(err, "the KV cache is full: the step needs %ld more blocks of the %s-attention pool, "
                                "%d are free", need[t], t == G4_LAYER_SLIDING ? "sliding" : "full",
                           kv->pool[t].n_free);
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        for (int s = 0; s < kv->n_seq; s++) { /* releases first, so that takes can reuse them */
            if (!add[s] || t != G4_LAYER_SLIDING) continue;
            int32_t *row = table_row(p, s);
            for (int b = 0, keep = first_kept_block(kv, kv->seq_len[s], kv->seq_len[s] + add[s]); b < keep; b++)
                unref(p, &row[b]);
        }
        for (int s = 0; s < kv->n_seq; s++) {
            if (!add[s]) continue;
            int p0 = kv->seq_len[s], p1 = p0 + add[s];
            int32_t *row = table_row(p, s);
            for (int b = p0 / B; b <= (p1 - 1) / B; b++) {
                if (row[b] < 0) {
                    row[b] = take(p);
                } else if (p->ref[row[b]] > 1) { /* shared: copy on write */
                    int32_t nb = take(p);
                    copy_block(kv, t, nb, row[b]);
                    p->ref[row[b]]--;
                    row[b] = nb;
                } else if (p->hashed[row[b]]) { /* rolled back into a cached block: it changes now */
                    cache_remove(p, row[b]);
                }
            }
        }
        for (int i = 0; i < n; i++)
            p->slot[i] = table_row(p, seq[i])[pos[i] / B] * B + pos[i] % B;
        g4_backend *be = kv->be;
        if (p->dirty) {
            be->ops->to_device(be, p->table_dev, p->table,
                               (size_t)kv->n_seq * (size_t)p->max_blocks * sizeof(int32_t));
            p->dirty = 0;
        }
        be->ops->to_device(be, p->slot_dev, p->slot, (size_t)n * sizeof(int32_t));
    }
    return 0;
}

void g4_kv_cache_commit(g4_kv_cache *kv, int s, const int32_t *tokens, int n) {
    const int B = kv->block;
    uint64_t *hs = kv->seq_hash + (size_t)s * (size_t)kv->max_blocks;
    for (int b = kv->seq_hashed[s]; b < n / B; b++) {
        for (int i = 0; i < B; i++)
            if (tokens[(size_t)b * B + i] < 0) return; /* a soft token (image, audio): never cached, nor what follows */
        uint64_t parent = b ? hs[b - 1] : 0, h = block_hash(parent, tokens + (size_t)b * B, B);
        hs[b] = h;
        for (int t = 0; t < G4_LAYER_TYPES; t++) {
            g4_kv_pool *p = &kv->pool[t];
            if (!p->used) continue;
            int32_t pb = table_row(p, s)[b];
            if (pb < 0 || p->hashed[pb] || cache_find(p, h, parent, tokens + (size_t)b * B, B) >= 0) continue;
            cache_insert(p, pb, h, parent, tokens + (size_t)b * B, B);
        }
    }
    if (n / B > kv->seq_hashed[s]) kv->seq_hashed[s] = n / B;
}

void g4_kv_cache_drop(g4_kv_cache *kv, int s, int n) {
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        int32_t *row = table_row(p, s);
        for (int b = (n + kv->block - 1) / kv->block; b < p->max_blocks; b++) unref(p, &row[b]);
        /* and holds the sliding rows a sequence whose last step added position n - 1 holds */
        if (t == G4_LAYER_SLIDING && n > 0)
            for (int b = 0, keep = first_kept_block(kv, n - 1, n); b < keep; b++) unref(p, &row[b]);
    }
    if (kv->seq_hashed[s] > n / kv->block) kv->seq_hashed[s] = n / kv->block;
}

int g4_kv_cache_can_resume(const g4_kv_cache *kv, int s, int n) {
    if (n <= 0) return 1;
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        const g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        int lo = t == G4_LAYER_SLIDING ? first_needed_block(kv, n) : 0;
        const int32_t *row = table_row_c(p, s);
        for (int b = lo; b <= (n - 1) / kv->block; b++)
            if (row[b] < 0) return 0;
    }
    return 1;
}

int g4_kv_cache_share(g4_kv_cache *kv, int dst, int src, int n, g4_error *err) {
    if (dst == src || kv->seq_len[dst] != 0)
        return g4_fail(err, "sequence %d cannot take a shared prefix: it is not empty", dst);
    if (n <= 0) return 0;
    if (n > kv->seq_len[src] || !g4_kv_cache_can_resume(kv, src, n))
        return g4_fail(err, "sequence %d no longer holds the first %d positions", src, n);
    g4_kv_cache_drop(kv, dst, 0);
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        int32_t *from = table_row(p, src), *to = table_row(p, dst);
        for (int b = 0; b <= (n - 1) / kv->block; b++) {
            if (from[b] < 0) continue; /* a sliding block below the window */
            to[b] = from[b];
            p->ref[from[b]]++;
        }
        p->dirty = 1;
    }
    const size_t mb = (size_t)kv->max_blocks;
    int whole = n / kv->block < kv->seq_hashed[src] ? n / kv->block : kv->seq_hashed[src];
    memcpy(kv->seq_hash + (size_t)dst * mb, kv->seq_hash + (size_t)src * mb, (size_t)whole * sizeof *kv->seq_hash);
    kv->seq_hashed[dst] = whole;
    kv->seq_len[dst] = n;
    return 0;
}

/* The largest k <= m such that pool t holds what resuming after k whole blocks of the prefix (hashes in
 * kv->lookup) needs: every block below k for the full pool, the blocks the window before k*block reads for the
 * sliding pool. */
static int pool_hits(const g4_kv_cache *kv, int t, const int32_t *tokens, int m) {
    const g4_kv_pool *p = &kv->pool[t];
    const int B = kv->block;
    if (t == G4_LAYER_FULL) {
        int k = 0;
        while (k < m && cache_find(p, kv->lookup[k], k ? kv->lookup[k - 1] : 0, tokens + (size_t)k * B, B) >= 0) k++;
        return k;
    }
    /* sliding: the largest k <= m with blocks first_needed_block(k*B) .. k-1 all present */
    for (int k = m; k > 0; k--) {
        int ok = 1;
        for (int b = k - 1; ok && b >= first_needed_block(kv, k * B); b--)
            ok = cache_find(p, kv->lookup[b], b ? kv->lookup[b - 1] : 0, tokens + (size_t)b * B, B) >= 0;
        if (ok) return k;
    }
    return 0;
}

int g4_kv_cache_lookup(g4_kv_cache *kv, const int32_t *tokens, int n) {
    const int B = kv->block;
    int m = n / B < kv->max_blocks ? n / B : kv->max_blocks;
    for (int b = 0; b < m; b++) kv->lookup[b] = block_hash(b ? kv->lookup[b - 1] : 0, tokens + (size_t)b * B, B);
    /* the largest k both pools can resume from: the full pool can resume from every k up to its answer */
    if (kv->pool[G4_LAYER_FULL].used) m = pool_hits(kv, G4_LAYER_FULL, tokens, m);
    if (kv->pool[G4_LAYER_SLIDING].used) m = pool_hits(kv, G4_LAYER_SLIDING, tokens, m);
    return m * B;
}

int g4_kv_cache_reuse(g4_kv_cache *kv, int s, const int32_t *tokens, int n) {
    const int B = kv->block;
    if (kv->seq_len[s] != 0) return 0;
    const int k = g4_kv_cache_lookup(kv, tokens, n) / B;
    if (!k) return 0;
    g4_kv_cache_drop(kv, s, 0);
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        int32_t *row = table_row(p, s);
        for (int b = t == G4_LAYER_SLIDING ? first_needed_block(kv, k * B) : 0; b < k; b++) {
            int32_t pb = cache_find(p, kv->lookup[b], b ? kv->lookup[b - 1] : 0, tokens + (size_t)b * B, B);
            take_cached(p, pb);
            row[b] = pb;
        }
    }
    memcpy(kv->seq_hash + (size_t)s * (size_t)kv->max_blocks, kv->lookup, (size_t)k * sizeof *kv->lookup);
    kv->seq_hashed[s] = k;
    kv->seq_len[s] = k * B;
    return k * B;
}
