"""Storage engine vs the device limit (fio) and vs simpler readers, on one multi-GiB model file.

Part 1, prefill-size batches: fio random ``O_DIRECT`` reads of the first
table's extent at queue depth 1, 16 and 64 (io_uring engine, one job), of
4 KiB (the usual device limit) and of the device's logical block (what the
engine reads for most rows: 512 B here), then this engine's rows/s on batches
of 2048 x 24 uniformly random rows of the same table with ``readers`` (pread
pool) or ring depth (io_uring) equal to that queue depth.  Ratio = engine
rows/s / fio IOPS.  The four measurements of a depth run in interleaved rounds
(the order rotating), medians over the rounds, since a shared virtual disk
drifts from one few-second window to the next.

Part 2, decode-size batches: the 48 row ids (24 per table) of each decode step
of a real text trace (Italian novel, DeepSeek V4 tokenizer, the model's own
layout), read as one batch of both tables: p50 step time of the engine's
concurrent read vs the same rows read serially, and vs a plain Python reader
(``os.preadv`` into aligned buffers on a ThreadPoolExecutor, then
``decode_rows``); the device floor is 48 reads at the best IOPS fio reached.

Backends that do not start here (``engram info``) are left out and named.
The model file is built once with ``engram.synth.build_model`` (default
``--scale 0.02``: two tables of 7.68 M rows, 2.03 GB each) and kept under
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .common import RESULTS, real_text


def _model(path: Path, scale: float):
    from engram import read_model
    from engram.synth import ModelShape, build_model

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"   building {path} (scale {scale}) ...")
        build_model(path, ModelShape(scale=scale), progress=True)
    return read_model(path)


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fio_randread(path: Path, offset: int, size: int, qd: int, seconds: float, bs: int = 4096) -> dict:
    """fio: random ``bs``-byte O_DIRECT reads of [offset, offset+size) at queue depth ``qd``."""
    cmd = ["fio", "--name=engram-randread", f"--filename={path}", "--rw=randread", f"--bs={bs}", "--direct=1",
           "--ioengine=io_uring", f"--iodepth={qd}", f"--offset={offset // 4096 * 4096}",
           f"--size={size // 4096 * 4096}", f"--runtime={seconds}", "--time_based", "--randrepeat=0",
           "--norandommap", "--output-format=json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"fio failed (exit {res.returncode}, qd {qd}, bs {bs}): {res.stderr.strip()}")
    job = json.loads(res.stdout)["jobs"][0]["read"]
    return {"iops": job["iops"], "p50_us": job["clat_ns"]["percentile"]["50.000000"] / 1000, "cmd": " ".join(cmd)}


def engine_prefill(table_args, backend: str, qd: int, seconds: float, seed: int) -> dict:
    from engram import Table

    path, offset, rows = table_args
    rng = np.random.default_rng(seed)
    out = np.empty((2048, 24, 256), np.float32)
    with Table(path, offset, rows, backend=backend, readers=qd, threshold=1) as t:
        t.read_batch(rng.integers(0, rows, (2048, 24), dtype=np.uint32), out=out)  # warm the readers
        n = reads = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t.read_batch(rng.integers(0, rows, (2048, 24), dtype=np.uint32), out=out)
            n += t.last_stats.rows_requested
            reads += t.last_stats.reads
        wall = time.perf_counter() - t0
        used = t.backend
    if used != backend:
        raise RuntimeError(f"asked for {backend}, read with {used}")
    return {"rows_per_s": n / wall, "reads_per_s": reads / wall, "backend": used}


def prefill_depth(t0, qd: int, backends, rounds: int, seconds: float, block: int) -> dict:
    """fio (4 KiB and ``block`` bytes) and each engine backend at queue depth ``qd``: interleaved
    rounds with the order rotating; medians and ratios to fio."""
    names = ["fio_4k", f"fio_{block}"] + list(backends)
    runs = {n: [] for n in names}
    cmds = {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name.startswith("fio_"):
                bs = 4096 if name == "fio_4k" else block
                f = fio_randread(t0.path, t0.offset, t0.rows * 264, qd, seconds, bs)
                runs[name].append(f["iops"])
                cmds[name] = f["cmd"]
            else:
                e = engine_prefill((str(t0.path), t0.offset, t0.rows), name, qd, seconds, seed=qd * 100 + r)
                runs[name].append(e["rows_per_s"])
    row = {"qd": qd, "runs": runs, "fio_cmds": cmds}
    for name in names:
        row[name] = statistics.median(runs[name])
    for b in backends:
        row[f"{b}_vs_fio_4k"] = row[b] / row["fio_4k"]
        row[f"{b}_vs_fio_{block}"] = row[b] / row[f"fio_{block}"]
    return row


def python_reader(fd: int, offsets: np.ndarray, pool: ThreadPoolExecutor, bufs, align: int) -> np.ndarray:
    """Plain Python: one os.preadv per row into an aligned buffer, then decode_rows."""
    from engram import decode_rows

    def one(i: int) -> bytes:
        off = int(offsets[i])
        start = off // align * align
        n = (off + 264 - start + align - 1) // align * align
        view = memoryview(bufs[i])[:n]
        got = os.preadv(fd, [view], start)
        if got < off + 264 - start:
            raise OSError("short read")
        return bytes(view[off - start:off - start + 264])

    raw = b"".join(pool.map(one, range(len(offsets))))
    return decode_rows(np.frombuffer(raw, np.uint8).reshape(-1, 264))


def main(argv=None) -> dict:
    from engram import Hasher, Table, TableGroup, build_token_map, load_tokenizer
    from engram.backends import probe_backends
    from engram.uncached import logical_block_size

    p = argparse.ArgumentParser(prog="bench_table")
    p.add_argument("--model", type=Path, default=RESULTS / "bench-model.gguf")
    p.add_argument("--scale", type=float, default=0.02,
                   help="bucket-size scale of the synthetic model (0.02: two tables of 2.03 GB each)")
    p.add_argument("--seconds", type=float, default=6.0, help="seconds per fio / engine measurement")
    p.add_argument("--depths", default="1,16,64")
    p.add_argument("--steps", type=int, default=400, help="decode steps of the trace")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per queue depth (medians)")
    args = p.parse_args(argv)

    if shutil.which("fio") is None:
        raise SystemExit("fio not found (Debian: apt-get install fio)")
    info = _model(args.model, args.scale)
    lid0, lid1 = info.layout.layer_ids[:2]
    t0, t1 = info.tables[lid0], info.tables[lid1]
    size_gib = (t0.rows * 264) / 2**30
    print(f"   model {args.model} ({os.path.getsize(args.model) / 2**30:.2f} GiB), table {lid0}: "
          f"{t0.rows} rows, {size_gib:.2f} GiB at offset {t0.offset}")
    _drop_cache(args.model)
    status = probe_backends()
    backends = [b for b in ("pread", "io_uring") if status[b].usable]
    left_out = {b: status[b].reason for b in ("pread", "io_uring") if not status[b].usable}
    for b, why in left_out.items():
        print(f"   {b} left out: {why}")
    fd = os.open(args.model, os.O_RDONLY)
    try:
        block = logical_block_size(fd)
    finally:
        os.close(fd)
    prefill = []
    for qd in [int(x) for x in args.depths.split(",")]:
        row = prefill_depth(t0, qd, backends, args.rounds, args.seconds, block)
        prefill.append(row)
        print(f"   QD {qd:3d}: fio 4k {row['fio_4k']:9.0f} IOPS, fio {block} B {row[f'fio_{block}']:9.0f} IOPS | " +
              " | ".join(f"{b} {row[b]:9.0f} rows/s ({row[f'{b}_vs_fio_4k'] * 100:5.1f}% / "
                         f"{row[f'{b}_vs_fio_{block}'] * 100:5.1f}%)" for b in backends))

    # Decode-size batches from a real text trace.
    tmap = build_token_map()
    ids = np.array(load_tokenizer().encode(real_text(20_000), add_special_tokens=False).ids[: args.steps])
    trace = Hasher(info.layout, tmap).hash(ids)  # [T, 2, 24]
    steps = trace[:, :2, :].reshape(len(ids), 48)
    decode = {}
    for name, backend, readers in [("serial", "serial", 1)] + [(b, b, 48) for b in backends]:
        with Table(t0.path, t0.offset, t0.rows, backend=backend, readers=readers) as ta, \
                Table(t1.path, t1.offset, t1.rows, backend=backend, readers=readers) as tb, \
                TableGroup([ta, tb], 24, threshold=8) as g:
            out = np.empty((1, 48, 256), np.float32)
            times = []
            for s in range(len(steps)):
                t = time.perf_counter()
                g.read_batch(steps[s:s + 1], out=out)
                times.append(time.perf_counter() - t)
            decode[name] = {"p50_ms": statistics.median(times) * 1e3,
                            "mean_ms": statistics.fmean(times) * 1e3}
    # plain Python reader on the same rows (O_DIRECT descriptor, aligned buffers)
    fd = os.open(t0.path, os.O_RDONLY | os.O_DIRECT)
    try:
        bufs = [mmap.mmap(-1, 8192) for _ in range(48)]
        times = []
        with ThreadPoolExecutor(16) as pool:
            for s in range(len(steps)):
                offs = np.concatenate([t0.offset + steps[s, :24].astype(np.int64) * 264,
                                       t1.offset + steps[s, 24:].astype(np.int64) * 264])
                t = time.perf_counter()
                python_reader(fd, offs, pool, bufs, 4096)
                times.append(time.perf_counter() - t)
        decode["python_threadpool16"] = {"p50_ms": statistics.median(times) * 1e3,
                                         "mean_ms": statistics.fmean(times) * 1e3}
    finally:
        os.close(fd)
    for name, d in decode.items():
        print(f"   decode step (48 rows) {name:>20}: p50 {d['p50_ms']:.3f} ms  mean {d['mean_ms']:.3f} ms")
    for b in backends:
        print(f"   {b}: {decode['serial']['p50_ms'] / decode[b]['p50_ms']:.1f}x faster than serial, "
              f"{decode['python_threadpool16']['p50_ms'] / decode[b]['p50_ms']:.1f}x faster than Python threads")
    # The device bounds a 48-row step: it cannot finish before 48 reads at the best IOPS fio saw.
    peak = max(max(r["fio_4k"], r[f"fio_{block}"]) for r in prefill)
    floor_ms = 48 / peak * 1e3
    decode["device_floor_ms"] = floor_ms
    decode["max_ratio_vs_serial"] = decode["serial"]["p50_ms"] / floor_ms
    for b in backends:
        decode[f"{b}_vs_floor"] = decode[b]["p50_ms"] / floor_ms
    print(f"   device floor for 48 reads at {peak:.0f} IOPS: {floor_ms:.3f} ms, so at most "
          f"{decode['max_ratio_vs_serial']:.1f}x over serial on this device; " +
          ", ".join(f"{b} step = {decode[f'{b}_vs_floor']:.2f}x the floor" for b in backends))
    return {"model": str(args.model), "table_rows": t0.rows, "table_gib": size_gib, "logical_block": block,
            "prefill": prefill, "decode": decode, "steps": len(steps), "left_out": left_out,
            "load_avg": os.getloadavg()}
