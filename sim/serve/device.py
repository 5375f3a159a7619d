"""The serving model's device: whole batches of reads sharing one device's throughput, one event per batch.

A serving engine puts two kinds of batches on the same device: a decode step's ``B x 48`` rows
(tens to thousands of reads) and its background prefill reader's chunks (tens of thousands of reads
each, SPEC §8).  The decode model's fast mode (:mod:`sim.device.fluid`) moves a batch one round of
``readers`` reads at a time; a prefill chunk would cost thousands of events there, and an hour of
serving hundreds of millions.  Here a batch is one fluid:

- batch ``i`` keeps ``c_i = min(n_i, readers)`` reads in the device while it runs (its readers
  issue the next read as soon as one completes);
- with ``q = sum(c_i)`` reads in the device every read progresses at the rate ``1 / L(q)``, ``L``
  the device's mean latency at depth ``q`` (:meth:`sim.device.Device.mean_latency`), and beyond
  the depth the device serves at once (``Q``, its saturation depth) at ``1 / (L(Q) q / Q)`` --
  the same throughput, shared: the round-robin of FIFO rounds :mod:`sim.device.fluid` gives, as a
  processor-sharing fluid;
- one virtual clock ``V`` (``dV/dt = 1 / L(q)``) serves every batch, so batch ``i`` finishes when
  ``V`` has advanced by ``sigma_i = t_i / L(c_i)`` since it started, ``t_i`` its duration alone:
  finishing batches come off a heap in ``O(log)``;
- ``t_i`` is drawn from the exact per-read model's own distribution of the batch alone
  (:meth:`sim.device.Device.batch_samples`), as the decode model's fast mode draws it, so a batch
  alone takes exactly its drawn time (:class:`BatchTimes`).

A rate-limited device (:class:`~sim.device.RateLimitedDevice`) adds its token bucket
(:class:`~sim.device.bucket.TokenBucket`), as the decode model's segment queue does: a batch takes its ``n``
tokens when it arrives and completes when the fluid has served it and not before its last token plus the raw
device's QD1 latency (held in a heap of its own until then).

The queue is the decode model's own (:class:`~sim.device.fluid.SegmentQueue`, its statements written once in
:data:`~sim.device.fluid.QUEUE`), with room for every batch at once and each batch one segment that leaves no
reads behind.  So a decode batch meeting a prefill chunk gets the share of the device its readers hold; the
batch-level events (a submit and a completion per batch) keep an hour of serving at 10 requests/s
to a few hundred thousand device events.  Little's law holds by construction: the integral of the
reads in the device is the sum over batches of ``c_i`` times their duration, which is the sum of
their reads' latencies.
"""

from __future__ import annotations

import math
import sys
import weakref

import numpy as np

from ..device import Device
from ..device.alone import sample_size
from ..device.fluid import SegmentQueue, queue_function

__all__ = ["BatchTimes", "SharedDevice"]

#: Samples drawn of a short batch's duration alone (the decode model draws up to 4096; 512 keep a short
#: batch's distribution to about 4% at the 99th percentile and its mean to a fraction of a percent).
ALONE_SAMPLES = 512

#: Rounds of readers a batch drawn from the exact model has at least before longer ones extrapolate (the decode
#: model's :data:`Device.END_WAVES` is 16: each extra size simulated costs its reads x readers x samples, and a
#: serving run meets thousands of sizes; 4 rounds keep the last round's stragglers and the mean within 1%).
EXACT_WAVES = 4

_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class BatchTimes:
    """Durations of batches alone on ``device``, drawn with ``rng`` (seconds).

    Batches of up to ``m = max(Device.EXACT_BATCH_LIMIT, EXACT_WAVES * k)`` reads draw from
    :meth:`Device.batch_samples` (the exact per-read model, simulated once per ``(n, k)`` with a seed
    of ``(n, k)`` and cached per device for the life of the process: a property of the device, not of
    a run).  Longer batches add their remaining whole rounds of ``k`` reads at the steady depth to a
    batch of ``m + ((n - m) mod k)`` reads: their mean latency, plus a normal spread of the sum of
    the extra reads' latencies -- the approximation :meth:`Device.batch_samples` itself makes for
    long batches -- exact for a device of fixed latencies.
    """

    def __init__(self, device: Device, rng: np.random.Generator):
        self.device, self.rng = device, rng
        self.Q = int(device.saturation_depth())
        try:
            self._cache = _CACHES.setdefault(device, {})
        except TypeError:  # not weak-referenceable: a cache of its own
            self._cache = {}
        self._u: list = []
        self._z: list = []

    def _uniform(self) -> float:
        if not self._u:
            self._u = self.rng.random(4096).tolist()
        return self._u.pop()

    def _normal(self) -> float:
        if not self._z:
            self._z = self.rng.standard_normal(4096).tolist()
        return self._z.pop()

    def samples(self, n: int, k: int) -> list:
        """Durations alone (seconds) of ``n <= limit(k)`` reads by ``k`` readers: the cached draws."""
        key = (n, k)
        got = self._cache.get(key)
        if got is None:
            rng = np.random.default_rng(1_000_003 * n + k)
            t, _ = self.device.batch_samples(n, k, size=min(sample_size(n), ALONE_SAMPLES), rng=rng)
            got = self._cache[key] = t.tolist()
        return got

    def limit(self, k: int) -> int:
        """The longest batch drawn from the exact model: :data:`Device.EXACT_BATCH_LIMIT` reads, or
        :data:`EXACT_WAVES` rounds of the readers in service."""
        ks = max(1, min(k, self.Q))
        return max(Device.EXACT_BATCH_LIMIT, EXACT_WAVES * ks)

    def steady(self, ks: int) -> tuple:
        """``(mean, std)`` seconds of one read at depth ``ks`` (cached)."""
        key = ("steady", ks)
        got = self._cache.get(key)
        if got is None:
            d = self.device.latency(ks)
            got = self._cache[key] = (float(d.mean), 0.0 if d.is_point else float(d.std))
        return got

    def draw(self, n: int, k: int) -> float:
        """One batch of ``n >= 1`` reads by ``k >= 1`` readers alone: its duration, seconds."""
        k = k if k < n else n
        m = self.limit(k)
        if n <= m:
            s = self.samples(n, k)
            return s[0] if len(s) == 1 else s[int(self._uniform() * len(s))]
        ks = max(1, min(k, self.Q))
        base_n = m + (n - m) % ks
        s = self.samples(base_n, k)
        t = s[0] if len(s) == 1 else s[int(self._uniform() * len(s))]
        extra = n - base_n
        mean, std = self.steady(ks)
        t += extra * mean / ks
        if std > 0:
            t += math.sqrt(extra) * std / ks * self._normal()
        return max(t, 0.0)


class SharedDevice(SegmentQueue):
    """One drive in the serving model (see the module docstring); times in seconds: the decode model's queue
    (:class:`~sim.device.fluid.SegmentQueue`, its statements :data:`~sim.device.fluid.QUEUE`) with no slots to wait
    for, each batch one segment of its readers' reads in the device.

    Attributes
    ----------
    area : float
        Integral of the reads in the device over time (read-seconds): the sum of the reads' latencies.
    busy : float
        Time with any read in the device.
    reads : int
        Reads completed (whole batches).
    batch_area, batches : float, int
        Sum over finished batches of their reads in the device times their duration (read-seconds), and
        their count: ``batch_area / reads`` is the mean latency of a read (Little's law, batch by batch).
    times, depths : list
        Time and reads in the device after each change (when ``record``).
    max_depth : int
    tnext : float
        When the next batch finishes (inf: idle).
    """

    __slots__ = ("batch_area", "batches")

    def __init__(self, device: Device, record: bool = True):
        super().__init__(device.saturation_depth(), device.mean_latency, "own", record, device.bucket(),
                         device.gate_tail())
        self.room, self.slack = sys.maxsize, 0  # every batch is served at once, whole
        self.batch_area = 0.0
        self.batches = 0

    submit = queue_function('''
        def submit(sq, now, n, k, alone, owner):
            """A batch of ``n >= 1`` reads by ``k >= 1`` readers arrives at ``now``; it would take ``alone`` seconds
            by itself.  ``owner`` comes back from :meth:`complete` when it finishes."""
            @load
            c = k if k < n else n
            if c >= nL:
                sq._deeper(c)
                nL = len(L)
            left, sigma, extra, ref = 0, alone / L[c], 0.0, 1.0
            @advance
            @submit
            @settle
            @store
        ''', "SharedDevice.submit")

    complete = queue_function('''
        def complete(sq, now):
            """Advance to ``now`` (the time :attr:`tnext` announced); returns the owners of the batches finished."""
            @load
            done = []
            served = reads
            @advance
            @complete
            @settle
            reads = served  # counted as batches finish (the queue counts segments as they leave service)
            owners = []
            if done:
                area_b = sq.batch_area
                for bt in done:
                    reads += bt[5]
                    area_b += bt[9] * (now - bt[4])
                    owners.append(bt[0])
                sq.batch_area = area_b
                sq.batches += len(done)
            @store
            return owners
        ''', "SharedDevice.complete")
