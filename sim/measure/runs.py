"""Measured decode runs: the real decode loop over stretches of real traces (``runs.json``, SPEC §9).

:func:`decode_run` runs one configuration: per step ``session.step(token)``
(hash, one concurrent batch of 48 rows over both tables, decode), then the
step's compute, each timed with ``time.perf_counter``; tokens/s over the
wall time of the loop.  Every run reads its own stretch of its trace
(:func:`segments`): no run re-reads the rows of another, which a virtual
disk's host cache would serve faster than the fresh random rows of the
microbenchmarks.
"""

from __future__ import annotations

import time
from typing import Dict, Sequence

import numpy as np

from engram.errors import ArgumentError

from ..schema import ComputeSpec, RunConfig, percentiles_ms, us_list
from ..trace import Trace
from .compute import compute_runner

__all__ = ["decode_run", "segments", "trace_tokens_needed"]

#: Percentiles of a run's step, read and compute times.
_PCT = (50, 90, 95, 99)


def decode_run(model, trace: Trace, config: RunConfig, *, start: int = 0, warmup: int = 8,
               residual_seed: int = 0) -> dict:
    """Run the real decode loop of ``config`` over ``config.steps`` tokens of ``trace`` from step ``start``.

    Each step: ``session.step(token)`` (hash + one batch of the 48 rows of both
    tables + decode; its time is the read time), then the step's compute
    (:class:`ComputeSpec`); the step time runs from before the read to after
    the compute.  The loop continues the text: the up to 3 tokens of the
    sequence before ``start`` are replayed into the hash history first
    (hashing only, no reads: SPEC §4), and a new sequence of the trace
    restarts the history, so every step's row ids equal the trace's (checked:
    ``rows_match``).  ``warmup`` steps on random token ids (random rows) wake
    the readers before the timed loop.

    Returns
    -------
    dict
        A run record (see :mod:`sim.schema`), without ``config``/``round``.

    Raises
    ------
    ArgumentError
        The trace has fewer than ``start + config.steps`` tokens.
    TableIOError, DecodeError
        A read failed.
    """
    n = config.steps
    start = int(start)
    if start < 0 or trace.steps < start + n:
        raise ArgumentError(f"trace {trace.source!r} has {trace.steps} tokens, the configuration needs "
                            f"{n} from step {start}")
    spec = ComputeSpec.parse(config.compute)
    tokens = trace.tokens[start:start + n].tolist()
    seq_starts = trace.starts
    starts = set(int(x) - start for x in seq_starts if start < x < start + n)
    first = int(seq_starts[seq_starts <= start].max())
    history = trace.tokens[max(first, start - 3):start].tolist()
    read_s = np.empty(n)
    comp_s = np.empty(n)
    step_s = np.empty(n)
    distinct = np.empty(n, np.int64)
    concurrent = nreads = 0
    match = True
    clock = time.perf_counter
    rng = np.random.default_rng([residual_seed, start, 6])
    with model.session(backend=config.backend, readers=config.readers, threshold=config.threshold) as s:
        run = compute_runner(spec, model, s, residual_seed)
        for tok in rng.integers(0, len(model.token_map), warmup).tolist():
            run(s.step(tok))
        s.restore(model.hasher.new_history())
        for tok in history:
            s.step_rows(int(tok))
        step, want = s.step, trace.rows[start:start + n]
        t_begin = clock()
        for i in range(n):
            if i in starts:
                s.restore(model.hasher.new_history())
            t0 = clock()
            rows = step(tokens[i])
            t1 = clock()
            run(rows)
            t2 = clock()
            read_s[i] = t1 - t0
            comp_s[i] = t2 - t1
            step_s[i] = t2 - t0
            st = s.last_stats
            distinct[i] = st.rows_distinct
            nreads += st.reads
            if st.backend != "serial":
                concurrent += 1
            if match and not np.array_equal(s.last_row_ids, want[i]):
                match = False
        wall = clock() - t_begin
    return {"start": start, "steps": n, "wall_s": wall, "tokens_per_s": n / wall,
            "step_ms": percentiles_ms(step_s, _PCT), "read_ms": percentiles_ms(read_s, _PCT),
            "compute_ms": percentiles_ms(comp_s, _PCT), "concurrent_steps": concurrent,
            "rows_distinct_mean": float(distinct.mean()), "reads": nreads, "rows_match": match,
            "step_us": us_list(step_s), "read_us": us_list(read_s), "compute_us": us_list(comp_s)}


def segments(configs: Sequence[RunConfig], rounds: int) -> Dict[tuple, int]:
    """First trace step of each run: ``{(config index, round): start}``.

    The runs of one trace read consecutive, disjoint stretches of it (round
    after round, configuration after configuration), so no run re-reads rows
    an earlier run read: a shared device's caches (a virtual disk's host page
    cache) would make repeated rows faster than the fresh random rows of the
    microbenchmarks.  Only a trace's own repeats (SPEC §8: 22.5% of reads)
    stay.  :func:`trace_tokens_needed` gives the length each trace needs.
    """
    out, nxt = {}, {}
    for r in range(rounds):
        for i, c in enumerate(configs):
            s = nxt.get(c.trace, 0)
            out[(i, r)] = s
            nxt[c.trace] = s + c.steps
    return out


def trace_tokens_needed(configs: Sequence[RunConfig], rounds: int) -> Dict[str, int]:
    """Tokens each trace source needs for :func:`segments`: ``{trace: sum of steps x rounds}``."""
    need: Dict[str, int] = {}
    for c in configs:
        need[c.trace] = need.get(c.trace, 0) + c.steps * rounds
    return need
