"""Serving points run in this process, in local processes or on a Dask cluster, rows handed over as they finish.

Everything a point needs -- its rows (:class:`~sim.serve.rows.RowSource`: the text tokenized,
hashed and counted once), its device, a fitted compute, a requests file -- is resolved once in the
calling process (:class:`ServeContext`) and shipped to the workers, which need neither the
tokenizer nor the data files.  A point's seed depends only on the study and the point
(:func:`sim.serve.study.serve_point_seed`), so every runner gives the same rows.

:class:`ServeRunner` is :class:`sim.sweep.PointRunner` -- its worker pool, its Dask connection, its
retries of points whose worker died (at most :data:`sim.sweep.MAX_ATTEMPTS` runs) -- running
:func:`run_serve_point` instead of a decode point.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from engram.errors import ArgumentError
from engram.rowcache import DEFAULT_POLICY

from sim.check.calibrate import Calibration
from ..decode import hot_rows
from ..device import load_device, load_tail, with_tail
from ..decode.speculative import DEFAULT_ACCEPTANCE, Speculation
from sim.core.params import Policy, Storage, consumer_preset
from ..sweep import PointRunner
from ..trace import load_trace
from .compute import StepCompute
from .engine import Scheduler
from .metrics import SLO
from .model import ServeRun, ServeText, simulate_serve
from .rows import RowSource
from .study import SERVE_AXES, check_serve_point, serve_text
from .workload import Workload, read_request_file

__all__ = ["ServeContext", "ServeRunner", "point_objects", "resolve_serve_context", "run_serve_point"]


def _rows_key(p: Mapping[str, Any]) -> tuple:
    return (serve_text(p), p["trace_limit"], p["read_chunk"], p["dram_fraction"], p["dram_rows"], p["requests"])


def _device_key(p: Mapping[str, Any]) -> tuple:
    spec = p["device"]
    return (spec, p["backend"]) if spec == "calibrated" or spec.startswith("calibrated:") else (spec,)


@dataclass
class ServeContext:
    """Resolved inputs of every point: rows by text and residency, devices (tails applied), fitted computes,
    requests files, and the SLOs."""

    rows: Dict[tuple, RowSource]
    devices: Dict[tuple, Any]
    computes: Dict[str, StepCompute]
    files: Dict[str, Any]
    slo: SLO
    fail_fast: bool = False


def resolve_serve_context(points: Sequence[Mapping[str, Any]], slo: SLO, calibration: Optional[Path] = None, *,
                          fail_fast: bool = False) -> ServeContext:
    """Load every text, requests file, device and measured compute the points use.

    Raises
    ------
    ArgumentError, FormatError
        A text, device, file or calibration that cannot be loaded.
    """
    cal = None
    devices: Dict[tuple, Any] = {}
    for p in points:
        key = _device_key(p) + (p["tail"],)
        if key in devices:
            continue
        spec = p["device"]
        if spec == "calibrated" or spec.startswith("calibrated:"):
            if calibration is None:
                raise ArgumentError(f"device {spec!r} needs a calibration: give [study] calibration = FILE "
                                    "or --calibration FILE")
            if cal is None:
                cal = Calibration.load(calibration)
            dev = load_device(spec, cal, backend=p["backend"])
        else:
            dev = load_device(spec)
        devices[key] = with_tail(dev, load_tail(p["tail"])) if p["tail"] else dev
    files: Dict[str, Any] = {}
    for p in points:
        if p["requests"] and p["requests"] not in files:
            files[p["requests"]] = read_request_file(p["requests"])
    rows: Dict[tuple, RowSource] = {}
    traces: Dict[tuple, Any] = {}
    for p in points:
        key = _rows_key(p)
        if key in rows:
            continue
        tkey = (serve_text(p), p["trace_limit"])
        if tkey not in traces:
            traces[tkey] = load_trace(tkey[0], limit=tkey[1])
        pol = Policy(dram_fraction=p["dram_fraction"])
        hot = hot_rows(p["dram_rows"]) if p["dram_rows"] else None
        rows[key] = RowSource(traces[tkey], pol, p["read_chunk"], hot=hot, file=files.get(p["requests"]))
    computes = {p["compute_file"]: StepCompute.from_file(p["compute_file"]) for p in points if p["compute_file"]}
    return ServeContext(rows, devices, computes, files, slo, fail_fast)


def point_objects(p: Mapping[str, Any], ctx: Optional[ServeContext] = None) -> dict:
    """The simulator's objects of a point: ``workload``, ``policy``, ``compute``, ``scheduler``."""
    policy = Policy(threshold=p["threshold"], backend=p["backend"], readers=p["readers"], cache_rows=p["cache_rows"],
                    overlap_layers=p["overlap_layers"], batch_overhead=p["batch_overhead_us"] * 1e-6,
                    shared_cache_rows=p["shared_cache_rows"], dram_fraction=p["dram_fraction"],
                    shared_cache_bytes=p.get("shared_cache_bytes") or 0, cache_policy=p.get("cache_policy") or DEFAULT_POLICY)
    if p["compute_file"]:
        base = ctx.computes[p["compute_file"]] if ctx is not None else StepCompute.from_file(p["compute_file"])
    else:
        tok = None if p["token_ms"] == SERVE_AXES["token_ms"][1] else p["token_ms"]  # None: the cited default
        base = StepCompute.reference(p["step_ms"], tok)
    compute = base.with_options(scale=p["compute_scale"], dist=p["compute_dist"], cv=p["compute_cv"],
                                layers=p["layers"]).with_consumer(consumer_preset(p["consumer"]))
    sched = Scheduler(p["max_running"], p["prefill_chunk"], p["read_chunk"], p["gate"], p["second_start_layer"])
    work = Workload(p["rate"], p["duration_s"], p["arrivals"], p["cv"], p["prompt_tokens"], p["output_tokens"],
                    p["requests"])
    spec = Speculation(p.get("draft_tokens", 0), p.get("acceptance", str(DEFAULT_ACCEPTANCE)),
                       p.get("prefetch_drafts", "off") == "on")
    return {"workload": work, "policy": policy, "compute": compute, "scheduler": sched, "speculation": spec}


def run_serve_point(index: int, params: Dict[str, Any], seed: int, ctx: ServeContext) -> Dict[str, Any]:
    """Simulate one point; its row: ``point``, every axis, ``seed``, every metric of
    :data:`sim.serve.study.SERVE_METRICS`."""
    p = params
    check_serve_point(p, "point")
    o = point_objects(p, ctx)
    r = simulate_serve(o["workload"], ctx.devices[_device_key(p) + (p["tail"],)], o["policy"], o["compute"],
                       o["scheduler"], ctx.slo, storage=Storage(drives=p["drives"]),
                       text=ServeText(requests_file=ctx.files.get(p["requests"]), rows=ctx.rows[_rows_key(p)]),
                       run=ServeRun(seed=seed, warmup=p["warmup_s"], bins=8, fail_fast=ctx.fail_fast,
                                    speculation=o["speculation"]))
    return {"point": index, **params, "seed": seed, **r.row()}


# =====================================================================================
# running points: sim.sweep.PointRunner with the serving point
# =====================================================================================
Task = Tuple[int, Dict[str, Any], int]


class ServeRunner(PointRunner):
    """:class:`sim.sweep.PointRunner` running serving points (:func:`run_serve_point`); same lifetime, pool, Dask
    connection and retries of points whose worker died."""

    point_fn = staticmethod(run_serve_point)
