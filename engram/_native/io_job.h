/* One batch of row reads as a list of requests, and the serial reader (SPEC §8).
 *
 * A request is one aligned span of a table file (one or a few blocks) that
 * covers one or more rows, read into an aligned bounce buffer (O_DIRECT needs
 * aligned buffer, offset and length); the raw bytes of each row are then
 * copied to its slot of the staging area.  Validation and decoding happen
 * afterwards, in Cython, so a failed batch never publishes anything.
 *
 * Errors: the first failure is kept (errno, or ENGRAM_ESHORT for a read that
 * ended before a row's last byte), with the request and file offset; the other
 * readers stop taking requests.  EINTR and EAGAIN are retried.
 */
#ifndef ENGRAM_IO_JOB_H
#define ENGRAM_IO_JOB_H

#include "io_platform.h"

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
    int64_t req;         /* failing request; -1 when the ring itself failed */
    uint64_t offset;     /* file offset of the failing read */
    int64_t got;         /* bytes obtained before the failure (short reads) */
} engram_ioerr;

typedef struct {
    uint64_t drop_granule;        /* buffered fallback: drop the pages read, in units of this; 0 = keep */
    int rw_flags;                 /* preadv2 / io_uring read flags (RWF_DONTCACHE) or 0 */
    uint32_t row_bytes;
    const engram_req *reqs;
    int64_t nreq;
    const uint64_t *row_off;      /* file offset of each distinct row */
    uint8_t *staging;             /* row_bytes per distinct row */
} engram_job;

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

/* A request's bytes are in its buffer: drop its pages (buffered fallback) and
 * copy its rows out.  0, or -1 with the short read recorded. */
static int engram_finish(const engram_job *job, int64_t r, const uint8_t *buf, int64_t got,
                         pthread_mutex_t *mu, engram_ioerr *e) {
    const engram_req *q = &job->reqs[r];
    if (job->drop_granule)
        engram_drop_range(q->fd, q->span_off, q->span_len, job->drop_granule);
    if (engram_scatter(job, r, buf, got) != 0) {
        engram_err_set(mu, e, ENGRAM_ESHORT, r, q->span_off + got, got);
        return -1;
    }
    return 0;
}

/* Blocking read of request r; 0 on success. */
static int engram_read_one(const engram_job *job, int64_t r, uint8_t *buf, pthread_mutex_t *mu, engram_ioerr *e) {
    const engram_req *q = &job->reqs[r];
    int64_t got = 0;
    while (got < (int64_t)q->span_len) {
        ssize_t n = engram_pread(q->fd, buf + got, q->span_len - got, q->span_off + got, job->rw_flags);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            engram_err_set(mu, e, errno, r, q->span_off + got, got);
            return -1;
        }
        if (n == 0) break;  /* end of file: the rows may still be covered */
        got += n;
    }
    return engram_finish(job, r, buf, got, mu, e);
}

static int engram_read_serial(const engram_job *job, uint8_t *buf, engram_ioerr *e) {
    memset(e, 0, sizeof(*e));
    for (int64_t r = 0; r < job->nreq; r++)
        if (engram_read_one(job, r, buf, NULL, e) != 0) return -1;
    return 0;
}

#endif
