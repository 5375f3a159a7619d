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

The queue is written once, as the statements of :data:`QUEUE` (the clock's advance, a batch's entry, the
completions, then the admission and the next event) over local names; :func:`queue_function` compiles them into
:meth:`SegmentQueue.submit` and :meth:`SegmentQueue.complete`, into those of the serving model's device
(:class:`sim.serve.device.SharedDevice`: room for every batch at once, each served whole) and into the loop that
runs them inline on its hot path (the fast decode mode's common case, :mod:`sim.decode.fast`), each loading the
queue's state into locals and storing it back.
"""

from __future__ import annotations

import ast
import heapq
import linecache
import math
import textwrap
from collections import deque
from typing import Callable, Dict, Optional, Sequence, Tuple

__all__ = ["QUEUE", "SegmentQueue", "nominal_batch", "queue_function"]

# Fields of a batch (a list, for speed); NB: not before this time (its last token plus the raw latency; 0: none);
# FIRST: the reads of its first segment (a batch served whole: its reads in the device).
OWNER, LEFT, INSYS, SIGMA, START, READS, EXTRA, REF, NB, FIRST = range(10)

#: The queue, written once: statements over its state as locals (``V``, ``tq`` its time, ``q`` reads in service,
#: ``d`` reads in the device, ``qseq``, ``area``, ``busy``, ``reads``, ``tnext``, ``max_depth``: :data:`STATE`)
#: and its parts (``L``, ``nL = len(L)``, ``room``, ``slack``, ``heap``, ``wait``, ...: :data:`BINDINGS`), ``sq``
#: the queue.  ``advance``: the clock to ``now``.  ``submit``: a batch ``bt`` of ``n`` reads, ``c`` at a time
#: (``left`` after its first segment), ``sigma`` the work of each, enters at the tail (``owner``, ``extra``,
#: ``ref``: :meth:`SegmentQueue.submit`).
#: ``complete``: the segments due at ``now`` finish, and the batches done go to the list ``done`` (empty before).  ``settle``: after either, the head of the queue takes the free slots and the next
#: event is planned.
QUEUE: Dict[str, str] = {
    "advance": """
dt = now - tq
if dt > 0:
    if q:
        V += dt / L[q]
    if d:
        area += dt * d
        busy += dt
    tq = now
""",
    "submit": """
if gate is None:
    nb = 0.0
else:  # its tokens: not before the last one plus the raw device's latency
    nb = gate.take(now, n)
    nb = nb + gate_tail if nb > now else 0.0
bt = [owner, left, c, sigma, now, n, extra, ref, nb, c]
d += c
if not wait and q < room and q + c <= room + slack:
    qseq += 1
    push(heap, (V + sigma, qseq, bt, c))
    q += c
else:
    wait.append([bt, c])
""",
    "complete": """
Ve = V + 1e-12 * (1.0 + (V if V > 0 else -V))  # V holds while the segments finish
while late and late[0][0] <= now:
    done.append(pop(late)[2])
first = not done
while heap and (first or heap[0][0] <= Ve):
    first = False
    _, _, bt, c = pop(heap)
    if c < 0:  # a straggler leaves
        q -= 1
        d -= 1
        if bt[8] > now:  # not before its last token (a rate-limited device)
            qseq += 1
            push(late, (bt[8], qseq, bt))
        else:
            done.append(bt)
        continue
    left = bt[1]
    if not left and bt[6] > 0 and bt[2] == c:  # its last segment: the straggler follows
        qseq += 1
        if shared:
            push(heap, (V + bt[6] / L[1], qseq, bt, -1))
            q += 1
            d += 1
            if q >= nL:
                sq._deeper(q)
                nL = len(L)
        else:
            tl = now + bt[6] * (bt[7] + (1.0 - bt[7]) * c / q)
            push(late, (tl if tl > bt[8] else bt[8], qseq, bt))
        bt[6] = -1.0
    q -= c
    d -= c
    reads += c
    if left:  # its readers issue the next segment at the tail
        x = c if c < left else left
        bt[1] = left - x
        bt[2] += x - c
        d += x
        wait.append([bt, x])
    else:
        bt[2] -= c
        if bt[2] == 0 and bt[6] >= 0:
            if bt[8] > now:  # not before its last token (a rate-limited device)
                qseq += 1
                push(late, (bt[8], qseq, bt))
            else:
                done.append(bt)
""",
    "settle": """
while wait and q < room:  # the head of the queue takes the free slots (whole within the slack)
    seg = wait[0]
    b2, c2 = seg
    take = room - q
    if take + slack >= c2:
        wait.popleft()
        take = c2
    else:
        seg[1] = c2 - take
    qseq += 1
    push(heap, (V + b2[3], qseq, b2, take))
    q += take
if q >= nL:
    sq._deeper(q)
    nL = len(L)
if heap:
    gap = heap[0][0] - V
    tnext = tq + (gap if gap > 0 else 0.0) * L[q]
else:
    tnext = inf
if late and late[0][0] < tnext:
    tnext = late[0][0]
if record:
    times.append(tq)
    depths.append(d)
if d > max_depth:
    max_depth = d
""",
}

#: The queue's state in :data:`QUEUE`: local name and attribute, loaded where used and stored back where assigned.
STATE = (("V", "V"), ("tq", "t"), ("q", "q"), ("d", "d"), ("qseq", "seq"), ("area", "area"), ("busy", "busy"),
         ("reads", "reads"), ("tnext", "tnext"), ("max_depth", "max_depth"))

#: The queue's parts in :data:`QUEUE`, loaded where used: local name and expression (``push``, ``pop`` and ``inf``
#: are globals: ``heapq.heappush``, ``heapq.heappop``, ``math.inf``).
BINDINGS = (("L", "sq.L"), ("nL", "len(sq.L)"), ("room", "sq.room"), ("slack", "sq.slack"), ("shared", "sq.shared"),
            ("gate", "sq.bucket"), ("gate_tail", "sq.tail"), ("heap", "sq.heap"), ("wait", "sq.wait"),
            ("late", "sq.late"), ("record", "sq.record"), ("times", "sq.times"), ("depths", "sq.depths"))


def queue_function(template: str, name: str, namespace: Optional[dict] = None) -> Callable:
    """The function that ``template`` defines, the queue's statements in it: a line ``@advance`` (``@submit``,
    ``@complete``, ``@settle``) stands for those of :data:`QUEUE` at its indentation, ``@load`` for the queue's
    parts and state that the function uses (taken from its argument ``sq``), ``@store`` for the state it assigns,
    written back.  ``namespace``: its globals beside ``push``, ``pop`` and ``inf``.  Its source is kept in
    :mod:`linecache` (and as its attribute ``source``), so tracebacks and profiles show its lines."""
    def expand(lines, marks):
        out = []
        for line in lines:
            key = line.strip()[1:]
            if line.strip().startswith("@") and key in marks:
                pad = line[:len(line) - len(line.lstrip())]
                out += [pad + x if x.strip() else "" for x in marks[key]]
            else:
                out.append(line)
        return out

    body = expand(textwrap.dedent(template).strip("\n").splitlines(),
                  {k: v.strip("\n").splitlines() for k, v in QUEUE.items()})
    fn = ast.parse("\n".join(x.replace("@", "pass  # ") if x.strip() in ("@load", "@store") else x
                             for x in body)).body[0]
    names = [x for x in ast.walk(fn) if isinstance(x, ast.Name)]
    used, stored = {x.id for x in names}, {x.id for x in names if isinstance(x.ctx, ast.Store)}
    params = {a.arg for a in fn.args.args}
    load = [f"{k} = {e}" for k, e in BINDINGS if k in used and k not in params]
    load += [f"{k} = sq.{a}" for k, a in STATE if k in used]
    src = "\n".join(expand(body, {"load": load, "store": [f"sq.{a} = {k}" for k, a in STATE if k in stored]}))
    filename = f"<sim.device.fluid: {name}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = {"push": heapq.heappush, "pop": heapq.heappop, "inf": math.inf, **(namespace or {})}
    exec(compile(src, filename, "exec"), ns)
    got = ns[fn.name]
    got.__qualname__, got.source = name, src
    return got


class SegmentQueue:
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
    Q, room : int
        The slots, and the reads served at once before more wait (the slots; unbounded in a fluid that shares
        the device at once, :class:`sim.serve.device.SharedDevice`).
    L : list of float
        The mean latency of a read at each depth ``q`` (``L[0]`` unused; past the slots saturated, ``L(Q) q / Q``).
    V, t : float
        The virtual clock (``dV/dt = 1 / L(q)``) at the time ``t``.
    q, d : int
        Reads in service, and in the device (in service or waiting).
    heap, wait, late : list, deque, list
        Segments in service by the ``V`` they finish at; segments waiting; batches served that wait for their
        straggler (``straggler="own"``) or their last token, by time.
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
    tnext : float
        When the next event comes (inf: none).
    """

    __slots__ = ("Q", "room", "L", "V", "t", "q", "d", "heap", "wait", "late", "seq", "area", "busy", "reads",
                 "times", "depths", "record", "tnext", "max_depth", "shared", "slack", "bucket", "tail")

    def __init__(self, slots: int, mean_latency: Callable[[int], float], straggler: str = "shared",
                 record: bool = True, bucket=None, tail: float = 0.0):
        if straggler not in ("shared", "own"):
            raise ValueError(f"straggler must be 'shared' or 'own', got {straggler!r}")
        self.Q = self.room = int(slots)
        self.L = [0.0] + [max(float(mean_latency(q)), 1e-15) for q in range(1, self.Q + 1)]
        self.V = self.t = self.area = self.busy = 0.0
        self.q = self.d = self.seq = self.reads = self.max_depth = 0
        self.heap: list = []
        self.wait: deque = deque()
        self.late: list = []
        self.times: list = []
        self.depths: list = []
        self.record = record
        self.tnext = math.inf
        self.shared = straggler == "shared"
        #: A segment that overflows the free slots by at most this many reads is served whole (at the
        #: saturated latency ``L(Q) q / Q``, the same throughput) rather than split: splitting at every
        #: completion would splinter segments into single reads.
        self.slack = max(0, self.Q // 8)
        self.bucket, self.tail = bucket, float(tail)

    @classmethod
    def of(cls, device, record: bool = True) -> "SegmentQueue":
        """The queue of ``device`` (a :class:`~sim.device.models.Device`): slots of its saturation depth, its mean
        latencies, its straggler and its token bucket."""
        return cls(device.saturation_depth(), device.mean_latency, device.straggler, record, device.bucket(),
                   device.gate_tail())

    def _deeper(self, q: int) -> None:
        """Extend the latency table past the slots (stragglers, a fluid's batches): saturated, ``L(Q) q / Q``."""
        L, Q = self.L, self.Q
        top, n = L[Q], len(L)
        L.extend([top * x / Q for x in range(n, max(q + 1, 2 * n))])  # doubling: a fluid's depth may keep growing

    advance = queue_function('''
        def advance(sq, now):
            """The clock to ``now`` (not earlier than :attr:`t`), the reads in the device counted; nothing else."""
            @load
            @advance
            @store
        ''', "SegmentQueue.advance")

    submit = queue_function('''
        def submit(sq, now, n, k, sigma, owner=None, extra=0.0, ref=1.0):
            """A batch of ``n >= 1`` reads by ``k >= 1`` readers arrives at ``now``; returns its record (a list whose
            first item is ``owner``).  ``sigma``: work of each read in mean latencies; ``extra``: the straggler's
            seconds alone; ``ref`` (``straggler="own"``): the share of it that stays with the batch on a busy
            device (the rest shrinks with the batch's share of the reads in service when its last segment
            finishes)."""
            @load
            c = k if k < n else n
            left = n - c
            @advance
            @submit
            @settle
            @store
            return bt
        ''', "SegmentQueue.submit")

    complete = queue_function('''
        def complete(sq, now):
            """Advance to ``now`` (the time :attr:`tnext` announced) and finish the segments due; returns the
            batches that completed."""
            @load
            done = []
            @advance
            @complete
            @settle
            @store
            return done
        ''', "SegmentQueue.complete")


def earliest(queues: Sequence[SegmentQueue]) -> Tuple[float, int]:
    """``(tnext, index)`` of the first of ``queues`` whose next event comes soonest (``(inf, 0)``: none comes)."""
    td, jd = math.inf, 0
    for j, c in enumerate(queues):
        if c.tnext < td:
            td, jd = c.tnext, j
    return td, jd


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
