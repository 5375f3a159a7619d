"""How often a trace's row reads repeat: the reuse rate by n-gram order and layer, and LRU row caches.

The reuse rate (SPEC §8: 22.5% in a 600-token coding generation) is the
share of row reads whose ``(layer, row)`` was read earlier in the same
session, reads taken in order ``[step][layer][column]``; each sequence of a
trace is its own session unless told otherwise.  A row id belongs to exactly
one column (each column owns its own row range, SPEC §2), so a repeat is a
repeat of the same n-gram in the same column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

import numpy as np

from engram.errors import ArgumentError
from engram.rowcache import CachePolicy

from sim.core.progress import progress as progress_bar
from .base import Trace

__all__ = ["ReuseStats", "lru_hit_rate", "lru_hits", "repeat_mask", "reuse_stats"]


# ------------------------------------------------------------------- reuse
def _keys(trace: Trace, per_sequence: bool = True) -> np.ndarray:
    """uint64 ``[T, layers, columns]``: ``(sequence << 34) | (layer << 32) | row``."""
    if trace.layers > 4:
        raise ArgumentError(f"reuse statistics support up to 4 layers, trace has {trace.layers}")
    k = trace.rows.astype(np.uint64)
    k |= (np.arange(trace.layers, dtype=np.uint64) << np.uint64(32))[None, :, None]
    if per_sequence and trace.starts.size > 1:
        k |= (trace.sequence_ids().astype(np.uint64) << np.uint64(34))[:, None, None]
    return k


def repeat_mask(trace: Trace, per_sequence: bool = True) -> np.ndarray:
    """bool ``[T, layers, columns]``: True where ``(layer, row)`` was read earlier in the session.

    "Earlier" follows read order ``[step][layer][column]``; with ``per_sequence``
    each sequence of the trace is its own session.
    """
    keys = _keys(trace, per_sequence).reshape(-1)
    if keys.size == 0:
        return np.zeros(trace.rows.shape, dtype=bool)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rep = first[inverse.reshape(-1)] != np.arange(keys.size)
    return rep.reshape(trace.rows.shape)


def lru_hits(trace: Trace, capacity: int, per_sequence: bool = True, *,
             progress: Union[bool, str] = True) -> np.ndarray:
    """bool ``[T, layers, columns]``: hits of an LRU cache of ``capacity`` rows (both layers together).

    Reads go through the cache in order ``[step][layer][column]``, one at a time; a miss
    inserts the row and evicts the least recently used one when full.  The cache is the engine's
    (:class:`engram.rowcache.CachePolicy` ``"lru"``); :mod:`sim.trace.rowcache` replays it a step
    at a time, as the engine reads, and with its other policies.  With
    ``per_sequence`` the cache is emptied at each sequence start.
    """
    if capacity < 0:
        raise ArgumentError(f"LRU capacity must be >= 0 rows, got {capacity}")
    if capacity == 0 or trace.steps == 0:
        return np.zeros(trace.rows.shape, dtype=bool)
    keys = _keys(trace, per_sequence)
    bounds = list(trace.starts) + [trace.steps] if per_sequence else [0, trace.steps]
    out = np.zeros(trace.rows.shape, dtype=bool)
    rep = None
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = keys[a:b].reshape(-1)
        if np.unique(seg).size <= capacity:  # never evicts: hits are exactly the repeats
            if rep is None:
                rep = repeat_mask(trace, per_sequence)
            out[a:b] = rep[a:b]
            continue
        hits = np.zeros(seg.size, dtype=np.uint8)
        policy = CachePolicy(int(capacity), "lru")  # the engine's policy code (engram.rowcache)
        step = 1 << 18
        with progress_bar(seg.size, "LRU", "read", delay=2.0, mode=progress) as bar:
            for lo in range(0, seg.size, step):
                hi = min(seg.size, lo + step)
                policy.access(np.ascontiguousarray(seg[lo:hi]), hits[lo:hi], 1)
                bar.update(hi - lo)
        hits = hits.astype(bool)
        out[a:b] = hits.reshape(b - a, trace.layers, trace.columns)
    return out


def lru_hit_rate(trace: Trace, capacity: int, per_sequence: bool = True, *,
                 progress: Union[bool, str] = True) -> float:
    """Share of row reads served by an LRU row cache of ``capacity`` rows (see :func:`lru_hits`)."""
    if trace.rows.size == 0:
        return 0.0
    return float(lru_hits(trace, capacity, per_sequence, progress=progress).mean())


@dataclass
class ReuseStats:
    """How often a trace's row reads repeat (SPEC §8: 22.5% in a 600-token coding generation).

    Attributes
    ----------
    source : str
    tokens, sequences, reads, repeats, distinct_rows : int
        Steps, sessions, row reads (``tokens * layers * columns``), reads that
        repeat an earlier ``(layer, row)`` of the session, distinct rows read.
    reuse_rate : float
        ``repeats / reads``.
    by_order : dict
        n-gram order (2, 3, 4) -> reuse rate of that order's columns.
    by_layer : dict
        layer id -> reuse rate of that layer's reads.
    by_layer_order : dict
        layer id -> {order -> reuse rate}.
    lru : dict
        cache capacity in rows -> LRU hit rate.
    """

    source: str
    tokens: int
    sequences: int
    reads: int
    repeats: int
    distinct_rows: int
    reuse_rate: float
    by_order: dict
    by_layer: dict
    by_layer_order: dict
    lru: dict

    def to_dict(self) -> dict:
        return {
            "source": self.source, "tokens": self.tokens, "sequences": self.sequences, "reads": self.reads,
            "repeats": self.repeats, "distinct_rows": self.distinct_rows, "reuse_rate": self.reuse_rate,
            "by_order": {str(k): v for k, v in self.by_order.items()},
            "by_layer": {str(k): v for k, v in self.by_layer.items()},
            "by_layer_order": {str(k): {str(o): r for o, r in v.items()} for k, v in self.by_layer_order.items()},
            "lru": {str(k): v for k, v in self.lru.items()},
        }


def reuse_stats(trace: Trace, lru_sizes: Iterable[int] = (), per_sequence: bool = True, *,
                progress: Union[bool, str] = True) -> ReuseStats:
    """Reuse statistics of ``trace`` (see :class:`ReuseStats`).

    Parameters
    ----------
    trace : Trace
    lru_sizes : iterable of int
        Cache capacities (rows, both tables together) whose LRU hit rate to report.
    per_sequence : bool
        Each sequence of the trace is its own session (default); otherwise the
        whole trace is one session.
    progress : bool or str
        :mod:`sim.core.progress` mode of the LRU replays (shown after 2 s).
    """
    rep = repeat_mask(trace, per_sequence)
    orders = trace.orders
    rate = (lambda m: float(m.mean()) if m.size else 0.0)
    by_order = {int(o): rate(rep[:, :, orders == o]) for o in np.unique(orders)}
    by_layer = {lid: rate(rep[:, li, :]) for li, lid in enumerate(trace.layer_ids)}
    by_layer_order = {lid: {int(o): rate(rep[:, li, orders == o]) for o in np.unique(orders)}
                      for li, lid in enumerate(trace.layer_ids)}
    lru = {int(c): lru_hit_rate(trace, int(c), per_sequence, progress=progress) for c in lru_sizes}
    return ReuseStats(
        source=trace.source, tokens=trace.steps, sequences=int(trace.starts.size), reads=int(rep.size),
        repeats=int(rep.sum()), distinct_rows=int(rep.size - rep.sum()), reuse_rate=rate(rep),
        by_order=by_order, by_layer=by_layer, by_layer_order=by_layer_order, lru=lru,
    )
