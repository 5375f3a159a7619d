"""What a device did during a simulation: boxes of activity, and utilisation and queue depth from them."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["Recorder", "summarize_boxes", "summarize_counter", "time_average"]


class Recorder:
    """Boxes of device activity: ``[start, end)`` with a level (reads in flight).

    The fast mode records one box per batch (level = summed read latency /
    batch time, so the integral is exact); the exact mode one box per read
    (level 1).  :func:`summarize_boxes` turns them into utilisation, mean
    queue depth and a time series.
    """

    def __init__(self) -> None:
        self.start: list = []
        self.end: list = []
        self.level: list = []
        self.reads = 0
        self.latency_sum = 0.0
        self.wait: list = []
        #: (time, reads in the device) after each change, kept by the exact models.
        self.counter: list = []

    def box(self, start: float, end: float, level: float, reads: int, latency_sum: float) -> None:
        self.start.append(start)
        self.end.append(end)
        self.level.append(level)
        self.reads += reads
        self.latency_sum += latency_sum

    def arrays(self):
        return (np.asarray(self.start, dtype=np.float64), np.asarray(self.end, dtype=np.float64),
                np.asarray(self.level, dtype=np.float64))


def time_average(counter: Sequence, t_end: float, t_start: float = 0.0) -> float:
    """Time average over ``[t_start, t_end]`` of a step function given as ``[(time, value), ...]``
    (value holds from its time to the next; 0 before the first)."""
    if t_end <= t_start:
        return 0.0
    if not counter:
        return 0.0
    arr = np.asarray(counter, dtype=np.float64)
    t = np.clip(np.concatenate([arr[:, 0], [t_end]]), t_start, t_end)
    return float(np.sum(np.diff(t) * arr[:, 1]) / (t_end - t_start))


def summarize_boxes(start: np.ndarray, end: np.ndarray, level: np.ndarray, t_end: float,
                    bins: int = 100) -> dict:
    """Device utilisation from activity boxes over ``[0, t_end]``.

    Returns a dict: ``busy_fraction`` (share of time with any read in flight),
    ``mean_queue_depth`` (time average of reads in flight), ``max_queue_depth``,
    and ``timeline`` with ``t_s`` (bin centres), ``queue_depth`` and ``busy``
    (per-bin means), ``bins`` bins.
    """
    keep = end > start  # a box of no length holds no read (a step with nothing to read: every row in DRAM)
    s, e, lv = start[keep], end[keep], level[keep]
    if t_end <= 0 or s.size == 0:
        z = [0.0] * bins
        edges = np.linspace(0, max(t_end, 0.0), bins + 1)
        return {"busy_fraction": 0.0, "mean_queue_depth": 0.0, "max_queue_depth": 0.0,
                "timeline": {"t_s": ((edges[1:] + edges[:-1]) / 2).tolist(), "queue_depth": z, "busy": z}}
    t = np.concatenate([s, e])
    dl = np.concatenate([lv, -lv])
    dc = np.concatenate([np.ones(s.size), -np.ones(s.size)])
    # At equal times ends go first, so a read handing its slot to the next is not counted twice.
    order = np.lexsort((np.concatenate([np.ones(s.size), np.zeros(s.size)]), t))
    t, dl, dc = t[order], dl[order], dc[order]
    lvl = np.cumsum(dl)
    cnt = np.cumsum(dc)
    # The step functions hold lvl[i] (reads in flight) and cnt[i] > 0 (busy) on [t[i], t[i+1]).
    dt = np.diff(t)
    seg_q = lvl[:-1]
    seg_b = (cnt[:-1] > 0.5).astype(np.float64)
    cum_q = np.concatenate([[0.0], np.cumsum(seg_q * dt)])
    cum_b = np.concatenate([[0.0], np.cumsum(seg_b * dt)])
    edges = np.linspace(0.0, t_end, bins + 1)

    def integral(cum, seg, x):
        """Integral of the step function from 0 to each x."""
        i = np.searchsorted(t, x, side="right") - 1
        inside = (i >= 0) & (i < seg.size)
        j = np.clip(i, 0, seg.size - 1) if seg.size else np.zeros_like(i)
        partial = cum[np.clip(i, 0, cum.size - 1)] + np.where(inside, seg[j] * (x - t[np.clip(i, 0, t.size - 1)]), 0)
        return np.where(i < 0, 0.0, partial)

    iq, ib = integral(cum_q, seg_q, edges), integral(cum_b, seg_b, edges)
    w = np.diff(edges)
    return {
        "busy_fraction": float(ib[-1] / t_end),
        "mean_queue_depth": float(iq[-1] / t_end),
        "max_queue_depth": float(lvl.max()),
        "timeline": {"t_s": ((edges[1:] + edges[:-1]) / 2).tolist(),
                     "queue_depth": (np.diff(iq) / w).tolist(), "busy": (np.diff(ib) / w).tolist()},
    }


def summarize_counter(changes, t_end: float, bins: int = 100) -> dict:
    """Device utilisation from the reads in the device as a step function over ``[0, t_end]``: the same dict
    as :func:`summarize_boxes`.  ``changes`` is ``[(time, reads), ...]`` or a pair of arrays ``(times,
    reads)``; each value holds until the next time, 0 before the first."""
    edges = np.linspace(0.0, max(t_end, 0.0), bins + 1)
    mid = ((edges[1:] + edges[:-1]) / 2).tolist()
    if isinstance(changes, tuple) and len(changes) == 2:
        tt, v = np.asarray(changes[0], dtype=np.float64), np.asarray(changes[1], dtype=np.float64)
    else:
        arr = np.asarray(changes, dtype=np.float64).reshape(-1, 2)
        tt, v = arr[:, 0], arr[:, 1]
    if t_end <= 0 or tt.size == 0:
        z = [0.0] * bins
        return {"busy_fraction": 0.0, "mean_queue_depth": 0.0, "max_queue_depth": 0.0,
                "timeline": {"t_s": mid, "queue_depth": z, "busy": z}}
    t = np.clip(np.concatenate([tt, [t_end]]), 0.0, t_end)
    dt = np.diff(t)
    cum_q = np.concatenate([[0.0], np.cumsum(v * dt)])
    cum_b = np.concatenate([[0.0], np.cumsum((v > 0) * dt)])
    iq = np.interp(edges, t, cum_q)
    ib = np.interp(edges, t, cum_b)
    w = np.diff(edges)
    return {"busy_fraction": float(ib[-1] / t_end), "mean_queue_depth": float(iq[-1] / t_end),
            "max_queue_depth": float(v.max()),
            "timeline": {"t_s": mid, "queue_depth": (np.diff(iq) / w).tolist(), "busy": (np.diff(ib) / w).tolist()}}
