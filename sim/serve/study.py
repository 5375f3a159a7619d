"""A serving study: serving configurations read from a TOML file, their points, seeds and latency targets.

Study file
----------
::

    [study]
    name = "serve"
    description = "Requests/s one SSD carries under p99 TTFT <= 2 s, p99 TBT <= 100 ms"
    seed = 0

    [serve]                          # values shared by every point (any serving axis)
    duration_s = 300
    prompt_tokens = "lognormal:mean=512,cv=1,min=16,max=16384"
    compute_scale = 20

    [grid]                           # the product of these lists ([[grid]]: a union of several)
    device = ["seed-apple-m3-ultra", "ssd:qd1_us=80,iops=600000,parallelism=32"]
    readers = [16, 64]

    [slo]                            # the latency targets
    ttft_s = 2.0
    tbt_ms = 100.0
    percentile = 99

    [search]                         # engram sim capacity: the largest rate meeting the SLOs
    seeds = 3                        # searches per configuration (the band is their smallest and largest)
    min_rate = 0.5                   # requests/s probed first
    max_rate = 64.0                  # the largest rate probed (a capacity there is a lower bound)
    resolution = 0.05                # bisect until the bracket is this share of its top
    min_requests = 50                # requests a probe measures at least (its window grows at low rates)

Axes: :data:`SERVE_AXES` (name, type, default, label).  ``rate`` is the arrival rate of a point
(``engram sim serve``); a capacity search sets it.  ``trace`` is the text the rows come from (a
source spec; ``reuse = R`` makes it the synthetic trace of that reuse rate, as in sweeps).

Seeds: a point's seed is :func:`sim.sweep.point_seed` of the study seed and the point *without its
rate*, so every probe of one search draws the same requests (common random numbers, see
:mod:`sim.serve.workload`); ``repeat`` only changes the seeds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from engram.errors import ArgumentError
from engram.rowcache import DEFAULT_POLICY

from ..decode.speculative import DEFAULT_ACCEPTANCE, Speculation
from sim.core.params import BACKENDS, COMPUTE_DISTS, CONSUMERS, DEFAULT_LAYERS, DEFAULT_READERS, DEFAULT_THRESHOLD, Compute
from ..sweep.study import (check_cache_axes, coerce_axis, grid_points, load_study_toml, parse_study_toml, point_seed,
                           study_fingerprint, study_grids, varying_axes)
from ..trace import SYNTH_PREFIX, SynthSpec
from .compute import REFERENCE_STEP_MS, default_token_ms
from .engine import GATES
from .metrics import SLO
from .model import DEFAULT_TEXT, DEFAULT_TEXT_TOKENS
from .rows import DEFAULT_READ_CHUNK
from .workload import ARRIVALS, DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, Lengths

__all__ = ["CV_RULE", "MIN_PROBE_REQUESTS", "RateSearch", "SERVE_AXES", "SERVE_METRICS", "ServeStudy",
           "check_serve_point", "is_serve_study", "serve_point_seed", "serve_text"]

#: The range of the ``cv`` axis, in words (:class:`sim.serve.workload.Workload`: the coefficient of variation of
#: gamma arrivals' gaps, shape 1 / cv^2).
CV_RULE = "the inter-arrival gaps' coefficient of variation: 1 is Poisson, larger is burstier"

#: Axes of a serving study: name -> (type, default, label with unit).
SERVE_AXES: Dict[str, Tuple[type, Any, str]] = {
    "device": (str, "seed-apple-m3-ultra", "device"),
    "tail": (str, "", "latency tail from device"),
    "drives": (int, 1, "drives striped"),
    "threshold": (int, DEFAULT_THRESHOLD, "threshold (distinct rows)"),
    "backend": (str, "pread", "backend"),
    "readers": (int, DEFAULT_READERS, "readers / ring depth"),
    "cache_rows": (int, 0, "row cache per request (rows)"),
    "shared_cache_rows": (int, 0, "shared row cache (rows)"),
    "shared_cache_bytes": (str, "", "shared row cache (bytes: 64M, 1G; sets the rows)"),
    "cache_policy": (str, DEFAULT_POLICY, "row cache policy (lru, tinylfu)"),
    "dram_fraction": (float, 0.0, "share of the tables in DRAM"),
    "dram_rows": (str, "", "hot set in DRAM (file)"),
    "overlap_layers": (int, 0, "overlap (layers)"),
    "batch_overhead_us": (float, 0.0, "batch overhead (us)"),
    "trace": (str, DEFAULT_TEXT, "text"),
    "trace_limit": (int, DEFAULT_TEXT_TOKENS, "text tokens"),
    "reuse": (float, None, "reuse rate (synthetic text)"),
    "zipf": (float, None, "Zipf skew of repeats (synthetic text)"),
    "requests": (str, "", "requests file"),
    "arrivals": (str, "poisson", "arrival process"),
    "cv": (float, 1.0, "inter-arrival CV (gamma)"),
    "rate": (float, 1.0, "arrival rate (requests/s)"),
    "duration_s": (float, 300.0, "arrivals for (s)"),
    "warmup_s": (float, 0.0, "warm-up (s)"),
    "prompt_tokens": (str, DEFAULT_PROMPT_TOKENS, "prompt tokens"),
    "output_tokens": (str, DEFAULT_OUTPUT_TOKENS, "output tokens"),
    "max_running": (int, 64, "running requests at most"),
    "prefill_chunk": (int, 256, "prompt tokens a step"),
    "read_chunk": (int, DEFAULT_READ_CHUNK, "reader chunk (tokens)"),
    "gate": (str, "ready", "prefill gate"),
    "second_start_layer": (int, 2, "second table's reader starts at layer"),
    "step_ms": (float, REFERENCE_STEP_MS, "step compute at batch 1 (ms)"),
    "token_ms": (float, round(default_token_ms(), 6), "compute a token (ms)"),
    "compute_file": (str, "", "measured step compute (file)"),
    "compute_scale": (float, 1.0, "compute speed-up"),
    "compute_dist": (str, "constant", "compute distribution"),
    "compute_cv": (float, 0.0, "compute CV"),
    "consumer": (str, "none", "Engram consumer preset (none, cpu, h200)"),
    "layers": (int, DEFAULT_LAYERS, "decoder layers"),
    "draft_tokens": (int, 0, "draft tokens a step (speculative decoding; 0: off)"),
    "acceptance": (str, str(DEFAULT_ACCEPTANCE), "acceptance of a draft (or a profile by position: 0.8,0.6)"),
    "prefetch_drafts": (str, "off", "drafts' rows prefetched (off, on)"),
    "repeat": (int, 0, "replicate"),
}

#: Axes that came later, and their values at which a point keeps the seed it had before them
#: (:func:`serve_point_seed`).
_LATER_AXES = {"consumer": "none", "draft_tokens": 0, "acceptance": str(DEFAULT_ACCEPTANCE),
               "prefetch_drafts": "off"}

#: Result columns of a serving point: name -> label with unit (:meth:`sim.serve.ServeResult.row`).
SERVE_METRICS: Dict[str, str] = {
    "requests_measured": "requests measured", "censored": "requests cut short",
    "slo_met": "SLOs met (1) or not (0)", "attainment": "share of requests meeting the SLOs",
    "goodput_rps": "goodput (requests/s meeting the SLOs)",
    "ttft_at_slo_ms": "TTFT at the SLO percentile (ms)", "tbt_at_slo_ms": "TBT at the SLO percentile (ms)",
    "requests_per_s": "measured requests completed per second of the window",
    "output_tokens_per_s": "output tokens/s",
    **{f"{n}_{k}_ms": f"{label}, {k} (ms)" for n, label in (("ttft", "time to first token"),
                                                            ("tbt", "time between tokens"),
                                                            ("tpot", "time per output token"),
                                                            ("e2e", "end-to-end latency"),
                                                            ("queue", "wait for admission"))
       for k in ("mean", "p50", "p90", "p99")},
    "device_busy": "device busy fraction", "mean_queue_depth": "mean device queue depth",
    "reads_per_s": "device reads/s", "mean_read_latency_us": "mean read latency (us)",
    "iops_utilization": "reads/s over peak IOPS", "dedup_saving": "decode rows saved by cross-request dedup",
    "prefill_read_share": "share of reads from prefill", "mean_batch": "mean decode batch",
    "mean_running": "mean running requests", "mean_waiting": "mean waiting requests",
    "prefill_steps": "share of steps with prompt tokens",
    "token_compute_ms": "token time: compute (ms)", "token_reads_alone_ms": "token time: reads alone (ms)",
    "token_contention_ms": "token time: behind prefill reads (ms)", "token_stall_ms": "token time: stalled (ms)",
    "ttft_queue_ms": "TTFT: queued (ms)", "ttft_prefill_reads_ms": "TTFT: the prompt's rows streaming (ms)",
    "ttft_prefill_compute_ms": "TTFT: computing after the prompt's rows (ms)",
    **{f"tail_token_{k}_ms": f"token time in the SLO tail: {label} (ms)" for k, label in
       (("compute", "compute"), ("reads_alone", "reads alone"), ("contention", "behind prefill reads"),
        ("stall", "stalled"))},
    **{f"tail_ttft_{k}_ms": f"TTFT in the SLO tail: {label} (ms)" for k, label in
       (("queue", "queued"), ("prefill_reads", "the prompt's rows streaming"),
        ("prefill_compute", "computing after the rows"))},
    "sim_seconds": "simulated seconds", "wall_seconds": "wall seconds",
}

_STUDY_KEYS = {"name", "description", "seed", "calibration"}
_SECTIONS = ("study", "serve", "grid", "slo", "search")
_SEARCH_KEYS = ("seeds", "min_rate", "max_rate", "resolution", "min_requests")
#: Requests a capacity probe measures at least by default (:attr:`RateSearch.min_requests`): below it a
#: p99 is the largest of a handful of requests.
MIN_PROBE_REQUESTS = 50


def is_serve_study(path: Union[str, os.PathLike]) -> bool:
    """Whether the TOML file at ``path`` is a serving study (it has a ``[serve]`` or ``[slo]`` table).

    Raises
    ------
    FormatError
        Unreadable or not TOML.
    """
    d = load_study_toml(Path(path))
    return "serve" in d or "slo" in d


def serve_text(p: Mapping[str, Any]) -> str:
    """The text a point's rows come from: its ``trace``, or with ``reuse`` the synthetic trace of that rate
    (``zipf`` from its axis, seed ``repeat``), as :func:`sim.sweep.study.point_trace` makes it for sweeps."""
    r = p.get("reuse")
    if r is None:
        return p["trace"]
    base = SynthSpec.parse(p["trace"]) if p["trace"].startswith(SYNTH_PREFIX) else SynthSpec(float(r))
    z = p.get("zipf") if p.get("zipf") is not None else base.zipf
    return SynthSpec(float(r), z, int(p["trace_limit"]), base.seed + int(p.get("repeat", 0)), base.profile).spec()


def check_serve_point(p: Mapping[str, Any], where: str) -> None:
    """Check a complete point's values (ranges, spellings).

    Raises
    ------
    ArgumentError
        A value outside its range (names ``where``, the axis and the value).
    """
    for name in ("threshold", "readers", "drives", "trace_limit", "max_running", "prefill_chunk", "read_chunk",
                 "layers"):
        if p[name] < 1:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be >= 1")
    for name in ("cache_rows", "shared_cache_rows", "overlap_layers", "batch_overhead_us", "warmup_s", "step_ms",
                 "token_ms", "compute_cv", "repeat", "second_start_layer"):
        if p[name] < 0:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be >= 0")
    check_cache_axes(p, where)
    for name in ("rate", "duration_s", "compute_scale"):
        if not p[name] > 0:
            raise ArgumentError(f"{where}: {name} = {p[name]} must be > 0")
    if not (math.isfinite(p["cv"]) and p["cv"] > 0):
        raise ArgumentError(f"{where}: cv = {p['cv']} must be a finite number > 0 ({CV_RULE})")
    if p["warmup_s"] >= p["duration_s"]:
        raise ArgumentError(f"{where}: warmup_s = {p['warmup_s']} must be below duration_s = {p['duration_s']}")
    if not 0 <= p["dram_fraction"] <= 1:
        raise ArgumentError(f"{where}: dram_fraction = {p['dram_fraction']} must be in [0, 1]")
    if p["backend"] not in BACKENDS:
        raise ArgumentError(f"{where}: backend = {p['backend']!r} must be 'pread' or 'io_uring'")
    if p["arrivals"] not in ARRIVALS:
        raise ArgumentError(f"{where}: arrivals = {p['arrivals']!r} must be one of {', '.join(ARRIVALS)}")
    if p["gate"] not in GATES:
        raise ArgumentError(f"{where}: gate = {p['gate']!r} must be one of {', '.join(GATES)}")
    if p["compute_dist"] not in COMPUTE_DISTS:
        raise ArgumentError(f"{where}: compute_dist = {p['compute_dist']!r} is not a distribution")
    Compute(1.0, p["compute_dist"], p["compute_cv"])
    if p["consumer"] not in CONSUMERS:
        raise ArgumentError(f"{where}: consumer = {p['consumer']!r} must be one of {', '.join(CONSUMERS)}")
    if p.get("prefetch_drafts", "off") not in ("off", "on"):
        raise ArgumentError(f"{where}: prefetch_drafts = {p['prefetch_drafts']!r} must be 'off' or 'on'")
    try:
        Speculation(p.get("draft_tokens", 0), p.get("acceptance", str(DEFAULT_ACCEPTANCE)))
    except ArgumentError as exc:
        raise ArgumentError(f"{where}: {exc}") from None
    for name in ("prompt_tokens", "output_tokens"):
        lg = Lengths.parse(p[name])
        if lg.kind == "file" and not p["requests"]:
            raise ArgumentError(f"{where}: {name} = 'file' needs requests = FILE.jsonl")
    if p["arrivals"] == "replay" and not p["requests"]:
        raise ArgumentError(f"{where}: arrivals = 'replay' needs requests = FILE.jsonl")
    if p["reuse"] is not None and not 0.0 <= p["reuse"] < 1.0:
        raise ArgumentError(f"{where}: reuse = {p['reuse']} must be in [0, 1)")
    if p["zipf"] is not None and (p["reuse"] is None or p["zipf"] < 0):
        raise ArgumentError(f"{where}: zipf = {p['zipf']} needs reuse = RATE and must be >= 0")


def serve_point_seed(study_seed: int, p: Mapping[str, Any]) -> int:
    """The seed of a point: :func:`sim.sweep.point_seed` of the study seed and the point without ``rate``
    (and without the axes that came later -- ``consumer``, ``draft_tokens``, ``acceptance``,
    ``prefetch_drafts`` -- at their defaults: a point without them keeps the seed, so the results, it had
    before)."""
    return point_seed(study_seed, {k: v for k, v in p.items()
                                   if k != "rate" and not (k in _LATER_AXES and v == _LATER_AXES[k])})


@dataclass(frozen=True)
class RateSearch:
    """How ``engram sim capacity`` searches a serving study (see the module docstring).

    Raises
    ------
    ArgumentError
        seeds below 1, rates <= 0 or ``min_rate > max_rate``, a resolution outside (0, 1), ``min_requests``
        below 1.

    ``min_requests``: the requests each probe measures at least.  A probe at ``rate`` whose window
    ``duration_s - warmup_s`` would expect fewer arrivals has its ``duration_s`` lengthened so that
    ``min_requests`` plus three standard deviations of the arrival count are expected
    (:meth:`probe_duration`); a probe that still measures fewer (a rare draw) is counted in the
    capacity's ``small_sample`` flag (:class:`sim.serve.search.ServeCapacity`).
    """

    seeds: int = 3
    min_rate: float = 0.5
    max_rate: float = 64.0
    resolution: float = 0.05
    min_requests: int = MIN_PROBE_REQUESTS

    def __post_init__(self) -> None:
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise ArgumentError(f"search seeds = {self.seeds!r} must be an integer >= 1")
        for name in ("min_rate", "max_rate", "resolution"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ArgumentError(f"search {name} = {v!r} must be a number > 0")
        if self.min_rate > self.max_rate:
            raise ArgumentError(f"search min_rate = {self.min_rate} is above max_rate = {self.max_rate}")
        if not self.resolution < 1:
            raise ArgumentError(f"search resolution = {self.resolution} must be below 1 (a share of the rate)")
        if isinstance(self.min_requests, bool) or not isinstance(self.min_requests, int) or self.min_requests < 1:
            raise ArgumentError(f"search min_requests = {self.min_requests!r} must be an integer >= 1")

    def probe_duration(self, p: Mapping[str, Any], rate: float) -> float:
        """``duration_s`` of a probe of point ``p`` at ``rate`` (s): the point's own, or longer so that its
        window expects ``min_requests + 3 sqrt(min_requests) * cv`` arrivals (``cv`` the arrivals' coefficient
        of variation: 1 for Poisson, 0 for constant, ``p['cv']`` for gamma; replayed files: the point's own)."""
        if p.get("arrivals") == "replay":
            return float(p["duration_s"])
        cv = {"constant": 0.0, "gamma": float(p.get("cv", 1.0))}.get(p.get("arrivals"), 1.0)
        want = self.min_requests + 3.0 * math.sqrt(self.min_requests) * cv
        return max(float(p["duration_s"]), float(p.get("warmup_s", 0.0)) + want / float(rate))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _SEARCH_KEYS}


@dataclass
class ServeStudy:
    """A serving study (see the module docstring).

    Attributes
    ----------
    name, description : str
    seed : int
    fixed : dict
        Axis -> value of ``[serve]``.
    grids : list of dict
        Axis -> values; the points are the union of each grid's product.
    slo : SLO
    search : RateSearch
    calibration : Path or None
        For ``calibrated`` devices.
    source : str
    """

    name: str
    description: str = ""
    seed: int = 0
    fixed: Dict[str, Any] = field(default_factory=dict)
    grids: List[Dict[str, list]] = field(default_factory=list)
    slo: SLO = SLO()
    search: RateSearch = RateSearch()
    calibration: Optional[Path] = None
    source: str = "<dict>"

    @classmethod
    def from_dict(cls, d: Mapping, base_dir: Union[str, os.PathLike, None] = None,
                  source: str = "<dict>") -> "ServeStudy":
        """A serving study from a parsed TOML document.

        Raises
        ------
        ArgumentError
            Unknown sections, keys or axes, values of the wrong type or out of range (names them).
        """
        where = source
        unknown = set(d) - set(_SECTIONS)
        if unknown:
            raise ArgumentError(f"{where}: unknown section {sorted(unknown)[0]!r} in a serving study "
                                f"({', '.join(_SECTIONS)})")
        head = dict(d.get("study", {}))
        bad = set(head) - _STUDY_KEYS
        if bad:
            raise ArgumentError(f"{where}: [study] has unknown key {sorted(bad)[0]!r}")
        seed = head.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ArgumentError(f"{where}: [study] seed = {seed!r} must be an integer >= 0")
        base = Path(base_dir) if base_dir is not None else None
        fixed = {}
        for k, v in dict(d.get("serve", {})).items():
            if k not in SERVE_AXES:
                raise ArgumentError(f"{where}: [serve] has unknown axis {k!r} (axes: {', '.join(SERVE_AXES)})")
            fixed[k] = _relative(k, coerce_axis(SERVE_AXES, k, v, f"{where}: [serve]"), base)
        grids = study_grids(d.get("grid", [{}]), SERVE_AXES, where, lambda k, v: _relative(k, v, base))
        slo_t = dict(d.get("slo", {}))
        bad = set(slo_t) - {"ttft_s", "tbt_ms", "percentile"}
        if bad:
            raise ArgumentError(f"{where}: [slo] has unknown key {sorted(bad)[0]!r} (ttft_s, tbt_ms, percentile)")
        slo = SLO(**{k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in slo_t.items()})
        srch = dict(d.get("search", {}))
        bad = set(srch) - set(_SEARCH_KEYS)
        if bad:
            raise ArgumentError(f"{where}: [search] has unknown key {sorted(bad)[0]!r} ({', '.join(_SEARCH_KEYS)})")
        search = RateSearch(**{k: float(v) if k not in ("seeds", "min_requests") and isinstance(v, int)
                               and not isinstance(v, bool) else v
                               for k, v in srch.items()})
        cal = head.get("calibration")
        if cal is not None:
            cal = Path(cal)
            if not cal.is_absolute() and base is not None:
                cal = base / cal
        name = head.get("name") or (Path(source).stem if source != "<dict>" else "serve")
        st = cls(str(name), str(head.get("description", "")), int(seed), fixed, grids, slo, search, cal, source)
        st.points()
        return st

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "ServeStudy":
        """Read a serving study TOML file.

        Raises
        ------
        FormatError, ArgumentError
        """
        path = Path(path)
        return cls.from_dict(load_study_toml(path), base_dir=path.parent, source=str(path))

    @classmethod
    def loads(cls, text: str, base_dir: Union[str, os.PathLike, None] = None, source: str = "<text>") -> "ServeStudy":
        return cls.from_dict(parse_study_toml(text, source), base_dir=base_dir, source=source)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "seed": self.seed, "fixed": self.fixed,
                "grids": self.grids, "slo": self.slo.to_dict(), "search": self.search.to_dict(),
                "calibration": str(self.calibration) if self.calibration else None, "source": self.source}

    def fingerprint(self) -> str:
        """SHA-256 (hex, 16 digits) of the seed, the SLOs and every point."""
        return study_fingerprint({"seed": self.seed, "slo": self.slo.to_dict(), "points": self.points()})

    def axes(self) -> List[str]:
        """Axes that take more than one value over the study, in :data:`SERVE_AXES` order."""
        return varying_axes(self.points(), SERVE_AXES)

    def points(self) -> List[Dict[str, Any]]:
        """Every point (all axes, defaults filled in), without duplicates, in grid order.

        Raises
        ------
        ArgumentError
            A value out of range (names the axis).
        """
        return grid_points(self.grids, self.fixed, SERVE_AXES, check_serve_point, self.source)


def _relative(name: str, value: Any, base: Optional[Path]) -> Any:
    """File axes (``requests``, ``compute_file``, ``dram_rows``) given relative to the study file's folder, when the
    file is there (else as given: relative to the working directory)."""
    if name in ("requests", "compute_file", "dram_rows") and value and base is not None and \
            not Path(value).is_absolute() and (base / value).exists():
        return str(base / value)
    return value
