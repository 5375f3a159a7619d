"""Consumer of one Engram layer (SPEC §7): ``gated_add`` vs NumPy, ``project`` vs ``numpy.matmul``.

``gated_add`` (Cython, nogil) is timed side by side with its bit-exact NumPy twin
(tests/reference.py::gated_add_twin, the same precision contract) and with SPEC §7
written plainly in float64 NumPy (``gated_add_float64`` plus the bf16 rounding),
for T = 1 (a decode step), 64 and 2048 tokens of V4.1 Flash shapes (4 streams x 5120).

Wall time is what a caller sees; CPU time of the calling thread (one-thread
runs) is also reported, as it moves little when other processes share the cores.

``project`` is one BLAS sgemm into the caller's buffer; its GFLOP/s (2 T 6144 25600
flops a call) are compared with a plain ``numpy.matmul`` of the same operands for
T = 64 and 2048.  Both run on the BLAS numpy loads, in this process and environment
(reported: threadpoolctl's view of it when installed, and OPENBLAS_CORETYPE /
OPENBLAS_L2_SIZE if set).  Rounds are interleaved and the best of each side kept.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from .common import time_best


S, W, COLUMNS, WIDTH = 4, 5120, 24, 256


def cpu_best(fn, repeat: int = 5, number: int = 1) -> float:
    """Best CPU time of the calling thread per call (seconds): for one-thread code it is
    hardly moved by other processes sharing the cores, unlike wall time."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(number):
            fn()
        best = min(best, (time.thread_time() - t0) / number)
    return best


def blas_info() -> dict:
    info = {"env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                                "OMP_NUM_THREADS") if k in os.environ}}
    try:
        from threadpoolctl import threadpool_info

        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        info["blas"] = [{k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                               "threading_layer")} for p in pools]
    except ImportError:
        cfg = getattr(np, "__config__", None)
        blas = getattr(cfg, "CONFIG", {}).get("Build Dependencies", {}).get("blas", {}) if cfg else {}
        info["blas"] = [{"name": blas.get("name"), "version": blas.get("version"),
                         "note": "threadpoolctl not installed: kernel and threads unknown"}]
    return info


def layer_inputs(rng, T):
    from tests.reference import bf16_round_nan_reference

    h = bf16_round_nan_reference(rng.standard_normal((T, S, W), dtype=np.float32))
    kv = rng.standard_normal((T, S + 1, W), dtype=np.float32)
    kv[:, :S] += h * rng.uniform(-2, 2, (T, S, 1)).astype(np.float32)
    q_w = (1 + 0.1 * rng.standard_normal((S, W))).astype(np.float32)
    k_w = (1 + 0.1 * rng.standard_normal((S, W))).astype(np.float32)
    return h, kv, q_w, k_w


def bench_gate(rng, tokens, rounds):
    from tests.reference import bf16_round_float64_reference, gated_add_float64, gated_add_twin

    from engram import gated_add
    from engram._native import gate as native

    eps = 1e-6
    out = []
    for T in tokens:
        h, kv, q_w, k_w = layer_inputs(rng, T)
        res = h.copy()
        gates = np.empty((T, S), np.float32)
        # correctness of what is timed: one call against the twin
        twin, twin_g = gated_add_twin(h, kv, q_w, k_w, eps)
        gated_add(res, kv, q_w, k_w, eps, gates_out=gates)
        assert np.array_equal(res.view(np.uint32), twin.view(np.uint32)) and np.array_equal(gates, twin_g)

        def engine():  # on a copy each time would time the copy too: the residual just keeps moving
            gated_add(res, kv, q_w, k_w, eps, gates_out=gates)

        def plain64():
            e, _ = gated_add_float64(h, kv, q_w, k_w, eps)
            return bf16_round_float64_reference(e)

        number = max(1, 4096 // T)
        t_eng = t_par = t_twin = t_f64 = c_one = c_twin = float("inf")
        prev = native.get_threads()
        cores = max(1, min(os.cpu_count() or 1, 8))
        slow = 1 if T >= 512 else 3
        for _ in range(rounds):
            native.set_threads(1)
            t_eng = min(t_eng, time_best(engine, repeat=5, number=number))
            c_one = min(c_one, cpu_best(engine, repeat=5, number=number))
            native.set_threads(cores)
            t_par = min(t_par, time_best(engine, repeat=5, number=number))
            native.set_threads(prev)
            t_twin = min(t_twin, time_best(lambda: gated_add_twin(h, kv, q_w, k_w, eps), repeat=slow))
            c_twin = min(c_twin, cpu_best(lambda: gated_add_twin(h, kv, q_w, k_w, eps), repeat=slow))
            t_f64 = min(t_f64, time_best(plain64, repeat=slow))
        rec = {"tokens": T, "engine_tokens_per_s": T / t_eng, "engine_threads": 1,
               f"engine_{cores}_threads_tokens_per_s": T / t_par,
               "twin_tokens_per_s": T / t_twin, "numpy_f64_tokens_per_s": T / t_f64,
               "speedup_vs_twin": t_twin / t_eng, "speedup_vs_numpy_f64": t_f64 / t_eng,
               "engine_us_per_call": t_eng * 1e6,
               "cpu_time_engine_one_thread_tokens_per_s": T / c_one, "cpu_time_twin_tokens_per_s": T / c_twin,
               "cpu_time_speedup_vs_twin_one_thread": c_twin / c_one}
        print(f"   gated_add T={T:5d}  engine {rec['engine_tokens_per_s']:10.0f} tok/s "
              f"({cores} threads {T / t_par:9.0f})   twin {rec['twin_tokens_per_s']:8.0f} tok/s"
              f"   x{rec['speedup_vs_twin']:6.1f} vs twin   x{rec['speedup_vs_numpy_f64']:5.1f} vs float64 NumPy")
        print(f"                     CPU time, one thread: engine {rec['cpu_time_engine_one_thread_tokens_per_s']:9.0f}"
              f" tok/s   twin {rec['cpu_time_twin_tokens_per_s']:8.0f} tok/s"
              f"   x{rec['cpu_time_speedup_vs_twin_one_thread']:6.1f}")
        out.append(rec)
    return out


def bench_project(rng, tokens, rounds):
    from engram import decode_rows, encode_rows, kv_weights, project

    # 6400 random F16 rows (|w| < 2), each of the 25600 output rows one of them
    bits = rng.integers(0, 1 << 16, size=(6400, COLUMNS * WIDTH), dtype=np.uint16) & np.uint16(0xBFFF)
    w32 = kv_weights(bits.view(np.float16)[rng.integers(0, 6400, 5 * W)])
    n_in = COLUMNS * WIDTH
    out = []
    for T in tokens:
        x = (rng.standard_normal((T * COLUMNS, WIDTH)) * 0.05).astype(np.float32)
        rows = decode_rows(encode_rows(x)).reshape(T, COLUMNS, WIDTH)
        buf = np.empty((T, 5, W), np.float32)
        project(rows, w32, out=buf)
        assert np.array_equal(buf.reshape(T, -1), np.matmul(rows.reshape(T, n_in), w32.T))
        flops = 2.0 * T * n_in * 5 * W
        number = max(1, 256 // T)
        repeat = 3 if T < 512 else 2
        t_p = t_m = float("inf")
        for _ in range(rounds):
            t_p = min(t_p, time_best(lambda: project(rows, w32, out=buf), repeat=repeat, number=number))
            t_m = min(t_m, time_best(lambda: np.matmul(rows.reshape(T, n_in), w32.T), repeat=repeat, number=number))
        rec = {"tokens": T, "project_gflops": flops / t_p / 1e9, "matmul_gflops": flops / t_m / 1e9,
               "ratio_vs_matmul": t_m / t_p, "project_ms_per_call": t_p * 1e3}
        print(f"   project   T={T:5d}  {rec['project_gflops']:7.1f} GFLOP/s   numpy.matmul "
              f"{rec['matmul_gflops']:7.1f} GFLOP/s   ratio {rec['ratio_vs_matmul']*100:5.1f}%")
        out.append(rec)
    return out


def main(argv=None) -> dict:
    from engram import mixer
    from engram._native import gate as native

    p = argparse.ArgumentParser(prog="bench_mixer")
    p.add_argument("--gate-tokens", type=int, nargs="+", default=[1, 64, 2048])
    p.add_argument("--project-tokens", type=int, nargs="+", default=[64, 2048])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    env = blas_info()
    print(f"   BLAS: {env['blas']}  env: {env['env'] or 'no OPENBLAS_* variables set'}")
    print(f"   gate path {mixer.gate_path()}, default threads {native.get_threads()}")
    gate = bench_gate(rng, args.gate_tokens, args.rounds)
    proj = bench_project(rng, args.project_tokens, args.rounds)
    return {"gate_path": mixer.gate_path(), "gate_threads": native.get_threads(), **env,
            "gated_add": gate, "project": proj}
