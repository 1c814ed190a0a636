/* The Gemma 4 assistant's forward pass, written once against the backend op table (docs/gemma4-assistant.md
 * section 3). One draft step: the main model's scaled embedding of the token and a hidden vector, concatenated,
 * pre_projection, La decoder layers that only make queries and attend to the main model's K/V rows (straight
 * from its paged cache, through the sequence's block table), final norm, post_projection (the next step's hidden
 * vector) and the head: dense (Ea, no soft-cap) or the centroid masked embedder; the argmax is the draft and the
 * next step's token, written in backend memory, so the steps of a round run without a round trip to the host.
 * All steps of a round share the position p, the RoPE of the queries and the rows (3.5, 5). */
#include "core/error.h"
#include "engine/speculative.h"

#define OPS (be->ops)

/* One decoder layer (3.2, 3.3) on the single row s->z. */
static void layer(g4_spec *s, int l, const g4_draft_rows *rows) {
    const g4_model *dm = s->d->m;
    const g4_text_config *c = &dm->cfg.text;
    const g4_layer *y = &dm->layers[l];
    const g4_context *ctx = s->ctx;
    g4_backend *be = dm->be;
    const int Ha = c->hidden_size, NH = c->n_heads, D = c->layer_head_dim[l], t = c->layer_type[l];
    const float eps = (float)c->rms_norm_eps;
    const g4_kv_layer *src = &ctx->kv.layers[s->d->src[t]];
    const g4_kv_pool *pool = &ctx->kv.pool[t];
    const int lo = rows->lo[t], hi = rows->hi[t];

    OPS->rmsnorm(be, s->z, y->input_norm, 1, Ha, eps, s->xn);
    OPS->matmul(be, s->xn, 1, y->q_proj, y->q_bias, s->q);
    OPS->head_norm_rope(be, s->q, 1, NH, D, y->q_norm, eps, s->rope[t]);
    /* keys lo .. hi-1: the op's query position is hi - 1 and its window hi - lo (none when lo is 0) */
    g4_attention_args a = {
        .q = s->q, .out = s->attn, .n_tokens = 1, .n_heads = NH, .n_kv_heads = c->layer_kv_heads[l],
        .head_dim = D, .seq = s->ints + G4_SPEC_SEQ, .pos = s->ints + G4_SPEC_ATTN_POS + t,
        .kv_end = s->ints + G4_SPEC_KV_END + t, .k = src->k, .v = src->v, .kv_type = ctx->kv.type,
        .block_table = pool->table_dev, .max_blocks = pool->max_blocks, .block_size = ctx->kv.block,
        .window = lo > 0 ? hi - lo : 0, .max_keys = hi - lo, .scale = 1.0f,
    };
    OPS->attention(be, &a);
    OPS->matmul(be, s->attn, 1, y->o_proj, y->o_bias, s->o);
    OPS->post_norm_add(be, s->z, s->o, y->post_attn_norm, 1, Ha, eps, 1.0f);
    OPS->rmsnorm(be, s->z, y->pre_ff_norm, 1, Ha, eps, s->xn);
    g4_matmul_set gu = {.count = 2, .w = {y->gate_proj, y->up_proj}, .y = {s->gate, s->up}};
    OPS->matmul_set(be, s->xn, 1, &gu);
    OPS->gelu_mul(be, s->gate, s->up, (size_t)c->layer_intermediate[l], s->gate);
    OPS->matmul(be, s->gate, 1, y->down_proj, NULL, s->o);
    OPS->post_norm_add(be, s->z, s->o, y->post_ff_norm, 1, Ha, eps, y->layer_scalar);
}

void g4_drafter_forward(g4_spec *s, int32_t tok, int p, const g4_draft_rows *rows, int k) {
    const g4_model *dm = s->d->m, *mm = s->d->main;
    const g4_text_config *c = &dm->cfg.text;
    g4_backend *be = dm->be;
    const int Hb = mm->cfg.text.hidden_size, Ha = c->hidden_size, V = c->vocab_size;
    int32_t *h = s->ints_host;
    h[G4_SPEC_SEQ] = s->seq;
    h[G4_SPEC_POS] = p;
    for (int t = 0; t < G4_LAYER_TYPES; t++) {
        h[G4_SPEC_ATTN_POS + t] = rows->hi[t] - 1;
        h[G4_SPEC_KV_END + t] = rows->hi[t];
    }
    h[G4_SPEC_TOKENS] = tok;
    OPS->to_device(be, s->ints, h, (G4_SPEC_TOKENS + 1) * sizeof(int32_t));
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        if (c->type_head_dim[t])
            OPS->rope_table(be, s->ints + G4_SPEC_POS, 1, dm->inv_freq[t], c->type_head_dim[t] / 2, s->rope[t]);
    OPS->copy(be, s->xin + Hb, s->h0, (size_t)Hb * sizeof(float));
    g4_spec_capture *cap = s->capture && s->capture->n < s->capture->max_draftings ? s->capture : NULL;
    const int slot = cap ? cap->n++ : 0, kc = cap && k > cap->max_steps ? cap->max_steps : k;
    float *cap_in = cap ? cap->inputs + (size_t)slot * cap->max_steps * 2 * Hb : NULL;
    float *cap_h = cap ? cap->hidden + (size_t)slot * cap->max_steps * Hb : NULL;
    for (int step = 0; step < k; step++) {
        int32_t *ids = s->ints + G4_SPEC_TOKENS + step;
        float *logits = s->logits + (s->scheduled ? 0 : (size_t)step * V);
        OPS->embed(be, mm->embed, ids, 1, mm->embed_scale, s->xin); /* the MAIN model's scaled embedding */
        if (cap && step < kc) OPS->to_host(be, cap_in + (size_t)step * 2 * Hb, s->xin, 2 * (size_t)Hb * 4);
        OPS->matmul(be, s->xin, 1, dm->pre_projection, NULL, s->z);
        for (int l = 0; l < c->n_layers; l++) layer(s, l, rows);
        OPS->rmsnorm(be, s->z, dm->final_norm, 1, Ha, (float)c->rms_norm_eps, s->zn);
        OPS->matmul(be, s->zn, 1, dm->post_projection, NULL, s->xin + Hb); /* the next step's hidden vector */
        if (cap && step < kc) OPS->to_host(be, cap_h + (size_t)step * Hb, s->xin + Hb, (size_t)Hb * 4);
        if (dm->cfg.asst.use_ordered_embeddings) {
            OPS->matmul(be, s->zn, 1, dm->centroids, NULL, s->cl);
            OPS->masked_logits(be, s->zn, s->cl, dm->cfg.asst.num_centroids, dm->cfg.asst.centroid_top_k,
                               dm->token_ordering, dm->lm_head, logits);
        } else {
            OPS->matmul(be, s->zn, 1, dm->lm_head, NULL, logits); /* no final_logit_softcapping (6.1) */
        }
        OPS->argmax(be, logits, 1, V, ids + 1);
    }
    if (k > 0) OPS->to_host(be, s->drafts, s->ints + G4_SPEC_TOKENS + 1, (size_t)k * sizeof(int32_t));
    if (cap) {
        OPS->to_host(be, cap->logits + (size_t)slot * cap->max_steps * V, s->logits, (size_t)kc * V * sizeof(float));
        cap->position[slot] = p;
        cap->steps[slot] = k;
        cap->rows[slot] = *rows;
    }
    OPS->sync(be);
}
