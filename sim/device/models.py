"""Device models: how long row reads take at each queue depth (SPEC §8, §9).

A device model answers one question for the simulator: when ``qd`` reads are
outstanding on the device, how long does one of them take?  The answer is a
distribution, :class:`~sim.device.latency.LatencyDist` (seconds), for every
queue depth.  It is the same quantity a closed-loop microbenchmark measures
(``qd`` threads each issuing one random read after the other): latency
percentiles, and by Little's law the mean latency ``qd / IOPS``.

Kinds of device:

:class:`EmpiricalDevice`
    a table ``{queue depth: latency distribution}`` from measurements (samples,
    or a mean and percentiles); between measured depths the quantile functions
    are interpolated linearly in ``qd``, above the deepest one the device is taken
    as saturated (constant IOPS, latency growing with ``qd``).  Simulated read by
    read, the deepest measured depth is the number of reads served at once;
    more wait in FIFO order (:mod:`sim.device.engines`).  Saved and loaded as
    JSON; also read from the JSONL microbenchmark format of the packaged
    ``sim/data/devices/*.jsonl``.
:class:`ParametricSSD`
    an SSD described by its QD1 latency, IOPS ceiling and internal parallelism:
    ``parallelism`` channels each serving one read for ``s = parallelism / iops``
    seconds (fixed, exponential or gamma with a given coefficient of variation),
    behind a fixed pipelined latency ``d = qd1_latency - s``; a read takes
    the first free channel, or (``routing="random"``) queues at the channel
    that holds its page, one drawn at random.  A datasheet's
    figures (QD1 latency and IOPS, optionally the tail and the depth at peak)
    are enough: :mod:`sim.device.datasheet` derives the rest.
:class:`MeasuredBatchDevice`
    an :class:`EmpiricalDevice` plus the measured service time of whole
    batches (the calibration's model of this machine).

Every model also simulates itself (:meth:`Device.fast`, :meth:`Device.exact`:
:mod:`sim.device.engines`), and gives the duration of a batch of reads alone
on it, as its exact model would (:meth:`Device.batch_samples`:
:mod:`sim.device.alone`).  The four classes are one idea -- a device's
latency by queue depth -- and :meth:`Device.from_dict` rebuilds any of them.
"""

from __future__ import annotations

import heapq
import math
import os
import re
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.core.io import read_jsonl, write_json
from sim.core.limits import MAX_QUEUE_DEPTH, check_queue_depth
from sim.core.schema import US
from .alone import channel_batch, sample_size, slot_batch
from .bucket import TokenBucket
from .engines import BucketExactDevice, ChannelExactDevice, ExactDevice, FastDevice, SlotExactDevice
from .fluid import nominal_batch
from .latency import LatencyDist, list_schedule
from .recorder import Recorder

__all__ = ["Device", "EmpiricalDevice", "MAX_IOPS", "MIN_IOPS", "MeasuredBatchDevice", "ParametricSSD",
           "RateLimitedDevice", "is_assumed"]


class Device:
    """A device model: the latency of one read at each queue depth, and batch service times.

    Subclasses implement :meth:`latency`, :meth:`saturation_depth` and
    :meth:`to_dict`; the exact per-read model defaults to service slots
    (:class:`~sim.device.engines.SlotExactDevice`) and is overridden by devices
    with an internal queue of their own.

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
    #: Batches longer than this many waves use the end-effect approximation.
    END_WAVES = 16
    #: How the fast mode keeps a batch's slowest reads (:mod:`sim.device.fluid`): ``"shared"`` -- reads in
    #: service share the device, so a straggler is slower on a busy device; ``"own"`` -- its time is its own.
    straggler = "shared"

    # ---------------------------------------------------------------- model
    def latency(self, qd: int) -> LatencyDist:
        """Latency distribution of one read when ``qd >= 1`` reads are outstanding."""
        raise NotImplementedError

    def saturation_depth(self) -> int:
        """Reads the device serves at once in its exact model; more reads wait (FIFO) without adding IOPS."""
        return max(self.depths())

    def mean_latency(self, qd: int) -> float:
        """Mean latency (seconds) at queue depth ``qd``."""
        return self.latency(qd).mean

    def parallel_reads(self) -> int:
        """Reads the device serves side by side without one waiting for another (channels)."""
        return self.saturation_depth()

    def iops(self, qd: int) -> float:
        """Reads per second at queue depth ``qd`` (Little's law: ``qd / mean latency``)."""
        return qd / self.mean_latency(qd)

    def peak_iops(self) -> float:
        """Highest IOPS over the queue depths the model describes."""
        return max(self.iops(q) for q in self.depths())

    def depths(self) -> list:
        """Queue depths the model is defined from (measured or characterised)."""
        return [1, 2, 4, 8, 16, 32, 64]

    def _alone(self, n: int, k: int, size: int, rng: np.random.Generator):
        """(times, areas) of ``n`` reads by ``k`` readers alone, read by read (see :mod:`sim.device.alone`)."""
        return slot_batch(self.latency, self.saturation_depth(), n, k, size, rng, point=self.is_point())

    def is_point(self) -> bool:
        """True when every read at every depth takes a fixed time (one sample of a batch suffices)."""
        return False

    def bucket(self) -> Optional[TokenBucket]:
        """A fresh (full) token bucket in front of one simulated drive of this device, or None: no rate limit
        (:class:`RateLimitedDevice` has one)."""
        return None

    def gate_tail(self) -> float:
        """Seconds a read takes after its token (the raw device's mean latency at depth 1)."""
        return self.mean_latency(1)

    def batch_samples(self, n: int, k: int, size: Optional[int] = None, rng: Optional[np.random.Generator] = None):
        """Durations of a batch of ``n`` reads issued by ``k`` readers alone on the device, as the exact
        per-read model gives them.

        ``k`` readers each take the next read as soon as their previous one
        completes; every read meets the queue depth it finds (its own
        batch's reads in flight, fewer in the last partial wave).

        Returns
        -------
        (times, areas) : tuple of numpy.ndarray
            float64 ``[size]`` (``[1]`` for a device of fixed latencies): the
            batch's duration and the integral of its reads in the device
            (the sum of their latencies), seconds.  Up to
            ``END_WAVES * k`` reads (or :attr:`EXACT_BATCH_LIMIT`), and on a
            device of fixed latencies, the batch is simulated read by read;
            longer batches take the sum of latencies at
            the steady depth from its normal approximation, divided by the
            depth, plus the end effect (simulated once for ``END_WAVES * k``
            reads, less its steady-state part).

        Raises
        ------
        ArgumentError
            ``n`` or ``k`` below 1.
        """
        if n < 1 or k < 1:
            raise ArgumentError(f"batch_samples: need n >= 1 reads and k >= 1 readers, got n={n}, k={k}")
        rng = rng if rng is not None else np.random.default_rng(0)
        ks = min(k, n, self.saturation_depth())
        m = self.END_WAVES * ks
        if n <= max(self.EXACT_BATCH_LIMIT, m) or self.is_point():
            return self._alone(n, k, size or sample_size(n), rng)
        size = size or sample_size(m)
        dist = self.latency(ks)
        tm, _ = self._alone(m, k, size, rng)
        end = tm - m * dist.mean / ks
        if dist.is_point and end.size == 1:
            v = float(dist.q[0])
            return np.array([n * v / ks + end[0]]), np.array([n * v])
        areas = np.maximum(rng.normal(n * dist.mean, math.sqrt(n) * dist.std, end.size), 0.0)
        return areas / ks + end, areas

    def chain_excess(self, n: int, k: int) -> float:
        """Mean work (in reads of mean work 1) by which the longest of the ``min(k, slots)`` readers' chains of
        a batch of ``n`` reads exceeds its ``ceil(n / readers)`` rounds: the list schedule of the reads' works
        ``L_k(u) / L(k)``, on a device where every read in service progresses alike (cached)."""
        cache = self.__dict__.setdefault("_chains", {})
        kk = max(1, min(int(k), int(n), self.saturation_depth()))
        key = (int(n), kk)
        got = cache.get(key)
        if got is None:
            d = self.latency(kk)
            if d.is_point or kk == 1:
                got = 0.0
            else:
                x = d.sample(np.random.default_rng(20260101 + 7919 * n + kk), (min(2048, sample_size(n)), n))
                got = max(0.0, float(list_schedule(x / d.mean, kk).mean()) - math.ceil(n / kk))
            cache[key] = got
        return got

    def nominal_batch(self, n: int, k: int) -> tuple:
        """(duration, area, last) of ``n`` reads by ``k`` readers alone in the fast mode's queue at mean
        latencies (:func:`sim.device.fluid.nominal_batch`); cached."""
        cache = self.__dict__.setdefault("_nominal", {})
        key = (int(n), int(k))
        got = cache.get(key)
        if got is None:
            got = cache[key] = nominal_batch(self.saturation_depth(), self.mean_latency, *key)
        return got

    # ------------------------------------------------------------ simulation
    def exact(self, env, rng: np.random.Generator, recorder: Optional[Recorder] = None) -> "ExactDevice":
        """The per-read simpy model of this device in ``env``."""
        return SlotExactDevice(self, env, rng, recorder)

    def fast(self, rng: np.random.Generator, recorder: Optional[Recorder] = None,
             samples: Optional[int] = None, env=None) -> "FastDevice":
        """The fast model of this device (``env`` needed for shared use in simpy)."""
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
        if not isinstance(d, Mapping):
            raise FormatError(f"device: expected a JSON object, got {d!r:.40}")
        kind = d.get("kind")
        if kind == "empirical":
            return EmpiricalDevice.from_dict(d)
        if kind == "measured_batch":
            return MeasuredBatchDevice.from_dict(d)
        if kind == "rate_limited":
            return RateLimitedDevice.from_dict(d)
        if kind == "parametric_ssd":
            f = {}
            for key in ("qd1_latency_us", "iops", "parallelism", "service_cv"):
                v = d.get(key, 0.5 if key == "service_cv" else None)
                if v is None:
                    raise FormatError(f"parametric_ssd device: missing field {key!r}")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                        (key == "parallelism" and v != int(v)):
                    kind = "a whole number" if key == "parallelism" else "a finite number"
                    raise FormatError(f"parametric_ssd device: {key} = {v!r} is not {kind}")
                f[key] = v
            try:
                return ParametricSSD(float(f["qd1_latency_us"]) * US, float(f["iops"]), int(f["parallelism"]),
                                     float(f["service_cv"]), name=d.get("name"),
                                     source=d.get("source", ""), derived=_derived(d, "parametric_ssd device"),
                                     routing=d.get("routing", "shared"))
            except ArgumentError as exc:
                raise FormatError(f"parametric_ssd device: {exc}") from None
        raise FormatError(f"device: unknown kind {kind!r} (expected 'empirical', 'measured_batch', "
                          "'parametric_ssd' or 'rate_limited'; a calibration file or fio output is read by load_device)")

    def table(self, depths: Optional[Sequence[int]] = None) -> list:
        """Rows ``{qd, mean_us, p50_us, p99_us, iops}`` for display."""
        out = []
        for q in depths or self.depths():
            d = self.latency(q)
            out.append({"qd": int(q), "mean_us": d.mean / US, "p50_us": d.percentile(50) / US,
                        "p99_us": d.percentile(99) / US, "iops": q / d.mean})
        return out

    def describe(self) -> dict:
        d = {"name": self.name, "kind": type(self).__name__, "source": self.source,
             "peak_iops": self.peak_iops(), "saturation_depth": self.saturation_depth(), "table": self.table()}
        derived = getattr(self, "derived", None)
        if derived:
            d["derived"] = _derived_copy(derived)
            d["assumed"] = [k for k, v in derived.items() if isinstance(v, Mapping) and is_assumed(v.get("rule"))]
        return d


def is_assumed(rule) -> bool:
    """Whether a ``derived`` entry's rule says its figure was assumed, not measured nor given: the word "assumed"
    in it (at its start, or after what was derived: "...; assumed: the readers copy on 2 CPUs")."""
    return re.search(r"\bassumed\b", str(rule or "")) is not None


def _derived_copy(derived: Mapping) -> dict:
    """A device's ``derived`` for a document: its entries copied, so that a change to the document leaves the
    device's own figures as they are."""
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in derived.items()}


def _derived(d: Mapping, where: str) -> Optional[dict]:
    """A device document's ``derived``: None, or a JSON object of ``{"value": number, "rule": string}`` entries
    (what ``engram sim device`` prints; ``cpu_per_read_us``, a finite number >= 0, is multiplied by the reads/s
    of a run).

    Raises
    ------
    FormatError
        Names the entry and the value (``rate_limited device: derived.cpu_per_read_us.value = "x": ...``).
    """
    derived = d.get("derived")
    if derived is None:
        return None
    if not isinstance(derived, Mapping):
        raise FormatError(f"{where}: derived = {derived!r:.40}: expected a JSON object of "
                          '{"value": number, "rule": string} entries')
    for key, entry in derived.items():
        at = f"{where}: derived.{key}"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("rule"), str) or "value" not in entry:
            raise FormatError(f"{at} = {entry!r:.40}: expected a JSON object with a \"value\" and a \"rule\" string")
        v = entry["value"]
        try:
            bad = isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or \
                (key == "cpu_per_read_us" and not (math.isfinite(v) and v >= 0)) or \
                (key == "memory_backed" and not 1 <= v <= MAX_QUEUE_DEPTH)
        except OverflowError:  # an integer past a float's range
            bad = True
        if bad:
            want = {"cpu_per_read_us": "a finite number >= 0 (microseconds)",
                    "memory_backed": f"a number in [1, {MAX_QUEUE_DEPTH}] (the CPUs its copies run on)"}
            raise FormatError(f"{at}.value = {v!r:.40}: expected {want.get(key, 'a number')}")
    return dict(derived)


class EmpiricalDevice(Device):
    """A device measured at some queue depths: ``{qd: LatencyDist}``.

    Parameters
    ----------
    table : mapping int -> LatencyDist
        Latency distribution of one read at each measured queue depth (>= 1).
    name, source : str
        Label and provenance of the measurements.
    derived : mapping, optional
        What was derived or assumed from the measurements, and by which rule (``{key: {"value", "rule"}}``,
        e.g. fio's ``cpu_per_read_us``): shown by ``engram sim device`` and kept by :meth:`to_dict`.

    Between measured depths the quantile functions are mixed with weight
    linear in ``qd`` (exact for the mean of a saturated device, where latency
    is ``qd / IOPS``); below the shallowest the shallowest is used; above the
    deepest (``Q``) the device is saturated: latency ``L_Q * qd / Q``.

    With ``peak_bound`` (a device from fio's output, :mod:`sim.device.fio`)
    its measured peak is a bound in every simulator path: a token bucket of
    :meth:`peak_iops` tokens a second, :meth:`saturation_depth` reads deep
    (:mod:`sim.device.bucket`), so that batches drawn alone one after the other
    -- each as fast as a short burst measured -- never carry the device past
    the peak fio measured in the long run.

    Raises
    ------
    ArgumentError
        An empty table or a queue depth below 1.
    """

    def __init__(self, table: Mapping[int, LatencyDist], name: str = "empirical", source: str = "",
                 peak_bound: bool = False, derived: Optional[Mapping] = None):
        if not table:
            raise ArgumentError("EmpiricalDevice: empty table")
        items = sorted((check_queue_depth(q, f"{name}: table"), d) for q, d in table.items())
        for q, d in items:
            if not isinstance(d, LatencyDist):
                raise ArgumentError(f"EmpiricalDevice: entry for qd {q} is {type(d).__name__}, not LatencyDist")
        self.measured = dict(items)
        self._qs = [q for q, _ in items]
        self.name, self.source = name, source
        self._cache: dict = {}
        self.peak_bound = bool(peak_bound)
        self.derived = dict(derived) if derived else {}

    def depths(self) -> list:
        return list(self._qs)

    def bucket(self) -> Optional[TokenBucket]:
        """With ``peak_bound``: a bucket of the measured peak IOPS, as deep as the deepest measured depth."""
        return TokenBucket(self.peak_iops(), self.saturation_depth()) if self.peak_bound else None

    def exact(self, env, rng: np.random.Generator, recorder: Optional[Recorder] = None) -> "ExactDevice":
        inner = SlotExactDevice(self, env, rng, recorder)
        return BucketExactDevice(self, inner, env, rng, recorder) if self.peak_bound else inner

    def is_point(self) -> bool:
        return all(d.is_point for d in self.measured.values())

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
    def from_measurements(cls, records: Sequence[Mapping], name: str = "measured", source: str = "",
                          where: Optional[Sequence[str]] = None) -> "EmpiricalDevice":
        """From microbenchmark records, one per queue depth.

        Each record has ``qd`` and any of: ``iops`` or ``rows_per_s`` (mean
        latency = ``qd / iops``), ``mean_us``, percentiles ``pNN_us``,
        ``samples_us``.  This is the format of ``sim/data/devices/*.jsonl``
        and of the engine's microbenchmarks.

        Raises
        ------
        FormatError
            A record without ``qd`` or without any latency figure, a queue depth that is not a whole number in
            ``[1, MAX_QUEUE_DEPTH]`` or given twice, a figure that is not a number (names the record:
            ``where[i]``, by default ``"NAME: record i"``).
        """
        table = {}
        for i, r in enumerate(records):
            at = where[i] if where is not None else f"{name}: record {i}"
            if "qd" not in r:
                raise FormatError(f"{at} has no 'qd'")
            try:
                q = check_queue_depth(r["qd"], at)
            except ArgumentError as exc:
                raise FormatError(str(exc)) from None
            if q in table:
                raise FormatError(f"{at}: queue depth {q} given twice")
            rate = r.get("iops", r.get("rows_per_s"))
            if rate is not None and "mean_us" not in r and \
                    (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf):
                raise FormatError(f"{at} (qd {q}): iops = {rate!r} must be a positive number")
            d = {k: v for k, v in r.items() if k.startswith("p") and k.endswith("_us")}
            if "mean_us" in r:
                d["mean_us"] = r["mean_us"]
            elif rate:
                d["mean_us"] = q / float(rate) / US
            if "samples_us" in r:
                d = {"samples_us": r["samples_us"]}
            if not d:
                raise FormatError(f"{at} (qd {q}) has no latency figure")
            try:
                table[q] = LatencyDist.from_dict(d)
            except FormatError as exc:
                raise FormatError(f"{at} (qd {q}): {exc}") from None
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
        lines = read_jsonl(path, "device file")
        if not lines:
            raise FormatError(f"{path}: no records")
        return cls.from_measurements([obj for _, obj in lines], name or path.stem,
                                     source or f"measured microbenchmark, {path.name} (mean latency = qd / iops)",
                                     where=[f"{path}: line {n}" for n, _ in lines])

    def to_dict(self) -> dict:
        d = {"kind": "empirical", "name": self.name, "source": self.source,
             "table": {str(q): d.to_dict() for q, d in self.measured.items()}}
        if self.peak_bound:
            d["peak_bound"] = True
        if self.derived:  # a saved fio device keeps what was derived (its CPU per read: the host's share)
            d["derived"] = _derived_copy(self.derived)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "EmpiricalDevice":
        if "table" not in d or not isinstance(d["table"], Mapping):
            raise FormatError("empirical device: missing 'table'")
        table = {}
        for q, v in d["table"].items():
            try:
                qd = check_queue_depth(q, "empirical device: table")
            except ArgumentError as exc:
                raise FormatError(str(exc)) from None
            try:
                table[qd] = LatencyDist.from_dict(v)
            except FormatError as exc:
                raise FormatError(f"empirical device: table[{q!r}]: {exc}") from None
        bound = d.get("peak_bound", False)
        if not isinstance(bound, bool):
            raise FormatError(f"empirical device: peak_bound = {bound!r} is not true or false")
        try:
            return cls(table, str(d.get("name", "empirical")), str(d.get("source", "")), peak_bound=bound,
                       derived=_derived(d, "empirical device"))
        except ArgumentError as exc:
            raise FormatError(f"empirical device: {exc}") from None

    def __repr__(self) -> str:
        return f"EmpiricalDevice({self.name!r}, depths={self._qs})"


class MeasuredBatchDevice(EmpiricalDevice):
    """An :class:`EmpiricalDevice` plus the measured service time of whole batches.

    Built from a reader's own microbenchmark (:mod:`sim.check.calibrate`): the time
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

    #: A measured batch's excess over the per-read model is the reader's own (waking threads, submitting).
    straggler = "own"

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
        if n != n0:  # other sizes: as the per-read model's batch of n over its batch of n0 (its partial waves)
            d = d.scaled(self.nominal_batch(n, kk)[0] / self.nominal_batch(n0, kk)[0])
        self._bcache[key] = d
        return d

    def batch_samples(self, n: int, k: int, size: Optional[int] = None, rng: Optional[np.random.Generator] = None):
        """Durations of a batch of ``n`` reads on ``k`` readers: the measured batch (see the class).

        Returns ``(times, areas)`` as :meth:`Device.batch_samples`; the area is
        the duration times the average reads in flight of the per-read model's
        batch (:meth:`nominal_batch`).
        """
        if n < 1 or k < 1:
            raise ArgumentError(f"batch_samples: need n >= 1 reads and k >= 1 readers, got n={n}, k={k}")
        d = self.batch_dist(n, k)
        rng = rng if rng is not None else np.random.default_rng(0)
        t = np.array([float(d.q[0])]) if d.is_point else d.sample(rng, size or sample_size(n))
        nt, na, _ = self.nominal_batch(n, min(k, n))
        return t, t * (na / nt if nt > 0 else min(k, n))

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
            dev = cls(base.measured, batches, base.name, base.source)
        except ArgumentError as exc:
            raise FormatError(f"measured_batch device: {exc}") from None
        dev.derived = base.derived
        return dev

    def __repr__(self) -> str:
        return f"MeasuredBatchDevice({self.name!r}, depths={self._qs}, batches={sorted(self.batches)})"


#: Physical ranges of a :class:`ParametricSSD`'s figures: a QD1 read within 1 s (a disk is slower than
#: flash at 10 ms), at most 10^9 reads/s (the fastest flash arrays are near 10^8), a service-time coefficient
#: of variation up to 10; ``parallelism`` and ``iops x qd1_latency`` up to :data:`sim.core.limits.MAX_QUEUE_DEPTH`.
MAX_QD1_LATENCY = 1.0
MAX_IOPS = 1e9
#: The slowest rate a device or a rate limit may have, reads a second: below one read a second (a disk does
#: about 100, the smallest gp2 volume 100) the figure is a typo or a unit slip, not a device.
MIN_IOPS = 1.0
MAX_SERVICE_CV = 10.0


class ParametricSSD(Device):
    """An SSD from three figures: QD1 latency, IOPS ceiling, internal parallelism.

    ``parallelism`` channels each serve one read at a time for ``s =
    parallelism / iops`` seconds on average (gamma distributed with
    coefficient of variation ``service_cv``: 0 fixed, 1 exponential; the
    default 0.5 is an assumption, not a measurement); every
    read also spends a fixed, pipelined ``d = qd1_latency - s`` seconds
    (controller, bus, system call).  ``routing="shared"``: reads wait for the
    first free channel in FIFO order (with ``d = 0`` and ``service_cv = 1`` the
    M/M/c queue): the IOPS rise linearly with depth up to the ceiling at the
    knee ``iops x qd1_latency``.  ``routing="random"``: each read queues FIFO at
    one channel drawn uniformly at random (the die or channel that holds its
    page; random reads collide): with exponential service, mean-value analysis
    of the closed loop (Reiser and Lavenberg 1980; ``p`` symmetric queues, each
    visited with probability ``1 / p``) gives the mean latency
    ``R(N) = d + s (1 + (N - 1) / p) = qd1_latency + (N - 1) / iops`` exactly:
    the latency grows by ``1 / iops`` a read in flight from QD1 on, and the
    IOPS ``N / R(N)`` approach the ceiling only at deep queues (94% of it at
    ``N = 16 x knee``), as measured drives do (the packaged
    ``vm-virtio-16core-4k`` within 18% at every depth from 2 to 64, where the
    first free channel is up to 46% below its latency).
    From a datasheet's figures, :func:`sim.device.datasheet.ssd_from_figures`
    derives the parallelism and the cv (``derived`` says how).

    :meth:`latency` characterises the model the way a microbenchmark would: a
    closed loop of ``qd`` readers, simulated once per depth (1 to 4 and powers
    of two; depths between are interpolated like a measured table) and cached.

    Raises
    ------
    ArgumentError
        Non-positive figures, or ``qd1_latency < parallelism / iops`` (the
        ceiling cannot be reached with that QD1 latency: the message gives the
        QD1 latency that would work and the largest parallelism that does).
    """

    #: A read in service holds its channel for its own service time, whatever the queue.
    straggler = "own"

    #: How a read picks its channel: the first free one, or one at random (see the class).
    ROUTINGS = ("shared", "random")
    #: With random routing, the fast mode serves up to this many times the parallelism at once (IOPS at 97% of
    #: the ceiling there); above the characterised depths each read in flight adds ``1 / iops`` to the mean
    #: latency (the mean-value analysis line of the class), so that no deep depth is simulated.
    ROUTED_DEPTHS = 32

    def __init__(self, qd1_latency: float, iops: float, parallelism: int, service_cv: float = 0.5,
                 name: Optional[str] = None, source: str = "", characterize_reads: int = 20000,
                 derived: Optional[Mapping] = None, routing: str = "shared"):
        for key, v, hi in (("qd1_latency", qd1_latency, MAX_QD1_LATENCY), ("iops", iops, MAX_IOPS),
                           ("parallelism", parallelism, MAX_QUEUE_DEPTH), ("service_cv", service_cv, MAX_SERVICE_CV)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ArgumentError(f"ParametricSSD: {key} = {v!r} is not a number")
            low_ok = v >= 0 if key == "service_cv" else (v >= 1 if key == "parallelism" else
                                                         (v >= MIN_IOPS if key == "iops" else v > 0))
            if not (math.isfinite(v) and low_ok and v <= hi):
                low = "[0" if key == "service_cv" else ("[1" if key == "parallelism" else
                                                        (f"[{MIN_IOPS:g}" if key == "iops" else "(0"))
                raise ArgumentError(f"ParametricSSD: {key} = {float(v):g} is outside its physical range "
                                    f"{low}, {hi:g}] (sim.device.models.MAX_*)")
        if routing not in self.ROUTINGS:
            raise ArgumentError(f"ParametricSSD: routing = {routing!r}: expected one of {', '.join(self.ROUTINGS)}")
        if iops * qd1_latency > MAX_QUEUE_DEPTH:
            raise ArgumentError(f"ParametricSSD: iops x qd1_latency = {iops * qd1_latency:g} reads in flight to reach "
                                f"the ceiling, more than the deepest queue ({MAX_QUEUE_DEPTH}, "
                                "sim.core.limits.MAX_QUEUE_DEPTH)")
        s = parallelism / iops
        if qd1_latency < s * (1 - 1e-9):
            most = max(1, int(math.floor(qd1_latency * iops * (1 + 1e-9))))
            raise ArgumentError(
                f"ParametricSSD: qd1_latency {qd1_latency / US:g} us is below the channel service time "
                f"parallelism/iops = {parallelism}/{iops:g} = {s / US:.3f} us: with {iops:g} IOPS and a QD1 "
                f"latency of {qd1_latency / US:g} us the parallelism can be at most {most} "
                f"(floor(iops x qd1 latency)), or parallelism {parallelism} needs qd1_us >= {s / US:.1f}; "
                "leave parallelism out to derive it")
        self.qd1_latency, self.iops_max, self.parallelism = float(qd1_latency), float(iops), int(parallelism)
        self.service_cv = float(service_cv)
        self.routing = str(routing)
        self.service = s
        self.delay = max(0.0, qd1_latency - s)
        self.name = name or (f"ssd-qd1-{qd1_latency / US:g}us-{iops:g}iops-p{parallelism}"
                             + ("-routed" if routing == "random" else ""))
        self.source = source or "parametric model (QD1 latency, IOPS ceiling, internal parallelism)"
        self.characterize_reads = int(characterize_reads)
        self.derived = dict(derived) if derived else {}
        self._cache: dict = {}

    def sample_service(self, rng: np.random.Generator, size) -> np.ndarray:
        """Channel service times (seconds), mean ``parallelism / iops``."""
        cv = self.service_cv
        if cv == 0:
            return np.full(size, self.service)
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, self.service / shape, size)

    def depths(self) -> list:
        """Characterised depths: 1 to 4, powers of two up to ``max(64, 4 x parallelism)``, and around the
        knee ``iops x qd1_latency`` (the parallelism, the knee, 1.25 and 1.5 times it), where latency bends."""
        out, q = {1, 2, 3, 4}, 1
        while q < 4 * self.parallelism or q <= 64:
            out.add(q)
            q *= 2
        knee = self.iops_max * self.qd1_latency
        out |= {self.parallelism, int(math.ceil(knee)), int(round(1.25 * knee)), int(round(1.5 * knee))}
        return sorted(x for x in out if x >= 1)

    def saturation_depth(self) -> int:
        """The shallowest characterised depth (a power of two) at which the closed loop reaches 98% of the
        IOPS ceiling: the fast mode serves this many reads at once (their latency the closed loop's at the
        depth in service) and queues the rest; the exact model queues at the channels.  The knee
        ``iops x qd1_latency`` (operational analysis: ``N* = X_max x R_min``) is where the ceiling would be
        reached with fixed service times; random ones reach it later.  With random routing,
        ``ROUTED_DEPTHS x parallelism`` (the IOPS rise towards the ceiling at every depth), at least the
        deepest characterised depth."""
        if self.routing == "random":  # the queues are at the channels: every read is in the device
            return max(self.depths()[-1], min(MAX_QUEUE_DEPTH, self.ROUTED_DEPTHS * self.parallelism))
        knee = max(1, int(math.ceil(self.iops_max * self.qd1_latency * (1 - 1e-9))))
        for q in self.depths():
            if q >= knee and self.iops(q) >= 0.995 * self.iops_max:
                return q
        return self.depths()[-1]

    def peak_iops(self) -> float:
        return self.iops_max

    def parallel_reads(self) -> int:
        return self.parallelism

    def latency(self, qd: int) -> LatencyDist:
        qd = int(qd)
        if qd < 1:
            raise ArgumentError(f"latency: queue depth must be >= 1, got {qd}")
        got = self._cache.get(qd)
        if got is None:
            grid = self.__dict__.get("_grid") or self.__dict__.setdefault("_grid", self.depths())
            if self.service_cv == 0 and qd <= self.parallelism and (self.routing == "shared" or qd == 1):
                got = LatencyDist.point(self.delay + self.service, self.source)
            elif qd > grid[-1] and self.routing == "random":  # the line: each read in flight adds 1 / iops
                top = self.latency(grid[-1])
                got = top.scaled((top.mean + (qd - grid[-1]) / self.iops_max) / top.mean)
            elif qd in grid or qd > grid[-1]:
                got = LatencyDist.from_samples(self.closed_loop(qd), knots=513, source=self.source)
            else:  # between characterised depths: quantile mixing linear in qd, like a measured table
                i = int(np.searchsorted(grid, qd))
                q0, q1 = grid[i - 1], grid[i]
                got = self.latency(q0).mix(self.latency(q1), (qd - q0) / (q1 - q0))
            self._cache[qd] = got
        return got

    def is_point(self) -> bool:
        return self.service_cv == 0 and (self.routing == "shared" or self.parallelism == 1)

    def _alone(self, n: int, k: int, size: int, rng: np.random.Generator):
        size = 1 if self.is_point() else size
        return channel_batch(self.delay, self.parallelism, self.sample_service, n, k, size, rng,
                             routed=self.routing == "random")

    def closed_loop(self, qd: int, reads: Optional[int] = None, seed: int = 12345) -> np.ndarray:
        """Latencies (seconds) of a closed loop of ``qd`` readers on this device, after warm-up.

        An event loop of its own (no simpy): reads leave the fixed delay stage
        and join a FIFO queue of ``parallelism`` channels (random routing: the FIFO queue of one channel
        drawn at random).
        """
        reads = reads or max(self.characterize_reads, 200 * qd)
        warm = max(reads // 10, 10 * qd)
        rng = np.random.default_rng(seed + qd)
        svc = self.sample_service(rng, reads + warm + qd).tolist()
        si = 0
        d, P = self.delay, self.parallelism
        events = [(d, i, 0.0) for i in range(qd)]  # (time leaving the delay stage, id, issue time)
        heapq.heapify(events)
        free_at = [0.0] * P  # min-heap of channel free times (random routing: each channel's own)
        routed = self.routing == "random"
        pick = rng.integers(0, P, reads + warm + qd).tolist() if routed else None
        out = []
        # FIFO in order of arrival at the channel queue = order of delay exit (heap order).
        while len(out) < reads + warm:
            t_arr, rid, t_issue = heapq.heappop(events)
            if routed:
                c = pick[si]
                t_free = free_at[c]
            else:
                t_free = heapq.heappop(free_at)
            t_start = t_arr if t_arr > t_free else t_free
            t_done = t_start + svc[si]
            si += 1
            if routed:
                free_at[c] = t_done
            else:
                heapq.heappush(free_at, t_done)
            out.append(t_done - t_issue)
            heapq.heappush(events, (t_done + d, rid, t_done))
        return np.asarray(out[warm:])

    def exact(self, env, rng: np.random.Generator, recorder: Optional[Recorder] = None) -> "ExactDevice":
        return ChannelExactDevice(self, env, rng, recorder)

    def to_dict(self) -> dict:
        d = {"kind": "parametric_ssd", "name": self.name, "source": self.source,
             "qd1_latency_us": self.qd1_latency / US, "iops": self.iops_max,
             "parallelism": self.parallelism, "service_cv": self.service_cv}
        if self.routing != "shared":
            d["routing"] = self.routing
        if self.derived:
            d["derived"] = _derived_copy(self.derived)
        return d

    def __repr__(self) -> str:
        return (f"ParametricSSD(qd1={self.qd1_latency / US:g} us, iops={self.iops_max:g}, "
                f"parallelism={self.parallelism}, cv={self.service_cv:g}"
                + (f", routing={self.routing!r})" if self.routing != "shared" else ")"))


#: Largest bucket depth of a :class:`RateLimitedDevice`, reads: 10^10 (a gp2 volume's 5.4 million credits fit).
MAX_BURST_IOS = 1e10


class RateLimitedDevice(Device):
    """A rate-limited volume: a token bucket of ``cap_iops`` tokens a second and ``burst_ios`` tokens deep in
    front of a raw device (any :class:`Device`) -- a cloud block volume's provisioned IOPS, a cgroup read-IOPS
    throttle (:mod:`sim.device.bucket`).

    A read waits for its token, then is served by the raw device.  After a
    step's compute of ``c`` seconds, ``min(burst_ios, cap_iops x c)`` reads
    pass at the raw device's latency; in the long run no more than
    ``cap_iops`` reads a second pass.  Every simulator path applies the
    bucket: the exact per-read models read by read
    (:class:`~sim.device.engines.BucketExactDevice`), the fast mode's segment
    queue and the serving model's fluid device batch by batch (a batch
    completes when its raw reads are done and not before its last token plus
    :meth:`gate_tail`, the raw QD1 latency).

    The latency, batch and saturation methods are the raw device's (the queue
    behind the bucket); :meth:`peak_iops` and :meth:`iops` are capped, and
    :meth:`table` shows the steady closed loop: ``qd`` readers in the long run
    wait ``qd / cap_iops`` for each read when that is longer than the raw
    latency.

    Parameters
    ----------
    raw : Device
        The device behind the bucket.
    cap_iops : float
        Tokens a second, in ``(0, raw.peak_iops()]``.
    burst_ios : float
        Bucket depth, reads, in ``[1, MAX_BURST_IOS]``.
    name, source : str
    derived : mapping, optional
        What was derived or assumed, and by which rule (shown by ``engram sim device``).
    drained : bool
        Every simulated run starts with the bucket empty instead of full (:meth:`sustained`): the volume's
        steady state under a load above its cap, so that a run shorter than the burst measures the
        sustained rate, not the burst.

    Raises
    ------
    ArgumentError
        A raw device that is not a :class:`Device` or is itself rate-limited, figures out of range, or a
        cap above the raw device's peak IOPS (the bucket would never bind: one line naming both).
    """

    def __init__(self, raw: Device, cap_iops: float, burst_ios: float, name: Optional[str] = None,
                 source: str = "", derived: Optional[Mapping] = None, drained: bool = False):
        if not isinstance(raw, Device) or isinstance(raw, RateLimitedDevice):
            raise ArgumentError(f"RateLimitedDevice: raw must be a device without a bucket, got {raw!r:.60}")
        for key, v, lo, hi in (("cap_iops", cap_iops, MIN_IOPS, MAX_IOPS), ("burst_ios", burst_ios, 1.0, MAX_BURST_IOS)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or \
                    not math.isfinite(v) or not v >= lo or v > hi:
                raise ArgumentError(f"RateLimitedDevice: {key} = {v!r} is outside [{lo:g}, {hi:g}]")
        peak = raw.peak_iops()
        if cap_iops > peak * (1 + 1e-9):
            raise ArgumentError(f"cap_iops = {float(cap_iops):g} is above the raw device's peak of {peak:.0f} IOPS: "
                                "the bucket would never bind (give the raw device's iops above the cap)")
        self.raw, self.cap_iops, self.burst_ios = raw, float(cap_iops), float(burst_ios)
        self.name = name or f"{raw.name}+cap{cap_iops:g}iops-burst{burst_ios:g}"
        self.source = source or f"token bucket ({cap_iops:g} IOPS, {burst_ios:g} reads deep) over {raw.name}"
        self.derived = dict(derived) if derived else {}
        self.straggler = raw.straggler
        self.drained = bool(drained)

    # ------------------------------------------------ the queue behind the bucket: the raw device's
    def latency(self, qd: int) -> LatencyDist:
        return self.raw.latency(qd)

    def saturation_depth(self) -> int:
        return self.raw.saturation_depth()

    def parallel_reads(self) -> int:
        return self.raw.parallel_reads()

    def depths(self) -> list:
        return self.raw.depths()

    def is_point(self) -> bool:
        return self.raw.is_point()

    def _alone(self, n: int, k: int, size: int, rng: np.random.Generator):
        return self.raw._alone(n, k, size, rng)

    def batch_samples(self, n: int, k: int, size: Optional[int] = None, rng: Optional[np.random.Generator] = None):
        """The raw device's batch alone (a full bucket passes it whole when ``n <= burst_ios``)."""
        return self.raw.batch_samples(n, k, size, rng)

    def chain_excess(self, n: int, k: int) -> float:
        return self.raw.chain_excess(n, k)

    def nominal_batch(self, n: int, k: int) -> tuple:
        return self.raw.nominal_batch(n, k)

    # ------------------------------------------------------------ the bucket
    def bucket(self) -> TokenBucket:
        """A bucket for one simulated drive: full, or empty when :attr:`drained`."""
        b = TokenBucket(self.cap_iops, self.burst_ios)
        if self.drained:
            b.level = 0.0
        return b

    def sustained(self) -> "RateLimitedDevice":
        """This volume with every run starting at an empty bucket (see ``drained``): same name and figures."""
        return RateLimitedDevice(self.raw, self.cap_iops, self.burst_ios, self.name,
                                 self.source + "; runs start with the bucket drained (sustained)", self.derived,
                                 drained=True)

    def gate_tail(self) -> float:
        return self.raw.mean_latency(1)

    def iops(self, qd: int) -> float:
        """Long-run reads a second of ``qd`` closed-loop readers: the raw device's, at most ``cap_iops``."""
        return min(self.raw.iops(qd), self.cap_iops)

    def peak_iops(self) -> float:
        return min(self.raw.peak_iops(), self.cap_iops)

    def table(self, depths: Optional[Sequence[int]] = None) -> list:
        """Rows ``{qd, mean_us, p50_us, p99_us, iops}`` of the steady closed loop (each read at least
        ``qd / cap_iops``), with the raw device's ``raw_mean_us`` and ``raw_iops``."""
        out = []
        for q in depths or self.depths():
            d = self.raw.latency(q)
            floor = q / self.cap_iops
            out.append({"qd": int(q), "mean_us": max(d.mean, floor) / US, "p50_us": max(d.percentile(50), floor) / US,
                        "p99_us": max(d.percentile(99), floor) / US, "iops": min(q / d.mean, self.cap_iops),
                        "raw_mean_us": d.mean / US, "raw_iops": q / d.mean})
        return out

    def describe(self) -> dict:
        d = super().describe()
        d.update({"cap_iops": self.cap_iops, "burst_ios": self.burst_ios, "raw": self.raw.describe()})
        return d

    # ------------------------------------------------------------ simulation
    def exact(self, env, rng: np.random.Generator, recorder: Optional[Recorder] = None) -> "ExactDevice":
        return BucketExactDevice(self, self.raw.exact(env, rng, recorder), env, rng, recorder)

    def to_dict(self) -> dict:
        d = {"kind": "rate_limited", "name": self.name, "source": self.source, "cap_iops": self.cap_iops,
             "burst_ios": self.burst_ios, "raw": self.raw.to_dict()}
        if self.derived:
            d["derived"] = _derived_copy(self.derived)
        if self.drained:
            d["drained"] = True
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RateLimitedDevice":
        for key in ("cap_iops", "burst_ios", "raw"):
            if key not in d:
                raise FormatError(f"rate_limited device: missing field {key!r}")
        raw = Device.from_dict(d["raw"])
        try:
            return cls(raw, d["cap_iops"], d["burst_ios"], name=d.get("name"), source=d.get("source", ""),
                       derived=_derived(d, "rate_limited device"), drained=d.get("drained") is True)
        except ArgumentError as exc:
            raise FormatError(f"rate_limited device: {exc}") from None

    def __repr__(self) -> str:
        return f"RateLimitedDevice({self.raw!r}, cap_iops={self.cap_iops:g}, burst_ios={self.burst_ios:g})"
