"""The simulator's parameters besides the trace and the device: the read policy, the compute, the session
phases and where the tables are stored (SPEC §8, §9).

:class:`Policy` says how a decode step reads its rows (threshold, backend,
readers, row caches, DRAM-resident rows, overlap); :class:`Compute` how long
the rest of a step takes; :class:`Phases` when independent sessions start
relative to each other; :class:`Storage` the drives the tables are striped
over, the rows kept in DRAM and what shapes the device's latencies.  The
defaults a newcomer meets everywhere in ``sim`` -- 16 readers, threshold 8, 43
layers, random phases -- are defined here once.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from engram._checks import setting_number
from engram.errors import ArgumentError
from engram.rowcache import DEFAULT_POLICY, POLICIES as CACHE_POLICIES, cache_rows as _cache_rows, parse_size
from engram.table import DEFAULT_READERS, DEFAULT_THRESHOLD  # the engine's defaults (readers, threshold)

from .limits import MAX_DRIVES, check_amount, check_count

__all__ = ["BACKENDS", "COMPUTE_DISTS", "DEFAULT_LAYERS", "DEFAULT_PHASES", "DEFAULT_READERS", "DEFAULT_THRESHOLD",
           "NORMAL_MAX_CV", "Compute", "Consumer", "CONSUMERS", "consumer_preset", "Phases", "Policy", "Storage",
           "compute_stats"]

#: Decoder layers of DeepSeek V4 Flash (ds4: ``DS4_N_LAYER = 43``).
DEFAULT_LAYERS = 43
#: The engine's concurrent read backends.
BACKENDS = ("pread", "io_uring")
#: Parametric distributions of compute time (:class:`Compute` also resamples measured times: ``"empirical"``).
COMPUTE_DISTS = ("constant", "normal", "lognormal", "gamma", "exponential")
#: Largest coefficient of variation of a ``"normal"`` compute (a normal truncated at 0 cannot reach 1).
NORMAL_MAX_CV = 0.85
#: Session phases by default: independent sessions, as a server sees them.
DEFAULT_PHASES = "random"


@dataclass(frozen=True)
class Policy:
    """How a step reads its rows (SPEC §8).

    Attributes
    ----------
    threshold : int
        A batch with at least this many distinct rows is read concurrently,
        smaller ones serially (reference engine: 256, then 8).
    backend : str
        ``"pread"`` (a persistent pool of ``readers`` threads) or ``"io_uring"``
        (one submission, ``readers`` reads in flight).
    readers : int
        Reads in flight of a concurrent batch, for either backend: pread pool
        threads or io_uring queue depth -- the meaning of ``readers`` in
        ``engram.Table``, ``engram measure`` and the sweeps (default 16).
    ring_depth : int, optional
        Deprecated alias of ``readers`` (a ``DeprecationWarning``); giving both
        with different values is an ``ArgumentError``.  Always equal to
        ``readers`` once built.
    cache_rows : int
        Per-session row cache, rows (0: none, as the engine does); its policy ``cache_policy``.
    shared_cache_rows : int
        One row cache shared by every session, rows (0: none): the engine's
        :class:`engram.RowCache` of the model.  A request goes to the session's
        cache first, then to the shared one, which sees each session's step as
        one batch (looked up, then its misses inserted), as the engine does.
    shared_cache_bytes : int or str
        The shared cache as the engine sizes it: a budget in bytes (``"1G"``),
        ``bytes // 264`` rows (:func:`engram.rowcache.cache_rows`); sets
        ``shared_cache_rows`` (giving both with other rows is an ``ArgumentError``).
        0: ``shared_cache_rows`` says.
    cache_policy : str
        The row caches' replacement policy, one of the engine's
        (:data:`engram.rowcache.POLICIES`: ``"lru"`` or ``"tinylfu"``), run by the engine's
        own code (:class:`engram.rowcache.CachePolicy`); default the engine's,
        :data:`engram.rowcache.DEFAULT_POLICY` (``"tinylfu"``: why there), so that a
        prediction and the engine run the same policy unless told otherwise.  It applies
        to the per-session caches (``cache_rows``) too.
    cache_warmup_steps : int
        Steps each session decodes through the row caches before the run's own steps, neither timed nor
        counted (>= 0; 0: the caches start empty, as a fresh engine's do): session ``i`` of ``S`` reads the
        ``cache_warmup_steps`` trace steps before its start (``i * T // S``, wrapping), interleaved step by step
        as the timed ones, so that a run starts with the caches of sessions that have been decoding a while
        (nearer a server's steady state) instead of empty ones.  Either way can hit more: an empty cache admits every
        row while it fills, where a full W-TinyLFU one admits a row only over a more frequent victim (on text
        whose rows come back soon after they are read, a warm W-TinyLFU cache hits less), while a warm LRU cache
        holds what an empty one would and more; and a W-TinyLFU cache's frequency counts build up over many
        steps, so its hit rate goes on changing with a longer warm-up.  No effect without a row cache; not
        modelled with speculative verification batches (:func:`sim.decode.step_reads` refuses them together).
    dram_fraction : float
        Share of every table's rows resident in DRAM (0: none): a request for
        such a row costs no device read.  The resident rows are chosen by a
        hash of (table, row id) (:func:`sim.decode.resident_mask`), so they are
        a uniform sample of each table.
    overlap_layers : int
        Layers of compute that run before the second table's rows are needed
        (0: every row is read before compute starts); at most the model's layers.
    batch_overhead : float
        Seconds added to every concurrent batch (waking the pool, submitting
        the ring); 0 by default.

    Raises
    ------
    ArgumentError
        An unknown backend, counts below 1, negative sizes, a fraction outside
        [0, 1], ``cache_warmup_steps`` not a whole number >= 0, or ``readers`` and
        ``ring_depth`` both given and different.
    """

    threshold: int = DEFAULT_THRESHOLD
    backend: str = "pread"
    readers: Optional[int] = None
    ring_depth: Optional[int] = None
    cache_rows: int = 0
    overlap_layers: int = 0
    batch_overhead: float = 0.0
    shared_cache_rows: int = 0
    dram_fraction: float = 0.0
    shared_cache_bytes: int = 0
    cache_policy: str = DEFAULT_POLICY
    cache_warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.cache_policy not in CACHE_POLICIES:
            raise ArgumentError(f"Policy.cache_policy must be one of {', '.join(CACHE_POLICIES)}, "
                                f"got {self.cache_policy!r}")
        b = parse_size(self.shared_cache_bytes, "Policy.shared_cache_bytes")
        object.__setattr__(self, "shared_cache_bytes", b)
        if b:
            rows = _cache_rows(b, check_memory=False)
            if self.shared_cache_rows and int(self.shared_cache_rows) != rows:
                raise ArgumentError(f"Policy: shared_cache_bytes {b} holds {rows} rows, shared_cache_rows says "
                                    f"{self.shared_cache_rows}; give one of them")
            object.__setattr__(self, "shared_cache_rows", rows)
        if self.backend not in BACKENDS:
            raise ArgumentError(f"Policy.backend must be 'pread' or 'io_uring', got {self.backend!r}")
        readers, ring = self.readers, self.ring_depth
        if ring is not None and readers is not None and int(ring) != int(readers):
            raise ArgumentError(f"Policy: ring_depth ({ring}) is a deprecated alias of readers ({readers}); "
                                "give readers only")
        if readers is None and ring is not None:
            warnings.warn("Policy(ring_depth=...) is deprecated: readers is the queue depth of either backend",
                          DeprecationWarning, stacklevel=3)
            readers = ring
        readers = DEFAULT_READERS if readers is None else readers
        object.__setattr__(self, "readers", int(readers))
        object.__setattr__(self, "ring_depth", int(readers))
        for name in ("threshold", "readers"):
            if int(getattr(self, name)) < 1:
                raise ArgumentError(f"Policy.{name} must be >= 1, got {getattr(self, name)}")
        w = self.cache_warmup_steps
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)) or w < 0:
            raise ArgumentError(f"Policy.cache_warmup_steps must be a whole number >= 0, got {w!r}")
        object.__setattr__(self, "cache_warmup_steps", int(w))
        for name in ("cache_rows", "shared_cache_rows", "overlap_layers"):
            if getattr(self, name) < 0:
                raise ArgumentError(f"Policy.{name} must be >= 0, got {getattr(self, name)}")
        object.__setattr__(self, "batch_overhead", check_amount(self.batch_overhead, "Policy.batch_overhead", "seconds"))
        if not 0.0 <= self.dram_fraction <= 1.0:
            raise ArgumentError(f"Policy.dram_fraction must be in [0, 1], got {self.dram_fraction}")

    @property
    def width(self) -> int:
        """Reads in flight for a concurrent batch: ``readers`` (pool threads or ring depth)."""
        return self.readers

    def concurrency(self, n: int) -> int:
        """Readers used for a batch of ``n`` distinct rows: 1 below ``threshold``, else ``min(n, readers)``."""
        return 1 if n < self.threshold else min(n, self.readers)

    def to_dict(self) -> dict:
        return asdict(self)


def compute_stats(x: np.ndarray) -> dict:
    """``{"mean_ms", "cv", "samples"}`` of drawn compute times (seconds): what a run actually used."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return {"mean_ms": 0.0, "cv": 0.0, "samples": 0}
    m = float(x.mean())
    return {"mean_ms": m * 1e3, "cv": float(x.std() / m) if m > 0 else 0.0, "samples": int(x.size)}


def _normal_cv(a: float) -> tuple:
    """(cv, P(X >= 0)) of a normal truncated below at ``a`` standard deviations from its mean."""
    sf = 0.5 * math.erfc(a / math.sqrt(2))
    lam = math.exp(-a * a / 2) / math.sqrt(2 * math.pi) / sf
    return math.sqrt(max(1 + a * lam - lam * lam, 0.0)) / (lam - a), sf


def _truncated_normal(mean: float, cv: float) -> tuple:
    """(mu, sigma) of a normal whose part above 0 has mean ``mean`` and coefficient of variation ``cv``.

    The truncated normal's cv grows with the truncation point ``a`` (in standard deviations, ``-mu/sigma``);
    ``a`` is found by bisection, then ``sigma = mean / (lambda(a) - a)`` (the truncated mean is
    ``sigma * (lambda - a)``, ``lambda`` the inverse Mills ratio).
    """
    lo, hi = -60.0, 1.2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _normal_cv(mid)[0] < cv:
            lo = mid
        else:
            hi = mid
    a = (lo + hi) / 2
    sf = 0.5 * math.erfc(a / math.sqrt(2))
    lam = math.exp(-a * a / 2) / math.sqrt(2 * math.pi) / sf
    sigma = mean / (lam - a)
    return -a * sigma, sigma


@dataclass(frozen=True)
class Compute:
    """Compute time of one decode step (or, for prefill, of one token through all layers).

    Every distribution has the requested mean and coefficient of variation and
    never draws a negative time.

    Attributes
    ----------
    mean : float
        Mean seconds.
    dist : str
        ``"constant"``; ``"normal"`` (a normal truncated at 0 whose own mean and
        cv are the requested ones, so the cv must be below
        :data:`NORMAL_MAX_CV`); ``"lognormal"``; ``"gamma"``; ``"exponential"``
        (cv 1 by definition: ``cv`` must be 0, meaning unset, or 1); or
        ``"empirical"`` (resampling ``samples``).
    cv : float
        Coefficient of variation (normal, lognormal, gamma; 1 for exponential).
    samples : tuple of float
        Measured times (seconds) for ``"empirical"``.
    layers : int
        Decoder layers the time spreads over evenly (for overlap and prefill).

    Raises
    ------
    ArgumentError
        An unknown distribution, a negative mean or cv, a cv the distribution
        cannot have (names the distribution and the values that work).
    """

    mean: float
    dist: str = "constant"
    cv: float = 0.0
    samples: tuple = ()
    layers: int = DEFAULT_LAYERS
    _normal: tuple = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dist not in COMPUTE_DISTS + ("empirical",):
            raise ArgumentError(f"Compute.dist: unknown distribution {self.dist!r} "
                                f"(one of {', '.join(COMPUTE_DISTS)}, or empirical)")
        if not (self.mean >= 0 and math.isfinite(self.mean)) or not (self.cv >= 0 and math.isfinite(self.cv)):
            raise ArgumentError(f"Compute: need mean >= 0 and cv >= 0, got {self.mean}, {self.cv}")
        if self.layers < 1:
            raise ArgumentError(f"Compute.layers must be >= 1, got {self.layers}")
        if self.dist == "empirical" and not self.samples:
            raise ArgumentError("Compute: 'empirical' needs samples")
        if self.dist == "constant" and self.cv > 0:
            raise ArgumentError(f"Compute: a constant compute has cv 0, got cv {self.cv}; "
                                "choose normal, lognormal or gamma for a spread")
        if self.dist == "exponential":
            if self.cv not in (0.0, 1.0):
                raise ArgumentError(f"Compute: an exponential compute has cv 1 by definition, got cv {self.cv}; "
                                    "leave the cv out, or choose gamma or lognormal for another cv")
            object.__setattr__(self, "cv", 1.0)
        if self.dist == "normal" and self.cv > 0:
            if self.cv > NORMAL_MAX_CV:
                raise ArgumentError(f"Compute: a normal compute truncated at 0 cannot have cv {self.cv} "
                                    f"(at most {NORMAL_MAX_CV}); choose gamma or lognormal")
            if self.mean > 0:
                object.__setattr__(self, "_normal", _truncated_normal(self.mean, self.cv))

    @classmethod
    def empirical(cls, samples: Sequence[float], layers: int = DEFAULT_LAYERS) -> "Compute":
        """Resample measured step times (seconds)."""
        s = tuple(float(x) for x in samples)
        if not s or min(s) < 0:
            raise ArgumentError("Compute.empirical: need measured times >= 0")
        return cls(float(np.mean(s)), "empirical", float(np.std(s) / max(np.mean(s), 1e-300)), s, layers)

    def with_layers(self, layers: int) -> "Compute":
        """The same compute spread over ``layers`` layers."""
        return Compute(self.mean, self.dist, self.cv, self.samples, int(layers))

    def shifted(self, seconds: float) -> "Compute":
        """The compute ``seconds`` longer every step (>= 0; a host's CPU queue, :mod:`sim.decode.host`): a
        constant or the measured samples moved by it; another distribution keeps its standard deviation about
        the new mean (an exponential becomes a gamma of that spread).

        Raises
        ------
        ArgumentError
            ``seconds`` negative or not finite.
        """
        s = setting_number("Compute.shifted: seconds", seconds, 0.0)
        if not math.isfinite(self.mean + s):
            raise ArgumentError(f"Compute.shifted: seconds = {seconds!r:.40}: the mean {self.mean:g} s plus it is "
                                "not finite")
        if s == 0:
            return self
        if self.dist == "empirical":
            return Compute.empirical([x + s for x in self.samples], self.layers)
        if self.dist == "constant":
            return Compute(self.mean + s, layers=self.layers)
        m = self.mean + s
        return Compute(m, "gamma" if self.dist == "exponential" else self.dist, self.cv * self.mean / m,
                       layers=self.layers)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """float64 ``[size]`` compute times, seconds (>= 0), with mean ``mean`` and cv ``cv``."""
        m, cv = self.mean, self.cv
        if self.dist == "constant" or m == 0 or (cv == 0 and self.dist in ("normal", "lognormal", "gamma")):
            return np.full(size, m)
        if self.dist == "normal":
            return self._sample_normal(rng, size)
        if self.dist == "lognormal":
            s2 = math.log1p(cv * cv)
            return rng.lognormal(math.log(m) - s2 / 2, math.sqrt(s2), size)
        if self.dist == "gamma":
            shape = 1 / (cv * cv)
            return rng.gamma(shape, m / shape, size)
        if self.dist == "exponential":
            return rng.exponential(m, size)
        return rng.choice(np.asarray(self.samples), size)

    def _sample_normal(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """The truncated normal by rejection (acceptance >= 16% up to :data:`NORMAL_MAX_CV`)."""
        mu, sigma = self._normal
        out = np.empty(size)
        got = 0
        while got < size:
            x = rng.normal(mu, sigma, max(64, 2 * (size - got)))
            x = x[x >= 0][: size - got]
            out[got:got + x.size] = x
            got += x.size
        return out

    def to_dict(self) -> dict:
        d = {"mean_ms": self.mean * 1e3, "dist": self.dist, "cv": self.cv, "layers": self.layers}
        if self.samples:
            d["samples"] = len(self.samples)
        return d


@dataclass(frozen=True)
class Consumer:
    """The Engram consumer of a step (copy, decode, projection, gated add), per Engram layer, by batch size.

    A what-if input of the decode and serving models: what the two Engram layers add to a step's
    compute on the processor that runs them (``none``: already inside the step compute, the default).
    ``ms(batch)`` is piecewise linear through ``knots`` (extended past the last with its slope).

    Attributes
    ----------
    name : str
    knots : tuple of (int, float)
        ``(batch, ms a layer)``, batches increasing from 1.
    layers : int
        Engram layers a step runs (2 in V4.1).
    source : str
        Where the figures come from.

    Raises
    ------
    ArgumentError
        No knot, batches not increasing from >= 1, negative times, ``layers < 0``.
    """

    name: str
    knots: Tuple[Tuple[int, float], ...]
    layers: int = 2
    source: str = ""

    def __post_init__(self) -> None:
        ks = tuple((int(b), float(m)) for b, m in self.knots)
        if not ks or ks[0][0] < 1 or any(b2 <= b1 for (b1, _), (b2, _) in zip(ks, ks[1:])):
            raise ArgumentError(f"Consumer {self.name!r}: knots need batches increasing from >= 1, got {ks}")
        if any(not (m >= 0 and math.isfinite(m)) for _, m in ks) or self.layers < 0:
            raise ArgumentError(f"Consumer {self.name!r}: times must be finite and >= 0, layers >= 0")
        object.__setattr__(self, "knots", ks)

    def slope_ms(self) -> float:
        """Milliseconds a layer adds per token past the last knot (0 with one knot)."""
        ks = self.knots
        return (ks[-1][1] - ks[-2][1]) / (ks[-1][0] - ks[-2][0]) if len(ks) > 1 else 0.0

    def ms(self, batch: int) -> float:
        """Milliseconds of one Engram layer's consumer for ``batch`` tokens (0 tokens: 0)."""
        if batch <= 0:
            return 0.0
        xs = [b for b, _ in self.knots]
        ys = [m for _, m in self.knots]
        if batch >= xs[-1]:
            return ys[-1] + (batch - xs[-1]) * self.slope_ms()
        return float(np.interp(batch, xs, ys))

    def step_s(self, batch: int = 1) -> float:
        """Seconds the consumer adds to a step of ``batch`` tokens: every Engram layer."""
        return self.layers * self.ms(batch) * 1e-3

    def to_dict(self) -> dict:
        return {"name": self.name, "knots": [list(k) for k in self.knots], "layers": self.layers,
                "source": self.source}


#: Consumer presets (``--consumer``): ``none`` (inside the step compute: the default), ``cpu`` (the host path on
#: a 16-core host, issue 22: ``Session.apply`` 4.46 and 4.29 ms for layers 1 and 14, the step's read and decode
#: 0.71 ms, halved between the layers: 4.73 ms a layer at batch 1; the F16 projection reads its 315 MB once for
#: every token up to 256, and a token's gate costs about what the batch-1 gate does (8.9 us), so 64 tokens add
#: 0.56 ms) and ``h200`` (the lent H200, issue 22: the consumer of both layers as a CUDA-graph replay of plain
#: torch ops took 0.31 ms at batch 1, 0.155 ms a layer; batch 64 at issue 22's bound of 0.5 ms a step, 0.25 ms a
#: layer, until ``benchmarks/bench_gpu.py``'s figure replaces it).
CONSUMERS = {
    "none": Consumer("none", ((1, 0.0),), source="inside the step compute"),
    "cpu": Consumer("cpu", ((1, 4.73), (64, 5.29)), source="16-core host, Session.step + apply (issue 22)"),
    "h200": Consumer("h200", ((1, 0.155), (64, 0.25)),
                     source="H200, CUDA-graph replay (issue 22; batch 64: the issue's bound)"),
}


def consumer_preset(name: str) -> Consumer:
    """The preset ``name`` of :data:`CONSUMERS`.

    Raises
    ------
    ArgumentError
        An unknown name (lists the presets).
    """
    try:
        return CONSUMERS[name]
    except KeyError:
        raise ArgumentError(f"unknown consumer {name!r} (one of {', '.join(CONSUMERS)})") from None


@dataclass(frozen=True)
class Phases:
    """When sessions start relative to each other.

    ``random`` (the default)
        each session starts at a uniformly random time within one step (its
        mean compute plus the mean read time of a step alone on the device),
        drawn from the run's seed: independent sessions, as a server sees them;
    ``lockstep``
        every session starts at time 0 (all step together at first; only
        contention decides whether they stay in phase): the worst case for the
        device;
    ``spread:MS``
        session ``i`` of ``S`` starts at ``i * MS / S`` milliseconds;
    ``offsets:MS,MS,...``
        session ``i`` starts at the ``i``-th offset (milliseconds; one per
        session): measured start times replayed (:meth:`at`).

    Raises
    ------
    ArgumentError
        Another spelling, a negative spread or offset, or (:meth:`offsets`) a number of offsets other than the
        sessions.
    """

    kind: str = DEFAULT_PHASES
    spread: float = 0.0
    #: Start of each session, seconds (``kind == "offsets"``).
    starts: Tuple[float, ...] = ()

    KINDS = ("random", "lockstep", "spread", "offsets")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ArgumentError(f"phases: unknown kind {self.kind!r} (random, lockstep, spread:MS or offsets:MS,...)")
        if not (self.spread >= 0 and math.isfinite(self.spread)):
            raise ArgumentError(f"phases: the spread must be >= 0 seconds, got {self.spread}")
        starts = tuple(float(x) for x in self.starts)
        if any(not (x >= 0 and math.isfinite(x)) for x in starts):
            raise ArgumentError(f"phases: offsets must be >= 0 seconds, got {list(starts)}")
        if (self.kind == "offsets") != bool(starts):
            raise ArgumentError("phases: offsets need at least one start time, and only the kind 'offsets' takes them")
        object.__setattr__(self, "starts", starts)

    @classmethod
    def at(cls, starts: Sequence[float]) -> "Phases":
        """Session ``i`` starts at ``starts[i]`` seconds (e.g. the measured start of each session)."""
        return cls("offsets", 0.0, tuple(float(x) for x in starts))

    @classmethod
    def parse(cls, spec) -> "Phases":
        """From ``"random"``, ``"lockstep"``, ``"spread:MS"`` (milliseconds) or a :class:`Phases`."""
        if isinstance(spec, Phases):
            return spec
        s = str(spec).strip()
        if s.startswith("spread:"):
            try:
                ms = float(s.split(":", 1)[1])
            except ValueError:
                raise ArgumentError(f"phases {s!r}: spread:MS needs a number of milliseconds") from None
            return cls("spread", ms * 1e-3)
        if s.startswith("offsets:"):
            try:
                ms = [float(x) for x in s.split(":", 1)[1].split(",") if x.strip()]
            except ValueError:
                raise ArgumentError(f"phases {s!r}: offsets:MS,MS,... needs numbers of milliseconds") from None
            return cls.at([x * 1e-3 for x in ms])
        if s not in ("random", "lockstep"):
            raise ArgumentError(f"phases {s!r}: use random, lockstep, spread:MS or offsets:MS,...")
        return cls(s)

    def offsets(self, sessions: int, period: float, rng: np.random.Generator) -> list:
        """Start time (seconds) of each session; ``period`` is one step (used by ``random``).

        Raises
        ------
        ArgumentError
            ``offsets`` given for another number of sessions.
        """
        if self.kind == "offsets":
            if len(self.starts) != sessions:
                raise ArgumentError(f"phases: {len(self.starts)} offsets for {sessions} sessions")
            return list(self.starts)
        if self.kind == "lockstep" or sessions == 1:
            return [0.0] * sessions
        if self.kind == "spread":
            return [i * self.spread / sessions for i in range(sessions)]
        return sorted(rng.random(sessions) * period)

    def __str__(self) -> str:
        if self.kind == "offsets":
            return "offsets:" + ",".join(f"{x * 1e3:g}" for x in self.starts)
        return f"spread:{self.spread * 1e3:g}" if self.kind == "spread" else self.kind


@dataclass(frozen=True)
class Storage:
    """Where the Engram tables sit: the drives they are striped over, the rows kept in DRAM, and what shapes the
    device's latencies (a decode run, :func:`sim.decode.simulate_decode`, and a serving run alike).

    Attributes
    ----------
    drives : int
        Identical drives the tables are striped over, by row id (row id mod drives; default 1, >= 1).
    hot : numpy.ndarray, str or os.PathLike, optional
        Rows resident in DRAM besides ``Policy.dram_fraction``: row ids ``[m]`` or ``(table index, row id)``
        pairs ``[m, 2]``, or a ``.npy`` file of them (:func:`sim.decode.reads.hot_rows`).
    tail : Device or str, optional
        A measured device whose latency distribution (the tail) the device takes at each depth, keeping its
        own means (:func:`sim.device.with_tail`).
    calibration : path, mapping or Calibration, optional
        For ``device="calibrated"`` (:func:`sim.device.load_device`); the ``tail`` is loaded with it too: a
        calibration file (``engram calibrate``), its document, or a :class:`sim.check.calibrate.Calibration`.

    Raises
    ------
    ArgumentError
        Names the field and the value: ``drives`` below 1, above :data:`sim.core.limits.MAX_DRIVES`, or not a
        whole number (a bool, a fraction or a string); ``calibration`` not None, a path naming a file, a mapping
        or a calibration (a path to no file, a number, a bool).
    """

    drives: int = 1
    hot: Any = None
    tail: Any = None
    calibration: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.drives, str):
            raise ArgumentError(f"Storage.drives must be a whole number >= 1, got {self.drives!r}")
        object.__setattr__(self, "drives", check_count(self.drives, "Storage.drives", high=MAX_DRIVES))
        _check_calibration(self.calibration, "Storage.calibration")


def _check_calibration(cal: Any, where: str) -> None:
    """Refuse a calibration that :func:`sim.device.load_device` cannot use: anything but None, a path naming a
    file, a mapping (the document) or an object with a ``device`` method (a ``Calibration``)."""
    if cal is None or isinstance(cal, Mapping) or callable(getattr(cal, "device", None)):
        return
    if isinstance(cal, (str, os.PathLike)):
        path = os.fspath(cal)
        if isinstance(path, str) and path and os.path.isfile(path):
            return
        raise ArgumentError(f"{where} = {str(cal)!r}: no such file (expected a calibration file written by "
                            "engram calibrate, its document, or a sim.check.calibrate.Calibration)")
    raise ArgumentError(f"{where} = {cal!r:.60}: expected None, a calibration file, its document (a mapping) or a "
                        "sim.check.calibrate.Calibration")
