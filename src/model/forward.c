/* The Gemma 4 text decoder, written once against the backend op table
 * (docs/gemma4-text.md section 3). Every feature is a branch driven by the config:
 * per-layer embeddings, sliding/full attention with their own head sizes and RoPE,
 * KV sharing, keys-as-values, double-wide MLP, mixture of experts, layer scalars,
 * final norm, tied head and soft-cap. Activations are float32 in backend memory;
 * the KV cache is paged (src/engine/kv_cache.h). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "engine/context.h"

#define OPS (be->ops)

/* Per-layer embeddings of the step's tokens, laid out [L, n, P] so that each layer
 * reads a contiguous [n, P] block (3.2). */
static void per_layer_inputs(g4_context *ctx, const g4_step *st) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int n = st->n, L = c->n_layers, P = c->hidden_size_per_layer_input, H = c->hidden_size;
    const size_t LP = (size_t)L * (size_t)P;
    /* token part: Eple[id] * sqrt(P) into ple_t (used as a temporary) */
    if (m->ple_on_host) { /* the table stays in host memory: gather its rows here, copy them in */
        g4_tensor_rows_f32(m->ple_embed, st->ids, n, sqrtf((float)P), s->host_rows);
        OPS->to_device(be, s->ple_t, s->host_rows, (size_t)n * LP * sizeof(float));
    } else {
        OPS->embed(be, m->ple_embed, s->ids, n, sqrtf((float)P), s->ple_t);
    }
    /* context part: (h0 * Wplm^T) * H^-0.5, RMS-normalized per P-slice */
    OPS->matmul(be, s->h, n, m->ple_model_proj, NULL, s->ple);
    OPS->scale(be, s->ple, (size_t)n * LP, (float)pow((double)H, -0.5));
    OPS->rmsnorm(be, s->ple, m->ple_proj_norm, n * L, P, (float)c->rms_norm_eps, s->ple);
    /* (ctx + tok) * 2^-0.5 */
    OPS->add_scale(be, s->ple, s->ple_t, (size_t)n * LP, (float)pow(2.0, -0.5));
    OPS->transpose(be, s->ple, n, L, P, s->ple_t);
}

static void attention_block(g4_context *ctx, int l, int n) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    const g4_layer *y = &m->layers[l];
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int H = c->hidden_size, NH = c->n_heads, D = c->layer_head_dim[l], KV = c->layer_kv_heads[l];
    const int type = c->layer_type[l];
    const float eps = (float)c->rms_norm_eps;
    const float *rope = s->rope[type];
    const g4_kv_layer *kvl = &ctx->kv.layers[l];
    const g4_kv_pool *pool = &ctx->kv.pool[type];

    OPS->rmsnorm(be, s->h, y->input_norm, n, H, eps, s->x);
    if (!c->layer_kv_shared[l]) {
        /* q, k and v from one pass over x; keys as values: V = v_norm(raw k_proj output) */
        g4_matmul_set qkv = {y->v_proj ? 3 : 2, {y->q_proj, y->k_proj, y->v_proj}, {y->q_bias, y->k_bias, y->v_bias},
                             {s->q, s->k, s->v}};
        OPS->matmul_set(be, s->x, n, &qkv);
        if (!y->v_proj) OPS->copy(be, s->v, s->k, (size_t)n * KV * D * sizeof(float));
        OPS->head_norm_rope(be, s->k, n, KV, D, y->k_norm, eps, rope);
        OPS->head_norm_rope(be, s->v, n, KV, D, NULL, eps, NULL);
        OPS->kv_store(be, s->k, s->v, n, kvl->row, pool->slot_dev, kvl->k, kvl->v, ctx->kv.type);
    } else { /* a KV-shared layer reads its source layer's rows (kvl points at them) */
        OPS->matmul(be, s->x, n, y->q_proj, y->q_bias, s->q);
    }
    OPS->head_norm_rope(be, s->q, n, NH, D, y->q_norm, eps, rope);
    g4_attention_args a = {
        .q = s->q, .out = s->attn, .n_tokens = n, .n_heads = NH, .n_kv_heads = KV, .head_dim = D,
        .seq = s->seq, .pos = s->pos, .kv_end = type == G4_LAYER_SLIDING ? ctx->step_kv_end : NULL,
        .k = kvl->k, .v = kvl->v, .kv_type = ctx->kv.type, .block_table = pool->table_dev,
        .max_blocks = pool->max_blocks, .block_size = ctx->kv.block, .window = kvl->window,
        .max_keys = ctx->max_keys[type], .scale = 1.0f,
    };
    OPS->attention(be, &a);
    OPS->matmul(be, s->attn, n, y->o_proj, y->o_bias, s->o);
    OPS->post_norm_add(be, s->h, s->o, y->post_attn_norm, n, H, eps, 1.0f);
}

/* The feed-forward sublayer; `scale` is applied to the residual stream after its add. */
static void feed_forward_block(g4_context *ctx, int l, int n, float scale) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    const g4_layer *y = &m->layers[l];
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int H = c->hidden_size, I = c->layer_intermediate[l];
    const float eps = (float)c->rms_norm_eps;

    /* s->h is the residual r of this block until the final add */
    OPS->rmsnorm(be, s->h, y->pre_ff_norm, n, H, eps, s->x);
    g4_matmul_set gu = {2, {y->gate_proj, y->up_proj}, {NULL, NULL}, {s->gate, s->up}};
    OPS->matmul_set(be, s->x, n, &gu);
    OPS->gelu_mul(be, s->gate, s->up, (size_t)n * I, s->gate);
    OPS->matmul(be, s->gate, n, y->down_proj, NULL, s->o);
    if (c->enable_moe_block) {
        OPS->rmsnorm(be, s->o, y->post_ff_norm1, n, H, eps, s->o);
        OPS->rmsnorm(be, s->h, y->pre_ff_norm2, n, H, eps, s->moe_x2);
        g4_moe_args a = {
            .residual = s->h, .x2 = s->moe_x2, .out = s->moe_out, .n = n, .hidden = H,
            .n_experts = c->num_experts, .top_k = c->top_k_experts, .expert_dim = c->moe_intermediate_size,
            .eps = eps, .router_proj = y->router_proj, .router_scale = y->router_scale,
            .per_expert_scale = y->per_expert_scale, .gate_up = y->experts_gate_up, .up = y->experts_up, .down = y->experts_down,
        };
        OPS->moe(be, &a);
        OPS->rmsnorm(be, s->moe_out, y->post_ff_norm2, n, H, eps, s->moe_out);
        OPS->add(be, s->o, s->moe_out, (size_t)n * H);
    }
    OPS->post_norm_add(be, s->h, s->o, y->post_ff_norm, n, H, eps, scale);
}

static void per_layer_input_block(g4_context *ctx, int l, int n, float scale) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    const g4_layer *y = &m->layers[l];
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int H = c->hidden_size, P = c->hidden_size_per_layer_input;
    OPS->matmul(be, s->h, n, y->ple_gate, NULL, s->ple_g);
    OPS->gelu_mul(be, s->ple_g, s->ple_t + (size_t)l * (size_t)n * (size_t)P, (size_t)n * P, s->ple_g);
    OPS->matmul(be, s->ple_g, n, y->ple_proj, NULL, s->ple_h);
    OPS->post_norm_add(be, s->h, s->ple_h, y->ple_post_norm, n, H, (float)c->rms_norm_eps, scale);
}

/* Final norm, tied head and soft-cap for the requested rows, in chunks of logit_rows: copied to the caller's
 * host buffer `logits`, or reduced to their argmax in `ids` (host) when logits is NULL. */
static void head(g4_context *ctx, const g4_step *st, float *logits, int32_t *ids) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int H = c->hidden_size, V = c->vocab_size;
    OPS->get_rows(be, s->h, s->out_rows, st->n_out, H, s->x);
    OPS->rmsnorm(be, s->x, m->final_norm, st->n_out, H, (float)c->rms_norm_eps, s->x);
    if (ctx->capture_final) OPS->to_host(be, ctx->capture_final, s->x, (size_t)st->n_out * H * sizeof(float));
    if (!logits && !ids) return; /* only the final norm was wanted (g4_embed) */
    for (int r0 = 0; r0 < st->n_out; r0 += s->logit_rows) {
        int nr = st->n_out - r0 < s->logit_rows ? st->n_out - r0 : s->logit_rows;
        OPS->matmul(be, s->x + (size_t)r0 * H, nr, m->lm_head, NULL, s->logits);
        if (c->has_softcap) OPS->softcap(be, s->logits, (size_t)nr * V, (float)c->final_logit_softcapping);
        if (logits) {
            OPS->to_host(be, logits + (size_t)r0 * V, s->logits, (size_t)nr * V * sizeof(float));
        } else {
            OPS->argmax(be, s->logits, nr, V, s->out_ids);
            OPS->to_host(be, ids + r0, s->out_ids, (size_t)nr * sizeof(int32_t));
        }
    }
}

int g4_forward(g4_context *ctx, const g4_step *st, float *logits, int32_t *ids, g4_error *err) {
    const g4_model *m = ctx->model;
    const g4_text_config *c = &m->cfg.text;
    g4_backend *be = m->be;
    g4_scratch *s = &ctx->s;
    const int n = st->n;

    OPS->to_device(be, s->ids, st->ids, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->seq, st->seq, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->pos, st->pos, (size_t)n * sizeof(int32_t));
    OPS->to_device(be, s->out_rows, st->out_rows, (size_t)st->n_out * sizeof(int32_t));
    ctx->step_kv_end = NULL;
    if (st->kv_end) {
        OPS->to_device(be, s->kv_end, st->kv_end, (size_t)n * sizeof(int32_t));
        ctx->step_kv_end = s->kv_end;
    }

    for (int t = 0; t < G4_LAYER_TYPES; t++) /* one cos/sin table per layer type serves every layer */
        if (c->type_head_dim[t]) OPS->rope_table(be, s->pos, n, m->inv_freq[t], c->type_head_dim[t] / 2, s->rope[t]);
    OPS->embed(be, m->embed, s->ids, n, m->embed_scale, s->h);
    const int ple = c->hidden_size_per_layer_input > 0;
    if (ple) per_layer_inputs(ctx, st);
    for (int l = 0; l < c->n_layers; l++) {
        const float layer_scalar = m->layers[l].layer_scalar; /* scales the residual stream after the layer */
        attention_block(ctx, l, n);
        feed_forward_block(ctx, l, n, ple ? 1.0f : layer_scalar);
        if (ple) per_layer_input_block(ctx, l, n, layer_scalar);
        if (ctx->capture_hidden)
            OPS->to_host(be, ctx->capture_hidden + (size_t)l * n * c->hidden_size, s->h,
                         (size_t)n * c->hidden_size * sizeof(float));
    }
    if (st->n_out > 0) head(ctx, st, logits, ids);
    OPS->sync(be);
    return OPS->check(be, err);
}
