/* The io_uring ring of the row readers, through the raw system calls (SPEC §8:
 * "on Linux an io_uring submission of the whole batch is the better tool").
 *
 * Built on Linux whenever the kernel's uapi header <linux/io_uring.h> (it comes
 * with the C toolchain's kernel headers) and the system call numbers are
 * there; no liburing.  As fio's own io_uring engine does, the ring is set up
 * with io_uring_setup(2), its submission queue (SQ), completion queue (CQ)
 * and SQE array are mmapped, and io_uring_enter(2) submits and waits.
 *
 * Memory ordering (the kernel is the other side of each ring):
 *   SQ: we write the SQE and its array slot, then store the SQ tail with
 *       release; the kernel's head is read with acquire.
 *   CQ: the CQ tail is read with acquire before reading the CQEs it covers,
 *       and our head is stored with release after they were read.
 *
 * Whether a ring can start and read is known only at run time: io_uring_setup
 * fails with ENOSYS (kernel without io_uring, some sandboxes), EPERM
 * (kernel.io_uring_disabled, seccomp), ENOMEM (locked memory); some kernels
 * and filters let the ring start but complete every read with -EINVAL.
 * engram/backends.py proves a ring with a real read before trusting it.
 * ENGRAM_DISABLE_IO_URING=1 in the environment refuses the ring at run time
 * as kernel.io_uring_disabled=2 would (EPERM, io_uring_setup never called).
 * ENGRAM_NO_URING defined at build time leaves the ring out.
 */
#ifndef ENGRAM_IO_RING_H
#define ENGRAM_IO_RING_H

#include "io_job.h"

#define ENGRAM_HAVE_URING 0
#if !defined(ENGRAM_NO_URING) && defined(__linux__) && defined(__has_include)
#if __has_include(<linux/io_uring.h>)
#include <linux/io_uring.h>
#include <linux/version.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#if defined(__NR_io_uring_setup) && defined(__NR_io_uring_enter)
#undef ENGRAM_HAVE_URING
#define ENGRAM_HAVE_URING 1
#endif
#endif
#endif

/* Why the ring is (not) built, for `engram info`. */
#if ENGRAM_HAVE_URING
#define ENGRAM_URING_BUILD "system calls"
#define ENGRAM_URING_HEADERS LINUX_VERSION_CODE
#elif defined(ENGRAM_NO_URING)
#define ENGRAM_URING_BUILD "not built: ENGRAM_NO_URING was set at build time"
#define ENGRAM_URING_HEADERS 0
#elif !defined(__linux__)
#define ENGRAM_URING_BUILD "not built: io_uring is Linux only"
#define ENGRAM_URING_HEADERS 0
#else
#define ENGRAM_URING_BUILD "not built: no <linux/io_uring.h> or io_uring system call numbers at build time"
#define ENGRAM_URING_HEADERS 0
#endif

/* Run-time refusal asked for by the environment (see above): 0 or EPERM. */
static int engram_ring_refused_by_env(void) {
    const char *v = getenv("ENGRAM_DISABLE_IO_URING");
    return (v && *v && strcmp(v, "0") != 0) ? EPERM : 0;
}

#if ENGRAM_HAVE_URING

/* Setup flags tried in turn (newest first); a kernel that does not know one answers EINVAL. */
#ifndef IORING_SETUP_SUBMIT_ALL
#define IORING_SETUP_SUBMIT_ALL (1U << 7)
#endif
#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12)
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13)
#endif

typedef struct engram_ring {
    int fd;
    unsigned setup_flags;         /* flags the kernel accepted */
    /* submission queue */
    unsigned *sq_head, *sq_tail, *sq_array;
    unsigned sq_mask, sq_entries, sq_local;   /* sq_local: our tail, published with release */
    struct io_uring_sqe *sqes;
    /* completion queue */
    unsigned *cq_head, *cq_tail;
    unsigned cq_mask;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len, sqes_len;
    /* reads */
    int depth;
    size_t buf_bytes, align;      /* each slot's bounce buffer: bytes and alignment */
    int64_t inflight;             /* reads the kernel holds */
    uint8_t **bufs;
    int64_t *slot_req;            /* request held by each slot */
    int64_t *slot_got;            /* bytes already read into the slot */
    int *free_slots;              /* slots without a read (the engine's ring loop, io_engine.h) */
} engram_ring;

static int engram_uring_setup(unsigned entries, struct io_uring_params *p) {
    return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int engram_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, (size_t)0);
}

/* Wait (bounded) for reads the kernel still holds, discarding their completions. */
static void engram_ring_drain(engram_ring *g) {
    for (int tries = 0; g->inflight > 0 && tries < 1000; tries++) {
        if (engram_uring_enter(g->fd, 0, 1, IORING_ENTER_GETEVENTS) < 0 && errno != EINTR && errno != EAGAIN)
            return;
        unsigned head = *g->cq_head, tail = __atomic_load_n(g->cq_tail, __ATOMIC_ACQUIRE);
        g->inflight -= (int64_t)(tail - head);
        __atomic_store_n(g->cq_head, tail, __ATOMIC_RELEASE);
    }
}

static void engram_ring_destroy(engram_ring *g) {
    if (!g) return;
    int leak = 0;
    if (g->fd >= 0) {
        engram_ring_drain(g);
        /* A read the kernel took and never completed may still write into its buffer: keep the
         * buffers then (reads never submitted hold nothing). */
        int64_t unsubmitted = g->sq_head ? (int64_t)(g->sq_local - __atomic_load_n(g->sq_head, __ATOMIC_ACQUIRE)) : 0;
        leak = g->inflight - unsubmitted > 0;
        if (g->sqes) munmap(g->sqes, g->sqes_len);
        if (g->cq_map && g->cq_map != g->sq_map) munmap(g->cq_map, g->cq_map_len);
        if (g->sq_map) munmap(g->sq_map, g->sq_map_len);
        close(g->fd);
    }
    if (g->bufs && !leak) for (int i = 0; i < g->depth; i++) free(g->bufs[i]);
    if (!leak) free(g->bufs);
    free(g->slot_req);
    free(g->slot_got);
    free(g->free_slots);
    free(g);
}

/* In a child after fork(): close the ring's descriptor and leave the rest (the parent's reads
 * may still complete into its buffers through the shared mappings; this process never uses it). */
static void engram_ring_abandon(engram_ring *g) {
    if (g && g->fd >= 0) { close(g->fd); g->fd = -1; }
}

/* io_uring_setup with `flags`, dropping the optional ones a kernel does not
 * know (it answers EINVAL) newest first; the ring fd or -errno. */
static int engram_ring_setup(unsigned entries, unsigned flags, struct io_uring_params *p) {
    static const unsigned optional[] = {IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SINGLE_ISSUER,
                                        IORING_SETUP_COOP_TASKRUN, IORING_SETUP_SUBMIT_ALL};
    const size_t n = sizeof(optional) / sizeof(optional[0]);
    size_t i = 0;
    for (;;) {
        memset(p, 0, sizeof(*p));
        p->flags = flags;
        int fd = engram_uring_setup(entries, p);
        if (fd >= 0) return fd;
        if (errno != EINVAL) return -errno;
        while (i < n && !(flags & optional[i])) i++;
        if (i == n) return -EINVAL;
        flags &= ~optional[i++];
    }
}

static int engram_ring_map(engram_ring *g, const struct io_uring_params *p) {
    g->sq_map_len = p->sq_off.array + p->sq_entries * sizeof(unsigned);
    g->cq_map_len = p->cq_off.cqes + p->cq_entries * sizeof(struct io_uring_cqe);
    int single = (p->features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) {
        if (g->cq_map_len > g->sq_map_len) g->sq_map_len = g->cq_map_len;
        g->cq_map_len = g->sq_map_len;
    }
    void *sq = mmap(NULL, g->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g->fd,
                    IORING_OFF_SQ_RING);
    if (sq == MAP_FAILED) return errno;
    g->sq_map = sq;
    void *cq = sq;
    if (!single) {
        cq = mmap(NULL, g->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g->fd,
                  IORING_OFF_CQ_RING);
        if (cq == MAP_FAILED) return errno;
    }
    g->cq_map = cq;
    g->sqes_len = p->sq_entries * sizeof(struct io_uring_sqe);
    void *sqes = mmap(NULL, g->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g->fd, IORING_OFF_SQES);
    if (sqes == MAP_FAILED) return errno;
    g->sqes = (struct io_uring_sqe *)sqes;
    uint8_t *s = (uint8_t *)sq, *c = (uint8_t *)cq;
    g->sq_head = (unsigned *)(s + p->sq_off.head);
    g->sq_tail = (unsigned *)(s + p->sq_off.tail);
    g->sq_array = (unsigned *)(s + p->sq_off.array);
    g->sq_mask = *(unsigned *)(s + p->sq_off.ring_mask);
    g->sq_entries = p->sq_entries;
    g->sq_local = *g->sq_tail;
    g->cq_head = (unsigned *)(c + p->cq_off.head);
    g->cq_tail = (unsigned *)(c + p->cq_off.tail);
    g->cq_mask = *(unsigned *)(c + p->cq_off.ring_mask);
    g->cqes = (struct io_uring_cqe *)(c + p->cq_off.cqes);
    return 0;
}

/* A ring of `depth` reads in flight, each with an aligned bounce buffer of
 * `buf_bytes`; `flags` = extra IORING_SETUP_* flags to try.  NULL and *err =
 * errno when it cannot start. */
static engram_ring *engram_ring_create(int depth, size_t buf_bytes, size_t align, unsigned flags, int *err) {
    *err = engram_ring_refused_by_env();
    if (*err) return NULL;
    engram_ring *g = (engram_ring *)calloc(1, sizeof(engram_ring));
    if (!g) { *err = ENOMEM; return NULL; }
    g->fd = -1;
    struct io_uring_params p;
    int fd = engram_ring_setup((unsigned)depth, IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | flags, &p);
    if (fd < 0) { *err = -fd; free(g); return NULL; }
    g->fd = fd;
    g->setup_flags = p.flags;
    g->depth = depth;
    g->buf_bytes = buf_bytes;
    g->align = align;
    *err = engram_ring_map(g, &p);
    if (*err) { engram_ring_destroy(g); return NULL; }
    g->bufs = (uint8_t **)calloc(depth, sizeof(uint8_t *));
    g->slot_req = (int64_t *)malloc(sizeof(int64_t) * depth);
    g->slot_got = (int64_t *)malloc(sizeof(int64_t) * depth);
    g->free_slots = (int *)malloc(sizeof(int) * depth);
    if (!g->bufs || !g->slot_req || !g->slot_got || !g->free_slots) { *err = ENOMEM; engram_ring_destroy(g); return NULL; }
    for (int i = 0; i < depth; i++) {
        void *b = NULL;
        if (posix_memalign(&b, align, buf_bytes) != 0) { *err = ENOMEM; engram_ring_destroy(g); return NULL; }
        g->bufs[i] = (uint8_t *)b;
    }
    return g;
}

/* Queue the read of the rest of slot's request (the SQ has room: one SQE per free slot). */
static void engram_ring_prep(engram_ring *g, const engram_job *job, int slot) {
    const engram_req *q = &job->reqs[g->slot_req[slot]];
    int64_t got = g->slot_got[slot];
    unsigned idx = g->sq_local & g->sq_mask;
    struct io_uring_sqe *sqe = &g->sqes[idx];
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = IORING_OP_READ;
    sqe->fd = q->fd;
    sqe->off = q->span_off + (uint64_t)got;
    sqe->addr = (uint64_t)(uintptr_t)(g->bufs[slot] + got);
    sqe->len = q->span_len - (uint32_t)got;
    sqe->rw_flags = job->rw_flags;
    sqe->user_data = (uint64_t)slot;
    g->sq_array[idx] = idx;
    g->sq_local++;
    g->inflight++;
}

/* Submit the reads queued since the last call and take one completion: 1 with *slot and *res
 * set, 0 when none is ready yet (call again), or -errno when io_uring_enter itself failed (the
 * ring must then be destroyed: reads may still be in flight).
 *
 * One completion is handled at a time and the read that replaces it is submitted
 * (io_uring_enter) before the next completion is handled, as fio does.  Reaping every
 * completion first and submitting all replacements in one io_uring_enter synchronises the reads
 * into waves that the device serves together: at queue depth 16 that loop issued 16 reads per
 * io_uring_enter and reached ~80% of fio's IOPS (benchmarks/BENCHMARKS.md, storage engine). */
static int engram_ring_reap(engram_ring *g, int *slot, int *res) {
    unsigned to_submit = g->sq_local - __atomic_load_n(g->sq_head, __ATOMIC_ACQUIRE);
    __atomic_store_n(g->sq_tail, g->sq_local, __ATOMIC_RELEASE);
    unsigned head = *g->cq_head;
    int ready = __atomic_load_n(g->cq_tail, __ATOMIC_ACQUIRE) != head;
    if (to_submit || !ready) {
        if (engram_uring_enter(g->fd, to_submit, ready ? 0 : 1, IORING_ENTER_GETEVENTS) < 0 &&
            errno != EINTR && errno != EAGAIN && errno != EBUSY)
            return -errno;
    }
    if (__atomic_load_n(g->cq_tail, __ATOMIC_ACQUIRE) == head) return 0;
    const struct io_uring_cqe *cqe = &g->cqes[head & g->cq_mask];
    *slot = (int)cqe->user_data;
    *res = cqe->res;
    __atomic_store_n(g->cq_head, head + 1, __ATOMIC_RELEASE);
    g->inflight--;
    return 1;
}

/* Hand the reads queued since the last call to the kernel without waiting for any (one
 * io_uring_enter): 0, or -errno (the reads stay queued; the next engram_ring_reap submits them
 * again and reports the failure). */
static int engram_ring_submit(engram_ring *g) {
    unsigned to_submit = g->sq_local - __atomic_load_n(g->sq_head, __ATOMIC_ACQUIRE);
    __atomic_store_n(g->sq_tail, g->sq_local, __ATOMIC_RELEASE);
    if (!to_submit) return 0;
    if (engram_uring_enter(g->fd, to_submit, 0, 0) < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY)
        return -errno;
    return 0;
}

/* Wait for the next read of `job` on g to end: 1 with *slot when the request in that slot is done
 * (its rows copied out) or failed (the error in *le); -errno when io_uring_enter itself failed
 * (the ring must then be destroyed: reads may still be in flight).  A read interrupted (-EINTR,
 * -EAGAIN) or short of the span is queued again on the same slot and waited for. */
static int engram_ring_wait(engram_ring *g, const engram_job *job, int *slot, engram_ioerr *le) {
    for (;;) {
        int res = 0, got = engram_ring_reap(g, slot, &res);
        if (got < 0) return got;
        if (got == 0) continue;
        int64_t r = g->slot_req[*slot];
        const engram_req *q = &job->reqs[r];
        if (res == -EINTR || res == -EAGAIN) { engram_ring_prep(g, job, *slot); continue; }
        if (res < 0) {
            engram_err_set(NULL, le, -res, r, q->span_off + g->slot_got[*slot], g->slot_got[*slot]);
            return 1;
        }
        g->slot_got[*slot] += res;
        if (res > 0 && g->slot_got[*slot] < (int64_t)q->span_len) { engram_ring_prep(g, job, *slot); continue; }
        engram_finish(job, r, g->bufs[*slot], g->slot_got[*slot], NULL, le);
        return 1;
    }
}

#else  /* no ring in this build */

typedef struct engram_ring { int depth; size_t buf_bytes, align; } engram_ring;
static void engram_ring_destroy(engram_ring *g) { (void)g; }
static void engram_ring_abandon(engram_ring *g) { (void)g; }
static engram_ring *engram_ring_create(int depth, size_t buf_bytes, size_t align, unsigned flags, int *err) {
    (void)depth; (void)buf_bytes; (void)align; (void)flags;
    *err = engram_ring_refused_by_env();
    if (!*err) *err = ENOSYS;
    return NULL;
}

#endif

#endif
