#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int g4_kv_cache_init(g4_kv_cache *kv, const g4_text_config *c, g4_backend *be, int n_seq, int n_ctx, int n_batch,
                     g4_error *err) {
    memset(kv, 0, sizeof *kv);
    kv->be = be;
    kv->n_layers = c->n_layers;
    kv->n_seq = n_seq;
    kv->n_ctx = n_ctx;
    kv->n_batch = n_batch;
    kv->layers = calloc((size_t)c->n_layers, sizeof *kv->layers);
    kv->seq_len = calloc((size_t)n_seq, sizeof *kv->seq_len);
    if (!kv->layers || !kv->seq_len) goto oom;
    for (int l = 0; l < c->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        y->owner = c->layer_kv_source[l];
        y->row = c->layer_kv_heads[l] * c->layer_head_dim[l];
        y->window = c->layer_type[l] == G4_LAYER_SLIDING ? c->sliding_window : 0;
        if (y->owner != l) continue; /* shared: filled in below */
        long cap = n_ctx;
        if (y->window && (long)y->window - 1 + n_batch < cap) cap = (long)y->window - 1 + n_batch;
        y->cap = (int)cap;
        size_t n;
        if (!g4_mul_ok((size_t)n_seq, (size_t)y->cap, &n) || !g4_mul_ok(n, (size_t)y->row, &n) ||
            !g4_mul_ok(n, sizeof(float), &n) || n > SIZE_MAX / 4)
            goto oom;
        y->k = be->ops->alloc(be, n);
        y->v = be->ops->alloc(be, n);
        y->k_base = calloc((size_t)n_seq, sizeof(float *));
        y->v_base = calloc((size_t)n_seq, sizeof(float *));
        if (!y->k || !y->v || !y->k_base || !y->v_base) goto oom;
        kv->bytes += 2 * n;
        for (int s = 0; s < n_seq; s++) {
            y->k_base[s] = y->k + (size_t)s * (size_t)y->cap * (size_t)y->row;
            y->v_base[s] = y->v + (size_t)s * (size_t)y->cap * (size_t)y->row;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        g4_kv_layer *y = &kv->layers[l];
        if (y->owner == l) continue;
        const g4_kv_layer *src = &kv->layers[y->owner];
        y->cap = src->cap;
        y->k_base = src->k_base;
        y->v_base = src->v_base;
    }
    return 0;
oom:
    g4_kv_cache_free(kv);
    return g4_fail(err, "out of memory for the KV cache (%d sequences x %d positions)", n_seq, n_ctx);
}

void g4_kv_cache_free(g4_kv_cache *kv) {
    if (kv->layers) {
        for (int l = 0; l < kv->n_layers; l++) {
            g4_kv_layer *y = &kv->layers[l];
            if (y->owner != l) continue;
            if (y->k) kv->be->ops->release(kv->be, y->k);
            if (y->v) kv->be->ops->release(kv->be, y->v);
            free(y->k_base);
            free(y->v_base);
        }
    }
    free(kv->layers);
    free(kv->seq_len);
    memset(kv, 0, sizeof *kv);
}
