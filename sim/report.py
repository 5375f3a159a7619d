"""Plotted reports: measurements, predictions and what-if studies as a folder of figures (SPEC §8, §9).

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

import csv
import html
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from engram.errors import ArgumentError

from .io import load_json, now_iso, sha256_file, write_json

__all__ = [
    "CAPACITY_SESSIONS",
    "CAPACITY_TARGET",
    "Doc",
    "build_report",
    "capacity_of",
    "default_traces",
]

#: Target tokens/s per session of the capacity figure.
CAPACITY_TARGET = 20.0
#: Concurrent sessions tried for the capacity figure.
CAPACITY_SESSIONS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
#: Thresholds of the threshold figure (a decode step reads 48 distinct rows).
THRESHOLDS = (1, 2, 4, 8, 16, 24, 32, 40, 44, 46, 47, 48, 49, 52, 64, 128, 256)
#: Reader counts (= ring depths) of the readers figure.
READERS = (1, 2, 4, 8, 16, 32, 64)
#: Row-cache sizes of the cache figures, rows.
CACHE_ROWS = (0, 64, 256, 1024, 4096, 16384, 65536)
#: Trace length (tokens) of the predicted what-if curves.
WHATIF_TOKENS = 2000
#: Steps per simulated curve point.
SIM_STEPS = 2000

_PROSE_SOURCES = ("stdlib:pydoc_data/topics.py", "stdlib:inspect.py")


def default_traces() -> List[str]:
    """Built-in trace sources present on every Python: standard-library source code and English prose.

    ``stdlib:asyncio/base_events.py`` (Python source) and
    ``stdlib:pydoc_data/topics.py`` (the English text of the language
    reference that ``pydoc`` shows), or ``stdlib:inspect.py`` where a
    distribution leaves ``pydoc_data`` out.
    """
    from .trace import CODE_SOURCE, resolve_source

    out = [CODE_SOURCE]
    for spec in _PROSE_SOURCES:
        try:
            resolve_source(spec)
        except ArgumentError:
            continue
        out.append(spec)
        break
    return out


# =====================================================================================
# the document: Markdown and HTML from one list of blocks
# =====================================================================================
class Doc:
    """A report as a list of blocks (headings, paragraphs, lists, tables, figures, code).

    :meth:`markdown` and :meth:`html` render the same blocks; inline text uses
    Markdown's ``**bold**`` and `` `code` `` only.
    """

    def __init__(self, title: str):
        self.title = title
        self.blocks: List[tuple] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.blocks.append(("table", [str(h) for h in header], [[_cell(c) for c in r] for r in rows]))

    def figure(self, path: str, caption: str, data: Optional[str] = None) -> None:
        self.blocks.append(("fig", path, caption, data))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    # ------------------------------------------------------------ rendering
    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out += ["#" * (b[1] + 1) + " " + b[2], ""]
            elif kind == "p":
                out += [b[1], ""]
            elif kind == "ul":
                out += [f"- {x}" for x in b[1]] + [""]
            elif kind == "table":
                out.append("| " + " | ".join(b[1]) + " |")
                out.append("|" + "---|" * len(b[1]))
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in b[2]]
                out.append("")
            elif kind == "fig":
                out.append(f"![{b[2]}]({b[1]})")
                out.append("")
                out.append(f"*{b[2]}*" + (f" Data: [`{b[3]}`]({b[3]})." if b[3] else ""))
                out.append("")
            elif kind == "code":
                out += ["```", b[1].rstrip("\n"), "```", ""]
        return "\n".join(out)

    def html(self) -> str:
        def inline(t: str) -> str:
            t = html.escape(t, quote=False)
            parts = t.split("`")
            t = "".join(f"<code>{x}</code>" if i % 2 else x for i, x in enumerate(parts))
            parts = t.split("**")
            return "".join(f"<b>{x}</b>" if i % 2 else x for i, x in enumerate(parts))

        out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(self.title)}</title>",
               "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
               "table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1.2em}"
               "td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}th{background:#eee}"
               "img{max-width:100%;border:1px solid #ddd}figcaption{font-style:italic;font-size:0.9em}"
               "pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;font-size:0.85em}"
               "code{background:#f3f3f3}</style></head><body>", f"<h1>{html.escape(self.title)}</h1>"]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                lvl = min(b[1] + 1, 6)
                anchor = _anchor(b[2])
                out.append(f"<h{lvl} id='{anchor}'>{inline(b[2])}</h{lvl}>")
            elif kind == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b[1]) + "</ul>")
            elif kind == "table":
                out.append("<table><tr>" + "".join(f"<th>{inline(h)}</th>" for h in b[1]) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in b[2]]
                out.append("</table>")
            elif kind == "fig":
                data = f" Data: <a href='{html.escape(b[3])}'>{html.escape(b[3])}</a>." if b[3] else ""
                out.append(f"<figure><img src='{html.escape(b[1])}' alt='{html.escape(b[2])}'>"
                           f"<figcaption>{inline(b[2])}{data}</figcaption></figure>")
            elif kind == "code":
                out.append(f"<pre>{html.escape(b[1])}</pre>")
        out.append("</body></html>")
        return "\n".join(out)


def _anchor(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        if not np.isfinite(v):
            return "-"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return "-" if v is None else str(v)


# =====================================================================================
# figures and their data
# =====================================================================================
_STYLE_SET = False


def _plt():
    """matplotlib.pyplot on the Agg backend, with the report's style."""
    global _STYLE_SET
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    if not _STYLE_SET:
        plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
                             "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 8,
                             "xtick.labelsize": 9, "ytick.labelsize": 9, "figure.titlesize": 12,
                             "axes.spines.top": False, "axes.spines.right": False})
        _STYLE_SET = True
    return plt


def _plain_log_ticks(ax) -> None:
    """Plain numbers (1, 2, 4, ..., 1,024; 200, 300) on log axes instead of powers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "log" or isinstance(axis.get_major_locator(), FixedLocator):
            continue  # linear, or ticks placed and labelled by hand
        base = getattr(axis.get_transform(), "base", 10)
        if base == 2:
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        else:
            axis.set_major_formatter(LogFormatter(base=base, labelOnlyBase=False))
            axis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False))


def _cache_axis(ax, sizes: Sequence[int]) -> List[float]:
    """A log-2 cache-size axis whose leftmost tick, "none", stands for no cache; returns the x positions."""
    nz = [c for c in sizes if c > 0]
    none_at = (min(nz) / 4) if nz else 1.0
    xs = [none_at if c == 0 else float(c) for c in sizes]
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, ["none" if c == 0 else f"{c:,}" for c in sizes])
    ax.xaxis.set_minor_locator(__import__("matplotlib.ticker", fromlist=["NullLocator"]).NullLocator())
    return xs


class _Out:
    """The report folder: figures, data tables, inputs."""

    def __init__(self, root: Path):
        self.root = root
        for sub in ("figures", "data", "inputs"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.figures: List[Tuple[str, str, str]] = []  # (figure, data, title)

    def save(self, fig, name: str, title: str) -> str:
        """Save ``fig`` as ``figures/NAME.png`` with ``title``; every visible axes must be readable.

        Raises
        ------
        RuntimeError
            An axes without x or y label, or with several labelled lines but no legend.
        """
        for ax in fig.axes:
            _plain_log_ticks(ax)
            if not ax.get_visible():
                continue
            if not ax.get_xlabel() or not ax.get_ylabel():
                raise RuntimeError(f"figure {name}: an axes lacks an axis label")
            labelled = [h for h in ax.get_legend_handles_labels()[1] if not h.startswith("_")]
            if len(labelled) > 1 and ax.get_legend() is None and not fig.legends:
                raise RuntimeError(f"figure {name}: an axes with {len(labelled)} labelled series has no legend")
        fig.suptitle(title, fontweight="bold")
        fig.tight_layout()
        rel = f"figures/{name}.png"
        fig.savefig(self.root / rel, bbox_inches="tight", pad_inches=0.15)
        _plt().close(fig)
        return rel

    def csv(self, name: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        rel = f"data/{name}.csv"
        with open(self.root / rel, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(header)
            for r in rows:
                w.writerow([repr(float(v)) if isinstance(v, (float, np.floating)) else v for v in r])
        return rel

    def add(self, doc: Doc, fig_rel: str, data_rel: str, caption: str) -> None:
        self.figures.append((fig_rel, data_rel, caption))
        doc.figure(fig_rel, caption, data_rel)


# =====================================================================================
# inputs
# =====================================================================================
@dataclass
class _Inputs:
    workdir: Optional[Path] = None
    cal: Any = None                    # sim.calibrate.Calibration
    cal_path: Optional[Path] = None
    runs: Optional[dict] = None        # runs.json
    runs_path: Optional[Path] = None
    micro: Optional[dict] = None       # microbench.json
    xc: Optional[dict] = None          # crosscheck.json
    demo: Optional[dict] = None        # demo.json
    traces: Dict[str, Any] = field(default_factory=dict)   # spec -> Trace (what-if curves)
    run_traces: Dict[str, Any] = field(default_factory=dict)  # spec -> Trace of the measured runs


def _load_inputs(workdir: Optional[Path], traces: Optional[Sequence[str]], quick: bool, progress: bool,
                 say: Callable[[str], None]) -> _Inputs:
    from .trace import Trace, load_trace

    inp = _Inputs(workdir=workdir)
    if workdir is not None:
        if not workdir.is_dir():
            raise ArgumentError(f"{workdir}: no such measurement folder")
        cal_p, runs_p, micro_p = workdir / "calibration.json", workdir / "runs.json", workdir / "microbench.json"
        xc_p, demo_p = workdir / "crosscheck.json", workdir / "demo.json"
        if cal_p.is_file():
            from .calibrate import Calibration

            inp.cal, inp.cal_path = Calibration.load(cal_p), cal_p
        if runs_p.is_file():
            inp.runs, inp.runs_path = load_json(runs_p, "decode_runs"), runs_p
        if micro_p.is_file():
            inp.micro = load_json(micro_p, "microbench")
        if demo_p.is_file():
            inp.demo = load_json(demo_p)
        if xc_p.is_file():
            inp.xc = load_json(xc_p, "crosscheck")
        elif inp.cal is not None and inp.runs is not None:
            from .crosscheck import crosscheck

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


def _label(spec: str) -> str:
    from .schema import trace_label

    return trace_label(spec)


def _dev_label(spec: str) -> str:
    if spec == "calibrated" or spec.startswith("calibrated:"):
        return "this machine" + (f" ({spec.split(':', 1)[1]})" if ":" in spec else "")
    if spec.startswith("ssd:"):
        kv = dict(x.split("=", 1) for x in spec[4:].split(",") if "=" in x)
        return f"SSD {kv.get('qd1_us', '?')} us, {float(kv.get('iops', 0)) / 1000:g}k IOPS"
    return spec


# =====================================================================================
# simulation helpers
# =====================================================================================
def _simulate(trace, device, policy, compute, *, steps: int, seed: int = 0, hash_time: float = 0.0, sessions=1,
              start_spread: float = 0.0):
    from .decode import simulate_decode

    return simulate_decode(trace, device, policy, compute, sessions=sessions, steps=steps, mode="fast", seed=seed,
                           hash_time=hash_time, start_spread=start_spread, bins=4)


def _reference_compute():
    from .decode import Compute, seed_reproduction

    return Compute(seed_reproduction()["compute_ms"] * 1e-3)


def _policy(threshold: int, backend: str, readers: int, cache_rows: int = 0):
    from .decode import Policy

    return Policy(threshold=int(threshold), backend=backend, readers=int(readers), ring_depth=int(readers),
                  cache_rows=int(cache_rows))


def _xc_rows(inp: _Inputs) -> List[dict]:
    return list(inp.xc["rows"]) if inp.xc else []


def _main_trace(inp: _Inputs) -> Optional[str]:
    """The trace with the most measured configurations without extra compute."""
    rows = [r for r in _xc_rows(inp) if r["compute"] == "none"] or _xc_rows(inp)
    if not rows:
        return None
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r["trace"]] = counts.get(r["trace"], 0) + 1
    return max(counts, key=lambda k: (counts[k], k == "stdlib:asyncio/base_events.py"))


def _machine_name(inp: _Inputs) -> str:
    m = (inp.cal.machine if inp.cal is not None else None) or (inp.runs or {}).get("machine") or {}
    cpu = m.get("cpu") or "this machine"
    return f"{cpu} x{m.get('cores', '?')}"


def _backends(inp: _Inputs) -> List[str]:
    return [b for b in ("io_uring", "pread") if inp.cal is not None and b in inp.cal.devices]


def _measured_steps(inp: _Inputs, trace: str) -> int:
    steps = [r["steps"] for r in _xc_rows(inp) if r["trace"] == trace]
    return int(max(set(steps), key=steps.count)) if steps else WHATIF_TOKENS


# =====================================================================================
# sections
# =====================================================================================
def _section_seed(doc: Doc, out: _Out, quick: bool) -> dict:
    from .decode import SEED_REFERENCE, seed_reproduction

    r = seed_reproduction()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    groups = ["serial reads\n(threshold 256)", "concurrent reads\n(threshold 8, 16 readers)"]
    ref = [SEED_REFERENCE["serial_tokens_per_s"], SEED_REFERENCE["concurrent_tokens_per_s"]]
    sim = [r["serial_tokens_per_s"], r["predicted_tokens_per_s"]]
    x = np.arange(2)
    b1 = ax.bar(x - 0.18, ref, 0.36, label="reference engine, measured (SPEC §8)", color="#4C72B0")
    b2 = ax.bar(x + 0.18, sim, 0.36, label="simulator (serial: fitted; concurrent: predicted)", color="#DD8452")
    for bars in (b1, b2):
        for bar in bars:
            ax.annotate(f"{bar.get_height():.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, groups)
    ax.set_ylabel("decode tokens/s (one session)")
    ax.set_xlabel("read policy (48 rows a step, Apple M3 Ultra SSD)")
    ax.set_ylim(0, max(ref + sim) * 1.18)
    ax.legend(loc="lower right")
    rel = out.save(fig, "seed_reproduction", "SPEC §8 seed reproduction: threshold 256 -> 8")
    data = out.csv("seed_reproduction", ["policy", "reference_tokens_per_s", "simulated_tokens_per_s", "compute_ms"],
                   [["serial (threshold 256)", ref[0], sim[0], r["compute_ms"]],
                    ["concurrent (threshold 8, 16 readers)", ref[1], sim[1], r["compute_ms"]]])
    doc.h(1, "Seed reproduction (SPEC §8, §9)")
    doc.p(f"The reference engine decoded at {ref[0]} tokens/s reading its 48 rows a step serially and at "
          f"{ref[1]} tokens/s reading them with 16 readers (serial 107.9 us a row, concurrent 12.8 us a row on "
          f"an Apple M3 Ultra SSD). The simulator's compute per step is fitted so that threshold 256 gives "
          f"{ref[0]} tokens/s ({r['compute_ms']:.2f} ms a step); with nothing else changed it predicts "
          f"**{r['predicted_tokens_per_s']:.2f} tokens/s** for threshold 8 ({r['error'] * 100:+.2f}% from "
          f"{ref[1]}; speed-up {r['speedup'] * 100:+.1f}% vs the reference's {r['reference_speedup'] * 100:+.1f}%).")
    out.add(doc, rel, data, "Seed reproduction: reference figures of SPEC §8 and the simulator's, tokens/s.")
    return r


def _section_threshold(doc: Doc, out: _Out, inp: _Inputs, ref_compute, quick: bool) -> None:
    from .device import preset

    plt = _plt()
    steps = 400 if quick else SIM_STEPS
    thr = THRESHOLDS if not quick else (4, 8, 32, 47, 48, 49, 64, 256)
    rows_csv = []
    have_cal = inp.cal is not None
    fig, axes = plt.subplots(1, 2 if have_cal else 1, figsize=(13 if have_cal else 7, 4.8), squeeze=False)
    axes = axes[0]
    doc.h(1, "Tokens/s by threshold")
    doc.p("A batch with at least `threshold` distinct rows is read concurrently, smaller ones serially (SPEC §8). "
          "A decode step reads 48 distinct rows (24 columns of two tables, each column its own row range), so "
          "without a cache every threshold up to 48 reads concurrently and every threshold above reads serially: "
          "the curve is a step at 48. With a row cache a step reads only its misses, fewer than 48, and the "
          "threshold decides how many steps still read concurrently.")
    if have_cal:
        ax = axes[0]
        main = _main_trace(inp)
        xc = [r for r in _xc_rows(inp) if r["compute"] == "none"]
        conc = [r for r in xc if not r["serial"] and r["trace"] == main]
        pairs: Dict[tuple, set] = {}
        for r in conc:
            pairs.setdefault((r["backend"], r["readers"]), set()).add(r["threshold"])
        if pairs:
            be, k = max(pairs, key=lambda p: (len(pairs[p]), p[1], p[0] == "pread"))
        else:
            be, k = _backends(inp)[0], 16
        comp = inp.cal.compute_model("none")
        traces = [main] if main else list(inp.traces)
        traces += [t for t in inp.traces if t not in traces][:2]
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for ti, spec in enumerate(traces):
            if spec not in inp.traces and spec not in inp.run_traces:
                continue
            tr = inp.run_traces.get(spec, inp.traces.get(spec))
            tr = tr.head(_measured_steps(inp, spec)) if spec in inp.run_traces else tr
            ys = []
            for t in thr:
                r = _simulate(tr, inp.cal.device(be), _policy(t, be, k), comp, steps=steps, hash_time=inp.cal.hash_s)
                ys.append(r.tokens_per_s)
                rows_csv.append(["this machine", _label(spec), be, k, t, 0, "predicted", r.tokens_per_s, "", ""])
            c = colors[ti % len(colors)]
            ax.plot(thr, ys, "-", color=c, label=f"{_label(spec)}: predicted")
            meas = [r for r in xc if r["trace"] == spec and (r["serial"] or (r["backend"], r["readers"]) == (be, k))]
            if meas:
                mx = [r["threshold"] for r in meas]
                my = [r["measured"]["tokens_per_s"] for r in meas]
                lo = [r["measured"]["tokens_per_s"] - min(r["measured"]["tokens_per_s_runs"]) for r in meas]
                hi = [max(r["measured"]["tokens_per_s_runs"]) - r["measured"]["tokens_per_s"] for r in meas]
                ax.errorbar(mx, my, yerr=[lo, hi], fmt="o", color=c, capsize=3,
                            label=f"{_label(spec)}: measured (median, min-max of repeats)")
                for r in meas:
                    rows_csv.append(["this machine", _label(spec), r["backend"], r["readers"], r["threshold"], 0,
                                     "measured", r["measured"]["tokens_per_s"],
                                     min(r["measured"]["tokens_per_s_runs"]), max(r["measured"]["tokens_per_s_runs"])])
        ax.axvline(48.5, color="gray", ls=":", lw=1)
        ax.annotate("48 rows a step", (48.5, ax.get_ylim()[1]), fontsize=8, ha="right", va="top", color="gray",
                    xytext=(-3, -3), textcoords="offset points")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("threshold (distinct rows for a concurrent read, log scale)")
        ax.set_ylabel("decode tokens/s (one session)")
        ax.set_title(f"This machine ({be}, {k} readers; Engram reads only, no model compute)")
        ax.legend(loc="best")
    ax = axes[-1]
    seed = preset("seed-apple-m3-ultra")
    tr = next(iter(inp.traces.values()))
    for cache, ls in ((0, "-"), (4096, "--")):
        ys = []
        for t in thr:
            r = _simulate(tr, seed, _policy(t, "pread", 16, cache), ref_compute, steps=steps)
            ys.append(r.tokens_per_s)
            rows_csv.append(["seed-apple-m3-ultra", tr.source, "pread", 16, t, cache, "predicted", r.tokens_per_s,
                             "", ""])
        ax.plot(thr, ys, ls, marker=".", label=f"{'no row cache' if not cache else f'{cache}-row LRU cache'}")
    ax.axvline(48.5, color="gray", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("threshold (distinct rows for a concurrent read, log scale)")
    ax.set_ylabel("decode tokens/s (one session)")
    ax.set_title(f"Reference SSD, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms a step), 16 readers, "
                 f"{_label(tr.source)}", fontsize=10)
    ax.legend(loc="best")
    rel = out.save(fig, "threshold", "Decode tokens/s by read threshold")
    data = out.csv("threshold", ["device", "trace", "backend", "readers", "threshold", "cache_rows", "kind",
                                 "tokens_per_s", "min", "max"], rows_csv)
    out.add(doc, rel, data, "Tokens/s by threshold: predicted lines, measured points (median of the repeats, bars "
                            "from the slowest to the fastest repeat).")


def _section_readers(doc: Doc, out: _Out, inp: _Inputs, ref_compute, quick: bool) -> None:
    from .device import preset, preset_names

    plt = _plt()
    steps = 400 if quick else SIM_STEPS
    readers = READERS if not quick else (1, 4, 16)
    rows_csv = []
    have_cal = inp.cal is not None
    doc.h(1, "Tokens/s by readers (queue depth)")
    doc.p("With threshold 8 a step's 48 rows are read by `readers` pread threads or an io_uring ring of that "
          "depth: the queue depth of the batch. More readers cut a step's read time until the device saturates "
          "or the per-batch cost of waking the readers dominates.")
    fig, axes = plt.subplots(1, 2 if have_cal else 1, figsize=(13 if have_cal else 7, 4.8), squeeze=False)
    axes = axes[0]
    if have_cal:
        ax = axes[0]
        main = _main_trace(inp) or next(iter(inp.traces))
        tr = inp.run_traces.get(main, inp.traces.get(main))
        if main in inp.run_traces:
            tr = tr.head(_measured_steps(inp, main))
        comp = inp.cal.compute_model("none")
        xc = [r for r in _xc_rows(inp) if r["compute"] == "none" and r["trace"] == main]
        colors = {"pread": "#4C72B0", "io_uring": "#DD8452"}
        for be in _backends(inp):
            ys = []
            for k in readers:
                r = _simulate(tr, inp.cal.device(be), _policy(8, be, k), comp, steps=steps, hash_time=inp.cal.hash_s)
                ys.append(r.tokens_per_s)
                rows_csv.append(["this machine", _label(main), be, k, 8, "predicted", r.tokens_per_s, "", ""])
            ax.plot(readers, ys, "-", color=colors[be], label=f"{be}: predicted")
            meas = sorted((r for r in xc if not r["serial"] and r["backend"] == be), key=lambda r: r["readers"])
            if meas:
                m = [r["measured"] for r in meas]
                ax.errorbar([r["readers"] for r in meas], [x["tokens_per_s"] for x in m],
                            yerr=[[x["tokens_per_s"] - min(x["tokens_per_s_runs"]) for x in m],
                                  [max(x["tokens_per_s_runs"]) - x["tokens_per_s"] for x in m]],
                            fmt="o", color=colors[be], capsize=3, label=f"{be}: measured")
                for r in meas:
                    rows_csv.append(["this machine", _label(main), be, r["readers"], r["threshold"], "measured",
                                     r["measured"]["tokens_per_s"], min(r["measured"]["tokens_per_s_runs"]),
                                     max(r["measured"]["tokens_per_s_runs"])])
        ser = [r for r in xc if r["serial"]]
        if ser:
            y = float(np.median([r["measured"]["tokens_per_s"] for r in ser]))
            yp = float(np.median([r["predicted"]["tokens_per_s"] for r in ser]))
            ax.axhline(y, color="gray", ls="--", lw=1.2, label=f"serial (threshold 256): measured {y:.0f}")
            ax.axhline(yp, color="gray", ls=":", lw=1.2, label=f"serial: predicted {yp:.0f}")
            rows_csv.append(["this machine", _label(main), "serial", 1, 256, "measured", y, "", ""])
            rows_csv.append(["this machine", _label(main), "serial", 1, 256, "predicted", yp, "", ""])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("readers = io_uring ring depth = queue depth of a batch (log scale)")
        ax.set_ylabel("decode tokens/s (one session)")
        ax.set_title(f"This machine, {_label(main)} (Engram reads only, no model compute)")
        ax.legend(loc="best")
    ax = axes[-1]
    tr = next(iter(inp.traces.values()))
    devs = [n for n in preset_names()]
    for name in devs:
        try:
            dev = preset(name)
        except ArgumentError:
            continue
        ys = []
        for k in readers:
            r = _simulate(tr, dev, _policy(8, "pread", k), ref_compute, steps=steps)
            ys.append(r.tokens_per_s)
            rows_csv.append([name, _label(tr.source), "any", k, 8, "predicted", r.tokens_per_s, "", ""])
        ax.plot(readers, ys, "-o", ms=4, label=f"{name} (threshold 8)")
        r = _simulate(tr, dev, _policy(256, "pread", 1), ref_compute, steps=steps)
        ax.axhline(r.tokens_per_s, ls=":", lw=1, color=ax.lines[-1].get_color(), label=f"{name}: serial")
        rows_csv.append([name, _label(tr.source), "serial", 1, 256, "predicted", r.tokens_per_s, "", ""])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("readers = queue depth of a batch (log scale)")
    ax.set_ylabel("decode tokens/s (one session)")
    ax.set_title(f"Device presets, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms a step), predicted", fontsize=10)
    ax.legend(loc="best")
    rel = out.save(fig, "readers", "Decode tokens/s by readers (queue depth)")
    data = out.csv("readers", ["device", "trace", "backend", "readers", "threshold", "kind", "tokens_per_s", "min",
                               "max"], rows_csv)
    out.add(doc, rel, data, "Tokens/s by readers: predicted lines, measured points with the min-max of repeats; "
                            "horizontal lines: serial reads.")
    _device_figure(doc, out, inp)


def _device_figure(doc: Doc, out: _Out, inp: _Inputs) -> None:
    from .device import preset, preset_names

    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.6))
    rows_csv = []
    devs: List[Tuple[str, Any]] = []
    if inp.cal is not None:
        devs += [(f"this machine, engine {be}", inp.cal.devices[be]) for be in _backends(inp)]
        if inp.cal.fio_device is not None:
            devs.append(("this machine, fio 4 KiB", inp.cal.fio_device))
    for n in preset_names():
        try:
            devs.append((n, preset(n)))
        except ArgumentError:
            continue
    for name, dev in devs:
        qs = [q for q in dev.depths() if q <= 256]
        lat = [dev.mean_latency(q) * 1e6 for q in qs]
        iops = [q / (v * 1e-6) for q, v in zip(qs, lat)]
        a1.plot(qs, lat, "-o", ms=3, label=name)
        a2.plot(qs, iops, "-o", ms=3, label=name)
        rows_csv += [[name, q, v, i] for q, v, i in zip(qs, lat, iops)]
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("queue depth (reads in flight)")
        a.legend(loc="best")
    a1.set_ylabel("mean latency of one read (us)")
    a1.set_title("Read latency by queue depth")
    a2.set_ylabel("reads per second (IOPS)")
    a2.set_title("Throughput by queue depth (Little's law: depth / mean latency)")
    rel = out.save(fig, "devices", "Device models: read latency and IOPS by queue depth")
    data = out.csv("devices", ["device", "queue_depth", "mean_latency_us", "iops"], rows_csv)
    out.add(doc, rel, data, "The device models behind the predictions: this machine's as calibrated from the "
                            "engine's own reads (and fio's, for reference), and the presets.")


def _section_cache(doc: Doc, out: _Out, inp: _Inputs, ref_compute, quick: bool) -> None:
    from .device import preset
    from .trace import lru_hit_rate, reuse_stats

    plt = _plt()
    steps = 400 if quick else SIM_STEPS
    sizes = CACHE_ROWS if not quick else (0, 256, 4096)
    doc.h(1, "Reuse and row caches")
    rows_csv, hit_rows = [], []
    reuse = {}
    for spec, tr in inp.traces.items():
        st = reuse_stats(tr)
        reuse[spec] = st
    doc.p("The engine never caches the table (SPEC §8: the win is concurrency, not caching). How much would a "
          "per-session LRU row cache buy? The share of row reads that repeat an earlier row of the session is "
          "the most any cache can serve:")
    doc.table(["trace", "tokens", "row reads", "repeat an earlier row", "2-gram", "3-gram", "4-gram"],
              [[_label(s), st.tokens, st.reads, f"{st.reuse_rate * 100:.1f}%",
                *[f"{st.by_order.get(o, 0) * 100:.1f}%" for o in (2, 3, 4)]] for s, st in reuse.items()])
    have_cal = inp.cal is not None
    ncol = 3 if have_cal else 2
    fig, axes = plt.subplots(1, ncol, figsize=(5.2 * ncol, 4.6))
    ax = axes[0]
    for spec, tr in inp.traces.items():
        xs = [c for c in sizes if c > 0]
        hr = [lru_hit_rate(tr, c) for c in xs]
        line, = ax.plot(xs, [h * 100 for h in hr], "-o", ms=4, label=f"{_label(spec)}: LRU hit rate")
        ax.axhline(reuse[spec].reuse_rate * 100, color=line.get_color(), ls=":", lw=1,
                   label=f"{_label(spec)}: reuse rate {reuse[spec].reuse_rate * 100:.1f}% (unbounded cache)")
        hit_rows += [[_label(spec), c, h, reuse[spec].reuse_rate] for c, h in zip(xs, hr)]
    _cache_axis(ax, [c for c in sizes if c > 0])
    ax.set_xlabel("cache size per session (rows of 264 B, log scale)")
    ax.set_ylabel("row reads served by the cache (%)")
    ax.set_title(f"Hit rate by cache size ({next(iter(inp.traces.values())).steps} tokens)")
    ax.legend(loc="best")

    panels = []
    if have_cal:
        be = _backends(inp)[0]
        panels.append(("this machine", inp.cal.device(be), inp.cal.compute_model("none"), inp.cal.hash_s, be,
                       f"This machine ({be}, Engram reads only)"))
    panels.append(("seed-apple-m3-ultra", preset("seed-apple-m3-ultra"), ref_compute, 0.0, "pread",
                   f"Reference SSD, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms)"))
    pts = []  # (panel, trace, threshold, hit rate, tokens/s)
    for pi, (name, dev, comp, hs, be, title) in enumerate(panels):
        ax = axes[1 + pi]
        for spec, tr in inp.traces.items():
            for thr, ls in ((8, "-"), (256, "--")):
                ys = []
                for c in sizes:
                    r = _simulate(tr, dev, _policy(thr, be, 16, c), comp, steps=min(steps, tr.steps), hash_time=hs)
                    ys.append(r.tokens_per_s)
                    rows_csv.append([name, _label(spec), be, 16, thr, c, r.cache_hit_rate, r.tokens_per_s])
                    pts.append((name, spec, thr, r.cache_hit_rate, r.tokens_per_s))
                ax.plot(_cache_axis(ax, sizes), ys, ls, marker="o", ms=3,
                        label=f"{_label(spec)}, {'threshold 8' if thr == 8 else 'serial (256)'}")
        ax.set_xlabel("cache size per session (rows of 264 B, log scale)")
        ax.set_ylabel("decode tokens/s (one session)")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="best")
    rel = out.save(fig, "cache", "What a row cache buys: hit rate and tokens/s by cache size")
    data = out.csv("cache", ["device", "trace", "backend", "readers", "threshold", "cache_rows", "cache_hit_rate",
                             "tokens_per_s"], rows_csv)
    out.csv("cache_hit_rate", ["trace", "cache_rows", "lru_hit_rate", "reuse_rate"], hit_rows)
    out.add(doc, rel, data, "Row cache per session: LRU hit rate (dotted: the reuse rate, the limit of an "
                            "unbounded cache) and predicted tokens/s by cache size, threshold 8 (16 readers) and "
                            "serial.")
    # tokens/s against the reuse actually served
    fig, axes2 = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.6), squeeze=False)
    rows2 = []
    for pi, (name, *_rest, title) in enumerate(panels):
        ax = axes2[0][pi]
        for spec in inp.traces:
            for thr, mk in ((8, "o"), (256, "s")):
                sel = sorted((p for p in pts if p[0] == name and p[1] == spec and p[2] == thr), key=lambda p: p[3])
                if not sel:
                    continue
                base = sel[0][4]
                ax.plot([p[3] * 100 for p in sel], [(p[4] / base - 1) * 100 for p in sel], "-" + mk, ms=4,
                        label=f"{_label(spec)}, {'threshold 8' if thr == 8 else 'serial (256)'}")
                rows2 += [[name, _label(spec), thr, p[3], p[4], p[4] / base - 1] for p in sel]
        ax.set_xlabel("row reads served by the cache (%)")
        ax.set_ylabel("tokens/s gain over no cache (%)")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="best")
    rel = out.save(fig, "reuse", "Tokens/s gain by reuse served from a row cache")
    data = out.csv("reuse", ["device", "trace", "threshold", "cache_hit_rate", "tokens_per_s", "gain"], rows2)
    out.add(doc, rel, data, "Tokens/s gain against the share of reads a cache serves (points: the cache sizes "
                            "above). Serial reads gain in proportion; concurrent reads gain less, since fewer rows "
                            "still take a round of reads.")


def _section_cdf(doc: Doc, out: _Out, inp: _Inputs, ref_compute, quick: bool) -> None:
    from .decode import Compute
    from .device import preset
    from .schema import RunConfig
    from .trace import Trace

    plt = _plt()
    doc.h(1, "Step-latency CDFs")
    rows_csv = []
    xc = _xc_rows(inp)
    if inp.cal is not None and inp.runs is not None and xc:
        doc.p("Distribution of the time of a decode step (hash + read of 48 rows + the step's compute), measured "
              "(every step of every repeat) and predicted by the calibrated simulator for the same configuration.")
        main = _main_trace(inp)
        pick: List[dict] = []

        def add(cands):
            for r in cands:
                if r not in pick:
                    pick.append(r)
                    return

        base = [r for r in xc if r["trace"] == main and r["compute"] == "none"] or xc
        add([r for r in base if r["serial"]])
        add(sorted((r for r in base if not r["serial"] and r["backend"] == "pread"),
                   key=lambda r: (abs(r["readers"] - 4), r["readers"])))
        add(sorted((r for r in base if not r["serial"] and r["backend"] == "io_uring"), key=lambda r: -r["readers"]))
        add(sorted((r for r in xc if r["compute"] != "none"), key=lambda r: (r["serial"], r["compute"] == "mixer")))
        add([r for r in xc if r["trace"] != main])
        add(base)
        pick = pick[:4]
        runs_by: Dict[str, List[dict]] = {}
        for r in inp.runs["runs"]:
            runs_by.setdefault(r["config"], []).append(r)
        n = len(pick)
        cols = 2 if n > 1 else 1
        fig, axes = plt.subplots((n + 1) // 2, cols, figsize=(6.5 * cols, 4.0 * ((n + 1) // 2)), squeeze=False)
        for i, row in enumerate(pick):
            ax = axes[i // cols][i % cols]
            meas = np.sort(np.concatenate([np.asarray(r["step_us"], float) for r in runs_by[row["key"]]])) / 1e3
            cfg = RunConfig.from_dict(row)
            tr = inp.run_traces.get(cfg.trace)
            if tr is None:
                continue
            # the stretches of the trace the runs read, one after the other (as the cross-check replays them)
            starts = [int(r.get("start", 0)) for r in runs_by[row["key"]]]
            tr = Trace(np.concatenate([tr.rows[a:a + cfg.steps] for a in starts]),
                       np.concatenate([tr.tokens[a:a + cfg.steps] for a in starts]), np.zeros(1, np.int64),
                       tr.layer_ids, tr.heads, tr.source)
            steps = 500 if quick else max(tr.steps, SIM_STEPS)
            r = _simulate(tr, inp.cal.device(cfg.backend, cfg.compute),
                          _policy(cfg.threshold, cfg.backend, cfg.readers), inp.cal.compute_model(cfg.compute),
                          steps=steps, hash_time=inp.cal.hash_s)
            pred = np.sort(r.step_latencies.reshape(-1)) * 1e3
            ym = np.arange(1, meas.size + 1) / meas.size
            yp = np.arange(1, pred.size + 1) / pred.size
            ax.plot(meas, ym, "-", lw=1.8, label=f"measured ({len(runs_by[row['key']])} runs x {cfg.steps} steps)")
            ax.plot(pred, yp, "--", lw=1.8, label=f"predicted ({pred.size} simulated steps)")
            ax.set_xscale("log")
            ax.set_xlabel("step latency (ms, log scale)")
            ax.set_ylabel("fraction of steps")
            pol = "serial" if cfg.serial else f"{cfg.backend} x{cfg.readers}"
            ax.set_title(f"{_label(cfg.trace)}, {pol}, compute {cfg.compute}", fontsize=10)
            ax.legend(loc="lower right")
            for p in (1, 5, 10, 25, 50, 75, 90, 95, 99):
                rows_csv.append([row["key"], p, float(np.percentile(meas, p)), float(np.percentile(pred, p))])
        for j in range(n, ((n + 1) // 2) * cols):
            axes[j // cols][j % cols].set_visible(False)
        rel = out.save(fig, "step_cdf", "Step-latency CDFs: measured vs predicted")
        data = out.csv("step_cdf", ["config", "percentile", "measured_ms", "predicted_ms"], rows_csv)
        out.add(doc, rel, data, "Cumulative distribution of step latency, measured (solid) and predicted (dashed).")
        return
    doc.p("No measured runs were given: predicted step-latency distributions on the reference SSD with the SPEC §8 "
          "compute, serial vs concurrent reads.")
    plt_fig, ax = plt.subplots(figsize=(7.5, 4.6))
    tr = next(iter(inp.traces.values()))
    dev = preset("seed-apple-m3-ultra")
    comp = Compute(ref_compute.mean, "gamma", 0.05)
    for thr, k, lab in ((256, 16, "serial (threshold 256)"), (8, 4, "threshold 8, 4 readers"),
                        (8, 16, "threshold 8, 16 readers")):
        r = _simulate(tr, dev, _policy(thr, "pread", k), comp, steps=400 if quick else SIM_STEPS)
        x = np.sort(r.step_latencies.reshape(-1)) * 1e3
        ax.plot(x, np.arange(1, x.size + 1) / x.size, label=lab)
        rows_csv += [[lab, p, float(np.percentile(x, p)), ""] for p in (1, 5, 10, 25, 50, 75, 90, 95, 99)]
    ax.set_xlabel("step latency (ms)")
    ax.set_ylabel("fraction of steps")
    ax.legend(loc="lower right")
    rel = out.save(plt_fig, "step_cdf", "Step-latency CDFs on the reference SSD (predicted)")
    data = out.csv("step_cdf", ["config", "percentile", "predicted_ms", ""], rows_csv)
    out.add(doc, rel, data, "Predicted step-latency CDFs (compute gamma-distributed, CV 0.05).")


def _section_crosscheck(doc: Doc, out: _Out, inp: _Inputs) -> None:
    from .crosscheck import markdown_table

    plt = _plt()
    xc = inp.xc
    doc.h(1, "Predicted vs measured")
    if not xc:
        doc.p("No cross-check: run `engram measure`, `engram calibrate` and `engram crosscheck` on a folder and "
              "pass it to `engram report`.")
        return
    s, t = xc["summary"], xc["targets"]
    doc.p(f"Every measured configuration predicted by the simulator calibrated from microbenchmarks only (the "
          f"calibration never saw a decode run). tokens/s: median |error| "
          f"**{s['tokens_per_s']['median_abs_error'] * 100:.1f}%** "
          f"(target <= {t['tokens_per_s_median_abs'] * 100:g}%), "
          f"max {s['tokens_per_s']['max_abs_error'] * 100:.1f}% (target <= {t['tokens_per_s_max_abs'] * 100:g}%); "
          f"step p50 max |error| {s['step_p50']['max_abs_error'] * 100:.1f}% (target <= "
          f"{t['step_p50_max_abs'] * 100:g}%). The spread of repeated measurements of one configuration "
          f"((max - min) / median) has median {s['spread']['tokens_per_s_median'] * 100:.1f}% and max "
          f"{s['spread']['tokens_per_s_max'] * 100:.1f}%: errors inside that spread are noise of the machine, "
          f"not of the model. {s['within_spread']} of {s['configurations']} predictions fall inside the "
          f"measured range. Verdict: **{'PASS' if s['passed'] else 'FAIL'}**.")
    bg = [r["background"] for r in (inp.runs or {}).get("runs", []) if isinstance(r.get("background"), dict)]
    if bg:
        cpu = np.array([float(b.get("cpu", 0.0)) for b in bg]) * 100
        io = np.array([float(b.get("disk_iops", 0.0)) for b in bg])
        waited = (inp.runs or {}).get("waited_s")
        doc.p(f"Other processes while the runs were measured: CPU median {np.median(cpu):.0f}% of the machine "
              f"(max {cpu.max():.0f}%), disk requests median {np.median(io):.0f}/s (max {io.max():.0f}/s)"
              + (f"; {waited:.0f} s were spent waiting for a quiet machine" if waited else "")
              + ". A shared machine's load widens the spread of the repeats and moves the microbenchmarks the "
                "calibration is fitted from.")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    rows = xc["rows"]
    m = np.array([r["measured"]["tokens_per_s"] for r in rows])
    p = np.array([r["predicted"]["tokens_per_s"] for r in rows])
    lo = np.array([min(r["measured"]["tokens_per_s_runs"]) for r in rows])
    hi = np.array([max(r["measured"]["tokens_per_s_runs"]) for r in rows])
    lim = (min(m.min(), p.min(), lo.min()) * 0.8, max(m.max(), p.max(), hi.max()) * 1.25)
    xs = np.geomspace(*lim, 50)
    ax.fill_between(xs, xs * (1 - t["tokens_per_s_median_abs"]), xs * (1 + t["tokens_per_s_median_abs"]),
                    color="green", alpha=0.15, label=f"+-{t['tokens_per_s_median_abs'] * 100:g}% band")
    ax.plot(xs, xs * (1 + t["tokens_per_s_max_abs"]), "g:", lw=1, label=f"+-{t['tokens_per_s_max_abs'] * 100:g}%")
    ax.plot(xs, xs * (1 - t["tokens_per_s_max_abs"]), "g:", lw=1)
    ax.plot(xs, xs, "k-", lw=0.8, label="predicted = measured")
    kinds = {}
    for r in rows:
        kinds.setdefault("serial" if r["serial"] else r["backend"], []).append(r)
    markers = {"serial": "s", "pread": "o", "io_uring": "^"}
    for kind, rs in kinds.items():
        idx = [rows.index(r) for r in rs]
        ax.errorbar(m[idx], p[idx], xerr=[m[idx] - lo[idx], hi[idx] - m[idx]], fmt=markers.get(kind, "o"), ms=5,
                    capsize=2, label=f"{kind} ({len(rs)} configurations)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("measured tokens/s (median of repeats; bars: min-max)")
    ax.set_ylabel("predicted tokens/s")
    ax.set_title("Every measured configuration")
    ax.legend(loc="upper left")
    err = np.array([r["error"]["tokens_per_s"] for r in rows]) * 100
    spr = np.array([r["spread"]["tokens_per_s"] for r in rows]) * 100
    order = np.argsort(err)
    y = np.arange(len(rows))
    ax2.barh(y, err[order], color=["#4C72B0" if abs(e) <= t["tokens_per_s_max_abs"] * 100 else "#C44E52"
                                   for e in err[order]], label="prediction error")
    ax2.errorbar(np.zeros(len(rows)), y, xerr=spr[order] / 2, fmt="none", ecolor="gray", capsize=2,
                 label="half the spread of repeats")
    ax2.axvspan(-t["tokens_per_s_median_abs"] * 100, t["tokens_per_s_median_abs"] * 100, color="green", alpha=0.12)
    ax2.set_yticks(y, [_short_key(rows[i]) for i in order], fontsize=7)
    ax2.set_xlabel("tokens/s error: predicted / measured - 1 (%)")
    ax2.set_ylabel("configuration (trace, reads, compute)")
    ax2.set_title("Error by configuration")
    ax2.legend(loc="lower right")
    rel = out.save(fig, "predicted_vs_measured", "Predicted vs measured decode tokens/s, with the error band")
    data = out.csv("predicted_vs_measured",
                   ["config", "trace", "threshold", "backend", "readers", "compute", "steps", "repeats",
                    "measured_tokens_per_s", "measured_min", "measured_max", "predicted_tokens_per_s", "error",
                    "spread", "measured_step_p50_ms", "predicted_step_p50_ms", "measured_step_p95_ms",
                    "predicted_step_p95_ms"],
                   [[r["key"], r["trace_label"], r["threshold"], r["backend"], r["readers"], r["compute"], r["steps"],
                     r["repeats"], r["measured"]["tokens_per_s"], min(r["measured"]["tokens_per_s_runs"]),
                     max(r["measured"]["tokens_per_s_runs"]), r["predicted"]["tokens_per_s"],
                     r["error"]["tokens_per_s"], r["spread"]["tokens_per_s"], r["measured"]["step_p50_ms"],
                     r["predicted"]["step_p50_ms"], r["measured"]["step_p95_ms"], r["predicted"]["step_p95_ms"]]
                    for r in rows])
    out.add(doc, rel, data, "Left: predicted against measured tokens/s (log-log) with the +-5% band. Right: the "
                            "error of each configuration, next to half the spread of its repeats.")
    doc.p("The cross-check table (medians over the repeats; spread: (max - min) / median of the repeats' "
          "tokens/s; error: predicted / measured - 1):")

    def pct(x: float) -> str:
        return f"{x * 100:+.1f}%"

    doc.table(["trace", "threshold", "reads", "readers", "compute", "steps x repeats", "tokens/s measured",
               "spread", "predicted", "error", "step p50 ms measured", "predicted", "error",
               "step p95 ms measured", "predicted", "error"],
              [[r["trace_label"], r["threshold"], "serial" if r["serial"] else r["backend"],
                "-" if r["serial"] else r["readers"], r["compute"], f"{r['steps']} x{r['repeats']}",
                r["measured"]["tokens_per_s"], f"{r['spread']['tokens_per_s'] * 100:.1f}%",
                r["predicted"]["tokens_per_s"], pct(r["error"]["tokens_per_s"]), r["measured"]["step_p50_ms"],
                r["predicted"]["step_p50_ms"], pct(r["error"]["step_p50"]), r["measured"]["step_p95_ms"],
                r["predicted"]["step_p95_ms"], pct(r["error"]["step_p95"])] for r in rows])
    doc.p(markdown_table(xc).split("\n\n", 1)[1].replace("\n", " "))


def _short_key(r: Mapping) -> str:
    pol = "serial" if r["serial"] else f"{r['backend']} x{r['readers']}"
    return f"{r['trace_label'][:14]} {pol} {r['compute']}"


def capacity_of(rows: Sequence[Mapping], target: float, y: str = "session_tokens_per_s_min") -> Tuple[int, bool]:
    """Largest session count whose sessions all reach ``target`` tokens/s, and whether it is only a lower bound.

    ``rows`` are sweep rows of one device (``sessions`` and ``y``).  Counting
    from one session up, the first count below the target ends the search;
    the capacity is the last count before it (0 when one session misses the
    target).  The bound flag is true when every count met the target.
    """
    cap = 0
    for r in sorted(rows, key=lambda r: r["sessions"]):
        if r[y] >= target:
            cap = int(r["sessions"])
        else:
            return cap, False
    return cap, True


def _section_capacity(doc: Doc, out: _Out, inp: _Inputs, ref_compute, *, target: float, compute_ms: Optional[float],
                      sessions: Sequence[int], quick: bool, jobs: Optional[int], progress: bool) -> None:
    from .device import preset_names, preset
    from .sweep import AXES, run_points

    plt = _plt()
    comp_ms = float(compute_ms) if compute_ms is not None else ref_compute.mean * 1e3
    trace_spec = next(iter(inp.traces))
    steps = 150 if quick else 300
    devices: List[Tuple[str, str, str]] = []  # (label, device spec, backend)
    if inp.cal is not None and inp.cal_path is not None:
        for be in _backends(inp):
            devices.append((f"this machine ({be})", "calibrated", be))
    for n in preset_names():
        try:
            preset(n)
        except ArgumentError:
            continue
        devices.append((n, n, "pread"))
    tr = inp.traces[trace_spec]
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace=trace_spec, trace_limit=tr.steps, steps=steps, compute="", compute_ms=comp_ms, threshold=8,
                readers=16, start_spread_ms=comp_ms)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        # the trace as loaded here (its source may be a file that is gone), handed over as a saved trace
        saved = str(tr.save(Path(tmp) / "capacity-trace.npz"))
        points = [dict(base, trace=saved, device=spec, backend=be, sessions=int(s))
                  for _, spec, be in devices for s in sessions]
        rows, _ = run_points(points, 0, calibration=inp.cal_path, jobs=jobs, progress=progress, desc="capacity")
    doc.h(1, "Capacity: concurrent sessions a device sustains")
    doc.p(f"S sessions decode at once on one device (threshold 8, 16 readers, trace {_label(trace_spec)}); each "
          f"session has its own compute of {comp_ms:.1f} ms a step "
          f"({'the SPEC §8 reference compute' if compute_ms is None else 'given'}), so only the reads contend; "
          f"session starts are spread over one step. A device sustains S sessions when every session still "
          f"decodes at >= **{target:g} tokens/s**.")
    fig, ax = plt.subplots(figsize=(9, 5.2))
    table, rows_csv = [], []
    for label, spec, be in devices:
        rs = [r for r in rows if r["device"] == spec and r["backend"] == be]
        cap, bound = capacity_of(rs, target)
        xs = [r["sessions"] for r in rs]
        ys = [r["session_tokens_per_s_min"] for r in rs]
        line, = ax.plot(xs, ys, "-o", ms=4, label=f"{label}: {'>= ' if bound else ''}{cap} sessions")
        if cap:
            capr = next(r for r in rs if r["sessions"] == cap)
            ax.plot([cap], [capr["session_tokens_per_s_min"]], "*", ms=14, color=line.get_color(),
                    markeredgecolor="k")
        one = next(r for r in rs if r["sessions"] == min(xs))
        at = next((r for r in rs if r["sessions"] == cap), None)
        table.append([label, f"{'>= ' if bound else ''}{cap}", one["session_tokens_per_s"],
                      at["device_busy"] if at else float("nan"), at["reads_per_s"] if at else float("nan")])
        rows_csv += [[label, r["sessions"], r["session_tokens_per_s"], r["session_tokens_per_s_min"],
                      r["tokens_per_s"], r["device_busy"], r["mean_queue_depth"], r["reads_per_s"], r["step_p99_ms"]]
                     for r in rs]
    ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g} tokens/s per session")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent sessions on the device (log scale)")
    ax.set_ylabel("tokens/s of the slowest session")
    ax.set_title(f"threshold 8, 16 readers, compute {comp_ms:.1f} ms a step; star: the capacity", fontsize=10)
    ax.legend(loc="lower left")
    rel = out.save(fig, "capacity", f"Capacity: sessions a device sustains at {target:g} tokens/s each")
    data = out.csv("capacity", ["device", "sessions", "session_tokens_per_s", "session_tokens_per_s_min",
                                "tokens_per_s_all", "device_busy", "mean_queue_depth", "reads_per_s", "step_p99_ms"],
                   rows_csv)
    out.add(doc, rel, data, f"Tokens/s of the slowest session by concurrent sessions; the legend gives each "
                            f"device's capacity at {target:g} tokens/s per session.")
    doc.table(["device", f"sessions at >= {target:g} tokens/s", "tokens/s, one session",
               "device busy at capacity", "reads/s at capacity"], table)
    return table


def _section_sweeps(doc: Doc, out: _Out, sweeps: Sequence[Path]) -> None:
    from .sweep import AXES, read_table

    for si, path in enumerate(sweeps):
        rows, meta = read_table(path)
        if not rows:
            continue
        study = meta.get("study", {})
        name = study.get("name") or path.stem
        axes = meta.get("axes") or [a for a in AXES if a in rows[0] and len({r[a] for r in rows}) > 1]
        doc.h(1, f"Study: {name}")
        if study.get("description"):
            doc.p(study["description"])
        doc.p(f"{len(rows)} points over {', '.join(f'`{a}`' for a in axes) or 'no varying axis'}"
              + (f"; ran in {meta['seconds']:.1f} s on {meta['runner']}" if "seconds" in meta else "")
              + f". Table: `inputs/{path.name}`.")
        shutil.copyfile(path, out.root / "inputs" / path.name)
        if Path(str(path) + ".meta.json").is_file():
            shutil.copyfile(str(path) + ".meta.json", out.root / "inputs" / (path.name + ".meta.json"))
        fixed = {a: rows[0][a] for a in AXES if a in rows[0] and a not in axes}
        doc.p("Fixed: " + ", ".join(f"{a} = `{v}`" for a, v in fixed.items() if v not in ("", None)))
        plots = study.get("plots") or [_default_plot(axes, rows)]
        for pi, spec in enumerate(plots):
            rel, data, cap = _plot_sweep(out, rows, spec, axes, f"sweep_{_anchor(name)}_{pi}", name)
            out.add(doc, rel, data, cap)


def _default_plot(axes: Sequence[str], rows: Sequence[Mapping]) -> dict:
    numeric = [a for a in axes if all(isinstance(r[a], (int, float)) for r in rows)]
    prefer = ["sessions", "readers", "cache_rows", "threshold", "compute_ms", "overlap_layers"]
    x = next((a for a in prefer if a in numeric), numeric[0] if numeric else (axes[0] if axes else "device"))
    return {"x": x, "y": "session_tokens_per_s", "series": [a for a in axes if a != x][:2],
            "logx": x in ("sessions", "readers", "cache_rows", "threshold")}


def _plot_sweep(out: _Out, rows: Sequence[Mapping], spec: Mapping, axes: Sequence[str], name: str,
                study: str) -> Tuple[str, str, str]:
    from .sweep import AXES, METRICS

    plt = _plt()
    x, y = spec["x"], spec.get("y", "session_tokens_per_s")
    series = list(spec.get("series", []))
    facet = spec.get("facet")
    where = spec.get("where", {}) or {}
    sel = [r for r in rows if all(r.get(k) == v or (isinstance(v, list) and r.get(k) in v) for k, v in where.items())]
    if not sel:
        raise ArgumentError(f"sweep plot {name}: no row matches where = {where}")
    averaged = [a for a in axes if a not in (x, facet, *series) and a not in where]
    facets = list(dict.fromkeys(r[facet] for r in sel)) if facet else [None]
    cols = min(3, len(facets))
    nrows = -(-len(facets) // cols)
    n_series = len(set(tuple(r[s] for s in series) for r in sel))
    outside = facet is not None or n_series > 4  # one legend for the figure, at its right
    fig, axs = plt.subplots(nrows, cols, figsize=(5.6 * cols + (0.6 if outside else 2.4), 4.4 * nrows),
                            squeeze=False)
    cat = not all(isinstance(r[x], (int, float)) for r in sel)
    xcats = list(dict.fromkeys(r[x] for r in sel)) if cat else []
    data_rows = []
    for fi, fv in enumerate(facets):
        ax = axs[fi // cols][fi % cols]
        part = [r for r in sel if facet is None or r[facet] == fv]
        keys = list(dict.fromkeys(tuple(r[s] for s in series) for r in part))
        for key in keys:
            pts = [r for r in part if tuple(r[s] for s in series) == key]
            xs = sorted(set(r[x] for r in pts), key=(xcats.index if cat else float))
            ym, ylo, yhi = [], [], []
            for xv in xs:
                v = np.array([r[y] for r in pts if r[x] == xv], dtype=float)
                ym.append(v.mean())
                ylo.append(v.min())
                yhi.append(v.max())
                data_rows.append([fv if facet else "", *key, xv, v.mean(), v.min(), v.max(), v.size])
            xp = [xcats.index(v) for v in xs] if cat else xs
            lab = ", ".join(f"{s}={_dev_label(v) if s == 'device' else v}" for s, v in zip(series, key)) or y
            line, = ax.plot(xp, ym, "-o", ms=4, label=lab)
            if any(h > l for h, l in zip(yhi, ylo)):
                ax.fill_between(xp, ylo, yhi, color=line.get_color(), alpha=0.15)
        if spec.get("kind") == "capacity":
            tgt = float(spec.get("target", CAPACITY_TARGET))
            ax.axhline(tgt, color="k", ls="--", lw=1, label=f"target {tgt:g}")
            for key in keys:
                pts = [r for r in part if tuple(r[s] for s in series) == key]
                cap, bound = capacity_of(pts, tgt, y)
                if cap:
                    r = next(r for r in pts if r["sessions"] == cap)
                    ax.plot([cap], [r[y]], "*", ms=13, color="gold", markeredgecolor="k")
                    ax.annotate(f"{'>=' if bound else ''}{cap}", (cap, r[y]), xytext=(4, 6),
                                textcoords="offset points", fontsize=8)
        if cat:
            ax.set_xticks(range(len(xcats)), [_dev_label(str(c)) for c in xcats], rotation=20, ha="right")
        elif spec.get("logx"):
            ax.set_xscale("log", base=2)
        if spec.get("logy"):
            ax.set_yscale("log")
        ax.set_xlabel(AXES.get(x, (None, None, x))[2] + (" (log scale)" if spec.get("logx") and not cat else ""))
        ax.set_ylabel(spec.get("ylabel") or METRICS.get(y, y))
        if facet:
            ax.set_title(f"{facet} = {_dev_label(fv) if facet == 'device' else fv}", fontsize=10)
        if not outside:
            ax.legend(loc="best")
    for j in range(len(facets), nrows * cols):
        axs[j // cols][j % cols].set_visible(False)
    if outside:
        seen: Dict[str, Any] = {}
        for ax in fig.axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(lab, h)
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.93), fontsize=8)
    title = spec.get("title") or f"{study}: {METRICS.get(y, y)} by {AXES.get(x, (0, 0, x))[2]}"
    rel = out.save(fig, name, title)
    data = out.csv(name, [facet or "facet", *series, x, f"{y}_mean", f"{y}_min", f"{y}_max", "points"], data_rows)
    cap = f"Study {study}: {METRICS.get(y, y)} by {x}" + (f", one line per {', '.join(series)}" if series else "")
    if where:
        cap += f"; only {', '.join(f'{k} = {v}' for k, v in where.items())}"
    if averaged:
        cap += f"; mean over {', '.join(averaged)} (band: min-max)"
    return rel, data, cap + "."


def _section_run(doc: Doc, inp: _Inputs) -> None:
    d = inp.demo
    if not d:
        return
    doc.h(1, "The run")
    m = d.get("model", {})
    if m:
        doc.p(f"Model file `{m.get('path')}`: {m.get('bytes', 0) / 2**30:.2f} GiB in the real GGUF format "
              f"(DeepSeek V4.1 Flash layout at scale {m.get('scale')}: tables of "
              f"{', '.join(f'{r:,}' for r in m.get('rows', []))} "
              f"rows, {m.get('table_bytes', 0) / 2**30:.2f} GiB of tables)"
              + (f", built in {m['build_s']:.1f} s." if m.get("build_s") else ", reused."))
    tr = d.get("traces", [])
    if tr:
        doc.p("Traces: real text through the DeepSeek V4 tokenizer and the V4.1 hash.")
        doc.table(["trace", "source", "tokens used", "reuse rate"],
                  [[t["label"], t["source"], t["tokens"], f"{t['reuse_rate'] * 100:.1f}%"] for t in tr])
    lk = d.get("lookups")
    if lk:
        doc.p(f"Lookups and gated adds: {lk['tokens']} tokens of `{lk['source']}` decoded through a session "
              f"(hash, one concurrent read of 48 rows, decode), then projected and gate-added into a seeded "
              f"random residual for both Engram layers (SPEC §7). Rows read from the file were "
              f"{'identical to' if lk.get('rows_verified') else 'NOT identical to'} the generator's bytes decoded "
              f"independently. Read time mean {lk['read_ms_mean']:.3f} ms, projection + gated add mean "
              f"{lk['mix_ms_mean']:.1f} ms a token.")
        doc.table(["position", "token", "text", "layer 1 rows (first 3)", "read ms", "gates layer 1",
                   "gates layer 14"],
                  [[r["position"], r["token"], repr(r["text"]), " ".join(str(x) for x in r["rows"][:3]),
                    r["read_ms"], " ".join(f"{g:.3f}" for g in r["gates"][0]),
                    " ".join(f"{g:.3f}" for g in r["gates"][-1])] for r in lk["records"][:12]])
    st = d.get("steps", [])
    if st:
        doc.p("Steps of the run and their wall time:")
        doc.table(["step", "seconds"], [[s["name"], s["seconds"]] for s in st])


def _section_inputs(doc: Doc, out: _Out, inp: _Inputs, sweeps: Sequence[Path]) -> None:
    doc.h(1, "Inputs, calibration and tables")
    if inp.cal is not None:
        c = inp.cal
        doc.p(f"Calibration of {_machine_name(inp)} from `{c.source.get('path', '?')}` "
              f"({c.source.get('records', '?')} microbenchmark records, {c.date}); it reads microbenchmarks only. "
              f"Hash: {c.hash_s * 1e6:.2f} us a step. Per backend and depth: the engine's mean read latency, fio's, "
              f"the measured 48-row batch (what a decode step's read costs) and the makespan of 48 independent "
              f"reads drawn from the per-read model:")
        doc.table(["backend", "depth", "engine us", "fio us", "48-row batch mean us", "48-row batch p50 us",
                   "48 independent reads us", "batches"],
                  [[f["backend"], f["qd"], f["engine_mean_us"], f.get("fio_mean_us"), f["batch48_mean_us"],
                    f["batch48_p50_us"], f["device_batch48_mean_us"], f["batches"]] for f in c.fit])
        think_fit = getattr(c, "think_fit", None) or []
        if think_fit:
            doc.p("48-row batches measured with a step's compute between batches (think time), used for the "
                  "configurations with that compute, next to the same batches back to back:")
            doc.table(["compute between batches", "backend", "readers", "48-row batch mean us", "p50 us",
                       "back to back mean us", "batches"],
                      [[f["think"], f["backend"], f["qd"], f["batch48_mean_us"], f["batch48_p50_us"],
                        f.get("back_to_back_mean_us"), f["batches"]] for f in think_fit])
        doc.table(["compute", "mean ms", "CV", "samples"],
                  [[label, m.mean * 1e3, m.cv, len(m.samples)] for label, m in c.compute.items()])
        out.csv("calibration_fit", list(c.fit[0].keys()) if c.fit else [], [list(f.values()) for f in c.fit])
        shutil.copyfile(inp.cal_path, out.root / "inputs" / "calibration.json")
    if inp.xc:
        write_json(out.root / "inputs" / "crosscheck.json", inp.xc)
    if inp.runs:
        rows = [[r["config"], r["round"], r["order"], r["steps"], r["tokens_per_s"], r["step_ms"]["p50"],
                 r["step_ms"]["p95"], r["read_ms"]["mean"], r["compute_ms"]["mean"], r.get("rows_match")]
                for r in inp.runs["runs"]]
        out.csv("runs", ["config", "round", "order", "steps", "tokens_per_s", "step_p50_ms", "step_p95_ms",
                         "read_mean_ms", "compute_mean_ms", "rows_match"], rows)
        shutil.copyfile(out.root / "data" / "runs.csv", out.root / "inputs" / "runs_summary.csv")
    if inp.demo:
        write_json(out.root / "inputs" / "demo.json", inp.demo)
    files = []
    if inp.workdir is not None:
        for name in ("microbench.json", "runs.json", "calibration.json", "crosscheck.json", "demo.json"):
            p = inp.workdir / name
            if p.is_file():
                files.append([f"`{p}`", f"{p.stat().st_size:,}", sha256_file(p)[:16]])
    for p in sweeps:
        files.append([f"`{p}`", f"{p.stat().st_size:,}", sha256_file(p)[:16]])
    if files:
        doc.p("Input files (sha256 prefix); copies or summaries of them are in `inputs/`:")
        doc.table(["file", "bytes", "sha256"], files)
    doc.p("Every figure and the table of numbers it plots:")
    doc.table(["figure", "data"], [[f"[{Path(f).name}]({f})", f"[{Path(d).name}]({d})"] for f, d, _ in out.figures])


# =====================================================================================
# the report
# =====================================================================================
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
    out = _Out(Path(out_dir))
    wd = Path(workdir) if workdir is not None else None
    sweep_paths = [Path(s) for s in sweeps]
    for s in sweep_paths:
        if not s.is_file():
            raise ArgumentError(f"sweep table {s} does not exist")
    say("loading inputs and traces")
    inp = _load_inputs(wd, traces, quick, progress, say)
    if quick and sessions == CAPACITY_SESSIONS:
        sessions = (1, 4, 16, 64)
    doc = Doc(title or "Engram decode: measured, predicted and what-if")
    now = now_iso()
    intro = (f"Generated {now} by `engram report`"
             + (f" from the measurements in `{wd}`" if wd else " (no measurements: predictions on device presets)")
             + (f" and {len(sweep_paths)} sweep table(s)" if sweep_paths else "") + ".")
    doc.p(intro)
    summary_at = len(doc.blocks)
    ref_compute = _reference_compute()

    say("seed reproduction")
    seed = _section_seed(doc, out, quick)
    _section_run(doc, inp)
    say("predicted vs measured")
    _section_crosscheck(doc, out, inp)
    say("tokens/s by threshold")
    _section_threshold(doc, out, inp, ref_compute, quick)
    say("tokens/s by readers")
    _section_readers(doc, out, inp, ref_compute, quick)
    say("step-latency CDFs")
    _section_cdf(doc, out, inp, ref_compute, quick)
    say("reuse and row caches")
    _section_cache(doc, out, inp, ref_compute, quick)
    say("capacity")
    cap = _section_capacity(doc, out, inp, ref_compute, target=target, compute_ms=compute_ms, sessions=sessions,
                            quick=quick, jobs=jobs, progress=progress)
    if sweep_paths:
        say("sweeps")
        _section_sweeps(doc, out, sweep_paths)
    _section_inputs(doc, out, inp, sweep_paths)

    # headline figures, placed after the introduction
    head = [f"Seed reproduction: threshold 8 predicted at {seed['predicted_tokens_per_s']:.2f} tokens/s vs "
            f"{21.06} measured by the reference engine ({seed['error'] * 100:+.2f}%)."]
    if inp.xc:
        s = inp.xc["summary"]
        head.append(f"Cross-check on {_machine_name(inp)}: {s['configurations']} configurations, tokens/s median "
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
    toc = [f"[{b[2]}](#{_anchor(b[2])})" for b in doc.blocks if b[0] == "h" and b[1] == 1]
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


# =====================================================================================
# command line
# =====================================================================================
def _ints(text: str) -> list:
    import argparse

    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _cmd_report(args) -> int:
    md = build_report(args.out, workdir=args.workdir, sweeps=args.sweep or (), traces=args.trace,
                      html_page=not args.no_html, target=args.target, compute_ms=args.compute_ms,
                      sessions=args.sessions or CAPACITY_SESSIONS, quick=args.quick, jobs=args.jobs,
                      title=args.title, progress=not args.no_progress and not args.json)
    figs = sorted(p.name for p in (md.parent / "figures").glob("*.png"))
    if args.json:
        print(json.dumps({"report": str(md), "html": str(md.with_suffix(".html")) if not args.no_html else None,
                          "figures": figs}, indent=2))
    else:
        print(f"report    {md}" + ("" if args.no_html else f"  (and {md.with_suffix('.html')})"))
        print(f"figures   {len(figs)} in {md.parent / 'figures'}; their numbers in {md.parent / 'data'}")
    return 0


def add_report_command(subparsers) -> None:
    """Add ``engram report``."""
    p = subparsers.add_parser("report", help="plotted report: measured, predicted, what-if (Markdown + PNG + HTML)",
                              description="Write a report folder (report.md, report.html, figures/*.png, "
                                          "data/*.csv, inputs/): the SPEC §8 seed reproduction, tokens/s by "
                                          "threshold, readers and row-cache size, step-latency CDFs, predicted vs "
                                          "measured with the error band, capacity (sessions a device sustains at "
                                          "a target tokens/s), and the figures of sweep tables. Give a folder of "
                                          "engram measure / calibrate (/ crosscheck) results for this machine's "
                                          "figures; without one, the figures use the device presets.")
    p.add_argument("workdir", nargs="?", help="measurement folder (microbench.json, runs.json, calibration.json, "
                                              "crosscheck.json)")
    p.add_argument("--out", default="reports/latest", help="report folder (default reports/latest)")
    p.add_argument("--sweep", action="append", metavar="TABLE", help="sweep table to plot (repeatable)")
    p.add_argument("--trace", action="append", metavar="SOURCE",
                   help="trace source of the what-if curves (repeatable; default: the measured traces, else "
                        "Python source and prose from the standard library)")
    p.add_argument("--target", type=float, default=CAPACITY_TARGET,
                   help=f"tokens/s per session of the capacity figure (default {CAPACITY_TARGET:g})")
    p.add_argument("--compute-ms", type=float,
                   help="compute per step of the capacity figure, ms (default: the SPEC §8 reference, ~47 ms)")
    p.add_argument("--sessions", type=_ints, help="session counts of the capacity figure (default 1,2,4,...,128)")
    p.add_argument("--jobs", type=int, help="local processes for the simulations (default: CPU count)")
    p.add_argument("--title", help="report title")
    p.add_argument("--quick", action="store_true", help="shorter simulations, fewer points")
    p.add_argument("--no-html", action="store_true", help="Markdown only")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_report)
