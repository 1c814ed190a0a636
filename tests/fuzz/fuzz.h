/* What the fuzz harnesses share (tests/fuzz/README.md).
 *
 * A harness is one file fuzz_<name>.c defining LLVMFuzzerTestOneInput (and, when it needs
 * setup, LLVMFuzzerInitialize).  It is built twice: with libFuzzer (-DG4_FUZZ=ON, clang) as
 * build-fuzz/tests/fuzz/fuzz-<name>, and always, with replay.c instead of libFuzzer, as
 * fuzz-replay-<name>: the ctest fuzz_replay_<name> runs it over regressions/<name>/.
 *
 * A finding is a crash, a sanitizer report, a hang, a runaway allocation, or a broken
 * promise the harness checks with fuzz_expect (e.g. an error message that is not one line). */
#ifndef G4_TESTS_FUZZ_H
#define G4_TESTS_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gemma4c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A promise of the code under test; breaking it is a finding (abort: libFuzzer saves the input). */
#define fuzz_expect(cond)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: fuzz_expect(%s) failed\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* A failure must come with a message of one line. */
static inline void fuzz_expect_error(int rc, const g4_error *err) {
    if (rc == 0) return;
    if (!err->msg[0] || strchr(err->msg, '\n')) {
        fprintf(stderr, "bad error message: [%s]\n", err->msg);
        abort();
    }
}

/* A path under the shared reference folder ($G4_SHARED_DIR, else the one CMake knew). */
static inline const char *fuzz_shared(const char *rel) {
    static char buf[8][4096];
    static int k;
    const char *root = getenv("G4_SHARED_DIR");
    if (!root || !*root) root = G4_FUZZ_SHARED_DIR;
    char *b = buf[k++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", root, rel);
    return b;
}

/* A path under the source tree. */
static inline const char *fuzz_source(const char *rel) {
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", G4_FUZZ_SOURCE_DIR, rel);
    return b;
}

/* A private scratch folder (in memory when /dev/shm exists), made once per process. */
static inline const char *fuzz_tmpdir(void) {
    static char dir[256];
    if (!dir[0]) {
        struct stat st;
        const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
        snprintf(dir, sizeof dir, "%s/g4fuzz-XXXXXX", base);
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

/* tmpdir/name, in one of a few rotating buffers. */
static inline const char *fuzz_tmp(const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, sizeof buf[0], "%s/%s", fuzz_tmpdir(), name);
    return b;
}

static inline void fuzz_write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

#endif
