"""Capacity search speed: the bracketed search (queueing bounds, then secant steps on the probes' rates) against
the same bracket stepping away from its estimate (the search before the secant steps), galloping, and the
bracketed search on the simulator as it was before its fast loop and reads were reworked.

Side by side in one run, for each device, the same configuration -- the SPEC §8 reference compute, threshold 8,
16 readers, random phases, 300 steps of a 1000-token real trace, the target 20 tokens/s -- searched up to
``--max-sessions`` (default 4096) for one seed, galloping (1, 2, 4, ... then bisection), bracketed stepping
(:func:`sim.sweep.capacity.session_bounds`, then steps of 1/512 of the estimate, doubling: kept here as
:func:`_stepping`), bracketed with secant steps (``sim.sweep.capacity._bracketed``) on the simulator as it was
(``before``: :func:`_before` patches in the fast decode loop, the sessions' reads and the queue's timeline of
2026-12-02) and as it is: wall seconds, probes, the session-steps simulated, and
the capacities found (the same within one session where the slowest session's rate falls with the count; where
it does not -- a few sessions settling into a convoy -- each search returns one of the counts that passed next to
one that failed), and whether the probe rows before and after are the same (every metric, bit for bit).  With
``--jobs 1`` the probes run in this process, so its CPU seconds
(:func:`time.process_time`) are the search's work whatever else loads the machine; wall seconds are shown beside.

``python -m benchmarks.run capacity [--max-sessions N] [--steps N] [--jobs N] [--devices A;B]``

``--planner REV``: the planner's command itself, ``engram sim capacity --device ... --max-sessions 4096``, as a
user runs it (:data:`PLANNER`: five seeds on both cores; one seed with the drive alone and on a host of 64 CPUs),
from the code of git revision ``REV`` (exported to a temporary folder, the engine's built kernels copied in: its
``engram/_native`` must be this tree's; its own fast loop built there) and from this tree, in turn, ``--rounds`` times: wall seconds, the CPU
seconds of the command and its workers, the load average before each, and the answers (every seed's capacity),
which must agree within one session.  ``--answers`` adds, once each, the configurations of :data:`ANSWERS` (four
devices, the drive alone and on hosts of 2 and 64 CPUs).

``python -m benchmarks.run capacity --planner REV [--rounds N] [--answers]``
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Generator, Mapping, Sequence, Tuple
from unittest import mock

import numpy as np

import sim.decode.model
import sim.decode.reads
from benchmarks.common import ROOT
from sim.sweep.capacity import SearchRun, bracket_opening
from sim.decode.fast import FastRun

DEVICES = ("ssd:qd1_us=500,iops=20000,parallelism=8;ssd:qd1_us=80,iops=600000,parallelism=32;"
           "ssd:qd1_us=64,iops=3400000,parallelism=200")


def _stepping(max_sessions: int, resolution: int, target: float, metric: str,
              host=None) -> Generator[int, Mapping[str, Any], Tuple[int, bool]]:
    """The bracketed search as it was before the secant steps (``sim.sweep.capacity._bracketed`` of 2026-12-02): from
    the queueing estimate, steps of 1/512 of it, doubling, then bisection; kept here to measure against."""
    done, e = yield from bracket_opening(max_sessions, resolution, target, metric, host)
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


def _run_lean_before(self, begin: Sequence[float], tick) -> None:
    """``sim.decode.fast.FastRun._run_lean`` as it was before its sampler lookups, uniform draws and stalls were
    taken inline (2026-12-02): kept here to measure against."""
    S = len(self.reads)
    sq = self.queues[0]
    thr, width = self.policy.threshold, self.policy.readers
    ns = self._n["all"]
    comps = [c.tolist() for c in self.computes]
    steps = len(comps[0])
    lat_rows = [[0.0] * steps for _ in range(S)]
    stl_rows = [[0.0] * steps for _ in range(S)]
    step = [0] * S
    t0 = [0.0] * S
    finish = self.finish
    sampler = self.sampler
    cache, samples_of, uniform = sampler._cache, sampler.samples_of, sampler._uniform
    wake = [(float(b), i, i) for i, b in enumerate(begin)]
    heapq.heapify(wake)
    push, pop = heapq.heappush, heapq.heappop
    seq = S
    # the queue's state
    L, Q, slack, shared = sq.L, sq.Q, sq.slack, sq.shared
    gate, gate_tail = sq.bucket, sq.tail
    heap, wait, late = sq.heap, sq.wait, sq.late
    V, tq, q, d, qseq = sq.V, sq.t, sq.q, sq.d, sq.seq
    area = busy = 0.0
    reads = 0
    times, depths = sq.times, sq.depths
    record = sq.record
    tnext = math.inf
    inf = math.inf
    done: list = []

    while True:
        if wake and wake[0][0] < tnext:  # at a tie, the device first (see the module)
            now, _, i = pop(wake)   # session i starts its step
            t = step[i]
            t0[i] = now
            n = ns[i][t]
            if n:
                k = 1 if n < thr else (n if n < width else width)
                got = cache.get((n, k))
                if got is None:
                    got = samples_of(n, k)
                sig = got[1]
                x = 0 if len(sig) == 1 else int(uniform() * len(sig))
                # submit (SegmentQueue.submit)
                dt = now - tq
                if dt > 0:
                    if q:
                        V += dt / L[q]
                    if d:
                        area += dt * d
                        busy += dt
                    tq = now
                c = k if k < n else n
                if gate is None:
                    nb = 0.0
                else:  # the device's not_before, inlined
                    nb = gate.take(now, n)
                    nb = nb + gate_tail if nb > now else 0.0
                bt = [i, n - c, c, sig[x], now, n, got[2][x], got[4], nb]
                d += c
                if not wait and q < Q and q + c <= Q + slack:
                    qseq += 1
                    push(heap, (V + bt[3], qseq, bt, c))
                    q += c
                else:
                    wait.append([bt, c])
                    while wait and q < Q:  # the device's _admit, inlined (hot loop)
                        seg = wait[0]
                        b2, c2 = seg
                        take = Q - q
                        if take + slack >= c2:
                            wait.popleft()
                            take = c2
                        else:
                            seg[1] = c2 - take
                        qseq += 1
                        push(heap, (V + b2[3], qseq, b2, take))
                        q += take
                if q >= len(L):
                    sq._deeper(q)
            else:  # nothing to read: the compute follows at once, the device untouched
                c = comps[i][t]
                end = now + c
                lat_rows[i][t] = end - now
                stl_rows[i][t] = end - now - c
                step[i] = t + 1
                if t + 1 == steps:
                    finish[i] = end
                    if tick is not None:
                        tick(1)
                else:
                    seq += 1
                    push(wake, (end, seq, i))
                continue
        else:
            if tnext == inf:
                break
            now = tnext
            # complete (SegmentQueue.complete)
            dt = now - tq
            if dt > 0:
                if q:
                    V += dt / L[q]
                if d:
                    area += dt * d
                    busy += dt
                tq = now
            eps = 1e-12 * (1.0 + (V if V > 0 else -V))
            while late and late[0][0] <= now:
                done.append(pop(late)[2])
            first = not done
            while heap and (first or heap[0][0] <= V + eps):
                first = False
                _, _, bt, c = pop(heap)
                if c < 0:
                    q -= 1
                    d -= 1
                    if bt[8] > now:
                        qseq += 1
                        push(late, (bt[8], qseq, bt))
                    else:
                        done.append(bt)
                    continue
                left = bt[1]
                if not left and bt[6] > 0 and bt[2] == c:
                    qseq += 1
                    if shared:
                        push(heap, (V + bt[6] / L[1], qseq, bt, -1))
                        q += 1
                        d += 1
                        if q >= len(L):
                            sq._deeper(q)
                    else:
                        tl = now + bt[6] * (bt[7] + (1.0 - bt[7]) * c / q)
                        push(late, (tl if tl > bt[8] else bt[8], qseq, bt))
                    bt[6] = -1.0
                q -= c
                d -= c
                reads += c
                if left:
                    x = c if c < left else left
                    bt[1] = left - x
                    bt[2] += x - c
                    d += x
                    wait.append([bt, x])
                else:
                    bt[2] -= c
                    if bt[2] == 0 and bt[6] >= 0:
                        if bt[8] > now:  # not before its last token (a rate-limited device)
                            qseq += 1
                            push(late, (bt[8], qseq, bt))
                        else:
                            done.append(bt)
            while wait and q < Q:  # the device's _admit, inlined (hot loop)
                seg = wait[0]
                b2, c2 = seg
                take = Q - q
                if take + slack >= c2:
                    wait.popleft()
                    take = c2
                else:
                    seg[1] = c2 - take
                qseq += 1
                push(heap, (V + b2[3], qseq, b2, take))
                q += take
            if q >= len(L):
                sq._deeper(q)
            now_done = now
        # the queue's next event
        if heap:
            gap = heap[0][0] - V
            tnext = tq + (gap if gap > 0 else 0.0) * L[q]
        else:
            tnext = inf
        if late and late[0][0] < tnext:
            tnext = late[0][0]
        if record:
            times.append(tq)
            depths.append(d)
        # sessions whose reads are done: their compute follows
        for bt in done:
            i = bt[0]
            t = step[i]
            c = comps[i][t]
            end = now_done + c
            lat_rows[i][t] = end - t0[i]
            stl_rows[i][t] = end - t0[i] - c
            step[i] = t + 1
            if t + 1 == steps:
                finish[i] = end
                if tick is not None:
                    tick(1)
            else:
                seq += 1
                push(wake, (end, seq, i))
        done.clear()
    sq.V, sq.t, sq.q, sq.d, sq.seq, sq.tnext = V, tq, q, d, qseq, tnext
    sq.area += area
    sq.busy += busy
    sq.reads += reads
    sq.max_depth = max(depths) if depths else 0
    self.lats = np.asarray(lat_rows)
    self.stalls = np.maximum(np.asarray(stl_rows), 0.0)


def _merge_before(counters: list, t0: float) -> tuple:
    """``sim.decode.model._merge`` as it was (2026-12-02: a stable sort of every counter, also of one in time
    order), kept here to measure against."""
    ts, ds = [], []
    for times, values in counters:
        if len(times):
            v = np.asarray(values, dtype=np.float64)
            ts.append(np.asarray(times, dtype=np.float64))
            ds.append(np.diff(v, prepend=0.0))
    if not ts:
        return np.zeros(0), np.zeros(0)
    t = np.concatenate(ts)
    d = np.concatenate(ds)
    o = np.argsort(t, kind="stable")
    return t[o] - t0, np.cumsum(d[o])


def _before():
    """The fast decode loop, the sessions' reads and the queue's timeline as they were (:func:`_run_lean_before`;
    every session's steps sorted on their own, ``sim.decode.reads.BY_POSITION`` off; :func:`_merge_before`),
    patched in for one search."""
    return [mock.patch.object(FastRun, "_run_lean", _run_lean_before),
            mock.patch.object(sim.decode.model, "_merge", _merge_before),
            mock.patch.object(sim.decode.reads, "BY_POSITION", False)]


_D1, _D2 = "ssd:qd1_us=64,iops=3400000,parallelism=200", "ssd:qd1_us=80,iops=3000000"
_D3, _D4 = "ssd:qd1_us=500,iops=20000,parallelism=8", "ssd:qd1_us=51.9,iops=123460,cap_iops=15004,burst_ios=1500"
#: The planner's commands of issue 23 (``engram sim capacity`` options), named.
PLANNER = {"five seeds, both cores": ["--device", _D1, "--max-sessions", "4096", "--jobs", "2"],
           "one seed": ["--device", _D2, "--seeds", "1", "--max-sessions", "4096"],
           "one seed, 64 CPUs": ["--device", _D2, "--seeds", "1", "--max-sessions", "4096", "--host-cpus", "64"]}
#: The configurations whose answers ``--answers`` compares: the devices of :data:`PLANNER` (one seed on a host,
#: whose probes take longest before), a slow SSD and a throttled volume (five seeds), the drive alone and on hosts
#: of 2 and 64 CPUs.
ANSWERS = {f"{name}{'' if h is None else f', {h} CPUs'}": ["--device", dev, "--max-sessions", "4096", *seeds,
                                                            *([] if h is None else ["--host-cpus", str(h)])]
           for name, dev, seeds, hosts in (("3.4 M IOPS, 1 seed", _D1, ["--seeds", "1"], (None, 2, 64)),
                                           ("3 M IOPS, 5 seeds", _D2, [], (None,)),
                                           ("3 M IOPS, 1 seed", _D2, ["--seeds", "1"], (2,)),
                                           ("20 k IOPS, 5 seeds", _D3, [], (None, 2, 64)),
                                           ("throttled 15 k IOPS, 5 seeds", _D4, [], (None, 2, 64)))
           for h in hosts}


def _tree(rev: str, into: Path) -> Path:
    """The code of git revision ``rev`` in ``into``, with this tree's built engine kernels (refused where the
    revision's engine kernels differ from this tree's)."""
    if subprocess.run(["git", "diff", "--quiet", rev, "--", "engram/_native"], cwd=ROOT).returncode:
        raise SystemExit(f"bench_capacity: {rev}'s engram/_native differs from this tree's: build it apart")
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for so in (ROOT / "engram" / "_native").glob("*.so"):
        shutil.copy(so, into / "engram" / "_native" / so.name)
    if (into / "sim" / "decode" / "lean_loop.py").is_file():  # its fast loop compiled as its own build does
        subprocess.run([sys.executable, "-c", _BUILD_LEAN, "build_ext", "--inplace"], cwd=into, check=True,
                       capture_output=True)
    return into


#: A revision's ``sim.decode._native.lean`` built in its tree, from its own loop and queue text, as its ``setup.py``
#: builds it (that extension alone: the engine's kernels are this tree's, copied in).
_BUILD_LEAN = """
import importlib.util, os
from Cython.Build import cythonize
from setuptools import Extension, setup
def load(path):
    spec = importlib.util.spec_from_file_location("_rev_" + os.path.basename(path)[:-3], path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m
fluid, text = load("sim/device/fluid.py"), load("sim/decode/lean_loop.py")
source = fluid.queue_function(text.LEAN_TEMPLATE, text.LEAN_NAME, text.lean_namespace()).source
os.makedirs("build/generated", exist_ok=True)
with open("build/generated/lean.pyx", "w", encoding="utf-8") as f:
    f.write(text.built_text(source))
setup(ext_modules=cythonize([Extension("sim.decode._native.lean", ["build/generated/lean.pyx"],
                                       extra_compile_args=["-O3", "-ffp-contract=off"])],
                            compiler_directives={"language_level": "3"}))
"""


def _command(tree: Path, args: list, out: Path) -> dict:
    """One ``engram sim capacity`` run from ``tree``: wall and CPU seconds (the command and its workers), the load
    average before it, and every configuration's seeds' capacities."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = "import sys; from engram.cli import main; sys.exit(main(sys.argv[1:]))"
    load, before = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, "sim", "capacity", *args, "--quiet", "--json", "--out",
                           str(out)], cwd=tree, env=env, check=True, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = json.loads(done.stdout)
    return {"wall_s": wall, "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "load_average": load, "per_seed": [c["per_seed"] for c in doc["configurations"]],
            "capacity": [c["capacity"] for c in doc["configurations"]]}


def planner(rev: str, rounds: int, answers: bool) -> dict:
    """The planner's commands before (``rev``) and after (this tree), in turn (see the module)."""
    rec: dict = {"before": rev, "after": "this tree", "rounds": rounds, "commands": {}}
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        Path(tmp, "before").mkdir()
        trees = {"before": _tree(rev, Path(tmp) / "before"), "after": ROOT}
        todo = [(name, args, rounds) for name, args in PLANNER.items()]
        todo += [(name, args, 1) for name, args in ANSWERS.items()] if answers else []
        print(f"   {'command':<34} {'round':>5} {'before: wall s / CPU s / load':>30} {'after':>22} {'wall ratio':>10}"
              f"  answers")
        for name, args, n in todo:
            runs = {"before": [], "after": []}
            for r in range(n):
                for side in ("before", "after"):
                    runs[side].append(_command(trees[side], args, Path(tmp) / f"{side}.csv"))
                b, a = runs["before"][-1], runs["after"][-1]
                same = all(abs(x - y) <= 1 for pb, pa in zip(b["per_seed"], a["per_seed"]) for x, y in zip(pb, pa))
                print(f"   {name:<34} {r + 1:>5} {b['wall_s']:>10.1f} / {b['cpu_s']:>6.1f} / {b['load_average']:>5.1f} "
                      f"{a['wall_s']:>8.1f} / {a['cpu_s']:>6.1f} / {a['load_average']:>4.1f} "
                      f"{b['wall_s'] / a['wall_s']:>9.2f}x  {b['per_seed']} / {a['per_seed']}"
                      f"{'' if same else '  MORE THAN ONE SESSION APART'}", flush=True)
            rec["commands"][name] = {"args": args, **runs, "within_one_session": all(
                abs(x - y) <= 1 for b, a in zip(runs["before"], runs["after"])
                for pb, pa in zip(b["per_seed"], a["per_seed"]) for x, y in zip(pb, pa))}
    return rec


def main(argv=None) -> dict:
    import sim.sweep.capacity
    from sim.sweep.capacity import CapacitySpec, find_capacity
    from sim.sweep import AXES, METRICS

    p = argparse.ArgumentParser(prog="bench_capacity")
    p.add_argument("--max-sessions", type=int, default=4096)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--jobs", type=int, default=1, help="processes (default 1: probes of one search are serial)")
    p.add_argument("--devices", default=DEVICES, help="device specs separated by ';'")
    p.add_argument("--planner", metavar="REV", help="the planner's commands from git revision REV and from this tree")
    p.add_argument("--rounds", type=int, default=1, help="with --planner: runs of each command on each side")
    p.add_argument("--answers", action="store_true", help="with --planner: also compare the answers of ANSWERS")
    args = p.parse_args(argv)
    if args.planner:
        return planner(args.planner, args.rounds, args.answers)
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace="stdlib:asyncio/base_events.py", trace_limit=1000, steps=args.steps, compute="reference",
                threshold=8, readers=16, phases="random")
    rec: dict = {"max_sessions": args.max_sessions, "steps": args.steps, "jobs": args.jobs, "cpus": os.cpu_count(),
                 "load_average_before": os.getloadavg(), "devices": {}}
    t0 = time.perf_counter()  # one-time costs apart (the tokenizer, the trace): a one-session search first
    find_capacity([{**base, "device": "ssd:qd1_us=80,iops=600000"}], CapacitySpec(seeds=1, max_sessions=1),
                  run=SearchRun(jobs=args.jobs, progress=False))
    rec["warm_up_s"] = time.perf_counter() - t0
    print(f"   {'device':<44} {'search':<8} {'capacity':>8} {'probes':>6} {'session-steps':>13} {'CPU s':>7} "
          f"{'wall s':>7}")
    for dev in args.devices.split(";"):
        out = {}
        rows = {}
        for search in ("gallop", "stepping", "before", "bracket"):
            patches = [mock.patch.object(sim.sweep.capacity, "_bracketed", _stepping if search == "stepping" else
                                         sim.sweep.capacity._bracketed)] + (_before() if search == "before" else [])
            t0, c0 = time.perf_counter(), time.process_time()
            with contextlib.ExitStack() as stack:
                for patch in patches:
                    stack.enter_context(patch)
                (cap,), _ = find_capacity([{**base, "device": dev}],
                                          CapacitySpec(seeds=1, max_sessions=args.max_sessions,
                                                       search="gallop" if search == "gallop" else "bracket"),
                                          run=SearchRun(jobs=args.jobs, progress=False))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            work = sum(int(p["sessions"]) for p in cap.probes) * args.steps
            rows[search] = [{k: p[k] for k in METRICS} for p in cap.probes]
            out[search] = {"capacity": cap.per_seed[0], "lower_bound": cap.bound[0], "probes": len(cap.probes),
                           "sessions_probed": [int(p["sessions"]) for p in cap.probes], "session_steps": work,
                           "wall_s": wall, "cpu_s": cpu}
            shown = f"{cap.per_seed[0]}{'+' if cap.bound[0] else ''}"
            print(f"   {dev:<44} {search:<8} {shown:>8} {len(cap.probes):>6} {work:>13,} {cpu:>7.1f} {wall:>7.1f}",
                  flush=True)
        out["same_probe_rows_as_before"] = rows["before"] == rows["bracket"]  # every metric, bit for bit
        out["speedup_cpu_vs_before"] = out["before"]["cpu_s"] / out["bracket"]["cpu_s"]
        out["speedup_wall_vs_before"] = out["before"]["wall_s"] / out["bracket"]["wall_s"]
        out["speedup_cpu"] = out["gallop"]["cpu_s"] / out["bracket"]["cpu_s"]
        out["speedup_wall"] = out["gallop"]["wall_s"] / out["bracket"]["wall_s"]
        out["speedup_cpu_vs_stepping"] = out["stepping"]["cpu_s"] / out["bracket"]["cpu_s"]
        print(f"   {'':<44} {'ratio':<8} {'':>8} {'':>6} {'':>13} {out['speedup_cpu']:>6.2f}x "
              f"{out['speedup_wall']:>6.2f}x  (gallop / bracket); {out['speedup_cpu_vs_stepping']:.2f}x CPU "
              f"(stepping / bracket); {out['speedup_cpu_vs_before']:.2f}x CPU (before / bracket, "
              f"{'the same' if out['same_probe_rows_as_before'] else 'OTHER'} probe rows)")
        rec["devices"][dev] = out
    rec["load_average_after"] = os.getloadavg()
    return rec
