/* A small fork-join thread pool: g4_pool_for splits [0, n) into chunks that the
 * calling thread and the workers claim from a shared word (tagged with the job's
 * generation); the caller waits only for chunks that were claimed, so a worker the
 * OS has not scheduled yet costs nothing (the caller runs its share). Workers spin
 * briefly between jobs (decode issues hundreds of short jobs per token), then sleep. */
#ifndef G4_CORE_THREADPOOL_H
#define G4_CORE_THREADPOOL_H

#include <stdint.h>

typedef struct g4_pool g4_pool;

/* fn handles [begin, end); thread is 0..n_threads-1 (0 is the caller). */
typedef void (*g4_range_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* n_threads counts the caller; <= 0 means one per online CPU. NULL on failure. */
g4_pool *g4_pool_new(int n_threads);
void g4_pool_free(g4_pool *pool);
int g4_pool_threads(const g4_pool *pool);

/* Runs fn over [0, n) in chunks of at least `grain` items; returns when all are done.
 * A NULL pool runs everything on the caller. Not reentrant. */
void g4_pool_for(g4_pool *pool, int64_t n, int64_t grain, g4_range_fn fn, void *ctx);

int g4_cpu_count(void);

#endif
