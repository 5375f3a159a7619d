"""Shared I/O engine (issue 15): many sessions on one device, measured side by side.

Part 1, the ring/pool rule: batches of 48, 480, 4,800 and 49,152 uniformly
random rows of one table (a decode step of both tables; 10 and 100 tokens; one
2048-token prefill chunk) read through an engine, on the io_uring ring and on
the pread pool, at batch depth 16 (a session's default) and 64 (the engine's
queue depth).  Rows/s and p50 batch time per size; the faster executor per
size sets :data:`engram.io_engine.RING_BATCH`.  Measured twice in one run:
as the machine is, and with ``--contention`` processes spinning on the cores
(as a server's own compute loads them): the ring's reads are all issued and
reaped by the one submitting thread, the pool's by ``readers`` threads.

Part 2, a session alone (N = 1): ``Session.step`` p50 on decode steps of a
real text (DeepSeek V4 tokenizer, the model's layout), with private readers
(the session's own ring or pool, as before the engine) and through the shared
engine, ``backend`` auto (the ring) and pread, ``readers`` 16.  Both sessions
stay open and step through alternating blocks of fresh text: the ratio of
each pair of blocks is measured within a few milliseconds, so the drift of a
shared machine cancels out.

Part 3, N sessions at once: N threads, each with its own session stepping
through its own stretch of the text, through the shared engine (queue depth
64), for a fixed time; aggregate rows/s (distinct rows read) vs fio at the
same total queue depth on the same file (4 KiB and the device's logical
block), and the threads the process holds.  With private readers 16 sessions
hold 16 x 16 reads in flight; that run is shown for reference beside fio at
that depth.

Part 4, threads: /proc/self/task counted with 1, 4 and 16 sessions open on the
pread backend (each having stepped and prefilled), private readers vs the
shared engine.

Every part runs in interleaved rounds with the order rotating; medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .bench_table import _drop_cache, _model, fio_randread
from .common import RESULTS, real_text

SIZES = (2, 20, 200, 2048)  # tokens of 24 rows: 48, 480, 4,800, 49,152 rows


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


# ------------------------------------------------------------------ part 1
def rule(loc, depths, rounds: int, budget_s: float) -> list:
    """Ring vs pool through an engine, per batch size and depth: medians over rounds."""
    from engram import Table
    from engram.io_engine import IOEngine

    rng = np.random.default_rng(11)
    out = []
    for depth in depths:
        engine = IOEngine(64, ring_batch=0)
        client = engine.client(depth)
        runs = {}
        try:
            for r in range(rounds):
                order = ("io_uring", "pread") if r % 2 == 0 else ("pread", "io_uring")
                for ex in order:
                    with Table(loc.path, loc.offset, loc.rows, backend=ex, readers=depth, threshold=1,
                               engine=client) as t:
                        for T in SIZES:
                            buf = np.empty((T, 24, 256), np.float32)
                            t.read_batch(rng.integers(0, loc.rows, (T, 24), dtype=np.uint32), out=buf)
                            times, rows = [], 0
                            t_end = time.perf_counter() + budget_s
                            while time.perf_counter() < t_end or len(times) < 3:
                                ids = rng.integers(0, loc.rows, (T, 24), dtype=np.uint32)
                                s = time.perf_counter()
                                t.read_batch(ids, out=buf)
                                times.append(time.perf_counter() - s)
                                rows += t.last_stats.rows_distinct
                            if t.last_stats.backend != ex:
                                raise RuntimeError(f"asked for {ex}, read with {t.last_stats.backend}")
                            runs.setdefault((T, ex), []).append((statistics.median(times) * 1e3, rows / sum(times)))
        finally:
            client.close()
        for T in SIZES:
            row = {"depth": depth, "rows": T * 24}
            for ex in ("io_uring", "pread"):
                v = runs[(T, ex)]
                row[f"{ex}_p50_ms"] = statistics.median(x[0] for x in v)
                row[f"{ex}_rows_per_s"] = statistics.median(x[1] for x in v)
                row[f"{ex}_rounds"] = [round(x[1]) for x in v]
            row["ring_vs_pool"] = row["io_uring_rows_per_s"] / row["pread_rows_per_s"]
            out.append(row)
            print(f"   depth {depth:3d}, {T * 24:6d} rows: ring {row['io_uring_rows_per_s']:8.0f} rows/s "
                  f"(p50 {row['io_uring_p50_ms']:8.3f} ms), pool {row['pread_rows_per_s']:8.0f} rows/s "
                  f"(p50 {row['pread_p50_ms']:8.3f} ms): ring/pool {row['ring_vs_pool']:.2f}")
    return out


class Spinners:
    """``n`` processes spinning on the CPU for the block (killed by pid after)."""

    def __init__(self, n: int):
        self.n = n
        self.procs = []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


# ------------------------------------------------------------------ part 2
def single_session(model, tokens, pairs: int, block: int, readers: int) -> dict:
    """Session.step p50, N = 1: a private-reader session and a shared-engine one, both open, step
    through alternating blocks of ``block`` tokens (the order alternating); per backend the
    median over the pairs of the ratio of the blocks' p50s, and the p50 of every step."""
    out = {}
    pos = 0
    for backend in ("auto", "pread"):
        with model.session(engine="private", backend=backend, readers=readers) as priv, \
                model.session(engine="shared", backend=backend, readers=readers) as shar:
            if shar.tables[model.layer_ids[0]].engine is None or priv.tables[model.layer_ids[0]].engine is not None:
                raise RuntimeError("the sessions do not read as asked")
            for s in (priv, shar):
                for tok in tokens[pos:pos + 20]:  # wake the readers
                    s.step(tok)
            pos += 20
            times = {"private": [], "shared": []}
            ratios = []
            for k in range(pairs):
                medians = {}
                for name in (("private", "shared") if k % 2 == 0 else ("shared", "private")):
                    s = priv if name == "private" else shar
                    s.restore(model.hasher.new_history())
                    t_block = []
                    for tok in tokens[pos:pos + block]:
                        t = time.perf_counter()
                        s.step(tok)
                        t_block.append(time.perf_counter() - t)
                    pos += block
                    times[name] += t_block
                    medians[name] = statistics.median(t_block)
                ratios.append(medians["shared"] / medians["private"])
        priv_ms = statistics.median(times["private"]) * 1e3
        shar_ms = statistics.median(times["shared"]) * 1e3
        q1, q3 = np.percentile(ratios, [25, 75])
        out[backend] = {"private_p50_ms": priv_ms, "shared_p50_ms": shar_ms, "ratio_median": statistics.median(ratios),
                        "ratio_iqr": [float(q1), float(q3)], "pairs": pairs, "block": block}
        print(f"   N=1, {backend:5s}: Session.step p50 private {priv_ms:.3f} ms, shared {shar_ms:.3f} ms; "
              f"shared/private per pair: median {statistics.median(ratios):.3f} (IQR {q1:.3f}-{q3:.3f}, "
              f"{pairs} pairs of {block} steps)")
    return out


# ------------------------------------------------------------------ part 3
def sessions_run(model, tokens, n: int, seconds: float, engine: str, readers: int, start: int) -> dict:
    """n sessions in threads, each stepping through its own stretch for ``seconds``."""
    stride = len(tokens) // n
    rows = [0] * n
    steps = [0] * n
    errors = []
    go = threading.Event()
    stop = time.perf_counter() + 1e9

    def run(i):
        try:
            with model.session(engine=engine, readers=readers) as s:
                seq = tokens[start + i * stride:start + (i + 1) * stride]
                s.step(int(seq[0]))
                go.wait()
                k = 1
                while time.perf_counter() < stop and k < len(seq):
                    s.step(int(seq[k]))
                    rows[i] += s.last_stats.rows_distinct
                    k += 1
                steps[i] = k - 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in ths:
        th.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    stop = t0 + seconds
    go.set()
    for th in ths:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    if min(steps) >= stride - 2:
        raise RuntimeError(f"a session ran out of its {stride} tokens before {seconds} s: give more text")
    return {"rows_per_s": sum(rows) / wall, "steps": sum(steps)}


def many_sessions(model, loc_all, tokens, ns, rounds: int, seconds: float, readers: int, block: int) -> list:
    """Aggregate rows/s of N sessions through the shared engine vs fio at the engine's queue depth."""
    from engram.io_engine import ENGINE_READERS

    qd = ENGINE_READERS
    lo = min(l.offset for l in loc_all)
    hi = max(l.offset + l.rows * 264 for l in loc_all)
    names = ["fio_4k", f"fio_{block}"] + [f"shared_{n}" for n in ns] + ["private_16", "fio_4k_qd256"]
    runs = {k: [] for k in names}
    cmds = {}
    pos = 0
    per_run = int(len(tokens) / (rounds * (len(ns) + 1)))
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name.startswith("fio"):
                depth = 256 if name.endswith("qd256") else qd
                bs = 4096 if "4k" in name else block
                f = fio_randread(loc_all[0].path, lo, hi - lo, depth, seconds, bs)
                runs[name].append(f["iops"])
                cmds[name] = f["cmd"]
                continue
            engine, n = name.split("_")
            res = sessions_run(model, tokens[pos:pos + per_run], int(n), seconds, engine, readers, 0)
            pos += per_run
            runs[name].append(res["rows_per_s"])
    out = []
    med = {k: statistics.median(v) for k, v in runs.items()}
    for n in ns:
        row = {"sessions": n, "rows_per_s": med[f"shared_{n}"], "vs_fio_4k": med[f"shared_{n}"] / med["fio_4k"],
               f"vs_fio_{block}": med[f"shared_{n}"] / med[f"fio_{block}"],
               "rounds": [round(x) for x in runs[f"shared_{n}"]]}
        out.append(row)
        print(f"   {n:2d} sessions, shared engine (QD {qd}): {row['rows_per_s']:8.0f} rows/s = "
              f"{row['vs_fio_4k'] * 100:5.1f}% of fio 4k / {row[f'vs_fio_{block}'] * 100:5.1f}% of fio {block} B "
              f"at QD {qd}")
    priv = {"sessions": 16, "engine": "private", "rows_per_s": med["private_16"],
            "vs_fio_4k_qd256": med["private_16"] / med["fio_4k_qd256"],
            "rounds": [round(x) for x in runs["private_16"]]}
    print(f"   16 sessions, private readers (QD 16 x 16): {priv['rows_per_s']:8.0f} rows/s = "
          f"{priv['vs_fio_4k_qd256'] * 100:5.1f}% of fio 4k at QD 256")
    print(f"   fio QD {qd}: 4k {med['fio_4k']:.0f} IOPS, {block} B {med[f'fio_{block}']:.0f} IOPS; "
          f"QD 256 4k {med['fio_4k_qd256']:.0f} IOPS")
    return [{"fio": {k: med[k] for k in names if k.startswith("fio")}, "fio_rounds":
             {k: [round(x) for x in runs[k]] for k in names if k.startswith("fio")}, "fio_cmds": cmds,
             "shared": out, "private_16": priv}]


# ------------------------------------------------------------------ part 4
def thread_counts(model, tokens, ns) -> dict:
    """Threads the process holds with n sessions open on the pread backend: private vs shared."""
    out = {}
    for engine in ("private", "shared"):
        for n in ns:
            base = _threads()
            sessions = [model.session(engine=engine, backend="pread") for _ in range(n)]
            try:
                for s in sessions:
                    for tok in tokens[:5]:
                        s.step(int(tok))
                    s.prefill(tokens[:300]).wait(model.layer_ids[-1], timeout=120)
                out[f"{engine}_{n}"] = _threads() - base
            finally:
                for s in sessions:
                    s.close()
        print(f"   threads held, pread, {engine:7s}: " +
              ", ".join(f"{n} sessions {out[f'{engine}_{n}']}" for n in ns))
    return out


def main(argv=None) -> dict:
    from engram import EngramModel, load_tokenizer
    from engram.backends import probe_backends
    from engram.uncached import logical_block_size

    p = argparse.ArgumentParser(prog="bench_engine")
    p.add_argument("--model", type=Path, default=RESULTS / "bench-model.gguf")
    p.add_argument("--scale", type=float, default=0.02)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=6.0, help="seconds per fio / multi-session run")
    p.add_argument("--budget", type=float, default=1.5, help="seconds per batch size and executor (part 1)")
    p.add_argument("--pairs", type=int, default=40, help="pairs of blocks of the N=1 comparison (part 2)")
    p.add_argument("--block", type=int, default=40, help="steps per block (part 2)")
    p.add_argument("--sessions", default="1,4,16")
    p.add_argument("--parts", default="rule,single,many,threads")
    p.add_argument("--contention", type=int, default=2,
                   help="spinning processes during the second measurement of the rule (0: skip it)")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))

    if shutil.which("fio") is None and "many" in parts:
        raise SystemExit("fio not found (Debian: apt-get install fio)")
    status = probe_backends()
    if not status["io_uring"].usable:
        raise SystemExit(f"io_uring unusable here ({status['io_uring'].reason}): the rule needs both executors")
    info = _model(args.model, args.scale)
    locs = [info.tables[l] for l in info.layout.layer_ids]
    _drop_cache(args.model)
    fd = os.open(args.model, os.O_RDONLY)
    try:
        block = logical_block_size(fd)
    finally:
        os.close(fd)
    record = {"model": str(args.model), "load_avg_before": os.getloadavg()}
    if "rule" in parts:
        record["rule"] = rule(locs[0], (16, 64), args.rounds, args.budget)
        if args.contention:
            print(f"   the same with {args.contention} processes spinning on the {os.cpu_count()} cores:")
            with Spinners(args.contention):
                record["rule_contended"] = rule(locs[0], (16, 64), args.rounds, args.budget)
            record["contention"] = args.contention
    model = EngramModel.open(args.model)
    ns = [int(x) for x in args.sessions.split(",")]
    single = 2 * (40 + 2 * args.pairs * args.block)
    need = single + args.rounds * (len(ns) + 1) * 16 * 4000
    ids = load_tokenizer().encode(real_text(need * 6), add_special_tokens=False).ids
    tokens = np.resize(np.array(ids, np.int64), need)
    if "single" in parts:
        record["single"] = single_session(model, tokens[:single].tolist(), args.pairs, args.block, 16)
    if "many" in parts:
        rest = tokens[single:]
        record["many"] = many_sessions(model, locs, rest, ns, args.rounds, args.seconds, 16, block)
    if "threads" in parts:
        record["threads"] = thread_counts(model, tokens[:300], ns)
    record["load_avg_after"] = os.getloadavg()
    return record
