/* The op table the model is written against, and the backend contract.
 *
 * The decoder (src/model/forward.c) and the towers are written once, in terms of these ops; each backend
 * (CPU: src/backend/cpu/, CUDA: src/backend/cuda/) implements the whole table (docs/architecture.md, "The
 * forward pass is written once", "The backend owns its memory").
 *
 * Memory. A backend has its own memory (host memory for the CPU, device memory for CUDA). Activations are
 * float32 buffers in it; integer arrays (ids, positions, block tables, slots) are int32 buffers in it.
 * Every op argument is either a plain scalar, a pointer into backend memory, or a small parameter struct
 * passed by address whose pointer fields point into backend memory; an op never reads a host array of
 * backend pointers or host-side constants. Ops are asynchronous: results are visible after sync or a
 * to_host copy; errors (e.g. out of memory inside an op) are reported by check() after the step.
 *
 * Weights. A weight is a g4_tensor whose dtype says how to read it. upload_weight() places a host view (a
 * memory-mapped file) in the backend: the CPU keeps the view as it is (nothing is copied or read; MLX affine
 * weights excepted, held as AF4 / AF8 blocks for its int8 products), CUDA copies
 * it into device memory (rows padded to 16 bytes there: a placed tensor is read only by its backend's ops). A
 * source without data (data NULL) asks for random values instead, uniform in +-sqrt(3 / row length): random-
 * weight models of real shapes for benchmarks, filled where they live (on the GPU, no host copy). A model may
 * keep a table on the host instead (host_table): ops never read it; rows_to_device copies the step's rows in
 * (E2B's 4.7 GB per-layer embedding table is read one row per token).
 *
 * KV cache. Paged (src/engine/kv_cache.h): each non-shared layer has K and V storage of
 * [n_blocks][block_size][n_kv_heads * head_dim] elements of the context's KV type; a sequence's block table
 * maps logical block p / block_size to a physical block. Writes go through a slot per token
 * (physical_block * block_size + p % block_size), computed once per step and layer type.
 *
 * Shapes are row-major: "[n, d]" means n rows of d floats. */
#ifndef G4_BACKEND_BACKEND_H
#define G4_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "gemma4c.h"

typedef struct g4_backend g4_backend;

/* Bytes of one KV element of a type. */
static inline size_t g4_kv_type_size(g4_kv_type t) { return t == G4_KV_F32 ? 4 : 2; }

/* Attention of one layer over the paged KV cache, for all tokens of a batch step.
 * Token t belongs to sequence seq[t] (a row of block_table) at absolute position pos[t]. It sees the keys
 * at positions lo .. hi-1 with hi = kv_end ? kv_end[t] : pos[t] + 1 and lo = kv_start ? kv_start[t] : window ?
 * max(0, pos[t] - window + 1) : 0 (kv_end lets a token see later tokens of its image, docs/gemma4-towers.md 2.7;
 * those rows are written in the same step before attention; kv_start lets a sliding layer see a whole image
 * beyond its window, docs/gemma4-unified.md 8). Position p of sequence s lives in physical row
 * block_table[s * max_blocks + p / block_size] * block_size + p % block_size of k and v.
 * out = softmax(scale * q.k) v per head; query head h reads KV head h / (n_heads / n_kv_heads). */
typedef struct g4_attention_args {
    const float *q;              /* [n_tokens, n_heads, head_dim] */
    float *out;                  /* [n_tokens, n_heads, head_dim] */
    int n_tokens, n_heads, n_kv_heads, head_dim;
    const int32_t *seq, *pos;    /* [n_tokens] */
    const int32_t *kv_end;       /* [n_tokens] or NULL */
    const int32_t *kv_start;     /* [n_tokens] or NULL */
    const void *k, *v;           /* [n_blocks, block_size, n_kv_heads * head_dim] of kv_type */
    g4_kv_type kv_type;
    const int32_t *block_table;  /* [n_seq, max_blocks] physical block ids, -1 where none */
    int max_blocks, block_size;
    int window;                  /* 0: full attention */
    int max_keys;                /* an upper bound of hi - lo over the step's tokens (for sizing work) */
    int max_seq_tokens;          /* the most tokens one sequence has in the step, 0 unknown (1: a batch of decode
                                    tokens); a hint for choosing kernels, results do not depend on it */
    float scale;
    /* NULL, or the layer's attn_prep (below), still to be done: q is the q projection's raw rows (prep->q) and
     * the op does the prep first (a backend may fuse the two: one launch a layer in a decode step). With a prep, the
     * cache rows other than those the prep stores must not be written by the op issued just before this one (a backend
     * may start reading them while that op finishes; the decoder writes them in earlier steps or layers). */
    const struct g4_attn_prep_args *prep;
} g4_attention_args;

/* Bidirectional attention over contiguous keys and values (the vision tower; docs/gemma4-towers.md 2.6):
 * out[i, h] = sum_j softmax_j(scale * q[i, h].k[j, h / G] + bias) v[j, h / G], G = n_heads / n_kv_heads.
 * Keys with key_valid[j] == 0 are left out; a query that sees no key gets zeros. */
typedef struct g4_dense_attention_args {
    const float *q;            /* [n_q, n_heads, head_dim] */
    const float *k, *v;        /* [n_k, n_kv_heads, head_dim] */
    float *out;                /* [n_q, n_heads, head_dim] */
    int n_q, n_k, n_heads, n_kv_heads, head_dim;
    float scale;
    const int32_t *key_valid;  /* [n_k] or NULL (every key valid) */
    const float *bias;         /* NULL, or additive logits [bias_heads, n_q, n_k] */
    int bias_heads;            /* 1: one bias for every head; n_heads: one per head */
} g4_dense_attention_args;

/* Several products of one input: y[i][n, out_i] = x'[n, in] * w[i]^T (+ bias[i]) for i < count, where x' is x,
 * or rmsnorm(x) * norm per row when norm is set (fused: the normalized rows are not stored).
 * Residual prologue (res_out set): first res_out = (res_h + rmsnorm(res_o) * res_w) * res_scale per row (a
 * sublayer's post_norm_add, res_out may equal res_h), and that is the x of the products (x is ignored).
 * Epilogues:
 * - geglu: y[0] = gelu_tanh(x' w[0]^T) * u with u = x' w[1]^T (count 2, equal out; y[1] is scratch the backend
 *   may overwrite) or u = mul [n, out_0] (count 1);
 * - softcap > 0: y = tanh(y / softcap) * softcap (after any bias). */
#define G4_MATMUL_SET_MAX 3
/* The largest k of the top_k op */
#define G4_TOP_K_MAX 1024
typedef struct g4_matmul_set {
    int count;
    const g4_tensor *w[G4_MATMUL_SET_MAX];
    const float *bias[G4_MATMUL_SET_MAX]; /* each may be NULL */
    float *y[G4_MATMUL_SET_MAX];
    const float *norm; /* [in] or NULL */
    float eps;
    int geglu;
    const float *mul;  /* [n, out_0]: geglu with one product */
    float softcap;
    const float *res_h, *res_o, *res_w; /* [n, in], [n, in], [in] */
    float res_scale;
    float *res_out;    /* [n, in] or NULL: no prologue */
} g4_matmul_set;

/* Mixture-of-experts feed-forward block of one layer for n tokens (docs/gemma4-text.md 3.7):
 * out = rmsnorm(dense) * post_norm1 + rmsnorm(E) * post_norm2, where E = the sum over the top-k experts of
 * w_k * expert_k(x2), x2 = rmsnorm(residual) * pre_norm2, and the router reads the residual. out may be dense.
 * The dense MLP is either an input (mlp.count == 0: `dense` holds its output) or part of the op (mlp.count == 2:
 * the gate/up pair of matmul_set with its norm and GeGLU, mlp.y[0] its activations and mlp.y[1] scratch, then
 * mlp_down into `dense`); with the set's residual prologue (mlp.res_out == residual) the op first makes the
 * residual, as matmul_set does. The two branches read only the residual: a backend may run them at once. */
typedef struct g4_moe_args {
    const float *residual; /* [n, H] router input r (made by the op with mlp's residual prologue) */
    float *dense;          /* [n, H] output of the dense MLP, before its post-norm (written when mlp.count) */
    float *out;            /* [n, H] */
    int n, hidden, n_experts, top_k, expert_dim;
    float eps;
    const float *pre_norm2, *post_norm1, *post_norm2; /* [H] */
    const g4_tensor *router_proj;     /* [E, H] */
    const float *router_scale;        /* [H] */
    const float *per_expert_scale;    /* [E] */
    const g4_tensor *gate_up;         /* [E, 2*Im, H], or [E, Im, H] gate alone when up is set */
    const g4_tensor *up;              /* NULL, or [E, Im, H] */
    const g4_tensor *down;            /* [E, H, Im] */
    g4_matmul_set mlp;                /* the dense MLP's gate/up pair, or count 0 */
    const g4_tensor *mlp_down;        /* [H, I] with mlp */
} g4_moe_args;

/* The attention inputs of one layer after their projections (docs/gemma4-text.md 3.4), in one op:
 * q = rope(rmsnorm(q) * q_norm); and unless kv_shared: v = rmsnorm(v_from_k ? k : v) (no weight; keys as values
 * take the raw k_proj output), k = rope(rmsnorm(k) * k_norm), and row i of k and v stored at row slot[i] of the
 * caches, converted to kv_type. q is updated in place; k and v are scratch afterwards. rope: the step's table
 * from rope_table (NULL: no rotation). */
typedef struct g4_attn_prep_args {
    float *q, *k, *v;            /* [n, n_heads, D], [n, n_kv_heads, D], [n, n_kv_heads, D] */
    int n, n_heads, n_kv_heads, head_dim;
    int kv_shared, v_from_k;
    const float *q_norm, *k_norm; /* [D] */
    float eps;
    const float *rope;           /* [n, D] */
    const int32_t *slot;         /* [n] */
    void *k_cache, *v_cache;
    g4_kv_type kv_type;
} g4_attn_prep_args;

/* Local self-attention with a relative position bias and a logit cap, the audio conformer's
 * chunked attention reduced to its window (docs/gemma4-towers.md §3.3). Per head, token t
 * attends to s = t-d for d = 0..window-1, s >= 0:
 *   qs = q_t * q_scale * q_dim_scale (per channel; NULL: 1),
 *   logit = k_scale * (qs . k_s) + qs . rel_d,  logit = cap * tanh(logit / cap),
 *   out_t = softmax over s of logit (fp32) times v_s. */
typedef struct g4_local_attention_args {
    const float *q, *k, *v;   /* [n, heads, head_dim] */
    const float *rel;         /* [window, heads, head_dim]: row d is the relative key of distance d */
    const float *q_dim_scale; /* [head_dim] or NULL */
    float *out;               /* [n, heads, head_dim] */
    int n, heads, head_dim, window;
    float q_scale, k_scale, logit_cap;
} g4_local_attention_args;

typedef struct g4_backend_ops {
    const char *name;
    int host_memory; /* 1 when backend memory is host memory (ops may be handed host pointers) */
    void (*free)(g4_backend *be);

    /* ---- memory */
    /* NULL when out of memory (no message: the caller says what it was allocating) */
    void *(*alloc)(g4_backend *be, size_t bytes);
    void (*release)(g4_backend *be, void *p);
    void (*to_device)(g4_backend *be, void *dst, const void *src, size_t bytes);
    /* dst[i, :] = table[ids[i], :] * scale as floats, for i < n, from a table kept in host memory (host_table: any
     * weight dtype; ids a host array): a copy from the host as to_device is (a backend may copy the rows as stored
     * and widen them itself). */
    void (*rows_to_device)(g4_backend *be, float *dst, const g4_tensor *table, const int32_t *ids, int n, float scale);
    void (*to_host)(g4_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(g4_backend *be, void *dst, const void *src, size_t bytes); /* within backend memory, ranges apart */
    void (*sync)(g4_backend *be);
    /* The backend memory free now and in all, in bytes (the CPU: the system's available and total memory). 0, or
     * -1 when unknown. */
    int (*memory)(g4_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* 0, or -1 with a message when an op of the last step failed (e.g. out of memory); clears the state */
    int (*check)(g4_backend *be, g4_error *err);
    /* Places a weight: *dst becomes a tensor the ops can read (dst->data in backend memory, in the backend's row
     * layout: dst->nbytes / rows apart, so views of its rows are g4_tensor_placed_rows). dst->dtype may differ from
     * src's: a backend without kernels for a type holds it as one it has (g4_transcode_row of core/quant.h; the
     * model's loader tells the user, once per type). 0, or -1 with a message (e.g. the model does not fit). */
    int (*upload_weight)(g4_backend *be, const g4_tensor *src, g4_tensor *dst, g4_error *err);
    /* Optional (NULL: upload_weight each): places the weights of a set (src[0 .. count), count <= G4_MATMUL_SET_MAX:
     * q/k/v, gate/up) one after another in one block of backend memory, so that matmul_set may multiply them as one
     * product; each is released on its own. 0, or -1 with a message and none placed. */
    int (*upload_weights)(g4_backend *be, const g4_tensor *const *src, g4_tensor *const *dst, int count, g4_error *err);
    void (*release_weight)(g4_backend *be, g4_tensor *w);

    /* ---- recorded steps (optional: NULL where the backend has none, e.g. the CPU)
     * graph_begin(owner, key): 1 when a recording of (owner, key) was launched, so the caller skips the ops it
     * covers; 0 when the caller must issue them (the backend may record them; graph_end then finishes the
     * recording and launches it). The ops between them read and write only memory at fixed addresses (the
     * owner's buffers), copy nothing from or to the host and do not sync. graph_forget drops the owner's
     * recordings (before its buffers are released). */
    int (*graph_begin)(g4_backend *be, const void *owner, uint64_t key);
    void (*graph_end)(g4_backend *be);
    void (*graph_forget)(g4_backend *be, const void *owner);

    /* ---- ops */
    /* out[i, :] = table[ids[i], :] * scale  (table [rows, cols] of any weight dtype, quantized included); an id
     * outside the rows (argmax's -1) gives a row of NaN */
    void (*embed)(g4_backend *be, const g4_tensor *table, const int32_t *ids, int n, float scale, float *out);
    /* y[n, out] = x[n, in] * W^T (+ bias[out] if bias); W is [out, in] */
    void (*matmul)(g4_backend *be, const float *x, int n, const g4_tensor *w, const float *bias, float *y);
    /* the products of a set with one input (q/k/v, gate/up): one pass where the backend can. The input is
     * rmsnorm(x) * norm with a norm; with res_out, x is first (res_h + rmsnorm(res_o) * res_w) * res_scale, written
     * to res_out. geglu with two products: y[0] = gelu_tanh(x W0^T + b0) * (x W1^T + b1), y[1] scratch (contents
     * unspecified); geglu with one: y[0] = gelu_tanh(x W0^T + b0) * mul; softcap c: y = tanh(y / c) * c. */
    void (*matmul_set)(g4_backend *be, const float *x, int n, const g4_matmul_set *set);
    /* per row of `dim`: y = x / sqrt(mean(x^2) + eps) * (w ? w : 1); in place allowed */
    void (*rmsnorm)(g4_backend *be, const float *x, const float *w, int rows, int dim, float eps, float *y);
    /* h = (h + rmsnorm(o) * w) * s per row of `dim`: a sublayer's post-norm, residual add and layer scalar */
    void (*post_norm_add)(g4_backend *be, float *h, const float *o, const float *w, int rows, int dim, float eps,
                          float s);
    /* RoPE angles of n positions: table[i, k] = cos(a), table[i, half + k] = sin(a) with the fp32
     * angle a = pos[i] * inv_freq[k], k < half (the same for every layer of one type) */
    void (*rope_table)(g4_backend *be, const int32_t *pos, int n, const float *inv_freq, int half, float *table);
    /* rotate-half RoPE in place on x[n, heads, dim] with a table from rope_table (half = dim/2) */
    void (*rope)(g4_backend *be, float *x, int n, int heads, int dim, const float *table);
    /* per head of x[n, heads, dim]: rmsnorm with weight w (NULL: none), then RoPE with table (NULL: none) */
    void (*head_norm_rope)(g4_backend *be, float *x, int n, int heads, int dim, const float *w, float eps,
                           const float *table);
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
    /* out[i] = the lowest index of the largest value of row i of x [rows, n]; -1 when the row holds a NaN (NaN
     * logits come only from broken weights: the caller reports them, as for the logits themselves) */
    void (*argmax)(g4_backend *be, const float *x, int rows, int n, int32_t *out);
    /* The candidates of a top-k sampler (src/engine/sampler.h, g4_sampler_sample_candidates), per row i of
     * x [rows, n]: the indices of every value >= the row's k-th largest value (NaN and -inf never count; every tie
     * at the k-th value is kept; fewer than k finite values: all of them), in ascending order, into
     * ids[i * cap ..] with their values in vals[i * cap ..], and their number in count[i]; count[i] = -1 when more
     * than cap qualify (ties: the caller reads the row itself) and when the row holds a NaN (the caller finds it
     * there). 1 <= k <= G4_TOP_K_MAX, k <= cap <= 2 * G4_TOP_K_MAX.
     * Only the token choices come back per step, not the vocabulary rows. */
    void (*top_k)(g4_backend *be, const float *x, int rows, int n, int k, int cap, int32_t *ids, float *vals,
                  int32_t *count);
    /* The masked embedder's logits (docs/gemma4-assistant.md 3.4), per row r of x [rows, dim]: the top_k largest of
     * the row's n_groups scores (scores [rows, n_groups]; ties -> lower index) select the ids
     * ordering[g * per .. g * per + per - 1] of each chosen group g (per = V / n_groups, table [V, dim]);
     * out[r, v] = x[r] . table[v] for a selected id and the smallest of the row's products minus 1 for every other
     * id (out [rows, V]). */
    void (*masked_logits)(g4_backend *be, const float *x, const float *scores, int rows, int n_groups, int top_k,
                          const int32_t *ordering, const g4_tensor *table, float *out);
    /* writes k[i, :] and v[i, :] (rows of `row` floats) into row slot[i] of the caches, converted to kv_type */
    void (*kv_store)(g4_backend *be, const float *k, const float *v, int n, int row, const int32_t *slot,
                     void *k_cache, void *v_cache, g4_kv_type kv_type);
    void (*attn_prep)(g4_backend *be, const g4_attn_prep_args *a);
    void (*attention)(g4_backend *be, const g4_attention_args *a);
    void (*moe)(g4_backend *be, const g4_moe_args *a);

    /* ---- ops of the towers (src/towers/) */
    void (*attention_dense)(g4_backend *be, const g4_dense_attention_args *a);
    /* y = min(max(x, lo), hi), n elements (ReLU: lo 0, hi +inf; NaN stays NaN, as torch.clamp); in place allowed */
    void (*clamp)(g4_backend *be, const float *x, float *y, size_t n, float lo, float hi);
    /* y[r, c] = (y[r, c] + shift[c]) * scale[c] for `rows` rows of `cols`; shift or scale may be NULL */
    void (*shift_scale_cols)(g4_backend *be, float *y, int rows, int cols, const float *shift, const float *scale);
    /* dst[i, :] = sum_{j < k} src[idx[i * k + j], :] * s, summed in j order, for n rows of `row` floats */
    void (*gather_sum)(g4_backend *be, const float *src, const int32_t *idx, int n, int k, int row, float s,
                       float *dst);
    /* y = a * sigmoid(b), n elements (SiLU: a == b; GLU: the two halves); in place allowed */
    void (*sigmoid_mul)(g4_backend *be, const float *a, const float *b, size_t n, float *y);
    /* per row of `dim`: y = (x - mean) / sqrt(var + eps) * (w ? w : 1) + (b ? b : 0); in place allowed */
    void (*layernorm)(g4_backend *be, const float *x, const float *w, const float *b, int rows, int dim, float eps,
                      float *y);
    /* Patches of a 2-D convolution over x [h, w, c] (channels last), kernel kh x kw, the same stride
     * and zero padding on both axes: for the output rows oy = row0 .. row0+nrows-1 and every output
     * column ox, out[(oy-row0)*ow + ox, (ch*kh + i)*kw + j] = x[oy*stride-pad+i, ox*stride-pad+j, ch]
     * (0 outside), ow = (w + 2*pad - kw) / stride + 1: a matmul with a [c_out, c, kh, kw] weight
     * then gives the output rows [nrows*ow, c_out] channels last. */
    void (*im2col)(g4_backend *be, const float *x, int h, int w, int c, int kh, int kw, int stride, int pad, int row0,
                   int nrows, float *out);
    /* Causal depthwise 1-D convolution over time: x, y [n, c], w [c, k] (f32);
     * y[t, ch] = sum_j w[ch, j] * x[t-k+1+j, ch] with zeros before t = 0. y must not alias x. */
    void (*conv1d_causal_dw)(g4_backend *be, const float *x, const float *w, int n, int c, int k, float *y);
    void (*local_attention)(g4_backend *be, const g4_local_attention_args *a);
} g4_backend_ops;

struct g4_backend {
    const g4_backend_ops *ops;
    void *impl;
};

/* The backend for a device name: "cpu", "cuda", or NULL/"auto" (CUDA when built in and a GPU is present, else
 * the CPU). n_threads: CPU threads (0: all cores). bf16_act: products with BF16 weights take the activations
 * rounded to bf16 (g4_load_params.bf16_activations; the CPU: matmul.c, CUDA: one bf16 part per activation in
 * the prefill GEMM, cuda_blas.cu). NULL with a message on failure. */
g4_backend *g4_backend_new(const char *device, int n_threads, int bf16_act, g4_error *err);

/* Backends this build contains, e.g. "cpu" or "cpu, cuda". */
const char *g4_backends_built(void);

g4_backend *g4_backend_cpu_new(int n_threads, int bf16_act, g4_error *err);
#ifdef G4_WITH_CUDA
g4_backend *g4_backend_cuda_new(int bf16_act, g4_error *err);
int g4_cuda_available(void); /* 1 when a CUDA device can be used */
#endif

static inline void g4_backend_free(g4_backend *be) {
    if (be) be->ops->free(be);
}

#endif
