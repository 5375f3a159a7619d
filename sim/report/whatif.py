"""The numbers behind the report's figures: every simulation the report runs, and the rows of its data tables.

Each function here computes one figure's data -- predicted curves, the
measured points they are compared with (from the cross-check), and the CSV
rows of ``data/NAME.csv`` -- and draws nothing; :mod:`sim.report.sections`
draws them and never simulates.  All simulations are seeded: the same
inputs give the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from engram.errors import ArgumentError
from engram.rowcache import DEFAULT_POLICY as DEFAULT_CACHE_POLICY

from sim.sweep.capacity import (CAPACITY_MAX_SESSIONS, CAPACITY_TARGET, Capacity, CapacitySpec, SearchRun, capacity_of,
                                find_capacity, phases_short)
from ..decode import DecodeRun, seed_reproduction, simulate_decode
from ..decode.speculative import Speculation
from ..device import SEED_REFERENCE, load_device, preset, preset_names, with_tail
from sim.core.params import DEFAULT_PHASES, DEFAULT_READERS, DEFAULT_THRESHOLD, Compute, Policy
from sim.core.schema import RunConfig, trace_label
from ..sweep import AXES
from ..trace import SynthSpec, Trace, load_trace, reuse_stats
from ..trace.rowcache import OPTIMAL, cache_curve
from .inputs import WHATIF_TOKENS, Inputs, device_label

__all__ = ["CACHE_ROWS", "CAPACITY_TARGET", "DRAM_FRACTIONS", "DRIVES", "PLANNER_SSD", "READERS",
           "REPORT_MAX_SESSIONS", "REPORT_SEEDS", "REUSE_RATES", "SHARED_CACHE_ROWS", "SIM_STEPS", "THRESHOLDS",
           "SPECULATIVE_ACCEPTANCE", "SPECULATIVE_DEVICES", "SpeculativeData", "capacity_data", "capacity_of",
           "planner_data", "reuse_data", "simulate", "speculative_data", "tail_shape"]

#: The largest session count the report's capacity search probes (the capacity search's: the galloping stops at the
#: first count that fails, so only a device that sustains more than 512 sessions probes 1,024).
REPORT_MAX_SESSIONS = CAPACITY_MAX_SESSIONS
#: Seeds of the report's capacity search, per device (a capacity study chooses its own).
REPORT_SEEDS = 3
#: Thresholds of the threshold figure (a decode step reads 48 distinct rows).
THRESHOLDS = (1, 2, 4, 8, 16, 24, 32, 40, 44, 46, 47, 48, 49, 52, 64, 128, 256)
#: Reader counts (= ring depths) of the readers figure.
READERS = (1, 2, 4, 8, 16, 32, 64)
#: Row-cache sizes of the cache figures, rows.
CACHE_ROWS = (0, 64, 256, 1024, 4096, 16384, 65536)
#: Steps per simulated curve point.
SIM_STEPS = 2000

#: The reference device of the what-if panels.
SEED_DEVICE = SEED_REFERENCE["device"]


def simulate(trace, device, policy: Policy, compute: Compute, *, steps: int, seed: int = 0, hash_time: float = 0.0,
             sessions: int = 1, speculation: Optional[Speculation] = None):
    """One decode simulation as the report runs them (fast mode, a coarse timeline; sessions at the default
    phases, :data:`sim.core.params.DEFAULT_PHASES`).

    The report picks ``steps`` itself (a stretch replayed to average out simulation noise), so the run is
    named as the report's what-if in any trace warning (``replay`` of :func:`sim.decode.simulate_decode`)."""
    phases = DEFAULT_PHASES
    dev = device if isinstance(device, str) else getattr(device, "name", type(device).__name__)
    src = trace if isinstance(trace, str) else getattr(trace, "source", "trace")
    name = (f"report what-if on {dev} ({src}, threshold {policy.threshold}, {policy.backend} x{policy.readers}"
            f"{f', cache {policy.cache_rows} rows {policy.cache_policy}' if policy.cache_rows else ''}, "
            f"{sessions} session(s), {steps} steps)")
    return simulate_decode(trace, device, policy, compute,
                           DecodeRun(sessions=sessions, steps=steps, mode="fast", seed=seed, hash_time=hash_time,
                                     phases=phases, bins=4, replay=name), speculation=speculation)


def policy(threshold: int, backend: str, readers: int, cache_rows: int = 0,
           cache_policy: str = DEFAULT_CACHE_POLICY) -> Policy:
    """The engine's policy for ``threshold``, ``backend`` and ``readers`` (ring depth = readers), with a
    per-session row cache of ``cache_rows`` rows run by ``cache_policy`` (default the engine's,
    :data:`engram.rowcache.DEFAULT_POLICY`).  The figures name the policy from the :class:`Policy` they
    simulated (``cache_policy`` of each figure's data)."""
    return Policy(threshold=int(threshold), backend=backend, readers=int(readers), ring_depth=int(readers),
                  cache_rows=int(cache_rows), cache_policy=cache_policy)


def seed_figures() -> Tuple[dict, Compute]:
    """The SPEC §8 seed reproduction (:func:`sim.decode.seed_reproduction`) and its fitted compute per step."""
    r = seed_reproduction()
    return r, Compute(r["compute_ms"] * 1e-3)


def _steps(quick: bool) -> int:
    return 400 if quick else SIM_STEPS


def _measured_range(row: Mapping) -> Tuple[float, float]:
    runs = row["measured"]["tokens_per_s_runs"]
    return min(runs), max(runs)


# ------------------------------------------------------------------- threshold
@dataclass
class ThresholdData:
    """Tokens/s by threshold: this machine's lines (``(colour index, trace, predicted, measured rows)``) at
    ``backend`` x ``readers``, and the reference SSD's (``(cache rows, predicted)``) on ``reference_trace``, its
    row cache run by ``cache_policy`` (of the :class:`Policy` simulated)."""

    thresholds: Sequence[int]
    backend: str = ""
    readers: int = 0
    machine: List[tuple] = field(default_factory=list)
    reference: List[tuple] = field(default_factory=list)
    reference_trace: Optional[Trace] = None
    rows: List[list] = field(default_factory=list)
    cache_policy: str = ""


def threshold_data(inp: Inputs, ref_compute: Compute, quick: bool) -> ThresholdData:
    """Predicted tokens/s by threshold on this machine (when calibrated, with the measured points of the
    configuration measured at most thresholds) and on the reference SSD without and with a row cache."""
    steps = _steps(quick)
    d = ThresholdData(THRESHOLDS if not quick else (4, 8, 32, 47, 48, 49, 64, 256))
    if inp.cal is not None:
        main = inp.main_trace()
        xc = [r for r in inp.xc_rows() if r["compute"] == "none"]
        pairs: Dict[tuple, set] = {}
        for r in xc:
            if not r["serial"] and r["trace"] == main:
                pairs.setdefault((r["backend"], r["readers"]), set()).add(r["threshold"])
        if pairs:
            be, k = max(pairs, key=lambda p: (len(pairs[p]), p[1], p[0] == "pread"))
        else:
            be, k = inp.backends()[0], DEFAULT_READERS
        d.backend, d.readers = be, k
        comp = inp.cal.compute_model("none")
        traces = [main] if main else list(inp.traces)
        traces += [t for t in inp.traces if t not in traces][:2]
        for ti, spec in enumerate(traces):
            if spec not in inp.traces and spec not in inp.run_traces:
                continue
            tr = inp.machine_trace(spec)
            ys = []
            for t in d.thresholds:
                r = simulate(tr, inp.cal.device(be), policy(t, be, k), comp, steps=steps, hash_time=inp.cal.hash_s)
                ys.append(r.tokens_per_s)
                d.rows.append(["this machine", trace_label(spec), be, k, t, 0, "predicted", r.tokens_per_s, "", ""])
            meas = [r for r in xc if r["trace"] == spec and (r["serial"] or (r["backend"], r["readers"]) == (be, k))]
            for r in meas:
                d.rows.append(["this machine", trace_label(spec), r["backend"], r["readers"], r["threshold"], 0,
                               "measured", r["measured"]["tokens_per_s"], *_measured_range(r)])
            d.machine.append((ti, spec, ys, meas))
    seed = preset(SEED_DEVICE)
    tr = d.reference_trace = next(iter(inp.traces.values()))
    for cache in (0, 4096):
        ys = []
        for t in d.thresholds:
            pol = policy(t, "pread", DEFAULT_READERS, cache)
            if cache:
                d.cache_policy = pol.cache_policy
            r = simulate(tr, seed, pol, ref_compute, steps=steps)
            ys.append(r.tokens_per_s)
            d.rows.append([SEED_DEVICE, tr.source, "pread", DEFAULT_READERS, t, cache, "predicted", r.tokens_per_s,
                           "", ""])
        d.reference.append((cache, ys))
    return d


# --------------------------------------------------------------------- readers
@dataclass
class ReadersData:
    """Tokens/s by readers: this machine's lines per backend (``(backend, predicted, measured rows)``) on
    ``main``, its serial lines (measured, predicted), and each preset's (``(name, predicted, serial)``)."""

    readers: Sequence[int]
    main: Optional[str] = None
    machine: List[tuple] = field(default_factory=list)
    serial: Optional[Tuple[float, float]] = None
    presets: List[tuple] = field(default_factory=list)
    preset_trace: Optional[Trace] = None
    rows: List[list] = field(default_factory=list)


def readers_data(inp: Inputs, ref_compute: Compute, quick: bool) -> ReadersData:
    """Predicted tokens/s by readers at the default threshold: this machine's backends (with the measured
    points) and every device preset, next to their serial reads."""
    steps = _steps(quick)
    d = ReadersData(READERS if not quick else (1, 4, 16))
    thr = DEFAULT_THRESHOLD
    if inp.cal is not None:
        main = d.main = inp.main_trace() or next(iter(inp.traces))
        tr = inp.machine_trace(main)
        comp = inp.cal.compute_model("none")
        xc = [r for r in inp.xc_rows() if r["compute"] == "none" and r["trace"] == main]
        for be in inp.backends():
            ys = []
            for k in d.readers:
                r = simulate(tr, inp.cal.device(be), policy(thr, be, k), comp, steps=steps, hash_time=inp.cal.hash_s)
                ys.append(r.tokens_per_s)
                d.rows.append(["this machine", trace_label(main), be, k, thr, "predicted", r.tokens_per_s, "", ""])
            meas = sorted((r for r in xc if not r["serial"] and r["backend"] == be), key=lambda r: r["readers"])
            for r in meas:
                d.rows.append(["this machine", trace_label(main), be, r["readers"], r["threshold"], "measured",
                               r["measured"]["tokens_per_s"], *_measured_range(r)])
            d.machine.append((be, ys, meas))
        ser = [r for r in xc if r["serial"]]
        if ser:
            y = float(np.median([r["measured"]["tokens_per_s"] for r in ser]))
            yp = float(np.median([r["predicted"]["tokens_per_s"] for r in ser]))
            d.serial = (y, yp)
            d.rows.append(["this machine", trace_label(main), "serial", 1, 256, "measured", y, "", ""])
            d.rows.append(["this machine", trace_label(main), "serial", 1, 256, "predicted", yp, "", ""])
    tr = d.preset_trace = next(iter(inp.traces.values()))
    for name in preset_names():
        try:
            dev = preset(name)
        except ArgumentError:
            continue
        ys = []
        for k in d.readers:
            r = simulate(tr, dev, policy(thr, "pread", k), ref_compute, steps=steps)
            ys.append(r.tokens_per_s)
            d.rows.append([name, trace_label(tr.source), "any", k, thr, "predicted", r.tokens_per_s, "", ""])
        r = simulate(tr, dev, policy(256, "pread", 1), ref_compute, steps=steps)
        d.rows.append([name, trace_label(tr.source), "serial", 1, 256, "predicted", r.tokens_per_s, "", ""])
        d.presets.append((name, ys, r.tokens_per_s))
    return d


def device_curves(inp: Inputs) -> Tuple[List[tuple], List[list]]:
    """Mean read latency and IOPS by queue depth of every device model behind the predictions:
    ``([(name, depths, latency us, IOPS)], csv rows)``."""
    devs: List[Tuple[str, Any]] = []
    if inp.cal is not None:
        devs += [(f"this machine, engine {be}", inp.cal.devices[be]) for be in inp.backends()]
        if inp.cal.fio_device is not None:
            devs.append(("this machine, fio 4 KiB", inp.cal.fio_device))
    for n in preset_names():
        try:
            devs.append((n, preset(n)))
        except ArgumentError:
            continue
    curves, rows = [], []
    for name, dev in devs:
        qs = [q for q in dev.depths() if q <= 256]
        lat = [dev.mean_latency(q) * 1e6 for q in qs]
        iops = [q / (v * 1e-6) for q, v in zip(qs, lat)]
        curves.append((name, qs, lat, iops))
        rows += [[name, q, v, i] for q, v, i in zip(qs, lat, iops)]
    return curves, rows


# ----------------------------------------------------------------------- cache
@dataclass
class CacheData:
    """Row caches: each trace's reuse statistics and the per-session cache's hit rates by cache size (``hit_rates``:
    those of the simulations behind the tokens/s, the policy ``cache_policy`` of the :class:`Policy` simulated), and
    per device panel (``(name, title)``) tokens/s by cache size for thresholds 8 and 256 (``(panel, trace,
    threshold, hit rate, tokens/s)`` points)."""

    sizes: Sequence[int]
    reuse: Dict[str, Any] = field(default_factory=dict)
    hit_rates: Dict[str, List[float]] = field(default_factory=dict)
    panels: List[Tuple[str, str]] = field(default_factory=list)
    curves: List[tuple] = field(default_factory=list)
    points: List[tuple] = field(default_factory=list)
    rows: List[list] = field(default_factory=list)
    hit_rows: List[list] = field(default_factory=list)
    gain_rows: List[list] = field(default_factory=list)
    wraps: Dict[str, str] = field(default_factory=dict)
    engine: Dict[tuple, Any] = field(default_factory=dict)
    engine_rows: List[list] = field(default_factory=list)
    cache_policy: str = ""


def cache_data(inp: Inputs, ref_compute: Compute, quick: bool) -> CacheData:
    """Reuse, hit rates and predicted tokens/s by per-session row-cache size (the engine's default policy), on
    this machine (when calibrated) and on the reference SSD.  A size's hit rate is the one its simulations
    report (the same in every panel and at every threshold: which rows hit depends on the trace, not the
    device)."""
    steps = _steps(quick)
    d = CacheData(CACHE_ROWS if not quick else (0, 256, 4096))
    for spec, tr in inp.traces.items():
        d.reuse[spec] = reuse_stats(tr)
        d.wraps[spec] = tr.wraps(min(steps, tr.steps)).summary()
    sized = [c for c in d.sizes if c > 0]
    for spec, tr in inp.traces.items():
        for n in (1, ENGINE_CACHE_SESSIONS):  # the engine's cache: its policies, replayed on the trace
            curve = cache_curve(tr, ENGINE_CACHE_BYTES[:3] if quick else ENGINE_CACHE_BYTES, sessions=n)
            d.engine[(spec, n)] = curve
            d.engine_rows += [[trace_label(spec), n, pt.bytes, pt.rows, name, pt.hit_rate[name]]
                              for pt in curve.points for name in (*curve.policies, OPTIMAL)]
    panels = []
    if inp.cal is not None:
        be = inp.backends()[0]
        panels.append(("this machine", inp.cal.device(be), inp.cal.compute_model("none"), inp.cal.hash_s, be,
                       f"This machine ({be}, Engram reads only)"))
    panels.append((SEED_DEVICE, preset(SEED_DEVICE), ref_compute, 0.0, "pread",
                   f"Reference SSD, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms)"))
    k = DEFAULT_READERS
    hit: Dict[int, Dict[str, float]] = {}  # cache rows -> trace -> hit rate of the first simulation
    for name, dev, comp, hs, be, title in panels:
        d.panels.append((name, title))
        for spec, tr in inp.traces.items():
            for thr in (DEFAULT_THRESHOLD, 256):
                ys = []
                for c in d.sizes:
                    pol = policy(thr, be, k, c)
                    d.cache_policy = pol.cache_policy
                    r = simulate(tr, dev, pol, comp, steps=min(steps, tr.steps), hash_time=hs)
                    ys.append(r.tokens_per_s)
                    if c and spec not in hit.setdefault(c, {}):
                        hit[c][spec] = r.cache_hit_rate
                    d.rows.append([name, trace_label(spec), be, k, thr, c, pol.cache_policy if c else "",
                                   r.cache_hit_rate, r.tokens_per_s])
                    d.points.append((name, spec, thr, r.cache_hit_rate, r.tokens_per_s))
                d.curves.append((name, spec, thr, ys))
    for spec in inp.traces:
        d.hit_rates[spec] = [hit[c][spec] for c in sized]
        d.hit_rows += [[trace_label(spec), c, d.cache_policy, h, d.reuse[spec].reuse_rate]
                       for c, h in zip(sized, d.hit_rates[spec])]
    for name, _title in d.panels:
        for spec in inp.traces:
            for thr in (DEFAULT_THRESHOLD, 256):
                sel = gain_points(d, name, spec, thr)
                if sel:
                    base = sel[0][4]
                    d.gain_rows += [[name, trace_label(spec), thr, p[3], p[4], p[4] / base - 1] for p in sel]
    return d


def gain_points(d: CacheData, name: str, spec: str, threshold: int) -> List[tuple]:
    """The points of one panel, trace and threshold, by increasing cache hit rate."""
    return sorted((p for p in d.points if p[0] == name and p[1] == spec and p[2] == threshold), key=lambda p: p[3])


# ------------------------------------------------------------------------- CDF
@dataclass
class CdfData:
    """Step-latency CDFs: with measurements, ``(panel, cross-check row, configuration, measured ms, predicted ms,
    runs)`` for each of the ``picked`` configurations whose trace was saved; without, ``(label, predicted ms)``
    on the reference SSD."""

    measured: List[tuple] = field(default_factory=list)
    picked: int = 0
    predicted: List[tuple] = field(default_factory=list)
    rows: List[list] = field(default_factory=list)


def _pick_cdf_rows(inp: Inputs) -> List[dict]:
    """Up to four measured configurations: serial, pread near 4 readers, io_uring at most readers, one with
    compute, one on another trace (on the main trace where possible)."""
    xc = inp.xc_rows()
    main = inp.main_trace()
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
    return pick[:4]


def cdf_data(inp: Inputs, ref_compute: Compute, quick: bool) -> CdfData:
    """Step-latency distributions: measured against predicted for up to four measured configurations, or,
    without measurements, predicted on the reference SSD for serial and concurrent reads."""
    d = CdfData()
    if inp.cal is not None and inp.runs is not None and inp.xc_rows():
        pick = _pick_cdf_rows(inp)
        d.picked = len(pick)
        runs_by: Dict[str, List[dict]] = {}
        for r in inp.runs["runs"]:
            runs_by.setdefault(r["config"], []).append(r)
        for i, row in enumerate(pick):
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
            r = simulate(tr, inp.cal.device(cfg.backend, cfg.compute), policy(cfg.threshold, cfg.backend, cfg.readers),
                         inp.cal.compute_model(cfg.compute), steps=steps, hash_time=inp.cal.hash_s)
            pred = np.sort(r.step_latencies.reshape(-1)) * 1e3
            d.measured.append((i, row, cfg, meas, pred, len(runs_by[row["key"]])))
            for p in (1, 5, 10, 25, 50, 75, 90, 95, 99):
                d.rows.append([row["key"], p, float(np.percentile(meas, p)), float(np.percentile(pred, p))])
        return d
    tr = next(iter(inp.traces.values()))
    dev = preset(SEED_DEVICE)
    comp = Compute(ref_compute.mean, "gamma", 0.05)
    for thr, k, lab in ((256, DEFAULT_READERS, "serial (threshold 256)"), (8, 4, "threshold 8, 4 readers"),
                        (8, DEFAULT_READERS, "threshold 8, 16 readers")):
        r = simulate(tr, dev, policy(thr, "pread", k), comp, steps=_steps(quick))
        x = np.sort(r.step_latencies.reshape(-1)) * 1e3
        d.predicted.append((lab, x))
        d.rows += [[lab, p, float(np.percentile(x, p)), ""] for p in (1, 5, 10, 25, 50, 75, 90, 95, 99)]
    return d


# -------------------------------------------------------------------- capacity
@dataclass
class CapacityData:
    """Capacity: the search's ``spec`` and, per device, ``(label, Capacity)``; the trace and compute it used."""

    trace: str
    compute_ms: float
    spec: CapacitySpec
    entries: List[Tuple[str, Capacity]] = field(default_factory=list)


def capacity_data(inp: Inputs, ref_compute: Compute, *, target: float = CAPACITY_TARGET,
                  compute_ms: Optional[float] = None, seeds: Optional[int] = None,
                  max_sessions: Optional[int] = None, quick: bool = False, jobs: Optional[int] = None,
                  progress=True) -> CapacityData:
    """The capacity of each device (this machine's calibrated backends and every preset) at ``target``, found
    by :func:`sim.sweep.capacity.find_capacity`: the default threshold and readers, each session with its own compute
    (the SPEC §8 reference unless ``compute_ms``), sessions at random phases (:data:`sim.core.params.DEFAULT_PHASES`,
    set explicitly: the capacities state it as the probes ran it).  Seeds come from the report's
    fixed study seed (0) and each probe's point, so the same inputs give the same capacities."""
    spec = CapacitySpec(float(target), int(seeds or (2 if quick else REPORT_SEEDS)),
                        int(max_sessions or (128 if quick else REPORT_MAX_SESSIONS)))
    comp_ms = float(compute_ms) if compute_ms is not None else ref_compute.mean * 1e3
    trace_spec = next(iter(inp.traces))
    tr = inp.traces[trace_spec]
    devices: List[Tuple[str, str, str]] = []  # (label, device spec, backend)
    if inp.cal is not None and inp.cal_path is not None:
        for be in inp.backends():
            devices.append((f"this machine ({be})", "calibrated", be))
    for n in preset_names():
        try:
            preset(n)
        except ArgumentError:
            continue
        devices.append((n, n, "pread"))
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace=trace_spec, trace_limit=tr.steps, steps=100 if quick else 300,
                threshold=DEFAULT_THRESHOLD, readers=DEFAULT_READERS, phases=DEFAULT_PHASES)
    if compute_ms is None:
        base.update(compute="reference")
    else:
        base.update(compute="", compute_ms=comp_ms)
    configs = [dict(base, device=spec_, backend=be) for _, spec_, be in devices]
    caps, _ = find_capacity(configs, spec, 0, calibration=inp.cal_path, traces={trace_spec: tr},
                            run=SearchRun(jobs=jobs, progress=progress, desc="capacity"))
    return CapacityData(trace_spec, comp_ms, spec, [(label, c) for (label, _, _), c in zip(devices, caps)])


# ------------------------------------------------------------------- planner
#: The datasheet SSD of the planner's panels: QD1 latency and random-read IOPS only, the rest derived
#: (:func:`sim.device.ssd_from_figures`).
PLANNER_SSD = "ssd:qd1_us=80,iops=100000"
#: Identical drives the tables are striped over, by row id.
DRIVES = (1, 2, 4)
#: Sizes of the row cache shared by every session, rows of 264 B (65,536 rows: 17 MB).
SHARED_CACHE_ROWS = (0, 4096, 65536)
#: Budgets of the engine's row cache (``engram.RowCache``) whose hit rates the report shows by policy, beside
#: the optimal bound, for one session and for :data:`ENGINE_CACHE_SESSIONS` sessions sharing the text.
ENGINE_CACHE_BYTES = ("256K", "1M", "4M", "16M", "64M")
ENGINE_CACHE_SESSIONS = 4
#: Shares of every table resident in DRAM.
DRAM_FRACTIONS = (0.0, 0.25, 0.5, 0.75)
#: Sessions the planner's capacity searches bisect to: the capacity is found to within this many sessions.
PLANNER_RESOLUTION = 8
#: Reuse rate of the planner's synthetic trace: SPEC §8's measured 22.5% of row reads repeating.
PLANNER_REUSE = 0.225


@dataclass
class PlannerData:
    """What a planner can buy, per device (``(label, spec)``): the capacity at ``spec.target`` by drives striped,
    shared row-cache size and DRAM-resident share (``capacities[(device spec, axis, value)]``), and the step
    latency tail by sessions with the device's own latency spread and with ``tail_label``'s measured one
    (``tail``: ``(device label, tail label or "", sessions, p99 ms, p99.9 ms)``)."""

    devices: List[Tuple[str, str]]
    axes: Dict[str, Sequence]
    trace: str
    trace_steps: int
    steps: int
    spec: CapacitySpec
    compute_ms: float
    capacities: Dict[tuple, Capacity] = field(default_factory=dict)
    tail_label: str = ""
    tail_steps: int = 0
    tail: List[tuple] = field(default_factory=list)
    wrap: str = ""
    rows: List[list] = field(default_factory=list)
    tail_rows: List[list] = field(default_factory=list)


def tail_shape(inp: Inputs) -> Optional[Tuple[str, Any]]:
    """The measured latency distribution the tail panel lends the devices: this machine's calibrated device
    (its first backend) when there is one, else the ``vm-virtio-16core-4k`` preset (fio on a virtual disk);
    ``None`` when neither is at hand."""
    if inp.cal is not None:
        for be in inp.backends():
            dev = inp.cal.devices[be]
            if not dev.is_point():
                return f"this machine ({be}, calibrated)", dev
    try:
        return "vm-virtio-16core-4k (fio, measured)", preset("vm-virtio-16core-4k")
    except ArgumentError:
        return None


def planner_data(inp: Inputs, ref_compute: Compute, *, target: float = CAPACITY_TARGET,
                 compute_ms: Optional[float] = None, quick: bool = False, jobs: Optional[int] = None,
                 progress=True) -> PlannerData:
    """Capacity on the reference SSD and a datasheet SSD (:data:`PLANNER_SSD`; ``quick``: the reference SSD
    alone) by drives striped (:data:`DRIVES`), a row cache shared by every session (:data:`SHARED_CACHE_ROWS`)
    and a DRAM-resident share of the tables (:data:`DRAM_FRACTIONS`), one seed each, at random phases, on a
    synthetic trace of SPEC §8's reuse rate long enough that no probe's sessions read the same steps (a shared
    cache would count those as hits); and the step-latency p99 / p99.9 by sessions with each device's own
    latency spread and a measured one (:func:`tail_shape`)."""
    steps = 20 if quick else 30
    spec = CapacitySpec(float(target), 1, 256 if quick else 512, resolution=PLANNER_RESOLUTION)
    # the shared cache is the engine's (engram.RowCache with its default policy), run by its own code
    trace_spec = SynthSpec(PLANNER_REUSE, tokens=spec.max_sessions * steps).spec()
    tr = load_trace(trace_spec)
    comp_ms = float(compute_ms) if compute_ms is not None else ref_compute.mean * 1e3
    axes = {"drives": DRIVES if not quick else (1, 2),
            "shared_cache_rows": SHARED_CACHE_ROWS if not quick else (0, 65536),
            "dram_fraction": DRAM_FRACTIONS if not quick else (0.0, 0.5)}
    devices = [(SEED_DEVICE, SEED_DEVICE)]
    if not quick:
        devices.append((f"datasheet {device_label(PLANNER_SSD)}", PLANNER_SSD))
    d = PlannerData(devices, axes, trace_spec, tr.steps, steps, spec, comp_ms)
    d.wrap = tr.wraps(steps, spec.max_sessions).summary()
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace=trace_spec, trace_limit=tr.steps, steps=steps, threshold=DEFAULT_THRESHOLD,
                readers=DEFAULT_READERS, phases=DEFAULT_PHASES, cache_policy=DEFAULT_CACHE_POLICY)
    if compute_ms is None:
        base.update(compute="reference")
    else:
        base.update(compute="", compute_ms=comp_ms)
    _planner_capacities(d, base, tr, jobs, progress)
    shape = tail_shape(inp)
    if shape is not None:
        _tail_curves(d, tr, shape, target, quick)
    return d


def _planner_capacities(d: PlannerData, base: Mapping[str, Any], tr: Trace, jobs: Optional[int], progress) -> None:
    """Every (device, axis, value) of ``d`` searched in one :func:`find_capacity` (configurations that coincide,
    such as each axis at its default, searched once)."""
    configs: List[dict] = []
    where: Dict[tuple, int] = {}
    for _, dev in d.devices:
        for axis, values in d.axes.items():
            for v in values:
                cfg = dict(base, device=dev, **{axis: v})
                if cfg not in configs:
                    configs.append(cfg)
                where[(dev, axis, v)] = configs.index(cfg)
    caps, _ = find_capacity(configs, d.spec, 0, traces={d.trace: tr},
                            run=SearchRun(jobs=jobs, progress=progress, desc="planner"))
    nan = float("nan")
    for key, i in where.items():
        d.capacities[key] = c = caps[i]
        at = c.at(c.capacity) if c.capacity else {}
        d.rows.append([*key, c.capacity, c.lower_bound, phases_short(c.phases), at.get("shared_cache_hit_rate", nan),
                       at.get("dram_hit_rate", nan), at.get("reads_per_s", nan), at.get("device_busy", nan)])


def _tail_curves(d: PlannerData, tr: Trace, shape: Tuple[str, Any], target: float, quick: bool) -> None:
    """Step latency p99 / p99.9 of each device of ``d`` by sessions (up to 90% of its throughput bound at
    ``target``), with its own latency spread and with ``shape``'s measured one (:func:`sim.device.with_tail`)."""
    d.tail_label, shape_dev = shape
    d.tail_steps = 100 if quick else 300
    comp = Compute(d.compute_ms * 1e-3)
    shares = (0.0, 0.5, 0.9) if quick else (0.0, 0.25, 0.5, 0.75, 0.9)
    for label, dev_spec in d.devices:
        dev = load_device(dev_spec)
        bound = dev.peak_iops() / (SEED_REFERENCE["rows_per_step"] * target)
        counts = sorted({max(1, int(round(bound * f))) for f in shares})
        for name, device in (("", dev), (d.tail_label, with_tail(dev, shape_dev))):
            p99, p999 = [], []
            for n in counts:
                r = simulate(tr, device, policy(DEFAULT_THRESHOLD, "pread", DEFAULT_READERS), comp,
                             steps=d.tail_steps, sessions=n)
                p99.append(r.step_ms["p99"])
                p999.append(r.step_ms["p999"])
                d.tail_rows.append([label, name or "own", n, r.step_ms["p50"], r.step_ms["p99"], r.step_ms["p999"],
                                    min(r.tokens_per_s_per_session)])
            d.tail.append((label, name, counts, p99, p999))


# ----------------------------------------------------------------------- reuse
#: Reuse rates of the reuse figure (synthetic traces ``synth:reuse=R``).
REUSE_RATES = (0.0, 0.1, 0.225, 0.5, 0.8)
#: Per-session row-cache sizes of the reuse figure.
REUSE_CACHE_ROWS = (0, 4096, 65536)


@dataclass
class ReuseData:
    """Tokens/s against the reuse rate of the text: per synthetic trace (``traces``: target rate -> spec,
    measured rate), per cache size, the per-session cache's hit rate (its policy ``cache_policy``, of the
    :class:`Policy` simulated) and one session's tokens/s in each panel (``(title, device name, compute)``);
    ``wraps``: each trace's :meth:`~sim.trace.Trace.wraps` summary."""

    rates: Sequence[float]
    caches: Sequence[int]
    steps: int
    traces: Dict[float, Tuple[str, float]] = field(default_factory=dict)
    panels: List[Tuple[str, str]] = field(default_factory=list)
    hit: Dict[Tuple[float, int], float] = field(default_factory=dict)
    tokens: Dict[Tuple[str, float, int], float] = field(default_factory=dict)
    wraps: List[str] = field(default_factory=list)
    rows: List[list] = field(default_factory=list)
    cache_policy: str = ""


def reuse_data(inp: Inputs, ref_compute: Compute, quick: bool) -> ReuseData:
    """One session's tokens/s against the reuse rate of the text: synthetic traces at :data:`REUSE_RATES`
    (shaped like code, :mod:`sim.trace.synth`), threshold 8 with 16 readers, without and with a per-session
    row cache (the engine's default policy), on the reference SSD with the SPEC §8 compute and with no compute
    (Engram reads only), and on this machine (reads only) when calibrated."""
    tokens = 500 if quick else WHATIF_TOKENS
    d = ReuseData(REUSE_RATES if not quick else (0.0, 0.225, 0.5), REUSE_CACHE_ROWS if not quick else (0, 4096),
                  tokens)
    panels = [(f"Reference SSD, SPEC §8 compute ({ref_compute.mean * 1e3:.1f} ms)", preset(SEED_DEVICE),
               ref_compute, 0.0, "pread"),
              ("Reference SSD, Engram reads only", preset(SEED_DEVICE), Compute(0.0), 0.0, "pread")]
    if inp.cal is not None:
        be = inp.backends()[0]
        panels.append((f"This machine ({be}), Engram reads only", inp.cal.device(be), inp.cal.compute_model("none"),
                       inp.cal.hash_s, be))
    d.panels = [(title, dev.name) for title, dev, *_ in panels]
    for rate in d.rates:
        tr = load_trace(SynthSpec(float(rate), tokens=tokens).spec())
        st = reuse_stats(tr)
        d.traces[rate] = (tr.source, st.reuse_rate)
        w = tr.wraps(d.steps)
        if w.summary() not in d.wraps:
            d.wraps.append(w.summary())
        for c in d.caches:
            for title, dev, comp, hs, be in panels:
                pol = policy(DEFAULT_THRESHOLD, be, DEFAULT_READERS, c)
                if c:
                    d.cache_policy = pol.cache_policy
                r = simulate(tr, dev, pol, comp, steps=d.steps, hash_time=hs)
                d.hit[(rate, c)] = r.cache_hit_rate
                d.tokens[(title, rate, c)] = r.tokens_per_s
                d.rows.append([title, rate, st.reuse_rate, c, r.cache_hit_rate, r.tokens_per_s, tr.source])
    return d


# --------------------------------------------------------------------- speculative decoding
#: Acceptance rates of the speculative-decoding figure.
SPECULATIVE_ACCEPTANCE = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: Draft tokens of the speculative-decoding figure.
SPECULATIVE_DRAFTS = (1, 2, 3)
#: Its devices: a slow SSD from datasheet figures (500 us a read alone, 20,000 IOPS, 8 in parallel: its reads
#: are a tenth of a step, where the presets' are a few percent) and the reference SSD.
SPECULATIVE_DEVICES = ("ssd:qd1_us=500,iops=20000,parallelism=8", SEED_DEVICE)


@dataclass
class SpeculativeData:
    """One session's tokens/s against the acceptance of a draft (:mod:`sim.decode.speculative`): per device,
    draft tokens and prefetch, at each acceptance; ``base``: the device's tokens/s without drafts."""

    acceptance: Sequence[float]
    drafts: Sequence[int]
    steps: int
    trace: str = ""
    compute_ms: float = 0.0
    tokens: Dict[Tuple[str, int, bool], List[float]] = field(default_factory=dict)
    base: Dict[str, float] = field(default_factory=dict)
    rows: List[list] = field(default_factory=list)


def speculative_data(inp: Inputs, ref_compute: Compute, quick: bool) -> SpeculativeData:
    """Tokens/s of one session decoding speculatively (``k`` = 1, 2, 3 drafts a step, acceptance 0..1, the
    drafts' rows prefetched or not) on a slow and a fast device, threshold 8 with 16 readers, the SPEC §8
    compute (a verification step computes as long as a one-token step: :mod:`sim.decode.speculative`)."""
    steps = _steps(quick)
    tr = next(iter(inp.traces.values()))
    d = SpeculativeData((0.0, 0.5, 1.0) if quick else SPECULATIVE_ACCEPTANCE, SPECULATIVE_DRAFTS, steps,
                        tr.source, ref_compute.mean * 1e3)
    pol = policy(DEFAULT_THRESHOLD, "pread", DEFAULT_READERS)
    for dev in SPECULATIVE_DEVICES:
        device = load_device(dev)
        d.base[dev] = simulate(tr, device, pol, ref_compute, steps=steps).tokens_per_s
        d.rows.append([dev, 0, "off", "", d.base[dev], 1.0, ""])
        for k in d.drafts:
            for pf in (False, True):
                ys = []
                for a in d.acceptance:
                    r = simulate(tr, device, pol, ref_compute, steps=steps, speculation=Speculation(k, a, pf))
                    ys.append(r.tokens_per_s)
                    d.rows.append([dev, k, "on" if pf else "off", a, r.tokens_per_s,
                                   r.speculative["tokens_per_step"], r.stall_ms["mean"]])
                d.tokens[(dev, k, pf)] = ys
    return d
