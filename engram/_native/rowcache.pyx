# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The replacement policies of the row cache: which keys are kept, in which slot (engram/rowcache.py).

One state machine per policy over ``capacity`` slots, written once and used by the engine's
:class:`engram.RowCache` and by the simulator (``sim`` replays traces through the same class):

- ``lru``: one recency list; a hit moves the key to the most recent end, a miss inserted into a
  full cache evicts the least recently used key and takes its slot.
- ``tinylfu``: W-TinyLFU (Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission
  Policy", ACM Transactions on Storage 13(4), 2017, section 4): a window LRU of 1% of the slots
  (at least one) admits every new key; the key it pushes out enters the main segmented LRU
  (probation 20%, protected 80%) only if a count-min sketch estimates it more frequent than the
  main's victim (the probation LRU key), else it is evicted.  The sketch: 4 rows of saturating
  4-bit counters (kept in bytes, at most 15) whose width is the power of two at least the
  capacity (at most 2**24), blocked as Caffeine's is: a key's 4 counters lie in one 64-byte block
  (one per row of 16), chosen by MurmurHash3's 64-bit finalizer, so that counting a key touches
  one cache line; every key of a batch is counted once -- a hit when it is looked up, a miss
  when it is inserted (the engine counts its misses while their reads fly, off the step's
  critical path) -- and after 10 x capacity counts every counter is halved (the paper's reset,
  its aging).  The paper's doorkeeper Bloom filter is left out (it saves sketch memory;
  it does not change which keys are admitted much, section 4.2).

Keys are uint64 (the cache uses ``(layer << 32) | row``).  A batch is looked up first (hits counted in the
sketch and touched), then its misses are counted and inserted in order; a key inserted
while already present (a duplicate of the batch, or a row another session inserted meanwhile)
is only left where it is.  Slots are int32 indices into the caller's record arena.  Not
thread-safe: :class:`engram.RowCache` holds a lock around every call.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, calloc
from libc.string cimport memcpy, memset
from cpython.pycapsule cimport PyCapsule_New
cimport numpy as cnp
import numpy as np

from engram._native.codec cimport decode_row, ROW_BYTES, ROW_VALUES

cnp.import_array()

cdef extern from *:
    """
    #include <stdlib.h>
    #include <sys/mman.h>
    /* bookkeeping arrays of 1 MiB or more on 2 MiB-aligned memory advised as huge pages (Linux THP in
       "madvise" mode): the random accesses of lookups and inserts then miss the TLB far less often */
    static void* _big_alloc(size_t size, int zero) {
        void* p = NULL;
        if (size >= ((size_t)1 << 20)) {
            size_t huge = (size_t)2 << 20, n = (size + huge - 1) / huge * huge;
            if (posix_memalign(&p, huge, n) != 0) return NULL;
    #ifdef MADV_HUGEPAGE
            madvise(p, n, MADV_HUGEPAGE);
    #endif
            if (zero) memset(p, 0, n);
            return p;
        }
        return zero ? calloc(size ? size : 1, 1) : malloc(size ? size : 1);
    }
    """
    void __builtin_prefetch(const void* addr) nogil
    void* _big_alloc(size_t size, int zero) nogil

cdef enum:
    NONE = 0
    WINDOW = 1
    PROBATION = 2
    PROTECTED = 3
    SKETCH_ROWS = 4
    COUNTER_MAX = 15

#: Replacement policies a cache can be given.
POLICIES = ("lru", "tinylfu")
#: Largest sketch width (counters a row).
MAX_SKETCH_WIDTH = 1 << 24


cdef struct Node:
    uint64_t key      # the key held in this slot
    int32_t prev      # neighbours in its segment's list (-1: none)
    int32_t nxt
    uint8_t where     # NONE, WINDOW, PROBATION, PROTECTED
    uint8_t pending   # reserved for a read in flight: held, not served, its record not written yet


cdef struct Entry:
    uint64_t key      # the hash table holds the key beside its slot: a probe reads one line
    int32_t slot      # -1: empty


cdef Py_ssize_t ANY_LENGTH = -(1 << 62)

cdef char* _vector(object a, int typenum, Py_ssize_t n, bint write, str name) except NULL:
    """The data of ``a``, a C-contiguous 1-D array of ``typenum`` with ``n`` items (``-n``: at least ``n``;
    ``ANY_LENGTH``: any), writable with ``write``; else ValueError naming it."""
    cdef cnp.ndarray x
    if not isinstance(a, cnp.ndarray):
        raise ValueError(f"{name} must be a NumPy array, got {type(a).__name__}")
    x = <cnp.ndarray>a
    if (cnp.PyArray_TYPE(x) != typenum or cnp.PyArray_NDIM(x) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(x)
            or (n != ANY_LENGTH and (cnp.PyArray_DIMS(x)[0] != n if n >= 0 else cnp.PyArray_DIMS(x)[0] < -n))
            or (write and not cnp.PyArray_ISWRITEABLE(x))):
        raise ValueError(f"{name}: {a.dtype} {a.shape} does not fit the batch or the cache")
    return cnp.PyArray_BYTES(x)


cdef char* _matrix(object a, int typenum, Py_ssize_t rows, Py_ssize_t cols, bint write, str name) except NULL:
    """The data of ``a``, a C-contiguous 2-D array of ``typenum``, at least ``rows`` x exactly ``cols``."""
    cdef cnp.ndarray x
    if not isinstance(a, cnp.ndarray):
        raise ValueError(f"{name} must be a NumPy array, got {type(a).__name__}")
    x = <cnp.ndarray>a
    if (cnp.PyArray_TYPE(x) != typenum or cnp.PyArray_NDIM(x) != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(x)
            or cnp.PyArray_DIMS(x)[0] < rows or cnp.PyArray_DIMS(x)[1] != cols
            or (write and not cnp.PyArray_ISWRITEABLE(x))):
        raise ValueError(f"{name}: {a.dtype} {a.shape} does not fit the batch or the cache")
    return cnp.PyArray_BYTES(x)


cdef float* _rows_out(object out, Py_ssize_t T, Py_ssize_t C) except NULL:
    """The data of ``out``, float32 C-contiguous and writable: ``[T * C, 256]`` (at least ``T * C`` rows, as
    :func:`_matrix`) or ``[T, C, 256]`` (a decode step's target as it is, no reshaped view made)."""
    cdef cnp.ndarray x
    if isinstance(out, cnp.ndarray) and cnp.PyArray_NDIM(<cnp.ndarray>out) == 3:
        x = <cnp.ndarray>out
        if (cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_IS_C_CONTIGUOUS(x)
                or not cnp.PyArray_ISWRITEABLE(x) or cnp.PyArray_DIMS(x)[0] != T or cnp.PyArray_DIMS(x)[1] != C
                or cnp.PyArray_DIMS(x)[2] != ROW_VALUES):
            raise ValueError(f"out: {out.dtype} {out.shape} does not fit the batch or the cache")
        return <float*>cnp.PyArray_BYTES(x)
    return <float*>_matrix(out, cnp.NPY_FLOAT32, T * C, ROW_VALUES, True, "out")


cdef inline bint _meet(const void* a, Py_ssize_t na, const void* b, Py_ssize_t nb) noexcept nogil:
    """Whether the byte spans ``[a, a + na)`` and ``[b, b + nb)`` share a byte (empty spans share none)."""
    cdef const char* x = <const char*>a
    cdef const char* y = <const char*>b
    return na > 0 and nb > 0 and x < y + nb and y < x + na


cdef int _outputs_apart(const char* idp, Py_ssize_t T, Py_ssize_t C, Py_ssize_t s0, Py_ssize_t s1,
                        const void* lay, const void* rows, const void* rec, Py_ssize_t nrec,
                        const void* kp, const void* sp, const void* op) except -1:
    """ValueError unless what :meth:`Policy.serve` writes -- ``keys`` (8 bytes a position), ``skip`` (1),
    ``out`` (a row of float32 a position) -- shares no byte with each other or with what it reads: ``ids``
    (any strides), ``col_layer``, ``col_rows`` (None: ``rows`` NULL), ``records``.  A key written over a
    row decoded later (``keys`` a view of ``out``) would send the decode of a hit outside the records."""
    cdef Py_ssize_t n = T * C
    cdef const char* lo = idp
    cdef Py_ssize_t span = 0
    if n:
        lo = idp + min(<Py_ssize_t>0, (T - 1) * s0) + min(<Py_ssize_t>0, (C - 1) * s1)
        span = abs((T - 1) * s0) + abs((C - 1) * s1) + 4
    cdef const void* outs[3]
    cdef Py_ssize_t sizes[3]
    cdef const void* ins[4]
    cdef Py_ssize_t isizes[4]
    cdef int i, j
    outs[0], outs[1], outs[2] = kp, sp, op
    sizes[0], sizes[1], sizes[2] = 8 * n, n, 4 * ROW_VALUES * n
    ins[0], ins[1], ins[2], ins[3] = lo, lay, rows, rec
    isizes[0], isizes[1], isizes[2], isizes[3] = span, 8 * C, 4 * C if rows != NULL else 0, nrec * ROW_BYTES
    for i in range(3):
        for j in range(i + 1, 3):
            if _meet(outs[i], sizes[i], outs[j], sizes[j]):
                raise ValueError("serve: keys, skip and out must not overlap")
        for j in range(4):
            if _meet(outs[i], sizes[i], ins[j], isizes[j]):
                raise ValueError("serve: keys, skip and out must not overlap ids, col_layer, col_rows or records")
    return 0


cdef inline uint64_t fmix64(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= <uint64_t>0xff51afd7ed558ccd
    k ^= k >> 33
    k *= <uint64_t>0xc4ceb9fe1a85ec53
    k ^= k >> 33
    return k


cdef size_t _allocated(size_t size):
    """Bytes ``_big_alloc`` takes for ``size``: from 1 MiB, a whole number of 2 MiB huge pages."""
    cdef size_t huge = (<size_t>2) << 20
    return (size + huge - 1) // huge * huge if size >= ((<size_t>1) << 20) else size


def bookkeeping_bytes(int64_t capacity, str name="lru"):
    """Bytes a :class:`Policy` of ``capacity`` slots allocates for its own arrays, without making one: its nodes
    (24 bytes a slot), its hash table (16 bytes an entry, the power of two at least twice the slots, at least 16)
    and TinyLFU's sketch (4 rows of the power of two at least the slots, at least 16, at most 2**24), each
    array of 1 MiB or more rounded up to whole 2 MiB huge pages.  At most 96 bytes a slot besides 6 MiB + 256
    bytes whatever the capacity (:data:`engram.rowcache.BOOKKEEPING_BYTES`)."""
    cdef int64_t m = 16, w = 16
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}")
    if capacity < 1 or capacity > 0x7FFFFFFF:
        raise ValueError(f"capacity must be in [1, 2**31), got {capacity}")
    while m < 2 * capacity:
        m <<= 1
    total = _allocated(capacity * sizeof(Node)) + _allocated(m * sizeof(Entry))
    if name == "tinylfu":
        while w < capacity and w < MAX_SKETCH_WIDTH:
            w <<= 1
        total += _allocated(SKETCH_ROWS * w)
    return int(total)


cdef class Policy:
    """A replacement policy over ``capacity`` slots (see the module).

    ``Policy(capacity, name)``: ``name`` in :data:`POLICIES`, ``capacity >= 1``.
    ``lookup(keys, slots)`` and ``insert(keys, slots)`` take uint64 ``[n]`` keys and fill int64
    ``[n]`` slots (-1: a miss, or nothing to write); both return the count of non-negative slots.
    """

    cdef readonly int64_t capacity
    cdef readonly str name
    cdef int tiny
    cdef int64_t used
    cdef Node* nodes
    cdef Entry* table
    cdef uint64_t tmask
    cdef int32_t head[4]
    cdef int32_t tail[4]
    cdef int64_t size[4]
    cdef int64_t window_cap
    cdef int64_t protected_cap
    cdef uint8_t* sketch
    cdef uint64_t bmask
    cdef int64_t swidth
    cdef int64_t counted
    cdef int64_t sample
    cdef readonly int64_t resets
    cdef int32_t free_head     # slots given back by a cancelled reservation, linked through nxt (-1: none)
    #: Slots reserved for reads still in flight (:func:`reserve_records`).
    cdef readonly int64_t pending

    def __cinit__(self, int64_t capacity, str name="lru"):
        cdef int64_t m = 16, w = 16
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}")
        if capacity < 1 or capacity > 0x7FFFFFFF:
            raise ValueError(f"capacity must be in [1, 2**31), got {capacity}")
        self.capacity = capacity
        self.name = name
        self.tiny = name == "tinylfu"
        while m < 2 * capacity:
            m <<= 1
        self.tmask = <uint64_t>(m - 1)
        self.nodes = <Node*>_big_alloc(capacity * sizeof(Node), 0)  # a slot is written before it is read
        self.table = <Entry*>_big_alloc(m * sizeof(Entry), 0)
        if self.tiny:
            while w < capacity and w < MAX_SKETCH_WIDTH:
                w <<= 1
            self.swidth = w
            self.bmask = <uint64_t>(w // 16 - 1)   # blocks of 64 counters: 4 rows x 16
            self.sketch = <uint8_t*>_big_alloc(SKETCH_ROWS * w, 1)
            self.sample = 10 * capacity
        if self.nodes == NULL or self.table == NULL or (self.tiny and self.sketch == NULL):
            raise MemoryError(f"cannot allocate the bookkeeping of {capacity} slots")
        for i in range(m):
            self.table[i].slot = -1
            self.table[i].key = 0
        self.free_head = -1
        self.pending = 0
        for i in range(4):
            self.head[i] = -1
            self.tail[i] = -1
            self.size[i] = 0
        self.window_cap = max(1, capacity // 100) if self.tiny else capacity
        self.protected_cap = (capacity - self.window_cap) * 4 // 5

    def __dealloc__(self):
        free(self.nodes)
        free(self.table)
        free(self.sketch)

    # ----------------------------------------------------------- state
    @property
    def entries(self):
        """Keys held now."""
        return self.size[WINDOW] + self.size[PROBATION] + self.size[PROTECTED]

    @property
    def segments(self):
        """Keys held by segment: ``{"window", "probation", "protected"}`` (LRU: all in the window)."""
        return {"window": self.size[WINDOW], "probation": self.size[PROBATION], "protected": self.size[PROTECTED]}

    @property
    def bookkeeping_bytes(self):
        """Bytes of this policy's own arrays (keys, links, hash table, sketch) as allocated
        (:func:`bookkeeping_bytes`)."""
        return bookkeeping_bytes(self.capacity, self.name)

    def contains(self, uint64_t key):
        """True when ``key`` is held (does not count or touch it); a key reserved for a read in flight is held."""
        return self._find(key) >= 0

    def slot(self, uint64_t key):
        """The slot of ``key``, or -1 (does not count or touch it); a key reserved for a read in flight has its
        slot, whose record is not written yet (:meth:`ready_slot` for one that is)."""
        return self._find(key)

    def ready_slot(self, uint64_t key):
        """The slot of ``key`` when held and its record written, else -1 (a key reserved for a read in flight
        is -1, as every lookup misses it); does not count or touch it."""
        return self._find_ready(key)

    def frequency(self, uint64_t key):
        """The sketch's estimate of ``key``'s count (TinyLFU; 0 for LRU)."""
        return self._estimate(key) if self.tiny else 0

    def held_keys(self):
        """uint64 ``[entries]``: the keys held, in no particular order."""
        out = np.empty(self.entries, np.uint64)
        cdef uint64_t[::1] o = out
        cdef int64_t j = 0, s
        for s in range(self.used):
            if self.nodes[s].where != NONE:
                o[j] = self.nodes[s].key
                j += 1
        return out

    # ----------------------------------------------------------- batches
    def lookup(self, const uint64_t[::1] keys, int64_t[::1] slots):
        """Count (TinyLFU's sketch) and touch the held keys; ``slots[i]`` = the slot of a hit, else -1 (a key
        reserved for a read in flight is a miss: its record is not there yet).  A miss is counted by
        :meth:`insert`."""
        cdef Py_ssize_t i, n = keys.shape[0]
        cdef int64_t hits = 0
        cdef int32_t s
        if slots.shape[0] < n:
            raise ValueError("slots is shorter than keys")
        with nogil:
            for i in range(n):
                s = self._find_ready(keys[i])
                slots[i] = s
                if s >= 0:
                    hits += 1
                    if self.tiny:
                        self._count(keys[i])
                    self._touch(s)
        return hits

    def insert(self, const uint64_t[::1] keys, int64_t[::1] slots):
        """Count (TinyLFU's sketch) and insert missed keys in order; ``slots[i]`` = the slot to write key ``i``'s
        record to, or -1 when the key was already held (a duplicate, or inserted meanwhile: nothing to write)."""
        cdef Py_ssize_t i, n = keys.shape[0]
        cdef int64_t wrote = 0
        if slots.shape[0] < n:
            raise ValueError("slots is shorter than keys")
        with nogil:
            for i in range(n):
                if self.tiny:
                    self._count(keys[i])
                if self._find(keys[i]) >= 0:
                    slots[i] = -1
                else:
                    slots[i] = self._insert(keys[i])
                    wrote += 1
        return wrote

    def access(self, const uint64_t[::1] keys, uint8_t[::1] hits, Py_ssize_t batch=1):
        """Replay ``keys`` in batches of ``batch`` keys, each as :meth:`lookup` then :meth:`insert` of its
        misses (what the engine does for a batch: hits counted and touched, then misses counted and inserted);
        ``hits[i]`` = 1 where key ``i`` hit.  Returns the hits."""
        cdef Py_ssize_t n = keys.shape[0], a = 0, b, i
        cdef int64_t total = 0
        cdef int32_t s
        if hits.shape[0] < n or batch < 1:
            raise ValueError("hits is shorter than keys, or batch < 1")
        with nogil:
            while a < n:
                b = min(n, a + batch)
                for i in range(a, b):
                    s = self._find(keys[i])
                    hits[i] = s >= 0
                    if s >= 0:
                        total += 1
                        if self.tiny:
                            self._count(keys[i])
                        self._touch(s)
                for i in range(a, b):
                    if hits[i] == 0:
                        if self.tiny:
                            self._count(keys[i])
                        if self._find(keys[i]) < 0:
                            self._insert(keys[i])
                a = b
        return total

    def access_runs(self, const uint64_t[::1] keys, const int64_t[::1] bounds, uint8_t[::1] hits):
        """As :meth:`access` with batches of any size: batch ``j`` is ``keys[bounds[j]:bounds[j + 1]]``
        (``bounds`` non-decreasing, from 0 to ``len(keys)``).  Returns the hits."""
        cdef Py_ssize_t j, i, nb = bounds.shape[0] - 1, n = keys.shape[0]
        cdef int64_t total = 0
        cdef int32_t s
        if hits.shape[0] < n or nb < 0 or (nb >= 0 and (bounds[0] != 0 or bounds[nb] != n)):
            raise ValueError("hits is shorter than keys, or bounds do not run from 0 to len(keys)")
        for j in range(nb):
            if bounds[j + 1] < bounds[j]:
                raise ValueError("bounds must not decrease")
        with nogil:
            for j in range(nb):
                for i in range(bounds[j], bounds[j + 1]):
                    s = self._find(keys[i])
                    hits[i] = s >= 0
                    if s >= 0:
                        total += 1
                        if self.tiny:
                            self._count(keys[i])
                        self._touch(s)
                for i in range(bounds[j], bounds[j + 1]):
                    if hits[i] == 0:
                        if self.tiny:
                            self._count(keys[i])
                        if self._find(keys[i]) < 0:
                            self._insert(keys[i])
        return total

    # ----------------------------------------------------------- the engine's batches
    def serve(self, ids, col_layer, keys, records, out, skip, col_rows=None):
        """A batch of the engine (:class:`engram.RowCache`): ``ids`` uint32 ``[T, C]`` row ids (any strides,
        multiples of 4 bytes), ``col_layer`` uint64 ``[C]`` the layer of each column shifted by 32; fills
        ``keys`` uint64 ``[T * C]`` with the keys, looks them up as :meth:`lookup` does (hits counted; the misses
        are counted by the insert that follows, or by the reader's reservation while their reads fly), decodes
        each hit's record of ``records`` uint8 ``[capacity, 264]`` into its row of ``out`` float32 ``[T * C, 256]``
        (or ``[T, C, 256]``) and
        sets ``skip[i]`` uint8 (1: a hit, 0: a miss).  ``col_rows`` uint32 ``[C]`` (optional): the rows of
        each column's table; a batch with an id at or beyond its column's is served nothing: no key looked up,
        touched or counted, nothing decoded into ``out``, every ``skip`` 0, and -1 returned (the reader then
        raises its range error, the caller's ``out`` untouched).  A key reserved for a read in flight (another
        session's) is a miss.  Every array but ``ids`` C-contiguous; the outputs writable.  Returns the hits,
        or -1.

        The arrays are taken as NumPy arrays and checked here (dtype, shape, layout), not as typed
        memoryviews: a hit's whole cost is a few microseconds, and a memoryview's acquisition is a good
        share of it (BENCHMARKS.md, "Row cache")."""
        cdef Py_ssize_t T, C, t, c, i, s0, s1
        cdef int64_t hits = 0
        cdef int32_t s
        cdef uint64_t k
        cdef uint32_t r
        cdef bint bound = col_rows is not None
        cdef bint beyond = False
        cdef const char* idp
        cdef const uint64_t* lay
        cdef const uint32_t* rows = NULL
        cdef uint64_t* kp
        cdef const uint8_t* rec
        cdef float* op
        cdef uint8_t* sp
        if not isinstance(ids, cnp.ndarray) or cnp.PyArray_TYPE(<cnp.ndarray>ids) != cnp.NPY_UINT32 \
                or cnp.PyArray_NDIM(<cnp.ndarray>ids) != 2:
            raise ValueError("serve: ids must be a uint32 array [T, C]")
        T, C = cnp.PyArray_DIMS(<cnp.ndarray>ids)[0], cnp.PyArray_DIMS(<cnp.ndarray>ids)[1]
        s0, s1 = cnp.PyArray_STRIDES(<cnp.ndarray>ids)[0], cnp.PyArray_STRIDES(<cnp.ndarray>ids)[1]
        if s0 % 4 or s1 % 4:
            raise ValueError("serve: ids' strides must be multiples of 4 bytes")
        idp = cnp.PyArray_BYTES(<cnp.ndarray>ids)
        lay = <const uint64_t*>_vector(col_layer, cnp.NPY_UINT64, C, False, "col_layer")
        if bound:
            rows = <const uint32_t*>_vector(col_rows, cnp.NPY_UINT32, C, False, "col_rows")
        kp = <uint64_t*>_vector(keys, cnp.NPY_UINT64, -T * C, True, "keys")
        sp = <uint8_t*>_vector(skip, cnp.NPY_UINT8, -T * C, True, "skip")
        rec = <const uint8_t*>_matrix(records, cnp.NPY_UINT8, self.capacity, ROW_BYTES, False, "records")
        op = _rows_out(out, T, C)
        _outputs_apart(idp, T, C, s0, s1, lay, rows, rec, self.capacity, kp, sp, op)
        with nogil:
            for t in range(T):  # the keys first, their table entries fetched ahead; ids checked against their tables
                for c in range(C):
                    r = (<const uint32_t*>(idp + t * s0 + c * s1))[0]
                    if bound and r >= rows[c]:
                        beyond = True
                    k = lay[c] | <uint64_t>r
                    kp[t * C + c] = k
                    self._prefetch_entry(k)
            if beyond:  # the batch fails its range check: nothing served, nothing written to out
                memset(sp, 0, T * C)
            else:
                for t in range(T):  # then the hits found and touched, their sketch blocks fetched ahead
                    for c in range(C):
                        i = t * C + c
                        sp[i] = 0
                        s = self._find_ready(kp[i])
                        if s >= 0:
                            hits += 1
                            self._touch(s)
                            sp[i] = 1
                            if self.tiny:
                                self._prefetch_block(kp[i])
                # the hits counted and decoded, each found again (its lines hot): decoding inside the loop above,
                # from its slot, made a decode step slower (BENCHMARKS.md, "Row cache"); keys cannot overlap out
                # (checked)
                if hits:
                    for i in range(T * C):  # the misses are counted when inserted
                        if sp[i]:
                            k = kp[i]
                            if self.tiny:
                                self._count(k)
                            decode_row(rec + <int64_t>self._find(k) * ROW_BYTES, op + i * ROW_VALUES)
        if beyond:
            return -1
        return hits

    def admit(self, keys, skip, raw, records):
        """The misses of a batch served by :meth:`serve` (uint8 ``skip[i] == 0``), counted and inserted in order
        with their records ``raw`` uint8 ``[n, 264]`` as read, copied into ``records`` uint8
        ``[capacity, 264]``; ``keys``
        uint64 ``[n]``; a key already held is left as it is.  C-contiguous arrays (NumPy, checked here).
        Returns the records written.

        The keys' hash entries and sketch blocks are prefetched first.  (Prefetching what the next evictions
        touch -- the oldest nodes of the window and probation lists, their entries and record slots -- and
        writing the records with non-temporal stores were measured slower inside real decode steps, 2026-12-02:
        BENCHMARKS.md, "Row cache".)"""
        cdef Py_ssize_t n, i
        cdef int64_t wrote = 0
        cdef int32_t s
        cdef const uint64_t* kp
        cdef const uint8_t* sp
        cdef const uint8_t* rp
        cdef uint8_t* rec
        kp = <const uint64_t*>_vector(keys, cnp.NPY_UINT64, ANY_LENGTH, False, "keys")
        n = cnp.PyArray_DIMS(<cnp.ndarray>keys)[0]
        sp = <const uint8_t*>_vector(skip, cnp.NPY_UINT8, -n, False, "skip")
        rp = <const uint8_t*>_matrix(raw, cnp.NPY_UINT8, n, ROW_BYTES, False, "raw")
        rec = <uint8_t*>_matrix(records, cnp.NPY_UINT8, self.capacity, ROW_BYTES, True, "records")
        with nogil:
            for i in range(n):
                if not sp[i]:
                    self._prefetch(kp[i])
            for i in range(n):
                if sp[i]:
                    continue
                if self.tiny:
                    self._count(kp[i])
                if self._find(kp[i]) >= 0:
                    continue
                s = self._insert(kp[i])
                memcpy(rec + <int64_t>s * ROW_BYTES, rp + i * ROW_BYTES, ROW_BYTES)
                wrote += 1
        return wrote

    cdef int64_t _admit_at(self, const uint64_t* kp, const uint8_t** rp, Py_ssize_t n,
                           uint8_t* rec) noexcept nogil:
        """:meth:`admit`'s loop over ``n`` misses given as keys ``kp`` and pointers ``rp`` to their records
        (the reader's staging, :func:`admit_records`)."""
        cdef Py_ssize_t i
        cdef int64_t wrote = 0
        cdef int32_t s
        for i in range(n):
            self._prefetch(kp[i])
        for i in range(n):
            if self.tiny:
                self._count(kp[i])
            if self._find(kp[i]) >= 0:
                continue
            s = self._insert(kp[i])
            memcpy(rec + <int64_t>s * ROW_BYTES, rp[i], ROW_BYTES)
            wrote += 1
        return wrote

    cdef int64_t _reserve_at(self, const uint64_t* kp, int32_t* slots, Py_ssize_t n) noexcept nogil:
        """Insert the ``n`` misses ``kp`` in order as :meth:`_admit_at` does, without their records: each new key's
        slot goes to ``slots[i]``, marked pending (held, not served) until :meth:`_fill_at`; -1 for a key held
        already.  Returns the slots reserved."""
        cdef Py_ssize_t i
        cdef int64_t wrote = 0
        cdef int32_t s
        for i in range(n):
            self._prefetch(kp[i])
        for i in range(n):
            if self.tiny:
                self._count(kp[i])
            if self._find(kp[i]) >= 0:
                slots[i] = -1
                continue
            s = self._insert(kp[i])
            self.nodes[s].pending = 1
            self.pending += 1
            slots[i] = s
            wrote += 1
        return wrote

    cdef inline bint _reserved(self, uint64_t key, int32_t s) noexcept nogil:
        """Slot ``s`` still reserved for ``key`` (not evicted meanwhile, nor taken again for another key)."""
        return s >= 0 and s < self.used and self.nodes[s].pending and self.nodes[s].key == key

    cdef int64_t _fill_at(self, const uint64_t* kp, const int32_t* slots, const uint8_t** rp, Py_ssize_t n,
                          uint8_t* rec) noexcept nogil:
        """The records ``rp[i]`` (264 bytes each) of the keys :meth:`_reserve_at` reserved into their slots,
        which are then served; a slot evicted meanwhile (by a later insert) is skipped.  Returns the records
        written."""
        cdef Py_ssize_t i
        cdef int64_t wrote = 0
        cdef int32_t s
        for i in range(n):
            s = slots[i]
            if self._reserved(kp[i], s):
                memcpy(rec + <int64_t>s * ROW_BYTES, rp[i], ROW_BYTES)
                self.nodes[s].pending = 0
                self.pending -= 1
                wrote += 1
        return wrote

    cdef void _release(self, int32_t s) noexcept nogil:
        """Slot ``s``, reserved, given back: its key forgotten, the slot free for the next insert."""
        if self.nodes[s].where != NONE:
            self._unlink(s)
        self._remove(s)
        self.nodes[s].pending = 0
        self.pending -= 1
        self.nodes[s].nxt = self.free_head
        self.free_head = s

    cdef int64_t _cancel_at(self, const uint64_t* kp, const int32_t* slots, Py_ssize_t n) noexcept nogil:
        """Give back the slots :meth:`_reserve_at` reserved whose reads failed; returns how many were still
        reserved."""
        cdef Py_ssize_t i
        cdef int64_t gone = 0
        for i in range(n):
            if self._reserved(kp[i], slots[i]):
                self._release(slots[i])
                gone += 1
        return gone

    def cancel_pending(self):
        """Give back every reserved slot (a child after ``fork()``: its parent's reads in flight never fill
        them).  Returns how many."""
        cdef int64_t s, gone = 0
        if self.pending == 0:
            return 0
        with nogil:
            for s in range(self.used):
                if self.nodes[s].pending:
                    self._release(<int32_t>s)
                    gone += 1
        return gone

    # ----------------------------------------------------------- hash table
    cdef inline void _prefetch(self, uint64_t key) noexcept nogil:
        """Start fetching ``key``'s hash table entry (and sketch block): a batch's misses then overlap."""
        self._prefetch_entry(key)
        if self.tiny:
            self._prefetch_block(key)

    cdef inline void _prefetch_entry(self, uint64_t key) noexcept nogil:
        __builtin_prefetch(&self.table[fmix64(key) & self.tmask])

    cdef inline void _prefetch_block(self, uint64_t key) noexcept nogil:
        __builtin_prefetch(self.sketch + ((fmix64(key) & self.bmask) << 6))

    cdef inline int32_t _find_ready(self, uint64_t key) noexcept nogil:
        """The slot of ``key`` when held and its record written, else -1."""
        cdef int32_t s = self._find(key)
        if s >= 0 and self.nodes[s].pending:
            return -1
        return s

    cdef inline int32_t _find(self, uint64_t key) noexcept nogil:
        cdef uint64_t i = fmix64(key) & self.tmask
        while True:
            if self.table[i].slot < 0:
                return -1
            if self.table[i].key == key:
                return self.table[i].slot
            i = (i + 1) & self.tmask

    cdef inline void _put(self, int32_t slot) noexcept nogil:
        cdef uint64_t key = self.nodes[slot].key
        cdef uint64_t i = fmix64(key) & self.tmask
        while self.table[i].slot >= 0:
            i = (i + 1) & self.tmask
        self.table[i].slot = slot
        self.table[i].key = key

    cdef void _remove(self, int32_t slot) noexcept nogil:
        """Delete ``slot``'s key from the table (backward-shift deletion: no tombstones)."""
        cdef uint64_t i = fmix64(self.nodes[slot].key) & self.tmask, j, k
        while self.table[i].slot != slot:
            i = (i + 1) & self.tmask
        j = i
        while True:
            j = (j + 1) & self.tmask
            if self.table[j].slot < 0:
                break
            k = fmix64(self.table[j].key) & self.tmask
            # the entry at j may move to i unless its home k lies cyclically in (i, j]
            if (i <= j and (k <= i or k > j)) or (i > j and (k <= i and k > j)):
                self.table[i] = self.table[j]
                i = j
        self.table[i].slot = -1

    # ----------------------------------------------------------- lists
    cdef inline void _unlink(self, int32_t s) noexcept nogil:
        cdef Node* n = &self.nodes[s]
        cdef int w = n.where
        if n.prev >= 0:
            self.nodes[n.prev].nxt = n.nxt
        else:
            self.head[w] = n.nxt
        if n.nxt >= 0:
            self.nodes[n.nxt].prev = n.prev
        else:
            self.tail[w] = n.prev
        self.size[w] -= 1
        n.where = NONE

    cdef inline void _push(self, int w, int32_t s) noexcept nogil:
        """``s`` at the most recent end of list ``w``."""
        cdef Node* n = &self.nodes[s]
        n.prev = self.tail[w]
        n.nxt = -1
        if self.tail[w] >= 0:
            self.nodes[self.tail[w]].nxt = s
        else:
            self.head[w] = s
        self.tail[w] = s
        self.size[w] += 1
        n.where = w

    cdef void _touch(self, int32_t s) noexcept nogil:
        cdef int w = self.nodes[s].where
        cdef int32_t d
        if w != PROBATION and self.tail[w] == s:
            return  # already the most recent of its list
        self._unlink(s)
        if w == PROBATION:
            self._push(PROTECTED, s)
            if self.size[PROTECTED] > self.protected_cap:
                d = self.head[PROTECTED]
                self._unlink(d)
                self._push(PROBATION, d)
        else:
            self._push(w, s)

    cdef int32_t _insert(self, uint64_t key) noexcept nogil:
        """Insert ``key`` (not held); returns its slot."""
        cdef int32_t s, cand, victim, freed
        if self.free_head >= 0 or self.used < self.capacity:
            if self.free_head >= 0:  # a slot a cancelled reservation gave back
                s = self.free_head
                self.free_head = self.nodes[s].nxt
            else:
                s = <int32_t>self.used
                self.used += 1
            self.nodes[s].key = key
            self.nodes[s].pending = 0
            self._put(s)
            self._push(WINDOW, s)
            if self.size[WINDOW] > self.window_cap:  # the main has room while the cache fills
                cand = self.head[WINDOW]
                self._unlink(cand)
                self._push(PROBATION, cand)
            return s
        if not self.tiny:
            freed = self.head[WINDOW]
        else:
            cand = self.head[WINDOW]
            victim = self.head[PROBATION] if self.size[PROBATION] > 0 else self.head[PROTECTED]
            if victim >= 0 and self._estimate(self.nodes[cand].key) > self._estimate(self.nodes[victim].key):
                self._unlink(cand)
                self._unlink(victim)
                self._push(PROBATION, cand)
                freed = victim
            else:
                freed = cand
        if self.nodes[freed].where != NONE:
            self._unlink(freed)
        if self.nodes[freed].pending:  # evicted before its read ended: that read's fill skips it
            self.nodes[freed].pending = 0
            self.pending -= 1
        self._remove(freed)
        self.nodes[freed].key = key
        self._put(freed)
        self._push(WINDOW, freed)
        return freed

    # ----------------------------------------------------------- sketch
    cdef inline uint8_t* _block(self, uint64_t key, uint64_t* h) noexcept nogil:
        """The 64-counter block of ``key`` (one cache line) and, in ``h``, the hash choosing its 4 counters."""
        cdef uint64_t h1 = fmix64(key)
        h[0] = fmix64(key ^ <uint64_t>0x9E3779B97F4A7C15)
        return self.sketch + ((h1 & self.bmask) << 6)

    cdef inline void _count(self, uint64_t key) noexcept nogil:
        cdef uint64_t h
        cdef uint8_t* blk = self._block(key, &h)
        cdef uint8_t* c
        cdef int r
        for r in range(SKETCH_ROWS):
            c = blk + (r << 4) + ((h >> (4 * r)) & 15)
            if c[0] < COUNTER_MAX:
                c[0] += 1
        self.counted += 1
        if self.counted >= self.sample:
            self._age()

    cdef inline int _estimate(self, uint64_t key) noexcept nogil:
        cdef uint64_t h
        cdef uint8_t* blk = self._block(key, &h)
        cdef int r, m = COUNTER_MAX, v
        for r in range(SKETCH_ROWS):
            v = blk[(r << 4) + ((h >> (4 * r)) & 15)]
            if v < m:
                m = v
        return m

    cdef void _age(self) noexcept nogil:
        cdef int64_t i
        for i in range(SKETCH_ROWS * self.swidth):
            self.sketch[i] >>= 1
        self.counted //= 2
        self.resets += 1


cdef int64_t admit_records(object policy, object records, const uint64_t* keys, const uint8_t** recs,
                           Py_ssize_t n) except -1:
    """The misses of a batch inserted in order, as :meth:`Policy.admit`, their records read where the table reader
    left them: ``keys[i]`` (uint64) with the record at ``recs[i]`` (264 bytes), copied into ``records`` uint8
    ``[capacity, 264]`` (checked); a key already held is left as it is.  The caller holds the cache's lock.
    Returns the records written.  The reader (``reader.pyx``) calls it through :data:`ADMIT_RECORDS`: one
    native call from the read to the insert, no Python call, no copy of the records in between."""
    cdef Policy p
    cdef uint8_t* rec
    cdef int64_t wrote
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a rowcache Policy, got {type(policy).__name__}")
    p = <Policy>policy
    rec = <uint8_t*>_matrix(records, cnp.NPY_UINT8, p.capacity, ROW_BYTES, True, "records")
    with nogil:
        wrote = p._admit_at(keys, recs, n, rec)
    return wrote


#: :func:`admit_records` for other kernels (the table reader): a capsule named ``ADMIT_RECORDS_NAME``.
ADMIT_RECORDS_NAME = "engram._native.rowcache.admit_records"
ADMIT_RECORDS = PyCapsule_New(<void*>admit_records, b"engram._native.rowcache.admit_records", NULL)


cdef Policy _policy_of(object policy):
    if not isinstance(policy, Policy):
        raise TypeError(f"policy must be a rowcache Policy, got {type(policy).__name__}")
    return <Policy>policy


cdef int64_t reserve_records(object policy, const uint64_t* keys, int32_t* slots, Py_ssize_t n) except -1:
    """The misses of a batch whose reads are in flight inserted in order, as :func:`admit_records` does, without
    their records: ``slots[i]`` (int32) the slot reserved for ``keys[i]`` (uint64), -1 where the key is held
    already.  A reserved key is held but not served (a lookup misses it) until :func:`fill_records` writes its
    record, or :func:`cancel_records` gives the slot back.  The caller holds the cache's lock.  The table reader
    calls it between handing a batch's reads to the engine and waiting for them, so that the bookkeeping of an
    insert (the hash table, the segments' lists, TinyLFU's admission) runs while the device reads; the policy's
    decisions are those of :func:`admit_records` after the read (nothing but this batch's insert comes between
    a batch's lookup and its insert in one session).  Returns the slots reserved."""
    cdef Policy p = _policy_of(policy)
    cdef int64_t wrote
    with nogil:
        wrote = p._reserve_at(keys, slots, n)
    return wrote


cdef int64_t fill_records(object policy, object records, const uint64_t* keys, const int32_t* slots,
                          const uint8_t** recs, Py_ssize_t n) except -1:
    """The records of the keys :func:`reserve_records` reserved: ``recs[i]`` (264 bytes, the reader's staging)
    copied into ``records`` uint8 ``[capacity, 264]`` (checked) at ``slots[i]`` where that slot is still
    reserved for ``keys[i]`` (an insert since may have evicted it).  The caller holds the cache's lock.  Returns
    the records written."""
    cdef Policy p = _policy_of(policy)
    cdef uint8_t* rec = <uint8_t*>_matrix(records, cnp.NPY_UINT8, p.capacity, ROW_BYTES, True, "records")
    cdef int64_t wrote
    with nogil:
        wrote = p._fill_at(keys, slots, recs, n, rec)
    return wrote


cdef int64_t cancel_records(object policy, const uint64_t* keys, const int32_t* slots, Py_ssize_t n) except -1:
    """Give back the slots :func:`reserve_records` reserved for reads that failed (those still reserved: keys
    forgotten, slots free).  The caller holds the cache's lock.  Returns how many were given back."""
    cdef Policy p = _policy_of(policy)
    cdef int64_t gone
    with nogil:
        gone = p._cancel_at(keys, slots, n)
    return gone


#: :func:`reserve_records`, :func:`fill_records` and :func:`cancel_records` for the table reader, as capsules.
RESERVE_RECORDS = PyCapsule_New(<void*>reserve_records, b"engram._native.rowcache.reserve_records", NULL)
FILL_RECORDS = PyCapsule_New(<void*>fill_records, b"engram._native.rowcache.fill_records", NULL)
CANCEL_RECORDS = PyCapsule_New(<void*>cancel_records, b"engram._native.rowcache.cancel_records", NULL)
