"""Synth write speed: a model's tables written by ``engram.synth`` vs ``dd`` and a plain write.

Side by side in one run, the same number of bytes each, each ending on stable storage:

- ``synth``: ``write_model(plan, path, Fill(tables="all", projections=False), writing=Writing(sync=True))``
  of a model whose two tables hold ``--gib`` GiB together (deterministic rows generated on the fly, 64 MiB chunks,
  a producer thread and a writer), timed from the first header byte to ``fsync``;
- ``plain``: one preallocated 64 MiB buffer of zeros written over and over with ``pwrite``,
  then ``fsync`` (the cost of the I/O alone, no content to generate);
- ``dd``: ``dd if=/dev/zero bs=1M oflag=direct`` (the device's sequential write limit).

Runs alternate (synth, plain, dd) ``--repeat`` times and the best of each is kept, as the
disk is shared.  Also reported: the row generator alone (``table_rows``, no I/O).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np


def _plain_write(path: Path, nbytes: int, chunk: int = 64 << 20) -> float:
    buf = np.zeros(chunk, dtype=np.uint8)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        while off < nbytes:
            n = min(chunk, nbytes - off)
            mv = memoryview(buf)[:n]
            done = 0
            while done < n:
                done += os.pwrite(fd, mv[done:], off + done)
            off += n
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _dd(path: Path, nbytes: int) -> float:
    count = -(-nbytes // (1 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "oflag=direct"],
                   check=True, capture_output=True)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    from engram import build_token_map, synth

    p = argparse.ArgumentParser(prog="bench_synth")
    p.add_argument("--gib", type=float, default=4.0, help="table bytes per run, both tables together (GiB)")
    p.add_argument("--repeat", type=int, default=2, help="alternating rounds; the best of each is kept")
    p.add_argument("--dir", default=None, help="directory to write in (default: the system temp dir)")
    args = p.parse_args(argv)

    # rows per layer ~= 24 columns x 16e6 x scale; two tables of 264-byte rows
    scale = args.gib * 2**30 / (2 * 24 * 16e6 * 264)
    plan = synth.plan_model(synth.ModelShape(scale=scale, token_map=build_token_map()))
    table_bytes = sum(t.nbytes for t in plan.tensors if t.kind == "table")
    work = Path(tempfile.mkdtemp(prefix="bench_synth_", dir=args.dir))
    free = shutil.disk_usage(work).free
    if table_bytes * 1.2 > free:
        shutil.rmtree(work)
        raise SystemExit(f"need {table_bytes / 2**30:.1f} GiB free in {work.parent}, have {free / 2**30:.1f}")

    # the row generator alone (after the pool exists)
    synth.table_rows(1, 0, 1)
    per = (64 << 20) // 264
    gen_rows = min(per * 16, int(plan.layout.rows[0]))
    t0 = time.perf_counter()
    for a in range(0, gen_rows, per):
        synth.table_rows(1, a, min(a + per, gen_rows))
    gen_s = time.perf_counter() - t0

    best = {"synth": float("inf"), "plain": float("inf"), "dd": float("inf")}
    try:
        for _ in range(args.repeat):
            f = work / "model.gguf"
            t0 = time.perf_counter()
            synth.write_model(plan, f, synth.Fill(tables="all", projections=False), progress=False,
                              writing=synth.Writing(sync=True))
            best["synth"] = min(best["synth"], time.perf_counter() - t0)
            f.unlink()
            f = work / "plain.bin"
            best["plain"] = min(best["plain"], _plain_write(f, table_bytes))
            f.unlink()
            f = work / "dd.bin"
            best["dd"] = min(best["dd"], _dd(f, table_bytes))
            f.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mbps = {k: table_bytes / v / 1e6 for k, v in best.items()}
    rec = {
        "table_bytes": table_bytes,
        "scale": scale,
        "repeat": args.repeat,
        "synth_MBps": mbps["synth"],
        "plain_write_MBps": mbps["plain"],
        "dd_direct_MBps": mbps["dd"],
        "generator_MBps": gen_rows * 264 / gen_s / 1e6,
        "synth_vs_dd": mbps["synth"] / mbps["dd"],
        "synth_vs_plain": mbps["synth"] / mbps["plain"],
    }
    print(f"   {table_bytes / 2**30:.2f} GiB of table rows, best of {args.repeat}, each ending in fsync")
    print(f"   synth  {mbps['synth']:8.0f} MB/s   plain write {mbps['plain']:8.0f} MB/s   "
          f"dd oflag=direct {mbps['dd']:8.0f} MB/s")
    print(f"   ratio  synth/dd {rec['synth_vs_dd']:.2f}   synth/plain {rec['synth_vs_plain']:.2f}   "
          f"(row generator alone {rec['generator_MBps']:.0f} MB/s)")
    return rec
