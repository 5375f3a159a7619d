"""Row codec: ``decode_rows`` GB/s (of raw 264-byte rows) vs the ml_dtypes NumPy decode.

Rows are realistic: float32 values drawn per row with magnitudes spread over a
few octaves (as learned embeddings are), encoded with ``encode_rows``.  The
peer is the vectorized NumPy formulation with ``ml_dtypes``: the codes viewed as
``float8_e4m3fn`` cast to float32, multiplied by the ``float8_e8m0fnu`` scales
as float32, rounded through ``bfloat16`` and cast back to float32.  Both give
the same bits (checked before timing).  Reported: the engine with a
preallocated ``out`` (the reader's usage; default threads, and one thread),
allocating a fresh output per call, each decode path on one thread, and the
latency of one decode step (48 rows).
"""

from __future__ import annotations

import argparse
import timeit

import ml_dtypes
import numpy as np

from .common import time_best


def numpy_decode(raw: np.ndarray) -> np.ndarray:
    """The ml_dtypes-vectorized NumPy decode (the peer): uint8 [n, 264] -> float32 [n, 256]."""
    n = raw.shape[0]
    codes = raw[:, :256].view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(n, 8, 32)
    scales = raw[:, 256:].view(ml_dtypes.float8_e8m0fnu).astype(np.float32).reshape(n, 8, 1)
    return (codes * scales).astype(ml_dtypes.bfloat16).astype(np.float32).reshape(n, 256)


def realistic_rows(n: int, seed: int = 0) -> np.ndarray:
    """uint8 [n, 264]: encoded N(0, sigma^2) rows, sigma log-uniform in [2^-10, 2^-2] per row."""
    from engram import encode_rows

    rng = np.random.default_rng(seed)
    sigma = np.exp2(rng.uniform(-10, -2, (n, 1)))
    x = (rng.standard_normal((n, 256)) * sigma).astype(np.float32)
    return encode_rows(x)


def main(argv=None) -> dict:
    from engram import decode_rows
    from engram._native import codec as native

    p = argparse.ArgumentParser(prog="bench_codec")
    p.add_argument("--rows", type=int, default=200_000)
    args = p.parse_args(argv)

    n = args.rows
    raw = realistic_rows(n)
    gb = raw.nbytes / 1e9
    out = np.empty((n, 256), np.float32)
    ref = numpy_decode(raw)
    assert np.array_equal(decode_rows(raw, out).view(np.uint32), ref.view(np.uint32))

    t_numpy = time_best(lambda: numpy_decode(raw), repeat=5)
    t_engine = time_best(lambda: decode_rows(raw, out), repeat=15)
    t_alloc = time_best(lambda: decode_rows(raw), repeat=10)
    threads = native.get_threads()
    prev_threads = native.set_threads(1)
    prev_path = native.get_path()
    per_path = {}
    try:
        t_one = time_best(lambda: decode_rows(raw, out), repeat=15)
        for path in native.paths():
            native.set_path(path)
            per_path[path] = gb / time_best(lambda: decode_rows(raw, out), repeat=10)
    finally:
        native.set_path(prev_path)
        native.set_threads(prev_threads)

    step = raw[:48].copy()
    step_out = np.empty((48, 256), np.float32)
    k = 20_000
    t_step = min(timeit.repeat(lambda: decode_rows(step, step_out), number=k, repeat=5)) / k
    t_step_np = min(timeit.repeat(lambda: numpy_decode(step), number=2_000, repeat=3)) / 2_000

    rec = {
        "rows": n,
        "raw_bytes": int(raw.nbytes),
        "path": prev_path,
        "threads": threads,
        "engine_gb_per_s": gb / t_engine,
        "engine_1thread_gb_per_s": gb / t_one,
        "engine_alloc_gb_per_s": gb / t_alloc,
        "numpy_ml_dtypes_gb_per_s": gb / t_numpy,
        "speedup_vs_numpy": t_numpy / t_engine,
        "speedup_vs_numpy_1thread": t_numpy / t_one,
        "speedup_vs_numpy_alloc": t_numpy / t_alloc,
        "path_1thread_gb_per_s": per_path,
        "step48_us": t_step * 1e6,
        "step48_numpy_us": t_step_np * 1e6,
    }
    print(f"   decode {rec['engine_gb_per_s']:7.2f} GB/s ({threads} threads, {prev_path}, preallocated out)"
          f"   numpy+ml_dtypes {rec['numpy_ml_dtypes_gb_per_s']:.3f} GB/s   ratio {rec['speedup_vs_numpy']:.1f}x")
    print(f"          {rec['engine_1thread_gb_per_s']:7.2f} GB/s on 1 thread (ratio {rec['speedup_vs_numpy_1thread']:.1f}x),"
          f" {rec['engine_alloc_gb_per_s']:.2f} GB/s allocating out (ratio {rec['speedup_vs_numpy_alloc']:.1f}x)")
    print("   paths (1 thread): " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in per_path.items()))
    print(f"   step   {rec['step48_us']:.2f} us for 48 rows from Python (numpy+ml_dtypes {rec['step48_numpy_us']:.1f} us)")
    return rec
