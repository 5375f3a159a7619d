"""Measured multi-session runs: N concurrent decode sessions on one device, as threads or as processes.

A server runs many decode sessions against one SSD.  :func:`sessions_run`
runs ``config.sessions`` real sessions (:meth:`engram.EngramModel.session`,
each with its own descriptors and history, reading through the process's
I/O engine of the device, :mod:`engram.io_engine`) at once, each on its own
stretch of the trace (session ``i`` from ``start + i * steps``), as threads of
this process (``mode="threads"``) or as processes sharing the device
(``mode="processes"``, forked where the platform allows).  Every session
wakes its readers, then all wait at one barrier; session ``i`` then sleeps
``i * stagger / sessions`` (its phase: the sessions' steps are spread over
one step, as a server's are) and runs its timed loop.

Probe steps on random token ids are interleaved with every session's trace
steps (:func:`sim.measure.runs.session_loop`): the microbenchmark of the
device, the engine and the CPUs as these sessions share them, in the run's
own time window.

The record holds every session's tokens/s (its trace steps over their own
time), its step latencies, its measured start offset (seconds after the
first session's first step: the phases the simulator replays), the slowest
session's tokens/s, the aggregate (the sum of the sessions' tokens/s), and
the OS threads the sessions used.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as _queue
import threading
from dataclasses import dataclass, replace
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from engram import EngramModel, RowCache
from engram.errors import ArgumentError, EngramError, TableIOError

from sim.core.schema import ComputeSpec, RunConfig, percentiles_ms, us_list
from ..trace import Trace
from .runs import DecodeLoop, cache_record, session_loop

__all__ = ["default_stagger", "sessions_run"]

#: Seconds to wait for every session to reach the barrier (opening readers on a loaded machine).
BARRIER_TIMEOUT = 120.0
#: Percentiles of the pooled step, read and compute times.
_PCT = (50, 90, 95, 99)


def default_stagger(config: RunConfig) -> float:
    """Seconds over which the sessions' first steps are spread: the nominal compute of a step plus 1 ms
    (about one step: each session meets the others at a different point of its step)."""
    spec = ComputeSpec.parse(config.compute)
    ms = sum(a for k, a in spec.extra if k in ("spin", "sleep"))
    return (ms + 1.0) * 1e-3


@dataclass(frozen=True)
class _Member:
    """One session of a multi-session run: its loop (its stretch and seeds), its phase ``delay`` (seconds after
    the barrier) and its ``index``; ``own_cache`` ``(bytes, policy)``: a fresh row cache of its own (a session
    process's), else the loop's."""

    loop: DecodeLoop
    delay: float
    index: int
    own_cache: Optional[Tuple[int, str]] = None

    def run(self, model, trace: Trace, config: RunConfig, ready: Callable[[], None]) -> dict:
        """The session's :func:`sim.measure.runs.session_loop`, ``ready`` its barrier."""
        loop = self.loop if self.own_cache is None else replace(self.loop, cache=RowCache(*self.own_cache))
        return session_loop(model, trace, config, loop, ready=ready, delay=self.delay)


def _threads(model, trace, config, members: Sequence[_Member]) -> List[dict]:
    n = config.sessions
    barrier = threading.Barrier(n, timeout=BARRIER_TIMEOUT)
    out: List[Optional[dict]] = [None] * n
    errors: List[BaseException] = []

    def body(i):
        try:
            out[i] = members[i].run(model, trace, config, barrier.wait)
        except threading.BrokenBarrierError:
            pass  # another session failed: its error is the one to report
        except BaseException as exc:  # noqa: BLE001 - reported below, with the session
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"engram-session-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if any(x is None for x in out):
        raise TableIOError(f"{config.key}: sessions did not all start within {BARRIER_TIMEOUT:.0f} s")
    return out  # type: ignore[return-value]


def _child(model, trace, config, member: _Member, barrier, results) -> None:
    """A session in a process of its own: its raw figures (or its error) go back through ``results``."""
    try:
        if isinstance(model, str):  # spawned: open the model from its path
            model = EngramModel.open(model)
            if ComputeSpec.parse(config.compute).mixer:
                for lid in model.layer_ids:
                    model.weights(lid)
        r = member.run(model, trace, config, lambda: barrier.wait(BARRIER_TIMEOUT))
        results.put((member.index, None, {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()}))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
        try:
            barrier.abort()
        except Exception:  # pragma: no cover
            pass
        results.put((member.index, f"{type(exc).__name__}: {exc}", None))


def _collect(config, results, n: int) -> List[dict]:
    """The raw figures the ``n`` session processes send back, in session order.

    Raises
    ------
    TableIOError
        A session failed (its error, up to three named), or nothing came for too long.
    """
    out: List[Optional[dict]] = [None] * n
    errors = []
    for _ in range(n):
        try:
            i, err, r = results.get(timeout=BARRIER_TIMEOUT + 600)
        except _queue.Empty:
            raise TableIOError(f"{config.key}: session processes sent nothing for "
                               f"{BARRIER_TIMEOUT + 600:.0f} s") from None
        if err is not None:
            errors.append(f"session {i}: {err}")
        else:
            out[i] = {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in r.items()}
    if errors:
        raise TableIOError(f"{config.key}: " + "; ".join(errors[:3]))
    return out  # type: ignore[return-value]


def _processes(model, trace, config, members: Sequence[_Member]) -> List[dict]:
    n = config.sessions
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    if ctx.get_start_method() != "fork":
        model = str(model.info.path)
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(model, trace, config, m, barrier, results), daemon=True)
             for m in members]
    try:
        for p in procs:
            p.start()
        return _collect(config, results, n)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _members(config: RunConfig, loop: DecodeLoop, stagger: float) -> List[_Member]:
    """The sessions of a run: session ``i`` from ``loop.start + i * steps``, seeded ``loop.residual_seed + i``,
    ``i * stagger / sessions`` seconds after the barrier; sessions as processes get a fresh cache each of the
    loop cache's budget and policy (a cache is private to its process)."""
    n, steps, cache = config.sessions, config.steps, loop.cache
    own = None
    if config.mode != "threads" and cache is not None:
        own, cache = (cache.max_bytes, cache.policy), None
    return [_Member(replace(loop, start=loop.start + i * steps, residual_seed=int(loop.residual_seed) + i,
                            cache=cache), i * stagger / n, i, own) for i in range(n)]


def sessions_run(model, trace: Trace, config: RunConfig, loop: DecodeLoop = DecodeLoop(), *,
                 stagger: Optional[float] = None) -> dict:
    """Run ``config.sessions`` concurrent decode sessions of ``config`` (threads or processes, ``config.mode``).

    Session ``i`` reads trace steps ``loop.start + i * steps`` to ``loop.start + (i + 1)
    * steps`` (distinct stretches) and starts its timed loop ``i * stagger /
    sessions`` seconds after the barrier (default :func:`default_stagger`).
    With ``loop.probe_every >= 1`` every session interleaves probe steps on random
    token ids (:func:`sim.measure.runs.session_loop`; seed ``loop.probe_seed``, each session on its own
    stretch), so the probes see the device, the engine and the CPUs as shared by all
    the sessions at once; their figures are in ``"_probe"``.  ``loop.cache`` (an
    :class:`engram.RowCache`): shared by the sessions in threads; with sessions
    as processes each process reads through a fresh cache of the same budget
    and policy (a cache is private to its process); ``row_cache`` in the record.

    Returns
    -------
    dict
        A run record (see :mod:`sim.core.schema`): ``tokens_per_s`` (the mean over
        sessions of each one's trace steps over their own time),
        ``session_tokens_per_s``, ``slowest_tokens_per_s``,
        ``aggregate_tokens_per_s`` (the sum of the sessions' tokens/s),
        ``starts``, ``start_offsets_s`` (measured start of each session's
        loop after the first's), ``stagger_s``, ``threads`` (OS threads of the
        sessions' process(es) mid-run), pooled ``step_ms``/``read_ms``/
        ``compute_ms`` and ``step_us`` (session after session).

    Raises
    ------
    ArgumentError
        The trace is shorter than the sessions' stretches.
    TableIOError, DecodeError
        A read failed in a session, or a session process died (names it).
    """
    n, steps, start = config.sessions, config.steps, loop.start
    if trace.steps < start + n * steps:
        raise ArgumentError(f"trace {trace.source!r} has {trace.steps} tokens; {n} sessions of {steps} steps "
                            f"need {n * steps} from step {start}")
    stagger = default_stagger(config) if stagger is None else float(stagger)
    members = _members(config, loop, stagger)
    starts = [m.loop.start for m in members]
    threads = config.mode == "threads"
    try:
        got = (_threads if threads else _processes)(model, trace, config, members)
    except EngramError:
        raise
    except OSError as exc:
        raise TableIOError(f"{config.key}: the sessions could not run ({exc})") from None
    rec = _record(config, starts, stagger, got)
    c = cache_record(loop.cache, trace, starts, steps, got, threads)
    if c is not None:
        rec["row_cache"] = c
    rec["probe_every"] = int(loop.probe_every)
    rec["_probe"] = list(got)
    return rec


def _record(config: RunConfig, starts: Sequence[int], stagger: float, got: Sequence[dict]) -> dict:
    steps = config.steps
    t0 = min(r["t_first"] for r in got)
    t1 = max(r["t_end"] for r in got)
    tps = np.array([steps / r["step_s"].sum() for r in got])
    step_s = np.concatenate([r["step_s"] for r in got])
    read_s = np.concatenate([r["read_s"] for r in got])
    comp_s = np.concatenate([r["comp_s"] for r in got])
    threads = max(int(r["threads"]) for r in got) if config.mode == "threads" else \
        int(sum(int(r["threads"]) for r in got))
    return {"start": int(starts[0]), "starts": [int(s) for s in starts], "steps": steps,
            "sessions": config.sessions, "mode": config.mode, "wall_s": t1 - t0,
            "tokens_per_s": float(tps.mean()), "session_tokens_per_s": tps.tolist(),
            "slowest_tokens_per_s": float(tps.min()), "aggregate_tokens_per_s": float(tps.sum()),
            "start_offsets_s": [r["t_first"] - t0 for r in got], "stagger_s": stagger,
            "session_step_p50_ms": [float(np.median(r["step_s"])) * 1e3 for r in got],
            "step_ms": percentiles_ms(step_s, _PCT), "read_ms": percentiles_ms(read_s, _PCT),
            "compute_ms": percentiles_ms(comp_s, _PCT), "concurrent_steps": int(sum(r["concurrent"] for r in got)),
            "rows_distinct_mean": float(np.mean(np.concatenate([r["distinct"] for r in got]))),
            "reads": int(sum(r["reads"] for r in got)), "rows_match": all(bool(r["rows_match"]) for r in got),
            "threads": threads, "probe_steps": int(len(got[0]["probe_read_s"])), "step_us": us_list(step_s),
            "read_us": us_list(read_s), "compute_us": us_list(comp_s)}
