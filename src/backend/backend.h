/* The op table the model is written against. The decoder (src/model/forward.c)
 * is written once, in terms of these ops; each backend (CPU today, CUDA later)
 * implements the table. Activations are float32 buffers in the backend's memory
 * (host memory for the CPU); weights are g4_tensor views whose dtype says how to
 * read them. Shapes are row-major: "[n, d]" means n rows of d floats. */
#ifndef G4_BACKEND_BACKEND_H
#define G4_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "gemma4c.h"

typedef struct g4_backend g4_backend;

/* Attention over a KV cache for one layer, all tokens of a batch step.
 * Token t belongs to sequence seq[t] at absolute position pos[t]. Key/value rows
 * of sequence s live at k_base[s] / v_base[s]; the row of position p is slot
 * (p % cap) and holds n_kv_heads * head_dim floats. Keys of token t are the
 * positions (window ? max(0, pos-window+1) : 0) .. pos[t]. */
typedef struct g4_attention_args {
    const float *q;           /* [n_tokens, n_heads, head_dim] */
    float *out;               /* [n_tokens, n_heads, head_dim] */
    int n_tokens, n_heads, n_kv_heads, head_dim;
    const int32_t *seq, *pos; /* [n_tokens] */
    float *const *k_base;     /* indexed by sequence */
    float *const *v_base;
    int cap;                  /* rows per sequence in the cache (ring size for sliding layers) */
    int window;               /* 0: full attention */
    float scale;
} g4_attention_args;

/* Mixture-of-experts block of one layer for n tokens (docs/gemma4-text.md 3.7). */
typedef struct g4_moe_args {
    const float *residual; /* [n, H] router input r */
    const float *x2;       /* [n, H] pre_feedforward_layernorm_2(r) */
    float *out;            /* [n, H] sum over the top-k experts of w_k * expert_k(x2), before post-norm */
    int n, hidden, n_experts, top_k, expert_dim;
    float eps;
    const g4_tensor *router_proj;     /* [E, H] */
    const float *router_scale;        /* [H] (f32) */
    const float *per_expert_scale;    /* [E] (f32) */
    const g4_tensor *gate_up;         /* [E, 2*Im, H], or [E, Im, H] gate alone when up is set */
    const g4_tensor *up;              /* NULL, or [E, Im, H] */
    const g4_tensor *down;            /* [E, H, Im] */
} g4_moe_args;

typedef struct g4_backend_ops {
    const char *name;
    void (*free)(g4_backend *be);
    /* memory: float buffers in the backend's memory */
    void *(*alloc)(g4_backend *be, size_t bytes);
    void (*release)(g4_backend *be, void *p);
    void (*to_device)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(g4_backend *be);
    /* 0, or -1 with a message when an op of the last step failed (e.g. out of memory); clears the state */
    int (*check)(g4_backend *be, g4_error *err);

    /* out[i, :] = table[ids[i], :] * scale  (table [rows, cols] of any float dtype) */
    void (*embed)(g4_backend *be, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out);
    /* y[n, out] = x[n, in] * W^T (+ bias[out] if bias); W is [out, in] */
    void (*matmul)(g4_backend *be, const float *x, int n, const g4_tensor *w, const float *bias, float *y);
    /* per row of `dim`: y = x / sqrt(mean(x^2) + eps) * (w ? w : 1); in place allowed */
    void (*rmsnorm)(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y);
    /* RoPE angles of n positions: table[i, k] = cos(a), table[i, half + k] = sin(a) with the fp32
     * angle a = pos[i] * inv_freq[k], k < half (the same for every layer of one type) */
    void (*rope_table)(g4_backend *be, const int32_t *pos, int n, const float *inv_freq, int half, float *table);
    /* rotate-half RoPE in place on x[n, heads, dim] with a table from rope_table (half = dim/2) */
    void (*rope)(g4_backend *be, float *x, int n, int heads, int dim, const float *table);
    /* y = gelu_tanh(g) * u, n elements (u may be NULL: y = gelu_tanh(g)) */
    void (*gelu_mul)(g4_backend *be, const float *g, const float *u, size_t n, float *y);
    /* y += x */
    void (*add)(g4_backend *be, float *y, const float *x, size_t n);
    /* y *= s */
    void (*scale)(g4_backend *be, float *y, size_t n, float s);
    /* y = x * y elementwise */
    void (*mul)(g4_backend *be, float *y, const float *x, size_t n);
    /* y = (y + x) * s */
    void (*add_scale)(g4_backend *be, float *y, const float *x, size_t n, float s);
    /* y = tanh(y / c) * c */
    void (*softcap)(g4_backend *be, float *y, size_t n, float c);
    /* dst[i, :] = src[idx[i], :] for rows of `row` floats */
    void (*get_rows)(g4_backend *be, const float *src, const int32_t *idx, int n, int row, float *dst);
    /* dst[b, a, :] = src[a, b, :] for src [na, nb, c] */
    void (*transpose)(g4_backend *be, const float *src, int na, int nb, int c, float *dst);
    /* writes rows of src [n, row] into the cache rows of (seq[i], pos[i]) */
    void (*kv_store)(g4_backend *be, const float *src, int n, int row, const int32_t *seq, const int32_t *pos,
                     float *const *base, int cap);
    void (*attention)(g4_backend *be, const g4_attention_args *a);
    void (*moe)(g4_backend *be, const g4_moe_args *a);
} g4_backend_ops;

struct g4_backend {
    const g4_backend_ops *ops;
    void *impl;
};

/* The CPU backend with n_threads threads (0: all cores). NULL on failure. */
g4_backend *g4_backend_cpu_new(int n_threads, g4_error *err);

static inline void g4_backend_free(g4_backend *be) {
    if (be) be->ops->free(be);
}

#endif
