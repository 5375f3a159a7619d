"""The tasks of a measurement: each microbenchmark and each decode run is one typed task.

:func:`plan_tasks` lists a round's tasks; :func:`sim.measure.measure` runs
every round's tasks in a shuffled order.  A task's :meth:`Task.run` returns
its records and the device requests it made itself (``None`` when unknown),
so the background load of other processes can be told apart from ours.
Each task seeds its random row ids from the measurement seed, the round and
its own fields, so a task reads the same rows whatever the order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from engram.errors import TableIOError

from sim.core.schema import ComputeSpec, RunConfig
from ..trace import Trace
from .compute import compute_runner
from .microbench import (BACKEND_TAG, cache_check, compute_microbench, fio_microbench, hash_microbench, io_batches,
                         io_depth, io_serial, io_shared, io_think)
from .runs import DecodeLoop, decode_run, probe_record
from .sessions import sessions_run
from .settings import Settings

__all__ = ["BatchChunk", "CacheCheck", "ComputeTimes", "Context", "DecodeRun", "DepthReads", "FioReads", "HashTimes",
           "SerialReads", "SharedReads", "Task", "ThinkBatches", "plan_tasks", "retry_busy"]

#: What a task returns: its records, and the device requests it made (``None``: unknown).
Outcome = Tuple[List[dict], Optional[int]]


@dataclass
class Context:
    """What the tasks of one measurement share: the model (an :class:`engram.EngramModel`), its tables opened
    for the microbenchmarks, the configurations, their traces and the first step of each run."""

    model: object
    settings: Settings
    configs: Sequence[RunConfig]
    tables: list
    traces: Dict[str, Trace]
    starts: Dict[tuple, int]


def _ours(recs: Sequence[dict]) -> int:
    """Device requests of our own in I/O records (engine reads, fio I/Os)."""
    return sum(int(x.get("reads", 0)) + int(x.get("ios", 0)) for x in recs)


class Task:
    """One unit of a round.  Its records go to ``runs.json`` when they name a ``config``, else to
    ``microbench.json``."""

    def describe(self, ctx: Context) -> str:
        """A few words for the progress bar."""
        raise NotImplementedError

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        """Run in round ``round_`` as the ``order``-th task of the round."""
        raise NotImplementedError


@dataclass(frozen=True)
class SerialReads(Task):
    """48-row batches and single rows read serially."""

    def describe(self, ctx: Context) -> str:
        return "serial"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        s = ctx.settings
        recs = io_serial(ctx.tables, np.random.default_rng([s.seed, round_, 1]), s.io_batches, s.single_rows, round_)
        return recs, _ours(recs)


@dataclass(frozen=True)
class _EngineReads(Task):
    """A microbenchmark of the engine's reads at ``readers`` of ``backend`` (``"serial"``: read serially)."""

    backend: str
    readers: int

    def _rng(self, ctx: Context, round_: int, kind: int, *more: int) -> np.random.Generator:
        """The random rows of the task: seeded by the measurement's seed, the round, the ``kind`` of task, the
        backend, the readers and ``more`` of the task's own fields (the same rows whatever the order)."""
        return np.random.default_rng([ctx.settings.seed, round_, kind, BACKEND_TAG.get(self.backend, 0),
                                      self.readers, *more])


@dataclass(frozen=True)
class DepthReads(_EngineReads):
    """``batches`` 48-row batches and large batches at ``readers`` of ``backend``."""

    batches: int

    def describe(self, ctx: Context) -> str:
        return f"depth {self.backend} {self.readers}"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        recs = io_depth(ctx.tables, self._rng(ctx, round_, 2), self.backend, self.readers, self.batches,
                        ctx.settings.big_seconds, round_)
        return recs, _ours(recs)


@dataclass(frozen=True)
class BatchChunk(_EngineReads):
    """One more chunk of 48-row batches at ``readers`` of ``backend`` (``"serial"``: read serially)."""

    chunk: int

    def describe(self, ctx: Context) -> str:
        return f"batches {self.backend} {self.readers} {self.chunk}"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        recs = [io_batches(ctx.tables, self._rng(ctx, round_, 8, self.chunk), self.backend, self.readers,
                           ctx.settings.io_batches, round_, self.chunk)]
        return recs, _ours(recs)


@dataclass(frozen=True)
class FioReads(Task):
    """fio random reads at queue depth ``depth`` (in the first ``fio_rounds`` rounds only)."""

    depth: int

    def describe(self, ctx: Context) -> str:
        return f"fio {self.depth}"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        s = ctx.settings
        if round_ >= s.fio_rounds:
            return [], 0
        recs = fio_microbench(ctx.model.info, [self.depth], s.fio_seconds, round_=round_)
        return recs, _ours(recs)


@dataclass(frozen=True)
class ThinkBatches(_EngineReads):
    """48-row batches at ``readers`` of ``backend`` with the compute ``compute`` between batches."""

    compute: str
    chunk: int

    def describe(self, ctx: Context) -> str:
        return f"think {self.backend} {self.readers} {self.compute} {self.chunk}"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        s, model = ctx.settings, ctx.model
        spec = ComputeSpec.parse(self.compute)
        rng = self._rng(ctx, round_, 7, self.chunk)
        with model.session(backend="serial") as session:
            run = compute_runner(spec, model, session, residual_seed=s.seed)
            rec = io_think(ctx.tables, rng, self.backend, self.readers, s.mixer_samples if spec.mixer else
                           s.think_batches, run, self.compute, model.layer_ids, round_)
        rec["chunk"] = self.chunk
        return [rec], _ours([rec])


@dataclass(frozen=True)
class ComputeTimes(Task):
    """The compute ``compute`` timed on one step's rows."""

    compute: str

    def describe(self, ctx: Context) -> str:
        return f"compute {self.compute}"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        s = ctx.settings
        recs = compute_microbench(ctx.model, [self.compute], samples=s.compute_samples,
                                  mixer_samples=s.mixer_samples, seed=s.seed, round_=round_)
        return recs, None


@dataclass(frozen=True)
class HashTimes(Task):
    """The hash part of a step, timed."""

    def describe(self, ctx: Context) -> str:
        return "hash"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        return [hash_microbench(ctx.model, seed=ctx.settings.seed, round_=round_)], 0


@dataclass(frozen=True)
class SharedReads(_EngineReads):
    """Large batches from ``submitters`` threads at once, each at ``readers`` of ``backend`` (as sessions read)."""

    submitters: int

    def describe(self, ctx: Context) -> str:
        return f"shared {self.backend} {self.submitters}x{self.readers}"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        rec = io_shared(ctx.model.info, self._rng(ctx, round_, 9, self.submitters), self.backend, self.readers,
                        self.submitters, ctx.settings.shared_seconds, round_)
        return [rec], _ours([rec])


@dataclass(frozen=True)
class CacheCheck(Task):
    """Fresh rows, then the same rows again (first round only): does a cache below O_DIRECT serve re-reads?"""

    def describe(self, ctx: Context) -> str:
        return "cache check"

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        s = ctx.settings
        if round_ > 0 or s.cache_batches < 1:
            return [], 0
        rec = cache_check(ctx.tables, np.random.default_rng([s.seed, round_, 10]), s.cache_batches, round_)
        return [rec], int(rec["reads"])


@dataclass(frozen=True)
class DecodeRun(Task):
    """The decode run of configuration ``index`` on its stretch of the trace for this round (one session, or
    ``sessions`` concurrent ones), with probe steps on random token ids interleaved (``settings.probe_every``, or
    closer in a short run: :meth:`Settings.run_probe_every`).

    The run goes to ``runs.json``; its probe steps, a microbenchmark of its own time window tagged with
    the ``window`` id (``rROUND-cINDEX``) it shares with the run, to ``microbench.json``
    (:func:`sim.measure.runs.probe_record`).  The calibration turns the probes into the device and
    compute of that window, the cross-check predicts the run with them."""

    index: int

    def describe(self, ctx: Context) -> str:
        return ctx.configs[self.index].key

    def run(self, ctx: Context, round_: int, order: int) -> Outcome:
        c, s = ctx.configs[self.index], ctx.settings
        window = f"r{round_}-c{self.index}"
        start = ctx.starts[(self.index, round_)]
        every = s.run_probe_every(c.steps)
        loop = DecodeLoop(start=start, warmup=s.warmup, residual_seed=s.seed, probe_every=every,
                          probe_seed=s.seed + 1 + round_, cache=s.run_cache())
        rec = (sessions_run if c.multi else decode_run)(ctx.model, ctx.traces[c.trace], c, loop)
        got = rec.pop("_probe")
        recs = [{"config": c.key, "round": round_, "order": order, "window": window, **rec}]
        p = probe_record(c, window, round_, got, every)
        if p is not None:
            recs.append(p)
        return recs, _ours(recs)


def plan_tasks(configs: Sequence[RunConfig], settings: Settings, *, backends: Sequence[str], depths: Sequence[int],
               computes: Sequence[str], fio_installed: bool) -> List[Task]:
    """The tasks of one round, in a fixed order (each round shuffles them).

    Microbenchmarks: serial reads; each backend x depth >= 2 (``io_batches``
    batches where configurations without compute read, ``depth_batches``
    elsewhere); fio at each depth; each compute; more chunks of batches
    where configurations without compute read; each compute as think time
    at the readers its configurations use; the hash; large batches from
    several submitters at the readers of the multi-session configurations
    (one task per submitter count: the session counts measured, or
    ``settings.submitters``); the cold/warm cache check.  Then one decode
    run per configuration (each with its probe steps interleaved).
    """
    s = settings
    tasks: List[Task] = []
    if s.micro:
        # Where configurations without compute read: more 48-row batches there, spread over the round.
        used = dict.fromkeys(("serial", 1) if c.serial else (c.backend, c.readers) for c in configs
                             if c.compute == "none")
        tasks.append(SerialReads())
        tasks += [DepthReads(be, k, s.io_batches if (be, k) in used else s.depth_batches)
                  for be in backends for k in depths if k >= 2]
        if s.fio and fio_installed:
            tasks += [FioReads(k) for k in depths]
        tasks += [ComputeTimes(c) for c in computes]
        tasks += [BatchChunk(be, k, j) for (be, k) in used for j in range(1, s.io_chunks)]
        # Think time: each compute between 48-row batches, at the readers its configurations use.
        think = dict.fromkeys((c.compute, "serial" if c.serial else c.backend, 1 if c.serial else c.readers)
                              for c in configs if c.compute != "none")
        tasks += [ThinkBatches(be, k, label, j) for (label, be, k) in think
                  for j in range(min(1, s.think_chunks) if ComputeSpec.parse(label).mixer else s.think_chunks)]
        tasks.append(HashTimes())
        shared = dict.fromkeys((c.backend, c.readers) for c in configs if c.multi and not c.serial)
        counts = sorted(set(s.submitters) if s.submitters is not None else
                        {c.sessions for c in configs if c.multi and c.sessions > 1})
        tasks += [SharedReads(be, k, m) for (be, k) in shared for m in counts if m > 1]
        tasks.append(CacheCheck())
    if s.decode:
        tasks += [DecodeRun(i) for i in range(len(configs))]
    return tasks


def retry_busy(fn: Callable[[], Outcome], attempts: int = 4, wait: float = 1.0) -> Outcome:
    """Run ``fn``; a read backend that cannot start for a moment (``EPERM``/``EAGAIN``/``ENOMEM`` from
    ``io_uring_setup`` while the machine is busy) is retried ``attempts - 1`` times, ``wait`` seconds apart."""
    for i in range(attempts):
        try:
            return fn()
        except TableIOError as exc:
            if i == attempts - 1 or "could not start" not in str(exc):
                raise
            time.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
