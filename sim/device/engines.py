"""Simulating reads on a device model: a batch as one event (fast) or every read as an event (exact).

Two ways to simulate reads on a device, used by :mod:`sim.decode` and
:mod:`sim.prefill`:

- fast: a whole batch of ``n`` reads issued ``k`` at a time is one service
  event whose duration is drawn from :meth:`Device.batch_samples` (list
  scheduling of ``n`` latencies); batches of several clients stretch while
  they overlap, by the device's latency at their joint queue depth
  (:class:`FastDevice`);
- exact: every read is its own simpy event (:meth:`Device.exact`); kept to
  validate the fast mode and for the queueing checks (:func:`poisson_load`).

``device`` below is any :class:`sim.device.models.Device` (``ChannelExactDevice``:
a :class:`~sim.device.models.ParametricSSD`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .recorder import Recorder

__all__ = ["ChannelExactDevice", "ExactDevice", "FastDevice"]


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

    def __init__(self, device, rng: np.random.Generator, recorder: Optional[Recorder] = None,
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

    def __init__(self, device, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
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

    def __init__(self, device, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
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
