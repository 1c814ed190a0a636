/* g4_context: KV cache + scratch, and g4_decode, the batch step of the public API. */
#include "engine/context.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Rows of logits a step computes at once (the head's weights are read once per such chunk: 64 sequences decoding
 * together read them once, not four times; 64 MB of f32 logits for a 262144-token vocabulary); 128 in device memory
 * (a GPU's batch of up to 128 sequences reads the head once: E2B's is 0.8 GB) */
#define LOGIT_ROWS 64
#define LOGIT_ROWS_DEVICE 128

static void scratch_free(g4_context *ctx) {
    g4_backend *be = ctx->model->be;
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        if (ctx->s.rope[t]) {
            be->ops->release(be, ctx->s.rope[t]);
            ctx->s.rope[t] = NULL;
        }
    void **bufs[] = {(void **)&ctx->s.h,      (void **)&ctx->s.h_spare, (void **)&ctx->s.x,       (void **)&ctx->s.o,
                     (void **)&ctx->s.q,      (void **)&ctx->s.k,       (void **)&ctx->s.v,
                     (void **)&ctx->s.attn,   (void **)&ctx->s.gate,    (void **)&ctx->s.up,
                     (void **)&ctx->s.ple,
                     (void **)&ctx->s.ple_t,  (void **)&ctx->s.ple_g,   (void **)&ctx->s.ple_h,
                     (void **)&ctx->s.logits, (void **)&ctx->s.ids,     (void **)&ctx->s.seq,
                     (void **)&ctx->s.pos,    (void **)&ctx->s.out_rows, (void **)&ctx->s.kv_end,
                     (void **)&ctx->s.kv_start, (void **)&ctx->s.out_ids, (void **)&ctx->s.top_ids,
                     (void **)&ctx->s.top_count, (void **)&ctx->s.top_vals, (void **)&ctx->s.extra_idx,
                     (void **)&ctx->s.extra_vals};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) be->ops->release(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(ctx->s.extra_idx_host);
    ctx->s.extra_idx_host = NULL;
}

static int scratch_alloc(g4_context *ctx, g4_error *err) {
    const g4_text_config *c = &ctx->model->cfg.text;
    g4_backend *be = ctx->model->be;
    const size_t n = (size_t)ctx->n_batch, H = (size_t)c->hidden_size;
    size_t qmax = 0, kvmax = 0, imax = 0;
    for (int l = 0; l < c->n_layers; l++) {
        size_t q = (size_t)c->n_heads * (size_t)c->layer_head_dim[l];
        size_t kv = (size_t)c->layer_kv_heads[l] * (size_t)c->layer_head_dim[l];
        if (q > qmax) qmax = q;
        if (kv > kvmax) kvmax = kv;
        if ((size_t)c->layer_intermediate[l] > imax) imax = (size_t)c->layer_intermediate[l];
    }
    const size_t LP = (size_t)c->n_layers * (size_t)c->hidden_size_per_layer_input;
    const size_t P = (size_t)c->hidden_size_per_layer_input;
    g4_scratch *s = &ctx->s;
    const int logit_rows = be->ops->host_memory ? LOGIT_ROWS : LOGIT_ROWS_DEVICE;
    s->logit_rows = ctx->n_batch < logit_rows ? ctx->n_batch : logit_rows;
#define ALLOC(field, count) \
    if (!(s->field = be->ops->alloc(be, (count) * sizeof(*s->field)))) goto oom
    ALLOC(h, n * H);
    ALLOC(h_spare, n * H);
    ALLOC(x, n * H);
    ALLOC(o, n * H);
    ALLOC(q, n * qmax);
    ALLOC(k, n * kvmax);
    ALLOC(v, n * kvmax);
    ALLOC(attn, n * qmax);
    ALLOC(gate, n * imax);
    ALLOC(up, n * imax);
    if (P) {
        ALLOC(ple, n * LP);
        ALLOC(ple_t, n * LP);
        ALLOC(ple_g, n * P);
        ALLOC(ple_h, n * H);
    }
    ALLOC(logits, (size_t)s->logit_rows * (size_t)c->vocab_size);
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        if (c->type_head_dim[t]) ALLOC(rope[t], n * (size_t)c->type_head_dim[t]);
    ALLOC(ids, n);
    ALLOC(seq, n);
    ALLOC(pos, n);
    ALLOC(out_rows, n);
    ALLOC(kv_end, n);
    ALLOC(kv_start, n);
    ALLOC(out_ids, n);
    const size_t cap = (size_t)g4_candidates_cap(G4_TOP_K_MAX);
    ALLOC(top_ids, (size_t)s->logit_rows * cap);
    ALLOC(top_vals, (size_t)s->logit_rows * cap);
    ALLOC(top_count, (size_t)s->logit_rows);
    ALLOC(extra_idx, (size_t)s->logit_rows * G4_TOP_K_MAX);
    ALLOC(extra_vals, (size_t)s->logit_rows * G4_TOP_K_MAX);
#undef ALLOC
    if (!(s->extra_idx_host = malloc((size_t)s->logit_rows * G4_TOP_K_MAX * sizeof(int32_t)))) goto oom;
    return 0;
oom:
    return g4_fail(err, "out of memory for a batch of %d tokens", ctx->n_batch);
}

/* params with their defaults filled in, or -1 with the message when they cannot make a context */
static int context_params(const g4_model *model, const g4_context_params *params, g4_context_params *out,
                          g4_error *err) {
    g4_context_params p = {0};
    if (params) p = *params;
    const g4_text_config *c = &model->cfg.text;
    if (p.n_seq_max < 0 || p.n_ctx < 0 || p.n_batch < 0 || p.kv_block_size < 0)
        return g4_fail(err, "negative context size (n_seq_max %d, n_ctx %d, n_batch %d, kv_block_size %d; 0 takes "
                            "the default)", p.n_seq_max, p.n_ctx, p.n_batch, p.kv_block_size);
    if (p.n_seq_max <= 0) p.n_seq_max = 1;
    if (p.n_ctx <= 0) p.n_ctx = c->max_position_embeddings < 8192 ? c->max_position_embeddings : 8192;
    if (p.n_batch <= 0) p.n_batch = 512;
    if (p.kv_block_size <= 0) p.kv_block_size = 32;
    if (p.n_seq_max > 65536 || p.n_ctx > (1 << 24) || p.n_batch > (1 << 20) || p.kv_block_size > 4096 ||
        (long)p.n_seq_max * ((p.n_ctx + p.kv_block_size - 1) / p.kv_block_size) > (1L << 26))
        return g4_fail(err, "context too large (%d sequences, %d positions, batch %d, KV blocks of %d)", p.n_seq_max,
                       p.n_ctx, p.n_batch, p.kv_block_size);
    if (p.kv_type != G4_KV_F32 && p.kv_type != G4_KV_BF16 && p.kv_type != G4_KV_F16)
        return g4_fail(err, "unknown KV cache type %d", (int)p.kv_type);
    if (p.n_kv_blocks < 0 || p.n_kv_sliding_blocks < 0)
        return g4_fail(err, "negative number of KV blocks %d / %d", p.n_kv_blocks, p.n_kv_sliding_blocks);
    if (p.kv_history > p.n_batch)
        return g4_fail(err, "kv_history %d exceeds n_batch %d", p.kv_history, p.n_batch);
    if (p.n_ctx > c->max_position_embeddings)
        return g4_fail(err, "n_ctx %d exceeds the model's max_position_embeddings %d", p.n_ctx,
                       c->max_position_embeddings);
    *out = p;
    return 0;
}

/* the history kv_cache_init takes: kv_history 0 is one batch, -1 none */
static int history_of(const g4_context_params *p) {
    return p->kv_history == 0 ? p->n_batch : p->kv_history < 0 ? 0 : p->kv_history;
}

size_t g4_kv_bytes_needed(const g4_model *model, const g4_context_params *params, g4_error *err) {
    g4_context_params p = {0};
    if (!model) {
        g4_fail(err, "g4_kv_bytes_needed: model is NULL");
        return 0;
    }
    if (context_params(model, params, &p, err)) return 0;
    return g4_kv_cache_bytes(&model->cfg.text, p.n_seq_max, p.n_ctx, p.n_batch, history_of(&p), p.kv_type,
                             p.kv_block_size, p.n_kv_blocks, p.n_kv_sliding_blocks);
}

int g4_context_fit_sequences(const g4_model *model, const g4_context_params *params, int max_seq, size_t *kv_bytes,
                             g4_error *err) {
    if (kv_bytes) *kv_bytes = 0;
    G4_ARG(model, err);
    size_t free_b, total;
    if (g4_model_memory(model, &free_b, &total, err)) return -1;
    g4_context_params p = {0};
    if (params) p = *params;
    const size_t reserve = total / 20 > G4_STEP_RESERVE_BYTES ? total / 20 : G4_STEP_RESERVE_BYTES;
    const size_t room = free_b > reserve ? free_b - reserve : 0;
    /* the largest n whose KV cache fits (it grows with n): lo fits or is 1, hi does not or is past max_seq */
    int lo = 1, hi = (max_seq > 1 ? max_seq : 1) + 1;
    size_t at_lo = 0;
    p.n_seq_max = 1;
    if (!(at_lo = g4_kv_bytes_needed(model, &p, err))) return -1;
    while (hi - lo > 1) {
        p.n_seq_max = lo + (hi - lo) / 2;
        const size_t b = g4_kv_bytes_needed(model, &p, err);
        if (!b) return -1;
        if (b <= room) lo = p.n_seq_max, at_lo = b;
        else hi = p.n_seq_max;
    }
    if (kv_bytes) *kv_bytes = at_lo;
    return lo;
}

int g4_context_new(g4_model *model, const g4_context_params *params, g4_context **out, g4_error *err) {
    G4_ARG(out, err);
    *out = NULL;
    G4_ARG(model, err);
    g4_context_params p = {0};
    if (context_params(model, params, &p, err)) return -1;
    const g4_text_config *c = &model->cfg.text;
    g4_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return g4_fail(err, "out of memory");
    ctx->model = model;
    ctx->n_seq = p.n_seq_max;
    ctx->n_ctx = p.n_ctx;
    ctx->n_batch = p.n_batch;
    ctx->pos_host = malloc((size_t)p.n_batch * sizeof(int32_t));
    ctx->rows_host = malloc((size_t)p.n_batch * sizeof(int32_t));
    ctx->zero_seq = calloc((size_t)p.n_batch, sizeof(int32_t));
    ctx->seq_added = calloc((size_t)p.n_seq_max, sizeof(int));
    ctx->seq_tokens = malloc((size_t)p.n_seq_max * (size_t)p.n_ctx * sizeof(int32_t));
    ctx->ids_host = malloc((size_t)p.n_batch * sizeof(int32_t));
    ctx->kv_end_host = malloc((size_t)p.n_batch * sizeof(int32_t));
    ctx->kv_start_host = malloc((size_t)p.n_batch * sizeof(int32_t));
    ctx->embedded_host = malloc((size_t)p.n_batch);
    if (!ctx->pos_host || !ctx->rows_host || !ctx->zero_seq || !ctx->seq_added || !ctx->seq_tokens ||
        !ctx->ids_host || !ctx->kv_end_host || !ctx->kv_start_host || !ctx->embedded_host) {
        g4_fail(err, "out of memory");
        goto fail;
    }
    pthread_mutex_lock(&model->backend_lock);
    int rc = g4_kv_cache_init(&ctx->kv, c, model->be, p.n_seq_max, p.n_ctx, p.n_batch, history_of(&p), p.kv_type,
                              p.kv_block_size, p.n_kv_blocks, p.n_kv_sliding_blocks, err) ||
             scratch_alloc(ctx, err);
    pthread_mutex_unlock(&model->backend_lock);
    if (rc) goto fail;
    *out = ctx;
    return 0;
fail:
    g4_context_free(ctx);
    return -1;
}

void g4_context_free(g4_context *ctx) {
    if (!ctx) return;
    g4_backend *be = ctx->model->be;
    pthread_mutex_lock(&ctx->model->backend_lock);
    if (be->ops->graph_forget) be->ops->graph_forget(be, ctx); /* recordings of this context's steps */
    scratch_free(ctx);
    if (ctx->kv.layers) g4_kv_cache_free(&ctx->kv);
    pthread_mutex_unlock(&ctx->model->backend_lock);
    free(ctx->pos_host);
    free(ctx->rows_host);
    free(ctx->zero_seq);
    free(ctx->seq_added);
    free(ctx->seq_tokens);
    free(ctx->ids_host);
    free(ctx->kv_end_host);
    free(ctx->kv_start_host);
    free(ctx->embedded_host);
    free(ctx);
}

int g4_context_n_ctx(const g4_context *ctx) { return ctx ? ctx->n_ctx : 0; }
g4_model *g4_context_model(const g4_context *ctx) { return ctx ? ctx->model : NULL; }

void g4_seq_reset(g4_context *ctx, int seq) {
    if (!ctx || seq < 0 || seq >= ctx->n_seq) return;
    g4_kv_cache_drop(&ctx->kv, seq, 0);
    ctx->kv.seq_len[seq] = 0;
}

int g4_seq_truncate(g4_context *ctx, int seq, int n, g4_error *err) {
    G4_ARG(ctx, err);
    if (seq < 0 || seq >= ctx->n_seq) return g4_fail(err, "sequence %d is outside 0..%d", seq, ctx->n_seq - 1);
    int len = ctx->kv.seq_len[seq];
    if (n < 0 || n > len) return g4_fail(err, "cannot truncate sequence %d of %d positions to %d", seq, len, n);
    if (!g4_kv_cache_can_resume(&ctx->kv, seq, n))
        return g4_fail(err, "cannot roll sequence %d back from %d to %d positions: the sliding window's blocks of "
                            "those positions were released", seq, len, n);
    g4_kv_cache_drop(&ctx->kv, seq, n);
    ctx->kv.seq_len[seq] = n;
    return 0;
}

int g4_seq_length(const g4_context *ctx, int seq) {
    return (ctx && seq >= 0 && seq < ctx->n_seq) ? ctx->kv.seq_len[seq] : -1;
}

const int32_t *g4_seq_tokens(const g4_context *ctx, int seq, int *n) {
    if (!ctx || seq < 0 || seq >= ctx->n_seq) {
        if (n) *n = 0;
        return NULL;
    }
    if (n) *n = ctx->kv.seq_len[seq];
    return ctx->seq_tokens + (size_t)seq * (size_t)ctx->n_ctx;
}

int g4_seq_reuse_prefix(g4_context *ctx, int seq, const int32_t *ids, int n) {
    if (!ctx || !ids || seq < 0 || seq >= ctx->n_seq || ctx->kv.seq_len[seq] != 0 || n <= 0) return 0;
    if (n > ctx->n_ctx) n = ctx->n_ctx;
    int k = g4_kv_cache_reuse(&ctx->kv, seq, ids, n);
    memcpy(ctx->seq_tokens + (size_t)seq * (size_t)ctx->n_ctx, ids, (size_t)k * sizeof *ids);
    return k;
}

int g4_kv_free_blocks(const g4_context *ctx) {
    if (!ctx) return 0;
    const g4_kv_pool *p = &ctx->kv.pool[G4_LAYER_FULL];
    if (!p->used) p = &ctx->kv.pool[G4_LAYER_SLIDING];
    return p->n_free;
}

size_t g4_kv_bytes(const g4_context *ctx) { return ctx ? ctx->kv.bytes : 0; }

void g4_context_capture(g4_context *ctx, float *hidden_per_layer, float *final_norm) {
    if (!ctx) return;
    ctx->capture_hidden = hidden_per_layer;
    ctx->capture_final = final_norm;
}

int g4_mm_placeholder(const g4_model *m, int32_t id) {
    const g4_model_config *c = &m->cfg;
    if (!c->multimodal_wrapper) return 0;
    return id == c->image_token_id ? 1 : id == c->video_token_id ? 2 : id == c->audio_token_id ? 3 : 0;
}

static int in_block(const g4_model *m, int32_t id) {
    int k = g4_mm_placeholder(m, id);
    return k == 1 || k == 2;
}

int g4_count_soft_tokens(const g4_model *m, const int32_t *ids, int n) {
    if (!m || !ids) return 0;
    int k = 0;
    for (int i = 0; i < n; i++) k += g4_mm_placeholder(m, ids[i]) != 0;
    return k;
}

int g4_step_length(const g4_model *m, const int32_t *ids, int n, int max, g4_error *err) {
    G4_ARG(m, err);
    G4_ARG(ids, err);
    if (max <= 0) return g4_fail(err, "a step of %d tokens", max);
    if (n <= max) return n;
    int end = max;
    while (end > 0 && in_block(m, ids[end - 1]) && in_block(m, ids[end])) end--;
    if (end == 0) {
        int run = 0;
        while (run < n && in_block(m, ids[run])) run++;
        return g4_fail(err, "an image of %d soft tokens does not fit a batch of %d tokens (its tokens must be "
                            "processed in one step)", run, max);
    }
    return end;
}

int32_t g4_token_read(const g4_model *m, int32_t id, g4_error *err) {
    const g4_text_config *c = &m->cfg.text;
    const int ple_rows = c->hidden_size_per_layer_input > 0 ? c->vocab_size_per_layer_input : 0;
    if (g4_mm_placeholder(m, id)) {
        /* a placeholder reads the pad token's rows (modeling_gemma4.py:2308), which transformers' embeddings
         * refuse outside their tables */
        if (c->pad_token_id < 0)
            return g4_fail(err, "the config has no pad_token_id (null or negative): the soft tokens' placeholders "
                                "take its embedding");
        if (c->pad_token_id >= c->vocab_size)
            return g4_fail(err, "the config's pad_token_id %d is outside the vocabulary (0..%d): the soft tokens' "
                                "placeholders take its embedding", c->pad_token_id, c->vocab_size - 1);
        id = c->pad_token_id;
    }
    /* so do the per-layer embeddings for an id past vocab_size_per_layer_input */
    if (ple_rows && id >= ple_rows)
        return g4_fail(err, "token id %d is outside the per-layer embedding table (vocab_size_per_layer_input %d)",
                       id, ple_rows);
    return id;
}

/* Marks the rows that take embedding rows, maps their ids to the pad token, and gives the tokens of
 * image/video runs their kv_end (2.7) and, for gemma4_unified, their kv_start: there a run is seen whole
 * from each of its tokens in every layer, beyond the sliding window too (docs/gemma4-unified.md 8, the
 * forward rule). Returns -1 on a count mismatch, else whether a run of the step attends bidirectionally
 * (ctx->kv_end_host and ctx->kv_start_host are then meaningful). */
static int multimodal_rows(g4_context *ctx, const g4_batch *b, const int32_t *seq, g4_error *err) {
    const g4_model *m = ctx->model;
    const int n = b->n_tokens, use_embd = b->embd != NULL;
    int n_mm = 0, bidi = 0;
    for (int i = 0; i < n; i++) {
        int kind = g4_mm_placeholder(m, b->token[i]);
        ctx->embedded_host[i] = kind && use_embd;
        if ((ctx->ids_host[i] = g4_token_read(m, b->token[i], err)) < 0)
            return g4_fail_prefix(err, "batch row %d", i);
        const int p = ctx->pos_host[i], W = m->cfg.text.sliding_window;
        ctx->kv_end_host[i] = p + 1;
        ctx->kv_start_host[i] = p - W + 1 > 0 ? p - W + 1 : 0;
        n_mm += kind != 0;
        bidi |= kind == 1 || kind == 2;
    }
    if (!use_embd && b->n_embd) return g4_fail(err, "n_embd is %d but embd is NULL", b->n_embd);
    if (use_embd && n_mm != b->n_embd)
        return g4_fail(err, "the batch has %d soft-token placeholders but %d embedding rows", n_mm, b->n_embd);
    if (!bidi || !use_embd || !m->cfg.text.bidirectional_vision) return 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && in_block(m, b->token[j]) && seq[j] == seq[i]) j++;
        for (int r = i; r < j; r++) {
            ctx->kv_end_host[r] = ctx->pos_host[j - 1] + 1;
            if (m->cfg.unified && ctx->pos_host[i] < ctx->kv_start_host[r]) ctx->kv_start_host[r] = ctx->pos_host[i];
        }
        i = j > i ? j : i + 1;
    }
    return 1;
}

/* The index of the first NaN of x[0 .. n), or -1 (blocks without a branch, so that the scan vectorizes). */
static int64_t first_nan(const float *x, size_t n) {
    for (size_t b = 0; b < n; b += 4096) {
        const size_t e = n - b < 4096 ? n : b + 4096;
        int any = 0;
        for (size_t i = b; i < e; i++) any |= x[i] != x[i];
        if (any)
            for (size_t i = b; i < e; i++)
                if (x[i] != x[i]) return (int64_t)i;
    }
    return -1;
}

/* Checks a batch, gives its tokens their positions, takes their KV blocks and runs the forward pass. */
static int decode_locked(g4_context *ctx, const g4_batch *b, float *logits, int32_t *ids, g4_candidates *cand,
                         g4_error *err) {
    const int n = b->n_tokens;
    const g4_text_config *c = &ctx->model->cfg.text;
    const int V = c->vocab_size;
    if (n <= 0) return g4_fail(err, "empty batch");
    if (n > ctx->n_batch) return g4_fail(err, "batch of %d tokens exceeds the context's limit of %d", n, ctx->n_batch);
    if (!b->token) return g4_fail(err, "a batch of %d tokens without its token array", n);
    const int32_t *seq = b->seq ? b->seq : ctx->zero_seq;
    int *added = ctx->seq_added;
    memset(added, 0, (size_t)ctx->n_seq * sizeof *added);
    /* positions continue each sequence; check ids, sequences, order and room */
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        if (b->token[i] < 0 || b->token[i] >= V)
            return g4_fail(err, "token id %d at batch row %d is outside the vocabulary (0..%d)", b->token[i], i, V - 1);
        if (seq[i] < 0 || seq[i] >= ctx->n_seq)
            return g4_fail(err, "sequence %d at batch row %d is outside 0..%d", seq[i], i, ctx->n_seq - 1);
        int p = ctx->kv.seq_len[seq[i]] + added[seq[i]]++;
        if (p >= ctx->n_ctx)
            return g4_fail(err, "sequence %d is full: position %d exceeds the context size %d", seq[i], p, ctx->n_ctx);
        ctx->pos_host[i] = p;
        if (!b->want_logits || b->want_logits[i]) ctx->rows_host[n_out++] = i;
    }
    const int bidi = multimodal_rows(ctx, b, seq, err);
    if (bidi < 0) return -1;
    /* the most keys a token sees per layer type: lo .. hi-1 (backend.h); kv_end on sliding layers (every layer
     * of gemma4_unified), kv_start on sliding layers */
    const int unified = ctx->model->cfg.unified;
    for (int t = 0; t < G4_LAYER_TYPES; t++) ctx->max_keys[t] = 0;
    for (int i = 0; i < n; i++) {
        int p = ctx->pos_host[i], hi = bidi ? ctx->kv_end_host[i] : p + 1;
        int lo = bidi ? ctx->kv_start_host[i] : p - c->sliding_window + 1 > 0 ? p - c->sliding_window + 1 : 0;
        int full = unified ? hi : p + 1;
        if (full > ctx->max_keys[G4_LAYER_FULL]) ctx->max_keys[G4_LAYER_FULL] = full;
        if (hi - lo > ctx->max_keys[G4_LAYER_SLIDING]) ctx->max_keys[G4_LAYER_SLIDING] = hi - lo;
    }
    ctx->max_seq_tokens = 0;
    for (int s = 0; s < ctx->n_seq; s++)
        if (added[s] > ctx->max_seq_tokens) ctx->max_seq_tokens = added[s];
    if (g4_kv_cache_prepare(&ctx->kv, added, n, seq, ctx->pos_host, err)) return -1;
    g4_step st = {n, ctx->ids_host, seq, ctx->pos_host, n_out, ctx->rows_host, bidi ? ctx->kv_end_host : NULL,
                  bidi && unified ? ctx->kv_start_host : NULL, b->embd, ctx->embedded_host};
    if (g4_forward(ctx, &st, logits, ids, cand, err)) return -1;
    /* NaN comes only from weights that hold NaN or infinities (transformers gives NaN logits there): an error,
     * as when the forward fails, rather than NaN handed on or sampled from */
    int64_t bad = -1;
    const char *what = "logits";
    int width = V;
    if (logits) {
        bad = first_nan(logits, (size_t)n_out * (size_t)V);
    } else if (ids) { /* the argmax of a row that holds NaN is -1 (backend.h) */
        for (int r = 0; bad < 0 && r < n_out; r++)
            if (ids[r] < 0) bad = (int64_t)r * V;
    } else if (cand) { /* so is the candidates' count, and the row came back */
        for (int r = 0; bad < 0 && r < n_out; r++)
            if (cand->count[r] < 0 && first_nan(cand->fallback + (size_t)r * V, (size_t)V) >= 0) bad = (int64_t)r * V;
    } else if (ctx->capture_final) {
        what = "hidden states", width = c->hidden_size;
        bad = first_nan(ctx->capture_final, (size_t)n_out * (size_t)width);
    }
    if (bad >= 0)
        return g4_fail(err, "the model computed NaN %s (batch row %d): its weights hold NaN or infinite values", what,
                       ctx->rows_host[bad / width]);
    /* soft-token rows are recorded as -1: they never match a prompt's ids (prefix reuse), nor enter the prefix cache */
    for (int i = 0; i < n; i++)
        ctx->seq_tokens[(size_t)seq[i] * (size_t)ctx->n_ctx + (size_t)ctx->pos_host[i]] =
            g4_mm_placeholder(ctx->model, b->token[i]) ? -1 : b->token[i];
    for (int s = 0; s < ctx->n_seq; s++) {
        if (!added[s]) continue;
        ctx->kv.seq_len[s] += added[s];
        g4_kv_cache_commit(&ctx->kv, s, ctx->seq_tokens + (size_t)s * (size_t)ctx->n_ctx, ctx->kv.seq_len[s]);
    }
    return 0;
}

/* Contexts of one model share its backend: their steps take turns. */
static int decode(g4_context *ctx, const g4_batch *b, float *logits, int32_t *ids, g4_candidates *cand,
                  g4_error *err) {
    if (!ctx || !b) return g4_fail(err, "g4_decode: %s is NULL", ctx ? "the batch" : "the context");
    pthread_mutex_lock(&ctx->model->backend_lock);
    int rc = decode_locked(ctx, b, logits, ids, cand, err);
    pthread_mutex_unlock(&ctx->model->backend_lock);
    return rc;
}

int g4_decode(g4_context *ctx, const g4_batch *b, float *logits, g4_error *err) {
    return decode(ctx, b, logits, NULL, NULL, err);
}

int g4_decode_greedy(g4_context *ctx, const g4_batch *b, int32_t *ids, g4_error *err) {
    return decode(ctx, b, NULL, ids, NULL, err);
}

int g4_context_candidates_max(const g4_context *ctx) {
    const char *e = getenv("G4_SAMPLE_CANDIDATES");
    const int on = e && *e ? strcmp(e, "0") != 0 : !ctx->model->be->ops->host_memory;
    return on ? G4_TOP_K_MAX : 0;
}

int g4_decode_candidates(g4_context *ctx, const g4_batch *b, g4_candidates *cand, g4_error *err) {
    if (cand->k < 1 || cand->k > G4_TOP_K_MAX || cand->cap != g4_candidates_cap(cand->k))
        return g4_fail(err, "top-k candidates: k %d or cap %d out of range", cand->k, cand->cap);
    if (cand->n_extra < 0 || (cand->n_extra > 0 && (!cand->extra_row || !cand->extra_id || !cand->extra_vals)))
        return g4_fail(err, "top-k candidates: %d extra ids without their arrays", cand->n_extra);
    int n_out = 0;
    for (int i = 0; i < b->n_tokens; i++) n_out += !b->want_logits || b->want_logits[i];
    const int V = ctx->model->cfg.text.vocab_size;
    if ((int64_t)ctx->s.logit_rows * V > INT32_MAX)
        return g4_fail(err, "top-k candidates: a vocabulary of %d is too large for extra ids", V);
    for (int i = 0, run = 0; i < cand->n_extra; i++) {
        const int32_t r = cand->extra_row[i], id = cand->extra_id[i];
        run = i > 0 && r == cand->extra_row[i - 1] ? run + 1 : 1;
        if (r < 0 || r >= n_out || (i > 0 && r < cand->extra_row[i - 1]) || id < 0 || id >= V || run > G4_TOP_K_MAX)
            return g4_fail(err, "top-k candidates: extra id %d of row %d (entry %d): rows ascend below %d, ids below "
                           "%d, at most %d a row", id, r, i, n_out, V, G4_TOP_K_MAX);
    }
    return decode(ctx, b, NULL, NULL, cand, err);
}
