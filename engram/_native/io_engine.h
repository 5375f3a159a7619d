/* The shared I/O engine of a device (SPEC §8; issue 15): one queue depth, fair between sessions.
 *
 * Many decode sessions read one device.  Each keeps its own descriptors, request storage and
 * staging (a failed read of one session never touches another's output), but the reads of all
 * of them go through one engine:
 *
 *   credits   The engine allows `readers` reads in flight in all (its queue depth).  A read
 *             needs a credit; each credit that frees is granted again by one dispatcher: it
 *             stays with the job whose read ended while that job's client (a session) holds
 *             less than its share = max(1, readers / active clients); else it goes,
 *             round-robin over the jobs in progress (a job = one chunk of one reader's batch),
 *             to a job whose client holds less than its share; else (work-conserving) to the
 *             job that released it or any job with reads left.  A job never holds more than
 *             its own depth (the reader's `readers`).  A decode batch arriving while a prefill
 *             batch holds every credit gets each credit the prefill releases above its share,
 *             until the decode batch reaches its depth or its share: the prefill batch is
 *             interleaved read by read with the decode batches, never served first in full.
 *   executors A job's granted reads run on the caller's io_uring ring (borrowed from the
 *             engine's cache of rings: one ring per submitting thread at a time, no thread) or
 *             on the engine's pool of pread threads (started on first use, `readers` threads;
 *             the caller reads its own job's granted reads too while it waits).
 *   queue     At most `max_jobs` jobs are admitted at a time, first come first served; a
 *             submitter past the bound waits.  Each job's requests live in its reader
 *             (2048 x 24 at most, SPEC §8), so the queue's memory is bounded too.
 *   errors    A failing read stops its own job only (the first failure, by request order, is
 *             kept in the job); other jobs go on.
 *   fork      engram_engine_fork_prepare/parent/child bracket fork(): in the child the engine
 *             is abandoned (its threads do not exist there; ring descriptors are closed) and
 *             the caller starts a new one.
 *
 *   own       A reader's own pool or ring (a table's private readers) is an engine too, with one
 *             client: the same two loops, `readers` credits (all its own), `readers - 1` pool
 *             threads (pool_threads; the caller is the last reader), a cache of one ring.
 *
 * Every function but the fork hooks takes the engine's mutex itself; none is called with it held.
 * Pool threads woken by a grant are woken once the mutex is released (engram_engine_unlock).
 */
#ifndef ENGRAM_IO_ENGINE_H
#define ENGRAM_IO_ENGINE_H

#include "io_job.h"
#include "io_ring.h"

/* How a job's reads are executed. */
#define ENGRAM_RUN_POOL 0
#define ENGRAM_RUN_RING 1
#define ENGRAM_RUN_AUTO 2      /* the ring for jobs of at most ring_batch reads, else the pool */

/* err.req of a job whose executor failed: io_uring_enter failed (as io_job.h's req = -1), a
 * ring or the pool would not start. */
#define ENGRAM_REQ_RING (-1)
#define ENGRAM_REQ_POOL (-2)
#define ENGRAM_REQ_RING_START (-3)

typedef struct engram_engine engram_engine;

/* A client of the engine: one session (or one standalone table or group). */
typedef struct engram_client {
    int64_t held;              /* credits held by its jobs (granted or running) */
    int jobs;                  /* jobs in progress */
    uint64_t reads;            /* reads granted, ever */
} engram_client;

typedef struct engram_ejob {
    const engram_job *job;
    engram_client *client;
    int depth;                 /* most reads in flight for this job */
    int on_ring;
    size_t buf_bytes, align;   /* bounce buffer a read of this job needs */
    int64_t next;              /* next request to start */
    int64_t granted;           /* credits granted, read not started */
    int64_t running;           /* reads started, not finished */
    engram_ioerr err;
    int sleeping;              /* the caller waits on cv */
    int detached;              /* a begun ring job nobody drives yet (engram_engine_begin): granted nothing */
    int64_t offbook;           /* its reads in flight then, their credits given back (counted again at finish) */
    pthread_cond_t cv;
    struct engram_ejob *prev_job, *next_job;   /* circular list of the jobs in progress */
    uint64_t issued0, own;     /* engine reads at admission; reads granted to this job */
} engram_ejob;

/* What a job did, for the reader's statistics. */
typedef struct engram_run_info {
    int on_ring;               /* executed on a ring (1) or the pool (0) */
    int depth;                 /* its depth */
    uint64_t others;           /* reads of other jobs granted while it was in progress */
} engram_run_info;

typedef struct engram_pool_worker {
    engram_engine *e;
    uint8_t *buf;
    size_t buf_bytes, align;
} engram_pool_worker;

struct engram_engine {
    pthread_mutex_t mu;
    pthread_cond_t work;       /* pool threads wait for granted pool reads */
    pthread_cond_t admit;      /* submitters wait for a place in the queue */
    int readers;               /* queue depth: credits in all */
    int64_t held;              /* credits held */
    int active_clients;        /* clients with a job in progress */
    uint64_t issued;           /* reads granted, ever */
    uint64_t ring_jobs, pool_jobs;
    int ring_batch;            /* ENGRAM_RUN_AUTO: the ring for jobs of at most this many reads */
    /* the queue */
    int max_jobs, njobs;
    uint64_t tickets, left;    /* FIFO admission: ticket t enters once t < left + max_jobs */
    engram_ejob *head, *cursor;
    int64_t pool_grants;       /* granted reads of pool jobs not yet started */
    /* the pool */
    pthread_t *threads;
    engram_pool_worker **workers;     /* each its own allocation: a running thread holds it */
    int nthreads, cap_threads, idle, stop;
    int pool_threads;          /* threads the pool starts: -1 = the queue depth (a device's shared engine);
                                  a reader's own engine: readers - 1, the caller being the last reader */
    int pool_ready;            /* the pool started (its threads, or none needed) */
    int wake;                  /* pool threads to wake once the mutex is released */
    /* the rings: all of them, and whether each is free */
    engram_ring **rings;
    unsigned char *ring_free;
    int nrings, cap_rings;
};

/* ------------------------------------------------------------------ lifetime */
/* `pool_threads`: the threads the pool starts (-1: as many as the queue depth). */
static engram_engine *engram_engine_create(int readers, int max_jobs, int ring_batch, int pool_threads, int *err) {
    engram_engine *e = (engram_engine *)calloc(1, sizeof(engram_engine));
    *err = 0;
    if (!e) { *err = ENOMEM; return NULL; }
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
#if defined(PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP)
    /* held for a few hundred instructions at a time by many threads: spin briefly before sleeping */
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&e->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->admit, NULL);
    e->readers = readers > 0 ? readers : 1;
    e->max_jobs = max_jobs > 0 ? max_jobs : 1;
    e->ring_batch = ring_batch;
    e->pool_threads = pool_threads;
    return e;
}

/* Stop the pool threads and the rings; the engine must have no job (no client reading). */
static void engram_engine_destroy(engram_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->work);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < e->nthreads; i++) pthread_join(e->threads[i], NULL);
    for (int i = 0; i < e->nthreads; i++) {
        free(e->workers[i]->buf);
        free(e->workers[i]);
    }
    for (int i = 0; i < e->nrings; i++) engram_ring_destroy(e->rings[i]);
    free(e->threads);
    free(e->workers);
    free(e->rings);
    free(e->ring_free);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->admit);
    free(e);
}

/* fork(): hold the mutex across it, so that the child sees a consistent engine. */
static void engram_engine_fork_prepare(engram_engine *e) { pthread_mutex_lock(&e->mu); }
static void engram_engine_fork_parent(engram_engine *e) { pthread_mutex_unlock(&e->mu); }

/* In the child: the pool threads do not exist and the rings belong to the parent.  Close the
 * ring descriptors and leave the rest (never destroyed: its threads cannot be joined here). */
static void engram_engine_fork_child(engram_engine *e) {
    for (int i = 0; i < e->nrings; i++) engram_ring_abandon(e->rings[i]);
}

/* The queue depth grows to `readers` (never shrinks while the engine lives). */
static void engram_engine_grow(engram_engine *e, int readers) {
    pthread_mutex_lock(&e->mu);
    if (readers > e->readers) e->readers = readers;
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------ credits */
static int engram_engine_share(const engram_engine *e) {
    int s = e->readers / (e->active_clients > 0 ? e->active_clients : 1);
    return s > 0 ? s : 1;
}

static int engram_ejob_eligible(const engram_ejob *j) {
    return !j->detached && !j->err.err && j->next + j->granted < j->job->nreq && j->running + j->granted < j->depth;
}

/* The next job to grant a credit to.  `self`: the job whose read just ended (its thread is
 * awake and starts a granted read at once, while a ring job's thread waiting in io_uring_enter
 * could take one only at its own next completion).  In order:
 *   1. self, while its client holds less than its share (it keeps its credit);
 *   2. round-robin from the cursor, the jobs whose client holds less than its share;
 *   3. self again (work-conserving: a credit above the share stays where it is used);
 *   4. round-robin, any job with reads left. */
static engram_ejob *engram_engine_pick(engram_engine *e, engram_ejob *self) {
    int share = engram_engine_share(e);
    if (self && engram_ejob_eligible(self) && self->client->held < share) return self;
    engram_ejob *start = e->cursor ? e->cursor : e->head, *j, *any = NULL;
    j = start;
    do {
        if (engram_ejob_eligible(j)) {
            if (j->client->held < share) return j;
            if (!any) any = j;
        }
        j = j->next_job;
    } while (j != start);
    if (self && engram_ejob_eligible(self)) return self;
    return any;
}

/* Grant the free credits, one at a time.  `self_job`: as for engram_engine_pick (NULL: none);
 * `self_worker`: the calling thread is a pool thread that looks for pool work right after (one
 * fewer thread to wake). */
static void engram_engine_dispatch(engram_engine *e, int self_worker, engram_ejob *self_job) {
    if (!e->head) return;
    while (e->held < e->readers) {
        engram_ejob *pick = engram_engine_pick(e, self_job);
        if (!pick) return;
        if (pick != self_job) e->cursor = pick->next_job;
        pick->granted++;
        pick->own++;
        pick->client->held++;
        pick->client->reads++;
        e->held++;
        e->issued++;
        if (pick->on_ring) {
            if (pick->sleeping) pthread_cond_signal(&pick->cv);
            continue;
        }
        e->pool_grants++;
        if (self_worker) self_worker = 0;                                  /* this thread takes it */
        else if (e->wake < e->idle) e->wake++;                             /* woken after the unlock */
        else if (pick->sleeping) pthread_cond_signal(&pick->cv);           /* no thread free: the caller */
    }
}

/* n credits of j return (reads ended, or grants given back) and are granted again; `self` as
 * for engram_engine_dispatch (j keeps its credit while under its share unless it gives back). */
static void engram_engine_release(engram_engine *e, engram_ejob *j, int64_t n, int self_worker, int keep) {
    j->client->held -= n;
    e->held -= n;
    engram_engine_dispatch(e, self_worker, keep ? j : NULL);
}

/* Release the mutex, then wake the pool threads the dispatcher counted (a thread woken while the
 * mutex is held would only wait for it again). */
static void engram_engine_unlock(engram_engine *e) {
    int n = e->wake;
    e->wake = 0;
    pthread_mutex_unlock(&e->mu);
    while (n-- > 0) pthread_cond_signal(&e->work);
}

/* Wake the counted pool threads now (mutex held: the caller is about to wait). */
static void engram_engine_wake_now(engram_engine *e) {
    for (; e->wake > 0; e->wake--) pthread_cond_signal(&e->work);
}

/* A job that stopped on an error gives back the credits it was granted but will not use. */
static void engram_ejob_return_grants(engram_engine *e, engram_ejob *j) {
    if (j->granted > 0) {
        int64_t n = j->granted;
        if (!j->on_ring) e->pool_grants -= n;
        j->granted = 0;
        engram_engine_release(e, j, n, 0, 0);
    }
}

static int engram_ejob_finished(const engram_ejob *j) {
    return j->running == 0 && j->granted == 0 && (j->err.err || j->next >= j->job->nreq);
}

/* Record the outcome of a read of j (le: its error, if any) and return its credit; `self` as
 * for engram_engine_dispatch. */
static void engram_ejob_read_done(engram_engine *e, engram_ejob *j, const engram_ioerr *le, int self) {
    if (le->err) {
        engram_err_set(NULL, &j->err, le->err, le->req, le->offset, le->got);
        engram_ejob_return_grants(e, j);
    }
    j->running--;
    engram_engine_release(e, j, 1, self, 1);
    if (j->sleeping && engram_ejob_finished(j)) pthread_cond_signal(&j->cv);
}

/* ------------------------------------------------------------------ the queue */
static void engram_engine_enter(engram_engine *e, engram_ejob *j) {
    uint64_t t = e->tickets++;
    while (t >= e->left + (uint64_t)e->max_jobs) pthread_cond_wait(&e->admit, &e->mu);
    if (e->head) {
        j->next_job = e->head;
        j->prev_job = e->head->prev_job;
        e->head->prev_job->next_job = j;
        e->head->prev_job = j;
    } else {
        e->head = j->next_job = j->prev_job = j;
    }
    e->njobs++;
    if (j->client->jobs++ == 0) e->active_clients++;
    j->issued0 = e->issued;
    j->own = 0;
    engram_engine_dispatch(e, 0, NULL);
}

static void engram_engine_leave(engram_engine *e, engram_ejob *j, engram_run_info *info) {
    engram_ejob_return_grants(e, j);
    if (j->next_job == j) {
        e->head = e->cursor = NULL;
    } else {
        j->prev_job->next_job = j->next_job;
        j->next_job->prev_job = j->prev_job;
        if (e->head == j) e->head = j->next_job;
        if (e->cursor == j) e->cursor = j->next_job;
    }
    e->njobs--;
    if (--j->client->jobs == 0) e->active_clients--;
    e->left++;
    pthread_cond_broadcast(&e->admit);
    if (info) {
        info->on_ring = j->on_ring;
        info->depth = j->depth;
        info->others = e->issued - j->issued0 - j->own;
    }
    engram_engine_dispatch(e, 0, NULL);  /* one client fewer: the others' share grows */
}

/* ------------------------------------------------------------------ the pool */
static engram_ejob *engram_engine_pool_work(engram_engine *e) {
    if (e->pool_grants <= 0 || !e->head) return NULL;
    engram_ejob *j = e->head;
    do {
        if (!j->on_ring && j->granted > 0) return j;
        j = j->next_job;
    } while (j != e->head);
    return NULL;
}

/* Start read `granted` of pool job j (mutex held): returns the request. */
static int64_t engram_ejob_start_pool_read(engram_engine *e, engram_ejob *j) {
    j->granted--;
    e->pool_grants--;
    j->running++;
    return j->next++;
}

/* A bounce buffer of at least `bytes` aligned to `align` (reallocated when too small). */
static int engram_fit_buffer(uint8_t **buf, size_t *have, size_t *have_align, size_t bytes, size_t align) {
    if (*buf && *have >= bytes && *have_align >= align && *have_align % align == 0) return 0;
    void *b = NULL;
    if (posix_memalign(&b, align, bytes) != 0) return ENOMEM;
    free(*buf);
    *buf = (uint8_t *)b;
    *have = bytes;
    *have_align = align;
    return 0;
}

/* Read request r of j into buf (mutex not held); the outcome in *le. */
static void engram_ejob_read(const engram_ejob *j, int64_t r, uint8_t *buf, engram_ioerr *le) {
    memset(le, 0, sizeof(*le));
    engram_read_one(j->job, r, buf, NULL, le);
}

static void *engram_engine_worker(void *arg) {
    engram_pool_worker *w = (engram_pool_worker *)arg;
    engram_engine *e = w->e;
    engram_ioerr le;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->stop) break;
        engram_ejob *j = engram_engine_pool_work(e);
        if (!j) {
            e->wake = 0;  /* no pool read is granted: nobody to wake */
            e->idle++;
            pthread_cond_wait(&e->work, &e->mu);
            e->idle--;
            continue;
        }
        int64_t r = engram_ejob_start_pool_read(e, j);
        engram_engine_unlock(e);
        if (engram_fit_buffer(&w->buf, &w->buf_bytes, &w->align, j->buf_bytes, j->align) != 0) {
            memset(&le, 0, sizeof(le));
            le.err = ENOMEM; le.req = r; le.offset = j->job->reqs[r].span_off;
        } else {
            engram_ejob_read(j, r, w->buf, &le);
        }
        pthread_mutex_lock(&e->mu);
        engram_ejob_read_done(e, j, &le, 1);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Start pool threads up to the queue depth (or `pool_threads`).  0, or the errno of the first
 * thread that could not start: for a shared engine when none runs (the threads that started keep
 * running), for a reader's own engine (pool_threads >= 0) when any did not start. */
static int engram_engine_start_pool(engram_engine *e) {
    int err = 0;
    pthread_mutex_lock(&e->mu);
    int want = e->pool_threads >= 0 ? e->pool_threads : e->readers;
    if (want > e->cap_threads) {
        pthread_t *t = (pthread_t *)realloc(e->threads, sizeof(pthread_t) * want);
        if (t) e->threads = t;
        engram_pool_worker **w = t ? (engram_pool_worker **)realloc(e->workers, sizeof(engram_pool_worker *) * want)
                                   : NULL;
        if (w) e->workers = w;
        if (t && w) e->cap_threads = want; else want = e->cap_threads;
        if (!t || !w) err = ENOMEM;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    while (e->nthreads < want) {
        engram_pool_worker *w = (engram_pool_worker *)calloc(1, sizeof(engram_pool_worker));
        if (!w) { err = ENOMEM; break; }
        w->e = e;
        int rc = pthread_create(&e->threads[e->nthreads], &attr, engram_engine_worker, w);
        if (rc != 0) { free(w); err = rc; break; }
        e->workers[e->nthreads++] = w;
    }
    pthread_attr_destroy(&attr);
    int n = e->nthreads, own = e->pool_threads >= 0;
    if (n >= want || (n > 0 && !own)) e->pool_ready = 1;
    pthread_mutex_unlock(&e->mu);
    if (own)  /* a reader's own pool: all its threads or an error (the caller stops the engine) */
        return n >= want ? 0 : (err ? err : EAGAIN);
    return n > 0 ? 0 : (err ? err : EAGAIN);
}

/* A reader's own engine: the pool keeps `threads` threads (started by engram_engine_start_pool;
 * never fewer than run already). */
static void engram_engine_set_pool_threads(engram_engine *e, int threads) {
    pthread_mutex_lock(&e->mu);
    e->pool_threads = threads;
    if (threads > e->nthreads) e->pool_ready = 0;
    pthread_mutex_unlock(&e->mu);
}

/* The caller of pool job j reads its granted reads too until the job is finished (mutex held). */
static void engram_engine_pool_job(engram_engine *e, engram_ejob *j, uint8_t *buf) {
    engram_ioerr le;
    while (!engram_ejob_finished(j)) {
        if (j->granted > 0 && !j->err.err) {
            int64_t r = engram_ejob_start_pool_read(e, j);
            engram_engine_unlock(e);
            engram_ejob_read(j, r, buf, &le);
            pthread_mutex_lock(&e->mu);
            engram_ejob_read_done(e, j, &le, 0);
            continue;
        }
        engram_engine_wake_now(e);
        j->sleeping = 1;
        pthread_cond_wait(&j->cv, &e->mu);
        j->sleeping = 0;
    }
}

/* ------------------------------------------------------------------ the rings */
#if ENGRAM_HAVE_URING
/* A free ring that fits j, or a new one (NULL and *err when none can start; mutex held). */
static engram_ring *engram_engine_borrow_ring(engram_engine *e, const engram_ejob *j, int *err) {
    *err = 0;
    for (int i = 0; i < e->nrings; i++) {
        engram_ring *g = e->rings[i];
        if (e->ring_free[i] && g->depth >= j->depth && g->buf_bytes >= j->buf_bytes && g->align % j->align == 0) {
            e->ring_free[i] = 0;
            return g;
        }
    }
    if (e->nrings == e->cap_rings) {
        int cap = e->cap_rings ? 2 * e->cap_rings : 8;
        engram_ring **r = (engram_ring **)realloc(e->rings, sizeof(engram_ring *) * cap);
        if (!r) { *err = ENOMEM; return NULL; }
        e->rings = r;
        unsigned char *f = (unsigned char *)realloc(e->ring_free, cap);
        if (!f) { *err = ENOMEM; return NULL; }
        e->ring_free = f;
        e->cap_rings = cap;
    }
    engram_ring *g = engram_ring_create(j->depth, j->buf_bytes, j->align, 0, err);
    if (!g) return NULL;
    e->rings[e->nrings] = g;
    e->ring_free[e->nrings] = 0;
    e->nrings++;
    return g;
}

/* Give a ring back to the cache, or, when io_uring_enter failed on it, take it out of the cache
 * for the caller to destroy once the mutex is released (mutex held). */
static void engram_engine_return_ring(engram_engine *e, engram_ring *g, int broken) {
    for (int i = 0; i < e->nrings; i++) {
        if (e->rings[i] != g) continue;
        if (!broken) { e->ring_free[i] = 1; return; }
        e->rings[i] = e->rings[e->nrings - 1];
        e->ring_free[i] = e->ring_free[e->nrings - 1];
        e->nrings--;
        return;
    }
}

/* The caller drives ring g for job j: each granted read goes into a free slot (*nfree of them, the
 * slots' indices in g->free_slots); a completion returns its credit, which the dispatcher grants
 * again (mutex held on entry and exit).  Returns 1 when io_uring_enter failed (the ring must be
 * destroyed), else 0. */
static int engram_engine_ring_job(engram_engine *e, engram_ejob *j, engram_ring *g, int *nfree) {
    const engram_job *job = j->job;
    for (;;) {
        while (j->granted > 0 && *nfree > 0 && !j->err.err) {
            int slot = g->free_slots[--*nfree];
            g->slot_req[slot] = j->next++;
            g->slot_got[slot] = 0;
            j->granted--;
            j->running++;
            engram_ring_prep(g, job, slot);
        }
        if (j->running == 0) {
            if (engram_ejob_finished(j)) return 0;
            engram_engine_wake_now(e);
            j->sleeping = 1;
            pthread_cond_wait(&j->cv, &e->mu);
            j->sleeping = 0;
            continue;
        }
        engram_engine_unlock(e);
        int slot = 0;
        engram_ioerr le;
        memset(&le, 0, sizeof(le));
        int got = engram_ring_wait(g, job, &slot, &le);
        pthread_mutex_lock(&e->mu);
        if (got < 0) {  /* the ring failed: every read of this job is abandoned with it */
            engram_ioerr fe;
            memset(&fe, 0, sizeof(fe));
            fe.err = -got; fe.req = ENGRAM_REQ_RING;
            j->err = fe;
            engram_ejob_return_grants(e, j);
            int64_t n = j->running;
            j->running = 0;
            engram_engine_release(e, j, n, 0, 0);
            return 1;
        }
        g->free_slots[(*nfree)++] = slot;
        engram_ejob_read_done(e, j, &le, 0);
    }
}
#endif

/* ------------------------------------------------------------------ a job */
/* A job in progress: begun by engram_engine_begin, finished by engram_engine_finish (the caller's
 * storage, which must stay in place in between: pool threads read its job). */
typedef struct engram_async {
    engram_ejob j;
    engram_engine *e;
    engram_ring *g;            /* the borrowed ring of a ring job, else NULL */
    int nfree;                 /* the ring's free slots */
    int active;                /* begun and entered the queue: engram_engine_finish must follow */
    engram_ioerr err;          /* a failure before the job entered the queue */
} engram_async;

/* Read `job` through the engine as client c: at most `depth` reads in flight, on the ring or
 * the pool (`mode`: ENGRAM_RUN_*).  Begins the job without waiting for any read: the job enters
 * the queue, and the reads granted at once are started (a ring job's submitted to the kernel by
 * this thread with one io_uring_enter, a pool job's handed to the pool's threads).  With `detach`,
 * a ring job is granted nothing more until engram_engine_finish (nobody drives its ring in
 * between), and the reads it submitted give their credits back until then (a job waiting for
 * credits must never wait for a finish that may come after its own); a pool job goes on in the
 * pool.
 * engram_engine_finish must follow on the same `a` (it is 0 or -1 as engram_engine_run; a failure
 * to start is reported there). */
static void engram_engine_begin(engram_engine *e, engram_client *c, const engram_job *job, int depth, int mode,
                                size_t buf_bytes, size_t align, int detach, engram_async *a) {
    engram_ejob *j = &a->j;
    memset(a, 0, sizeof(*a));
    a->e = e;
    if (job->nreq == 0) return;
    j->job = job;
    j->client = c;
    j->buf_bytes = buf_bytes;
    j->align = align;
    pthread_mutex_lock(&e->mu);
    j->depth = depth < e->readers ? depth : e->readers;
    if (j->depth < 1) j->depth = 1;
    engram_ring *g = NULL;
    int rc = 0;
#if ENGRAM_HAVE_URING
    if (mode == ENGRAM_RUN_RING || (mode == ENGRAM_RUN_AUTO && job->nreq <= e->ring_batch)) {
        g = engram_engine_borrow_ring(e, j, &rc);
        if (!g && mode == ENGRAM_RUN_RING) {
            pthread_mutex_unlock(&e->mu);
            a->err.err = rc; a->err.req = ENGRAM_REQ_RING_START;
            return;
        }
    }
#else
    if (mode == ENGRAM_RUN_RING) {
        pthread_mutex_unlock(&e->mu);
        rc = engram_ring_refused_by_env();
        a->err.err = rc ? rc : ENOSYS; a->err.req = ENGRAM_REQ_RING_START;
        return;
    }
#endif
    j->on_ring = g != NULL;
    if (!j->on_ring && !e->pool_ready) {  /* the pool starts on first use */
        pthread_mutex_unlock(&e->mu);
        rc = engram_engine_start_pool(e);
        pthread_mutex_lock(&e->mu);
        if (rc && !e->pool_ready && mode == ENGRAM_RUN_POOL) {
            pthread_mutex_unlock(&e->mu);
            a->err.err = rc; a->err.req = ENGRAM_REQ_POOL;
            return;
        }
    }
    pthread_cond_init(&j->cv, NULL);
    a->g = g;
    a->active = 1;
    if (j->on_ring) e->ring_jobs++; else e->pool_jobs++;
    engram_engine_enter(e, j);
#if ENGRAM_HAVE_URING
    if (g) {
        a->nfree = 0;
        for (int s = g->depth - 1; s >= 0; s--) g->free_slots[a->nfree++] = s;
        if (detach) {  /* the reads granted now go to the kernel at once; no more until finish */
            while (j->granted > 0 && a->nfree > 0) {
                int slot = g->free_slots[--a->nfree];
                g->slot_req[slot] = j->next++;
                g->slot_got[slot] = 0;
                j->granted--;
                j->running++;
                engram_ring_prep(g, job, slot);
            }
            /* Nobody reaps this ring until finish: its reads give their credits back now, so that no
             * other job waits for credits that only this job's finish would return (another job's
             * finish may be the one waiting).  The engine may so have up to one begun batch's reads in
             * flight above its queue depth; finish counts them again. */
            j->detached = 1;
            j->offbook = j->running;
            if (j->offbook) engram_engine_release(e, j, j->offbook, 0, 0);
            engram_engine_unlock(e);
            engram_ring_submit(g);  /* a failure shows again at the first wait, in finish */
            return;
        }
    }
#endif
    (void)detach;
    engram_engine_unlock(e);   /* a pool job's granted reads: the woken pool threads start them */
}

/* Finish the job begun on `a`: the caller drives its ring, or reads its pool job's granted reads
 * too, until every read ended; then it leaves the queue.  `caller_buf`: a bounce buffer of
 * buf_bytes for the caller's own pool reads.  Returns 0, or -1 with *err: the first failed read
 * (req >= 0), the ring that failed (req = ENGRAM_REQ_RING) or would not start
 * (ENGRAM_REQ_RING_START), the pool that would not start (ENGRAM_REQ_POOL). */
static int engram_engine_finish(engram_async *a, uint8_t *caller_buf, engram_ioerr *err, engram_run_info *info) {
    engram_engine *e = a->e;
    engram_ejob *j = &a->j;
    if (info) memset(info, 0, sizeof(*info));
    if (!a->active) {
        *err = a->err;
        return err->err ? -1 : 0;
    }
    a->active = 0;
    engram_ring *g = a->g;
    pthread_mutex_lock(&e->mu);
    int broken = 0;
#if ENGRAM_HAVE_URING
    if (g) {
        if (j->detached) {
            j->detached = 0;
            j->client->held += j->offbook;       /* its reads still in flight hold credits again */
            e->held += j->offbook;
            j->offbook = 0;
            engram_engine_dispatch(e, 0, NULL);  /* it may be granted credits again */
        }
        broken = engram_engine_ring_job(e, j, g, &a->nfree);
    } else
#endif
        engram_engine_pool_job(e, j, caller_buf);
    engram_engine_leave(e, j, info);
#if ENGRAM_HAVE_URING
    if (g) engram_engine_return_ring(e, g, broken);
#endif
    engram_engine_unlock(e);
    pthread_cond_destroy(&j->cv);
    if (broken) engram_ring_destroy(g);  /* drains the reads the kernel may still hold */
    *err = j->err;
    return err->err ? -1 : 0;
}

/* Read `job` through the engine as client c and wait for it (engram_engine_begin, then
 * engram_engine_finish; the same arguments and results). */
static int engram_engine_run(engram_engine *e, engram_client *c, const engram_job *job, int depth, int mode,
                             size_t buf_bytes, size_t align, uint8_t *caller_buf, engram_ioerr *err,
                             engram_run_info *info) {
    engram_async a;
    engram_engine_begin(e, c, job, depth, mode, buf_bytes, align, 0, &a);
    return engram_engine_finish(&a, caller_buf, err, info);
}

/* Make sure a ring for jobs of `depth` reads and buf_bytes / align buffers can start: 0 or the
 * errno of io_uring_setup (the ring is kept in the cache). */
static int engram_engine_ready_ring(engram_engine *e, int depth, size_t buf_bytes, size_t align) {
#if ENGRAM_HAVE_URING
    engram_ejob j;
    memset(&j, 0, sizeof(j));
    j.buf_bytes = buf_bytes;
    j.align = align;
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    j.depth = depth < e->readers ? depth : e->readers;
    engram_ring *g = engram_engine_borrow_ring(e, &j, &rc);
    if (g) engram_engine_return_ring(e, g, 0);
    pthread_mutex_unlock(&e->mu);
    return rc;
#else
    (void)e; (void)depth; (void)buf_bytes; (void)align;
    int rc = engram_ring_refused_by_env();
    return rc ? rc : ENOSYS;
#endif
}

/* Destroy the rings of the cache that no job holds (a reader's own engine leaving the ring). */
static void engram_engine_drop_rings(engram_engine *e) {
#if ENGRAM_HAVE_URING
    pthread_mutex_lock(&e->mu);
    int n = 0;
    engram_ring **gone = e->nrings ? (engram_ring **)malloc(sizeof(engram_ring *) * e->nrings) : NULL;
    for (int i = 0; i < e->nrings;) {
        if (!e->ring_free[i] || !gone) { i++; continue; }
        gone[n++] = e->rings[i];
        e->rings[i] = e->rings[e->nrings - 1];
        e->ring_free[i] = e->ring_free[e->nrings - 1];
        e->nrings--;
    }
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++) engram_ring_destroy(gone[i]);
    free(gone);
#else
    (void)e;
#endif
}

/* Counters of the engine (mutex taken). */
typedef struct engram_engine_stats {
    int readers, threads, idle, rings, free_rings, jobs, active_clients, max_jobs, ring_batch;
    int64_t held;
    uint64_t issued, ring_jobs, pool_jobs, waiting;
} engram_engine_stats;

static void engram_engine_get_stats(engram_engine *e, engram_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    s->readers = e->readers;
    s->threads = e->nthreads;
    s->idle = e->idle;
    s->rings = e->nrings;
    s->free_rings = 0;
    for (int i = 0; i < e->nrings; i++) s->free_rings += e->ring_free[i];
    s->jobs = e->njobs;
    s->active_clients = e->active_clients;
    s->max_jobs = e->max_jobs;
    s->ring_batch = e->ring_batch;
    s->held = e->held;
    s->issued = e->issued;
    s->ring_jobs = e->ring_jobs;
    s->pool_jobs = e->pool_jobs;
    s->waiting = e->tickets - e->left - (uint64_t)e->njobs;
    pthread_mutex_unlock(&e->mu);
}

static void engram_engine_set_ring_batch(engram_engine *e, int ring_batch) {
    pthread_mutex_lock(&e->mu);
    e->ring_batch = ring_batch;
    pthread_mutex_unlock(&e->mu);
}

#endif
