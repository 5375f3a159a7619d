"""The report's serving sections (issue 16): a serving capacity study's panels, and the serving model's measured
counterpart, predicted vs measured.

- :func:`serve_capacity_section` -- a table of ``engram sim capacity`` on a serving study (``kind =
  "serve-capacity"`` in its metadata, every probe in ``TABLE.probes.csv``): each configuration's requests/s
  under the SLOs with its band over seeds, and the panels of :mod:`sim.serve.panels` -- goodput by device,
  TTFT and TBT percentiles against load, where the knee comes from;
- :func:`serve_counterpart_section` -- ``serve_counterpart.json`` in the measurement folder (what ``engram sim
  serve --counterpart MODEL --json`` prints): the real engine decoding a batch while a prompt prefills, beside
  the serving model's prediction of it.

They draw what the documents hold and never simulate.  Units: requests/s, TTFT in s, TBT in ms, as labelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from sim.core.io import load_json
from ..serve.metrics import SLO
from ..serve.panels import (goodput_by_device, knee_breakdown, latency_vs_load, plot_counterpart, plot_goodput,
                            plot_knee, plot_latency_vs_load)
from sim.sweep.capacity import CAPACITY_RULE, read_capacity
from ..serve.search import MAX_HALVINGS, knee_words, probes_path
from ..sweep import meta_path
from .document import Doc, anchor
from .plots import ReportFolder, pyplot

__all__ = ["COUNTERPART_FILE", "KNEE_PANELS", "serve_capacity_section", "serve_counterpart_section"]

#: The measured counterpart's document in a measurement folder (``engram sim serve --counterpart MODEL --json``).
COUNTERPART_FILE = "serve_counterpart.json"
#: Configurations drawn in the knee figure (one panel each; the table lists them all).
KNEE_PANELS = 12


def _csv(out: ReportFolder, name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """``data/NAME.csv`` of dict rows (the columns of the first row)."""
    header = list(rows[0]) if rows else []
    return out.csv(name, header, [[r[k] for k in header] for r in rows])


def _capacity_table(doc: Doc, rows: Sequence[Mapping[str, Any]]) -> None:
    """One line per configuration: requests/s, band, goodput and tokens/s there, the knee."""
    table = []
    for r in rows:
        cap = ("≥ " if r["lower_bound"] else "") + f"{r['capacity_rps']:.3g}"
        if r.get("below_min") and r.get("min_rate"):
            cap = f"< {r['min_rate'] / 2 ** MAX_HALVINGS:.3g}"
        if r.get("small_sample"):
            cap += f" (small sample: a probe measured {r['fewest_requests']} requests)"
        knee = knee_words(r["knee_rate"] if r.get("knee_cause") else None, r["knee_failed"], r["knee_cause"])
        table.append([r["label"], cap, f"{r['low']:.3g}-{r['high']:.3g}", f"{r['goodput_rps']:.3g}",
                      f"{r['output_tokens_per_s']:.4g}", knee or "every probe met the SLOs"])
    doc.table(["configuration", "requests/s", "band over seeds", "goodput there (requests/s)", "output tokens/s there",
               "what fails first above it"], table)


@dataclass(frozen=True)
class _Panels:
    """A figure's panels: ``panels`` axes in rows of ``ncols``, each ``size`` inches (width, height)."""

    ncols: int = 1
    panels: int = 1
    size: Tuple[float, float] = (8.0, 4.6)


def _figure(out: ReportFolder, doc: Doc, name: str, title: str, rows: List[Dict[str, Any]], caption: str,
            draw, grid: _Panels = _Panels()) -> None:
    """A figure of ``grid.panels`` axes (``draw(axes_list)`` fills them), its data ``rows`` beside it."""
    plt = pyplot()
    ncols, panels, size = grid.ncols, grid.panels, grid.size
    nrows = -(-panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False)
    flat = list(axes.ravel())
    draw(flat[:panels])
    for ax in flat[panels:]:
        ax.set_visible(False)
    rel = out.save(fig, name, title)
    out.add(doc, rel, _csv(out, name, rows), caption)


def serve_capacity_section(doc: Doc, out: ReportFolder, path: Path) -> None:
    """A serving capacity table's section: the study, each configuration's requests/s under the SLOs, and the
    goodput, latency-against-load and knee figures (their data in ``data/``, the tables copied to ``inputs/``).

    Raises
    ------
    FormatError
        An unreadable table, probes table or metadata.
    """
    rows, probes, meta = read_capacity(path)
    ppath = probes_path(path)
    study, search = meta.get("study", {}), meta.get("search", {})
    slo = SLO(**meta["slo"]) if meta.get("slo") else None
    name = study.get("name") or path.stem
    doc.h(1, f"Serving capacity study: {name}")
    if study.get("description"):
        doc.p(study["description"])
    doc.p(f"{len(rows)} configuration(s); the most requests/s meeting {slo.text() if slo else 'the SLOs'}, searched "
          f"on the arrival rate with {search.get('seeds', '?')} seeds from {search.get('min_rate', '?')} up to "
          f"{search.get('max_rate', '?')} requests/s ({len(probes)} probes"
          + (f", {meta['seconds']:.1f} s on {meta['runner']}" if "seconds" in meta else "")
          + f"). Tables: `inputs/{path.name}`, `inputs/{ppath.name}`. The capacity is {CAPACITY_RULE}, "
            "the band from the smallest to the largest; goodput counts the requests/s whose TTFT and TPOT meet the "
            "targets." + (f" Each probe measures at least {search['min_requests']} requests (its window lengthened "
                          "at low rates); a capacity marked *small sample* rests on a probe that measured fewer."
                          if search.get("min_requests") else ""))
    out.copy_inputs([path, meta_path(path), ppath, meta_path(ppath)])
    good = goodput_by_device(rows)
    _capacity_table(doc, good)
    stem = f"serving_{anchor(name)}"
    _figure(out, doc, f"{stem}_goodput", "Requests/s each configuration carries under the SLOs", good,
            "Each configuration's capacity (lower median over seeds, bar: the band), with what fails first above it.",
            lambda axs: plot_goodput(axs[0], good), _Panels(size=(max(8.0, 0.9 * len(good) + 3), 5.0)))
    if not probes:
        doc.p(f"No probes table (`{ppath.name}`): the figures against load are left out.")
        return
    load = latency_vs_load(probes)
    _figure(out, doc, f"{stem}_latency", "TTFT and TBT percentiles against load", load,
            "Means over the seeds that probed each rate; dashed red: the target.",
            lambda axs: (plot_latency_vs_load(axs[0], load, slo, metric="ttft"),
                         plot_latency_vs_load(axs[1], load, slo, metric="tbt")), _Panels(ncols=2, panels=2))
    knee = knee_breakdown(probes)
    configs = sorted({r["config"] for r in knee})[:KNEE_PANELS]
    _figure(out, doc, f"{stem}_knee", "Where the knee comes from: a decode token's time in the slowest steps",
            knee, "Per configuration: the mean time of a decode token over the steps at or above the SLO's "
                  "percentile, by part, against the arrival rate; the line is the percentile itself (TBT p99), so "
                  "the parts sum above it"
                  + (f" (the first {KNEE_PANELS} configurations)" if len(configs) < len({r['config'] for r in knee})
                     else "") + ". The data also splits TTFT into queueing, the prompt's rows and its steps after them.",
            lambda axs: [plot_knee(ax, knee, c) for ax, c in zip(axs, configs)],
            _Panels(ncols=min(3, len(configs)), panels=len(configs), size=(5.6, 4.2)))


def _number(v: float, unit: str) -> str:
    """A table cell: counts (``reads``) whole with thousands separators, other quantities to 4 digits."""
    return f"{v:,.0f}" if unit == "reads" else f"{v:.4g}"


def serve_counterpart_section(doc: Doc, out: ReportFolder, workdir: Path) -> bool:
    """The measured counterpart's section from ``WORKDIR/serve_counterpart.json``, if there is one: the record's
    regime and the predicted-vs-measured table and figure.  Returns whether there was one.

    Raises
    ------
    FormatError
        An unreadable document.
    """
    path = workdir / COUNTERPART_FILE
    if not path.is_file():
        return False
    d = load_json(path)
    rec, table = d.get("record", {}), d.get("table", [])
    cfg, g = rec.get("config", {}), rec.get("regime", {})
    load = [f"{float((g.get(k) or [float('nan')])[0]):.1f}" for k in ("load_before", "load_after")]
    doc.h(1, "Serving: predicted vs measured")
    doc.p(f"The real engine: {cfg.get('batch', '?')} requests decoding, every step one batched read of their rows "
          f"then {cfg.get('compute_ms', '?')} ms of compute (slept), while a {cfg.get('prompt_tokens', 0):,}-token "
          f"prompt prefills in the background (`engram sim serve --counterpart`); the serving model predicts it from "
          f"the device probed right before. Regime: {g.get('cpus', '?')} CPUs, load average {load[0]} before and "
          f"{load[1]} after, backend "
          f"{g.get('backend_used', '?')}. Document: `inputs/{path.name}`.")
    out.copy_inputs([path])
    doc.table(["quantity", "measured", "predicted", "unit", "predicted / measured"],
              [[r["quantity"], _number(r["measured"], r["unit"]), _number(r["predicted"], r["unit"]), r["unit"],
                f"{r['ratio']:.3f}"] for r in table])
    if table:
        _figure(out, doc, "serve_counterpart", "Serving: predicted vs measured", table,
                "Each quantity predicted over measured (1: exact).", lambda axs: plot_counterpart(axs[0], table),
                _Panels(size=(9.0, 4.6)))
    return True
