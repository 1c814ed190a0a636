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

struct g4_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation; /* bumped for every job */
    atomic_int stop;
    atomic_int sleeping;    /* workers blocked on cv */
    /* the current job */
    g4_range_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_llong next;   /* next unclaimed chunk start */
    atomic_int pending;  /* workers still inside the job */
};

typedef struct {
    g4_pool *pool;
    int index;
} worker_arg;

static void run_chunks(g4_pool *p, int thread) {
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->n) break;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e, thread);
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
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_chunks(p, index);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
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
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, nt - 1, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: pairs with the sleeping count */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, 0);
    /* a worker still on its last chunk: spin briefly, then give the core away (on a busy
     * machine the worker may be waiting for this very core) */
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0;)
        if (++spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
}
