# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython kernels of the n-gram hash (SPEC §4).

``HashKernel`` holds one layout's constants as C arrays; ``History`` is the
per-sequence state (the compressed ids of the last ``max_ngram - 1`` tokens,
newest first, DEAD = -1).  All loops run without the GIL.

The modulo by each column's prime is the hot operation (24 per token and
layer).  For primes above 2**13 it is computed with a double-precision
reciprocal: ``q = trunc(h * (1/p))`` is within one of ``h // p`` because
``h < 2**63`` and ``h / p < 2**50`` keep the relative error far below ``1/q``;
one correction step in each direction makes the remainder exact.  Smaller
primes (tiny test layouts) use the hardware division.  The tests compare
every path against a NumPy twin that uses ``%``.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from cython.parallel cimport prange
cimport openmp
cimport numpy as cnp
import numpy as np

cnp.import_array()

from operator import index as _index

from engram.errors import ArgumentError, HistoryError, LayoutError, TokenError

cdef enum:
    # Longest history (max_ngram - 1) and most columns a layer the kernel serves.
    MAX_TAIL = 15
    MAX_COLS = 1024
    # Primes from which the reciprocal modulo is exact (see the module docstring).
    FAST_MOD_MIN_PRIME = 8192
    # Batches of at least this many tokens are split across threads (OpenMP, where built).
    PARALLEL_MIN_TOKENS = 4096
    PARALLEL_CHUNK = 2048

cdef int32_t DEAD = -1

cdef extern from "hash_simd.h" nogil:
    int ENGRAM_HAVE_AVX512_PATH
    int engram_cpu_has_avx512()
    void engram_hash_batch_avx512(int L, int N, const uint64_t* mults, const uint64_t* primes,
                                  const double* inv, const uint64_t* offsets, int32_t pad,
                                  const int32_t* ext, Py_ssize_t T, uint32_t* out)

cdef bint _CPU_AVX512 = engram_cpu_has_avx512() != 0


cdef class History:
    """Hash state of one sequence: compressed ids of the last tokens, newest first.

    ``History()`` is a fresh state: every id DEAD (-1), as at the start of a
    sequence (SPEC §4).  ``History(ids)`` restores a saved state; ids must be
    ``-1`` or non-negative (they are checked against the layout when hashed).
    ``copy()`` is a snapshot.  The state has ``max_ngram - 1`` ids (3 for V4.1).

    Raises
    ------
    HistoryError
        ``ids`` is not a sequence of integers, has the wrong length, or holds
        an id below -1.
    """

    cdef int32_t _ids[MAX_TAIL]
    cdef readonly int n  # read-only: the ids live in a fixed array of MAX_TAIL

    def __cinit__(self, ids=None, *, int n=3):
        cdef int i
        if ids is None:
            if n < 1 or n > MAX_TAIL:
                raise HistoryError(f"History: length must be in [1, {MAX_TAIL}], got {n}")
            self.n = n
            for i in range(MAX_TAIL):
                self._ids[i] = DEAD
            return
        try:
            vals = [_index(x) for x in ids]
            if any(isinstance(x, (bool, np.bool_)) for x in ids):
                raise TypeError("bool")
        except TypeError:
            raise HistoryError(f"History: ids must be a sequence of integer compressed ids, got {ids!r:.200}") from None
        if len(vals) < 1 or len(vals) > MAX_TAIL:
            raise HistoryError(f"History: length must be in [1, {MAX_TAIL}], got {len(vals)}")
        for i, v in enumerate(vals):
            if v < -1 or v > 2**31 - 1:
                raise HistoryError(f"History: id {i} is {v}; ids are compressed ids >= 0 or -1 (DEAD)")
        self.n = len(vals)
        for i in range(MAX_TAIL):
            self._ids[i] = vals[i] if i < self.n else DEAD

    @property
    def ids(self):
        """tuple[int, ...]: the stored compressed ids, newest first (-1 = DEAD)."""
        return tuple(self._ids[i] for i in range(self.n))

    def copy(self):
        """A snapshot that evolves independently."""
        cdef History h = History.__new__(History, None, n=self.n)
        cdef int i
        for i in range(self.n):
            h._ids[i] = self._ids[i]
        return h

    def reset(self):
        """Forget every token (all DEAD)."""
        cdef int i
        for i in range(self.n):
            self._ids[i] = DEAD

    def __eq__(self, other):
        cdef History o
        cdef int i
        if not isinstance(other, History):
            return NotImplemented
        o = <History>other
        if o.n != self.n:
            return False
        for i in range(self.n):  # in C: a step compares histories on its critical path
            if self._ids[i] != o._ids[i]:
                return False
        return True

    def __hash__(self):
        return hash(self.ids)

    def __repr__(self):
        return f"History({list(self.ids)})"

    def __reduce__(self):
        return (History, (list(self.ids),))


cdef inline uint32_t _mod_fast(uint64_t h, double hd, uint64_t p, double inv) noexcept nogil:
    cdef int64_t q = <int64_t>(hd * inv)
    cdef int64_t r = <int64_t>h - q * <int64_t>p
    if r < 0:
        r += <int64_t>p
    elif r >= <int64_t>p:
        r -= <int64_t>p
    return <uint32_t>r


cdef struct Consts:
    int L, C, N, H
    int32_t pad
    bint fast
    const uint64_t* primes
    const uint64_t* offsets
    const uint64_t* mults
    const double* inv


cdef inline void hash_token(const Consts* k, const int32_t* ids_in, uint32_t* out) noexcept nogil:
    """Rows of one token.  ``ids_in[j]`` is the compressed id ``j`` tokens back (DEAD = -1)."""
    cdef int32_t ids[MAX_TAIL + 1]
    cdef int j, l, kk, hd_, col, N = k.N, H = k.H, C = k.C
    cdef bint dead = False
    cdef uint64_t h
    cdef double hdbl
    cdef const uint64_t* m
    cdef const uint64_t* pr
    cdef const uint64_t* of
    cdef const double* iv
    cdef uint32_t* o
    for j in range(N):
        ids[j] = ids_in[j]
        if dead or ids[j] < 0:
            dead = True
            ids[j] = k.pad
    for l in range(k.L):
        m = k.mults + l * N
        pr = k.primes + l * C
        of = k.offsets + l * C
        iv = k.inv + l * C
        o = out + l * C
        h = <uint64_t>ids[0] * m[0]
        for kk in range(1, N):
            h ^= <uint64_t>ids[kk] * m[kk]
            col = (kk - 1) * H
            if k.fast:
                hdbl = <double><int64_t>h
                if H == 8:
                    for hd_ in range(8):
                        o[col + hd_] = _mod_fast(h, hdbl, pr[col + hd_], iv[col + hd_]) + <uint32_t>of[col + hd_]
                else:
                    for hd_ in range(H):
                        o[col + hd_] = _mod_fast(h, hdbl, pr[col + hd_], iv[col + hd_]) + <uint32_t>of[col + hd_]
            else:
                for hd_ in range(H):
                    o[col + hd_] = <uint32_t>(h % pr[col + hd_] + of[col + hd_])


cdef class HashKernel:
    """One layout's hash constants as C arrays.  Built by :class:`engram.Hasher`."""

    cdef int L, C, N, H
    cdef int32_t pad, cvs
    cdef bint fast
    cdef uint64_t* primes
    cdef uint64_t* offsets
    cdef uint64_t* mults
    cdef double* inv
    cdef const int32_t* tmap
    cdef Py_ssize_t vocab
    cdef object _tmap_ref
    cdef Consts k
    cdef public bint simd
    cdef public int threads

    def __cinit__(self, primes, offsets, multipliers, int heads, int max_ngram,
                  int compressed_vocab_size, int pad_id, token_map=None):
        cdef cnp.ndarray[cnp.uint64_t, ndim=2] P = np.ascontiguousarray(primes, dtype=np.uint64)
        cdef cnp.ndarray[cnp.uint64_t, ndim=2] O = np.ascontiguousarray(offsets, dtype=np.uint64)
        cdef cnp.ndarray[cnp.uint64_t, ndim=2] M = np.ascontiguousarray(multipliers, dtype=np.uint64)
        cdef Py_ssize_t i, n
        self.L = P.shape[0]
        self.C = P.shape[1]
        self.N = max_ngram
        self.H = heads
        if self.C != (max_ngram - 1) * heads:
            raise LayoutError(f"hash kernel: {self.C} columns do not match (max_ngram - 1) x heads = "
                              f"{(max_ngram - 1) * heads}")
        if self.C > MAX_COLS or max_ngram - 1 > MAX_TAIL:
            raise LayoutError(f"the hash kernel serves at most max_ngram {MAX_TAIL + 1} and {MAX_COLS} columns a "
                              f"layer; this layout has max_ngram {max_ngram} and {self.C} columns")
        self.pad = pad_id
        self.cvs = compressed_vocab_size
        n = self.L * self.C
        self.primes = <uint64_t*>malloc(n * sizeof(uint64_t))
        self.offsets = <uint64_t*>malloc(n * sizeof(uint64_t))
        self.inv = <double*>malloc(n * sizeof(double))
        self.mults = <uint64_t*>malloc(self.L * self.N * sizeof(uint64_t))
        if not self.primes or not self.offsets or not self.inv or not self.mults:
            raise MemoryError()
        self.fast = True
        for i in range(n):
            self.primes[i] = P.reshape(-1)[i]
            self.offsets[i] = O.reshape(-1)[i]
            self.inv[i] = 1.0 / <double>self.primes[i]
            if self.primes[i] < FAST_MOD_MIN_PRIME:
                self.fast = False
        for i in range(self.L * self.N):
            self.mults[i] = M.reshape(-1)[i]
        self.k.L = self.L
        self.k.C = self.C
        self.k.N = self.N
        self.k.H = self.H
        self.k.pad = self.pad
        self.k.fast = self.fast
        self.k.primes = self.primes
        self.k.offsets = self.offsets
        self.k.mults = self.mults
        self.k.inv = self.inv
        # The AVX-512 batch path covers 8 heads with reciprocal modulo on CPUs that have it.
        self.simd = _CPU_AVX512 and self.fast and self.H == 8
        self.threads = max(1, min(openmp.omp_get_num_procs(), 8))
        self.tmap = NULL
        self.vocab = 0
        self._tmap_ref = None
        if token_map is not None:
            tm = np.ascontiguousarray(token_map, dtype=np.int32)
            tm.setflags(write=False)
            self._tmap_ref = tm
            self.vocab = tm.shape[0]
            self.tmap = <const int32_t*>cnp.PyArray_DATA(tm)

    def __dealloc__(self):
        free(self.primes)
        free(self.offsets)
        free(self.inv)
        free(self.mults)

    @property
    def fast_mod(self):
        """bool: whether the reciprocal modulo is in use (every prime >= 8192)."""
        return bool(self.fast)

    cdef void _hash_range(self, const int32_t* ext, Py_ssize_t start, Py_ssize_t stop,
                          uint32_t* o) noexcept nogil:
        """Hash tokens ``start..stop`` of the extended id array into their rows of ``o``."""
        cdef Py_ssize_t t, stride = self.L * self.C
        cdef int j, nt = self.N - 1
        cdef int32_t win[MAX_TAIL + 1]
        if self.simd:
            engram_hash_batch_avx512(self.L, self.N, self.mults, self.primes, self.inv, self.offsets,
                                     self.pad, ext + start, stop - start, o + start * stride)
            return
        for t in range(start, stop):
            for j in range(nt + 1):
                win[j] = ext[t + nt - j]
            hash_token(&self.k, win, o + t * stride)

    cdef Py_ssize_t _compress(self, const int64_t* tok, const uint8_t* mask, Py_ssize_t T,
                              int32_t* cur) noexcept nogil:
        """Map tokens to compressed ids (DEAD where masked).  Returns the first bad index or -1.

        Every token is range-checked, masked ones too: a masked position's id is not hashed,
        but an id outside the vocabulary is a caller's bug wherever it sits."""
        cdef Py_ssize_t t
        cdef int64_t v
        cdef int64_t bound = self.vocab if self.tmap != NULL else self.cvs
        for t in range(T):
            v = tok[t]
            if v < 0 or v >= bound:
                return t
            if mask != NULL and mask[t] == 0:
                cur[t] = DEAD
            elif self.tmap != NULL:
                cur[t] = self.tmap[v]
            else:
                cur[t] = <int32_t>v
        return -1

    cdef int _check_history(self, History hist) noexcept:
        cdef int i
        if hist.n != self.N - 1:
            return -2
        for i in range(hist.n):
            if hist._ids[i] < -1 or hist._ids[i] >= self.cvs:
                return i
        return -1

    def check_history(self, History hist):
        """Return -1 if ``hist`` fits this layout, -2 on a length mismatch, else the bad index."""
        return self._check_history(hist)

    def hash_into(self, cnp.ndarray tokens, mask, History hist, cnp.ndarray out):
        """Hash ``tokens`` (int64 [T], C-contiguous) into ``out`` (uint32 [T, L, C], C-contiguous).

        ``mask`` is None or uint8/bool [T] (nonzero = text).  Advances ``hist`` on
        success.  Returns -1 on success or the index of the first invalid token
        (then neither ``out`` nor ``hist`` is changed).  Arguments are checked by
        the Python caller.
        """
        cdef Py_ssize_t T = tokens.shape[0]
        cdef const int64_t* tok = <const int64_t*>cnp.PyArray_DATA(tokens)
        cdef const uint8_t* mk = NULL
        cdef uint32_t* o = <uint32_t*>cnp.PyArray_DATA(out)
        cdef int32_t* ext
        cdef Py_ssize_t t, bad, c, nchunks
        cdef int nthreads
        cdef int j, nt = self.N - 1
        cdef Py_ssize_t stride = self.L * self.C
        if mask is not None:
            mk = <const uint8_t*>cnp.PyArray_DATA(mask)
        if T == 0:
            return -1
        # ext = [oldest history id, ..., newest history id, token 0, ..., token T-1]
        ext = <int32_t*>malloc((T + nt) * sizeof(int32_t))
        if ext == NULL:
            raise MemoryError()
        try:
            with nogil:
                bad = self._compress(tok, mk, T, ext + nt)
                if bad < 0:
                    for j in range(nt):
                        ext[nt - 1 - j] = hist._ids[j]
                    nchunks = (T + PARALLEL_CHUNK - 1) // PARALLEL_CHUNK
                    nthreads = self.threads if T >= PARALLEL_MIN_TOKENS else 1
                    for c in prange(nchunks, num_threads=nthreads, schedule="static"):
                        self._hash_range(ext, c * PARALLEL_CHUNK, min(T, (c + 1) * PARALLEL_CHUNK), o)
                    for j in range(nt):
                        hist._ids[j] = ext[T + nt - 1 - j]
        finally:
            free(ext)
        return bad

    def step(self, token, History hist, cnp.ndarray out):
        """One decode token: hash into ``out`` (uint32 [L, C]) and advance ``hist``.

        Validates everything in C (no allocation): raises ``TokenError`` for an
        invalid token, ``HistoryError`` for a history that does not fit the
        layout, ``ArgumentError`` for a wrong ``out``; nothing changes then.
        """
        cdef int64_t v
        cdef int32_t cur
        cdef int j
        cdef int32_t win[MAX_TAIL + 1]
        if type(token) is not int and (isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer))):
            raise TokenError(f"token {token!r} is not an integer token id")
        try:
            v = token
        except (OverflowError, TypeError):
            raise TokenError(f"token {token!r} is not a valid token id") from None
        if self.tmap != NULL:
            if v < 0 or v >= self.vocab:
                raise TokenError(f"token {v} is outside the vocabulary [0, {self.vocab})")
            cur = self.tmap[v]
        else:
            if v < 0 or v >= self.cvs:
                raise TokenError(f"compressed id {v} is outside [0, {self.cvs})")
            cur = <int32_t>v
        j = self._check_history(hist)
        if j != -1:
            raise HistoryError(self._history_message(hist, j))
        if (cnp.PyArray_TYPE(out) != cnp.NPY_UINT32 or not cnp.PyArray_IS_C_CONTIGUOUS(out)
                or cnp.PyArray_NDIM(out) != 2 or cnp.PyArray_DIM(out, 0) != self.L
                or cnp.PyArray_DIM(out, 1) != self.C or not cnp.PyArray_ISWRITEABLE(out)):
            raise ArgumentError(
                f"out must be a writable C-contiguous uint32 array of shape ({self.L}, {self.C}), "
                f"got {(<object>out).dtype} shape {(<object>out).shape}")
        win[0] = cur
        for j in range(self.N - 1):
            win[j + 1] = hist._ids[j]
        hash_token(&self.k, win, <uint32_t*>cnp.PyArray_DATA(out))
        for j in range(self.N - 1):
            hist._ids[j] = win[j]
        return out

    def _history_message(self, History hist, int j):
        if j == -2:
            return (f"history holds {hist.n} ids but this layout (max_ngram {self.N}) needs {self.N - 1}; "
                    f"it comes from another layout")
        return (f"history id {j} is {hist._ids[j]}, outside the compressed vocabulary [0, {self.cvs}) "
                f"of this layout; it comes from another layout or was corrupted")


def _CPU_AVX512_PUBLIC():
    """Whether this CPU runs the AVX-512 hash path."""
    return bool(_CPU_AVX512)
