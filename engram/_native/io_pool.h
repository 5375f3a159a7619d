/* The persistent pool of pread readers (SPEC §8: "readers are a persistent
 * pool"; creating threads per step cost 2.59 ms of idle GPU a step in one port).
 *
 * readers - 1 threads wait on a condition variable between batches; the
 * calling thread is the last reader.  Requests are taken from a shared atomic
 * counter, so each reader keeps one read in flight: queue depth = readers.
 */
#ifndef ENGRAM_IO_POOL_H
#define ENGRAM_IO_POOL_H

#include "io_job.h"

typedef struct engram_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *threads;
    uint8_t **bufs;           /* one bounce buffer per thread (+1 for the caller) */
    int nthreads;             /* worker threads (the caller reads too) */
    int started;
    uint64_t generation;
    int stop;
    int active;               /* workers still inside the current job */
    const engram_job *job;
    int64_t next;             /* next request to take */
    engram_ioerr err;
} engram_pool;

typedef struct { engram_pool *p; int idx; } engram_worker_arg;

static void engram_pool_drain(engram_pool *p, uint8_t *buf) {
    for (;;) {
        int64_t r = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (r >= p->job->nreq) return;
        if (__atomic_load_n(&p->err.err, __ATOMIC_RELAXED) != 0) return;
        engram_read_one(p->job, r, buf, &p->mu, &p->err);
    }
}

static void *engram_pool_main(void *arg) {
    engram_worker_arg *a = (engram_worker_arg *)arg;
    engram_pool *p = a->p;
    uint8_t *buf = p->bufs[a->idx];
    free(a);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        engram_pool_drain(p, buf);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void engram_pool_destroy(engram_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    if (p->bufs) for (int i = 0; i <= p->nthreads; i++) free(p->bufs[i]);
    free(p->bufs);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    free(p);
}

/* readers >= 1 concurrent reads: readers - 1 threads plus the caller.
 * Returns NULL and sets *err to an errno value when a thread cannot start. */
static engram_pool *engram_pool_create(int readers, size_t buf_bytes, size_t align, int *err) {
    engram_pool *p = (engram_pool *)calloc(1, sizeof(engram_pool));
    *err = 0;
    if (!p) { *err = ENOMEM; return NULL; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->nthreads = readers > 1 ? readers - 1 : 0;
    p->threads = (pthread_t *)calloc(p->nthreads ? p->nthreads : 1, sizeof(pthread_t));
    p->bufs = (uint8_t **)calloc(p->nthreads + 1, sizeof(uint8_t *));
    if (!p->threads || !p->bufs) { *err = ENOMEM; engram_pool_destroy(p); return NULL; }
    for (int i = 0; i <= p->nthreads; i++) {
        void *b = NULL;
        if (posix_memalign(&b, align, buf_bytes) != 0) { *err = ENOMEM; engram_pool_destroy(p); return NULL; }
        p->bufs[i] = (uint8_t *)b;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < p->nthreads; i++) {
        engram_worker_arg *a = (engram_worker_arg *)malloc(sizeof(engram_worker_arg));
        if (!a) { *err = ENOMEM; break; }
        a->p = p; a->idx = i + 1;
        int rc = pthread_create(&p->threads[i], &attr, engram_pool_main, a);
        if (rc != 0) { free(a); *err = rc; break; }
        p->started++;
    }
    pthread_attr_destroy(&attr);
    if (*err) { engram_pool_destroy(p); return NULL; }
    return p;
}

static int engram_pool_run(engram_pool *p, const engram_job *job, engram_ioerr *e) {
    pthread_mutex_lock(&p->mu);
    p->job = job;
    p->next = 0;
    memset(&p->err, 0, sizeof(p->err));
    p->active = p->nthreads;
    p->generation++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    engram_pool_drain(p, p->bufs[0]);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    *e = p->err;
    pthread_mutex_unlock(&p->mu);
    return e->err ? -1 : 0;
}

#endif
