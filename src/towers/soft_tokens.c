/* Prompts with soft tokens (docs/gemma4-towers.md 4; gemma4c.h, "images and audio"): the expansion of the
 * placeholders a chat template writes, one per input, into blocks of begin + N placeholders + end, and the
 * rows the expanded placeholders take, in order (transformers' masked_scatter per modality). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "engine/context.h"

void g4_soft_tokens_free(g4_soft_tokens *s) {
    if (!s) return;
    free(s->block_tokens);
    free(s->rows);
    memset(s, 0, sizeof *s);
}

static const char *kind_name(int kind) { return kind == G4_MEDIA_IMAGE ? "image" : "audio"; }

/* Placeholders of a kind per input kind (image, audio) must number what `per_input` says: the inputs
 * (expansion) or their soft tokens (gathering). */
static int check_counts(const g4_model *m, const int32_t *ids, int n, const g4_soft_tokens *in, int n_in,
                        int per_token, g4_error *err) {
    if (!m) return g4_fail(err, "soft tokens: the model is NULL");
    if (n < 0 || (n && !ids)) return g4_fail(err, "soft tokens: %d prompt ids%s", n, ids ? "" : " without their array");
    if (n_in < 0 || (n_in && !in)) return g4_fail(err, "soft tokens: %d inputs%s", n_in, in ? "" : " without their array");
    const int H = m->cfg.text.hidden_size;
    static const g4_media_kind kinds[2] = {G4_MEDIA_IMAGE, G4_MEDIA_AUDIO};
    for (int i = 0; i < n_in; i++) {
        if (in[i].kind != G4_MEDIA_IMAGE && in[i].kind != G4_MEDIA_AUDIO)
            return g4_fail(err, "input %d has an unknown kind %d", i, (int)in[i].kind);
        if (in[i].hidden != H)
            return g4_fail(err, "input %d has rows of %d floats, the model takes %d", i, in[i].hidden, H);
        long sum = 0, bad = in[i].n_blocks < 0 || (in[i].n_tokens && !in[i].rows);
        for (int b = 0; b < in[i].n_blocks; b++) {
            bad |= !in[i].block_tokens || in[i].block_tokens[b] < 0;
            if (bad) break;
            sum += in[i].block_tokens[b];
        }
        if (bad || sum != in[i].n_tokens)
            return g4_fail(err, "input %d: its blocks do not add up to its %d soft tokens", i, in[i].n_tokens);
    }
    /* a batch with embedding rows gives every placeholder a row (g4_count_soft_tokens): a video placeholder
     * would take one past the rows gathered here */
    int video = 0;
    for (int i = 0; i < n; i++) video += g4_mm_placeholder(m, ids[i]) == 2;
    if (video)
        return g4_fail(err, "the prompt has %d video placeholder%s (<|video|>): video input is not supported", video,
                       video == 1 ? "" : "s");
    for (int k = 0; k < 2; k++) {
        int found = 0, want = 0;
        for (int i = 0; i < n; i++) found += g4_mm_placeholder(m, ids[i]) == (int)kinds[k];
        for (int i = 0; i < n_in; i++)
            if (in[i].kind == kinds[k]) want += per_token ? in[i].n_tokens : 1;
        if (found != want)
            return g4_fail(err, "the prompt has %d %s placeholder%s for %d %s%s", found, kind_name(kinds[k]),
                           found == 1 ? "" : "s", want, per_token ? "soft token" : kind_name(kinds[k]),
                           want == 1 ? "" : "s");
    }
    return 0;
}

int g4_soft_tokens_gather(const g4_model *m, const int32_t *ids, int n, const g4_soft_tokens *in, int n_in,
                          float **embd, int *n_embd, g4_error *err) {
    G4_ARG(embd, err);
    G4_ARG(n_embd, err);
    *embd = NULL;
    *n_embd = 0;
    if (check_counts(m, ids, n, in, n_in, 1, err)) return -1;
    const size_t H = (size_t)m->cfg.text.hidden_size;
    int total = 0;
    for (int i = 0; i < n_in; i++) total += in[i].n_tokens;
    float *rows = malloc((size_t)total * H * sizeof *rows + 1);
    if (!rows) return g4_fail(err, "out of memory");
    int item[2] = {-1, -1}, row[2] = {0, 0}; /* per kind: the input being read and its next row */
    for (int i = 0, out = 0; i < n; i++) {
        const int kind = g4_mm_placeholder(m, ids[i]), k = kind == G4_MEDIA_AUDIO;
        if (kind != G4_MEDIA_IMAGE && kind != G4_MEDIA_AUDIO) continue;
        while (item[k] < 0 || row[k] == in[item[k]].n_tokens) { /* the next input of this kind */
            do item[k]++;
            while ((int)in[item[k]].kind != kind);
            row[k] = 0;
        }
        memcpy(rows + (size_t)out++ * H, in[item[k]].rows + (size_t)row[k]++ * H, H * sizeof *rows);
    }
    *embd = rows;
    *n_embd = total;
    return 0;
}

int g4_prompt_expand(const g4_model *m, const int32_t *ids, int n, const g4_soft_tokens *in, int n_in,
                     int32_t **out_ids, int *n_out, float **embd, int *n_embd, g4_error *err) {
    G4_ARG(out_ids, err);
    G4_ARG(n_out, err);
    G4_ARG(embd, err);
    G4_ARG(n_embd, err);
    *out_ids = NULL;
    *n_out = 0;
    *embd = NULL;
    *n_embd = 0;
    if (check_counts(m, ids, n, in, n_in, 0, err)) return -1;
    const g4_model_config *c = &m->cfg;
    size_t len = (size_t)n;
    for (int i = 0; i < n_in; i++) len += (size_t)in[i].n_tokens + 2 * (size_t)in[i].n_blocks;
    int32_t *o = malloc(len * sizeof *o + 1);
    if (!o) return g4_fail(err, "out of memory");
    int next[2] = {0, 0}, k = 0; /* per kind: the next input to look at */
    for (int i = 0; i < n; i++) {
        const int kind = g4_mm_placeholder(m, ids[i]), a = kind == G4_MEDIA_AUDIO;
        if (kind != G4_MEDIA_IMAGE && kind != G4_MEDIA_AUDIO) {
            o[k++] = ids[i];
            continue;
        }
        while ((int)in[next[a]].kind != kind) next[a]++;
        const g4_soft_tokens *s = &in[next[a]++];
        for (int b = 0; b < s->n_blocks; b++) {
            o[k++] = a ? c->boa_token_id : c->boi_token_id;
            for (int j = 0; j < s->block_tokens[b]; j++) o[k++] = ids[i];
            o[k++] = a ? c->eoa_token_id : c->eoi_token_id;
        }
    }
    if (g4_soft_tokens_gather(m, o, k, in, n_in, embd, n_embd, err)) {
        free(o);
        return -1;
    }
    *out_ids = o;
    *n_out = k;
    return 0;
}
