"""Simulator speed: the fast mode against the exact (per-read) mode, one session and many, side by side.

- one session, 100k decode steps of 48 rows (the shared Italian novel through
  the DeepSeek V4 tokenizer and the V4.1 Flash layout), compute 5 ms: fast
  mode steps a second, and the exact mode on a 5k-step stretch of the same
  trace, with both modes' tokens/s;
- the saturated point of issue 19.5, ``engram sim decode --sessions 256
  --steps 300 --compute-ms 47.01``: fast-mode session-steps a second (goal
  >= 200k);
- 64 sessions, 100 steps, compute 47.01 ms (random phases): fast against
  exact, session-steps a second (goal: fast >= 50x) and tokens/s of each.

Devices: the ``seed-apple-m3-ultra`` preset (fixed latencies), the measured
``vm-virtio-16core-4k`` preset, and a datasheet SSD (``ssd:qd1_us=80,
iops=500000``).  The machine's load average is recorded beside the figures:
absolute rates on a shared machine drift, the ratios hold.
"""

from __future__ import annotations

import argparse
import os
import time

DEVICES = ("seed-apple-m3-ultra", "vm-virtio-16core-4k", "ssd:qd1_us=80,iops=500000")


def _timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def _best(fn, repeat: int = 3):
    return min((_timed(fn) for _ in range(repeat)), key=lambda x: x[0])


def main(argv=None) -> dict:
    from sim.decode import Compute, DecodeRun, Policy, seed_reproduction, simulate_decode
    from sim.device import load_device
    from sim.trace import load_trace

    p = argparse.ArgumentParser(prog="bench_sim")
    p.add_argument("--steps", type=int, default=100_000, help="one-session fast-mode steps (default 100000)")
    p.add_argument("--exact-steps", type=int, default=5_000, help="one-session exact-mode steps (default 5000)")
    p.add_argument("--sessions", type=int, default=256, help="sessions of the saturated point (default 256)")
    p.add_argument("--shared-sessions", type=int, default=64, help="sessions of fast vs exact (default 64)")
    p.add_argument("--shared-steps", type=int, default=100, help="steps of fast vs exact (default 100)")
    args = p.parse_args(argv)

    trace = load_trace("shared:promessi_sposi.txt", limit=args.steps)
    policy, c5, c47 = Policy(threshold=8, readers=16), Compute(5e-3), Compute(47.01e-3)
    rec: dict = {"steps": args.steps, "rows_per_step": 48, "load_average_before": os.getloadavg(), "devices": {}}
    for spec in DEVICES:
        dev = load_device(spec)
        simulate_decode(trace.head(300), dev, policy, c47, DecodeRun(sessions=4, steps=50))  # warm the batch samples
        fast_s, fast = _best(lambda: simulate_decode(trace, dev, policy, c5, DecodeRun(steps=args.steps)))
        short = trace.head(args.exact_steps)
        fs_s, fs = _best(lambda: simulate_decode(short, dev, policy, c5, DecodeRun(mode="fast")))
        ex_s, ex = _timed(lambda: simulate_decode(short, dev, policy, c5, DecodeRun(mode="exact")))
        S = args.sessions
        sat_s, sat = _best(lambda: simulate_decode(trace, dev, policy, c47, DecodeRun(sessions=S, steps=300)))
        S2, n2 = args.shared_sessions, args.shared_steps
        f64_s, f64 = _best(lambda: simulate_decode(trace, dev, policy, c47, DecodeRun(sessions=S2, steps=n2)))
        e64_s, e64 = _timed(lambda: simulate_decode(trace, dev, policy, c47,
                                                    DecodeRun(sessions=S2, steps=n2, mode="exact")))
        d = {
            "one_session_fast_steps_per_s": args.steps / fast_s,
            "one_session_fast_vs_exact": ex_s / fs_s,
            "one_session_tokens_per_s": [fs.tokens_per_s, ex.tokens_per_s],
            "saturated_sessions": S,
            "saturated_session_steps_per_s": S * 300 / sat_s,
            "saturated_tokens_per_s_per_session": sat.mean_session_tokens_per_s,
            "saturated_busy": sat.device["busy_fraction"],
            "shared_sessions": S2,
            "shared_fast_session_steps_per_s": S2 * n2 / f64_s,
            "shared_exact_session_steps_per_s": S2 * n2 / e64_s,
            "shared_fast_vs_exact": e64_s / f64_s,
            "shared_tokens_per_s_per_session": [f64.mean_session_tokens_per_s, e64.mean_session_tokens_per_s],
        }
        rec["devices"][spec] = d
        print(f"   {spec:<28} 1 session: fast {d['one_session_fast_steps_per_s'] / 1e3:6.0f}k steps/s, "
              f"{d['one_session_fast_vs_exact']:5.0f}x exact; tokens/s {fs.tokens_per_s:.3f} vs {ex.tokens_per_s:.3f}")
        print(f"   {'':<28} {S} sessions x 300 steps: {sat_s:5.2f} s = {d['saturated_session_steps_per_s'] / 1e3:5.0f}k "
              f"session-steps/s (busy {d['saturated_busy']:.2f})")
        print(f"   {'':<28} {S2} sessions x {n2}: fast {d['shared_fast_session_steps_per_s'] / 1e3:5.0f}k, exact "
              f"{d['shared_exact_session_steps_per_s'] / 1e3:5.1f}k session-steps/s = {d['shared_fast_vs_exact']:4.0f}x; "
              f"tokens/s {f64.mean_session_tokens_per_s:.3f} vs {e64.mean_session_tokens_per_s:.3f}")
    seed = seed_reproduction()
    rec["seed_reproduction"] = seed
    rec["load_average_after"] = os.getloadavg()
    print(f"   seed reproduction: threshold 8 predicts {seed['predicted_tokens_per_s']:.3f} tokens/s "
          f"(reference {seed['reference_tokens_per_s']}, error {seed['error'] * 100:+.2f}%)")
    print(f"   load average {rec['load_average_before'][0]:.1f} before, {rec['load_average_after'][0]:.1f} after "
          f"on {os.cpu_count()} cores")
    return rec
