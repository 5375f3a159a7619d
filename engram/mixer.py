"""The consumer math of one Engram layer (SPEC §7): projection and gated add.

Per token the 24 decoded rows (6144 values) are multiplied by the layer's
``engram_kv`` matrix into 4 keys and 1 value of 5120 values each
(:func:`project`), then the value is added to each of the 4 hyper-connection
residual streams through a cosine-similarity gate (:func:`gated_add`)::

    rows [T, 24, 256] --project(engram_kv)--> kv [T, 5, 5120]
    kv + residual [T, 4, 5120] --gated_add(q_w, k_w, eps)--> residual (in place)

The projection is one BLAS ``sgemm`` (``numpy.matmul`` into the caller's
buffer); the gated add is a Cython kernel (``engram/_native/gate.pyx``) whose
loops run without the GIL.  Shapes are taken from the arguments, so smaller
synthetic layouts work the same way as the V4.1 Flash one.

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

import math
from numbers import Real
from typing import Optional

import numpy as np

from ._native import gate as _gate
from .errors import ArgumentError

__all__ = ["kv_weights", "project", "gated_add", "gate_path"]


def gate_path() -> str:
    """Name of the arithmetic path :func:`gated_add` uses: ``"avx512"``, ``"avx2"`` or ``"portable"``."""
    return _gate.get_path()


def _shape(a: np.ndarray) -> str:
    return "[" + ", ".join(str(d) for d in a.shape) + "]"


def _need_array(name: str, a, dtype, ndim: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name} must be a numpy.ndarray of {np.dtype(dtype).name}, got {type(a).__name__}")
    if a.dtype != dtype:
        raise ArgumentError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype} with shape {_shape(a)}")
    if a.ndim != ndim:
        raise ArgumentError(f"{name} must have {ndim} dimensions, got shape {_shape(a)}")
    return a


def _need_output(name: str, a: np.ndarray) -> None:
    if not a.flags.c_contiguous:
        raise ArgumentError(f"{name} (shape {_shape(a)}) must be C-contiguous")
    if not a.flags.writeable:
        raise ArgumentError(f"{name} (shape {_shape(a)}) is read-only")


def _no_overlap(name: str, out: np.ndarray, **others) -> None:
    for other_name, other in others.items():
        if other is not None and np.may_share_memory(out, other):
            raise ArgumentError(f"{name} (shape {_shape(out)}) overlaps {other_name} (shape {_shape(other)})")


def kv_weights(w_f16: np.ndarray) -> np.ndarray:
    """Convert a layer's F16 ``engram_kv`` weights to float32 once (exact).

    Parameters
    ----------
    w_f16 : numpy.ndarray
        float16 ``[out_features, in_features]``: the GGUF tensor
        ``blk.L.engram_kv.weight`` as numpy sees it, ``(25600, 6144)`` for
        V4.1 Flash (SPEC §6).  Any strides (a memory map works).

    Returns
    -------
    numpy.ndarray
        float32, same shape, C-contiguous (629 MB for V4.1 Flash), for :func:`project`.

    Raises
    ------
    ArgumentError
        ``w_f16`` is not a 2-D float16 array.
    """
    _need_array("w_f16", w_f16, np.float16, 2)
    out = np.empty(w_f16.shape, dtype=np.float32)
    # Row blocks bound the temporaries of a strided or memory-mapped source.
    step = max(1, (1 << 24) // max(1, w_f16.shape[1]))
    for r in range(0, w_f16.shape[0], step):
        out[r:r + step] = w_f16[r:r + step]
    return out


def project(rows: np.ndarray, w_kv: np.ndarray, out: Optional[np.ndarray] = None, *,
            streams: int = 4) -> np.ndarray:
    """Project each token's rows by ``engram_kv`` into keys and value (SPEC §7).

    ``out[t].ravel() = w_kv @ rows[t].ravel()``: the token's rows are concatenated
    in column order (6144 values) and multiplied by the ``[out, in]`` matrix with
    float32 accumulation, in one BLAS ``sgemm`` (``numpy.matmul`` of the rows
    against the transposed weights, written straight into ``out``; no copies of
    either operand).  The first ``streams`` parts of ``out[t]`` are the keys of
    streams ``0..streams-1``, the last one the shared value.  Rows holding bf16
    values times F16 weights give exact float32 products; only the summation
    rounds.  Non-finite inputs propagate (IEEE).

    Parameters
    ----------
    rows : numpy.ndarray
        float32 ``[T, columns, width]`` (``[T, 24, 256]``), C-contiguous, the
        decoded rows of each token (:func:`engram.decode_rows` output reshaped).
    w_kv : numpy.ndarray
        float32 ``[(streams + 1) * dim, columns * width]`` (``[25600, 6144]``),
        C-contiguous: the layer's ``engram_kv`` (see :func:`kv_weights`).
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
    _need_array("rows", rows, np.float32, 3)
    _need_array("w_kv", w_kv, np.float32, 2)
    if isinstance(streams, bool) or not isinstance(streams, (int, np.integer)) or streams < 1:
        raise ArgumentError(f"streams must be an integer >= 1, got {streams!r}")
    streams = int(streams)
    T, columns, width = rows.shape
    n_out, n_in = w_kv.shape
    if not rows.flags.c_contiguous:
        raise ArgumentError(f"rows (shape {_shape(rows)}) must be C-contiguous")
    if not w_kv.flags.c_contiguous:
        raise ArgumentError(f"w_kv (shape {_shape(w_kv)}) must be C-contiguous (see kv_weights)")
    if n_in != columns * width:
        raise ArgumentError(f"w_kv has shape {_shape(w_kv)}: its {n_in} input features do not match "
                            f"rows of shape {_shape(rows)} ({columns} x {width} = {columns * width} values a token)")
    parts = streams + 1
    if n_out % parts or n_out == 0:
        raise ArgumentError(f"w_kv has shape {_shape(w_kv)}: {n_out} output features do not split into "
                            f"{parts} equal parts ({streams} keys + 1 value)")
    dim = n_out // parts
    if out is None:
        out = np.empty((T, parts, dim), dtype=np.float32)
    else:
        _need_array("out", out, np.float32, 3)
        if out.shape != (T, parts, dim):
            raise ArgumentError(f"out must have shape [{T}, {parts}, {dim}], got {_shape(out)}")
        _need_output("out", out)
        _no_overlap("out", out, rows=rows, w_kv=w_kv)
    np.matmul(rows.reshape(T, n_in), w_kv.T, out=out.reshape(T, n_out))
    return out


def gated_add(residual: np.ndarray, kv: np.ndarray, q_w: np.ndarray, k_w: np.ndarray, eps: float,
              mask: Optional[np.ndarray] = None, *, gates_out: Optional[np.ndarray] = None) -> None:
    """Add the Engram value to every residual stream through its gate, in place (SPEC §7).

    For each token ``t`` with ``mask[t]`` true and stream ``s``, with ``h = residual[t, s]``,
    ``k = bf16(kv[t, s])``, ``v = bf16(kv[t, S])``::

        dot  = sum_i h_i * (q_w[s,i] * k_w[s,i]) * k_i
        dot *= rsqrt(mean(h^2) + eps) * rsqrt(mean(k^2) + eps) * rsqrt(width)
        gate = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot))
        h   <- bf16(h + gate * v)

    Precision: see the module docstring (float64 sums and gate, float32 add,
    bf16 round-to-nearest-even).  An all-zero ``h`` or ``k`` gives dot 0 (gate
    ``sigmoid(1e-3)``) even with ``eps = 0``.  Non-finite inputs are not
    rejected: a NaN or infinity in ``h`` or ``k`` makes that stream's gate and
    outputs NaN, one in ``v`` the matching outputs non-finite; sums past the
    bf16 range become +-inf.  Nothing raises for values.  Runs without the GIL on the
    calling thread (``engram._native.gate.set_threads`` enables OpenMP for large calls).

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
    eps : float
        RMS-norm epsilon (``deepseek41.attention.layer_norm_rms_epsilon``), finite, ``>= 0``.
    mask : numpy.ndarray, optional
        bool ``[T]``; False skips the token (padding, image positions: SPEC §4).
    gates_out : numpy.ndarray, optional
        float32 ``[T, S]``, C-contiguous, writable: receives every gate as float32
        (the value used in the add); 0 at masked-off tokens.

    Raises
    ------
    ArgumentError
        A wrong dtype, shape, memory layout (residual or gates_out not
        C-contiguous or read-only), overlapping arrays, ``W == 0``, a mask of
        another length, or ``eps`` not a finite number ``>= 0``.  Raised before
        anything is written: ``residual`` and ``gates_out`` stay untouched.
    """
    _need_array("residual", residual, np.float32, 3)
    _need_array("kv", kv, np.float32, 3)
    _need_array("q_w", q_w, np.float32, 2)
    _need_array("k_w", k_w, np.float32, 2)
    T, S, W = residual.shape
    if W == 0:
        raise ArgumentError(f"residual has shape {_shape(residual)}: the stream width must be >= 1")
    if kv.shape != (T, S + 1, W):
        raise ArgumentError(f"kv must have shape [{T}, {S + 1}, {W}] (keys of {S} streams + value) "
                            f"for residual of shape {_shape(residual)}, got {_shape(kv)}")
    for name, w in (("q_w", q_w), ("k_w", k_w)):
        if w.shape != (S, W):
            raise ArgumentError(f"{name} must have shape [{S}, {W}] for residual of shape "
                                f"{_shape(residual)}, got {_shape(w)}")
    if isinstance(eps, bool) or not isinstance(eps, Real) or not math.isfinite(float(eps)) or float(eps) < 0:
        raise ArgumentError(f"eps must be a finite number >= 0, got {eps!r}")
    _need_output("residual", residual)
    m8 = None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise ArgumentError(f"mask must be bool, got {m.dtype} with shape {_shape(m)}")
        if m.shape != (T,):
            raise ArgumentError(f"mask must have shape [{T}] (one flag a token), got {_shape(m)}")
        m8 = np.ascontiguousarray(m).view(np.uint8)
    if gates_out is not None:
        _need_array("gates_out", gates_out, np.float32, 2)
        if gates_out.shape != (T, S):
            raise ArgumentError(f"gates_out must have shape [{T}, {S}], got {_shape(gates_out)}")
        _need_output("gates_out", gates_out)
        _no_overlap("gates_out", gates_out, residual=residual, kv=kv, q_w=q_w, k_w=k_w, mask=m8)
    _no_overlap("residual", residual, kv=kv, q_w=q_w, k_w=k_w, mask=m8)
    gates = gates_out if gates_out is not None else np.empty((T, S), dtype=np.float32)
    _gate.gated_add_into(residual, np.ascontiguousarray(kv), np.ascontiguousarray(q_w),
                         np.ascontiguousarray(k_w), float(eps), m8, gates)
