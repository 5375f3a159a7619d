"""The latency of one read as a distribution: a piecewise-linear quantile function (seconds).

:class:`LatencyDist` is what every device model returns for a queue depth,
built from measured samples, from percentiles and a mean (a microbenchmark
or fio), or a single value.  :func:`list_schedule` is the makespan of a batch
of such latencies on ``k`` readers.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.core.schema import LATENCY, US, check_number, check_numbers

__all__ = ["LatencyDist", "list_schedule"]


def list_schedule(x: np.ndarray, k: int) -> np.ndarray:
    """float64 ``[size]``: makespan of each row of ``x`` (``[size, n]`` latencies, seconds) on ``k`` readers
    that each take the next read as soon as their previous one completes."""
    size, n = x.shape
    if n <= k:
        return x.max(axis=1)
    finish = x[:, :k].copy()
    rows = np.arange(size)
    for j in range(k, n):
        i = finish.argmin(axis=1)
        finish[rows, i] += x[:, j]
    return finish.max(axis=1)


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
    def std(self) -> float:
        """Standard deviation of the latency, seconds (exact for the piecewise-linear quantile function)."""
        a, b = self.q[:-1], self.q[1:]
        second = float(np.sum(np.diff(self.u) * ((a * a + a * b + b * b) / 3)))
        return math.sqrt(max(second - self._mean * self._mean, 0.0))

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
        if not isinstance(d, Mapping):
            raise FormatError(f"latency distribution: expected an object, got {_shown(d)}")
        try:
            src = str(d.get("source", ""))
            if "u" in d and "q_us" in d:
                return cls(_numbers(d["u"], "u", 0.0), _numbers(d["q_us"], "q_us") * US, src)
            if "samples_us" in d:
                return cls.from_samples(_numbers(d["samples_us"], "samples_us") * US, source=src)
            pct = {float(k[1:-3]): _number(v, k) * US for k, v in d.items()
                   if k.startswith("p") and k.endswith("_us") and _is_number(k[1:-3])}
            mean = d.get("mean_us")
            if pct:
                return cls.from_percentiles(pct, None if mean is None else _number(mean, "mean_us") * US, src)
            if mean is not None:
                return cls.point(_number(mean, "mean_us") * US, src)
        except ArgumentError as exc:
            raise FormatError(f"latency distribution: {exc}") from None
        raise FormatError(f"latency distribution: need u/q_us, samples_us or pNN_us keys, got {sorted(d)}")

    def __repr__(self) -> str:
        return (f"LatencyDist(mean={self.mean / US:.2f} us, p50={self.percentile(50) / US:.2f} us, "
                f"p99={self.percentile(99) / US:.2f} us)")


def _shown(v) -> str:
    """A value as an error message shows it: numbers with ``:g``, anything else short."""
    if isinstance(v, float):
        return f"{v:g}"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(v, key: str) -> float:
    """``v`` as a float: a latency in us, a finite number > 0 (:data:`sim.core.schema.LATENCY`).

    Raises
    ------
    FormatError
        Not a number, not finite, zero or negative (names ``key`` and the value).
    """
    return check_number("latency distribution", key, v, LATENCY)


def _numbers(v, key: str, low=LATENCY) -> np.ndarray:
    """``v`` (a list of numbers) as a float64 array, each checked as :func:`_number` (``key[i]`` named);
    ``low=0.0`` for quantile levels ``u``, which are not latencies."""
    return np.asarray(check_numbers("latency distribution", key, v, low), dtype=np.float64)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
