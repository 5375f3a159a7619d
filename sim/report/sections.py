"""The report's sections on measurements and studies: predicted vs measured, sweep studies, the run, inputs.

They draw what the documents hold (the cross-check, sweep tables,
``demo.json``, the calibration) and never simulate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from engram.errors import ArgumentError

from sim.sweep.capacity import (CAPACITY_TARGET, capacity_of, is_capacity_table, phases_short, phases_text, pooled_compute,
                                probes_path, read_capacity)
from sim.check.crosscheck import markdown_table
from sim.check.intervals import error_band
from sim.check.regimes import count_text, percent_text, regime_checks, summary_figure, verdict_text
from sim.core.io import sha256_file, write_json
from ..serve.search import is_serve_capacity_table
from ..sweep import AXES, METRICS, meta_path, read_table
from ..trace import wrap_info
from .answer import Entry, compute_phrase, entries_from_capacity_table, entries_from_crosscheck, grid_entries
from .document import Doc, anchor
from .inputs import Inputs, device_label
from .plots import ReportFolder, pyplot, spread_labels, zero_based
from .serving import serve_capacity_section

__all__ = ["crosscheck_section", "inputs_section", "ran_text", "run_section", "sessions_section", "sweeps_section",
           "wrap_warnings"]


def _interval_note(s: dict) -> str:
    """The regime the runs ran in, the windows and the coverage of the predicted intervals (a cross-check's
    summary; a figure it lacks reads ``not measured``, a count ``?``)."""
    alone = (f"; the calibrated device and compute alone would be off by a median "
             f"{percent_text(summary_figure(s, 'calibrated_only', 'median_abs_error'))} (max "
             f"{percent_text(summary_figure(s, 'calibrated_only', 'max_abs_error'))})"
             if summary_figure(s, "calibrated_only", "median_abs_error") is not None else "")
    rg = {"name": "unknown", "why": "not recorded", **s["regime"]}
    runs = count_text(s, "runs")
    return (f"Regime: **{rg['name']}** ({rg['why']}). Each run is predicted with the device and "
            f"compute of its own time window, fitted from probe steps interleaved with it ({s.get('windows_probed', 0)}"
            f" of {runs} runs){alone}. Configurations inside their 90% interval (each run against its own "
            f"prediction, the median over the runs): "
            f"{s.get('inside_interval', 0)} of {count_text(s, 'configurations')}; runs inside their own: "
            f"{s.get('runs_inside', 0)} of {runs}.")


def _background_note(doc: Doc, inp: Inputs) -> None:
    """A paragraph on the load of other processes while the runs were measured (none when not recorded)."""
    bg = [r["background"] for r in (inp.runs or {}).get("runs", []) if isinstance(r.get("background"), dict)]
    if not bg:
        return
    cpu = np.array([float(b.get("cpu", 0.0)) for b in bg]) * 100
    io = np.array([float(b.get("disk_iops", 0.0)) for b in bg])
    waited = (inp.runs or {}).get("waited_s")
    doc.p(f"Other processes while the runs were measured: CPU median {np.median(cpu):.0f}% of the machine "
          f"(max {cpu.max():.0f}%), disk requests median {np.median(io):.0f}/s (max {io.max():.0f}/s)"
          + (f"; {waited:.0f} s were spent waiting for a quiet machine" if waited else "")
          + ". A shared machine's load widens the spread of the repeats and moves the microbenchmarks the "
            "calibration is fitted from.")


def _predicted_vs_measured_figure(plt, rows: Sequence[Mapping], t: Mapping[str, float]):
    """The cross-check's figure: predicted against measured tokens/s (log-log, the target bands) and the
    error of each configuration beside half the spread of its repeats (``t``: the targets)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
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
    ax.set_ylabel("predicted tokens/s (median of the runs' predictions)")
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
    ax2.set_xlabel("tokens/s error, run by run: median over the runs of predicted / measured - 1 (%)")
    ax2.set_ylabel("configuration (trace, reads, compute)")
    ax2.set_title("Error by configuration")
    ax2.legend(loc="lower right")
    return fig


def _crosscheck_table(doc: Doc, rows: Sequence[Mapping]) -> None:
    """The cross-check table: measured, predicted and the error of tokens/s, step p50 and p95 per configuration."""
    def pct(x: float) -> str:
        return f"{x * 100:+.1f}%"

    doc.table(["trace", "threshold", "reads", "readers", "compute", "steps x repeats", "tokens/s measured",
               "spread", "predicted", "error", "step p50 ms measured", "predicted", "error",
               "step p95 ms measured", "predicted", "error"],
              [[r["trace_label"], r["threshold"], "serial" if r["serial"] else r["backend"],
                "-" if r["serial"] else r["readers"], r["compute"], f"{r['steps']} x{r['repeats']}",
                r["measured"]["tokens_per_s"], f"{r['spread']['tokens_per_s'] * 100:.1f}%",
                r["predicted"]["tokens_per_s"], f"{pct(r['error']['tokens_per_s'])} {error_band(r['interval'])}",
                r["measured"]["step_p50_ms"],
                r["predicted"]["step_p50_ms"], pct(r["error"]["step_p50"]), r["measured"]["step_p95_ms"],
                r["predicted"]["step_p95_ms"], pct(r["error"]["step_p95"])] for r in rows])


def crosscheck_section(doc: Doc, out: ReportFolder, inp: Inputs) -> None:
    """Predicted vs measured: the cross-check's figure and table (or a note that there is none)."""
    plt = pyplot()
    xc = inp.xc
    doc.h(1, "Predicted vs measured")
    if not xc:
        doc.p("No cross-check: run `engram measure`, `engram calibrate` and `engram crosscheck` on a folder and "
              "pass it to `engram report`.")
        return
    s = xc.get("summary") if isinstance(xc.get("summary"), Mapping) else {}
    which, _, rule = regime_checks((s.get("regime") or {}).get("name", "loaded"))
    t = (xc.get("quiet_targets") if which == "quiet" else None) or xc.get("targets") or {}

    def target(key: str) -> str:
        at = percent_text(summary_figure(t, key), "g", "not recorded")
        return f"target <= {at}" if which is not None else f"any-machine target <= {at}, not held under load"

    def share(*path: str, spec: str = ".2f") -> str:
        return percent_text(summary_figure(s, *path), spec)

    doc.p(f"Every measured configuration predicted by the simulator calibrated from microbenchmarks only (the "
          f"calibration never saw a decode run); each run against its own prediction, the median over a "
          f"configuration's runs. tokens/s: median |error| "
          f"**{share('tokens_per_s', 'median_abs_error')}** ({target('tokens_per_s_median_abs')}), "
          f"max {share('tokens_per_s', 'max_abs_error')} ({target('tokens_per_s_max_abs')}); "
          f"step p50 max |error| {share('step_p50', 'max_abs_error')} ({target('step_p50_max_abs')}); "
          f"{rule}. The spread of repeated measurements of one configuration "
          f"((max - min) / median) has median {share('spread', 'tokens_per_s_median', spec='.1f')} and max "
          f"{share('spread', 'tokens_per_s_max', spec='.1f')}: errors inside that spread are noise of the machine, "
          f"not of the model. {count_text(s, 'within_spread')} of {count_text(s, 'configurations')} predictions "
          f"fall inside the measured range. Verdict: **{verdict_text(s)}**.")
    if isinstance(s.get("regime"), Mapping):
        doc.p(_interval_note(s))
    _background_note(doc, inp)
    rows = xc["rows"]
    fig = _predicted_vs_measured_figure(plt, rows, t)
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
    doc.p("The cross-check table (measured and predicted: medians over the repeats; spread: (max - min) / median "
          "of the repeats' tokens/s; error: each run's predicted / measured - 1, the median over the runs, so it can "
          "differ from the ratio of the two medians when they are different runs; the 90% band of the tokens/s "
          "error beside it):")
    _crosscheck_table(doc, rows)
    sessions_section(doc, out, xc)
    # the cross-check's own summary: its last block of lines (errors, spread, interval, regime, backends left out)
    for line in markdown_table(xc).rsplit("\n\n", 1)[-1].split("\n"):
        doc.p(line)


def sessions_section(doc: Doc, out: ReportFolder, xc: Mapping[str, Any]) -> None:
    """Several sessions on this machine's device (the cross-check's ``session_rows``): their table, and the
    measured capacity next to the predicted one per mode (``capacity``), in a figure with the prediction's
    interval, the target, the compute and the phases."""
    srows = xc.get("session_rows") or []
    if not srows:
        return
    pct = (lambda x: f"{x * 100:+.1f}%")
    doc.p("Several sessions decoding at once on this machine's device, each on its own stretch of the trace, as "
          "threads of one process or as processes sharing the device; each run predicted with the same number of "
          "sessions started where each session started in the run, and the device and compute of the run's own "
          "window (the probe steps interleaved with it). Tokens/s of a session (the mean over the sessions) and of the slowest session, medians over "
          "the repeats; the error is each run's against its own prediction, the median over the runs, with its 90% "
          "band; the slowest session's prediction with its 90% interval:")
    doc.table(["sessions", "as", "trace", "policy", "compute", "steps x repeats", "compute ms measured / simulated",
               "start spread ms", "tokens/s a session measured", "predicted", "error [90% band]", "slowest measured",
               "slowest predicted [90%]", "error", "step p50 ms measured", "predicted", "error"],
              [[r["sessions"], r["mode"], r["trace_label"],
                "serial" if r["serial"] else f"t{r['threshold']} {r['backend']} x{r['readers']}", r["compute"],
                f"{r['steps']} x{r['repeats']}",
                f"{r['measured']['compute_mean_ms']:.2f} / {r['predicted']['compute_mean_ms']:.2f}",
                r["predicted"]["start_spread_s"] * 1e3, r["measured"]["tokens_per_s"],
                f"{r['predicted']['tokens_per_s']:.1f}",
                f"{pct(r['error']['tokens_per_s'])} {error_band(r['interval'])}", r["measured"]["slowest_tokens_per_s"],
                f"{r['predicted']['slowest_tokens_per_s']:.1f} [{r['interval']['slowest_low']:.1f}, "
                f"{r['interval']['slowest_high']:.1f}]", pct(r["error"]["slowest_tokens_per_s"]),
                r["measured"]["step_p50_ms"], r["predicted"]["step_p50_ms"], pct(r["error"]["step_p50"])]
               for r in sorted(srows, key=lambda r: (r["mode"], r["sessions"]))])
    checked = entries_from_crosscheck(xc)
    if not checked:
        return
    plt = pyplot()
    pairs = [(checked[i], checked[i + 1]) for i in range(0, len(checked), 2)]
    fig, axes = plt.subplots(1, len(pairs), figsize=(6.2 * len(pairs), 4.6), squeeze=False)
    rows = []
    for ax, (meas, pred) in zip(axes[0], pairs):
        c = meas.checked["row"]
        n = c["sessions"]
        lo = c.get("predicted_slowest_low") or c["predicted_slowest"]
        hi = c.get("predicted_slowest_high") or c["predicted_slowest"]
        ax.fill_between(n, lo, hi, color="#8172B2", alpha=0.2, label="predicted, 90% interval")
        ax.plot(n, c["predicted_slowest"], "-D", ms=5, color="#8172B2",
                label=f"predicted: capacity {pred.shown()} (interval {pred.checked['low']}-{pred.checked['high']})")
        ax.plot(n, c["measured_slowest"], "s", ms=7, color="#C44E52",
                label=f"measured (median of {meas.checked['repeats']} repeats): capacity {meas.shown()}")
        ax.axhline(meas.spec.target, color="k", ls="--", lw=1, label=f"target {meas.spec.target:g} tokens/s")
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.set_xlabel(f"concurrent sessions as {c['mode']} (log scale)")
        ax.set_ylabel("tokens/s of the slowest session")
        ax.set_title(f"Sessions as {c['mode']}: t{c['threshold']} {c['backend']} x{c['readers']}, compute "
                     f"{meas.checked['compute_ms']:.2f} ms ('{c['compute']}'), {meas.phases_short()}", fontsize=9)
        ax.legend(loc="lower left", fontsize=7)
        rows += [[c["mode"], s, m, p, a, b, meas.spec.target, c["measured_capacity"], c["predicted_capacity"],
                  pred.checked["low"], pred.checked["high"], meas.checked["compute_ms"], meas.phases_short()]
                 for s, m, p, a, b in zip(n, c["measured_slowest"], c["predicted_slowest"], lo, hi)]
    rel = out.save(fig, "capacity_measured", "Capacity on this machine: measured and predicted")
    data = out.csv("capacity_measured", ["mode", "sessions", "measured_slowest_tokens_per_s",
                                         "predicted_slowest_tokens_per_s", "predicted_low", "predicted_high",
                                         "target", "measured_capacity", "predicted_capacity",
                                         "predicted_capacity_low", "predicted_capacity_high", "compute_ms",
                                         "phases"], rows)
    out.add(doc, rel, data, "The slowest session's tokens/s by concurrent sessions on this machine, measured "
                            "(squares: medians of the repeats) and predicted (line, band: the 90% interval from the "
                            "uncertainty of each run's window), with the target; the capacity is the largest count of "
                            "the grid whose slowest session reaches it.")
    doc.p(" ".join(f"Sessions as {m.checked['row']['mode']}: measured capacity {m.shown()}, predicted {p.shown()} "
                   f"(interval {p.checked['low']}-{p.checked['high']}) at {m.spec.target:g} tokens/s for the slowest "
                   f"session, on the grid {m.checked['grid']}, compute {m.compute()}, phases: {m.phases()}"
                   f" ({'within' if m.checked['row']['within_one_step'] else 'NOT within'} one grid step)."
                   for m, p in pairs))


def _short_key(r: Mapping) -> str:
    pol = f"t{r['threshold']} serial" if r["serial"] else f"t{r['threshold']} {r['backend']} x{r['readers']}"
    return f"{r['trace_label'][:14]} {pol} {r['compute']}"


_COMPUTE_AXES = ("compute", "compute_ms", "compute_dist", "compute_cv")


def fixed_text(row: Mapping[str, Any], axes: Sequence[str], rows: Sequence[Mapping[str, Any]] = ()) -> str:
    """What a study held fixed, from one of its rows: the compute of a step in words with its mean (not the
    ``compute_ms`` axis, which a named compute model leaves at 0) and the compute drawn over ``rows`` (default:
    the row), then every other axis that does not vary."""
    parts = []
    if not any(a in axes for a in _COMPUTE_AXES) and ("compute_mean_ms" in row or "compute_ms" in row):
        parts.append(f"compute = {compute_phrase(row, rows)}")
    skip = set(_COMPUTE_AXES) if parts else set()
    parts += [f"{a} = `{row[a]}`" for a in AXES
              if a in row and a not in axes and a not in skip and a not in ("sessions", "repeat")
              and row[a] not in ("", None)]
    return "Fixed: " + ", ".join(parts) + "."


def ran_text(rows: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> str:
    """What the simulator ran, from a table's result columns: the session phases of the points with several
    sessions (``phases_run``, else the phases the axes give) and, when the compute varies, the compute drawn
    against the nominal one."""
    parts = []
    multi = [r for r in rows if int(r.get("sessions", 1) or 1) > 1]
    if multi:
        kinds = sorted({phases_text(r) for r in multi})
        parts.append(f"Session phases as simulated: {'; '.join(kinds)}.")
    if any(a in axes for a in _COMPUTE_AXES) and any("compute_realised_mean_ms" in r for r in rows):
        groups: Dict[float, List[Mapping]] = {}
        for r in rows:
            groups.setdefault(float(r.get("compute_mean_ms", 0.0)), []).append(r)
        drawn = []
        for nominal, rs in sorted(groups.items()):
            m, cv = pooled_compute(rs)
            drawn.append(f"{nominal:.2f} ms nominal: drawn mean {m:.2f} ms, CV {cv:.3g}")
        parts.append("Compute per step, nominal and as drawn over the points: " + "; ".join(drawn) + ".")
    return " ".join(parts)


def wrap_warnings(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The warnings of the points whose cache figures depend on replaying their trace: a row cache with a session
    that wraps past the end of the trace, or a shared cache with sessions reading the same steps
    (:meth:`sim.trace.Trace.wraps`, from each row's ``trace_steps``, ``steps`` and ``sessions``); one per
    distinct run shape."""
    out: List[str] = []
    for r in rows:
        per, shared = int(r.get("cache_rows") or 0), int(r.get("shared_cache_rows") or 0)
        if not (per or shared) or not isinstance(r.get("trace_steps"), int) or r["trace_steps"] < 1:
            continue
        w = wrap_info(r["trace_steps"], int(r["steps"]), int(r.get("sessions", 1) or 1))
        if (w.wraps or (shared and w.overlaps)) and w.warning() not in out:
            out.append(w.warning())
    return out


def _completeness(meta: Mapping[str, Any], rows: Sequence[Mapping], path: Path) -> str:
    if meta.get("complete") is False:
        return (f" **Incomplete**: {len(rows)} of {meta.get('points', '?')} points (the run stopped; "
                f"`engram sim sweep --resume --out {path}` continues it).")
    return ""


def sweeps_section(doc: Doc, out: ReportFolder, sweeps: Sequence[Path]) -> List[Entry]:
    """One section per table: a sweep's figures (its own ``[[plot]]`` specifications, or one chosen from its
    axes), a capacity study's configurations or a serving capacity study's panels (:mod:`sim.report.serving`);
    returns the session capacities they give (:class:`answer.Entry`)."""
    entries: List[Entry] = []
    for path in sweeps:
        if is_capacity_table(path):
            entries += _capacity_study_section(doc, out, path)
            continue
        if is_serve_capacity_table(path):
            serve_capacity_section(doc, out, path)
            continue
        rows, meta = read_table(path, metrics=METRICS)
        study = meta.get("study", {})
        name = study.get("name") or path.stem
        axes = meta.get("axes") or [a for a in AXES if a in rows[0] and len({r[a] for r in rows}) > 1]
        doc.h(1, f"Study: {name}")
        if study.get("description"):
            doc.p(study["description"])
        doc.p(f"{len(rows)} points over {', '.join(f'`{a}`' for a in axes) or 'no varying axis'}"
              + (f"; ran in {meta['seconds']:.1f} s on {meta['runner']}" if "seconds" in meta else "")
              + f". Table: `inputs/{path.name}`." + _completeness(meta, rows, path))
        out.copy_inputs([path, meta_path(path)])
        doc.p(fixed_text(rows[0], axes, rows))
        ran = ran_text(rows, axes)
        if ran:
            doc.p(ran)
        warn = wrap_warnings(rows)
        if warn:
            doc.p(f"**Warning**: the cache figures of this study depend on replaying its trace, in "
                  f"{len(warn)} run shape(s): " + " ".join(f"{w}." for w in warn[:3])
                  + (f" ({len(warn) - 3} more.)" if len(warn) > 3 else ""))
        plots = study.get("plots") or [_default_plot(axes, rows)]
        for pi, spec in enumerate(plots):
            rel, data, cap = _plot_sweep(out, rows, spec, axes, f"sweep_{anchor(name)}_{pi}", name)
            out.add(doc, rel, data, cap)
            if spec.get("kind") == "capacity" and "sessions" in axes:
                entries += grid_entries(rows, axes, spec, name, path)
    return entries


def _capacity_study_section(doc: Doc, out: ReportFolder, path: Path) -> List[Entry]:
    """A capacity table's section: the study, what it held, each configuration's capacity and seeds."""
    rows, probes, meta = read_capacity(path)
    entries = entries_from_capacity_table(path)
    study = meta.get("study", {})
    spec = meta.get("capacity", {})
    doc.h(1, f"Capacity study: {study.get('name') or path.stem}")
    if study.get("description"):
        doc.p(study["description"])
    axes = [a for a in meta.get("axes", []) if a in AXES]
    doc.p(f"{len(rows)} configuration(s) over {', '.join(f'`{a}`' for a in axes) or 'no varying axis'}; capacity "
          f"searched at {spec.get('target', '?')} tokens/s with {spec.get('seeds', '?')} "
          f"seed{'' if spec.get('seeds') == 1 else 's'} up to "
          f"{spec.get('max_sessions', '?')} sessions ({len(probes)} probes"
          + (f", {meta['seconds']:.1f} s on {meta['runner']}" if "seconds" in meta else "")
          + f"). Tables: `inputs/{path.name}`, `inputs/{probes_path(path).name}`.")
    out.copy_inputs([path, meta_path(path), probes_path(path), meta_path(probes_path(path))])
    if rows:
        doc.p(fixed_text({**rows[0], "compute_mean_ms": rows[0]["compute_mean_ms"]}, axes, probes or rows))
    doc.table(["configuration", "capacity", "per seed", "probes", "phases (as run)", "assumes"],
              [[e.label, e.shown(), " ".join(str(c) for c in e.cap.per_seed), len(e.cap.probes), e.phases_short(),
                e.cap.assumptions()] for e in entries])
    warn = wrap_warnings(probes)
    if warn:
        doc.p("**Warning**: probes of this study replay their trace, and its row caches see those replays as hits: "
              + " ".join(f"{w}." for w in warn[:3]) + (f" ({len(warn) - 3} more.)" if len(warn) > 3 else ""))
    return entries


def _default_plot(axes: Sequence[str], rows: Sequence[Mapping]) -> dict:
    numeric = [a for a in axes if all(isinstance(r[a], (int, float)) for r in rows)]
    prefer = ["sessions", "readers", "cache_rows", "threshold", "compute_ms", "overlap_layers"]
    x = next((a for a in prefer if a in numeric), numeric[0] if numeric else (axes[0] if axes else "device"))
    return {"x": x, "y": "session_tokens_per_s", "series": [a for a in axes if a != x][:2],
            "logx": x in ("sessions", "readers", "cache_rows", "threshold")}


def _capacity_stars(ax, spec: Mapping, part: Sequence[Mapping], keys: Sequence[tuple], series: Sequence[str],
                    y: str) -> list:
    """A capacity plot's target line on ``ax`` and a star at each series' capacity read off the grid;
    returns the stars' labels (x, y, text, colour) for :func:`spread_labels`."""
    stars = []
    tgt = float(spec.get("target", CAPACITY_TARGET))
    ax.axhline(tgt, color="k", ls="--", lw=1, label=f"target {tgt:g}")
    for key in keys:
        pts = [r for r in part if tuple(r[s] for s in series) == key]
        cap, bound = capacity_of(pts, tgt, y)
        if cap:
            r = next(r for r in pts if r["sessions"] == cap)
            ax.plot([cap], [r[y]], "*", ms=13, color="gold", markeredgecolor="k")
            stars.append((cap, r[y], f"{'>=' if bound else ''}{cap}", "k"))
    return stars


def _figure_legend(fig) -> None:
    """One legend for the whole figure, at its right: every label of its axes once."""
    seen: Dict[str, Any] = {}
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.93), fontsize=8)


def _plot_sweep(out: ReportFolder, rows: Sequence[Mapping], spec: Mapping, axes: Sequence[str], name: str,
                study: str) -> Tuple[str, str, str]:
    plt = pyplot()
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
            lab = ", ".join(f"{s}={_value_label(s, v)}" for s, v in zip(series, key)) or y
            line, = ax.plot(xp, ym, "-o", ms=4, label=lab)
            if any(h > l for h, l in zip(yhi, ylo)):
                ax.fill_between(xp, ylo, yhi, color=line.get_color(), alpha=0.15)
        stars = _capacity_stars(ax, spec, part, keys, series, y) if spec.get("kind") == "capacity" else []
        if cat:
            ax.set_xticks(range(len(xcats)), [device_label(str(c)) for c in xcats], rotation=20, ha="right")
        elif spec.get("logx"):
            ax.set_xscale("log", base=2)
        if spec.get("logy"):
            ax.set_yscale("log")
        ax.set_xlabel(AXES.get(x, (None, None, x))[2] + (" (log scale)" if spec.get("logx") and not cat else ""))
        ax.set_ylabel(spec.get("ylabel") or METRICS.get(y, y))
        if facet:
            ax.set_title(f"{facet} = {device_label(fv) if facet == 'device' else fv}", fontsize=10)
        if "tokens/s" in ax.get_ylabel():
            zero_based(ax)
        spread_labels(ax, stars)
        if not outside:
            ax.legend(loc="best")
    for j in range(len(facets), nrows * cols):
        axs[j // cols][j % cols].set_visible(False)
    if outside:
        _figure_legend(fig)
    title = spec.get("title") or f"{study}: {METRICS.get(y, y)} by {AXES.get(x, (0, 0, x))[2]}"
    rel = out.save(fig, name, title)
    data = out.csv(name, [facet or "facet", *series, x, f"{y}_mean", f"{y}_min", f"{y}_max", "points"], data_rows)
    cap = f"Study {study}: {METRICS.get(y, y)} by {x}" + (f", one line per {', '.join(series)}" if series else "")
    if where:
        cap += f"; only {', '.join(f'{k} = {v}' for k, v in where.items())}"
    if averaged:
        cap += f"; mean over {', '.join(averaged)} (band: min-max)"
    if spec.get("kind") == "capacity":
        cap += (f"; stars: the capacity read off the grid at {float(spec.get('target', CAPACITY_TARGET)):g} tokens/s, "
                f"sessions at {' / '.join(sorted({phases_short(r) for r in sel}))} as simulated")
    return rel, data, cap + "."


def _value_label(axis: str, value: Any) -> str:
    """An axis value as a legend shows it: devices by :func:`device_label`, an unset text axis as ``none``."""
    if axis in ("device", "tail") and value:
        return device_label(str(value))
    return "none" if value in ("", None) else str(value)


def run_section(doc: Doc, inp: Inputs) -> None:
    """The run of ``engram demo`` (``demo.json``): model file, traces, lookups, steps; nothing without it."""
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


def inputs_section(doc: Doc, out: ReportFolder, inp: Inputs, sweeps: Sequence[Path]) -> None:
    """The calibration's tables, copies of the inputs, their hashes, and every figure with its data."""
    doc.h(1, "Inputs, calibration and tables")
    if inp.cal is not None:
        c = inp.cal
        doc.p(f"Calibration of {inp.machine_name()} from `{c.source.get('path', '?')}` "
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
        out.copy_inputs([inp.cal_path], "calibration.json")
    if inp.xc:
        write_json(out.root / "inputs" / "crosscheck.json", inp.xc)
    if inp.runs:
        rows = [[r["config"], r["round"], r["order"], r["steps"], r["tokens_per_s"], r["step_ms"]["p50"],
                 r["step_ms"]["p95"], r["read_ms"]["mean"], r["compute_ms"]["mean"], r.get("rows_match")]
                for r in inp.runs["runs"]]
        out.csv("runs", ["config", "round", "order", "steps", "tokens_per_s", "step_p50_ms", "step_p95_ms",
                         "read_mean_ms", "compute_mean_ms", "rows_match"], rows)
        out.copy_inputs([out.root / "data" / "runs.csv"], "runs_summary.csv")
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
