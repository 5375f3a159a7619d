"""The report's predicted figures: each draws the data of :mod:`sim.report.whatif` and writes its section.

Seed reproduction, tokens/s by threshold and by readers, the device models,
row caches and reuse (by cache size and by the reuse rate of the text),
step-latency CDFs, and what a planner can buy (drives, a shared cache, DRAM,
the tail; capacity: :mod:`sim.report.answer`).  Nothing here simulates:
every number comes in computed, and the CSV rows beside each figure are the
ones it was drawn from.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from engram.codec import ROW_BYTES
from engram.rowcache import DEFAULT_POLICY

from ..device import SEED_REFERENCE
from sim.core.params import DEFAULT_READERS, DEFAULT_THRESHOLD
from sim.core.schema import trace_label
from ..trace.rowcache import OPTIMAL
from .document import Doc
from .plots import ReportFolder, cache_axis, colors, pyplot
from .whatif import (CacheData, CdfData, PlannerData, ReadersData, ReuseData, SpeculativeData, ThresholdData,
                     gain_points)

__all__ = ["cache_section", "cdf_section", "devices_figure", "planner_section", "readers_section",
           "reuse_rate_section", "seed_section", "speculative_section", "threshold_section"]

_ENGRAM_ONLY = "Engram reads only, no model compute"


def _policy_label(threshold: int) -> str:
    return f"threshold {threshold}" if threshold <= SEED_REFERENCE["rows_per_step"] else f"serial ({threshold})"


#: How the figures name a row cache policy of the engine (:data:`engram.rowcache.POLICIES`).
_POLICY_NAMES = {"tinylfu": "W-TinyLFU", "lru": "LRU"}


def _cache_policy_name(policy: str) -> str:
    """The name the figures give a row cache policy (``"tinylfu"`` -> ``W-TinyLFU``, ``"lru"`` -> ``LRU``; another
    as it is)."""
    return _POLICY_NAMES.get(policy, policy)


def _cache_label(rows: int, policy: str) -> str:
    """A legend's row cache: ``no row cache``, or ``4,096-row W-TinyLFU cache`` (``policy`` the one simulated)."""
    return "no row cache" if not rows else f"{int(rows):,}-row {_cache_policy_name(policy)} cache"


def seed_section(doc: Doc, out: ReportFolder, r: dict) -> None:
    """The SPEC §8 seed reproduction ``r`` (:func:`sim.decode.seed_reproduction`): reference and simulator."""
    plt = pyplot()
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
          f"{ref[1]} tokens/s reading them with 16 readers (serial {SEED_REFERENCE['serial_us_per_row']} us a row, "
          f"concurrent {SEED_REFERENCE['concurrent_us_per_row']} us a row on "
          f"an Apple M3 Ultra SSD). The simulator's compute per step is fitted so that threshold 256 gives "
          f"{ref[0]} tokens/s ({r['compute_ms']:.2f} ms a step); with nothing else changed it predicts "
          f"**{r['predicted_tokens_per_s']:.2f} tokens/s** for threshold 8 ({r['error'] * 100:+.2f}% from "
          f"{ref[1]}; speed-up {r['speedup'] * 100:+.1f}% vs the reference's {r['reference_speedup'] * 100:+.1f}%).")
    out.add(doc, rel, data, "Seed reproduction: reference figures of SPEC §8 and the simulator's, tokens/s.")


def _measured_points(ax, meas: Sequence[dict], x_key: str, **style) -> None:
    """Measured points: the median of the repeats, bars from the slowest to the fastest."""
    m = [r["measured"] for r in meas]
    ax.errorbar([r[x_key] for r in meas], [v["tokens_per_s"] for v in m],
                yerr=[[v["tokens_per_s"] - min(v["tokens_per_s_runs"]) for v in m],
                      [max(v["tokens_per_s_runs"]) - v["tokens_per_s"] for v in m]], capsize=3, **style)


def _label_axes(ax, xlabel: str, ylabel: str, title: str, legend: str = "best", **title_kw) -> None:
    """A panel's labels, title and legend (at ``legend``)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, **title_kw)
    ax.legend(loc=legend)


def _log2_tokens_axes(ax, xlabel: str, title: str, **title_kw) -> None:
    """A panel of one session's tokens/s against a log2 axis: its scale, labels, title and legend."""
    ax.set_xscale("log", base=2)
    _label_axes(ax, xlabel, "decode tokens/s (one session)", title, **title_kw)


def threshold_section(doc: Doc, out: ReportFolder, d: ThresholdData, ref_compute) -> None:
    """Tokens/s by threshold (:func:`sim.report.whatif.threshold_data`)."""
    plt = pyplot()
    have_cal = bool(d.backend)
    fig, axes = plt.subplots(1, 2 if have_cal else 1, figsize=(13 if have_cal else 7, 4.8), squeeze=False)
    axes = axes[0]
    doc.h(1, "Tokens/s by threshold")
    doc.p("A batch with at least `threshold` distinct rows is read concurrently, smaller ones serially (SPEC §8). "
          "A decode step reads 48 distinct rows (24 columns of two tables, each column its own row range), so "
          "without a cache every threshold up to 48 reads concurrently and every threshold above reads serially: "
          "the curve is a step at 48. With a row cache a step reads only its misses, fewer than 48, and the "
          "threshold decides how many steps still read concurrently.")
    thr = d.thresholds
    if have_cal:
        ax = axes[0]
        cycle = colors()
        for ti, spec, ys, meas in d.machine:
            c = cycle[ti % len(cycle)]
            ax.plot(thr, ys, "-", color=c, label=f"{trace_label(spec)}: predicted")
            if meas:
                _measured_points(ax, meas, "threshold", fmt="o", color=c,
                                 label=f"{trace_label(spec)}: measured (median, min-max of repeats)")
        ax.axvline(48.5, color="gray", ls=":", lw=1)
        ax.annotate("48 rows a step", (48.5, ax.get_ylim()[1]), fontsize=8, ha="right", va="top", color="gray",
                    xytext=(-3, -3), textcoords="offset points")
        _log2_tokens_axes(ax, "threshold (distinct rows for a concurrent read, log scale)",
                          f"This machine ({d.backend}, {d.readers} readers; {_ENGRAM_ONLY})")
    ax = axes[-1]
    for (cache, ys), ls in zip(d.reference, ("-", "--")):
        ax.plot(thr, ys, ls, marker=".", label=_cache_label(cache, d.cache_policy))
    ax.axvline(48.5, color="gray", ls=":", lw=1)
    _log2_tokens_axes(ax, "threshold (distinct rows for a concurrent read, log scale)",
                      f"Reference SSD, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms a step), {DEFAULT_READERS} "
                      f"readers, {trace_label(d.reference_trace.source)}", fontsize=10)
    rel = out.save(fig, "threshold", "Decode tokens/s by read threshold")
    data = out.csv("threshold", ["device", "trace", "backend", "readers", "threshold", "cache_rows", "kind",
                                 "tokens_per_s", "min", "max"], d.rows)
    out.add(doc, rel, data, "Tokens/s by threshold: predicted lines, measured points (median of the repeats, bars "
                            "from the slowest to the fastest repeat).")


def readers_section(doc: Doc, out: ReportFolder, d: ReadersData, ref_compute) -> None:
    """Tokens/s by readers (:func:`sim.report.whatif.readers_data`)."""
    plt = pyplot()
    have_cal = d.main is not None
    doc.h(1, "Tokens/s by readers (queue depth)")
    doc.p("With threshold 8 a step's 48 rows are read by `readers` pread threads or an io_uring ring of that "
          "depth: the queue depth of the batch. More readers cut a step's read time until the device saturates "
          "or the per-batch cost of waking the readers dominates.")
    fig, axes = plt.subplots(1, 2 if have_cal else 1, figsize=(13 if have_cal else 7, 4.8), squeeze=False)
    axes = axes[0]
    if have_cal:
        ax = axes[0]
        backend_colors = {"pread": "#4C72B0", "io_uring": "#DD8452"}
        for be, ys, meas in d.machine:
            ax.plot(d.readers, ys, "-", color=backend_colors[be], label=f"{be}: predicted")
            if meas:
                _measured_points(ax, meas, "readers", fmt="o", color=backend_colors[be], label=f"{be}: measured")
        if d.serial is not None:
            y, yp = d.serial
            ax.axhline(y, color="gray", ls="--", lw=1.2, label=f"serial (threshold 256): measured {y:.0f}")
            ax.axhline(yp, color="gray", ls=":", lw=1.2, label=f"serial: predicted {yp:.0f}")
        _log2_tokens_axes(ax, "readers = io_uring ring depth = queue depth of a batch (log scale)",
                          f"This machine, {trace_label(d.main)} ({_ENGRAM_ONLY})")
    ax = axes[-1]
    for name, ys, serial in d.presets:
        ax.plot(d.readers, ys, "-o", ms=4, label=f"{name} (threshold {DEFAULT_THRESHOLD})")
        ax.axhline(serial, ls=":", lw=1, color=ax.lines[-1].get_color(), label=f"{name}: serial")
    _log2_tokens_axes(ax, "readers = queue depth of a batch (log scale)",
                      f"Device presets, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms a step), predicted",
                      fontsize=10)
    rel = out.save(fig, "readers", "Decode tokens/s by readers (queue depth)")
    data = out.csv("readers", ["device", "trace", "backend", "readers", "threshold", "kind", "tokens_per_s", "min",
                               "max"], d.rows)
    out.add(doc, rel, data, "Tokens/s by readers: predicted lines, measured points with the min-max of repeats; "
                            "horizontal lines: serial reads.")


def devices_figure(doc: Doc, out: ReportFolder, curves: List[tuple], rows: List[list]) -> None:
    """Read latency and IOPS by queue depth of each device model (:func:`sim.report.whatif.device_curves`)."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.6))
    for name, qs, lat, iops in curves:
        a1.plot(qs, lat, "-o", ms=3, label=name)
        a2.plot(qs, iops, "-o", ms=3, label=name)
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
    data = out.csv("devices", ["device", "queue_depth", "mean_latency_us", "iops"], rows)
    out.add(doc, rel, data, "The device models behind the predictions: this machine's as calibrated from the "
                            "engine's own reads (and fio's, for reference), and the presets.")


def cache_section(doc: Doc, out: ReportFolder, d: CacheData) -> None:
    """Reuse, row caches and what they buy (:func:`sim.report.whatif.cache_data`): two figures."""
    plt = pyplot()
    doc.h(1, "Reuse and row caches")
    doc.p("The engine reads the table uncached (SPEC §8: the win is concurrency, not caching); it can keep a row "
          "cache in front of the reads, shared by a model's sessions (`engram.RowCache`: raw records, LRU or "
          "W-TinyLFU). How much can a cache buy? The share of row reads that repeat an earlier row of the session "
          "is the most any cache can serve:")
    doc.table(["trace", "tokens", "row reads", "repeat an earlier row", "2-gram", "3-gram", "4-gram"],
              [[trace_label(s), st.tokens, st.reads, f"{st.reuse_rate * 100:.1f}%",
                *[f"{st.by_order.get(o, 0) * 100:.1f}%" for o in (2, 3, 4)]] for s, st in d.reuse.items()])
    doc.p("Trace coverage of the simulated sessions (a session that replays its trace would make its cache hit "
          "rows the text does not repeat): " + "; ".join(f"{trace_label(s)}: {w}" for s, w in d.wraps.items()) + ".")
    ncol = 1 + len(d.panels)
    fig, axes = plt.subplots(1, ncol, figsize=(5.2 * ncol, 4.6))
    ax = axes[0]
    sized = [c for c in d.sizes if c > 0]
    for spec, hr in d.hit_rates.items():
        rate = d.reuse[spec].reuse_rate
        line, = ax.plot(sized, [h * 100 for h in hr], "-o", ms=4,
                        label=f"{trace_label(spec)}: {_cache_policy_name(d.cache_policy)} hit rate")
        ax.axhline(rate * 100, color=line.get_color(), ls=":", lw=1,
                   label=f"{trace_label(spec)}: reuse rate {rate * 100:.1f}% (unbounded cache)")
    cache_axis(ax, sized)
    ax.set_xlabel("cache size per session (rows of 264 B, log scale)")
    ax.set_ylabel("row reads served by the cache (%)")
    first = next(iter(d.reuse.values()))
    ax.set_title(f"Hit rate by cache size ({first.tokens} tokens)")
    ax.legend(loc="best")
    for pi, (name, title) in enumerate(d.panels):
        ax = axes[1 + pi]
        for cname, spec, thr, ys in d.curves:
            if cname == name:
                ax.plot(cache_axis(ax, d.sizes), ys, "-" if thr == DEFAULT_THRESHOLD else "--", marker="o", ms=3,
                        label=f"{trace_label(spec)}, {_policy_label(thr)}")
        _label_axes(ax, "cache size per session (rows of 264 B, log scale)", "decode tokens/s (one session)", title,
                    fontsize=10)
    rel = out.save(fig, "cache", "What a row cache buys: hit rate and tokens/s by cache size")
    data = out.csv("cache", ["device", "trace", "backend", "readers", "threshold", "cache_rows", "cache_policy",
                             "cache_hit_rate", "tokens_per_s"], d.rows)
    out.csv("cache_hit_rate", ["trace", "cache_rows", "cache_policy", "cache_hit_rate", "reuse_rate"], d.hit_rows)
    out.add(doc, rel, data, f"Row cache per session, {_cache_policy_name(d.cache_policy)} (the policy simulated): "
                            "hit rate (dotted: the reuse rate, the limit of an unbounded cache) and predicted "
                            "tokens/s by cache size, threshold 8 (16 readers) and serial.")
    engine_cache_figure(doc, out, d)
    # tokens/s against the reuse actually served
    fig, axes2 = plt.subplots(1, len(d.panels), figsize=(6.5 * len(d.panels), 4.6), squeeze=False)
    for pi, (name, title) in enumerate(d.panels):
        ax = axes2[0][pi]
        for spec in d.reuse:
            for thr, mk in ((DEFAULT_THRESHOLD, "o"), (256, "s")):
                sel = gain_points(d, name, spec, thr)
                if not sel:
                    continue
                base = sel[0][4]
                ax.plot([p[3] * 100 for p in sel], [(p[4] / base - 1) * 100 for p in sel], "-" + mk, ms=4,
                        label=f"{trace_label(spec)}, {_policy_label(thr)}")
        _label_axes(ax, "row reads served by the cache (%)", "tokens/s gain over no cache (%)", title, fontsize=10)
    rel = out.save(fig, "reuse", "Tokens/s gain by reuse served from a row cache")
    data = out.csv("reuse", ["device", "trace", "threshold", "cache_hit_rate", "tokens_per_s", "gain"], d.gain_rows)
    out.add(doc, rel, data, "Tokens/s gain against the share of reads a cache serves (points: the cache sizes "
                            "above). Serial reads gain in proportion; concurrent reads gain less, since fewer rows "
                            "still take a round of reads.")


def engine_cache_figure(doc: Doc, out: ReportFolder, d: CacheData) -> None:
    """The engine's row cache by budget: each policy's hit rate beside the optimal bound, one session and several
    sessions sharing the text (:func:`sim.trace.rowcache.cache_curve`, the engine's policy code)."""
    if not d.engine:
        return
    plt = pyplot()
    counts = sorted({n for _, n in d.engine})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.6 * len(counts), 4.6), squeeze=False)
    styles = {"lru": "-o", "tinylfu": "-s", OPTIMAL: ":^"}
    for ai, n in enumerate(counts):
        ax = axes[0][ai]
        for (spec, m), curve in d.engine.items():
            if m != n:
                continue
            xs = [pt.bytes / 2**20 for pt in curve.points]
            color = None
            for name in (*curve.policies, OPTIMAL):
                line, = ax.plot(xs, [pt.hit_rate[name] * 100 for pt in curve.points], styles.get(name, "-"), ms=4,
                                color=color, label=f"{trace_label(spec)}: {name}")
                color = line.get_color()
        ax.set_xscale("log")
        ax.set_xlabel("row cache budget (MiB of 264-byte records, log scale)")
        ax.set_ylabel("row reads served by the cache (%)")
        ax.set_title(f"{n} session{'s' if n > 1 else ''} sharing one cache" + (" and the text" if n > 1 else ""),
                     fontsize=10)
        ax.legend(loc="best", fontsize=8)
    rel = out.save(fig, "engine_cache", "The engine's row cache: hit rate by budget and policy, and the optimal bound")
    data = out.csv("engine_cache", ["trace", "sessions", "bytes", "rows", "policy", "hit_rate"], d.engine_rows)
    out.add(doc, rel, data, "The engine's row cache (`EngramModel.open(path, cache=RowCache(SIZE, POLICY))`) replayed "
                            "on each trace by the engine's own policy code, a session's decode step one batch: hit "
                            "rate of LRU and W-TinyLFU by budget, dotted the optimal bound (Belady's MIN with "
                            "bypass); right, sessions sharing one cache and the text as the decode model runs them "
                            "(`engram sim trace reuse TRACE --cache-bytes ... --sessions N` prints these numbers).")


def cdf_section(doc: Doc, out: ReportFolder, d: CdfData) -> None:
    """Step-latency CDFs (:func:`sim.report.whatif.cdf_data`): measured vs predicted, or predicted only."""
    plt = pyplot()
    doc.h(1, "Step-latency CDFs")
    if d.picked:
        doc.p("Distribution of the time of a decode step (hash + read of 48 rows + the step's compute), measured "
              "(every step of every repeat) and predicted by the calibrated simulator for the same configuration.")
        n = d.picked
        cols = 2 if n > 1 else 1
        fig, axes = plt.subplots((n + 1) // 2, cols, figsize=(6.5 * cols, 4.0 * ((n + 1) // 2)), squeeze=False)
        for i, row, cfg, meas, pred, runs in d.measured:
            ax = axes[i // cols][i % cols]
            ym = np.arange(1, meas.size + 1) / meas.size
            yp = np.arange(1, pred.size + 1) / pred.size
            ax.plot(meas, ym, "-", lw=1.8, label=f"measured ({runs} runs x {cfg.steps} steps)")
            ax.plot(pred, yp, "--", lw=1.8, label=f"predicted ({pred.size} simulated steps)")
            ax.set_xscale("log")
            ax.set_xlabel("step latency (ms, log scale)")
            ax.set_ylabel("fraction of steps")
            pol = "serial" if cfg.serial else f"{cfg.backend} x{cfg.readers}"
            ax.set_title(f"{trace_label(cfg.trace)}, {pol}, compute {cfg.compute}", fontsize=10)
            ax.legend(loc="lower right")
        for j in range(n, ((n + 1) // 2) * cols):
            axes[j // cols][j % cols].set_visible(False)
        rel = out.save(fig, "step_cdf", "Step-latency CDFs: measured vs predicted")
        data = out.csv("step_cdf", ["config", "percentile", "measured_ms", "predicted_ms"], d.rows)
        out.add(doc, rel, data, "Cumulative distribution of step latency, measured (solid) and predicted (dashed).")
        return
    doc.p("No measured runs were given: predicted step-latency distributions on the reference SSD with the SPEC §8 "
          "compute, serial vs concurrent reads.")
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for lab, x in d.predicted:
        ax.plot(x, np.arange(1, x.size + 1) / x.size, label=lab)
    ax.set_xlabel("step latency (ms)")
    ax.set_ylabel("fraction of steps")
    ax.legend(loc="lower right")
    rel = out.save(fig, "step_cdf", "Step-latency CDFs on the reference SSD (predicted)")
    data = out.csv("step_cdf", ["config", "percentile", "predicted_ms", ""], d.rows)
    out.add(doc, rel, data, "Predicted step-latency CDFs (compute gamma-distributed, CV 0.05).")


_AXIS_TITLES = {"drives": "Drives striped (rows spread by row id)",
                "shared_cache_rows": f"The engine's row cache (RowCache, {_POLICY_NAMES[DEFAULT_POLICY]}) shared by "
                                     "every session",
                "dram_fraction": "A share of every table resident in DRAM"}
_AXIS_LABELS = {"drives": "identical drives the tables are striped over",
                "shared_cache_rows": "shared row cache (rows of 264 B, log scale)",
                "dram_fraction": "share of the tables resident in DRAM"}


def planner_section(doc: Doc, out: ReportFolder, d: PlannerData) -> None:
    """What a planner can buy (:func:`sim.report.whatif.planner_data`): capacity by drives, shared cache and
    DRAM share, and the step-latency tail with a measured latency distribution; one figure."""
    plt = pyplot()
    doc.h(1, "What a planner can buy: drives, a shared cache, DRAM, the tail")
    first = next(iter(d.capacities.values()))
    doc.p(f"Capacity (the most sessions whose slowest session reaches {d.spec.target:g} tokens/s, searched with "
          f"one seed up to {d.spec.max_sessions} sessions) on the reference SSD and a datasheet SSD whose other "
          f"figures are derived from its QD1 latency and IOPS, by what a planner can add: drives the tables are "
          f"striped over, a row cache shared by every session (the engine's own: "
          f"`EngramModel.open(path, cache=RowCache(SIZE))`, its default policy {_POLICY_NAMES[DEFAULT_POLICY]}, run "
          f"by the same policy code here; "
          + ", ".join(f"{int(v):,} rows = {int(v) * ROW_BYTES / 2**20:.3g} MiB" for v in d.axes.get("shared_cache_rows", ())
                      if int(v)) + f"), a share of the tables kept in DRAM. Each session "
          f"runs {d.steps} steps of a synthetic trace with SPEC §8's reuse rate ({d.trace_steps:,} tokens, "
          f"`{d.trace}`; {d.wrap}), threshold {DEFAULT_THRESHOLD}, {DEFAULT_READERS} readers. Assumptions: "
          f"{first.assumptions()}.")
    ncol = 3 + (1 if d.tail else 0)
    fig, axes = plt.subplots(1, ncol, figsize=(5.0 * ncol, 4.6))
    markers = {0: "o", 1: "s"}
    for ai, (axis, values) in enumerate(d.axes.items()):
        ax = axes[ai]
        for di, (label, dev) in enumerate(d.devices):
            caps = [d.capacities[(dev, axis, v)] for v in values]
            xs = cache_axis(ax, values) if axis == "shared_cache_rows" else list(values)
            ys = [c.capacity for c in caps]
            line, = ax.plot(xs, ys, "-" + markers[di % 2], ms=5, label=label)
            for x, c in zip(xs, caps):
                if c.lower_bound:
                    ax.annotate(">=", (x, c.capacity), xytext=(3, 3), textcoords="offset points", fontsize=7,
                                color=line.get_color())
            if axis in ("drives", "dram_fraction"):
                ideal = [ys[0] * (v / values[0] if axis == "drives" else 1 / max(1 - v, 1e-9)) for v in values]
                ax.plot(xs, ideal, ":", lw=1, color=line.get_color(),
                        label=f"{label}: x{'drives' if axis == 'drives' else ' 1 / (1 - share)'}")
        if axis == "drives":
            ax.set_xticks(list(values), [str(v) for v in values])
        ax.set_xlabel(_AXIS_LABELS[axis])
        ax.set_ylabel(f"sessions sustained at {d.spec.target:g} tokens/s")
        ax.set_title(_AXIS_TITLES[axis], fontsize=10)
        ax.set_ylim(0, None)
        ax.legend(loc="upper left", fontsize=7)
    if d.tail:
        ax = axes[-1]
        for label, name, counts, p99, p999 in d.tail:
            ls = "--" if name else "-"
            ax.plot(counts, p999, ls, marker="o", ms=4,
                    label=f"{label.split(' (')[0]}: {'tail of ' + name if name else 'own spread'}, p99.9")
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel("step latency p99.9 (ms)")
        ax.set_title(f"Tail latency with a measured distribution ({d.tail_steps} steps a session)", fontsize=10)
        ax.legend(loc="upper left", fontsize=7)
    rel = out.save(fig, "planner", "What a planner can buy: capacity by drives, shared cache and DRAM; the tail")
    data = out.csv("planner", ["device", "axis", "value", "capacity", "lower_bound", "phases",
                               "shared_cache_hit_rate_at_capacity", "dram_hit_rate_at_capacity",
                               "reads_per_s_at_capacity", "device_busy_at_capacity"], d.rows)
    out.csv("planner_tail", ["device", "latency_distribution", "sessions", "step_p50_ms", "step_p99_ms",
                             "step_p999_ms", "slowest_session_tokens_per_s"], d.tail_rows)
    out.add(doc, rel, data, "Capacity by drives striped, shared row-cache size and DRAM-resident share (dotted: "
                            "the capacity if it scaled with the drives or with the reads left to the device; >=: "
                            "a lower bound)"
                            + (f"; right: the step latency p99.9 by sessions with each device's own latency "
                               f"spread (solid) and with the distribution measured on {d.tail_label} scaled to "
                               "its means (dashed); numbers in data/planner_tail.csv" if d.tail else "") + ".")
    table = []
    for label, dev in d.devices:
        for axis, values in d.axes.items():
            for v in values:
                c = d.capacities[(dev, axis, v)]
                table.append([label, axis, v, f"{'>= ' if c.lower_bound else ''}{c.capacity}"])
    doc.table(["device", "axis", "value", "capacity (sessions)"], table)
    if not d.tail:
        doc.p("No measured latency distribution was at hand (no calibration, no `vm-virtio-16core-4k` preset): "
              "the tail panel is left out.")


def reuse_rate_section(doc: Doc, out: ReportFolder, d: ReuseData) -> None:
    """Tokens/s against the reuse rate of the text (:func:`sim.report.whatif.reuse_data`): one figure."""
    plt = pyplot()
    doc.p(f"How much does it matter how often the text repeats itself? Synthetic traces with a target reuse rate "
          f"(`synth:reuse=R`, shaped like code: {d.steps} tokens each; the rates they reached: "
          + ", ".join(f"{r:g} -> {m * 100:.1f}%" for r, (_, m) in d.traces.items())
          + f"), one session, threshold {DEFAULT_THRESHOLD} with {DEFAULT_READERS} readers, without and with a "
          f"per-session {_cache_policy_name(d.cache_policy)} row cache. Trace coverage: {'; '.join(d.wraps)}.")
    n = 1 + len(d.panels)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n, 4.6))
    measured = [d.traces[r][1] * 100 for r in d.rates]
    ax = axes[0]
    for c in d.caches:
        if c:
            ax.plot(measured, [d.hit[(r, c)] * 100 for r in d.rates], "-o", ms=4,
                    label=_cache_label(c, d.cache_policy))
    ax.plot(measured, measured, "k:", lw=1, label="the reuse rate (an unbounded cache)")
    ax.set_xlabel("reuse rate of the text (% of row reads repeating)")
    ax.set_ylabel("row reads served by the cache (%)")
    ax.set_title("Hit rate by reuse rate", fontsize=10)
    ax.legend(loc="upper left")
    for pi, (title, _) in enumerate(d.panels):
        ax = axes[1 + pi]
        for c in d.caches:
            ax.plot(measured, [d.tokens[(title, r, c)] for r in d.rates], "-o", ms=4,
                    label=_cache_label(c, d.cache_policy))
        _label_axes(ax, "reuse rate of the text (% of row reads repeating)", "decode tokens/s (one session)", title,
                    "lower right", fontsize=10)
    rel = out.save(fig, "reuse_rate", "Decode tokens/s against the reuse rate of the text")
    data = out.csv("reuse_rate", ["panel", "target_reuse", "reuse_rate", "cache_rows", "cache_hit_rate",
                                  "tokens_per_s", "trace"], d.rows)
    out.add(doc, rel, data, "Synthetic traces from no repeats to 80% of row reads repeating: the hit rate of a "
                            f"per-session {_cache_policy_name(d.cache_policy)} cache and one session's tokens/s, with "
                            "the SPEC §8 compute (where the reads are a few percent of a step) and without compute "
                            "(the reads alone).")


def speculative_section(doc: Doc, out: ReportFolder, d: SpeculativeData) -> None:
    """Tokens/s against the acceptance of a draft, k = 1, 2, 3, with and without prefetch, on two devices
    (:func:`sim.report.whatif.speculative_data`): one figure."""
    plt = pyplot()
    doc.h(1, "Speculative decoding")
    doc.p("DeepSeek V4 drafts the next k tokens and verifies them in one forward pass of k + 1 tokens, keeping "
          "the accepted prefix and one token of its own. For Engram a verification step reads the rows of all "
          "k + 1 tokens as one deduplicated batch (up to (k + 1) x 48 rows, at a higher queue depth), and the "
          "drafts' rows can be read a step early, while the previous step computes (prefetch). One session, "
          f"threshold {DEFAULT_THRESHOLD} with {DEFAULT_READERS} readers, the SPEC §8 compute ({d.compute_ms:.1f} ms "
          "a step, the same for a verification step: the model has no per-token term), "
          f"{d.steps} verification steps of {trace_label(d.trace)}; a rejected draft's rows are other rows of the "
          "table, read all the same.")
    fig, axes = plt.subplots(1, len(d.base), figsize=(6.5 * len(d.base), 4.6), squeeze=False)
    cmap = colors()
    for ai, dev in enumerate(d.base):
        ax = axes[0][ai]
        for ki, k in enumerate(d.drafts):
            for pf in (False, True):
                ax.plot(d.acceptance, d.tokens[(dev, k, pf)], "-" if pf else "--", marker="o" if pf else "s", ms=4,
                        color=cmap[ki], label=f"k = {k}, prefetch {'on' if pf else 'off'}")
        ax.axhline(d.base[dev], color="k", ls=":", lw=1, label="no drafts")
        ax.set_xlabel("acceptance of a draft (probability it is right)")
        ax.set_ylabel("decode tokens/s (one session, emitted tokens)")
        ax.set_ylim(bottom=0)
        ax.set_title(dev, fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
    rel = out.save(fig, "speculative", "Speculative decoding: tokens/s against the acceptance of a draft")
    data = out.csv("speculative", ["device", "draft_tokens", "prefetch", "acceptance", "tokens_per_s",
                                   "tokens_per_step", "stall_mean_ms"], d.rows)
    out.add(doc, rel, data, "Tokens/s by acceptance for k = 1, 2, 3 draft tokens a step, the drafts' rows read "
                            "a step early (solid) or with the step (dashed); dotted: decoding without drafts.")
