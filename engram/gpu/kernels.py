"""The consumer's kernels on a torch device: row decode, projection, gated add (SPEC §5, §7).

Each kernel has two implementations that give the same bits:

- a Triton kernel (``triton.jit``), used on CUDA devices, and on the CPU when
  ``TRITON_INTERPRET=1`` runs Triton's interpreter (how CI tests it);
- a pure-torch twin, used where Triton is absent (or not interpreting on the CPU).

:func:`kernel_path` says which one a device gets.

**Decode** (:func:`decode_raw`): raw 264-byte records ``uint8 [n, 264]`` -> bf16
``[n, 256]``, computed with integer operations only: value ``j`` is
``M * 2^E`` with ``M`` the E4M3 significand (4 bits) and ``E`` its exponent
plus the E8M0 scale; its bf16 bits are built directly, rounding to nearest even
where the value is a bf16 subnormal.  No float arithmetic, so no flush-to-zero
or contraction can move a bit: the result is bit-identical to
:func:`engram.decode_rows` for every record that decodes (the host checks the
records before they are published, SPEC §5).  The same kernel writes the f16
copy the projection reads (fused: one pass over the records).

**Projection** (:func:`project`): ``kv = rows @ engram_kv.T`` with the F16
weights resident on the device, by one of three paths (:func:`projection_path`):

- up to :data:`LANES_MAX_TOKENS` tokens on CUDA (a decode step of one session,
  or two), a Triton kernel that sums in the CPU kernel's own order (64 float32
  partial sums, folded pairwise; ``engram/_native/project_simd.h``): the keys
  and value are bit-identical to :func:`engram.project`, so the gates equal the
  CPU path's.  It reads the weights at the speed of cuBLAS there (88.9% of a
  device-to-device copy on an H200);
- more tokens on CUDA, cuBLAS through ``torch.mm(x16, w16.T,
  out_dtype=torch.float32)``: f16 inputs, float32 accumulation in cuBLAS's
  order.  The rows are bf16 values; a bf16 value is exact in f16 when its E8M0
  scale byte lies in :data:`F16_EXACT_SCALES`, so every product is exact in
  float32 and only the sums round (SPEC §7's numerics with another order: a key
  next to a bf16 rounding boundary may then round the other way before the
  gate, moving that gate by up to ~1e-4).  Records with a scale outside that
  range go through float32 weights in blocks;
- on the CPU device, the CPU path's own F16 kernel on the tensors' memory: the
  host session's bits.

BF16 weights were rejected: rounding F16 weights to bf16 drops 3 of their 11
significant bits (``benchmarks/bench_gpu.py`` prints the error it gives against
the CPU path).

**Gated add** (:func:`gated_add`): the CPU kernel's contract
(:mod:`engram.mixer`): ``dot``, ``sum(h^2)``, ``sum(k^2)`` in float64, the
gate in float64, rounded to float32; ``h + gate * v`` in float32 (no fused
multiply-add: ``enable_fp_fusion=False``) rounded to bf16 (nearest even, on the
bits: SPEC §5's rule, as Triton's interpreter truncates in its own conversion).
The float64 sums are taken in another order than the CPU kernel's 16 lanes,
so gates agree to float64 rounding before their float32 rounding (well
within 1e-5) and the residual to one bf16 rounding at most.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from typing import Optional

import torch

import numpy as np

from .._native import project as _native_project
from ..codec import BLOCK, ROW_BYTES, ROW_VALUES
from ..errors import ArgumentError
from ..mixer import F16_KERNEL_MAX_TOKENS

try:  # Triton is optional: the torch twins run without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None
    tl = None

__all__ = ["decode_raw", "project", "gated_add", "gate_weights", "kernel_path", "f16_exact", "triton_available",
           "project_mode", "projection_path", "LANES_MAX_TOKENS", "PROJECT_LANES", "F16_EXACT_SCALES", "CPU_BLOCK_ROWS", "GATE_BLOCK"]

#: E8M0 scale bytes whose decoded values are all exact in float16 (so the f16 projection is exact
#: in its products): ``2^(s-127)`` from ``2^-15`` (the smallest E4M3 step, 2^-9, times 2^-15 is the
#: f16 subnormal step 2^-24) to ``2^7`` (448 * 2^7 = 57,344 <= 65,504).
F16_EXACT_SCALES = (112, 134)
#: Weight rows converted to float32 per matmul of the CPU and exact projections (24 MB at 6144 inputs).
CPU_BLOCK_ROWS = 1024
#: Elements of a stream one Triton gate program handles per loop iteration, and its warps (a gate is one
#: program per token and stream: 2048 x 8 warps took 3.4 us less a call than 1024 x 4 on an H200).
GATE_BLOCK = 2048
GATE_WARPS = 8


def triton_available() -> bool:
    """Triton is importable."""
    return triton is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


_INTERPRETER_LOCK = threading.Lock()


def _launching():
    """A lock around each launch under Triton's interpreter, which patches ``triton.language`` for the
    duration of a launch and so cannot run two at once; nothing on a real device."""
    return _INTERPRETER_LOCK if _interpreting() else contextlib.nullcontext()


def kernel_path(device: torch.device) -> str:
    """``"triton"`` (a CUDA device with Triton, or the CPU under ``TRITON_INTERPRET=1``) or ``"torch"``."""
    if triton is None:
        return "torch"
    if device.type == "cuda" or (device.type == "cpu" and _interpreting()):
        return "triton"
    return "torch"


# ------------------------------------------------------------------ argument checks
def _need(name: str, t, dtype: torch.dtype, shape: tuple, device: Optional[torch.device] = None,
          contiguous: bool = True) -> None:
    """``t`` is a tensor of ``dtype`` and ``shape`` (-1: any size) on ``device``, contiguous if asked: the
    kernels index raw pointers, so a tensor of another size or layout would be read or written out of
    bounds.  Metadata only (no device synchronisation).  Raises :class:`ArgumentError`."""
    want = "[" + ", ".join("n" if d == -1 else str(d) for d in shape) + "]"
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor {str(dtype)[6:]} {want}, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ArgumentError(f"{name} must have dtype {str(dtype)[6:]}, got {str(t.dtype)[6:]}")
    if t.dim() != len(shape) or any(d != -1 and d != n for d, n in zip(shape, t.shape)):
        raise ArgumentError(f"{name} must have shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ArgumentError(f"{name} is on {t.device}, the other tensors on {device}")
    if contiguous and not t.is_contiguous():
        raise ArgumentError(f"{name} must be contiguous (strides {list(t.stride())})")
    if t.requires_grad and name in ("out", "x16", "residual", "gates"):
        raise ArgumentError(f"{name} requires grad: the kernel writes it in place, outside autograd")


#: The paths that launch a Triton kernel.
TRITON_PATHS = ("triton", "lanes")


def _need_path(path: Optional[str], known: tuple, device: torch.device) -> None:
    """``path`` is None or one of ``known``; a Triton path has Triton and tensors it can reach: on a CUDA
    device, or on the CPU under ``TRITON_INTERPRET=1`` (on a CUDA host the interpreter is off, and a
    compiled kernel given CPU tensors fails inside Triton's launcher).  Raises :class:`ArgumentError`."""
    if path is None:
        return
    if path not in known:
        raise ArgumentError(f"path must be one of {list(known)}, got {path!r}")
    if path in TRITON_PATHS:
        if triton is None:
            raise ArgumentError(f"path {path!r} needs Triton, which is not installed")
        if device.type != "cuda" and not (device.type == "cpu" and _interpreting()):
            raise ArgumentError(f"path {path!r} runs Triton on a CUDA device, or on the CPU under "
                                f"TRITON_INTERPRET=1; the tensors are on {device}")


# ------------------------------------------------------------------ decode
def _decode_bits_torch(raw: torch.Tensor) -> torch.Tensor:
    """int32 bf16 bit patterns ``[n, 256]`` of the records ``raw`` (uint8 ``[n, 264]``)."""
    c = raw[:, :ROW_VALUES].to(torch.int32)
    s = raw[:, ROW_VALUES:].to(torch.int32).repeat_interleave(BLOCK, dim=1)
    sign = (c >> 7) & 1
    e = (c >> 3) & 15
    m = c & 7
    big = torch.where(e > 0, 8 + m, m)                    # significand M, value = M * 2^E
    E = torch.clamp(e, min=1) - 10 + s - 127
    p = (big >= 2).to(torch.int32) + (big >= 4).to(torch.int32) + (big >= 8).to(torch.int32)
    ef = E + p + 127                                      # biased bf16 exponent of a normal result
    normal = (ef << 7) | ((big - (1 << p)) << (7 - p))
    sh = E + 133                                          # subnormal: value = q * 2^-133
    up_sh = torch.clamp(sh, min=0)
    dn = torch.clamp(-sh, min=0)
    q = torch.where(sh >= 0, big << up_sh, big >> dn)
    rem = big & ((1 << dn) - 1)
    half = torch.where(dn > 0, 1 << torch.clamp(dn - 1, min=0), torch.zeros_like(dn))
    up = (dn > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    sub = q + up.to(torch.int32)
    bits = torch.where(big == 0, torch.zeros_like(big), torch.where(ef >= 1, normal, sub))
    return bits | (sign << 15)


if triton is not None:
    @triton.jit
    def _decode_kernel(raw_ptr, out_ptr, x16_ptr, WRITE_X16: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, 256)
        c = tl.load(raw_ptr + r * 264 + j).to(tl.int32)
        s = tl.load(raw_ptr + r * 264 + 256 + j // 32).to(tl.int32)
        sign = (c >> 7) & 1
        e = (c >> 3) & 15
        m = c & 7
        big = tl.where(e > 0, 8 + m, m)
        E = tl.maximum(e, 1) - 10 + s - 127
        p = (big >= 2).to(tl.int32) + (big >= 4).to(tl.int32) + (big >= 8).to(tl.int32)
        ef = E + p + 127
        normal = (ef << 7) | ((big - (1 << p)) << (7 - p))
        sh = E + 133
        up_sh = tl.maximum(sh, 0)
        dn = tl.maximum(-sh, 0)
        q = tl.where(sh >= 0, big << up_sh, big >> dn)
        rem = big & ((1 << dn) - 1)
        half = tl.where(dn > 0, 1 << tl.maximum(dn - 1, 0), 0)
        up = (dn > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
        sub = q + up.to(tl.int32)
        bits = tl.where(big == 0, 0, tl.where(ef >= 1, normal, sub)) | (sign << 15)
        signed = tl.where(bits >= 32768, bits - 65536, bits)  # the int16 view of the bf16 output
        tl.store(out_ptr + r * 256 + j, signed.to(tl.int16))
        if WRITE_X16:
            f = (bits << 16).to(tl.float32, bitcast=True)
            tl.store(x16_ptr + r * 256 + j, f.to(tl.float16))


def decode_raw(raw: torch.Tensor, out: Optional[torch.Tensor] = None, x16: Optional[torch.Tensor] = None, *,
               path: Optional[str] = None) -> torch.Tensor:
    """Decode raw records on their device to bf16 (SPEC §5), bit-identical to :func:`engram.decode_rows`.

    Parameters
    ----------
    raw : torch.Tensor
        uint8 ``[n, 264]``, contiguous, on the device; records the host has
        checked (a NaN code or scale gives garbage here, not an error).
    out : torch.Tensor, optional
        bfloat16 ``[n, 256]``, contiguous, same device.  Allocated when omitted.
    x16 : torch.Tensor, optional
        float16 ``[n, 256]``: also receives the values as f16 (the projection's
        input; exact for scales in :data:`F16_EXACT_SCALES`).
    path : {"triton", "torch"}, optional
        Force an implementation; default :func:`kernel_path` of the device.

    Returns
    -------
    torch.Tensor
        ``out``.

    Raises
    ------
    ArgumentError
        A tensor of another type, dtype, shape, device or layout, or an unknown ``path``, or a Triton
        path its tensors cannot take (:func:`_need_path`) (``out`` and ``x16`` are then untouched).
    """
    _need("raw", raw, torch.uint8, (-1, ROW_BYTES))
    n = raw.shape[0]
    if out is not None:
        _need("out", out, torch.bfloat16, (n, ROW_VALUES), raw.device)
    if x16 is not None:
        _need("x16", x16, torch.float16, (n, ROW_VALUES), raw.device)
    _need_path(path, ("triton", "torch"), raw.device)
    if out is None:
        out = torch.empty((n, ROW_VALUES), dtype=torch.bfloat16, device=raw.device)
    if n == 0:
        return out
    path = path or kernel_path(raw.device)
    if path == "triton":
        with _launching():
            _decode_kernel[(n,)](raw, out.view(torch.int16), x16 if x16 is not None else out,
                                 WRITE_X16=x16 is not None)
    else:
        bits = _decode_bits_torch(raw)
        out.view(torch.int16).copy_(torch.where(bits >= 32768, bits - 65536, bits).to(torch.int16))
        if x16 is not None:
            x16.copy_(out)
    return out


def f16_exact(raw: torch.Tensor) -> bool:
    """All scale bytes of ``raw`` (uint8 ``[..., 264]``, any device) lie in :data:`F16_EXACT_SCALES`."""
    s = raw[..., ROW_VALUES:]
    lo, hi = F16_EXACT_SCALES
    return bool(((s >= lo) & (s <= hi)).all())


# ------------------------------------------------------------------ projection
def _has_out_dtype(device: torch.device) -> str:
    """How ``torch.mm(..., out_dtype=torch.float32)`` runs f16 inputs on ``device`` (CUDA, torch >= 2.8):
    ``"out"`` (into a given ``out``), ``"new"`` (a new tensor) or ``""`` (not at all)."""
    a = torch.zeros((2, 2), dtype=torch.float16, device=device)
    o = torch.empty((2, 2), dtype=torch.float32, device=device)
    try:
        torch.mm(a, a, out_dtype=torch.float32, out=o)
        return "out"
    except (TypeError, RuntimeError, NotImplementedError):
        pass
    try:
        return "new" if torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32 else ""
    except (TypeError, RuntimeError, NotImplementedError):
        return ""


_OUT_DTYPE: dict = {}


def project_mode(device: torch.device) -> str:
    """How :func:`project` multiplies on ``device``: ``"f16-cublas"`` (f16 inputs, float32 accumulation and
    output; ``"f16-cublas-new"`` the same into a new tensor, then copied), ``"f16-cublas-f16out"`` (an older torch: f16 output, documented as inexact), or ``"f32-blocks"``."""
    if device.type != "cuda":
        return "f32-blocks"
    key = str(device)
    if key not in _OUT_DTYPE:
        _OUT_DTYPE[key] = _has_out_dtype(device)
    return {"out": "f16-cublas", "new": "f16-cublas-new"}.get(_OUT_DTYPE[key], "f16-cublas-f16out")


if triton is not None:
    @triton.jit
    def _lanes_fold(p, BLOCK_N: tl.constexpr, LANES: tl.constexpr):
        """``p[:, j] += p[:, j + s]`` for s = LANES/2 .. 1 (the CPU kernel's fold): ``[BLOCK_N]``."""
        if LANES >= 64:
            p = tl.sum(tl.reshape(p, [BLOCK_N, 2, LANES // 2]), axis=1)
        if LANES >= 32:
            p = tl.sum(tl.reshape(p, [BLOCK_N, 2, 16]), axis=1)
        p = tl.sum(tl.reshape(p, [BLOCK_N, 2, 8]), axis=1)
        p = tl.sum(tl.reshape(p, [BLOCK_N, 2, 4]), axis=1)
        p = tl.sum(tl.reshape(p, [BLOCK_N, 2, 2]), axis=1)
        p = tl.sum(tl.reshape(p, [BLOCK_N, 2, 1]), axis=1)
        return tl.reshape(p, [BLOCK_N])

    @triton.jit
    def _project_lanes4_kernel(x_ptr, w_ptr, out_ptr, T, N, K, T_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                               LANES: tl.constexpr, UNROLL: tl.constexpr):
        """``out[t, n] = sum_i w[n, i] * x[t, i]`` for up to 4 tokens in the CPU kernel's order
        (engram/_native/project_simd.h): input ``i`` into float32 partial sum ``i % LANES`` in increasing
        ``i``, then ``p[j] += p[j + s]`` for s = LANES/2 .. 1.  ``x`` bf16 ``[T, K]``, ``w`` f16 ``[N, K]``,
        ``out`` float32 ``[T, N]``.  A 2-D accumulator per token, so the weights' loads vectorise as in a
        GEMV and each weight is loaded once for all tokens; ``UNROLL`` blocks of ``LANES`` inputs are
        loaded an iteration and added in increasing ``i``.  Compiled with fused multiply-add only where every
        product is exact in float32 (then ``fma(x, w, p)`` rounds as ``p + x * w`` does)."""
        pid = tl.program_id(0)
        n = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < N
        j = tl.arange(0, LANES)
        a0 = tl.zeros([BLOCK_N, LANES], dtype=tl.float32)
        a1 = tl.zeros([BLOCK_N, LANES], dtype=tl.float32)
        a2 = tl.zeros([BLOCK_N, LANES], dtype=tl.float32)
        a3 = tl.zeros([BLOCK_N, LANES], dtype=tl.float32)
        tj = j * 0 + T  # the token count as a tensor (masks must be tensors under the interpreter)
        tn = n * 0 + T
        for c0 in range(0, K, LANES * UNROLL):
            for u in tl.static_range(UNROLL):
                c = c0 + u * LANES
                km = (c + j) < K
                w = tl.load(w_ptr + n[:, None] * K + c + j[None, :], mask=nm[:, None] & km[None, :],
                            other=0.0).to(tl.float32)
                x0 = tl.load(x_ptr + c + j, mask=km, other=0.0).to(tl.float32)
                a0 = a0 + x0[None, :] * w
                if T_PAD > 1:
                    x1 = tl.load(x_ptr + K + c + j, mask=km & (tj > 1), other=0.0).to(tl.float32)
                    a1 = a1 + x1[None, :] * w
                if T_PAD > 2:
                    x2 = tl.load(x_ptr + 2 * K + c + j, mask=km & (tj > 2), other=0.0).to(tl.float32)
                    a2 = a2 + x2[None, :] * w
                    x3 = tl.load(x_ptr + 3 * K + c + j, mask=km & (tj > 3), other=0.0).to(tl.float32)
                    a3 = a3 + x3[None, :] * w
        tl.store(out_ptr + n, _lanes_fold(a0, BLOCK_N, LANES), mask=nm)
        if T_PAD > 1:
            tl.store(out_ptr + N + n, _lanes_fold(a1, BLOCK_N, LANES), mask=nm & (tn > 1))
        if T_PAD > 2:
            tl.store(out_ptr + 2 * N + n, _lanes_fold(a2, BLOCK_N, LANES), mask=nm & (tn > 2))
            tl.store(out_ptr + 3 * N + n, _lanes_fold(a3, BLOCK_N, LANES), mask=nm & (tn > 3))


#: Token counts up to which the projection on a CUDA device sums in the CPU kernel's order
#: (:func:`projection_path`'s ``"lanes"``): there it runs at the speed of cuBLAS (88.9% of a
#: device-to-device copy at 1 and 2 tokens on an H200, 0.084 ms a layer); at 3-4 tokens it takes 0.12 ms
#: against cuBLAS's 0.084, and beyond it is compute-bound on CUDA cores, so more tokens go to cuBLAS.
LANES_MAX_TOKENS = 2
#: The CPU kernel's partial sums per output (engram/_native/project_simd.h's EP_LANES).
PROJECT_LANES = 64
#: Launch settings of the lanes kernel by padded token count: BLOCK_N, UNROLL, num_warps, num_stages
#: (the best of a sweep inside CUDA graphs on an H200: 76.2 us a layer at 1 and 2 tokens, cuBLAS 81.0).
_LANES_CONFIG = {1: (16, 8, 8, 1), 2: (8, 8, 4, 3), 4: (64, 2, 4, 3)}


def _project_lanes(rows: torch.Tensor, w16: torch.Tensor, out: torch.Tensor, fuse: bool = True) -> None:
    """The lanes kernel over ``rows`` in launches of up to 4 tokens (tokens are independent: same bits)."""
    T, K = rows.shape
    N = w16.shape[0]
    for t0 in range(0, T, 4):
        n = min(4, T - t0)
        t_pad = 1 if n == 1 else (2 if n == 2 else 4)
        block_n, unroll, warps, stages = _LANES_CONFIG[t_pad]
        with _launching():
            _project_lanes4_kernel[(triton.cdiv(N, block_n),)](
                rows[t0:t0 + n], w16, out[t0:t0 + n], n, N, K, T_PAD=t_pad, BLOCK_N=block_n,
                LANES=PROJECT_LANES, UNROLL=unroll, num_warps=warps, num_stages=stages, enable_fp_fusion=fuse)


def _project_host(rows: torch.Tensor, w16: torch.Tensor, out: torch.Tensor) -> None:
    """The CPU path's own F16 kernel (``engram/_native/project.pyx``, as :func:`engram.project` calls it up to
    :data:`engram.mixer.F16_KERNEL_MAX_TOKENS` tokens) on CPU tensors: the host session's bits."""
    x = rows.to(torch.float32).numpy()
    _native_project.f16_project_into(w16.numpy().view(np.uint16), x, out.numpy())


def _project_f32_blocks(x: torch.Tensor, w16: torch.Tensor, out: torch.Tensor) -> None:
    x32 = x.to(torch.float32)
    for r0 in range(0, w16.shape[0], CPU_BLOCK_ROWS):
        r1 = min(w16.shape[0], r0 + CPU_BLOCK_ROWS)
        torch.matmul(x32, w16[r0:r1].to(torch.float32).t(), out=out[:, r0:r1])


#: The implementations :func:`project` knows (``path=``).
PROJECTION_PATHS = ("lanes", "host", "f32-blocks", "f16-cublas", "f16-cublas-new", "f16-cublas-f16out")


def projection_path(device: torch.device, tokens: int, exact: bool = True) -> str:
    """Which implementation :func:`project` uses for ``tokens`` tokens on ``device``:

    - ``"lanes"``: the Triton kernel that sums in the CPU kernel's order (CUDA with Triton), up to
      :data:`LANES_MAX_TOKENS` tokens: bit-identical to :func:`engram.project` (forced with ``path=``, it
      also runs any token count, and on the CPU under Triton's interpreter);
    - ``"host"``: the CPU path's own F16 kernel on CPU tensors (up to
      :data:`engram.mixer.F16_KERNEL_MAX_TOKENS` tokens): bit-identical to :func:`engram.project`;
    - ``"f16-cublas"`` (or its variants, :func:`project_mode`): cuBLAS on tensor cores, f16 inputs, float32
      accumulation in cuBLAS's order (more tokens on CUDA: a batch of many sessions, a prefill chunk);
    - ``"f32-blocks"``: float32 matmul on weight blocks (records outside the f16-exact scales on CUDA past
      :data:`LANES_MAX_TOKENS`, and more tokens than the F16 kernel takes on the CPU).
    """
    if device.type == "cpu":  # also under Triton's interpreter, where the lanes kernel is tested on its own
        return "host" if tokens <= F16_KERNEL_MAX_TOKENS else "f32-blocks"
    if kernel_path(device) == "triton" and tokens <= LANES_MAX_TOKENS:
        return "lanes"
    mode = project_mode(device)
    return mode if exact else "f32-blocks"


def project(x16: torch.Tensor, rows: torch.Tensor, w16: torch.Tensor, *, exact: bool = True,
            out: Optional[torch.Tensor] = None, path: Optional[str] = None) -> torch.Tensor:
    """``kv = rows @ w16.T`` (SPEC §7): float32 ``[T, out_features]``.

    Numerics by path (:func:`projection_path`): ``"lanes"`` and ``"host"`` give the CPU path's bits (its 64
    float32 partial sums, SPEC §7's float32 accumulation, products exact); cuBLAS sums in its own order
    (each output within the float32 bound of :mod:`engram.mixer`, so a key next to a bf16 rounding boundary
    may round the other way before the gate: gates then differ from the CPU path's by up to ~1e-4).

    Parameters
    ----------
    x16 : torch.Tensor or None
        float16 ``[T, in_features]``: the rows as f16 (:func:`decode_raw`'s ``x16``; read by cuBLAS only,
        so None on the other paths).
    rows : torch.Tensor
        bfloat16 ``[T, in_features]``, contiguous: the same rows.
    w16 : torch.Tensor
        float16 ``[out_features, in_features]``, contiguous, resident on the device.
    exact : bool
        ``x16`` holds the rows exactly (:func:`f16_exact` of their records: then every product is also
        exact in float32); False keeps cuBLAS off them and the lanes kernel off fused multiply-adds.
    out : torch.Tensor, optional
        float32 ``[T, out_features]``, contiguous.
    path : str, optional
        Force a path (tests and benchmarks); default :func:`projection_path`.

    Raises
    ------
    ArgumentError
        A tensor of another type, dtype, shape, device or layout, or an unknown ``path``, or a Triton path
        its tensors cannot take (:func:`_need_path`) (``out`` untouched).
    """
    _need("rows", rows, torch.bfloat16, (-1, -1), contiguous=False)
    T, K = rows.shape
    dev = rows.device
    if x16 is not None:
        _need("x16", x16, torch.float16, (T, K), dev, contiguous=False)
    _need("w16", w16, torch.float16, (-1, K), dev)
    if out is not None:
        _need("out", out, torch.float32, (T, w16.shape[0]), dev)
    _need_path(path, PROJECTION_PATHS, dev)
    if path == "host" and dev.type != "cpu":
        raise ArgumentError(f"the host projection runs on CPU tensors, got {dev}")
    if out is None:
        out = torch.empty((T, w16.shape[0]), dtype=torch.float32, device=rows.device)
    if T == 0:
        return out
    path = path or projection_path(rows.device, T, exact)
    if x16 is None and path.startswith("f16-cublas"):
        raise ArgumentError(f"the {path} projection multiplies x16, got None")
    if path == "lanes":  # the kernel indexes token t at t * K: a strided view (a batch's layer) is copied
        _project_lanes(rows if rows.is_contiguous() else rows.contiguous(), w16, out, fuse=exact)
    elif path == "host":
        _project_host(rows, w16, out)
    elif path == "f32-blocks":
        _project_f32_blocks(rows, w16, out)
    elif path == "f16-cublas":
        torch.mm(x16, w16.t(), out_dtype=torch.float32, out=out)
    elif path == "f16-cublas-new":
        out.copy_(torch.mm(x16, w16.t(), out_dtype=torch.float32))
    else:  # pragma: no cover - torch < 2.8 on CUDA
        out.copy_(torch.mm(x16, w16.t()))
    return out


# ------------------------------------------------------------------ gated add
def gate_weights(q_w: torch.Tensor, k_w: torch.Tensor) -> torch.Tensor:
    """float64 ``q_w * k_w`` ``[S, W]`` (exact: a product of two float32), kept with the layer's weights."""
    return q_w.to(torch.float64) * k_w.to(torch.float64)


def _gated_add_torch(residual, kv, w64, eps, mask8, gates):
    T, S, W = residual.shape
    h32 = residual.to(torch.float32)
    k32 = kv[:, :S].to(torch.bfloat16).to(torch.float32)
    v32 = kv[:, S].to(torch.bfloat16).to(torch.float32)
    h64, k64 = h32.to(torch.float64), k32.to(torch.float64)
    dot = ((h64 * k64) * w64[None]).sum(dim=2)
    shh = (h64 * h64).sum(dim=2)
    skk = (k64 * k64).sum(dim=2)
    width = float(W)
    scaled = dot * (1.0 / torch.sqrt(shh / width + eps))
    scaled = scaled * (1.0 / torch.sqrt(skk / width + eps))
    scaled = scaled * (1.0 / math.sqrt(width))  # IEEE sqrt, as the Triton kernel's float64 one
    dot = torch.where(dot != 0.0, scaled, dot)
    a = torch.clamp(torch.abs(dot), min=1e-6)
    x = torch.copysign(torch.sqrt(a), dot)
    gate = 1.0 / (1.0 + torch.exp(-x))
    g32 = gate.to(torch.float32)
    prod = g32[:, :, None] * v32[:, None, :]
    new = (h32 + prod).to(torch.bfloat16)
    keep = mask8.to(torch.bool)
    g32 = torch.where(keep[:, None], g32, torch.zeros_like(g32))
    residual.copy_(torch.where(keep[:, None, None], new, residual))
    if gates is not None:
        gates.copy_(g32)


if triton is not None:
    @triton.jit
    def _bf16_bits(x):
        """Round float32 ``x`` to bf16 (nearest even, SPEC §5's rule on the bits): int32 bits of the result
        in the high half.  Integer operations: Triton's interpreter converts to bf16 by truncation."""
        b = x.to(tl.int32, bitcast=True)
        return (b + 0x7FFF + ((b >> 16) & 1)) & -65536

    @triton.jit
    def _bf16_round(x):
        return _bf16_bits(x).to(tl.float32, bitcast=True)

    @triton.jit
    def _gate_kernel(res_ptr, res16_ptr, kv_ptr, w_ptr, mask_ptr, gate_ptr, eps_ptr, S: tl.constexpr,
                     W: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        s = tl.program_id(1).to(tl.int64)
        keep = tl.load(mask_ptr + t)
        eps = tl.load(eps_ptr)
        h_base = res_ptr + (t * S + s) * W
        k_base = kv_ptr + (t * (S + 1) + s) * W
        v_base = kv_ptr + (t * (S + 1) + S) * W
        w_base = w_ptr + s * W
        if keep != 0:
            acc_d = tl.zeros([BLOCK], dtype=tl.float64)
            acc_h = tl.zeros([BLOCK], dtype=tl.float64)
            acc_k = tl.zeros([BLOCK], dtype=tl.float64)
            for i0 in range(0, W, BLOCK):
                i = i0 + tl.arange(0, BLOCK)
                m = i < W
                h = tl.load(h_base + i, mask=m, other=0.0).to(tl.float32).to(tl.float64)
                k = _bf16_round(tl.load(k_base + i, mask=m, other=0.0)).to(tl.float64)
                w = tl.load(w_base + i, mask=m, other=0.0)
                acc_d += (h * k) * w
                acc_h += h * h
                acc_k += k * k
            dot = tl.sum(acc_d, axis=0)
            shh = tl.sum(acc_h, axis=0)
            skk = tl.sum(acc_k, axis=0)
            width = W * 1.0
            scaled = dot * (1.0 / tl.sqrt(shh / width + eps))
            scaled = scaled * (1.0 / tl.sqrt(skk / width + eps))
            scaled = scaled * (1.0 / tl.sqrt(width + 0.0 * dot))
            dot = tl.where(dot != 0.0, scaled, dot)
            a = tl.maximum(tl.abs(dot), 1e-6)
            neg = dot.to(tl.int64, bitcast=True) < 0
            x = tl.where(neg, -tl.sqrt(a), tl.sqrt(a))
            gate = 1.0 / (1.0 + tl.exp(-x))
            g32 = gate.to(tl.float32)
            for i0 in range(0, W, BLOCK):
                i = i0 + tl.arange(0, BLOCK)
                m = i < W
                h = tl.load(h_base + i, mask=m, other=0.0).to(tl.float32)
                v = _bf16_round(tl.load(v_base + i, mask=m, other=0.0))
                prod = g32 * v
                bits = _bf16_bits(h + prod) >> 16  # arithmetic shift: the int16 pattern, sign-extended
                tl.store(res16_ptr + (t * S + s) * W + i, bits.to(tl.int16), mask=m)
            tl.store(gate_ptr + t * S + s, g32)
        else:
            tl.store(gate_ptr + t * S + s, 0.0)


def gated_add(residual: torch.Tensor, kv: torch.Tensor, w64: torch.Tensor, eps: float,
              mask8: Optional[torch.Tensor] = None, gates: Optional[torch.Tensor] = None, *,
              path: Optional[str] = None, eps_t: Optional[torch.Tensor] = None) -> None:
    """Add the value into every residual stream through its gate, in place (SPEC §7; shapes checked, values trusted).

    Parameters
    ----------
    residual : torch.Tensor
        bfloat16 ``[T, S, W]``, contiguous: updated in place (masked tokens untouched).
    kv : torch.Tensor
        float32 ``[T, S + 1, W]``, contiguous: keys then value (:func:`project`).
    w64 : torch.Tensor
        float64 ``[S, W]``: :func:`gate_weights` of the layer.
    eps : float
        The gate epsilon.
    eps_t : torch.Tensor, optional
        float64 ``[1]`` on the device holding ``eps`` (the Triton kernel reads it there, so that
        a captured graph holds no host value); made from ``eps`` when omitted.
    mask8 : torch.Tensor, optional
        uint8 ``[T]`` (1 keeps the token); default all kept.
    gates : torch.Tensor, optional
        float32 ``[T, S]``: receives the gates (0 at masked tokens).
    path : {"triton", "torch"}, optional
        Force an implementation; default :func:`kernel_path` of the device.

    Raises
    ------
    ArgumentError
        A tensor of another type, dtype, shape, device or layout, or an unknown ``path``, or a Triton
        path its tensors cannot take (:func:`_need_path`) (``residual`` and ``gates`` are then untouched; the values themselves are trusted).
    """
    _need("residual", residual, torch.bfloat16, (-1, -1, -1))
    T, S, W = residual.shape
    dev = residual.device
    _need("kv", kv, torch.float32, (T, S + 1, W), dev)
    _need("w64", w64, torch.float64, (S, W), dev)
    if mask8 is not None:
        _need("mask8", mask8, torch.uint8, (T,), dev)
    if gates is not None:
        _need("gates", gates, torch.float32, (T, S), dev)
    if eps_t is not None:
        _need("eps_t", eps_t, torch.float64, (1,), dev)
    _need_path(path, ("triton", "torch"), residual.device)
    if T == 0:
        return
    dev = residual.device
    if mask8 is None:
        mask8 = torch.ones(T, dtype=torch.uint8, device=dev)
    path = path or kernel_path(dev)
    if path == "triton":
        g = gates if gates is not None else torch.empty((T, S), dtype=torch.float32, device=dev)
        if eps_t is None:
            eps_t = torch.full((1,), float(eps), dtype=torch.float64, device=dev)
        with _launching():
            _gate_kernel[(T, S)](residual, residual.view(torch.int16), kv, w64, mask8, g, eps_t, S=S, W=W,
                                 BLOCK=GATE_BLOCK, num_warps=GATE_WARPS, enable_fp_fusion=False)
    else:
        _gated_add_torch(residual, kv, w64, float(eps), mask8, gates)
