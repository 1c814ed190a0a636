/* Stop strings over streamed text.
 *
 * The caller pushes each piece of newly decoded text (bytes, usually whole UTF-8 characters
 * from the streaming detokenizer). The matcher returns the bytes that are safe to show now and
 * holds back the longest tail that is a proper prefix of some stop string, so a partial stop
 * string is never shown. When a stop string completes, the result ends right before it and
 * `stopped` is set; the stop string and anything after it are dropped.
 *
 * When several stop strings complete in the same push, the one that completes first (lowest
 * end offset) wins, ties going to the longer one; this makes the outcome independent of how
 * the text was split into pushes.
 *
 * At the end of generation (eos, length limit) call g4_stop_flush to release the held tail.
 */
#ifndef G4_ENGINE_STOP_H
#define G4_ENGINE_STOP_H

#include <stddef.h>

#include "gemma4c.h"

typedef struct g4_stop_matcher g4_stop_matcher;

typedef struct g4_stop_result {
    const char *text; /* bytes to emit now; valid until the next call on the matcher */
    size_t len;
    int stopped;      /* 1: a stop string completed (now or earlier); generation should end */
    int which;        /* index of the stop string that matched, -1 if none */
} g4_stop_result;

/* Copies the n stop strings (each non-empty; n may be 0: everything passes through). */
int g4_stop_new(const char *const *stops, int n, g4_stop_matcher **out, g4_error *err);
void g4_stop_free(g4_stop_matcher *m);
/* Forgets held text and the stopped state (a new generation). */
void g4_stop_reset(g4_stop_matcher *m);

/* Feeds len bytes. After a stop every further push returns nothing with stopped = 1.
 * Fails only when out of memory. */
int g4_stop_push(g4_stop_matcher *m, const char *text, size_t len, g4_stop_result *res,
                 g4_error *err);
/* Releases the held tail (no stop string completed it). */
void g4_stop_flush(g4_stop_matcher *m, g4_stop_result *res);

/* Bytes currently held back. */
size_t g4_stop_held(const g4_stop_matcher *m);

#endif
