"""The answer a capacity study asks for: how many concurrent sessions each device sustains, with its assumptions.

The report leads with it.  Capacities come from the report's own search
(:func:`sim.report.whatif.capacity_data`: this machine's calibrated backends
and the device presets), from every capacity table given with ``--sweep``
(``engram sim capacity``), and, marked as such, from sweep tables that only
read a capacity off a grid over ``sessions`` (a ``kind = "capacity"`` plot).
Each is drawn with its band over the seeds, and stated with what it assumes:
the compute of a step, batching, the sessions' phases, the target and its
headroom under the compute-only ceiling.  Nothing here simulates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from sim.sweep.capacity import (BATCHING, CAPACITY_METRIC, CAPACITY_RULE, Capacity, CapacitySpec, capacity_of, compute_text,
                                phases_short, phases_text, pooled_compute, read_capacity)
from sim.check.crosscheck import largest_met
from ..sweep import AXES
from .document import Doc, anchor
from .inputs import device_label
from .plots import ReportFolder, colors, pyplot, spread_labels

__all__ = ["Entry", "answer_section", "capacity_figure", "compute_phrase", "entries_from_capacity_table",
           "grid_entries", "search_section"]


@dataclass
class Entry:
    """One capacity of the answer: ``label`` (the device and what else varies), where it comes from
    (``source``), and the :class:`~sim.sweep.capacity.Capacity` (``cap``) or, read off a grid, ``grid``
    ``(capacity, lower bound, largest count, row at capacity)`` with the ``spec`` it was read at, or, from
    the cross-check of measured runs, ``checked`` (:func:`entries_from_crosscheck`)."""

    label: str
    source: str
    spec: CapacitySpec
    cap: Optional[Capacity] = None
    grid: Optional[tuple] = None
    config: Optional[Dict[str, Any]] = None
    tag: str = "report"
    checked: Optional[Dict[str, Any]] = None

    def name(self) -> str:
        """The entry as the figure names it: its label and, in brackets, where it comes from."""
        return f"{self.label} [{self.tag}]"

    @property
    def searched(self) -> bool:
        return self.cap is not None

    def value(self) -> int:
        if self.checked is not None:
            return int(self.checked["value"])
        return self.cap.capacity if self.cap is not None else int(self.grid[0])

    def band(self) -> str:
        if self.checked is not None:
            c = self.checked
            if c["kind"] == "measured":
                return f"- (medians of {c['repeats']} repeats, grid {c['grid']})"
            return f"{c['low']}-{c['high']} over the 90% interval (grid {c['grid']})"
        if self.cap is None:
            return "- (one grid, no seeds)"
        c = self.cap
        return f"{c.low}-{c.high}" + (f" over {len(c.per_seed)} seeds" if len(c.per_seed) > 1 else " (one seed)")

    def shown(self) -> str:
        if self.checked is not None:
            return f"{'>= ' if self.checked['bound'] else ''}{self.checked['value']}"
        if self.cap is not None:
            words = self.cap.bracket_words()  # a coarse search's bracket (--resolution), as engram sim capacity says
            if words is not None:
                return words[0]
            return f"{'>= ' if self.cap.lower_bound else ''}{self.cap.capacity}"
        cap, bound, top, _ = self.grid
        return f"{'>= ' if bound else ''}{cap}"

    def ran(self) -> Dict[str, Any]:
        """What the capacity was found with: the configuration and its phases as run (the probes' or the grid
        row's ``phases_run``)."""
        if self.cap is not None:
            return self.cap.phases
        return dict(self.grid[3]) if self.grid is not None else dict(self.config or {})

    def phases(self) -> str:
        """The session phases in words, as run (never assumed)."""
        if self.checked is not None:
            return self.checked["phases"]
        return phases_text(self.ran())

    def phases_short(self) -> str:
        if self.checked is not None:
            return self.checked["phases_short"]
        return phases_short(self.ran())

    def compute(self) -> str:
        """The compute of a step in words: nominal, and the mean and cv drawn."""
        if self.checked is not None:
            return self.checked["compute"]
        if self.cap is not None:
            return compute_text(self.cap.config, self.cap.compute_ms, self.cap.compute_realised)
        at = self.grid[3]
        return compute_text(at, float(at["compute_mean_ms"]), pooled_compute([at]))

    def assumptions_short(self) -> str:
        """Compute and headroom in a few words (phases: :meth:`phases`; the full sentence:
        :meth:`Capacity.assumptions`)."""
        if self.checked is not None:
            comp = self.checked["compute_ms"]
            hash_ms = 0.0
        else:
            cfg = self.cap.config if self.cap is not None else self.config
            comp = self.cap.compute_ms if self.cap is not None else float(self.grid[3]["compute_mean_ms"])
            hash_ms = float(cfg.get("hash_us", 0.0)) * 1e-3
        if comp + hash_ms <= 0:  # no compute and no hash: nothing bounds a session but its reads
            return f"compute {self.compute()}; no compute-only ceiling (a step is its reads alone)"
        ceiling = 1e3 / (comp + hash_ms)
        head = 1 - self.spec.target / ceiling
        return f"compute {self.compute()}; target {head:.1%} under the ceiling {ceiling:.2f} tokens/s"


def entries_from_crosscheck(xc: Mapping[str, Any]) -> List[Entry]:
    """The measured and the predicted capacity of every multi-session group of the cross-check
    (``crosscheck.json["capacity"]``: one per mode, sessions as threads of one process or as processes),
    two :class:`Entry` each, with the compute and phases the runs had.

    The predicted capacity's band is the capacity of the predicted interval's slow and fast bounds; the
    compute is the measured runs' mean step compute beside the simulator's; the phases are the start
    spread of the sessions' first steps, as measured and replayed by the simulator."""
    out: List[Entry] = []
    srows = xc.get("session_rows") or []
    for c in xc.get("capacity") or []:
        keys = ("trace", "threshold", "backend", "readers", "compute", "steps", "mode")
        group = sorted((r for r in srows if all(r.get(k) == c[k] for k in keys)), key=lambda r: r["sessions"])
        grid = [int(n) for n in c["sessions"]]
        target = float(c["target_tokens_per_s"])
        spec = CapacitySpec(target=target, seeds=1, max_sessions=max(grid))
        meas_ms = float(np.median([r["measured"]["compute_mean_ms"] for r in group])) if group else float("nan")
        pred_ms = float(np.median([r["predicted"]["compute_mean_ms"] for r in group])) if group else float("nan")
        spread = float(np.median([r["predicted"]["start_spread_s"] for r in group])) * 1e3 if group else float("nan")
        repeats = int(min(r["repeats"] for r in group)) if group else 0
        phases = (f"each session started where it started in the measured run (the starts spread over a median "
                  f"{spread:.3g} ms; the simulator replays each run's own offsets)")
        compute = (f"{meas_ms:.2f} ms a step measured (compute '{c['compute']}'), {pred_ms:.2f} ms in the "
                   "simulator (the calibration's, in each run's window)")
        cfg = {"threshold": c["threshold"], "backend": c["backend"], "readers": c["readers"], "cache_rows": 0}
        lo = largest_met(c.get("predicted_slowest_low") or c["predicted_slowest"], target)
        hi = largest_met(c.get("predicted_slowest_high") or c["predicted_slowest"], target)
        common = {"grid": " ".join(str(n) for n in grid), "phases": phases, "phases_short": f"spread {spread:.2g} ms",
                  "compute": compute, "compute_ms": meas_ms, "repeats": repeats, "row": c, "group": group}
        label = f"this machine, sessions as {c['mode']}"
        src = f"cross-check of measured runs ({c['trace_label']}, {c['steps']} steps)"
        out.append(Entry(label, src, spec, config=cfg, tag="measured",
                         checked={**common, "kind": "measured", "value": int(c["measured_capacity"]),
                                  "bound": bool(c["all_met"]["measured"])}))
        out.append(Entry(label, src, spec, config=cfg, tag="predicted",
                         checked={**common, "kind": "predicted", "value": int(c["predicted_capacity"]),
                                  "bound": bool(c["all_met"]["predicted"]),
                                  "low": grid[lo] if lo >= 0 else 0, "high": grid[hi] if hi >= 0 else 0}))
    return out


def _policy_text(cfg: Mapping[str, Any]) -> str:
    depth = "ring depth" if cfg["backend"] == "io_uring" else "readers"
    text = f"threshold {cfg['threshold']}, {cfg['readers']} {depth}"
    if cfg.get("cache_rows"):
        text += f", {cfg['cache_rows']:,}-row cache"
    return text


def _varying_label(cfg: Mapping[str, Any], axes: Sequence[str]) -> str:
    """A configuration's name: its device, and the other axes that vary in its study."""
    parts = [device_label(str(cfg["device"]))] if "device" in cfg else []
    parts += [f"{a} {cfg[a]}" for a in axes if a not in ("device", "sessions", "repeat")]
    return ", ".join(parts) or "the configuration"


def entries_from_capacity_table(path: Path) -> List[Entry]:
    """The capacities of a capacity table (``engram sim capacity``), one :class:`Entry` per configuration.

    Raises
    ------
    FormatError
        Unreadable tables.
    """
    rows, probes, meta = read_capacity(path)
    spec = CapacitySpec(**(meta.get("capacity") or {}))
    name = (meta.get("study") or {}).get("name") or path.stem
    axes = [a for a in meta.get("axes", []) if a in AXES]
    out = []
    for r in rows:
        cfg = {a: r[a] for a in AXES if a in r}
        cfg.update(sessions=1, repeat=0)
        per_seed = [int(x) for x in str(r["capacities"]).split()]
        cap = Capacity(int(r["config"]), cfg, spec, per_seed, [c >= spec.max_sessions for c in per_seed],
                       [p for p in probes if p.get("config") == r["config"]])
        if not cap.probes:  # the probes table is gone: the compute is still in the row
            cap.probes = [{**cfg, "compute_mean_ms": r["compute_mean_ms"], "sessions": 0, "repeat": 0}]
        out.append(Entry(_varying_label(cfg, axes), f"study '{name}' (`{path.name}`)", spec, cap=cap, config=cfg,
                         tag=f"study {name}"))
    return out


def grid_entries(rows: Sequence[Mapping[str, Any]], axes: Sequence[str], plot: Mapping[str, Any], name: str,
                 path: Path) -> List[Entry]:
    """Capacities read off a sweep grid over ``sessions`` (a ``kind = "capacity"`` plot of the study)."""
    target = float(plot.get("target", CapacitySpec().target))
    y = plot.get("y", CAPACITY_METRIC)
    spec = CapacitySpec(target=target, seeds=1, max_sessions=max(int(r["sessions"]) for r in rows),
                        metric=y if y.startswith("session_tokens_per_s") else CAPACITY_METRIC)
    others = [a for a in axes if a not in ("sessions", "repeat")]
    groups: Dict[tuple, List[Mapping]] = {}
    for r in rows:
        groups.setdefault(tuple(r[a] for a in others), []).append(r)
    out = []
    for key, rs in groups.items():
        cap, bound = capacity_of(rs, target, spec.metric)
        at = next((r for r in rs if r["sessions"] == cap), rs[0])
        cfg = dict(rs[0])
        out.append(Entry(_varying_label(cfg, others), f"study '{name}' (`{path.name}`, read off a grid)", spec,
                         grid=(cap, bound, max(r["sessions"] for r in rs), at), config=cfg, tag=f"grid {name}"))
    return out


def capacity_figure(out: ReportFolder, name: str, title: str, entries: Sequence[Entry]) -> str:
    """Two panels: the slowest session's tokens/s by sessions (every probe; the line: the median seed's search)
    with the target, and each entry's capacity with its band over the seeds.  Returns the figure's path."""
    plt = pyplot()
    searched = [e for e in entries if e.searched]
    n = len(entries)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13.5, max(4.6, 0.42 * n + 2.0)),
                                  gridspec_kw={"width_ratios": [1.15, 1]})
    cycle = colors()
    targets = sorted({e.spec.target for e in entries})
    for e in searched:
        c = cycle[searched.index(e) % len(cycle)]  # one colour per entry in both panels
        cap = e.cap
        med = cap.median_seed()
        line = sorted((p for p in cap.probes if p["repeat"] == med and p["sessions"] > 0), key=lambda p: p["sessions"])
        rest = [p for p in cap.probes if p["repeat"] != med and p["sessions"] > 0]
        ax.plot([p["sessions"] for p in line], [p[e.spec.metric] for p in line], "-o", ms=3.5, color=c,
                label=f"{e.name()}: {e.shown()} ({e.phases_short()})")
        if rest:
            ax.plot([p["sessions"] for p in rest], [p[e.spec.metric] for p in rest], "o", ms=3, color=c, alpha=0.35)
    for t in sorted({e.spec.target for e in searched}):
        ax.axhline(t, color="k", ls="--", lw=1, label=f"target {t:g} tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent sessions on the device (log scale)")
    ax.set_ylabel("tokens/s of the slowest session")
    ax.set_title("Every probe of the search (line: the median seed's)", fontsize=10)
    if searched:
        ax.legend(loc="lower left", fontsize=7)
    # right: the answer, one row per entry, with its band
    ys = np.arange(n)[::-1]
    labels = []
    checked_colour = {"measured": "#C44E52", "predicted": "#8172B2"}
    for y, e in zip(ys, entries):
        c = cycle[searched.index(e) % len(cycle)] if e.searched else "0.4"
        v = max(e.value(), 0.5)
        if e.cap is not None:
            lo, hi = max(e.cap.low, 0.5), max(e.cap.high, 0.5)
            ax2.errorbar([v], [y], xerr=[[v - lo], [hi - v]], fmt="o", ms=7, capsize=4, color=c)
        elif e.checked is not None and e.checked["kind"] == "predicted":
            lo, hi = max(e.checked["low"], 0.5), max(e.checked["high"], 0.5)
            ax2.errorbar([v], [y], xerr=[[max(v - lo, 0)], [max(hi - v, 0)]], fmt="D", ms=6, capsize=4,
                         color=checked_colour["predicted"])
        elif e.checked is not None:
            ax2.plot([v], [y], "s", ms=7, color=checked_colour["measured"])
        else:
            ax2.plot([v], [y], "s", ms=7, mfc="white", color=c)
        shown = f"{e.name()}, {e.phases_short()}"
        labels.append(shown if len(shown) <= 64 else shown[:62] + "..")
    ax2.set_xscale("log", base=2)
    top = max([_bound(e, "high") for e in entries] + [1])
    bottom = min(_bound(e, "low") for e in entries)
    lo, hi = (0.4 if bottom < 1 else bottom / 2.5), top * 3.2
    ax2.set_xlim(lo, hi)
    ticks = [2.0 ** k for k in range(0, int(np.log2(hi)) + 1) if lo <= 2.0 ** k]
    ticks = ([0.5] if lo < 1 else []) + ticks[::max(1, len(ticks) // 8)]
    ax2.set_xticks(ticks, ["0" if t < 1 else f"{t:,.0f}" for t in ticks])  # a capacity of 0 sits at 0.5
    ax2.set_ylim(-0.7, n - 0.3)
    ax2.set_yticks(ys, labels, fontsize=8)
    ax2.set_xlabel(f"sessions sustained at >= {', '.join(f'{t:g}' for t in targets)} tokens/s each (log scale)")
    ax2.set_ylabel("device [where the capacity comes from], session phases")
    ax2.set_title("Capacity: lower median of the seeds, bars from the smallest to the largest"
                  + ("\nthis machine: measured (square), predicted (diamond; bar: its 90% interval)"
                     if any(e.checked is not None for e in entries) else ""), fontsize=10)
    ax2.grid(axis="y", visible=False)
    spread_labels(ax2, [(max(e.value(), 0.5), y, f"{e.shown()}" + _label_note(e), "k") for y, e in zip(ys, entries)])
    return out.save(fig, name, title)


def _bound(e: Entry, side: str) -> int:
    """The ``"low"`` or ``"high"`` end of a capacity's band (its value where it has none)."""
    if e.cap is not None:
        return getattr(e.cap, side)
    if e.checked is not None and e.checked["kind"] == "predicted":
        return (min if side == "low" else max)(e.checked[side], e.value())
    return e.value()


def _label_note(e: Entry) -> str:
    """What follows a capacity's number in the figure: its band, or how it was found."""
    if e.cap is not None:
        return f"  [{e.cap.low}-{e.cap.high}]" if e.cap.low != e.cap.high else ""
    if e.checked is not None:
        c = e.checked
        band = f" [{c['low']}-{c['high']}]" if c["kind"] == "predicted" and c["low"] != c["high"] else ""
        return f" {c['kind']}{band}"
    return " (grid)"


def target_reason(e: Entry) -> str:
    """Why an entry's capacity is stated at its target, in words: this machine's measured runs have their own
    target (:data:`sim.measure.configs.MEASURED_CAPACITY_TARGET`, for their own compute), the presets and studies
    the report's (``--target``) or their table's."""
    if e.checked is not None:
        ms = e.checked.get("compute_ms")
        ceiling = f", a ceiling of {1e3 / ms:.0f} tokens/s" if ms and np.isfinite(ms) and ms > 0 else ""
        return (f"the target of this machine's measured multi-session runs, whose steps compute "
                f"{ms:.3g} ms{ceiling} (engram measure --capacity-target)")
    if e.grid is not None:
        return "the target read off the sweep grid (the study's capacity plot)"
    if e.source.startswith("this report"):
        return "the target of this report's search on the device presets (engram report --target)"
    return f"the target of {e.source}"


def target_reasons(entries: Sequence[Entry]) -> List[str]:
    """The distinct :func:`target_reason` of ``entries``, in order."""
    return list(dict.fromkeys(target_reason(e) for e in entries))


def by_target(entries: Sequence[Entry]) -> Dict[float, List[Entry]]:
    """``entries`` grouped by target tokens/s (ascending): one table and one figure each, never two targets on
    one axis."""
    out: Dict[float, List[Entry]] = {}
    for e in sorted(entries, key=lambda e: e.spec.target):
        out.setdefault(e.spec.target, []).append(e)
    return out


def _assumptions_text(searched: Sequence[Entry]) -> str:
    """The sentence of assumptions of the searched entries (one per distinct set, naming its sources)."""
    said: Dict[str, List[str]] = {}
    for e in searched:
        said.setdefault(e.cap.assumptions(), [])
        if e.source not in said[e.cap.assumptions()]:
            said[e.cap.assumptions()].append(e.source)
    if len(said) == 1:
        return "Assumptions: " + "".join(f"{a[0].upper()}{a[1:]}." for a in said)
    if said:
        return "Assumptions: " + " ".join(f"for {' and '.join(srcs)}: {a}." for a, srcs in said.items())
    return f"Assumptions: batching {BATCHING}."


def _capacity_rows(entries: Sequence[Entry]) -> List[list]:
    """The rows of ``capacity.csv``: every probe of a search, every session count of a cross-check, or
    the grid point a capacity was read off."""
    rows = []
    for e in entries:
        if e.cap is not None:
            for p in e.cap.probes:
                if p["sessions"] > 0:
                    rows.append([e.label, e.tag, e.source, p["repeat"], p["seed"], p["sessions"], p[e.spec.metric],
                                 e.spec.target, p[e.spec.metric] >= e.spec.target, p["device_busy"],
                                 p["reads_per_s"], e.phases_short()])
        elif e.checked is not None:
            c = e.checked["row"]
            ys = c["measured_slowest"] if e.checked["kind"] == "measured" else c["predicted_slowest"]
            rows += [[e.label, e.tag, e.source, 0, "", n, y, e.spec.target, y >= e.spec.target, "", "",
                      e.phases_short()] for n, y in zip(c["sessions"], ys)]
        else:
            at = e.grid[3]
            rows.append([e.label, e.tag, e.source, 0, at.get("seed", ""), at["sessions"], at[e.spec.metric],
                         e.spec.target, at[e.spec.metric] >= e.spec.target, at["device_busy"], at["reads_per_s"],
                         e.phases_short()])
    return rows


def answer_section(doc: Doc, out: ReportFolder, entries: Sequence[Entry], details: Optional[str]) -> List[str]:
    """The report's first section: the capacity of every entry, its band and assumptions, the figure and its
    data.  ``details`` is the heading of the section that says how it was found.  Returns the headline lines."""
    doc.h(1, "Answer: concurrent sessions each device sustains")
    if not entries:
        doc.p("No capacity was computed.")
        return []
    targets = sorted({e.spec.target for e in entries})
    searched = [e for e in entries if e.searched]
    doc.p("The largest number of sessions decoding at once on one device while **every session still reaches "
          + (f"{targets[0]:g} tokens/s** (the slowest session's rate). " if len(targets) == 1 else
             "its target tokens/s** (the slowest session's rate; one table and one figure per target, each "
             "with the reason for its target). ")
          + (f"Found by search: {searched[0].spec.search_words()}, once per seed of an "
             f"ensemble; the capacity is {CAPACITY_RULE} and the band runs from the smallest to the "
             "largest. " if searched else "")
          + ("Rows marked *read off a grid* only bracket the capacity between two session counts of a sweep. "
             if any(e.grid is not None for e in entries) else "")
          + ("Rows *measured* and *predicted* come from the cross-check of this machine's multi-session runs: the "
             "largest session count of the measured grid whose slowest session reached the target, measured and "
             "as the calibrated simulator predicted it (band: the capacity of the prediction's 90% interval)."
             if any(e.checked is not None for e in entries) else ""))
    groups = by_target(entries)
    for target, es in groups.items():
        doc.p(f"**Target {target:g} tokens/s**: {'; '.join(target_reasons(es))}.")
        doc.table(["device", "read policy", "capacity (sessions)", "band", "target tokens/s", "phases", "assumes",
                   "from"],
                  [[e.label, _policy_text(e.cap.config if e.cap is not None else e.config), e.shown(), e.band(),
                    f"{e.spec.target:g}", e.phases_short(), e.assumptions_short(),
                    e.source + (f" [{e.tag}]" if e.checked is not None else "")]
                   for e in es])
    doc.p(_assumptions_text(searched)
          + " With batched decode several sessions would share one step's compute and every capacity here would "
            "change." + (f" How it was found: [{details}](#{anchor(details)})." if details else ""))
    checked = [e for e in entries if e.checked is not None]
    if checked:
        doc.p("For the measured and predicted capacities of this machine: " + " ".join(
            f"sessions as {e.checked['row']['mode']}: target {e.spec.target:g} tokens/s for the slowest session, "
            f"compute {e.compute()}, phases: {e.phases()}; batching {BATCHING}."
            for e in checked if e.checked["kind"] == "measured"))
    data = out.csv("capacity", ["device", "kind", "source", "seed_index", "seed", "sessions",
                                "slowest_session_tokens_per_s", "target", "passed", "device_busy", "reads_per_s",
                                "phases"], _capacity_rows(entries))
    for i, (target, es) in enumerate(groups.items()):  # one figure, one axis, one target each
        name = "capacity" if i == 0 else f"capacity_at_{target:g}".replace(".", "_")
        rel = capacity_figure(out, name, f"Capacity: sessions a device sustains at {target:g} tokens/s", es)
        out.add(doc, rel, data, f"At {target:g} tokens/s ({'; '.join(target_reasons(es))}). Left: the slowest "
                                "session's tokens/s at every session count the search probed (faint: the other "
                                f"seeds), with the sessions' phases. Right: each device's capacity, {CAPACITY_RULE}, "
                                "with a bar from the smallest to the largest"
                                + ("; this machine's measured capacity next to the predicted one"
                                   if any(e.checked is not None for e in es) else "") + ".")
    return [f"Capacity at {e.spec.target:g} tokens/s per session: {e.label} {e.shown()} sessions "
            f"({e.band()}; {e.phases_short()}; {e.source} [{e.tag}])" for e in entries]


def compute_phrase(row: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] = ()) -> str:
    """The compute of a sweep row in words (its mean is the row's ``compute_mean_ms``), with the compute drawn
    over ``rows`` (default: the row alone) when the table has it."""
    return compute_text(row, float(row.get("compute_mean_ms", row.get("compute_ms", 0.0))),
                        pooled_compute(list(rows) or [row]))


def search_section(doc: Doc, d, heading: str) -> None:
    """How the report's own capacities were found (``d``: :class:`sim.report.whatif.CapacityData`): the
    configuration, the search, and each device's seeds, probes and state at capacity."""
    doc.h(1, heading)
    if not d.entries:
        return
    spec = d.spec
    first = d.entries[0][1]
    cfg = first.config
    doc.p(f"Each device runs S sessions at once on trace `{d.trace}` (threshold {cfg['threshold']}, "
          f"{cfg['readers']} readers, {cfg['steps']} steps a session, sessions at {phases_text(first.phases)}); "
          f"each session computes {d.compute_ms:.2f} ms a step on its own, so only the reads contend. The search "
          f"probes {spec.search_words()} (a probe fails when the slowest session falls below {spec.target:g} "
          f"tokens/s), independently for {spec.seeds} seed{'' if spec.seeds == 1 else 's'}; each probe's seed derives "
          f"from the report's seed and the probe's point only, so the same inputs give the same capacities.")
    a = first.assumptions()
    doc.p(f"Assumptions: {a[0].upper()}{a[1:]}.")
    table = []
    for label, c in d.entries:
        one = c.at(1)
        at = c.at(c.capacity, c.median_seed()) if c.capacity else None
        real = c.compute_realised
        table.append([label, f"{'>= ' if c.lower_bound else ''}{c.capacity}", " ".join(str(x) for x in c.per_seed),
                      len(c.probes), phases_short(c.phases), f"{real[0]:.2f} ({real[1]:.3g})",
                      one[spec.metric] if one else float("nan"),
                      at[spec.metric] if at else float("nan"), at["device_busy"] if at else float("nan"),
                      at["reads_per_s"] if at else float("nan")])
    doc.table(["device", "capacity", "per seed", "probes", "phases (as run)", "compute drawn, ms (CV)",
               "tokens/s, one session", "slowest session at capacity",
               "device busy at capacity", "reads/s at capacity"], table)
