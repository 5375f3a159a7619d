"""Microbenchmarks of the real engine, the input of the calibration (``microbench.json``, SPEC §9).

- the engine's own reads by queue depth: :class:`engram.TableGroup` batches
  of uniformly random rows of both tables, 48 rows a batch (a decode step's
  size) and large batches (steady state), at ``readers`` = ring depth = the
  queue depth, per backend; 48-row batches and single rows read serially;
- the same 48-row batches with a compute spec run on each batch's rows
  before the next batch (think time);
- 48-row batches from several submitters at once (as several sessions read),
  so the device is known at the total queue depth sessions reach, not only
  at what one reader's pool or ring reaches (:func:`io_shared`);
- a cold/warm pass over the same rows, to tell a cache below ``O_DIRECT``
  from the device (:func:`cache_check`);
- ``fio`` random 4 KiB reads with ``--direct=1`` by queue depth (when fio is
  installed);
- the compute of a step on rows read at random, and the hash part of a step.

Backend ``"serial"`` reads every batch serially; the other backends read
every batch concurrently (threshold 1), through the process's I/O engine of
the device (:mod:`engram.io_engine`) as decode sessions do.  The probes of
each decode run's own time window are steps of the run's session
(:func:`sim.measure.runs.session_loop`).  Records follow :mod:`sim.core.schema`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from typing import List, Sequence

import numpy as np

from engram import Table, TableGroup
from engram.codec import ROW_BYTES, ROW_VALUES
from engram.errors import TableIOError

from sim.core.schema import STEP_ROWS, TABLE_COLUMNS, US, ComputeSpec, us_list
from .compute import compute_runner
from .configs import DEFAULT_DEPTHS

__all__ = ["BACKEND_TAG", "FIO_PERCENTILES", "cache_check", "compute_microbench", "fio_microbench",
           "hash_microbench", "io_batches", "io_depth", "io_microbench", "io_serial", "io_shared",
           "io_think", "open_tables"]

#: A number per backend, mixed into the seeds of its random row ids.
BACKEND_TAG = {"pread": 1, "io_uring": 2}

#: fio completion-latency percentiles kept in the records.
FIO_PERCENTILES = ("1.000000", "5.000000", "10.000000", "20.000000", "30.000000", "40.000000", "50.000000",
                   "60.000000", "70.000000", "80.000000", "90.000000", "95.000000", "99.000000", "99.900000")


def open_tables(info) -> List[Table]:
    """The tables of model ``info`` (:class:`engram.ModelInfo`), in layer order, each read serially on its own."""
    return [Table(info.tables[l].path, info.tables[l].offset, info.tables[l].rows, backend="serial")
            for l in sorted(info.tables)]


def _group(tables, columns: int, backend: str, readers: int) -> TableGroup:
    """The tables read together: every batch serially (backend ``"serial"``), or every batch concurrently
    with ``readers`` reads in flight through the shared I/O engine of the device (its pread pool, or an
    io_uring ring), as a decode session reads."""
    if backend == "serial":
        return TableGroup(tables, columns, backend="serial", readers=1)
    return TableGroup(tables, columns, backend=backend, readers=int(readers), threshold=1, engine="shared")


def _random_ids(rng: np.random.Generator, rows: Sequence[int], tokens: int,
                columns: int = TABLE_COLUMNS) -> np.ndarray:
    """uint32 ``[tokens, len(rows) * columns]``: uniform random row ids of each table, table after table."""
    return np.concatenate([rng.integers(0, r, (tokens, columns), dtype=np.uint32) for r in rows], axis=1)


def _time_batches(group, rng, rows, batches: int, warmup_tokens: int = 1):
    """A warm-up read of ``warmup_tokens`` steps, then ``batches`` timed reads of random 48-row steps:
    (seconds [batches], reads)."""
    clock = time.perf_counter
    dest = np.empty((1, STEP_ROWS, ROW_VALUES), np.float32)
    group.read_batch(_random_ids(rng, rows, warmup_tokens),
                     out=np.empty((warmup_tokens, STEP_ROWS, ROW_VALUES), np.float32))
    ts = np.empty(batches)
    nreads = 0
    for i in range(batches):
        ids = _random_ids(rng, rows, 1)
        t0 = clock()
        group.read_batch(ids, out=dest)
        ts[i] = clock() - t0
        nreads += group.last_stats.reads
    return ts, nreads


def _batch_record(backend: str, k: int, round_: int, ts: np.ndarray, nreads: int, **extra) -> dict:
    """An ``"io"`` record of timed 48-row batches."""
    return {"kind": "io", "tool": "engine", "backend": backend, "qd": int(k), "batch_rows": STEP_ROWS,
            "round": round_, **extra, "batch_us": us_list(ts), "rows": ts.size * STEP_ROWS, "reads": nreads}


def io_serial(tables, rng: np.random.Generator, batches: int, single_rows: int, round_: int) -> List[dict]:
    """Serial reads: ``batches`` 48-row batches and ``single_rows`` single-row reads (two records)."""
    rows = [t.rows for t in tables]
    clock = time.perf_counter
    with _group(tables, TABLE_COLUMNS, "serial", 1) as g:
        ts, nreads = _time_batches(g, rng, rows, batches)
        out = [_batch_record("serial", 1, round_, ts, nreads)]
    t = tables[0]
    one = np.empty((1, ROW_VALUES), np.float32)
    ts = np.empty(single_rows)
    for i in range(single_rows):
        ids = rng.integers(0, t.rows, 1, dtype=np.uint32)
        t0 = clock()
        t.read_rows(ids, out=one)
        ts[i] = clock() - t0
    out.append({"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": 1,
                "round": round_, "batch_us": us_list(ts), "rows": single_rows, "reads": single_rows})
    return out


def io_batches(tables, rng: np.random.Generator, backend: str, k: int, batches: int, round_: int,
               chunk: int) -> dict:
    """One more chunk of ``batches`` 48-row batches at ``readers = k`` (``backend="serial"``: serially)."""
    rows = [t.rows for t in tables]
    with _group(tables, TABLE_COLUMNS, backend, k) as g:
        ts, nreads = _time_batches(g, rng, rows, batches)
    return _batch_record(backend, k, round_, ts, nreads, chunk=chunk)


def io_depth(tables, rng: np.random.Generator, backend: str, k: int, batches: int, big_seconds: float,
             round_: int) -> List[dict]:
    """Concurrent reads at ``readers = k``: ``batches`` 48-row batches, then large batches for ``big_seconds``."""
    rows = [t.rows for t in tables]
    clock = time.perf_counter
    with _group(tables, TABLE_COLUMNS, backend, k) as g:
        ts, nreads = _time_batches(g, rng, rows, batches, warmup_tokens=2)
        out = [_batch_record(backend, k, round_, ts, nreads)]
        tokens = max(4096, 64 * int(k)) // STEP_ROWS
        big = np.empty((tokens, STEP_ROWS, ROW_VALUES), np.float32)
        n = nrows = nreads = 0
        wall = 0.0
        while wall < big_seconds or n < 2:
            ids = _random_ids(rng, rows, tokens)
            t0 = clock()
            g.read_batch(ids, out=big)
            wall += clock() - t0
            n += 1
            nrows += g.last_stats.rows_distinct
            nreads += g.last_stats.reads
        out.append({"kind": "io", "tool": "engine", "backend": backend, "qd": int(k),
                    "batch_rows": tokens * STEP_ROWS, "round": round_, "batches": n, "rows": nrows,
                    "reads": nreads, "wall_s": wall, "reads_per_s": nreads / wall})
    return out


def io_think(tables, rng: np.random.Generator, backend: str, k: int, batches: int, run, think: str,
             layer_ids: Sequence[int], round_: int) -> dict:
    """48-row batches at ``readers = k`` (``backend="serial"``: read serially) with the compute ``run`` on each
    batch's rows between batches (the think time of a closed loop): the batch times and the think times."""
    rows = [t.rows for t in tables]
    clock = time.perf_counter
    dest = np.empty((1, STEP_ROWS, ROW_VALUES), np.float32)
    C = STEP_ROWS // len(layer_ids)
    got = {lid: dest[0, j * C:(j + 1) * C] for j, lid in enumerate(layer_ids)}
    with _group(tables, C, backend, k) as g:
        g.read_batch(_random_ids(rng, rows, 1, C), out=dest)
        run(got)
        ts = np.empty(batches)
        th = np.empty(batches)
        nreads = 0
        for i in range(batches):
            ids = _random_ids(rng, rows, 1, C)
            t0 = clock()
            g.read_batch(ids, out=dest)
            t1 = clock()
            run(got)
            th[i] = clock() - t1
            ts[i] = t1 - t0
            nreads += g.last_stats.reads
    return _batch_record(backend, k, round_, ts, nreads, think=think, think_us=us_list(th))


def _submitter(info, seed: int, backend: str, k: int, seconds: float, barrier: threading.Barrier) -> tuple:
    """One submitter of :func:`io_shared`: its own tables at ``readers = k``, one warm-up batch, the barrier,
    then 48-row batches of random rows (seeded by ``seed``) back to back for ``seconds``: ``(reads, batches,
    seconds busy reading, time.perf_counter at its end)``."""
    clock = time.perf_counter
    tables = open_tables(info)
    try:
        r = np.random.default_rng(seed)
        rows = [t.rows for t in tables]
        dest = np.empty((1, STEP_ROWS, ROW_VALUES), np.float32)
        with _group(tables, TABLE_COLUMNS, backend, k) as g:
            g.read_batch(_random_ids(r, rows, 2), out=np.empty((2, STEP_ROWS, ROW_VALUES), np.float32))
            barrier.wait()
            t_end = clock() + seconds
            n = b = 0
            t_busy = 0.0
            while True:
                ids = _random_ids(r, rows, 1)
                t0 = clock()
                g.read_batch(ids, out=dest)
                t1 = clock()
                t_busy += t1 - t0
                n += g.last_stats.reads
                b += 1
                if t1 >= t_end:
                    break
            return n, b, t_busy, clock()
    finally:
        for t in tables:
            t.close()


def io_shared(info, rng: np.random.Generator, backend: str, k: int, submitters: int, seconds: float,
              round_: int) -> dict:
    """48-row batches read back to back by ``submitters`` threads at once, each with its own tables and
    ``readers = k`` (as that many sessions read, without their compute): the device at ``submitters * k``
    reads in flight.

    One submitter's pool or ring can be what limits the reads a second, not
    the device; several sessions reach more, and they pay every batch's
    own work (waking readers, sorting, decoding) as the sessions do.  Each
    thread opens its own descriptors, warms up with one batch, waits at a
    barrier, then reads decode-step batches of random rows for ``seconds``.
    Returns an ``"io"`` record with ``submitters``, ``readers``, ``qd =
    submitters * k``, ``batch_rows`` 48, the batches and reads of all threads,
    the wall time from the barrier to the last thread's end (``reads_per_s``
    at that depth) and ``batch_mean_us``.

    Raises
    ------
    TableIOError
        A table cannot be opened or a backend cannot start (in any thread).
    """
    seeds = rng.integers(0, 2**63 - 1, submitters)
    barrier = threading.Barrier(submitters + 1, timeout=120.0)
    figures: List[tuple] = [(0, 0, 0.0, 0.0)] * submitters  # (reads, batches, busy, end) of each submitter
    errors: List[BaseException] = []
    clock = time.perf_counter

    def body(i: int) -> None:
        try:
            figures[i] = _submitter(info, int(seeds[i]), backend, k, seconds, barrier)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised in the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"engram-submitter-{i}") for i in range(submitters)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = clock()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    reads, batches, busy, ends = zip(*figures)
    wall = max(max(ends) - t0, 1e-9)
    total, nb = int(sum(reads)), int(sum(batches))
    return {"kind": "io", "tool": "engine", "backend": backend, "qd": int(k) * int(submitters), "readers": int(k),
            "submitters": int(submitters), "batch_rows": STEP_ROWS, "round": round_, "batches": nb,
            "rows": nb * STEP_ROWS, "reads": total, "wall_s": wall, "reads_per_s": total / wall,
            "batch_mean_us": sum(busy) / max(nb, 1) / US}


def cache_check(tables, rng: np.random.Generator, batches: int, round_: int) -> dict:
    """Fresh rows, then the same rows again: does a cache below ``O_DIRECT`` serve re-reads?

    ``batches`` serial 48-row batches of fresh random rows (the first pass),
    then the same batches in the same order (the re-read).  A host's page
    cache under a virtual disk, or a device's own cache, serves the second
    pass faster; the microbenchmarks and runs read fresh rows, so they measure
    the device, but a cache makes a small table look faster than a large one.
    Returns a ``"cache"`` record: ``cold_us``, ``warm_us`` (per batch) and
    ``warm_over_cold`` (ratio of the means).
    """
    rows = [t.rows for t in tables]
    ids = [_random_ids(rng, rows, 1) for _ in range(batches)]
    dest = np.empty((1, STEP_ROWS, ROW_VALUES), np.float32)
    clock = time.perf_counter
    out = {}
    with _group(tables, TABLE_COLUMNS, "serial", 1) as g:
        for name in ("cold", "warm"):
            ts = np.empty(batches)
            for i, x in enumerate(ids):
                t0 = clock()
                g.read_batch(x, out=dest)
                ts[i] = clock() - t0
            out[name] = ts
    return {"kind": "cache", "round": round_, "batch_rows": STEP_ROWS, "cold_us": us_list(out["cold"]),
            "warm_us": us_list(out["warm"]), "warm_over_cold": float(out["warm"].mean() / out["cold"].mean()),
            "reads": 2 * batches * STEP_ROWS}


def io_microbench(info, *, backends: Sequence[str] = ("pread", "io_uring"),
                  depths: Sequence[int] = DEFAULT_DEPTHS, batches: int = 60, big_seconds: float = 0.2,
                  single_rows: int = 200, seed: int = 0, round_: int = 0, progress=None) -> List[dict]:
    """The engine's own reads by queue depth, on uniformly random rows of both tables.

    Per backend and depth ``k >= 2`` (``readers`` = ring depth = ``k``,
    threshold 1): ``batches`` batches of 48 rows (24 a table, one decode
    step's worth) timed one by one, then large batches (``max(4096,
    64 k)`` rows) for ``big_seconds`` (steady-state reads/s).  Serially
    (``qd`` 1): ``batches`` 48-row batches and ``single_rows`` single-row
    reads.  Deterministic row ids (``seed``, ``round_``).

    Parameters
    ----------
    info : engram.ModelInfo
        The model whose tables are read (``read_model(path)``).

    Returns
    -------
    list of dict
        Records of kind ``"io"``, tool ``"engine"`` (see :mod:`sim.core.schema`).

    Raises
    ------
    TableIOError
        A table cannot be opened or a backend cannot start.
    """
    tables = open_tables(info)
    out: List[dict] = []
    try:
        out += io_serial(tables, np.random.default_rng([seed, round_, 1]), batches, single_rows, round_)
        if progress is not None:
            progress(1)
        for be in backends:
            for k in depths:
                if k < 2:
                    continue
                rng = np.random.default_rng([seed, round_, 2, BACKEND_TAG[be], int(k)])
                out += io_depth(tables, rng, be, int(k), batches, big_seconds, round_)
                if progress is not None:
                    progress(1)
    finally:
        for t in tables:
            t.close()
    return out


def fio_microbench(info, depths: Sequence[int] = DEFAULT_DEPTHS, seconds: float = 0.5, round_: int = 0,
                   progress=None) -> List[dict]:
    """fio random 4 KiB reads of the first table's extent with ``--direct=1`` (io_uring), by queue depth.

    Returns an empty list when fio is not installed.  Each record has
    ``iops``, ``mean_us`` (total latency, submission to completion) and
    ``pNN_us`` completion-latency percentiles, and the command line.

    Raises
    ------
    TableIOError
        fio fails on the file (its message is kept).
    """
    exe = shutil.which("fio")
    if exe is None:
        return []
    loc = info.tables[sorted(info.tables)[0]]
    off = loc.offset // 4096 * 4096
    size = (loc.offset + loc.rows * ROW_BYTES - off) // 4096 * 4096
    out = []
    for qd in depths:
        cmd = [exe, "--name=engram-randread", f"--filename={loc.path}", "--rw=randread", "--bs=4k", "--direct=1",
               "--ioengine=io_uring", f"--iodepth={int(qd)}", f"--offset={off}", f"--size={size}",
               f"--runtime={max(1, int(round(seconds * 1000)))}ms", "--time_based", "--randrepeat=0", "--norandommap",
               "--output-format=json"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise TableIOError(f"fio could not run ({exe}, qd {qd}): {exc.strerror or exc}") from None
        if res.returncode != 0:
            raise TableIOError(f"fio failed on {loc.path} (qd {qd}): {_fio_failure(res)}")
        try:
            job = json.loads(res.stdout)["jobs"][0]["read"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise TableIOError(f"fio on {loc.path} (qd {qd}) printed no JSON result: {_fio_failure(res)}") from None
        pct = job["clat_ns"].get("percentile", {})
        rec = {"kind": "io", "tool": "fio", "qd": int(qd), "round": round_, "iops": float(job["iops"]),
               "mean_us": float(job["lat_ns"]["mean"]) / 1e3, "clat_mean_us": float(job["clat_ns"]["mean"]) / 1e3,
               "ios": int(job.get("total_ios", 0)), "cmd": " ".join(cmd[1:]).join(("fio ", ""))}
        for p in FIO_PERCENTILES:
            if p in pct:
                rec[f"p{float(p):g}_us"] = float(pct[p]) / 1e3
        out.append(rec)
        if progress is not None:
            progress(1)
    return out


def _fio_failure(res: subprocess.CompletedProcess) -> str:
    """fio's exit status and what it said (stderr, else stdout), never empty."""
    status = (f"killed by signal {-res.returncode}" if res.returncode < 0 else f"exit status {res.returncode}")
    said = (res.stderr or "").strip() or (res.stdout or "").strip()
    return f"{status}; " + (f"fio said: {said[-600:]}" if said else "fio printed nothing")


def compute_microbench(model, computes: Sequence[str], *, samples: int = 100, mixer_samples: int = 15,
                       seed: int = 0, round_: int = 0, progress=None) -> List[dict]:
    """Time each compute spec on one token's rows, read for random token ids (not from any trace).

    ``samples`` calls per spec (``mixer_samples`` when the spec holds the
    mixer), each on the rows of a fresh step of a random token, after one
    warm-up call.  Returns records of kind ``"compute"`` with ``samples_us``.
    """
    rng = np.random.default_rng([seed, round_, 3])
    out = []
    clock = time.perf_counter
    with model.session(backend="serial") as s:
        for label in dict.fromkeys(ComputeSpec.parse(c).label for c in computes):
            spec = ComputeSpec.parse(label)
            run = compute_runner(spec, model, s, residual_seed=seed)
            n = mixer_samples if spec.mixer else samples
            toks = rng.integers(0, len(model.token_map), n + 1).tolist()
            ts = np.empty(n)
            for i, tok in enumerate(toks):
                rows = s.step(tok)
                t0 = clock()
                run(rows)
                dt = clock() - t0
                if i:
                    ts[i - 1] = dt
            out.append({"kind": "compute", "compute": label, "round": round_, "samples_us": us_list(ts)})
            if progress is not None:
                progress(1)
    return out


def hash_microbench(model, samples: int = 2000, seed: int = 0, round_: int = 0) -> dict:
    """Time the hash part of a step, :meth:`engram.Session.step_rows`, on random token ids (``"hash"`` record)."""
    rng = np.random.default_rng([seed, round_, 4])
    toks = rng.integers(0, len(model.token_map), samples).tolist()
    clock = time.perf_counter
    ts = np.empty(samples)
    with model.session(backend="serial") as s:
        for i, tok in enumerate(toks):
            t0 = clock()
            s.step_rows(tok)
            ts[i] = clock() - t0
    return {"kind": "hash", "round": round_, "samples_us": us_list(ts)}
