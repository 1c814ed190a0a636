#include "cli/cli_media.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli_common.h"
#include "cli/commands.h"

static g4_soft_tokens *next_slot(cli_media *md) {
    if (md->n == CLI_MAX_MEDIA) return cli_error("at most %d images and audio inputs", CLI_MAX_MEDIA), NULL;
    return &md->items[md->n];
}

int cli_media_add_image(cli_media *md, g4_model *m, const char *path, int budget) {
    g4_soft_tokens *s = next_slot(md);
    if (!s) return -1;
    g4_error err;
    g4_image img;
    if (g4_image_load(path, NULL, &img, &err)) return cli_error("%s", err.msg), -1;
    int rc = g4_image_encode(m, &img, budget, s, &err);
    g4_image_free(&img);
    if (rc) return cli_error("%s: %s", path, err.msg), -1;
    md->n++;
    return 0;
}

int cli_media_add_audio(cli_media *md, g4_model *m, const char *path) {
    g4_soft_tokens *s = next_slot(md);
    if (!s) return -1;
    g4_error err;
    float *pcm;
    size_t n;
    const int rate = g4_audio_rate(m);
    if (!rate) return cli_error("%s: this model does not take audio (no audio_config, or no audio tower in the weights)", path), -1;
    if (g4_audio_load(path, rate, &pcm, &n, &err)) return cli_error("%s", err.msg), -1;
    int rc = g4_audio_encode(m, pcm, n, s, &err);
    g4_free(pcm);
    if (rc) return cli_error("%s: %s", path, err.msg), -1;
    md->n++;
    return 0;
}

int cli_media_file(cli_media_files *f, const char *cmd, const char *path, int is_audio) {
    if (f->n == CLI_MAX_MEDIA) return cli_error("%s: at most %d images and audio files", cmd, CLI_MAX_MEDIA);
    f->is_audio[f->n] = is_audio;
    f->path[f->n++] = path;
    return 0;
}

int cli_media_add_files(cli_media *md, g4_model *m, const cli_media_files *f, int budget) {
    for (int i = 0; i < f->n; i++)
        if (f->is_audio[i] ? cli_media_add_audio(md, m, f->path[i]) : cli_media_add_image(md, m, f->path[i], budget))
            return -1;
    return 0;
}

int cli_media_write(const cli_media *md, const char *path) {
    FILE *f = cli_open_output(path);
    if (!f) return cli_error("%s: cannot open for writing", path), -1;
    int bad = 0;
    for (int i = 0; i < md->n && !bad; i++) {
        const size_t count = (size_t)md->items[i].n_tokens * (size_t)md->items[i].hidden;
        bad = fwrite(md->items[i].rows, sizeof(float), count, f) != count;
    }
    if ((bad | ferror(f)) | cli_close_output(f)) {
        cli_remove_output(path);
        return cli_error("%s: write failed", path), -1;
    }
    return 0;
}

void cli_media_truncate(cli_media *md, int from) {
    while (md->n > from) g4_soft_tokens_free(&md->items[--md->n]);
}

int cli_media_tokens(const cli_media *md) {
    int k = 0;
    for (int i = 0; i < md->n; i++) k += md->items[i].n_tokens;
    return k;
}

json_t *cli_user_message(const char *text, const cli_media *md, int first, g4_error *err) {
    json_t *t = json_string(text); /* NULL for text that is not UTF-8: it must not vanish from the message */
    if (!t) return g4_fail(err, "the message is not valid UTF-8"), NULL;
    json_t *m;
    if (first >= md->n) {
        m = json_pack("{s:s,s:o}", "role", "user", "content", t);
    } else {
        json_t *content = json_array();
        for (int i = first; i < md->n; i++)
            json_array_append_new(content,
                                  json_pack("{s:s}", "type", md->items[i].kind == G4_MEDIA_IMAGE ? "image" : "audio"));
        json_array_append_new(content, json_pack("{s:s,s:o}", "type", "text", "text", t));
        m = json_pack("{s:s,s:o}", "role", "user", "content", content);
    }
    if (!m) g4_fail(err, "out of memory");
    return m;
}
