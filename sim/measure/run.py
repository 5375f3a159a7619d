"""The whole measurement: microbenchmarks and decode runs in interleaved rounds, written as two documents."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

import numpy as np
from tqdm import tqdm

from engram import EngramModel
from engram.errors import ArgumentError

from ..io import now_iso, write_json
from ..schema import MICRO_SCHEMA, RUNS_SCHEMA, ComputeSpec, RunConfig, trace_label
from ..trace import Trace, load_trace
from .background import QuietGuard
from .environment import file_info, machine_info
from .microbench import open_tables
from .runs import segments, trace_tokens_needed
from .settings import Settings
from .tasks import Context, Task, plan_tasks, retry_busy

__all__ = ["measure"]


def measure(model_path: Union[str, os.PathLike], configs: Sequence[RunConfig], out_dir: Union[str, os.PathLike],
            settings: Optional[Settings] = None, *, progress: bool = True, micro_name: str = "microbench.json",
            runs_name: str = "runs.json", **options) -> dict:
    """Measure microbenchmarks and decode runs of ``configs`` on the model at ``model_path``.

    ``settings`` (default :class:`Settings`), with any of its fields given as
    keyword ``options`` (``rounds=2, depths=(1, 4), fio=False, ...``).
    ``rounds`` rounds; each round runs every task of :func:`plan_tasks`
    (the microbenchmarks and every configuration once), all in one order
    shuffled with ``seed`` and the round number, so that the microbenchmarks
    and the runs sample the same stretches of a shared machine's load.
    Results go to ``out_dir/microbench.json`` and ``out_dir/runs.json``
    (written after every round, so an interrupted run keeps what it
    measured), and the runs' traces to ``out_dir/traces/*.npz``.

    Every record carries the background load of other processes while it ran
    (:class:`sim.measure.background.Background`).  With
    ``max_background_cpu`` set (a share of all CPUs, e.g. 0.25) a task waits
    up to ``quiet_wait`` seconds for a quiet machine (others below
    ``max_background_cpu`` and ``max_background_iops`` disk requests a second
    over 0.5 s) and is run again (up to ``redo`` times) when others were busy
    during it; waiting stops after ``wait_budget`` seconds in all.

    Returns
    -------
    dict
        ``{"microbench": path or None, "runs": path or None, "configs": n, "runs_done": n,
        "seconds": wall, "waited_s": seconds spent waiting for a quiet machine}``.

    Raises
    ------
    ArgumentError
        No configurations, rounds < 1, or a trace shorter than its steps.
    TypeError
        An option that is not a field of :class:`Settings`.
    FormatError, TableIOError
        The model cannot be read.
    """
    s = dataclasses.replace(settings or Settings(), **options)
    configs = list(configs)
    if s.decode and not configs:
        raise ArgumentError("no configurations to measure")
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    model = EngramModel.open(model_path)
    backends = s.resolved_backends(configs)
    depths = s.resolved_depths()
    computes = list(dict.fromkeys(c.compute for c in configs)) or ["none"]
    traces, starts = _traces(model, configs, s) if s.decode else ({}, {})
    if any(ComputeSpec.parse(c).mixer for c in computes):
        for lid in model.layer_ids:
            model.weights(lid)

    head = {"date": now_iso(), "machine": machine_info(), "file": file_info(model.info),
            "params": s.params(configs)}
    micro_doc = {"schema": MICRO_SCHEMA, "kind": "microbench", **head, "records": []}
    runs_doc = {"schema": RUNS_SCHEMA, "kind": "decode_runs", **head, "machine": machine_info(),
                "configs": [c.to_dict() for c in configs], "runs": []}
    micro_path = out_dir / micro_name if s.micro else None
    runs_path = out_dir / runs_name if s.decode else None
    if s.decode:
        runs_doc["traces"] = _save_traces(traces, out_dir)
    tasks = plan_tasks(configs, s, backends=backends, depths=depths, computes=computes,
                       fio_installed=shutil.which("fio") is not None)
    docs = {"micro": micro_doc["records"], "runs": runs_doc["runs"]}
    ctx = Context(model, s, configs, open_tables(model.info) if s.micro else [], traces, starts)
    bar = tqdm(total=s.rounds * len(tasks), unit="task", desc="measure", disable=not progress, leave=False)
    guard = QuietGuard(model_path, s.max_background_cpu, s.max_background_iops, s.quiet_wait, s.redo,
                       s.wait_budget, on_wait=lambda: bar.set_postfix_str("waiting for a quiet machine"))
    try:
        for r in range(s.rounds):
            order = np.random.default_rng([s.seed, r, 5]).permutation(len(tasks))
            for pos, ti in enumerate(order):
                task: Task = tasks[int(ti)]
                bar.set_postfix_str(f"round {r}: {task.describe(ctx)}")
                docs[task.document].extend(guard.run(lambda: retry_busy(lambda: task.run(ctx, r, pos))))
                bar.update(1)
            if s.micro:
                micro_doc["waited_s"] = guard.waited
                write_json(micro_path, micro_doc)
            if s.decode:
                runs_doc["machine"]["loadavg_end"] = machine_info().get("loadavg")
                runs_doc["waited_s"] = guard.waited
                write_json(runs_path, runs_doc)
    finally:
        bar.close()
        for t in ctx.tables:
            t.close()
    return {"microbench": str(micro_path) if micro_path else None, "runs": str(runs_path) if runs_path else None,
            "configs": len(configs) if s.decode else 0, "runs_done": len(runs_doc["runs"]),
            "seconds": time.perf_counter() - t_start, "waited_s": guard.waited}


def _traces(model, configs: Sequence[RunConfig], s: Settings) -> tuple:
    """The trace of every configuration, long enough for all its runs, and each run's first step.

    Raises
    ------
    ArgumentError
        A trace shorter than its runs need.
    """
    traces: Dict[str, Trace] = {}
    for spec, need in trace_tokens_needed(configs, s.rounds).items():
        traces[spec] = load_trace(spec, limit=need, layout=model.layout)
        if traces[spec].steps < need:
            raise ArgumentError(f"trace {spec!r} has {traces[spec].steps} tokens; its runs need {need} "
                                f"(each run reads its own stretch: fewer steps, rounds or configurations)")
    return traces, segments(configs, s.rounds)


def _save_traces(traces: Dict[str, Trace], out_dir: Path) -> Dict[str, str]:
    """Save the exact traces of the runs beside them, for the cross-check (no tokenizer or model file needed
    there): trace spec -> path relative to ``out_dir``."""
    names: Dict[str, str] = {}
    (out_dir / "traces").mkdir(parents=True, exist_ok=True)
    for spec, tr in traces.items():
        base = trace_label(spec).replace("/", "_")
        name, i = base, 1
        while name in names.values():
            i += 1
            name = f"{base}-{i}"
        names[spec] = name
        tr.save(out_dir / "traces" / f"{name}.npz")
    return {spec: f"traces/{name}.npz" for spec, name in names.items()}
