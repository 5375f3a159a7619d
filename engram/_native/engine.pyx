# cython: language_level=3
"""The native shared I/O engine of a device (``io_engine.h``; SPEC §8, issue 15).

:class:`Engine` owns the engine's credits, queue, pool of pread threads and
cache of io_uring rings; :class:`Client` is one session's membership, whose
fair share is counted together.  Readers (``reader.RowReader.attach``) run
their batches through it; :mod:`engram.io_engine` keeps one engine per device
and process.
"""

from engram._native.readers cimport *

cdef class Engine:
    """The native shared I/O engine of one device (``io_engine.h``); :mod:`engram.io_engine`
    keeps one per device and process.

    ``readers``: reads in flight in all (queue depth; also the pool's threads, started on
    first use); ``max_jobs``: jobs admitted at a time (the bounded queue); ``ring_batch``:
    with ``BACKEND_AUTO``, chunks of at most this many reads go on a ring, larger ones on
    the pool; ``pool_threads``: the pool's threads (-1: ``readers``; a reader's own engine
    keeps ``readers - 1``, the caller being the last reader).  :meth:`close` stops the
    threads and rings; it must be called with no reader reading through the engine.
    """

    def __cinit__(self, int readers, int max_jobs, int ring_batch, int pool_threads=-1):
        cdef int err = 0
        self.abandoned = False
        self.e = engram_engine_create(readers, max_jobs, ring_batch, pool_threads, &err)
        if self.e == NULL:
            raise MemoryError()

    def __dealloc__(self):
        self.close()

    def close(self):
        """Stop the pool threads and the rings (idempotent; a no-op in a forked child)."""
        cdef engram_engine* e = self.e
        self.e = NULL
        if e != NULL and not self.abandoned:
            with nogil:
                engram_engine_destroy(e)

    @property
    def closed(self):
        return self.e == NULL

    cdef engram_engine* _get(self) except NULL:
        if self.e == NULL or self.abandoned:
            raise ValueError("the engine is stopped")
        return self.e

    def grow(self, int readers):
        """Raise the queue depth to ``readers`` (never lowered while the engine lives)."""
        cdef engram_engine* e = self._get()
        with nogil:  # never wait for the engine's mutex holding the GIL (fork_prepare holds it)
            engram_engine_grow(e, readers)

    def start_pool(self):
        """Start the pool threads up to the queue depth: 0, or the errno when none could start."""
        cdef engram_engine* e = self._get()
        cdef int err
        with nogil:
            err = engram_engine_start_pool(e)
        return err

    def set_pool_threads(self, int threads):
        """The pool keeps ``threads`` threads (started by :meth:`start_pool`; never fewer than run)."""
        cdef engram_engine* e = self._get()
        with nogil:
            engram_engine_set_pool_threads(e, threads)

    def drop_rings(self):
        """Destroy the cached rings no job holds (a later ring job starts a new one)."""
        cdef engram_engine* e = self._get()
        with nogil:
            engram_engine_drop_rings(e)

    def ready_ring(self, int depth, size_t buf_bytes, size_t align):
        """Make sure a ring for ``depth`` reads of ``buf_bytes`` can start (kept in the cache):
        0 or io_uring_setup's errno (ENOSYS when the ring is not built, EPERM when refused by
        ``ENGRAM_DISABLE_IO_URING``)."""
        cdef engram_engine* e = self._get()
        cdef int err
        with nogil:
            err = engram_engine_ready_ring(e, depth, buf_bytes, align)
        return err

    def set_ring_batch(self, int ring_batch):
        cdef engram_engine* e = self._get()
        with nogil:
            engram_engine_set_ring_batch(e, ring_batch)

    def stats(self):
        """Counters: readers, threads, idle threads, rings (free), jobs, active clients, credits
        held, reads issued, ring and pool jobs, submitters waiting for the queue."""
        cdef engram_engine_stats st
        cdef engram_engine* e = self._get()
        with nogil:
            engram_engine_get_stats(e, &st)
        return {"readers": st.readers, "threads": st.threads, "idle_threads": st.idle, "rings": st.rings,
                "free_rings": st.free_rings, "jobs": st.jobs, "active_clients": st.active_clients,
                "max_jobs": st.max_jobs, "ring_batch": st.ring_batch, "held": st.held, "issued": st.issued,
                "ring_jobs": st.ring_jobs, "pool_jobs": st.pool_jobs, "waiting": st.waiting}

    # fork(): see io_engine.h; called by engram.io_engine's os.register_at_fork hooks
    def fork_prepare(self):
        cdef engram_engine* e = self.e
        if e != NULL and not self.abandoned:
            with nogil:
                engram_engine_fork_prepare(e)

    def fork_parent(self):
        if self.e != NULL and not self.abandoned:
            engram_engine_fork_parent(self.e)  # unlocks: never waits

    def fork_child(self):
        if self.e != NULL and not self.abandoned:
            engram_engine_fork_child(self.e)
            self.abandoned = True


cdef class Client:
    """A client of an :class:`Engine` (one session): its share of the queue depth is counted
    together.  Keeps the engine object alive."""

    def __cinit__(self, Engine engine):
        self.engine = engine
        self.c.held = 0
        self.c.jobs = 0
        self.c.reads = 0

    @property
    def reads(self):
        """Reads granted to this client's jobs."""
        return self.c.reads
