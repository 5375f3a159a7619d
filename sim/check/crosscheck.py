"""Cross-check: the calibrated simulator's predictions against measured decode runs (SPEC §9).

For every run of a ``runs.json`` document (:mod:`sim.measure`) the simulator
(:func:`sim.decode.simulate_decode`, fast mode) replays the exact stretch of
trace the run read, with the calibrated device of the configuration's
backend, the policy (threshold, readers = ring depth), the compute model of
its compute spec and the hash time (:class:`sim.check.calibrate.Calibration`) --
each scaled to the device and compute state of the run's own time window,
fitted from the probe steps interleaved with the run (random token ids
through the same sessions: :mod:`sim.check.windows`,
:meth:`Calibration.window_models`).  A multi-session run is simulated with
the same number of sessions, each on its own stretch with the probe steps
where the run had them, started at the measured start of each session
(:meth:`sim.core.params.Phases.at`); each simulated session's tokens/s counts its
trace steps only, as the measured one does.  A configuration's prediction
shown is the median of its runs' predictions, next to the median of the
measured runs and the spread of the repeats; its error is taken run by run
(Definitions, below).  Each run is also
predicted with the calibrated device and compute alone (``calibrated_only``:
what the microbenchmarks say without the window's state).

Prediction interval: each run's prediction carries a 90% interval from its window's uncertainty
and the model's scatter on the other configurations; a configuration is inside when the median of its
runs' log errors lies within its band (:mod:`sim.check.intervals`).

Regime: from the background load measured during the runs, ``quiet``, ``busy``, ``loaded`` or
``unmeasured``, each with its goals (:mod:`sim.check.regimes`).

Capacity: per group of multi-session configurations that differ only in
their session count, the largest count whose slowest session reaches the
measurement's target tokens/s (``params.capacity_target`` of the runs),
measured (median over repeats of each run's slowest session) and predicted;
the two must lie within one step of the session grid.

Definitions
-----------
- measured tokens/s: a run's trace steps over their own time (the probe
  steps between them left out); the configuration's figure is the median
  over its repeats.  Step p50 / p95: per run, then the median over repeats.
- error: per run ``predicted / measured - 1``, each run against the
  prediction of its own window, then the median over the configuration's runs
  (paired: on a loaded machine the repeats spread by tens of percent, and the
  ratio of two medians would compare different runs); the ratio of the
  medians shown is kept as ``tokens_per_s_of_medians``.
- spread: ``(max - min) / median`` of the repeats' tokens/s (and of their step
  p50); ``cv`` the coefficient of variation of the repeats' tokens/s.
- multi-session tokens/s: the mean over sessions of each session's trace
  steps over their own time; ``slowest``: the slowest session's;
  ``aggregate``: the sum over sessions.

The layout of ``crosscheck.json`` is in :mod:`sim.core.schema`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from engram import read_model
from engram.errors import ArgumentError, FormatError

from .calibrate import Calibration
from sim.decode import DecodeRun, simulate_decode
from sim.decode.speculative import Speculation
from sim.device import Device
from sim.core.io import load_json, now_iso, sha256_file, write_json
from sim.core.params import Compute, Phases, Policy
from sim.core.progress import progress as progress_bar
from sim.core.schema import CROSSCHECK_SCHEMA, ComputeSpec, RunConfig, check_runs
from sim.trace import Trace, load_trace
from sim.trace.rowcache import stretch_hits
from .intervals import INTERVAL_Z, error_band, peer_model_sd, run_interval, run_sd
from .regimes import (COVERAGE_TARGET, QUIET_TARGETS, TARGETS, chance_of_fewer, count_text, median_of, percent_text,
                      regime, regime_checks, summary_figure, verdict, verdict_text)
from .windows import insert_probes

__all__ = ["CDF_PERCENTILES", "SESSION_SIM_SEEDS", "SINGLE_SIM_STEPS", "capacity", "capacity_shown", "crosscheck",
           "crosscheck_files", "largest_met", "markdown_table", "predict", "predict_run", "run_cache_hits"]

#: Simulated steps of a single-session run's prediction at least (its stretch, replayed).
SINGLE_SIM_STEPS = 1000
#: Seeds averaged in a multi-session run's prediction (the simulated run has the measured run's length).
SESSION_SIM_SEEDS = 3
#: Largest gap between a row cache's measured and predicted hit rate on the same trace steps (issue 26: 1 point).
ROW_CACHE_HIT_RATE_TOLERANCE = 0.01
#: Percentiles of the step-latency CDFs kept for plotting.
CDF_PERCENTILES = (1, 2, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 98, 99)


def predict(cal: Calibration, config: RunConfig, trace: Trace, *, starts: Optional[Sequence[int]] = None,
            sim_steps: Optional[int] = None, seed: int = 0) -> dict:
    """Predict one configuration with the calibrated simulator.

    Parameters
    ----------
    cal : Calibration
    config : RunConfig
    trace : Trace
        The trace the runs read.
    starts : sequence of int, optional
        First trace step of each run (``config.steps`` steps each); the
        simulator replays these stretches one after the other, wrapping
        around up to ``sim_steps``.  Default: the first ``config.steps`` steps.
    sim_steps : int, optional
        Simulated steps (default ``max(replayed steps, 2000)``: the
        expectation rather than one noisy sample).
    seed : int

    Returns
    -------
    dict
        ``tokens_per_s``, ``step_p50_ms``, ``step_p95_ms``, ``step_mean_ms``, ``read_mean_ms``
        (wait for rows + hash), ``compute_mean_ms``, ``device`` (its name), ``cdf_ms``.

    Raises
    ------
    ArgumentError
        The calibration lacks the backend or the compute spec of ``config``,
        or a stretch lies outside the trace.
    """
    n = config.steps
    starts = [0] if starts is None else [int(x) for x in starts]
    if not starts or min(starts) < 0 or max(starts) + n > trace.steps:
        raise ArgumentError(f"stretches {starts} of {n} steps do not fit the trace ({trace.steps} steps)")
    rows = np.concatenate([trace.rows[a:a + n] for a in starts])
    toks = np.concatenate([trace.tokens[a:a + n] for a in starts])
    tr = Trace(rows, toks, np.zeros(1, dtype=np.int64), trace.layer_ids, trace.heads, trace.source)
    steps = int(sim_steps) if sim_steps else max(tr.steps, 2000)
    pol = cal.policy(config.threshold, config.backend, config.readers)
    comp = cal.compute_model(config.compute)
    dev = cal.device(config.backend, config.compute)
    r = simulate_decode(tr, dev, pol, comp,
                        DecodeRun(sessions=1, steps=steps, mode="fast", seed=seed, hash_time=cal.hash_s,
                                  replay=f"cross-check prediction of {config.key}",
                                  host=cal.host(config.compute, config.mode)))
    lat = r.step_latencies.reshape(-1)
    return {"tokens_per_s": r.tokens_per_s, "step_p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "step_p95_ms": float(np.percentile(lat, 95)) * 1e3, "step_mean_ms": float(lat.mean()) * 1e3,
            "read_mean_ms": r.stall_ms["mean"] + cal.hash_s * 1e3, "compute_mean_ms": comp.mean * 1e3,
            "device": dev.name, "cdf_ms": [float(x) * 1e3 for x in np.percentile(lat, CDF_PERCENTILES)]}


def _spread(x: np.ndarray) -> float:
    med = float(np.median(x))
    return float((x.max() - x.min()) / med) if x.size > 1 and med > 0 else 0.0


def _measured(runs: Sequence[Mapping]) -> dict:
    tps = np.array([float(r["tokens_per_s"]) for r in runs])
    p50 = np.array([float(r["step_ms"]["p50"]) for r in runs])
    p95 = np.array([float(r["step_ms"]["p95"]) for r in runs])
    allsteps = np.concatenate([np.asarray(r["step_us"], dtype=np.float64) for r in runs]) / 1e3 \
        if all("step_us" in r for r in runs) else np.array([])
    return {
        "tokens_per_s": float(np.median(tps)), "tokens_per_s_runs": tps.tolist(),
        "slowest_tokens_per_s": float(np.median([float(r.get("slowest_tokens_per_s", r["tokens_per_s"]))
                                                 for r in runs])),
        "aggregate_tokens_per_s": float(np.median([float(r.get("aggregate_tokens_per_s", r["tokens_per_s"]))
                                                   for r in runs])),
        "threads": int(max(int(r.get("threads", 0)) for r in runs)),
        "step_p50_ms": float(np.median(p50)), "step_p95_ms": float(np.median(p95)),
        "step_mean_ms": float(np.median([r["step_ms"]["mean"] for r in runs])),
        "read_mean_ms": float(np.median([r["read_ms"]["mean"] for r in runs])),
        "compute_mean_ms": float(np.median([r["compute_ms"]["mean"] for r in runs])),
        "rows_match": all(bool(r.get("rows_match", True)) for r in runs),
        "background_cpu": median_of([(r.get("background") or {}).get("cpu") for r in runs]),
        "background_disk_iops": median_of([(r.get("background") or {}).get("disk_iops") for r in runs]),
        "cdf_ms": [float(x) for x in np.percentile(allsteps, CDF_PERCENTILES)] if allsteps.size else [],
        "_spread": {"tokens_per_s": _spread(tps),
                    "tokens_per_s_cv": float(tps.std() / tps.mean()) if tps.size > 1 else 0.0,
                    "step_p50": _spread(p50)},
        "_min_max": (float(tps.min()), float(tps.max())),
    }


def _load_traces(runs_doc: Mapping, runs_path: Optional[Path], configs: Sequence[RunConfig],
                 need: Mapping[str, int]) -> Dict[str, Trace]:
    out: Dict[str, Trace] = {}
    files = runs_doc.get("traces") or {}
    for spec in dict.fromkeys(c.trace for c in configs):
        rel = files.get(spec)
        if rel is not None and runs_path is not None and (runs_path.parent / rel).is_file():
            out[spec] = Trace.load(runs_path.parent / rel)
            continue
        # Fall back to rebuilding the trace under the model file's layout.
        path = (runs_doc.get("file") or {}).get("path")
        if not path or not Path(path).is_file():
            raise FormatError(f"trace {spec!r}: no saved trace beside the runs and no model file to rebuild it")
        out[spec] = load_trace(spec, limit=need[spec], layout=read_model(path).layout)
    return out


def _stretches(trace: Trace, starts: Sequence[int], n: int) -> Trace:
    """The stretches ``[a, a + n)`` of ``trace`` for each ``a`` in ``starts``, one after the other."""
    if not starts or min(starts) < 0 or max(starts) + n > trace.steps:
        raise ArgumentError(f"stretches {list(starts)[:4]} of {n} steps do not fit the trace ({trace.steps} steps)")
    rows = np.concatenate([trace.rows[a:a + n] for a in starts])
    toks = np.concatenate([trace.tokens[a:a + n] for a in starts])
    return Trace(rows, toks, np.zeros(1, dtype=np.int64), trace.layer_ids, trace.heads, trace.source)


def _session_rows(trace: Trace, starts: Sequence[int], n: int, every: int, seed: int) -> tuple:
    """The sessions' stretches with their probe steps (random rows) where the run had them, one session after
    the other: ``(Trace, bool mask [steps a session] of the trace steps)``."""
    parts, mask = [], None
    for i, a in enumerate(starts):
        rows, mask = insert_probes(trace.rows[a:a + n], every, [seed, 14, i])
        parts.append(rows)
    rows = np.concatenate(parts)
    return Trace(rows, np.zeros(rows.shape[0], np.int64), np.zeros(1, dtype=np.int64), trace.layer_ids,
                 trace.heads, trace.source), mask


def predict_run(cal: Calibration, config: RunConfig, trace: Trace, run: Mapping, *,
                sim_steps: Optional[int] = None, seed: int = 0, windows: bool = True) -> dict:
    """Predict one measured run (single- or multi-session) with the device and compute of its window.

    Parameters
    ----------
    run : mapping
        The run record: ``start`` (single session) or ``starts`` and
        ``start_offsets_s`` (multi-session), ``probe_every`` and ``window``.
    sim_steps : int, optional
        Simulated steps of a single session (default ``max(steps, 1000)``,
        the stretch replayed); several sessions run the measured loop (trace
        and probe steps), averaged over :data:`SESSION_SIM_SEEDS` seeds.
    windows : bool
        Use the window's state (False: the calibrated device and compute as they are).

    A run read through the engine's row cache (``row_cache`` of the record: ``engram measure
    --cache-bytes``) is predicted with the cache it had: its trace steps replayed through the same policy
    and budget, fresh at the run's start, in the run's order (:func:`sim.trace.rowcache.stretch_hits`:
    one cache for sessions in threads, one each for processes); the rows it serves are not read, so the
    tokens/s comes from the misses only, and a replay of the stretch meets the same hits at the same
    positions (no inflation).  Warm-up and probe steps go past the cache in the run and here.

    Returns
    -------
    dict
        ``tokens_per_s`` (mean over sessions), ``slowest_tokens_per_s``, ``aggregate_tokens_per_s``,
        ``step_p50_ms``, ``step_p95_ms``, ``step_mean_ms``, ``read_mean_ms``, ``compute_mean_ms``,
        ``read_share`` and ``compute_share`` (of a step's mean time), ``sim_se`` (relative standard error
        of the simulated tokens/s), ``device``, ``cache_hit_rate`` (the row cache's predicted hit rate on the
        run's trace steps; None without a cache), the trace steps' latencies ``_lat`` (seconds), and ``host``
        where the calibration models the host apart (:meth:`Calibration.host`: ``DecodeResult.host``).

    Raises
    ------
    ArgumentError
        The calibration lacks the backend or compute, or a stretch lies outside the trace.
    """
    dev, comp = cal.window_models(config.backend, config.compute, run.get("window") if windows else None)
    pol = cal.policy(config.threshold, config.backend, config.readers)
    hits = run_cache_hits(config, trace, run)
    lat, per, reads, sim_se, host = _Replay(cal, config, trace, run, dev, pol, comp, sim_steps, seed, hits).simulate()
    read = float(np.mean(reads)) + cal.hash_s
    step = float(lat.mean())
    return {"tokens_per_s": float(per.mean()), "slowest_tokens_per_s": float(per.min(axis=1).mean()),
            "aggregate_tokens_per_s": float(per.sum(axis=1).mean()),
            "step_p50_ms": float(np.percentile(lat, 50)) * 1e3, "step_p95_ms": float(np.percentile(lat, 95)) * 1e3,
            "step_mean_ms": step * 1e3, "read_mean_ms": read * 1e3, "compute_mean_ms": comp.mean * 1e3,
            "read_share": min(1.0, read / step) if step > 0 else 0.0,
            "compute_share": min(1.0, comp.mean / step) if step > 0 else 0.0, "sim_se": sim_se,
            "device": dev.name, "cache_hit_rate": None if hits is None else float(hits.mean()), "_lat": lat,
            **({"host": host} if host else {})}


def _run_starts(config: RunConfig, run: Mapping) -> List[int]:
    """The first trace step of each session of ``run``."""
    if not config.multi:
        return [int(run.get("start", 0))]
    n = config.steps
    return [int(x) for x in run.get("starts") or [int(run.get("start", 0)) + i * n for i in range(config.sessions)]]


def run_cache_hits(config: RunConfig, trace: Trace, run: Mapping) -> Optional[np.ndarray]:
    """bool ``[steps, sessions, layers, columns]``: the requests of ``run``'s trace steps its row cache serves
    (the cache of its ``row_cache`` record -- budget in rows, policy, shared or one a process -- replayed
    fresh over its stretches: :func:`sim.trace.rowcache.stretch_hits`); None for a run without a cache.

    Raises
    ------
    FormatError
        A ``row_cache`` record without its ``rows`` or ``policy``, or with a policy the engine lacks.
    """
    rc = run.get("row_cache")
    if not rc:
        return None
    try:
        rows, policy = int(rc["rows"]), str(rc["policy"])
        return stretch_hits(trace, _run_starts(config, run), config.steps, rows, policy,
                            bool(rc.get("shared", True)))
    except (KeyError, TypeError, ValueError, ArgumentError) as exc:
        raise FormatError(f"run of {config.key} (round {run.get('round')}): row_cache {rc!r} is not a row cache "
                          f"record (rows, policy, shared): {exc}") from None


@dataclass(frozen=True)
class _Replay:
    """One measured run as the simulator replays it: the run's record and configuration, the trace it read, the
    device, policy and compute it is predicted with, the simulated steps (``sim_steps``, None: the default) and
    seed, and the requests its row cache serves (``hits``: :func:`run_cache_hits`, None without a cache)."""

    cal: Calibration
    config: RunConfig
    trace: Trace
    run: Mapping
    dev: Device
    pol: Policy
    comp: Compute
    sim_steps: Optional[int]
    seed: int
    hits: Optional[np.ndarray] = None

    def simulate(self) -> tuple:
        """:meth:`sessions` for a multi-session run, else :meth:`single`."""
        return self.sessions() if self.config.multi else self.single()

    def single(self) -> tuple:
        """One session on its stretch, replayed to ``sim_steps``: ``(latencies [s], tokens/s [[1]], [mean read],
        relative standard error of the mean step, the host's figures: ``DecodeResult.host``)``."""
        cal, config, run, dev, pol, comp, seed, hits = (self.cal, self.config, self.run, self.dev, self.pol,
                                                        self.comp, self.seed, self.hits)
        n = config.steps
        tr = _stretches(self.trace, [int(run.get("start", 0))], n)
        steps = int(self.sim_steps) if self.sim_steps else max(n, SINGLE_SIM_STEPS)
        spec = None
        if config.draft_tokens:  # a speculative run: its verification steps cover about as many tokens
            spec = Speculation(config.draft_tokens, config.acceptance, config.prefetch_drafts)
            steps = max(1, int(steps / spec.expected_tokens()))
        r = simulate_decode(tr, dev, pol, comp,
                            DecodeRun(sessions=1, steps=steps, mode="fast", seed=seed, hash_time=cal.hash_s,
                                      replay=f"cross-check prediction of {config.key}",
                                      host=cal.host(config.compute, config.mode)), speculation=spec,
                            served=None if hits is None else hits[:, 0])
        lat = r.step_latencies.reshape(-1)
        sim_se = float(lat.std() / lat.mean() / np.sqrt(lat.size)) if lat.size > 1 and lat.mean() > 0 else 0.0
        return lat, np.array([[r.tokens_per_s]]), [r.stall_ms["mean"] * 1e-3], sim_se, r.host

    def _served(self, tr: Trace, mask: np.ndarray) -> Optional[np.ndarray]:
        """The row cache's hits at the trace steps of the sessions' rows ``tr`` (never at a probe step)."""
        if self.hits is None:
            return None
        k = self.config.sessions
        served = np.zeros((k, mask.size) + tr.rows.shape[1:], dtype=bool)
        for i in range(k):
            served[i, mask] = self.hits[:, i]
        return served.reshape(tr.rows.shape)

    def _phases(self) -> Phases:
        """The sessions' start phases: the run's measured offsets, else spread over its largest one."""
        k = self.config.sessions
        offsets = [float(x) for x in self.run.get("start_offsets_s") or ()]
        return Phases.at(offsets) if len(offsets) == k else Phases("spread", max(offsets or [0.0]) * k / (k - 1))

    def sessions(self) -> tuple:
        """The measured loop of several sessions -- each on its stretch with the probe steps where the run had
        them, started at its measured offset -- over :data:`SESSION_SIM_SEEDS` seeds: ``(trace steps' latencies
        [s], tokens/s [seeds, sessions] over trace steps only, mean reads, relative standard error over seeds, the
        host's figures of the first seed: ``DecodeResult.host``)``;
        the row cache serves at the trace steps, never at a probe step."""
        cal, config, run, dev, pol, comp, seed = (self.cal, self.config, self.run, self.dev, self.pol, self.comp,
                                                  self.seed)
        n, k = config.steps, config.sessions
        starts = _run_starts(config, run)
        tr, mask = _session_rows(self.trace, starts, n, int(run.get("probe_every") or 0), seed)
        served = self._served(tr, mask)
        phases = self._phases()
        lats, per, reads, hosts = [], [], [], []
        for j in range(SESSION_SIM_SEEDS):
            r = simulate_decode(tr, dev, pol, comp,
                                DecodeRun(sessions=k, steps=mask.size, mode="fast", seed=seed + j, hash_time=cal.hash_s,
                                          phases=phases, replay=f"cross-check prediction of {config.key}",
                                          host=cal.host(config.compute, config.mode)),
                                served=served)
            own = r.step_latencies[:, mask]
            lats.append(own.reshape(-1))
            per.append(n / own.sum(axis=1))
            reads.append(r.stall_ms["mean"] * 1e-3)
            hosts.append(r.host)
        means = np.array(per).mean(axis=1)
        sim_se = float(means.std(ddof=1) / means.mean() / np.sqrt(means.size)) if means.size > 1 else 0.0
        return np.concatenate(lats), np.array(per), reads, sim_se, hosts[0]


def _start_spread(runs: Sequence[Mapping]) -> float:
    """The median over runs of how far apart the sessions started (the largest measured start offset, s; 0
    for single-session runs): the phases the simulator replays, each run's own offsets."""
    return float(np.median([max([float(x) for x in r.get("start_offsets_s") or ()] or [0.0]) for r in runs]))


def largest_met(values: Sequence[float], target: float) -> int:
    """Index of the largest grid count whose value, and every smaller count's, reaches ``target``; -1: none."""
    idx = -1
    for i, v in enumerate(values):
        if v < target:
            break
        idx = i
    return idx


def capacity(rows: Sequence[Mapping], target: float) -> List[dict]:
    """Measured and predicted capacity per group of multi-session rows differing only in their sessions.

    The capacity is the largest session count of the group's grid whose
    slowest session reaches ``target`` tokens/s, every smaller count
    reaching it too (0 when one session misses it); ``within_one_step``:
    measured and predicted lie at most one grid step apart.
    """
    groups: Dict[tuple, List[Mapping]] = {}
    for r in rows:
        key = (r["trace"], r["threshold"], r["backend"], r["readers"], r["compute"], r["steps"], r["mode"])
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["sessions"])
        grid = [int(r["sessions"]) for r in rs]
        im = largest_met([r["measured"]["slowest_tokens_per_s"] for r in rs], target)
        ip = largest_met([r["predicted"]["slowest_tokens_per_s"] for r in rs], target)
        out.append({"trace": key[0], "trace_label": rs[0]["trace_label"], "threshold": key[1], "backend": key[2],
                    "readers": key[3], "compute": key[4], "steps": key[5], "mode": key[6],
                    "target_tokens_per_s": target, "sessions": grid,
                    "measured_slowest": [r["measured"]["slowest_tokens_per_s"] for r in rs],
                    "predicted_slowest": [r["predicted"]["slowest_tokens_per_s"] for r in rs],
                    "predicted_slowest_low": [r["interval"]["slowest_low"] for r in rs],
                    "predicted_slowest_high": [r["interval"]["slowest_high"] for r in rs],
                    "measured_capacity": grid[im] if im >= 0 else 0,
                    "predicted_capacity": grid[ip] if ip >= 0 else 0,
                    "all_met": {"measured": im == len(grid) - 1, "predicted": ip == len(grid) - 1},
                    "within_one_step": abs(im - ip) <= 1})
    return out


def _fit(cal: Calibration, c: RunConfig, runs: Sequence[Mapping], mid: Sequence[Mapping], row: Mapping) -> tuple:
    """``(several sessions?, log errors of the runs' tokens/s, their window sds, the slowest session's sds)``."""
    sd = np.array([run_sd(cal, c, r, x) for r, x in zip(runs, mid)])
    sd_slow = np.array([run_sd(cal, c, r, x, slowest=True) for r, x in zip(runs, mid)])
    err = np.log(np.asarray(row["measured"]["tokens_per_s_runs"]) / np.array([x["tokens_per_s"] for x in mid]))
    return c.multi, err, sd, sd_slow


def _add_interval(row: dict, c: RunConfig, mid: Sequence[Mapping], fit: tuple, msd: float, seed: int) -> None:
    """Put the interval, ``inside_interval`` and ``runs_inside`` into ``row``."""
    interval, inside, runs_inside = run_interval(c, mid, row["measured"]["tokens_per_s_runs"], fit[2], fit[3], msd,
                                              seed)
    row.update(interval=interval, runs_inside=runs_inside, inside_interval=inside)


def _paired(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """The median over runs of each run's ``predicted / measured - 1`` (see the module docstring)."""
    return float(np.median(np.asarray(predicted, dtype=np.float64) / np.asarray(measured, dtype=np.float64) - 1))


def _errors(runs: Sequence[Mapping], mid: Sequence[Mapping], base: Sequence[Mapping], multi: bool) -> dict:
    """A configuration's errors, each run against its own prediction (``mid``; ``base``: the calibrated device
    and compute alone), the median over runs."""
    def tps(r, key="tokens_per_s"):
        return float(r.get(key, r["tokens_per_s"]))

    err = {"tokens_per_s": _paired([x["tokens_per_s"] for x in mid], [tps(r) for r in runs]),
           "step_p50": _paired([x["step_p50_ms"] for x in mid], [r["step_ms"]["p50"] for r in runs]),
           "step_p95": _paired([x["step_p95_ms"] for x in mid], [r["step_ms"]["p95"] for r in runs]),
           "step_mean": _paired([x["step_mean_ms"] for x in mid], [r["step_ms"]["mean"] for r in runs]),
           "tokens_per_s_calibrated": _paired([x["tokens_per_s"] for x in base], [tps(r) for r in runs])}
    if multi:
        for key in ("slowest_tokens_per_s", "aggregate_tokens_per_s"):
            err[key] = _paired([x[key] for x in mid], [tps(r, key) for r in runs])
    return err


def _own_windows(cal: Calibration, runs_doc: Mapping) -> tuple:
    """``(calibration, warning or None)``: ``cal`` as it is when its microbenchmarks and the runs are one
    measurement (the two documents of one ``engram measure`` carry its start date), else ``cal`` without its
    windows -- window ids repeat from one measurement to the next, and another measurement's window is not this
    run's -- with a warning saying so (the runs are then predicted with the calibrated device and compute)."""
    ours, theirs = (cal.source or {}).get("date"), runs_doc.get("date")
    if not cal.windows or not ours or not theirs or ours == theirs:
        return cal, None
    return replace(cal, windows={}), (f"the calibration's probe windows come from the measurement of {ours}, the "
                                      f"runs from the measurement of {theirs}: every run is predicted with the "
                                      f"calibrated device and compute alone (calibrate the runs' own "
                                      f"microbench.json to use their windows)")


def _check_window(cal: Calibration, c: RunConfig, run: Mapping) -> None:
    """The window a run names was probed with the run's own configuration (else a corrupt or mixed document).

    Raises
    ------
    FormatError
        Names the window, what it was probed with and the run's configuration.
    """
    w = cal.window(run.get("window"))
    if w is None:
        return
    want = {"backend": c.backend, "threshold": c.threshold, "readers": c.readers, "sessions": c.sessions,
            "mode": c.mode, "compute_label": ComputeSpec.parse(c.compute).label}
    got = {k: w.get(k) for k in want}
    k_diff = [k for k in want if got[k] is not None and got[k] != want[k]]
    if k_diff:
        raise FormatError(f"window {run['window']} of the calibration was probed with "
                          f"{', '.join(f'{k} {got[k]!r}' for k in k_diff)}, but the run of {c.key} (round "
                          f"{run.get('round')}) has {', '.join(f'{k} {want[k]!r}' for k in k_diff)}: the calibration "
                          f"and the runs do not belong together")


def _row(cal: Calibration, c: RunConfig, trace: Trace, runs: Sequence[Mapping], sim_steps, seed,
         baseline: bool = True) -> tuple:
    """One configuration: ``(row, its runs' predictions)``; the row holds measured (medians over repeats),
    predicted (median over its runs) and error; its interval comes once every row is known
    (:func:`_add_interval`).  ``baseline``: also predict with the calibrated device and compute alone (else
    those figures are the windowed ones)."""
    m = _measured(runs)
    mid = [predict_run(cal, c, trace, r, sim_steps=sim_steps, seed=seed) for r in runs]
    base = [predict_run(cal, c, trace, r, sim_steps=sim_steps, seed=seed, windows=False) for r in runs] \
        if baseline else mid
    lat = np.concatenate([p["_lat"] for p in mid])
    p = {k: float(np.median([x[k] for x in mid])) for k in
         ("tokens_per_s", "slowest_tokens_per_s", "aggregate_tokens_per_s", "step_mean_ms", "read_mean_ms",
          "compute_mean_ms")}
    p.update(step_p50_ms=float(np.median([x["step_p50_ms"] for x in mid])),
             step_p95_ms=float(np.median([x["step_p95_ms"] for x in mid])),
             tokens_per_s_runs=[x["tokens_per_s"] for x in mid], step_p50_ms_runs=[x["step_p50_ms"] for x in mid],
             device=mid[0]["device"].split("@")[0],
             windows=int(sum(cal.window(r.get("window")) is not None for r in runs)),
             tokens_per_s_calibrated=float(np.median([x["tokens_per_s"] for x in base])),
             tokens_per_s_calibrated_runs=[x["tokens_per_s"] for x in base],
             slowest_tokens_per_s_calibrated=float(np.median([x["slowest_tokens_per_s"] for x in base])),
             start_spread_s=_start_spread(runs),
             cdf_ms=[float(x) * 1e3 for x in np.percentile(lat, CDF_PERCENTILES)])
    spread = m.pop("_spread")
    lo, hi = m.pop("_min_max")
    err = _errors(runs, mid, base, c.multi)
    err["tokens_per_s_of_medians"] = p["tokens_per_s"] / m["tokens_per_s"] - 1
    row = {**c.to_dict(), "repeats": len(runs), "measured": m, "predicted": p, "error": err, "spread": spread,
           "within_spread": bool(lo <= p["tokens_per_s"] <= hi)}
    rc = _cache_row(runs, mid)
    if rc is not None:
        row["row_cache"] = rc
    return row, mid


def _cache_row(runs: Sequence[Mapping], mid: Sequence[Mapping]) -> Optional[dict]:
    """A configuration's row cache, when its runs had one: the policy and budget, the measured hit rate of
    each run (its ``row_cache`` record) beside the one the prediction replayed, and the largest gap."""
    recs = [r.get("row_cache") for r in runs]
    if not any(recs):
        return None
    if not all(recs):
        raise FormatError("a configuration's runs read some through a row cache and some without: "
                          "measure them apart (engram measure --cache-bytes applies to every run)")
    meas = [float(x["hit_rate"]) for x in recs]
    pred = [float(x["cache_hit_rate"]) for x in mid]
    return {"policy": recs[0]["policy"], "bytes": int(recs[0]["bytes"]), "rows": int(recs[0]["rows"]),
            "shared": bool(recs[0].get("shared", True)), "hit_rate_measured_runs": meas,
            "hit_rate_predicted_runs": pred, "hit_rate_measured": float(np.median(meas)),
            "hit_rate_predicted": float(np.median(pred)),
            "hit_rate_max_abs_error": float(max(abs(a - b) for a, b in zip(meas, pred)))}


def _stats(rows: Sequence[Mapping], name: str) -> dict:
    e = np.array([r["error"][name] for r in rows if name in r["error"]])
    if not e.size:
        return {"median_abs_error": None, "max_abs_error": None, "mean_error": None}
    return {"median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.abs(e).max()),
            "mean_error": float(e.mean())}


def _runs_by_config(runs_doc: Mapping, runs_path) -> tuple:
    """``(configurations that have runs, their runs by configuration key)``, the document checked first.

    Raises
    ------
    ArgumentError
        A run of an unknown configuration, or no run at all.
    """
    configs = check_runs(runs_doc, runs_path)
    by_key: Dict[str, List[Mapping]] = {c.key: [] for c in configs}
    for r in runs_doc.get("runs", []):
        if r.get("config") not in by_key:
            raise ArgumentError(f"run of unknown configuration {r.get('config')!r}")
        by_key[r["config"]].append(r)
    configs = [c for c in configs if by_key[c.key]]
    if not configs:
        raise ArgumentError("the runs document holds no runs")
    return configs, by_key


def _checked_calibration(cal: Calibration, runs_doc: Mapping, configs: Sequence[RunConfig],
                         by_key: Mapping[str, Sequence[Mapping]]) -> tuple:
    """``(calibration, warning or None)`` of :func:`_own_windows`, once the calibration has every configuration's
    backend and each run's window was probed with its configuration (:func:`_check_window`)."""
    cal.check_backends([c.backend for c in configs], "the measured runs")
    cal, other = _own_windows(cal, runs_doc)
    for c in configs:
        for r in by_key[c.key]:
            _check_window(cal, c, r)
    return cal, other


def _trace_need(configs: Sequence[RunConfig], by_key: Mapping[str, Sequence[Mapping]]) -> Dict[str, int]:
    """Steps each trace must have for the runs that read it."""
    need: Dict[str, int] = {}
    for c in configs:
        end = max(int(r.get("start", 0)) + c.steps * c.sessions for r in by_key[c.key])
        need[c.trace] = max(need.get(c.trace, 0), end)
    return need


def _predicted_rows(cal: Calibration, configs: Sequence[RunConfig], by_key: Mapping[str, Sequence[Mapping]],
                    traces: Mapping[str, Trace], sim_steps: Optional[int], seed: int, baseline: bool,
                    progress) -> tuple:
    """``(single-session rows, multi-session rows)``, every configuration predicted (:func:`_row`) and then
    given its interval against the model's scatter on the others."""
    built = []
    with progress_bar(len(configs), "crosscheck", "configuration", mode=progress) as bar:
        for c in configs:
            row, mid = _row(cal, c, traces[c.trace], by_key[c.key], sim_steps, seed, baseline)
            built.append((c, row, mid, _fit(cal, c, by_key[c.key], mid, row)))
            bar.update(1, note=c.key)
    fits = [b[3] for b in built]
    for i, (c, row, mid, fit) in enumerate(built):
        _add_interval(row, c, mid, fit, peer_model_sd(fits, i), seed)
    return [b[1] for b in built if not b[0].multi], [b[1] for b in built if b[0].multi]


def _summary(rows: Sequence[Mapping], session_rows: Sequence[Mapping], runs_doc: Mapping) -> dict:
    """The cross-check's summary before its verdict: errors, spreads, intervals, the regime, the row cache."""
    every = list(rows) + list(session_rows)
    sp_t = np.array([r["spread"]["tokens_per_s"] for r in every])
    sp_p = np.array([r["spread"]["step_p50"] for r in every])
    summary = {"configurations": len(every), "single_configurations": len(rows),
               "session_configurations": len(session_rows), "runs": int(sum(r["repeats"] for r in every)),
               "tokens_per_s": _stats(every, "tokens_per_s"), "step_p50": _stats(every, "step_p50"),
               "step_p95": _stats(every, "step_p95"), "step_mean": _stats(every, "step_mean"),
               "single": {"tokens_per_s": _stats(rows, "tokens_per_s")} if rows else {},
               "sessions": {name: _stats(session_rows, name) for name in
                            ("tokens_per_s", "slowest_tokens_per_s", "aggregate_tokens_per_s")} if session_rows else {},
               "spread": {"tokens_per_s_median": float(np.median(sp_t)), "tokens_per_s_max": float(sp_t.max()),
                          "tokens_per_s_cv_median": float(np.median([r["spread"]["tokens_per_s_cv"] for r in every])),
                          "step_p50_median": float(np.median(sp_p)), "step_p50_max": float(sp_p.max())},
               "within_spread": int(sum(r["within_spread"] for r in every)),
               "inside_interval": int(sum(r["inside_interval"] for r in every)),
               "inside_interval_share": float(np.mean([r["inside_interval"] for r in every])),
               "runs_inside": int(sum(r["runs_inside"] for r in every)),
               "runs_inside_share": float(sum(r["runs_inside"] for r in every) / sum(r["repeats"] for r in every)),
               "calibrated_only": _stats(every, "tokens_per_s_calibrated"),
               "windows_probed": int(sum(r["predicted"]["windows"] for r in every)),
               "regime": regime([r.get("background") for r in runs_doc.get("runs", [])]),
               "rows_match": all(r["measured"]["rows_match"] for r in every)}
    cached = [r["row_cache"] for r in every if "row_cache" in r]
    if cached:  # the measured hit rate against the replayed one, within a point (issue 26)
        gap = max(x["hit_rate_max_abs_error"] for x in cached)
        summary["row_cache"] = {"configurations": len(cached), "hit_rate_max_abs_error": gap,
                                "hit_rate_within_one_point": bool(gap <= ROW_CACHE_HIT_RATE_TOLERANCE)}
    summary["background_cpu_median"] = summary["regime"]["cpu"]
    return summary


def _judge(summary: dict, caps: Sequence[Mapping], targets: Mapping[str, float],
           quiet_targets: Mapping[str, float]) -> None:
    """Put the regime's goals, each check's verdict (``pass``) and the whole one (``passed``) into ``summary``."""
    which, coverage, _ = regime_checks(summary["regime"]["name"])
    summary["goals"] = {"targets": which, "coverage": coverage, "capacity": bool(caps),
                        "row_cache": bool(summary.get("row_cache"))}
    ok = verdict(summary, targets, quiet_targets, caps)
    summary["pass"] = ok
    summary["passed"] = all(ok.values())


def _left_out(cal: Calibration, runs_doc: Mapping) -> dict:
    """The backends left out, with why: the calibration's, then the runs'."""
    left = dict(cal.left_out)
    left.update((runs_doc.get("backends") or {}).get("left_out") or {})
    return left


def crosscheck(cal: Calibration, runs_doc: Mapping, *, runs_path: Optional[Union[str, os.PathLike]] = None,
               sim_steps: Optional[int] = None, seed: int = 0, targets: Mapping[str, float] = TARGETS,
               quiet_targets: Mapping[str, float] = QUIET_TARGETS, progress: Union[bool, str] = False,
               baseline: bool = True) -> dict:
    """Predict every measured run and tabulate the errors per configuration, the regime and the capacity.

    Parameters
    ----------
    cal : Calibration
        From :func:`sim.check.calibrate.calibrate` (microbenchmarks only).
    runs_doc : mapping
        A ``runs.json`` document (schema ``engram.decode-runs/1``).
    runs_path : path, optional
        Where ``runs_doc`` was read from (its saved traces are found beside it).
    sim_steps, seed
        See :func:`predict_run`.
    targets, quiet_targets : mapping
        Acceptance targets on any machine and on a quiet one (see :data:`TARGETS`, :data:`QUIET_TARGETS`).
    baseline : bool
        Also predict every run with the calibrated device and compute alone (``calibrated_only``); False
        where there are no windows to compare with (:mod:`sim.check.planner`): those figures are then the
        predictions themselves.

    Returns
    -------
    dict
        The ``crosscheck.json`` document (layout: :mod:`sim.core.schema`): single-session ``rows``,
        multi-session ``session_rows``, ``capacity``, the ``summary`` with the ``regime`` and its verdict,
        and the backends left out (``backends``).

    Raises
    ------
    ArgumentError
        ``cal`` is not a :class:`Calibration`, ``runs_doc`` not a decode-run document, a run names an unknown
        configuration, or a configuration's backend or compute is not in the calibration (names both).
    FormatError
        A configuration or run of ``runs_doc`` with a field missing, of the wrong type or out of range
        (names ``runs_path`` when given, the run -- its configuration and round -- the field and the value;
        :func:`sim.core.schema.check_runs`), before anything is simulated.
    """
    if not isinstance(cal, Calibration):
        raise ArgumentError(f"crosscheck needs a Calibration, got {type(cal).__name__}")
    configs, by_key = _runs_by_config(runs_doc, runs_path)
    cal, other = _checked_calibration(cal, runs_doc, configs, by_key)
    rp = Path(runs_path) if runs_path is not None else None
    traces = _load_traces(runs_doc, rp, configs, _trace_need(configs, by_key))
    rows, session_rows = _predicted_rows(cal, configs, by_key, traces, sim_steps, seed, baseline, progress)
    target = (runs_doc.get("params") or {}).get("capacity_target")
    caps = capacity(session_rows, float(target)) if session_rows and target else []
    summary = _summary(rows, session_rows, runs_doc)
    _judge(summary, caps, targets, quiet_targets)
    return {
        "schema": CROSSCHECK_SCHEMA, "kind": "crosscheck",
        "date": now_iso(),
        "calibration": {"date": cal.date, "source": cal.source}, "runs": {"date": runs_doc.get("date")},
        "machine": runs_doc.get("machine", {}),
        "sim": {"steps": sim_steps, "seed": seed, "mode": "fast", "interval_z": INTERVAL_Z,
                "session_seeds": SESSION_SIM_SEEDS},
        "targets": dict(targets), "quiet_targets": dict(quiet_targets), "coverage_target": COVERAGE_TARGET,
        "backends": {"usable": sorted(cal.devices), "left_out": _left_out(cal, runs_doc)},
        "warnings": list(runs_doc.get("warnings") or []) + ([other] if other else []),
        "summary": summary, "rows": rows, "session_rows": session_rows, "capacity": caps,
        "cdf_percentiles": list(CDF_PERCENTILES),
    }


def crosscheck_files(calibration: Union[str, os.PathLike], runs: Union[str, os.PathLike],
                     out: Optional[Union[str, os.PathLike]] = None, **kw) -> dict:
    """:func:`crosscheck` from a calibration file and a ``runs.json`` file; written to ``out`` when given."""
    cal_path, runs_path = Path(calibration), Path(runs)
    cal = Calibration.load(cal_path)
    doc = load_json(runs_path, "decode_runs")
    res = crosscheck(cal, doc, runs_path=runs_path, **kw)
    res["calibration"].update(path=str(cal_path.resolve()), sha256=sha256_file(cal_path))
    res["runs"].update(path=str(runs_path.resolve()), sha256=sha256_file(runs_path))
    if out is not None:
        write_json(out, res)
    return res


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def capacity_shown(c: Mapping, key: str) -> str:
    """A cross-check capacity (``key`` ``"measured"`` or ``"predicted"`` of a :func:`capacity` row) as shown
    everywhere: ``">= N"`` when every count of the grid met the target (a lower bound), else ``"N"``."""
    return f"{'>= ' if c['all_met'][key] else ''}{c[key + '_capacity']}"


def _by_chance(s: Mapping, res: Mapping) -> str:
    """Below the coverage target, how often an interval of exactly the target's level shows as few inside."""
    n, k, share = summary_figure(s, "configurations"), summary_figure(s, "inside_interval"), \
        summary_figure(s, "inside_interval_share")
    level = float(res.get("coverage_target", COVERAGE_TARGET))
    if n is None or k is None or share is None or share >= level:  # a partial summary: no chance to give
        return ""
    n, k = int(n), int(k)
    return (f"; with {n} configurations an interval that holds {level:.0%} of the time shows {k} or fewer inside "
            f"{chance_of_fewer(k, n, level):.0%} of the time")


def _pct_or(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _drafts_text(r: Mapping) -> str:
    """A speculative configuration's drafts in the compute column (empty without drafts)."""
    if not r.get("draft_tokens"):
        return ""
    return (f", {r['draft_tokens']} drafts at acceptance {r['acceptance']:g}"
            + (", prefetched" if r.get("prefetch_drafts") else ""))


def _cells(r: Mapping, key: str, error: Optional[str] = None, spec: str = ".1f") -> str:
    """The ``measured | predicted | error`` cells of row ``r``: ``key`` of its measured and predicted figures
    (written with format ``spec``), ``error`` (default ``key``) of its errors."""
    return f"{r['measured'][key]:{spec}} | {r['predicted'][key]:{spec}} | {_pct(r['error'][error or key])}"


def _tokens_cells(r: Mapping, interval: Mapping) -> str:
    """The tokens/s cells of row ``r``: measured (its spread), predicted, error [90% band of ``interval``]."""
    return (f"{r['measured']['tokens_per_s']:.1f} ({r['spread']['tokens_per_s'] * 100:.1f}%) | "
            f"{r['predicted']['tokens_per_s']:.1f} | {_pct(r['error']['tokens_per_s'])} {error_band(interval)}")


def _single_lines(rows: Sequence[Mapping]) -> List[str]:
    """The single-session table."""
    head = ("| trace | threshold | backend | readers | compute | steps | tokens/s measured (spread) | "
            "predicted | error [90% band] | step p50 ms measured | predicted | error | step p95 ms measured | "
            "predicted | error |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        pol = "serial" if r["serial"] else r["backend"]
        rd = "-" if r["serial"] else str(r["readers"])
        lines.append(
            f"| {r['trace_label']} | {r['threshold']} | {pol} | {rd} | {r['compute']}{_drafts_text(r)} | "
            f"{r['steps']} x{r['repeats']} | {_tokens_cells(r, r.get('interval', {}))} | "
            f"{_cells(r, 'step_p50_ms', 'step_p50', '.3f')} | {_cells(r, 'step_p95_ms', 'step_p95', '.3f')} |")
    return lines


def _session_lines(srows: Sequence[Mapping]) -> List[str]:
    """The multi-session table (nothing without multi-session rows)."""
    if not srows:
        return []
    lines = ["", "| sessions | mode | trace | policy | compute | steps | threads | tokens/s a session measured "
                 "(spread) | predicted | error [90% band] | slowest measured | predicted | error | "
                 "aggregate measured | predicted | error | step p50 ms measured | predicted | error |",
             "|" + "---|" * 19]
    for r in srows:
        pol = "serial" if r["serial"] else f"t{r['threshold']} {r['backend']} x{r['readers']}"
        lines.append(
            f"| {r['sessions']} | {r['mode']} | {r['trace_label']} | {pol} | {r['compute']} | "
            f"{r['steps']} x{r['repeats']} | {r['measured']['threads']} | {_tokens_cells(r, r['interval'])} | "
            f"{_cells(r, 'slowest_tokens_per_s')} | {_cells(r, 'aggregate_tokens_per_s')} | "
            f"{_cells(r, 'step_p50_ms', 'step_p50', '.3f')} |")
    return lines


def _capacity_lines(caps: Sequence[Mapping]) -> List[str]:
    """A sentence per capacity group, each after a blank line."""
    lines = []
    for c in caps:
        def cap(key):
            return capacity_shown(c, key) + (f" (every count up to {c['sessions'][-1]} met it)"
                                             if c["all_met"][key] else "")
        lines += ["", f"Capacity ({c['mode']}, {c['trace_label']}, t{c['threshold']} {c['backend']} x{c['readers']}, "
                      f"compute {c['compute']} a step, sessions {c['sessions']}): the largest session count whose "
                      f"slowest session reaches {c['target_tokens_per_s']:g} tokens/s is "
                      f"{cap('measured')} measured and {cap('predicted')} predicted "
                      f"({'within' if c['within_one_step'] else 'NOT within'} one grid step)."]
    return lines


def _cache_lines(rows: Sequence[Mapping]) -> List[str]:
    """The row caches' hit rates measured and predicted (nothing without a row cache)."""
    cached = [r for r in rows if r.get("row_cache")]
    if not cached:
        return []
    return ["", "Row cache (engram measure --cache-bytes; predicted from the misses of the same policy and budget "
                "replayed over each run's trace steps): "
            + "; ".join(f"{r['key']}: {r['row_cache']['policy']} {r['row_cache']['bytes'] / 2**20:.3g} MiB "
                        f"({r['row_cache']['rows']} rows{'' if r['row_cache']['shared'] else ', one a process'}), "
                        f"hit rate measured {r['row_cache']['hit_rate_measured']:.4f}, predicted "
                        f"{r['row_cache']['hit_rate_predicted']:.4f} (largest gap of a run "
                        f"{r['row_cache']['hit_rate_max_abs_error'] * 100:.2f} points)" for r in cached) + "."]


def _errors_text(s: Mapping, target) -> str:
    """The summary's sentence on the errors (``target(key)``: how its target reads; a figure the summary lacks
    reads ``not measured``, a count ``?``)."""
    def share(*path: str) -> str:
        return percent_text(summary_figure(s, *path), ".2f")

    return (
        f"{count_text(s, 'configurations')} configurations ({s.get('session_configurations', 0)} with several "
        f"sessions), {count_text(s, 'runs')} runs. Errors: each run against its own prediction, the median over a "
        f"configuration's runs (the measured and predicted columns are medians over the runs, under load often of "
        f"different runs, so their ratio can differ from the error). tokens/s: median |error| "
        f"{share('tokens_per_s', 'median_abs_error')} ({target('tokens_per_s_median_abs')}), max "
        f"{share('tokens_per_s', 'max_abs_error')} ({target('tokens_per_s_max_abs')}); step p50: median "
        f"|error| {share('step_p50', 'median_abs_error')}, max {share('step_p50', 'max_abs_error')} "
        f"({target('step_p50_max_abs')}); step p95: median |error| "
        f"{share('step_p95', 'median_abs_error')}, max {share('step_p95', 'max_abs_error')}."
        + (f" Several sessions: tokens/s a session median |error| "
           f"{_pct_or(summary_figure(s, 'sessions', 'tokens_per_s', 'median_abs_error'))}, max "
           f"{_pct_or(summary_figure(s, 'sessions', 'tokens_per_s', 'max_abs_error'))}; slowest session median "
           f"{_pct_or(summary_figure(s, 'sessions', 'slowest_tokens_per_s', 'median_abs_error'))}."
           if s.get("sessions") else ""))


def _spread_text(s: Mapping, res: Mapping, coverage: bool) -> str:
    """The summary's sentence on the repeats' spread, the intervals and the windows (a figure the summary lacks
    reads ``not measured``, a count ``?``)."""
    def share(*path: str, spec: str = ".2f") -> str:
        return percent_text(summary_figure(s, *path), spec)

    n, runs = count_text(s, "configurations"), count_text(s, "runs")
    return (
        "Spread of repeated runs ((max - min) / median): tokens/s median "
        f"{share('spread', 'tokens_per_s_median')}, "
        f"max {share('spread', 'tokens_per_s_max')} (coefficient of variation: median "
        f"{share('spread', 'tokens_per_s_cv_median')}); step p50 median "
        f"{share('spread', 'step_p50_median')}, "
        f"max {share('spread', 'step_p50_max')}. Prediction inside the measured range: "
        f"{count_text(s, 'within_spread')} of {n}; inside the 90% interval (run by run): "
        f"{s.get('inside_interval', 0)} of {n} "
        f"({share('inside_interval_share', spec='.0f')}, target when not quiet >= "
        f"{res.get('coverage_target', COVERAGE_TARGET) * 100:g}%{_by_chance(s, res) if coverage else ''}); "
        f"each run inside its own 90% interval: "
        f"{s.get('runs_inside', 0)} of {runs}. Runs predicted with the device and compute of "
        f"their own time window (fitted from their interleaved probe steps): {s.get('windows_probed', 0)} of "
        f"{runs}" + (f"; with the calibrated device and compute alone tokens/s would be off by a median "
                     f"{_pct_or(summary_figure(s, 'calibrated_only', 'median_abs_error'))}, max "
                     f"{_pct_or(summary_figure(s, 'calibrated_only', 'max_abs_error'))}."
                     if s.get("calibrated_only") else "."))


def _summary_lines(res: Mapping) -> List[str]:
    """The summary: the errors against the regime's targets, the spread and intervals, the regime and verdict."""
    s = res.get("summary") if isinstance(res.get("summary"), Mapping) else {}
    t = res.get("targets") or {}
    q = res.get("quiet_targets") or t
    rg = {"name": "unknown", "why": "", **(s.get("regime") if isinstance(s.get("regime"), Mapping) else {})}
    which, coverage, rule = regime_checks(rg["name"])
    use = q if which == "quiet" else t

    def target(key: str) -> str:
        if use and key not in use:
            return "reported, not held"
        at = percent_text(summary_figure(use, key), "g", "not recorded")
        return f"target <= {at}" if which is not None else f"any-machine target <= {at}, not held under load"

    return [
        "",
        _errors_text(s, target),
        _spread_text(s, res, coverage),
        f"Regime: {rg['name']} ({rg['why']}); {rule}. {verdict_text(s)}.",
    ]


def markdown_table(res: Mapping) -> str:
    """The cross-check as Markdown: single-session and multi-session tables, capacity, and a summary that says
    the regime, its targets and the verdict."""
    srows = res.get("session_rows") or []
    lines = (_single_lines(res["rows"]) + _session_lines(srows) + _capacity_lines(res.get("capacity") or [])
             + _cache_lines(res["rows"] + srows) + _summary_lines(res))
    left = (res.get("backends") or {}).get("left_out") or {}
    if left:
        lines.append("Backends left out: " + "; ".join(f"{b} ({why})" for b, why in left.items()) + ".")
    for w in res.get("warnings") or []:
        lines.append(f"Warning: {w}.")
    return "\n".join(lines)
