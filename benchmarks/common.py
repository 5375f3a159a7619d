"""Helpers shared by the benchmarks: timing, real text, result records.

Every benchmark measures a ratio side by side in one run (the engine against
its peer or the physical limit); absolute times on shared machines drift.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

from sim.core.io import shared_data_dir

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def shared_data() -> Path:
    """The folder of the real corpora: the package's own copies (``sim/data/``), or ``$ENGRAM_SHARED_DATA``
    when set (:func:`sim.core.io.shared_data_dir`)."""
    return shared_data_dir()


def real_text(chars: int | None = None) -> str:
    """The Italian novel of the shared corpus (public domain), optionally cut."""
    text = (shared_data() / "promessi_sposi.txt").read_text(encoding="utf-8")
    return text if chars is None else text[:chars]


def time_best(fn: Callable[[], object], repeat: int = 5, number: int = 1) -> float:
    """Best wall time of ``number`` calls, over ``repeat`` runs, in seconds per call."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def time_median(fn: Callable[[], object], repeat: int = 7, number: int = 1) -> float:
    """Median wall time per call over ``repeat`` runs of ``number`` calls, seconds."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return statistics.median(runs)


def machine() -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def save(name: str, record: dict) -> Path:
    """Write ``benchmarks/results/NAME.json`` (not committed) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {"benchmark": name, "machine": machine(), **record}
    path.write_text(json.dumps(record, indent=2))
    return path
