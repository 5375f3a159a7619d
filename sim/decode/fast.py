"""The fast mode of the decode model: sessions as generators on a plain event loop, batches on segment queues.

Each session is a generator that yields what it waits for -- a time
(``hash``, batch overhead, compute), a batch of reads (one per drive with
reads), a batch started in the background (the second table under
``overlap_layers``) and later joined.  The loop keeps a heap of session
wake-ups and asks each drive's :class:`~sim.device.fluid.SegmentQueue` for its
next completion; whichever comes first runs.  No simpy: a step costs a few
heap operations, so hundreds of sessions run at hundreds of thousands of
session-steps a second.

One session alone (no contention possible) skips the loop altogether: every
step's time is its reads' duration alone plus its compute, in arrays.  The
common case of many sessions (one drive, no overlap, no hash or batch
overhead) runs the device's queue inline (:meth:`FastRun._run_lean`), its statements compiled in
from the one text of the queue (:data:`sim.device.fluid.QUEUE`).

Simultaneous events: at the same time to the last bit, the device's
completions go before sessions' wake-ups.  The exact mode orders them as
simpy does (by when they were scheduled), and with fixed latencies and a
constant compute such ties are common and their floats differ by rounding:
the two modes can then settle in different but equally valid convoys of
sessions (e.g. the seed device, 4 sessions, 5 ms compute: +7%).  Any spread
in the latencies or the compute makes ties vanish.

With striped drives a batch is one batch per drive holding reads, its readers
split in proportion (:func:`split_readers`); the engine's readers take the
next read whatever its drive, so the fast mode approximates them (the exact
mode keeps every read's drive): within 5% of the exact mode in the tests.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, List, Optional, Sequence

import numpy as np

from ..device import FastDevice, SegmentQueue
from ..device.fluid import earliest, queue_function
from .lean_loop import LEAN_NAME, LEAN_TEMPLATE, lean_namespace
from sim.core.params import Policy

__all__ = ["FastRun", "split_readers"]

WAIT, IO, ASYNC, JOIN, IO1 = range(5)


def split_readers(k: int, parts: Sequence[int]) -> list:
    """Readers of each drive's share of a batch: ``k`` readers over drives holding ``parts[j]`` reads,
    in proportion (at least one for a drive with reads, at most its reads).  With fewer readers than
    drives with reads, the shares are read one drive after another (returned as several phases)."""
    idx = [j for j, n in enumerate(parts) if n]
    if not idx:
        return []
    n = sum(parts[j] for j in idx)
    if k < len(idx):
        return [[(j, parts[j], min(k, parts[j]))] for j in idx]
    return [[(j, parts[j], max(1, min(parts[j], int(round(k * parts[j] / n))))) for j in idx]]


#: The fast mode's common case (one drive, no overlap, no hash or batch overhead, :meth:`FastRun._run_lean`): the
#: sessions' steps on a heap of wake-ups, the device's queue (:data:`sim.device.fluid.QUEUE`) run inline -- this
#: loop is where hundreds of sessions spend their time -- and so is the sampler: its batch samples looked up by
#: the batch's reads ``n`` (readers ``kof[n]``), its uniform draws taken from its buffer in the order
#: :meth:`FastDevice.draw` takes them.  A session's step: its reads (if any) as one batch, then its compute.
_lean_loop = queue_function(LEAN_TEMPLATE, LEAN_NAME, lean_namespace())
try:  # the same text compiled at build time (setup.py), where it was built
    from ._native.lean import SOURCE as _BUILT_SOURCE, lean as _lean_built
except ImportError:  # not built (a checkout without its extensions built): the text as compiled above
    _BUILT_SOURCE = _lean_built = None
#: The loop :meth:`FastRun._run_lean` runs: :func:`_lean_loop` as the build compiled it (``sim.decode._native.lean``,
#: :mod:`sim.decode.lean_loop`) where the build's text is the text of now, else :func:`_lean_loop` itself -- the
#: same statements (its heaps of wake-ups and of segments on C arrays), the same runs bit for bit, the build's about
#: 2.3x faster (a capacity probe of 3,541 sessions).
LEAN = _lean_built if _BUILT_SOURCE == _lean_loop.source else _lean_loop


class FastRun:
    """One fast-mode run: the sessions' reads and computes through ``drives`` copies of one device.

    Parameters
    ----------
    sampler : FastDevice
        Draws each batch's duration alone and its ``sigma`` (shared by the drives: identical devices).
    drives : int
    policy : Policy
    reads : list of int64 [steps, layers]
        Device reads per session, step and table.
    by_drive : list of int64 [steps, layers, drives], optional
        The same per drive (``drives > 1``).
    computes : list of float64 [steps]
        Compute seconds per session and step.
    hash_time : float
    overlap : float
        Share of the compute that overlaps the second table's read (0: none).
    prefetch : list of int64 [steps], optional
        Speculative runs with the drafts' rows prefetched (:mod:`sim.decode.speculative`; one drive): per
        session, the rows of step ``t`` read in the background from the moment step ``t - 1``'s rows have
        arrived (``reads`` then holds only the rest, the critical path's); step ``t`` waits for them, then
        reads the rest, as ``engram.Session.step_many`` takes a prefetch's rows before reading the others.
    """

    def __init__(self, sampler: FastDevice, drives: int, policy: Policy, reads: List[np.ndarray],
                 by_drive: Optional[List[np.ndarray]], computes: List[np.ndarray], hash_time: float,
                 overlap: float, prefetch: Optional[List[np.ndarray]] = None):
        self.prefetch = None if prefetch is None else [np.asarray(p).tolist() for p in prefetch]
        self.sampler, self.drives, self.policy = sampler, drives, policy
        self.reads, self.by_drive, self.computes = reads, by_drive, computes
        self.hash_time, self.overlap = hash_time, overlap
        self.queues = [sampler.queue] + [SegmentQueue.of(sampler.device) for _ in range(drives - 1)]
        S = len(reads)
        steps = len(computes[0])
        if drives == 1:
            self._n = {"all": [r.sum(axis=1).tolist() for r in reads]}
            if overlap > 0:  # the first table apart from the rest: the second table read under the compute
                self._n.update(first=[r[:, 0].tolist() for r in reads],
                               rest=[r[:, 1:].sum(axis=1).tolist() for r in reads])
        self.lats = np.zeros((S, steps))
        self.stalls = np.zeros((S, steps))
        self.finish = [0.0] * S
        self.boxes = None  # (start, end, level) of the one-session path

    # ---------------------------------------------------------------- reads
    def _k(self, n: int) -> int:
        p = self.policy
        return 1 if n < p.threshold else (n if n < p.readers else p.readers)

    def _phases(self, s: int, t: int, tables: slice) -> list:
        """Phases (lists of ``(drive, reads, readers)`` read together) of session ``s``'s step ``t``."""
        if self.drives == 1:
            key = "all" if tables.start is None else ("first" if tables.start == 0 else "rest")
            n = self._n[key][s][t]
            return [[(0, n, self._k(n))]] if n else []
        parts = self.by_drive[s][t, tables].sum(axis=0).tolist()
        return split_readers(self._k(sum(parts)), parts)

    def _prefetch_phases(self, s: int, t: int) -> list:
        """Phases of the prefetched rows of session ``s``'s step ``t`` (one drive)."""
        n = self.prefetch[s][t] if self.prefetch is not None and t < len(self.prefetch[s]) else 0
        return [[(0, n, self._k(n))]] if n else []

    # ---------------------------------------------------------- one session
    def run_alone(self, begin: float) -> None:
        """One session: every step is its reads alone, then its compute (arrays, no events).  A rate-limited
        device's bucket carries from step to step: it runs through the device's queue (:meth:`run`)."""
        if self.queues[0].bucket is not None or self.prefetch is not None:
            self.run([begin])
            return
        ovh, h = self.policy.batch_overhead, self.hash_time
        draw = self.sampler.draw
        comp = self.computes[0]
        steps = comp.size
        overlap = self.overlap > 0 and self.reads[0].shape[1] > 1

        def io(phases):
            total, level = 0.0, 0.0
            for ph in phases:
                d = 0.0
                for _, n, k in ph:
                    dt = draw(n, k)[0]
                    lv = self.sampler.samples_of(n, k)[3]
                    level += lv * dt
                    d = dt if dt > d else d
                if any(k > 1 for _, _, k in ph) and ovh:
                    d += ovh
                total += d
            return total, level

        io_a = np.zeros(steps)
        io_b = np.zeros(steps)
        area = np.zeros(steps)
        for t in range(steps):
            if overlap:
                io_a[t], a1 = io(self._phases(0, t, slice(0, 1)))
                io_b[t], a2 = io(self._phases(0, t, slice(1, None)))
                area[t] = a1 + a2
            else:
                io_a[t], area[t] = io(self._phases(0, t, slice(None)))
        if overlap:
            ca = comp * self.overlap
            step = h + io_a + np.maximum(io_b, ca) + (comp - ca)
            busy = io_a + io_b
        else:
            step = h + io_a + comp
            busy = io_a
        starts = begin + np.concatenate([[0.0], np.cumsum(step)[:-1]])
        self.lats[0] = step
        self.stalls[0] = np.maximum(step - comp - h, 0.0)
        self.finish[0] = float(begin + step.sum())
        io_start = starts + h
        with np.errstate(invalid="ignore", divide="ignore"):
            level = np.where(busy > 0, area / np.where(busy > 0, busy, 1.0), 0.0)
        self.boxes = (io_start, io_start + busy, level)
        self.reads_done = int(self.reads[0].sum())
        self.area_done = float(area.sum())

    # --------------------------------------------------------- many sessions
    def _session(self, s: int):
        """Session ``s`` as a generator of waits and reads (see the module)."""
        comp = self.computes[s].tolist()
        h = self.hash_time
        ovh = self.policy.batch_overhead
        overlap = self.overlap > 0 and self.reads[s].shape[1] > 1
        lat, stl = self.lats[s], self.stalls[s]
        now = yield None
        if self.drives == 1 and not overlap and not ovh and self.prefetch is None:  # the common case, lean
            thr, width = self.policy.threshold, self.policy.readers
            ns = self._n["all"][s]
            for t in range(len(comp)):
                t0 = now
                c = comp[t]
                if h:
                    now = yield (WAIT, h)
                n = ns[t]
                if n:
                    now = yield (IO1, n, 1 if n < thr else (n if n < width else width))
                now = yield (WAIT, c)
                lat[t] = now - t0
                stl[t] = now - t0 - c - h
            return
        frac = self.overlap
        phases = self._phases
        every = slice(None)
        first, rest = slice(0, 1), slice(1, None)
        pending = None  # the prefetch of this step's drafts' rows, issued during the step before

        def prefetch(t):
            """Issue step ``t``'s prefetch (generator step): the handle, or None."""
            later = self._prefetch_phases(s, t)
            if not later:
                return None
            o = ovh if any(k > 1 for ph in later for _, _, k in ph) else 0.0
            return (ASYNC, later, o)

        for t in range(len(comp)):
            t0 = now
            c = comp[t]
            if h:
                now = yield (WAIT, h)
            if pending is not None:  # the prefetched rows first, then the rest (engram.Session.step_many)
                now = yield (JOIN, pending)
                pending = None
            for ph in phases(s, t, first if overlap else every):
                if ovh and any(k > 1 for _, _, k in ph):
                    now = yield (WAIT, ovh)
                now = yield (IO, ph)
            if overlap:  # the second table's reads in the background, under the first part of the compute
                later = phases(s, t, rest)
                handle = None
                if later:
                    o = ovh if any(k > 1 for ph in later for _, _, k in ph) else 0.0
                    now = yield (ASYNC, later, o)
                    handle = self._handle
                now = yield (WAIT, c * frac)
                if handle is not None:
                    now = yield (JOIN, handle)
            cmd = prefetch(t + 1)
            if cmd is not None:
                now = yield cmd
                pending = self._handle
            now = yield (WAIT, c * (1 - frac) if overlap else c)
            lat[t] = now - t0
            stl[t] = now - t0 - c - h

    def _lean(self) -> bool:
        """The common case (one drive, no overlap, no hash or batch overhead): :meth:`_run_lean`."""
        p = self.policy
        return (self.drives == 1 and not self.hash_time and not p.batch_overhead and self.prefetch is None
                and not (self.overlap > 0 and self.reads[0].shape[1] > 1))

    def _run_lean(self, begin: Sequence[float], tick) -> None:
        """Every session as a state (its step and when it began), no generators: :data:`LEAN`, the readers
        of each batch size looked up once; a step's stall is its latency less its compute, computed once at the
        end (the same subtraction).  (``tests/sim/test_decode.py`` checks that this loop and the general one give
        the same run.)"""
        S = len(self.reads)
        ns = self._n["all"]
        comps = [c.tolist() for c in self.computes]
        lat_rows = [[0.0] * len(comps[0]) for _ in range(S)]
        thr, width = self.policy.threshold, self.policy.readers
        top = max((max(r) for r in ns if r), default=0)
        kof = [1 if n < thr else (n if n < width else width) for n in range(top + 1)]
        wake = [(float(b), i, i) for i, b in enumerate(begin)]
        heapq.heapify(wake)
        LEAN(self.queues[0], self.sampler, wake, ns, comps, kof, lat_rows, [0] * S, [0.0] * S, self.finish, tick)
        self.lats = np.asarray(lat_rows)
        self.stalls = np.maximum(self.lats - np.asarray(self.computes, dtype=np.float64), 0.0)

    def run(self, begin: Sequence[float], tick: Optional[Callable[[int], None]] = None,
            lean: bool = True) -> None:
        """All sessions, session ``i`` starting at ``begin[i]``; ``tick(n)`` counts finished sessions;
        ``lean=False`` takes the general loop even in the common case (to check one against the other)."""
        if lean and self._lean():
            self._run_lean(begin, tick)
            return
        S = len(self.reads)
        gens = [self._session(s) for s in range(S)]
        for g in gens:
            next(g)
        heap = [(float(b), i + 1, i, None) for i, b in enumerate(begin)]
        heapq.heapify(heap)
        submit, start_phase = self._submitters()
        resume = self._resumer(gens, heap, tick, submit, start_phase)
        self._loop(heap, resume, start_phase)

    def _submitters(self) -> tuple:
        """``(submit, start_phase)``: a part ``(drive, reads, readers)`` of a phase submitted to its drive's
        queue with a batch sample drawn, and the next phase of a background read ``h`` started."""
        queues = self.queues
        sampler = self.sampler
        cache = sampler._cache
        samples_of = sampler.samples_of
        uniform = sampler._uniform

        def submit(now, part, owner):
            j, n, k = part
            got = cache.get((n, k))
            if got is None:
                got = samples_of(n, k)
            sig = got[1]
            x = 0 if len(sig) == 1 else int(uniform() * len(sig))
            queues[j].submit(now, n, k, sig[x], owner, got[2][x], got[4])

        def start_phase(now, h):
            ph = h[2].pop(0)
            h[0] = len(ph)
            for part in ph:
                submit(now, part, h)

        return submit, start_phase

    def _resumer(self, gens: list, heap: list, tick, submit, start_phase) -> Callable[[int, float], None]:
        """``resume(i, now)``: session ``i``'s generator sent ``now`` and its commands carried out until it waits
        (a time pushed on ``heap``, reads submitted, a background read joined) or ends."""
        q0 = self.queues[0]
        sampler = self.sampler
        cache = sampler._cache
        samples_of = sampler.samples_of
        uniform = sampler._uniform
        finish = self.finish
        push = heapq.heappush
        seq = [len(gens) + 1]

        def resume(i, now):
            g = gens[i]
            while True:
                try:
                    cmd = g.send(now)
                except StopIteration:
                    finish[i] = now
                    if tick is not None:
                        tick(1)
                    return
                op = cmd[0]
                if op == WAIT:
                    seq[0] += 1
                    push(heap, (now + cmd[1], seq[0], i, None))
                    return
                if op == IO1:
                    n, k = cmd[1], cmd[2]
                    got = cache.get((n, k))
                    if got is None:
                        got = samples_of(n, k)
                    sig = got[1]
                    x = 0 if len(sig) == 1 else int(uniform() * len(sig))
                    q0.submit(now, n, k, sig[x], i, got[2][x], got[4])
                    return
                if op == IO:
                    ph = cmd[1]
                    if len(ph) == 1:
                        submit(now, ph[0], i)
                    else:
                        h = [len(ph), i, []]
                        for part in ph:
                            submit(now, part, h)
                    return
                if op == ASYNC:  # background read: [reads left in its phase, waiter, phases to come]
                    h = [1, -1, list(cmd[1])]
                    self._handle = h
                    if cmd[2] > 0:
                        seq[0] += 1
                        push(heap, (now + cmd[2], seq[0], -1, h))
                    else:
                        start_phase(now, h)
                    continue
                h = cmd[1]  # JOIN
                if h[0] == 0 and not h[2]:
                    continue
                h[1] = i
                return

        return resume

    def _loop(self, heap: list, resume, start_phase) -> None:
        """The event loop of :meth:`run`: the earliest of the sessions' wake-ups and the drives' completions, in
        turn, until neither is left."""
        queues = self.queues
        q0 = queues[0]
        one = len(queues) == 1
        pop = heapq.heappop
        inf = math.inf
        while True:
            td, jd = (q0.tnext, 0) if one else earliest(queues)
            if heap and heap[0][0] < td:  # at a tie, the device first (see the module)
                t, _, i, h = pop(heap)
                if i >= 0:
                    resume(i, t)
                else:
                    start_phase(t, h)
                continue
            if td == inf:
                break
            for b in queues[jd].complete(td):
                o = b[0]
                if o.__class__ is int:
                    resume(o, td)
                    continue
                o[0] -= 1
                if o[0]:
                    continue
                if o[2]:
                    start_phase(td, o)
                elif o[1] >= 0:
                    w, o[1] = o[1], -1
                    resume(w, td)
