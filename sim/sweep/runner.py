"""Running a study: every point through the decode simulator, in local processes or on a Dask cluster.

Traces, devices and
compute models are resolved once in the calling process and shipped to the
workers, so the workers need neither the tokenizer nor the data files.
The rows come back in point order whatever the runner, and a point's seed
(:func:`sim.sweep.study.point_seed`) depends only on the study and the point.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as futures_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from tqdm import tqdm

from engram.errors import ArgumentError

from ..calibrate import Calibration
from ..decode import hot_rows, seed_reproduction, simulate_decode
from ..device import load_device
from ..io import write_json
from ..params import Compute, Policy
from ..schema import SWEEP_SCHEMA
from ..trace import load_trace
from .study import AXES, METRICS, Study, check_point, point_seed
from .table import write_table

__all__ = ["SweepResult", "run_points", "run_study"]


def _device_key(p: Mapping[str, Any]) -> tuple:
    """Which resolved device a point uses: calibrated devices depend on the backend and the compute."""
    spec = p["device"]
    if spec == "calibrated" or spec.startswith("calibrated:"):
        return (spec, p["backend"], p["compute"])
    return (spec,)


@dataclass
class _Context:
    """Everything the workers need, resolved once: shipped to every worker."""

    traces: Dict[Tuple[str, int], Any]
    devices: Dict[tuple, Any]
    computes: Dict[str, Any]
    extras: Dict[str, Any] = None  # "tail:SPEC" -> device, "hot:FILE" -> hot set


def _resolve(points: Sequence[Mapping[str, Any]], calibration: Optional[Path]) -> _Context:
    cal = None

    def need_cal(what: str):
        nonlocal cal
        if cal is None:
            if calibration is None:
                raise ArgumentError(f"{what} needs a calibration: give [study] calibration = FILE "
                                    "or --calibration FILE")
            cal = Calibration.load(calibration)
        return cal

    devices: Dict[tuple, Any] = {}
    loaded: Dict[str, Any] = {}
    for p in points:
        key = _device_key(p)
        if key in devices:
            continue
        spec = p["device"]
        if spec == "calibrated" or spec.startswith("calibrated:"):
            # this machine: the device of the point's backend (or the named one), with the batches
            # measured with the point's compute as think time where the calibration has them
            label = p["compute"].split(":", 1)[1] if p["compute"].startswith("calibrated:") else "none"
            devices[key] = load_device(spec, need_cal(f"device {spec!r}"), backend=p["backend"], compute=label)
        else:
            if spec not in loaded:
                loaded[spec] = load_device(spec)
            devices[key] = loaded[spec]
    computes: Dict[str, Any] = {}
    for spec in dict.fromkeys(p["compute"] for p in points):
        if spec == "reference":
            computes[spec] = Compute(seed_reproduction()["compute_ms"] * 1e-3)
        elif spec.startswith("calibrated:"):
            computes[spec] = need_cal(f"compute {spec!r}").compute_model(spec.split(":", 1)[1])
    traces: Dict[Tuple[str, int], Any] = {}
    for spec, limit in dict.fromkeys((p["trace"], p["trace_limit"]) for p in points):
        traces[(spec, limit)] = load_trace(spec, limit=limit)
    extras: Dict[str, Any] = {}
    for p in points:
        if p["tail"] and f"tail:{p['tail']}" not in extras:
            extras[f"tail:{p['tail']}"] = load_device(p["tail"])
        if p["dram_rows"] and f"hot:{p['dram_rows']}" not in extras:
            extras[f"hot:{p['dram_rows']}"] = hot_rows(p["dram_rows"])
    return _Context(traces, devices, computes, extras)


# =====================================================================================
# one point
# =====================================================================================
def _run_point(index: int, params: Dict[str, Any], seed: int, ctx: _Context) -> Dict[str, Any]:
    """Simulate one point; returns the result row (axes, seed, metrics)."""
    p = params
    trace = ctx.traces[(p["trace"], p["trace_limit"])]
    device = ctx.devices[_device_key(p)]
    policy = Policy(threshold=p["threshold"], backend=p["backend"], readers=p["readers"],
                    cache_rows=p["cache_rows"], overlap_layers=p["overlap_layers"],
                    batch_overhead=p["batch_overhead_us"] * 1e-6, shared_cache_rows=p["shared_cache_rows"],
                    dram_fraction=p["dram_fraction"])
    if p["compute"]:
        base = ctx.computes[p["compute"]]
        compute = Compute(base.mean, base.dist, base.cv, base.samples, p["layers"])
    else:
        compute = Compute(p["compute_ms"] * 1e-3, p["compute_dist"], p["compute_cv"], (), p["layers"])
    phases = f"spread:{p['start_spread_ms']:g}" if p["start_spread_ms"] > 0 else p["phases"]
    extras = ctx.extras or {}
    r = simulate_decode(trace, device, policy, compute, sessions=p["sessions"], steps=p["steps"], mode=p["mode"],
                        seed=seed, hash_time=p["hash_us"] * 1e-6, phases=phases, drives=p["drives"],
                        hot=extras.get(f"hot:{p['dram_rows']}"), tail=extras.get(f"tail:{p['tail']}"), bins=4)
    lat = r.step_latencies.reshape(-1)
    pct = np.percentile(lat, [50, 90, 99])
    per = np.asarray(r.tokens_per_s_per_session, dtype=np.float64)
    out: Dict[str, Any] = {"point": index, **params, "seed": seed}
    out.update({
        "tokens_per_s": float(r.tokens_per_s),
        "session_tokens_per_s": float(per.mean()),
        "session_tokens_per_s_min": float(per.min()),
        "step_mean_ms": float(lat.mean()) * 1e3,
        "step_p50_ms": float(pct[0]) * 1e3,
        "step_p90_ms": float(pct[1]) * 1e3,
        "step_p99_ms": float(pct[2]) * 1e3,
        "stall_mean_ms": float(r.stall_ms["mean"]),
        "compute_mean_ms": compute.mean * 1e3,
        "reads_per_step": r.reads / (p["sessions"] * p["steps"]),
        "cache_hit_rate": float(r.cache_hit_rate),
        "device_busy": float(r.device["busy_fraction"]),
        "mean_queue_depth": float(r.device["mean_queue_depth"]),
        "reads_per_s": float(r.device["reads_per_s"]),
        "iops_utilization": float(r.device["iops_utilization"]),
        "shared_cache_hit_rate": float(r.shared_cache_hit_rate),
        "dram_hit_rate": float(r.dram_hit_rate),
        "compute_realised_mean_ms": float(r.compute_realised["mean_ms"]),
        "compute_realised_cv": float(r.compute_realised["cv"]),
        "wrapped": int(bool(r.wrap["wrapped"])),
    })
    return out


_WORKER_CTX: Optional[_Context] = None


def _init_worker(ctx: _Context) -> None:
    global _WORKER_CTX
    _WORKER_CTX = ctx


def _local_task(index: int, params: Dict[str, Any], seed: int) -> Dict[str, Any]:
    return _run_point(index, params, seed, _WORKER_CTX)


def _dask_task(index: int, params: Dict[str, Any], seed: int, ctx: _Context) -> Dict[str, Any]:
    return _run_point(index, params, seed, ctx)


@dataclass
class SweepResult:
    """The table of a study run.

    Attributes
    ----------
    study : Study
    rows : list of dict
        One per point, in point order: ``point``, every axis, ``seed``, every metric of :data:`METRICS`.
    seconds : float
        Wall time of the run.
    runner : str
        ``"processes:N"``, ``"inline"`` or ``"dask:ADDRESS"``.
    """

    study: Study
    rows: List[Dict[str, Any]]
    seconds: float
    runner: str

    @property
    def columns(self) -> List[str]:
        return ["point", *AXES, "seed", *METRICS]

    def meta(self) -> dict:
        return {"kind": "sweep", "schema": SWEEP_SCHEMA, "study": self.study.to_dict(),
                "axes": self.study.axes(), "columns": self.columns, "metrics": METRICS,
                "axis_labels": {k: v[2] for k, v in AXES.items()}, "points": len(self.rows),
                "seconds": self.seconds, "runner": self.runner}

    def write(self, path: Union[str, os.PathLike]) -> Path:
        """Write the table (``.csv`` or ``.parquet``) and ``PATH.meta.json`` beside it; return the table's path."""
        path = write_table(self.rows, path, self.columns)
        write_json(str(path) + ".meta.json", self.meta())
        return path


def run_points(points: Sequence[Mapping[str, Any]], study_seed: int = 0, *, calibration=None,
               jobs: Optional[int] = None, scheduler: Optional[str] = None, progress: bool = True,
               desc: str = "sweep", connect_timeout: float = 30.0) -> Tuple[List[Dict[str, Any]], str]:
    """Simulate ``points`` (complete axis dicts, see :meth:`Study.points`); return ``(rows, runner)``.

    ``jobs`` local processes (default: the CPU count; 1 runs in this process),
    or the Dask cluster at ``scheduler`` (``tcp://host:port``) when given
    (``connect_timeout`` seconds to reach it).  Rows come back in point order
    whatever the runner.

    Raises
    ------
    ArgumentError
        Bad points, an unreachable scheduler, or a device, trace or calibration
        that cannot be loaded.
    """
    pts = [dict(p) for p in points]
    if not pts:
        raise ArgumentError("no points to run")
    for p in pts:
        missing = set(AXES) - set(p)
        if missing:
            raise ArgumentError(f"point lacks axis {sorted(missing)[0]!r}")
        check_point(p, "point")
    seeds = [point_seed(study_seed, p) for p in pts]
    ctx = _resolve(pts, Path(calibration) if calibration else None)
    bar = tqdm(total=len(pts), unit="point", desc=desc, disable=not progress, leave=False)
    rows: List[Optional[Dict[str, Any]]] = [None] * len(pts)
    try:
        if scheduler:
            runner = _run_dask(pts, seeds, ctx, scheduler, connect_timeout, rows, bar)
        else:
            runner = _run_local(pts, seeds, ctx, jobs, rows, bar)
    finally:
        bar.close()
    return [r for r in rows if r is not None], runner


def _collect(futures, completed, rows: list, bar) -> None:
    """Put each finished point's row at its place, in completion order (``completed``: an ``as_completed``)."""
    for fut in completed(futures):
        row = fut.result()
        rows[row["point"]] = row
        bar.update(1)


def _run_dask(pts, seeds, ctx: _Context, scheduler: str, connect_timeout: float, rows: list, bar) -> str:
    """The points on the Dask cluster at ``scheduler``; returns the runner's name."""
    try:
        from dask.distributed import Client, as_completed
    except ModuleNotFoundError:
        raise ArgumentError("--scheduler needs dask.distributed: pip install 'dask[distributed]'") from None
    try:
        client = Client(scheduler, timeout=f"{connect_timeout}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise ArgumentError(f"cannot reach the Dask scheduler at {scheduler!r}: {exc}") from None
    with client:
        ctx_f = client.scatter(ctx, broadcast=True)
        futs = [client.submit(_dask_task, i, p, s, ctx_f, pure=False) for i, (p, s) in enumerate(zip(pts, seeds))]
        _collect(futs, as_completed, rows, bar)
    return f"dask:{scheduler}"


def _run_local(pts, seeds, ctx: _Context, jobs: Optional[int], rows: list, bar) -> str:
    """The points in ``jobs`` local processes (1: in this process); returns the runner's name."""
    jobs = int(jobs) if jobs else (os.cpu_count() or 1)
    if jobs < 1:
        raise ArgumentError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(pts) == 1:
        for i, (p, s) in enumerate(zip(pts, seeds)):
            rows[i] = _run_point(i, p, s, ctx)
            bar.update(1)
        return "inline"
    n = min(jobs, len(pts))
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                             initargs=(ctx,)) as ex:
        futs = [ex.submit(_local_task, i, p, s) for i, (p, s) in enumerate(zip(pts, seeds))]
        _collect(futs, futures_completed, rows, bar)
    return f"processes:{n}"


def run_study(study: Union[Study, str, os.PathLike], *, jobs: Optional[int] = None, scheduler: Optional[str] = None,
              calibration: Union[str, os.PathLike, None] = None, progress: bool = True,
              out: Union[str, os.PathLike, None] = None, connect_timeout: float = 30.0) -> SweepResult:
    """Run every point of a study.

    Parameters
    ----------
    study : Study or path
        A :class:`Study` or a study TOML file.
    jobs : int, optional
        Local worker processes (default: the CPU count; 1 runs inline).
    scheduler : str, optional
        Address of a running Dask scheduler (``tcp://host:port``); the points
        then run on that cluster (``dask.distributed``).
    connect_timeout : float
        Seconds to reach the scheduler.
    calibration : path, optional
        Calibration file for ``calibrated`` devices and computes (overrides the study's).
    progress : bool
        Show a progress bar.
    out : path, optional
        Write the table there (``.csv`` or ``.parquet``) with ``OUT.meta.json``.

    Returns
    -------
    SweepResult
        Rows identical, for the same study, whatever the runner.

    Raises
    ------
    ArgumentError, FormatError
        A bad study, device, trace or calibration.
    """
    if not isinstance(study, Study):
        study = Study.load(study)
    cal = Path(calibration) if calibration else study.calibration
    t0 = time.perf_counter()
    rows, runner = run_points(study.points(), study.seed, calibration=cal, jobs=jobs, scheduler=scheduler,
                              progress=progress, desc=f"sweep {study.name}", connect_timeout=connect_timeout)
    res = SweepResult(study, rows, time.perf_counter() - t0, runner)
    if out is not None:
        res.write(out)
    return res
