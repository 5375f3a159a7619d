"""The CPU a decode step takes on the host, in parts: the profile the simulator's host model reads
(:mod:`sim.decode.host`, ``sim/data/hosts/engine-cpu.json``).

Side by side in one run on one model file: fio's random reads at QD1 at the engine's read size (its
``usr_cpu + sys_cpu`` per read: :func:`sim.device.fio.cpu_per_read`), then one decode session of the engine
(``pread`` x 4, threshold 8, a 5 ms sleep after each step as the measured runs' ``sleep:5``) on a real text:
its process's CPU time (every thread: the session's and its readers') a step as it runs; the same steps
again through a row cache holding every row (all hits: the engine's own CPU a step, no read); and the same
batches read raw through the session's readers (the read path alone).  The engine's CPU per read over
fio's is the ratio the model scales a planner's fio figure by; own + reads over a step's CPU says how far
the parts add up.

``--modes-only`` measures instead ``--sessions`` sessions at once, as threads of one process and as processes
(forked), in alternating order: the CPU a step of the processes over the threads' (each process has its own
engine and pool of readers, woken and switched to across address spaces, where the threads share one engine
whose busy readers take the next read without sleeping).  With the CPUs busy (32 sessions on 2 CPUs), where
the host binds; with them mostly idle the two differ less.  ``--write-profile`` then writes only the
profile's ``process_cpu_ratio``: the host model scales the CPU a step and a read of sessions as processes by it
(:mod:`sim.decode.host`).  ``--tmpfs`` runs that pass on a copy of the model in ``/dev/shm`` instead (a memory
copy in each reader), reported only.

``python -m benchmarks.run host [--steps 2000] [--scale 0.005] [--sleep-ms 5] [--write-profile]``,
``python -m benchmarks.run host --modes-only --steps 200 --rounds 5``;
``--write-profile`` writes the package's profile (the figures, this machine, the date, the command).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import resource
import threading
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import engram
from engram.codec import ROW_BYTES
from engram.synth import ModelShape, build_model

from sim.core.io import now_iso, packaged_data_path
from sim.decode.host import ENGINE_PROFILE
from sim.device.fio import cpu_per_read, fio_records, read_fio_output
from sim.measure.devices import engine_read_size, fio_json

from .common import RESULTS, machine, real_text


def _model(scale: float) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"host-model-s{scale:g}.gguf"
    if not path.exists():
        build_model(path, ModelShape(scale=scale), progress=False)
    return path


def fio_read_cpu(path: Path, seconds: float) -> dict:
    """fio at QD1 at the engine's read size on the model's first table: CPU per read (us), mean latency (us)."""
    bs = engine_read_size(path)[0]
    with tempfile.TemporaryDirectory() as d:
        out = fio_json(path, Path(d) / "fio.json", bs, depths=(1,), seconds=seconds)
        recs = fio_records(read_fio_output(out), str(out))
    cpu = cpu_per_read(recs)
    return {"bs": bs, "cpu_per_read_us": None if cpu is None else cpu * 1e6,
            "qd1_mean_us": float(np.median([r["mean"] for r in recs])) * 1e6}


def _steps(s, ids, pause: float) -> tuple:
    """``(process CPU s, wall s of the steps alone, reads, row ids [n, 1, 48])`` of stepping ``s`` over ``ids``,
    a ``pause`` sleep after each step."""
    reads, kept, wall = 0, [], 0.0
    c0 = time.process_time()
    for t in ids:
        w = time.perf_counter()
        s.step(t)
        wall += time.perf_counter() - w
        reads += s.last_stats.reads
        kept.append(s.last_row_ids.reshape(1, -1).copy())
        if pause:
            time.sleep(pause)
    return time.process_time() - c0, wall, reads, kept


def _memory_reads(path: Path, kept: list, pause: float, readers: int, threshold: int):
    """Process CPU seconds of reading the batches ``kept`` raw through a session's readers from a copy of the
    model on tmpfs (``/dev/shm``): a memory copy in each reader, no drive; None where there is no tmpfs or it
    refuses the engine's uncached reads."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return None
    with tempfile.TemporaryDirectory(dir=shm) as d:
        copy = Path(d) / path.name
        shutil.copyfile(path, copy)
        try:
            model = engram.EngramModel.open(copy)
        except engram.EngramError as exc:
            print(f"   tmpfs: {exc}; no memory figure")
            return None
        with model.session(backend="pread", readers=readers, threshold=threshold, cache=None) as s:
            group = s._group
            raw = np.empty((1, kept[0].shape[1], ROW_BYTES), np.uint8)
            for k in kept[:200]:          # the readers awake
                group.read_raw(k, out=raw)
            r0 = time.process_time()
            for k in kept:
                group.read_raw(k, out=raw)
                if pause:
                    time.sleep(pause)
            return time.process_time() - r0


def session_cpu(path: Path, steps: int, sleep_ms: float, readers: int = 4, threshold: int = 8) -> dict:
    """CPU a decode step takes on this machine, in three parts measured one after the other on the same tokens,
    each step followed by a ``sleep_ms`` sleep (a compute that takes no CPU, as the measured runs' ``sleep:MS``),
    process CPU time (every thread):

    - ``cpu_per_step_us``: a session's steps as they run (hash, 48 rows read, decode);
    - ``own_cpu_per_step_us``: the same steps again through a row cache that holds every row (all hits: the
      hash, the cache's lookup and the decode, no read) -- the engine's own CPU a step;
    - ``reads_only_cpu_per_step_us``: the same batches read raw through the session's readers (no hash, no
      decode) -- the read path alone; over the reads a step, the engine's CPU a read;
    - ``wake_us``: the batches read again in pairs, one after a ``sleep_ms`` sleep and the next right after it
      (pairs keep a drive's drift out): the first's mean wall
      (``batch_after_sleep_us``) less the second's (``batch_back_to_back_us``) -- the engine's hand-offs to its
      readers and back waking idle CPUs, which a drive measured back to back (fio) does not show.
    """
    model = engram.EngramModel.open(path)
    ids = model.encode(real_text(steps * 8))[:steps + 200]
    if len(ids) < steps + 200:
        raise SystemExit(f"the text gives {len(ids)} tokens, fewer than {steps + 200}")
    warm, timed = ids[:200].tolist(), ids[200:200 + steps].tolist()
    pause = sleep_ms * 1e-3
    with model.session(backend="pread", readers=readers, threshold=threshold, cache=None) as s:
        _steps(s, warm, 0.0)              # the readers awake, the weights' pages touched
        cpu, wall, reads, kept = _steps(s, timed, pause)
        group = s._group                  # the same batches again, raw: the read path alone
        raw = np.empty((1, kept[0].shape[1], ROW_BYTES), np.uint8)
        r0 = time.process_time()
        for k in kept:
            group.read_raw(k, out=raw)
            if pause:
                time.sleep(pause)
        raw_cpu = time.process_time() - r0
        after, back = [], []              # in pairs: a batch after the step's sleep, the next one right after it
        for i, k in enumerate(kept):
            if pause and i % 2 == 0:
                time.sleep(pause)
            w = time.perf_counter()
            group.read_raw(k, out=raw)
            (after if i % 2 == 0 else back).append(time.perf_counter() - w)
        back = float(np.mean(back)) if back else float(np.mean(after))
    mem_cpu = _memory_reads(path, kept, 0.0, readers, threshold)
    cache = engram.RowCache(max(1, 2 * 48 * (steps + 200)) * ROW_BYTES, "lru")
    with model.session(backend="pread", readers=readers, threshold=threshold, cache=cache) as s:
        _steps(s, warm + timed, 0.0)      # every row of the tokens into the cache
        own, own_wall, own_reads, _ = _steps(s, timed, pause)
    if own_reads > 0.01 * reads:
        raise SystemExit(f"the cache missed {own_reads} reads of {reads}: the all-hit pass read the device")
    return {"steps": steps, "cpu_per_step_us": cpu / steps * 1e6, "wall_per_step_us": wall / steps * 1e6,
            "rows_per_step": reads / steps, "reads_only_cpu_per_step_us": raw_cpu / steps * 1e6,
            "own_cpu_per_step_us": own / steps * 1e6, "own_wall_per_step_us": own_wall / steps * 1e6,
            "own_reads_per_step": own_reads / steps,
            "memory_reads_only_cpu_per_step_us": None if mem_cpu is None else mem_cpu / steps * 1e6,
            "batch_after_sleep_us": float(np.mean(after)) * 1e6, "batch_back_to_back_us": back * 1e6,
            "wake_us": max(0.0, float(np.mean(after)) - back) * 1e6,
            "readers": readers, "threshold": threshold, "sleep_ms": sleep_ms}


def _cpu_s() -> float:
    """CPU seconds of this process so far (every thread; user + system)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _mode_worker(path: str, ids: list, pause: float, readers: int, threshold: int, start, out) -> None:
    """One session of :func:`mode_cpu`: open the model, wake its readers, wait at ``start``, step over ``ids``
    with a ``pause`` sleep after each step; put ``(CPU s of its process, reads)`` into ``out``.  In a thread the
    CPU is the whole process's (the caller takes it); in a process its own, readers included."""
    model = engram.EngramModel.open(path)
    with model.session(backend="pread", readers=readers, threshold=threshold, cache=None) as s:
        for t in ids[:50]:
            s.step(t)
        start.wait()
        c0, reads = _cpu_s(), 0
        for t in ids[50:]:
            s.step(t)
            reads += s.last_stats.reads
            time.sleep(pause)
        out.put((_cpu_s() - c0, reads))


def mode_cpu(path: Path, sessions: int, steps: int, sleep_ms: float, readers: int = 4, threshold: int = 8,
             processes_first: bool = False) -> dict:
    """CPU a step of ``sessions`` sessions at once, each on its own stretch of the real text (``steps`` steps, a
    ``sleep_ms`` sleep after each), as threads of this process and as forked processes, one after the other
    (``processes_first``: that order): ``{"threads_cpu_per_step_us", "processes_cpu_per_step_us", "ratio"}``."""
    ids = engram.EngramModel.open(path).encode(real_text((steps + 50) * sessions * 8))
    need = (steps + 50) * sessions
    if len(ids) < need:
        raise SystemExit(f"the text gives {len(ids)} tokens, fewer than {need}")
    stretches = [ids[i * (steps + 50):(i + 1) * (steps + 50)].tolist() for i in range(sessions)]
    got = {}
    for mode in (("processes", "threads") if processes_first else ("threads", "processes")):
        if mode == "threads":
            out, start = queue.Queue(), threading.Barrier(sessions + 1)
            ws = [threading.Thread(target=_mode_worker, args=(str(path), st, sleep_ms * 1e-3, readers, threshold,
                                                               start, out)) for st in stretches]
        else:
            ctx = mp.get_context("fork")
            out, start = ctx.Queue(), ctx.Barrier(sessions + 1)
            ws = [ctx.Process(target=_mode_worker, args=(str(path), st, sleep_ms * 1e-3, readers, threshold,
                                                         start, out)) for st in stretches]
        for w in ws:
            w.start()
        start.wait()
        c0 = _cpu_s()
        res = [out.get() for _ in ws]
        for w in ws:
            w.join()
        cpu = _cpu_s() - c0 if mode == "threads" else sum(c for c, _ in res)
        got[mode] = cpu / (sessions * steps) * 1e6
    return {"sessions": sessions, "threads_cpu_per_step_us": got["threads"],
            "processes_cpu_per_step_us": got["processes"], "ratio": got["processes"] / got["threads"]}


def _modes_only(a, path: Path, argv) -> dict:
    """``--modes-only``: :func:`mode_cpu` over ``a.rounds`` rounds (alternating which mode goes first), and their
    median ratio; with ``--write-profile`` the package profile's ``process_cpu_ratio`` (that median),
    ``process_sessions`` and their own ``process_command`` and ``process_date``, its other figures left."""
    rounds = []
    for i in range(a.rounds):
        m = mode_cpu(path, a.sessions, a.steps, a.sleep_ms, processes_first=bool(i % 2))
        rounds.append(m)
        print(f"   round {i + 1}: {a.sessions} sessions as processes {m['processes_cpu_per_step_us']:.0f} us CPU a "
              f"step, as threads {m['threads_cpu_per_step_us']:.0f} us: {m['ratio']:.3f}x")
    ratio = float(np.median([m["ratio"] for m in rounds]))
    print(f"   median: sessions as processes {ratio:.3f}x the CPU a step of threads")
    rec = {"machine": machine(), "date": now_iso(), "rounds": rounds, "process_cpu_ratio": ratio,
           "sessions": a.sessions, "steps": a.steps}
    if a.write_profile:
        out = packaged_data_path(ENGINE_PROFILE)
        prof = json.loads(out.read_text(encoding="utf-8"))
        prof.update(process_cpu_ratio=round(ratio, 3), process_sessions=a.sessions, process_date=rec["date"],
                    process_command=("python -m benchmarks.run host " + " ".join(argv or [])).strip())
        out.write_text(json.dumps(prof, indent=1) + "\n", encoding="utf-8")
        print(f"   wrote process_cpu_ratio to {out}")
    return rec


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run host", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000, help="decode steps of the session (default 2000)")
    p.add_argument("--scale", type=float, default=0.005, help="the model's table scale (default 0.005)")
    p.add_argument("--sleep-ms", type=float, default=5.0,
                   help="a sleep after each step, ms (default 5: the measured runs' sleep:5)")
    p.add_argument("--fio-seconds", type=float, default=3.0, help="fio's run at QD1, seconds (default 3)")
    p.add_argument("--write-profile", action="store_true",
                   help=f"write the figures to the package's sim/data/{ENGINE_PROFILE}")
    p.add_argument("--rounds", type=int, default=3, help="rounds of fio and the session; the profile takes the "
                   "medians (default 3)")
    p.add_argument("--sessions", type=int, default=32, help="sessions at once of the threads-or-processes pass, "
                   "enough to keep the CPUs busy, where the host binds (default 32)")
    p.add_argument("--modes-only", action="store_true",
                   help="only the threads-or-processes pass (--steps steps a session, --sessions at once); with "
                        "--write-profile, only the profile's process_cpu_ratio is rewritten")
    p.add_argument("--tmpfs", action="store_true",
                   help="with --modes-only: the pass on a copy of the model in /dev/shm (a memory copy in each "
                        "reader, no drive); not with --write-profile (the profile's ratio is a drive's)")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.steps < 1 or a.sessions < 1:
        p.error("--rounds, --steps and --sessions must be >= 1")
    if a.tmpfs and (not a.modes_only or a.write_profile):
        p.error("--tmpfs goes with --modes-only, without --write-profile")
    path = _model(a.scale)
    if a.modes_only and a.tmpfs:
        if not Path("/dev/shm").is_dir():
            raise SystemExit("--tmpfs: no /dev/shm here")
        with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
            copy = Path(d) / path.name
            shutil.copyfile(path, copy)
            return dict(_modes_only(a, copy, argv), device="tmpfs")
    if a.modes_only:
        return _modes_only(a, path, argv)
    rounds = []
    for i in range(a.rounds):
        fio = fio_read_cpu(path, a.fio_seconds)
        if fio["cpu_per_read_us"] is None:
            raise SystemExit("fio gave no CPU figures: run it longer (--fio-seconds)")
        ses = session_cpu(path, a.steps, a.sleep_ms)
        engine_read = ses["reads_only_cpu_per_step_us"] / ses["rows_per_step"]
        mem = ses["memory_reads_only_cpu_per_step_us"]
        mem_read = None if mem is None else mem / ses["rows_per_step"]
        parts = ses["own_cpu_per_step_us"] + ses["rows_per_step"] * engine_read
        wake = ses["wake_us"]
        rounds.append({"fio": fio, "session": ses, "engine_read_cpu_us": engine_read, "memory_read_cpu_us": mem_read,
                       "read_cpu_ratio": engine_read / fio["cpu_per_read_us"],
                       "parts_over_step": parts / ses["cpu_per_step_us"], "wake_us": wake})
        print(f"   round {i + 1}: fio QD1 {fio['bs']} B {fio['cpu_per_read_us']:.2f} us CPU a read "
              f"({fio['qd1_mean_us']:.1f} us mean); a step {ses['cpu_per_step_us']:.1f} us CPU "
              f"({ses['rows_per_step']:.1f} reads); the engine's own (every row a cache hit) "
              f"{ses['own_cpu_per_step_us']:.1f} us; the reads alone {engine_read:.2f} us a read = "
              f"{engine_read / fio['cpu_per_read_us']:.2f}x fio's; own + reads = {parts / ses['cpu_per_step_us']:.2f} "
              "of the step" + ("" if mem_read is None else f"; a read from tmpfs {mem_read:.2f} us")
              + f"; a batch after the sleep {ses['batch_after_sleep_us']:.0f} us, back to back "
              f"{ses['batch_back_to_back_us']:.0f} us: a wake-up of {wake:.0f} us")
    med = lambda f: float(np.median([f(r) for r in rounds]))  # noqa: E731
    own = med(lambda r: r["session"]["own_cpu_per_step_us"])
    ratio = med(lambda r: r["read_cpu_ratio"])
    fio_us = med(lambda r: r["fio"]["cpu_per_read_us"])
    mems = [r["memory_read_cpu_us"] for r in rounds if r["memory_read_cpu_us"] is not None]
    mem_us = float(np.median(mems)) if mems else None
    wake = med(lambda r: r["wake_us"])
    rec = {"machine": machine(), "memory_read_cpu_us": mem_us, "date": now_iso(), "rounds": rounds,
           "step_cpu_us": own, "read_cpu_us": fio_us, "read_cpu_ratio": ratio, "wake_us": wake,
           "parts_over_step": med(lambda r: r["parts_over_step"])}
    print(f"   medians: the engine's own {own:.1f} us CPU a step; a read {ratio:.3f}x fio's {fio_us:.2f} us; own + "
          f"reads {rec['parts_over_step']:.2f} of a step's CPU; a step's wake-up {wake:.0f} us")
    if a.write_profile:
        cmd = "python -m benchmarks.run host " + " ".join(argv or [])
        prof = {"step_cpu_us": round(own, 1), "read_cpu_us": round(fio_us, 2), "read_cpu_ratio": round(ratio, 3),
                "machine": rec["machine"], "date": rec["date"], "command": cmd.strip(),
                **({"memory_read_cpu_us": round(mem_us, 2)} if mem_us is not None else {}),
                "wake_us": round(wake, 1),
                "rounds": a.rounds, "steps": a.steps, "sleep_ms": a.sleep_ms,
                "what": "medians over the rounds: the engine's own CPU a decode step with every row a row-cache "
                        "hit (hash, the lookup, decode, the session's Python), fio's CPU per read at QD1 on the "
                        "same file, the engine's pread CPU a read over fio's, the engine's pread CPU a read from a "
                        "copy on tmpfs (a memory copy, no drive), and a 48-row batch's wall after the step's sleep "
                        "over the next one right after it (wake_us); process_cpu_ratio (--modes-only): the CPU a step "
                        "of sessions as processes over threads of one process: sim.decode.host reads them"}
        out = packaged_data_path(ENGINE_PROFILE)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.is_file():  # the --modes-only figures are measured on their own: kept
            old = json.loads(out.read_text(encoding="utf-8"))
            prof.update({k: v for k, v in old.items() if k.startswith("process_")})
        out.write_text(json.dumps(prof, indent=1) + "\n", encoding="utf-8")
        print(f"   wrote {out}")
    return rec
