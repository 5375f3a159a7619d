"""Serving capacity: the largest arrival rate whose run meets the SLOs, searched with a seed ensemble.

A configuration (a point of a serving study without its ``rate``) *meets* the SLOs at a rate when
a run of ``duration_s`` seconds of arrivals at that rate meets them (:class:`sim.serve.SLO`: the
TTFT and TBT percentiles under their targets, every measured request finished).  Its capacity is
the largest such rate, in requests/s: how many users one device carries.

Search (per seed, Vidur-Search's and DistServe's binary search on the rate, galloping first, as
:mod:`sim.sweep.capacity` searches session counts): probe ``min_rate``; while it passes double it (up to
``max_rate``: a capacity there is a lower bound); if ``min_rate`` fails, halve it (at most
:data:`MAX_HALVINGS` times: below that the capacity is reported as 0); then bisect between the
last rate that passed and the first that failed until they are ``resolution`` (a share of the
upper one) apart.  The searches of every configuration and seed advance together, one round of
probes at a time, in parallel (:class:`~sim.serve.runner.ServeRunner`: local processes or a
Dask cluster).  A probe stops early once the TTFT target can no longer be met (``fail_fast``).

Sample size: a probe measures at least ``min_requests`` requests (:attr:`RateSearch.min_requests`,
:data:`sim.serve.study.MIN_PROBE_REQUESTS` by default): at a rate too low for the point's window to
expect them, the probe's ``duration_s`` is lengthened (:meth:`RateSearch.probe_duration`; the probes
table records the duration each probe ran).  A capacity row gives ``fewest_requests``, the fewest
requests any probe of the configuration measured, and ``small_sample`` when that is below
``min_requests`` (a rare Poisson draw, or a replayed file too short): its percentiles rest on few requests.

The capacity of a configuration is the median of its seeds' capacities (the lower median for an
even count), with the band from the smallest to the largest.  Every probe of one search uses the
same requests, their arrivals scaled by the rate (:mod:`sim.serve.workload`); the ``repeat`` axis
(0, 1, ... per seed) changes them.

Where the knee comes from (:func:`knee_cause`): at the first rate that fails (of the median seed's
search), which target failed and which part of it grew most from the lowest rate probed, in the tail
the SLO looks at (the steps or requests at or above its percentile) -- for TBT, the compute of a
step (``compute``: bigger batches), the decode reads alone (``device``), the wait of decode reads
behind prefill reads or for prefill rows (``prefill reads starving decode``); for TTFT, waiting for
admission (``queueing``), the prompt's rows streaming (``prefill reads``) or the prompt's steps after
its last row arrived (``prefill compute``).  When even the lowest rate probed fails, the cause is the
largest part there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from engram._checks import settings_from
from engram.errors import ArgumentError

from sim.sweep.capacity import CapacityResult, ProbeRounds, SearchBound, SearchProgress, SearchRun, SeedBand, gallop, \
    is_capacity_table, probes_path
from sim.core.schema import SERVE_SCHEMA
from .metrics import SLO, plain_value
from .runner import ServeRunner, resolve_serve_context
from .study import SERVE_AXES, SERVE_METRICS, RateSearch, ServeStudy, check_serve_point, \
    serve_point_seed

__all__ = ["CAPACITY_COLUMNS", "KNEE_CAUSES", "MAX_HALVINGS", "PROBE_COLUMNS", "ServeCapacity", "ServeCapacityResult",
           "find_serve_capacity", "is_serve_capacity_table", "knee_cause", "knee_words", "probe_point", "probe_seed",
           "probes_path", "run_serve_capacity"]

#: Halvings of ``min_rate`` tried when it fails, before the capacity is reported as 0.
MAX_HALVINGS = 6
_SEARCHED = ("rate", "repeat")
#: The causes :func:`knee_cause` names.
KNEE_CAUSES = ("compute", "device", "prefill reads starving decode", "queueing", "prefill reads", "prefill compute")

#: Columns of the probes table: a serving row and its configuration.
PROBE_COLUMNS = ["point", "config", *SERVE_AXES, "seed", *SERVE_METRICS]
#: Columns of the capacity table.
CAPACITY_COLUMNS = ["config", *[a for a in SERVE_AXES if a not in _SEARCHED], "capacity_rps", "capacity_low",
                    "capacity_high", "capacities", "lower_bound", "below_min", "seeds", "probes", "min_rate",
                    "max_rate", "resolution", "min_requests", "fewest_requests", "small_sample", "slo", "goodput_at_capacity", "attainment_at_capacity",
                    "ttft_p99_at_capacity_ms", "tbt_p99_at_capacity_ms", "output_tokens_per_s_at_capacity",
                    "device_busy_at_capacity", "mean_batch_at_capacity", "knee_rate", "knee_failed", "knee_cause"]


def _rate_search(search: RateSearch) -> Generator[float, bool, Tuple[float, bool, bool]]:
    """:func:`~sim.sweep.capacity.gallop` over the rate: yields the rate to probe, receives whether it passed;
    returns ``(capacity, lower bound, below min)``."""
    cap, bound = yield from gallop(float(search.min_rate), float(search.max_rate),
                                   lambda lo, hi: hi - lo > search.resolution * hi, MAX_HALVINGS)
    return cap, bound, cap == 0  # 0 only where every halving of min_rate failed


def knee_cause(base: Mapping[str, Any], fail: Mapping[str, Any], slo: SLO) -> Tuple[str, str]:
    """``(what failed, cause)`` between a probe at a low rate (``base``) and the first failing one (``fail``):
    see the module docstring.  ``what failed`` is ``"tbt"``, ``"ttft"`` (both: ``"tbt+ttft"``) or ``"unstable"``."""
    tbt_bad = fail["tbt_at_slo_ms"] > slo.tbt_ms
    ttft_bad = fail["ttft_at_slo_ms"] > slo.ttft_s * 1e3
    failed = "+".join(x for x, bad in (("tbt", tbt_bad), ("ttft", ttft_bad)) if bad) or "unstable"

    def grew(parts: Dict[str, Tuple[str, ...]]) -> str:
        d = {name: sum(fail[c] - base[c] for c in cols) for name, cols in parts.items()}
        return max(d, key=lambda k: d[k])

    if tbt_bad:
        return failed, grew({"compute": ("tail_token_compute_ms",), "device": ("tail_token_reads_alone_ms",),
                             "prefill reads starving decode": ("tail_token_contention_ms", "tail_token_stall_ms")})
    return failed, grew({"queueing": ("tail_ttft_queue_ms",), "prefill reads": ("tail_ttft_prefill_reads_ms",),
                         "prefill compute": ("tail_ttft_prefill_compute_ms",)})


def knee_words(rate: Optional[float], failed: str, cause: str) -> str:
    """What fails first above a capacity and why, in words: ``TTFT over the target at 3.25 requests/s, from
    queueing`` (``failed`` and ``cause`` as :func:`knee_cause` names them; empty when ``rate`` is ``None``: every
    probe passed)."""
    if rate is None or not failed:
        return ""
    what = ("requests left unfinished (the queue grows)" if failed == "unstable"
            else failed.upper().replace("+", " and ") + " over the target")
    return f"{what} at {rate:.3g} requests/s, from {cause}"


@dataclass
class ServeCapacity(SeedBand):
    """The capacity of one configuration (requests/s).

    Attributes
    ----------
    index : int
    config : dict
        Its axis values (``rate`` and ``repeat`` are the search's).
    search : RateSearch
    slo : SLO
    per_seed : list of float
        The capacity each seed's search found.
    bound, below : list of bool
        Per seed: passed at ``max_rate`` (a lower bound); failed every halving of ``min_rate`` (reported as 0).
    probes : list of dict
        Every probe's row, in the order they ran.
    """

    index: int
    config: Dict[str, Any]
    search: RateSearch
    slo: SLO
    per_seed: List[float] = field(default_factory=list)
    bound: List[bool] = field(default_factory=list)
    below: List[bool] = field(default_factory=list)
    probes: List[Dict[str, Any]] = field(default_factory=list)
    axis, value = "rate", float

    @property
    def top(self) -> float:
        return self.search.max_rate

    @property
    def fewest_requests(self) -> int:
        """The fewest requests any probe of this configuration measured (0 before any probe)."""
        return min((int(r["requests_measured"]) for r in self.probes), default=0)

    @property
    def small_sample(self) -> bool:
        """Whether a probe measured fewer than ``search.min_requests`` requests."""
        return self.fewest_requests < self.search.min_requests

    def knee(self) -> Tuple[Optional[float], str, str]:
        """``(rate, what failed, cause)`` at the first failing rate above the capacity of the median seed's search
        (``(None, "", "")`` when every probe passed)."""
        k = self.median_seed()
        mine = [r for r in self.probes if r["repeat"] == k]
        fails = sorted((r for r in mine if not r["slo_met"] and r["rate"] > self.capacity), key=lambda r: r["rate"])
        if not fails:
            return None, "", ""
        base = min(mine, key=lambda r: r["rate"])
        if base is fails[0]:  # failed at the lowest rate probed: the largest part, not the one that grew
            base = {k: 0.0 for k, v in base.items() if isinstance(v, (int, float))}
        what, cause = knee_cause(base, fails[0], self.slo)
        return float(fails[0]["rate"]), what, cause

    def label(self) -> str:
        """``12.5 requests/s (11.7-13.3 over 3 seeds)``."""
        if self.capacity == 0 and all(self.below):
            lowest = min(float(r["rate"]) for r in self.probes)
            cap = f"< {lowest:.3g}"
        else:
            cap = f"{'>= ' if self.lower_bound else ''}{self.capacity:.3g}"
        band = self.band(lambda x: f"{x:.3g}")
        small = (f"; SMALL SAMPLE: a probe measured only {self.fewest_requests} requests"
                 if self.small_sample else "")
        return f"{cap} requests/s ({band}{small})"

    def row(self) -> Dict[str, Any]:
        at = self.at_capacity
        kr, kf, kc = self.knee()

        def m(key):
            return at[key] if at else float("nan")

        out = {
            **self.row_head(), "capacity_rps": self.capacity, "capacity_low": self.low, "capacity_high": self.high,
            "capacities": " ".join(f"{c:.6g}" for c in self.per_seed), "lower_bound": self.lower_bound,
            "below_min": all(self.below), "seeds": len(self.per_seed), "probes": len(self.probes),
            "min_rate": self.search.min_rate, "max_rate": self.search.max_rate,
            "resolution": self.search.resolution, "min_requests": self.search.min_requests,
            "fewest_requests": self.fewest_requests, "small_sample": self.small_sample, "slo": self.slo.text(),
            "goodput_at_capacity": m("goodput_rps"), "attainment_at_capacity": m("attainment"),
            "ttft_p99_at_capacity_ms": m("ttft_p99_ms"), "tbt_p99_at_capacity_ms": m("tbt_p99_ms"),
            "output_tokens_per_s_at_capacity": m("output_tokens_per_s"), "device_busy_at_capacity": m("device_busy"),
            "mean_batch_at_capacity": m("mean_batch"), "knee_rate": kr if kr is not None else float("nan"),
            "knee_failed": kf, "knee_cause": kc,
        }
        return {k: plain_value(v) for k, v in out.items()}


def probe_point(config: Mapping[str, Any], rate: float, repeat: int, search: RateSearch) -> Dict[str, Any]:
    """The point a probe of ``config`` at ``rate`` runs: ``duration_s`` lengthened to measure ``search.min_requests``
    requests (:meth:`RateSearch.probe_duration`).  Its seed is that of the point with the configuration's own
    duration (:func:`probe_seed`), so lengthening a window only adds requests after the ones it had."""
    p = {**config, "rate": float(rate), "repeat": repeat}
    p["duration_s"] = search.probe_duration(p, rate)
    return p


def probe_seed(study_seed: int, config: Mapping[str, Any], repeat: int) -> int:
    """The seed of every probe of one search: :func:`serve_point_seed` of the configuration and ``repeat``."""
    return serve_point_seed(study_seed, {**config, "repeat": repeat})


class _RateRounds(ProbeRounds):
    """Probes of an arrival rate (:func:`find_serve_capacity`)."""

    runner = ServeRunner
    axis, value = "rate", float

    def __init__(self, ctx, caps: List[ServeCapacity], run: SearchRun, search: RateSearch, study_seed: int):
        self.search, self.study_seed = search, study_seed
        super().__init__(ctx, caps, run, search.seeds, lambda i: _rate_search(search))

    def task(self, i, r, x):
        cfg = self.caps[i].config
        return probe_point(cfg, x, r, self.search), probe_seed(self.study_seed, cfg, r)

    def passed(self, row):
        return bool(row["slo_met"])

    def answer(self, row):
        return bool(row["slo_met"])

    def note(self, row):
        return (f"probe of configuration {row['config']}, seed {row['repeat']}: {row['rate']:.4g} requests/s "
                f"{'meets' if row['slo_met'] else 'misses'} the SLOs")

    def finished(self, i, r, value):
        return f"configuration {i}, seed {r}: {value[0]:.4g} requests/s"

    def progress(self) -> SearchProgress:
        """In probes, against the most the searches may still ask over candidate rates: a fine geometric grid from
        below the deepest halving to above the top."""
        lo = float(self.search.min_rate) / 2.0 ** (MAX_HALVINGS + 1)
        grid = np.geomspace(lo, 2.0 * float(self.search.max_rate), 2000)
        return SearchProgress(SearchBound(lambda: _rate_search(self.search), grid), list(self.searches),
                              self.settings.desc or "serve capacity", self.settings.progress)


def find_serve_capacity(configs: Sequence[Mapping[str, Any]], slo: SLO = SLO(), search: RateSearch = RateSearch(),
                        study_seed: int = 0, run: SearchRun = SearchRun(), *,
                        calibration=None) -> Tuple[List[ServeCapacity], str]:
    """Search the capacity of every configuration; return ``(capacities in configuration order, runner name)``.

    ``configs``: complete serving points (every axis; ``rate`` and ``repeat`` are set by the search).  Each
    probe's seed is :func:`sim.serve.study.serve_point_seed` of ``study_seed`` and the probe's point.  ``run``:
    processes or a Dask scheduler, the progress line, probe rows of an earlier run (``done``: not simulated
    again), a callback getting each probe row as it finishes (``on_probe``).

    Raises
    ------
    ArgumentError
        Bad configurations, devices, texts or calibration.
    SweepError
        A probe whose worker died too often.
    """
    cfgs = []
    for c in configs:
        p = {k: c.get(k, d) for k, (_, d, _) in SERVE_AXES.items()}
        p.update(rate=float(search.min_rate), repeat=0)
        check_serve_point(p, "configuration")
        cfgs.append(p)
    if not cfgs:
        raise ArgumentError("no configurations to search")
    ctx = resolve_serve_context(cfgs, slo, Path(calibration) if calibration else None, fail_fast=True)
    caps = [ServeCapacity(i, c, search, slo) for i, c in enumerate(cfgs)]
    name = _RateRounds(ctx, caps, run, search, study_seed).run()
    for cap in caps:
        cap.below = [c == 0 for c in cap.per_seed]
    return caps, name


class ServeCapacityResult(CapacityResult):
    """A serving capacity study's results: one :class:`ServeCapacity` per configuration, ``spec`` (also
    ``search``) the :class:`~sim.serve.study.RateSearch` (see :class:`sim.sweep.capacity.CapacityResult`)."""

    kind, schema, spec_key, axes, searched = "serve-capacity", SERVE_SCHEMA, "search", SERVE_AXES, _SEARCHED
    columns, probe_columns = CAPACITY_COLUMNS, PROBE_COLUMNS

    @property
    def search(self) -> RateSearch:
        return self.spec

    def notes(self) -> dict:
        return {"slo": self.study.slo.to_dict(), "metric_labels": SERVE_METRICS}

    def probe(self, config, row):
        repeat = row.get("repeat")
        return probe_point(config, float(row.get("rate")), repeat, self.spec), probe_seed(self.study.seed, config, repeat)

    def finished_probe(self, row):
        return isinstance(row.get("slo_met"), int)

    def check_earlier(self, path, meta):
        """Nothing: a rate search starts its probes one way."""


def run_serve_capacity(study: Union[ServeStudy, str, os.PathLike], *, jobs: Optional[int] = None,
                       scheduler: Optional[str] = None, calibration: Union[str, os.PathLike, None] = None,
                       progress: Union[bool, str] = True, out: Union[str, os.PathLike, None] = None,
                       connect_timeout: float = 30.0, resume: bool = False, **overrides: Any) -> ServeCapacityResult:
    """Run a serving capacity study: the capacity of every point of its grid.

    ``out``: the capacity table (``.csv`` or ``.parquet``, one row per configuration, :data:`CAPACITY_COLUMNS`)
    with ``OUT.meta.json``, and every probe in ``OUT.probes.csv`` as it finishes; ``resume=True`` starts from
    the probes of an earlier run.  ``overrides``: :class:`~sim.serve.study.RateSearch` fields replacing the
    study's ``[search]`` values (``None`` ignored).  Local workers are spawned and import the calling script:
    from a script, call this under ``if __name__ == "__main__":`` unless ``jobs=1`` or ``scheduler`` is given
    (see :func:`sim.sweep.capacity.run_capacity`).

    Raises
    ------
    ArgumentError, FormatError
        A bad study, device, text or calibration; an override that is not a field of ``RateSearch`` (names it
        and lists the fields); ``resume`` on probes of another study.
    OutputError
        ``out`` cannot be written.
    SweepError
        A probe whose worker died too often.
    """
    if not isinstance(study, ServeStudy):
        study = ServeStudy.load(study)
    values = {**study.search.to_dict(), **{k: v for k, v in overrides.items() if v is not None}}
    search = settings_from(RateSearch, values, f"{study.source}: [search] and the overrides")

    def start(cal):
        return lambda run: find_serve_capacity(study.points(), study.slo, search, study.seed, calibration=cal, run=run)

    return ServeCapacityResult(study, search, [], 0.0, "").run(start, out=out, resume=resume, calibration=calibration,
                                                               desc="serve capacity", jobs=jobs, scheduler=scheduler,
                                                               connect_timeout=connect_timeout, progress=progress)


def is_serve_capacity_table(path: Union[str, os.PathLike]) -> bool:
    """Whether the table at ``path`` is a serving capacity table (its metadata says ``"kind": "serve-capacity"``).

    Raises
    ------
    FormatError
        Unreadable metadata.
    """
    return is_capacity_table(path, "serve-capacity")
