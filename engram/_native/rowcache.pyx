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
  capacity (at most 2**24), indexed by double hashing of MurmurHash3's 64-bit finalizer; every
  looked-up key is counted, and after 10 x capacity counts every counter is halved (the paper's
  reset, its aging).  The paper's doorkeeper Bloom filter is left out (it saves sketch memory;
  it does not change which keys are admitted much, section 4.2).

Keys are uint64 (the cache uses ``(layer << 32) | row``).  A batch is looked up first (every key
counted in the sketch, hits touched), then its misses are inserted in order; a key inserted
while already present (a duplicate of the batch, or a row another session inserted meanwhile)
is only left where it is.  Slots are int32 indices into the caller's record arena.  Not
thread-safe: :class:`engram.RowCache` holds a lock around every call.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, calloc
from libc.string cimport memcpy, memset
cimport numpy as cnp
import numpy as np

from engram._native.codec cimport decode_row, ROW_BYTES, ROW_VALUES

cnp.import_array()

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


cdef inline uint64_t fmix64(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= <uint64_t>0xff51afd7ed558ccd
    k ^= k >> 33
    k *= <uint64_t>0xc4ceb9fe1a85ec53
    k ^= k >> 33
    return k


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
    cdef uint64_t* keys
    cdef int32_t* prev
    cdef int32_t* nxt
    cdef uint8_t* where
    cdef int32_t* table
    cdef uint64_t tmask
    cdef int32_t head[4]
    cdef int32_t tail[4]
    cdef int64_t size[4]
    cdef int64_t window_cap
    cdef int64_t protected_cap
    cdef uint8_t* sketch
    cdef uint64_t smask
    cdef int64_t swidth
    cdef int64_t counted
    cdef int64_t sample
    cdef readonly int64_t resets

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
        self.keys = <uint64_t*>malloc(capacity * sizeof(uint64_t))
        self.prev = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.nxt = <int32_t*>malloc(capacity * sizeof(int32_t))
        self.where = <uint8_t*>calloc(capacity, 1)
        self.table = <int32_t*>malloc(m * sizeof(int32_t))
        if self.tiny:
            while w < capacity and w < MAX_SKETCH_WIDTH:
                w <<= 1
            self.swidth = w
            self.smask = <uint64_t>(w - 1)
            self.sketch = <uint8_t*>calloc(SKETCH_ROWS * w, 1)
            self.sample = 10 * capacity
        if (self.keys == NULL or self.prev == NULL or self.nxt == NULL or self.where == NULL
                or self.table == NULL or (self.tiny and self.sketch == NULL)):
            raise MemoryError(f"cannot allocate the bookkeeping of {capacity} slots")
        memset(self.table, 0xFF, m * sizeof(int32_t))
        for i in range(4):
            self.head[i] = -1
            self.tail[i] = -1
            self.size[i] = 0
        self.window_cap = max(1, capacity // 100) if self.tiny else capacity
        self.protected_cap = (capacity - self.window_cap) * 4 // 5

    def __dealloc__(self):
        free(self.keys)
        free(self.prev)
        free(self.nxt)
        free(self.where)
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
        """Bytes of this policy's own arrays (keys, links, hash table, sketch)."""
        return (self.capacity * (8 + 4 + 4 + 1) + (self.tmask + 1) * 4
                + (SKETCH_ROWS * self.swidth if self.tiny else 0))

    def contains(self, uint64_t key):
        """True when ``key`` is held (does not count or touch it)."""
        return self._find(key) >= 0

    def slot(self, uint64_t key):
        """The slot of ``key``, or -1 (does not count or touch it)."""
        return self._find(key)

    def frequency(self, uint64_t key):
        """The sketch's estimate of ``key``'s count (TinyLFU; 0 for LRU)."""
        return self._estimate(key) if self.tiny else 0

    def held_keys(self):
        """uint64 ``[entries]``: the keys held, in no particular order."""
        out = np.empty(self.entries, np.uint64)
        cdef uint64_t[::1] o = out
        cdef int64_t j = 0, s
        for s in range(self.used):
            if self.where[s] != NONE:
                o[j] = self.keys[s]
                j += 1
        return out

    # ----------------------------------------------------------- batches
    def lookup(self, const uint64_t[::1] keys, int64_t[::1] slots):
        """Count every key (TinyLFU's sketch), touch the held ones; ``slots[i]`` = the slot of a hit, else -1."""
        cdef Py_ssize_t i, n = keys.shape[0]
        cdef int64_t hits = 0
        cdef int32_t s
        if slots.shape[0] < n:
            raise ValueError("slots is shorter than keys")
        with nogil:
            for i in range(n):
                if self.tiny:
                    self._count(keys[i])
                s = self._find(keys[i])
                slots[i] = s
                if s >= 0:
                    hits += 1
                    self._touch(s)
        return hits

    def insert(self, const uint64_t[::1] keys, int64_t[::1] slots):
        """Insert missed keys in order; ``slots[i]`` = the slot to write key ``i``'s record to, or -1 when the
        key was already held (a duplicate, or inserted meanwhile: nothing to write)."""
        cdef Py_ssize_t i, n = keys.shape[0]
        cdef int64_t wrote = 0
        if slots.shape[0] < n:
            raise ValueError("slots is shorter than keys")
        with nogil:
            for i in range(n):
                if self._find(keys[i]) >= 0:
                    slots[i] = -1
                else:
                    slots[i] = self._insert(keys[i])
                    wrote += 1
        return wrote

    def access(self, const uint64_t[::1] keys, uint8_t[::1] hits, Py_ssize_t batch=1):
        """Replay ``keys`` in batches of ``batch`` keys, each as :meth:`lookup` then :meth:`insert` of its
        misses (what the engine does for a batch); ``hits[i]`` = 1 where key ``i`` hit.  Returns the hits."""
        cdef Py_ssize_t n = keys.shape[0], a = 0, b, i
        cdef int64_t total = 0
        cdef int32_t s
        if hits.shape[0] < n or batch < 1:
            raise ValueError("hits is shorter than keys, or batch < 1")
        with nogil:
            while a < n:
                b = min(n, a + batch)
                for i in range(a, b):
                    if self.tiny:
                        self._count(keys[i])
                    s = self._find(keys[i])
                    hits[i] = s >= 0
                    if s >= 0:
                        total += 1
                        self._touch(s)
                for i in range(a, b):
                    if hits[i] == 0 and self._find(keys[i]) < 0:
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
                    if self.tiny:
                        self._count(keys[i])
                    s = self._find(keys[i])
                    hits[i] = s >= 0
                    if s >= 0:
                        total += 1
                        self._touch(s)
                for i in range(bounds[j], bounds[j + 1]):
                    if hits[i] == 0 and self._find(keys[i]) < 0:
                        self._insert(keys[i])
        return total

    # ----------------------------------------------------------- the engine's batches
    def serve(self, const uint32_t[:, :] ids, const uint64_t[::1] col_layer, uint64_t[::1] keys,
              const uint8_t[:, ::1] records, float[:, ::1] out, uint8_t[::1] skip):
        """A batch of the engine (:class:`engram.RowCache`): ``ids`` uint32 ``[T, C]`` row ids, ``col_layer``
        uint64 ``[C]`` the layer of each column shifted by 32; fills ``keys`` ``[T * C]`` with the keys, looks
        them up as :meth:`lookup` does, decodes each hit's record of ``records`` ``[capacity, 264]`` into its
        row of ``out`` ``[T * C, 256]`` and sets ``skip[i]`` (1: a hit, 0: a miss).  Returns the hits."""
        cdef Py_ssize_t T = ids.shape[0], C = ids.shape[1], t, c, i
        cdef int64_t hits = 0
        cdef int32_t s
        cdef uint64_t k
        if (col_layer.shape[0] != C or keys.shape[0] < T * C or out.shape[0] < T * C or out.shape[1] != ROW_VALUES
                or skip.shape[0] < T * C or records.shape[0] < self.capacity or records.shape[1] != ROW_BYTES):
            raise ValueError("serve: the arrays do not fit the batch or the cache")
        with nogil:
            for t in range(T):
                for c in range(C):
                    i = t * C + c
                    k = col_layer[c] | <uint64_t>ids[t, c]
                    keys[i] = k
                    if self.tiny:
                        self._count(k)
                    s = self._find(k)
                    if s >= 0:
                        hits += 1
                        self._touch(s)
                        decode_row(&records[s, 0], &out[i, 0])
                        skip[i] = 1
                    else:
                        skip[i] = 0
        return hits

    def admit(self, const uint64_t[::1] keys, const uint8_t[::1] skip, const uint8_t[:, ::1] raw,
              uint8_t[:, ::1] records):
        """The misses of a batch served by :meth:`serve` (``skip[i] == 0``), inserted in order with their
        records ``raw`` ``[n, 264]`` as read, copied into ``records``; a key already held is left as it is.
        Returns the records written."""
        cdef Py_ssize_t n = keys.shape[0], i
        cdef int64_t wrote = 0
        cdef int32_t s
        if skip.shape[0] < n or raw.shape[0] < n or raw.shape[1] != ROW_BYTES or records.shape[0] < self.capacity:
            raise ValueError("admit: the arrays do not fit the batch or the cache")
        with nogil:
            for i in range(n):
                if skip[i] or self._find(keys[i]) >= 0:
                    continue
                s = self._insert(keys[i])
                memcpy(&records[s, 0], &raw[i, 0], ROW_BYTES)
                wrote += 1
        return wrote

    # ----------------------------------------------------------- hash table
    cdef inline int32_t _find(self, uint64_t key) noexcept nogil:
        cdef uint64_t i = fmix64(key) & self.tmask
        cdef int32_t s
        while True:
            s = self.table[i]
            if s < 0:
                return -1
            if self.keys[s] == key:
                return s
            i = (i + 1) & self.tmask

    cdef inline void _put(self, int32_t slot) noexcept nogil:
        cdef uint64_t i = fmix64(self.keys[slot]) & self.tmask
        while self.table[i] >= 0:
            i = (i + 1) & self.tmask
        self.table[i] = slot

    cdef void _remove(self, int32_t slot) noexcept nogil:
        """Delete ``slot``'s key from the table (backward-shift deletion: no tombstones)."""
        cdef uint64_t i = fmix64(self.keys[slot]) & self.tmask, j, k
        while self.table[i] != slot:
            i = (i + 1) & self.tmask
        j = i
        while True:
            j = (j + 1) & self.tmask
            if self.table[j] < 0:
                break
            k = fmix64(self.keys[self.table[j]]) & self.tmask
            # the entry at j may move to i unless its home k lies cyclically in (i, j]
            if (i <= j and (k <= i or k > j)) or (i > j and (k <= i and k > j)):
                self.table[i] = self.table[j]
                i = j
        self.table[i] = -1

    # ----------------------------------------------------------- lists
    cdef inline void _unlink(self, int32_t s) noexcept nogil:
        cdef int w = self.where[s]
        if self.prev[s] >= 0:
            self.nxt[self.prev[s]] = self.nxt[s]
        else:
            self.head[w] = self.nxt[s]
        if self.nxt[s] >= 0:
            self.prev[self.nxt[s]] = self.prev[s]
        else:
            self.tail[w] = self.prev[s]
        self.size[w] -= 1
        self.where[s] = NONE

    cdef inline void _push(self, int w, int32_t s) noexcept nogil:
        """``s`` at the most recent end of list ``w``."""
        self.prev[s] = self.tail[w]
        self.nxt[s] = -1
        if self.tail[w] >= 0:
            self.nxt[self.tail[w]] = s
        else:
            self.head[w] = s
        self.tail[w] = s
        self.size[w] += 1
        self.where[s] = w

    cdef void _touch(self, int32_t s) noexcept nogil:
        cdef int w = self.where[s]
        cdef int32_t d
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
        if self.used < self.capacity:
            s = <int32_t>self.used
            self.used += 1
            self.keys[s] = key
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
            if victim >= 0 and self._estimate(self.keys[cand]) > self._estimate(self.keys[victim]):
                self._unlink(cand)
                self._unlink(victim)
                self._push(PROBATION, cand)
                freed = victim
            else:
                freed = cand
        if self.where[freed] != NONE:
            self._unlink(freed)
        self._remove(freed)
        self.keys[freed] = key
        self._put(freed)
        self._push(WINDOW, freed)
        return freed

    # ----------------------------------------------------------- sketch
    cdef inline void _count(self, uint64_t key) noexcept nogil:
        cdef uint64_t h1 = fmix64(key), h2 = fmix64(key ^ <uint64_t>0x9E3779B97F4A7C15) | 1
        cdef int r
        cdef uint8_t* c
        for r in range(SKETCH_ROWS):
            c = self.sketch + r * self.swidth + ((h1 + r * h2) & self.smask)
            if c[0] < COUNTER_MAX:
                c[0] += 1
        self.counted += 1
        if self.counted >= self.sample:
            self._age()

    cdef inline int _estimate(self, uint64_t key) noexcept nogil:
        cdef uint64_t h1 = fmix64(key), h2 = fmix64(key ^ <uint64_t>0x9E3779B97F4A7C15) | 1
        cdef int r, m = COUNTER_MAX, v
        for r in range(SKETCH_ROWS):
            v = self.sketch[r * self.swidth + ((h1 + r * h2) & self.smask)]
            if v < m:
                m = v
        return m

    cdef void _age(self) noexcept nogil:
        cdef int64_t i
        for i in range(SKETCH_ROWS * self.swidth):
            self.sketch[i] >>= 1
        self.counted //= 2
        self.resets += 1
