"""Serving model speed: an hour of serving at 10 requests/s, against real time and against the decode model.

Side by side in one run, on the same text (the Italian novel, 200,000 tokens through the DeepSeek
V4 tokenizer and the V4.1 Flash layout) and the same device (a datasheet SSD of 1.5 M IOPS):

- ``engram sim serve --duration-s 3600 --rate 10`` with default lengths (prompts lognormal mean 512
  tokens, outputs mean 256), 64 readers, up to 128 running requests, at two computes: 40x the
  reference machine's (small batches, short steps: the most steps an hour, the SLOs met) and 20x
  (batches of ~70: heavier steps); wall seconds, simulated seconds per wall second, decode tokens
  simulated per wall second;
- the decode model's fast mode (``simulate_decode``, 64 sessions on the same device and text) on
  as many decode tokens as the 40x run emitted: its decode tokens per wall second, the peer of the
  serving model's;
- the one-time costs apart: tokenizing and hashing the text, counting its chunks' rows
  (:class:`sim.serve.RowSource`), the device's batch-duration samples (first run in a process).

The machine's load average is recorded beside the figures: absolute rates on a shared machine drift,
the ratios hold.
"""

from __future__ import annotations

import argparse
import os
import time

DEVICE = "ssd:qd1_us=60,iops=1500000"


def main(argv=None) -> dict:
    from sim.decode import DecodeRun, simulate_decode
    from sim.core.params import Compute, Policy
    from sim.serve import RowSource, Scheduler, ServeRun, ServeText, StepCompute, Workload, simulate_serve
    from sim.trace import load_trace

    p = argparse.ArgumentParser(prog="bench_serve")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of arrivals (default 3600)")
    p.add_argument("--rate", type=float, default=10.0, help="requests/s (default 10)")
    p.add_argument("--scales", default="40,20", help="compute speed-ups to run (default 40,20)")
    args = p.parse_args(argv)

    rec: dict = {"duration_s": args.duration, "rate": args.rate, "device": DEVICE, "load_average_before":
                 os.getloadavg(), "cpus": os.cpu_count(), "runs": {}}
    t0 = time.perf_counter()
    text = load_trace("shared:promessi_sposi.txt", limit=200_000)
    rec["text_s"] = time.perf_counter() - t0
    policy = Policy(readers=64)
    t0 = time.perf_counter()
    rows = RowSource(text, policy, 2048)
    rec["row_source_s"] = time.perf_counter() - t0
    sched = Scheduler(max_running=128)
    w = Workload(rate=args.rate, duration=args.duration)
    t0 = time.perf_counter()
    simulate_serve(Workload(rate=args.rate, duration=20.0), DEVICE, policy, StepCompute.reference(scale=40), sched,
                   text=ServeText(rows=rows), run=ServeRun(seed=1))
    rec["warm_up_s"] = time.perf_counter() - t0
    print(f"   text {rec['text_s']:.1f} s, row counts {rec['row_source_s']:.1f} s, device samples and first run "
          f"{rec['warm_up_s']:.1f} s (one-time costs)")
    for scale in (float(x) for x in args.scales.split(",")):
        t0 = time.perf_counter()
        r = simulate_serve(w, DEVICE, policy, StepCompute.reference(scale=scale), sched, text=ServeText(rows=rows),
                           run=ServeRun(seed=0))
        wall = time.perf_counter() - t0
        tokens = int(r.throughput["output_tokens_per_s"] * r.sim_seconds)
        d = {"wall_s": wall, "sim_s": r.sim_seconds, "realtime_x": r.sim_seconds / wall, "steps": r.engine["steps"],
             "steps_per_s": r.engine["steps"] / wall, "decode_tokens": tokens, "decode_tokens_per_s": tokens / wall,
             "requests": r.requests["completed"], "mean_batch": r.engine["mean_batch"], "slo_met": r.slo["met"],
             "ttft_p99_ms": r.ttft_ms["p99"], "tbt_p99_ms": r.tbt_ms["p99"], "device_busy": r.device["busy_fraction"],
             "littles_requests": r.littles_law["requests"]["ratio"], "littles_reads": r.littles_law["reads"]["ratio"]}
        rec["runs"][f"{scale:g}x"] = d
        print(f"   compute {scale:g}x: {args.duration:g} s at {args.rate:g} requests/s in {wall:.1f} s wall "
              f"({d['realtime_x']:.0f}x real time): {d['steps']:,} steps ({d['steps_per_s'] / 1e3:.0f}k/s), "
              f"{tokens:,} decode tokens ({d['decode_tokens_per_s'] / 1e3:.0f}k/s), mean batch {d['mean_batch']:.1f}, "
              f"SLOs {'met' if d['slo_met'] else 'missed'} (TTFT p99 {d['ttft_p99_ms']:.0f} ms, TBT p99 "
              f"{d['tbt_p99_ms']:.1f} ms)")
    first = next(iter(rec["runs"].values()))
    sessions = 64
    steps = max(1, first["decode_tokens"] // sessions)
    t0 = time.perf_counter()
    dec = simulate_decode(text, DEVICE, policy, Compute(47.013e-3 / 40),
                          DecodeRun(sessions=sessions, steps=steps, seed=0))
    wall = time.perf_counter() - t0
    rec["decode_peer"] = {"sessions": sessions, "steps": steps, "wall_s": wall,
                          "decode_tokens_per_s": sessions * steps / wall, "tokens_per_s": dec.tokens_per_s}
    ratio = first["decode_tokens_per_s"] / rec["decode_peer"]["decode_tokens_per_s"]
    rec["serve_vs_decode"] = ratio
    print(f"   decode model, fast mode, {sessions} sessions x {steps:,} steps on the same device: {wall:.1f} s = "
          f"{rec['decode_peer']['decode_tokens_per_s'] / 1e3:.0f}k decode tokens/s; the serving model "
          f"{ratio:.2f}x that (with arrivals, prefill reads and batching)")
    rec["load_average_after"] = os.getloadavg()
    print(f"   load average {rec['load_average_before'][0]:.1f} before, {rec['load_average_after'][0]:.1f} after "
          f"on {os.cpu_count()} cores")
    return rec
