/* The Gemma 4 text decoder, written once against the backend op table
 * (docs/gemma4-text.md section 3). Every feature is a branch driven by the config:
 * per-layer embeddings, sliding/full attention with their own head sizes and RoPE,
 * KV sharing, keys-as-values, double-wide MLP, mixture of experts, layer scalars,
 * final norm, tied head and soft-cap. Activations are float32 in backend memory;
 * the KV cache is paged (src/engine/kv_cache.h).
 *
 * A step has two parts: copying its inputs in (token ids, positions, the rows of a table kept on the host),
 * then the computation, which reads only buffers at fixed addresses, so that a backend can record it once and
 * replay it for every later step of the same shape (graph_begin; one recording per context and shape). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/context.h"

#define OPS (be->ops)

/* Steps of at most this many tokens are replayed from recordings where the backend can (decode batches: up to
 * GRAPH_DECODE_BATCH sequences). */
#define GRAPH_MAX_TOKENS 8
#define GRAPH_DECODE_BATCH 128

/* The residual stream between sublayers. A sublayer's closing update h = (h + rmsnorm(o) * w) * scale is left
 * pending and done by the next matmul_set as its prologue (one pass less over the stream on a GPU); that
 * writes the updated stream to the spare buffer, and the two swap. settle() does a pending update alone. */
typedef struct residual {
    float *h, *spare;
    const float *o, *w;
    float scale;
    int pending;
} residual;

static void update_later(residual *r, const float *o, const float *w, float scale) {
    r->o = o, r->w = w, r->scale = scale, r->pending = 1;
}

/* The input of a matmul_set that reads the stream: the pending update becomes its prologue. */
static const float *stream_input(residual *r, g4_matmul_set *set) {
    if (r->pending) {
        set->res_h = r->h, set->res_o = r->o, set->res_w = r->w, set->res_scale = r->scale, set->res_out = r->spare;
        float *t = r->h;
        r->h = r->spare, r->spare = t, r->pending = 0;
    }
    return r->h;
}

static void settle(g4_context *ctx, residual *r, int n) {
    if (!r->pending) return;
    const g4_text_config *c = &ctx->model->cfg.text;
    g4_backend *be = ctx->model->be;
    OPS->post_norm_add(be, r->h, r->o, r->w, n, c->hidden_size, (float)c->rms_norm_eps, r->scale);
    r->pending = 0;
}

/* Per-layer embeddings of the step's tokens, laid out [L, n, P] so that each layer
 * reads a contiguous [n, P] block (3.2). The token part is already in s->ple_t. */
static void per_layer_inputs(g4_context *ctx, const float *h, int n) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int L = c->n_layers, P = c->hidden_size_per_layer_input, H = c->hidden_size;
    const size_t LP = (size_t)L * (size_t)P;
    /* context part: (h0 * Wplm^T) * H^-0.5, RMS-normalized per P-slice */
    OPS->matmul(be, h, n, m->ple_model_proj, NULL, s->ple);
    OPS->scale(be, s->ple, (size_t)n * LP, (float)pow((double)H, -0.5));
    OPS->rmsnorm(be, s->ple, m->ple_proj_norm, n * L, P, (float)c->rms_norm_eps, s->ple);
    /* (ctx + tok) * 2^-0.5 */
    OPS->add_scale(be, s->ple, s->ple_t, (size_t)n * LP, (float)pow(2.0, -0.5));
    OPS->transpose(be, s->ple, n, L, P, s->ple_t);
}

/* Multimodal soft tokens replace the (pad) embeddings of their rows, unscaled (docs/gemma4-towers.md 4):
 * one copy per run of consecutive embedded rows. */
static void merge_embeddings(g4_context *ctx, const g4_step *st, float *h) {
    g4_backend *be = ctx->model->be;
    const size_t H = (size_t)ctx->model->cfg.text.hidden_size;
    size_t used = 0;
    for (int i = 0; i < st->n;) {
        if (!st->embedded[i]) {
            i++;
            continue;
        }
        int j = i;
        while (j < st->n && st->embedded[j]) j++;
        OPS->to_device(be, h + (size_t)i * H, st->embd + used * H, (size_t)(j - i) * H * sizeof(float));
        used += (size_t)(j - i);
        i = j;
    }
}

static void attention_block(g4_context *ctx, residual *r, int l, int n) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    const g4_layer *y = &m->layers[l];
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int NH = c->n_heads, D = c->layer_head_dim[l], KV = c->layer_kv_heads[l];
    const int type = c->layer_type[l], shared = c->layer_kv_shared[l];
    const float eps = (float)c->rms_norm_eps;
    const g4_kv_layer *kvl = &ctx->kv.layers[l];
    const g4_kv_pool *pool = &ctx->kv.pool[type];

    /* q, k and v from one pass over the normalized residual (a KV-shared layer reads its source layer's
     * rows, kvl points at them: only q) */
    g4_matmul_set qkv = {shared ? 1 : y->v_proj ? 3 : 2, {y->q_proj, y->k_proj, y->v_proj},
                         {y->q_bias, y->k_bias, y->v_bias}, {s->q, s->k, s->v}, .norm = y->input_norm, .eps = eps};
    OPS->matmul_set(be, stream_input(r, &qkv), n, &qkv);
    g4_attn_prep_args prep = {
        .q = s->q, .k = s->k, .v = s->v, .n = n, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
        .kv_shared = shared, .v_from_k = !y->v_proj, .q_norm = y->q_norm, .k_norm = y->k_norm, .eps = eps,
        .rope = s->rope[type], .slot = pool->slot_dev, .k_cache = kvl->k, .v_cache = kvl->v, .kv_type = ctx->kv.type,
    };
    g4_attention_args a = {
        .q = s->q, .out = s->attn, .n_tokens = n, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
        .seq = s->seq, .pos = s->pos,
        /* image blocks: sliding layers (every layer of gemma4_unified, beyond the window too) */
        .kv_end = type == G4_LAYER_SLIDING || m->cfg.unified ? ctx->step_kv_end : NULL,
        .kv_start = type == G4_LAYER_SLIDING ? ctx->step_kv_start : NULL,
        .k = kvl->k, .v = kvl->v, .kv_type = ctx->kv.type, .block_table = pool->table_dev,
        .max_blocks = pool->max_blocks, .block_size = ctx->kv.block, .window = kvl->window,
        .max_keys = ctx->max_keys[type], .max_seq_tokens = ctx->max_seq_tokens, .scale = 1.0f, .prep = &prep, /* q/k norms, RoPE, the KV store first */
    };
    OPS->attention(be, &a);
    OPS->matmul(be, s->attn, n, y->o_proj, y->o_bias, s->o);
    update_later(r, s->o, y->post_attn_norm, 1.0f);
}

/* The feed-forward sublayer; `scale` is applied to the residual stream after its add. */
static void feed_forward_block(g4_context *ctx, residual *r, int l, int n, float scale) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    const g4_layer *y = &m->layers[l];
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;

    /* r->h is the residual of this block until the final add */
    g4_matmul_set gu = {2, {y->gate_proj, y->up_proj}, {NULL, NULL}, {s->gate, s->up}, .norm = y->pre_ff_norm,
                        .eps = eps, .geglu = 1};
    if (c->enable_moe_block) { /* o = post_norm1(mlp(h)) + post_norm2(experts(pre_norm2(h))), both in one op */
        g4_moe_args a = {
            .dense = s->o, .out = s->o, .n = n, .hidden = H, .n_experts = c->num_experts,
            .top_k = c->top_k_experts, .expert_dim = c->moe_intermediate_size, .eps = eps,
            .pre_norm2 = y->pre_ff_norm2, .post_norm1 = y->post_ff_norm1, .post_norm2 = y->post_ff_norm2,
            .router_proj = y->router_proj, .router_scale = y->router_scale, .per_expert_scale = y->per_expert_scale,
            .gate_up = y->experts_gate_up, .up = y->experts_up, .down = y->experts_down,
            .mlp = gu, .mlp_down = y->down_proj,
        };
        a.residual = stream_input(r, &a.mlp);
        OPS->moe(be, &a);
    } else {
        OPS->matmul_set(be, stream_input(r, &gu), n, &gu);
        OPS->matmul(be, s->gate, n, y->down_proj, NULL, s->o);
    }
    update_later(r, s->o, y->post_ff_norm, scale);
}

static void per_layer_input_block(g4_context *ctx, residual *r, int l, int n, float scale) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    const g4_layer *y = &m->layers[l];
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int P = c->hidden_size_per_layer_input;
    g4_matmul_set gate = {1, {y->ple_gate}, {NULL}, {s->ple_g}, .eps = (float)c->rms_norm_eps, .geglu = 1,
                          .mul = s->ple_t + (size_t)l * (size_t)n * (size_t)P};
    OPS->matmul_set(be, stream_input(r, &gate), n, &gate);
    OPS->matmul(be, s->ple_g, n, y->ple_proj, NULL, s->ple_h);
    update_later(r, s->ple_h, y->ple_post_norm, scale);
}

/* Final norm of the requested rows of the stream h into s->x (copied to the capture buffer when one is set). */
static void final_norm(g4_context *ctx, const float *h, const g4_step *st) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int H = c->hidden_size;
    OPS->get_rows(be, h, s->out_rows, st->n_out, H, s->x);
    OPS->rmsnorm(be, s->x, m->final_norm, st->n_out, H, (float)c->rms_norm_eps, s->x);
    if (ctx->capture_final) OPS->to_host(be, ctx->capture_final, s->x, (size_t)st->n_out * H * sizeof(float));
}

/* What the head gives back: the logits rows, their argmax, or their top-k candidates (context.h). */
typedef enum { HEAD_LOGITS, HEAD_IDS, HEAD_TOP } head_mode;

/* Tied head and soft-cap of nr normalized rows from row r0 into s->logits, then their argmax into s->out_ids or
 * their top-k candidates into s->top_* (k: cand's) as the mode asks. */
static void head_rows(g4_context *ctx, int r0, int nr, head_mode mode, const g4_candidates *cand) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    g4_matmul_set head = {1, {m->lm_head}, {NULL}, {s->logits},
                          .softcap = c->has_softcap ? (float)c->final_logit_softcapping : 0.0f};
    OPS->matmul_set(be, s->x + (size_t)r0 * c->hidden_size, nr, &head);
    if (mode == HEAD_IDS) OPS->argmax(be, s->logits, nr, c->vocab_size, s->out_ids);
    if (mode == HEAD_TOP)
        OPS->top_k(be, s->logits, nr, c->vocab_size, cand->k, cand->cap, s->top_ids, s->top_vals, s->top_count);
}

/* Copies the head's results of rows r0 .. r0+nr-1 out: logits, ids or candidates (a row whose candidates
 * overflowed brings its logits). */
static void head_out(g4_context *ctx, int r0, int nr, float *logits, int32_t *ids, g4_candidates *cand) {
    g4_backend *be = ctx->model->be;
    g4_scratch *s = &ctx->s;
    const size_t V = (size_t)ctx->model->cfg.text.vocab_size;
    if (logits) {
        OPS->to_host(be, logits + (size_t)r0 * V, s->logits, (size_t)nr * V * sizeof(float));
    } else if (ids) {
        OPS->to_host(be, ids + r0, s->out_ids, (size_t)nr * sizeof(int32_t));
    } else {
        const size_t cap = (size_t)cand->cap, at = (size_t)r0 * cap;
        OPS->to_host(be, cand->count + r0, s->top_count, (size_t)nr * sizeof(int32_t));
        OPS->to_host(be, cand->ids + at, s->top_ids, (size_t)nr * cap * sizeof(int32_t));
        OPS->to_host(be, cand->vals + at, s->top_vals, (size_t)nr * cap * sizeof(float));
        OPS->sync(be);
        for (int i = 0; i < nr; i++)
            if (cand->count[r0 + i] < 0)
                OPS->to_host(be, cand->fallback + (size_t)(r0 + i) * V, s->logits + (size_t)i * V, V * sizeof(float));
        /* the extra ids of these rows: single logits gathered (rows of one float) */
        int e0 = 0, e1;
        while (e0 < cand->n_extra && cand->extra_row[e0] < r0) e0++;
        for (e1 = e0; e1 < cand->n_extra && cand->extra_row[e1] < r0 + nr; e1++)
            s->extra_idx_host[e1 - e0] = (int32_t)((size_t)(cand->extra_row[e1] - r0) * V + (size_t)cand->extra_id[e1]);
        if (e1 > e0) {
            OPS->to_device(be, s->extra_idx, s->extra_idx_host, (size_t)(e1 - e0) * sizeof(int32_t));
            OPS->get_rows(be, s->logits, s->extra_idx, e1 - e0, 1, s->extra_vals);
            OPS->to_host(be, cand->extra_vals + e0, s->extra_vals, (size_t)(e1 - e0) * sizeof(float));
        }
    }
}

/* Everything between the input copies and the head's output copies. */
static void compute(g4_context *ctx, const g4_step *st, int head_in_step, head_mode mode, const g4_candidates *cand) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int n = st->n;
    for (int t = 0; t < G4_LAYER_TYPES; t++) /* one cos/sin table per layer type serves every layer */
        if (c->type_head_dim[t]) OPS->rope_table(be, s->pos, n, m->inv_freq[t], c->type_head_dim[t] / 2, s->rope[t]);
    residual r = {s->h, s->h_spare, NULL, NULL, 1.0f, 0};
    OPS->embed(be, m->embed, s->ids, n, m->embed_scale, r.h);
    if (st->embd) merge_embeddings(ctx, st, r.h);
    const int ple = c->hidden_size_per_layer_input > 0;
    if (ple && !m->ple_on_host) /* the token part of the per-layer inputs, from the table in backend memory */
        OPS->embed(be, m->ple_embed, s->ids, n, sqrtf((float)c->hidden_size_per_layer_input), s->ple_t);
    if (ple) per_layer_inputs(ctx, r.h, n);
    for (int l = 0; l < c->n_layers; l++) {
        const float layer_scalar = m->layers[l].layer_scalar; /* scales the residual stream after the layer */
        attention_block(ctx, &r, l, n);
        feed_forward_block(ctx, &r, l, n, ple ? 1.0f : layer_scalar);
        if (ple) per_layer_input_block(ctx, &r, l, n, layer_scalar);
        if (ctx->capture_hidden) {
            settle(ctx, &r, n);
            OPS->to_host(be, ctx->capture_hidden + (size_t)l * n * c->hidden_size, r.h,
                         (size_t)n * c->hidden_size * sizeof(float));
        }
    }
    if (st->n_out > 0) {
        settle(ctx, &r, n);
        final_norm(ctx, r.h, st);
    }
    if (head_in_step) head_rows(ctx, 0, st->n_out, mode, cand);
}

int g4_forward(g4_context *ctx, const g4_step *st, float *logits, int32_t *ids, g4_candidates *cand,
               g4_error *err) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int n = st->n;

    /* 1. inputs */
    OPS->to_device(be, s->ids, st->ids, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->seq, st->seq, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->pos, st->pos, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->out_rows, st->out_rows, (size_t)st->n_out * sizeof(int32_t));
    ctx->step_kv_end = ctx->step_kv_start = NULL;
    if (st->kv_end) {
        OPS->to_device(be, s->kv_end, st->kv_end, (size_t)n * sizeof(int32_t));
        ctx->step_kv_end = s->kv_end;
    }
    if (st->kv_start) {
        OPS->to_device(be, s->kv_start, st->kv_start, (size_t)n * sizeof(int32_t));
        ctx->step_kv_start = s->kv_start;
    }

    if (c->hidden_size_per_layer_input > 0 && m->ple_on_host) { /* token part of the per-layer inputs, Eple[id] *
                                                                    * sqrt(P), from the table in host memory (else
                                                                    * in compute) */
        OPS->rows_to_device(be, s->ple_t, m->ple_embed, st->ids, n, sqrtf((float)c->hidden_size_per_layer_input));
    }

    /* 2. the computation, recorded and replayed for small steps where the backend can; without logits and ids
     * only the final norm is wanted (g4_embed: capture_final) */
    const int head = st->n_out > 0 && (logits || ids || cand);
    const int one_chunk = st->n_out <= s->logit_rows;
    const head_mode mode = logits ? HEAD_LOGITS : ids ? HEAD_IDS : HEAD_TOP;
    /* and decode batches (a token a sequence) of up to GRAPH_DECODE_BATCH sequences of models without experts (H200,
     * E2B decode tok/s, 16 / 64 / 100 sequences: +20 / +5 / 0%; E4B +8 / +3 / +3%); G4_GRAPH_DECODE_BATCH=N sets the
     * bound (0: none) */
    static int decode_batch_max = -1;
    if (decode_batch_max < 0) {
        const char *e = getenv("G4_GRAPH_DECODE_BATCH");
        decode_batch_max = e && *e ? atoi(e) : GRAPH_DECODE_BATCH;
    }
    const int decode_batch = ctx->max_seq_tokens == 1 && n <= decode_batch_max && !c->enable_moe_block;
    const int replayable = OPS->graph_begin && one_chunk && (n <= GRAPH_MAX_TOKENS || decode_batch) &&
                           !ctx->capture_hidden && !ctx->capture_final && !st->embd &&
                           !st->kv_start; /* soft tokens: host rows copied in each step */
    const int top_k = mode == HEAD_TOP && cand ? cand->k : 0; /* (no output at all: the mode is not used) */
    const uint64_t key = (uint64_t)n | (uint64_t)st->n_out << 16 | (uint64_t)mode << 32 |
                         (uint64_t)(st->kv_end != NULL) << 34 | (uint64_t)top_k << 35 | (uint64_t)decode_batch << 46;
    if (!replayable || !OPS->graph_begin(be, ctx, key)) {
        compute(ctx, st, one_chunk && head, mode, cand);
        if (replayable) OPS->graph_end(be);
    }

    /* 3. outputs */
    if (head) {
        if (one_chunk) {
            head_out(ctx, 0, st->n_out, logits, ids, cand);
        } else {
            for (int r0 = 0; r0 < st->n_out; r0 += s->logit_rows) {
                int nr = st->n_out - r0 < s->logit_rows ? st->n_out - r0 : s->logit_rows;
                head_rows(ctx, r0, nr, mode, cand);
                head_out(ctx, r0, nr, logits, ids, cand);
            }
        }
    }
    OPS->sync(be);
    return OPS->check(be, err);
}
