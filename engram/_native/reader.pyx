# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Batched, deduplicated, concurrent row reads of one or more tables (SPEC §8).

A reader serves one or more *segments* (a table: descriptor, byte offset of
row 0, rows); column ``c`` of a batch reads from segment ``c // seg_cols``, so
one decode step's 48 rows of two tables go out as one concurrent batch.
``RowReader.read`` takes row ids ``[T, C]`` (any strides) and fills
``out[T, C, 256]``: it sorts the requests of up to ``CHUNK_REQUESTS`` ids at a
time by row, reads each distinct row once (rows sharing or touching a block
go in one aligned read), checks every row, and only then decodes into the
output, copying duplicates.  The reads run serially, on a persistent pool of
pread threads or on an io_uring ring (``readers.h``); the GIL is released
throughout.  Descriptors are opened by the Python caller.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free, realloc
from libc.string cimport memcpy
from libcpp.algorithm cimport sort
cimport numpy as cnp
import numpy as np

from engram._native.codec cimport check_row, decode_row, ROW_BYTES, ROW_VALUES

cnp.import_array()

cdef extern from "readers.h" nogil:
    int ENGRAM_ESHORT
    int ENGRAM_HAVE_URING
    ctypedef struct engram_req:
        int fd
        uint64_t span_off
        uint32_t span_len
        uint32_t first
        uint32_t count
    ctypedef struct engram_ioerr:
        int err
        int64_t req
        uint64_t offset
        int64_t got
    ctypedef struct engram_job:
        int fadvise_dontneed
        uint32_t row_bytes
        const engram_req* reqs
        int64_t nreq
        const uint64_t* row_off
        uint8_t* staging
    ctypedef struct engram_pool:
        pass
    ctypedef struct engram_ring:
        pass
    int engram_read_serial(const engram_job* job, uint8_t* buf, engram_ioerr* e)
    engram_pool* engram_pool_create(int readers, size_t buf_bytes, size_t align, int* err)
    int engram_pool_run(engram_pool* p, const engram_job* job, engram_ioerr* e)
    void engram_pool_destroy(engram_pool* p)
    engram_ring* engram_ring_create(int depth, size_t buf_bytes, size_t align, int* err)
    int engram_ring_run(engram_ring* g, const engram_job* job, engram_ioerr* e)
    void engram_ring_destroy(engram_ring* g)
    int posix_memalign(void** p, size_t align, size_t size)

#: Requests sorted and read at a time: 2048 tokens x 24 columns (SPEC §8).
CHUNK_REQUESTS = 2048 * 24
cdef Py_ssize_t _CHUNK = 2048 * 24

#: Largest span merged into one read (rows sharing or touching blocks).
MAX_SPAN_BYTES = 16384

HAVE_URING = bool(ENGRAM_HAVE_URING)

cdef enum:
    _SERIAL = 0
    _PREAD = 1
    _URING = 2

BACKEND_SERIAL = _SERIAL
BACKEND_PREAD = _PREAD
BACKEND_URING = _URING


class ReadFailure(Exception):
    """Raised by ``RowReader.read``; ``table.py`` turns it into the public errors.

    ``args`` = (kind, a, b, c, d): "range" (row, token, column, 0), "decode"
    (row, file offset, segment, column), "short" (row, file offset, segment, 0),
    "io" (row, file offset, segment, errno), "ring" (0, 0, 0, errno).
    """


# A request key packs (segment, file offset, position): 4 + 44 + 16 bits.
DEF SEG_BITS = 4
DEF OFF_BITS = 44
DEF POS_BITS = 16
#: Most segments one reader serves, and the largest file offset it addresses.
MAX_SEGMENTS = 1 << SEG_BITS
MAX_FILE_OFFSET = 1 << OFF_BITS


cdef class RowReader:
    """Reads rows of one or more tables through already opened descriptors.

    Parameters: ``segments`` = list of (fd, table byte offset, rows);
    alignment (bytes; 1 for buffered descriptors); whether to drop pages after
    reading (buffered fallback).
    """

    cdef int nseg
    cdef int seg_fd[16]
    cdef uint64_t seg_off[16]
    cdef uint64_t seg_rows[16]
    cdef uint64_t align
    cdef uint32_t span_cap
    cdef bint dontneed
    # bounded request storage, grown on demand up to _CHUNK entries
    cdef Py_ssize_t cap
    cdef uint64_t* keys
    cdef uint64_t* dkey
    cdef uint64_t* doff
    cdef engram_req* reqs
    cdef uint8_t* staging
    cdef uint8_t* bounce
    cdef engram_pool* pool
    cdef engram_ring* ring
    cdef public int pool_readers
    cdef public int ring_depth

    def __cinit__(self, segments, uint64_t align, bint dontneed):
        cdef int i
        self.keys = NULL
        self.dkey = NULL
        self.doff = NULL
        self.reqs = NULL
        self.staging = NULL
        self.bounce = NULL
        self.pool = NULL
        self.ring = NULL
        self.cap = 0
        self.pool_readers = 0
        self.ring_depth = 0
        segs = list(segments)
        if not 1 <= len(segs) <= MAX_SEGMENTS:
            raise ValueError(f"a reader serves 1..{MAX_SEGMENTS} tables, got {len(segs)}")
        self.nseg = len(segs)
        for i, (fd, off, rows) in enumerate(segs):
            if off + rows * ROW_BYTES >= MAX_FILE_OFFSET:
                raise ValueError(f"table {i} ends beyond byte 2**{OFF_BITS}")
            self.seg_fd[i] = fd
            self.seg_off[i] = off
            self.seg_rows[i] = rows
        self.align = align if align > 0 else 1
        self.dontneed = dontneed
        self.span_cap = <uint32_t>max(MAX_SPAN_BYTES, 2 * self.align if self.align > 1 else 2 * ROW_BYTES)
        cdef void* b = NULL
        if posix_memalign(&b, max(self.align, 64), self.span_cap) != 0:
            raise MemoryError()
        self.bounce = <uint8_t*>b

    def __dealloc__(self):
        self.close()

    def close(self):
        """Stop the reader threads and the ring, free the buffers (the fd is the caller's)."""
        if self.pool != NULL:
            with nogil:
                engram_pool_destroy(self.pool)
            self.pool = NULL
        if self.ring != NULL:
            engram_ring_destroy(self.ring)
            self.ring = NULL
        free(self.keys); self.keys = NULL
        free(self.dkey); self.dkey = NULL
        free(self.doff); self.doff = NULL
        free(self.reqs); self.reqs = NULL
        free(self.staging); self.staging = NULL
        free(self.bounce); self.bounce = NULL
        self.cap = 0

    @property
    def span_bytes(self):
        """Largest aligned span read in one request (bytes)."""
        return self.span_cap

    def start_pool(self, int readers):
        """Start ``readers - 1`` persistent threads (the caller is the last reader).

        Returns 0 or the errno of a thread that could not start (nothing runs then).
        """
        cdef int err = 0
        if self.pool != NULL and self.pool_readers == readers:
            return 0
        if self.pool != NULL:
            engram_pool_destroy(self.pool)
            self.pool = NULL
            self.pool_readers = 0
        self.pool = engram_pool_create(readers, self.span_cap, max(self.align, 64), &err)
        if self.pool != NULL:
            self.pool_readers = readers
        return err

    def start_ring(self, int depth):
        """Set up an io_uring ring of ``depth`` entries; returns 0 or an errno (ENOSYS if not built)."""
        cdef int err = 0
        if self.ring != NULL and self.ring_depth == depth:
            return 0
        if self.ring != NULL:
            engram_ring_destroy(self.ring)
            self.ring = NULL
            self.ring_depth = 0
        self.ring = engram_ring_create(depth, self.span_cap, max(self.align, 64), &err)
        if self.ring != NULL:
            self.ring_depth = depth
        return err

    cdef int _reserve(self, Py_ssize_t n) except -1:
        if n <= self.cap:
            return 0
        cdef Py_ssize_t c = max(n, min(_CHUNK, 2 * self.cap))
        cdef void* p
        p = realloc(self.keys, c * sizeof(uint64_t))
        if p == NULL: raise MemoryError()
        self.keys = <uint64_t*>p
        p = realloc(self.dkey, c * sizeof(uint64_t))
        if p == NULL: raise MemoryError()
        self.dkey = <uint64_t*>p
        p = realloc(self.doff, c * sizeof(uint64_t))
        if p == NULL: raise MemoryError()
        self.doff = <uint64_t*>p
        p = realloc(self.reqs, c * sizeof(engram_req))
        if p == NULL: raise MemoryError()
        self.reqs = <engram_req*>p
        p = realloc(self.staging, c * ROW_BYTES)
        if p == NULL: raise MemoryError()
        self.staging = <uint8_t*>p
        self.cap = c
        return 0

    def read(self, cnp.ndarray ids, cnp.ndarray out, int threshold, int backend, Py_ssize_t seg_cols):
        """Fill ``out`` (float32 [T, C, 256], C-contiguous) with the rows of ``ids`` (uint32 [T, C]).

        Column ``c`` reads from segment ``c // seg_cols``.
        ``backend``: BACKEND_PREAD or BACKEND_URING for batches with at least
        ``threshold`` distinct rows (the pool or ring must be started), serial
        otherwise.  Returns (requested, distinct, reads, bytes, concurrency,
        serial_chunks, concurrent_chunks).  Raises ReadFailure; ``out`` is then
        untouched only for single-chunk calls (``table.py`` stages larger ones).
        """
        cdef Py_ssize_t T = ids.shape[0], C = ids.shape[1]
        cdef Py_ssize_t s0 = ids.strides[0] // 4, s1 = ids.strides[1] // 4
        cdef const uint32_t* idp = <const uint32_t*>cnp.PyArray_DATA(ids)
        cdef float* op = <float*>cnp.PyArray_DATA(out)
        cdef Py_ssize_t total = T * C, start, n, i, t, c, nd, nr
        cdef uint64_t row, bad_row = 0
        cdef Py_ssize_t bad_at = -1
        cdef uint64_t requested = 0, distinct = 0, nreads = 0, nbytes = 0
        cdef int conc = 1, rc = 0, col = -1
        cdef int serial_chunks = 0, conc_chunks = 0
        cdef engram_job job
        cdef engram_ioerr err
        cdef uint64_t rb = ROW_BYTES, a = self.align, cur_end, s, e, vk
        cdef uint64_t off_mask = (<uint64_t>1 << OFF_BITS) - 1, pos_mask = (<uint64_t>1 << POS_BITS) - 1
        cdef int seg, fd
        if seg_cols < 1 or (C + seg_cols - 1) // seg_cols > self.nseg:
            raise ValueError(f"{C} columns in groups of {seg_cols} need more than {self.nseg} tables")
        if total == 0:
            return (0, 0, 0, 0, 1, 0, 0)
        # Range check of every id before any I/O.
        with nogil:
            for t in range(T):
                for c in range(C):
                    row = idp[t * s0 + c * s1]
                    if row >= self.seg_rows[c // seg_cols]:
                        bad_at = t * C + c
                        bad_row = row
                        break
                if bad_at >= 0:
                    break
        if bad_at >= 0:
            raise ReadFailure("range", bad_row, bad_at // C, bad_at % C, 0)
        self._reserve(min(total, _CHUNK))
        start = 0
        while start < total:
            n = min(_CHUNK, total - start)
            with nogil:
                # keys: (segment, file offset of the row) << 16 | position within the chunk
                for i in range(n):
                    t = (start + i) // C
                    c = (start + i) % C
                    seg = c // seg_cols
                    vk = (<uint64_t>seg << OFF_BITS) | (self.seg_off[seg] + <uint64_t>idp[t * s0 + c * s1] * rb)
                    self.keys[i] = (vk << POS_BITS) | <uint64_t>i
                sort(self.keys, self.keys + n)
                # distinct rows and their file offsets
                nd = 0
                for i in range(n):
                    vk = self.keys[i] >> POS_BITS
                    if nd == 0 or self.dkey[nd - 1] != vk:
                        self.dkey[nd] = vk
                        self.doff[nd] = vk & off_mask
                        nd += 1
                # aligned spans; rows sharing or touching a span of one file are read together
                nr = 0
                for i in range(nd):
                    fd = self.seg_fd[self.dkey[i] >> OFF_BITS]
                    s = (self.doff[i] // a) * a
                    e = ((self.doff[i] + rb + a - 1) // a) * a
                    if nr > 0 and self.reqs[nr - 1].fd == fd:
                        cur_end = self.reqs[nr - 1].span_off + self.reqs[nr - 1].span_len
                        if s <= cur_end and e - self.reqs[nr - 1].span_off <= self.span_cap:
                            if e > cur_end:
                                self.reqs[nr - 1].span_len = <uint32_t>(e - self.reqs[nr - 1].span_off)
                            self.reqs[nr - 1].count += 1
                            continue
                    self.reqs[nr].fd = fd
                    self.reqs[nr].span_off = s
                    self.reqs[nr].span_len = <uint32_t>(e - s)
                    self.reqs[nr].first = <uint32_t>i
                    self.reqs[nr].count = 1
                    nr += 1
                job.fadvise_dontneed = self.dontneed
                job.row_bytes = ROW_BYTES
                job.reqs = self.reqs
                job.nreq = nr
                job.row_off = self.doff
                job.staging = self.staging
                err.err = 0
                if nd >= threshold and backend == _URING and self.ring != NULL:
                    rc = engram_ring_run(self.ring, &job, &err)
                    conc = max(conc, self.ring_depth)
                    conc_chunks += 1
                elif nd >= threshold and backend == _PREAD and self.pool != NULL:
                    rc = engram_pool_run(self.pool, &job, &err)
                    conc = max(conc, self.pool_readers)
                    conc_chunks += 1
                else:
                    rc = engram_read_serial(&job, self.bounce, &err)
                    serial_chunks += 1
            if rc != 0:
                self._raise_io(err)
            # every row must decode before anything is published
            with nogil:
                for i in range(nd):
                    col = check_row(self.staging + i * rb)
                    if col >= 0:
                        bad_at = i
                        break
            if bad_at >= 0:
                raise ReadFailure("decode", *self._where(bad_at), col)
            with nogil:
                nd = -1
                for i in range(n):
                    vk = self.keys[i] >> POS_BITS
                    t = <Py_ssize_t>(self.keys[i] & pos_mask)
                    if nd >= 0 and self.dkey[nd] == vk:
                        memcpy(op + (start + t) * ROW_VALUES, op + (start + c) * ROW_VALUES,
                               ROW_VALUES * sizeof(float))
                    else:
                        nd += 1
                        c = t
                        decode_row(self.staging + nd * rb, op + (start + t) * ROW_VALUES)
                for i in range(nr):
                    nbytes += self.reqs[i].span_len
            requested += n
            distinct += nd + 1
            nreads += nr
            start += n
        return (requested, distinct, nreads, nbytes, conc, serial_chunks, conc_chunks)

    def _where(self, Py_ssize_t d):
        """(row, file offset, segment) of distinct row ``d`` of the current chunk."""
        cdef int seg = <int>(self.dkey[d] >> OFF_BITS)
        return ((self.doff[d] - self.seg_off[seg]) // ROW_BYTES, self.doff[d], seg)

    cdef _raise_io(self, engram_ioerr err):
        cdef int64_t r = err.req
        cdef uint64_t d
        cdef uint32_t k
        if r < 0:
            # the ring itself failed: drop it so a later call starts clean
            if self.ring != NULL:
                engram_ring_destroy(self.ring)
                self.ring = NULL
                self.ring_depth = 0
            raise ReadFailure("ring", 0, 0, 0, err.err, 0)
        # name the first row of the failing span that was not fully read
        d = self.reqs[r].first
        for k in range(self.reqs[r].count):
            if self.doff[self.reqs[r].first + k] + ROW_BYTES > self.reqs[r].span_off + <uint64_t>max(err.got, 0):
                d = self.reqs[r].first + k
                break
        if err.err == ENGRAM_ESHORT:
            raise ReadFailure("short", *self._where(d), 0)
        raise ReadFailure("io", *self._where(d), err.err)
