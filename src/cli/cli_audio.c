#include "cli/cli_audio.h"

#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "towers/audio.h"

int cli_audio_add(cli_audio *a, g4_model *m, const char *path) {
    g4_error err;
    g4_audio_embeddings e;
    if (g4_audio_embed_file(m, path, &e, &err)) return cli_error("%s", err.msg), -1;
    int *ib = realloc(a->item_blocks, (size_t)(a->n_items + 1) * sizeof *ib);
    if (ib) a->item_blocks = ib;
    int *bt = ib ? realloc(a->block_tokens, (size_t)(a->n_blocks + e.n_clips) * sizeof *bt) : NULL;
    if (bt) a->block_tokens = bt;
    float *rows = bt ? realloc(a->rows, (size_t)(a->n_rows + e.n_tokens) * e.hidden * sizeof *rows) : NULL;
    if (!rows) {
        g4_audio_embeddings_free(&e);
        return cli_error("out of memory"), -1;
    }
    a->rows = rows;
    memcpy(rows + (size_t)a->n_rows * e.hidden, e.rows, (size_t)e.n_tokens * e.hidden * sizeof *rows);
    memcpy(a->block_tokens + a->n_blocks, e.clip_tokens, (size_t)e.n_clips * sizeof *bt);
    a->item_blocks[a->n_items++] = e.n_clips;
    a->n_blocks += e.n_clips;
    a->n_rows += e.n_tokens;
    a->hidden = e.hidden;
    g4_audio_embeddings_free(&e);
    return 0;
}

int cli_audio_expand(const cli_audio *a, const g4_model *m, const int32_t *ids, int n, g4_soft_prompt *out) {
    g4_error err;
    g4_soft_items it = {m->cfg.audio_token_id, m->cfg.boa_token_id, m->cfg.eoa_token_id, a->n_items,
                        a->item_blocks, a->block_tokens};
    if (g4_soft_prompt_expand(ids, n, &it, out, &err)) return cli_error("audio: %s", err.msg), -1;
    return 0;
}

void cli_audio_clear(cli_audio *a) {
    free(a->item_blocks);
    free(a->block_tokens);
    free(a->rows);
    memset(a, 0, sizeof *a);
}

json_t *cli_audio_user_message(int n_audio, const char *text) {
    if (!n_audio) return json_pack("{s:s,s:s}", "role", "user", "content", text);
    json_t *parts = json_array();
    for (int i = 0; i < n_audio; i++) json_array_append_new(parts, json_pack("{s:s}", "type", "audio"));
    json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "text", "text", text));
    return json_pack("{s:s,s:o}", "role", "user", "content", parts);
}
