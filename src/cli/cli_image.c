#include "cli/cli_image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/context.h"

static int processor_for(const g4_model *m, g4_image_processor *p, g4_error *err) {
    if (g4_image_processor_load(m->dir, p, err)) return -1;
    const g4_vision_config *v = &m->cfg.vision;
    if (p->patch_size != v->patch_size || p->pooling_kernel != v->pooling_kernel)
        return g4_fail(err, "%s: the image processor's patch size %d / pooling kernel %d differ from the vision "
                            "tower's %d / %d", m->dir, p->patch_size, p->pooling_kernel, v->patch_size,
                       v->pooling_kernel);
    return 0;
}

int cli_image_max_tokens(const char *model_dir, int budget) {
    g4_image_processor p;
    g4_error err;
    if (budget > 0) return budget;
    return !model_dir || g4_image_processor_load(model_dir, &p, &err) ? 280 : p.max_soft_tokens;
}

int cli_images_add(g4_model *m, g4_vision **vis, const char *const *paths, int n, int budget, cli_images *im) {
    g4_error err;
    g4_image_processor proc;
    if (!m->cfg.has_vision) return cli_error("%s: the model has no vision tower (its config has no vision_config)", m->dir), -1;
    if (im->n + n > CLI_MAX_IMAGES) return cli_error("at most %d images", CLI_MAX_IMAGES), -1;
    if (processor_for(m, &proc, &err) || (!*vis && g4_vision_new(m, vis, &err))) return cli_error("%s", err.msg), -1;
    const int H = g4_model_hidden_size(m);
    int *counts = realloc(im->n_tokens, (size_t)(im->n + n) * sizeof(int));
    if (!counts) return cli_error("out of memory"), -1;
    im->n_tokens = counts;
    im->hidden = H;
    int total = im->total;
    for (int i = 0; i < n; i++) {
        g4_image img;
        g4_image_patches pp;
        if (g4_image_load(paths[i], NULL, &img, &err)) return cli_error("%s", err.msg), -1;
        int rc = g4_image_preprocess(&proc, &img, budget, &pp, &err);
        g4_image_free(&img);
        if (rc) return cli_error("%s: %s", paths[i], err.msg), -1;
        float *e = realloc(im->embd, (size_t)(total + pp.n_tokens) * H * sizeof(float));
        if (!e) {
            g4_image_patches_free(&pp);
            return cli_error("out of memory"), -1;
        }
        im->embd = e;
        rc = g4_vision_encode(*vis, &pp, im->embd + (size_t)total * H, NULL, &err);
        counts[im->n + i] = pp.n_tokens;
        total += pp.n_tokens;
        g4_image_patches_free(&pp);
        if (rc) return cli_error("%s: %s", paths[i], err.msg), -1;
    }
    im->n += n;
    im->total = total;
    return 0;
}

void cli_images_free(cli_images *im) {
    free(im->n_tokens);
    free(im->embd);
    memset(im, 0, sizeof *im);
}

json_t *cli_user_message(const char *text, int n_images) {
    if (!n_images) return json_pack("{s:s,s:s}", "role", "user", "content", text);
    json_t *content = json_array();
    for (int i = 0; i < n_images; i++) json_array_append_new(content, json_pack("{s:s}", "type", "image"));
    json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text", text));
    return json_pack("{s:s,s:o}", "role", "user", "content", content);
}

int cli_count_soft_tokens(const g4_model *m, const int32_t *ids, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += g4_mm_placeholder(m, ids[i]) != 0;
    return k;
}

int cli_images_expand(const g4_model *m, const int32_t *ids, int n, const cli_images *im, int32_t **out,
                      int *n_out, g4_error *err) {
    const g4_model_config *c = &m->cfg;
    int found = 0;
    for (int i = 0; i < n; i++) found += ids[i] == c->image_token_id && c->multimodal_wrapper;
    if (found != im->n)
        return g4_fail(err, "the prompt has %d image placeholder%s but %d image%s given", found, found == 1 ? "" : "s",
                       im->n, im->n == 1 ? " was" : "s were");
    int32_t *o = malloc(((size_t)n + (size_t)im->total + 2 * (size_t)im->n + 1) * sizeof *o);
    if (!o) return g4_fail(err, "out of memory");
    int k = 0, img = 0;
    for (int i = 0; i < n; i++) {
        if (!(c->multimodal_wrapper && ids[i] == c->image_token_id)) {
            o[k++] = ids[i];
            continue;
        }
        o[k++] = c->boi_token_id;
        for (int j = 0; j < im->n_tokens[img]; j++) o[k++] = c->image_token_id;
        o[k++] = c->eoi_token_id;
        img++;
    }
    *out = o;
    *n_out = k;
    return 0;
}
