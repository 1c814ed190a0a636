#include "engine/generate.h"

#include <stdlib.h>

#include "core/error.h"
#include "engine/context.h"

int32_t g4_argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int g4_generate(g4_context *ctx, int seq, const int32_t *prompt, int n_prompt, const g4_generate_params *p,
                int32_t *out, int *n_out, int *stopped_by, g4_error *err) {
    *n_out = 0;
    if (stopped_by) *stopped_by = 0;
    const int V = ctx->model->cfg.text.vocab_size;
    if (n_prompt <= 0) return g4_fail(err, "empty prompt");
    if (seq < 0 || seq >= ctx->n_seq) return g4_fail(err, "sequence %d is outside 0..%d", seq, ctx->n_seq - 1);
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *seqs = malloc((size_t)ctx->n_batch * sizeof(int32_t));
    uint8_t *want = malloc((size_t)ctx->n_batch);
    int rc = -1;
    if (!logits || !seqs || !want) {
        g4_fail(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < ctx->n_batch; i++) seqs[i] = seq;
    for (int i = 0; i < n_prompt; i += ctx->n_batch) {
        int k = n_prompt - i < ctx->n_batch ? n_prompt - i : ctx->n_batch;
        for (int j = 0; j < k; j++) want[j] = (i + j == n_prompt - 1);
        g4_batch b = {.n_tokens = k, .token = prompt + i, .seq = seqs, .want_logits = want, .embeddings = p->embeddings,
                      .embedding_row = p->embedding_row ? p->embedding_row + i : NULL};
        if (g4_decode(ctx, &b, logits, err)) goto done;
        if (p->cancel && *p->cancel) {
            if (stopped_by) *stopped_by = 3;
            rc = 0;
            goto done;
        }
    }
    for (int t = 0; t < p->max_new_tokens; t++) {
        if (p->cancel && *p->cancel) {
            if (stopped_by) *stopped_by = 3;
            break;
        }
        int32_t id = p->pick ? p->pick(logits, V, p->pick_user) : g4_argmax(logits, V);
        if (id < 0 || id >= V) {
            g4_fail(err, "the sampler returned token %d outside the vocabulary", id);
            goto done;
        }
        out[(*n_out)++] = id;
        int stop = 0;
        for (int s = 0; s < p->n_stop; s++) stop |= p->stop_ids[s] == id;
        int cb = p->on_token ? p->on_token(id, p->on_token_user) : 0;
        if (stop || cb) {
            if (stopped_by) *stopped_by = stop ? 1 : 2;
            break;
        }
        if (t + 1 == p->max_new_tokens) break; /* the last token need not be fed */
        g4_batch b = {.n_tokens = 1, .token = &id, .seq = seqs};
        if (g4_decode(ctx, &b, logits, err)) goto done;
    }
    rc = 0;
done:
    free(logits);
    free(seqs);
    free(want);
    return rc;
}
