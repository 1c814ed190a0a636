/* Runs a harness over files without libFuzzer: `fuzz-replay-NAME FILE_OR_DIR...` calls
 * LLVMFuzzerTestOneInput once per file (the files of a folder in name order).  The normal test
 * suite runs each harness over its regressions/NAME folder this way (tests/fuzz/README.md). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) return -1;
    /* an exact-size copy, so ASan sees reads past the input */
    unsigned char *data = malloc(n ? n : 1);
    memcpy(data, buf, n);
    free(buf);
    fprintf(stderr, "replay %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(data, n);
    free(data);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path, int *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: none (no regression found yet)\n", path);
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return run_file(path);
    }
    DIR *d = opendir(path);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (strcmp(names[i], "README.md") != 0 && run_path(p, count)) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0, count = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count)) rc = 1;
    fprintf(stderr, "%d input%s replayed\n", count, count == 1 ? "" : "s");
    return rc;
}
