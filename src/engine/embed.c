/* g4_embed: the mean over a sequence's positions of the final hidden state (after the final
 * norm, transformers' last_hidden_state), computed with batch steps on one sequence of a
 * context and no output head. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/context.h"

int g4_embed(g4_context *ctx, int seq, const int32_t *ids, int n_ids, float *out, g4_error *err) {
    G4_ARG(ctx, err);
    G4_ARG(ids, err);
    G4_ARG(out, err);
    if (ctx->scheduler)
        return g4_fail(err, "the context's sequences belong to its scheduler: submit the request there "
                            "(g4_scheduler_submit_embed)");
    if (seq < 0 || seq >= ctx->n_seq) return g4_fail(err, "sequence %d is outside 0..%d", seq, ctx->n_seq - 1);
    if (n_ids <= 0) return g4_fail(err, "nothing to embed: no token ids");
    if (n_ids > ctx->n_ctx)
        return g4_fail(err, "%d tokens do not fit the context of %d positions", n_ids, ctx->n_ctx);
    const int H = ctx->model->cfg.text.hidden_size;
    float *rows = malloc((size_t)ctx->n_batch * (size_t)H * sizeof(float));
    double *sum = calloc((size_t)H, sizeof(double));
    int32_t *seqs = malloc((size_t)ctx->n_batch * sizeof(int32_t));
    int rc = -1;
    if (!rows || !sum || !seqs) {
        g4_fail(err, "out of memory");
        goto done;
    }
    float *saved_hidden = ctx->capture_hidden, *saved_final = ctx->capture_final;
    g4_context_capture(ctx, NULL, rows);
    g4_seq_reset(ctx, seq);
    for (int i = 0; i < ctx->n_batch; i++) seqs[i] = seq;
    for (int i = 0; i < n_ids; i += ctx->n_batch) {
        int k = n_ids - i < ctx->n_batch ? n_ids - i : ctx->n_batch;
        g4_batch b = {.n_tokens = k, .token = ids + i, .seq = seqs};
        if (g4_decode(ctx, &b, NULL, err)) break;
        for (int r = 0; r < k; r++)
            for (int h = 0; h < H; h++) sum[h] += rows[(size_t)r * H + h];
        if (i + k == n_ids) rc = 0;
    }
    g4_seq_reset(ctx, seq);
    g4_context_capture(ctx, saved_hidden, saved_final);
    for (int h = 0; rc == 0 && h < H; h++) out[h] = (float)(sum[h] / n_ids);
done:
    free(rows);
    free(sum);
    free(seqs);
    return rc;
}
