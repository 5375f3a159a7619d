# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython kernels of the row codec ``e4m3_e8m0_32_row264`` (SPEC §5).

The arithmetic lives in ``codec_simd.h`` (one C source compiled for the
build's baseline, AVX2 and AVX-512, chosen at run time).  This module exposes

- the C interface declared in ``codec.pxd`` (``check_row``, ``decode_row``) for
  other kernels, e.g. the table reader, to cimport;
- the batch entry points used by :mod:`engram.codec`: ``find_bad_row``,
  ``first_bad_column`` and ``decode_rows_into`` (loops without the GIL; large
  batches split across threads with OpenMP where built);
- ``paths()``, ``get_path()``, ``set_path(name)`` to inspect or force the path
  (the tests run every path available on the machine), and ``get_threads()``,
  ``set_threads(n)`` (the shared :class:`engram._native.controls.Controls`).

Arguments of the batch entry points are checked by the Python caller.
"""

from libc.stdint cimport uint8_t
from cython.parallel cimport prange
cimport openmp

from engram._native.controls cimport Controls

from engram.errors import ArgumentError

# Rows per thread chunk and the batch size from which threads are used.
cdef enum:
    PARALLEL_CHUNK = 2048
    PARALLEL_MIN_ROWS = 8192

cdef extern from "codec_simd.h" nogil:
    int ENGRAM_CODEC_HAVE_X86
    void engram_codec_init()
    int engram_codec_cpu_path()
    void engram_codec_decode_rows(int path, const uint8_t* raw, Py_ssize_t n, float* out)
    Py_ssize_t engram_codec_find_bad(int path, const uint8_t* raw, Py_ssize_t n)
    int engram_codec_first_bad(const uint8_t* raw)

engram_codec_init()

cdef Controls _CONTROLS = Controls("codec", engram_codec_cpu_path(), max(1, min(openmp.omp_get_num_procs(), 8)))

# ------------------------------------------------------------------ C interface
cdef int check_row(const uint8_t* raw) noexcept nogil:
    if engram_codec_find_bad(_CONTROLS.path, raw, 1) == 0:
        return engram_codec_first_bad(raw)
    return -1


cdef void decode_row(const uint8_t* raw, float* out) noexcept nogil:
    engram_codec_decode_rows(_CONTROLS.path, raw, 1, out)


# ------------------------------------------------------------------ paths and threads
#: Decode paths this CPU runs; the path in use; threads of batches of at least PARALLEL_MIN_ROWS rows.
paths, get_path, set_path, get_threads, set_threads = _CONTROLS.functions()


# ------------------------------------------------------------------ batch entry points
def find_bad_row(const uint8_t[:, ::1] raw):
    """Index of the first row (of uint8 ``[n, 264]``) holding a bad value, or -1."""
    cdef Py_ssize_t n = raw.shape[0], i
    if n == 0:
        return -1
    with nogil:
        i = engram_codec_find_bad(_CONTROLS.path, &raw[0, 0], n)
    return -1 if i == n else i


def first_bad_column(const uint8_t[::1] row):
    """First bad column (0..255) of one 264-byte row, or -1 (the rule of ``check_row``)."""
    if row.shape[0] != ROW_BYTES:
        raise ArgumentError(f"a row has {ROW_BYTES} bytes, got {row.shape[0]}")
    return check_row(&row[0])


def decode_rows_into(const uint8_t[:, ::1] raw, float[:, ::1] out):
    """Decode uint8 ``[n, 264]`` rows into float32 ``[n, 256]`` without checking them.

    Batches of at least ``PARALLEL_MIN_ROWS`` rows are split across threads.
    """
    cdef Py_ssize_t n = raw.shape[0], c, nchunks, lo, hi
    cdef int nthreads, path = _CONTROLS.path
    cdef const uint8_t* r
    cdef float* o
    if n == 0:
        return
    r = &raw[0, 0]
    o = &out[0, 0]
    with nogil:
        if n < PARALLEL_MIN_ROWS or _CONTROLS.threads == 1:
            engram_codec_decode_rows(path, r, n, o)
        else:
            nchunks = (n + PARALLEL_CHUNK - 1) // PARALLEL_CHUNK
            nthreads = _CONTROLS.threads
            for c in prange(nchunks, num_threads=nthreads, schedule="static"):
                lo = c * PARALLEL_CHUNK
                hi = min(n, lo + PARALLEL_CHUNK)
                engram_codec_decode_rows(path, r + lo * 264, hi - lo, o + lo * 256)


def decode_row_into(const uint8_t[::1] row, float[::1] out):
    """Decode one 264-byte row into float32 ``out[0:256]`` through the C interface ``decode_row``.

    No check of the values (call ``first_bad_column`` first).
    """
    if row.shape[0] != ROW_BYTES or out.shape[0] != ROW_VALUES:
        raise ArgumentError(f"need a {ROW_BYTES}-byte row and {ROW_VALUES} outputs, "
                            f"got {row.shape[0]} and {out.shape[0]}")
    decode_row(&row[0], &out[0])
