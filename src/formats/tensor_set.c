#include "formats/tensor_set.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void g4_tensor_set_free(g4_tensor_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_tensors; i++) free((char *)set->tensors[i].name);
    free(set->tensors);
    free(set->file_of);
    for (int i = 0; i < set->n_files; i++) {
        g4_unmap_file(&set->files[i]);
        free(set->file_paths[i]);
    }
    free(set->files);
    free(set->file_paths);
    for (int i = 0; i < set->n_owned; i++) free(set->owned[i]);
    free(set->owned);
    memset(set, 0, sizeof *set);
}

int g4_tensor_set_own(g4_tensor_set *set, void *buf, g4_error *err) {
    void **o = realloc(set->owned, (size_t)(set->n_owned + 1) * sizeof *o);
    if (!o) {
        free(buf);
        return g4_fail(err, "out of memory");
    }
    set->owned = o;
    set->owned[set->n_owned++] = buf;
    return 0;
}

int g4_tensor_set_add_file(g4_tensor_set *set, g4_mapped_file file, const char *path,
                           g4_error *err) {
    if (set->n_files == set->cap_files) {
        int cap = set->cap_files ? set->cap_files * 2 : 4;
        g4_mapped_file *f = realloc(set->files, (size_t)cap * sizeof *f);
        if (!f) goto oom;
        set->files = f;
        char **p = realloc(set->file_paths, (size_t)cap * sizeof *p);
        if (!p) goto oom;
        set->file_paths = p;
        set->cap_files = cap;
    }
    char *copy = strdup(path);
    if (!copy) goto oom;
    set->files[set->n_files] = file;
    set->file_paths[set->n_files] = copy;
    return set->n_files++;
oom:
    g4_unmap_file(&file);
    return g4_fail(err, "out of memory");
}

int g4_tensor_set_add(g4_tensor_set *set, const g4_tensor *t, int file_index, g4_error *err) {
    if (set->n_tensors == set->cap_tensors) {
        int cap = set->cap_tensors ? set->cap_tensors * 2 : 64;
        g4_tensor *nt = realloc(set->tensors, (size_t)cap * sizeof *nt);
        if (!nt) return g4_fail(err, "out of memory");
        set->tensors = nt;
        int *nf = realloc(set->file_of, (size_t)cap * sizeof *nf);
        if (!nf) return g4_fail(err, "out of memory");
        set->file_of = nf;
        set->cap_tensors = cap;
    }
    char *name = strdup(t->name);
    if (!name) return g4_fail(err, "out of memory");
    set->tensors[set->n_tensors] = *t;
    set->tensors[set->n_tensors].name = name;
    set->file_of[set->n_tensors] = file_index;
    set->n_tensors++;
    return 0;
}

typedef struct {
    g4_tensor t;
    int file;
} tensor_and_file;

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const tensor_and_file *)a)->t.name, ((const tensor_and_file *)b)->t.name);
}

int g4_tensor_set_finish(g4_tensor_set *set, g4_error *err) {
    int n = set->n_tensors;
    if (n == 0) return 0;
    tensor_and_file *tmp = malloc((size_t)n * sizeof *tmp);
    if (!tmp) return g4_fail(err, "out of memory");
    for (int i = 0; i < n; i++) {
        tmp[i].t = set->tensors[i];
        tmp[i].file = set->file_of[i];
    }
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_by_name);
    for (int i = 0; i < n; i++) {
        set->tensors[i] = tmp[i].t;
        set->file_of[i] = tmp[i].file;
    }
    free(tmp);
    for (int i = 1; i < n; i++)
        if (!strcmp(set->tensors[i].name, set->tensors[i - 1].name))
            return g4_fail(err, "tensor '%s' appears twice (in %s and %s)", set->tensors[i].name,
                           set->file_paths[set->file_of[i - 1]], set->file_paths[set->file_of[i]]);
    return 0;
}

const g4_tensor *g4_tensor_set_find(const g4_tensor_set *set, const char *name) {
    int lo = 0, hi = set->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(set->tensors[mid].name, name);
        if (c == 0) return &set->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

const char *g4_tensor_set_file_of(const g4_tensor_set *set, const g4_tensor *t) {
    ptrdiff_t i = t - set->tensors;
    if (i < 0 || i >= set->n_tensors) return "?";
    return set->file_paths[set->file_of[i]];
}
