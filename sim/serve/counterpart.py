"""Predicted vs measured: the serving model replays a measured counterpart run read for read.

A counterpart record (:func:`sim.serve.measured.measure_counterpart`: the real engine decoding a
batch while one prompt prefills) is predicted by the serving engine with:

- the same rows: the prompt's and every request's decode stretch hashed as the run hashed them
  (the model file's layout, a fresh history each), each request reading where it read, and the
  same reads: rows merged into aligned spans as the engine merges them (:class:`SpanRowSource`);
- the device the run probed just before (mean latency by queue depth, :class:`~sim.device.EmpiricalDevice`);
- the compute the run slept (the mean of step minus read), prompt tokens costing nothing (the run
  only reads the prompt), one background reader (``prefill_readers = "one"``), both tables open at
  once (``gate = "ready"``);
- the batch starting together, the prompt arriving when the run started it (relative to the first
  decode step).

:func:`predict_counterpart` returns the figures side by side -- the decode batch's read alone and
while the prompt streams, the slowdown, and how long the prompt's rows took -- and
:func:`counterpart_table` the rows of a report table.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import numpy as np

from engram import Layout
from engram.errors import FormatError

from ..device import EmpiricalDevice
from sim.core.params import Policy
from ..trace import Trace
from .compute import StepCompute
from .engine import Engine, EngineRun, Scheduler
from .measured import COUNTERPART_SCHEMA
from .rows import RowSource
from .workload import Requests

__all__ = ["SpanRowSource", "counterpart_table", "predict_counterpart", "span_count"]

#: Decode steps at the start of a run left out of the "alone" figure (readers waking up).
WARM_STEPS = 2


def span_count(rows: np.ndarray, offset: int, row_bytes: int, align: int, cap: int) -> int:
    """Reads the engine issues for the distinct rows ``rows`` (sorted) of a table at byte ``offset``: rows sharing or
    touching an aligned span go in one read of at most ``cap`` bytes (``engram``'s span plan, greedy in file
    order)."""
    off = offset + rows.astype(np.int64) * row_bytes
    s = (off // align) * align
    e = ((off + row_bytes + align - 1) // align) * align
    n = 0
    cur_s = cur_e = -1
    for a, b in zip(s.tolist(), e.tolist()):
        if n and a <= cur_e and b - cur_s <= cap:
            if b > cur_e:
                cur_e = b
            continue
        n += 1
        cur_s, cur_e = a, b
    return n


class SpanRowSource(RowSource):
    """A :class:`~sim.serve.rows.RowSource` counting reads as the engine issues them on a given file (see
    :func:`span_count`): for predicting a run on a small model file, whose tables are dense enough that the
    rows of a batch share blocks."""

    def __init__(self, text: Trace, policy: Policy, read_chunk: int, *, tables: List[Mapping], spans: Mapping):
        super().__init__(text, policy, read_chunk)
        self.offsets = [int(t["offset"]) for t in tables]
        self.align, self.cap, self.row_bytes = int(spans["align"]), int(spans["cap"]), int(spans["row_bytes"])
        self._cache: Dict[tuple, np.ndarray] = {}

    def _spans(self, keys: np.ndarray) -> np.ndarray:
        """int64 ``[layers]``: reads of the distinct keys (sorted) per table."""
        t = keys >> np.uint32(30)
        rows = keys & np.uint32((1 << 30) - 1)
        return np.asarray([span_count(rows[t == j], self.offsets[j], self.row_bytes, self.align, self.cap)
                           for j in range(self.layers)], dtype=np.int64)

    def count_distinct(self, pos: np.ndarray) -> int:
        return int(self._spans(self.decode_keys(pos)).sum())

    def prompt_reads(self, source: int, ppos: int, tokens: int) -> np.ndarray:
        key = (int(ppos), int(tokens))
        got = self._cache.get(key)
        if got is None:
            ch = self.read_chunk
            n = -(-int(tokens) // ch)
            got = np.zeros((n, self.layers), dtype=np.int64)
            C = self.columns
            for c in range(n):
                lo = int(ppos) + c * ch
                hi = int(ppos) + min(int(tokens), (c + 1) * ch)
                for j in range(self.layers):
                    k = np.unique(self.keys[lo:hi, j * C:(j + 1) * C])
                    got[c, j] = self._spans(k)[j]
            self._cache[key] = got
        return got


def _text(record: Mapping, tokens: np.ndarray, layout: Layout, chunk: int) -> Trace:
    """The rows the run read, laid end to end: the prompt, then each request's stretch, padded to whole chunks."""
    cfg = record["config"]
    P, n = cfg["prompt_tokens"], cfg["max_steps"]
    parts = [Trace.from_tokens(tokens[:P], layout=layout, source="prompt").rows]
    parts += [Trace.from_tokens(tokens[s:s + n], layout=layout, source="stretch").rows for s in cfg["starts"]]
    rows = np.concatenate(parts)
    pad = (-rows.shape[0]) % chunk
    if pad:
        rows = np.concatenate([rows, rows[:pad]])
    return Trace(rows, np.zeros(rows.shape[0], np.int64), layer_ids=layout.layer_ids, heads=layout.heads,
                 source="counterpart rows")


def _run(rows: RowSource, device, policy: Policy, compute: StepCompute, sched: Scheduler, cfg: Mapping,
         prompt_at: float, seed: int):
    B, P, n, steps = cfg["batch"], cfg["prompt_tokens"], cfg["max_steps"], cfg["steps"]
    with_prompt = prompt_at >= 0
    m = B + int(with_prompt)
    arrival = np.zeros(m)
    prompt = np.ones(m, np.int64)
    output = np.full(m, steps + 1, np.int64)
    ppos = np.zeros(m, np.int64)
    dpos = np.asarray([P + i * n for i in range(B)] + ([0] if with_prompt else []), np.int64)
    if with_prompt:
        arrival[-1], prompt[-1], output[-1] = prompt_at, P, 1
    reqs = Requests(arrival, prompt, output, np.full(m, -1, np.int64), np.zeros(m), np.arange(m))
    return Engine(reqs, rows, device, policy, compute, sched, run=EngineRun(seed=seed, positions=(ppos, dpos))).run()


def predict_counterpart(record: Mapping, tokens: np.ndarray, layout: Layout, *, seed: int = 0) -> Dict[str, Any]:
    """Predict a counterpart record (see the module docstring).

    ``tokens`` and ``layout`` are the run's text and the model file's layout (``EngramModel.layout``).

    Returns
    -------
    dict
        ``measured`` and ``predicted``, each with ``alone_ms`` (mean decode batch read before the prompt),
        ``during_ms`` (while its rows stream), ``slowdown`` (their ratio), ``prefill_s`` (the prompt's rows
        read) and ``prefill_reads`` (the reads they took); ``regime``, ``device`` (the probe) and ``config`` of
        the record.

    Raises
    ------
    FormatError
        Not a counterpart record.
    """
    if record.get("schema") != COUNTERPART_SCHEMA:
        raise FormatError(f"not a serving counterpart record (schema {record.get('schema')!r}, expected "
                          f"{COUNTERPART_SCHEMA!r})")
    cfg = record["config"]
    chunk = int(cfg["read_chunk"])
    device = EmpiricalDevice.from_measurements(record["device"], name="this machine (probed)",
                                               source="mean read latency by queue depth, probed before the run")
    policy = Policy(threshold=cfg["threshold"], backend=cfg["backend"], readers=cfg["readers"])
    rows = SpanRowSource(_text(record, tokens, layout, chunk), policy, chunk, tables=record["tables"],
                         spans=record["spans"])
    st = record["steps"]
    comp_ms = float(np.mean(np.asarray(st["step_s"]) - np.asarray(st["read_s"]))) * 1e3
    compute = StepCompute(((0, comp_ms), (1, comp_ms)), 0.0, source="the run's slept compute")
    sched = Scheduler(max_running=cfg["batch"] + 1, prefill_chunk=cfg["prompt_tokens"], read_chunk=chunk,
                      gate="ready", prefill_readers="one")
    base = _run(rows, device, policy, compute, sched, cfg, -1.0, seed)
    t_loop = float(base.steps["t0"][base.steps["B"] == cfg["batch"]][0])
    pf = record["prefill"]
    arrival = t_loop + float(pf["start_s"])
    tr = _run(rows, device, policy, compute, sched, cfg, arrival, seed)
    s = tr.steps
    full = s["B"] == cfg["batch"]
    t0 = s["t0"][full] - t_loop
    read = (s["t_read"] - s["t0"])[full]
    pre_read = float(tr.read[-1] - arrival)
    pred = _split(t0, read, float(pf["start_s"]), float(pf["start_s"]) + pre_read)
    pred["prefill_s"] = pre_read
    pred["prefill_reads"] = int(rows.prompt_reads(-1, 0, cfg["prompt_tokens"]).sum())
    meas = _split(np.asarray(st["t0_s"]), np.asarray(st["read_s"]), float(pf["start_s"]), float(pf["done_s"]))
    meas["prefill_s"] = float(pf["read_s"])
    meas["prefill_reads"] = int(pf["reads"])
    return {"measured": meas, "predicted": pred, "regime": record["regime"], "device": record["device"],
            "config": dict(cfg), "compute_ms": comp_ms}


def _split(t0: np.ndarray, read: np.ndarray, start: float, done: float) -> Dict[str, float]:
    idx = np.arange(t0.size)
    alone = read[(t0 < start) & (idx >= WARM_STEPS)]
    during = read[(t0 >= start) & (t0 < done)]
    a = float(alone.mean()) * 1e3 if alone.size else float("nan")
    d = float(during.mean()) * 1e3 if during.size else float("nan")
    return {"alone_ms": a, "during_ms": d, "slowdown": d / a if a > 0 else float("nan"),
            "steps_alone": int(alone.size), "steps_during": int(during.size)}


def counterpart_table(result: Mapping) -> List[Dict[str, Any]]:
    """Rows ``{quantity, unit, measured, predicted, ratio}`` of :func:`predict_counterpart`'s result."""
    out = []
    for key, what, unit in (("alone_ms", "decode batch read, before the prompt", "ms"),
                            ("during_ms", "decode batch read, while the prompt's rows stream", "ms"),
                            ("slowdown", "slowdown of the decode read by the prefill", "x"),
                            ("prefill_s", "the prompt's rows read", "s"),
                            ("prefill_reads", "reads of the prompt's rows", "reads")):
        m, p = result["measured"][key], result["predicted"][key]
        out.append({"quantity": what, "unit": unit, "measured": m, "predicted": p,
                    "ratio": p / m if m and np.isfinite(m) and m > 0 else float("nan")})
    return out
