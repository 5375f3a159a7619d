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
