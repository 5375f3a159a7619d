# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython kernel of the Engram gated add (SPEC §7).

For every token ``t`` not masked off and every residual stream ``s``::

    k    = bf16(kv[t, s]);  v = bf16(kv[t, S])        # S = number of streams
    dot  = sum_i h_i * (q_w[s,i] * k_w[s,i]) * k_i
    dot *= rsqrt(mean(h^2) + eps) * rsqrt(mean(k^2) + eps) * rsqrt(width)
    gate = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot))
    h   <- bf16(h + gate * v)

Precision (the contract ``tests/reference.py::gated_add_twin`` reproduces bit
for bit):

- Sums in float64.  Each term ``(h_i * k_i) * (q_w[s,i] * k_w[s,i])`` is formed
  in float64 (``h_i * k_i`` and ``q_w * k_w`` are exact there, the product of the
  two is rounded once); ``h_i^2`` and ``k_i^2`` are exact.  Element ``i`` goes to
  partial sum ``i % 16`` (in increasing ``i``); the 16 partial sums are then
  folded as ``p[j] += p[j + n]`` for ``n = 8, 4, 2, 1``.  float64 cannot
  overflow here for finite float32 inputs (``|term| < 2^512``).
- The gate in float64: ``mean = sum / width``; ``dot = ((dot * (1/sqrt(mean_h + eps)))
  * (1/sqrt(mean_k + eps))) * (1/sqrt(width))``, skipped when the raw dot is exactly
  0 (so an all-zero ``h`` or ``k`` with ``eps = 0`` gives dot 0, not 0 * inf);
  ``a = |dot|``, ``a = 1e-6`` if ``a < 1e-6``; ``x = copysign(sqrt(a), dot)``;
  ``gate = 1 / (1 + exp(-x))`` with the C library's ``exp``.
- The add in float32: ``g = (float)gate``; ``h + g * v`` with two float32
  roundings (no fused multiply-add: the module is built with
  ``-ffp-contract=off``), then bf16 round-to-nearest-even on the float32 bits
  (SPEC §5's rule; values past the bf16 range become infinities).
- The kernel does not look for non-finite values (its caller
  :func:`engram.mixer.gated_add` refuses a NaN or infinity in ``residual`` or
  ``kv`` before calling it); given one, it propagates it by IEEE rules (a NaN or
  an infinity in ``h`` or ``k`` makes that stream's gate and outputs NaN), and
  the bf16 rounding keeps a NaN a (quiet) NaN instead of letting the carry of the
  SPEC §5 rule turn it into an infinity or -0.

The loops run without the GIL, on the calling thread by default: the add is tiny
next to the projection, and while two OpenMP threads ran it 1.9x faster on an idle
2-core machine, they made it up to 10x slower (at 64 tokens) when other processes
kept the cores busy, as an inference engine's own threads would.  Callers may also
split tokens over their own threads.  ``set_threads(n)`` shares tokens out to ``n`` OpenMP threads (dynamic
schedule, two tokens at a time) for calls of at least ``PARALLEL_MIN_VALUES``
residual values; the bits do not depend on it.  The arithmetic is
compiled three times (baseline x86-64, AVX2, AVX-512F; one portable copy on other
CPUs) and chosen at run time; every path gives the same bits.

Arguments are checked by the Python caller (:func:`engram.mixer.gated_add`).
"""

from cython.parallel cimport prange
from libc.stdlib cimport free, malloc

from engram._native.controls cimport Controls

from engram.errors import ArgumentError

# Residual values (tokens x streams x width) from which a call uses threads.
cdef enum:
    PARALLEL_MIN_VALUES = 1 << 18

cdef extern from *:
    """
    #include <math.h>
    #include <stdint.h>
    #include <string.h>

    #define EG_LANES 16
    #define EG_PORTABLE 0
    #define EG_AVX2 1
    #define EG_AVX512 2

    /* float32 -> bf16 (as float32): SPEC 5 rule, NaN kept a quiet NaN. */
    static inline float eg_bf16(float x) {
        uint32_t b, r;
        memcpy(&b, &x, 4);
        r = ((b & 0x7fffffffu) > 0x7f800000u) ? (b | 0x00400000u)
                                               : (b + 0x7fffu + ((b >> 16) & 1u));
        r &= 0xffff0000u;
        memcpy(&x, &r, 4);
        return x;
    }

    /* The three float64 sums of one stream: out = {dot, sum h^2, sum k^2}. */
    #define EG_SUMS_BODY                                                           \\
        double d[EG_LANES], hh[EG_LANES], kk[EG_LANES];                            \\
        Py_ssize_t i = 0;                                                          \\
        int j, step;                                                               \\
        for (j = 0; j < EG_LANES; j++) { d[j] = 0.0; hh[j] = 0.0; kk[j] = 0.0; }   \\
        for (; i + EG_LANES <= n; i += EG_LANES) {                                 \\
            for (j = 0; j < EG_LANES; j++) {                                       \\
                double hd = (double)h[i + j];                                      \\
                double kd = (double)eg_bf16(key[i + j]);                           \\
                d[j] += (hd * kd) * w[i + j];                                      \\
                hh[j] += hd * hd;                                                  \\
                kk[j] += kd * kd;                                                  \\
            }                                                                      \\
        }                                                                          \\
        for (j = 0; i < n; i++, j++) {                                             \\
            double hd = (double)h[i];                                              \\
            double kd = (double)eg_bf16(key[i]);                                   \\
            d[j] += (hd * kd) * w[i];                                              \\
            hh[j] += hd * hd;                                                      \\
            kk[j] += kd * kd;                                                      \\
        }                                                                          \\
        for (step = EG_LANES / 2; step > 0; step >>= 1) {                          \\
            for (j = 0; j < step; j++) {                                           \\
                d[j] += d[j + step]; hh[j] += hh[j + step]; kk[j] += kk[j + step]; \\
            }                                                                      \\
        }                                                                          \\
        out[0] = d[0]; out[1] = hh[0]; out[2] = kk[0];

    /* h <- bf16(h + g * bf16(v)) in float32. */
    #define EG_ADD_BODY                                                            \\
        Py_ssize_t i;                                                              \\
        for (i = 0; i < n; i++) h[i] = eg_bf16(h[i] + g * eg_bf16(v[i]));

    #define EG_SUMS_SIG(name) \\
        static void name(const float* h, const float* key, const double* w, \\
                         Py_ssize_t n, double* out)
    #define EG_ADD_SIG(name) static void name(float* h, const float* v, float g, Py_ssize_t n)

    EG_SUMS_SIG(eg_sums_portable) { EG_SUMS_BODY }
    EG_ADD_SIG(eg_add_portable) { EG_ADD_BODY }

    #if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    #define EG_HAVE_X86 1
    __attribute__((target("avx2"))) EG_SUMS_SIG(eg_sums_avx2) { EG_SUMS_BODY }
    __attribute__((target("avx2"))) EG_ADD_SIG(eg_add_avx2) { EG_ADD_BODY }
    __attribute__((target("avx512f"))) EG_SUMS_SIG(eg_sums_avx512) { EG_SUMS_BODY }
    __attribute__((target("avx512f"))) EG_ADD_SIG(eg_add_avx512) { EG_ADD_BODY }
    static int eg_cpu_path(void) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f")) return EG_AVX512;
        if (__builtin_cpu_supports("avx2")) return EG_AVX2;
        return EG_PORTABLE;
    }
    #else
    #define EG_HAVE_X86 0
    static int eg_cpu_path(void) { return EG_PORTABLE; }
    #endif

    static void eg_sums(int path, const float* h, const float* key, const double* w,
                        Py_ssize_t n, double* out) {
    #if EG_HAVE_X86
        if (path == EG_AVX512) { eg_sums_avx512(h, key, w, n, out); return; }
        if (path == EG_AVX2) { eg_sums_avx2(h, key, w, n, out); return; }
    #endif
        eg_sums_portable(h, key, w, n, out);
    }

    static void eg_add(int path, float* h, const float* v, float g, Py_ssize_t n) {
    #if EG_HAVE_X86
        if (path == EG_AVX512) { eg_add_avx512(h, v, g, n); return; }
        if (path == EG_AVX2) { eg_add_avx2(h, v, g, n); return; }
    #endif
        eg_add_portable(h, v, g, n);
    }

    /* The gate from the three sums (float64), see the module docstring. */
    static double eg_gate(double dot, double shh, double skk, Py_ssize_t n, double eps) {
        double width = (double)n, a, x;
        if (dot != 0.0) {
            dot = dot * (1.0 / sqrt(shh / width + eps));
            dot = dot * (1.0 / sqrt(skk / width + eps));
            dot = dot * (1.0 / sqrt(width));
        }
        a = fabs(dot);
        if (a < 1e-6) a = 1e-6;
        x = copysign(sqrt(a), dot);
        return 1.0 / (1.0 + exp(-x));
    }
    """
    int EG_LANES
    int eg_cpu_path() nogil
    float eg_bf16(float x) nogil
    void eg_sums(int path, const float* h, const float* key, const double* w,
                 Py_ssize_t n, double* out) nogil
    void eg_add(int path, float* h, const float* v, float g, Py_ssize_t n) nogil
    double eg_gate(double dot, double shh, double skk, Py_ssize_t n, double eps) nogil


cdef Controls _CONTROLS = Controls("gate", eg_cpu_path(), 1)

#: Partial sums of the float64 reductions (part of the precision contract).
LANES = EG_LANES

#: Arithmetic paths this CPU runs; the path in use; threads of calls of at least
#: PARALLEL_MIN_VALUES residual values (default 1, see the module docstring).
paths, get_path, set_path, get_threads, set_threads = _CONTROLS.functions()


cdef inline void _token(int path, float* res, const float* kv, const double* w,
                        Py_ssize_t S, Py_ssize_t W, double eps, float* gates) noexcept nogil:
    """Gated add of one token: ``res`` [S, W], ``kv`` [S + 1, W], ``w`` [S, W], ``gates`` [S]."""
    cdef double sums[3]
    cdef Py_ssize_t s
    cdef float g
    cdef const float* v = kv + S * W
    for s in range(S):
        eg_sums(path, res + s * W, kv + s * W, w + s * W, W, sums)
        g = <float>eg_gate(sums[0], sums[1], sums[2], W, eps)
        gates[s] = g
        eg_add(path, res + s * W, v, g, W)


def gated_add_into(float[:, :, ::1] residual, const float[:, :, ::1] kv,
                   const float[:, ::1] q_w, const float[:, ::1] k_w, double eps,
                   const unsigned char[::1] mask, float[:, ::1] gates):
    """Run the kernel on checked arguments (see :func:`engram.mixer.gated_add`).

    ``residual`` float32 [T, S, W] (updated in place), ``kv`` float32 [T, S+1, W],
    ``q_w``/``k_w`` float32 [S, W], ``mask`` uint8 [T] or ``None`` (0 = skip),
    ``gates`` float32 [T, S] (0 at skipped tokens).  No checks beyond memoryview
    dtypes and contiguity: the caller validated shapes.
    """
    cdef Py_ssize_t T = residual.shape[0], S = residual.shape[1], W = residual.shape[2], t, s, i
    cdef int path = _CONTROLS.path, nthreads = _CONTROLS.threads
    cdef bint masked = mask is not None
    cdef float* res
    cdef const float* kvp
    cdef const float* qw
    cdef const float* kw
    cdef double* w
    cdef float* gp
    cdef const unsigned char* mp = NULL
    if T == 0 or S == 0:
        return
    res = &residual[0, 0, 0]
    kvp = &kv[0, 0, 0]
    qw = &q_w[0, 0]
    kw = &k_w[0, 0]
    gp = &gates[0, 0]
    if masked:
        mp = &mask[0]
    if T < 2 or T * S * W < PARALLEL_MIN_VALUES:
        nthreads = 1
    # q_w * k_w once per call, in float64 (exact: two 24-bit significands).
    w = <double*>malloc(S * W * sizeof(double))
    if w == NULL:
        raise MemoryError(f"cannot allocate {S * W * 8} bytes for the norm weights")
    with nogil:
        for i in range(S * W):
            w[i] = <double>qw[i] * <double>kw[i]
        if nthreads == 1:
            for t in range(T):
                if masked and mp[t] == 0:
                    for s in range(S):
                        gp[t * S + s] = 0.0
                    continue
                _token(path, res + t * S * W, kvp + t * (S + 1) * W, w, S, W, eps, gp + t * S)
        else:
            for t in prange(T, num_threads=nthreads, schedule="dynamic", chunksize=2):
                if masked and mp[t] == 0:
                    for s in range(S):
                        gp[t * S + s] = 0.0
                    continue
                _token(path, res + t * S * W, kvp + t * (S + 1) * W, w, S, W, eps, gp + t * S)
    free(w)


def bf16_round_into(const float[::1] x, float[::1] out):
    """The kernel's bf16 rounding (SPEC §5 rule, NaN kept) of ``x`` into ``out`` (tests)."""
    cdef Py_ssize_t i, n = x.shape[0]
    if out.shape[0] != n:
        raise ArgumentError(f"out has {out.shape[0]} values, x has {n}")
    with nogil:
        for i in range(n):
            out[i] = eg_bf16(x[i])
