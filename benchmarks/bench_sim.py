"""Simulator speed: 100k decode steps x 48 rows in fast mode (limit 20 s), against the per-read mode.

The trace is 100k tokens of the shared Italian novel through the DeepSeek V4
tokenizer and the V4.1 Flash layout (48 distinct rows a step).  Fast mode
times one service event per batch of reads; the exact mode, one simpy event
per read, runs a shorter stretch of the same trace side by side and the ratio
of steps per second is reported, with both modes' predicted tokens/s on that
stretch.  Device: the measured ``vm-virtio-16core-4k`` preset (latency spread
by queue depth) and the ``seed-apple-m3-ultra`` preset; compute 5 ms a step.
"""

from __future__ import annotations

import argparse
import time

LIMIT_S = 20.0


def _timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def main(argv=None) -> dict:
    from sim.decode import Compute, Policy, seed_reproduction, simulate_decode
    from sim.trace import load_trace

    p = argparse.ArgumentParser(prog="bench_sim")
    p.add_argument("--steps", type=int, default=100_000, help="fast-mode steps (default 100000)")
    p.add_argument("--exact-steps", type=int, default=5_000, help="per-read mode steps (default 5000)")
    args = p.parse_args(argv)

    trace = load_trace("shared:promessi_sposi.txt", limit=args.steps)
    policy, compute = Policy(threshold=8, readers=16), Compute(5e-3)
    rec: dict = {"steps": args.steps, "rows_per_step": 48, "limit_s": LIMIT_S, "devices": {}}
    for dev in ("vm-virtio-16core-4k", "seed-apple-m3-ultra"):
        fast_s, fast = min((_timed(lambda: simulate_decode(trace, dev, policy, compute, steps=args.steps))
                            for _ in range(3)), key=lambda x: x[0])
        shared_s, shared = _timed(lambda: simulate_decode(trace, dev, policy, compute, sessions=4,
                                                          steps=args.steps // 4, start_spread=5e-3))
        short = trace.head(args.exact_steps)
        fast_short_s, fs = min((_timed(lambda: simulate_decode(short, dev, policy, compute, mode="fast"))
                                for _ in range(3)), key=lambda x: x[0])
        exact_s, ex = _timed(lambda: simulate_decode(short, dev, policy, compute, mode="exact"))
        d = {
            "fast_s": fast_s,
            "fast_steps_per_s": args.steps / fast_s,
            "fast_4_sessions_s": shared_s,
            "exact_steps": args.exact_steps,
            "exact_s": exact_s,
            "exact_steps_per_s": args.exact_steps / exact_s,
            "exact_reads_per_s": args.exact_steps * 48 / exact_s,
            "fast_vs_exact_speed": (args.exact_steps / fast_short_s) / (args.exact_steps / exact_s),
            "tokens_per_s_fast": fs.tokens_per_s,
            "tokens_per_s_exact": ex.tokens_per_s,
            "tokens_per_s_100k": fast.tokens_per_s,
            "tokens_per_s_4_sessions": shared.tokens_per_s,
            "within_limit": fast_s <= LIMIT_S,
        }
        rec["devices"][dev] = d
        print(f"   {dev:<22} fast {args.steps} steps {fast_s:6.2f} s ({d['fast_steps_per_s']/1e3:6.0f}k steps/s, "
              f"limit {LIMIT_S:.0f} s)   4 sessions x {args.steps // 4}: {shared_s:5.2f} s")
        print(f"   {'':<22} exact {args.exact_steps} steps {exact_s:6.2f} s ({d['exact_steps_per_s']:7.0f} steps/s)"
              f"   fast/exact speed {d['fast_vs_exact_speed']:6.1f}x   tokens/s fast {fs.tokens_per_s:.3f} "
              f"exact {ex.tokens_per_s:.3f}")
    seed = seed_reproduction()
    rec["seed_reproduction"] = seed
    print(f"   seed reproduction: threshold 8 predicts {seed['predicted_tokens_per_s']:.3f} tokens/s "
          f"(reference {seed['reference_tokens_per_s']}, error {seed['error'] * 100:+.2f}%)")
    return rec
