"""Simulating reads on a device model: batches as segments (fast), or every read as an event (exact).

Two ways to simulate reads on a device, used by :mod:`sim.decode` and
:mod:`sim.decode.prefill`:

- exact: every read is its own simpy event.  :class:`SlotExactDevice` (any
  device described by its latency at each queue depth): ``slots`` reads are
  served at once, a read in service progressing at the rate ``1 / L_q(u)``
  while ``q`` reads are served (``u`` its own uniform draw: at a steady depth
  its latency is the measured distribution's), the others waiting in FIFO
  order.  :class:`ChannelExactDevice` (a
  :class:`~sim.device.models.ParametricSSD`): a fixed delay, then a FIFO queue
  on ``parallelism`` channels.  :class:`BucketExactDevice` (a
  :class:`~sim.device.models.RateLimitedDevice`): each read waits for its token
  (:class:`~sim.device.bucket.TokenBucket`), then goes to the raw device's own
  exact model.  Each read thus meets the queue depth it
  actually finds, for its whole life;
- fast: :class:`FastDevice` -- a batch's duration alone is drawn from the
  exact model's own distribution (:meth:`Device.batch_samples`), and batches
  of several clients share the device through a
  :class:`~sim.device.fluid.SegmentQueue` (slots, FIFO order, the next round of
  reads behind the reads that came meanwhile), a few events per batch.

``device`` below is any :class:`sim.device.models.Device`.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional

import numpy as np

from .fluid import SegmentQueue
from .recorder import Recorder

__all__ = ["BucketExactDevice", "ChannelExactDevice", "ExactDevice", "FastDevice", "SlotExactDevice"]


class _Uniforms:
    """Uniform draws in [0, 1) from ``self.rng``, ``_UNIFORM_CHUNK`` at a time: the list ``_u``, the next at
    ``_ui``."""

    _UNIFORM_CHUNK = 65536

    def _uniform(self) -> float:
        if self._ui >= len(self._u):
            self._u = self.rng.random(self._UNIFORM_CHUNK).tolist()
            self._ui = 0
        v = self._u[self._ui]
        self._ui += 1
        return v


class FastDevice(_Uniforms):
    """Batches of reads in the fast mode: durations alone from the exact model, sharing by a segment queue.

    :meth:`draw` gives a batch's duration alone (a sample of
    :meth:`Device.batch_samples`, cached per ``(n, k)``) and how the queue
    reproduces it (``sigma`` and ``extra``, see :mod:`sim.device.fluid`);
    :attr:`queue` is the device's
    :class:`~sim.device.fluid.SegmentQueue`.  :meth:`issue` is a batch alone;
    :meth:`submit` a batch among others, as a simpy event (``env`` needed).
    """

    def __init__(self, device, rng: np.random.Generator, recorder: Optional[Recorder] = None,
                 samples: Optional[int] = None, env=None):
        self.device, self.rng, self.rec, self.samples, self.env = device, rng, recorder, samples, env
        self.queue = SegmentQueue.of(device)
        self._cache: dict = {}
        self._u: list = []
        self._ui = 0
        self._version = 0

    def samples_of(self, n: int, k: int) -> tuple:
        """``(times, sigmas, extras, level, ref)`` of a batch of ``n`` reads by ``k`` readers (cached): its
        durations alone; per duration the work of each read and the extra delay after its last segment
        (see :mod:`sim.device.fluid`); the mean reads in the device; the ``ref`` of the extras."""
        key = (n, k)
        got = self._cache.get(key)
        if got is None:
            t, a = self.device.batch_samples(n, k, size=self.samples, rng=self.rng)
            nom, _, ref = self.device.nominal_batch(n, k)
            if self.device.straggler == "own":
                # the mean excess over the nominal batch is a delay; with a channel for each reader (up to 4/3
                # readers a channel) it stays whole on a busy device; with two or more readers a channel it is
                # channels idle in the drain, which a busy device fills (linear between)
                excess = max(float(t.mean()) - nom, 0.0)
                ref = min(1.0, max(0.0, 4.0 * self.device.parallel_reads() / min(n, k) - 2.0))
            else:
                # the excess is the longest chain of reads past the rounds, in units of work (a straggler read
                # in service); alone it is served at the latency of depth 1, so the rounds take the rest
                excess = self.device.chain_excess(n, k) * self.device.mean_latency(1)
            # each draw's deviation from the mean is its reads' own work, so the device does its mean work
            extra = np.minimum(np.full(t.size, excess), t) if nom > 0 else t.copy()
            sig = (t - extra) / nom if nom > 0 else np.zeros(t.size)
            got = (t.tolist(), sig.tolist(), extra.tolist(), float(a.sum() / t.sum()) if t.sum() > 0 else 0.0,
                   ref)
            self._cache[key] = got
        return got

    def draw(self, n: int, k: int) -> tuple:
        """``(duration alone, sigma, extra, ref)`` of one batch of ``n >= 1`` reads by ``k`` readers."""
        times, sig, extra, _, ref = self.samples_of(n, k)
        i = 0 if len(times) == 1 else int(self._uniform() * len(times))
        return times[i], sig[i], extra[i], ref

    # ------------------------------------------------------------ one client
    def issue(self, now: float, n: int, k: int) -> float:
        """Duration (seconds) of a batch of ``n >= 1`` reads with ``k`` readers, alone on the device."""
        k = k if k < n else n
        dt = self.draw(n, k)[0]
        if self.rec is not None:
            level = self.samples_of(n, k)[3]
            self.rec.box(now, now + dt, level, n, level * dt)
        return dt

    # ------------------------------------------------------------ shared
    def submit(self, n: int, k: int):
        """A simpy event that succeeds when a batch of ``n >= 1`` reads with ``k`` readers completes."""
        env = self.env
        k = k if k < n else n
        _, sigma, extra, ref = self.draw(n, k)
        ev = env.event()
        self.queue.submit(env.now, n, k, sigma, ev, extra, ref)
        self._plan()
        return ev

    def _plan(self) -> None:
        self._version += 1
        t = self.queue.tnext
        if t == math.inf:
            return
        v = self._version
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e, v=v: self._fire(v))

    def _fire(self, v: int) -> None:
        if v != self._version:
            return
        now = self.env.now
        for b in self.queue.complete(now):
            if self.rec is not None:
                self.rec.box(b[4], now, 0.0, b[5], 0.0)
            b[0].succeed(now - b[4])
        self._plan()


class ExactDevice:
    """Base of the per-read models: readers, batches and the recorder; subclasses serve one read.

    :meth:`read` is one read issued alone; :meth:`batch` is ``n`` reads by
    ``k`` readers, each taking the next read as soon as its previous one
    completes.  The recorder gets a box per read and the reads in the device
    after each change (``counter``).
    """

    def __init__(self, device, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
        self.device, self.env, self.rng, self.rec = device, env, rng, recorder
        #: Reads between issue and completion (kept in ``recorder.counter``).
        self.in_device = 0

    def _count(self, delta: int) -> None:
        self.in_device += delta
        if self.rec is not None:
            self.rec.counter.append((self.env.now, self.in_device))

    def _serve(self):
        """One read (generator); subclasses implement it."""
        raise NotImplementedError

    def read(self):
        """One read (generator)."""
        env = self.env
        t0 = env.now
        self._count(1)
        yield from self._serve()
        self._count(-1)
        if self.rec is not None:
            self.rec.box(t0, env.now, 1.0, 1, env.now - t0)

    def _reader(self, remaining: list):
        while True:
            yield from self.read()
            if remaining[0] > 0:
                remaining[0] -= 1
                continue
            return

    def batch(self, n: int, k: int):
        """``n`` reads by ``k`` readers (generator); returns when all completed."""
        if n <= 0:
            return
        k = min(k, n)
        remaining = [n - k]
        env = self.env
        if k == 1:
            yield from self._reader(remaining)
            return
        yield env.all_of([env.process(self._reader(remaining)) for _ in range(k)])


class SlotExactDevice(ExactDevice, _Uniforms):
    """The per-read model of a device described by its latency at each queue depth (see the module).

    ``slots = device.saturation_depth()`` reads are served at once; a read in
    service while ``q`` are served progresses at ``1 / L_q(u)`` (``u`` drawn
    once per read, ``L_q`` the quantile function at depth ``q``); the others
    wait in FIFO order.  The recorder's ``wait`` list gets each read's time in
    the queue.
    """

    _UNIFORM_CHUNK = 4096

    def __init__(self, device, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
        super().__init__(device, env, rng, recorder)
        Q = self.slots = int(device.saturation_depth())
        self.u = np.zeros(Q)
        self.rem = np.full(Q, math.inf)
        self.L = np.ones(Q)
        self.events: list = [None] * Q
        self.free = list(range(Q - 1, -1, -1))
        self.q = 0
        self.t_last = 0.0
        self.waiting: deque = deque()
        self._version = 0
        self._dist: dict = {}
        self._u: list = []
        self._ui = 0

    def _knots(self, q: int) -> tuple:
        got = self._dist.get(q)
        if got is None:
            d = self.device.latency(q)
            got = self._dist[q] = (d.u, d.q)
        return got

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.t_last
        if dt > 0 and self.q:
            self.rem -= dt / self.L
        self.t_last = now

    def _rates(self) -> None:
        if self.q:
            u, qv = self._knots(self.q)
            self.L = np.maximum(np.interp(self.u, u, qv), 1e-15)

    def _admit(self) -> bool:
        changed = False
        while self.waiting and self.free:
            ev, t_q = self.waiting.popleft()
            s = self.free.pop()
            self.u[s] = self._uniform()
            self.rem[s] = 1.0
            self.events[s] = ev
            self.q += 1
            changed = True
            if self.rec is not None:
                self.rec.wait.append(self.env.now - t_q)
        return changed

    def _plan(self) -> None:
        self._version += 1
        if not self.q:
            return
        ttf = self.rem * self.L
        dt = float(ttf.min())
        v = self._version
        ev = self.env.timeout(max(dt, 0.0))
        ev.callbacks.append(lambda _e, v=v: self._fire(v))

    def _fire(self, v: int) -> None:
        if v != self._version:
            return
        self._advance()
        ttf = self.rem * self.L
        done = np.flatnonzero(ttf <= 1e-12 + 1e-9 * self.L)
        if done.size == 0:
            done = np.array([int(ttf.argmin())])
        evs = []
        for s in done.tolist():
            evs.append(self.events[s])
            self.events[s] = None
            self.rem[s] = math.inf
            self.free.append(s)
            self.q -= 1
        self._admit()
        self._rates()
        self._plan()
        for ev in evs:
            ev.succeed()

    def request(self):
        """An event that succeeds when a read issued now completes."""
        self._advance()
        ev = self.env.event()
        self.waiting.append((ev, self.env.now))
        if self._admit():
            self._rates()
            self._plan()
        return ev

    def _serve(self):
        yield self.request()


class ChannelExactDevice(ExactDevice):
    """Per-read model of :class:`ParametricSSD`: fixed delay, then a FIFO queue on ``parallelism`` channels
    (``routing="random"``: a FIFO queue of its own at each channel, a read joining a channel drawn at random).

    The recorder's ``wait`` list gets each read's time in the channel queue.
    """

    def __init__(self, device, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
        import simpy

        super().__init__(device, env, rng, recorder)
        self.routed = getattr(device, "routing", "shared") == "random"
        self.channels = simpy.Resource(env, capacity=device.parallelism)
        self.queues = [simpy.Resource(env, capacity=1) for _ in range(device.parallelism)] if self.routed else None
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
        if dev.delay > 0:
            yield env.timeout(dev.delay)
        res = self.queues[int(self.rng.integers(len(self.queues)))] if self.routed else self.channels
        with res.request() as req:
            t_q = env.now
            yield req
            if self.rec is not None:
                self.rec.wait.append(env.now - t_q)
            yield env.timeout(self._service())


class BucketExactDevice(ExactDevice):
    """Per-read model of a :class:`~sim.device.models.RateLimitedDevice`: each read waits for its token of the
    device's :class:`~sim.device.bucket.TokenBucket` (granted in issue order), then is served by ``inner``, the
    raw device's own exact model.  The recorder's ``wait`` list gets the raw device's queue waits; the time
    waiting for a token counts as time in the device (a volume's latency)."""

    def __init__(self, device, inner: ExactDevice, env, rng: np.random.Generator, recorder: Optional[Recorder] = None):
        super().__init__(device, env, rng, recorder)
        self.inner = inner
        self.gate = device.bucket()

    def _serve(self):
        env = self.env
        t = self.gate.take(env.now, 1)
        if t > env.now:
            yield env.timeout(t - env.now)
        yield from self.inner._serve()
