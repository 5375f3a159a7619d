"""Measured decode runs: the real decode loop over stretches of real traces (``runs.json``, SPEC §9).

:func:`decode_run` runs one configuration: per step ``session.step(token)``
(hash, one concurrent batch of 48 rows over both tables, decode), then the
step's compute, each timed with ``time.perf_counter``; tokens/s over the
time of those steps.  Probe steps on random token ids are interleaved with
them (:func:`session_loop`), the microbenchmark of the run's own time window
(:func:`probe_record`).  Every run reads its own stretch of its trace
(:func:`segments`): no run re-reads the rows of another, which a virtual
disk's host cache would serve faster than the fresh random rows of the
microbenchmarks.

A speculative configuration (``config.draft_tokens = k > 0``) decodes its stretch with drafts
(:func:`speculative_loop`): the draft of a position is the replayed text's true token with probability
``config.acceptance``, else a random id of the vocabulary; a verification step reads its tokens' rows with
``Session.step_many``, rolls the rejected drafts back with ``Session.rollback``, and with
``config.prefetch_drafts`` reads the next drafts' rows in the background (``Session.prefetch``) while it
computes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from engram import RowCache
from engram.errors import ArgumentError

from sim.core.schema import STEP_ROWS, ComputeSpec, RunConfig, percentiles_ms, probe_positions, us_list
from ..trace import Trace
from ..trace.rowcache import stretch_hits
from .compute import compute_runner

__all__ = ["DecodeLoop", "decode_run", "probe_record", "run_record", "segments", "session_loop", "speculative_loop",
           "trace_tokens_needed"]

#: Percentiles of a run's step, read and compute times.
_PCT = (50, 90, 95, 99)


def _os_threads() -> int:
    """Threads of this process as the kernel counts them (Python's and the readers' native ones); 0 when unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


@dataclass(frozen=True)
class DecodeLoop:
    """How one session's measured decode loop runs (:func:`session_loop`, :func:`speculative_loop`,
    :func:`decode_run`, :func:`sim.measure.sessions.sessions_run`).

    Attributes
    ----------
    start : int
        First trace step of the loop's stretch (a multi-session run: of its first session's; session ``i``
        reads from ``start + i * steps``).
    warmup : int
        Steps on random token ids before the timed loop (they wake the readers; no row cache).
    residual_seed : int
        Seed of the warm-up token ids and of the compute's residuals (session ``i`` of a multi-session run:
        ``residual_seed + i``).
    probe_every : int
        A probe step on a random token id before every ``probe_every``-th trace step and after the last
        (0: none; :func:`sim.core.schema.probe_positions`).  Speculative loops take none.
    probe_seed : int
        Seed of the probe steps' token ids.
    cache : engram.RowCache, optional
        The trace steps read through it, the warm-up and probe steps past it (None: no row cache).

    Raises
    ------
    ArgumentError
        ``start``, ``warmup`` or ``probe_every`` is not a whole number >= 0 (names the field).
    """

    start: int = 0
    warmup: int = 8
    residual_seed: int = 0
    probe_every: int = 0
    probe_seed: int = 0
    cache: Optional[RowCache] = None

    def __post_init__(self) -> None:
        for name in ("start", "warmup", "probe_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ArgumentError(f"{name} must be a whole number >= 0, got {v!r}")
            object.__setattr__(self, name, int(v))


def _open(model, config: RunConfig):
    """The loop's session (``config``'s backend, readers and threshold; a context manager)."""
    return model.session(backend=config.backend, readers=config.readers, threshold=config.threshold)


def _warm_up(model, s, run, loop: DecodeLoop) -> None:
    """``loop.warmup`` steps on random token ids (seeded by ``loop.residual_seed`` and ``loop.start``), each with
    its compute: they wake the readers."""
    rng = np.random.default_rng([loop.residual_seed, loop.start, 6])
    for tok in rng.integers(0, len(model.token_map), loop.warmup).tolist():
        run(s.step(tok))


def _replay(model, s, history: Sequence[int]) -> None:
    """A fresh hash history with the tokens of the sequence before the stretch replayed into it (hashing only)."""
    s.restore(model.hasher.new_history())
    for tok in history:
        s.step_rows(int(tok))


class _ProbedLoop:
    """The figures of :func:`session_loop` as its steps run: the trace steps' and the probe steps' times, rows
    and counts, each step timed from the end of the one before (``t_prev``)."""

    def __init__(self, model, s, run, cache, n: int, m: int) -> None:
        self.model, self.s, self.run, self.cache = model, s, run, cache
        self.clock = time.perf_counter
        self.read_s, self.comp_s, self.step_s = np.empty(n), np.empty(n), np.empty(n)
        self.distinct = np.empty(n, np.int64)
        self.p_read, self.p_comp, self.p_t = np.empty(m), np.empty(m), np.empty(m)
        self.p_distinct = np.empty(m, np.int64)
        self.concurrent = self.nreads = self.threads = self.hits = 0
        self.match = True
        self.t_begin = self.t_prev = 0.0

    def begin(self) -> None:
        """The timed loop starts now."""
        self.t_begin = self.t_prev = self.clock()

    def probe(self, j: int, token: int) -> None:
        """Probe step ``j`` on ``token``, past the row cache."""
        s = self.s
        if self.cache is not None:
            s.use_cache(None)
        t1, t_end, st = _probe_step(s, self.run, token, self.clock)
        if self.cache is not None:
            s.use_cache(self.cache)
        self.p_read[j], self.p_comp[j], self.p_t[j] = t1 - self.t_prev, t_end - t1, self.t_prev - self.t_begin
        self.p_distinct[j] = st.rows_distinct
        self.nreads += st.reads
        self.t_prev = t_end

    def trace_step(self, i: int, token: int, want: np.ndarray, restart: bool, midway: bool) -> None:
        """Trace step ``i`` on ``token`` (a new sequence first when ``restart``), its row ids checked against
        ``want``; this process's threads counted when ``midway``."""
        s = self.s
        if restart:
            s.restore(self.model.hasher.new_history())
        t1, t_end, st = _timed_step(s, self.run, token, self.clock)
        t_prev = self.t_prev
        self.read_s[i], self.comp_s[i], self.step_s[i] = t1 - t_prev, t_end - t1, t_end - t_prev
        self.distinct[i] = st.rows_distinct
        self.t_prev = t_end
        self.nreads += st.reads
        self.hits += st.cache_hits
        self.concurrent += st.backend != "serial"
        self.match = self.match and bool(np.array_equal(s.last_row_ids, want))
        if midway:
            self.threads = _os_threads()

    def figures(self, t_end: float) -> dict:
        """The raw figures of :func:`session_loop`, the loop having ended at ``t_end``."""
        return {"t_first": self.t_begin, "t_end": t_end, "read_s": self.read_s, "comp_s": self.comp_s,
                "step_s": self.step_s, "distinct": self.distinct, "probe_read_s": self.p_read,
                "probe_comp_s": self.p_comp, "probe_t": self.p_t, "probe_distinct": self.p_distinct,
                "reads": self.nreads, "concurrent": int(self.concurrent), "rows_match": self.match,
                "threads": self.threads, "cache_hits": int(self.hits)}


def session_loop(model, trace: Trace, config: RunConfig, loop: DecodeLoop = DecodeLoop(), *,
                 ready: Optional[Callable[[], None]] = None, delay: float = 0.0) -> dict:
    """One session's timed decode loop over ``config.steps`` tokens of ``trace`` from step ``loop.start``, with
    probe steps interleaved.

    The session (``config``'s backend, readers and threshold) wakes its readers
    with ``loop.warmup`` steps on random tokens, replays the history before
    ``loop.start`` (hashing only), then calls ``ready()`` (a barrier shared with
    other sessions, when given), sleeps ``delay`` seconds (its phase) and runs
    the timed loop.  Every step: ``session.step(token)``, then the compute.

    Probe steps (``loop.probe_every >= 1``, :func:`sim.core.schema.probe_positions`): before every
    ``probe_every``-th trace step and after the last, the same session steps a
    random token id (seeded by ``loop.probe_seed``) with its hash history saved
    and restored around it -- fresh random rows, through the same readers
    and engine, with the same compute after it, at the same time as the
    trace steps around it.  They are the microbenchmark of the loop's own
    time window: the calibration reads them, never the trace steps.

    ``loop.cache`` (an :class:`engram.RowCache`, or None): the trace steps read through it, the warm-up and
    probe steps past it (``cache_hits``: the trace steps' hits).

    Each step's time runs from the end of the step before (so the loop's own
    work is in it, and the steps of the loop add up to its wall time) to the
    end of its compute; its read time ends when ``session.step`` returns.

    Returns
    -------
    dict
        Raw figures: ``t_first``, ``t_end`` (``time.perf_counter`` seconds, a
        system-wide monotonic clock on Linux), ``read_s``, ``comp_s``,
        ``step_s`` (float64 ``[steps]``: the trace steps), ``distinct`` (int64
        ``[steps]``), ``probe_read_s``, ``probe_comp_s``, ``probe_t`` (float64
        ``[m]``: the probe steps, ``probe_t`` their start after ``t_first``),
        ``probe_distinct``, ``reads`` (device reads of every step), ``concurrent``,
        ``rows_match``, ``threads`` (this process's OS threads midway through the loop).

    Raises
    ------
    ArgumentError
        The trace has fewer than ``loop.start + config.steps`` tokens.
    TableIOError, DecodeError
        A read of the session failed.
    """
    n, start, cache = config.steps, loop.start, loop.cache
    tokens, restarts, history = _loop_inputs(trace, start, n)
    where = probe_positions(n, loop.probe_every)
    m = where.size
    with _open(model, config) as s:
        run = compute_runner(ComputeSpec.parse(config.compute), model, s, loop.residual_seed)
        _warm_up(model, s, run, loop)
        probe_tokens = np.random.default_rng([loop.probe_seed, start, 12]).integers(0, len(model.token_map), m).tolist()
        _replay(model, s, history)
        want = trace.rows[start:start + n]
        figs = _ProbedLoop(model, s, run, cache, n, m)
        s.use_cache(cache)
        if ready is not None:
            ready()
        if delay > 0:
            time.sleep(delay)
        figs.begin()
        j = 0
        for i in range(n + 1):
            while j < m and where[j] == i:
                figs.probe(j, probe_tokens[j])
                j += 1
            if i == n:
                break
            figs.trace_step(i, tokens[i], want[i], i in restarts, i == n // 2)
        t_end = figs.clock()
    return figs.figures(t_end)


def _drafts(rng: np.random.Generator, truth: Sequence[int], acceptance: float, vocab: int) -> list:
    """Drafts of the positions whose true tokens are ``truth``: each the true token with probability
    ``acceptance``, else a random id of the vocabulary (which may be the true one by chance)."""
    right = rng.random(len(truth)) < acceptance
    other = rng.integers(0, vocab, len(truth))
    return [int(t) if ok else int(o) for t, ok, o in zip(truth, right, other)]


def _accepted(drafts: Sequence[int], truth: Sequence[int]) -> int:
    """The accepted prefix: drafts equal to the true tokens, up to the first that is not."""
    a = 0
    for d, t in zip(drafts, truth):
        if d != t:
            break
        a += 1
    return a


class _Speculation:
    """The verification steps of :func:`speculative_loop` on an open session ``s`` with the compute ``run``, and
    their figures as they run (each step timed from the end of the one before: ``t_prev``)."""

    def __init__(self, model, s, run, config: RunConfig, tokens: Sequence[int], loop: DecodeLoop) -> None:
        self.s, self.run, self.tokens = s, run, tokens
        self.n, self.k, self.acc = config.steps, config.draft_tokens, config.acceptance
        self.vocab = len(model.token_map)
        self.draft_rng = np.random.default_rng([loop.residual_seed, loop.start, 27])
        self.clock = time.perf_counter
        self.read_s, self.comp_s, self.step_s, self.emitted, self.distinct = [], [], [], [], []
        self.nreads = self.hits = self.pf_hits = self.made = self.taken = self.concurrent = self.threads = 0
        self.t_begin = self.t_prev = self.clock()

    def count(self, st) -> None:
        """Add a read's stats."""
        self.nreads += st.reads
        self.hits += st.cache_hits
        self.pf_hits += getattr(st, "prefetch_hits", 0)
        self.concurrent += st.backend != "serial"

    def _draft(self, truth: Sequence[int]) -> list:
        return _drafts(self.draft_rng, truth, self.acc, self.vocab)

    def _record(self, t1: float, t_end: float, e: int, nd: int) -> None:
        """A verification step whose read ended at ``t1`` and compute at ``t_end``: ``e`` tokens emitted,
        ``nd`` distinct rows read."""
        self.read_s.append(t1 - self.t_prev), self.comp_s.append(t_end - t1), self.step_s.append(t_end - self.t_prev)
        self.emitted.append(e), self.distinct.append(nd)
        self.t_prev = t_end
        if len(self.step_s) == 20:
            self.threads = _os_threads()

    def _compute(self, rows, e: int, nd: int) -> None:
        t1 = self.clock()
        self.run(rows)
        self._record(t1, self.clock(), e, nd)

    def _accept(self, drafts: Sequence[int], truth: Sequence[int]) -> int:
        a = _accepted(drafts, truth)
        self.made, self.taken = self.made + len(drafts), self.taken + a
        return a

    def without_prefetch(self) -> None:
        """Every verification step reads the emitted token and the drafts after it in one batch."""
        s, tokens, n, k = self.s, self.tokens, self.n, self.k
        q = 0  # the next position to emit
        while q < n:
            truth = tokens[q + 1:q + 1 + k]
            drafts = self._draft(truth)
            a = self._accept(drafts, truth)
            got = s.step_many([tokens[q]] + drafts)
            self.count(s.last_stats)
            nd = s.last_stats.rows_distinct
            if len(drafts) > a:
                s.rollback(len(drafts) - a)
            self._compute({lid: x[-1] for lid, x in got.items()}, 1 + a, nd)
            q += 1 + a

    def _prefetch_and_compute(self, rows, q: int, e: int, nd: int) -> list:
        """Prefetch the drafts after ``tokens[q]``, compute on ``rows``, record the step; the drafts."""
        drafts = self._draft(self.tokens[q:q + self.k])
        if drafts:
            self.s.prefetch(drafts)
        self._compute(rows, e, nd)
        return drafts

    def with_prefetch(self) -> None:
        """The first token alone; from there every step reads the drafts the step before prefetched, then the
        token it emits after its accepted ones, and prefetches the next drafts while it computes."""
        s, tokens, n = self.s, self.tokens, self.n
        rows = s.step(tokens[0])
        self.count(s.last_stats)
        q = 1
        drafts = self._prefetch_and_compute(rows, q, 1, s.last_stats.rows_distinct)
        while q < n:
            a = self._accept(drafts, tokens[q:q + len(drafts)])
            nd = 0
            if drafts:
                s.step_many(drafts)
                self.count(s.last_stats)
                nd += s.last_stats.rows_distinct
                s.rollback(len(drafts) - a)
            e = a
            if q + a < n:  # the token the step emits after its accepted drafts
                rows = s.step(tokens[q + a])
                self.count(s.last_stats)
                nd += s.last_stats.rows_distinct
                e += 1
            q += e
            drafts = self._prefetch_and_compute(rows, q, e, nd)

    def figures(self, t_end: float) -> dict:
        """The raw figures of :func:`speculative_loop`, the loop having ended at ``t_end``."""
        empty = np.zeros(0)
        return {"t_first": self.t_begin, "t_end": t_end, "read_s": np.asarray(self.read_s),
                "comp_s": np.asarray(self.comp_s), "step_s": np.asarray(self.step_s),
                "distinct": np.asarray(self.distinct, np.int64), "probe_read_s": empty, "probe_comp_s": empty,
                "probe_t": empty, "probe_distinct": np.zeros(0, np.int64), "reads": self.nreads,
                "concurrent": int(self.concurrent), "rows_match": True, "threads": self.threads,
                "cache_hits": int(self.hits), "emitted": np.asarray(self.emitted, np.int64),
                "prefetch_hits": int(self.pf_hits), "drafts": int(self.made), "accepted": int(self.taken)}


def speculative_loop(model, trace: Trace, config: RunConfig, loop: DecodeLoop = DecodeLoop()) -> dict:
    """One session decoding ``config.steps`` tokens of ``trace`` from step ``loop.start`` speculatively (see the
    module); no probe steps whatever ``loop.probe_every`` (a probe's saved and restored history would drop a
    prefetch).

    Without prefetch a verification step is ``session.step_many([c, d1..dk])`` -- ``c`` the token the step
    before emitted, ``d`` the drafts of the positions after it -- then ``rollback(k - a)`` of the rejected
    drafts (``a`` the accepted prefix) and the compute: one batch of up to ``(k + 1) x 48`` rows, ``1 + a``
    tokens emitted.  With prefetch the drafts follow the history (``Session.prefetch`` hashes them from it),
    so a step is ``step_many([d1..dk])`` (rows from the prefetch, waiting for what is still in flight),
    ``rollback(k - a)``, ``step(b)`` of the token the step emits after its accepted drafts (its rows on the
    critical path), then ``prefetch`` of the next drafts and the compute: the same rows a step as without,
    the drafts' read off the critical path; the first step reads its token alone.  Drafts stop at the end of
    the stretch.  Each step's read time runs from the end of the step before to the last row's arrival.

    Returns
    -------
    dict
        :func:`session_loop`'s figures (per verification step), plus ``emitted`` (int64 ``[steps]``),
        ``prefetch_hits`` (rows served by prefetches), ``drafts`` and ``accepted`` (drafts made and accepted).

    Raises
    ------
    ArgumentError
        The trace is too short, or starts a sequence inside the stretch.
    TableIOError, DecodeError
        A read failed.
    """
    start = loop.start
    tokens, restarts, history = _loop_inputs(trace, start, config.steps)
    if restarts:  # a new sequence in the stretch: a draft across it would follow the wrong history
        raise ArgumentError(f"speculative runs need a stretch within one sequence: {trace.source!r} starts a "
                            f"sequence inside steps {start}..{start + config.steps}")
    with _open(model, config) as s:
        run = compute_runner(ComputeSpec.parse(config.compute), model, s, loop.residual_seed)
        _warm_up(model, s, run, loop)
        _replay(model, s, history)
        s.use_cache(loop.cache)
        spec = _Speculation(model, s, run, config, tokens, loop)
        if config.prefetch_drafts:
            spec.with_prefetch()
        else:
            spec.without_prefetch()
        t_end = spec.clock()
    return spec.figures(t_end)


def cache_record(cache, trace: Trace, starts: Sequence[int], steps: int, got: Sequence[dict],
                 shared: bool) -> Optional[dict]:
    """A run's row cache: measured hits of its trace steps beside the hits predicted by replaying the same
    stretches through the same policy (:func:`sim.trace.rowcache.stretch_hits`; ``shared``: the sessions'
    steps interleaved step by step through one cache, else each session through a cache of its own)."""
    if cache is None:
        return None
    hits = stretch_hits(trace, starts, steps, cache.capacity, cache.policy, shared)
    predicted, requests = int(hits.sum()), int(hits.size)
    measured = sum(int(r["cache_hits"]) for r in got)
    return {"bytes": cache.max_bytes, "rows": cache.capacity, "policy": cache.policy, "shared": bool(shared),
            "requests": requests, "hits": measured, "hit_rate": measured / requests,
            "predicted_hits": predicted, "predicted_hit_rate": predicted / requests}


def _loop_inputs(trace: Trace, start: int, n: int) -> tuple:
    """``(tokens, restarts, history)`` of the loop over trace steps ``[start, start + n)``: its token ids, the
    loop steps where a new sequence restarts the hash history, and the up to 3 tokens of the sequence before
    ``start`` (replayed into the history first, SPEC §4).

    Raises
    ------
    ArgumentError
        The trace is too short.
    """
    if start < 0 or trace.steps < start + n:
        raise ArgumentError(f"trace {trace.source!r} has {trace.steps} tokens, the configuration needs "
                            f"{n} from step {start}")
    seq_starts = trace.starts
    restarts = set(int(x) - start for x in seq_starts if start < x < start + n)
    first = int(seq_starts[seq_starts <= start].max())
    return trace.tokens[start:start + n].tolist(), restarts, trace.tokens[max(first, start - 3):start].tolist()


def _timed_step(s, run, token: int, clock) -> tuple:
    """``session.step(token)`` then the compute ``run``: ``(time the read ended, time the compute ended, stats)``."""
    rows = s.step(token)
    t1 = clock()
    run(rows)
    return t1, clock(), s.last_stats


def _probe_step(s, run, token: int, clock) -> tuple:
    """A probe step: :func:`_timed_step` on a random token id with the session's hash history saved and restored
    around it (the trace steps after it read the trace's rows)."""
    saved = s.snapshot()
    out = _timed_step(s, run, token, clock)
    s.restore(saved)
    return out


def decode_run(model, trace: Trace, config: RunConfig, loop: DecodeLoop = DecodeLoop()) -> dict:
    """Run the real decode loop of ``config`` over ``config.steps`` tokens of ``trace`` from step ``loop.start``.

    Each step: ``session.step(token)`` (hash + one batch of the 48 rows of both
    tables + decode; its time is the read time), then the step's compute
    (:class:`ComputeSpec`); the step time runs from the end of the step before
    to after the compute.  The loop continues the text: the up to 3 tokens of
    the sequence before ``loop.start`` are replayed into the hash history first
    (hashing only, no reads: SPEC §4), and a new sequence of the trace
    restarts the history, so every step's row ids equal the trace's (checked:
    ``rows_match``).  ``loop.warmup`` steps on random token ids (random rows) wake
    the readers before the timed loop; with ``loop.probe_every >= 1`` probe steps
    on random token ids are interleaved (:func:`session_loop`): their figures
    are in ``"_probe"`` (:func:`probe_record` makes them a microbenchmark).  A speculative configuration
    runs :func:`speculative_loop` instead (no probe steps: ``probe_every`` 0 in the record).

    Returns
    -------
    dict
        A run record (see :mod:`sim.core.schema`), without ``config``/``round``/``window``;
        tokens/s is the trace steps over their own time (the probe steps left out).

    Raises
    ------
    ArgumentError, TableIOError, DecodeError
        As :func:`session_loop` and :func:`speculative_loop` raise them.
    """
    if config.draft_tokens:
        r = speculative_loop(model, trace, config, loop)
        probe_every = 0
    else:
        r = session_loop(model, trace, config, loop)
        probe_every = loop.probe_every
    rec = run_record(config, loop.start, r)
    c = cache_record(loop.cache, trace, [loop.start], config.steps, [r], True)
    if c is not None:
        rec["row_cache"] = c
    rec["probe_every"] = int(probe_every)
    rec["_probe"] = [r]
    return rec


def run_record(config: RunConfig, start: int, r: dict) -> dict:
    """The run record of one session's raw figures (:func:`session_loop`)."""
    n = config.steps
    step_s, read_s, comp_s = r["step_s"], r["read_s"], r["comp_s"]
    extra = {}
    if "emitted" in r:  # a speculative run: its verification steps, the tokens they emitted
        e = r["emitted"]
        extra = {"speculative": {"draft_tokens": config.draft_tokens, "acceptance": config.acceptance,
                                 "prefetch_drafts": config.prefetch_drafts, "verification_steps": int(e.size),
                                 "tokens": int(e.sum()), "tokens_per_step": float(e.mean()),
                                 "drafts": r["drafts"], "accepted": r["accepted"],
                                 "accepted_share": r["accepted"] / r["drafts"] if r["drafts"] else 0.0,
                                 "prefetch_hits": r["prefetch_hits"], "emitted": e.astype(int).tolist()}}
    return {**extra, "start": start, "steps": n, "wall_s": r["t_end"] - r["t_first"],
            "tokens_per_s": n / step_s.sum(),
            "step_ms": percentiles_ms(step_s, _PCT), "read_ms": percentiles_ms(read_s, _PCT),
            "compute_ms": percentiles_ms(comp_s, _PCT), "concurrent_steps": r["concurrent"],
            "rows_distinct_mean": float(np.mean(r["distinct"])), "reads": r["reads"], "rows_match": r["rows_match"],
            "threads": r["threads"], "probe_steps": int(len(r["probe_read_s"])), "step_us": us_list(step_s),
            "read_us": us_list(read_s), "compute_us": us_list(comp_s)}


def probe_record(config: RunConfig, window: str, round_: int, got: Sequence[dict], every: int) -> Optional[dict]:
    """The microbenchmark record of the probe steps of one decode run (one session's or several sessions'
    raw figures of :func:`session_loop`), or None when it had none.

    A record of kind ``"io"``, tool ``"session"``, tagged ``probe = window``:
    the run's read policy (``backend``, ``threshold``, ``readers``, ``qd`` =
    readers, 1 for a serial configuration), ``compute``, ``sessions``,
    ``mode``, ``every`` (``probe_every`` of the loop), ``session_steps``
    (steps of each session's loop, probes included: placed by
    :func:`sim.core.schema.probe_positions`) and ``offsets_s`` (each session's
    loop start after the first's), and per probe step, session after
    session: ``session``,
    ``batch_us`` (read time: hash, rows, decode), ``compute_us``, ``t_us``
    (start after the first session's start) and ``distinct`` (rows read).
    It holds nothing of the trace steps.
    """
    if not got or not len(got[0]["probe_read_s"]):
        return None
    t0 = min(r["t_first"] for r in got)
    sess = np.concatenate([np.full(len(r["probe_read_s"]), i) for i, r in enumerate(got)])
    return {"kind": "io", "tool": "session", "probe": window, "round": int(round_), "backend": config.backend,
            "threshold": config.threshold, "readers": config.readers, "qd": 1 if config.serial else config.readers,
            "batch_rows": STEP_ROWS, "compute": ComputeSpec.parse(config.compute).label, "sessions": len(got),
            "mode": config.mode, "every": int(every),
            "session_steps": int(len(got[0]["step_s"]) + len(got[0]["probe_read_s"])),
            "offsets_s": [float(r["t_first"] - t0) for r in got], "session": sess.astype(int).tolist(),
            "batch_us": us_list(np.concatenate([r["probe_read_s"] for r in got])),
            "compute_us": us_list(np.concatenate([r["probe_comp_s"] for r in got])),
            "t_us": us_list(np.concatenate([np.asarray(r["probe_t"]) + (r["t_first"] - t0) for r in got])),
            "distinct": np.concatenate([r["probe_distinct"] for r in got]).astype(int).tolist(),
            "rows": int(sum(int(np.sum(r["probe_distinct"])) for r in got))}


def segments(configs: Sequence[RunConfig], rounds: int) -> Dict[tuple, int]:
    """First trace step of each run: ``{(config index, round): start}``.

    The runs of one trace read consecutive, disjoint stretches of it (round
    after round, configuration after configuration), so no run re-reads rows
    an earlier run read: a shared device's caches (a virtual disk's host page
    cache) would make repeated rows faster than the fresh random rows of the
    microbenchmarks.  Only a trace's own repeats (SPEC §8: 22.5% of reads)
    stay.  A run of ``sessions`` sessions takes ``sessions`` consecutive
    stretches (session ``i`` from ``start + i * steps``).
    :func:`trace_tokens_needed` gives the length each trace needs.
    """
    out, nxt = {}, {}
    for r in range(rounds):
        for i, c in enumerate(configs):
            s = nxt.get(c.trace, 0)
            out[(i, r)] = s
            nxt[c.trace] = s + c.steps * c.sessions
    return out


def trace_tokens_needed(configs: Sequence[RunConfig], rounds: int) -> Dict[str, int]:
    """Tokens each trace source needs for :func:`segments`: ``{trace: sum of steps x sessions x rounds}``."""
    need: Dict[str, int] = {}
    for c in configs:
        need[c.trace] = need.get(c.trace, 0) + c.steps * c.sessions * rounds
    return need
