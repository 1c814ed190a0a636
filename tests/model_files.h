/* Writing model folders for tests: a fixture re-saved as shards, as float32, or edited
 * (a tensor dropped, replaced or added) to provoke load errors. */
#ifndef G4_TESTS_MODEL_FILES_H
#define G4_TESTS_MODEL_FILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/mapped_file.h"
#include "formats/safetensors.h"

static inline int copy_file(const char *src, const char *dst) {
    char *buf;
    size_t len;
    g4_error err;
    if (g4_read_file(src, &buf, &len, &err)) return -1;
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f) fclose(f);
    free(buf);
    return ok ? 0 : -1;
}

static inline int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* Edits applied while re-saving: drop a tensor, drop every tensor whose name (after renaming) starts with drop_prefix, append
 * extra tensors (which may replace a tensor of the same name), and/or rename tensors by prefix (pairs
 * rename[2k] -> rename[2k+1]; names up to 255 bytes). */
typedef struct resave_edit {
    const char *drop;
    const char *drop_prefix;
    const g4_tensor *extra;
    int n_extra;
    const char *const *rename;
    int n_rename;
} resave_edit;

/* to: G4_F32 or G4_F16 converts every float tensor, 0 keeps the dtypes. */
static inline int resave(const char *src_dir, const char *dst_dir, int n_shards, g4_dtype to, const resave_edit *ed) {
    g4_error err;
    g4_tensor_set set;
    if (g4_safetensors_open_dir(src_dir, &set, &err)) return -1;
    mkdir(dst_dir, 0755);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/config.json", src_dir);
    snprintf(b, sizeof b, "%s/config.json", dst_dir);
    if (copy_file(a, b)) {
        g4_tensor_set_free(&set);
        return -1;
    }
    int n_extra = ed ? ed->n_extra : 0;
    g4_tensor *ts = calloc((size_t)(set.n_tensors + n_extra), sizeof *ts);
    float **owned = calloc((size_t)set.n_tensors + 1, sizeof *owned);
    char(*renamed)[256] = calloc((size_t)set.n_tensors + 1, sizeof *renamed);
    int n = 0;
    for (int i = 0; i < set.n_tensors; i++) {
        const char *name = set.tensors[i].name;
        int skip = ed && ed->drop && !strcmp(name, ed->drop);
        for (int e = 0; e < n_extra; e++) skip |= !strcmp(name, ed->extra[e].name);
        ts[n] = set.tensors[i];
        for (int r = 0; ed && r < ed->n_rename; r++) {
            size_t pl = strlen(ed->rename[2 * r]);
            if (strncmp(name, ed->rename[2 * r], pl)) continue;
            snprintf(renamed[i], sizeof renamed[i], "%s%s", ed->rename[2 * r + 1], name + pl);
            ts[n].name = renamed[i];
            break;
        }
        skip |= ed && ed->drop_prefix && !strncmp(ts[n].name, ed->drop_prefix, strlen(ed->drop_prefix));
        if (skip) continue;
        int is_float = ts[n].dtype == G4_BF16 || ts[n].dtype == G4_F16 || ts[n].dtype == G4_F32;
        if (to && is_float && ts[n].dtype != to) {
            size_t cnt = (size_t)g4_tensor_numel(&ts[n]);
            owned[i] = malloc(cnt * sizeof(float) + 1);
            g4_to_f32(ts[n].dtype, ts[n].data, owned[i], cnt);
            if (to == G4_F16) {
                uint16_t *h = (uint16_t *)owned[i];
                for (size_t k = 0; k < cnt; k++) h[k] = g4_f32_to_f16(owned[i][k]); /* in place, front to back */
            }
            ts[n].data = owned[i];
            ts[n].dtype = to;
            ts[n].nbytes = cnt * (size_t)(g4_dtype_bits(to) / 8);
        }
        n++;
    }
    for (int e = 0; e < n_extra; e++) ts[n++] = ed->extra[e];
    FILE *idx = NULL;
    snprintf(b, sizeof b, "%s/model.safetensors.index.json", dst_dir);
    remove(b);
    if (n_shards > 1) {
        char single[4096];
        snprintf(single, sizeof single, "%s/model.safetensors", dst_dir);
        remove(single); /* it would be read instead of the shards, as transformers does */
        idx = fopen(b, "w");
        fprintf(idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    }
    int rc = 0, per = (n + n_shards - 1) / n_shards;
    for (int s = 0; s < n_shards && rc == 0; s++) {
        int lo = s * per, hi = lo + per < n ? lo + per : n;
        char name[64];
        if (n_shards > 1)
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        else
            snprintf(name, sizeof name, "model.safetensors");
        snprintf(b, sizeof b, "%s/%s", dst_dir, name);
        rc = g4_safetensors_write(b, ts + lo, hi - lo, &err);
        for (int i = lo; idx && i < hi; i++) fprintf(idx, "%s\"%s\": \"%s\"", i ? ", " : "", ts[i].name, name);
    }
    if (idx) {
        fprintf(idx, "}}\n");
        fclose(idx);
    }
    for (int i = 0; i < set.n_tensors; i++) free(owned[i]);
    free(owned);
    free(renamed);
    free(ts);
    g4_tensor_set_free(&set);
    return rc;
}

#endif
