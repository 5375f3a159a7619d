"""Cross-check: the calibrated simulator's predictions against measured decode runs (SPEC §9).

For every configuration of a ``runs.json`` document (:mod:`sim.measure`) the
simulator (:func:`sim.decode.simulate_decode`, one session, fast mode) replays
the exact trace of the runs with the calibrated device of the configuration's
backend, the policy (threshold, readers = ring depth),
the compute model of its compute spec and the hash time
(:class:`sim.calibrate.Calibration`).  Predicted tokens/s and step-time
percentiles are compared with the measured ones (medians over the repeats),
next to the spread of the repeats, so noise is not mistaken for model error.

Definitions
-----------
- measured tokens/s: steps / wall time of a run's loop; the configuration's
  figure is the median over its repeats.  Step p50 / p95: per run, then the
  median over repeats.
- error: ``predicted / measured - 1``.
- spread: ``(max - min) / median`` of the repeats' tokens/s (and of their step
  p50); ``cv`` the coefficient of variation of the repeats' tokens/s.

The layout of ``crosscheck.json`` is in :mod:`sim.schema`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from tqdm import tqdm

from engram import read_model
from engram.errors import ArgumentError, FormatError

from .calibrate import Calibration
from .decode import simulate_decode
from .io import load_json, now_iso, sha256_file, write_json
from .schema import CROSSCHECK_SCHEMA, RunConfig, check_runs
from .trace import Trace, load_trace

__all__ = ["TARGETS", "CDF_PERCENTILES", "crosscheck", "crosscheck_files", "markdown_table", "predict"]

#: Acceptance targets of the cross-check (relative errors).
TARGETS = {"tokens_per_s_median_abs": 0.05, "tokens_per_s_max_abs": 0.10, "step_p50_max_abs": 0.10}
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
    r = simulate_decode(tr, dev, pol, comp, sessions=1, steps=steps, mode="fast", seed=seed, hash_time=cal.hash_s)
    lat = r.step_latencies.reshape(-1)
    return {"tokens_per_s": r.tokens_per_s, "step_p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "step_p95_ms": float(np.percentile(lat, 95)) * 1e3, "step_mean_ms": float(lat.mean()) * 1e3,
            "read_mean_ms": r.stall_ms["mean"] + cal.hash_s * 1e3, "compute_mean_ms": comp.mean * 1e3,
            "device": dev.name, "cdf_ms": [float(x) * 1e3 for x in np.percentile(lat, CDF_PERCENTILES)]}


def _median_of(xs) -> Optional[float]:
    xs = [float(x) for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


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
        "step_p50_ms": float(np.median(p50)), "step_p95_ms": float(np.median(p95)),
        "step_mean_ms": float(np.median([r["step_ms"]["mean"] for r in runs])),
        "read_mean_ms": float(np.median([r["read_ms"]["mean"] for r in runs])),
        "compute_mean_ms": float(np.median([r["compute_ms"]["mean"] for r in runs])),
        "rows_match": all(bool(r.get("rows_match", True)) for r in runs),
        "background_cpu": _median_of([(r.get("background") or {}).get("cpu") for r in runs]),
        "background_disk_iops": _median_of([(r.get("background") or {}).get("disk_iops") for r in runs]),
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


def crosscheck(cal: Calibration, runs_doc: Mapping, *, runs_path: Optional[Union[str, os.PathLike]] = None,
               sim_steps: Optional[int] = None, seed: int = 0, targets: Mapping[str, float] = TARGETS,
               progress: bool = False) -> dict:
    """Predict every measured configuration and tabulate the errors.

    Parameters
    ----------
    cal : Calibration
        From :func:`sim.calibrate.calibrate` (microbenchmarks only).
    runs_doc : mapping
        A ``runs.json`` document (schema ``engram.decode-runs/1``).
    runs_path : path, optional
        Where ``runs_doc`` was read from (its saved traces are found beside it).
    sim_steps, seed
        See :func:`predict`.
    targets : mapping
        Acceptance targets (see :data:`TARGETS`).

    Returns
    -------
    dict
        The ``crosscheck.json`` document (layout: :mod:`sim.schema`).

    Raises
    ------
    ArgumentError
        Not a decode-run document, or a run names an unknown configuration.
    """
    configs = check_runs(runs_doc)
    by_key: Dict[str, List[Mapping]] = {c.key: [] for c in configs}
    for r in runs_doc.get("runs", []):
        if r.get("config") not in by_key:
            raise ArgumentError(f"run of unknown configuration {r.get('config')!r}")
        by_key[r["config"]].append(r)
    configs = [c for c in configs if by_key[c.key]]
    if not configs:
        raise ArgumentError("the runs document holds no runs")
    rp = Path(runs_path) if runs_path is not None else None
    need: Dict[str, int] = {}
    for c in configs:
        end = max(int(r.get("start", 0)) + c.steps for r in by_key[c.key])
        need[c.trace] = max(need.get(c.trace, 0), end)
    traces = _load_traces(runs_doc, rp, configs, need)

    rows = []
    for c in tqdm(configs, desc="crosscheck", unit="config", disable=not progress, leave=False):
        m = _measured(by_key[c.key])
        p = predict(cal, c, traces[c.trace], starts=[int(r.get("start", 0)) for r in by_key[c.key]],
                    sim_steps=sim_steps, seed=seed)
        spread = m.pop("_spread")
        lo, hi = m.pop("_min_max")
        err = {"tokens_per_s": p["tokens_per_s"] / m["tokens_per_s"] - 1,
               "step_p50": p["step_p50_ms"] / m["step_p50_ms"] - 1,
               "step_p95": p["step_p95_ms"] / m["step_p95_ms"] - 1,
               "step_mean": p["step_mean_ms"] / m["step_mean_ms"] - 1}
        rows.append({**c.to_dict(), "repeats": len(by_key[c.key]), "measured": m, "predicted": p, "error": err,
                     "spread": spread, "within_spread": bool(lo <= p["tokens_per_s"] <= hi)})

    def stats(name: str) -> dict:
        e = np.array([r["error"][name] for r in rows])
        return {"median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.abs(e).max()),
                "mean_error": float(e.mean())}

    sp_t = np.array([r["spread"]["tokens_per_s"] for r in rows])
    sp_p = np.array([r["spread"]["step_p50"] for r in rows])
    summary = {"configurations": len(rows), "runs": int(sum(r["repeats"] for r in rows)),
               "tokens_per_s": stats("tokens_per_s"), "step_p50": stats("step_p50"),
               "step_p95": stats("step_p95"), "step_mean": stats("step_mean"),
               "spread": {"tokens_per_s_median": float(np.median(sp_t)), "tokens_per_s_max": float(sp_t.max()),
                          "tokens_per_s_cv_median": float(np.median([r["spread"]["tokens_per_s_cv"] for r in rows])),
                          "step_p50_median": float(np.median(sp_p)), "step_p50_max": float(sp_p.max())},
               "within_spread": int(sum(r["within_spread"] for r in rows)),
               "background_cpu_median": _median_of([r["measured"]["background_cpu"] for r in rows]),
               "rows_match": all(r["measured"]["rows_match"] for r in rows)}
    ok = {"tokens_per_s_median_abs": summary["tokens_per_s"]["median_abs_error"] <= targets["tokens_per_s_median_abs"],
          "tokens_per_s_max_abs": summary["tokens_per_s"]["max_abs_error"] <= targets["tokens_per_s_max_abs"],
          "step_p50_max_abs": summary["step_p50"]["max_abs_error"] <= targets["step_p50_max_abs"]}
    summary["pass"] = ok
    summary["passed"] = all(ok.values())
    return {
        "schema": CROSSCHECK_SCHEMA, "kind": "crosscheck",
        "date": now_iso(),
        "calibration": {"date": cal.date, "source": cal.source}, "runs": {"date": runs_doc.get("date")},
        "machine": runs_doc.get("machine", {}),
        "sim": {"steps": sim_steps, "seed": seed, "mode": "fast"},
        "targets": dict(targets), "summary": summary, "rows": rows, "cdf_percentiles": list(CDF_PERCENTILES),
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


def markdown_table(res: Mapping) -> str:
    """The cross-check as a Markdown table (one line per configuration) and a summary."""
    head = ("| trace | threshold | backend | readers | compute | steps | tokens/s measured (spread) | "
            "predicted | error | step p50 ms measured | predicted | error | step p95 ms measured | predicted | "
            "error |")
    lines = [head, "|" + "---|" * 15]
    for r in res["rows"]:
        m, p, e, s = r["measured"], r["predicted"], r["error"], r["spread"]
        pol = "serial" if r["serial"] else r["backend"]
        rd = "-" if r["serial"] else str(r["readers"])
        lines.append(
            f"| {r['trace_label']} | {r['threshold']} | {pol} | {rd} | {r['compute']} | {r['steps']} x{r['repeats']} | "
            f"{m['tokens_per_s']:.1f} ({s['tokens_per_s'] * 100:.1f}%) | {p['tokens_per_s']:.1f} | "
            f"{_pct(e['tokens_per_s'])} | {m['step_p50_ms']:.3f} | {p['step_p50_ms']:.3f} | {_pct(e['step_p50'])} | "
            f"{m['step_p95_ms']:.3f} | {p['step_p95_ms']:.3f} | {_pct(e['step_p95'])} |")
    s = res["summary"]
    t = res["targets"]
    lines += [
        "",
        f"{s['configurations']} configurations, {s['runs']} runs. "
        f"tokens/s: median |error| {s['tokens_per_s']['median_abs_error'] * 100:.2f}% "
        f"(target <= {t['tokens_per_s_median_abs'] * 100:g}%), max {s['tokens_per_s']['max_abs_error'] * 100:.2f}% "
        f"(target <= {t['tokens_per_s_max_abs'] * 100:g}%); step p50: median |error| "
        f"{s['step_p50']['median_abs_error'] * 100:.2f}%, max {s['step_p50']['max_abs_error'] * 100:.2f}% "
        f"(target <= {t['step_p50_max_abs'] * 100:g}%); step p95: median |error| "
        f"{s['step_p95']['median_abs_error'] * 100:.2f}%, max {s['step_p95']['max_abs_error'] * 100:.2f}%.",
        "Spread of repeated runs ((max - min) / median): tokens/s median "
        f"{s['spread']['tokens_per_s_median'] * 100:.2f}%, "
        f"max {s['spread']['tokens_per_s_max'] * 100:.2f}% (coefficient of variation: median "
        f"{s['spread'].get('tokens_per_s_cv_median', 0) * 100:.2f}%); step p50 median "
        f"{s['spread']['step_p50_median'] * 100:.2f}%, "
        f"max {s['spread']['step_p50_max'] * 100:.2f}%. Prediction inside the measured range: "
        f"{s['within_spread']} of {s['configurations']}."
        + (f" Other processes used a median {s['background_cpu_median'] * 100:.1f}% of the CPUs during the runs."
           if s.get("background_cpu_median") is not None else "")
        + f" {'PASS' if s['passed'] else 'FAIL'}.",
    ]
    return "\n".join(lines)
