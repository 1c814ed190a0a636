/* What bench/grammar_bench.c and its peer bench/llama_grammar.c share (the peer is built against llama.cpp alone,
 * so these are header-only): a clock, a file's text, a list of ids, a median. */
#ifndef G4_BENCH_GRAMMAR_BENCH_H
#define G4_BENCH_GRAMMAR_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* A file's text, NUL-terminated (NULL when it cannot be read). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

/* Comma-separated ids (malloc'd; *n of them). */
static int32_t *parse_ids(const char *text, int *n) {
    int cap = 1024;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    *n = 0;
    for (const char *p = text; ids && *p;) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) break;
        if (*n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        if (ids) ids[(*n)++] = (int32_t)v;
        p = *e ? e + 1 : e;
    }
    return ids;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorted in place). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

#endif
