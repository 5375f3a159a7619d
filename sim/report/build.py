"""The report: measurements, predictions and what-if studies as a folder of figures (SPEC §8, §9).

:func:`build_report` writes a report folder::

    OUT/report.md        the report (Markdown; figures and tables inline)
    OUT/report.html      the same as one HTML page (optional)
    OUT/figures/*.png    every figure: title, labelled axes with units, legend
    OUT/data/*.csv       the numbers behind every figure, one file per figure
    OUT/inputs/          the calibration, cross-check, run summary and sweep tables it was made from

What goes in depends on what it is given:

- always: the SPEC §8 seed reproduction; tokens/s by threshold and by readers,
  by row-cache size and reuse rate, step-latency CDFs and capacity (concurrent
  sessions a device sustains at a target tokens/s) on the device presets of
  :mod:`sim.device`, predicted;
- with a measurement folder (``engram measure`` + ``engram calibrate``, and
  ``engram crosscheck`` or computed here): the same figures for this machine
  with measured points next to the predictions, the step-latency CDFs measured
  vs predicted, predicted vs measured tokens/s with the error band and the
  cross-check table, this machine's calibrated device in the capacity figure,
  the calibration's tables;
- with sweep tables (``engram sim sweep``): the study's figures;
- with ``demo.json`` in the measurement folder (``engram demo``): the model
  file, traces, lookups and gated adds of the run.

Units: tokens/s are decode tokens per second of one session unless a label
says otherwise; latencies in ms or us as labelled; cache sizes in rows of 264
bytes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from engram.errors import ArgumentError

from ..device import SEED_REFERENCE
from ..io import now_iso
from .document import Doc, anchor
from .figures import (cache_section, capacity_section, cdf_section, devices_figure, readers_section, seed_section,
                      threshold_section)
from .inputs import load_inputs
from .plots import ReportFolder
from .sections import crosscheck_section, inputs_section, run_section, sweeps_section
from .whatif import (CAPACITY_SESSIONS, CAPACITY_TARGET, cache_data, capacity_data, cdf_data, device_curves,
                     readers_data, seed_figures, threshold_data)

__all__ = ["build_report"]


def build_report(out_dir: Union[str, os.PathLike], *, workdir: Union[str, os.PathLike, None] = None,
                 sweeps: Sequence[Union[str, os.PathLike]] = (), traces: Optional[Sequence[str]] = None,
                 html_page: bool = True, target: float = CAPACITY_TARGET, compute_ms: Optional[float] = None,
                 sessions: Sequence[int] = CAPACITY_SESSIONS, quick: bool = False, jobs: Optional[int] = None,
                 title: Optional[str] = None, progress: bool = True,
                 log: Optional[Callable[[str], None]] = None) -> Path:
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
        Sweep tables (``engram sim sweep``; ``.csv`` or ``.parquet``) to plot.
    traces : sequence of str, optional
        Trace sources of the what-if curves (default: the measured runs' traces,
        else :func:`default_traces`).
    html_page : bool
        Also write ``report.html``.
    target : float
        Tokens/s per session of the capacity figure.
    compute_ms : float, optional
        Compute per step of the capacity figure (default: the SPEC §8 reference compute).
    sessions : sequence of int
        Concurrent session counts of the capacity figure.
    quick : bool
        Shorter simulations and fewer points (for tests and smoke runs).
    jobs : int, optional
        Local processes for the capacity simulations (default: the CPU count).
    title : str, optional
    progress : bool
        Progress bars.
    log : callable, optional
        Receives a line as each section starts (default: print when ``progress``).

    Raises
    ------
    ArgumentError, FormatError
        A missing folder, or inputs that are not what they claim to be.
    """
    t0 = time.perf_counter()
    say = log or ((lambda s: print(f"  report: {s}", flush=True)) if progress else (lambda s: None))
    out = ReportFolder(Path(out_dir))
    wd = Path(workdir) if workdir is not None else None
    sweep_paths = [Path(s) for s in sweeps]
    for s in sweep_paths:
        if not s.is_file():
            raise ArgumentError(f"sweep table {s} does not exist")
    say("loading inputs and traces")
    inp = load_inputs(wd, traces, quick, progress, say)
    if quick and sessions == CAPACITY_SESSIONS:
        sessions = (1, 4, 16, 64)
    doc = Doc(title or "Engram decode: measured, predicted and what-if")
    now = now_iso()
    intro = (f"Generated {now} by `engram report`"
             + (f" from the measurements in `{wd}`" if wd else " (no measurements: predictions on device presets)")
             + (f" and {len(sweep_paths)} sweep table(s)" if sweep_paths else "") + ".")
    doc.p(intro)
    summary_at = len(doc.blocks)
    seed, ref_compute = seed_figures()

    say("seed reproduction")
    seed_section(doc, out, seed)
    run_section(doc, inp)
    say("predicted vs measured")
    crosscheck_section(doc, out, inp)
    say("tokens/s by threshold")
    threshold_section(doc, out, threshold_data(inp, ref_compute, quick), ref_compute)
    say("tokens/s by readers")
    readers_section(doc, out, readers_data(inp, ref_compute, quick), ref_compute)
    devices_figure(doc, out, *device_curves(inp))
    say("step-latency CDFs")
    cdf_section(doc, out, cdf_data(inp, ref_compute, quick))
    say("reuse and row caches")
    cache_section(doc, out, cache_data(inp, ref_compute, quick))
    say("capacity")
    cap = capacity_section(doc, out, capacity_data(inp, ref_compute, compute_ms=compute_ms, sessions=sessions,
                                                   quick=quick, jobs=jobs, progress=progress),
                           target=target, given_compute=compute_ms is not None)
    if sweep_paths:
        say("sweeps")
        sweeps_section(doc, out, sweep_paths)
    inputs_section(doc, out, inp, sweep_paths)

    # headline figures, placed after the introduction
    head = [f"Seed reproduction: threshold 8 predicted at {seed['predicted_tokens_per_s']:.2f} tokens/s vs "
            f"{SEED_REFERENCE['concurrent_tokens_per_s']} measured by the reference engine "
            f"({seed['error'] * 100:+.2f}%)."]
    if inp.xc:
        s = inp.xc["summary"]
        head.append(f"Cross-check on {inp.machine_name()}: {s['configurations']} configurations, tokens/s median "
                    f"|error| {s['tokens_per_s']['median_abs_error'] * 100:.1f}%, max "
                    f"{s['tokens_per_s']['max_abs_error'] * 100:.1f}% ({'PASS' if s['passed'] else 'FAIL'} against "
                    f"the targets); median spread of repeats {s['spread']['tokens_per_s_median'] * 100:.1f}%.")
        best = max(inp.xc["rows"], key=lambda r: r["measured"]["tokens_per_s"] if r["compute"] == "none" else 0)
        ser = [r for r in inp.xc["rows"] if r["serial"] and r["trace"] == best["trace"] and r["compute"] == "none"]
        if ser and not best["serial"]:
            head.append(f"Fastest measured read policy: {best['backend']} with {best['readers']} readers, "
                        f"{best['measured']['tokens_per_s']:.0f} tokens/s of Engram reads on {best['trace_label']} "
                        f"vs {ser[0]['measured']['tokens_per_s']:.0f} serially "
                        f"(x{best['measured']['tokens_per_s'] / ser[0]['measured']['tokens_per_s']:.2f}).")
    if cap:
        head.append("Capacity at " + f"{target:g} tokens/s per session: "
                    + "; ".join(f"{row[0]} {row[1]} sessions" for row in cap) + ".")
    toc = [f"[{b[2]}](#{anchor(b[2])})" for b in doc.blocks if b[0] == "h" and b[1] == 1]
    how = ("How to read it: **measured** is the real engine on this machine (the median of interleaved repeats, "
           "bars from the slowest to the fastest); **predicted** is the simpy model of `sim`, calibrated from "
           "microbenchmarks only, never from the runs it is compared with; the reference SSD and the other presets "
           "are predictions with the SPEC §8 compute per step (~47 ms, a V4.1 Flash-class model), while 'Engram "
           "reads only' panels leave the rest of the model out and show how fast the reads alone can go. "
           "tokens/s are decode tokens per second of one session unless a label says otherwise; every figure's "
           "numbers are in `data/`, its inputs in `inputs/`.")
    doc.blocks[summary_at:summary_at] = [("h", 1, "Headline figures"), ("ul", head), ("p", how),
                                         ("p", "Contents: " + " · ".join(toc))]
    doc.p(f"Report written in {time.perf_counter() - t0:.0f} s.")
    md = out.root / "report.md"
    md.write_text(doc.markdown(), encoding="utf-8")
    if html_page:
        (out.root / "report.html").write_text(doc.html(), encoding="utf-8")
    return md
