/* The paged KV cache (see kv_cache.h for the layout and the rules). */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

/* Sliding blocks a sequence can hold at once: W - 1 + n_batch rows (see the release rule in kv_cache.h) and
 * one block of slack for alignment. */
static int sliding_blocks_per_seq(const g4_kv_cache *kv, int window) {
    int n = ceil_div((long)window - 1 + kv->n_batch, kv->block) + 1;
    return n < kv->pool[G4_LAYER_SLIDING].max_blocks ? n : kv->pool[G4_LAYER_SLIDING].max_blocks;
}

int g4_kv_cache_init(g4_kv_cache *kv, const g4_text_config *c, g4_backend *be, int n_seq, int n_ctx, int n_batch,
                     g4_kv_type type, int block, int n_full_blocks, g4_error *err) {
    memset(kv, 0, sizeof *kv);
    kv->be = be;
    kv->n_layers = c->n_layers;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->n_batch = n_batch;
    kv->block = block;
    kv->type = type;
    kv->layers = calloc((size_t)c->n_layers, sizeof *kv->layers);
    kv->seq_len = calloc((size_t)n_seq, sizeof *kv->seq_len);
    if (!kv->layers || !kv->seq_len) goto oom;
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
        p->max_blocks = ceil_div(n_ctx, block);
        if (t == G4_LAYER_SLIDING)
            p->n_blocks = n_seq * sliding_blocks_per_seq(kv, c->sliding_window);
        else
            p->n_blocks = n_full_blocks > 0 ? n_full_blocks : n_seq * p->max_blocks;
        size_t tab = (size_t)n_seq * (size_t)p->max_blocks;
        p->free_ids = malloc((size_t)p->n_blocks * sizeof(int32_t));
        p->ref = calloc((size_t)p->n_blocks, sizeof(int32_t));
        p->table = malloc(tab * sizeof(int32_t));
        p->slot = malloc((size_t)n_batch * sizeof(int32_t));
        p->table_dev = be->ops->alloc(be, tab * sizeof(int32_t));
        p->slot_dev = be->ops->alloc(be, (size_t)n_batch * sizeof(int32_t));
        if (!p->free_ids || !p->ref || !p->table || !p->slot || !p->table_dev || !p->slot_dev) goto oom;
        for (size_t i = 0; i < tab; i++) p->table[i] = -1;
        for (int b = 0; b < p->n_blocks; b++) p->free_ids[b] = p->n_blocks - 1 - b; /* block 0 on top */
        p->n_free = p->n_blocks;
        p->dirty = 1;
    }
    const size_t esz = g4_kv_type_size(type);
    for (int l = 0; l < c->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        if (y->owner != l) continue; /* shared: filled in below */
        size_t n = (size_t)kv->pool[y->type].n_blocks * (size_t)block * (size_t)y->row * esz;
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
        free(p->table);
        free(p->slot);
        if (p->table_dev) be->ops->release(be, p->table_dev);
        if (p->slot_dev) be->ops->release(be, p->slot_dev);
    }
    free(kv->layers);
    free(kv->seq_len);
    memset(kv, 0, sizeof *kv);
}

static int32_t *table_row(g4_kv_pool *p, int s) { return p->table + (size_t)s * (size_t)p->max_blocks; }

static void unref(g4_kv_pool *p, int32_t *entry) {
    int32_t b = *entry;
    if (b < 0) return;
    if (--p->ref[b] == 0) p->free_ids[p->n_free++] = b;
    *entry = -1;
    p->dirty = 1;
}

static int32_t take(g4_kv_pool *p) {
    int32_t b = p->free_ids[--p->n_free];
    p->ref[b] = 1;
    p->dirty = 1;
    return b;
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
static int first_needed_block(const g4_kv_cache *kv, int window, int p0) {
    int lo = p0 - window + 1;
    return lo > 0 ? lo / kv->block : 0;
}

int g4_kv_cache_prepare(g4_kv_cache *kv, const int *add, int n, const int32_t *seq, const int32_t *pos,
                        g4_error *err) {
    const int B = kv->block, window = kv->window;
    /* count what the step needs per pool (new blocks and copies of shared ones) against what is free or
     * released by it, before changing anything */
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        long need = 0, freed = 0;
        for (int s = 0; s < kv->n_seq; s++) {
            if (!add[s]) continue;
            int p0 = kv->seq_len[s], p1 = p0 + add[s]; /* new positions p0 .. p1-1 */
            int32_t *row = table_row(p, s);
            int keep = t == G4_LAYER_SLIDING ? first_needed_block(kv, window, p1 - kv->n_batch) : 0;
            for (int b = 0; b < keep; b++)
                if (row[b] >= 0 && p->ref[row[b]] == 1) freed++;
            for (int b = p0 / B; b <= (p1 - 1) / B; b++)
                if (row[b] < 0 || p->ref[row[b]] > 1) need++;
        }
        if (need > p->n_free + freed)
            return g4_fail(err, "the KV cache is full: the step needs %ld free blocks of the %s-attention pool, "
                                "%d are free", need, t == G4_LAYER_SLIDING ? "sliding" : "full", p->n_free);
    }
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        for (int s = 0; s < kv->n_seq; s++) {
            if (!add[s]) continue;
            int p0 = kv->seq_len[s], p1 = p0 + add[s];
            int32_t *row = table_row(p, s);
            if (t == G4_LAYER_SLIDING)
                for (int b = 0, keep = first_needed_block(kv, window, p1 - kv->n_batch); b < keep; b++)
                    unref(p, &row[b]);
            for (int b = p0 / B; b <= (p1 - 1) / B; b++) {
                if (row[b] < 0) {
                    row[b] = take(p);
                } else if (p->ref[row[b]] > 1) { /* shared: copy on write */
                    int32_t nb = take(p);
                    copy_block(kv, t, nb, row[b]);
                    p->ref[row[b]]--;
                    row[b] = nb;
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

void g4_kv_cache_drop(g4_kv_cache *kv, int s, int n) {
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        int32_t *row = table_row(p, s);
        for (int b = (n + kv->block - 1) / kv->block; b < p->max_blocks; b++) unref(p, &row[b]);
    }
}

int g4_kv_cache_can_resume(const g4_kv_cache *kv, int s, int n) {
    if (n <= 0) return 1;
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        const g4_kv_pool *p = &kv->pool[t];
        if (!p->used) continue;
        int lo = t == G4_LAYER_SLIDING ? first_needed_block(kv, kv->window, n) : 0;
        const int32_t *row = p->table + (size_t)s * (size_t)p->max_blocks;
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
    kv->seq_len[dst] = n;
    return 0;
}
