"""Capacity: the largest number of concurrent sessions a configuration sustains at a target, found by search.

A configuration (device, read policy, compute, trace ...: a point of a study
without ``sessions``) sustains ``S`` sessions when, with ``S`` sessions
sharing its device, every session still decodes at ``target`` tokens/s or
more (the metric is the slowest session's tokens/s,
``session_tokens_per_s_min``).  Its capacity is the largest such ``S``.

Search
------
For each of ``seeds`` seeds (the ``repeat`` axis: 0, 1, ...), independently:
probe 1 session; then (``search = "bracket"``, the default) bracket the
capacity by the bounds of queueing theory on what that probe measured, and
probe only near the knee; or (``search = "gallop"``) double while the probe
passes (1, 2, 4, ... up to ``max_sessions``).  Either way, bisect between the
last count that passed and the first that failed until they are
``resolution`` apart (1: the exact count).

The bracket (:func:`session_bounds`) treats the sessions as a closed system
(Denning and Buzen, "The operational analysis of queueing network models",
1978; Lazowska et al., "Quantitative System Performance", 1984, ch. 5): each
session is one customer cycling through its step -- ``C1`` seconds alone,
compute and reads, the 1-session probe's own time -- and the device, which
needs ``D = reads per step / peak IOPS`` seconds of each step at its peak.
A session's rate is at most ``1 / (N D)`` (the asymptotic bound: ``N``
sessions share the peak), so above ``floor(1 / (target x D))`` sessions the
target cannot be met; and at least ``1 / (C1 + (N - 1) D)`` (each step waits
at most behind every other session's reads served at the peak), so below
``floor((1 / target - C1) / D) + 1`` it can.  Within these bounds the search
starts at the estimate of exact mean value analysis of that closed system
(Reiser and Lavenberg, 1980: a delay of ``C1 - D`` and one FIFO server of
demand ``D``), and goes from each probe to the count its measured rate points
at (:func:`_secant`: once the device is the bottleneck the sessions'
aggregate ``N x rate`` is flat, so the capacity is ``N x rate / target``;
after two probes, the secant of their rates), falling back to steps of
1/512 of the estimate, doubling, or to bisection when the rates do not
behave so (:data:`SECANT_TRIES`); a probe that contradicts the bounds (the
slowest session is slower than the mean they speak of, a shared cache lowers
the reads as sessions grow) only makes the steps go on.  So the bounds choose
where to look, not what is found: the answer is a count that passed next to
one that failed, as with galloping, in a few probes near the knee instead of
about ``2 log2(capacity)``, and without the probes far above the capacity
(the largest and slowest).  Where the upper bound is below
:data:`SMALL_CAPACITY` sessions the bracketed search gallops as the other
does (cheap probes; a few sessions can settle into convoys, so that the
slowest one's rate does not fall with their count and the probes taken decide
which of two adjacent counts is found).

A configuration that passes at ``max_sessions`` has a capacity of at least
that (a lower bound).  The searches of every configuration and seed run side
by side (local processes or a Dask cluster, :class:`sim.sweep.PointRunner`),
each taking its probe's row as soon as it is in; a worker that would idle
probes ahead, next to a search's probe, a count it may ask next
(:class:`ProbeRounds`: the probes taken, and so the answers, are the same).
The search assumes that the slowest session's tokens/s does not rise with
more sessions; where noise breaks that, it returns a count that passed next
to one that failed.

The result of a configuration is the median of its seeds' capacities (the
lower median for an even count) with a band from the smallest to the
largest.  Each probe's seed is :func:`sim.sweep.point_seed` of the study seed
and the probe's point (the configuration, ``sessions`` and ``repeat``), so
the capacity is the same on every run and every runner.

Assumptions
-----------
Every capacity is stated with what it assumes (:meth:`Capacity.assumptions`):
the compute of a step (nominal, and the mean and cv the probes actually drew),
batching (none: each session computes alone and compute never contends), how
the sessions' steps are phased as the probes ran them (random phases by
default, lockstep, or starts spread over some milliseconds), and the target
with its headroom under
the compute-only ceiling ``1000 / compute_ms`` tokens/s: a target of 20
tokens/s with 47.01 ms of compute leaves 2.99 ms a step for the reads, 6% under
the ceiling of 21.27 tokens/s, so any compute above 50 ms makes every device
fail.  With a row cache the assumptions say its size and policy and whether each probe starts with it
empty or warmed (below); a capacity of 0 says why (:meth:`Capacity.zero_note`: one session's rate against
the target, and what the device assumed).

Study file
----------
A study with a ``[capacity]`` table (:mod:`sim.sweep.study`; its keys are the fields of :class:`CapacitySpec`,
``studies/capacity.toml`` an example), run by ``engram sim capacity STUDY.toml``.

Sustained capacity
------------------
A rate-limited volume (:class:`sim.device.models.RateLimitedDevice`) starts every probe with a full bucket, so
where its burst outlasts the probe the answer is the burst's (:meth:`Capacity.burst_note` says so).  With
``sustained`` every probe starts with the bucket empty -- the volume's steady state under a load above its cap
-- and the bucket refills only while the sessions read less than the cap: the answer is the sustained one,
about ``cap_iops / (reads a step x target)`` sessions.

Row caches
----------
A probe is a fresh run: its row caches start empty unless the configuration warms them
(``cache_warmup_steps``, :attr:`sim.core.params.Policy.cache_warmup_steps`: each session first decodes that many
trace steps before its start through the caches, uncounted).  A cache's hit rate changes with the steps it has
seen until its policy's state settles -- an empty one admits every row while it fills, a full W-TinyLFU one only
over a more frequent victim, and its frequency counts build up over many steps -- so the hit rate, and the
capacity with it, depends on the probes' ``steps`` and on the warm-up.  ``engram sim capacity
--shared-cache-bytes`` warms it by the probes' steps unless told otherwise; a study says it in its axes.  Each
configuration's answer gives the hit rate of the probe at the capacity and, replayed through the same policy
code without timing, that probe's rate from the other start (:attr:`Capacity.cache_other`).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from engram._checks import setting_int, setting_number, setting_str, settings_from
from engram.errors import ArgumentError

from sim.core.io import load_json
from sim.core.progress import progress as progress_bar
from sim.core.progress import progress_label, progress_mode
from sim.core.schema import CAPACITY_SCHEMA
from sim.device import load_device
from sim.device.fio import HOST_BOUND_SHARE
from sim.device.models import RateLimitedDevice
from sim.decode.host import HostCPU
from sim.core.params import Phases, Storage
from sim.sweep import (AXES, METRICS, PHASES_COLUMN, Context, PointRunner, Study, TableWriter, check_points,
                       check_table_target, meta_path, point_phases, point_seed, point_trace, read_table,
                       resolve_context, same_axis_value)
from sim.sweep.runner import HOLD_WARNINGS, device_key, point_host, point_policy
from sim.sweep.study import varying_axes
from ..decode.model import lockstep_warning
from ..decode.reads import held_warnings, step_reads, wrap_info

__all__ = ["BATCHING", "CAPACITY_COLUMNS", "CAPACITY_RULE", "CAPACITY_MAX_SESSIONS", "CAPACITY_METRIC",
           "CAPACITY_SEEDS", "MAX_CAPACITY_SESSIONS", "CAPACITY_TARGET", "PROBE_COLUMNS", "Capacity", "CapacityResult",
           "CapacitySpec", "ProbeRounds", "SEARCHES", "SearchBound", "SearchProgress", "SearchRun",
           "SeedBand", "WorkProgress", "sustained_context", "capacity_of", "compute_text", "configuration_names",
           "find_capacity", "gallop", "grid_capacities", "host_sessions", "is_capacity_table", "phases_short", "phases_text",
           "pooled_compute", "probes_path", "read_capacity", "run_capacity", "session_bounds"]

#: How a capacity is taken from its seeds' searches, in the words every output uses (reports, README, the
#: tables' metadata): :func:`statistics.median_low`, a capacity one of the seeds reached.
CAPACITY_RULE = ("the lower median over the seeds (with an even count of seeds, the smaller of the middle two: "
                 "the conservative one)")

#: Tokens/s every session must reach (per session, the slowest one).
CAPACITY_TARGET = 20.0
#: Searches per configuration, each with its own seeds.
CAPACITY_SEEDS = 5
#: The largest session count probed.
CAPACITY_MAX_SESSIONS = 1024
#: The result column compared with the target: the slowest session's tokens/s.
CAPACITY_METRIC = "session_tokens_per_s_min"
#: How the simulator batches the sessions' compute: it does not (each session computes alone).
BATCHING = "none (each session computes alone; compute never contends)"

#: A drawn compute's cv below this is the rounding of a constant compute's standard deviation: 0.
CV_ROUNDING = 1e-9

#: The most sessions a capacity search may probe: 16x the studies' 4,096, a simulation of hours a probe on a
#: laptop core (the fast decode loop runs about 150,000 session-steps a CPU second), and a search bound
#: (:class:`SearchBound`) of well under a second.
MAX_CAPACITY_SESSIONS = 1 << 16

log = logging.getLogger("sim.capacity")

_SPEC_KEYS = ("target", "seeds", "max_sessions", "metric", "resolution", "search", "sustained")
#: Below this upper bound the bracketed search gallops as the other does: its probes are cheap, and where a few
#: sessions settle into convoys the slowest one's rate need not fall with their count, so the same probes give the
#: same answer.
SMALL_CAPACITY = 64
#: How a search looks for the knee (see the module): by queueing bounds, or by doubling from 1 session.
SEARCHES = ("bracket", "gallop")
_SEARCHED = ("sessions", "repeat")


@dataclass(frozen=True)
class CapacitySpec:
    """What a capacity search looks for (see the module docstring).

    Attributes
    ----------
    target : float
        Tokens/s every session must reach (> 0).
    seeds : int
        Searches per configuration (>= 1); the band is their smallest and largest capacity.
    max_sessions : int
        Largest session count probed (>= 1).
    metric : str
        Result column compared with ``target`` (default the slowest session's tokens/s).
    resolution : int
        Bisect until the last pass and the first failure are this many sessions apart (>= 1).
    search : str
        ``"bracket"`` (queueing bounds first) or ``"gallop"`` (1, 2, 4, ...): where the search looks, not
        what it finds (not part of the tables' fingerprint).
    sustained : bool
        Probe rate-limited volumes with their bucket drained at the start (see the module).
    """

    target: float = CAPACITY_TARGET
    seeds: int = CAPACITY_SEEDS
    max_sessions: int = CAPACITY_MAX_SESSIONS
    metric: str = CAPACITY_METRIC
    resolution: int = 1
    search: str = "bracket"
    sustained: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.sustained, bool):
            raise ArgumentError(f"capacity sustained = {self.sustained!r} must be true or false")
        if self.search not in SEARCHES:
            raise ArgumentError(f"capacity search = {self.search!r} must be one of {', '.join(SEARCHES)}")
        if not (isinstance(self.target, (int, float)) and math.isfinite(self.target) and self.target > 0):
            raise ArgumentError(f"capacity target = {self.target!r} must be a number of tokens/s > 0")
        for name in ("seeds", "max_sessions", "resolution"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ArgumentError(f"capacity {name} = {v!r} must be an integer >= 1")
        if self.max_sessions > MAX_CAPACITY_SESSIONS:
            raise ArgumentError(f"capacity max_sessions = {self.max_sessions} is above {MAX_CAPACITY_SESSIONS} "
                                f"(sim.sweep.capacity.MAX_CAPACITY_SESSIONS: concurrent sessions a search may probe)")
        if self.metric not in METRICS or not self.metric.startswith("session_tokens_per_s"):
            raise ArgumentError(f"capacity metric = {self.metric!r} must be session_tokens_per_s_min or "
                                "session_tokens_per_s")

    @classmethod
    def from_study(cls, study: Study, **overrides: Any) -> "CapacitySpec":
        """The ``[capacity]`` table of ``study`` with ``overrides`` (``None`` values ignored).

        Raises
        ------
        ArgumentError
            Not a capacity study, an unknown key (of the table or of ``overrides``: names it and lists the
            fields) or a bad value, or a study that sets ``sessions`` or ``repeat`` (the search sets them).
        """
        table = study.capacity
        if table is None:
            raise ArgumentError(f"{study.source}: not a capacity study (it has no [capacity] table: "
                                "target = ..., seeds = ...); run it with engram sim sweep")
        bad = set(table) - set(_SPEC_KEYS)
        if bad:
            raise ArgumentError(f"{study.source}: [capacity] has unknown key {sorted(bad)[0]!r} "
                                f"({', '.join(_SPEC_KEYS)})")
        for axis in _SEARCHED:
            if axis in study.fixed or any(axis in g for g in study.grids):
                raise ArgumentError(f"{study.source}: a capacity study cannot set {axis!r}: the search sets it")
        values = dict(table)
        if isinstance(values.get("target"), int) and not isinstance(values.get("target"), bool):
            values["target"] = float(values["target"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return settings_from(cls, values, f"{study.source}: [capacity] and the overrides")

    def search_words(self) -> str:
        """How this search probes, in words for a report: ``"... sessions"`` (the module docstring's Search)."""
        if self.search == "gallop":
            return (f"1, 2, 4, ... sessions (up to {self.max_sessions}) until a count fails, then bisection to "
                    "the exact count")
        return (f"1 session, then only counts near the knee that the bounds of queueing theory on that probe "
                f"bracket (up to {self.max_sessions} sessions), then bisection to the exact count")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _SPEC_KEYS if k != "search"}


# =====================================================================================
# assumptions, in words
# =====================================================================================
def compute_text(point: Mapping[str, Any], compute_ms: float,
                 realised: Optional[Tuple[float, float]] = None) -> str:
    """The compute of a step of ``point`` in words, with its nominal mean (``compute_ms``) and, when given, the
    ``realised`` ``(mean ms, cv)`` of the times the simulator drew (:attr:`sim.decode.DecodeResult.compute_realised`)."""
    c = point.get("compute", "")
    if c == "reference":
        text = f"{compute_ms:.2f} ms a step (the SPEC §8 reference compute)"
    elif c.startswith("calibrated:"):
        text = f"{compute_ms:.2f} ms a step (compute '{c.split(':', 1)[1]}' measured on this machine)"
    elif point.get("compute_dist", "constant") == "constant" or not point.get("compute_cv"):
        text = f"{compute_ms:.2f} ms a step (constant)"
    else:
        text = f"{compute_ms:.2f} ms a step on average ({point['compute_dist']}, CV {point['compute_cv']:g})"
    if realised is not None and math.isfinite(realised[0]):
        text += f"; drawn: mean {realised[0]:.2f} ms, CV {realised[1]:.3g}"
    return text


#: How each kind of session phases reads in an assumption (:class:`sim.core.params.Phases`).
_PHASES_WORDS = {"random": "random (each session starts at a uniformly random time within one step, seeded)",
                 "lockstep": "lockstep (every session starts at once)"}


def phases_text(point: Mapping[str, Any]) -> str:
    """How the sessions' steps are phased against each other, in words, from what the point ran with: its
    ``phases_run`` result column (:attr:`sim.decode.DecodeResult.phases`) when it has one, else the phases its
    axes give (:func:`sim.sweep.point_phases`: ``phases``, or the older ``start_spread_ms``).  A table written
    before the ``phases`` axis holds the words themselves; they are returned as they are."""
    ran = point.get(PHASES_COLUMN) or point.get("phases") or ""
    try:
        ph = Phases.parse(ran) if point.get(PHASES_COLUMN) else Phases.parse(point_phases(point))
    except ArgumentError:
        return str(ran)
    if ph.kind == "spread":
        return f"starts spread evenly over {ph.spread * 1e3:.4g} ms"
    return _PHASES_WORDS[ph.kind]


def phases_short(point: Mapping[str, Any]) -> str:
    """The session phases of ``point`` in two or three words (figure labels): ``random phases``, ``lockstep``,
    ``spread 47 ms``."""
    text = phases_text(point)
    for kind in _PHASES_WORDS:
        if text == _PHASES_WORDS[kind]:
            return "random phases" if kind == "random" else kind
    if text.startswith("starts spread evenly over "):
        return "spread " + text.rsplit(" over ", 1)[1]
    return text


def pooled_compute(rows: Sequence[Mapping[str, Any]]) -> Tuple[float, float]:
    """The realised compute ``(mean ms, cv)`` over every step of ``rows`` (sweep rows or probes), each row's
    ``compute_realised_mean_ms`` and ``compute_realised_cv`` weighted by its sessions x steps; ``(nan, nan)``
    when no row has them (a table written before they were recorded)."""
    kept = []
    for r in rows:
        mean, cv = r.get("compute_realised_mean_ms"), r.get("compute_realised_cv")
        if not isinstance(mean, (int, float)) or not isinstance(cv, (int, float)) or isinstance(mean, bool):
            continue
        kept.append((float(r.get("sessions") or 1) * float(r.get("steps") or 1), float(mean), float(cv)))
    if not kept:
        return float("nan"), float("nan")
    n = sum(w for w, _, _ in kept)
    same = all(m == kept[0][1] for _, m, _ in kept)
    mean = kept[0][1] if same else sum(w * m for w, m, _ in kept) / n
    # within each row's steps, and between the rows' means (two passes: a constant compute gives CV 0 exactly)
    var = sum(w * ((cv * m) ** 2 + (m - mean) ** 2) for w, m, cv in kept) / n
    cv = math.sqrt(var) / mean if mean > 0 else 0.0
    return mean, (cv if cv > CV_ROUNDING else 0.0)


class SeedBand:
    """What a search repeated over seeds found: ``per_seed`` (one capacity a seed, ``repeat`` 0, 1, ...), the
    lower median of them (:data:`CAPACITY_RULE`) and the band; shared by session and serving capacities, whose
    searches set :attr:`axis`, of type :attr:`value`, up to :attr:`top` (their ``probes``: every probe's row)."""

    per_seed: list
    probes: list
    axis, value = "sessions", int

    @property
    def capacity(self):
        """The median of the seeds' capacities (the lower median for an even count)."""
        return self.value(self.median)

    @property
    def lower_bound(self) -> bool:
        """The capacity is the largest value probed (:attr:`top`) and passed there: it may be more."""
        return self.capacity >= self.top

    @property
    def median(self):
        """The lower median of the seeds' capacities (the lower of the middle two for an even count)."""
        return statistics.median_low(self.per_seed)

    @property
    def low(self):
        """The smallest capacity a seed found (same unit as ``per_seed``)."""
        return min(self.per_seed)

    @property
    def high(self):
        """The largest capacity a seed found."""
        return max(self.per_seed)

    def median_seed(self) -> int:
        """The repeat index whose search found the median capacity."""
        return self.per_seed.index(self.median)

    def at(self, value: Any, seed_index: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """The probe row at ``value`` of the searched :attr:`axis` (of seed ``seed_index``'s search where it has
        one, else any seed's), or None."""
        rows = [r for r in self.probes if r[self.axis] == value]
        if seed_index is not None:
            rows = [r for r in rows if r["repeat"] == seed_index] or rows
        return rows[0] if rows else None

    @property
    def at_capacity(self) -> Optional[Dict[str, Any]]:
        """The median seed's probe at the capacity (None for a capacity of 0)."""
        return self.at(self.capacity, self.median_seed()) if self.capacity else None

    def row_head(self) -> Dict[str, Any]:
        """A capacity row's first columns: the configuration's index and axis values, but the search's."""
        return {"config": self.index, **{k: v for k, v in self.config.items() if k not in (self.axis, "repeat")}}

    def band(self, fmt: Callable[[Any], str] = str) -> str:
        """The seeds' band in words: ``56-64 over 5 seeds``, ``all equal over 3 seeds`` or ``1 seed``."""
        n = len(self.per_seed)
        return (f"{fmt(self.low)}-{fmt(self.high)} over {n} seeds" if self.low != self.high else
                f"all equal over {n} seeds" if n > 1 else "1 seed")


@dataclass
class Capacity(SeedBand):
    """The capacity of one configuration.

    Attributes
    ----------
    index : int
        The configuration's place in the study.
    config : dict
        Its axis values (``sessions`` and ``repeat`` are the search's).
    spec : CapacitySpec
    per_seed : list of int
        The capacity each seed's search found (``repeat`` 0, 1, ...).
    bound : list of bool
        Per seed: passed at ``max_sessions`` (the capacity is a lower bound).
    probes : list of dict
        Every probe's result row (sweep columns), in the order they ran.
    warnings : list of str
        What the trace does to the probes' figures at the capacity (:func:`sim.decode.reads.wrap_info` of the
        probe there: a trace replayed, sessions sharing stretches of it under a shared cache, a cache warm-up
        overlapping the steps), said once for the configuration by :func:`find_capacity`.
    """

    index: int
    config: Dict[str, Any]
    spec: CapacitySpec
    per_seed: List[int] = field(default_factory=list)
    bound: List[bool] = field(default_factory=list)
    probes: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    #: ``(cache_warmup_steps, hit rate)`` of the probe at the capacity replayed from the other start -- warmed
    #: by the probes' steps where the probes start empty, empty where they were warmed -- (None: no cache, or
    #: not replayed), set by :func:`find_capacity`.
    cache_other: Optional[Tuple[int, float]] = None
    #: The configuration's device as loaded once for the notes (:meth:`_device_at_capacity`), in a 1-tuple.
    _device: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

    @property
    def top(self) -> int:
        return self.spec.max_sessions

    @property
    def compute_ms(self) -> float:
        """Mean compute of a step (ms), as the probes ran it."""
        return float(self.probes[0]["compute_mean_ms"]) if self.probes else float("nan")

    @property
    def compute_realised(self) -> Tuple[float, float]:
        """``(mean ms, cv)`` of the compute the probes drew, over all their steps (:func:`pooled_compute`)."""
        return pooled_compute(self.probes)

    @property
    def phases(self) -> Dict[str, Any]:
        """What the probes ran with: the configuration with the probes' ``phases_run`` (the simulator's
        :attr:`~sim.decode.DecodeResult.phases`; the first probe's -- every probe of a configuration has the
        same), for :func:`phases_text`."""
        ran = next((p[PHASES_COLUMN] for p in self.probes if p.get(PHASES_COLUMN)), None)
        return {**self.config, PHASES_COLUMN: ran} if ran else dict(self.config)

    @property
    def hash_ms(self) -> float:
        return float(self.config.get("hash_us", 0.0)) * 1e-3

    @property
    def ceiling(self) -> float:
        """Tokens/s of a session whose reads take no time: 1000 / (compute + hash ms)."""
        step = self.compute_ms + self.hash_ms
        return 1e3 / step if step > 0 else float("inf")

    @property
    def headroom(self) -> float:
        """How far the target sits under the compute-only ceiling: ``1 - target / ceiling`` (< 0: above it)."""
        return 1.0 - self.spec.target / self.ceiling

    @property
    def read_budget_ms(self) -> float:
        """Milliseconds a step may spend waiting for its rows at the target: ``1000 / target - compute - hash``."""
        return 1e3 / self.spec.target - self.compute_ms - self.hash_ms

    def bracket(self, seed_index: Optional[int] = None) -> Optional[Tuple[int, Optional[int]]]:
        """``(low, high)``: the session counts the search of seed ``seed_index`` (default: the median seed's, whose
        capacity is :attr:`capacity`) ended with the capacity between, both included.  ``low`` is the capacity it
        found (the largest count that passed); ``high`` one below the smallest count that failed, or
        ``max_sessions`` where none failed (the search's ``resolution`` stopped it first); ``high`` is None for a
        pass at ``max_sessions`` (a lower bound); ``(0, 0)`` where one session failed.  ``low == high`` where the
        search was exact (``resolution`` 1).  None where the probes are not at hand (a table whose probes table is
        gone)."""
        r = self.median_seed() if seed_index is None else seed_index
        c = self.per_seed[r]
        if c >= self.top:
            return c, None
        mine = [p for p in self.probes if int(p.get("repeat") or 0) == r and int(p.get("sessions") or 0) > 0]
        if not mine or (c and not any(int(p["sessions"]) == c for p in mine)):
            return None
        failed = [int(p["sessions"]) for p in mine
                  if int(p["sessions"]) > c and not p[self.spec.metric] >= self.spec.target]
        return c, (min(failed) - 1 if failed else self.top)

    def bracket_words(self) -> Optional[Tuple[str, str]]:
        """The bracket (:meth:`bracket`) in words where it is wider than one count: ``("between 20 and 23",
        "resolution 4: 20 passed, 24 failed")`` (sessions); None where the capacity is exact, a lower bound or the
        probes are not at hand."""
        b = self.bracket()
        if b is None or b[1] is None or b[1] <= b[0]:
            return None
        low, high = b
        why = (f"{low} passed, {high + 1} failed" if high < self.top else
               f"{low} passed, none probed above it up to {self.top}")
        return f"between {low} and {high}", f"resolution {self.spec.resolution}: {why}"

    def label(self) -> str:
        """The capacity as a reader sees it: ``64 sessions (56-64 over 5 seeds)``; where the search's resolution
        left it within a bracket (:meth:`bracket`), that: ``between 20 and 23 sessions (1 seed; resolution 4: 20
        passed, 24 failed)``."""
        words = self.bracket_words()
        if words is not None:
            return f"{words[0]} sessions ({self.band()}; {words[1]})"
        cap = f"{'>= ' if self.lower_bound else ''}{self.capacity}"
        return f"{cap} session{'' if cap == '1' else 's'} ({self.band()})"

    def assumptions(self) -> str:
        """One sentence with everything the capacity assumes (compute, batching, phases, target, headroom)."""
        cfg = self.config
        cache = self.cache_text()
        head = (f"target {self.spec.target:g} tokens/s for every session "
                f"({'the slowest session' if self.spec.metric == CAPACITY_METRIC else 'the mean session'}), "
                f"compute {compute_text(cfg, self.compute_ms, self.compute_realised)}, batching {BATCHING}, "
                f"phases: {phases_text(self.phases)}" + (f", {cache}" if cache else "") + "; ")
        if self.headroom <= 0:
            return head + (f"the target is above the compute-only ceiling of {self.ceiling:.2f} tokens/s: "
                           "no device can reach it")
        return head + (f"the target sits {self.headroom:.1%} under the compute-only ceiling of "
                       f"{self.ceiling:.2f} tokens/s, leaving {self.read_budget_ms:.2f} ms a step for reads"
                       + self.burst_note() + self.host_note())

    @property
    def policy(self):
        """The configuration's read policy (:func:`sim.sweep.runner.point_policy`)."""
        return point_policy({**self.config, "sessions": 1, "repeat": 0})

    def cache_text(self) -> str:
        """The configuration's row caches in words, and whether the probes start with them empty or warm
        (:attr:`sim.core.params.Policy.cache_warmup_steps`); ``""`` without a cache."""
        pol = self.policy
        if not (pol.shared_cache_rows or pol.cache_rows):
            return ""
        parts = []
        if pol.shared_cache_rows:
            size = (f"{_bytes_text(pol.shared_cache_bytes)} ({pol.shared_cache_rows:,} rows)" if pol.shared_cache_bytes
                    else f"{pol.shared_cache_rows:,} rows")
            parts.append(f"one row cache of {size} shared by the sessions")
        if pol.cache_rows:
            parts.append(f"a row cache of {pol.cache_rows:,} rows a session")
        w = pol.cache_warmup_steps
        start = (f"warmed before each probe by {w} steps a session (the trace's steps before the session's start)"
                 if w else "empty at the start of each probe (no warm-up: cache_warmup_steps 0)")
        return f"{' and '.join(parts)}, {pol.cache_policy}, {start}"

    def cache_note(self) -> str:
        """With a row cache: its hit rate in the probe at the capacity (the median seed's; else the first
        probe's) beside that probe's from the other start (:attr:`cache_other`), and that a cache's hit rate
        changes with the steps it has seen, so that the capacity depends on the probes' ``steps`` and warm-up;
        ``""`` without a cache."""
        if not self.cache_text():
            return ""
        at = self.at_capacity or (self.probes[0] if self.probes else None)
        if not at:
            return ""
        n, steps = int(at["sessions"]), int(at["steps"])
        rate = (f"hit rate {float(at['cache_hit_rate']):.4f} in the probe of {n} session{'s' if n != 1 else ''} x "
                f"{steps} steps")
        w = self.policy.cache_warmup_steps
        other = self.cache_other
        grows = ("a cache's hit rate changes with the steps it has seen until its policy settles (W-TinyLFU's "
                 "counts over many steps), so the capacity depends on the probes' steps and warm-up")
        if w:
            return (f"row cache warmed by {w} steps a session before each probe: {rate}"
                    + (f" ({other[1]:.4f} from empty)" if other else "")
                    + f"; {grows}: compare a longer --cache-warmup-steps (a study's cache_warmup_steps)")
        return (f"row cache starts empty in each probe: {rate}"
                + (f" against {other[1]:.4f} once warmed by {other[0]} steps a session" if other else "")
                + f"; {grows}: warm it first (--cache-warmup-steps N, a study's cache_warmup_steps)")

    def zero_note(self) -> str:
        """Why the capacity is 0 (``""`` otherwise): one session alone, the median seed's probe, against the
        target and the read time the target leaves; and what the device assumes where it assumed values
        (a rate-limited volume without ``iops``: its drive at the cap, its ``burst_ios``; ``engram sim
        device`` shows every rule)."""
        if self.capacity or not self.probes:
            return ""
        one = self.at(1, self.median_seed()) or self.probes[0]
        rate = float(one.get(self.spec.metric) or 0.0)
        words = "slowest" if self.spec.metric == CAPACITY_METRIC else "mean"
        out = (f"one session alone decodes at {rate:.2f} tokens/s ({words}), under the target of "
               f"{self.spec.target:g}: its steps wait {float(one.get('stall_mean_ms') or 0.0):.2f} ms on average for "
               f"their {float(one.get('reads_per_step') or 0.0):.1f} reads, against the {self.read_budget_ms:.2f} ms a "
               f"step the target leaves after {self.compute_ms:.2f} ms of compute")
        host = self.host()
        if host is not None:
            # the host's queue is inside the step, not the reads' wait: say what one session's step asks of it
            demand = host.demand(float(one.get("reads_per_step") or 0.0))
            out += (f"; on the host modelled ({host.cpus:g} CPU{'' if host.cpus == 1 else 's'}) each step also takes "
                    f"{demand * 1e3:.3f} ms of CPU (the engine's {host.step_cpu_s * 1e6:.4g} us and "
                    f"{host.read_cpu_s * 1e6:.3g} us a read), and a step is {float(one.get('step_mean_ms') or 0.0):.2f} "
                    f"ms in all")
        dev = self.device()
        derived = (getattr(dev, "derived", None) or {}) if dev is not None else {}
        assumed = [f"{k} = {d['value']:g}, {d['rule']}" for k, d in derived.items()
                   if str(d.get("rule", "")).startswith("assumed") and isinstance(d.get("value"), (int, float))]
        reads = float(one.get("reads_per_step") or 0.0)
        if isinstance(dev, RateLimitedDevice) and reads > 0:
            peak = float(dev.raw.peak_iops())
            passes = min(dev.burst_ios, dev.cap_iops * float(one.get("step_mean_ms") or 0.0) * 1e-3)
            bucket = f"the volume's bucket ({dev.cap_iops:,.0f} IOPS, {dev.burst_ios:,.0f} reads deep)"
            out += (f"; {bucket} lets a step's {reads:.1f} reads through to its drive, which reads them in "
                    f"{reads / peak * 1e3:.2f} ms at the least at its peak of {peak:,.0f} IOPS" if reads <= passes else
                    f"; {bucket} passes about {passes:,.0f} of a step's {reads:.1f} reads at its drive's latency, the "
                    f"rest at the cap")
        if assumed:
            out += ("; the device assumes " + "; ".join(assumed)
                    + f": give them in the device spec where they are known (engram sim device {self.config['device']} "
                      "shows every rule)")
        return out

    def _device_at_capacity(self) -> tuple:
        """``(the probe row at the capacity, the configuration's device)``, either None where there is none or the
        device spec does not load."""
        at = self.at_capacity
        return at, (self.device() if at else None)

    def device(self):
        """The configuration's device (:func:`sim.device.presets.load_device` of its spec), None where the spec
        does not load (a calibrated device: its notes say nothing there)."""
        if not isinstance(self.config.get("device"), str):
            return None
        if self._device is None:
            try:
                self._device = (load_device(self.config["device"]),)
            except Exception:  # noqa: BLE001 - a device a note cannot load says nothing there
                self._device = (None,)
        return self._device[0]

    def host(self):
        """The host every probe ran on (:func:`sim.sweep.runner.point_host`: its ``host_cpus`` axes, the reads' CPU
        from the device's own figures), None without one."""
        return point_host(self.config, self.device())

    def host_note(self) -> str:
        """For a device from fio JSON with CPU figures (``derived["cpu_per_read_us"]``,
        :func:`sim.device.fio.cpu_per_read`): the host's CPUs the probes' reads at the capacity keep busy in the
        read path alone; the host's CPUs are not modelled, so with fewer than that over
        :data:`sim.device.fio.HOST_BOUND_SHARE` the host binds first and the capacity is an upper bound.
        With the host modelled (a ``host_cpus`` axis, :func:`sim.sweep.runner.point_host`): what it was taken
        to be.  Without fio's CPU figure (a datasheet): that the drive was taken alone.  ``""`` without probes."""
        host = self.host()
        if host is not None:
            dev = self.device()
            try:
                copies = host.copies_text(dev) if dev is not None else ""
            except ArgumentError:  # the probes refused it already; a note says nothing more
                copies = ""
            return f"; the host modelled (sim.decode.host): {host.source}" + (f"; reads: {copies}" if copies else "")
        at, dev = self._device_at_capacity()
        cpu = ((getattr(dev, "derived", None) or {}).get("cpu_per_read_us") or {}).get("value")
        rps = float(at.get("reads_per_s") or 0.0) if at else 0.0
        if cpu is None or not rps > 0:
            return ("; the host's CPUs not modelled (the drive alone: --host-cpus N adds them, the engine's CPU from "
                    "its shipped profile)") if at else ""
        busy = rps * float(cpu) * 1e-6
        return (f"; at {self.capacity} session{'' if self.capacity == 1 else 's'} the probes read {rps:,.0f} reads/s, "
                f"which keep {busy:.2f} CPUs busy "
                f"in the host's read path alone at fio's {float(cpu):.1f} us of CPU a read (the host's CPUs are not "
                f"modelled: with fewer than {busy / HOST_BOUND_SHARE:.2f} CPUs the host binds before the drive, and this "
                f"capacity is an upper bound)")

    def burst_note(self) -> str:
        """For a rate-limited volume (:class:`sim.device.models.RateLimitedDevice`) whose probes at the capacity
        read faster than its ``cap_iops``: how long its burst lasts at that rate against the probes' simulated
        time, and the sustained bound ``floor(cap_iops / (reads a step x target))``; ``""`` otherwise.  A probe
        starts with a full bucket, so a burst deeper than its window raises the answer (a planner's long-run
        question is the sustained one).  A sustained search (:attr:`CapacitySpec.sustained`) says instead that its
        probes started with the bucket drained, with the same bound."""
        at, dev = self._device_at_capacity()
        if not at or not isinstance(dev, RateLimitedDevice):
            return ""
        rps, reads = float(at.get("reads_per_s") or 0.0), float(at.get("reads_per_step") or 0.0)
        sustained = int(math.floor(dev.cap_iops / (reads * self.spec.target) + 1e-9)) if reads > 0 else 0
        if self.spec.sustained:
            return (f"; the rate-limited volume was probed with its bucket of {dev.burst_ios:,.0f} reads drained at "
                    f"the start of every probe (sustained: no burst credit), its cap of {dev.cap_iops:,.0f} IOPS "
                    f"bounding it at {sustained} sessions (cap_iops / (reads a step x target))")
        if not (rps > dev.cap_iops * 1.01 and reads > 0):
            return ""
        lasts = dev.burst_ios / (rps - dev.cap_iops)
        rate = float(at.get(self.spec.metric) or 0.0)
        window = float(at.get("steps") or 0.0) / rate if rate > 0 else float("nan")
        return (f"; at {self.capacity} session{'' if self.capacity == 1 else 's'} the probes read {rps:,.0f} reads/s, "
                f"above the volume's cap of "
                f"{dev.cap_iops:,.0f}: its burst of {dev.burst_ios:,.0f} reads lasts about {lasts:,.1f} s at that "
                f"rate (the probes simulated {window:,.1f} s), so this capacity holds only while the burst lasts; "
                f"sustained, at most {sustained} sessions (cap_iops / (reads a step x target); "
                f"--sustained probes with the bucket drained)")

    def row(self) -> Dict[str, Any]:
        """The configuration's row of the capacity table."""
        at = self.at_capacity
        return {
            **self.row_head(), "target": self.spec.target, "metric": self.spec.metric, "capacity": self.capacity,
            "capacity_low": self.low, "capacity_high": self.high,
            "capacities": " ".join(str(c) for c in self.per_seed), "lower_bound": self.lower_bound,
            "seeds": len(self.per_seed), "probes": len(self.probes), "max_sessions": self.spec.max_sessions,
            "compute_mean_ms": self.compute_ms, "compute_realised_mean_ms": self.compute_realised[0],
            "compute_realised_cv": self.compute_realised[1], "ceiling_tokens_per_s": self.ceiling,
            "headroom": self.headroom, "read_budget_ms": self.read_budget_ms, "batching": BATCHING,
            PHASES_COLUMN: self.phases.get(PHASES_COLUMN, point_phases(self.config)),
            "session_phases": phases_text(self.phases),
            "tokens_per_s_at_capacity": at[self.spec.metric] if at else float("nan"),
            "device_busy_at_capacity": at["device_busy"] if at else float("nan"),
            "reads_per_s_at_capacity": at["reads_per_s"] if at else float("nan"),
            "cache_hit_rate_at_capacity": at["cache_hit_rate"] if at else float("nan"),
        }


#: Columns of the capacity table.
CAPACITY_COLUMNS = ["config", *[a for a in AXES if a not in _SEARCHED], "target", "metric", "capacity",
                    "capacity_low", "capacity_high", "capacities", "lower_bound", "seeds", "probes", "max_sessions",
                    "compute_mean_ms", "compute_realised_mean_ms", "compute_realised_cv", "ceiling_tokens_per_s",
                    "headroom", "read_budget_ms", "batching", PHASES_COLUMN, "session_phases",
                    "tokens_per_s_at_capacity", "device_busy_at_capacity", "reads_per_s_at_capacity",
                    "cache_hit_rate_at_capacity"]
#: Columns of the probes table: a sweep row and its configuration.
PROBE_COLUMNS = ["point", "config", *AXES, "seed", *METRICS, PHASES_COLUMN]


# =====================================================================================
# the search
# =====================================================================================
def gallop(first, top, wide: Callable[[Any, Any], bool], halvings: int = 0) -> Generator[Any, bool, Tuple[Any, bool]]:
    """The search of session counts and of rates: yields the value to probe, receives whether it passed; returns
    ``(capacity, passed at top)``.  Probe ``first``; while it passes double it (up to ``top``); if ``first`` fails,
    halve it (at most ``halvings`` times: then the capacity is 0); then bisect between the last value that passed
    and the first that failed while ``wide(passed, failed)`` (their resolution).  Values keep ``first``'s type."""
    x = first
    if (yield x):
        lo = x
        while True:
            if lo >= top:
                return lo, True
            x = min(2 * lo, top)
            if not (yield x):
                hi = x
                break
            lo = x
    else:
        hi, lo = x, 0 * x
        for _ in range(halvings):
            x = hi / 2
            if (yield x):
                lo = x
                break
            hi = x
        else:
            return lo, False
    while wide(lo, hi):
        mid = type(first)((lo + hi) / 2)
        if (yield mid):
            lo = mid
        else:
            hi = mid
    return lo, False


def _search(max_sessions: int, resolution: int) -> Generator[int, bool, Tuple[int, bool]]:
    """:func:`gallop` over session counts from 1: returns ``(capacity, passed at max_sessions)``."""
    return gallop(1, max_sessions, lambda lo, hi: hi - lo > resolution)


def _by_rows(search: Generator, passes: Callable[[Mapping[str, Any]], bool], x: Any) -> Generator:
    """``search`` (receiving whether a probe passed; ``x`` its value asked now) receiving the probes' rows."""
    while True:
        try:
            x = search.send(passes((yield x)))
        except StopIteration as stop:
            return stop.value


class SearchBound:
    """The most probes a search may still ask, for the progress line's time left.

    A search (``factory()``: a generator like :func:`_search`, yielding the value to probe and receiving whether
    it passed) is deterministic given the true capacity ``c`` (a probe at ``x`` passes iff ``x <= c``), so its
    length is known for every candidate in ``capacities``; after some answers the candidates still possible
    are those between the largest passed and the smallest failed probe, and the most probes left is the
    longest of their searches less the probes already answered.  An upper bound that tightens to within one
    probe of the count once the bracket is found (bisection's length is the bracket's, give or take a halving).

    Parameters
    ----------
    factory : callable
        A new search generator each call.
    capacities : sequence of float
        Candidate capacities covering every outcome (sessions: ``0 .. max_sessions``; rates: a fine grid).
    """

    def __init__(self, factory: Callable[[], Generator], capacities: Sequence[float]):
        self.capacities = np.asarray(capacities, dtype=np.float64)
        lengths = np.empty(self.capacities.size, dtype=np.int64)
        for k, c in enumerate(self.capacities.tolist()):
            g, n = factory(), 0
            try:
                x = next(g)
                while True:
                    n += 1
                    x = g.send(x <= c)
            except StopIteration:
                pass
            lengths[k] = n
        self.lengths = lengths

    def left(self, passed: Optional[float], failed: Optional[float], answered: int) -> int:
        """Probes still to ask (the one asked now included) after ``answered`` answers whose largest passing
        probe is ``passed`` and smallest failing one ``failed`` (``None``: none yet)."""
        ok = np.ones(self.capacities.size, dtype=bool)
        if passed is not None:
            ok &= self.capacities >= passed
        if failed is not None:
            ok &= self.capacities < failed
        return max(int(self.lengths[ok].max()) - int(answered), 0) if ok.any() else 0


class SearchProgress:
    """The progress of a set of searches counted in probes, the total being the most they may still ask
    (:class:`SearchBound`), so that the line's time left is an estimate from the probes to come (probes
    of many sessions take longer than the first ones: the estimate is of the count, not the cost).

    ``keys`` name the searches; ``mode`` and ``kw`` (``output``) go to :func:`sim.core.progress.progress`.
    Each search's state (:attr:`state`) is its largest passing probe (``lo``), its smallest failing one (``hi``),
    its answers (``n``) and the probe it asks now (``asked``), kept the same way by :class:`WorkProgress`.
    """

    def __init__(self, bound: SearchBound, keys: Sequence[Any], desc: str, mode: Union[bool, str], **kw: Any):
        self.bound = bound
        self._open(keys)
        self.bar = progress_bar(len(self.state) * int(bound.left(None, None, 0)), desc, "probe", mode=mode, **kw)

    def _open(self, keys: Sequence[Any], asked: Optional[Mapping[Any, Any]] = None) -> None:
        self.state: Dict[Any, Dict[str, Any]] = {
            k: {"lo": None, "hi": None, "n": 0, "asked": None if asked is None else asked[k]} for k in keys}

    def _answer(self, key: Any, value: Any, passed: bool) -> None:
        st, side = self.state[key], "lo" if passed else "hi"
        st[side] = value if st[side] is None else (max if passed else min)(st[side], value)
        st["n"], st["asked"] = st["n"] + 1, None

    def answered(self, key: Any, value: float, passed: bool, note: str = "") -> None:
        """One probe of search ``key`` at ``value`` answered."""
        self._answer(key, value, passed)
        self.bar.update(1, note)

    def finished(self, key: Any, note: str = "") -> None:
        """Search ``key`` returned."""
        self.state.pop(key, None)
        self.bar.update(0, note)

    def asked(self, key: Any, value: Any) -> None:
        """Search ``key`` asks ``value`` next."""
        self.state[key]["asked"] = value

    def ran(self, work: int, seconds: float, probes: int = 1) -> None:
        """A probe ran (the bound counts probes, not their work)."""

    def retotal(self) -> None:
        """After probes were answered: the total is those plus the most the open searches still ask."""
        self.bar.set_total(self.bar.n + sum(self.bound.left(st["lo"], st["hi"], st["n"])
                                            for st in self.state.values()))

    def note(self, text: str) -> None:
        self.bar.update(0, text)

    def __enter__(self) -> "SearchProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


#: Session-steps a second a probe is taken to simulate until a probe of many sessions has run (the fast decode
#: loop, probes of thousands of sessions, on one core of the 2-core development VM: about 150,000 a CPU second on
#: a quiet machine, fewer with other jobs running: benchmarks/BENCHMARKS.md); only the time left before the first
#: such probe rests on it, and the line says so.
ASSUMED_SESSION_STEPS_PER_S = 100_000.0
#: A probe simulating fewer session-steps than this says little of the simulator's rate (its fixed
#: costs -- the device's batch samples, the sessions' reads -- dominate): the time left goes by the others.
RATE_MIN_WORK = 50_000


class WorkProgress(SearchProgress):
    """The progress of bracketed searches (:func:`_bracketed`) in session-steps: a probe of ``S`` sessions of
    ``T`` steps simulates ``S x T`` of them, so its time is about proportional to that while the count of
    probes says little (the first probe has one session, the next ones thousands).

    The line says the probes done and their session-steps, and the fewest probes the open searches still need:
    each one's probe asked now, and one more of about its size unless the answer to this one can close its
    bracket (a pass next to a failure, ``resolution`` apart, or a pass at ``max_sessions``) -- so the work to go
    is a lower bound, exact when the search closes in as few probes as it can; a search that misses the knee
    adds a probe at a time.  The time left is that work at the session-steps a second of a probe that the probes
    measured (:meth:`ran`: each probe of at least :data:`RATE_MIN_WORK` over its own seconds), or before any such
    probe at :data:`ASSUMED_SESSION_STEPS_PER_S`, which the line says, times the probes the open searches run side
    by side.
    The bar (on a terminal) counts session-steps.

    ``keys`` name the searches, ``steps`` their probes' steps and ``asked`` their first probes' sessions
    (mappings key -> int); ``mode`` and ``kw`` (``output``) go to :func:`sim.core.progress.progress`.
    """

    def __init__(self, keys: Sequence[Any], steps: Mapping[Any, int], desc: str, mode: Union[bool, str], *,
                 asked: Optional[Mapping[Any, int]] = None, resolution: int = 1,
                 max_sessions: int = CAPACITY_MAX_SESSIONS, workers: int = 1, **kw: Any):
        self._open(keys, asked)
        self.steps = {k: int(steps[k]) for k in keys}
        self.resolution, self.max_sessions, self.workers = int(resolution), int(max_sessions), max(1, int(workers))
        self.probes = 0
        self.work_done = 0
        self.measured_work, self.measured_s = 0, 0.0
        self._pending, self._note = 0, ""  # answered work and the last news, shown once the next probe is asked
        self.bar = progress_bar(0, desc, "session-step", mode=mode, text=self.text, **kw)

    # ------------------------------------------------------------ the estimate
    def _more(self, st: Mapping[str, Optional[int]]) -> int:
        """Probes certain to follow the one asked of a search in state ``st`` (0 or 1)."""
        s, lo, hi = st["asked"], st["lo"], st["hi"]
        ends_on_pass = s >= self.max_sessions or (hi is not None and hi - s <= self.resolution)
        ends_on_fail = lo is None or s - lo <= self.resolution
        return 0 if ends_on_pass or ends_on_fail else 1

    def to_go(self) -> Tuple[int, int]:
        """``(probes, session-steps)``: the fewest the open searches still need, the probes asked now included."""
        probes = work = 0
        for k, st in self.state.items():
            if st["asked"] is None:
                continue
            m = 1 + self._more(st)
            probes += m
            work += m * int(st["asked"]) * self.steps[k]
        return probes, work

    def rate(self) -> Tuple[float, bool]:
        """``(session-steps a second, measured)``: a probe's rate -- the probes' own, or the assumed one before any
        probe of :data:`RATE_MIN_WORK` has run -- times the probes the open searches run side by side (at most
        ``workers``)."""
        open_ = sum(1 for st in self.state.values() if st["asked"] is not None)
        side = max(1, min(self.workers, open_))
        if self.measured_work >= RATE_MIN_WORK and self.measured_s > 0:
            return self.measured_work / self.measured_s * side, True
        return ASSUMED_SESSION_STEPS_PER_S * side, False

    def text(self, elapsed: float, closing: bool) -> str:
        """The line after the label (see the class); ``closing``: the search is over."""
        done = (f"{self.probes} probe{'' if self.probes == 1 else 's'} ({self.work_done:,} session-steps)")
        if closing:
            return f"{done} in {elapsed:.0f} s"
        done += f" done after {elapsed:.0f} s"
        first = [st for st in self.state.values() if st["asked"] is not None and st["lo"] is None]
        if first:
            return (done + f"; the 1-session probe{'' if len(first) == 1 else 's'} first: "
                    f"{'its' if len(first) == 1 else 'their'} reads give the knee's estimate and the work to go")
        probes, work = self.to_go()
        if not probes:
            return done
        rate, measured = self.rate()
        return (done + f"; at least {probes} more probe{'' if probes == 1 else 's'} ({work:,} session-steps), "
                f"about {work / rate:.0f} s left at {rate:,.0f} session-steps a second "
                + ("(measured)" if measured else "(assumed: no probe of many sessions has finished yet)"))

    # ------------------------------------------------------------ the searches' news
    def answered(self, key: Any, value: int, passed: bool, note: str = "") -> None:
        """The probe of search ``key`` at ``value`` sessions answered (shown with the next line)."""
        self._answer(key, value, passed)
        self.probes += 1
        work = int(value) * self.steps[key]
        self.work_done += work
        self._pending += work
        self._note = note or self._note

    def ran(self, work: int, seconds: float, probes: int = 1) -> None:
        """``probes`` probes (one: a probe on its own) simulated ``work`` session-steps in ``seconds`` (wall), at
        most ``workers`` of them side by side."""
        if work >= RATE_MIN_WORK and seconds > 0:
            self.measured_work += int(work)
            self.measured_s += float(seconds) * max(1, min(self.workers, int(probes)))

    def finished(self, key: Any, note: str = "") -> None:
        """Search ``key`` returned."""
        self.state.pop(key, None)
        self._note = note or self._note

    def retotal(self) -> None:
        """After probes were answered, once their searches have asked their next probe or returned (so that a
        line's work to go is the searches' own): the bar's total is the session-steps done plus the fewest to go; the answered work
        and the last news to the bar (a line when its interval has passed)."""
        work, self._pending = self._pending, 0
        self.bar.set_total(self.bar.n + work + self.to_go()[1])
        self.bar.update(work, self._note)

    def note(self, text: str) -> None:
        """News (a probe finished): shown with the next line."""
        self._note = text


def session_bounds(row: Mapping[str, Any], target: float, metric: str = CAPACITY_METRIC,
                   max_sessions: int = 1 << 20) -> Tuple[int, int, Optional[int]]:
    """``(lower, estimate, upper)`` session counts for the capacity at ``target`` tokens/s, from the row of a probe
    of one session (its ``metric``, ``reads_per_step``, ``reads_per_s`` and ``iops_utilization``; see the module).

    ``C1`` is the session's step alone (seconds, ``1 / metric``) and ``D`` its reads at the device's peak
    (seconds, ``reads_per_step / peak``, the peak being ``reads_per_s / iops_utilization``).  ``lower =
    floor((1 / target - C1) / D) + 1`` (every other session's reads ahead of each step), ``upper = floor(1 /
    (target x D))`` (the sessions share the peak), and ``estimate`` the largest count whose rate, by exact mean
    value analysis of the closed system (a delay of ``C1 - D`` and one FIFO server of demand ``D``; Reiser and
    Lavenberg 1980), still reaches the target, clipped to the bounds.  ``upper`` is None (and ``estimate`` 1)
    when the row shows no reads at the peak; all three are 0 when one session misses the target.
    """
    rate = float(row[metric])
    if not rate >= target:
        return 0, 0, 0
    reads, rps, util = (float(row.get(k) or 0.0) for k in ("reads_per_step", "reads_per_s", "iops_utilization"))
    if not (reads > 0 and rps > 0 and util > 0):
        return 1, 1, None
    demand = reads / (rps / util)  # seconds of the device at its peak, per session-step
    c1 = 1.0 / rate
    lower = max(1, int(math.floor((1.0 / target - c1) / demand + 1e-9)) + 1)
    upper = max(lower, int(math.floor(1.0 / (target * demand) + 1e-9)))
    think, budget, queue, est = max(0.0, c1 - demand), 1.0 / target, 0.0, lower
    for n in range(1, min(upper, max_sessions) + 1):  # exact MVA, one class: R(n) = D (1 + Q(n - 1))
        resp = demand * (1.0 + queue)
        if think + resp > budget * (1 + 1e-12):
            break
        est = max(est, n)
        queue = n * resp / (think + resp)
    return lower, min(est, upper), upper


def bracket_opening(max_sessions: int, resolution: int, target: float, metric: str,
                    host: Optional[HostCPU] = None) -> Generator[int, Mapping[str, Any], Tuple[bool, Any]]:
    """The opening of a bracketed search (``yield from`` it): the 1-session probe, then galloping's answer
    below :data:`SMALL_CAPACITY`; returns ``(True, (capacity, passed at max_sessions))`` when that is the
    answer, else ``(False, e)`` with ``e`` the queueing estimate to probe next (:func:`session_bounds`; on a
    ``host``, where its CPUs bind first, :func:`host_sessions`)."""
    row = yield 1
    if not row[metric] >= target:
        return True, (0, False)
    if max_sessions == 1:
        return True, (1, True)
    lower, est, upper = session_bounds(row, target, metric, max_sessions)
    if upper is not None and upper < SMALL_CAPACITY:  # a few sessions: galloping's cheap probes, its answer
        g = _search(max_sessions, resolution)
        next(g)
        return True, (yield from _by_rows(g, lambda r: r[metric] >= target, g.send(True)))
    e = est if upper is not None else max_sessions
    if host is not None:
        e = min(e, host_sessions(row, host, target, max_sessions))
    return False, max(2, min(max_sessions, e))


def host_sessions(row: Mapping[str, Any], host: HostCPU, target: float, max_sessions: int) -> int:
    """The most sessions (up to ``max_sessions``) whose mean step on ``host`` (:meth:`HostCPU.sessions_within`, the
    mean-value analysis every probe on a host runs) is at most ``1 / target``, each step taking what the 1-session
    probe's row took with the CPUs free -- its ``step_mean_ms`` less the engine's CPU the host added to it (one
    session queues for no CPU) -- and its ``reads_per_step``: where the host's CPUs bind before the drive, the
    search's first guess (the drive's queue at that count is not in it)."""
    free = max(0.0, float(row["step_mean_ms"]) * 1e-3 - host.step_cpu_s)
    return host.sessions_within(1.0 / target, free, float(row.get("reads_per_step") or 0.0), max_sessions)


def _bracketed(max_sessions: int, resolution: int, target: float, metric: str,
               host: Optional[HostCPU] = None) -> Generator[int, Mapping[str, Any], Tuple[int, bool]]:
    """The bracketed search (see the module): yields the count to probe, receives its row; returns ``(capacity,
    passed at max_sessions)``.  ``host``: the host every probe runs on (:func:`bracket_opening`)."""
    done, e = yield from bracket_opening(max_sessions, resolution, target, metric, host)
    if done:
        return e
    lo, hi = 1, max_sessions + 1  # the largest count known to pass, the smallest known to fail
    rates: Dict[int, float] = {}  # sessions -> the probe's rate (the metric), beyond the 1-session probe
    width = max(1, -(-e // 512))  # steps away from the estimate when the rates say nothing: 1/512 of it, doubling
    s, wild = e, 0
    while hi - lo > resolution:
        row = yield s
        r = float(row[metric])
        rates[s] = r
        if r >= target:
            lo = s
        else:
            hi = s
        if lo >= max_sessions:
            return lo, True
        if hi - lo <= resolution:
            break
        nxt = _secant(rates, lo, hi, target, max_sessions)
        if nxt is None or wild >= SECANT_TRIES:  # no rate to go by, or the secant keeps missing: bisect / step
            if hi > max_sessions:
                nxt = min(max_sessions, lo + width)
            elif lo == 1:
                nxt = max(2, hi - width)
            else:
                nxt = (lo + hi) // 2
            width *= 2
        else:
            span = hi - lo
            wild = wild + 1 if span > 4 * resolution else wild
        s = min(max(nxt, lo + 1), hi - 1)
    return lo, False


#: Secant steps a bracketed search takes before it bisects (each lands next to the count the probes' rates
#: point at; more than these without closing the bracket to a few sessions means the rates do not fall as
#: ``1 / sessions``, and halving is the safer step).
SECANT_TRIES = 4


def _secant(rates: Mapping[int, float], lo: int, hi: int, target: float, max_sessions: int) -> Optional[int]:
    """The next count of a bracketed search from the rates its probes measured (sessions -> the metric, in the
    order probed): the secant through the last two probes' rates (the rate falls smoothly with the sessions
    near the knee), or from the last one alone where the aggregate ``N x rate`` -- flat once the device is
    the bottleneck -- gives the capacity ``N x rate / target`` (the asymptotic bound, Denning and Buzen 1978);
    the largest count it predicts to pass, for the caller to keep inside the bracket ``(lo, hi)``.  None with
    no probe to go by."""
    seen = [(n, r) for n, r in rates.items() if r > 0]
    if not seen:
        return None
    (n1, r1) = seen[-1]
    if len(seen) >= 2:
        n0, r0 = seen[-2]
        if n0 != n1 and (r1 - r0) / (n1 - n0) < 0:  # the rate falls with the sessions: where it meets the target
            x = n1 + (target - r1) * (n1 - n0) / (r1 - r0)
            if math.isfinite(x):
                return int(math.floor(min(max(x, 1.0), float(max_sessions)) + 1e-9))
    x = n1 * r1 / target  # the aggregate flat: capacity = N x rate(N) / target
    if not math.isfinite(x):
        return None
    return int(math.floor(min(x, float(max_sessions)) + 1e-9))


def _galloping(max_sessions: int, resolution: int, target: float,
               metric: str) -> Generator[int, Mapping[str, Any], Tuple[int, bool]]:
    """:func:`_search` receiving rows."""
    g = _search(max_sessions, resolution)
    return _by_rows(g, lambda r: r[metric] >= target, next(g))


def sustained_context(ctx: Context) -> Context:
    """``ctx`` with every rate-limited volume starting its runs with the bucket drained
    (:meth:`sim.device.models.RateLimitedDevice.sustained`); other devices as they are."""
    devices = {k: (d.sustained() if isinstance(d, RateLimitedDevice) else d) for k, d in ctx.devices.items()}
    return Context(ctx.traces, devices, ctx.computes, ctx.extras)


@dataclass(frozen=True)
class SearchRun:
    """How a capacity search runs its probes and says how it goes.

    Attributes
    ----------
    jobs : int, optional
        Local processes (>= 1; default one per CPU).
    scheduler : str, optional
        A Dask scheduler's address: the probes run on its cluster instead.
    connect_timeout : float
        Seconds to wait for the scheduler (> 0).
    progress : bool or str
        :mod:`sim.core.progress` mode of the search's line (see :func:`find_capacity`).
    desc : str
        The line's label (empty: the search's own, ``capacity`` or ``serve capacity``).
    done : sequence of dict
        Probe rows of an earlier run: not simulated again.
    on_probe : callable, optional
        Receives each probe row as it finishes (to write it).

    Raises
    ------
    ArgumentError
        Names the field and the value: ``jobs`` not None or a whole number >= 1 (a bool, a float or a string
        included), ``scheduler`` not None or a non-empty string, ``connect_timeout`` not a finite number > 0,
        ``progress`` not a bool or a mode of :mod:`sim.core.progress`, ``desc`` not a string, ``done`` not a
        sequence of mappings, ``on_probe`` not None or a callable.
    """

    jobs: Optional[int] = None
    scheduler: Optional[str] = None
    connect_timeout: float = 30.0
    progress: Union[bool, str] = True
    desc: str = ""
    done: Sequence[Mapping[str, Any]] = ()
    on_probe: Optional[Callable[[Dict[str, Any]], None]] = None

    def __post_init__(self) -> None:
        if self.jobs is not None:
            object.__setattr__(self, "jobs", setting_int("SearchRun.jobs", self.jobs, 1))
        if self.scheduler is not None:
            setting_str("SearchRun.scheduler", self.scheduler, empty=False)
        object.__setattr__(self, "connect_timeout", setting_number("SearchRun.connect_timeout",
                                                                   self.connect_timeout, 0.0, above=True))
        try:
            progress_mode(bool(self.progress) if isinstance(self.progress, np.bool_) else self.progress)
        except ArgumentError:
            raise ArgumentError(f"SearchRun.progress = {self.progress!r:.60}: expected True, False or one of "
                                "'auto', 'bar', 'lines', 'off'") from None
        setting_str("SearchRun.desc", self.desc)
        if isinstance(self.done, (str, bytes, Mapping)) or not isinstance(self.done, Sequence):
            raise ArgumentError(f"SearchRun.done = {type(self.done).__name__}: expected a sequence of probe rows "
                                "(mappings)")
        bad = next((i for i, r in enumerate(self.done) if not isinstance(r, Mapping)), None)
        if bad is not None:
            raise ArgumentError(f"SearchRun.done[{bad}] = {type(self.done[bad]).__name__}: expected a probe row "
                                "(a mapping)")
        if self.on_probe is not None and not callable(self.on_probe):
            raise ArgumentError(f"SearchRun.on_probe = {self.on_probe!r:.60}: expected None or a callable")


class ProbeRounds:
    """The searches of every configuration and seed, each advanced as soon as its probe's row is in: every probe
    an open search asks (those not in ``run.done``) runs as soon as a worker is free, and the search gets its row
    when it finishes and asks its next one, without waiting for the other searches' probes; a search that
    returns is done.  A worker that would idle (the last searches' probes running) probes ahead: a count the
    search is likely to ask next (:meth:`ahead`), whose row waits until its search asks it and is dropped if
    it never does, so the searches, their probes and their answers are the same whatever ran ahead and on
    every runner.  The rows the searches took are kept, numbered (``point``) and written in rounds -- every
    search's first probe, then every one's second, ..., the seeds in order -- as if the searches had advanced
    together.  One for session counts and arrival rates.

    A subclass says what a probe is: the axis it sets (:attr:`axis`, of type :attr:`value`); ``task(i, r, x)``,
    the ``(point, seed)`` of configuration ``i``'s seed ``r`` probing ``x``; ``passed(row)``; :meth:`answer`; the
    words of ``note(row)`` (a probe done) and ``finished(i, r, value)`` (a search returned); ``progress()``, the
    searches' line (a :class:`SearchProgress`); :meth:`work`; :meth:`ahead`; and :attr:`runner`, which runs the
    points.

    Parameters
    ----------
    ctx : Context
        What the runner's points need resolved.
    caps : list
        Per configuration (``index`` 0, 1, ...), the result that gets every probe row in rounds (``probes``)
        and, once its searches returned, each seed's capacity and whether it passed at the top (``per_seed``,
        ``bound``).
    run : SearchRun
    seeds : int
        Searches per configuration (``repeat`` 0, 1, ...).
    search : callable
        ``search(i)``: a new search generator of configuration ``i`` (yielding the value to probe, receiving
        :meth:`answer` of its row, returning ``(capacity, passed at the top, ...)``); its first value is asked
        here.
    """

    runner = PointRunner
    axis, value = "sessions", int

    def __init__(self, ctx: Any, caps: Sequence[Any], run: SearchRun, seeds: int,
                 search: Callable[[int], Generator]):
        self.ctx, self.caps, self.settings, self.seeds = ctx, caps, run, seeds
        self.searches: Dict[Tuple[int, int], Generator] = {(c.index, r): search(c.index) for c in caps
                                                           for r in range(seeds)}
        self.asked: Dict[Tuple[int, int], Any] = {k: next(g) for k, g in self.searches.items()}
        self.cache: Dict[tuple, Dict[str, Any]] = {self.row_key(r): dict(r) for r in run.done}
        self.counter = max((int(r["point"]) for r in run.done), default=-1) + 1
        self.results: Dict[Tuple[int, int], Any] = {}
        self.fresh: Dict[tuple, Dict[str, Any]] = {}  # rows run here that their search has not taken (yet)
        self.flight: Dict[int, tuple] = {}  # task index -> the probe it runs (running or waiting for a worker)
        self.tasks = self.kept = 0
        self.taken: List[tuple] = []  # (the search's probe number, config, seed, row, run here) as taken
        self.count: Dict[Tuple[int, int], int] = dict.fromkeys(self.searches, 0)
        self.bar: Any = None
        self.pool: Any = None

    # ------------------------------------------------------------ what a probe is
    def key(self, i: int, r: int, x: Any) -> tuple:
        """The cache key of configuration ``i``'s seed ``r`` probing ``x``."""
        return i, r, self.value(x)

    def row_key(self, row: Mapping[str, Any]) -> tuple:
        """:meth:`key` of a probe row."""
        return self.key(int(row["config"]), int(row["repeat"]), row[self.axis])

    def answer(self, row: Dict[str, Any]) -> Any:
        """What the search receives for its probe's row."""
        return row

    def work(self, tasks: Sequence[tuple]) -> int:
        """The work of tasks ``(index, point, seed)``, for the progress line."""
        return 0

    def ahead(self, i: int, r: int, x: Any) -> List[Any]:
        """Values configuration ``i``'s seed ``r``, now asking ``x``, may ask next, the likeliest first: probed
        ahead by workers that would idle (none here)."""
        return []

    # ------------------------------------------------------------ the searches
    def run(self) -> str:
        """Every probe until every search returned (``results``: each one's value, set on ``caps``); the runner's
        name.

        Raises
        ------
        SweepError
            A probe whose worker died too often.
        """
        run = self.settings
        with self.progress() as bar, self.runner(self.ctx, jobs=run.jobs, scheduler=run.scheduler,
                                                 connect_timeout=run.connect_timeout) as runner:
            self.bar, self.pool = bar, runner
            runner.run(self._more(0) or [], self._got, more=self._more)
        self._in_rounds()
        for cap in self.caps:
            found = [self.results[(cap.index, r)] for r in range(self.seeds)]
            cap.per_seed, cap.bound = [f[0] for f in found], [f[1] for f in found]
        return runner.name

    def _got(self, row: Dict[str, Any]) -> None:
        """A probe's row is in (its search takes it in :meth:`_more`)."""
        key = self.flight.pop(row["point"])
        self.fresh[key] = {**row, "config": key[0]}
        self.bar.ran(self.work([(row["point"], row, row["seed"])]), self.pool.seconds.pop(row["point"], 0.0))

    def _more(self, free: int) -> Optional[List[tuple]]:
        """The searches whose probes' rows are in take them, until none can; returns the tasks of the probes
        they ask that are neither in nor running, then, for ``free`` workers left idle, probes ahead; None once
        every search returned (the probes still running ahead are not wanted)."""
        moved = True
        while moved:
            moved = False
            for (i, r), x in list(self.asked.items()):
                k = self.key(i, r, x)
                here = k in self.fresh
                if here:
                    self.cache[k] = self._keep(self.fresh.pop(k))
                if k in self.cache:
                    self._take(i, r, x, self.cache[k], here)
                    moved = True
        running = set(self.flight.values())
        tasks = [self._task(i, r, x) for (i, r), x in self.asked.items() if self.key(i, r, x) not in running]
        spare = free - len(tasks)
        for (i, r), x in list(self.asked.items()) if spare > 0 else ():
            for y in self.ahead(i, r, x):
                k = self.key(i, r, y)
                if spare > 0 and k not in self.cache and k not in self.fresh and k not in running:
                    tasks.append(self._task(i, r, y))
                    running.add(k)
                    spare -= 1
        self.bar.retotal()
        return tasks if self.searches else None

    def _task(self, i: int, r: int, x: Any) -> tuple:
        p, seed = self.task(i, r, x)
        self.flight[self.tasks] = self.key(i, r, x)
        self.tasks += 1
        return self.tasks - 1, p, seed

    def _keep(self, row: Dict[str, Any]) -> Dict[str, Any]:
        """A row run here, taken by its search: numbered (for now: :meth:`_in_rounds` numbers the rows in rounds
        at the end) and written."""
        row["point"] = self.counter + self.kept
        self.kept += 1
        if self.settings.on_probe is not None:
            self.settings.on_probe(row)
        # a search takes many probes: each one is news for the plain progress lines
        self.bar.note(self.note(row))
        return row

    def _take(self, i: int, r: int, x: Any, row: Dict[str, Any], here: bool) -> None:
        """Search ``(i, r)`` takes the row of its probe at ``x`` and asks its next probe (or returns)."""
        self.taken.append((self.count[(i, r)], i, r, row, here))
        self.count[(i, r)] += 1
        self.caps[i].probes.append(row)
        self.bar.answered((i, r), x, self.passed(row))
        try:
            self.asked[(i, r)] = self.searches[(i, r)].send(self.answer(row))
            self.bar.asked((i, r), self.asked[(i, r)])
        except StopIteration as stop:
            self.results[(i, r)] = stop.value
            del self.searches[(i, r)], self.asked[(i, r)]
            self.bar.finished((i, r), self.finished(i, r, stop.value))

    def _in_rounds(self) -> None:
        """The rows in rounds: each configuration's by the searches' probe number, then seed; the rows run here
        numbered in that order (configurations in order within a round) after those of an earlier run."""
        order = sorted(range(len(self.taken)), key=lambda n: self.taken[n][:3])
        for cap in self.caps:
            cap.probes = [self.taken[n][3] for n in order if self.taken[n][1] == cap.index]
        for point, n in enumerate(n for n in order if self.taken[n][4]):
            self.taken[n][3]["point"] = self.counter + point


class _SessionRounds(ProbeRounds):
    """Probes of a session count (:func:`find_capacity`)."""

    def __init__(self, ctx: Context, caps: List["Capacity"], run: SearchRun, spec: CapacitySpec, study_seed: int):
        self.spec, self.study_seed = spec, study_seed
        args = (spec.max_sessions, spec.resolution, spec.target, spec.metric)
        if spec.search == "bracket":  # on a host, its CPUs' bound guides the first probe of many sessions
            hosts = [point_host(c.config, ctx.devices[device_key(c.config)]) for c in caps]
            search = lambda i: _bracketed(*args, hosts[i])  # noqa: E731
        else:
            search = lambda i: _galloping(*args)  # noqa: E731
        super().__init__(ctx, caps, run, spec.seeds, search)

    def task(self, i, r, x):
        return _session_probe(self.study_seed, self.caps[i].config, x, r)

    def passed(self, row):
        return row[self.spec.metric] >= self.spec.target

    def note(self, row):
        return (f"probe of configuration {row['config']}, seed {row['repeat']}: {row['sessions']} sessions, "
                f"{row[self.spec.metric]:.2f} tokens/s")

    def finished(self, i, r, value):
        return (f"configuration {i}, seed {r}: {value[0]} sessions "
                f"({sum(1 for p in self.caps[i].probes if p['repeat'] == r)} probes)")

    def work(self, tasks):
        return sum(int(p["sessions"]) * int(p["steps"]) for _, p, _ in tasks)

    def ahead(self, i, r, x):
        """For a bracketed search: the counts next to ``x`` (``resolution`` away) inside its bracket, first the
        one that its configuration's last probe of many sessions points at (its aggregate ``N x rate /
        target``, its own seed's first: above ``x``, where ``x`` should pass, below where it should fail) -- a
        secant step ends the search next to where it lands.  None for galloping (its next count is twice or
        half away)."""
        spec = self.spec
        if spec.search != "bracket":
            return []
        probes = self.caps[i].probes
        mine = [p for p in probes if p["repeat"] == r]
        lo = max((p["sessions"] for p in mine if self.passed(p)), default=0)
        hi = min((p["sessions"] for p in mine if not self.passed(p)), default=spec.max_sessions + 1)
        many = [p for p in mine if p["sessions"] > 1] or [p for p in probes if p["sessions"] > 1]
        guess = many[-1]["sessions"] * many[-1][spec.metric] / spec.target if many else x
        step = spec.resolution
        return [y for y in ((x + step, x - step) if x <= guess else (x - step, x + step)) if lo < y < hi]

    def progress(self) -> SearchProgress:
        """In session-steps for bracketed searches (:class:`WorkProgress`), in probes for galloping."""
        spec, run, keys = self.spec, self.settings, list(self.searches)
        desc = run.desc or "capacity"
        if spec.search == "bracket":  # probes done and the session-steps to go, with their time
            workers = 1 if run.scheduler else (run.jobs if run.jobs else (os.cpu_count() or 1))
            return WorkProgress(keys, {(i, r): int(self.caps[i].config["steps"]) for (i, r) in keys}, desc,
                                run.progress, asked=self.asked, resolution=spec.resolution,
                                max_sessions=spec.max_sessions, workers=workers)
        # galloping's length is known for every capacity: the most probes to go bound the time left
        bound = SearchBound(lambda: _search(spec.max_sessions, spec.resolution), range(spec.max_sessions + 1))
        return SearchProgress(bound, keys, desc, run.progress)


def find_capacity(configs: Sequence[Mapping[str, Any]], spec: CapacitySpec = CapacitySpec(), study_seed: int = 0,
                  run: SearchRun = SearchRun(), *, calibration=None, traces: Optional[Mapping[str, Any]] = None,
                  context: Optional[Context] = None) -> Tuple[List[Capacity], str]:
    """Search the capacity of every configuration; return ``(capacities in config order, runner name)``.

    Parameters
    ----------
    configs : sequence of dict
        Complete points (every axis); ``sessions`` and ``repeat`` are set by the search.
    spec : CapacitySpec
    study_seed : int
        Every probe's seed is ``point_seed(study_seed, probe point)``.
    run : SearchRun
        Processes or a Dask scheduler, the progress line, the probes of an earlier run (``done``, columns
        :data:`PROBE_COLUMNS`), a callback for each probe row.  ``progress``: for bracketed searches the probes
        done with their session-steps and the fewest still needed with their time (:class:`WorkProgress`), for
        galloping probes against the most its searches may still ask (:class:`SearchProgress`); a line every
        few seconds naming the last probe.
    calibration, traces
        As for :func:`sim.sweep.run_points`.
    context : Context, optional
        The traces, devices and computes of every probe, already resolved (:func:`sim.sweep.resolve_context`
        of the configurations at every seed); else resolved here.

    Raises
    ------
    ArgumentError
        Bad configurations, devices, traces or calibration.
    SweepError
        A probe whose worker died too often.
    """
    cfgs = check_points([{**c, "sessions": 1, "repeat": 0} for c in configs])
    # every seed's trace: with a reuse axis the seed index (``repeat``) draws a synthetic trace of its own
    ctx = context if context is not None else \
        resolve_context([{**c, "repeat": r} for c in cfgs for r in range(spec.seeds)],
                        Path(calibration) if calibration else None, traces)
    if spec.sustained:
        ctx = sustained_context(ctx)
    # the probes' trace warnings are said once a configuration below, not once a worker process and probe
    ctx = Context(ctx.traces, ctx.devices, ctx.computes, {**(ctx.extras or {}), HOLD_WARNINGS: True})
    caps = [Capacity(i, c, spec) for i, c in enumerate(cfgs)]
    name = _SessionRounds(ctx, caps, run, spec, study_seed).run()
    names = configuration_names(cfgs)
    for cap in caps:
        cap.cache_other = _other_start(cap, ctx)
        cap.warnings = _trace_warnings(cap, ctx) + _lockstep_warnings(cap)
        for w in cap.warnings:
            log.warning("%s", f"{names[cap.index]}: {w}")
    return caps, name


def _bytes_text(n: int) -> str:
    """``16 MiB``, ``1.5 GiB``, ``1000 bytes``: a cache budget in the binary units of its sizes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} bytes"


def configuration_names(configs: Sequence[Mapping[str, Any]]) -> List[str]:
    """How each configuration is named in the words of a search: ``configuration 1 (device=..., drives=2)`` by
    the axes that vary over ``configs`` (the device where none does)."""
    axes = [a for a in varying_axes(configs, AXES) if a not in _SEARCHED] or ["device"]
    return [f"configuration {i} ({', '.join(f'{a}={c.get(a)}' for a in axes)})" for i, c in enumerate(configs)]


def _other_start(cap: Capacity, ctx: Context) -> Optional[Tuple[int, float]]:
    """:attr:`Capacity.cache_other`: the hit rate of the row caches in the probe at the capacity (at 1 session
    for a capacity of 0; the median seed's trace) replayed through the engine's policy from the other start
    (:func:`sim.decode.step_reads`, no timing: the caches' hits depend on the trace and the sessions only)."""
    p, trace = _at_capacity(cap, ctx)
    n, pol = p["sessions"], point_policy(p)
    if trace is None or not (pol.shared_cache_rows or pol.cache_rows):
        return None
    w = 0 if pol.cache_warmup_steps else int(p["steps"])
    hot = (ctx.extras or {}).get(f"hot:{p['dram_rows']}") if p.get("dram_rows") else None
    try:
        with held_warnings():
            rd = step_reads(trace, n, int(p["steps"]), replace(pol, cache_warmup_steps=w), storage=Storage(hot=hot))
    except ArgumentError:  # more than memory allows here: the probe's own figure stands alone
        return None
    return w, (rd.cache_hits + rd.shared_hits) / rd.requests if rd.requests else 0.0


def _trace_warnings(cap: Capacity, ctx: Context) -> List[str]:
    """:attr:`Capacity.warnings`: the trace warnings of the median seed's probe at the capacity (at 1 session
    for a capacity of 0), each saying the count it was taken at."""
    p, trace = _at_capacity(cap, ctx)
    if trace is None:
        return []
    n = p["sessions"]
    with held_warnings():
        found = wrap_info(trace, n, int(p["steps"]), point_policy(p))["warnings"]
    return [f"at {n} session{'s' if n != 1 else ''}: {w}" for w in found]


def _lockstep_warnings(cap: Capacity) -> List[str]:
    """The median seed's probes at the capacity and one past it, where their sessions read in lockstep
    (:func:`sim.decode.model.lockstep_warning`): a convoy under a constant compute can set the capacity where a
    real compute's spread would not.  Each says the count it was taken at."""
    out = []
    for n in (cap.capacity, cap.capacity + 1):
        r = cap.at(n, cap.median_seed()) if n >= 2 else None
        if r is None or cap.axis != "sessions":
            continue
        w = lockstep_warning(sessions=r.get("sessions"), readers=r.get("readers"), drives=r.get("drives", 1),
                             busy=r.get("device_busy"), mean_qd=r.get("mean_queue_depth"),
                             stall_ms=r.get("stall_mean_ms"), step_ms=r.get("step_mean_ms"),
                             rows=r.get("reads_per_step"), compute_cv=r.get("compute_realised_cv"))
        if w:
            out.append(f"at {n} sessions: {w}")
    return out


def _at_capacity(cap: Capacity, ctx: Context) -> Tuple[Dict[str, Any], Any]:
    """The point of the median seed's probe at the capacity (at 1 session for a capacity of 0) and its trace (None
    where ``ctx`` has none)."""
    p = {**cap.config, "sessions": max(1, cap.capacity), "repeat": cap.median_seed()}
    return p, ctx.traces.get((point_trace(p), p["trace_limit"]))


# =====================================================================================
# read off a grid
# =====================================================================================
def capacity_of(rows: Sequence[Mapping], target: float, y: str = CAPACITY_METRIC) -> Tuple[int, bool]:
    """Largest session count of a grid whose sessions all reach ``target``, and whether it is only a lower bound.

    ``rows`` are sweep rows of one configuration (``sessions`` and ``y``).
    Counting from one session up, the first count below the target ends the
    search; the capacity is the last count before it (0 when the smallest count
    misses the target).  The bound flag is true when every count met the
    target.  A grid only brackets the capacity: :func:`find_capacity` finds it.
    """
    cap = 0
    for r in sorted(rows, key=lambda r: r["sessions"]):
        if r[y] >= target:
            cap = int(r["sessions"])
        else:
            return cap, False
    return cap, True


def grid_capacities(rows: Sequence[Mapping], target: float, y: str = CAPACITY_METRIC,
                    axes: Optional[Sequence[str]] = None) -> List[Tuple[Dict[str, Any], int, bool, int]]:
    """Capacity read off a sweep grid over ``sessions``, per combination of the other varying ``axes``
    (default: every axis that varies, but ``sessions`` and ``repeat``), the replicates' rows averaged.

    Returns ``[(axis values, capacity, lower bound, largest count of the grid)]``.
    """
    if axes is None:
        axes = [a for a in AXES if a not in _SEARCHED and len({r[a] for r in rows}) > 1]
    groups: Dict[tuple, List[Mapping]] = {}
    for r in rows:
        groups.setdefault(tuple(r[a] for a in axes), []).append(r)
    out = []
    for key, rs in groups.items():
        by: Dict[int, List[float]] = {}
        for r in rs:
            by.setdefault(int(r["sessions"]), []).append(float(r[y]))
        mean = [{"sessions": s, y: sum(v) / len(v)} for s, v in by.items()]
        cap, bound = capacity_of(mean, target, y)
        out.append((dict(zip(axes, key)), cap, bound, max(by)))
    return out


# =====================================================================================
# capacity studies
# =====================================================================================
def probes_path(path: Union[str, os.PathLike]) -> Path:
    """``OUT.probes.csv``: every probe of a capacity table at ``OUT``."""
    return Path(str(path) + ".probes.csv")


def _session_probe(study_seed: int, config: Mapping[str, Any], sessions: int, repeat: int) -> Tuple[Dict[str, Any], int]:
    """``(point, seed)`` of a probe of ``config`` at ``sessions``: the seed is :func:`sim.sweep.point_seed`'s."""
    p = {**config, "sessions": sessions, "repeat": repeat}
    return p, point_seed(study_seed, p)


@dataclass
class CapacityResult:
    """A capacity study's results: one :class:`Capacity` per configuration.  The serving one
    (:class:`sim.serve.search.ServeCapacityResult`) is this with its own axes, columns and probes
    (:attr:`kind` ... :meth:`probe`); both run, write and resume through :meth:`run`."""

    study: Study
    spec: CapacitySpec
    capacities: List[Capacity]
    seconds: float
    runner: str
    resumed: int = 0
    table: Optional[Path] = None

    kind, schema, spec_key, axes, searched = "capacity", CAPACITY_SCHEMA, "capacity", AXES, _SEARCHED
    columns, probe_columns = CAPACITY_COLUMNS, PROBE_COLUMNS

    def rows(self) -> List[Dict[str, Any]]:
        """One row a configuration (its ``row()``), in study order."""
        return [c.row() for c in self.capacities]

    def probes(self) -> List[Dict[str, Any]]:
        """Every probe's row, in ``point`` order."""
        return sorted((p for c in self.capacities for p in c.probes), key=lambda p: p["point"])

    def head(self) -> dict:
        """What both tables' metadata start with: the study and the search's settings."""
        return {"kind": self.kind, "schema": self.schema, "study": self.study.to_dict(),
                "study_fingerprint": self.study.fingerprint(), self.spec_key: self.spec.to_dict()}

    def meta(self) -> dict:
        return {**self.head(), "axes": [a for a in self.study.axes() if a not in self.searched],
                "columns": self.columns, "configurations": len(self.capacities),
                "axis_labels": {k: v[2] for k, v in self.axes.items()}, "capacity_rule": CAPACITY_RULE,
                "seconds": self.seconds, "runner": self.runner, "resumed_probes": self.resumed,
                "probes_table": probes_path(self.table).name if self.table else None, **self.notes()}

    def notes(self) -> dict:
        """The metadata's last keys: what the capacities assume."""
        return {"assumptions": [c.assumptions() for c in self.capacities]}

    # ------------------------------------------------------------ the probes
    def probe(self, config: Mapping[str, Any], row: Mapping[str, Any]) -> Tuple[Dict[str, Any], int]:
        """``(point, seed)`` of the probe of ``config`` that ``row`` (of an earlier run) says it is."""
        return _session_probe(self.study.seed, config, row.get("sessions"), row.get("repeat"))

    def finished_probe(self, row: Mapping[str, Any]) -> bool:
        """Whether a probe row of an earlier run is whole (not cut short)."""
        return isinstance(row.get(self.spec.metric), float)

    def check_earlier(self, path: Path, meta: Mapping[str, Any]) -> None:
        """Refuse the probes of an earlier run searched otherwise (here: with the buckets started otherwise)."""
        if bool((meta.get("capacity") or {}).get("sustained", False)) != self.spec.sustained:
            raise ArgumentError(f"{path}: probes of a search {'without' if self.spec.sustained else 'with'} "
                                "--sustained (the buckets of rate-limited volumes started otherwise); give another "
                                "--out, or drop --resume")

    def resume_probes(self, out: Path) -> List[Dict[str, Any]]:
        """Probe rows of an earlier run of the study at ``out`` (``OUT.probes.csv``; none when absent) that still
        hold (same configurations and seeds), with the study's axis values as a new probe holds them.

        Raises
        ------
        ArgumentError
            Probes of another study, or a probe whose axis values or seed are not the study's.
        """
        path, source = probes_path(out), self.study.source
        if not path.is_file():
            return []
        rows, meta = read_table(path)
        if meta.get("study_fingerprint") not in (None, self.study.fingerprint()):
            raise ArgumentError(f"{path}: probes of another study than {source}; give another --out, or drop --resume")
        if rows:
            self.check_earlier(path, meta)
        cfgs, keep = self.study.points(), []
        for r in rows:
            i = r.get("config")
            if not isinstance(i, int) or not 0 <= i < len(cfgs) or not self.finished_probe(r):
                continue  # cut short
            p, seed = self.probe(cfgs[i], r)
            if r.get("seed") != seed or not all(same_axis_value(r.get(a), p[a]) or (t is str and str(r.get(a)) == str(p[a]))
                                                for a, (t, _, _) in self.axes.items()):
                raise ArgumentError(f"{path}: probe {r.get('point')} does not belong to {source} "
                                    "(other axis values or seed)")
            keep.append({**r, **{a: p[a] for a in self.axes}})
        return keep

    def run(self, start: Callable[[Optional[Path]], Callable[[SearchRun], Tuple[list, str]]], *,
               out: Union[str, os.PathLike, None], resume: bool, calibration: Union[str, os.PathLike, None],
               desc: str, **run: Any) -> "CapacityResult":
        """Search every configuration of the study and return this result filled in: ``start(calibration)``
        resolves what the probes need before a file is opened and returns the search (``(capacities, runner
        name)`` for a :class:`SearchRun`); ``out``, ``resume`` and ``run`` (``jobs``, ``scheduler``,
        ``connect_timeout``, ``progress``) as for :func:`run_capacity`; ``desc`` labels the progress line."""
        if resume and out is None:
            raise ArgumentError("resume needs the table of the earlier run (out)")
        if out is not None:
            for p in (out, probes_path(out)):
                check_table_target(p)
        t0 = time.perf_counter()
        done = self.resume_probes(Path(out)) if resume else []
        find = start(Path(calibration) if calibration else self.study.calibration)
        writer = (TableWriter(probes_path(out), self.probe_columns, {**self.head(), "kind": f"{self.kind}-probes",
                                                                     "columns": self.probe_columns}, 0, done)
                  if out is not None else None)
        try:
            self.capacities, self.runner = find(SearchRun(**run, desc=progress_label(desc, self.study.name), done=done,
                                                          on_probe=writer.add if writer is not None else None))
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        self.seconds, self.resumed = time.perf_counter() - t0, len(done)
        if writer is not None:
            writer.finish()
            self.table = Path(out)
            TableWriter(out, self.columns, self.meta(), len(self.capacities), self.rows(), key="config").finish()
        return self


def run_capacity(study: Union[Study, str, os.PathLike], *, jobs: Optional[int] = None,
                 scheduler: Optional[str] = None, calibration: Union[str, os.PathLike, None] = None,
                 progress: Union[bool, str] = True, out: Union[str, os.PathLike, None] = None,
                 connect_timeout: float = 30.0, resume: bool = False, **overrides: Any) -> CapacityResult:
    """Run a capacity study: the capacity of every point of its grid.

    ``out``: the capacity table (``.csv`` or ``.parquet``, one row per
    configuration, :data:`CAPACITY_COLUMNS`) with ``OUT.meta.json``, and every
    probe in ``OUT.probes.csv``, written as the probes finish (an interrupted
    search leaves them; ``resume=True`` starts from them).  ``overrides``:
    :class:`CapacitySpec` fields replacing the study's ``[capacity]`` values.
    Other parameters as for :func:`sim.sweep.run_study`.

    From a script, call it under ``if __name__ == "__main__":`` unless ``jobs=1`` or ``scheduler`` is given.
    The local workers (``jobs`` other than 1, the CPU count by default) are started with the ``spawn`` method,
    and a spawned process imports the script that started it (as ``__mp_main__``) before it takes a probe: a
    call at the script's top level runs again in every worker, where it cannot start processes of its own
    (multiprocessing's RuntimeError about the bootstrapping phase), so every worker ends at once and the search
    ends with :class:`~sim.sweep.runner.SweepError` after :data:`~sim.sweep.runner.MAX_ATTEMPTS` pools.
    ``jobs=1`` probes in the calling process and a Dask cluster's workers import no script: neither needs
    the guard.  The same holds for :func:`sim.sweep.run_study` and :func:`sim.serve.run_serve_capacity`.

    Raises
    ------
    ArgumentError, FormatError
        Not a capacity study, bad values, devices, traces, calibration.
    OutputError
        ``out`` cannot be written.
    SweepError
        A probe whose worker died too often (also: a script that calls this outside its ``__main__`` guard).
    """
    if not isinstance(study, Study):
        study = Study.load(study)
    spec = CapacitySpec.from_study(study, **overrides)

    def start(cal: Optional[Path]) -> Callable[[SearchRun], Tuple[List[Capacity], str]]:
        # devices, traces and calibration resolved before a file is opened: a bad one leaves nothing behind
        ctx = resolve_context(check_points([{**c, "sessions": 1, "repeat": r} for c in study.points()
                                            for r in range(spec.seeds)]), cal)
        return lambda run: find_capacity(study.points(), spec, study.seed, calibration=cal, context=ctx, run=run)

    return CapacityResult(study, spec, [], 0.0, "").run(start, out=out, resume=resume, calibration=calibration,
                                                       desc="capacity", jobs=jobs, scheduler=scheduler,
                                                       connect_timeout=connect_timeout, progress=progress)


def read_capacity(path: Union[str, os.PathLike]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], dict]:
    """A capacity table written by :func:`run_capacity` or :func:`sim.serve.run_serve_capacity`: ``(rows, probe
    rows, meta)`` (no probes when the probes table is gone).

    Raises
    ------
    FormatError
        Unreadable tables.
    """
    rows, meta = read_table(path)
    probes = read_table(probes_path(path))[0] if probes_path(path).is_file() else []
    return rows, probes, meta


def is_capacity_table(path: Union[str, os.PathLike], kind: str = "capacity") -> bool:
    """Whether the table at ``path`` is a capacity table (its metadata says ``"kind": "capacity"``; a serving one's,
    ``kind="serve-capacity"``).

    Raises
    ------
    FormatError
        Unreadable metadata.
    """
    mp = meta_path(path)
    return mp.is_file() and load_json(mp).get("kind") == kind
