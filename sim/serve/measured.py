"""The serving model's measured counterpart: the real engine decoding a batch while one prompt prefills.

What a serving engine built on ``engram`` does, run for real on a model file here:

- ``batch`` requests decode together: every step hashes each request's next token with its own
  history (:class:`engram.Hasher`) and reads the step's ``batch x 48`` rows as **one** batch through
  a :class:`engram.TableGroup` (sorted, each distinct row once, ``readers`` at a time above
  ``threshold``), then computes for ``compute_ms`` (a sleep: the accelerator's time, no CPU);
- at step ``prefill_step`` a prompt of ``prompt_tokens`` tokens starts prefilling in the
  background (:meth:`engram.Session.prefill`: its rows hashed, then streamed in 2048-token chunks
  by the prefetcher's reader, both tables open at once) while the batch keeps decoding, and the
  time its last row arrives is taken by a thread waiting on the prefetcher;
- the engine reads spans, not rows: rows sharing or touching an aligned block of one table go in one
  read of at most 16 KiB; the record keeps the tables' offsets and the alignment, so the prediction
  counts reads as the engine does (a small test table merges many rows; a full-size one hardly any);
- right before, the device is probed: uniformly random rows of the same tables read by ``k``
  readers for each ``k`` of ``depths`` (closed loop: mean latency of a read = time x ``k`` / reads),
  the device model the prediction uses (:func:`sim.serve.counterpart.predict_counterpart`), measured
  apart from the run it predicts.

:func:`measure_counterpart` only times the engine; it returns a record (a dict of plain numbers, the
schema :data:`COUNTERPART_SCHEMA`) that the prediction reads, as ``engram measure`` writes what
``engram calibrate`` reads.  The record says the regime it ran in: the machine's load average
before and after, its CPUs, the backend the readers used and whether reads bypassed the page cache.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from engram import EngramModel, Table, TableGroup
from engram._checks import setting_choice, setting_int, setting_number
from engram._native.reader import MAX_SPAN_BYTES
from engram.codec import ROW_BYTES
from engram.errors import ArgumentError
from engram.table import BACKENDS as TABLE_BACKENDS, MAX_READERS
from sim.core.schema import MAX_EMULATED_MS

__all__ = ["COUNTERPART_SCHEMA", "CounterpartReads", "CounterpartRun", "measure_counterpart", "probe_device"]

#: Schema of a counterpart record.
COUNTERPART_SCHEMA = "engram.serve-counterpart/1"
#: Tokens per chunk of the engine's prefetcher (``engram.Session.prefill``'s default).
PREFETCH_CHUNK = 2048
#: The longest probe of one queue depth, seconds (an hour: past it a setting is a typo, not a probe).
MAX_PROBE_SECONDS = 3600.0


def _tables(model: EngramModel) -> list:
    return [Table(model.info.tables[l].path, model.info.tables[l].offset, model.info.tables[l].rows,
                  backend="serial") for l in model.layer_ids]


def probe_device(model: EngramModel, depths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), *, backend: str = "pread",
                 seconds: float = 0.25, seed: int = 0) -> list:
    """Mean read latency by queue depth: ``[{"qd", "mean_us", "iops", "reads", "backend"}]``, uniformly random rows
    of the model's tables read by ``qd`` readers (batches of ``max(512, 64 qd)`` rows, closed loop) for about
    ``seconds`` each."""
    rng = np.random.default_rng(seed)
    tables = _tables(model)
    rows = [t.rows for t in tables]
    cols = model.layout.columns
    out = []
    try:
        for k in depths:
            group = TableGroup(tables, cols, backend=backend, readers=int(k), threshold=1)
            tokens = max(1, max(512, 64 * int(k)) // (cols * len(rows)))
            n = reads = 0
            t_read = 0.0
            t_end = time.perf_counter() + seconds
            while n < 2 or time.perf_counter() < t_end:
                ids = np.concatenate([rng.integers(0, r, (tokens, cols), dtype=np.uint32) for r in rows], axis=1)
                t0 = time.perf_counter()
                group.read_batch(ids)
                t_read += time.perf_counter() - t0
                reads += group.last_stats.reads
                n += 1
            out.append({"qd": int(k), "mean_us": t_read * k / reads * 1e6, "iops": reads / t_read, "reads": int(reads),
                        "backend": group.backend})
            group.close()
    finally:
        for t in tables:
            t.close()
    return out


@dataclass(frozen=True)
class CounterpartRun:
    """What the measured engine runs: the batch decoding, the prompt prefilling beside it, the compute of a step.

    Attributes
    ----------
    batch : int
        Requests decoding together (>= 1).
    steps : int
        Steps at least (>= 1); the run lasts ``max(steps, prefill done + after_steps)`` steps, at most
        ``5 * steps``.
    prompt_tokens : int
        Tokens of the prompt prefilled in the background (>= 1).
    prefill_step : int
        The step the prefill starts at (in ``[0, steps)``).
    after_steps : int
        Steps after the prefill finished (>= 0).
    compute_ms : float
        The compute of a step, ms (slept; >= 0).

    Raises
    ------
    ArgumentError
        Names the field and the value: a count that is not a whole number (a bool, a float or a string) or is out
        of its range, ``compute_ms`` not a finite number in [0, 60000] (:data:`sim.core.schema.MAX_EMULATED_MS`).
    """

    batch: int = 8
    steps: int = 60
    prompt_tokens: int = 4096
    prefill_step: int = 10
    after_steps: int = 10
    compute_ms: float = 10.0

    def __post_init__(self) -> None:
        for name in ("batch", "steps", "prompt_tokens"):
            object.__setattr__(self, name, setting_int(f"CounterpartRun.{name}", getattr(self, name), 1))
        object.__setattr__(self, "prefill_step", setting_int("CounterpartRun.prefill_step", self.prefill_step, 0,
                                                             self.steps - 1))
        object.__setattr__(self, "after_steps", setting_int("CounterpartRun.after_steps", self.after_steps, 0))
        object.__setattr__(self, "compute_ms", setting_number("CounterpartRun.compute_ms", self.compute_ms, 0.0,
                                                              float(MAX_EMULATED_MS)))


@dataclass(frozen=True)
class CounterpartReads:
    """How the measured engine reads, and how the device is probed before it runs.

    Attributes
    ----------
    backend : str
        The readers' backend (as ``engram.Table``: ``"auto"``, ``"io_uring"``, ``"pread"`` or ``"serial"``).
    readers : int
        Readers of a batch above ``threshold`` (in ``[1, engram.table.MAX_READERS]``).
    threshold : int
        Distinct rows below which a batch is read serially (>= 1).
    depths : sequence of int
        Queue depths the device is probed at (:func:`probe_device`), each in ``[1, engram.table.MAX_READERS]``.
    seconds : float
        Seconds the probe spends at each depth (> 0, at most 3600).

    Raises
    ------
    ArgumentError
        Names the field and the value: an unknown ``backend``, ``readers``, ``threshold`` or a depth that is not
        a whole number (a bool, a float or a string) or is out of its range, no depth, ``seconds`` not a finite
        number in (0, 3600].
    """

    backend: str = "pread"
    readers: int = 16
    threshold: int = 8
    depths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)
    seconds: float = 0.25

    def __post_init__(self) -> None:
        setting_choice("CounterpartReads.backend", self.backend, TABLE_BACKENDS)
        object.__setattr__(self, "readers", setting_int("CounterpartReads.readers", self.readers, 1, MAX_READERS))
        object.__setattr__(self, "threshold", setting_int("CounterpartReads.threshold", self.threshold, 1))
        if isinstance(self.depths, np.ndarray) and self.depths.ndim == 1:
            object.__setattr__(self, "depths", tuple(self.depths.tolist()))
        if isinstance(self.depths, (str, bytes)) or not isinstance(self.depths, Sequence) or not self.depths:
            raise ArgumentError(f"CounterpartReads.depths = {self.depths!r:.60}: expected a non-empty sequence of "
                                f"whole numbers in [1, {MAX_READERS}]")
        object.__setattr__(self, "depths", tuple(setting_int(f"CounterpartReads.depths[{i}]", k, 1, MAX_READERS)
                                                 for i, k in enumerate(self.depths)))
        object.__setattr__(self, "seconds", setting_number("CounterpartReads.seconds", self.seconds, 0.0,
                                                           MAX_PROBE_SECONDS, above=True))


def measure_counterpart(model_path: Union[str, os.PathLike], tokens: np.ndarray,
                        run: CounterpartRun = CounterpartRun(), reads: CounterpartReads = CounterpartReads(), *,
                        source: str = "", seed: int = 0) -> dict:
    """Run the real engine as the module docstring says; return the record.

    Parameters
    ----------
    model_path : path
        A model file (``engram synth`` writes one).
    tokens : numpy.ndarray
        int64 token ids of real text: the prompt is its first ``run.prompt_tokens`` tokens, request ``i`` decodes
        the stretch after it starting at ``prompt_tokens + i * max_steps`` (``max_steps = 5 * run.steps``, every
        stretch from a fresh hash history).
    run : CounterpartRun
        The batch, steps, prompt, prefill start, compute.
    reads : CounterpartReads
        Backend, readers, threshold; the device probe's depths and time.
    source : str
        Where ``tokens`` came from (kept in the record).
    seed : int
        The device probe's rows.

    Raises
    ------
    ArgumentError
        Too few tokens for the prompt and the stretches; the prefill not done within the run.
    TableIOError
        A read failed.
    """
    max_steps = 5 * run.steps
    tokens = np.asarray(tokens, dtype=np.int64)
    need = run.prompt_tokens + run.batch * max_steps
    if tokens.size < need:
        raise ArgumentError(f"{source or 'the text'} has {tokens.size} tokens; the prompt and {run.batch} stretches "
                            f"of {max_steps} steps need {need}")
    load_before = os.getloadavg()
    model = EngramModel.open(model_path, backend=reads.backend, readers=reads.readers)
    device = probe_device(model, reads.depths, backend=reads.backend, seconds=reads.seconds, seed=seed)
    hasher = model.hasher
    starts = [run.prompt_tokens + i * max_steps for i in range(run.batch)]
    ids = np.stack([hasher.hash(tokens[s:s + max_steps], None, hasher.new_history()) for s in starts], axis=1)
    ids = ids.reshape(max_steps, run.batch, -1)                   # [steps, batch, 48]
    loop = _Loop(model, ids, tokens[:run.prompt_tokens], run, reads)
    loop.run()
    first = model.info.tables[model.layer_ids[0]]
    direct = Table(first.path, first.offset, first.rows, backend="serial")
    try:
        uncached, align = bool(direct.direct), int(direct.alignment)
    finally:
        direct.close()
    return {
        "schema": COUNTERPART_SCHEMA, "model": str(model_path), "source": source,
        "config": {"batch": run.batch, "steps": len(loop.read_s), "prompt_tokens": run.prompt_tokens,
                   "prefill_step": run.prefill_step, "compute_ms": run.compute_ms, "backend": reads.backend,
                   "readers": reads.readers, "threshold": reads.threshold, "read_chunk": PREFETCH_CHUNK,
                   "starts": starts, "prompt_start": 0, "max_steps": max_steps},
        "tables": [{"layer": int(l), "offset": int(model.info.tables[l].offset), "rows": int(model.info.tables[l].rows)}
                   for l in model.layer_ids],
        "spans": {"align": align, "cap": max(MAX_SPAN_BYTES, 2 * align if align > 1 else 2 * ROW_BYTES),
                  "row_bytes": ROW_BYTES},
        "regime": {"cpus": os.cpu_count(), "load_before": list(load_before), "load_after": list(os.getloadavg()),
                   "backend_used": device[0]["backend"] if device else reads.backend, "o_direct": uncached},
        "device": device,
        "steps": {"t0_s": loop.t0_s, "read_s": loop.read_s, "step_s": loop.step_s, "distinct_rows": loop.distinct},
        "prefill": {"start_s": loop.prefill_start, "done_s": loop.done_at[0],
                    "read_s": loop.done_at[0] - loop.prefill_start, "reads": int(loop.pf.stats.reads)},
    }


class _Loop:
    """The measured run's steps: the batch's reads and slept compute, the prompt's prefill started at its step
    and watched by a thread; per step the times (s from the loop's start) and distinct rows."""

    def __init__(self, model: EngramModel, ids: np.ndarray, prompt: np.ndarray, run: CounterpartRun,
                 reads: CounterpartReads):
        self.model, self.ids, self.prompt, self.cfg, self.reads = model, ids, prompt, run, reads
        self.read_s: list = []
        self.step_s: list = []
        self.t0_s: list = []
        self.distinct: list = []
        self.done_at: list = []
        self.prefill_start = None
        self.pf = None

    def _watch(self, p, t_start) -> None:
        for lid in self.model.layer_ids:
            p.wait(lid)
        self.done_at.append(time.perf_counter() - t_start)

    def run(self) -> None:
        """Every step until the run may stop; the tables, the group and the session closed after.

        Raises ArgumentError when the prefill did not finish within the run."""
        model, batch = self.model, self.cfg.batch
        tables = _tables(model)
        group = TableGroup(tables, model.layout.columns, backend=self.reads.backend, readers=self.reads.readers,
                           threshold=self.reads.threshold)
        buf = np.empty((batch, self.ids.shape[2], 256), np.float32)
        sess = model.session()
        try:
            watcher = self._steps(group, buf, sess)
            if watcher is not None:
                watcher.join(timeout=600)
        finally:
            group.close()
            for tb in tables:
                tb.close()
            sess.close()
        if not self.done_at:
            raise ArgumentError("the prefill did not finish within the run")

    def _steps(self, group: TableGroup, buf: np.ndarray, sess) -> Optional[threading.Thread]:
        model, run, ids = self.model, self.cfg, self.ids
        read_s, step_s, t0_s, distinct, done_at = self.read_s, self.step_s, self.t0_s, self.distinct, self.done_at
        compute_s = run.compute_ms * 1e-3
        max_steps = ids.shape[0]
        clock = time.perf_counter
        t_loop = clock()
        watcher = None
        t = 0
        while t < max_steps:
            if t == run.prefill_step:
                self.prefill_start = clock() - t_loop
                self.pf = pf = sess.prefill(self.prompt)
                pf.enter_layer(max(model.layer_ids))  # both tables open at once (the serving model's ready gate)
                watcher = threading.Thread(target=self._watch, args=(pf, t_loop), name="engram-prefill-watch",
                                           daemon=True)
                watcher.start()
            t0 = clock()
            group.read_batch(ids[t].reshape(run.batch, -1), out=buf)
            t1 = clock()
            time.sleep(compute_s)
            t2 = clock()
            t0_s.append(t0 - t_loop)
            read_s.append(t1 - t0)
            step_s.append(t2 - t0)
            distinct.append(int(np.unique(ids[t]).size))
            t += 1
            if t >= run.steps and done_at and t >= run.prefill_step + run.after_steps and \
                    t0 - t_loop >= done_at[0] + run.after_steps * (compute_s + float(np.mean(read_s))):
                break
        return watcher
