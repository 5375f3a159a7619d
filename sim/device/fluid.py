"""The fast mode's device: batches as segments of reads that share service slots and queue in FIFO order.

The exact model of a device (:mod:`sim.device.engines`) serves ``slots`` reads
at once -- each progressing at the rate ``1 / L(q)`` while ``q`` reads are
served -- and queues the rest in FIFO order; a reader issues its next read,
at the tail of the queue, as soon as its previous one completes.  This module
keeps that structure but moves whole groups of reads at a time:

- a batch of ``n`` reads by ``k`` readers enters as one *segment* of
  ``min(n, k)`` reads at the tail of the queue; the head of the queue takes
  free slots, a segment splitting when only part of it fits (by more than
  an eighth of the slots: a smaller overflow is served whole, at the
  saturated latency -- the same throughput -- so segments do not splinter);
- the reads of a segment in service finish together, after ``sigma`` units
  of work at the rate ``1 / L(q)`` (``L`` the device's mean latency at the
  depth ``q`` in service): one virtual clock ``V`` with ``dV/dt = 1 / L(q)``
  serves every read, so finishing segments come off a heap in ``O(log)``;
- when a segment finishes, its readers issue the batch's next reads as one
  segment at the tail of the queue;
- a batch's duration alone on the device is drawn from the exact model's own
  distribution (:mod:`sim.device.alone`) and compared with the duration this
  queue gives it alone at mean latencies (:func:`nominal_batch`).  When the
  mean drawn duration is longer, the batch waits for its slowest reads (its
  readers' chains of reads are not all equally long): the mean difference
  becomes its *straggler* after its last segment, and each draw's deviation
  from the mean scales its reads' work ``sigma`` (so the device does its mean
  work).  On a device whose reads share its service
  (``straggler="shared"``: the slots of :class:`~sim.device.engines.SlotExactDevice`)
  the straggler is one more read in service whose work is the batch's longest
  chain of reads past its rounds (:meth:`Device.chain_excess`: what a busy
  device, where every read progresses alike, leaves it); alone it is served at
  the latency of depth 1 and the batch's rounds take the rest of its drawn
  duration.  On a device whose reads, once served, are their own
  (``straggler="own"``: channels, or measured batches whose excess is the
  reader's own overhead) it is a delay.  With about a channel for each of its
  readers the batch's excess is its own (its readers' chains of reads are not
  equally long) and stays whole; with two or more readers a channel it queues
  within itself, and the excess is channels left idle while it drains, which
  other batches fill on a busy device: it is then scaled by the batch's share
  of the reads in service when its last segment finishes (the share that
  stays, ``ref``, falls linearly from 1 at 4/3 readers a channel to 0 at 2,
  fitted on the exact model's channels).  Either way the device
  serves others meanwhile, so stragglers do not lower its throughput.
  Alone, a batch takes
  exactly its drawn time; together with others, its reads wait and share
  slots as the exact model's would, group by group.

A rate-limited device (:class:`~sim.device.models.RateLimitedDevice`) gives
the queue a :class:`~sim.device.bucket.TokenBucket`: a batch takes its ``n``
tokens when it arrives, its reads are served by the raw device as above, and
it completes when they are done and not before its last token plus ``tail``
(the raw device's QD1 latency: the last read, issued on its token): a batch
whose tokens are there passes at the raw device's speed, one that finds the
bucket empty at ``n / rate``.  Such a batch waits in the ``late`` heap, as an
own straggler does.  (The raw device sees the batch's reads at once, not as
their tokens come: when the bucket binds the raw queue is deeper than it is;
the bucket's rate is the tighter bound then.)

So the sharing of the device between sessions is the exact model's -- slots,
FIFO order, the next round of a batch behind the reads that came meanwhile --
while the events are a few per batch instead of a few per read.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, List, Sequence, Tuple

__all__ = ["SegmentQueue", "nominal_batch"]

# Fields of a batch (a list, for speed); NB: not before this time (its last token plus the raw latency; 0: none).
OWNER, LEFT, INSYS, SIGMA, START, READS, EXTRA, REF, NB = range(9)


class FluidClock:
    """What a device serving its reads as a fluid keeps (:class:`SegmentQueue`, the serving model's
    :class:`sim.serve.device.SharedDevice`): the mean latency ``L[q]`` of a read at each depth ``q`` up to the
    slots ``Q`` (``L[0]`` unused), the virtual clock ``V`` at time ``t`` (``dV/dt = 1 / L(q)``), the reads in
    service ``q``, the heap of what is in service by the ``V`` it finishes at and ``late`` (served, waiting for
    its last token), and the counters of its timeline (``area``, ``busy``, ``reads``; ``times`` and ``depths``
    when ``record``; ``tnext``, ``max_depth``), all starting at time 0 with the device empty."""

    __slots__ = ("Q", "L", "V", "t", "q", "heap", "late", "seq", "area", "busy", "reads", "times", "depths",
                 "record", "tnext", "max_depth")

    def __init__(self, slots: int, mean_latency: Callable[[int], float], record: bool = True):
        self.Q = int(slots)
        self.L = [0.0] + [max(float(mean_latency(q)), 1e-15) for q in range(1, self.Q + 1)]
        self.V = 0.0
        self.t = 0.0
        self.q = 0
        self.heap: list = []
        self.late: list = []
        self.seq = 0
        self.area = 0.0
        self.busy = 0.0
        self.reads = 0
        self.times: list = []
        self.depths: list = []
        self.record = record
        self.tnext = math.inf
        self.max_depth = 0

    def _replan(self, lq: float, depth: int) -> None:
        """After a change: when the next event comes (``lq``: the mean latency of a read at the depth in service
        now) and, when ``record``, the timeline's point (``depth``: the reads in the device)."""
        heap = self.heap
        if heap:
            gap = heap[0][0] - self.V
            self.tnext = self.t + (gap if gap > 0 else 0.0) * lq
        else:
            self.tnext = math.inf
        if self.late and self.late[0][0] < self.tnext:
            self.tnext = self.late[0][0]
        if self.record:
            self.times.append(self.t)
            self.depths.append(depth)
        if depth > self.max_depth:
            self.max_depth = depth


def earliest(clocks: Sequence[FluidClock]) -> Tuple[float, int]:
    """``(tnext, index)`` of the first of ``clocks`` whose next event comes soonest (``(inf, 0)``: none comes)."""
    td, jd = math.inf, 0
    for j, c in enumerate(clocks):
        if c.tnext < td:
            td, jd = c.tnext, j
    return td, jd


class SegmentQueue(FluidClock):
    """One device in the fast mode (see the module docstring); times in seconds.

    Parameters
    ----------
    slots : int
        Reads served at once (>= 1); more wait in FIFO order.
    mean_latency : callable
        ``q -> L(q)``, the mean latency of one read while ``q`` reads are served.
    straggler : str
        ``"shared"`` or ``"own"`` (see the module).
    record : bool
        Keep ``(time, reads in the device)`` at every change (for the timeline).
    bucket : TokenBucket, optional
        The rate limit in front of the device (see the module); ``tail``: seconds a read takes after its token.

    Attributes
    ----------
    area : float
        Integral of the reads in the device over time (read-seconds).
    busy : float
        Time with any read in the device.
    reads : int
        Reads completed.
    times, depths : list of float, list of int
        Time and reads in the device after each change, when ``record``.
    max_depth : int
        Most reads in the device at once.
    """

    __slots__ = ("d", "wait", "shared", "slack", "bucket", "tail")

    def __init__(self, slots: int, mean_latency: Callable[[int], float], straggler: str = "shared",
                 record: bool = True, bucket=None, tail: float = 0.0):
        if straggler not in ("shared", "own"):
            raise ValueError(f"straggler must be 'shared' or 'own', got {straggler!r}")
        super().__init__(slots, mean_latency, record)
        self.shared = straggler == "shared"
        #: A segment that overflows the free slots by at most this many reads is served whole (at the
        #: saturated latency ``L(Q) q / Q``, the same throughput) rather than split: splitting at every
        #: completion would splinter segments into single reads.
        self.slack = max(0, self.Q // 8)
        self.d = 0
        self.wait: deque = deque()
        self.bucket, self.tail = bucket, float(tail)

    def not_before(self, now: float, n: int) -> float:
        """Take ``n`` tokens at ``now``: when a batch of ``n`` reads arriving now may complete at the earliest
        (0: whenever its reads are done; always 0 without a bucket)."""
        if self.bucket is None:
            return 0.0
        t = self.bucket.take(now, n)
        return t + self.tail if t > now else 0.0

    # --------------------------------------------------------------- internals
    def _deeper(self, q: int) -> None:
        """Extend the latency table past the slots (stragglers in service): saturated, ``L(Q) q / Q``."""
        top = self.L[self.Q]
        while len(self.L) <= q:
            self.L.append(top * len(self.L) / self.Q)

    def _admit(self) -> None:
        Q, q, wait, heap = self.Q, self.q, self.wait, self.heap
        slack = self.slack
        while wait and q < Q:
            seg = wait[0]
            b, c = seg
            take = Q - q
            if take + slack >= c:  # fits, or overflows by at most the slack: whole (no splinters)
                wait.popleft()
                take = c
            else:
                seg[1] = c - take
            self.seq += 1
            heapq.heappush(heap, (self.V + b[SIGMA], self.seq, b, take))
            q += take
        self.q = q
        if q >= len(self.L):
            self._deeper(q)

    # ------------------------------------------------------------------ public
    def submit(self, now: float, n: int, k: int, sigma: float, owner=None, extra: float = 0.0,
               ref: float = 1.0) -> list:
        """A batch of ``n >= 1`` reads by ``k >= 1`` readers arrives at ``now``; returns its record
        (a list whose first item is ``owner``).  ``sigma``: work of each read in mean latencies;
        ``extra``: the straggler's seconds alone; ``ref`` (``straggler="own"``): the share of it that
        stays with the batch on a busy device (the rest shrinks with the batch's share of the reads in
        service when its last segment finishes)."""
        # the clock advanced inline (as complete): submit runs once a batch, on the fast mode's hot path
        # (benchmarks/BENCHMARKS.md)
        dt = now - self.t
        if dt > 0:
            if self.q:
                self.V += dt / self.L[self.q]
            if self.d:
                self.area += dt * self.d
                self.busy += dt
            self.t = now
        c = k if k < n else n
        b = [owner, n - c, c, sigma, now, n, extra, ref, self.not_before(now, n) if self.bucket is not None else 0.0]
        self.d += c
        q = self.q
        if not self.wait and q + c <= self.Q + (self.slack if q < self.Q else -1):
            self.seq += 1
            heapq.heappush(self.heap, (self.V + sigma, self.seq, b, c))
            self.q = q + c
            if self.q >= len(self.L):
                self._deeper(self.q)
        else:
            self.wait.append([b, c])
            self._admit()
        self._replan(self.L[self.q], self.d)
        return b

    def complete(self, now: float) -> List[list]:
        """Advance to ``now`` (the time :attr:`tnext` announced) and finish the segments due; returns the
        batches that completed.  (The hot path of the fast mode: everything inline.)"""
        q, d, L = self.q, self.d, self.L
        dt = now - self.t
        V = self.V
        if dt > 0:
            if q:
                V += dt / L[q]
                self.V = V
            if d:
                self.area += dt * d
                self.busy += dt
            self.t = now
        heap, wait, late = self.heap, self.wait, self.late
        eps = 1e-12 * (1.0 + (V if V > 0 else -V))
        done = []
        while late and late[0][0] <= now:
            done.append(heapq.heappop(late)[2])
        first = not done
        pop, push = heapq.heappop, heapq.heappush
        while heap and (first or heap[0][0] <= V + eps):
            first = False
            _, _, b, c = pop(heap)
            if c < 0:  # a straggler leaves
                q -= 1
                d -= 1
                if b[8] > now:  # not before its last token (a rate-limited device)
                    self.seq += 1
                    push(late, (b[8], self.seq, b))
                else:
                    done.append(b)
                continue
            left = b[1]
            if not left and b[6] > 0 and b[2] == c:  # its last segment: the straggler follows
                self.seq += 1
                if self.shared:
                    push(heap, (V + b[6] / L[1], self.seq, b, -1))
                    q += 1
                    d += 1
                    if q >= len(L):
                        self._deeper(q)
                else:
                    tl = now + b[6] * (b[7] + (1.0 - b[7]) * c / q)
                    push(late, (tl if tl > b[8] else b[8], self.seq, b))
                b[6] = -1.0
            q -= c
            d -= c
            self.reads += c
            if left:
                x = c if c < left else left
                b[1] = left - x
                b[2] += x - c
                d += x
                wait.append([b, x])
            else:
                b[2] -= c
                if b[2] == 0 and b[6] >= 0:
                    if b[8] > now:  # not before its last token (a rate-limited device)
                        self.seq += 1
                        push(late, (b[8], self.seq, b))
                    else:
                        done.append(b)
        if wait and q < self.Q:  # admit from the head of the queue
            self.q = q
            self._admit()
            q = self.q
        self.q, self.d = q, d
        # the next event (as _replan)
        if heap:
            gap = heap[0][0] - V
            tn = now + (gap if gap > 0 else 0.0) * L[q]
        else:
            tn = math.inf
        if late and late[0][0] < tn:
            tn = late[0][0]
        self.tnext = tn
        if self.record:
            self.times.append(now)
            self.depths.append(d)
        if d > self.max_depth:
            self.max_depth = d
        return done


def nominal_batch(slots: int, mean_latency: Callable[[int], float], n: int, k: int) -> tuple:
    """(duration, area, last) of a batch of ``n`` reads by ``k`` readers alone in a :class:`SegmentQueue`
    with ``sigma = 1``: seconds, read-seconds, and the mean latency in service when its last segment
    finished (the ``ref`` of its ``extra``)."""
    sq = SegmentQueue(slots, mean_latency, record=False)
    sq.submit(0.0, n, k, 1.0)
    last = sq.L[sq.q]
    while sq.heap:
        last = sq.L[sq.q]
        sq.complete(sq.tnext)
    return sq.t, sq.area, last
