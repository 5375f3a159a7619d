"""The whole measurement: microbenchmarks and decode runs in interleaved rounds, written as two documents."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

import numpy as np

from engram import EngramModel
from engram.codec import ROW_BYTES
from engram.errors import ArgumentError, TableIOError

from sim.core.io import now_iso, write_json
from sim.core.progress import progress as progress_bar
from sim.core.schema import MICRO_SCHEMA, RUNS_SCHEMA, ComputeSpec, RunConfig, trace_label
from ..trace import Trace, load_trace
from ..trace.sources import encoded_by_tokenizer
from ..trace.tokens import check_model_vocabulary
from .background import QuietGuard
from .configs import backends_here, usable_configs
from .environment import file_info, machine_info
from .microbench import open_tables
from .runs import segments, trace_tokens_needed
from .settings import Settings
from .tasks import Context, Task, plan_tasks, retry_busy

__all__ = ["cache_warnings", "measure", "size_warnings"]

#: Re-reads this much faster than first reads (mean time ratio below it) mean a cache serves them.
CACHE_RATIO = 0.8


def measure(model_path: Union[str, os.PathLike], configs: Sequence[RunConfig], out_dir: Union[str, os.PathLike],
            settings: Optional[Settings] = None, *, progress: Union[bool, str] = True, micro_name: str = "microbench.json",
            runs_name: str = "runs.json", device: Optional[dict] = None, **options) -> dict:
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

    Only configurations whose backend starts and reads here are measured
    (:func:`sim.measure.configs.usable_configs`); both documents say which
    backends were left out and why (``"backends"``), the ``device`` measured when given (a device of
    :func:`sim.measure.devices.measure_devices`: its name, class, throttle, fio files), and carry ``"warnings"``
    about what the figures may have measured besides the device (a table
    small against the machine's memory, re-reads faster than first reads).

    Returns
    -------
    dict
        ``{"microbench": path or None, "runs": path or None, "configs": n, "runs_done": n,
        "seconds": wall, "waited_s": seconds spent waiting for a quiet machine, "backends": {"usable",
        "left_out", "configs_left_out"}, "warnings": [...], "complete": bool}``.

    Raises
    ------
    ArgumentError
        No configurations (or none whose backend starts here), rounds < 1, or a trace shorter than its
        steps.
    TableIOError
        A document or trace cannot be written (names the path).
    TypeError
        An option that is not a field of :class:`Settings`.
    FormatError, TableIOError
        The model cannot be read.
    """
    s = dataclasses.replace(settings or Settings(), **options)
    configs, usable, be_doc = _configs_here(configs, s)
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    _make_folder(out_dir)
    model = EngramModel.open(model_path)
    backends = s.resolved_backends(configs, usable)
    depths = s.resolved_depths()
    computes = list(dict.fromkeys(c.compute for c in configs)) or ["none"]
    traces, starts = _traces(model, configs, s) if s.decode else ({}, {})
    if any(ComputeSpec.parse(c).mixer for c in computes):
        for lid in model.layer_ids:
            model.weights(lid)
    docs = _Documents(s, _head(model.info, configs, s, usable, be_doc, device), configs,
                      (out_dir / micro_name if s.micro else None, out_dir / runs_name if s.decode else None))
    if s.decode:
        docs.runs["traces"] = _save_traces(traces, out_dir)
    tasks = plan_tasks(configs, s, backends=backends, depths=depths, computes=computes,
                       fio_installed=shutil.which("fio") is not None)
    ctx = Context(model, s, configs, open_tables(model.info) if s.micro else [], traces, starts)
    bar = progress_bar(s.rounds * len(tasks), "measure", "task", mode=progress)
    guard = QuietGuard(model_path, s.max_background_cpu, s.max_background_iops, s.quiet_wait, s.redo,
                       s.wait_budget, on_wait=lambda: bar.update(0, note="waiting for a quiet machine"))
    complete = _rounds(tasks, ctx, guard, docs, bar)
    return {"microbench": str(docs.micro_path) if docs.micro_path else None,
            "runs": str(docs.runs_path) if docs.runs_path else None,
            "configs": len(configs) if s.decode else 0, "runs_done": len(docs.runs["runs"]),
            "seconds": time.perf_counter() - t_start, "waited_s": guard.waited, "backends": be_doc,
            "warnings": docs.micro["warnings"], "complete": complete}


def _configs_here(configs: Sequence[RunConfig], s: Settings) -> tuple:
    """``(configurations, usable backends, the documents' "backends")``: the configurations whose backend starts
    and reads here, the backends that do, and which were left out and why.

    Raises
    ------
    ArgumentError
        Decode runs asked and no configuration (or none whose backend starts here).
    """
    usable, left_out = backends_here()
    configs, dropped = usable_configs(list(configs), usable)
    if s.decode and not configs:
        raise ArgumentError("no configurations to measure" + (
            f": every one needs a backend that does not start here ({_left_text(left_out)})" if dropped else ""))
    return configs, usable, {"usable": list(usable), "left_out": dict(left_out),
                             "configs_left_out": [c.key for c in dropped]}


def _rounds(tasks: Sequence[Task], ctx: Context, guard: QuietGuard, docs: "_Documents", bar) -> bool:
    """Every round (:func:`_round`), the documents written after each; True when all ran.  Whatever stops
    them, the progress bar and the tables are closed and what was measured is written, marked incomplete."""
    complete = False
    try:
        for r in range(ctx.settings.rounds):
            _round(r, tasks, ctx, guard, docs, bar)
            docs.save(False, guard.waited)
        complete = True
    finally:
        bar.close()
        for t in ctx.tables:
            t.close()
        if docs.micro["records"] or docs.runs["runs"]:
            docs.save(complete, guard.waited)
    return complete


def _make_folder(out_dir: Path) -> None:
    """Make the measurement folder (it is this command's to make: its documents' folders must exist,
    :mod:`sim.core.io`).

    Raises
    ------
    TableIOError
        It cannot be made (names it).
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TableIOError(f"{out_dir}: cannot make the measurement folder ({exc.strerror or exc})",
                           errno_=exc.errno or 0) from None


def _head(info, configs: Sequence[RunConfig], s: Settings, usable, be_doc: dict, device: Optional[dict]) -> dict:
    """What both documents start with: the date, the machine, the model file ``info``, the settings, the
    backends and the warnings about the tables' size, and the ``device`` when given."""
    machine = machine_info()
    finfo = file_info(info)
    head = {"date": now_iso(), "machine": machine, "file": finfo, "params": s.params(configs, usable),
            "backends": be_doc, "warnings": size_warnings(info, machine)}
    if device is not None:
        head["device"] = dict(device)
    return head


def _round(r: int, tasks: Sequence[Task], ctx: Context, guard: QuietGuard, docs: "_Documents", bar) -> None:
    """Round ``r``: every task once, in an order shuffled with the seed and ``r``, each run by ``guard`` (again
    when others were busy during it); its records go to ``docs``, a tick to the progress ``bar``."""
    order = np.random.default_rng([ctx.settings.seed, r, 5]).permutation(len(tasks))
    for pos, ti in enumerate(order):
        task: Task = tasks[int(ti)]
        for rec in guard.run(lambda: retry_busy(lambda: task.run(ctx, r, pos))):
            docs.add(rec)
        bar.update(1, note=f"round {r}: {task.describe(ctx)}")


class _Documents:
    """The two documents of a measurement as they fill (``micro``: ``microbench.json``, ``runs``: ``runs.json``)
    and where they go (``micro_path``, ``runs_path``: None when that part is off)."""

    def __init__(self, s: Settings, head: dict, configs: Sequence[RunConfig], paths: tuple) -> None:
        self.s = s
        self.warnings = head["warnings"]
        self.micro = {"schema": MICRO_SCHEMA, "kind": "microbench", **head, "records": []}
        self.runs = {"schema": RUNS_SCHEMA, "kind": "decode_runs", **head, "machine": machine_info(),
                     "configs": [c.to_dict() for c in configs], "runs": []}
        self.micro_path, self.runs_path = paths

    def add(self, rec: dict) -> None:
        """A task's record: a run (it names a ``config``) or a microbenchmark."""
        (self.runs["runs"] if "config" in rec else self.micro["records"]).append(rec)

    def save(self, done: bool, waited: float) -> None:
        """Write both documents (those measured), ``done`` saying whether the measurement is complete,
        ``waited`` its seconds spent waiting for a quiet machine."""
        for doc in (self.micro, self.runs):
            doc["waited_s"] = waited
            doc["complete"] = done
            doc["warnings"] = self.warnings + cache_warnings(self.micro["records"])
        if self.s.micro:
            _write(self.micro_path, self.micro)
        if self.s.decode:
            self.runs["machine"]["loadavg_end"] = machine_info().get("loadavg")
            _write(self.runs_path, self.runs)


def _left_text(left_out: Dict[str, str]) -> str:
    return "; ".join(f"{b}: {why}" for b, why in left_out.items()) or "none"


def _write(path: Path, doc: dict) -> None:
    """:func:`sim.core.io.write_json`, with a failure (permissions, a full disk) as a typed error naming the path."""
    try:
        write_json(path, doc)
    except OSError as exc:
        raise TableIOError(f"{path}: cannot write the measurement ({exc.strerror or exc})",
                           errno_=exc.errno or 0) from None


def size_warnings(info, machine: dict) -> list:
    """Warnings when the measured tables are small against this machine's memory: a host's page cache under a
    virtual disk (or a device's cache) may then hold them, below ``O_DIRECT``, and serve re-read rows fast."""
    mem = machine.get("memory_bytes") or 0
    size = sum(int(t.rows) * ROW_BYTES for t in info.tables.values())
    if mem and size < 2 * mem:
        return [f"the tables ({size / 2**30:.2f} GiB) are small against this machine's memory "
                f"({mem / 2**30:.1f} GiB): a host or device cache below O_DIRECT may hold them. Every run and "
                f"microbenchmark reads fresh rows (no stretch or random row is read twice on purpose); the cold/"
                f"warm check says whether re-reads are served faster"]
    return []


def cache_warnings(records) -> list:
    """A warning per cold/warm check whose re-reads ran faster than :data:`CACHE_RATIO` times the first
    reads."""
    out = []
    for r in records:
        if r.get("kind") == "cache" and float(r.get("warm_over_cold", 1.0)) < CACHE_RATIO:
            cold = float(np.mean(r["cold_us"])) / 1e3
            warm = float(np.mean(r["warm_us"])) / 1e3
            out.append(f"re-reads of the same rows took {warm:.3f} ms a 48-row batch against {cold:.3f} ms the "
                       f"first time ({r['warm_over_cold']:.2f}x): a cache below O_DIRECT serves repeated rows, so "
                       f"a trace's own repeats read faster than fresh rows and a small table looks faster than "
                       f"a large one")
    return out


def _traces(model, configs: Sequence[RunConfig], s: Settings) -> tuple:
    """The trace of every configuration, long enough for all its runs, and each run's first step.

    Raises
    ------
    ArgumentError
        A trace shorter than its runs need.
    """
    traces: Dict[str, Trace] = {}
    for spec, need in trace_tokens_needed(configs, s.rounds).items():
        if encoded_by_tokenizer(spec):  # the model's own vocabulary, or every row read is another one
            check_model_vocabulary(model.info)
        traces[spec] = load_trace(spec, limit=need, layout=model.layout)
        if traces[spec].steps < need:
            raise ArgumentError(f"trace {spec!r} has {traces[spec].steps} tokens; its runs need {need} "
                                f"(each run reads its own stretch: fewer steps, rounds or configurations)")
    return traces, segments(configs, s.rounds)


def _save_traces(traces: Dict[str, Trace], out_dir: Path) -> Dict[str, str]:
    """Save the exact traces of the runs beside them, for the cross-check (no tokenizer or model file needed
    there): trace spec -> path relative to ``out_dir``."""
    names: Dict[str, str] = {}
    try:
        (out_dir / "traces").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TableIOError(f"{out_dir / 'traces'}: cannot create the folder ({exc.strerror or exc})",
                           errno_=exc.errno or 0) from None
    for spec, tr in traces.items():
        base = trace_label(spec).replace("/", "_")
        name, i = base, 1
        while name in names.values():
            i += 1
            name = f"{base}-{i}"
        names[spec] = name
        path = out_dir / "traces" / f"{name}.npz"
        try:
            tr.save(path)
        except OSError as exc:
            raise TableIOError(f"{path}: cannot write the trace ({exc.strerror or exc})",
                               errno_=exc.errno or 0) from None
    return {spec: f"traces/{name}.npz" for spec, name in names.items()}
