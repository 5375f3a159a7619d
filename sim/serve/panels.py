"""The serving panels of a report: data tables from capacity tables and probes, and how to draw each one.

Data first (plain rows of numbers, each a CSV beside its figure), drawing last:

- :func:`goodput_by_device` -- per configuration: the requests/s it carries under the SLOs (median
  over seeds, band), the goodput and output tokens/s there, what failed first above it and why;
- :func:`latency_vs_load` -- per configuration and probed rate (means over the seeds that probed
  it): TTFT and TBT p50/p90/p99, goodput, the share of seeds meeting the SLOs;
- :func:`knee_breakdown` -- per configuration and rate: a decode token's time split into compute,
  reads alone, behind prefill reads, stalled, and TTFT into queueing, the prompt's rows streaming,
  the prompt's steps after them, on average and in the tail the SLO looks at: where the knee comes from;
- :func:`sim.serve.counterpart.counterpart_table` -- predicted vs measured on this machine.

Drawing: each ``plot_*`` function draws one panel on a matplotlib ``Axes`` the caller made (the
report's :class:`sim.report.plots.ReportFolder` style), with labelled axes and a legend, using only
the ``Axes`` methods -- this module imports no plotting package.  :data:`PANELS` lists them for the
report: name, title, data function, plot function.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .counterpart import counterpart_table
from .metrics import SLO
from .study import SERVE_AXES

__all__ = ["PANELS", "config_label", "goodput_by_device", "knee_breakdown", "latency_vs_load", "plot_counterpart",
           "plot_goodput", "plot_knee", "plot_latency_vs_load"]

_SEARCHED = ("rate", "repeat")
_TOKEN_PARTS = (("token_compute_ms", "compute"), ("token_reads_alone_ms", "decode reads alone (device)"),
                ("token_contention_ms", "behind prefill reads"), ("token_stall_ms", "stalled for prefill rows"))
_TTFT_PARTS = (("ttft_queue_ms", "queued"), ("ttft_prefill_reads_ms", "the prompt's rows streaming"),
               ("ttft_prefill_compute_ms", "the prompt's steps after its rows"))
_TAIL_PARTS = tuple(("tail_" + k, n) for k, n in _TOKEN_PARTS + _TTFT_PARTS)


def _varying(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    return [a for a in SERVE_AXES if a not in _SEARCHED and len({str(r.get(a)) for r in rows}) > 1]


def config_label(row: Mapping[str, Any], axes: Sequence[str]) -> str:
    """A configuration in words: its device, then the other ``axes`` as ``name=value``."""
    parts = [str(row["device"])] if "device" in axes or not axes else []
    parts += [f"{a}={row[a]}" for a in axes if a != "device"]
    return ", ".join(parts) or str(row.get("device", "configuration"))


def goodput_by_device(capacity_rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Rows ``{config, label, capacity_rps, low, high, lower_bound, fewest_requests, small_sample, below_min,
    min_rate, goodput_rps, output_tokens_per_s, knee_rate, knee_failed, knee_cause}`` of a serving capacity table, in its order."""
    axes = _varying(capacity_rows)
    out = []
    for r in capacity_rows:
        out.append({"config": r["config"], "label": config_label(r, axes), "capacity_rps": r["capacity_rps"],
                    "low": r["capacity_low"], "high": r["capacity_high"], "lower_bound": r["lower_bound"],
                    "fewest_requests": r.get("fewest_requests"), "small_sample": bool(r.get("small_sample")),
                    "below_min": bool(r.get("below_min")), "min_rate": r.get("min_rate"),
                    "goodput_rps": r["goodput_at_capacity"],
                    "output_tokens_per_s": r["output_tokens_per_s_at_capacity"], "knee_rate": r["knee_rate"],
                    "knee_failed": r["knee_failed"], "knee_cause": r["knee_cause"]})
    return out


def _by_config_rate(probes: Sequence[Mapping[str, Any]]) -> Dict[tuple, List[Mapping[str, Any]]]:
    groups: Dict[tuple, List[Mapping[str, Any]]] = {}
    for p in probes:
        groups.setdefault((int(p["config"]), float(p["rate"])), []).append(p)
    return dict(sorted(groups.items()))


def latency_vs_load(probes: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Rows ``{config, label, rate, seeds, ttft_p50_ms, ..., tbt_p99_ms, e2e_p99_ms, goodput_rps, met}`` (means
    over the seeds that probed the rate; ``met``: the share of them meeting the SLOs), by configuration and rate."""
    axes = _varying(probes)
    keys = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "e2e_p99_ms",
            "goodput_rps", "output_tokens_per_s", "device_busy")
    out = []
    for (c, rate), rs in _by_config_rate(probes).items():
        row = {"config": c, "label": config_label(rs[0], axes), "rate": rate, "seeds": len(rs)}
        row.update({k: float(np.mean([r[k] for r in rs])) for k in keys})
        row["met"] = float(np.mean([r["slo_met"] for r in rs]))
        out.append(row)
    return out


def knee_breakdown(probes: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Rows ``{config, label, rate, token_*_ms ..., ttft_*_ms ..., tail_*_ms ..., tbt_p99_ms, ttft_p99_ms}`` (means
    over seeds): where a decode token's time and a request's first token go, on average and in the tail the SLO
    looks at, by configuration and rate."""
    axes = _varying(probes)
    out = []
    for (c, rate), rs in _by_config_rate(probes).items():
        row = {"config": c, "label": config_label(rs[0], axes), "rate": rate}
        for k, _ in _TOKEN_PARTS + _TTFT_PARTS + _TAIL_PARTS:
            row[k] = float(np.mean([r[k] for r in rs]))
        row["tbt_p99_ms"] = float(np.mean([r["tbt_p99_ms"] for r in rs]))
        row["ttft_p99_ms"] = float(np.mean([r["ttft_p99_ms"] for r in rs]))
        out.append(row)
    return out


# =====================================================================================
# drawing (on an Axes the caller made)
# =====================================================================================
def plot_goodput(ax, rows: Sequence[Mapping[str, Any]]) -> None:
    """Bars: requests/s each configuration carries under the SLOs, with the band over seeds; a bar at its
    ``max_rate`` is marked as a lower bound."""
    x = np.arange(len(rows))
    cap = np.asarray([r["capacity_rps"] for r in rows], dtype=float)
    lo = cap - np.asarray([r["low"] for r in rows], dtype=float)
    hi = np.asarray([r["high"] for r in rows], dtype=float) - cap
    ax.bar(x, cap, color="#4477aa", label="capacity (lower median over seeds)")
    ax.errorbar(x, cap, yerr=[lo, hi], fmt="none", ecolor="black", capsize=4, label="band over seeds")
    for i, r in enumerate(rows):
        note = (">= " if r["lower_bound"] else "") + f"{r['capacity_rps']:.3g}"
        if r.get("knee_cause"):
            failed = "unfinished" if r["knee_failed"] == "unstable" else str(r["knee_failed"]).upper()
            note += f"\n{failed}: {r['knee_cause']}"
        ax.annotate(note, (i, cap[i]), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels([r["label"] for r in rows], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("requests/s meeting the SLOs")
    ax.set_xlabel("configuration")
    ax.set_ylim(0, max(float(np.max(cap + hi)) * 1.25 if len(rows) else 1.0, 1e-3))
    ax.legend(loc="upper left")


def plot_latency_vs_load(ax, rows: Sequence[Mapping[str, Any]], slo: Optional[SLO] = None,
                         metric: str = "tbt") -> None:
    """Lines: p50, p90 and p99 of ``metric`` (``"tbt"`` in ms or ``"ttft"`` in s) against the arrival rate, one
    colour per configuration; the SLO target as a dashed line."""
    scale, unit = (1.0, "ms") if metric == "tbt" else (1e-3, "s")
    configs = sorted({r["config"] for r in rows})
    for i, c in enumerate(configs):
        rs = sorted((r for r in rows if r["config"] == c), key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        color = f"C{i % 10}"
        for k, style in (("p50", ":"), ("p90", "--"), ("p99", "-")):
            ax.plot(x, [r[f"{metric}_{k}_ms"] * scale for r in rs], style, color=color, marker="o", markersize=3,
                    label=f"{rs[0]['label']} {k}" if k == "p99" or len(configs) == 1 else None)
    if slo is not None:
        target = slo.tbt_ms if metric == "tbt" else slo.ttft_s
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target p{slo.percentile:g} {target:g} {unit}")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel(f"{'time between tokens' if metric == 'tbt' else 'time to first token'} ({unit})")
    ax.set_title("p50 dotted, p90 dashed, p99 solid", fontsize=9)
    ax.set_yscale("log")
    ax.legend(fontsize=7)


def plot_knee(ax, rows: Sequence[Mapping[str, Any]], config: int) -> None:
    """Stacked areas: the time of a decode token in the SLO's tail (the slowest steps) by part against the arrival
    rate, for one configuration, with the TBT p99 it makes."""
    rs = sorted((r for r in rows if r["config"] == config), key=lambda r: r["rate"])
    if not rs:
        raise ValueError(f"no probes of configuration {config}")
    x = [r["rate"] for r in rs]
    ax.stackplot(x, *[[r["tail_" + k] for r in rs] for k, _ in _TOKEN_PARTS], labels=[n for _, n in _TOKEN_PARTS],
                 alpha=0.8)
    ax.plot(x, [r["tbt_p99_ms"] for r in rs], "k-", marker="o", markersize=3, label="TBT p99")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("time of a decode token in the slowest steps (ms)")
    ax.set_title(rs[0]["label"], fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")


def plot_counterpart(ax, rows: Sequence[Mapping[str, Any]]) -> None:
    """Paired bars: measured and predicted, each quantity of :func:`counterpart_table` over its measured value
    (1 = measured)."""
    rows = [r for r in rows if r["measured"] and math.isfinite(r["measured"])]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [1.0] * len(rows), 0.4, color="#999999", label="measured (= 1)")
    ax.bar(x + 0.2, [r["ratio"] for r in rows], 0.4, color="#4477aa", label="predicted / measured")
    for i, r in enumerate(rows):
        fmt = ",.0f" if r["unit"] == "reads" else ".3g"
        ax.annotate(f"{r['measured']:{fmt}} vs {r['predicted']:{fmt}} {r['unit']}", (i, max(1.0, r["ratio"])),
                    textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([r["quantity"] for r in rows], rotation=15, ha="right", fontsize=7)
    ax.set_ylabel("predicted / measured")
    ax.set_xlabel("quantity")
    ax.set_ylim(0, max([1.5] + [r["ratio"] * 1.3 for r in rows]))
    ax.legend(fontsize=7)


#: The panels the report draws: ``(name, title, data function, plot function, input)``; ``input`` says what the
#: data function takes (``"capacity"``: the capacity table's rows, ``"probes"``: its probes, ``"counterpart"``:
#: :func:`sim.serve.counterpart.predict_counterpart`'s result).
PANELS: List[tuple] = [
    ("serve_goodput", "Requests/s each configuration carries under the SLOs", goodput_by_device, plot_goodput,
     "capacity"),
    ("serve_tbt_vs_load", "Time between tokens against load", latency_vs_load, plot_latency_vs_load, "probes"),
    ("serve_ttft_vs_load", "Time to first token against load", latency_vs_load,
     lambda ax, rows, slo=None: plot_latency_vs_load(ax, rows, slo, metric="ttft"), "probes"),
    ("serve_knee", "Where a decode token's time goes as load grows", knee_breakdown, plot_knee, "probes"),
    ("serve_counterpart", "Predicted vs measured: a batch decoding while a prompt prefills", counterpart_table,
     plot_counterpart, "counterpart"),
]
