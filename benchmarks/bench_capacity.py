"""Capacity search speed: the bracketed search (queueing bounds, then secant steps on the probes' rates) against
the same bracket stepping away from its estimate (the search before the secant steps) and galloping.

Side by side in one run, for each device, the same configuration -- the SPEC §8 reference compute, threshold 8,
16 readers, random phases, 300 steps of a 1000-token real trace, the target 20 tokens/s -- searched up to
``--max-sessions`` (default 4096) for one seed, galloping (1, 2, 4, ... then bisection), bracketed stepping
(:func:`sim.capacity.session_bounds`, then steps of 1/512 of the estimate, doubling: kept here as
:func:`_stepping`) and bracketed with secant steps (``sim.capacity._bracketed``): wall seconds, probes, the session-steps simulated, and
the capacities found (the same within one session where the slowest session's rate falls with the count; where
it does not -- a few sessions settling into a convoy -- each search returns one of the counts that passed next to
one that failed).  With ``--jobs 1`` the probes run in this process, so its CPU seconds
(:func:`time.process_time`) are the search's work whatever else loads the machine; wall seconds are shown beside.

``python -m benchmarks.run capacity [--max-sessions N] [--steps N] [--jobs N] [--devices A;B]``
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Generator, Mapping, Tuple
from unittest import mock

from sim.capacity import bracket_opening

DEVICES = ("ssd:qd1_us=500,iops=20000,parallelism=8;ssd:qd1_us=80,iops=600000,parallelism=32;"
           "ssd:qd1_us=64,iops=3400000,parallelism=200")


def _stepping(max_sessions: int, resolution: int, target: float,
               metric: str) -> Generator[int, Mapping[str, Any], Tuple[int, bool]]:
    """The bracketed search as it was before the secant steps (``sim.capacity._bracketed`` of 2026-12-02): from
    the queueing estimate, steps of 1/512 of it, doubling, then bisection; kept here to measure against."""
    done, e = yield from bracket_opening(max_sessions, resolution, target, metric)
    if done:
        return e
    lo, hi = 1, max_sessions + 1  # the largest count known to pass, the smallest known to fail
    width = max(1, -(-e // 512))  # first steps away from the estimate: 1/512 of it, doubling
    row = yield e
    if row[metric] >= target:  # at or above the estimate: step up until a failure (or max_sessions)
        lo = e
        while hi > max_sessions:
            if lo >= max_sessions:
                return lo, True
            s = min(max_sessions, lo + width)
            row = yield s
            if row[metric] >= target:
                lo, width = s, 2 * width
            else:
                hi = s
    else:  # below the estimate: step down until a pass (one session passed)
        hi = e
        while lo == 1:
            s = max(1, hi - width)
            if s == 1:
                break
            row = yield s
            if row[metric] >= target:
                lo = s
            else:
                hi, width = s, 2 * width
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        row = yield mid
        if row[metric] >= target:
            lo = mid
        else:
            hi = mid
    return lo, False


def main(argv=None) -> dict:
    import sim.capacity
    from sim.capacity import CapacitySpec, find_capacity
    from sim.sweep import AXES

    p = argparse.ArgumentParser(prog="bench_capacity")
    p.add_argument("--max-sessions", type=int, default=4096)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--jobs", type=int, default=1, help="processes (default 1: probes of one search are serial)")
    p.add_argument("--devices", default=DEVICES, help="device specs separated by ';'")
    args = p.parse_args(argv)
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace="stdlib:asyncio/base_events.py", trace_limit=1000, steps=args.steps, compute="reference",
                threshold=8, readers=16, phases="random")
    rec: dict = {"max_sessions": args.max_sessions, "steps": args.steps, "jobs": args.jobs, "cpus": os.cpu_count(),
                 "load_average_before": os.getloadavg(), "devices": {}}
    t0 = time.perf_counter()  # one-time costs apart (the tokenizer, the trace): a one-session search first
    find_capacity([{**base, "device": "ssd:qd1_us=80,iops=600000"}], CapacitySpec(seeds=1, max_sessions=1),
                  jobs=args.jobs, progress=False)
    rec["warm_up_s"] = time.perf_counter() - t0
    print(f"   {'device':<44} {'search':<8} {'capacity':>8} {'probes':>6} {'session-steps':>13} {'CPU s':>7} "
          f"{'wall s':>7}")
    for dev in args.devices.split(";"):
        out = {}
        for search in ("gallop", "stepping", "bracket"):
            t0, c0 = time.perf_counter(), time.process_time()
            with mock.patch.object(sim.capacity, "_bracketed", _stepping if search == "stepping" else
                                   sim.capacity._bracketed):
                (cap,), _ = find_capacity([{**base, "device": dev}],
                                          CapacitySpec(seeds=1, max_sessions=args.max_sessions,
                                                       search="gallop" if search == "gallop" else "bracket"),
                                          jobs=args.jobs, progress=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            work = sum(int(p["sessions"]) for p in cap.probes) * args.steps
            out[search] = {"capacity": cap.per_seed[0], "lower_bound": cap.bound[0], "probes": len(cap.probes),
                           "sessions_probed": [int(p["sessions"]) for p in cap.probes], "session_steps": work,
                           "wall_s": wall, "cpu_s": cpu}
            shown = f"{cap.per_seed[0]}{'+' if cap.bound[0] else ''}"
            print(f"   {dev:<44} {search:<8} {shown:>8} {len(cap.probes):>6} {work:>13,} {cpu:>7.1f} {wall:>7.1f}",
                  flush=True)
        out["speedup_cpu"] = out["gallop"]["cpu_s"] / out["bracket"]["cpu_s"]
        out["speedup_wall"] = out["gallop"]["wall_s"] / out["bracket"]["wall_s"]
        out["speedup_cpu_vs_stepping"] = out["stepping"]["cpu_s"] / out["bracket"]["cpu_s"]
        print(f"   {'':<44} {'ratio':<8} {'':>8} {'':>6} {'':>13} {out['speedup_cpu']:>6.2f}x "
              f"{out['speedup_wall']:>6.2f}x  (gallop / bracket); {out['speedup_cpu_vs_stepping']:.2f}x CPU "
              f"(stepping / bracket)")
        rec["devices"][dev] = out
    rec["load_average_after"] = os.getloadavg()
    return rec
