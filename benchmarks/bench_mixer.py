"""Consumer of one Engram layer (SPEC §7): ``gated_add`` vs NumPy, ``project`` vs ``numpy.matmul``.

``gated_add`` (Cython, nogil) is timed side by side with its bit-exact NumPy twin
(tests/reference.py::gated_add_twin, the same precision contract) and with SPEC §7
written plainly in float64 NumPy (``gated_add_float64`` plus the bf16 rounding),
for T = 1 (a decode step), 64 and 2048 tokens of V4.1 Flash shapes (4 streams x 5120).

Wall time is what a caller sees; CPU time of the calling thread (one-thread
runs) is also reported, as it moves little when other processes share the cores.

``project`` with the F16 weights the model keeps (315 MB a layer) is compared, in
rounds, side by side with today's float32 path (``project`` on float32 weights, 629 MB:
one BLAS sgemm) and with the memory: a STREAM-like copy (``numpy.copyto`` of two
1 GiB arrays, on 1 and on all cores, bytes read + written per second as STREAM
counts them) measured in the same run.  For T = 1 (a decode step) the figures are
the speedup over float32 and the F16 kernel's read bandwidth as a share of the
copy's; for T = 2, 4, ... the F16 kernel against float32 blocks + BLAS (the
crossover ``F16_KERNEL_MAX_TOKENS``); for large T the F16 path as a share of
float32 BLAS.  Before timing, each F16 result is checked against float64 within
the float32-accumulation bound.  BLAS is the one numpy loads (reported:
threadpoolctl's view of it when installed, and OPENBLAS_* variables if set).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from .common import time_best


S, W, COLUMNS, WIDTH = 4, 5120, 24, 256
#: Token counts up to which both F16 ways (kernel, blocks + BLAS) are timed, for the crossover.
CROSSOVER_MAX = 256


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


def copy_bandwidth(nbytes: int = 1 << 30, repeat: int = 5) -> dict:
    """STREAM-like copy: best (bytes read + bytes written) / s of ``numpy.copyto``, on 1 thread
    and on every core (one slice per thread; copyto releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(nbytes // 4, np.float32)
    b = np.zeros_like(a)
    n = max(1, os.cpu_count() or 1)
    cuts = [a.shape[0] * i // n for i in range(n + 1)]

    def part(i):
        np.copyto(b[cuts[i]:cuts[i + 1]], a[cuts[i]:cuts[i + 1]])

    with ThreadPoolExecutor(n) as ex:
        one = time_best(lambda: np.copyto(b, a), repeat=repeat)
        every = time_best(lambda: list(ex.map(part, range(n))), repeat=repeat)
    return {"copy_1_thread_GBps": 2 * a.nbytes / one / 1e9, f"copy_{n}_threads_GBps": 2 * a.nbytes / every / 1e9,
            "copy_GBps": 2 * a.nbytes / min(one, every) / 1e9}


def _check_f16(out, rows, w16, cols):
    """F16 results against float64, within n u / (1 - n u) sum |w x| (the documented bound)."""
    T = rows.shape[0]
    x = rows.reshape(T, -1).astype(np.float64)
    w = w16[cols].astype(np.float64)
    ref, mag = x @ w.T, np.abs(x) @ np.abs(w).T
    n = x.shape[1]
    gamma = n * 2.0**-24 / (1 - n * 2.0**-24)
    assert np.all(np.abs(out.reshape(T, -1)[:, cols] - ref) <= gamma * mag)


def _project_cases(rng, tokens):
    """Per token count: bf16 rows (encoded and decoded, as the engine gets them) and an output buffer."""
    from engram import decode_rows, encode_rows

    cases = {}
    for T in tokens:
        x = (rng.standard_normal((T * COLUMNS, WIDTH)) * 0.05).astype(np.float32)
        cases[T] = (decode_rows(encode_rows(x)).reshape(T, COLUMNS, WIDTH), np.empty((T, 5, W), np.float32))
    return cases


def other_cpu_share(interval: float = 1.0) -> float:
    """Share (0..1) of the machine's CPU time that other processes used over ``interval`` seconds
    (``/proc/stat`` busy time minus this process's own; Linux)."""
    def sample():
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
        t = os.times()
        return sum(vals), vals[3] + vals[4], t.user + t.system
    t0, a = time.monotonic(), sample()
    time.sleep(interval)
    b, dt = sample(), time.monotonic() - t0
    busy = ((b[0] - a[0]) - (b[1] - a[1])) / os.sysconf("SC_CLK_TCK") - (b[2] - a[2])
    return max(0.0, busy / (dt * (os.cpu_count() or 1)))


def wait_quiet(threshold: float, max_wait: float) -> float:
    """Wait (at most ``max_wait`` s) for a second in which others use under ``threshold`` of the CPUs;
    returns the last share seen."""
    deadline = time.monotonic() + max_wait
    share = other_cpu_share()
    while share >= threshold and time.monotonic() < deadline:
        share = other_cpu_share()
    return share


def bench_project(rng, tokens, rounds, quiet=0.25, max_wait=20.0):
    """Rounds; in each, per token count: wait for a quiet second (others under ``quiet`` of the CPUs,
    at most ``max_wait`` s), time F16, pause, time float32 (side by side, in the same conditions).

    The pause lets BLAS's worker threads go idle (OpenBLAS spins for a while after a call),
    so neither side runs beside the other's spinning threads.  The best of each side over the
    quiet rounds is kept (over every round if none was quiet, which the output says); the
    copy is measured in each round the same way.
    """
    from engram import kv_weights, mixer, project
    from engram._native import project as native

    # 6400 random F16 rows (|w| < 2), each of the 25600 output rows one of them, as the model keeps them
    bits = rng.integers(0, 1 << 16, size=(6400, COLUMNS * WIDTH), dtype=np.uint16) & np.uint16(0xBFFF)
    w16 = np.ascontiguousarray(bits.view(np.float16)[rng.integers(0, 6400, 5 * W)])
    w32 = kv_weights(w16)
    n_in = COLUMNS * WIDTH
    cols = rng.choice(5 * W, 300, replace=False)
    cases = _project_cases(rng, tokens)
    for T, (rows, buf) in cases.items():
        project(rows, w16, out=buf)
        _check_f16(buf, rows, w16, cols)
    runs = []  # (T or "copy", quiet share, {key: seconds})

    def timed(fn, T):
        number = max(1, 8 // T)
        repeat = 3 if T < 64 else 2 if T < 1024 else 1
        return time_best(fn, repeat=repeat, number=number)

    for _ in range(rounds):
        share = wait_quiet(quiet, max_wait)
        runs.append(("copy", share, copy_bandwidth()))
        for T, (rows, buf) in cases.items():
            x, o2 = rows.reshape(T, n_in), buf.reshape(T, -1)
            share = wait_quiet(quiet, max_wait)
            got = {"f16": timed(lambda: project(rows, w16, out=buf), T)}
            if T <= CROSSOVER_MAX:  # both F16 ways, for the crossover
                got["kernel"] = timed(lambda: native.f16_project_into(w16.view(np.uint16), x, o2), T)
                got["blocks"] = timed(lambda: mixer._project_blas_f16(x, w16, o2), T)
            if T == 1:
                prev = native.set_threads(1)
                got["f16_1_thread"] = timed(lambda: project(rows, w16, out=buf), T)
                native.set_threads(prev)
            time.sleep(0.5)
            got["f32"] = timed(lambda: project(rows, w32, out=buf), T)
            time.sleep(0.5)
            runs.append((T, share, got))
    return _project_summary(runs, tokens, quiet, w16, w32, n_in, mixer, native)


def _project_summary(runs, tokens, quiet, w16, w32, n_in, mixer, native):
    """Best of each side per token count over the quiet rounds (all rounds if none was quiet); printed."""
    def pick(what):
        mine = [(share, got) for T, share, got in runs if T == what]
        calm = [got for share, got in mine if share < quiet]
        return (calm or [got for _, got in mine]), len(calm), len(mine)

    copies, calm_n, all_n = pick("copy")
    copy = max(copies, key=lambda c: c["copy_GBps"])
    regime = "quiet" if calm_n else "loaded"
    print(f"   memory: STREAM-like copy {copy['copy_GBps']:.1f} GB/s (read + write; 1 thread "
          f"{copy['copy_1_thread_GBps']:.1f})   resident engram_kv: F16 {w16.nbytes / 2**20:.0f} MiB, "
          f"float32 {w32.nbytes / 2**20:.0f} MiB")
    out = []
    for T in tokens:
        gots, calm_n, all_n = pick(T)
        best = {k: min(g[k] for g in gots) for k in gots[0]}
        t16, t32 = best["f16"], best["f32"]
        flops = 2.0 * T * n_in * 5 * W
        rec = {"tokens": T, "rounds": all_n, "quiet_rounds": calm_n, "f16_ms": t16 * 1e3, "float32_ms": t32 * 1e3,
               "speedup_vs_float32": t32 / t16, "f16_gflops": flops / t16 / 1e9, "float32_gflops": flops / t32 / 1e9,
               "f16_read_GBps": w16.nbytes / t16 / 1e9, "f16_share_of_copy": w16.nbytes / t16 / 1e9 / copy["copy_GBps"],
               "f16_path": "kernel" if T <= mixer.F16_KERNEL_MAX_TOKENS else "blocks+BLAS"}
        line = (f"   project   T={T:5d}  F16 {t16 * 1e3:9.2f} ms ({rec['f16_path']})  float32 {t32 * 1e3:9.2f} ms"
                f"  x{t32 / t16:5.2f}  ({calm_n} of {all_n} rounds quiet)")
        if T == 1:
            rec["f16_1_thread_ms"] = best["f16_1_thread"] * 1e3
            line += (f"   F16 reads {rec['f16_read_GBps']:.1f} GB/s = {100 * rec['f16_share_of_copy']:.0f}% of the "
                     f"copy (1 thread {best['f16_1_thread'] * 1e3:.2f} ms)")
        if T <= CROSSOVER_MAX:
            rec.update(kernel_ms=best["kernel"] * 1e3, blocks_blas_ms=best["blocks"] * 1e3)
            line += f"   [kernel {best['kernel'] * 1e3:.2f} ms, blocks+BLAS {best['blocks'] * 1e3:.2f} ms]"
        else:
            line += f"   = {100 * t32 / t16:.1f}% of float32 BLAS's speed"
        print(line)
        out.append(rec)
    print(f"   regime: {regime} (others under {quiet:.0%} of the CPUs in the second before a timing counts as quiet)")
    return {"regime": regime, "memory": copy, "resident_bytes": {"f16": int(w16.nbytes), "float32": int(w32.nbytes)},
            "project_threads": native.get_threads(), "project_path": native.get_path(),
            "f16_kernel_max_tokens": mixer.F16_KERNEL_MAX_TOKENS, "blas_block_rows": mixer.BLAS_BLOCK_ROWS,
            "by_tokens": out}


def bench_finite(rng, rounds: int) -> dict:
    """The finiteness checks of a T = 1 ``Session.apply`` against the call they guard, side by side.

    The checks are the ones the call runs (``residual`` and ``rows`` in ``apply``; ``residual``
    and ``kv`` again in ``gated_add``); the call is ``project`` of one token with F16 V4.1 Flash
    weights (315 MB) plus the gate kernel.  Best of ``rounds`` rounds each.
    """
    from engram._checks import as_mask, need_finite
    from engram._native import gate as native
    from engram.mixer import project

    w16 = (rng.standard_normal((5 * W, COLUMNS * WIDTH)) * 0.01).astype(np.float16)
    rows = rng.standard_normal((1, COLUMNS, WIDTH)).astype(np.float32)
    residual = rng.standard_normal((1, S, W)).astype(np.float32)
    kv = np.empty((1, S + 1, W), np.float32)
    norm = np.ones((S, W), np.float32)
    gates = np.empty((1, S), np.float32)
    m8 = as_mask(np.ones(1, bool), 1)

    def checks():
        need_finite("residual", residual, ("token", "stream", "column"), m8)
        need_finite("rows", rows, ("token", "row", "column"), m8)
        need_finite("residual", residual, ("token", "stream", "column"), m8)
        need_finite("kv", kv, ("token", "part", "column"), m8)

    def call():
        project(rows, w16, out=kv)
        native.gated_add_into(residual.copy(), kv, norm, norm, 1e-6, m8, gates)

    from engram.mixer import gated_add

    h = residual.copy()
    call()
    best = dict(check=float("inf"), call=float("inf"), gate=float("inf"), kernel=float("inf"))
    for _ in range(rounds):
        best["check"] = min(best["check"], time_best(checks, repeat=5, number=2000))
        best["call"] = min(best["call"], time_best(call, repeat=5))
        # the public gated_add (its argument and finiteness checks) against its kernel alone
        best["gate"] = min(best["gate"], time_best(lambda: gated_add(h, kv, norm, norm, 1e-6, m8, gates_out=gates),
                                                   repeat=5, number=2000))
        best["kernel"] = min(best["kernel"], time_best(lambda: native.gated_add_into(h, kv, norm, norm, 1e-6, m8,
                                                                                     gates), repeat=5, number=2000))
    share = best["check"] / best["call"]
    print(f"   finiteness checks of a T=1 apply: {best['check'] * 1e6:.1f} us; projection + gate of one token "
          f"{best['call'] * 1e3:.2f} ms; the checks are {100 * share:.3f}% of it")
    print(f"   gated_add T=1: {best['gate'] * 1e6:.1f} us with its checks, the kernel alone {best['kernel'] * 1e6:.1f} us")
    return {"check_us": best["check"] * 1e6, "call_ms": best["call"] * 1e3, "check_share": share,
            "gated_add_us": best["gate"] * 1e6, "gate_kernel_us": best["kernel"] * 1e6}


def bench_weights_check(rng, rounds: int) -> dict:
    """``engram.gguf.check_finite`` on an F16 ``engram_kv`` of V4.1 Flash's shape (315 MB) against its peer,
    ``numpy.isfinite(kv).all()``, side by side; best of ``rounds`` rounds each."""
    from types import SimpleNamespace

    from engram.gguf import check_finite

    kv = (rng.standard_normal((5 * W, COLUMNS * WIDTH)) * 0.01).astype(np.float16)
    loc = SimpleNamespace(path="bench", name="blk.1.engram_kv.weight", offset=0)
    best = dict(ours=float("inf"), numpy=float("inf"))
    for _ in range(rounds):
        best["ours"] = min(best["ours"], time_best(lambda: check_finite(loc, kv), repeat=3))
        best["numpy"] = min(best["numpy"], time_best(lambda: bool(np.isfinite(kv).all()), repeat=3))
    print(f"   check_finite of a {kv.nbytes / 1e6:.0f} MB F16 engram_kv: {best['ours'] * 1e3:.1f} ms; "
          f"numpy.isfinite(kv).all() {best['numpy'] * 1e3:.1f} ms: {best['numpy'] / best['ours']:.1f}x")
    return {"check_ms": best["ours"] * 1e3, "isfinite_ms": best["numpy"] * 1e3, "speedup": best["numpy"] / best["ours"]}


def main(argv=None) -> dict:
    from engram import mixer
    from engram._native import gate as native

    p = argparse.ArgumentParser(prog="bench_mixer")
    p.add_argument("--gate-tokens", type=int, nargs="+", default=[1, 64, 2048])
    p.add_argument("--project-tokens", type=int, nargs="+", default=[1, 4, 16, 32, 64, 128, 256, 2048])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    p.add_argument("--only", choices=("gate", "project", "finite", "weights"),
                   help="run one part (finite: the cost of the finiteness checks of a T = 1 apply; weights: the "
                        "finiteness check of engram_kv at load)")
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    env = blas_info()
    print(f"   BLAS: {env['blas']}  env: {env['env'] or 'no OPENBLAS_* variables set'}")
    print(f"   gate path {mixer.gate_path()}, default threads {native.get_threads()}")
    gate = bench_gate(rng, args.gate_tokens, args.rounds) if args.only in (None, "gate") else None
    proj = bench_project(rng, args.project_tokens, args.rounds) if args.only in (None, "project") else None
    finite = bench_finite(rng, args.rounds) if args.only in (None, "finite") else None
    weights = bench_weights_check(rng, args.rounds) if args.only in (None, "weights") else None
    return {"gate_path": mixer.gate_path(), "gate_threads": native.get_threads(), **env,
            "gated_add": gate, "project": proj, "finite": finite, "weights_check": weights}
