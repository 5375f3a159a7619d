"""What-if studies: a grid of simulator runs described in a TOML file (SPEC §9).

A study is a grid over the simulator's inputs -- device, read policy, row
cache, concurrent sessions, compute and trace -- run with
:func:`sim.decode.simulate_decode` at every point, in parallel local processes
or on an existing Dask cluster (``dask.distributed``).  The result is a table,
one row per point (CSV, or Parquet when ``pyarrow`` is installed), that
:mod:`sim.report` plots.

Study file
----------
::

    [study]
    name = "threshold-readers"          # label of the study and of its results
    description = "Which threshold and reader count to ship"
    seed = 0                            # every point's seed derives from it and the point
    calibration = "calibration.json"    # optional: for device/compute "calibrated:..."
                                        # (relative to the study file)

    [fixed]                             # values shared by every point (any axis)
    trace = "stdlib:asyncio/base_events.py"
    steps = 1000

    [grid]                              # the product of these lists
    device = ["seed-apple-m3-ultra", "ssd:qd1_us=80,iops=400000,parallelism=32"]
    threshold = [8, 256]
    readers = [1, 2, 4, 8, 16, 32]

    [[plot]]                            # figures of `engram report --sweep` (optional)
    x = "readers"
    y = "session_tokens_per_s"
    series = ["device", "threshold"]
    logx = true

``[[grid]]`` (an array of tables) gives a union of several grids, each merged
over ``[fixed]``.  Axes (see :data:`AXES` for defaults and units): ``device``
(preset, ``ssd:...``, ``.json``/``.jsonl`` file, ``calibrated`` -- this
machine's calibrated device of the point's ``backend`` -- or
``calibrated:BACKEND``), ``trace`` and ``trace_limit`` (source spec of
:func:`sim.trace.load_trace`, tokens), ``threshold``, ``backend``, ``readers``
(pread readers or io_uring ring depth, as in the engine), ``cache_rows``,
``overlap_layers``, ``batch_overhead_us``, ``sessions``, ``steps``,
``start_spread_ms``, ``compute`` (``""``: ``compute_ms`` with
``compute_dist``/``compute_cv``; ``"reference"``: the SPEC §8 compute fitted so
threshold 256 gives 19.16 tokens/s on the reference device;
``"calibrated:LABEL"``: a measured compute of the calibration), ``compute_ms``,
``compute_dist``, ``compute_cv``, ``layers``, ``hash_us``, ``mode`` and
``repeat`` (a replicate index: it only changes the seed).

Reproducibility
---------------
A point's seed is a hash of the study seed and the point's values
(:func:`point_seed`), never of the worker, the order or the runner, so the same
study gives the same table locally and on any cluster.  Traces, devices and
compute models are resolved once in the calling process and shipped to the
workers, so the workers need neither the tokenizer nor the data files.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from engram.errors import ArgumentError, FormatError

from .io import write_json
from .params import DEFAULT_LAYERS, DEFAULT_READERS, DEFAULT_THRESHOLD

__all__ = [
    "AXES",
    "METRICS",
    "Study",
    "SweepResult",
    "point_seed",
    "read_table",
    "run_points",
    "run_study",
    "write_table",
]

#: Axes of a study: name -> (type, default, label with unit).
AXES: Dict[str, Tuple[type, Any, str]] = {
    "device": (str, "seed-apple-m3-ultra", "device"),
    "trace": (str, "stdlib:asyncio/base_events.py", "trace"),
    "trace_limit": (int, 2000, "trace tokens"),
    "threshold": (int, DEFAULT_THRESHOLD, "threshold (distinct rows)"),
    "backend": (str, "pread", "backend"),
    "readers": (int, DEFAULT_READERS, "readers / ring depth"),
    "cache_rows": (int, 0, "row cache per session (rows)"),
    "overlap_layers": (int, 0, "overlap (layers)"),
    "batch_overhead_us": (float, 0.0, "batch overhead (us)"),
    "sessions": (int, 1, "concurrent sessions"),
    "steps": (int, 1000, "steps per session"),
    "start_spread_ms": (float, 0.0, "start spread (ms)"),
    "compute": (str, "", "compute model"),
    "compute_ms": (float, 0.0, "compute per step (ms)"),
    "compute_dist": (str, "constant", "compute distribution"),
    "compute_cv": (float, 0.0, "compute CV"),
    "layers": (int, DEFAULT_LAYERS, "decoder layers"),
    "hash_us": (float, 0.0, "hash time (us)"),
    "mode": (str, "fast", "simulation mode"),
    "repeat": (int, 0, "replicate"),
}

#: Result columns of every point: name -> label with unit.
METRICS: Dict[str, str] = {
    "tokens_per_s": "tokens/s, all sessions",
    "session_tokens_per_s": "tokens/s per session (mean)",
    "session_tokens_per_s_min": "tokens/s of the slowest session",
    "step_mean_ms": "step latency, mean (ms)",
    "step_p50_ms": "step latency, p50 (ms)",
    "step_p90_ms": "step latency, p90 (ms)",
    "step_p99_ms": "step latency, p99 (ms)",
    "stall_mean_ms": "wait for rows per step, mean (ms)",
    "compute_mean_ms": "compute per step, mean (ms)",
    "reads_per_step": "device reads per step and session",
    "cache_hit_rate": "row cache hit rate",
    "device_busy": "device busy fraction",
    "mean_queue_depth": "mean device queue depth",
    "reads_per_s": "device reads/s",
    "iops_utilization": "reads/s over peak IOPS",
}

_STUDY_KEYS = {"name", "description", "seed", "calibration"}
_PLOT_KEYS = {"x", "y", "series", "facet", "where", "logx", "logy", "title", "kind", "target", "ylabel"}


# =====================================================================================
# seeds
# =====================================================================================
def point_seed(study_seed: int, params: Mapping[str, Any]) -> int:
    """The seed of one grid point: a hash of the study seed and the point's values.

    ``params`` maps axis names to values; the seed is the first 63 bits of the
    SHA-256 of their canonical JSON (sorted keys), so it depends on nothing but
    the study and the point.
    """
    blob = json.dumps({"study_seed": int(study_seed), **{k: params[k] for k in sorted(params)}},
                      sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "little") >> 1


# =====================================================================================
# the study
# =====================================================================================
def _tomllib():
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - older Pythons
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ArgumentError("reading a study needs Python >= 3.11 or the 'tomli' package") from None
    return tomllib


def _load_toml(path: Path) -> dict:
    tomllib = _tomllib()
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read study ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise FormatError(f"{path}: not TOML ({exc})") from None


def _coerce(name: str, value: Any, where: str) -> Any:
    """A study value checked against its axis type (ints accepted for floats)."""
    typ = AXES[name][0]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ArgumentError(f"{where}: {name} = {value!r} must be {typ.__name__}")
    if typ is float and not math.isfinite(value):
        raise ArgumentError(f"{where}: {name} = {value!r} must be finite")
    return value


@dataclass
class Study:
    """A grid of simulator runs.

    Attributes
    ----------
    name, description : str
    seed : int
        Study seed; each point's seed is :func:`point_seed` of it and the point.
    fixed : dict
        Axis -> value shared by every point.
    grids : list of dict
        Axis -> list of values; the points are the union of each grid's product.
    plots : list of dict
        Figure specifications for :mod:`sim.report` (``x``, ``y``, ``series``, ``facet``,
        ``where``, ``logx``, ``logy``, ``title``, ``kind`` = ``"line"`` or ``"capacity"``,
        ``target``).
    calibration : Path or None
        Calibration file for ``calibrated`` devices and computes.
    source : str
        Where the study came from (a path, or ``"<dict>"``).
    """

    name: str
    description: str = ""
    seed: int = 0
    fixed: Dict[str, Any] = field(default_factory=dict)
    grids: List[Dict[str, list]] = field(default_factory=list)
    plots: List[dict] = field(default_factory=list)
    calibration: Optional[Path] = None
    source: str = "<dict>"

    # ------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, d: Mapping, base_dir: Union[str, os.PathLike, None] = None, source: str = "<dict>") -> "Study":
        """A study from a parsed TOML document (see the module docstring).

        Raises
        ------
        ArgumentError
            Unknown sections or axes, values of the wrong type, empty grids (names them).
        """
        where = source
        unknown = set(d) - {"study", "fixed", "grid", "plot"}
        if unknown:
            raise ArgumentError(f"{where}: unknown section {sorted(unknown)[0]!r} (study, fixed, grid, plot)")
        head = dict(d.get("study", {}))
        bad = set(head) - _STUDY_KEYS
        if bad:
            raise ArgumentError(f"{where}: [study] has unknown key {sorted(bad)[0]!r} "
                                f"({', '.join(sorted(_STUDY_KEYS))})")
        name = head.get("name") or (Path(source).stem if source != "<dict>" else "study")
        seed = head.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ArgumentError(f"{where}: [study] seed = {seed!r} must be an integer >= 0")
        fixed = {}
        for k, v in dict(d.get("fixed", {})).items():
            if k not in AXES:
                raise ArgumentError(f"{where}: [fixed] has unknown axis {k!r} (axes: {', '.join(AXES)})")
            fixed[k] = _coerce(k, v, f"{where}: [fixed]")
        raw_grids = d.get("grid", [{}])
        if isinstance(raw_grids, Mapping):
            raw_grids = [raw_grids]
        grids = []
        for gi, g in enumerate(raw_grids):
            gw = f"{where}: grid {gi}"
            out = {}
            for k, vals in dict(g).items():
                if k not in AXES:
                    raise ArgumentError(f"{gw}: unknown axis {k!r} (axes: {', '.join(AXES)})")
                if not isinstance(vals, list):
                    vals = [vals]
                if not vals:
                    raise ArgumentError(f"{gw}: axis {k!r} has no values")
                out[k] = [_coerce(k, v, gw) for v in vals]
            grids.append(out)
        plots = []
        for pi, p in enumerate(d.get("plot", [])):
            bad = set(p) - _PLOT_KEYS
            if bad:
                raise ArgumentError(f"{where}: plot {pi} has unknown key {sorted(bad)[0]!r}")
            if "x" not in p:
                raise ArgumentError(f"{where}: plot {pi} needs x = AXIS")
            for key in ("x", "facet"):
                if key in p and p[key] not in AXES:
                    raise ArgumentError(f"{where}: plot {pi}: {key} = {p[key]!r} is not an axis")
            series = p.get("series", [])
            p = dict(p, series=[series] if isinstance(series, str) else list(series))
            for s in p["series"]:
                if s not in AXES:
                    raise ArgumentError(f"{where}: plot {pi}: series {s!r} is not an axis")
            if p.get("y", "session_tokens_per_s") not in METRICS:
                raise ArgumentError(f"{where}: plot {pi}: y = {p['y']!r} is not a result column "
                                    f"({', '.join(METRICS)})")
            plots.append(p)
        cal = head.get("calibration")
        if cal is not None:
            cal = Path(cal)
            if not cal.is_absolute() and base_dir is not None:
                cal = Path(base_dir) / cal
        study = cls(str(name), str(head.get("description", "")), int(seed), fixed, grids, plots, cal, source)
        study.points()  # validates the values
        return study

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Study":
        """Read a study TOML file.

        Raises
        ------
        FormatError
            Unreadable or not TOML.
        ArgumentError
            Not a valid study (names the key).
        """
        path = Path(path)
        return cls.from_dict(_load_toml(path), base_dir=path.parent, source=str(path))

    @classmethod
    def loads(cls, text: str, base_dir: Union[str, os.PathLike, None] = None, source: str = "<text>") -> "Study":
        """A study from TOML text (relative paths are taken from ``base_dir``).

        Raises
        ------
        FormatError
            Not TOML.
        ArgumentError
            Not a valid study.
        """
        tomllib = _tomllib()
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise FormatError(f"{source}: not TOML ({exc})") from None
        return cls.from_dict(d, base_dir=base_dir, source=source)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "seed": self.seed, "fixed": self.fixed,
                "grids": self.grids, "plots": self.plots,
                "calibration": str(self.calibration) if self.calibration else None, "source": self.source}

    # -------------------------------------------------------------- points
    def axes(self) -> List[str]:
        """Axes that take more than one value over the study, in :data:`AXES` order."""
        vals: Dict[str, set] = {}
        for p in self.points():
            for k, v in p.items():
                vals.setdefault(k, set()).add(v)
        return [k for k in AXES if len(vals.get(k, ())) > 1]

    def points(self) -> List[Dict[str, Any]]:
        """Every point: axis -> value (all axes, defaults filled in), without duplicates, in grid order.

        Raises
        ------
        ArgumentError
            A value outside its range (names the axis and value).
        """
        out, seen = [], set()
        for g in self.grids or [{}]:
            names = list(g)
            for combo in itertools.product(*(g[n] for n in names)):
                p = {k: default for k, (_, default, _) in AXES.items()}
                p.update(self.fixed)
                p.update(zip(names, combo))
                _check_point(p, self.source)
                key = json.dumps(p, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(p)
        return out


def _check_point(p: Mapping[str, Any], where: str) -> None:
    for name in ("threshold", "readers", "sessions", "steps", "trace_limit", "layers"):
        if p[name] < 1:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be >= 1")
    for name in ("cache_rows", "overlap_layers", "batch_overhead_us", "start_spread_ms", "compute_ms",
                 "compute_cv", "hash_us", "repeat"):
        if p[name] < 0:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be >= 0")
    if p["backend"] not in ("pread", "io_uring"):
        raise ArgumentError(f"{where}: backend = {p['backend']!r} must be 'pread' or 'io_uring'")
    if p["mode"] not in ("fast", "exact"):
        raise ArgumentError(f"{where}: mode = {p['mode']!r} must be 'fast' or 'exact'")
    if p["compute_dist"] not in ("constant", "normal", "lognormal", "gamma", "exponential"):
        raise ArgumentError(f"{where}: compute_dist = {p['compute_dist']!r} is not a distribution")
    c = p["compute"]
    if c not in ("", "reference") and not c.startswith("calibrated:"):
        raise ArgumentError(f"{where}: compute = {c!r} must be '', 'reference' or 'calibrated:LABEL'")


# =====================================================================================
# resolving devices, traces and computes (in the calling process)
# =====================================================================================
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


def _resolve(points: Sequence[Mapping[str, Any]], calibration: Optional[Path]) -> _Context:
    from .decode import Compute, seed_reproduction
    from .device import load_device
    from .trace import load_trace

    cal = None

    def need_cal(what: str):
        nonlocal cal
        if cal is None:
            if calibration is None:
                raise ArgumentError(f"{what} needs a calibration: give [study] calibration = FILE "
                                    "or --calibration FILE")
            from .calibrate import Calibration

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
            backend = p["backend"] if spec == "calibrated" else spec.split(":", 1)[1]
            label = p["compute"].split(":", 1)[1] if p["compute"].startswith("calibrated:") else "none"
            devices[key] = need_cal(f"device {spec!r}").device(backend, label)
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
    return _Context(traces, devices, computes)


# =====================================================================================
# one point
# =====================================================================================
def _run_point(index: int, params: Dict[str, Any], seed: int, ctx: _Context) -> Dict[str, Any]:
    """Simulate one point; returns the result row (axes, seed, metrics)."""
    import numpy as np

    from .decode import Compute, Policy, simulate_decode

    p = params
    trace = ctx.traces[(p["trace"], p["trace_limit"])]
    device = ctx.devices[_device_key(p)]
    policy = Policy(threshold=p["threshold"], backend=p["backend"], readers=p["readers"], ring_depth=p["readers"],
                    cache_rows=p["cache_rows"], overlap_layers=p["overlap_layers"],
                    batch_overhead=p["batch_overhead_us"] * 1e-6)
    if p["compute"]:
        base = ctx.computes[p["compute"]]
        compute = Compute(base.mean, base.dist, base.cv, base.samples, p["layers"])
    else:
        compute = Compute(p["compute_ms"] * 1e-3, p["compute_dist"], p["compute_cv"], (), p["layers"])
    r = simulate_decode(trace, device, policy, compute, sessions=p["sessions"], steps=p["steps"], mode=p["mode"],
                        seed=seed, hash_time=p["hash_us"] * 1e-6, start_spread=p["start_spread_ms"] * 1e-3, bins=4)
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


# =====================================================================================
# running
# =====================================================================================
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
        return {"kind": "sweep", "schema": "engram.sweep/1", "study": self.study.to_dict(),
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
        _check_point(p, "point")
    seeds = [point_seed(study_seed, p) for p in pts]
    ctx = _resolve(pts, Path(calibration) if calibration else None)
    from tqdm import tqdm

    bar = tqdm(total=len(pts), unit="point", desc=desc, disable=not progress, leave=False)
    rows: List[Optional[Dict[str, Any]]] = [None] * len(pts)
    try:
        if scheduler:
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
                futs = [client.submit(_dask_task, i, p, s, ctx_f, pure=False) for i, (p, s) in
                        enumerate(zip(pts, seeds))]
                for fut in as_completed(futs):
                    row = fut.result()
                    rows[row["point"]] = row
                    bar.update(1)
            runner = f"dask:{scheduler}"
        else:
            jobs = int(jobs) if jobs else (os.cpu_count() or 1)
            if jobs < 1:
                raise ArgumentError(f"jobs must be >= 1, got {jobs}")
            if jobs == 1 or len(pts) == 1:
                for i, (p, s) in enumerate(zip(pts, seeds)):
                    rows[i] = _run_point(i, p, s, ctx)
                    bar.update(1)
                runner = "inline"
            else:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor, as_completed as done

                n = min(jobs, len(pts))
                with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                         initargs=(ctx,)) as ex:
                    futs = [ex.submit(_local_task, i, p, s) for i, (p, s) in enumerate(zip(pts, seeds))]
                    for fut in done(futs):
                        row = fut.result()
                        rows[row["point"]] = row
                        bar.update(1)
                runner = f"processes:{n}"
    finally:
        bar.close()
    return [r for r in rows if r is not None], runner


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


# =====================================================================================
# tables
# =====================================================================================
def write_table(rows: Sequence[Mapping[str, Any]], path: Union[str, os.PathLike],
                columns: Optional[Sequence[str]] = None) -> Path:
    """Write rows as ``.csv`` (default) or ``.parquet`` (needs ``pyarrow``); floats keep full precision.

    Raises
    ------
    ArgumentError
        Parquet asked without ``pyarrow`` installed.
    """
    path = Path(path)
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ModuleNotFoundError:
            raise ArgumentError(f"{path}: Parquet output needs pyarrow (pip install pyarrow); "
                                "or write .csv") from None
        pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), path)
        return path
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([repr(v) if isinstance(v, float) else v for v in (r.get(c, "") for c in cols)])
    return path


def _parse_cell(s: str) -> Any:
    if s == "":
        return ""
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def read_table(path: Union[str, os.PathLike]) -> Tuple[List[Dict[str, Any]], dict]:
    """Rows of a table written by :func:`write_table` (numbers parsed) and its ``.meta.json`` (or ``{}``).

    String axes keep their type from the metadata (a device named ``"1"`` stays a string).

    Raises
    ------
    FormatError
        Unreadable file.
    """
    path = Path(path)
    meta_path = Path(str(path) + ".meta.json")
    meta = {}
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise FormatError(f"{meta_path}: cannot read ({exc})") from None
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            t = pq.read_table(path).to_pydict()
            cols = list(t)
            rows = [{c: t[c][i] for c in cols} for i in range(len(t[cols[0]]) if cols else 0)]
        else:
            with open(path, newline="", encoding="utf-8") as f:
                rows = [{k: (v if k in AXES and AXES[k][0] is str else _parse_cell(v)) for k, v in r.items()}
                        for r in csv.DictReader(f)]
    except OSError as exc:
        raise FormatError(f"{path}: cannot read table ({exc.strerror})") from None
    except ModuleNotFoundError:
        raise FormatError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    return rows, meta


# =====================================================================================
# command line
# =====================================================================================
def _cmd_sweep(args) -> int:
    res = run_study(args.study, jobs=args.jobs, scheduler=args.scheduler, calibration=args.calibration,
                    progress=not args.no_progress)
    out = Path(args.out) if args.out else Path(f"{Path(args.study).stem}.csv")
    path = res.write(out)
    if args.json:
        json.dump({"table": str(path), "meta": str(path) + ".meta.json", "points": len(res.rows),
                   "seconds": res.seconds, "runner": res.runner, "axes": res.study.axes()}, __import__("sys").stdout,
                  indent=2)
        print()
        return 0
    axes = res.study.axes()
    print(f"study     {res.study.name}: {len(res.rows)} points over {', '.join(axes) or 'no varying axis'}")
    print(f"ran       {res.seconds:.1f} s on {res.runner}")
    best = max(res.rows, key=lambda r: r["session_tokens_per_s"])
    print("best      " + ", ".join(f"{a}={best[a]}" for a in axes) +
          f": {best['session_tokens_per_s']:.2f} tokens/s per session")
    print(f"wrote     {path} (+ .meta.json); plot it with: engram report --sweep {path}")
    return 0


def add_sweep_command(sub) -> None:
    """Add ``sweep`` to the ``engram sim`` subcommands."""
    p = sub.add_parser("sweep", help="run a what-if study (a TOML grid) locally or on a Dask cluster",
                       description="Run every point of a study file (a grid over device, policy, cache, "
                                   "sessions, compute and trace; see studies/*.toml) through the decode "
                                   "simulator, in parallel local processes or on a running Dask cluster, and "
                                   "write one row per point (CSV, or Parquet with pyarrow). Each point's seed "
                                   "derives from the study seed and the point, so every runner gives the same "
                                   "table.")
    p.add_argument("study", help="study TOML file")
    p.add_argument("--out", help="results table, .csv or .parquet (default STUDY.csv in the current directory)")
    p.add_argument("--jobs", type=int, help="local worker processes (default: CPU count; 1 = in this process)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://10.0.0.5:8786)")
    p.add_argument("--calibration", help="calibration.json for 'calibrated' devices and computes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_sweep)
