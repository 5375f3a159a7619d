"""A what-if study: a grid over the simulator's inputs, read from a TOML file, and the seed of each point.

A study is a grid over the simulator's inputs -- device, read policy, row
cache, concurrent sessions, compute and trace -- run with
:func:`sim.decode.simulate_decode` at every point (:mod:`sim.sweep.runner`).

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
over ``[fixed]``.

A ``[capacity]`` table makes it a capacity study (``engram sim capacity``,
:mod:`sim.sweep.capacity`): each point of the grid is a configuration whose largest
session count meeting a target is searched for, instead of a grid over
``sessions``::

    [capacity]
    target = 20.0        # tokens/s every session must reach (its slowest session)
    seeds = 5            # a seed ensemble per probe: the band is the smallest and largest capacity
    max_sessions = 1024  # the search stops there (a capacity found there is a lower bound)
  Axes (see :data:`AXES` for defaults and units): ``device``
(preset, ``ssd:...``, ``.json``/``.jsonl`` file, ``calibrated`` -- this
machine's calibrated device of the point's ``backend`` -- or
``calibrated:BACKEND``), ``trace`` and ``trace_limit`` (source spec of
:func:`sim.trace.load_trace`, tokens), ``threshold``, ``backend``, ``readers``
(pread readers or io_uring ring depth, as in the engine), ``cache_rows``,
``overlap_layers``, ``batch_overhead_us``, ``sessions``, ``steps``,
``start_spread_ms`` (older form of ``phases = "spread:MS"``, :func:`point_phases`), ``phases``
(``random`` -- the default --, ``lockstep`` or ``spread:MS``:
:class:`sim.core.params.Phases`), ``drives`` (drives striped by row id),
``shared_cache_rows``, ``shared_cache_bytes``, ``cache_policy``, ``cache_warmup_steps`` (steps each session
decodes through the row caches before the point's own, uncounted: caches warm as a running server's;
unset or 0: they start empty, :attr:`sim.core.params.Policy.cache_warmup_steps`), ``dram_fraction`` (share of the tables resident in
DRAM), ``dram_rows`` (a hot set, ``.npy``), ``tail`` (a measured device whose
latency distribution the point's device takes), ``compute`` (``""``: ``compute_ms`` with
``compute_dist``/``compute_cv``; ``"reference"``: the SPEC §8 compute fitted so
threshold 256 gives 19.16 tokens/s on the reference device;
``"calibrated:LABEL"``: a measured compute of the calibration), ``compute_ms``,
``compute_dist``, ``compute_cv``, ``layers``, ``hash_us``, ``host_cpus`` (the host's CPUs shared by
every session's steps, :class:`sim.decode.host.HostCPU`; unset: the drive alone), ``host_step_us`` and
``host_read_us`` (the engine's CPU a step and a read's, with ``host_cpus``; unset: the shipped profile's and the
device's fio figure), ``host_sessions`` (``threads`` or ``processes``, with ``host_cpus``; unset: threads),
``mode``,
``repeat`` (a replicate index: it only changes the seeds), ``reuse`` (a target
reuse rate: the point's trace becomes the synthetic trace of that rate,
:func:`point_trace`) and ``zipf`` (its Zipf skew).

Reproducibility
---------------
A point's seed is a hash of the study seed and the point's values
(:func:`point_seed`), never of the worker, the order or the runner, so the same
study gives the same table locally and on any cluster.
"""


from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from engram._checks import setting_number
from engram.errors import ArgumentError, FormatError
from engram.rowcache import DEFAULT_POLICY, POLICIES as CACHE_POLICIES, parse_size

from sim.core.io import read_text
from sim.decode.host import MAX_CPUS, MAX_STEP_CPU_S, MIN_CPUS, SESSIONS, engine_profile, process_scale
from sim.core.params import BACKENDS, COMPUTE_DISTS, DEFAULT_LAYERS, DEFAULT_PHASES, DEFAULT_READERS, DEFAULT_THRESHOLD, Phases
from ..trace import SYNTH_PREFIX, SynthSpec

try:
    import tomllib  # Python >= 3.11
except ModuleNotFoundError:  # pragma: no cover - older Pythons
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None

__all__ = ["AXES", "METRICS", "PHASES_COLUMN", "SHIPPED_STUDIES", "Study", "check_point", "coerce_axis",
           "load_study_toml", "parse_study_toml", "point_phases", "point_seed", "point_trace", "shipped_studies",
           "study_file", "study_fingerprint", "varying_axes", "check_cache_axes", "check_host_axes"]

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
    "phases": (str, DEFAULT_PHASES, "session phases"),
    "drives": (int, 1, "drives striped"),
    "shared_cache_rows": (int, 0, "shared row cache (rows)"),
    "shared_cache_bytes": (str, "", "shared row cache (bytes: 64M, 1G; sets the rows)"),
    "cache_policy": (str, DEFAULT_POLICY, "row cache policy (lru, tinylfu)"),
    # unset by default, so that the seeds of earlier studies stay (point_seed)
    "cache_warmup_steps": (int, None, "row cache warm-up (steps a session before the timed ones)"),
    "dram_fraction": (float, 0.0, "share of the tables in DRAM"),
    "dram_rows": (str, "", "hot set in DRAM (file)"),
    "tail": (str, "", "latency tail from device"),
    "compute": (str, "", "compute model"),
    "compute_ms": (float, 0.0, "compute per step (ms)"),
    "compute_dist": (str, "constant", "compute distribution"),
    "compute_cv": (float, 0.0, "compute CV"),
    "layers": (int, DEFAULT_LAYERS, "decoder layers"),
    "hash_us": (float, 0.0, "hash time (us)"),
    # the host (sim.decode.host): unset by default, so that the seeds of earlier studies stay (point_seed)
    "host_cpus": (float, None, "host CPUs shared by the sessions (unset: the drive alone)"),
    "host_step_us": (float, None, "the engine's own CPU a step (us; unset: its shipped profile)"),
    "host_read_us": (float, None, "CPU a row read takes (us; unset: the device's fio figure, else the profile's)"),
    "host_sessions": (str, None, "sessions as threads of one process or processes (with host_cpus; unset: threads)"),
    "mode": (str, "fast", "simulation mode"),
    "repeat": (int, 0, "replicate"),
    "reuse": (float, None, "reuse rate (synthetic trace)"),
    "zipf": (float, None, "Zipf skew of repeats (synthetic trace)"),
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
    "step_p999_ms": "step latency, p99.9 (ms)",
    "stall_mean_ms": "wait for rows per step, mean (ms)",
    "compute_mean_ms": "compute per step, mean (ms)",
    "reads_per_step": "device reads per step and session",
    "cache_hit_rate": "row cache hit rate",
    "device_busy": "device busy fraction",
    "mean_queue_depth": "mean device queue depth",
    "reads_per_s": "device reads/s",
    "iops_utilization": "reads/s over peak IOPS",
    "shared_cache_hit_rate": "shared row cache hit rate",
    "dram_hit_rate": "share of requests served from DRAM",
    "compute_realised_mean_ms": "compute drawn per step, mean (ms)",
    "compute_realised_cv": "compute drawn per step, CV",
    "wrapped": "trace replayed (1) or not (0)",
    "trace_steps": "steps of the trace replayed (tokens)",
}

#: The result column naming the session phases a point ran with (:attr:`sim.decode.DecodeResult.phases`): text,
#: so not one of the :data:`METRICS`.
PHASES_COLUMN = "phases_run"

_STUDY_KEYS = {"name", "description", "seed", "calibration"}
_SECTIONS = ("study", "fixed", "grid", "plot", "capacity")
_PLOT_KEYS = {"x", "y", "series", "facet", "where", "logx", "logy", "title", "kind", "target", "ylabel"}


#: Axes that do not enter a point's seed (:func:`point_seed`): sessions as threads or as processes change the
#: host's CPU a step, not the trace, the phases or the device's draws.
UNSEEDED_AXES = frozenset({"host_sessions"})


def point_seed(study_seed: int, params: Mapping[str, Any]) -> int:
    """The seed of one grid point: a hash of the study seed and the point's values.

    ``params`` maps axis names to values; the seed is the first 63 bits of the
    SHA-256 of their canonical JSON (sorted keys), so it depends on nothing but
    the study and the point.  Axes left unset (``None``) do not enter the hash,
    so adding an axis with an unset default keeps the seeds of existing studies.  Nor do the axes of
    :data:`UNSEEDED_AXES`: points that differ only there draw the same numbers (common random numbers), so that
    the difference between them is the model's, not the draws'.
    """
    blob = json.dumps({"study_seed": int(study_seed),
                       **{k: params[k] for k in sorted(params) if params[k] is not None and k not in UNSEEDED_AXES}},
                      sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "little") >> 1


def _tomllib():
    if tomllib is None:  # pragma: no cover - older Pythons without tomli
        raise ArgumentError("reading a study needs Python >= 3.11 or the 'tomli' package")
    return tomllib


def parse_study_toml(text: str, source: str) -> dict:
    """The tables of a study's TOML ``text``; ``FormatError`` naming ``source`` when it is not TOML."""
    tl = _tomllib()
    try:
        return tl.loads(text)
    except tl.TOMLDecodeError as exc:
        raise FormatError(f"{source}: not TOML ({exc})") from None


#: The example studies shipped with the package (``studies/`` in the repository links here).
SHIPPED_STUDIES = Path(__file__).resolve().parent.parent / "studies"


def shipped_studies() -> List[str]:
    """The names of the studies in :data:`SHIPPED_STUDIES` (``capacity``, ``serve``, ...), sorted."""
    return sorted(p.stem for p in SHIPPED_STUDIES.glob("*.toml"))


def study_file(arg: Union[str, os.PathLike]) -> Path:
    """The study file a command line names: ``arg`` itself when it exists, else the shipped study of that name
    (``capacity``, ``capacity.toml`` or ``studies/capacity.toml`` outside the repository, where a wheel's user
    has no ``studies/``), else ``arg`` (reading it then says it is missing, and lists the shipped ones)."""
    p = Path(arg)
    if p.exists():
        return p
    name = p.name if p.suffix == ".toml" else p.name + ".toml"
    shipped = SHIPPED_STUDIES / name
    if len(p.parts) <= 2 and (len(p.parts) < 2 or p.parts[0] == "studies") and shipped.is_file():
        return shipped
    return p


def load_study_toml(path: Path) -> dict:
    """The tables of the study file at ``path`` (UTF-8 text, :func:`sim.core.io.read_text`; a missing file's
    error lists the shipped studies, :func:`study_file`)."""
    try:
        text = read_text(path, "study")
    except FormatError as exc:
        if Path(path).exists():
            raise
        raise FormatError(f"{exc}; the studies shipped with engram, by name: {', '.join(shipped_studies())}") \
            from None
    return parse_study_toml(text, str(path))


def coerce_axis(axes: Mapping[str, tuple], name: str, value: Any, where: str) -> Any:
    """A study value checked against its axis type in ``axes`` (``name -> (type, ...)``; ints accepted for
    floats, floats finite); ``ArgumentError`` naming ``where``, the axis and the value."""
    typ = axes[name][0]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ArgumentError(f"{where}: {name} = {value!r} must be {typ.__name__}")
    if typ is float and not math.isfinite(value):
        raise ArgumentError(f"{where}: {name} = {value!r} must be finite")
    return value


def study_grids(raw: Any, axes: Mapping[str, tuple], where: str,
                value: Optional[Callable[[str, Any], Any]] = None) -> List[Dict[str, list]]:
    """The ``[[grid]]`` tables ``raw`` of a study (one table, or a list of them): axis -> values (a single value
    as a list of one), each checked against ``axes`` (:func:`coerce_axis`) and then, with ``value``, replaced by
    ``value(axis, value)``.

    Raises
    ------
    ArgumentError
        An axis not in ``axes``, one without values, or a value of the wrong type (names the grid).
    """
    if isinstance(raw, Mapping):
        raw = [raw]
    grids = []
    for gi, g in enumerate(raw):
        gw = f"{where}: grid {gi}"
        out = {}
        for k, vals in dict(g).items():
            if k not in axes:
                raise ArgumentError(f"{gw}: unknown axis {k!r} (axes: {', '.join(axes)})")
            if not isinstance(vals, list):
                vals = [vals]
            if not vals:
                raise ArgumentError(f"{gw}: axis {k!r} has no values")
            out[k] = [coerce_axis(axes, k, v, gw) for v in vals]
            if value is not None:
                out[k] = [value(k, v) for v in out[k]]
        grids.append(out)
    return grids


def grid_points(grids: Sequence[Mapping[str, list]], fixed: Mapping[str, Any], axes: Mapping[str, tuple],
                check: Callable[[Mapping[str, Any], str], None], source: str) -> List[Dict[str, Any]]:
    """Every point of a study: axis -> value, the defaults of ``axes`` (``name -> (type, default, ...)``) then
    ``fixed`` then each combination of a grid's values (no grid: one point), each checked with
    ``check(point, source)``; without duplicates, in grid order."""
    out, seen = [], set()
    for g in grids or [{}]:
        names = list(g)
        for combo in itertools.product(*(g[n] for n in names)):
            p = {k: default for k, (_, default, _) in axes.items()}
            p.update(fixed)
            p.update(zip(names, combo))
            check(p, source)
            key = json.dumps(p, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def study_fingerprint(payload: Mapping[str, Any]) -> str:
    """SHA-256 (hex, 16 digits) of ``payload`` as canonical JSON: equal for studies that give equal tables."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def varying_axes(points: Sequence[Mapping[str, Any]], order: Sequence[str]) -> List[str]:
    """The axes of ``order`` that take more than one value over ``points``, in that order."""
    vals: Dict[str, set] = {}
    for p in points:
        for k, v in p.items():
            vals.setdefault(k, set()).add(v)
    return [k for k in order if len(vals.get(k, ())) > 1]


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
    capacity : dict or None
        The ``[capacity]`` table of a capacity study (read by :class:`sim.sweep.capacity.CapacitySpec`), else ``None``.
    """

    name: str
    description: str = ""
    seed: int = 0
    fixed: Dict[str, Any] = field(default_factory=dict)
    grids: List[Dict[str, list]] = field(default_factory=list)
    plots: List[dict] = field(default_factory=list)
    calibration: Optional[Path] = None
    source: str = "<dict>"
    capacity: Optional[Dict[str, Any]] = None

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
        unknown = set(d) - set(_SECTIONS)
        if unknown:
            raise ArgumentError(f"{where}: unknown section {sorted(unknown)[0]!r} ({', '.join(_SECTIONS)})")
        capacity = d.get("capacity")
        if capacity is not None and not isinstance(capacity, Mapping):
            raise ArgumentError(f"{where}: [capacity] must be a table (target = ..., seeds = ...)")
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
            fixed[k] = coerce_axis(AXES, k, v, f"{where}: [fixed]")
        grids = study_grids(d.get("grid", [{}]), AXES, where)
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
        study = cls(str(name), str(head.get("description", "")), int(seed), fixed, grids, plots, cal, source,
                    dict(capacity) if capacity is not None else None)
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
        return cls.from_dict(load_study_toml(path), base_dir=path.parent, source=str(path))

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
        return cls.from_dict(parse_study_toml(text, source), base_dir=base_dir, source=source)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "seed": self.seed, "fixed": self.fixed,
                "grids": self.grids, "plots": self.plots,
                "calibration": str(self.calibration) if self.calibration else None, "source": self.source,
                "capacity": self.capacity}

    def fingerprint(self) -> str:
        """SHA-256 (hex, 16 digits) of the study seed and every point: equal for studies that give equal tables."""
        return study_fingerprint({"seed": self.seed, "points": self.points()})

    # -------------------------------------------------------------- points
    def axes(self) -> List[str]:
        """Axes that take more than one value over the study, in :data:`AXES` order."""
        return varying_axes(self.points(), AXES)

    def points(self) -> List[Dict[str, Any]]:
        """Every point: axis -> value (all axes, defaults filled in), without duplicates, in grid order.

        Raises
        ------
        ArgumentError
            A value outside its range (names the axis and value).
        """
        return grid_points(self.grids, self.fixed, AXES, check_point, self.source)


def point_trace(p: Mapping[str, Any]) -> str:
    """The trace source a point simulates: its ``trace``; with ``reuse`` set, the synthetic trace of that rate
    (``synth:reuse=R``, ``zipf=Z`` from the ``zipf`` axis, seed ``repeat``; a ``synth:`` trace keeps its other
    parameters, e.g. ``profile=prose``), ``trace_limit`` tokens long (:mod:`sim.trace.synth`)."""
    r = p.get("reuse")
    if r is None:
        return p["trace"]
    base = SynthSpec.parse(p["trace"]) if p["trace"].startswith(SYNTH_PREFIX) else SynthSpec(float(r))
    z = p.get("zipf") if p.get("zipf") is not None else base.zipf
    return SynthSpec(float(r), z, base.tokens, base.seed + int(p.get("repeat", 0)), base.profile).spec()


def point_phases(p: Mapping[str, Any]) -> str:
    """The session phases a point runs with (:class:`sim.core.params.Phases` as text): ``spread:MS`` when the older
    ``start_spread_ms`` axis is set above 0, else its ``phases`` (``random`` unless the study says otherwise)."""
    spread = float(p.get("start_spread_ms") or 0.0)
    if spread > 0:
        return str(Phases("spread", spread * 1e-3))
    return str(Phases.parse(p.get("phases") or DEFAULT_PHASES))


def check_cache_axes(p: Mapping[str, Any], where: str) -> None:
    """``ArgumentError`` (naming ``where``) unless ``cache_policy`` is one of the engine's and
    ``shared_cache_bytes`` a size (:func:`engram.rowcache.parse_size`) -- the row cache axes of
    decode and serving studies alike."""
    if p.get("cache_policy", DEFAULT_POLICY) not in CACHE_POLICIES:
        raise ArgumentError(f"{where}: cache_policy = {p['cache_policy']!r} must be one of "
                            f"{', '.join(CACHE_POLICIES)}")
    if p.get("shared_cache_bytes"):
        try:
            b = parse_size(p["shared_cache_bytes"], "shared_cache_bytes")
        except ArgumentError as exc:
            raise ArgumentError(f"{where}: {exc}") from None
        if b and b < 264:
            raise ArgumentError(f"{where}: shared_cache_bytes = {b} holds no row (264 bytes)")
        if b // 264 >= 1 << 31:
            raise ArgumentError(f"{where}: shared_cache_bytes = {b} is {b // 264} rows; at most 2**31 - 1 rows "
                                f"(563 GiB)")


def check_host_axes(p: Mapping[str, Any], where: str) -> None:
    """``ArgumentError`` (naming ``where`` and the axis) unless the host axes describe one
    (:class:`sim.decode.host.HostCPU`): ``host_cpus`` unset or in [:data:`~sim.decode.host.MIN_CPUS`,
    :data:`~sim.decode.host.MAX_CPUS`], ``host_step_us`` and ``host_read_us`` only with it, each in [0, 60 s],
    ``host_sessions`` only with it, one of :data:`~sim.decode.host.SESSIONS`."""
    cpus = p.get("host_cpus")
    if cpus is None:
        given = [k for k in ("host_step_us", "host_read_us", "host_sessions") if p.get(k) is not None]
        if given:
            raise ArgumentError(f"{where}: {' and '.join(given)} go with host_cpus = N (the host's CPUs)")
        return
    if p.get("host_sessions") is not None and p["host_sessions"] not in SESSIONS:
        raise ArgumentError(f"{where}: host_sessions = {p['host_sessions']!r:.40}: expected one of "
                            f"{', '.join(SESSIONS)}")
    try:
        setting_number("host_cpus", cpus, MIN_CPUS, MAX_CPUS)
        us = {k: setting_number(k, p[k], 0.0, MAX_STEP_CPU_S * 1e6) if p.get(k) is not None else 0.0
              for k in ("host_step_us", "host_read_us")}
    except ArgumentError as exc:
        raise ArgumentError(f"{where}: {exc}") from None
    if p.get("host_read_us") is None:  # the profile's (a fio device's own figure is known only once it loads)
        us["host_read_us"] = _profile_read_us()
    scale = process_scale(engine_profile(), p.get("host_sessions") or "threads")[0]
    step = (us["host_step_us"] + ROWS_A_STEP * us["host_read_us"]) * scale
    if step > MAX_STEP_CPU_S * 1e6:
        what = f"host_step_us + {ROWS_A_STEP} x host_read_us"
        if scale != 1:
            what = f"({what}) x {scale:.3g} (host_sessions = processes: the profile's process_cpu_ratio)"
        raise ArgumentError(f"{where}: {what} = {step:g} us: a step of {ROWS_A_STEP} reads would ask for more than "
                            f"{MAX_STEP_CPU_S:g} s of CPU")


@functools.lru_cache(maxsize=1)
def _profile_read_us() -> float:
    """The shipped profile's CPU a read, us (:func:`sim.decode.host.engine_profile`: fio's x its ratio), read once
    for every point's check."""
    prof = engine_profile()
    return float(prof["read_cpu_us"]) * float(prof.get("read_cpu_ratio") or 1.0)


#: The rows a decode step reads at most (SPEC §2: 24 row ids in each of 2 layers), for the host axes' check.
ROWS_A_STEP = 48


def check_point(p: Mapping[str, Any], where: str) -> None:
    """Check a complete point's values against their ranges.

    Raises
    ------
    ArgumentError
        A value outside its range (names ``where``, the axis and the value).
    """
    for name in ("threshold", "readers", "sessions", "steps", "trace_limit", "layers", "drives"):
        if p[name] < 1:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be >= 1")
    for name in ("cache_rows", "overlap_layers", "batch_overhead_us", "start_spread_ms", "compute_ms",
                 "compute_cv", "hash_us", "repeat", "shared_cache_rows"):
        if p[name] < 0:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be >= 0")
    check_cache_axes(p, where)
    if not 0 <= p["dram_fraction"] <= 1:
        raise ArgumentError(f"{where}: dram_fraction = {p['dram_fraction']} must be in [0, 1]")
    Phases.parse(p["phases"])
    if p["start_spread_ms"] > 0 and p["phases"] != DEFAULT_PHASES:
        raise ArgumentError(f"{where}: give phases = {p['phases']!r} or the older start_spread_ms = "
                            f"{p['start_spread_ms']:g} (phases = \"spread:MS\"), not both")
    if p["backend"] not in BACKENDS:
        raise ArgumentError(f"{where}: backend = {p['backend']!r} must be 'pread' or 'io_uring'")
    if p["mode"] not in ("fast", "exact"):
        raise ArgumentError(f"{where}: mode = {p['mode']!r} must be 'fast' or 'exact'")
    if p["compute_dist"] not in COMPUTE_DISTS:
        raise ArgumentError(f"{where}: compute_dist = {p['compute_dist']!r} is not a distribution")
    c = p["compute"]
    if c not in ("", "reference") and not c.startswith("calibrated:"):
        raise ArgumentError(f"{where}: compute = {c!r} must be '', 'reference' or 'calibrated:LABEL'")
    if p.get("cache_warmup_steps") is not None and p["cache_warmup_steps"] < 0:
        raise ArgumentError(f"{where}: cache_warmup_steps = {p['cache_warmup_steps']} must be >= 0")
    check_host_axes(p, where)
    if p["reuse"] is not None and not 0.0 <= p["reuse"] < 1.0:
        raise ArgumentError(f"{where}: reuse = {p['reuse']} must be in [0, 1)")
    if p["zipf"] is not None and (p["reuse"] is None or p["zipf"] < 0):
        raise ArgumentError(f"{where}: zipf = {p['zipf']} needs reuse = RATE and must be >= 0")
