"""Pure NumPy twins of the Cython kernels, written straight from SPEC.md.

They are slow on purpose: one obvious formulation per rule, used by the tests as
the reference the kernels must match bit for bit.
"""

from __future__ import annotations

import numpy as np

DEAD = -1


def hash_reference(layout, compressed, mask=None, tail=(DEAD, DEAD, DEAD)):
    """SPEC §4 with Python ints: returns (uint32 [T, L, C], new tail tuple)."""
    N = layout.max_ngram
    tail = list(tail)
    T = len(compressed)
    out = np.zeros((T, layout.layers, layout.columns), dtype=np.uint32)
    for t in range(T):
        cur = int(compressed[t])
        if mask is not None and not mask[t]:
            cur = DEAD
        ids = [cur] + tail[: N - 1]
        dead = False
        for k in range(N):
            if dead or ids[k] < 0:
                dead = True
                ids[k] = layout.pad_id
        for li in range(layout.layers):
            m = [int(x) for x in layout.multipliers[li]]
            h = ids[0] * m[0]
            for k in range(1, N):
                h ^= ids[k] * m[k]
                assert 0 <= h < 2**64
                for head in range(layout.heads):
                    c = (k - 1) * layout.heads + head
                    out[t, li, c] = h % int(layout.primes[li, c]) + int(layout.offsets[li, c])
        tail = [cur] + tail[: N - 2]
    return out, tuple(tail)


def hash_official_numpy(layout, compressed):
    """The published NumPy formulation: shift the id array per lookback, multiply-xor,
    ``%`` per head (as DeepSeek's Engram demo computes it), for a fresh sequence.

    Returns uint32 [T, L, C] global row ids (offsets added).
    """
    x = np.asarray(compressed, dtype=np.int64)
    T = x.shape[0]
    N = layout.max_ngram
    pad = layout.pad_id
    shifts = [x]
    for k in range(1, N):
        shifts.append(np.pad(x, (k, 0), mode="constant", constant_values=pad)[:T])
    out = []
    for li in range(layout.layers):
        m = layout.multipliers[li].astype(np.int64)
        cols = []
        for n in range(2, N + 1):
            mix = shifts[0] * m[0]
            for k in range(1, n):
                mix = np.bitwise_xor(mix, shifts[k] * m[k])
            for head in range(layout.heads):
                c = (n - 2) * layout.heads + head
                cols.append(mix % np.int64(layout.primes[li, c]) + np.int64(layout.offsets[li, c]))
        out.append(np.stack(cols, axis=1))
    return np.stack(out, axis=1).astype(np.uint32)


# --------------------------------------------------------------------------- row codec (SPEC §5)

def e4m3_reference(codes):
    """E4M3 (float8_e4m3fn) codes -> float32 from the bit fields; NaN for ``code & 127 == 127``."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 15
    m = c & 7
    mag = np.where(e > 0, (1.0 + m / 8.0) * np.exp2(e - 7.0), m / 512.0)  # exact in float64
    val = (sign * mag).astype(np.float32)
    return np.where((c & 127) == 127, np.float32(np.nan), val).astype(np.float32)


def bf16_bits_round_reference(values):
    """float32 -> float32 holding bf16: ``(bits + 0x7FFF + ((bits >> 16) & 1))``, keep the high 16 bits."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
    return r.astype(np.uint32).view(np.float32)


def decode_rows_reference(raw):
    """SPEC §5 decode, literally: returns (float32 [n, 256] values, bool [n, 256] bad).

    ``e4m3 * 2^(s-127)`` with ``numpy.ldexp`` in float32 (as ``ldexpf``), then the
    bf16 rounding on the float32 bits.  ``bad`` marks NaN codes, the NaN scale 255
    and non-finite results (values there are meaningless).
    """
    raw = np.asarray(raw).view(np.uint8).reshape(-1, 264)
    codes = raw[:, :256]
    s = np.repeat(raw[:, 256:].astype(np.int32), 32, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        prod = np.ldexp(e4m3_reference(codes), s - 127)
        assert prod.dtype == np.float32
        vals = bf16_bits_round_reference(prod)
    bad = ((codes & 127) == 127) | (s == 255) | ~np.isfinite(vals)
    return vals, bad


def encode_rows_reference(x):
    """SPEC §5 encode with ml_dtypes: returns (uint8 [n, 264] rows, float32 [n, 256] decoded).

    The scale of a block is found by searching the table ``448 * 2^(s-127)``
    (float64, exact) for the first entry ``>= amax``; values ``x / 2^(s-127)``
    (float64, exact) go through ``ml_dtypes.float8_e4m3fn``; the decoded values
    are ``float8_e4m3fn * float8_e8m0fnu`` in float32 rounded by ``ml_dtypes.bfloat16``.
    """
    import ml_dtypes

    x = np.asarray(x, dtype=np.float32)
    n = x.shape[0]
    xb = x.astype(np.float64).reshape(n, 8, 32)
    amax = np.abs(xb).max(axis=2)
    limits = 448.0 * np.exp2(np.arange(255, dtype=np.float64) - 127.0)
    s = np.searchsorted(limits, amax, side="left").astype(np.uint8)
    q = (xb / np.exp2(s.astype(np.float64) - 127.0)[:, :, None]).astype(ml_dtypes.float8_e4m3fn)
    rows = np.empty((n, 264), dtype=np.uint8)
    rows[:, :256] = q.reshape(n, 256).view(np.uint8)
    rows[:, 256:] = s
    scale = s.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    dec = (q.astype(np.float32) * scale[:, :, None]).astype(ml_dtypes.bfloat16).astype(np.float32)
    return rows, dec.reshape(n, 256)
