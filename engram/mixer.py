"""The consumer math of one Engram layer (SPEC §7): projection and gated add.

Per token the 24 decoded rows (6144 values) are multiplied by the layer's
``engram_kv`` matrix into 4 keys and 1 value of 5120 values each
(:func:`project`), then the value is added to each of the 4 hyper-connection
residual streams through a cosine-similarity gate (:func:`gated_add`)::

    rows [T, 24, 256] --project(engram_kv)--> kv [T, 5, 5120]
    kv + residual [T, 4, 5120] --gated_add(q_w, k_w, eps)--> residual (in place)

The projection reads the F16 weights as the file stores them (315 MB a layer,
half the bytes of float32): up to :data:`F16_KERNEL_MAX_TOKENS` (256) tokens go
through a Cython kernel that converts each weight as it loads it
(``engram/_native/project.pyx``; AVX-512F, AVX2+F16C or portable, chosen at run
time), reading the weights once for all tokens; more tokens convert blocks of
:data:`BLAS_BLOCK_ROWS` weight rows to float32 and run BLAS ``sgemm`` on each
(``numpy.matmul`` into the caller's buffer).  float32 weights (:func:`kv_weights`)
go to ``sgemm`` whole.  The gated add is a Cython kernel
(``engram/_native/gate.pyx``).  All loops run without the GIL.  Shapes are taken
from the arguments, so smaller synthetic layouts work the same way as the V4.1
Flash one.

Precision of :func:`project` (float32 accumulation, SPEC §7): with rows holding
bf16 values and F16 weights every product is exact in float32 and only the sums
round.  The F16 kernel sums each output in 64 float32 partial sums (input ``i``
into sum ``i % 64``, in increasing ``i``, product then sum, no fused
multiply-add), folded pairwise at the end; ``tests/engram/test_mixer.py``'s NumPy
twin reproduces it bit for bit on every path.  The BLAS path sums in BLAS's
order.  Either way each output is within ``n u / (1 - n u) * sum_i |w_i x_i|``
of the exact value (``n`` = 6144 inputs, ``u`` = 2^-24), the classic bound for a
float32 dot product of ``n`` terms.

Precision of :func:`gated_add` (SPEC §7 leaves it open; this is the contract the
NumPy twin ``tests/reference.py::gated_add_twin`` reproduces bit for bit):

- ``dot``, ``sum(h^2)`` and ``sum(k^2)`` are accumulated in float64 (16 partial
  sums, element ``i`` into sum ``i % 16``, folded pairwise at the end), and the
  gate is computed in float64 with the C library's ``sqrt`` and ``exp``;
- the gate is then rounded to float32 and ``h + gate * v`` is formed in float32
  (a product and a sum, each rounded; no fused multiply-add) and rounded to
  bfloat16 with round-to-nearest-even on the float32 bits (the SPEC §5 rule).

So the gates match an exact evaluation to float32 rounding (about 3e-8), and the
outputs are the bf16 rounding of the float64 result except (a) where that result
lies within a few float32 ulps of a bf16 rounding midpoint (near-ties: they then
differ by one bf16 ulp; about 2 values in 10^5 for random data), (b) where ``h``
and ``gate * v`` nearly cancel, as the float32 product carries an error up to
2^-23 of ``|gate * v|``, and (c) where the gate is below 2^-126 (``|dot|`` above
about 7600, only with very large norm weights) and so a float32 subnormal.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ._checks import (as_mask, need_array, need_contiguous, need_eps, need_finite, need_int, need_output, no_overlap,
                      shape_str)
from ._native import gate as _gate
from ._native import project as _project
from .errors import ArgumentError

__all__ = ["kv_weights", "project", "gated_add", "gate_path", "project_path", "F16_KERNEL_MAX_TOKENS",
           "BLAS_BLOCK_ROWS"]

#: Token counts up to which :func:`project` uses the F16 kernel; above it, float32 blocks
#: and BLAS.  ``benchmarks/bench_mixer.py`` times both: the kernel was at or below blocks + BLAS
#: for every count up to 256 tokens (BENCHMARKS.md); at 2048 tokens BLAS is the peer to match.
F16_KERNEL_MAX_TOKENS = 256
#: Weight rows converted to float32 per BLAS call of the large-token path (24 MB at 6144 inputs).
BLAS_BLOCK_ROWS = 1024


def gate_path() -> str:
    """Name of the arithmetic path :func:`gated_add` uses: ``"avx512"``, ``"avx2"`` or ``"portable"``."""
    return _gate.get_path()


def project_path() -> str:
    """Name of the path of :func:`project`'s F16 kernel: ``"avx512"``, ``"avx2"`` or ``"portable"``."""
    return _project.get_path()


def kv_weights(w_f16: np.ndarray) -> np.ndarray:
    """Convert a layer's F16 ``engram_kv`` weights to float32 once (exact).

    :func:`project` reads F16 weights directly and faster (half the bytes); this
    is for callers that want float32 weights for their own BLAS calls.

    Parameters
    ----------
    w_f16 : numpy.ndarray
        float16 ``[out_features, in_features]``: the GGUF tensor
        ``blk.L.engram_kv.weight`` as numpy sees it, ``(25600, 6144)`` for
        V4.1 Flash (SPEC §6).  Any strides (a memory map works).

    Returns
    -------
    numpy.ndarray
        float32, same shape, C-contiguous (629 MB for V4.1 Flash).

    Raises
    ------
    ArgumentError
        ``w_f16`` is not a 2-D float16 array.
    """
    need_array("w_f16", w_f16, np.float16, 2)
    out = np.empty(w_f16.shape, dtype=np.float32)
    # Row blocks bound the temporaries of a strided or memory-mapped source.
    step = max(1, (1 << 24) // max(1, w_f16.shape[1]))
    for r in range(0, w_f16.shape[0], step):
        out[r:r + step] = w_f16[r:r + step]
    return out


def _project_blas_f16(x: np.ndarray, w16: np.ndarray, out: np.ndarray) -> None:
    """``out = x @ w16.T`` by blocks: :data:`BLAS_BLOCK_ROWS` weight rows converted, then ``sgemm``.

    The conversion runs on the calling thread only: BLAS's worker threads keep
    spinning for a while after each call, and OpenMP threads next to them would
    slow both down on a machine with few cores.
    """
    n_out, n_in = w16.shape
    block = np.empty((min(BLAS_BLOCK_ROWS, n_out), n_in), dtype=np.float32)
    bits = w16.view(np.uint16)
    for r0 in range(0, n_out, BLAS_BLOCK_ROWS):
        r1 = min(n_out, r0 + BLAS_BLOCK_ROWS)
        part = block[:r1 - r0]
        _project.f16_to_f32_into(bits[r0:r1], part, 1)
        np.matmul(x, part.T, out=out[:, r0:r1])


def project(rows: np.ndarray, w_kv: np.ndarray, out: Optional[np.ndarray] = None, *,
            streams: int = 4) -> np.ndarray:
    """Project each token's rows by ``engram_kv`` into keys and value (SPEC §7).

    ``out[t].ravel() = w_kv @ rows[t].ravel()``: the token's rows are concatenated
    in column order (6144 values) and multiplied by the ``[out, in]`` matrix with
    float32 accumulation, written straight into ``out`` (no copies of the
    operands).  The first ``streams`` parts of ``out[t]`` are the keys of
    streams ``0..streams-1``, the last one the shared value.  F16 weights are
    read as they are (the kernel for up to :data:`F16_KERNEL_MAX_TOKENS` tokens,
    float32 blocks and BLAS beyond); float32 weights go to BLAS.  Precision: see
    the module docstring.  Non-finite inputs propagate (IEEE) into ``out``;
    :meth:`engram.Session.apply` refuses them in ``rows`` before projecting.

    Parameters
    ----------
    rows : numpy.ndarray
        float32 ``[T, columns, width]`` (``[T, 24, 256]``), C-contiguous, the
        decoded rows of each token (:func:`engram.decode_rows` output reshaped).
    w_kv : numpy.ndarray
        float16 (the GGUF tensor as stored, :meth:`engram.EngramModel.weights`)
        or float32 (:func:`kv_weights`) ``[(streams + 1) * dim, columns * width]``
        (``[25600, 6144]``), C-contiguous.
    out : numpy.ndarray, optional
        float32 ``[T, streams + 1, dim]`` (``[T, 5, 5120]``), C-contiguous,
        writable, not overlapping the inputs.  Allocated when omitted.
    streams : int
        Residual streams (4 in V4.1); ``w_kv``'s rows must split into ``streams + 1`` parts.

    Returns
    -------
    numpy.ndarray
        ``out``: float32 ``[T, streams + 1, dim]``.

    Raises
    ------
    ArgumentError
        A wrong dtype, number of dimensions, shape, memory layout, an ``out``
        that overlaps an input, or ``streams < 1``; nothing is written then.
    """
    need_array("rows", rows, np.float32, 3)
    need_array("w_kv", w_kv, (np.float16, np.float32), 2)
    streams = need_int("streams", streams, lo=1)
    T, columns, width = rows.shape
    n_out, n_in = w_kv.shape
    need_contiguous("rows", rows)
    need_contiguous("w_kv", w_kv, " (the GGUF tensor as read, or kv_weights)")
    if n_in != columns * width:
        raise ArgumentError(f"w_kv has shape {shape_str(w_kv)}: its {n_in} input features do not match rows of "
                            f"shape {shape_str(rows)} ({columns} x {width} = {columns * width} values a token)")
    parts = streams + 1
    if n_out % parts or n_out == 0:
        raise ArgumentError(f"w_kv has shape {shape_str(w_kv)}: {n_out} output features do not split into "
                            f"{parts} equal parts ({streams} keys + 1 value)")
    dim = n_out // parts
    if out is None:
        out = np.empty((T, parts, dim), dtype=np.float32)
    else:
        need_array("out", out, np.float32, 3)
        if out.shape != (T, parts, dim):
            raise ArgumentError(f"out must have shape [{T}, {parts}, {dim}], got {shape_str(out)}")
        need_output("out", out)
        no_overlap("out", out, rows=rows, w_kv=w_kv)
    x, o2 = rows.reshape(T, n_in), out.reshape(T, n_out)
    if w_kv.dtype == np.float32:
        np.matmul(x, w_kv.T, out=o2)
    elif T <= F16_KERNEL_MAX_TOKENS:
        _project.f16_project_into(w_kv.view(np.uint16), x, o2)
    else:
        _project_blas_f16(x, w_kv, o2)
    return out


def _check_layer_weights(q_w: np.ndarray, k_w: np.ndarray) -> tuple:
    """``(S, W)`` of the norm weights, which define the layer's streams and width."""
    need_array("q_w", q_w, np.float32, 2)
    need_array("k_w", k_w, np.float32, 2)
    if k_w.shape != q_w.shape:
        raise ArgumentError(f"k_w must have the shape of q_w {shape_str(q_w)}, got {shape_str(k_w)}")
    S, W = q_w.shape
    if W == 0:
        raise ArgumentError(f"q_w has shape {shape_str(q_w)}: the stream width must be >= 1")
    return S, W


def _gate_shapes(residual: np.ndarray, kv: np.ndarray, q_w: np.ndarray, k_w: np.ndarray) -> Tuple[int, int, int]:
    """(T, S, W) of a gated add: ``residual`` [T, S, W] and ``kv`` [T, S + 1, W] checked against the layer's
    weights ``q_w``, ``k_w`` [S, W] (``ArgumentError`` naming the array that does not fit)."""
    S, W = _check_layer_weights(q_w, k_w)
    need_array("residual", residual, np.float32, 3)
    T = residual.shape[0]
    if residual.shape[1:] != (S, W):
        raise ArgumentError(f"residual must have shape [T, {S}, {W}] ({S} streams of the layer's width {W}, "
                            f"from q_w {shape_str(q_w)}), got {shape_str(residual)}")
    need_array("kv", kv, np.float32, 3)
    if kv.shape != (T, S + 1, W):
        raise ArgumentError(f"kv must have shape [{T}, {S + 1}, {W}] (keys of {S} streams + value) "
                            f"for residual of shape {shape_str(residual)}, got {shape_str(kv)}")
    return T, S, W


def _check_gates_out(gates_out, shape: Tuple[int, int], m8, **others: np.ndarray) -> None:
    """``gates_out``: float32 of ``shape`` [T, S], C-contiguous, writable, sharing no memory with ``others``
    or the mask ``m8``."""
    need_array("gates_out", gates_out, np.float32, 2)
    if gates_out.shape != shape:
        raise ArgumentError(f"gates_out must have shape [{shape[0]}, {shape[1]}], got {shape_str(gates_out)}")
    need_output("gates_out", gates_out)
    no_overlap("gates_out", gates_out, **others, mask=m8)


def gated_add(residual: np.ndarray, kv: np.ndarray, q_w: np.ndarray, k_w: np.ndarray, eps: float,
              mask=None, *, gates_out: Optional[np.ndarray] = None) -> None:
    """Add the Engram value to every residual stream through its gate, in place (SPEC §7).

    For each token ``t`` with ``mask[t]`` true and stream ``s``, with ``h = residual[t, s]``,
    ``k = bf16(kv[t, s])``, ``v = bf16(kv[t, S])``::

        dot  = sum_i h_i * (q_w[s,i] * k_w[s,i]) * k_i
        dot *= rsqrt(mean(h^2) + eps) * rsqrt(mean(k^2) + eps) * rsqrt(width)
        gate = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot))
        h   <- bf16(h + gate * v)

    Precision: see the module docstring (float64 sums and gate, float32 add,
    bf16 round-to-nearest-even).  An all-zero ``h`` or ``k`` gives dot 0 (gate
    ``sigmoid(1e-3)``) even with ``eps = 0``.  Non-finite inputs are refused: a
    NaN or infinity in ``residual`` or ``kv`` (tokens the mask turns off are not
    looked at) raises before anything is written, where the kernel would make
    that stream's gate and outputs NaN.  Finite inputs can still give +-inf:
    sums past the bf16 range, and ``kv`` values at or past the bf16 maximum
    (read as +-inf).  The check is one ``numpy.isfinite`` pass over each array;
    every check of a T = 1 :meth:`engram.Session.apply` (residual and rows there,
    residual and kv here) took 8.7 us in all, 0.06-0.13% of the 6.8-15.0 ms its
    projection (315 MB of F16 weights) and gate took (two runs on a shared
    machine: ``.venv/bin/python -m benchmarks.run mixer --only finite --rounds 5``;
    BENCHMARKS.md), so it runs in NumPy ahead of the kernel rather than in the
    kernel's first pass.  Called alone at T = 1 this function is dominated by its
    checks: 22.9 us against 8.9 us for the kernel.
    Runs without the GIL on the calling thread (``engram._native.gate.set_threads``
    enables OpenMP for large calls).

    Parameters
    ----------
    residual : numpy.ndarray
        float32 ``[T, S, W]`` (``[T, 4, 5120]``) holding bf16 values, C-contiguous,
        writable: updated in place (rows of masked-off tokens untouched).
    kv : numpy.ndarray
        float32 ``[T, S + 1, W]``: keys of streams ``0..S-1`` then the value
        (:func:`project` output).  Read as bf16 (rounded on the fly).
        A non-contiguous array is copied first.
    q_w, k_w : numpy.ndarray
        float32 ``[S, W]``: ``engram_q_norm`` / ``engram_k_norm`` weights (SPEC §6).
        They define the layer's streams ``S`` and width ``W``: ``residual`` and
        ``kv`` are checked against them, so a message names the array that does
        not fit the layer.
    eps : float
        RMS-norm epsilon of the gate (the model's ``EngramModel.eps``), finite, ``>= 0``.
    mask : array_like, optional
        ``[T]``, bool or 0/1 integers (the one mask rule of ``engram._checks.as_mask``);
        False/0 skips the token (padding, image positions: SPEC §4).
    gates_out : numpy.ndarray, optional
        float32 ``[T, S]``, C-contiguous, writable: receives every gate as float32
        (the value used in the add); 0 at masked-off tokens.

    Raises
    ------
    ArgumentError
        A wrong dtype, shape, memory layout (residual or gates_out not
        C-contiguous or read-only), overlapping arrays, ``W == 0``, a mask of
        another length or with entries other than 0/1 (:class:`~engram.errors.MaskError`),
        or ``eps`` not a finite number ``>= 0``; a NaN or infinity in ``residual``
        or ``kv`` at a token the mask keeps (names the array, the token, the
        stream -- for ``kv`` the part: keys of streams ``0..S-1``, then the
        value ``S`` -- and the column of the first one, in C order).  Raised
        before anything is written: ``residual`` and ``gates_out`` stay untouched.
    """
    T, S, W = _gate_shapes(residual, kv, q_w, k_w)
    eps = need_eps(eps)
    need_output("residual", residual)
    m8 = None if mask is None else as_mask(mask, T)
    if gates_out is not None:
        _check_gates_out(gates_out, (T, S), m8, residual=residual, kv=kv, q_w=q_w, k_w=k_w)
    no_overlap("residual", residual, kv=kv, q_w=q_w, k_w=k_w, mask=m8)
    untouched = "; residual and gates_out are untouched"
    need_finite("residual", residual, ("token", "stream", "column"), m8, untouched)
    need_finite("kv", kv, ("token", "part", "column"), m8, untouched)
    gates = gates_out if gates_out is not None else np.empty((T, S), dtype=np.float32)
    _gate.gated_add_into(residual, np.ascontiguousarray(kv), np.ascontiguousarray(q_w),
                         np.ascontiguousarray(k_w), eps, m8, gates)
