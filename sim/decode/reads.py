"""The reads of every decode step that reach the device, and whether a run replays its trace (SPEC §8, §9).

Each session replays a :class:`~sim.trace.Trace`: session ``i`` of ``S``
starts at step ``i * T // S`` and wraps around.  A step's requests (``[layers,
columns]`` row ids, read in ``[table][column]`` order) go through, in turn:

1. the DRAM-resident rows (:func:`resident_mask`): served from memory, no read;
2. the session's LRU row cache (``Policy.cache_rows``);
3. the row cache shared by all sessions (``Policy.shared_cache_rows``, the
   engine's :class:`engram.RowCache` with its policy ``Policy.cache_policy``),
   which sees the sessions' requests interleaved step by step (step ``t`` of
   session 0, of session 1, ...: the order of sessions decoding at the same
   pace), each session's step one batch as the engine reads it (looked up, then
   its misses inserted: :func:`shared_cache_hits`);
4. the engine's deduplication: each distinct row of a table is read once a
   step (SPEC §8).

With ``drives > 1`` the tables are striped over identical drives by row id
(drive = row id mod drives: row ids are hash outputs, so the rows spread
evenly) and every step's reads are counted per drive.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional, Union

import numpy as np

from engram.errors import ArgumentError, CachePolicyError, FormatError
from engram.rowcache import DEFAULT_POLICY, POLICIES, CachePolicy

from sim.core.limits import check_memory
from sim.core.params import Policy, Storage
from ..trace import Trace

__all__ = ["BY_POSITION", "StepReads", "cache_hits", "held_warnings", "hot_rows", "resident_mask", "shared_cache_hits",
           "step_reads", "wrap_info"]

log = logging.getLogger("sim.decode")
#: Warnings already logged by this process (each result still carries its own).
_LOGGED: set = set()
#: Depth of :func:`held_warnings` blocks open in this process: while above 0, :func:`wrap_info` logs nothing.
_HELD = 0


@contextlib.contextmanager
def held_warnings():
    """A block whose runs log none of their trace warnings (:func:`wrap_info`; their results still carry them):
    for a caller that says them itself, once, naming what they belong to (a capacity search's configuration,
    :func:`sim.sweep.capacity.find_capacity`), where every probe's worker process would log its own copy."""
    global _HELD
    _HELD += 1
    try:
        yield
    finally:
        _HELD -= 1

_M32 = np.uint64(0xFFFFFFFF)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer on uint64 values holding 32-bit numbers."""
    h = h & _M32
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & _M32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & _M32
    h ^= h >> np.uint64(16)
    return h


def hot_rows(source: Union[str, os.PathLike, np.ndarray]) -> np.ndarray:
    """A hot set: int64 ``[m, 2]`` of ``(table index, row id)``, from an array or a ``.npy`` file.

    A 1-D array of row ids makes those rows resident in every table; a
    ``[m, 2]`` array gives ``(table index, row id)`` pairs (table index 0 is the
    trace's first table, e.g. layer 1).

    Raises
    ------
    FormatError, ArgumentError
        An unreadable file, or an array of another shape or of negative ids.
    """
    if isinstance(source, (str, os.PathLike)):
        try:
            arr = np.load(source, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise FormatError(f"{source}: cannot read the hot set (a .npy array of row ids): {exc}") from None
    else:
        arr = np.asarray(source)
    arr = np.asarray(arr, dtype=np.int64)
    if arr.ndim == 1:
        arr = np.stack([np.full(arr.size, -1, dtype=np.int64), arr], axis=1)
    if arr.ndim != 2 or arr.shape[1] != 2 or (arr.size and arr[:, 1].min() < 0):
        raise ArgumentError(f"hot set: need row ids [m] or (table index, row id) pairs [m, 2] >= 0, "
                            f"got shape {arr.shape}")
    return arr


def resident_mask(rows: np.ndarray, fraction: float = 0.0, hot: Optional[np.ndarray] = None) -> np.ndarray:
    """bool, the shape of ``rows`` (``[..., layers, columns]`` row ids): requests served from DRAM.

    A row is resident when MurmurHash3's 32-bit finalizer of ``row id XOR
    (table index * 0x9E3779B9)`` is below ``fraction * 2**32`` -- a uniform
    sample of ``fraction`` of each table, independent of the striping by
    ``row id mod drives`` -- or when it is in ``hot`` (:func:`hot_rows`).
    """
    layers = rows.shape[-2]
    out = np.zeros(rows.shape, dtype=bool)
    if fraction > 0:
        salt = (np.arange(layers, dtype=np.uint64) * np.uint64(0x9E3779B9))[:, None]
        h = _fmix32(rows.astype(np.uint64) ^ salt)
        out |= h < np.uint64(min(int(fraction * 2**32), 2**32))
    if hot is not None and len(hot):
        for li in range(layers):
            ids = hot[(hot[:, 0] == li) | (hot[:, 0] == -1), 1]
            if ids.size:
                out[..., li, :] |= np.isin(rows[..., li, :], ids)
    return out


def _lru(keys: np.ndarray, active: np.ndarray, capacity: int, policy: str = "lru") -> np.ndarray:
    """bool like ``keys`` (1-D): hits of a row cache of ``capacity`` keys fed the ``active`` keys in order, one
    at a time: the engine's ``policy`` (:class:`engram.rowcache.CachePolicy`; ``"lru"`` by default)."""
    hits = np.zeros(keys.size, dtype=bool)
    if capacity <= 0 or not active.any():
        return hits
    pos = np.flatnonzero(active)
    k = keys[pos]
    _, first, inv = np.unique(k, return_index=True, return_inverse=True)
    repeat = first[inv.reshape(-1)] != np.arange(k.size)
    if first.size <= capacity:  # never evicts: the hits are exactly the repeats
        hits[pos] = repeat
        return hits
    got = np.zeros(k.size, dtype=np.uint8)
    CachePolicy(int(capacity), policy).access(np.ascontiguousarray(k, np.uint64), got, 1)
    hits[pos] = got.astype(bool)
    return hits


def cache_hits(keys: np.ndarray, active: np.ndarray, capacity: int, policy: str = DEFAULT_POLICY) -> np.ndarray:
    """bool ``[n]`` (``keys`` flattened): hits of a row cache of ``capacity`` keys running the engine's ``policy``
    (:class:`engram.rowcache.CachePolicy`, one of :data:`engram.rowcache.POLICIES`; default the engine's,
    :data:`engram.rowcache.DEFAULT_POLICY`) fed the ``active`` keys (bool like ``keys``) in order, one at a
    time -- a per-session row cache of :class:`~sim.core.params.Policy` (``cache_rows`` rows, its
    ``cache_policy``), for other models of a session's reads (the serving model's per-request caches).
    ``keys`` are uint64 ``(layer id << 32) | row`` (:func:`engram.rowcache.cache_key`).

    Raises
    ------
    CachePolicyError
        ``policy`` is not one of the engine's (an :class:`engram.ArgumentError`).
    """
    if policy not in POLICIES:
        raise CachePolicyError(f"unknown row cache policy {policy!r}; policies: {', '.join(POLICIES)}")
    return _lru(np.asarray(keys).reshape(-1), np.asarray(active, dtype=bool).reshape(-1), int(capacity), policy)


def shared_cache_hits(keys: np.ndarray, active: np.ndarray, capacity: int,
                      policy: str = DEFAULT_POLICY) -> np.ndarray:
    """bool ``[batches, width]``: hits of the engine's row cache (``policy``, ``capacity`` rows) fed batch
    after batch the ``active`` keys of each row of ``keys`` ``[batches, width]``: a batch's keys looked up
    first, then its misses inserted, as :class:`engram.RowCache` serves a batch
    (:meth:`engram.rowcache.CachePolicy.access_runs`)."""
    hits = np.zeros(keys.shape, dtype=bool)
    if capacity <= 0 or not active.any():
        return hits
    act = active.reshape(-1)
    k = np.ascontiguousarray(keys.reshape(-1)[act], np.uint64)
    counts = active.sum(axis=1)
    _, first, inv = np.unique(k, return_index=True, return_inverse=True)
    if first.size <= capacity:  # never evicts: the hits are the keys of an earlier batch
        batch = np.repeat(np.arange(keys.shape[0]), counts)
        got = batch > batch[first[inv.reshape(-1)]]
    else:
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        g = np.zeros(k.size, np.uint8)
        CachePolicy(int(capacity), policy).access_runs(k, bounds, g)
        got = g.astype(bool)
    hits.reshape(-1)[act] = got
    return hits


def _keys(rows: np.ndarray, layer_ids) -> np.ndarray:
    """uint64 keys ``(layer id << 32) | row`` of ``rows`` (``[..., layers, columns]``): the keys of
    :class:`engram.RowCache` (:func:`engram.rowcache.cache_key`), so that its policy sees the same keys."""
    return rows.astype(np.uint64) | (np.asarray(layer_ids, dtype=np.uint64) << np.uint64(32))[:, None]


@dataclass
class StepReads:
    """Device reads of every session and step.

    Attributes
    ----------
    reads : list of numpy.ndarray
        Per session, int64 ``[steps, layers]``: distinct rows of each table read
        from the device at each step.
    by_drive : list of numpy.ndarray or None
        Per session, int64 ``[steps, layers, drives]`` (``drives > 1``).
    order : list or None
        Per session and step, per table, int8 arrays of the drive of each read
        in the engine's order (sorted row ids); for the exact mode with drives.
    requests, dram_hits, cache_hits, shared_hits : int
        Row requests, and those served by DRAM-resident rows, the sessions'
        caches and the shared cache.
    wrap : dict
        :func:`wrap_info`.
    drafts : list of numpy.ndarray or None
        Speculative runs (``batch`` given): per session, int64 ``[steps, layers]``, the distinct rows read
        among the drafts' requests (the part a prefetch can read early, :mod:`sim.decode.speculative`).
    wasted : int
        Speculative runs: reads of rows only rejected drafts asked for.
    """

    reads: List[np.ndarray]
    by_drive: Optional[List[np.ndarray]]
    order: Optional[list]
    requests: int
    dram_hits: int
    cache_hits: int
    shared_hits: int
    wrap: dict = field(default_factory=dict)
    drafts: Optional[List[np.ndarray]] = None
    wasted: int = 0


#: Bytes the reads of one row slot of one step of one session take while :func:`step_reads` works (row id,
#: key, sorted id, resident and first-read flags, and their temporaries; measured: 19 bytes at 64 sessions).
BYTES_PER_ROW_SLOT = 24


def _distinct(s_rows: np.ndarray, big: np.int64) -> np.ndarray:
    """bool like ``s_rows`` (sorted along the last axis, ``big`` for no request): the first of each row id."""
    first = np.ones(s_rows.shape, dtype=bool)
    first[..., 1:] = s_rows[..., 1:] != s_rows[..., :-1]
    return first & (s_rows != big)


#: Whether :func:`step_reads` counts a run without row caches once per trace position (:func:`_positional_reads`);
#: ``False`` counts every session's steps on their own (the same result: to check one against the other).
BY_POSITION = True


def step_reads(trace: Trace, sessions: int, steps: int, policy: Policy = Policy(), *, storage: Storage = Storage(),
               order: bool = False, replay: Optional[str] = None, batch: Optional[tuple] = None,
               served: Optional[np.ndarray] = None) -> StepReads:
    """The reads of every session and step (see the module); ``replay``: see :func:`wrap_info`.

    ``storage``: its ``drives`` (reads counted per drive when more than one) and ``hot`` rows
    (:func:`hot_rows`) are used.  ``order``: keep each read's drive in the engine's order too
    (:attr:`StepReads.order`, for the exact mode with drives).

    Without row caches (and without ``batch``) a step's reads depend only on its trace position, and they are
    counted once per position and gathered (:func:`_positional_reads`: the same result; :data:`BY_POSITION`
    ``False`` counts every session's steps on their own even then, to check one against the other).

    ``batch``: a speculative run's verification steps, ``(rows, accepted, positions, lead)`` -- ``rows``
    int64 ``[S, steps, layers, W]`` (every request of a step per table, the confirmed token's ``lead``
    columns first, then the drafts' ``lead`` columns each), ``accepted`` int64 ``[S, steps]`` and
    ``positions`` int64 ``[S]`` as :func:`sim.decode.speculative.verification_rows` returns them.  The ``W``
    requests of a table are deduplicated as one batch; :attr:`StepReads.drafts` and
    :attr:`StepReads.wasted` are filled in.

    ``policy.cache_warmup_steps`` (with a row cache): each session first decodes that many trace steps before its
    start through the caches, interleaved as the timed steps; those steps are neither returned nor counted, so the
    run's figures are those of caches already warm (:class:`sim.core.params.Policy`).

    ``served``: bool like ``trace.rows`` (``[trace steps, layers, columns]``), the requests of the trace that a
    row cache replayed beforehand serves (a measured run's own cache: :func:`sim.check.crosscheck.run_cache_hits`);
    a session replaying the trace meets them at the same positions, so a replay does not inflate their rate.
    Counted with the shared cache's hits (``shared_hits``).  Not with ``batch``.

    Raises
    ------
    ArgumentError
        A trace without steps, fewer than one session or step, a warm-up of the caches with ``batch``, or a run
        whose reads would take more memory than :func:`sim.core.limits.check_memory` allows
        (``BYTES_PER_ROW_SLOT`` a row slot, the warm-up's steps included).
    """
    drives = storage.drives
    hot = hot_rows(storage.hot) if storage.hot is not None else None
    caches = policy.cache_rows > 0 or policy.shared_cache_rows > 0
    warm = policy.cache_warmup_steps if caches else 0
    _check_reads(trace, sessions, steps, drives, order, batch, served, warm)
    if batch is not None and warm:
        raise ArgumentError(f"Policy.cache_warmup_steps = {warm}: a warm-up of the row caches is not modelled with "
                            "speculative verification batches: predict such a run with caches that start empty")
    if BY_POSITION and batch is None and not caches:
        return _positional_reads(trace, sessions, steps, policy, drives, hot, order, replay, served)
    T, L = trace.steps, trace.layers
    if batch is None:  # a warm-up's steps first: each session's trace steps before its start
        rows = np.stack([trace.rows[(s * T // sessions + np.arange(-warm, steps)) % T] for s in range(sessions)])
    else:
        rows = batch[0]
    miss = ~resident_mask(rows, policy.dram_fraction, hot)           # [S, warm + steps, L, C]
    dram = int((~miss[:, warm:]).sum())
    cache, shared = _cached(rows, miss, trace, policy, served, warm)
    rows, miss = rows[:, warm:], miss[:, warm:]
    big = np.int64(1) << np.int64(40)
    s_rows = np.sort(np.where(miss, rows.astype(np.int64), big), axis=3)
    first = _distinct(s_rows, big)
    reads = first.sum(axis=3).astype(np.int64)                        # [S, steps, L]
    drafts, wasted = None, 0
    if batch is not None:
        drafts, wasted = _drafts(rows, miss, reads, batch)
    by_drive = seq = None
    if drives > 1:
        dj = s_rows % drives
        by = np.stack([(first & (dj == j)).sum(axis=3) for j in range(drives)], axis=-1).astype(np.int64)
        by_drive = [by[s] for s in range(sessions)]
        if order:
            seq = [[[dj[s, t, li][first[s, t, li]].astype(np.int8) for li in range(L)] for t in range(steps)]
                   for s in range(sessions)]
    wrap = wrap_info(trace, sessions, steps if batch is None else int(np.max(batch[2])), policy, replay=replay,
                     unit="steps" if batch is None else "tokens")
    return StepReads([reads[s] for s in range(sessions)], by_drive, seq, sessions * steps * L * rows.shape[3], dram,
                     cache, shared, wrap, drafts, wasted)


def _check_reads(trace: Trace, sessions: int, steps: int, drives: int, order: bool, batch: Optional[tuple],
                 served: Optional[np.ndarray], warm: int = 0) -> None:
    """The checks of :func:`step_reads`: the sizes, ``served`` and ``batch``, and the memory the reads take
    (``warm``: the caches' warm-up steps a session, held with the run's own)."""
    if trace.steps == 0:
        raise ArgumentError("the trace has no steps")
    if sessions < 1 or steps < 1 or drives < 1:
        raise ArgumentError(f"need sessions, steps and drives >= 1, got {sessions}, {steps}, {drives}")
    if served is not None and (not isinstance(served, np.ndarray) or served.shape != trace.rows.shape):
        got = served.shape if isinstance(served, np.ndarray) else type(served).__name__
        raise ArgumentError(f"served must be a bool array shaped like the trace's rows {trace.rows.shape}, got {got}")
    if served is not None and batch is not None:
        raise ArgumentError("a replayed row cache (served) is not modelled with speculative verification "
                            "batches: predict such a run without one of them")
    L, W = trace.layers, trace.columns if batch is None else int(batch[0].shape[3])
    check_memory(float(sessions) * (steps + warm) * L * W * (BYTES_PER_ROW_SLOT + (8 if order else 0) * (drives > 1)),
                 f"{steps + warm} steps x {sessions} sessions x {L * W} row slots a step "
                 f"(~{BYTES_PER_ROW_SLOT} bytes a slot)")


def _cached(rows: np.ndarray, miss: np.ndarray, trace: Trace, policy: Policy, served: Optional[np.ndarray],
            warm: int = 0) -> tuple:
    """``(cache, shared)`` hits of the sessions' row caches and of the shared one (with a replayed cache's
    ``served`` requests) among ``miss`` (bool ``[S, warm + steps, L, C]``), which loses them (in place); the
    first ``warm`` steps of each session (:attr:`Policy.cache_warmup_steps`) go through the caches but their hits
    are not counted."""
    sessions, n, L, C = rows.shape
    steps = n - warm
    T = trace.steps
    keys = _keys(rows, trace.layer_ids)
    cache = 0
    if policy.cache_rows > 0:
        for s in range(sessions):
            h = _lru(keys[s].reshape(-1), miss[s].reshape(-1), policy.cache_rows,
                     policy.cache_policy).reshape(miss[s].shape)
            cache += int(h[warm:].sum())
            miss[s] &= ~h
    shared = 0
    if policy.shared_cache_rows > 0:
        k2 = keys.transpose(1, 0, 2, 3).reshape(-1, L * C)
        m2 = miss.transpose(1, 0, 2, 3).reshape(-1, L * C)
        h = shared_cache_hits(k2, m2, policy.shared_cache_rows, policy.cache_policy)
        h = h.reshape(n, sessions, L, C).transpose(1, 0, 2, 3)
        shared = int(h[:, warm:].sum())
        miss &= ~h
    if served is not None:
        sv = served.astype(bool, copy=False)
        h = np.stack([sv[(s * T // sessions + np.arange(steps)) % T] for s in range(sessions)]) & miss[:, warm:]
        shared += int(h.sum())
        miss[:, warm:] &= ~h
    return cache, shared


def _drafts(rows: np.ndarray, miss: np.ndarray, reads: np.ndarray, batch: tuple) -> tuple:
    """``(drafts, wasted)`` of a speculative run's verification steps (:attr:`StepReads.drafts`,
    :attr:`StepReads.wasted`)."""
    lead, W = int(batch[3]), rows.shape[3]
    big = np.int64(1) << np.int64(40)
    r64 = rows.astype(np.int64)
    d = _distinct(np.sort(np.where(miss[..., lead:], r64[..., lead:], big), axis=3), big).sum(axis=3)
    drafts = [d[s].astype(np.int64) for s in range(rows.shape[0])]
    kept = (np.arange(W) // lead)[None, None, :] <= batch[1][:, :, None]     # [S, steps, W]: not rejected
    good = _distinct(np.sort(np.where(miss & kept[:, :, None, :], r64, big), axis=3), big).sum(axis=3)
    return drafts, int(reads.sum() - good.sum())


def _positional_reads(trace: Trace, sessions: int, steps: int, policy: Policy, drives: int,
                      hot: Optional[np.ndarray], order: bool, replay: Optional[str],
                      served: Optional[np.ndarray]) -> StepReads:
    """:func:`step_reads` without row caches (nor verification batches): a step's reads then depend only on its
    trace position (DRAM-resident rows, a replayed cache's ``served`` requests and the deduplication are each a
    function of the position's requests), so they are counted once per position of the trace and gathered for
    every session and step -- the same arrays and counts, in ``O(T)`` work instead of ``O(sessions x steps)``
    sorts (a capacity probe of thousands of sessions)."""
    T, L, C = trace.steps, trace.layers, trace.columns
    rows = trace.rows
    miss = ~resident_mask(rows, policy.dram_fraction, hot)                       # [T, L, C]
    dram_at = (~miss).sum(axis=(1, 2))                                            # [T]
    shared_at = None
    if served is not None:
        h = served.astype(bool, copy=False) & miss
        shared_at = h.sum(axis=(1, 2))
        miss &= ~h
    big = np.int64(1) << np.int64(40)
    s_rows = np.sort(np.where(miss, rows.astype(np.int64), big), axis=2)
    first = _distinct(s_rows, big)
    at = first.sum(axis=2).astype(np.int64)                                       # [T, L]
    pos = (np.arange(sessions, dtype=np.int64)[:, None] * T // sessions + np.arange(steps, dtype=np.int64)) % T
    reads = at[pos]                                                               # [S, steps, L]
    dram = int(dram_at[pos].sum())
    shared = int(shared_at[pos].sum()) if shared_at is not None else 0
    by_drive = seq = None
    if drives > 1:
        dj = s_rows % drives
        by = np.stack([(first & (dj == j)).sum(axis=2) for j in range(drives)], axis=-1).astype(np.int64)
        by_s = by[pos]                                                            # [S, steps, L, drives]
        by_drive = [by_s[s] for s in range(sessions)]
        if order:
            at_seq: dict = {}
            for p in np.unique(pos).tolist():
                at_seq[p] = [dj[p, li][first[p, li]].astype(np.int8) for li in range(L)]
            seq = [[[a.copy() for a in at_seq[p]] for p in pos[s].tolist()] for s in range(sessions)]
    return StepReads([reads[s] for s in range(sessions)], by_drive, seq, sessions * steps * L * C, dram, 0, shared,
                     wrap_info(trace, sessions, steps, policy, replay=replay, unit="steps"))


def _warmup_shared(T: int, sessions: int, steps: int, warm: int) -> float:
    """Share of the sessions' steps (on a trace of ``T`` steps; session ``s`` from ``s * T // sessions``) at a
    position that another session's cache warm-up of ``warm`` steps (the positions before its start) reads."""
    starts = np.arange(sessions, dtype=np.int64) * T // sessions
    w = min(warm, T)
    ahead = (starts[:, None] - w + np.arange(w)) % T                      # [S, w]: each session's warm-up
    count = np.zeros(T, dtype=np.int64)
    for a in ahead:
        count[np.unique(a)] += 1
    hits = 0
    for s in range(sessions):
        pos = (starts[s] + np.arange(min(steps, T))) % T
        own = np.isin(pos, ahead[s])
        hits += int(((count[pos] - own) > 0).sum())
    return hits / (sessions * min(steps, T))


def wrap_info(trace: Trace, sessions: int, steps: int, policy: Policy = Policy(), *,
              replay: Optional[str] = None, unit: str = "steps") -> dict:
    """Whether a run replays its trace, and the warnings that say what that does to its figures.

    ``replay``: the name of an internal run that replays its trace on purpose (a cross-check prediction,
    a report's what-if, the demo's): a wrap is then warned only when a row cache is on (the replay
    inflates its hit rate; without one, replaying a stretch only averages out simulation noise), and the
    warnings name the run instead of advising a longer trace.  ``None``: a run the user configured.
    ``unit``: what ``steps`` counts, in the warnings (``"tokens"``: the trace positions a speculative run
    covers, :mod:`sim.decode.speculative`).

    Returns
    -------
    dict
        ``wrapped`` (a session runs past the end of the trace), ``replays``
        (steps / trace steps), ``repeated_steps`` (share of a session's steps
        at a trace position it read before), ``shared_positions`` (share of
        all sessions' steps at a position another session also reads),
        ``warmup_shared_positions`` (with a shared cache warmed first, several sessions: share of the
        sessions' steps at a position another session's warm-up reads),
        ``warnings`` (list of str: one per effect on this run's figures; also
        logged, once a process, outside :func:`held_warnings`).
    """
    T = trace.steps
    out = {"trace_steps": T, "wrapped": steps > T, "replays": steps / T,
           "repeated_steps": max(0.0, (steps - T) / steps), "shared_positions": 0.0, "warmup_shared_positions": 0.0,
           "warnings": []}
    if sessions > 1:
        pos = np.concatenate([(s * T // sessions + np.arange(min(steps, T))) % T for s in range(sessions)])
        out["shared_positions"] = float(1 - np.unique(pos).size / pos.size)
    caches = policy.cache_rows > 0 or policy.shared_cache_rows > 0
    if steps > T and replay is None:
        out["warnings"].append(
            f"trace wraps: each session runs {steps} {unit} over a trace of {T} (replayed {steps / T:.2f} times), "
            f"so {out['repeated_steps']:.0%} of its {unit} re-read rows it read before"
            + ("; the row cache hit rate is inflated by the replay" if caches else "")
            + ": use a longer trace (or fewer steps)")
    elif steps > T and caches:
        out["warnings"].append(
            f"{replay}: replays its {T}-step stretch {steps / T:.2f} times ({steps} steps) on purpose, so its row "
            "cache hit rate is inflated by the replay")
    warm = policy.cache_warmup_steps if caches else 0
    if warm and warm + min(steps, T) > T:
        out["warnings"].append(
            (f"{replay}: " if replay else "")
            + f"the caches' warm-up of {warm} steps and the {min(steps, T)} steps that follow overlap on a trace of "
            f"{T}: a session's warm-up reads rows it reads again later, so the row cache hit rate is inflated"
            + ("" if replay else ": use a trace of at least warm-up + steps tokens (or a shorter warm-up)"))
    if warm and sessions > 1 and policy.shared_cache_rows > 0:
        out["warmup_shared_positions"] = _warmup_shared(T, sessions, steps, warm)
    if out["warmup_shared_positions"] > 0:
        out["warnings"].append(
            (f"{replay}: " if replay else "")
            + f"the caches' warm-up reads stretches other sessions read after it: "
            f"{out['warmup_shared_positions']:.0%} of the sessions' steps read a stretch another session's warm-up "
            f"of {warm} steps read, so the shared row cache hits rows independent sessions would not share"
            + ("" if replay else ": use a trace of at least sessions x (warm-up + steps) tokens"))
    if policy.shared_cache_rows > 0 and out["shared_positions"] > 0:
        out["warnings"].append(
            (f"{replay}: " if replay else "")
            + f"sessions share their trace: {out['shared_positions']:.0%} of the sessions' steps read a stretch "
            "another session also reads, so the shared row cache hits rows independent sessions would not share"
            + ("" if replay else ": use a trace of at least sessions x steps tokens"))
    for w in out["warnings"] if not _HELD else ():
        if w not in _LOGGED:  # once per process: a report or sweep simulates the same run many times
            _LOGGED.add(w)
            log.warning("%s", w)
    return out
