/* The Gemma 4 assistant's forward pass, written once against the backend op table (docs/gemma4-assistant.md
 * section 3). One draft step: the main model's scaled embedding of the token and a hidden vector, concatenated,
 * pre_projection, La decoder layers that only make queries and attend to the main model's K/V rows (straight
 * from its paged cache, through the sequence's block table), final norm, post_projection (the next step's hidden
 * vector) and the head: dense (Ea, no soft-cap) or the centroid masked embedder; the argmax is the draft and the
 * next step's token, written in backend memory, so the steps of a round run without a round trip to the host.
 * All steps of a round share the position p, the RoPE of the queries and the rows (3.5, 5). One forward drafts for
 * many requests of a context at once (a scheduler's step): each row its own sequence, position, RoPE angles and key
 * range, the weights read once a step for all of them; a row leaves after its k steps. One request's steps are
 * recorded where the backend can (graph_begin: the round's launches replayed as one, as forward.c does for the
 * main model's steps); G4_DRAFT_GRAPHS=0 runs them eagerly. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/speculative.h"

#define OPS (be->ops)

/* One decoder layer (3.2, 3.3) on the first m rows of w->z; max_keys per layer type over the rows. */
static void layer(const g4_drafter *d, const g4_context *ctx, g4_draft_ws *w, int l, int m, const int *max_keys) {
    const g4_model *dm = d->m;
    const g4_text_config *c = &dm->cfg.text;
    const g4_layer *y = &dm->layers[l];
    g4_backend *be = dm->be;
    const int Ha = c->hidden_size, NH = c->n_heads, D = c->layer_head_dim[l], t = c->layer_type[l], R = w->rows;
    const float eps = (float)c->rms_norm_eps;
    const g4_kv_layer *src = &ctx->kv.layers[d->src[t]];
    const g4_kv_pool *pool = &ctx->kv.pool[t];
    OPS->rmsnorm(be, w->z, y->input_norm, m, Ha, eps, w->xn);
    OPS->matmul(be, w->xn, m, y->q_proj, y->q_bias, w->q);
    OPS->head_norm_rope(be, w->q, m, NH, D, y->q_norm, eps, w->rope[t]);
    g4_attention_args a = {
        .q = w->q, .out = w->attn, .n_tokens = m, .n_heads = NH, .n_kv_heads = c->layer_kv_heads[l],
        .head_dim = D, .seq = w->ints + G4_DRAFT_SEQ * R, .pos = w->ints + (G4_DRAFT_ATTN_POS + t) * R,
        .kv_end = w->ints + (G4_DRAFT_KV_END + t) * R, .kv_start = w->ints + (G4_DRAFT_KV_START + t) * R,
        .k = src->k, .v = src->v, .kv_type = ctx->kv.type, .block_table = pool->table_dev,
        .max_blocks = pool->max_blocks, .block_size = ctx->kv.block, .max_keys = max_keys[t], .max_seq_tokens = 1,
        .scale = 1.0f,
    };
    OPS->attention(be, &a);
    OPS->matmul(be, w->attn, m, y->o_proj, y->o_bias, w->o);
    OPS->post_norm_add(be, w->z, w->o, y->post_attn_norm, m, Ha, eps, 1.0f);
    OPS->rmsnorm(be, w->z, y->pre_ff_norm, m, Ha, eps, w->xn);
    g4_matmul_set gu = {.count = 2, .w = {y->gate_proj, y->up_proj}, .y = {w->gate, w->up}};
    OPS->matmul_set(be, w->xn, m, &gu);
    OPS->gelu_mul(be, w->gate, w->up, (size_t)m * (size_t)c->layer_intermediate[l], w->gate);
    OPS->matmul(be, w->gate, m, y->down_proj, NULL, w->o);
    OPS->post_norm_add(be, w->z, w->o, y->post_ff_norm, m, Ha, eps, y->layer_scalar);
}

void g4_drafter_forward(g4_drafter *d, g4_draft_ws *w, const g4_draft_job *jobs, int n) {
    const g4_model *dm = d->m, *mm = d->main;
    const g4_text_config *c = &dm->cfg.text;
    const g4_context *ctx = jobs[0].s->ctx;
    g4_backend *be = dm->be;
    const int Hb = mm->cfg.text.hidden_size, Ha = c->hidden_size, V = c->vocab_size, R = w->rows, K = jobs[0].k;
    const int nc = dm->cfg.asst.num_centroids;
    int32_t *h = w->ints_host;
    int max_keys[G4_LAYER_TYPES] = {0};
    for (int i = 0; i < n; i++) {
        const g4_draft_job *j = &jobs[i];
        h[G4_DRAFT_SEQ * R + i] = j->s->seq;
        h[G4_DRAFT_POS * R + i] = j->p;
        for (int t = 0; t < G4_LAYER_TYPES; t++) {
            h[(G4_DRAFT_ATTN_POS + t) * R + i] = j->rows.hi[t] - 1;
            h[(G4_DRAFT_KV_END + t) * R + i] = j->rows.hi[t];
            h[(G4_DRAFT_KV_START + t) * R + i] = j->rows.lo[t];
            if (j->rows.hi[t] - j->rows.lo[t] > max_keys[t]) max_keys[t] = j->rows.hi[t] - j->rows.lo[t];
        }
        h[G4_DRAFT_TOKENS * R + i] = j->tok;
    }
    OPS->to_device(be, w->ints, h, (size_t)(G4_DRAFT_TOKENS + 1) * R * sizeof(int32_t));
    /* every step's input is [embedding, hidden]: rows 1 write both into xin, more rows into pair, concatenated */
    float *emb = R == 1 ? w->xin : w->pair, *hid = R == 1 ? w->xin + Hb : w->pair + (size_t)R * Hb;
    for (int i = 0; i < n; i++) OPS->copy(be, hid + (size_t)i * Hb, jobs[i].h0, (size_t)Hb * sizeof(float));
    g4_spec_capture *cap = n == 1 && jobs[0].s->capture && jobs[0].s->capture->n < jobs[0].s->capture->max_draftings
                               ? jobs[0].s->capture : NULL;
    /* the steps below read and write only these buffers, the weights and the context's caches: one request's
     * (the latency case: a batch's rows share its launches) recorded for this workspace and step count (steps that
     * copy to the host run eagerly) */
    static int graphs = -1;
    if (graphs < 0) {
        const char *e = getenv("G4_DRAFT_GRAPHS");
        graphs = !(e && *e == '0');
    }
    const int replayable = graphs && OPS->graph_begin && !cap && n == 1 && K > 0;
    if (replayable) { /* recordings of caches elsewhere (another context, or a freed one's place) are made again */
        const void *reads[G4_LAYER_TYPES][3] = {{0}};
        int shape[G4_LAYER_TYPES + 2] = {0};
        shape[G4_LAYER_TYPES] = ctx->kv.block, shape[G4_LAYER_TYPES + 1] = (int)ctx->kv.type;
        for (int t = 0; t < G4_LAYER_TYPES; t++)
            if (d->src[t] >= 0) {
                const g4_kv_layer *src = &ctx->kv.layers[d->src[t]];
                reads[t][0] = src->k, reads[t][1] = src->v, reads[t][2] = ctx->kv.pool[t].table_dev;
                shape[t] = ctx->kv.pool[t].max_blocks;
            }
        if (memcmp(reads, w->reads, sizeof reads) || memcmp(shape, w->read_shape, sizeof shape)) {
            OPS->graph_forget(be, w);
            memcpy(w->reads, reads, sizeof reads);
            memcpy(w->read_shape, shape, sizeof shape);
        }
    }
    const int slot = cap ? cap->n++ : 0, kc = cap && K > cap->max_steps ? cap->max_steps : K;
    float *cap_in = cap ? cap->inputs + (size_t)slot * cap->max_steps * 2 * Hb : NULL;
    float *cap_h = cap ? cap->hidden + (size_t)slot * cap->max_steps * Hb : NULL;
    if (!replayable || !OPS->graph_begin(be, w, (uint64_t)K)) {
        for (int t = 0; t < G4_LAYER_TYPES; t++)
            if (c->type_head_dim[t])
                OPS->rope_table(be, w->ints + G4_DRAFT_POS * R, n, dm->inv_freq[t], c->type_head_dim[t] / 2,
                                w->rope[t]);
        for (int step = 0, m = n; step < K; step++) {
            while (jobs[m - 1].k <= step) m--; /* the rows still drafting (jobs[0].k == K > step) */
            int32_t *ids = w->ints + (size_t)(G4_DRAFT_TOKENS + step) * R;
            float *logits = w->logits + (w->keep_logits ? (size_t)step * V : 0);
            OPS->embed(be, mm->embed, ids, m, mm->embed_scale, emb); /* the MAIN model's scaled embedding */
            if (R > 1) OPS->transpose(be, w->pair, 2, R, Hb, w->xin);
            if (cap && step < kc) OPS->to_host(be, cap_in + (size_t)step * 2 * Hb, w->xin, 2 * (size_t)Hb * 4);
            OPS->matmul(be, w->xin, m, dm->pre_projection, NULL, w->z);
            for (int l = 0; l < c->n_layers; l++) layer(d, ctx, w, l, m, max_keys);
            OPS->rmsnorm(be, w->z, dm->final_norm, m, Ha, (float)c->rms_norm_eps, w->zn);
            OPS->matmul(be, w->zn, m, dm->post_projection, NULL, hid); /* the next step's hidden vectors */
            if (cap && step < kc) OPS->to_host(be, cap_h + (size_t)step * Hb, hid, (size_t)Hb * 4);
            if (dm->cfg.asst.use_ordered_embeddings) {
                OPS->matmul(be, w->zn, m, dm->centroids, NULL, w->cl);
                OPS->masked_logits(be, w->zn, w->cl, m, nc, dm->cfg.asst.centroid_top_k, dm->token_ordering,
                                   dm->lm_head, logits);
            } else {
                OPS->matmul(be, w->zn, m, dm->lm_head, NULL, logits); /* no final_logit_softcapping (6.1) */
            }
            OPS->argmax(be, logits, m, V, ids + R);
        }
        if (replayable) OPS->graph_end(be);
    }
    int32_t *toks = h + (size_t)(G4_DRAFT_TOKENS + 1) * R;
    if (K > 0) OPS->to_host(be, toks, w->ints + (size_t)(G4_DRAFT_TOKENS + 1) * R, (size_t)K * R * sizeof(int32_t));
    if (cap) {
        OPS->to_host(be, cap->logits + (size_t)slot * cap->max_steps * V, w->logits, (size_t)kc * V * sizeof(float));
        cap->position[slot] = jobs[0].p;
        cap->steps[slot] = K;
        cap->rows[slot] = jobs[0].rows;
    }
    OPS->sync(be);
    for (int i = 0; i < n; i++)
        for (int step = 0; step < jobs[i].k; step++) jobs[i].s->drafts[step] = toks[(size_t)step * R + i];
}

/* ------------------------------------------------------------------ buffers */

void g4_draft_ws_release(const g4_drafter *d, g4_draft_ws *w) {
    g4_backend *be = d->m->be;
    if (OPS->graph_forget) OPS->graph_forget(be, w); /* (its recordings use the buffers) */
    void *bufs[] = {w->xin, w->pair, w->z, w->xn, w->o, w->zn, w->q, w->attn, w->gate, w->up, w->cl, w->logits,
                    w->rope[0], w->rope[1], w->ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) OPS->release(be, bufs[i]);
    free(w->ints_host);
    memset(w, 0, sizeof *w);
}

int g4_draft_ws_reserve(const g4_drafter *d, g4_draft_ws *w, int rows, int steps, int keep_logits) {
    if (w->ints && w->rows >= rows && w->steps >= steps && w->keep_logits == keep_logits) return 0;
    if (w->ints) { /* grown by half again, so that a growing batch is not made again at every step */
        if (rows > w->rows && rows < w->rows + w->rows / 2) rows = w->rows + w->rows / 2;
        if (rows < w->rows) rows = w->rows;
        if (steps < w->steps) steps = w->steps;
    }
    g4_draft_ws_release(d, w);
    const g4_text_config *ac = &d->m->cfg.text;
    g4_backend *be = d->m->be;
    const size_t R = (size_t)rows, Hb = (size_t)d->main->cfg.text.hidden_size, Ha = (size_t)ac->hidden_size;
    const size_t V = (size_t)ac->vocab_size;
    size_t qmax = 0, imax = 0;
    for (int l = 0; l < ac->n_layers; l++) {
        size_t q = (size_t)ac->n_heads * (size_t)ac->layer_head_dim[l];
        if (q > qmax) qmax = q;
        if ((size_t)ac->layer_intermediate[l] > imax) imax = (size_t)ac->layer_intermediate[l];
    }
    const size_t n_ints = (G4_DRAFT_TOKENS + (size_t)steps + 1) * R;
    int ok = 1;
#define ALLOC(field, count) ok = ok && (w->field = OPS->alloc(be, (count) * sizeof *w->field)) != NULL
    ALLOC(xin, R * 2 * Hb);
    if (rows > 1) ALLOC(pair, 2 * R * Hb);
    ALLOC(z, R * Ha);
    ALLOC(xn, R * Ha);
    ALLOC(o, R * Ha);
    ALLOC(zn, R * Ha);
    ALLOC(q, R * qmax);
    ALLOC(attn, R * qmax);
    ALLOC(gate, R * imax);
    ALLOC(up, R * imax);
    ALLOC(logits, (keep_logits ? (size_t)(steps > 0 ? steps : 1) : R) * V);
    ALLOC(ints, n_ints);
    if (d->m->cfg.asst.use_ordered_embeddings) ALLOC(cl, R * (size_t)d->m->cfg.asst.num_centroids);
    for (int t = 0; t < G4_LAYER_TYPES; t++)
        if (ac->type_head_dim[t]) ALLOC(rope[t], R * (size_t)ac->type_head_dim[t]);
#undef ALLOC
    w->ints_host = malloc(n_ints * sizeof *w->ints_host);
    if (!ok || !w->ints_host) {
        g4_draft_ws_release(d, w);
        return -1;
    }
    w->rows = rows;
    w->steps = steps;
    w->keep_logits = keep_logits;
    return 0;
}
