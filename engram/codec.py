"""The row codec ``e4m3_e8m0_32_row264`` (SPEC §5): decode, encode, bf16 rounding.

A row is 264 bytes: 256 E4M3 codes (``float8_e4m3fn``) then 8 E8M0 scale bytes
(``float8_e8m0fnu``), one per block of 32 values.  Value ``j`` is
``e4m3(raw[j]) * 2^(raw[256 + j // 32] - 127)`` computed exactly in float32 and
rounded to bfloat16 (round to nearest even on the float32 bits); decoded rows
are float32 arrays holding those bf16 values.

:func:`decode_rows` is the engine's hot path (Cython, ``engram/_native/codec.pyx``,
with AVX2/AVX-512 paths chosen at run time); :func:`encode_rows` builds tables
with NumPy and ``ml_dtypes``.
"""

from __future__ import annotations

from typing import Optional

import ml_dtypes
import numpy as np

from ._checks import need_contiguous, need_output, no_overlap, shape_str
from ._native import codec as _native
from .errors import ArgumentError, DecodeError

__all__ = [
    "ENCODING", "ROW_BYTES", "ROW_VALUES", "BLOCK", "ZERO_BLOCK_SCALE", "ENCODE_LIMIT",
    "decode_rows", "encode_rows", "bf16_round", "decode_path",
]

#: Name of the encoding in GGUF metadata (``deepseek41.engram.encoding``, SPEC §6).
ENCODING = "e4m3_e8m0_32_row264"
#: Bytes of one encoded row.
ROW_BYTES = 264
#: Values of one row.
ROW_VALUES = 256
#: Values sharing one scale byte.
BLOCK = 32
#: Scale byte :func:`encode_rows` gives a block of zeros: 0, the smallest scale, as the
#: SPEC §5 rule "smallest s with amax / 2^(s-127) <= 448" yields for amax = 0.
ZERO_BLOCK_SCALE = 0

#: Magnitudes from this one up (248 * 2^120, about 3.2965e38) round to 2^128 at the largest
#: scale and cannot be encoded; :func:`encode_rows` refuses them.
ENCODE_LIMIT = float(248 * 2.0**120)
_ENCODE_CHUNK = 1 << 15  # rows per chunk of encode_rows (bounds temporaries to ~100 MB)


def decode_path() -> str:
    """Name of the decode path in use: ``"avx512"``, ``"avx2"`` or ``"portable"``."""
    return _native.get_path()


def _describe_bad(raw_u8: np.ndarray, row: int, col: int, row_id: Optional[int] = None) -> str:
    code = int(raw_u8[row, col])
    block = col // BLOCK
    s = int(raw_u8[row, ROW_VALUES + block])
    name = f"row {row}" if row_id is None else f"row id {row_id} (record {row})"
    where = f"{name} column {col} (code byte 0x{code:02x}, scale byte {s} of block {block})"
    if code & 0x7F == 0x7F:
        why = "the code is an E4M3 NaN"
    elif s == 255:
        why = "the scale byte 255 is an E8M0 NaN"
    else:
        e4m3 = float(np.uint8(code).view(ml_dtypes.float8_e4m3fn))
        why = f"{e4m3:g} * 2^{s - 127} is not finite in float32"
    return f"cannot decode {where}: {why} (SPEC §5)"


def _row_ids(row_ids, n: int) -> np.ndarray:
    ids = np.asarray(row_ids)
    if ids.shape != (n,) or (n and ids.dtype.kind not in "iu"):
        raise ArgumentError(f"row_ids must be integers of shape [{n}] (one row id a record), got {ids.dtype} "
                            f"with shape {shape_str(ids)}")
    return ids


def decode_rows(raw: np.ndarray, out: Optional[np.ndarray] = None, *, row_ids=None) -> np.ndarray:
    """Decode encoded rows to float32 holding bfloat16 values (SPEC §5).

    This is also the entry for rows that come from elsewhere: raw 264-byte
    records read on another machine (a storage node of a disaggregated serving
    stack) and sent with the row ids they came from.  Decoding them gives
    exactly what :meth:`engram.Session.step` returns for those row ids (the same
    kernel); pass ``row_ids`` so that an error names the row id.

    Parameters
    ----------
    raw : numpy.ndarray
        uint8 or int8 ``[n, 264]``, C-contiguous (e.g. rows read from a table, a
        buffer received from the network viewed as ``numpy.frombuffer(buf,
        numpy.uint8).reshape(-1, 264)``, or a slice of the GGUF tensor's I8
        data).  ``n`` may be 0.
    out : numpy.ndarray, optional
        float32 ``[n, 256]``, C-contiguous, writable, not overlapping ``raw``.
        Passing it makes the call allocation-free.
    row_ids : array_like of int, shape ``[n]``, optional
        The table row id of each record (uint32 row ids as :meth:`engram.Hasher.step`
        gives them); used only in error messages and ``DecodeError.row``.

    Returns
    -------
    numpy.ndarray
        ``out`` (or a new float32 ``[n, 256]`` array).

    Raises
    ------
    ArgumentError
        ``raw`` is not a 2-D C-contiguous uint8/int8 array with 264 columns (a
        single row must be passed as ``row.reshape(1, 264)``); ``out`` has the
        wrong dtype, shape or memory layout; ``row_ids`` is not ``n`` integers.
    DecodeError
        A value is a NaN code (``code & 0x7F == 0x7F``), uses the NaN scale byte
        255, or is not finite (``e4m3 * 2^(s-127) >= 2^128``).  The first such
        value in row-major order is named: ``row`` is its record index (or its
        row id when ``row_ids`` is given), ``column`` its column, and the message
        gives its code and scale bytes.  All rows are checked before any value
        is written: ``out`` is untouched on error.
    """
    if not isinstance(raw, np.ndarray):
        raise ArgumentError(f"raw must be a numpy uint8 array [n, {ROW_BYTES}], got {type(raw).__name__}")
    if raw.dtype not in (np.uint8, np.int8):
        raise ArgumentError(f"raw must have dtype uint8 or int8, got {raw.dtype}")
    if raw.ndim != 2 or raw.shape[1] != ROW_BYTES:
        hint = f"; pass one row as row.reshape(1, {ROW_BYTES})" if raw.ndim == 1 else ""
        raise ArgumentError(f"raw must have shape [n, {ROW_BYTES}], got {shape_str(raw)}{hint}")
    need_contiguous("raw", raw, " (use numpy.ascontiguousarray)")
    n = raw.shape[0]
    ids = None if row_ids is None else _row_ids(row_ids, n)
    if out is None:
        out = np.empty((n, ROW_VALUES), dtype=np.float32)
    else:
        if not isinstance(out, np.ndarray):
            raise ArgumentError(f"out must be a numpy float32 array [{n}, {ROW_VALUES}], got {type(out).__name__}")
        if out.dtype != np.float32 or out.shape != (n, ROW_VALUES):
            raise ArgumentError(f"out must be float32 [{n}, {ROW_VALUES}], got {out.dtype} {shape_str(out)}")
        need_output("out", out)
        no_overlap("out", out, raw=raw)
    if n == 0:
        return out
    raw_u8 = raw.view(np.uint8)
    row = _native.find_bad_row(raw_u8)
    if row >= 0:
        col = _native.first_bad_column(raw_u8[row])
        rid = None if ids is None else int(ids[row])
        raise DecodeError(_describe_bad(raw_u8, row, col, rid), row=row if rid is None else rid, column=col)
    _native.decode_rows_into(raw_u8, out)
    return out


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even), returned as float32.

    Parameters
    ----------
    x : array_like
        Values, converted to float32 first.

    Returns
    -------
    numpy.ndarray
        float32 array of ``x``'s shape whose values are exactly representable in
        bfloat16 (NaN and infinities kept).  Uses ``ml_dtypes.bfloat16``.
    """
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _block_scales(amax: np.ndarray) -> np.ndarray:
    """Smallest E8M0 byte ``s`` with ``amax / 2^(s-127) <= 448`` (``amax`` finite, >= 0).

    With ``amax = m * 2^e`` (``0.5 <= m < 1``) and ``448 = 0.875 * 2^9``:
    ``amax <= 448 * 2^k`` iff ``k >= e - 9`` when ``m <= 0.875``, else ``k >= e - 8``.
    Exact (no logarithms); 0 for ``amax = 0``.
    """
    m, e = np.frexp(amax)
    k = e.astype(np.int32) - 9 + (m > 0.875)
    s = np.clip(k + 127, 0, 254)
    s[amax == 0] = ZERO_BLOCK_SCALE
    return s.astype(np.uint8)


def encode_rows(x: np.ndarray) -> np.ndarray:
    """Encode float32 values as rows of ``e4m3_e8m0_32_row264`` (SPEC §5).

    Per block of 32 values the scale byte is the smallest ``s >= 0``
    with ``amax / 2^(s-127) <= 448`` (``amax`` = largest ``|x|`` of the block;
    a block of zeros gets :data:`ZERO_BLOCK_SCALE` = 0), then each
    ``x / 2^(s-127)`` (exact) is rounded to E4M3 with round-to-nearest-even by
    ``ml_dtypes.float8_e4m3fn``; it never exceeds 448, so nothing saturates.
    ``decode_rows(encode_rows(x))`` is the bf16 rounding of that quantization.
    Values with ``|x| >= ENCODE_LIMIT`` (248 * 2^120, near the float32 maximum)
    would round to 2^128, which decodes to infinity, so they are refused.

    Parameters
    ----------
    x : numpy.ndarray
        float32 ``[n, 256]`` (any memory layout), all values finite.

    Returns
    -------
    numpy.ndarray
        uint8 ``[n, 264]``, C-contiguous.

    Raises
    ------
    ArgumentError
        ``x`` is not a float32 ``[n, 256]`` array, or holds a NaN, an infinity or
        a magnitude ``>= ENCODE_LIMIT`` (the message names the first such row and
        column).
    """
    if not isinstance(x, np.ndarray):
        raise ArgumentError(f"x must be a numpy float32 array [n, {ROW_VALUES}], got {type(x).__name__}")
    if x.dtype != np.float32:
        raise ArgumentError(f"x must have dtype float32, got {x.dtype} (convert with x.astype(numpy.float32))")
    if x.ndim != 2 or x.shape[1] != ROW_VALUES:
        raise ArgumentError(f"x must have shape [n, {ROW_VALUES}], got {x.shape}")
    n = x.shape[0]
    out = np.empty((n, ROW_BYTES), dtype=np.uint8)
    for lo in range(0, n, _ENCODE_CHUNK):
        hi = min(n, lo + _ENCODE_CHUNK)
        xc = np.ascontiguousarray(x[lo:hi])
        finite = np.isfinite(xc)
        if not finite.all():
            r, c = np.argwhere(~finite)[0]
            raise ArgumentError(
                f"x[{lo + r}, {c}] = {xc[r, c]} is not finite; only finite values can be encoded")
        xb = xc.reshape(hi - lo, ROW_VALUES // BLOCK, BLOCK)
        s = _block_scales(np.abs(xb).max(axis=2))
        # s <= 247 since amax < 2^128, so 2^(127-s) is a normal float32; the product is exact
        # (or a float32 subnormal far below half the smallest E4M3 step, which
        # rounds to a signed zero either way).
        inv = ((254 - s.astype(np.uint32)) << 23).view(np.float32)
        q = (xb * inv[:, :, None]).astype(ml_dtypes.float8_e4m3fn)
        out[lo:hi, :ROW_VALUES] = q.reshape(hi - lo, ROW_VALUES).view(np.uint8)
        out[lo:hi, ROW_VALUES:] = s
        bad = _native.find_bad_row(out[lo:hi])
        if bad >= 0:
            c = _native.first_bad_column(out[lo + bad])
            raise ArgumentError(
                f"x[{lo + bad}, {c}] = {xc[bad, c]} rounds to 2^128 in E4M3 * E8M0 and would decode to "
                f"infinity; magnitudes must stay below {ENCODE_LIMIT:.6g} (248 * 2^120)")
    return out
