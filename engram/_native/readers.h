/* Row readers of the storage engine (SPEC §8): serial pread, a persistent pool of
 * pread threads, and an io_uring ring (when liburing was found at build time).
 *
 * All three execute the same list of I/O requests.  A request is one aligned
 * span of the table file (one or a few blocks) that covers one or more rows,
 * read into an aligned bounce buffer (O_DIRECT needs aligned buffer, offset
 * and length); the raw bytes of each row are then copied to its slot of the
 * staging area.  Validation and decoding happen afterwards, in Cython, so a
 * failed batch never publishes anything.
 *
 * Errors: the first failure is kept (errno, or ENGRAM_ESHORT for a read that
 * ended before a row's last byte), with the request and file offset; the other
 * readers stop taking requests.  EINTR and EAGAIN are retried.
 */
#ifndef ENGRAM_READERS_H
#define ENGRAM_READERS_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ENGRAM_HAVE_LIBURING
#include <liburing.h>
#endif

#define ENGRAM_ESHORT (-1)

typedef struct {
    int fd;              /* descriptor of the file holding the span */
    uint64_t span_off;   /* aligned file offset of the span */
    uint32_t span_len;   /* aligned length */
    uint32_t first;      /* index of the first row (distinct, sorted) it covers */
    uint32_t count;      /* rows covered */
} engram_req;

typedef struct {
    int err;             /* 0, an errno value, or ENGRAM_ESHORT */
    int64_t req;         /* failing request */
    uint64_t offset;     /* file offset of the failing read */
    int64_t got;         /* bytes obtained before the failure (short reads) */
} engram_ioerr;

typedef struct {
    int fadvise_dontneed;         /* buffered fallback: drop what was read */
    uint32_t row_bytes;
    const engram_req *reqs;
    int64_t nreq;
    const uint64_t *row_off;      /* file offset of each distinct row */
    uint8_t *staging;             /* row_bytes per distinct row */
} engram_job;

/* Buffered fallback: drop the pages holding a span (DONTNEED only drops whole pages). */
static void engram_drop_span(int fd, uint64_t off, uint64_t len) {
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = off / page * page, end = (off + len + page - 1) / page * page;
    posix_fadvise(fd, (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
}

static void engram_err_set(pthread_mutex_t *mu, engram_ioerr *e, int err, int64_t req, uint64_t off, int64_t got) {
    if (mu) pthread_mutex_lock(mu);
    if (e->err == 0 || req < e->req) {
        e->err = err; e->req = req; e->offset = off; e->got = got;
    }
    if (mu) pthread_mutex_unlock(mu);
}

/* Copy the rows of request r from its bounce buffer (holding `got` bytes). */
static int engram_scatter(const engram_job *job, int64_t r, const uint8_t *buf, int64_t got) {
    const engram_req *q = &job->reqs[r];
    for (uint32_t i = 0; i < q->count; i++) {
        uint32_t d = q->first + i;
        uint64_t rel = job->row_off[d] - q->span_off;
        if ((int64_t)(rel + job->row_bytes) > got) return -1;
        memcpy(job->staging + (uint64_t)d * job->row_bytes, buf + rel, job->row_bytes);
    }
    return 0;
}

/* Blocking read of request r; 0 on success. */
static int engram_read_one(const engram_job *job, int64_t r, uint8_t *buf, pthread_mutex_t *mu, engram_ioerr *e) {
    const engram_req *q = &job->reqs[r];
    int64_t got = 0;
    while (got < (int64_t)q->span_len) {
        ssize_t n = pread(q->fd, buf + got, q->span_len - got, (off_t)(q->span_off + got));
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            engram_err_set(mu, e, errno, r, q->span_off + got, got);
            return -1;
        }
        if (n == 0) break;  /* end of file: the rows may still be covered */
        got += n;
    }
    if (job->fadvise_dontneed)
        engram_drop_span(q->fd, q->span_off, q->span_len);
    if (engram_scatter(job, r, buf, got) != 0) {
        engram_err_set(mu, e, ENGRAM_ESHORT, r, q->span_off + got, got);
        return -1;
    }
    return 0;
}

static int engram_read_serial(const engram_job *job, uint8_t *buf, engram_ioerr *e) {
    for (int64_t r = 0; r < job->nreq; r++)
        if (engram_read_one(job, r, buf, NULL, e) != 0) return -1;
    return 0;
}

/* ------------------------------------------------------------------ pool */
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

/* ------------------------------------------------------------------ ring */
#ifdef ENGRAM_HAVE_LIBURING
#define ENGRAM_HAVE_URING 1
typedef struct engram_ring {
    struct io_uring ring;
    int depth;
    uint8_t **bufs;
    int64_t *slot_req;        /* request held by each slot, -1 when free */
    int64_t *slot_got;        /* bytes already read into the slot */
} engram_ring;

static void engram_ring_destroy(engram_ring *g) {
    if (!g) return;
    io_uring_queue_exit(&g->ring);
    if (g->bufs) for (int i = 0; i < g->depth; i++) free(g->bufs[i]);
    free(g->bufs);
    free(g->slot_req);
    free(g->slot_got);
    free(g);
}

static engram_ring *engram_ring_create(int depth, size_t buf_bytes, size_t align, int *err) {
    engram_ring *g = (engram_ring *)calloc(1, sizeof(engram_ring));
    *err = 0;
    if (!g) { *err = ENOMEM; return NULL; }
    int rc = io_uring_queue_init((unsigned)depth, &g->ring, 0);
    if (rc < 0) { *err = -rc; free(g); return NULL; }
    g->depth = depth;
    g->bufs = (uint8_t **)calloc(depth, sizeof(uint8_t *));
    g->slot_req = (int64_t *)malloc(sizeof(int64_t) * depth);
    g->slot_got = (int64_t *)malloc(sizeof(int64_t) * depth);
    if (!g->bufs || !g->slot_req || !g->slot_got) { *err = ENOMEM; engram_ring_destroy(g); return NULL; }
    for (int i = 0; i < depth; i++) {
        void *b = NULL;
        if (posix_memalign(&b, align, buf_bytes) != 0) { *err = ENOMEM; engram_ring_destroy(g); return NULL; }
        g->bufs[i] = (uint8_t *)b;
    }
    return g;
}

static void engram_ring_prep(engram_ring *g, const engram_job *job, int slot) {
    const engram_req *q = &job->reqs[g->slot_req[slot]];
    int64_t got = g->slot_got[slot];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&g->ring);  /* never NULL: one sqe per free slot */
    io_uring_prep_read(sqe, q->fd, g->bufs[slot] + got, q->span_len - (unsigned)got, q->span_off + got);
    io_uring_sqe_set_data64(sqe, (uint64_t)slot);
}

/* Keep up to `depth` reads in flight until every request is done or one fails. */
static int engram_ring_run(engram_ring *g, const engram_job *job, engram_ioerr *e) {
    int64_t next = 0, inflight = 0;
    memset(e, 0, sizeof(*e));
    for (int s = 0; s < g->depth && next < job->nreq; s++) {
        g->slot_req[s] = next++;
        g->slot_got[s] = 0;
        engram_ring_prep(g, job, s);
        inflight++;
    }
    while (inflight > 0) {
        int rc = io_uring_submit_and_wait(&g->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            if (!e->err) { e->err = -rc; e->req = -1; }
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&g->ring, head, cqe) {
            seen++;
            int slot = (int)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            int64_t r = g->slot_req[slot];
            const engram_req *q = &job->reqs[r];
            inflight--;
            if (res == -EINTR || res == -EAGAIN) {          /* retry the same read */
                if (!e->err) { engram_ring_prep(g, job, slot); inflight++; }
                continue;
            }
            if (res < 0) {
                engram_err_set(NULL, e, -res, r, q->span_off + g->slot_got[slot], g->slot_got[slot]);
                continue;
            }
            g->slot_got[slot] += res;
            if (res > 0 && g->slot_got[slot] < (int64_t)q->span_len) {   /* partial: read the rest */
                if (!e->err) { engram_ring_prep(g, job, slot); inflight++; }
                continue;
            }
            if (job->fadvise_dontneed)
                engram_drop_span(q->fd, q->span_off, q->span_len);
            if (engram_scatter(job, r, g->bufs[slot], g->slot_got[slot]) != 0) {
                engram_err_set(NULL, e, ENGRAM_ESHORT, r, q->span_off + g->slot_got[slot], g->slot_got[slot]);
                continue;
            }
            if (!e->err && next < job->nreq) {
                g->slot_req[slot] = next++;
                g->slot_got[slot] = 0;
                engram_ring_prep(g, job, slot);
                inflight++;
            }
        }
        io_uring_cq_advance(&g->ring, seen);
    }
    return e->err ? -1 : 0;
}
#else
#define ENGRAM_HAVE_URING 0
typedef struct engram_ring { int unused; } engram_ring;
static void engram_ring_destroy(engram_ring *g) { (void)g; }
static engram_ring *engram_ring_create(int depth, size_t buf_bytes, size_t align, int *err) {
    (void)depth; (void)buf_bytes; (void)align; *err = ENOSYS; return NULL;
}
static int engram_ring_run(engram_ring *g, const engram_job *job, engram_ioerr *e) {
    (void)g; (void)job; e->err = ENOSYS; return -1;
}
#endif

#endif
