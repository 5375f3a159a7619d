"""One batch of reads alone on a device: the makespan the exact per-read models give, drawn many times at once.

A batch is ``n`` reads issued by ``k`` readers, each taking the next read as
soon as its previous one completes (SPEC §8: a pread pool, or an io_uring ring
of depth ``k``).  The fast mode (:mod:`sim.device.fluid`) draws a batch's
duration from these samples, so one session alone on a device has, read for
read, the distribution of the exact mode (:mod:`sim.device.engines`):

:func:`slot_batch`
    the model of :class:`~sim.device.models.EmpiricalDevice`: ``slots`` reads
    are served at once (the deepest measured queue depth); a read in service
    while ``q`` reads are served progresses at the rate ``1 / L_q(u)``, ``L_q``
    the latency quantile function at depth ``q`` and ``u`` the read's own
    uniform draw (so at a steady depth ``q`` its latency is exactly ``L_q(u)``,
    the measured distribution); reads beyond ``slots`` wait in FIFO order.
    Each read therefore meets the queue depth it actually finds, including the
    shallower depths of a batch's last partial wave;
:func:`channel_batch`
    the model of :class:`~sim.device.models.ParametricSSD`: a fixed pipelined
    delay, then a FIFO queue on ``parallelism`` channels (shared: the first
    free channel; routed: a channel drawn at random for each read, the one
    that holds its page).

Both return ``(times, areas)``: float64 ``[size]`` batch durations and the
integral over the batch of the reads in the device (issued, not completed;
by Little's law the sum of the reads' latencies), seconds.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .latency import LatencyDist

__all__ = ["channel_batch", "sample_size", "slot_batch"]


def sample_size(n: int) -> int:
    """Samples drawn of a batch of ``n`` reads: about 65,536 simulated reads, 512 to 4096 batches."""
    return max(512, min(4096, (1 << 16) // max(n, 1)))


def slot_batch(latency: Callable[[int], LatencyDist], slots: int, n: int, k: int, size: int,
               rng: np.random.Generator, point: bool = False):
    """Makespans of ``n`` reads by ``k`` readers on a device of ``slots`` service slots (see the module).

    ``latency(q)`` is the latency distribution at depth ``q``; ``point``: every
    distribution is a single value (one sample suffices).
    """
    kin = min(k, n)             # reads in the device while reads remain to issue
    ks = min(kin, slots)        # of which in service
    size = 1 if point else size
    rows = np.arange(size)
    u = rng.random((size, ks)) if not point else np.zeros((1, ks))
    rem = np.ones((size, ks))
    t = np.zeros(size)
    area = np.zeros(size)
    waiting, to_issue, alive = kin - ks, n - kin, ks
    q_of_L = -1
    L = None
    for _ in range(n):
        if q_of_L != alive:
            d = latency(alive)
            L = np.maximum(np.interp(u, d.u, d.q), 1e-15)
            q_of_L = alive
        ttf = rem * L
        i = ttf.argmin(axis=1)
        dt = ttf[rows, i]
        t += dt
        area += dt * (alive + waiting)
        rem -= dt[:, None] / L
        if to_issue:               # the reader of the completed read issues the next one at the queue's tail
            to_issue -= 1
            waiting += 1
        if waiting:                # the head of the queue takes the free slot
            waiting -= 1
            nu = rng.random(size) if not point else np.zeros(1)
            u[rows, i] = nu
            rem[rows, i] = 1.0
            d = latency(alive)
            L[rows, i] = np.maximum(np.interp(nu, d.u, d.q), 1e-15)
        else:
            rem[rows, i] = math.inf
            alive -= 1
    return t, area


def channel_batch(delay: float, channels: int, service: Callable, n: int, k: int, size: int,
                  rng: np.random.Generator, routed: bool = False):
    """Makespans of ``n`` reads by ``k`` readers: each read spends ``delay``, then queues FIFO for one of
    ``channels`` channels and is served for a time drawn by ``service(rng, shape)``.

    Reads are issued in non-decreasing time (a reader issues when its read
    completes), so they reach the channel queue in issue order and each takes
    the earliest free channel: the FIFO multi-server queue, read by read.
    ``routed``: each read queues at a channel drawn uniformly at random instead
    (its own FIFO queue; the channel that holds the read's page).
    """
    kk = min(k, n)
    rows = np.arange(size)
    reader_free = np.zeros((size, kk))
    chan_free = np.zeros((size, channels))
    svc = service(rng, (size, n))
    area = np.zeros(size)
    for j in range(n):
        r = reader_free.argmin(axis=1)
        issue = reader_free[rows, r]
        c = rng.integers(0, channels, size) if routed else chan_free.argmin(axis=1)
        done = np.maximum(issue + delay, chan_free[rows, c]) + svc[:, j]
        chan_free[rows, c] = done
        reader_free[rows, r] = done
        area += done - issue
    return reader_free.max(axis=1), area
