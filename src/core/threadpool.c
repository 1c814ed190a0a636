#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS 20000

/* The claim word: the job's generation (24 bits), its number of chunks (20 bits) and the next unclaimed chunk
 * (20 bits). A thread claims a chunk by a compare-and-swap that also checks the generation, so a worker that
 * wakes late (the machine is shared: it may not have run for milliseconds) can never take a chunk of a job it
 * did not see posted; and the caller waits only for chunks that were claimed, never for a worker to show up:
 * a chunk no worker took is run by the caller. */
#define GEN_SHIFT 40
#define TOTAL_SHIFT 20
#define FIELD_MASK ((1ull << 20) - 1)
#define MAX_CHUNKS ((int64_t)FIELD_MASK)

struct g4_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t claim; /* generation | chunks | next chunk (above) */
    atomic_int stop;
    atomic_int sleeping;  /* workers blocked on cv */
    /* the current job (written before its claim word is published) */
    g4_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_llong done;    /* chunks of the current job finished */
};

typedef struct {
    g4_pool *pool;
    int index;
} worker_arg;

static unsigned gen_of(uint64_t v) { return (unsigned)(v >> GEN_SHIFT); }

/* Claims and runs chunks of job `gen` until it has none left, or is no longer the current job. */
static void run_chunks(g4_pool *p, unsigned gen, int thread) {
    uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        if (gen_of(v) != gen || (v & FIELD_MASK) >= ((v >> TOTAL_SHIFT) & FIELD_MASK)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acquire, memory_order_acquire))
            continue; /* v now holds the current word */
        /* chunk (v & FIELD_MASK) of job gen is ours: the job stays current until it is done */
        int64_t b = (int64_t)(v & FIELD_MASK) * p->chunk;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e, thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        v = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    g4_pool *p = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned seen = 0; /* the pool starts at generation 0; a job may be posted before this thread runs */
    for (;;) {
        int spins = 0;
        unsigned g;
        while ((g = gen_of(atomic_load_explicit(&p->claim, memory_order_acquire))) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (gen_of(atomic_load(&p->claim)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        run_chunks(p, g, index);
        seen = g;
    }
    return NULL;
}

int g4_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

g4_pool *g4_pool_new(int n_threads) {
    if (n_threads <= 0) n_threads = g4_cpu_count();
    g4_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = malloc(sizeof *wa);
            if (!wa) {
                p->n_threads = i;
                break;
            }
            wa->pool = p;
            wa->index = i;
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n_threads = i;
                break;
            }
        }
    }
    return p;
}

void g4_pool_free(g4_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int g4_pool_threads(const g4_pool *p) { return p ? p->n_threads : 1; }

void g4_pool_for(g4_pool *p, int64_t n, int64_t grain, g4_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    int nt = p->n_threads;
    /* about 4 chunks per thread for balance, never below the grain */
    int64_t chunk = (n + (int64_t)nt * 4 - 1) / ((int64_t)nt * 4);
    if (chunk < grain) chunk = grain;
    int64_t total = (n + chunk - 1) / chunk;
    if (total > MAX_CHUNKS) {
        chunk = (n + MAX_CHUNKS - 1) / MAX_CHUNKS;
        total = (n + chunk - 1) / chunk;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    unsigned gen = (gen_of(atomic_load_explicit(&p->claim, memory_order_relaxed)) + 1) & (unsigned)((1u << 24) - 1);
    atomic_store(&p->claim, (uint64_t)gen << GEN_SHIFT | (uint64_t)total << TOTAL_SHIFT); /* seq_cst: pairs with the sleeping count */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, gen, 0);
    /* a worker still on a chunk it claimed: spin briefly, then give the core away (on a busy machine the worker
     * may be waiting for this very core) */
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < total;)
        if (++spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
}
