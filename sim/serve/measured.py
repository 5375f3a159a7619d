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
from typing import Sequence, Union

import numpy as np

from engram import EngramModel, Table, TableGroup
from engram._native.reader import MAX_SPAN_BYTES
from engram.codec import ROW_BYTES
from engram.errors import ArgumentError

__all__ = ["COUNTERPART_SCHEMA", "measure_counterpart", "probe_device"]

#: Schema of a counterpart record.
COUNTERPART_SCHEMA = "engram.serve-counterpart/1"
#: Tokens per chunk of the engine's prefetcher (``engram.Session.prefill``'s default).
PREFETCH_CHUNK = 2048


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


def measure_counterpart(model_path: Union[str, os.PathLike], tokens: np.ndarray, *, batch: int = 8, steps: int = 60,
                        prompt_tokens: int = 4096, prefill_step: int = 10, after_steps: int = 10,
                        compute_ms: float = 10.0, backend: str = "pread", readers: int = 16, threshold: int = 8,
                        depths: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), probe_seconds: float = 0.25,
                        source: str = "", seed: int = 0) -> dict:
    """Run the real engine as the module docstring says; return the record.

    Parameters
    ----------
    model_path : path
        A model file (``engram synth`` writes one).
    tokens : numpy.ndarray
        int64 token ids of real text: the prompt is its first ``prompt_tokens`` tokens, request ``i`` decodes
        the stretch after it starting at ``prompt_tokens + i * max_steps`` (``max_steps = 5 * steps``, every
        stretch from a fresh hash history).
    batch, steps, prefill_step, after_steps : int
        Requests decoding; steps at least; the step the prefill starts at; steps after it finished (the run
        lasts ``max(steps, prefill done + after_steps)`` steps, at most ``5 * steps``).
    compute_ms : float
        The compute of a step (slept).
    backend, readers, threshold : as ``engram.Table``.
    source : str
        Where ``tokens`` came from (kept in the record).

    Raises
    ------
    ArgumentError
        Bad counts, or too few tokens for the prompt and the stretches.
    TableIOError
        A read failed.
    """
    if batch < 1 or steps < 1 or prompt_tokens < 1 or not 0 <= prefill_step < steps or after_steps < 0:
        raise ArgumentError(f"need batch, steps, prompt_tokens >= 1 and 0 <= prefill_step < steps; got {batch}, "
                            f"{steps}, {prompt_tokens}, {prefill_step}")
    max_steps = 5 * steps
    tokens = np.asarray(tokens, dtype=np.int64)
    need = prompt_tokens + batch * max_steps
    if tokens.size < need:
        raise ArgumentError(f"{source or 'the text'} has {tokens.size} tokens; the prompt and {batch} stretches of "
                            f"{max_steps} steps need {need}")
    load_before = os.getloadavg()
    model = EngramModel.open(model_path, backend=backend, readers=readers)
    device = probe_device(model, depths, backend=backend, seconds=probe_seconds, seed=seed)
    hasher = model.hasher
    starts = [prompt_tokens + i * max_steps for i in range(batch)]
    ids = np.stack([hasher.hash(tokens[s:s + max_steps], None, hasher.new_history()) for s in starts], axis=1)
    ids = ids.reshape(max_steps, batch, -1)                   # [steps, batch, 48]
    tables = _tables(model)
    group = TableGroup(tables, model.layout.columns, backend=backend, readers=readers, threshold=threshold)
    buf = np.empty((batch, ids.shape[2], 256), np.float32)
    sess = model.session()
    prompt = tokens[:prompt_tokens]
    read_s, step_s, t0_s, distinct = [], [], [], []
    done_at: list = []
    compute_s = compute_ms * 1e-3
    pf = None

    def watch(p, t_start):
        for lid in model.layer_ids:
            p.wait(lid)
        done_at.append(time.perf_counter() - t_start)

    try:
        clock = time.perf_counter
        t_loop = clock()
        prefill_start = None
        watcher = None
        t = 0
        while t < max_steps:
            if t == prefill_step:
                prefill_start = clock() - t_loop
                pf = sess.prefill(prompt)
                pf.enter_layer(max(model.layer_ids))  # both tables open at once (the serving model's ready gate)
                watcher = threading.Thread(target=watch, args=(pf, t_loop), name="engram-prefill-watch", daemon=True)
                watcher.start()
            t0 = clock()
            group.read_batch(ids[t].reshape(batch, -1), out=buf)
            t1 = clock()
            time.sleep(compute_s)
            t2 = clock()
            t0_s.append(t0 - t_loop)
            read_s.append(t1 - t0)
            step_s.append(t2 - t0)
            distinct.append(int(np.unique(ids[t]).size))
            t += 1
            if t >= steps and done_at and t >= prefill_step + after_steps and \
                    t0 - t_loop >= done_at[0] + after_steps * (compute_s + float(np.mean(read_s))):
                break
        if watcher is not None:
            watcher.join(timeout=600)
    finally:
        group.close()
        for tb in tables:
            tb.close()
        sess.close()
    if not done_at:
        raise ArgumentError("the prefill did not finish within the run")
    first = model.info.tables[model.layer_ids[0]]
    direct = Table(first.path, first.offset, first.rows, backend="serial")
    try:
        uncached, align = bool(direct.direct), int(direct.alignment)
    finally:
        direct.close()
    return {
        "schema": COUNTERPART_SCHEMA, "model": str(model_path), "source": source,
        "config": {"batch": batch, "steps": len(read_s), "prompt_tokens": prompt_tokens, "prefill_step": prefill_step,
                   "compute_ms": compute_ms, "backend": backend, "readers": readers, "threshold": threshold,
                   "read_chunk": PREFETCH_CHUNK, "starts": starts, "prompt_start": 0, "max_steps": max_steps},
        "tables": [{"layer": int(l), "offset": int(model.info.tables[l].offset), "rows": int(model.info.tables[l].rows)}
                   for l in model.layer_ids],
        "spans": {"align": align, "cap": max(MAX_SPAN_BYTES, 2 * align if align > 1 else 2 * ROW_BYTES),
                  "row_bytes": ROW_BYTES},
        "regime": {"cpus": os.cpu_count(), "load_before": list(load_before), "load_after": list(os.getloadavg()),
                   "backend_used": device[0]["backend"] if device else backend, "o_direct": uncached},
        "device": device,
        "steps": {"t0_s": t0_s, "read_s": read_s, "step_s": step_s, "distinct_rows": distinct},
        "prefill": {"start_s": prefill_start, "done_s": done_at[0], "read_s": done_at[0] - prefill_start,
                    "reads": int(pf.stats.reads)},
    }
