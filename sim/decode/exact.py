"""The exact mode of the decode model: every read a simpy event on the device's per-read model.

Sessions are simpy processes; a batch of reads is ``k`` reader processes,
each taking the next read of the batch as soon as its previous one completes
(:meth:`sim.device.ExactDevice.batch`).  With several drives the batch's reads
keep the engine's order (sorted row ids) and each goes to its own drive
(row id mod drives), so the readers spread over the drives as the rows do.
Kept to validate the fast mode (:mod:`sim.decode.fast`): slow, but nothing in
it is approximated beyond the device's own per-read model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from sim.core.params import Policy

__all__ = ["SessionWork", "exact_session"]


@dataclass(frozen=True)
class SessionWork:
    """What one session does in the exact mode (:func:`exact_session`).

    Attributes
    ----------
    reads : numpy.ndarray
        int64 ``[steps, layers]``: device reads of each step and table.
    order : list, optional
        Per step, per table, int8 arrays of the drive of each read in the engine's order (several drives);
        ``None`` on one drive.
    compute : numpy.ndarray
        float64 ``[steps]``: compute seconds of each step.
    prefetch : numpy.ndarray, optional
        int64 ``[steps]`` (one drive): rows of step ``t`` read in the background from the moment step
        ``t - 1``'s rows have arrived; step ``t`` waits for them, then reads the rest (as
        ``engram.Session.step_many`` does; speculative decoding, :mod:`sim.decode.speculative`; ``reads`` then
        holds the rest).
    """

    reads: np.ndarray
    order: Optional[list]
    compute: np.ndarray
    prefetch: Optional[np.ndarray] = None


def _read(env, devs, drive_seq, n: int, k: int, ovh: float):
    """``n`` reads by ``k`` readers (generator): on one device, or spread over drives by ``drive_seq``."""
    if k > 1 and ovh:
        yield env.timeout(ovh)
    if len(devs) == 1:
        yield from devs[0].batch(n, k)
        return
    todo = deque(drive_seq)

    def reader():
        while todo:
            j = todo.popleft()
            yield from devs[j].read()

    k = min(k, n)
    if k == 1:
        yield from reader()
    else:
        yield env.all_of([env.process(reader()) for _ in range(k)])


def exact_session(env, devs: Sequence, work: SessionWork, policy: Policy, hash_time: float, overlap: float,
                  lat: np.ndarray, stall: np.ndarray, tick: Optional[Callable[[int], None]]):
    """One session (generator): per step, hash, read (the first table, then the rest in the background under
    ``overlap``), compute; fills ``lat`` and ``stall`` (float64 ``[steps]``, seconds per step); ``tick(1)`` when
    it is done.  ``devs``: the exact device of each drive; ``overlap``: share of a step's compute that overlaps
    the second table's read (0: none)."""
    reads, order, compute, prefetch = work.reads, work.order, work.compute, work.prefetch
    ovh = policy.batch_overhead
    pre = None if prefetch is None else np.asarray(prefetch).tolist()
    pending = None

    def issue(t):
        n = pre[t] if pre is not None and t < len(pre) else 0
        return env.process(_read(env, devs, None, n, policy.concurrency(n), ovh)) if n else None

    two = overlap > 0 and reads.shape[1] > 1
    comp = compute.tolist()

    def seq_of(t, tables):
        if order is None:
            return None
        return np.concatenate([order[t][li] for li in range(reads.shape[1])[tables]]).tolist()

    for t in range(len(comp)):
        t0 = env.now
        c = comp[t]
        if hash_time:
            yield env.timeout(hash_time)
        if not two:
            n = int(reads[t].sum())
            if pending is not None:  # the prefetched rows first, then the rest (engram.Session.step_many)
                yield pending
            if n:
                yield from _read(env, devs, seq_of(t, slice(None)), n, policy.concurrency(n), ovh)
            pending = issue(t + 1)
            yield env.timeout(c)
        else:
            n1, n2 = int(reads[t, 0]), int(reads[t, 1:].sum())
            if pending is not None:
                yield pending
            if n1:
                yield from _read(env, devs, seq_of(t, slice(0, 1)), n1, policy.concurrency(n1), ovh)
            p2 = env.process(_read(env, devs, seq_of(t, slice(1, None)), n2, policy.concurrency(n2), ovh)) \
                if n2 else None
            yield env.timeout(c * overlap)
            if p2 is not None:
                yield p2
            pending = issue(t + 1)
            yield env.timeout(c * (1 - overlap))
        lat[t] = env.now - t0
        stall[t] = env.now - t0 - c - hash_time
    if tick is not None:
        tick(1)
