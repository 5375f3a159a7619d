"""The report: measurements, predictions and what-if studies as a folder of figures (SPEC §8, §9).

:func:`build_report` writes a report folder::

    OUT/report.md        the report (Markdown; figures and tables inline)
    OUT/report.html      the same as one self-contained HTML page (figures and data embedded)
    OUT/figures/*.png    every figure: title, labelled axes with units, legend
    OUT/data/*.csv       the numbers behind every figure, one file per figure
    OUT/inputs/          the calibration, cross-check, run summary and sweep tables it was made from

What goes in depends on what it is given:

- first, the answer: the concurrent sessions each device sustains at a target
  tokens/s, searched with a seed ensemble (:mod:`sim.sweep.capacity`), with its band
  and assumptions, from the report's own search and every capacity table
  given (:mod:`sim.report.answer`);
- always: the SPEC §8 seed reproduction; tokens/s by threshold and by readers,
  by row-cache size and reuse rate, step-latency CDFs on the device presets of
  :mod:`sim.device`, predicted;
- with a measurement folder (``engram measure`` + ``engram calibrate``, and
  ``engram crosscheck`` or computed here): the same figures for this machine
  with measured points next to the predictions, the step-latency CDFs measured
  vs predicted, predicted vs measured tokens/s with the error band and the
  cross-check table, this machine's calibrated device in the capacity figure,
  the calibration's tables;
- with sweep tables (``engram sim sweep``): the study's figures; with capacity
  tables (``engram sim capacity``): the study's configurations; with serving
  capacity tables (a serving study): requests/s under the SLOs by device,
  latency percentiles against load and where the knee comes from
  (:mod:`sim.report.serving`);
- with ``serve_counterpart.json`` in the measurement folder (``engram sim serve
  --counterpart MODEL --json``): the serving model predicted vs measured;
- with ``demo.json`` in the measurement folder (``engram demo``): the model
  file, traces, lookups and gated adds of the run.

Units: tokens/s are decode tokens per second of one session unless a label
says otherwise; latencies in ms or us as labelled; cache sizes in rows of 264
bytes.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union


from engram.errors import ArgumentError

from sim.sweep.capacity import CAPACITY_TARGET, is_capacity_table
from sim.check.crosscheck import capacity_shown
from sim.check.regimes import (count_text, percent_text, regime as xc_regime, regime_checks as xc_regime_checks,
                               summary_figure, verdict_text)
from ..device import SEED_REFERENCE
from sim.core.io import now_iso, output_error
from sim.core.progress import progress_mode
from ..serve.search import is_serve_capacity_table
from ..sweep import METRICS, read_table
from .answer import Entry, answer_section, entries_from_crosscheck, search_section
from .document import Doc, anchor
from .figures import (cache_section, cdf_section, devices_figure, planner_section, readers_section,
                      reuse_rate_section, seed_section, speculative_section, threshold_section)
from .inputs import Inputs, load_inputs
from .plots import ReportFolder
from .devices import devices_section
from .sections import crosscheck_section, inputs_section, run_section, sweeps_section
from .serving import serve_counterpart_section
from .whatif import (cache_data, capacity_data, cdf_data, device_curves, planner_data, readers_data, reuse_data,
                     seed_figures, speculative_data, threshold_data)

__all__ = ["ReportPage", "ReportSearch", "build_report"]

_SEARCH_HEADING = "Capacity: how the report searched it"


def regime(inp: Inputs) -> str:
    """The machine regime the measurements ran in, in words: the cross-check's (``summary["regime"]``, from the
    background load measured during the runs, by :func:`sim.check.regimes.regime`), else that rule applied to the
    runs' background load, else what was not measured."""
    rg = ((inp.xc or {}).get("summary") or {}).get("regime")
    if rg is None and inp.runs is not None:
        bg = [r["background"] for r in inp.runs.get("runs", []) if isinstance(r.get("background"), dict)]
        rg = xc_regime(bg) if bg else None
    if rg is None:
        if inp.runs is None and (inp.cal is not None or inp.xc):
            return (f"measured on {inp.machine_name()}; the runs (runs.json), and with them the load of other "
                    "processes, are not in the measurement folder")
        if inp.runs is None:
            return "no measurement on this machine: every figure is a prediction on the device presets"
        return f"measured on {inp.machine_name()}; the load of other processes was not recorded"
    kind = {"quiet": "a quiet machine", "busy": "a shared, busy machine", "unmeasured": "a machine whose load was "
            "not recorded"}.get(rg["name"], "a shared, loaded machine")
    return f"measured on {inp.machine_name()}, {kind} (regime {rg['name']}: {rg['why']})"


def left_out(inp: Inputs) -> Dict[str, str]:
    """Read backends left out of the measurements, with the reason: from the demo, the runs, the calibration and
    the cross-check (``backends.left_out`` of each; the first reason given for a backend is kept)."""
    out: Dict[str, str] = {}
    docs = [inp.demo, inp.runs, inp.xc]
    for d in docs:
        for be, why in (((d or {}).get("backends") or {}).get("left_out") or {}).items():
            out.setdefault(be, why)
    if inp.cal is not None:
        for be, why in inp.cal.left_out.items():
            out.setdefault(be, why)
    return out


def _measurement_lines(inp: Inputs) -> List[str]:
    """The headline's lines on this machine's measurements: the read backends measured and left out (with why),
    the cross-check's regime, interval coverage and verdict, the measured capacity, the measurements' warnings."""
    if inp.cal is None and inp.xc is None and inp.runs is None:
        return []
    lines = []
    used = sorted(inp.cal.devices) if inp.cal is not None else sorted(((inp.xc or {}).get("backends") or {})
                                                                      .get("usable") or [])
    gone = left_out(inp)
    lines.append(f"Read backends measured: {', '.join(used) or 'none'}; "
                 + ("left out: " + "; ".join(f"{b} ({why})" for b, why in gone.items()) if gone else
                    "none left out (every read backend started here)") + ".")
    if inp.xc:
        s = inp.xc.get("summary") if isinstance(inp.xc.get("summary"), Mapping) else {}
        n = count_text(s, "configurations")
        lines.append(f"Cross-check on {inp.machine_name()}: {n} configurations, tokens/s median "
                     f"|error| {percent_text(summary_figure(s, 'tokens_per_s', 'median_abs_error'))}, max "
                     f"{percent_text(summary_figure(s, 'tokens_per_s', 'max_abs_error'))}; median spread of repeats "
                     f"{percent_text(summary_figure(s, 'spread', 'tokens_per_s_median'))}.")
        rg = {"name": "unknown", "why": "not recorded", **(s.get("regime") if isinstance(s.get("regime"), Mapping)
                                                          else {})}
        cover = summary_figure(s, "inside_interval_share")
        which, _, rule = xc_regime_checks(rg["name"])
        targets = (inp.xc.get("quiet_targets") if which == "quiet" else None) or inp.xc.get("targets")

        def target(key: str) -> str:
            return percent_text(summary_figure(targets, key), "g", "not recorded")

        lines.append(
            f"Cross-check regime: **{rg['name']}** ({rg['why']}); {rule} (tokens/s median |error| "
            f"<= {target('tokens_per_s_median_abs')}, max <= {target('tokens_per_s_max_abs')})"
            + (f"; {s.get('inside_interval', 0)} of {n} configurations ({percent_text(cover, '.0f')}) inside their "
               f"90% interval, run by run (target when not quiet >= {inp.xc.get('coverage_target', 0.9):.0%})"
               if cover is not None else "")
            + f": {verdict_text(s)}.")
        for e in entries_from_crosscheck(inp.xc):
            if e.checked["kind"] == "measured":
                c = e.checked["row"]
                lines.append(f"Capacity on this machine, sessions as {c['mode']}: measured {e.shown()}, predicted "
                             f"{capacity_shown(c, 'predicted')} at {e.spec.target:g} tokens/s for the slowest session "
                             f"(grid {e.checked['grid']}; compute {e.checked['compute_ms']:.2f} ms a step; "
                             f"{e.phases_short()}).")
    warns = list(dict.fromkeys(((inp.xc or {}).get("warnings") or []) + ((inp.runs or {}).get("warnings") or [])))
    lines += [f"Measurement warning: {w}." for w in warns]
    return lines


def _headline(inp: Inputs, seed: dict) -> List[str]:
    head = [f"Machine: {regime(inp)}.",
            f"Seed reproduction: threshold 8 predicted at {seed['predicted_tokens_per_s']:.2f} tokens/s vs "
            f"{SEED_REFERENCE['concurrent_tokens_per_s']} measured by the reference engine "
            f"({seed['error'] * 100:+.2f}%)."]
    head += _measurement_lines(inp)
    if inp.xc:
        single = [r for r in inp.xc["rows"] if r["compute"] == "none"]
        best = max(single, key=lambda r: r["measured"]["tokens_per_s"]) if single else None
        ser = [r for r in single if best and r["serial"] and r["trace"] == best["trace"]]
        if ser and not best["serial"]:
            head.append(f"Fastest measured read policy: {best['backend']} with {best['readers']} readers, "
                        f"{best['measured']['tokens_per_s']:.0f} tokens/s of Engram reads on {best['trace_label']} "
                        f"vs {ser[0]['measured']['tokens_per_s']:.0f} serially "
                        f"(x{best['measured']['tokens_per_s'] / ser[0]['measured']['tokens_per_s']:.2f}).")
    return head


_HOW = ("How to read it: **measured** is the real engine on this machine (the median of interleaved repeats, "
        "bars from the slowest to the fastest); **predicted** is the simpy model of `sim`, calibrated from "
        "microbenchmarks only, never from the runs it is compared with; the reference SSD and the other presets "
        "are predictions with the SPEC §8 compute per step (~47 ms, a V4.1 Flash-class model), while 'Engram "
        "reads only' panels leave the rest of the model out and show how fast the reads alone can go. "
        "tokens/s are decode tokens per second of one session unless a label says otherwise, and every tokens/s "
        "axis starts at zero; every figure's numbers are in `data/`, its inputs in `inputs/`.")


@dataclass(frozen=True)
class ReportSearch:
    """The report's capacity search (and the planner's panels, searched the same way).

    Attributes
    ----------
    target : float
        Tokens/s every session must reach in the report's capacity search (> 0).
    compute_ms : float, optional
        Compute per step of the capacity search, ms (>= 0; default: the SPEC §8 reference compute).
    seeds, max_sessions : int, optional
        Seeds per device and the largest session count of the capacity search (default, also for 0: 3 and
        1,024, :data:`sim.sweep.capacity.CAPACITY_MAX_SESSIONS`; ``quick``: 2 and 128).
    jobs : int, optional
        Local processes for the capacity search (default: the CPU count).

    Raises
    ------
    ArgumentError
        A field out of its range (names the field and the value).
    """

    target: float = CAPACITY_TARGET
    compute_ms: Optional[float] = None
    seeds: Optional[int] = None
    max_sessions: Optional[int] = None
    jobs: Optional[int] = None

    def __post_init__(self) -> None:
        t = self.target
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ArgumentError(f"report search target = {t!r} must be a number of tokens/s > 0")
        c = self.compute_ms
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0):
            raise ArgumentError(f"report search compute_ms = {c!r} must be a number of ms >= 0")
        for name in ("seeds", "max_sessions", "jobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ArgumentError(f"report search {name} = {v!r} must be a whole number >= 1 (0 or None: the "
                                    f"default)")


@dataclass(frozen=True)
class ReportPage:
    """How the report's document is written.

    Attributes
    ----------
    html_page : bool
        Also write ``report.html`` (the same document, rendered by markdown-it-py).
    self_contained : bool
        Embed the figures and data files in ``report.html`` (default), or link them by relative path.
    title : str, optional
        The report's title (default: "Engram decode: measured, predicted and what-if").

    Raises
    ------
    ArgumentError
        A flag that is not true or false, a title that is not text (names the field and the value).
    """

    html_page: bool = True
    self_contained: bool = True
    title: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("html_page", "self_contained"):
            if not isinstance(getattr(self, name), bool):
                raise ArgumentError(f"report page {name} = {getattr(self, name)!r} must be true or false")
        if self.title is not None and not isinstance(self.title, str):
            raise ArgumentError(f"report page title = {self.title!r} must be text")


def build_report(out_dir: Union[str, os.PathLike], *, workdir: Union[str, os.PathLike, None] = None,
                 sweeps: Sequence[Union[str, os.PathLike]] = (), traces: Optional[Sequence[str]] = None,
                 search: ReportSearch = ReportSearch(), page: ReportPage = ReportPage(), quick: bool = False,
                 progress: Union[bool, str] = True, log: Optional[Callable[[str], None]] = None) -> Path:
    """Write a report folder and return the path of its ``report.md``.

    Parameters
    ----------
    out_dir : path
        Report folder (created; files in it are overwritten).
    workdir : path, optional
        A measurement folder: ``microbench.json``, ``runs.json`` (``engram measure``),
        ``calibration.json`` (``engram calibrate``), ``crosscheck.json``
        (``engram crosscheck``; computed here when missing), ``traces/``, and
        ``demo.json`` (``engram demo``).  Without it the report holds the
        predicted figures on the device presets only.
    sweeps : sequence of path
        Sweep tables (``engram sim sweep``) and capacity tables (``engram sim capacity``), ``.csv`` or
        ``.parquet``: their figures, and their capacities in the answer.
    traces : sequence of str, optional
        Trace sources of the what-if curves (default: the measured runs' traces,
        else :func:`default_traces`).
    search : ReportSearch
        The capacity search of the report.
    page : ReportPage
        The HTML page and the title.
    quick : bool
        Shorter simulations and fewer points (for tests and smoke runs).
    progress : bool or str
        :mod:`sim.core.progress` mode of the capacity search; section lines go to standard error unless ``False``.
    log : callable, optional
        Receives a line as each section starts (default: print to standard error unless progress is off).

    Raises
    ------
    ArgumentError, FormatError
        A missing folder or table, or inputs that are not what they claim to be.
    OutputError
        The report folder cannot be written (names the path).
    """
    t0 = time.perf_counter()
    mode = progress_mode(progress)
    say = log or ((lambda s: print(f"  report: {s}", file=sys.stderr, flush=True)) if mode != "off"
                  else (lambda s: None))
    wd = Path(workdir) if workdir is not None else None
    sweep_paths = _sweep_paths(sweeps)
    say("loading inputs and traces")
    bars = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
    inp = load_inputs(wd, traces, quick, bars, say)
    out = ReportFolder(Path(out_dir))  # made only once every input is read: a bad input leaves nothing behind
    doc = Doc(page.title or "Engram decode: measured, predicted and what-if")
    intro = (f"Generated {now_iso()} by `engram report`"
             + (f" from the measurements in `{wd}`" if wd else " (no measurements: predictions on device presets)")
             + (f" and {len(sweep_paths)} table(s) of studies" if sweep_paths else "") + ".")
    doc.p(intro)
    answer_at = len(doc.blocks)
    seed, ref_compute = seed_figures()
    _evidence_sections(doc, out, inp, seed, ref_compute, quick, say)
    cap = _capacity_sections(doc, out, inp, ref_compute, search, quick, mode, say)
    entries = [Entry(label, "this report's search", cap.spec, cap=c, config=c.config) for label, c in cap.entries]
    if inp.xc:
        entries += entries_from_crosscheck(inp.xc)
    if wd is not None and serve_counterpart_section(doc, out, wd):
        say("serving: predicted vs measured")
    if sweep_paths:
        say("studies")
        entries += sweeps_section(doc, out, sweep_paths)
    answer = Doc("")
    answer_section(answer, out, entries, _SEARCH_HEADING)
    inputs_section(doc, out, inp, sweep_paths)
    _lead_with_the_answer(doc, answer_at, answer, _headline(inp, seed))
    doc.p(f"Report written in {time.perf_counter() - t0:.0f} s.")
    md = out.root / "report.md"
    _write_text(md, doc.markdown())
    if page.html_page:
        _write_text(out.root / "report.html", doc.html(out.root, self_contained=page.self_contained))
    return md


def _sweep_paths(sweeps: Sequence[Union[str, os.PathLike]]) -> List[Path]:
    """The sweep and capacity tables, each checked to be one the report can use before any work.

    Raises
    ------
    ArgumentError, FormatError
        A folder, a missing table, or a sweep table the sweep section cannot use.
    """
    sweep_paths = [Path(s) for s in sweeps]
    for s in sweep_paths:
        if s.is_dir():
            raise ArgumentError(f"sweep table {s} is a folder, not a table")
        if not s.is_file() and not Path(str(s) + ".partial.csv").is_file():
            raise ArgumentError(f"sweep table {s} does not exist")
        if not (is_capacity_table(s) or is_serve_capacity_table(s)):
            read_table(s, metrics=METRICS)  # a table the sweep section cannot use is refused before any work
    return sweep_paths


def _evidence_sections(doc: Doc, out: ReportFolder, inp: Inputs, seed: dict, ref_compute, quick: bool,
                       say: Callable[[str], None]) -> None:
    """The seed reproduction, the runs, predicted vs measured and the what-if figures (``seed``, ``ref_compute``:
    the seed reproduction and its compute per step, :func:`sim.report.whatif.seed_figures`)."""
    say("seed reproduction")
    seed_section(doc, out, seed)
    run_section(doc, inp)
    say("predicted vs measured")
    crosscheck_section(doc, out, inp)
    devices_section(doc, inp)
    say("tokens/s by threshold")
    threshold_section(doc, out, threshold_data(inp, ref_compute, quick), ref_compute)
    say("tokens/s by readers")
    readers_section(doc, out, readers_data(inp, ref_compute, quick), ref_compute)
    devices_figure(doc, out, *device_curves(inp))
    say("step-latency CDFs")
    cdf_section(doc, out, cdf_data(inp, ref_compute, quick))
    say("reuse and row caches")
    cache_section(doc, out, cache_data(inp, ref_compute, quick))
    reuse_rate_section(doc, out, reuse_data(inp, ref_compute, quick))
    say("speculative decoding")
    speculative_section(doc, out, speculative_data(inp, ref_compute, quick))


def _capacity_sections(doc: Doc, out: ReportFolder, inp: Inputs, ref_compute, search: ReportSearch, quick: bool,
                       mode: str, say: Callable[[str], None]):
    """The report's capacity search and what a planner can buy; returns the search
    (:func:`sim.report.whatif.capacity_data`)."""
    say("capacity search")
    cap = capacity_data(inp, ref_compute, target=search.target, compute_ms=search.compute_ms, seeds=search.seeds,
                        max_sessions=search.max_sessions, quick=quick, jobs=search.jobs or None, progress=mode)
    search_section(doc, cap, _SEARCH_HEADING)
    say("what a planner can buy")
    planner_section(doc, out, planner_data(inp, ref_compute, target=search.target, compute_ms=search.compute_ms,
                                           quick=quick, jobs=search.jobs or None, progress=mode))
    return cap


def _lead_with_the_answer(doc: Doc, answer_at: int, answer: Doc, headline: List[str]) -> None:
    """The answer first, then the other headline figures and the contents, at ``answer_at`` of ``doc``."""
    head = [("h", 1, "Other headline figures"), ("ul", headline), ("p", _HOW)]
    doc.blocks[answer_at:answer_at] = answer.blocks + head
    toc = [f"[{b[2]}](#{anchor(b[2])})" for b in doc.blocks if b[0] == "h" and b[1] == 1]
    doc.blocks.insert(answer_at + len(answer.blocks) + len(head), ("p", "Contents: " + " · ".join(toc)))


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise output_error(path, exc) from None
