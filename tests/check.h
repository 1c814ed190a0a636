/* A tiny test harness: CHECK records a failure and goes on; main returns g4t_done(). */
#ifndef G4_TESTS_CHECK_H
#define G4_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g4t_failures = 0;
static int g4t_checks = 0;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        g4t_checks++;                                                                    \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);     \
            g4t_failures++;                                                              \
        }                                                                                \
    } while (0)

#define CHECKF(cond, ...)                                                                \
    do {                                                                                 \
        g4t_checks++;                                                                    \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            g4t_failures++;                                                              \
        }                                                                                \
    } while (0)

/* Path under $G4_SHARED_DIR (the read-only ../shared folder); static buffer rotation. */
static inline const char *g4t_shared(const char *rel) {
    static char bufs[8][4096];
    static int k = 0;
    const char *root = getenv("G4_SHARED_DIR");
    if (!root) root = "../shared";
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", root, rel);
    return b;
}

/* Scratch folder for files a test writes. */
static inline const char *g4t_tmp(const char *rel) {
    static char bufs[8][4096];
    static int k = 0;
    const char *root = getenv("G4_TMP");
    if (!root) root = "/tmp";
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", root, rel);
    return b;
}

static inline int g4t_done(void) {
    fprintf(stderr, "%d checks, %d failed\n", g4t_checks, g4t_failures);
    return g4t_failures ? 1 : 0;
}

#endif
