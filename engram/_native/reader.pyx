# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Batched, deduplicated, concurrent row reads of one or more tables (SPEC §8).

A reader serves one or more *segments* (a table: descriptor, byte offset of
row 0, rows); column ``c`` of a batch reads from segment ``c // seg_cols``, so
one decode step's 48 rows of two tables go out as one concurrent batch.
``RowReader.read`` takes row ids ``[T, C]`` (any strides) and fills
``out[T, C, 256]`` in named steps, per chunk of up to ``CHUNK_REQUESTS`` ids:
sort the requests by row, keep the distinct rows, plan aligned spans (rows
sharing or touching a block go in one read), read the spans, check every row,
and only then publish (decode into the output, copying duplicates).  The reads
run serially, on a persistent pool of pread threads or on an io_uring ring, both
the executors of an engine (``io_engine.h``): the reader's own, or the shared
engine of its device it is attached to; the GIL is released throughout.  Descriptors are opened by
the Python caller.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from posix.unistd cimport getpid, pid_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy
from libcpp.algorithm cimport sort
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
cimport numpy as cnp
import numpy as np

from engram._native import rowcache as _rowcache

from engram._native.codec cimport check_row, decode_row, ROW_BYTES, ROW_VALUES
from engram._native.engine cimport Client, Engine
from engram._native.readers cimport *

cnp.import_array()

# The row cache's insert of a batch's misses (rowcache.pyx admit_records), called on the records in staging.
ctypedef int64_t (*admit_fn)(object, object, const uint64_t*, const uint8_t**, Py_ssize_t) except -1
cdef admit_fn _admit_records = <admit_fn>PyCapsule_GetPointer(_rowcache.ADMIT_RECORDS,
                                                              b"engram._native.rowcache.admit_records")
# Its split around a read in flight (rowcache.pyx reserve_records, fill_records, cancel_records): the misses' slots
# reserved while the device reads, their records written once the reads are in, or the slots given back.
ctypedef int64_t (*reserve_fn)(object, const uint64_t*, int32_t*, Py_ssize_t) except -1
ctypedef int64_t (*fill_fn)(object, object, const uint64_t*, const int32_t*, const uint8_t**, Py_ssize_t) except -1
ctypedef int64_t (*cancel_fn)(object, const uint64_t*, const int32_t*, Py_ssize_t) except -1
cdef reserve_fn _reserve_records = <reserve_fn>PyCapsule_GetPointer(_rowcache.RESERVE_RECORDS,
                                                                    b"engram._native.rowcache.reserve_records")
cdef fill_fn _fill_records = <fill_fn>PyCapsule_GetPointer(_rowcache.FILL_RECORDS,
                                                           b"engram._native.rowcache.fill_records")
cdef cancel_fn _cancel_records = <cancel_fn>PyCapsule_GetPointer(_rowcache.CANCEL_RECORDS,
                                                                 b"engram._native.rowcache.cancel_records")

# A request key packs (segment, file offset, position in the chunk): 4 + 44 + 16 bits.
cdef enum:
    SEG_BITS = 4
    OFF_BITS = 44
    POS_BITS = 16
    # Requests sorted and read at a time: 2048 tokens x 24 columns (SPEC §8).
    CHUNK = 2048 * 24

# Read paths of a chunk (AUTO: an attached engine chooses the ring or its pool per chunk).
cdef enum Path:
    SERIAL = 0
    PREAD = 1
    URING = 2
    AUTO = 3

#: Requests sorted and read at a time: 2048 tokens x 24 columns (SPEC §8).
CHUNK_REQUESTS = CHUNK
#: Largest span merged into one read (rows sharing or touching blocks).
MAX_SPAN_BYTES = 16384
#: Most segments one reader serves, and the largest file offset it addresses.
MAX_SEGMENTS = 1 << SEG_BITS
MAX_FILE_OFFSET = 2 ** <object>OFF_BITS

BACKEND_SERIAL = SERIAL
BACKEND_PREAD = PREAD
BACKEND_URING = URING
BACKEND_AUTO = AUTO
_PATH_NAMES = {SERIAL: "serial", PREAD: "pread", URING: "io_uring", AUTO: "auto"}  # auto: the engine picks

#: The io_uring ring is compiled in (raw system calls; whether it starts is a run-time matter).
HAVE_URING = bool(ENGRAM_HAVE_URING)
#: How the ring was built: "system calls", or "not built: <why>".
URING_BUILD = ENGRAM_URING_BUILD.decode()
#: LINUX_VERSION_CODE of the <linux/io_uring.h> it was built against (0 when not built).
URING_HEADERS = ENGRAM_URING_HEADERS
#: posix_fadvise exists on this platform (not on macOS).
HAVE_FADVISE = bool(ENGRAM_HAVE_FADVISE)
#: preadv2 read flags exist on this platform (Linux).
HAVE_PREADV2 = bool(ENGRAM_HAVE_PREADV2)
#: The uapi value of RWF_DONTCACHE (0 where the platform has none).
RWF_DONTCACHE_FLAG = RWF_DONTCACHE


class ReadFailure(Exception):
    """Raised by ``RowReader.read``; ``engram/table.py`` turns it into the public errors.

    Attributes (keyword-only at construction, so a wrong call fails where it is made):

    kind : {"range", "decode", "short", "io", "ring", "start"}
        ``range``: an id outside its table (``row`` = the id, ``token``, ``column``,
        ``segment``), raised before any I/O.  ``decode``: a row that does not decode
        (``row``, ``offset``, ``segment``, ``value_column`` = the first bad value of the
        row).  ``short``: a read ended before the row's last byte (``row``, ``offset``,
        ``segment``).  ``io``: a read failed with ``errno`` (``row``, ``offset``,
        ``segment``).  ``ring``: io_uring itself failed (``errno``): io_uring_enter, or
        a reader's own ring that could not restart.  ``start``: the ``backend``'s
        executor could not start (``errno``): an engine's ring or pool, or a reader's
        own pool after ``fork()``.
    backend : {"serial", "pread", "io_uring", "auto"}
        The read path that failed (``range`` and ``decode``: the one in use; ``auto``: a ``range`` failure of
        a reader attached to an engine, raised before the engine picked a path).
    """

    KINDS = ("range", "decode", "short", "io", "ring", "start")

    def __init__(self, kind, *, row=-1, token=-1, column=-1, segment=0, offset=-1, errno=0, value_column=-1,
                 backend="serial"):
        if kind not in ReadFailure.KINDS:
            raise ValueError(f"unknown ReadFailure kind {kind!r}")
        if backend not in ("serial", "pread", "io_uring", "auto"):
            raise ValueError(f"unknown read backend {backend!r}")
        super().__init__(kind, row, offset, errno)
        self.kind = kind
        self.row = int(row)
        self.token = int(token)
        self.column = int(column)
        self.segment = int(segment)
        self.offset = int(offset)
        self.errno = int(errno)
        self.value_column = int(value_column)
        self.backend = backend

    def __repr__(self):
        return (f"ReadFailure({self.kind!r}, row={self.row}, token={self.token}, column={self.column}, "
                f"segment={self.segment}, offset={self.offset}, errno={self.errno}, "
                f"value_column={self.value_column}, backend={self.backend!r})")




def list_ids(list ids not None, bint column):
    """The row ids of a short list of Python ints, converted without NumPy's list parser.

    ``ids``: a list whose items are all ``int`` (exactly: not ``bool``, not NumPy scalars) in
    ``[0, 2**32)``.  Returns uint32 ``[n, 1]`` with ``column`` (a column of rows, as
    ``Table.read_rows`` reads them), else ``[n]``; ``None`` when an item is anything else, for the
    caller's general path and its errors (``engram.table._row_ids``)."""
    cdef Py_ssize_t n = PyList_GET_SIZE(ids), i
    cdef cnp.npy_intp dims[2]
    cdef uint32_t* p
    cdef object x
    cdef long long v
    cdef int over
    dims[0] = n
    dims[1] = 1
    cdef cnp.ndarray a = cnp.PyArray_EMPTY(2 if column else 1, dims, cnp.NPY_UINT32, 0)
    p = <uint32_t*>cnp.PyArray_DATA(a)
    for i in range(n):
        x = <object>PyList_GET_ITEM(ids, i)
        if not PyLong_CheckExact(x):
            return None
        v = PyLong_AsLongLongAndOverflow(x, &over)
        if over or v < 0 or v > 0xFFFFFFFF:
            return None
        p[i] = <uint32_t>v
    return a


def cache_buffers(Py_ssize_t n):
    """``(keys, skip)``: new uint64 ``[n]`` and uint8 ``[n]`` arrays for a cached read's keys and hit flags
    (:meth:`RowReader.read`'s ``keys`` and ``skip``), made through NumPy's C API."""
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return cnp.PyArray_EMPTY(1, dims, cnp.NPY_UINT64, 0), cnp.PyArray_EMPTY(1, dims, cnp.NPY_UINT8, 0)


cdef inline bint _c_array(cnp.ndarray a, int typenum, Py_ssize_t size) noexcept:
    """``a`` C-contiguous of dtype ``typenum`` and ``size`` elements (NumPy's C API: no dtype object compared)."""
    return cnp.PyArray_TYPE(a) == typenum and cnp.PyArray_SIZE(a) == size and cnp.PyArray_IS_C_CONTIGUOUS(a)


cdef inline int _check_ids(cnp.ndarray ids) except -1:
    """``ids`` a uint32 ``[T, C]`` array whose strides are whole ids (any order), else ValueError."""
    if cnp.PyArray_TYPE(ids) != cnp.NPY_UINT32 or cnp.PyArray_NDIM(ids) != 2 \
            or cnp.PyArray_STRIDES(ids)[0] % 4 or cnp.PyArray_STRIDES(ids)[1] % 4:
        raise ValueError("ids must be a uint32 array [T, C] with strides of whole ids")
    return 0


cdef inline int _check_rows_out(cnp.ndarray out, int typenum, Py_ssize_t size, str what) except -1:
    """``out`` C-contiguous, writable, of dtype ``typenum`` and ``size`` elements, else ValueError."""
    if not _c_array(out, typenum, size) or not cnp.PyArray_ISWRITEABLE(out):
        raise ValueError(f"out must be a writable C-contiguous {what}")
    return 0

cdef class RowReader:
    """Reads rows of one or more tables through already opened descriptors.

    Parameters: ``segments`` = list of (fd, table byte offset, rows);
    ``align`` = alignment of reads (bytes; 1 for buffered descriptors);
    ``drop_granule`` = buffered fallback: after each read drop the cached pages
    around it in units of this many bytes (0: keep, for O_DIRECT);
    ``rw_flags`` = preadv2 / io_uring read flags (``RWF_DONTCACHE_FLAG``) or 0.
    """

    cdef int nseg
    cdef int seg_fd[16]
    cdef uint64_t seg_off[16]
    cdef uint64_t seg_rows[16]
    cdef uint64_t align
    cdef uint32_t span_cap
    cdef uint64_t drop_granule
    cdef int rw_flags
    # bounded request storage, grown on demand up to CHUNK entries
    cdef Py_ssize_t cap
    cdef uint64_t* keys
    cdef uint64_t* dkey
    cdef uint64_t* doff
    cdef engram_req* reqs
    cdef uint8_t* staging
    cdef uint8_t* bounce
    cdef uint64_t* ckey       # a chunk's misses for the row cache: keys, in position order
    cdef const uint8_t** crec  # and their records in staging
    cdef int32_t* cslot        # and the slots reserved for them while their reads fly (-1: none)
    cdef object rpol           # the cache's policy the last reserving read reserved in, and its misses
    cdef Py_ssize_t rnm
    cdef public int pool_readers
    cdef public int ring_depth
    cdef int ring_want
    cdef pid_t owner          # process that started the reader's own engine
    # concurrent chunks go through an engine (io_engine.h): the reader's own (``own``: its pool
    # and ring, one client), or an attached one (a device's engine shared with other readers)
    cdef Engine eng
    cdef Client cl
    cdef bint own
    cdef int eng_depth
    cdef int eng_depth_used
    cdef uint64_t others
    cdef Py_ssize_t last_nr   # reads planned for the last chunk read (last_spans)
    # a begun read (begin / finish): its engine job, request list and where it publishes
    cdef engram_async aj
    cdef engram_job ajob
    cdef bint apending
    cdef pid_t apid
    cdef int apath
    cdef Py_ssize_t am, and_, anr
    cdef float* aop
    cdef uint8_t* arp
    cdef object aref          # the arrays the begun read publishes into, kept alive
    cdef object acache        # the row cache its misses go into (None: none)
    cdef const uint64_t* akp  # with their keys
    cdef const uint8_t* ask   # and the positions the cache served
    cdef object apol          # the policy its misses' slots were reserved in (None: none reserved)
    cdef Py_ssize_t anm       # and how many misses
    cdef Py_ssize_t atotal    # positions of the begun read

    def __cinit__(self, segments, uint64_t align, uint64_t drop_granule=0, int rw_flags=0):
        cdef int i
        self.keys = NULL
        self.dkey = NULL
        self.doff = NULL
        self.reqs = NULL
        self.staging = NULL
        self.bounce = NULL
        self.ckey = NULL
        self.crec = NULL
        self.cslot = NULL
        self.rpol = None
        self.apol = None
        self.cap = 0
        self.pool_readers = 0
        self.ring_depth = 0
        self.ring_want = 0
        self.owner = getpid()
        self.eng = None
        self.cl = None
        self.own = False
        self.eng_depth = 0
        self.apending = False
        self.aref = None
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
        self.drop_granule = drop_granule
        self.rw_flags = rw_flags
        self.span_cap = <uint32_t>max(MAX_SPAN_BYTES, 2 * self.align if self.align > 1 else 2 * ROW_BYTES)
        cdef void* b = NULL
        if posix_memalign(&b, max(self.align, 64), self.span_cap) != 0:
            raise MemoryError()
        self.bounce = <uint8_t*>b

    def __dealloc__(self):
        self.close()

    def close(self):
        """Stop the reader's own engine (threads joined, rings closed), free the buffers (the fd
        is the caller's); an attached reader is detached (the engine is the caller's).  A begun
        read is waited for first (its rows are not published)."""
        cdef engram_ioerr err
        cdef engram_run_info info
        if self.apending:
            self.apending = False
            self.aref = None
            if self.apid == getpid() and self.apath != SERIAL and self.apath >= 0:
                with nogil:
                    engram_engine_finish(&self.aj, self.bounce, &err, &info)
            if self.apid == getpid() and self.apol is not None:  # its reserved slots will never be filled
                self._cancel_misses(self.acache, self.apol, self.anm)
        self.apol = None
        self.acache = None
        self.detach()
        self._forget_if_forked()
        self._close_own()
        self.pool_readers = 0
        self.ring_depth = 0
        self.ring_want = 0
        free(self.keys); self.keys = NULL
        free(self.dkey); self.dkey = NULL
        free(self.doff); self.doff = NULL
        free(self.reqs); self.reqs = NULL
        free(self.staging); self.staging = NULL
        free(self.bounce); self.bounce = NULL
        free(self.ckey); self.ckey = NULL
        free(self.crec); self.crec = NULL
        free(self.cslot); self.cslot = NULL
        self.cap = 0

    @property
    def span_bytes(self):
        """Largest aligned span read in one request (bytes)."""
        return self.span_cap

    @property
    def drop_bytes(self):
        """Buffered fallback: unit of the pages dropped after each read (0: none dropped)."""
        return self.drop_granule

    @property
    def read_flags(self):
        """preadv2 / io_uring read flags in use (``RWF_DONTCACHE_FLAG`` or 0)."""
        return self.rw_flags

    # ------------------------------------------------------------ the shared engine
    def attach(self, Engine engine, Client client, int depth):
        """Read concurrent chunks through ``engine`` as ``client``, at most ``depth`` reads in
        flight per chunk; the reader's own pool and ring are stopped."""
        if client.engine is not engine:
            raise ValueError("the client belongs to another engine")
        engine._get()
        self._forget_if_forked()
        self._close_own()
        self.ring_depth = 0
        self.ring_want = 0
        self.pool_readers = 0
        self.eng = engine
        self.cl = client
        self.eng_depth = max(1, depth)
        engine.grow(self.eng_depth)

    def detach(self):
        """Stop reading through the engine (a no-op when not attached)."""
        if self.own:
            return
        self.eng = None
        self.cl = None
        self.eng_depth = 0
        self.ring_want = 0

    @property
    def engine(self):
        """The :class:`Engine` this reader is attached to, or None (its own readers)."""
        return None if self.own else self.eng

    @property
    def client(self):
        return None if self.own else self.cl

    @property
    def last_others(self):
        """Reads of other jobs the engine granted while this reader's last call was in progress."""
        return self.others

    cdef void _forget_if_forked(self) noexcept:
        """In a child after fork(): the own engine's threads do not exist and its rings are the
        parent's; abandon it (never joined or drained here; its ring descriptors closed).  The
        next read starts a new own engine with the same pool and ring."""
        if self.apending and self.apid != getpid():
            self.apending = False  # the parent's begun read: its engine job is not this process's
            self.aref = None
        if self.owner == getpid():
            return
        self.owner = getpid()
        if self.own and self.eng is not None:
            self.eng.fork_child()
            self.eng = None
            self.cl = None
            self.own = False

    cdef Engine _own_engine(self):
        """The reader's own engine (one client: this reader), made on first use: queue depth the
        deeper of its pool and ring, ``readers - 1`` pool threads (the caller is the last reader)."""
        if self.eng is None:
            self.eng = Engine(max(1, self.pool_readers, self.ring_want), 8, 0, max(0, self.pool_readers - 1))
            self.cl = Client(self.eng)
            self.own = True
        return self.eng

    cdef void _close_own(self):
        if self.own and self.eng is not None:
            self.eng.close()
        if self.own:
            self.eng = None
            self.cl = None
            self.own = False

    # ------------------------------------------------------------ backends
    def start_pool(self, int readers):
        """Start the pread pool of ``readers`` reads in flight: ``readers - 1`` persistent threads
        of the reader's own engine (the caller is the last reader).

        Attached to an engine: start the engine's pool instead (its queue depth raised to
        ``readers`` if lower).  Returns 0 or the errno of a thread that could not start
        (nothing runs then).
        """
        cdef int err = 0
        cdef Engine e
        self._forget_if_forked()
        if self.eng is not None and not self.own:
            self.eng.grow(readers)
            err = self.eng.start_pool()
            if err == 0:
                self.pool_readers = readers
            return err
        e = self._own_engine()
        e.grow(readers)
        e.set_pool_threads(readers - 1)
        err = e.start_pool()
        if err:  # all or nothing: the threads that started are joined with the engine (a ring of
            self._close_own()  # ring_want starts again in a new one on the next ring read)
        self.pool_readers = readers if err == 0 else 0
        return err

    def start_ring(self, int depth):
        """Set up an io_uring ring of ``depth`` entries (in the reader's own engine); returns 0
        or an errno: ENOSYS when the ring is not built, EPERM when refused by
        ``ENGRAM_DISABLE_IO_URING``, else what io_uring_setup said.  Attached to an engine: make
        sure the engine can start a ring of ``depth``.
        """
        cdef int err = 0
        cdef Engine e
        self._forget_if_forked()
        if self.eng is not None and not self.own:
            err = self.eng.ready_ring(depth, self.span_cap, max(self.align, 64))
        else:
            e = self._own_engine()
            e.grow(depth)
            err = e.ready_ring(depth, self.span_cap, max(self.align, 64))
        self.ring_want = depth if err == 0 else 0
        self.ring_depth = self.ring_want
        return err

    def stop_ring(self):
        """Tear the ring down (a later ``read`` on the ring path needs :meth:`start_ring`);
        attached: stop using the engine's rings."""
        self._forget_if_forked()
        if self.own and self.eng is not None:
            self.eng.drop_rings()
        self.ring_want = 0
        self.ring_depth = 0

    cdef int _check_backend(self, int backend) except -1:
        """The executor ``backend`` asks for is there: a private reader's pool or ring started (AUTO only on
        an engine's), an attached engine not stopped; else ValueError."""
        if self.eng is None or self.own:
            if backend == PREAD and self.pool_readers == 0:
                raise ValueError("the pread pool is not started")
            if backend == URING and self.ring_want == 0:
                raise ValueError("the io_uring ring is not started")
            if backend == AUTO:
                raise ValueError("BACKEND_AUTO needs a reader attached to an engine")
        elif self.eng.closed or self.eng.abandoned:
            raise ValueError("the engine is stopped")
        return 0

    cdef int _reserve(self, Py_ssize_t n) except -1:
        if n <= self.cap:
            return 0
        cdef Py_ssize_t c = max(n, min(<Py_ssize_t>CHUNK, 2 * self.cap))
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
        p = realloc(self.ckey, c * sizeof(uint64_t))
        if p == NULL: raise MemoryError()
        self.ckey = <uint64_t*>p
        p = realloc(self.crec, c * sizeof(uint8_t*))
        if p == NULL: raise MemoryError()
        self.crec = <const uint8_t**>p
        p = realloc(self.cslot, c * sizeof(int32_t))
        if p == NULL: raise MemoryError()
        self.cslot = <int32_t*>p
        self.cap = c
        return 0

    # ------------------------------------------------------------ read
    def read(self, cnp.ndarray ids not None, cnp.ndarray out not None, int threshold, int backend,
             Py_ssize_t seg_cols, cnp.ndarray skip=None, cnp.ndarray raw=None, bint decode=True, object cache=None,
             cnp.ndarray keys=None):
        """Fill ``out`` (float32 [T, C, 256], C-contiguous) with the rows of ``ids`` (uint32 [T, C]).

        ``decode`` False: ``out`` is uint8 [T, C, 264] instead and receives each row's 264-byte
        record as stored (checked to decode to finite values, not decoded): the records a consumer
        decodes elsewhere (an accelerator); ``raw`` must then be None.

        Column ``c`` reads from segment ``c // seg_cols``.  ``backend``:
        BACKEND_PREAD or BACKEND_URING for chunks with at least ``threshold``
        distinct rows (the pool must be started; a ring torn down by a failure
        is restarted), BACKEND_AUTO (attached readers only: the engine picks
        the ring or its pool per chunk), BACKEND_SERIAL or smaller chunks
        serially.  Returns (requested, distinct, reads, bytes, concurrency,
        serial_chunks, pool_chunks, ring_chunks, others): ``others`` = reads of
        other jobs the engine granted meanwhile (0 when not attached).  Raises
        ReadFailure; ``out`` is then untouched only for single-chunk calls
        (``table.py`` stages larger ones).

        ``skip``: uint8 ``[T, C]`` C-contiguous or None; positions where it is
        nonzero are neither read nor published (a row cache serves them); the
        counts then count the other positions only.  ``raw``: uint8
        ``[T * C, 264]`` C-contiguous or None; receives the record of every
        published position, as read (the row cache keeps records, not values).

        ``cache``: an ``engram.RowCache`` or None, with ``keys`` uint64 ``[T * C]`` C-contiguous (the keys
        ``RowCache.serve`` filled; ``skip`` its hits): a chunk's misses (positions not skipped, in position
        order) are inserted into the cache under its lock, their records copied from the staged reads.  On the
        pool or the ring their slots are reserved while the device reads (``rowcache.pyx`` ``reserve_records``,
        between handing the reads to the engine and waiting for them) and the records written once the chunk
        is checked and published (``fill_records``); a chunk read serially inserts after it is published
        (``admit_records``).  Native calls, no ``raw`` array, no Python call between.  Decoded reads only,
        ``raw`` None.  A failing chunk inserts nothing (its reserved slots given back); the
        chunks before it (multi-chunk calls) stay inserted, rows read and checked.
        """
        _check_ids(ids)
        cdef Py_ssize_t T = ids.shape[0], C = ids.shape[1]
        cdef Py_ssize_t s0 = ids.strides[0] // 4, s1 = ids.strides[1] // 4
        cdef const uint32_t* idp = <const uint32_t*>cnp.PyArray_DATA(ids)
        cdef float* op = <float*>cnp.PyArray_DATA(out)
        cdef Py_ssize_t total = T * C, start = 0, n, m, nd, nr, i, nm
        cdef uint64_t requested = 0, distinct = 0, nreads = 0, nbytes = 0, others = 0
        cdef int conc = 1, path, serial_chunks = 0, pool_chunks = 0, ring_chunks = 0
        cdef const uint8_t* sk = NULL
        cdef uint8_t* rp = NULL
        cdef const uint64_t* kp = NULL
        cdef const uint8_t** cr = NULL
        cdef bint reserving
        if skip is not None:
            if not _c_array(skip, cnp.NPY_UINT8, total):
                raise ValueError("skip must be a C-contiguous uint8 array of T * C flags")
            sk = <const uint8_t*>cnp.PyArray_DATA(skip)
        if raw is not None:
            if not _c_array(raw, cnp.NPY_UINT8, total * ROW_BYTES):
                raise ValueError("raw must be a C-contiguous uint8 array of T * C records")
            rp = <uint8_t*>cnp.PyArray_DATA(raw)
        if cache is not None:
            if not decode or raw is not None:
                raise ValueError("cache needs decoded reads and no raw")
            if keys is None or keys.ndim != 1 or not _c_array(keys, cnp.NPY_UINT64, max(total, keys.shape[0])):
                raise ValueError("keys must be a C-contiguous uint64 array of at least T * C keys")
            kp = <const uint64_t*>cnp.PyArray_DATA(keys)
        if not decode:
            if raw is not None:
                raise ValueError("raw must be None when decode is off (the records go to out)")
            _check_rows_out(out, cnp.NPY_UINT8, total * ROW_BYTES, "uint8 array of T * C records when decode is off")
            rp = <uint8_t*>cnp.PyArray_DATA(out)
            op = NULL
        else:
            _check_rows_out(out, cnp.NPY_FLOAT32, total * ROW_VALUES, "float32 array of T * C rows")
        self.last_nr = 0
        if seg_cols < 1 or (C + seg_cols - 1) // seg_cols > self.nseg:
            raise ValueError(f"{C} columns in groups of {seg_cols} need more than {self.nseg} tables")
        self._forget_if_forked()
        if self.apending:
            raise ValueError("the reader has a begun read: finish() it first")
        self._check_backend(backend)
        self.others = 0
        if total == 0:
            return (0, 0, 0, 0, 1, 0, 0, 0, 0)
        self._check_range(idp, T, C, s0, s1, seg_cols, backend)
        self._reserve(min(total, <Py_ssize_t>CHUNK))
        if kp != NULL:
            cr = self.crec
        while start < total:
            n = min(<Py_ssize_t>CHUNK, total - start)
            with nogil:
                m = self._sort_requests(idp, C, s0, s1, seg_cols, start, n, sk)
                nd = self._distinct_rows(m)
                nr = self._plan_spans(nd)
            if m == 0:  # every position of the chunk skipped
                start += n
                continue
            path = SERIAL if nd < threshold else backend
            reserving = kp != NULL and path != SERIAL
            if reserving:  # the misses' slots reserved while the device reads them
                path = self._read_spans_reserving(nr, path, cache, kp + start, sk + start if sk != NULL else NULL, n)
            else:
                path = self._read_spans(nr, path)
            self.last_nr = nr
            try:
                self._check_rows(nd, path)
            except BaseException:
                if reserving:
                    self._cancel_misses(cache, self.rpol, self.rnm)
                    self.rpol = None
                raise
            with nogil:
                if op == NULL:
                    self._publish_raw(rp + start * ROW_BYTES, m)
                else:
                    self._publish(op + start * ROW_VALUES, m, rp + start * ROW_BYTES if rp != NULL else NULL, cr)
            if reserving:
                with nogil:
                    self._gather_records(sk + start if sk != NULL else NULL, n)
                self._fill_misses(cache, self.rpol, self.rnm)
                self.rpol = None
            elif kp != NULL:
                with nogil:
                    nm = self._gather_misses(kp + start, sk + start if sk != NULL else NULL, n)
                self._admit(cache, nm)
            if path == SERIAL:
                serial_chunks += 1
            elif path == PREAD:
                pool_chunks += 1
            else:
                ring_chunks += 1
            if path != SERIAL:
                conc = max(conc, self.eng_depth_used)
                others += self.others
            for i in range(nr):
                nbytes += self.reqs[i].span_len
            requested += m
            distinct += nd
            nreads += nr
            start += n
        self.others = others
        return (requested, distinct, nreads, nbytes, conc, serial_chunks, pool_chunks, ring_chunks, others)

    # ------------------------------------------------------------ a read begun now, finished later
    def begin(self, cnp.ndarray ids not None, cnp.ndarray out not None, int backend, Py_ssize_t seg_cols,
              cnp.ndarray skip=None, cnp.ndarray raw=None, int depth=0, object cache=None, cnp.ndarray keys=None):
        """Begin reading the rows of ``ids`` (uint32 [T, C], at most ``CHUNK_REQUESTS`` of them) into
        ``out`` (float32 [T, C, 256], C-contiguous) without waiting: the requests are planned and
        handed to the engine at once from the calling thread (on the ring: submitted to the kernel
        with one io_uring_enter, as many as the engine grants now; on the pool: to its threads).
        :meth:`finish` waits for them, checks and publishes, and must follow before any other read
        of this reader.  ``depth``: reads in flight for this batch, above the reader's (0: the
        reader's); the engine bounds it by its queue depth.  A ring batch is granted nothing more
        until :meth:`finish` (nobody drives the ring in between), so the rest of a batch deeper than
        what the engine granted is read then.  The threshold does not apply: a begun batch is never
        read serially unless ``backend`` is BACKEND_SERIAL (then :meth:`finish` reads it).
        ``skip``, ``raw``, ``cache`` and ``keys`` as for :meth:`read` (:meth:`finish` inserts the misses
        into ``cache`` from staging).  Raises ValueError for bad arguments or a read
        already begun, ReadFailure("range") before any I/O; the other failures are raised by
        :meth:`finish`."""
        _check_ids(ids)
        cdef Py_ssize_t T = ids.shape[0], C = ids.shape[1]
        cdef Py_ssize_t s0 = ids.strides[0] // 4, s1 = ids.strides[1] // 4
        cdef const uint32_t* idp = <const uint32_t*>cnp.PyArray_DATA(ids)
        cdef Py_ssize_t total = T * C, m, nd, nr
        cdef const uint8_t* sk = NULL
        cdef int mode, d
        cdef engram_engine* e
        self._forget_if_forked()
        if self.apending:
            raise ValueError("the reader has a begun read: finish() it first")
        if total > CHUNK:
            raise ValueError(f"a begun read holds at most {CHUNK} ids, got {total}")
        _check_rows_out(out, cnp.NPY_FLOAT32, total * ROW_VALUES, "float32 array of T * C rows")
        if skip is not None:
            if not _c_array(skip, cnp.NPY_UINT8, total):
                raise ValueError("skip must be a C-contiguous uint8 array of T * C flags")
            sk = <const uint8_t*>cnp.PyArray_DATA(skip)
        self.arp = NULL
        if raw is not None:
            if not _c_array(raw, cnp.NPY_UINT8, total * ROW_BYTES):
                raise ValueError("raw must be a C-contiguous uint8 array of T * C records")
            self.arp = <uint8_t*>cnp.PyArray_DATA(raw)
        self.acache = None
        self.akp = NULL
        self.ask = sk
        self.atotal = total
        if cache is not None:
            if raw is not None:
                raise ValueError("cache needs no raw")
            if keys is None or keys.ndim != 1 or not _c_array(keys, cnp.NPY_UINT64, max(total, keys.shape[0])):
                raise ValueError("keys must be a C-contiguous uint64 array of at least T * C keys")
            self.acache = cache
            self.akp = <const uint64_t*>cnp.PyArray_DATA(keys)
        if seg_cols < 1 or (C + seg_cols - 1) // seg_cols > self.nseg:
            raise ValueError(f"{C} columns in groups of {seg_cols} need more than {self.nseg} tables")
        self._check_backend(backend)
        self.aop = <float*>cnp.PyArray_DATA(out)
        self.others = 0
        self.am = self.and_ = self.anr = 0
        self.apath = -1  # nothing to read
        if total:
            self._check_range(idp, T, C, s0, s1, seg_cols, backend)
            self._reserve(total)
            with nogil:
                m = self._sort_requests(idp, C, s0, s1, seg_cols, 0, total, sk)
                nd = self._distinct_rows(m)
                nr = self._plan_spans(nd)
            self.am, self.and_, self.anr = m, nd, nr
            self.last_nr = nr
            self.ajob.drop_granule = self.drop_granule
            self.ajob.rw_flags = self.rw_flags
            self.ajob.row_bytes = ROW_BYTES
            self.ajob.reqs = self.reqs
            self.ajob.nreq = nr
            self.ajob.row_off = self.doff
            self.ajob.staging = self.staging
            if m > 0:
                self.apath = backend
        self.aref = (ids, out, skip, raw, keys)
        self.apid = getpid()
        self.apending = True
        self.apol = None
        if self.apath < 0:
            return
        if self.apath != SERIAL:
            if self.own or self.eng is None:
                e = self._own_engine()._get()
                d = self.pool_readers if backend == PREAD else self.ring_want
            else:
                e = self.eng._get()
                d = max(self.eng_depth, depth)
            mode = ENGRAM_RUN_POOL if backend == PREAD else ENGRAM_RUN_RING if backend == URING else ENGRAM_RUN_AUTO
            with nogil:
                engram_engine_begin(e, &self.cl.c, &self.ajob, d, mode, self.span_cap, max(self.align, 64), 1,
                                    &self.aj)
        if self.acache is not None:  # the misses' slots reserved now, while the reads fly; filled by finish
            with nogil:
                self.anm = self._gather_keys(self.akp, self.ask, total)
            try:
                self.apol = self._reserve_misses(self.acache, self.anm)
            except BaseException:
                self._drop_begun()
                raise

    cdef void _drop_begun(self):
        """Drop a begun read (its reads waited for, nothing published, nothing left reserved)."""
        cdef engram_ioerr err
        cdef engram_run_info info
        self.apending = False
        self.aref = None
        if self.apath != SERIAL and self.apath >= 0:
            with nogil:
                engram_engine_finish(&self.aj, self.bounce, &err, &info)
        self.acache = None
        self.apol = None

    @property
    def begun(self):
        """A read was begun and not finished (in this process)."""
        return bool(self.apending) and self.apid == getpid()

    def finish(self):
        """Wait for the read :meth:`begin` began, check every row, publish: returns what :meth:`read`
        returns.  Raises ValueError when none was begun (in this process: a child after fork() does
        not finish its parent's), ReadFailure as :meth:`read` (``out`` untouched)."""
        cdef engram_ioerr err
        cdef engram_run_info info
        cdef int rc = 0, path = self.apath
        cdef Py_ssize_t i, nm
        cdef const uint8_t** cr
        cdef uint64_t nbytes = 0
        if not self.apending or self.apid != getpid():
            self._forget_if_forked()
            raise ValueError("no begun read to finish")
        self.apending = False
        ref, self.aref = self.aref, None
        cache, self.acache = self.acache, None
        pol, self.apol = self.apol, None
        if path < 0:
            return (0, 0, 0, 0, 1, 0, 0, 0, 0)
        err.err = 0
        err.req = 0
        try:
            if path == SERIAL:
                with nogil:
                    rc = engram_read_serial(&self.ajob, self.bounce, &err)
                if rc != 0:
                    self._raise_io(err, path)
            else:
                with nogil:
                    rc = engram_engine_finish(&self.aj, self.bounce, &err, &info)
                path = URING if info.on_ring else PREAD
                self.others = info.others
                self.eng_depth_used = info.depth
                if rc != 0:
                    self._run_failed(err, path)
            self._check_rows(self.and_, path)
        except BaseException:
            if pol is not None:  # nothing published: the reserved slots given back
                self._cancel_misses(cache, pol, self.anm)
            raise
        cr = self.crec if cache is not None else NULL
        with nogil:
            self._publish(self.aop, self.am, self.arp, cr)
        if pol is not None:
            with nogil:
                self._gather_records(self.ask, self.atotal)
            self._fill_misses(cache, pol, self.anm)
        elif cache is not None:
            with nogil:
                nm = self._gather_misses(self.akp, self.ask, self.atotal)
            self._admit(cache, nm)
        for i in range(self.anr):
            nbytes += self.reqs[i].span_len
        conc = 1 if path == SERIAL else max(1, self.eng_depth_used)
        return (self.am, self.and_, self.anr, nbytes, conc, int(path == SERIAL), int(path == PREAD),
                int(path == URING), self.others if path != SERIAL else 0)

    cdef int _check_range(self, const uint32_t* idp, Py_ssize_t T, Py_ssize_t C, Py_ssize_t s0, Py_ssize_t s1,
                          Py_ssize_t seg_cols, int backend) except -1:
        """Every id inside its table, before any I/O; else ReadFailure("range")."""
        cdef Py_ssize_t t, c, bad_at = -1
        cdef uint64_t row, bad_row = 0
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
            raise ReadFailure("range", row=bad_row, token=bad_at // C, column=bad_at % C,
                              segment=(bad_at % C) // seg_cols, backend=_PATH_NAMES[backend])
        return 0

    cdef Py_ssize_t _sort_requests(self, const uint32_t* idp, Py_ssize_t C, Py_ssize_t s0, Py_ssize_t s1,
                                   Py_ssize_t seg_cols, Py_ssize_t start, Py_ssize_t n,
                                   const uint8_t* skip) noexcept nogil:
        """keys[j] = (segment, file offset of the row) << 16 | position i in the chunk, sorted, for the
        positions not skipped; returns their count."""
        cdef Py_ssize_t i, t, c, m = 0
        cdef int seg
        cdef uint64_t vk
        for i in range(n):
            if skip != NULL and skip[start + i]:
                continue
            t = (start + i) // C
            c = (start + i) % C
            seg = <int>(c // seg_cols)
            vk = (<uint64_t>seg << OFF_BITS) | (self.seg_off[seg] + <uint64_t>idp[t * s0 + c * s1] * ROW_BYTES)
            self.keys[m] = (vk << POS_BITS) | <uint64_t>i
            m += 1
        sort(self.keys, self.keys + m)
        return m

    cdef Py_ssize_t _distinct_rows(self, Py_ssize_t n) noexcept nogil:
        """dkey / doff: the distinct (segment, offset) keys and file offsets; returns their count."""
        cdef Py_ssize_t i, nd = 0
        cdef uint64_t vk, off_mask = (<uint64_t>1 << OFF_BITS) - 1
        for i in range(n):
            vk = self.keys[i] >> POS_BITS
            if nd == 0 or self.dkey[nd - 1] != vk:
                self.dkey[nd] = vk
                self.doff[nd] = vk & off_mask
                nd += 1
        return nd

    cdef Py_ssize_t _plan_spans(self, Py_ssize_t nd) noexcept nogil:
        """reqs: aligned spans; rows sharing or touching a span of one file go in one read."""
        cdef Py_ssize_t i, nr = 0
        cdef uint64_t a = self.align, s, e, cur_end
        cdef int fd
        for i in range(nd):
            fd = self.seg_fd[self.dkey[i] >> OFF_BITS]
            s = (self.doff[i] // a) * a
            e = ((self.doff[i] + ROW_BYTES + a - 1) // a) * a
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
        return nr

    cdef int _read_spans(self, Py_ssize_t nr, int path) except -1:
        """Read the planned spans into staging on ``path``; returns the path that read them
        (an engine's choice for AUTO); ReadFailure io/short/ring/pool on failure."""
        cdef engram_job job
        cdef engram_ioerr err
        cdef engram_run_info info
        cdef int rc = 0, mode, depth
        cdef engram_engine* e
        job.drop_granule = self.drop_granule
        job.rw_flags = self.rw_flags
        job.row_bytes = ROW_BYTES
        job.reqs = self.reqs
        job.nreq = nr
        job.row_off = self.doff
        job.staging = self.staging
        err.err = 0
        err.req = 0
        if path == SERIAL:
            with nogil:
                rc = engram_read_serial(&job, self.bounce, &err)
            if rc != 0:
                self._raise_io(err, path)
            return path
        # the pool or the ring: the engine's executors, the reader's own engine or an attached one
        if self.own or self.eng is None:
            e = self._own_engine()._get()
            depth = self.pool_readers if path == PREAD else self.ring_want
        else:
            e = self.eng._get()
            depth = self.eng_depth
        mode = ENGRAM_RUN_POOL if path == PREAD else ENGRAM_RUN_RING if path == URING else ENGRAM_RUN_AUTO
        with nogil:
            rc = engram_engine_run(e, &self.cl.c, &job, depth, mode, self.span_cap,
                                   max(self.align, 64), self.bounce, &err, &info)
        path = URING if info.on_ring else PREAD
        self.others = info.others
        self.eng_depth_used = info.depth
        if rc != 0:
            self._run_failed(err, path)
        return path

    cdef int _run_failed(self, engram_ioerr err, int path) except -1:
        """Raise the ReadFailure of an engine job that failed on ``path``."""
        if True:
            if err.req == ENGRAM_REQ_RING:
                raise ReadFailure("ring", errno=err.err, backend="io_uring")
            if err.req == ENGRAM_REQ_RING_START:
                # a reader's own ring that cannot start again (after a failure or fork()): the
                # ring's fault, as at its first start; an attached engine's: its executor's start
                raise ReadFailure("ring" if self.own else "start", errno=err.err, backend="io_uring")
            if err.req == ENGRAM_REQ_POOL:
                raise ReadFailure("start", errno=err.err, backend="pread")
            self._raise_io(err, path)
        return 0

    cdef int _check_rows(self, Py_ssize_t nd, int path) except -1:
        """Every staged row decodes to finite values; else ReadFailure("decode")."""
        cdef Py_ssize_t i, bad = -1
        cdef int col = -1
        with nogil:
            for i in range(nd):
                col = check_row(self.staging + i * ROW_BYTES)
                if col >= 0:
                    bad = i
                    break
        if bad >= 0:
            row, offset, seg = self._where(bad)
            raise ReadFailure("decode", row=row, offset=offset, segment=seg, value_column=col,
                              backend=_PATH_NAMES[path])
        return 0

    cdef void _publish(self, float* op, Py_ssize_t n, uint8_t* rp, const uint8_t** cr) noexcept nogil:
        """Decode each distinct row into its first position; copy it to the duplicates; the records to
        ``rp`` (when not NULL) at every position; in ``cr`` (when not NULL) each position's record in staging."""
        cdef Py_ssize_t i, t, first = 0, d = -1
        cdef uint64_t vk, pos_mask = (<uint64_t>1 << POS_BITS) - 1
        for i in range(n):
            vk = self.keys[i] >> POS_BITS
            t = <Py_ssize_t>(self.keys[i] & pos_mask)
            if d >= 0 and self.dkey[d] == vk:
                memcpy(op + t * ROW_VALUES, op + first * ROW_VALUES, ROW_VALUES * sizeof(float))
            else:
                d += 1
                first = t
                decode_row(self.staging + d * ROW_BYTES, op + t * ROW_VALUES)
            if rp != NULL:
                memcpy(rp + t * ROW_BYTES, self.staging + d * ROW_BYTES, ROW_BYTES)
            if cr != NULL:
                cr[t] = self.staging + d * ROW_BYTES

    cdef Py_ssize_t _gather_misses(self, const uint64_t* kp, const uint8_t* sk, Py_ssize_t n) noexcept nogil:
        """The chunk's published positions (not skipped), in position order: their keys into ``ckey`` and their
        records' places in staging (``crec``, by position from :meth:`_publish`) compacted; returns their count."""
        cdef Py_ssize_t t, j = 0
        for t in range(n):
            if sk != NULL and sk[t]:
                continue
            self.ckey[j] = kp[t]
            self.crec[j] = self.crec[t]
            j += 1
        return j

    cdef int _admit(self, object cache, Py_ssize_t m) except -1:
        """Insert the gathered misses into ``cache`` (an ``engram.RowCache``) under its lock."""
        lock = cache._lock
        if not lock.acquire(False):
            cache.contended += 1
            lock.acquire()
        try:
            cache.inserts += _admit_records(cache._policy, cache._records, self.ckey, self.crec, m)
        finally:
            lock.release()
        return 0

    cdef Py_ssize_t _gather_keys(self, const uint64_t* kp, const uint8_t* sk, Py_ssize_t n) noexcept nogil:
        """The keys of the chunk's positions not skipped (the misses), in position order, into ``ckey``; returns
        their count (the first half of :meth:`_gather_misses`, before the reads are in)."""
        cdef Py_ssize_t t, j = 0
        for t in range(n):
            if sk != NULL and sk[t]:
                continue
            self.ckey[j] = kp[t]
            j += 1
        return j

    cdef void _gather_records(self, const uint8_t* sk, Py_ssize_t n) noexcept nogil:
        """The records' places in staging of the positions :meth:`_gather_keys` kept (``crec``, by position from
        :meth:`_publish`) compacted beside their keys."""
        cdef Py_ssize_t t, j = 0
        for t in range(n):
            if sk != NULL and sk[t]:
                continue
            self.crec[j] = self.crec[t]
            j += 1

    cdef object _reserve_misses(self, object cache, Py_ssize_t m):
        """Reserve slots in ``cache`` for the ``m`` misses in ``ckey`` (into ``cslot``) under its lock; returns the
        policy they were reserved in (``RowCache.clear`` replaces it: the fill then writes nothing)."""
        lock = cache._lock
        if not lock.acquire(False):
            cache.contended += 1
            lock.acquire()
        try:
            pol = cache._policy
            cache.inserts += _reserve_records(pol, self.ckey, self.cslot, m)
        finally:
            lock.release()
        return pol

    cdef int _fill_misses(self, object cache, object pol, Py_ssize_t m) except -1:
        """Write the records (``crec``) of the slots :meth:`_reserve_misses` reserved, under the cache's lock."""
        lock = cache._lock
        if not lock.acquire(False):
            cache.contended += 1
            lock.acquire()
        try:
            if cache._policy is pol:
                _fill_records(pol, cache._records, self.ckey, self.cslot, self.crec, m)
        finally:
            lock.release()
        return 0

    cdef int _cancel_misses(self, object cache, object pol, Py_ssize_t m) except -1:
        """Give back the slots :meth:`_reserve_misses` reserved (their reads failed), under the cache's lock."""
        lock = cache._lock
        lock.acquire()
        try:
            if cache._policy is pol:
                cache.inserts -= _cancel_records(pol, self.ckey, self.cslot, m)
        finally:
            lock.release()
        return 0

    cdef int _read_spans_reserving(self, Py_ssize_t nr, int path, object cache, const uint64_t* kp,
                                   const uint8_t* sk, Py_ssize_t n) except -1:
        """:meth:`_read_spans` on the pool or the ring for a chunk of ``n`` positions with a row cache: the reads
        handed to the engine first (``engram_engine_begin``, a ring's submitted at once), then the misses' slots
        reserved in ``cache`` (keys ``kp``, positions ``sk`` skipped) while the device reads, then the wait.  The
        policy and the misses go to ``rpol`` / ``rnm`` for the fill; a failed read gives the slots back before
        its ReadFailure."""
        cdef engram_job job
        cdef engram_async a
        cdef engram_ioerr err
        cdef engram_run_info info
        cdef int rc = 0, mode, depth
        cdef engram_engine* e
        cdef Py_ssize_t nm
        job.drop_granule = self.drop_granule
        job.rw_flags = self.rw_flags
        job.row_bytes = ROW_BYTES
        job.reqs = self.reqs
        job.nreq = nr
        job.row_off = self.doff
        job.staging = self.staging
        err.err = 0
        err.req = 0
        if self.own or self.eng is None:
            e = self._own_engine()._get()
            depth = self.pool_readers if path == PREAD else self.ring_want
        else:
            e = self.eng._get()
            depth = self.eng_depth
        mode = ENGRAM_RUN_POOL if path == PREAD else ENGRAM_RUN_RING if path == URING else ENGRAM_RUN_AUTO
        with nogil:
            engram_engine_begin(e, &self.cl.c, &job, depth, mode, self.span_cap, max(self.align, 64), 1, &a)
            nm = self._gather_keys(kp, sk, n)
        try:
            pol = self._reserve_misses(cache, nm)
        except BaseException:
            with nogil:
                engram_engine_finish(&a, self.bounce, &err, &info)
            raise
        with nogil:
            rc = engram_engine_finish(&a, self.bounce, &err, &info)
        path = URING if info.on_ring else PREAD
        self.others = info.others
        self.eng_depth_used = info.depth
        self.rpol, self.rnm = pol, nm
        if rc != 0:
            self.rpol = None
            self._cancel_misses(cache, pol, nm)
            self._run_failed(err, path)
        return path

    def last_spans(self):
        """The reads of the last chunk the last :meth:`read` submitted: a list of (segment's descriptor,
        file offset, bytes), in submission order (sorted by file offset, one span per distinct block run)."""
        if self.reqs == NULL:
            return []
        return [(self.reqs[i].fd, self.reqs[i].span_off, self.reqs[i].span_len) for i in range(self.last_nr)]

    cdef void _publish_raw(self, uint8_t* rp, Py_ssize_t n) noexcept nogil:
        """Copy each distinct row's record to every position that asked for it."""
        cdef Py_ssize_t i, t, d = -1
        cdef uint64_t vk, pos_mask = (<uint64_t>1 << POS_BITS) - 1
        for i in range(n):
            vk = self.keys[i] >> POS_BITS
            t = <Py_ssize_t>(self.keys[i] & pos_mask)
            if d < 0 or self.dkey[d] != vk:
                d += 1
            memcpy(rp + t * ROW_BYTES, self.staging + d * ROW_BYTES, ROW_BYTES)

    def _where(self, Py_ssize_t d):
        """(row, file offset, segment) of distinct row ``d`` of the current chunk."""
        cdef int seg = <int>(self.dkey[d] >> OFF_BITS)
        return ((self.doff[d] - self.seg_off[seg]) // ROW_BYTES, self.doff[d], seg)

    cdef _raise_io(self, engram_ioerr err, int path):
        cdef int64_t r = err.req
        cdef uint64_t d
        cdef uint32_t k
        if r < 0:
            # io_uring_enter itself failed: the engine tore the ring down (reads may still
            # have been in flight); the next read on the ring path starts a new one
            raise ReadFailure("ring", errno=err.err, backend="io_uring")
        # name the first row of the failing span that was not fully read
        d = self.reqs[r].first
        for k in range(self.reqs[r].count):
            if self.doff[self.reqs[r].first + k] + ROW_BYTES > self.reqs[r].span_off + <uint64_t>max(err.got, 0):
                d = self.reqs[r].first + k
                break
        row, offset, seg = self._where(d)
        if err.err == ENGRAM_ESHORT:
            raise ReadFailure("short", row=row, offset=offset, segment=seg, backend=_PATH_NAMES[path])
        raise ReadFailure("io", row=row, offset=offset, segment=seg, errno=err.err, backend=_PATH_NAMES[path])
