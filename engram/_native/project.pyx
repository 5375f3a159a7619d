# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython kernels of the projection by F16 ``engram_kv`` weights (SPEC §7).

- ``f16_project_into(w, x, out)``: ``out[t, o] = sum_i w[o, i] * x[t, i]`` reading
  the F16 weights directly (``project_simd.h``: the summation order that is the
  precision contract, the AVX-512F / AVX2+F16C / portable paths);
- ``f16_to_f32_into(w, out)``: exact conversion of F16 rows to float32 (for the
  BLAS path of large token counts, block by block).

Both split rows across ``get_threads()`` OpenMP threads once a call has at least
``PARALLEL_MIN_ROWS`` rows of weights, and run without the GIL.  Paths and
threads are the shared :class:`engram._native.controls.Controls`.  Arguments
are checked by the Python caller (:func:`engram.mixer.project`).
"""

from libc.stdint cimport uint16_t
from cython.parallel cimport prange
cimport openmp

from engram._native.controls cimport Controls

cdef enum:
    # Weight rows a thread takes at a time, and the call size from which threads are used.
    ROW_CHUNK = 64
    PARALLEL_MIN_ROWS = 1024

cdef extern from "project_simd.h" nogil:
    int EP_LANES
    int EP_MAX_TOKENS
    int ep_cpu_path()
    void ep_rows(int path, const uint16_t* w, Py_ssize_t n_in, const float* x, Py_ssize_t ldx, int T,
                 Py_ssize_t r0, Py_ssize_t r1, float* out, Py_ssize_t ldo)
    void ep_convert(int path, const uint16_t* w, Py_ssize_t n, float* out)

cdef Controls _CONTROLS = Controls("project", ep_cpu_path(), max(1, min(openmp.omp_get_num_procs(), 8)))

#: Partial sums of each output (part of the precision contract).
LANES = EP_LANES
#: Tokens computed per pass over a weight row on the AVX-512 path.
MAX_TOKENS = EP_MAX_TOKENS

#: Paths this CPU runs; the path in use; threads of calls with at least PARALLEL_MIN_ROWS weight rows.
paths, get_path, set_path, get_threads, set_threads = _CONTROLS.functions()


def f16_project_into(const uint16_t[:, ::1] w, const float[:, ::1] x, float[:, ::1] out):
    """``out[t, o] = sum_i w[o, i] * x[t, i]`` for F16 bits ``w`` [n_out, n_in], float32 ``x`` [T, n_in],
    float32 ``out`` [T, n_out] (no checks beyond the memoryviews: the caller validated shapes)."""
    cdef Py_ssize_t n_out = w.shape[0], n_in = w.shape[1], T = x.shape[0], c, nchunks
    cdef int path = _CONTROLS.path, nthreads = _CONTROLS.threads, tt = <int>T
    cdef const uint16_t* wp
    cdef const float* xp
    cdef float* op
    if T == 0 or n_out == 0:
        return
    wp = &w[0, 0] if n_in else <const uint16_t*>NULL
    xp = &x[0, 0] if n_in else <const float*>NULL
    op = &out[0, 0]
    nchunks = (n_out + ROW_CHUNK - 1) // ROW_CHUNK
    if n_out < PARALLEL_MIN_ROWS:
        nthreads = 1
    with nogil:
        if nthreads == 1:
            ep_rows(path, wp, n_in, xp, n_in, tt, 0, n_out, op, n_out)
        else:
            for c in prange(nchunks, num_threads=nthreads, schedule="dynamic"):
                ep_rows(path, wp, n_in, xp, n_in, tt, c * ROW_CHUNK, min(n_out, (c + 1) * ROW_CHUNK), op, n_out)


def f16_to_f32_into(const uint16_t[:, ::1] w, float[:, ::1] out, int threads=0):
    """Exact float32 values of the F16 bits ``w`` [n, m] into ``out`` [n, m].

    ``threads`` > 0 overrides ``get_threads()`` (1 between BLAS calls: OpenBLAS's
    workers spin for a while after each call, and OpenMP threads beside them
    would fight them for the cores).
    """
    cdef Py_ssize_t n = w.shape[0], m = w.shape[1], c, nchunks
    cdef int path = _CONTROLS.path, nthreads = threads if threads > 0 else _CONTROLS.threads
    cdef const uint16_t* wp
    cdef float* op
    if n == 0 or m == 0:
        return
    wp = &w[0, 0]
    op = &out[0, 0]
    nchunks = (n + ROW_CHUNK - 1) // ROW_CHUNK
    if n < PARALLEL_MIN_ROWS:
        nthreads = 1
    with nogil:
        for c in prange(nchunks, num_threads=nthreads, schedule="static"):
            ep_convert(path, wp + c * ROW_CHUNK * m, (min(n, (c + 1) * ROW_CHUNK) - c * ROW_CHUNK) * m,
                       op + c * ROW_CHUNK * m)
