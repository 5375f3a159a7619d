"""The simulator's parameters besides the trace and the device: the read policy and the compute (SPEC §8, §9).

:class:`Policy` says how a decode step reads its rows (threshold, backend,
readers, row cache, overlap); :class:`Compute` how long the rest of a step
takes.  The defaults a newcomer meets everywhere in ``sim`` -- 16 readers,
threshold 8, 43 layers -- are defined here once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from engram.errors import ArgumentError
from engram.table import DEFAULT_READERS, DEFAULT_THRESHOLD  # the engine's defaults (readers, threshold)

__all__ = ["BACKENDS", "COMPUTE_DISTS", "DEFAULT_LAYERS", "DEFAULT_READERS", "DEFAULT_RING_DEPTH",
           "DEFAULT_THRESHOLD", "Compute", "Policy"]

#: io_uring queue depth of the simulated ring when it is not tied to the readers.
DEFAULT_RING_DEPTH = 64
#: Decoder layers of DeepSeek V4 Flash (ds4: ``DS4_N_LAYER = 43``).
DEFAULT_LAYERS = 43
#: The engine's concurrent read backends.
BACKENDS = ("pread", "io_uring")
#: Parametric distributions of compute time (:class:`Compute` also resamples measured times: ``"empirical"``).
COMPUTE_DISTS = ("constant", "normal", "lognormal", "gamma", "exponential")


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
        (one submission, ``ring_depth`` reads in flight).
    readers : int
        pread pool size.
    ring_depth : int
        io_uring queue depth.
    cache_rows : int
        Per-session LRU row cache, rows (0: none, as the engine does).
    overlap_layers : int
        Layers of compute that run before the second table's rows are needed
        (0: every row is read before compute starts).
    batch_overhead : float
        Seconds added to every concurrent batch (waking the pool, submitting
        the ring); 0 by default.
    """

    threshold: int = DEFAULT_THRESHOLD
    backend: str = "pread"
    readers: int = DEFAULT_READERS
    ring_depth: int = DEFAULT_RING_DEPTH
    cache_rows: int = 0
    overlap_layers: int = 0
    batch_overhead: float = 0.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ArgumentError(f"Policy.backend must be 'pread' or 'io_uring', got {self.backend!r}")
        for name in ("threshold", "readers", "ring_depth"):
            if int(getattr(self, name)) < 1:
                raise ArgumentError(f"Policy.{name} must be >= 1, got {getattr(self, name)}")
        if self.cache_rows < 0 or self.overlap_layers < 0 or self.batch_overhead < 0:
            raise ArgumentError("Policy.cache_rows, overlap_layers and batch_overhead must be >= 0")

    @property
    def width(self) -> int:
        """Reads in flight for a concurrent batch: ``readers`` or ``ring_depth``."""
        return self.readers if self.backend == "pread" else self.ring_depth

    def concurrency(self, n: int) -> int:
        """Readers used for a batch of ``n`` distinct rows: 1 below ``threshold``, else ``min(n, width)``."""
        return 1 if n < self.threshold else min(n, self.width)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Compute:
    """Compute time of one decode step (or, for prefill, of one token through all layers).

    Attributes
    ----------
    mean : float
        Mean seconds.
    dist : str
        ``"constant"``, ``"normal"`` (clipped at 0), ``"lognormal"``, ``"gamma"``,
        ``"exponential"`` or ``"empirical"`` (resampling ``samples``).
    cv : float
        Coefficient of variation (normal, lognormal, gamma).
    samples : tuple of float
        Measured times (seconds) for ``"empirical"``.
    layers : int
        Decoder layers the time spreads over evenly (for overlap and prefill).
    """

    mean: float
    dist: str = "constant"
    cv: float = 0.0
    samples: tuple = ()
    layers: int = DEFAULT_LAYERS

    def __post_init__(self) -> None:
        if self.dist not in COMPUTE_DISTS + ("empirical",):
            raise ArgumentError(f"Compute.dist: unknown distribution {self.dist!r}")
        if not (self.mean >= 0 and math.isfinite(self.mean)) or self.cv < 0:
            raise ArgumentError(f"Compute: need mean >= 0 and cv >= 0, got {self.mean}, {self.cv}")
        if self.layers < 1:
            raise ArgumentError(f"Compute.layers must be >= 1, got {self.layers}")
        if self.dist == "empirical" and not self.samples:
            raise ArgumentError("Compute: 'empirical' needs samples")

    @classmethod
    def empirical(cls, samples: Sequence[float], layers: int = DEFAULT_LAYERS) -> "Compute":
        """Resample measured step times (seconds)."""
        s = tuple(float(x) for x in samples)
        if not s or min(s) < 0:
            raise ArgumentError("Compute.empirical: need measured times >= 0")
        return cls(float(np.mean(s)), "empirical", float(np.std(s) / max(np.mean(s), 1e-300)), s, layers)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """float64 ``[size]`` compute times, seconds (>= 0)."""
        m, cv = self.mean, self.cv
        if self.dist == "constant" or m == 0 or (cv == 0 and self.dist in ("normal", "lognormal", "gamma")):
            return np.full(size, m)
        if self.dist == "normal":
            return np.maximum(rng.normal(m, cv * m, size), 0.0)
        if self.dist == "lognormal":
            s2 = math.log1p(cv * cv)
            return rng.lognormal(math.log(m) - s2 / 2, math.sqrt(s2), size)
        if self.dist == "gamma":
            shape = 1 / (cv * cv)
            return rng.gamma(shape, m / shape, size)
        if self.dist == "exponential":
            return rng.exponential(m, size)
        return rng.choice(np.asarray(self.samples), size)

    def to_dict(self) -> dict:
        d = {"mean_ms": self.mean * 1e3, "dist": self.dist, "cv": self.cv, "layers": self.layers}
        if self.samples:
            d["samples"] = len(self.samples)
        return d
