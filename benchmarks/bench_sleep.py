"""How long an emulated ``sleep:MS`` compute lasts, against a plain ``time.sleep`` of the same length.

The measured decode loop emulates a step's compute with ``sleep:MS`` (``sim.measure.compute``), which runs with
its thread's timer slack at 1 ns; a plain ``time.sleep`` keeps the thread's default (50 us on Linux,
``prctl(2)`` PR_SET_TIMERSLACK).  Two threads, one each, take turns one sleep at a time (interleaved side by
side, so both see the same machine); each times its own sleeps with ``time.perf_counter``.  Reports the mean
and p50 overshoot past the asked length, microseconds, for each length in ``--ms``.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time

import numpy as np

from sim.measure.compute import compute_runner, timer_slack_ns


def _worker(run, jobs: "queue.Queue", done: "queue.Queue") -> None:
    slack = None
    while True:
        job = jobs.get()
        if job is None:
            done.put(("slack", slack))
            return
        t0 = time.perf_counter()
        run(job)
        done.put(time.perf_counter() - t0)
        slack = timer_slack_ns()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench_sleep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="0.1,1,5", help="sleep lengths, milliseconds, comma-separated (default 0.1,1,5)")
    p.add_argument("--count", type=int, default=400, help="sleeps of each length on each side (default 400)")
    args = p.parse_args(argv)
    try:
        lengths = [float(x) for x in args.ms.split(",") if x.strip()]
    except ValueError:
        p.error(f"--ms takes lengths in milliseconds, comma-separated, not {args.ms!r}")
    if not lengths or any(not (0 < x <= 1000) for x in lengths):
        p.error(f"--ms takes lengths in (0, 1000] ms, comma-separated, not {args.ms!r}")
    if not 1 <= args.count <= 100_000:
        p.error(f"--count takes 1 to 100,000 sleeps a length, not {args.count}")
    record = {"count": args.count, "rows": []}
    print(f"   {'sleep':>8} {'plain: mean / p50 over':>24} {'sleep:MS: mean / p50 over':>27}  slack plain / sleep:MS")
    for ms in lengths:
        sides = {}
        for name, run in (("plain", lambda s, sec=ms / 1e3: time.sleep(sec)),
                          ("emulated", compute_runner(f"sleep:{ms:g}"))):
            jobs, done = queue.Queue(), queue.Queue()
            t = threading.Thread(target=_worker, args=(run, jobs, done), daemon=True)
            t.start()
            sides[name] = (jobs, done, t)
        times = {name: [] for name in sides}
        for _ in range(args.count):
            for name, (jobs, done, _t) in sides.items():
                jobs.put({})
                times[name].append(done.get())
        slack = {}
        for name, (jobs, done, t) in sides.items():
            jobs.put(None)
            slack[name] = done.get()[1]
            t.join()
        row = {"ms": ms}
        for name in sides:
            over = (np.array(times[name]) - ms / 1e3) * 1e6
            row[name] = {"mean_over_us": float(over.mean()), "p50_over_us": float(np.median(over)),
                         "timer_slack_ns": slack[name]}
        record["rows"].append(row)
        print(f"   {ms:>6g}ms {row['plain']['mean_over_us']:>14.1f} / {row['plain']['p50_over_us']:>6.1f} us "
              f"{row['emulated']['mean_over_us']:>16.1f} / {row['emulated']['p50_over_us']:>6.1f} us  "
              f"{slack['plain']} / {slack['emulated']} ns")
    return record


if __name__ == "__main__":
    main()
