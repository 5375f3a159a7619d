"""The engine's row cache replayed on a trace: hit rate against cache size, beside the optimal bound.

A trace's reads go through :class:`engram.rowcache.CachePolicy` -- the very policy code the engine's
:class:`engram.RowCache` runs, not a model of it -- in the order the engine does them: one batch a
decode step of a session (``[layer][column]``, 48 keys ``(layer << 32) | row``), looked up first, its
misses inserted after.  ``sessions`` sessions share the cache as the decode model runs them
(:func:`sim.trace.session_offsets`: session ``i`` of ``S`` starts at step ``i * T // S`` and wraps;
their steps interleave step by step).  The cache is the model's, so it lives across the trace's
sequences.

The optimal bound is Belady's MIN with bypass (Belady, "A study of replacement algorithms for a
virtual-storage computer", IBM Systems Journal 5(2), 1966): on a miss with the cache full, keep the
rows whose next use comes soonest, and do not insert a row used later than all of them (or never).
No policy of that capacity hits more on the same reads.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError
from engram.rowcache import POLICIES, CachePolicy, cache_rows, parse_size

from sim.core.limits import check_count, check_memory
from sim.core.progress import progress as progress_bar
from .base import Trace
from .wrap import session_offsets

__all__ = ["CacheCurve", "CachePoint", "batch_bounds", "cache_curve", "check_replay_memory", "optimal_hits",
           "policy_hits", "replay_keys", "stretch_hits", "OPTIMAL", "REPLAY_BYTES_A_READ", "OPTIMAL_BYTES_A_READ"]

#: The name of the optimal bound beside the policies.
OPTIMAL = "optimal"
#: Bytes of memory a replayed read takes at most (:func:`cache_curve`): its key (8), the trace rows it is made of,
#: ``np.unique``'s sort, indices and inverse, the hit masks -- about 50 measured; and with the optimal bound,
#: whose replay holds the keys and next uses as Python lists, about 130 measured.
REPLAY_BYTES_A_READ = 64
OPTIMAL_BYTES_A_READ = 160


def check_replay_memory(trace: Trace, sessions: int, steps: Optional[int], optimal: bool = False) -> int:
    """The reads of replaying ``sessions`` sessions of ``steps`` steps of ``trace`` (default its length), after
    checking that the replay fits in memory (:func:`sim.core.limits.check_memory`), before anything is made.

    Raises
    ------
    ArgumentError
        No steps, fewer than one session or step, or a replay that would not fit in memory (says how much
        it needs).
    """
    if trace.steps == 0:
        raise ArgumentError("the trace has no steps")
    sessions = check_count(sessions, "sessions")
    steps = trace.steps if steps is None else check_count(steps, "steps")
    reads = sessions * steps * trace.layers * trace.columns
    check_memory(reads * (OPTIMAL_BYTES_A_READ if optimal else REPLAY_BYTES_A_READ),
                 f"replaying {sessions:,} session(s) x {steps:,} steps x {trace.layers * trace.columns} row reads "
                 f"({reads:,} reads{', with the optimal bound' if optimal else ''})")
    return reads


def replay_keys(trace: Trace, sessions: int = 1, steps: Optional[int] = None) -> np.ndarray:
    """uint64 ``[steps, sessions, layers, columns]``: the cache keys ``(layer id << 32) | row`` in the order a
    shared cache sees them (step ``t`` of session 0, of session 1, ...).

    ``steps``: per session (default the trace's length; a session wraps past the end).

    Raises
    ------
    ArgumentError
        No steps, fewer than one session or step, or keys that would not fit in memory
        (:func:`check_replay_memory`)."""
    T = trace.steps
    if T == 0:
        raise ArgumentError("the trace has no steps")
    if sessions < 1:
        raise ArgumentError(f"need at least one session, got {sessions}")
    steps = T if steps is None else int(steps)
    if steps < 1:
        raise ArgumentError(f"need at least one step, got {steps}")
    check_replay_memory(trace, sessions, steps)
    starts = session_offsets(T, sessions)
    pos = (np.asarray(starts, np.int64)[None, :] + np.arange(steps)[:, None]) % T     # [steps, sessions]
    lay = (np.asarray(trace.layer_ids, np.uint64) << np.uint64(32))[:, None]
    return trace.rows[pos].astype(np.uint64) | lay


def batch_bounds(keys: np.ndarray) -> int:
    """Keys a batch: one session's decode step (``layers * columns`` of ``keys[..., layers, columns]``)."""
    return int(keys.shape[-1] * keys.shape[-2])


def _first_batch_repeats(flat: np.ndarray, batch: int) -> np.ndarray:
    """bool: keys read in an earlier batch (a cache that never evicts hits exactly these)."""
    _, first, inv = np.unique(flat, return_index=True, return_inverse=True)
    return (np.arange(flat.size) // batch) > (first[inv.reshape(-1)] // batch)


def policy_hits(keys: np.ndarray, capacity: int, policy: str, batch: int = 1) -> np.ndarray:
    """bool like ``keys``: the hits of the engine's ``policy`` with ``capacity`` rows fed ``keys`` (any shape,
    read in C order) in batches of ``batch`` keys, as :meth:`engram.rowcache.CachePolicy.access` does.

    A cache that holds every distinct key never evicts, under either policy: its hits are the keys read
    in an earlier batch, found without replaying."""
    if policy not in POLICIES:
        raise ArgumentError(f"unknown row cache policy {policy!r}; policies: {', '.join(POLICIES)}")
    flat = np.ascontiguousarray(keys, np.uint64).reshape(-1)
    if capacity < 1 or flat.size == 0:
        return np.zeros(keys.shape, bool)
    if np.unique(flat).size <= capacity:
        return _first_batch_repeats(flat, batch).reshape(keys.shape)
    hits = np.zeros(flat.size, np.uint8)
    CachePolicy(int(capacity), policy).access(flat, hits, int(batch))
    return hits.astype(bool).reshape(keys.shape)


def stretch_hits(trace: Trace, starts: Sequence[int], steps: int, capacity: int, policy: str,
                 shared: bool = True) -> np.ndarray:
    """bool ``[steps, sessions, layers, columns]``: the hits of a measured run's row cache (``policy``,
    ``capacity`` rows, fresh at the run's start) on its trace steps: session ``i`` reads trace steps
    ``starts[i]`` to ``starts[i] + steps``, one batch of ``layers x columns`` keys a step (:func:`policy_hits`).
    ``shared``: the sessions' steps interleaved step by step through one cache (sessions in threads);
    else each session through a cache of its own (sessions as processes).  The one replay behind both a
    run's predicted hit rate (``row_cache`` of a run record) and its cross-check prediction.

    Raises
    ------
    ArgumentError
        A stretch outside the trace, or an unknown policy.
    """
    starts = [int(a) for a in starts]
    if not starts or min(starts) < 0 or max(starts) + steps > trace.steps:
        raise ArgumentError(f"stretches {starts[:4]} of {steps} steps do not fit the trace ({trace.steps} steps)")
    lay = (np.asarray(trace.layer_ids, np.uint64) << np.uint64(32))[:, None]
    keys = np.stack([trace.rows[a:a + steps].astype(np.uint64) | lay for a in starts], axis=1)  # [steps, S, L, C]
    width = keys.shape[-1] * keys.shape[-2]
    if shared:
        return policy_hits(keys, int(capacity), policy, width)
    return np.stack([policy_hits(np.ascontiguousarray(keys[:, i]), int(capacity), policy, width)
                     for i in range(keys.shape[1])], axis=1)


def optimal_hits(keys: np.ndarray, capacity: int, progress: Union[bool, str] = True) -> np.ndarray:
    """bool like ``keys``: the hits of Belady's MIN with bypass with ``capacity`` rows (see the module);
    ``progress``: a :mod:`sim.core.progress` mode."""
    flat = np.ascontiguousarray(keys, np.uint64).reshape(-1)
    n = flat.size
    if capacity < 1 or n == 0:
        return np.zeros(keys.shape, bool)
    if np.unique(flat).size <= capacity:
        return _first_batch_repeats(flat, 1).reshape(keys.shape)
    order = np.argsort(flat, kind="stable")
    same = flat[order[1:]] == flat[order[:-1]]
    nxt = np.full(n, n, np.int64)               # n: never read again
    nxt[order[:-1][same]] = order[1:][same]
    hits = np.zeros(n, bool)
    held: Dict[int, int] = {}                   # key -> its next use
    heap: List[tuple] = []                      # (-next use, key), stale entries skipped
    push, pop = heapq.heappush, heapq.heappop
    cap = int(capacity)
    keys_l, nxt_l = flat.tolist(), nxt.tolist()
    step = 1 << 18
    with progress_bar(n, "optimal", "read", delay=2.0, mode=progress) as bar:
        for lo in range(0, n, step):
            for i in range(lo, min(n, lo + step)):
                k, nu = keys_l[i], nxt_l[i]
                if k in held:
                    hits[i] = True
                    if nu == n:
                        del held[k]             # never read again: its place is free
                    else:
                        held[k] = nu
                        push(heap, (-nu, k))
                    continue
                if nu == n:
                    continue
                if len(held) < cap:
                    held[k] = nu
                    push(heap, (-nu, k))
                    continue
                while True:
                    far, kk = heap[0]
                    if held.get(kk) == -far:
                        break
                    pop(heap)
                if -far > nu:
                    pop(heap)
                    del held[kk]
                    held[k] = nu
                    push(heap, (-nu, k))
            bar.update(min(step, n - lo))
    return hits.reshape(keys.shape)


@dataclass
class CachePoint:
    """One cache size: hit rates of each policy and of the optimal bound.

    Attributes
    ----------
    bytes, rows : int
        The budget and the rows it holds (``bytes // 264``).
    hit_rate : dict
        policy (and ``"optimal"``) -> share of row reads served by the cache.
    by_layer : dict
        policy -> {layer id -> hit rate of that layer's reads}.
    by_order : dict
        policy -> {n-gram order -> hit rate of that order's columns}.
    """

    bytes: int
    rows: int
    hit_rate: Dict[str, float] = field(default_factory=dict)
    by_layer: Dict[str, Dict[int, float]] = field(default_factory=dict)
    by_order: Dict[str, Dict[int, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"bytes": self.bytes, "rows": self.rows, "hit_rate": dict(self.hit_rate),
                "by_layer": {p: {str(k): v for k, v in d.items()} for p, d in self.by_layer.items()},
                "by_order": {p: {str(k): v for k, v in d.items()} for p, d in self.by_order.items()}}


@dataclass
class CacheCurve:
    """Hit rate against cache size on one trace (:func:`cache_curve`).

    Attributes
    ----------
    source : str
    sessions, steps, reads, distinct_rows : int
        Sessions sharing the cache, steps of each, row reads, distinct rows read.
    reuse_rate : float
        Reads of a row read before (any session): the hit rate of a cache that never evicts.
    policies : list of str
    points : list of CachePoint
    """

    source: str
    sessions: int
    steps: int
    reads: int
    distinct_rows: int
    reuse_rate: float
    policies: List[str]
    points: List[CachePoint]

    def to_dict(self) -> dict:
        return {"source": self.source, "sessions": self.sessions, "steps": self.steps, "reads": self.reads,
                "distinct_rows": self.distinct_rows, "reuse_rate": self.reuse_rate, "policies": list(self.policies),
                "points": [p.to_dict() for p in self.points]}


def _rates(hits: np.ndarray, trace: Trace) -> tuple:
    """(by layer, by order) of a hit mask ``[..., layers, columns]``."""
    orders = trace.orders
    by_layer = {int(lid): float(hits[..., li, :].mean()) for li, lid in enumerate(trace.layer_ids)}
    by_order = {int(o): float(hits[..., orders == o].mean()) for o in np.unique(orders)}
    return by_layer, by_order


def cache_curve(trace: Trace, sizes: Iterable, policies: Sequence[str] = POLICIES, *, sessions: int = 1,
                steps: Optional[int] = None, optimal: bool = True, progress: Union[bool, str] = True) -> CacheCurve:
    """Hit rates of the engine's ``policies`` (and the optimal bound) for each cache size in ``sizes``
    (bytes, or strings such as ``"64M"``), ``sessions`` sessions sharing the cache (see the module).  A size
    (the same bytes, however written) or a policy given twice is replayed once, in the order first given.

    Raises
    ------
    ArgumentError
        An unknown policy, no sizes, neither a policy nor the optimal bound, no steps or sessions, or a
        replay that would not fit in memory (checked before anything is made: :func:`check_replay_memory`).
    CacheSizeError
        A size below one row (264 bytes), above 2**31 - 1 rows, or not a size (names the size).
    """
    given, sizes = list(sizes), []
    for s in given:
        b = parse_size(s, "cache size")
        cache_rows(b, check_memory=False, what=f"cache size {s!r}", zero="; each cache replayed holds at least one row")
        if b not in sizes:
            sizes.append(b)
    if not sizes:
        raise ArgumentError("give at least one cache size")
    policies = list(dict.fromkeys(policies))
    for p in policies:
        if p not in POLICIES:
            raise ArgumentError(f"unknown row cache policy {p!r}; policies: {', '.join(POLICIES)}")
    if not policies and not optimal:
        raise ArgumentError(f"nothing to replay: give a policy ({', '.join(POLICIES)}) or the optimal bound")
    check_replay_memory(trace, sessions, steps, optimal)
    keys = replay_keys(trace, sessions, steps)                         # [steps, S, L, C]
    batch = batch_bounds(keys)
    flat = keys.reshape(-1)
    distinct = int(np.unique(flat).size)
    reuse = float(_first_batch_repeats(flat, batch).mean())
    points = []
    for b in sizes:
        rows = b // 264
        pt = CachePoint(bytes=b, rows=rows)
        names = list(policies) + ([OPTIMAL] if optimal else [])
        for name in names:
            h = optimal_hits(keys, rows, progress) if name == OPTIMAL else policy_hits(keys, rows, name, batch)
            pt.hit_rate[name] = float(h.mean())
            pt.by_layer[name], pt.by_order[name] = _rates(h, trace)
        points.append(pt)
    return CacheCurve(source=trace.source, sessions=int(sessions), steps=int(keys.shape[0]), reads=int(flat.size),
                      distinct_rows=distinct, reuse_rate=reuse, policies=list(policies), points=points)
