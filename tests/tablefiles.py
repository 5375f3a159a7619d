"""Small table files for the storage tests: encoded rows at a chosen byte offset (sparse before it)."""

from __future__ import annotations

import os

import numpy as np

from engram.codec import encode_rows


def rows_raw(n: int, seed: int = 0) -> np.ndarray:
    """uint8 [n, 264]: encoded rows of normal values with varied per-block magnitudes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 256)).astype(np.float32)
    x *= (2.0 ** rng.integers(-12, 4, size=(n, 8))).repeat(32, axis=1).astype(np.float32)
    return encode_rows(x)


def write_table(path, raw: np.ndarray, offset: int, tail: int = 100) -> None:
    """Write ``raw`` at ``offset`` (a hole before it) plus ``tail`` bytes after, and drop it from the cache."""
    with open(path, "wb") as f:
        f.truncate(offset)
        f.seek(offset)
        f.write(raw.tobytes())
        f.write(b"\x00" * tail)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
