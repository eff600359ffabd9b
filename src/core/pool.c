/*
 * pool.c - the persistent thread pool (see pool.h).
 *
 * A job lives on the caller's stack: {fn, ctx, n_items, chunk, next, done}. The caller publishes a
 * pointer to it and bumps a generation counter that wakes the workers; every thread then takes chunks
 * with fetch_add on `next` and adds the items it finished to `done`. The caller returns once `done`
 * reaches n_items, after withdrawing the pointer and waiting for the workers that still hold it
 * (`active`), so a worker that wakes late never touches a job that is gone, and a sleeping or
 * descheduled worker never holds a job back.
 *
 * Invariants: at most one job is published (job_lock); a worker reads the job only between its
 * active++ and active--; the caller clears the pointer before it waits for active == 0 (both seq_cst,
 * so one of them sees the other).
 */
#define _GNU_SOURCE
#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* how long an idle worker spins before it sleeps: a decode step issues jobs microseconds apart */
#define QW_POOL_SPIN_NS 5000000L

typedef struct {
    qw_pool_fn fn;
    void *ctx;
    int64_t n_items, chunk;
    atomic_int_fast64_t next; /* first item not yet handed out */
    atomic_int_fast64_t done; /* items finished */
} qw_pool_job;

struct qw_pool {
    int n_threads; /* workers + the caller */
    int64_t spin_ns; /* how long an idle worker spins before it sleeps */
    pthread_t *threads;
    pthread_mutex_t job_lock; /* held while a job is published */
    pthread_mutex_t mu;       /* with cv: sleeping workers */
    pthread_cond_t cv;
    _Atomic(qw_pool_job *) job;
    atomic_uint_fast64_t gen; /* bumped for every job (and at shutdown) */
    atomic_int n_sleeping;
    atomic_int active; /* workers holding the job pointer */
    atomic_int stop;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int qw_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void run_chunks(qw_pool_job *j) {
    for (;;) {
        int64_t i0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
        if (i0 >= j->n_items) return;
        int64_t i1 = i0 + j->chunk < j->n_items ? i0 + j->chunk : j->n_items;
        j->fn(j->ctx, i0, i1);
        atomic_fetch_add_explicit(&j->done, i1 - i0, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    qw_pool *p = arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g == seen) {
            int64_t t0 = now_ns();
            for (int spins = 1; (g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen; spins++) {
                cpu_relax();
                if ((spins & 255) == 0 && now_ns() - t0 > p->spin_ns) break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        atomic_fetch_add(&p->active, 1);
        qw_pool_job *j = atomic_load(&p->job);
        if (j) run_chunks(j);
        atomic_fetch_sub(&p->active, 1);
    }
}

static void wake_all(qw_pool *p) {
    if (atomic_load(&p->n_sleeping) == 0) return;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

qw_pool *qw_pool_new(int n_threads) { return qw_pool_new_spin(n_threads, QW_POOL_SPIN_NS); }

qw_pool *qw_pool_new_spin(int n_threads, int64_t spin_ns) {
    if (n_threads <= 0) n_threads = qw_cpu_count();
    qw_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n_threads = n_threads;
    p->spin_ns = spin_ns;
    pthread_mutex_init(&p->job_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->job, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->stop, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            p->n_threads = 1;
            qw_pool_free(p);
            return NULL;
        }
        for (int i = 0; i < n_threads - 1; i++)
            if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
                p->n_threads = i + 1; /* join the ones that started */
                qw_pool_free(p);
                return NULL;
            }
    }
    return p;
}

void qw_pool_free(qw_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->job_lock);
    free(p);
}

int qw_pool_n_threads(const qw_pool *p) { return p ? p->n_threads : 1; }

void qw_pool_parallel_for(qw_pool *p, int64_t n_items, int64_t chunk, qw_pool_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (chunk < 1) chunk = 1;
    if (!p || p->n_threads == 1 || n_items <= chunk || pthread_mutex_trylock(&p->job_lock) != 0) {
        fn(ctx, 0, n_items);
        return;
    }
    qw_pool_job j = {.fn = fn, .ctx = ctx, .n_items = n_items, .chunk = chunk};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_store(&p->job, &j);
    atomic_fetch_add(&p->gen, 1);
    wake_all(p);
    run_chunks(&j);
    int64_t t0 = 0;
    for (int spins = 1; atomic_load_explicit(&j.done, memory_order_acquire) < n_items; spins++) {
        cpu_relax();
        /* a worker holding a chunk was descheduled: give it the core */
        if ((spins & 255) == 0) {
            if (!t0) t0 = now_ns();
            else if (now_ns() - t0 > p->spin_ns) sched_yield();
        }
    }
    atomic_store(&p->job, NULL);
    for (int spins = 1; atomic_load(&p->active) != 0; spins++) {
        cpu_relax();
        if ((spins & 1023) == 0) sched_yield();
    }
    pthread_mutex_unlock(&p->job_lock);
}
