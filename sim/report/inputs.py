"""What a report is made from: a measurement folder (calibration, runs, cross-check, demo) and the traces.

:func:`load_inputs` reads a folder written by ``engram measure`` /
``calibrate`` / ``crosscheck`` / ``demo`` (any of them may be missing) and
the traces of the what-if curves; :class:`Inputs` answers the questions the
sections ask of them (the main trace, the machine, the calibrated backends).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from engram.errors import ArgumentError

from sim.check.calibrate import Calibration
from sim.check.crosscheck import crosscheck
from sim.check.planner import check_planner
from sim.core.io import load_json
from ..trace import CODE_SOURCE, Trace, load_trace, resolve_source

__all__ = ["WHATIF_TOKENS", "Inputs", "default_traces", "device_label", "load_inputs"]

#: Trace length (tokens) of the predicted what-if curves.
WHATIF_TOKENS = 2000

_PROSE_SOURCES = ("stdlib:pydoc_data/topics.py", "stdlib:inspect.py")


def default_traces() -> List[str]:
    """Built-in trace sources present on every Python: standard-library source code and English prose.

    ``stdlib:asyncio/base_events.py`` (Python source) and
    ``stdlib:pydoc_data/topics.py`` (the English text of the language
    reference that ``pydoc`` shows), or ``stdlib:inspect.py`` where a
    distribution leaves ``pydoc_data`` out.
    """
    out = [CODE_SOURCE]
    for spec in _PROSE_SOURCES:
        try:
            resolve_source(spec)
        except ArgumentError:
            continue
        out.append(spec)
        break
    return out


def device_label(spec: str) -> str:
    """A reader's name for a device spec of a study (``calibrated`` -> ``this machine``, ``ssd:...`` -> figures)."""
    if spec == "calibrated" or spec.startswith("calibrated:"):
        return "this machine" + (f" ({spec.split(':', 1)[1]})" if ":" in spec else "")
    if spec.startswith("ssd:"):
        kv = dict(x.split("=", 1) for x in spec[4:].split(",") if "=" in x)
        return f"SSD {kv.get('qd1_us', '?')} us, {float(kv.get('iops', 0)) / 1000:g}k IOPS"
    return spec


@dataclass
class Inputs:
    """The documents and traces of one report (each document ``None`` when the folder lacks it).

    ``traces``: trace spec -> :class:`~sim.trace.Trace` of the what-if curves;
    ``run_traces``: trace spec -> the trace the measured runs read.
    """

    workdir: Optional[Path] = None
    cal: Optional[Calibration] = None
    cal_path: Optional[Path] = None
    runs: Optional[dict] = None        # runs.json
    runs_path: Optional[Path] = None
    micro: Optional[dict] = None       # microbench.json
    xc: Optional[dict] = None          # crosscheck.json
    demo: Optional[dict] = None        # demo.json
    planner: Optional[dict] = None     # planner.json (engram crosscheck --planner)
    traces: Dict[str, Any] = field(default_factory=dict)
    run_traces: Dict[str, Any] = field(default_factory=dict)

    def xc_rows(self) -> List[dict]:
        """The cross-check's rows (one per measured configuration), or none."""
        return list(self.xc["rows"]) if self.xc else []

    def main_trace(self) -> Optional[str]:
        """The trace with the most measured configurations without extra compute."""
        rows = [r for r in self.xc_rows() if r["compute"] == "none"] or self.xc_rows()
        if not rows:
            return None
        counts: Dict[str, int] = {}
        for r in rows:
            counts[r["trace"]] = counts.get(r["trace"], 0) + 1
        return max(counts, key=lambda k: (counts[k], k == CODE_SOURCE))

    def machine_name(self) -> str:
        """CPU and cores of the measured machine."""
        m = (self.cal.machine if self.cal is not None else None) or (self.runs or {}).get("machine") or {}
        cpu = m.get("cpu") or "this machine"
        return f"{cpu} x{m.get('cores', '?')}"

    def backends(self) -> List[str]:
        """The calibrated read backends, io_uring first."""
        return [b for b in ("io_uring", "pread") if self.cal is not None and b in self.cal.devices]

    def measured_steps(self, trace: str) -> int:
        """The most common step count of the measured runs on ``trace``."""
        steps = [r["steps"] for r in self.xc_rows() if r["trace"] == trace]
        return int(max(set(steps), key=steps.count)) if steps else WHATIF_TOKENS

    def machine_trace(self, spec: str) -> Trace:
        """The trace ``spec`` as the runs read it (their length) when measured, else the what-if trace."""
        tr = self.run_traces.get(spec, self.traces.get(spec))
        return tr.head(self.measured_steps(spec)) if spec in self.run_traces else tr


def load_inputs(workdir: Optional[Path], traces: Optional[Sequence[str]], quick: bool, progress: bool,
                say: Callable[[str], None]) -> Inputs:
    """The documents of ``workdir`` (computing the cross-check when the folder has none) and the traces.

    Raises
    ------
    ArgumentError
        ``workdir`` is not a folder, or a trace source is gone and nothing of it was saved.
    FormatError
        A document is not what its name says, or cannot be read (a folder in its place).
    """
    inp = Inputs(workdir=workdir)
    if workdir is not None:
        if not workdir.is_dir():
            raise ArgumentError(f"{workdir}: no such measurement folder")
        cal_p, runs_p, micro_p = workdir / "calibration.json", workdir / "runs.json", workdir / "microbench.json"
        xc_p, demo_p = workdir / "crosscheck.json", workdir / "demo.json"
        if cal_p.exists():  # a folder in its place is refused when read
            inp.cal, inp.cal_path = Calibration.load(cal_p), cal_p
        if runs_p.exists():  # a folder in its place is refused when read
            inp.runs, inp.runs_path = load_json(runs_p, "decode_runs"), runs_p
        if micro_p.exists():  # a folder in its place is refused when read
            inp.micro = load_json(micro_p, "microbench")
        if demo_p.exists():  # a folder in its place is refused when read
            inp.demo = load_json(demo_p)
        if (workdir / "planner.json").exists():  # a folder in its place is refused when read
            inp.planner = check_planner(load_json(workdir / "planner.json", "planner_crosscheck"),
                                        workdir / "planner.json")
        if xc_p.exists():  # a folder in its place is refused when read
            inp.xc = load_json(xc_p, "crosscheck")
        elif inp.cal is not None and inp.runs is not None:
            say("cross-check (no crosscheck.json in the folder)")
            inp.xc = crosscheck(inp.cal, inp.runs, runs_path=runs_p, progress=progress,
                                sim_steps=500 if quick else None)
        if inp.runs is not None:
            for spec, rel in (inp.runs.get("traces") or {}).items():
                if (workdir / rel).is_file():
                    inp.run_traces[spec] = Trace.load(workdir / rel)
    limit = 500 if quick else WHATIF_TOKENS
    specs = list(traces) if traces else (list(inp.run_traces) if inp.run_traces else default_traces())
    for spec in specs:
        tr = inp.run_traces.get(spec)
        if tr is None or tr.steps < limit:
            try:
                tr = load_trace(spec, limit=limit)
            except ArgumentError:
                if tr is None:  # the source is gone and nothing was saved
                    raise
        inp.traces[spec] = tr.head(limit)
    return inp
