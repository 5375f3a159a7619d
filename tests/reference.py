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


# --------------------------------------------------------------------------- gated add (SPEC §7)

GATE_LANES = 16  # partial sums of the kernel's float64 reductions (engram/_native/gate.pyx)


def bf16_round_nan_reference(values):
    """The SPEC §5 bf16 rounding on the float32 bits, NaN kept a quiet NaN (the gate kernel's rule)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, bits | 0x00400000, bits + 0x7FFF + ((bits >> 16) & 1))
    return ((r & 0xFFFF0000) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def lane_sum_reference(terms, lanes=GATE_LANES):
    """float64 sum over the last axis as the kernel does it: element ``i`` into partial
    sum ``i % lanes`` in increasing ``i``, then ``p[j] += p[j + n]`` for n = lanes/2 .. 1."""
    terms = np.asarray(terms, dtype=np.float64)
    W = terms.shape[-1]
    acc = np.zeros(terms.shape[:-1] + (lanes,), dtype=np.float64)
    full = W // lanes * lanes
    for i0 in range(0, full, lanes):
        acc += terms[..., i0:i0 + lanes]
    acc[..., : W - full] += terms[..., full:]
    n = lanes // 2
    while n:
        acc = acc[..., :n] + acc[..., n:2 * n]
        n //= 2
    return acc[..., 0]


def _c_exp(y):
    """C ``exp`` through ``math.exp`` (the same library call), with overflow giving inf as in C."""
    import math

    try:
        return math.exp(y)
    except OverflowError:
        return math.inf


def gated_add_twin(residual, kv, q_w, k_w, eps, mask=None):
    """SPEC §7 gated add with the kernel's documented precision, bit for bit.

    float64 lane sums of ``(h*k)*(q_w*k_w)``, ``h^2``, ``k^2``; the gate in float64
    (``math.sqrt``/``math.exp``: the C library's, as the kernel calls them); then
    ``bf16(h + float32(gate) * v)`` in float32.  Returns (new residual float32
    [T, S, W], gates float32 [T, S] with 0 at masked tokens); inputs untouched.
    """
    h = np.array(residual, dtype=np.float32)
    kv = np.asarray(kv, dtype=np.float32)
    T, S, W = h.shape
    k = bf16_round_nan_reference(kv[:, :S])
    v = bf16_round_nan_reference(kv[:, S])
    h64 = h.astype(np.float64)
    k64 = k.astype(np.float64)
    w = np.asarray(q_w, dtype=np.float32).astype(np.float64) * np.asarray(k_w, dtype=np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        dot = lane_sum_reference((h64 * k64) * w[None])
        shh = lane_sum_reference(h64 * h64)
        skk = lane_sum_reference(k64 * k64)
        width = float(W)
        scaled = dot * (1.0 / np.sqrt(shh / width + eps))
        scaled = scaled * (1.0 / np.sqrt(skk / width + eps))
        scaled = scaled * (1.0 / np.sqrt(width))
        dot = np.where(dot != 0.0, scaled, dot)
        a = np.abs(dot)
        a = np.where(a < 1e-6, 1e-6, a)
        x = np.copysign(np.sqrt(a), dot)
        gate = np.array([1.0 / (1.0 + _c_exp(-xi)) for xi in x.ravel()], dtype=np.float64).reshape(x.shape)
        g32 = gate.astype(np.float32)
        out = bf16_round_nan_reference(h + g32[:, :, None] * v[:, None, :])
    if mask is not None:
        keep = ~np.asarray(mask, dtype=bool)
        out[keep] = h[keep]
        g32[keep] = 0.0
    return out, g32


def bf16_round_float64_reference(x):
    """float64 -> nearest bfloat16 value (ties to even), exactly (no float32 step), as float64.

    Quantum ``2^(max(e, -125) - 8)`` for ``x = m 2^e`` (``0.5 <= |m| < 1``); values that
    round to ``2^128`` or beyond become infinities; NaN stays NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        _, e = np.frexp(x)
        q = np.ldexp(1.0, np.maximum(e, -125) - 8)
        r = np.rint(x / q) * q
        r = np.where(np.abs(r) >= 2.0**128, np.copysign(np.inf, x), r)
        return np.where(np.isfinite(x), r, x)


def gated_add_float64(residual, kv, q_w, k_w, eps, mask=None):
    """SPEC §7 read literally, everything in float64 (NumPy's own sums and means).

    Returns (exact result float64 [T, S, W] before the final rounding, gates float64
    [T, S]); k and v are the bf16 roundings of the keys and value.  Masked tokens keep
    ``h`` and gate 0.
    """
    h = np.asarray(residual, dtype=np.float32).astype(np.float64)
    kv = np.asarray(kv, dtype=np.float32)
    S = h.shape[1]
    k = bf16_round_nan_reference(kv[:, :S]).astype(np.float64)
    v = bf16_round_nan_reference(kv[:, S]).astype(np.float64)
    w = np.asarray(q_w, dtype=np.float64) * np.asarray(k_w, dtype=np.float64)
    W = h.shape[2]
    with np.errstate(all="ignore"):
        dot = np.einsum("tsi,si,tsi->ts", h, w, k)
        dot = dot / np.sqrt(np.mean(h * h, axis=2) + eps) / np.sqrt(np.mean(k * k, axis=2) + eps) / np.sqrt(W)
        gate = 1.0 / (1.0 + np.exp(-np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)), dot)))
        out = h + gate[:, :, None] * v[:, None, :]
    if mask is not None:
        keep = ~np.asarray(mask, dtype=bool)
        out[keep] = h[keep]
        gate[keep] = 0.0
    return out, gate


def first_non_finite_twin(a, mask=None):
    """Index of the first NaN or infinity of ``a`` in C order (tokens with a false ``mask`` skipped), or None.

    A plain loop over every index with :func:`math.isfinite`: the reference of the
    finiteness check of ``gated_add`` and ``Session.apply``.
    """
    import math

    a = np.asarray(a)
    for idx in np.ndindex(*a.shape):
        if mask is not None and not mask[idx[0]]:
            continue
        if not math.isfinite(float(a[idx])):
            return tuple(int(i) for i in idx)
    return None
