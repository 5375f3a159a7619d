"""Device models: how long row reads take at each queue depth (SPEC §8, §9).

A device model answers one question for the simulator: when ``qd`` reads are
outstanding on the device, how long does one of them take?  The answer is a
distribution, :class:`LatencyDist` (seconds), for every queue depth.  It is the
same quantity a closed-loop microbenchmark measures (``qd`` threads each
issuing one random read after the other): latency percentiles, and by Little's
law the mean latency ``qd / IOPS``.

Kinds of device:

:class:`EmpiricalDevice`
    a table ``{queue depth: latency distribution}`` from measurements (samples,
    or a mean and percentiles); between measured depths the quantile functions
    are interpolated linearly in ``qd``, above the deepest one the device is taken
    as saturated (constant IOPS, latency growing with ``qd``).  Saved and loaded
    as JSON; also read from the JSONL microbenchmark format of
    ``../shared/data/devices/*.jsonl``.
:class:`ParametricSSD`
    an SSD described by its QD1 latency, IOPS ceiling and internal parallelism:
    ``parallelism`` channels each serving one read for ``s = parallelism / iops``
    seconds (fixed, exponential or gamma with a given coefficient of variation),
    behind a fixed pipelined latency ``d = qd1_latency - s``.

Presets (:func:`preset`) are labelled with their source:
``seed-apple-m3-ultra`` (SPEC §8 reference figures) and ``vm-virtio-16core-4k``
(read from the shared data directory at run time).

Two ways to simulate reads on a device, used by :mod:`sim.decode` and
:mod:`sim.prefill`:

- fast: a whole batch of ``n`` reads issued ``k`` at a time is one service
  event whose duration is drawn from :meth:`Device.batch_samples` (list
  scheduling of ``n`` latencies); batches of several clients stretch while
  they overlap, by the device's latency at their joint queue depth
  (:class:`FastDevice`);
- exact: every read is its own simpy event (:meth:`Device.exact`); kept to
  validate the fast mode and for the queueing checks (:func:`poisson_load`).
"""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from .io import load_json, read_jsonl, shared_data_dir, write_json


__all__ = [
    "Device",
    "EmpiricalDevice",
    "MeasuredBatchDevice",
    "LatencyDist",
    "ParametricSSD",
    "PoissonLoadResult",
    "Recorder",
    "load_device",
    "poisson_load",
    "preset",
    "preset_names",
    "summarize_boxes",
    "time_average",
]

US = 1e-6


# =====================================================================================
# latency distributions
# =====================================================================================
def _list_schedule(x: np.ndarray, k: int) -> np.ndarray:
    """Makespan of each row of ``x`` (``[size, n]`` latencies) on ``k`` readers taking reads in order."""
    size, n = x.shape
    if n <= k:
        return x.max(axis=1)
    finish = x[:, :k].copy()
    rows = np.arange(size)
    for j in range(k, n):
        i = finish.argmin(axis=1)
        finish[rows, i] += x[:, j]
    return finish.max(axis=1)


def _seg_second_moment(dist: "LatencyDist") -> np.ndarray:
    """Per segment of the piecewise-linear quantile function: mean of Q(u)^2 over the segment."""
    a, b = dist.q[:-1], dist.q[1:]
    return (a * a + a * b + b * b) / 3


class LatencyDist:
    """Distribution of one read's latency in seconds, as a piecewise-linear quantile function.

    Parameters
    ----------
    u : array_like of float
        Probabilities, increasing, from 0 to 1 (``[K]``, ``K >= 2``).
    q : array_like of float
        Latency (seconds) at each probability, non-decreasing, ``>= 0`` (``[K]``).
    source : str
        Where the figures come from.

    Raises
    ------
    ArgumentError
        Knots that are not increasing, not covering [0, 1], or negative.
    """

    __slots__ = ("u", "q", "source", "_mean")

    def __init__(self, u, q, source: str = ""):
        u = np.asarray(u, dtype=np.float64)
        q = np.asarray(q, dtype=np.float64)
        if u.ndim != 1 or u.shape != q.shape or u.size < 2:
            raise ArgumentError(f"LatencyDist: u and q must be 1-D of equal length >= 2, got {u.shape} {q.shape}")
        if abs(u[0]) > 1e-12 or abs(u[-1] - 1) > 1e-12 or np.any(np.diff(u) <= 0):
            raise ArgumentError("LatencyDist: probabilities must increase strictly from 0 to 1")
        if not np.all(np.isfinite(q)) or q[0] < 0 or np.any(np.diff(q) < -1e-15):
            raise ArgumentError(f"LatencyDist: latencies must be finite, >= 0 and non-decreasing, got {q[:6]}")
        self.u, self.q, self.source = u, np.maximum.accumulate(q), source
        self._mean = float(np.sum(np.diff(self.u) * (self.q[1:] + self.q[:-1]) / 2))

    # ------------------------------------------------------------ constructors
    @classmethod
    def point(cls, seconds: float, source: str = "") -> "LatencyDist":
        """Every read takes exactly ``seconds``."""
        return cls([0.0, 1.0], [seconds, seconds], source)

    @classmethod
    def from_samples(cls, samples, knots: int = 257, source: str = "") -> "LatencyDist":
        """From measured latencies (seconds): the empirical quantiles at ``knots`` evenly spaced probabilities."""
        x = np.asarray(samples, dtype=np.float64).reshape(-1)
        if x.size == 0 or not np.all(np.isfinite(x)) or x.min() < 0:
            raise ArgumentError("LatencyDist.from_samples: need finite latencies >= 0")
        if x.size == 1 or x.min() == x.max():
            return cls.point(float(x[0]), source)
        u = np.linspace(0.0, 1.0, max(2, min(knots, x.size)))
        return cls(u, np.quantile(x, u), source)

    @classmethod
    def from_percentiles(cls, percentiles: Mapping[float, float], mean: Optional[float] = None,
                         source: str = "") -> "LatencyDist":
        """From latency percentiles (``{50: p50_s, 95: p95_s, 99: p99_s}``) and optionally the mean.

        The quantile function passes through the given percentiles; its ends
        (the 0th and 100th percentile) are extrapolated linearly from the two
        nearest points, then the lower end (or, when that would leave
        ``[0, lowest percentile]``, the upper end) is moved so the mean of the
        distribution equals ``mean``.  With a single percentile and no mean the
        distribution is a point.

        Raises
        ------
        ArgumentError
            Percentiles outside (0, 100), or decreasing latencies (names them).
        """
        items = sorted((float(p), float(v)) for p, v in percentiles.items())
        if not items:
            raise ArgumentError("LatencyDist.from_percentiles: no percentiles given")
        for p, v in items:
            if not 0 < p < 100:
                raise ArgumentError(f"LatencyDist.from_percentiles: percentile {p} outside (0, 100)")
            if not math.isfinite(v) or v < 0:
                raise ArgumentError(f"LatencyDist.from_percentiles: p{p:g} = {v} is not a latency >= 0")
        for (p0, v0), (p1, v1) in zip(items, items[1:]):
            if v1 < v0:
                raise ArgumentError(f"LatencyDist.from_percentiles: p{p1:g} = {v1} is below p{p0:g} = {v0}")
        u_in = [p / 100 for p, _ in items]
        v_in = [v for _, v in items]
        if len(items) == 1:
            lo = hi = v_in[0]
        else:
            slope_lo = (v_in[1] - v_in[0]) / (u_in[1] - u_in[0])
            slope_hi = (v_in[-1] - v_in[-2]) / (u_in[-1] - u_in[-2])
            lo = max(0.0, v_in[0] - slope_lo * u_in[0])
            hi = v_in[-1] + slope_hi * (1 - u_in[-1])
        u = np.array([0.0] + u_in + [1.0])
        q = np.array([lo] + v_in + [hi])
        if mean is not None and mean > 0:
            w = np.diff(u)
            mid = np.sum(w * (q[1:] + q[:-1]) / 2)
            # Solve for q[0] (weight w[0]/2) keeping q[-1]; fall back to q[-1].
            a = q[0] + (mean - mid) / (w[0] / 2)
            if 0 <= a <= q[1]:
                q[0] = a
            else:
                q[0] = min(max(a, 0.0), q[1])
                mid = np.sum(w * (q[1:] + q[:-1]) / 2)
                q[-1] = max(q[-2], q[-1] + (mean - mid) / (w[-1] / 2))
        return cls(u, q, source)

    # --------------------------------------------------------------- queries
    @property
    def mean(self) -> float:
        """Mean latency, seconds."""
        return self._mean

    @property
    def is_point(self) -> bool:
        """True when every read takes the same time."""
        return bool(self.q[0] == self.q[-1])

    def quantile(self, p) -> np.ndarray:
        """Latency (seconds) at probability ``p`` in [0, 1] (array or scalar)."""
        return np.interp(p, self.u, self.q)

    def percentile(self, p: float) -> float:
        """Latency (seconds) at percentile ``p`` in [0, 100]."""
        return float(self.quantile(p / 100))

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        """float64 latencies (seconds) of shape ``size``, by inverse transform sampling."""
        if self.is_point:
            return np.full(size, self.q[0])
        return np.interp(rng.random(size), self.u, self.q)

    def scaled(self, factor: float) -> "LatencyDist":
        """The distribution of ``factor * latency``."""
        return LatencyDist(self.u, self.q * factor, self.source)

    def mix(self, other: "LatencyDist", w: float) -> "LatencyDist":
        """Quantile interpolation ``(1 - w) * Q_self(u) + w * Q_other(u)``."""
        u = np.union1d(self.u, other.u)
        return LatencyDist(u, (1 - w) * self.quantile(u) + w * other.quantile(u), self.source)

    def to_dict(self) -> dict:
        """JSON-ready: ``{"u": [...], "q_us": [...]}`` (latencies in microseconds)."""
        d = {"u": [round(float(x), 9) for x in self.u], "q_us": [float(x) / US for x in self.q],
             "mean_us": self.mean / US}
        if self.source:
            d["source"] = self.source
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "LatencyDist":
        """Inverse of :meth:`to_dict`; also accepts ``{"samples_us": [...]}`` or
        ``{"mean_us": m, "p50_us": ..., "p99_us": ...}``.

        Raises
        ------
        FormatError
            None of the accepted forms (names the keys found).
        """
        try:
            src = str(d.get("source", ""))
            if "u" in d and "q_us" in d:
                return cls(d["u"], np.asarray(d["q_us"], dtype=np.float64) * US, src)
            if "samples_us" in d:
                return cls.from_samples(np.asarray(d["samples_us"], dtype=np.float64) * US, source=src)
            pct = {float(k[1:-3]): float(v) * US for k, v in d.items()
                   if k.startswith("p") and k.endswith("_us") and _is_number(k[1:-3])}
            mean = d.get("mean_us")
            if pct:
                return cls.from_percentiles(pct, None if mean is None else float(mean) * US, src)
            if mean is not None:
                return cls.point(float(mean) * US, src)
        except ArgumentError as exc:
            raise FormatError(f"latency distribution: {exc}") from None
        raise FormatError(f"latency distribution: need u/q_us, samples_us or pNN_us keys, got {sorted(d)}")

    def __repr__(self) -> str:
        return (f"LatencyDist(mean={self.mean / US:.2f} us, p50={self.percentile(50) / US:.2f} us, "
                f"p99={self.percentile(99) / US:.2f} us)")


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# =====================================================================================
# recorder of device activity
# =====================================================================================
class Recorder:
    """Boxes of device activity: ``[start, end)`` with a level (reads in flight).

    The fast mode records one box per batch (level = summed read latency /
    batch time, so the integral is exact); the exact mode one box per read
    (level 1).  :func:`summarize_boxes` turns them into utilisation, mean
    queue depth and a time series.
    """

    def __init__(self) -> None:
        self.start: list = []
        self.end: list = []
        self.level: list = []
        self.reads = 0
        self.latency_sum = 0.0
        self.wait: list = []
        #: (time, reads in the device) after each change, kept by the exact models.
        self.counter: list = []

    def box(self, start: float, end: float, level: float, reads: int, latency_sum: float) -> None:
        self.start.append(start)
        self.end.append(end)
        self.level.append(level)
        self.reads += reads
        self.latency_sum += latency_sum

    def arrays(self):
        return (np.asarray(self.start, dtype=np.float64), np.asarray(self.end, dtype=np.float64),
                np.asarray(self.level, dtype=np.float64))


def time_average(counter: Sequence, t_end: float, t_start: float = 0.0) -> float:
    """Time average over ``[t_start, t_end]`` of a step function given as ``[(time, value), ...]``
    (value holds from its time to the next; 0 before the first)."""
    if t_end <= t_start:
        return 0.0
    if not counter:
        return 0.0
    arr = np.asarray(counter, dtype=np.float64)
    t = np.clip(np.concatenate([arr[:, 0], [t_end]]), t_start, t_end)
    return float(np.sum(np.diff(t) * arr[:, 1]) / (t_end - t_start))


def summarize_boxes(start: np.ndarray, end: np.ndarray, level: np.ndarray, t_end: float,
                    bins: int = 100) -> dict:
    """Device utilisation from activity boxes over ``[0, t_end]``.

    Returns a dict: ``busy_fraction`` (share of time with any read in flight),
    ``mean_queue_depth`` (time average of reads in flight), ``max_queue_depth``,
    and ``timeline`` with ``t_s`` (bin centres), ``queue_depth`` and ``busy``
    (per-bin means), ``bins`` bins.
    """
    if t_end <= 0 or start.size == 0:
        z = [0.0] * bins
        edges = np.linspace(0, max(t_end, 0.0), bins + 1)
        return {"busy_fraction": 0.0, "mean_queue_depth": 0.0, "max_queue_depth": 0.0,
                "timeline": {"t_s": ((edges[1:] + edges[:-1]) / 2).tolist(), "queue_depth": z, "busy": z}}
    keep = end > start
    s, e, lv = start[keep], end[keep], level[keep]
    t = np.concatenate([s, e])
    dl = np.concatenate([lv, -lv])
    dc = np.concatenate([np.ones(s.size), -np.ones(s.size)])
    # At equal times ends go first, so a read handing its slot to the next is not counted twice.
    order = np.lexsort((np.concatenate([np.ones(s.size), np.zeros(s.size)]), t))
    t, dl, dc = t[order], dl[order], dc[order]
    lvl = np.cumsum(dl)
    cnt = np.cumsum(dc)
    # The step functions hold lvl[i] (reads in flight) and cnt[i] > 0 (busy) on [t[i], t[i+1]).
    dt = np.diff(t)
    seg_q = lvl[:-1]
    seg_b = (cnt[:-1] > 0.5).astype(np.float64)
    cum_q = np.concatenate([[0.0], np.cumsum(seg_q * dt)])
    cum_b = np.concatenate([[0.0], np.cumsum(seg_b * dt)])
    edges = np.linspace(0.0, t_end, bins + 1)

    def integral(cum, seg, x):
        """Integral of the step function from 0 to each x."""
        i = np.searchsorted(t, x, side="right") - 1
        inside = (i >= 0) & (i < seg.size)
        j = np.clip(i, 0, seg.size - 1) if seg.size else np.zeros_like(i)
        partial = cum[np.clip(i, 0, cum.size - 1)] + np.where(inside, seg[j] * (x - t[np.clip(i, 0, t.size - 1)]), 0)
        return np.where(i < 0, 0.0, partial)

    iq, ib = integral(cum_q, seg_q, edges), integral(cum_b, seg_b, edges)
    w = np.diff(edges)
    return {
        "busy_fraction": float(ib[-1] / t_end),
        "mean_queue_depth": float(iq[-1] / t_end),
        "max_queue_depth": float(lvl.max()),
        "timeline": {"t_s": ((edges[1:] + edges[:-1]) / 2).tolist(),
                     "queue_depth": (np.diff(iq) / w).tolist(), "busy": (np.diff(ib) / w).tolist()},
    }


# =====================================================================================
# device base
# =====================================================================================
class Device:
    """A device model: the latency of one read at each queue depth, and batch service times.

    Subclasses implement :meth:`latency` and :meth:`to_dict`; the exact per-read
    model defaults to "each read's latency is drawn at the queue depth in force
    when it is issued" and is overridden by devices with an internal queue.

    Attributes
    ----------
    name : str
    source : str
        Where the figures come from (a measurement, a document, parameters).
    """

    name: str = "device"
    source: str = ""
    #: Batches up to this many reads are always simulated read by read (see :meth:`batch_samples`).
    EXACT_BATCH_LIMIT = 256

    # ---------------------------------------------------------------- model
    def latency(self, qd: int) -> LatencyDist:
        """Latency distribution of one read when ``qd >= 1`` reads are outstanding."""
        raise NotImplementedError

    def mean_latency(self, qd: int) -> float:
        """Mean latency (seconds) at queue depth ``qd``."""
        return self.latency(qd).mean

    def iops(self, qd: int) -> float:
        """Reads per second at queue depth ``qd`` (Little's law: ``qd / mean latency``)."""
        return qd / self.mean_latency(qd)

    def peak_iops(self) -> float:
        """Highest IOPS over the queue depths the model describes."""
        return max(self.iops(q) for q in self.depths())

    def depths(self) -> list:
        """Queue depths the model is defined from (measured or characterised)."""
        return [1, 2, 4, 8, 16, 32, 64]

    def batch_samples(self, n: int, k: int, qd: Optional[int] = None, size: int = 2048,
                      rng: Optional[np.random.Generator] = None):
        """Service times of a batch of ``n`` reads issued ``k`` at a time.

        ``k`` readers each take the next read as soon as their previous one
        completes (list scheduling); every latency is drawn at queue depth
        ``qd`` (default ``min(n, k)``: the batch alone on the device).

        Returns
        -------
        (times, areas) : tuple of numpy.ndarray
            float64 ``[size]`` (or ``[1]`` for a point distribution): the batch's
            duration and the sum of its ``n`` read latencies (seconds).  Up to
            ``END_WAVES * k`` reads (or :attr:`EXACT_BATCH_LIMIT`) the list
            schedule is simulated read by read; longer batches take the sum of
            latencies from its normal approximation plus the end effect
            (makespan minus sum / k) simulated once for ``END_WAVES * k`` reads.
        """
        if n < 1 or k < 1:
            raise ArgumentError(f"batch_samples: need n >= 1 reads and k >= 1 readers, got n={n}, k={k}")
        k = min(k, n)
        qd = k if qd is None else max(1, int(qd))
        dist = self.latency(qd)
        rng = rng if rng is not None else np.random.default_rng(0)
        if dist.is_point:
            v = float(dist.q[0])
            return np.array([math.ceil(n / k) * v]), np.array([n * v])
        if n > max(self.EXACT_BATCH_LIMIT, self.END_WAVES * k):
            end = self._end_effect(dist, k, size, rng)
            mu = dist.mean
            sd = math.sqrt(max(float(np.sum(np.diff(dist.u) * _seg_second_moment(dist))) - mu * mu, 0.0))
            areas = np.maximum(rng.normal(n * mu, math.sqrt(n) * sd, size), 0.0)
            return areas / k + end, areas
        x = dist.sample(rng, (size, n))
        return _list_schedule(x, k), x.sum(axis=1)

    #: Batches longer than this many waves use the end-effect approximation.
    END_WAVES = 16

    def _end_effect(self, dist: "LatencyDist", k: int, size: int, rng: np.random.Generator) -> np.ndarray:
        x = dist.sample(rng, (size, self.END_WAVES * k))
        return _list_schedule(x, k) - x.sum(axis=1) / k

    # ------------------------------------------------------------ simulation
    def exact(self, env, rng: np.random.Generator, recorder: Optional[Recorder] = None) -> "ExactDevice":
        """The per-read simpy model of this device in ``env``."""
        return ExactDevice(self, env, rng, recorder)

    def fast(self, rng: np.random.Generator, recorder: Optional[Recorder] = None,
             samples: int = 2048, env=None) -> "FastDevice":
        """The batch-as-one-event model of this device (``env`` needed for shared use)."""
        return FastDevice(self, rng, recorder, samples, env)

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        raise NotImplementedError

    def save(self, path: Union[str, os.PathLike]) -> Path:
        """Write :meth:`to_dict` as JSON."""
        return write_json(path, self.to_dict())

    @staticmethod
    def from_dict(d: Mapping) -> "Device":
        """Rebuild a device from :meth:`to_dict` output.

        Raises
        ------
        FormatError
            Unknown ``kind`` or missing fields (names them).
        """
        kind = d.get("kind")
        if kind == "empirical":
            return EmpiricalDevice.from_dict(d)
        if kind == "measured_batch":
            return MeasuredBatchDevice.from_dict(d)
        if kind == "parametric_ssd":
            try:
                return ParametricSSD(float(d["qd1_latency_us"]) * US, float(d["iops"]), int(d["parallelism"]),
                                     float(d.get("service_cv", 0.5)), name=d.get("name"),
                                     source=d.get("source", ""))
            except KeyError as exc:
                raise FormatError(f"parametric_ssd device: missing field {exc}") from None
        raise FormatError(f"device: unknown kind {kind!r} (expected 'empirical', 'measured_batch' or 'parametric_ssd')")

    def table(self, depths: Optional[Sequence[int]] = None) -> list:
        """Rows ``{qd, mean_us, p50_us, p99_us, iops}`` for display."""
        out = []
        for q in depths or self.depths():
            d = self.latency(q)
            out.append({"qd": int(q), "mean_us": d.mean / US, "p50_us": d.percentile(50) / US,
                        "p99_us": d.percentile(99) / US, "iops": q / d.mean})
        return out

    def describe(self) -> dict:
        return {"name": self.name, "kind": type(self).__name__, "source": self.source,
                "peak_iops": self.peak_iops(), "table": self.table()}


# =====================================================================================
# empirical device
# =====================================================================================
class EmpiricalDevice(Device):
    """A device measured at some queue depths: ``{qd: LatencyDist}``.

    Parameters
    ----------
    table : mapping int -> LatencyDist
        Latency distribution of one read at each measured queue depth (>= 1).
    name, source : str
        Label and provenance of the measurements.

    Between measured depths the quantile functions are mixed with weight
    linear in ``qd`` (exact for the mean of a saturated device, where latency
    is ``qd / IOPS``); below the shallowest the shallowest is used; above the
    deepest (``Q``) the device is saturated: latency ``L_Q * qd / Q``.

    Raises
    ------
    ArgumentError
        An empty table or a queue depth below 1.
    """

    def __init__(self, table: Mapping[int, LatencyDist], name: str = "empirical", source: str = ""):
        if not table:
            raise ArgumentError("EmpiricalDevice: empty table")
        items = sorted((int(q), d) for q, d in table.items())
        for q, d in items:
            if q < 1:
                raise ArgumentError(f"EmpiricalDevice: queue depth {q} < 1")
            if not isinstance(d, LatencyDist):
                raise ArgumentError(f"EmpiricalDevice: entry for qd {q} is {type(d).__name__}, not LatencyDist")
        self.measured = dict(items)
        self._qs = [q for q, _ in items]
        self.name, self.source = name, source
        self._cache: dict = {}

    def depths(self) -> list:
        return list(self._qs)

    def latency(self, qd: int) -> LatencyDist:
        qd = int(qd)
        if qd < 1:
            raise ArgumentError(f"latency: queue depth must be >= 1, got {qd}")
        got = self._cache.get(qd)
        if got is not None:
            return got
        qs = self._qs
        if qd in self.measured:
            d = self.measured[qd]
        elif qd < qs[0]:
            d = self.measured[qs[0]]
        elif qd > qs[-1]:
            d = self.measured[qs[-1]].scaled(qd / qs[-1])
        else:
            i = int(np.searchsorted(qs, qd))
            q0, q1 = qs[i - 1], qs[i]
            d = self.measured[q0].mix(self.measured[q1], (qd - q0) / (q1 - q0))
        self._cache[qd] = d
        return d

    # ------------------------------------------------------------ builders
    @classmethod
    def from_table(cls, table: Mapping[int, object], name: str = "empirical", source: str = "") -> "EmpiricalDevice":
        """From ``{qd: value}`` where value is a :class:`LatencyDist`, an array of latency samples
        (seconds), or a dict accepted by :meth:`LatencyDist.from_dict` (microseconds:
        ``{"mean_us", "p50_us", "p99_us", ...}`` or ``{"samples_us": [...]}``)."""
        out = {}
        for q, v in table.items():
            if isinstance(v, LatencyDist):
                out[int(q)] = v
            elif isinstance(v, Mapping):
                out[int(q)] = LatencyDist.from_dict(v)
            else:
                out[int(q)] = LatencyDist.from_samples(v)
        return cls(out, name, source)

    @classmethod
    def from_measurements(cls, records: Sequence[Mapping], name: str = "measured", source: str = "") -> "EmpiricalDevice":
        """From microbenchmark records, one per queue depth.

        Each record has ``qd`` and any of: ``iops`` or ``rows_per_s`` (mean
        latency = ``qd / iops``), ``mean_us``, percentiles ``pNN_us``,
        ``samples_us``.  This is the format of ``../shared/data/devices/*.jsonl``
        and of the engine's microbenchmarks.

        Raises
        ------
        FormatError
            A record without ``qd`` or without any latency figure (names the record).
        """
        table = {}
        for i, r in enumerate(records):
            if "qd" not in r:
                raise FormatError(f"{name}: record {i} has no 'qd'")
            q = int(r["qd"])
            d = {k: v for k, v in r.items() if k.startswith("p") and k.endswith("_us")}
            rate = r.get("iops", r.get("rows_per_s"))
            if "mean_us" in r:
                d["mean_us"] = r["mean_us"]
            elif rate:
                d["mean_us"] = q / float(rate) / US
            if "samples_us" in r:
                d = {"samples_us": r["samples_us"]}
            if not d:
                raise FormatError(f"{name}: record {i} (qd {q}) has no latency figure")
            try:
                table[q] = LatencyDist.from_dict(d)
            except FormatError as exc:
                raise FormatError(f"{name}: record {i} (qd {q}): {exc}") from None
        if not table:
            raise FormatError(f"{name}: no records")
        return cls(table, name, source)

    @classmethod
    def from_jsonl(cls, path: Union[str, os.PathLike], name: Optional[str] = None,
                   source: Optional[str] = None) -> "EmpiricalDevice":
        """Read a JSONL microbenchmark file (``{"qd", "iops", "p50_us", "p95_us", "p99_us", ...}`` a line).

        Raises
        ------
        FormatError
            Unreadable file or a bad line (names the line).
        """
        path = Path(path)
        recs = [obj for _, obj in read_jsonl(path, "device file")]
        return cls.from_measurements(recs, name or path.stem,
                                     source or f"measured microbenchmark, {path.name} (mean latency = qd / iops)")

    def to_dict(self) -> dict:
        return {"kind": "empirical", "name": self.name, "source": self.source,
                "table": {str(q): d.to_dict() for q, d in self.measured.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "EmpiricalDevice":
        if "table" not in d or not isinstance(d["table"], Mapping):
            raise FormatError("empirical device: missing 'table'")
        try:
            table = {int(q): LatencyDist.from_dict(v) for q, v in d["table"].items()}
        except ValueError as exc:
            raise FormatError(f"empirical device: bad queue depth ({exc})") from None
        try:
            return cls(table, str(d.get("name", "empirical")), str(d.get("source", "")))
        except ArgumentError as exc:
            raise FormatError(f"empirical device: {exc}") from None

    def __repr__(self) -> str:
        return f"EmpiricalDevice({self.name!r}, depths={self._qs})"


# =====================================================================================
# measured batches
# =====================================================================================
class MeasuredBatchDevice(EmpiricalDevice):
    """An :class:`EmpiricalDevice` plus the measured service time of whole batches.

    Built from a reader's own microbenchmark (:mod:`sim.calibrate`): the time
    of a batch of ``n`` reads issued by ``k`` readers, measured as one
    distribution per ``(n, k)``.  A short burst of reads need not behave like
    ``n`` independent draws of the steady-state latency at depth ``k``: slow
    periods of a shared device hit all reads in flight together, and a burst
    can run faster than the sustained rate.  The measured batch time holds
    both, and everything the reader does per batch (waking threads,
    submitting a ring, sorting, decoding).

    :meth:`batch_samples` draws from the measured batch of the nearest size
    ``n0`` at ``k`` readers (quantile functions mixed linearly in ``k``
    between measured reader counts; the nearest count outside them), times
    ``ceil(n / k) / ceil(n0 / k)`` (waves of reads) when ``n != n0``.  A batch
    asked at a deeper queue than its own readers (other clients in flight)
    and the per-read (exact) model use the per-read table.

    Parameters
    ----------
    table : mapping int -> LatencyDist
        Latency of one read by queue depth (as :class:`EmpiricalDevice`).
    batches : mapping (int, int) -> LatencyDist
        ``(n, k)`` -> duration (seconds) of a batch of ``n`` reads on ``k`` readers.
    name, source : str

    Raises
    ------
    ArgumentError
        An empty table or batch table, or ``n``/``k`` below 1.
    """

    def __init__(self, table: Mapping[int, LatencyDist], batches: Mapping[tuple, LatencyDist],
                 name: str = "measured-batch", source: str = ""):
        super().__init__(table, name, source)
        if not batches:
            raise ArgumentError("MeasuredBatchDevice: empty batch table")
        self.batches = {}
        for key, d in sorted(batches.items()):
            n, k = int(key[0]), int(key[1])
            if n < 1 or k < 1:
                raise ArgumentError(f"MeasuredBatchDevice: batch ({n}, {k}) needs n >= 1 reads and k >= 1 readers")
            if not isinstance(d, LatencyDist):
                raise ArgumentError(f"MeasuredBatchDevice: batch ({n}, {k}) is {type(d).__name__}, not LatencyDist")
            self.batches[(n, k)] = d
        self._bcache: dict = {}

    def batch_dist(self, n: int, k: int) -> LatencyDist:
        """Distribution of the duration of ``n`` reads on ``k`` readers, alone on the device."""
        key = (int(n), int(k))
        got = self._bcache.get(key)
        if got is not None:
            return got
        n, k = key
        sizes = sorted({b for b, _ in self.batches})
        n0 = min(sizes, key=lambda b: (abs(b - n), b))
        ks = sorted(r for b, r in self.batches if b == n0)
        if k <= ks[0]:
            d, kk = self.batches[(n0, ks[0])], ks[0]
        elif k >= ks[-1]:
            d, kk = self.batches[(n0, ks[-1])], ks[-1]
        else:
            i = int(np.searchsorted(ks, k))
            k0, k1 = ks[i - 1], ks[i]
            d = self.batches[(n0, k0)] if k == k0 else \
                self.batches[(n0, k0)].mix(self.batches[(n0, k1)], (k - k0) / (k1 - k0))
            kk = k
        if n != n0:
            d = d.scaled(math.ceil(n / kk) / math.ceil(n0 / kk))
        self._bcache[key] = d
        return d

    def batch_samples(self, n: int, k: int, qd: Optional[int] = None, size: int = 2048,
                      rng: Optional[np.random.Generator] = None):
        """Service times of a batch of ``n`` reads on ``k`` readers: the measured batch (see the class).

        Returns ``(times, areas)`` as :meth:`Device.batch_samples`; the area
        (summed read latency) is taken as ``min(n, k)`` readers busy for the
        whole batch.  With ``qd`` deeper than ``min(n, k)`` the per-read model
        is used.
        """
        if n < 1 or k < 1:
            raise ArgumentError(f"batch_samples: need n >= 1 reads and k >= 1 readers, got n={n}, k={k}")
        kk = min(k, n)
        if qd is not None and int(qd) > kk:
            return super().batch_samples(n, k, qd, size, rng)
        d = self.batch_dist(n, k)
        rng = rng if rng is not None else np.random.default_rng(0)
        t = np.array([float(d.q[0])]) if d.is_point else d.sample(rng, size)
        return t, t * kk

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["kind"] = "measured_batch"
        d["batches"] = [{"n": n, "k": k, "dist": b.to_dict()} for (n, k), b in self.batches.items()]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "MeasuredBatchDevice":
        base = EmpiricalDevice.from_dict(d)
        try:
            batches = {(int(b["n"]), int(b["k"])): LatencyDist.from_dict(b["dist"]) for b in d["batches"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"measured_batch device: bad 'batches' ({exc})") from None
        try:
            return cls(base.measured, batches, base.name, base.source)
        except ArgumentError as exc:
            raise FormatError(f"measured_batch device: {exc}") from None

    def __repr__(self) -> str:
        return f"MeasuredBatchDevice({self.name!r}, depths={self._qs}, batches={sorted(self.batches)})"


# =====================================================================================
# parametric SSD
# =====================================================================================
class ParametricSSD(Device):
    """An SSD from three figures: QD1 latency, IOPS ceiling, internal parallelism.

    ``parallelism`` channels each serve one read at a time for ``s =
    parallelism / iops`` seconds on average (gamma distributed with
    coefficient of variation ``service_cv``: 0 fixed, 1 exponential; the
    default 0.5 is an assumption, not a measurement); every
    read also spends a fixed, pipelined ``d = qd1_latency - s`` seconds
    (controller, bus, system call).  Reads wait for a free channel in FIFO
    order.  With ``d = 0`` and ``service_cv = 1`` this is the M/M/c queue.

    :meth:`latency` characterises the model the way a microbenchmark would: a
    closed loop of ``qd`` readers, simulated once per depth (1 to 4 and powers
    of two; depths between are interpolated like a measured table) and cached.

    Raises
    ------
    ArgumentError
        Non-positive figures, or ``qd1_latency < parallelism / iops`` (the
        ceiling cannot be reached with that QD1 latency).
    """

    def __init__(self, qd1_latency: float, iops: float, parallelism: int, service_cv: float = 0.5,
                 name: Optional[str] = None, source: str = "", characterize_reads: int = 20000):
        if not (qd1_latency > 0 and iops > 0 and parallelism >= 1 and service_cv >= 0):
            raise ArgumentError(f"ParametricSSD: need qd1_latency > 0, iops > 0, parallelism >= 1, "
                                f"service_cv >= 0; got {qd1_latency}, {iops}, {parallelism}, {service_cv}")
        s = parallelism / iops
        if qd1_latency < s * (1 - 1e-9):
            raise ArgumentError(f"ParametricSSD: qd1_latency {qd1_latency / US:.3f} us is below the channel "
                                f"service time parallelism/iops = {s / US:.3f} us")
        self.qd1_latency, self.iops_max, self.parallelism = float(qd1_latency), float(iops), int(parallelism)
        self.service_cv = float(service_cv)
        self.service = s
        self.delay = max(0.0, qd1_latency - s)
        self.name = name or (f"ssd-qd1-{qd1_latency / US:g}us-{iops:g}iops-p{parallelism}")
        self.source = source or "parametric model (QD1 latency, IOPS ceiling, internal parallelism)"
        self.characterize_reads = int(characterize_reads)
        self._cache: dict = {}

    def sample_service(self, rng: np.random.Generator, size) -> np.ndarray:
        """Channel service times (seconds), mean ``parallelism / iops``."""
        cv = self.service_cv
        if cv == 0:
            return np.full(size, self.service)
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, self.service / shape, size)

    def depths(self) -> list:
        out, q = [], 1
        while q < 4 * self.parallelism or q <= 64:
            out.append(q)
            q *= 2
        return out

    def peak_iops(self) -> float:
        return self.iops_max

    def latency(self, qd: int) -> LatencyDist:
        qd = int(qd)
        if qd < 1:
            raise ArgumentError(f"latency: queue depth must be >= 1, got {qd}")
        got = self._cache.get(qd)
        if got is None:
            if self.service_cv == 0 and qd <= self.parallelism:
                got = LatencyDist.point(self.delay + self.service, self.source)
            elif qd & (qd - 1) == 0 or qd <= 4:
                got = LatencyDist.from_samples(self.closed_loop(qd), knots=513, source=self.source)
            else:  # between powers of two: quantile mixing linear in qd, like a measured table
                q0 = 1 << (qd.bit_length() - 1)
                got = self.latency(q0).mix(self.latency(2 * q0), (qd - q0) / q0)
            self._cache[qd] = got
        return got

    def closed_loop(self, qd: int, reads: Optional[int] = None, seed: int = 12345) -> np.ndarray:
        """Latencies (seconds) of a closed loop of ``qd`` readers on this device, after warm-up.

        An event loop of its own (no simpy): reads leave the fixed delay stage
        and join a FIFO queue of ``parallelism`` channels.
        """
        reads = reads or max(self.characterize_reads, 200 * qd)
        warm = max(reads // 10, 10 * qd)
        rng = np.random.default_rng(seed + qd)
        svc = self.sample_service(rng, reads + warm + qd).tolist()
        si = 0
        d, P = self.delay, self.parallelism
        events = [(d, i, 0.0) for i in range(qd)]  # (time leaving the delay stage, id, issue time)
        heapq.heapify(events)
        free_at = [0.0] * P  # min-heap of channel free times
        out = []
        # FIFO in order of arrival at the channel queue = order of delay exit (heap order).
        while len(out) < reads + warm:
            t_arr, rid, t_issue = heapq.heappop(events)
            t_free = heapq.heappop(free_at)
            t_start = t_arr if t_arr > t_free else t_free
            t_done = t_start + svc[si]
            si += 1
            heapq.heappush(free_at, t_done)
            out.append(t_done - t_issue)
            heapq.heappush(events, (t_done + d, rid, t_done))
        return np.asarray(out[warm:])

    def exact(self, env, rng: np.random.Generator, recorder: Optional[Recorder] = None) -> "ExactDevice":
        return ChannelExactDevice(self, env, rng, recorder)

    def to_dict(self) -> dict:
        return {"kind": "parametric_ssd", "name": self.name, "source": self.source,
                "qd1_latency_us": self.qd1_latency / US, "iops": self.iops_max,
                "parallelism": self.parallelism, "service_cv": self.service_cv}

    @classmethod
    def from_spec(cls, spec: str) -> "ParametricSSD":
        """From ``"ssd:qd1_us=80,iops=500000,parallelism=32[,cv=0.5]"``.

        Raises
        ------
        ArgumentError
            Unknown or missing keys (names them).
        """
        body = spec.split(":", 1)[1] if ":" in spec else spec
        kv = {}
        for part in filter(None, body.split(",")):
            k, _, v = part.partition("=")
            try:
                kv[k.strip()] = float(v)
            except ValueError:
                raise ArgumentError(f"device spec {spec!r}: {k}={v!r} is not a number") from None
        unknown = set(kv) - {"qd1_us", "iops", "parallelism", "cv"}
        if unknown:
            raise ArgumentError(f"device spec {spec!r}: unknown key {sorted(unknown)[0]!r} "
                                "(use qd1_us, iops, parallelism, cv)")
        missing = {"qd1_us", "iops", "parallelism"} - set(kv)
        if missing:
            raise ArgumentError(f"device spec {spec!r}: missing {sorted(missing)[0]!r}")
        return cls(kv["qd1_us"] * US, kv["iops"], int(kv["parallelism"]), kv.get("cv", 0.5))

    def __repr__(self) -> str:
        return (f"ParametricSSD(qd1={self.qd1_latency / US:g} us, iops={self.iops_max:g}, "
                f"parallelism={self.parallelism}, cv={self.service_cv:g})")


# =====================================================================================
# simulation models of a device
# =====================================================================================
class _Batch:
    __slots__ = ("n", "k", "keff", "alone", "area", "left", "rate", "start", "event")


class FastDevice:
    """Batches as single service events (the fast mode).

    A batch of ``n`` reads issued ``k`` at a time first gets its duration
    alone on the device, ``T``, drawn from :meth:`Device.batch_samples` at
    queue depth ``k`` (cached per ``(n, k)``), with ``A`` the sum of its read
    latencies; ``A / T`` is the number of reads it keeps in flight on average.

    - :meth:`issue` (one client, nothing else on the device): the batch takes ``T``.
    - :meth:`submit` (several clients): a fluid model of contention.  All
      reads see one queue depth, ``Q`` = the active batches' average reads in
      flight (``sum A / T``); a batch's remaining work drains at the rate
      ``L(k) / L(max(k, Q))`` (``L`` the mean latency at a depth, linear between
      integers), so together the batches complete ``Q / L(Q)`` reads a second
      as Little's law on the device says.  Every start and end re-plans the
      next completion.  Alone, a batch takes exactly ``T``.
    """

    def __init__(self, device: Device, rng: np.random.Generator, recorder: Optional[Recorder] = None,
                 samples: int = 2048, env=None):
        self.device, self.rng, self.rec, self.samples, self.env = device, rng, recorder, samples, env
        self._cache: dict = {}
        self._mean: dict = {}
        self._u: list = []
        self._ui = 0
        self._batches: list = []
        self._t_last = 0.0
        self._version = 0

    def _uniform(self) -> float:
        if self._ui >= len(self._u):
            self._u = self.rng.random(65536).tolist()
            self._ui = 0
        v = self._u[self._ui]
        self._ui += 1
        return v

    def _draw(self, n: int, k: int):
        key = (n, k)
        got = self._cache.get(key)
        if got is None:
            t, a = self.device.batch_samples(n, k, k, self.samples, self.rng)
            got = (t.tolist(), a.tolist())
            self._cache[key] = got
        times, areas = got
        i = 0 if len(times) == 1 else int(self._uniform() * len(times))
        return times[i], areas[i]

    def _lmean(self, qd: float) -> float:
        lo = int(qd)
        w = qd - lo
        m0 = self._mean.get(lo)
        if m0 is None:
            m0 = self._mean[lo] = self.device.mean_latency(lo)
        if w < 1e-12:
            return m0
        m1 = self._mean.get(lo + 1)
        if m1 is None:
            m1 = self._mean[lo + 1] = self.device.mean_latency(lo + 1)
        return m0 + w * (m1 - m0)

    @property
    def in_flight(self) -> float:
        """Average reads in flight of the active batches (shared mode)."""
        return sum(b.keff for b in self._batches)

    # ------------------------------------------------------------ one client
    def issue(self, now: float, n: int, k: int) -> float:
        """Duration (seconds) of a batch of ``n >= 1`` reads with ``k`` readers, alone on the device."""
        k = k if k < n else n
        dt, area = self._draw(n, k)
        if self.rec is not None:
            self.rec.box(now, now + dt, area / dt if dt > 0 else 0.0, n, area)
        return dt

    # ------------------------------------------------------------ shared
    def submit(self, n: int, k: int):
        """A simpy event that succeeds when a batch of ``n >= 1`` reads with ``k`` readers completes."""
        env = self.env
        now = env.now
        self._advance(now)
        k = k if k < n else n
        dt, area = self._draw(n, k)
        b = _Batch()
        b.n, b.k, b.alone, b.area, b.left, b.rate, b.start = n, k, dt, area, dt, 1.0, now
        b.keff = area / dt if dt > 0 else float(k)
        b.event = env.event()
        self._batches.append(b)
        self._plan(now)
        return b.event

    def _advance(self, now: float) -> None:
        dt = now - self._t_last
        if dt > 0:
            for b in self._batches:
                b.left -= dt * b.rate
        self._t_last = now

    def _plan(self, now: float) -> None:
        bs = self._batches
        self._version += 1
        if not bs:
            return
        total = 0.0
        for b in bs:
            total += b.keff
        t_first = float("inf")
        for b in bs:
            b.rate = 1.0 if total <= b.k else self._lmean(b.k) / self._lmean(total)
            t = b.left / b.rate if b.left > 0 else 0.0
            if t < t_first:
                t_first = t
        v = self._version
        ev = self.env.timeout(t_first)
        ev.callbacks.append(lambda _e, v=v: self._fire(v))

    def _fire(self, v: int) -> None:
        if v != self._version:
            return
        now = self.env.now
        self._advance(now)
        keep = []
        for b in self._batches:
            if b.left <= 1e-9 * b.alone + 1e-15:
                dur = now - b.start
                if self.rec is not None:
                    # Latencies stretch with the batch: their sum scales by dur / alone.
                    area = b.area * (dur / b.alone) if b.alone > 0 else 0.0
                    self.rec.box(b.start, now, b.keff, b.n, area)
                b.event.succeed(dur)
            else:
                keep.append(b)
        self._batches = keep
        self._plan(now)


class ExactDevice:
    """Every read is a simpy event; its latency is drawn at the queue depth when it is issued.

    A batch registers its ``k`` readers as in flight before the first draw, so
    reads issued together see each other; a reader that takes the next read
    of its batch keeps its slot.
    """

    def __init__(self, device: Device, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
        self.device, self.env, self.rng, self.rec = device, env, rng, recorder
        #: Readers holding a slot (the queue depth a new draw sees).
        self.in_flight = 0
        #: Reads between issue and completion (kept in ``recorder.counter``).
        self.in_device = 0
        self._pools: dict = {}

    def _draw(self, qd: int) -> float:
        pool = self._pools.get(qd)
        if pool is None or pool[1] >= len(pool[0]):
            dist = self.device.latency(qd)
            pool = [dist.sample(self.rng, 4096).tolist(), 0]
            self._pools[qd] = pool
        v = pool[0][pool[1]]
        pool[1] += 1
        return v

    def _count(self, delta: int) -> None:
        self.in_device += delta
        if self.rec is not None:
            self.rec.counter.append((self.env.now, self.in_device))

    def _serve(self):
        """One read while this reader is counted in flight (generator)."""
        env = self.env
        t0 = env.now
        self._count(1)
        yield env.timeout(self._draw(self.in_flight))
        self._count(-1)
        if self.rec is not None:
            self.rec.box(t0, env.now, 1.0, 1, env.now - t0)

    def read(self):
        """One read issued alone (generator): counts itself in flight for its duration."""
        self.in_flight += 1
        yield from self._serve()
        self.in_flight -= 1

    def _reader(self, remaining: list):
        while True:
            yield from self._serve()
            if remaining[0] > 0:
                remaining[0] -= 1
                continue
            self.in_flight -= 1
            return

    def batch(self, n: int, k: int):
        """``n`` reads by ``k`` readers (generator); returns when all completed."""
        if n <= 0:
            return
        k = min(k, n)
        self.in_flight += k
        remaining = [n - k]
        env = self.env
        if k == 1:
            yield from self._reader(remaining)
            return
        yield env.all_of([env.process(self._reader(remaining)) for _ in range(k)])


class ChannelExactDevice(ExactDevice):
    """Per-read model of :class:`ParametricSSD`: fixed delay, then a FIFO queue on ``parallelism`` channels.

    The recorder's ``wait`` list gets each read's time in the channel queue.
    """

    def __init__(self, device: ParametricSSD, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
        import simpy

        super().__init__(device, env, rng, recorder)
        self.channels = simpy.Resource(env, capacity=device.parallelism)
        self._svc: list = []
        self._si = 0

    def _service(self) -> float:
        if self._si >= len(self._svc):
            self._svc = self.device.sample_service(self.rng, 4096).tolist()
            self._si = 0
        v = self._svc[self._si]
        self._si += 1
        return v

    def _serve(self):
        env, dev = self.env, self.device
        t0 = env.now
        self._count(1)
        if dev.delay > 0:
            yield env.timeout(dev.delay)
        with self.channels.request() as req:
            t_q = env.now
            yield req
            if self.rec is not None:
                self.rec.wait.append(env.now - t_q)
            yield env.timeout(self._service())
        self._count(-1)
        if self.rec is not None:
            self.rec.box(t0, env.now, 1.0, 1, env.now - t0)


# =====================================================================================
# open-loop load (queueing checks)
# =====================================================================================
@dataclass
class PoissonLoadResult:
    """Outcome of :func:`poisson_load`; times in seconds.

    ``latencies`` and ``waits`` (time queued for a channel; empty for devices
    without channels) are per read in completion order; ``mean_queue_depth``
    is the time average of the device's count of reads inside it over
    ``[0, duration]`` (kept apart from the per-read times, for Little's law).
    """

    rate: float
    reads: int
    duration: float
    latencies: np.ndarray
    waits: np.ndarray
    mean_queue_depth: float
    busy_fraction: float

    @property
    def throughput(self) -> float:
        return self.reads / self.duration

    def to_dict(self) -> dict:
        return {"rate": self.rate, "reads": self.reads, "duration_s": self.duration,
                "mean_latency_us": float(self.latencies.mean()) / US,
                "mean_wait_us": float(self.waits.mean()) / US if self.waits.size else 0.0,
                "mean_queue_depth": self.mean_queue_depth, "busy_fraction": self.busy_fraction,
                "throughput": self.throughput}


def poisson_load(device: Device, rate: float, reads: int, seed: int = 0) -> PoissonLoadResult:
    """Drive ``device``'s exact model with Poisson arrivals of single reads.

    Parameters
    ----------
    rate : float
        Arrivals per second (> 0).
    reads : int
        Number of arrivals; the run ends when the last read completes.

    Raises
    ------
    ArgumentError
        Non-positive ``rate`` or ``reads``.
    """
    import simpy

    if rate <= 0 or reads < 1:
        raise ArgumentError(f"poisson_load: need rate > 0 and reads >= 1, got {rate}, {reads}")
    env = simpy.Environment()
    rng = np.random.default_rng(seed)
    rec = Recorder()
    dev = device.exact(env, np.random.default_rng(rng.integers(1 << 62)), rec)
    gaps = rng.exponential(1.0 / rate, reads).tolist()

    def source():
        for g in gaps:
            yield env.timeout(g)
            env.process(dev.read())

    env.process(source())
    env.run()
    s, e, lv = rec.arrays()
    summ = summarize_boxes(s, e, lv, env.now, bins=1)
    return PoissonLoadResult(rate=rate, reads=reads, duration=env.now, latencies=e - s,
                             waits=np.asarray(rec.wait), mean_queue_depth=time_average(rec.counter, env.now),
                             busy_fraction=summ["busy_fraction"])


# =====================================================================================
# presets and loading
# =====================================================================================
#: SPEC §8 reference figures (Apple M3 Ultra SSD).
SEED_SERIAL_US_PER_ROW = 107.9
SEED_CONCURRENT_US_PER_ROW = 12.8
SEED_READERS = 16


def _seed_device() -> EmpiricalDevice:
    qd16 = SEED_CONCURRENT_US_PER_ROW * SEED_READERS  # per-read latency with 16 readers in flight
    src = ("SPEC §8 reference figures, Apple M3 Ultra SSD, 48 random 264-byte rows: serial 5.177 ms a batch "
           "= 107.9 us a row (qd 1); 16 readers 0.614 ms a batch = 12.8 us a row, i.e. 204.8 us per read at "
           "qd 16. Two points, no spread: qd 2..15 interpolated, above 16 saturated (78,125 reads/s).")
    return EmpiricalDevice({1: LatencyDist.point(SEED_SERIAL_US_PER_ROW * US, src),
                            SEED_READERS: LatencyDist.point(qd16 * US, src)},
                           name="seed-apple-m3-ultra", source=src)


def _vm_virtio() -> EmpiricalDevice:
    path = shared_data_dir() / "devices" / "vm-virtio-16core-4k.jsonl"
    if not path.is_file():
        raise ArgumentError(f"device preset 'vm-virtio-16core-4k': no file {path}")
    return EmpiricalDevice.from_jsonl(
        path, "vm-virtio-16core-4k",
        "measured 2026-11-29: random 4 KiB O_DIRECT pread on a 16-core VM's virtio disk (ext4), qd 1..256, "
        f"3 s each ({path}); mean latency = qd / iops, percentiles p50/p95/p99")


_PRESETS = {
    "seed-apple-m3-ultra": _seed_device,
    "vm-virtio-16core-4k": _vm_virtio,
}


def preset_names() -> list:
    """Names accepted by :func:`preset`."""
    return list(_PRESETS)


def preset(name: str) -> Device:
    """A labelled device preset.

    ``seed-apple-m3-ultra``
        SPEC §8: 107.9 us a row serially, 12.8 us a row with 16 readers.
    ``vm-virtio-16core-4k``
        ``../shared/data/devices/vm-virtio-16core-4k.jsonl``, read at run time.

    Raises
    ------
    ArgumentError
        Unknown name (lists the known ones).
    """
    try:
        return _PRESETS[name]()
    except KeyError:
        raise ArgumentError(f"unknown device preset {name!r}; known: {', '.join(_PRESETS)}") from None


def load_device(spec: Union[str, os.PathLike, Device]) -> Device:
    """A device from a preset name, ``ssd:qd1_us=..,iops=..,parallelism=..[,cv=..]``,
    a ``.json`` file written by :meth:`Device.save`, or a ``.jsonl`` microbenchmark file.

    Raises
    ------
    ArgumentError, FormatError
        Unknown spec, unreadable or malformed file.
    """
    if isinstance(spec, Device):
        return spec
    s = str(spec)
    if s in _PRESETS:
        return preset(s)
    if s.startswith("ssd:"):
        return ParametricSSD.from_spec(s)
    path = Path(s)
    if path.suffix == ".jsonl":
        return EmpiricalDevice.from_jsonl(path)
    if path.suffix == ".json":
        return Device.from_dict(load_json(path))
    raise ArgumentError(f"unknown device {s!r}: give a preset ({', '.join(_PRESETS)}), "
                        "ssd:qd1_us=..,iops=..,parallelism=.., or a .json/.jsonl file")
