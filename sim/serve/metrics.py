"""What a serving run measured: latencies, throughput, goodput under SLOs, the device, and the checks.

Per request (arrival ``a``, admission, first token ``f``, last token ``e``, ``O`` output tokens):

- **TTFT** (time to first token) ``f - a``; **E2E** latency ``e - a``; **queue** ``admission - a``;
- **TBT** (time between tokens): every gap between two consecutive tokens of a request, pooled over
  the measured requests (Vidur's decode token time as the user sees it);
- **TPOT** (time per output token) ``(e - f) / (O - 1)``: a request's mean gap (DistServe's decode SLO).

Percentiles p50, p90, p99 (and the mean and max).  Requests arriving in ``[warmup, duration)`` are
measured; a request the run's time cap cut short is *censored*: its latencies count at their lower
bound (the time it had waited), and the run does not meet its SLOs.

**SLOs** (:class:`SLO`): the run meets them when the ``percentile`` (99 by default) of TTFT is at most
``ttft_s`` and of TBT at most ``tbt_ms``, with no censored request (Vidur-Search's criterion).  A
request meets them when its TTFT is at most ``ttft_s`` and its TPOT at most ``tbt_ms``
(DistServe's); **goodput** is the measured requests that meet them per second of the window, and
``attainment`` their share.

**Throughput and goodput share one denominator**, the measurement window ``duration - warmup``:
``requests_per_s`` is the measured requests that completed per second of the window, ``goodput_rps``
the measured requests that completed *and* met the SLOs per second of the window, so goodput never
exceeds throughput.  ``output_tokens_per_s`` and ``prompt_tokens_per_s`` are the engine's work over
the whole simulated run (warmup and drain included).

**Where the time of a token goes** (decode steps, weighted by the tokens they emit): compute, the
decode batch's reads as they would take alone on the device, the extra wait of those reads behind
the prefill reads sharing the device (``contention``), and waits of a stalled step for prefill rows
(``stall``).  With the queueing of TTFT, these tell where a latency knee comes from.

**Little's law**, checked on every run: requests in the system (time average of arrivals minus
departures) against arrival rate x mean time in the system, over the whole run (an identity of the
bookkeeping) and over the last three quarters of the arrival window (steady state, approximate);
reads in the device (time average of its queue depth) against reads/s x mean read latency (batch
by batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

import numpy as np

from engram.errors import ArgumentError

from ..device import summarize_counter
from sim.core.schema import percentiles_ms
from .engine import EngineTrace
from .workload import Requests

__all__ = ["DEFAULT_SLO_PERCENTILE", "DEFAULT_TBT_MS", "DEFAULT_TTFT_S", "SLO", "ServeResult", "littles_law_requests",
           "plain_value", "summarize"]

#: Default SLOs (issue 16): p99 TTFT <= 2 s, p99 TBT <= 100 ms.
DEFAULT_TTFT_S = 2.0
DEFAULT_TBT_MS = 100.0
DEFAULT_SLO_PERCENTILE = 99.0
_PCT = (50, 90, 99)


@dataclass(frozen=True)
class SLO:
    """Latency targets (see the module docstring).

    Raises
    ------
    ArgumentError
        A target <= 0 or a percentile outside (0, 100].
    """

    ttft_s: float = DEFAULT_TTFT_S
    tbt_ms: float = DEFAULT_TBT_MS
    percentile: float = DEFAULT_SLO_PERCENTILE

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tbt_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ArgumentError(f"SLO {name} = {v!r} must be a number > 0")
        if not 0 < self.percentile <= 100:
            raise ArgumentError(f"SLO percentile = {self.percentile!r} must be in (0, 100]")

    def scaled(self, factor: float) -> "SLO":
        """Both targets times ``factor`` (slack)."""
        return SLO(self.ttft_s * factor, self.tbt_ms * factor, self.percentile)

    def text(self) -> str:
        p = f"p{self.percentile:g}"
        return f"{p} TTFT <= {self.ttft_s:g} s, {p} TBT <= {self.tbt_ms:g} ms"

    def to_dict(self) -> dict:
        return {"ttft_s": self.ttft_s, "tbt_ms": self.tbt_ms, "percentile": self.percentile}


def plain_value(v):
    """A NumPy scalar as the Python number it holds (tables write Python floats at full precision)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def _pct(x: np.ndarray, scale: float = 1e3) -> dict:
    """``{mean, p50, p90, p99, max}`` of seconds (times ``scale``: ms by default)."""
    d = percentiles_ms(x, _PCT)
    return {k: v * scale / 1e3 for k, v in d.items()}


def _q(x: np.ndarray, p: float) -> float:
    return float(np.percentile(x, p)) if x.size else 0.0


def _time_average(t: np.ndarray, delta: np.ndarray, t0: float, t1: float) -> float:
    """Time average over ``[t0, t1]`` of the counter that changes by ``delta`` at times ``t`` (0 before)."""
    if t1 <= t0:
        return 0.0
    o = np.argsort(t, kind="stable")
    t, level = t[o], np.cumsum(delta[o])
    edges = np.clip(np.concatenate([t, [t1]]), t0, t1)
    return float(np.sum(np.diff(edges) * level) / (t1 - t0))


def littles_law_requests(arrival: np.ndarray, leave: np.ndarray, t0: float, t1: float) -> dict:
    """Requests in the system over ``[t0, t1]``: its time average ``L`` against ``lambda * W``.

    ``lambda`` counts the arrivals in the window per second, ``W`` their mean time in the system; over
    a whole run (every request arrived and left inside it) the two are equal by construction.
    """
    L = _time_average(np.concatenate([arrival, leave]),
                      np.concatenate([np.ones(arrival.size), -np.ones(leave.size)]), t0, t1)
    inside = (arrival >= t0) & (arrival < t1)
    lam = float(inside.sum()) / (t1 - t0) if t1 > t0 else 0.0
    W = float(np.mean(leave[inside] - arrival[inside])) if inside.any() else 0.0
    return {"window_s": [t0, t1], "L": L, "lambda": lam, "W_s": W, "lambda_W": lam * W,
            "ratio": L / (lam * W) if lam * W > 0 else float("nan")}


@dataclass
class ServeResult:
    """Outcome of :func:`sim.serve.simulate_serve` (see the module docstring); latencies in ms unless named ``_s``.

    Attributes
    ----------
    requests : dict
        ``arrived``, ``measured``, ``completed``, ``censored`` (measured requests cut short), ``window_s``.
    ttft_ms, tbt_ms, tpot_ms, e2e_ms, queue_ms : dict
        ``{mean, p50, p90, p99, max}``.
    throughput : dict
        ``requests_per_s`` (measured requests completed, per second of the measurement window -- the
        denominator of ``goodput_rps``), ``output_tokens_per_s``, ``prompt_tokens_per_s`` (over the whole run).
    slo : dict
        The targets, ``ttft_ok``, ``tbt_ok``, ``stable``, ``met``, ``attainment``, ``goodput_rps``.
    device : dict
        ``name``, ``drives``, ``busy_fraction``, ``mean_queue_depth``, ``max_queue_depth``, ``reads_per_s``,
        ``mean_read_latency_us``, ``iops_utilization``, ``decode_reads``, ``prefill_reads``, ``dedup_saving``
        (share of decode row requests a step's cross-request deduplication saved), ``shared_cache_hit_rate``,
        ``request_cache_hit_rate`` (the per-request row caches', over their decode row requests; 0 without them).
    engine : dict
        ``steps``, ``mean_batch``, ``max_batch``, ``mean_running``, ``mean_waiting``, ``step_ms``, ``idle_fraction``,
        ``prefill_steps`` (share of steps with prompt tokens).
    token_time_ms : dict
        Mean of a decode token's step split into ``compute``, ``reads_alone``, ``contention``, ``stall``
        (they add up to the mean TBT of the steps).
    ttft_parts_ms : dict
        Mean TTFT split into ``queue`` (waiting for a place in the running set), ``prefill_reads`` (until the
        prompt's rows are all read: they stream while its first chunks compute) and ``prefill_compute`` (the rest:
        its steps after the last row arrived).
    tail_ms : dict
        The same splits over the tail the SLO looks at: ``token``, over the decode steps whose time is at or
        above its SLO percentile (weighted by their tokens); ``ttft``, over the requests whose TTFT is.
    littles_law : dict
        ``requests`` (whole run), ``requests_steady``, ``reads``: each ``L``, ``lambda_W`` (or ``X_R``), ``ratio``.
    timeline : dict
        ``t_s`` (bin centres), ``queue_depth``, ``busy``, ``running``, ``waiting``, ``batch``.
    config : dict
    warnings : list of str
    sim_seconds, wall_seconds : float
    """

    requests: dict
    ttft_ms: dict
    tbt_ms: dict
    tpot_ms: dict
    e2e_ms: dict
    queue_ms: dict
    throughput: dict
    slo: dict
    device: dict
    engine: dict
    token_time_ms: dict
    ttft_parts_ms: dict
    tail_ms: dict
    littles_law: dict
    timeline: dict
    config: dict
    warnings: list
    sim_seconds: float
    wall_seconds: float = 0.0
    per_request: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    tbt_samples: Optional[np.ndarray] = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("requests", "ttft_ms", "tbt_ms", "tpot_ms", "e2e_ms", "queue_ms",
                                              "throughput", "slo", "device", "engine", "token_time_ms", "ttft_parts_ms", "tail_ms",
                                              "littles_law", "timeline", "config", "warnings", "sim_seconds",
                                              "wall_seconds")}

    def row(self) -> dict:
        """The flat metrics of a table row (:data:`sim.serve.study.SERVE_METRICS`)."""
        s, d, e, tt = self.slo, self.device, self.engine, self.token_time_ms
        out = {"requests_measured": self.requests["measured"], "censored": self.requests["censored"],
               "slo_met": int(bool(s["met"])), "attainment": s["attainment"], "goodput_rps": s["goodput_rps"],
               "ttft_at_slo_ms": s["ttft_p_s"] * 1e3, "tbt_at_slo_ms": s["tbt_p_ms"],
               "requests_per_s": self.throughput["requests_per_s"],
               "output_tokens_per_s": self.throughput["output_tokens_per_s"]}
        for name in ("ttft", "tbt", "tpot", "e2e", "queue"):
            m = getattr(self, f"{name}_ms")
            for k in ("mean", "p50", "p90", "p99"):
                out[f"{name}_{k}_ms"] = m[k]
        out.update({"device_busy": d["busy_fraction"], "mean_queue_depth": d["mean_queue_depth"],
                    "reads_per_s": d["reads_per_s"], "mean_read_latency_us": d["mean_read_latency_us"],
                    "iops_utilization": d["iops_utilization"], "dedup_saving": d["dedup_saving"],
                    "prefill_read_share": d["prefill_reads"] / max(d["decode_reads"] + d["prefill_reads"], 1),
                    "mean_batch": e["mean_batch"], "mean_running": e["mean_running"],
                    "mean_waiting": e["mean_waiting"], "prefill_steps": e["prefill_steps"],
                    "token_compute_ms": tt["compute"], "token_reads_alone_ms": tt["reads_alone"],
                    "token_contention_ms": tt["contention"], "token_stall_ms": tt["stall"],
                    "ttft_queue_ms": self.ttft_parts_ms["queue"],
                    "ttft_prefill_reads_ms": self.ttft_parts_ms["prefill_reads"],
                    "ttft_prefill_compute_ms": self.ttft_parts_ms["prefill_compute"],
                    **{f"tail_token_{k}_ms": v for k, v in self.tail_ms["token"].items()},
                    **{f"tail_ttft_{k}_ms": v for k, v in self.tail_ms["ttft"].items()},
                    "sim_seconds": self.sim_seconds, "wall_seconds": self.wall_seconds})
        return {k: plain_value(v) for k, v in out.items()}

    def summary(self) -> str:
        c, r, s, d, e, tt = self.config, self.requests, self.slo, self.device, self.engine, self.token_time_ms
        w, sc = c["workload"], c["scheduler"]
        store = f"device {d['name']}" + (f" x{d['drives']} striped" if d["drives"] > 1 else "")
        pol = c["policy"]

        def pc(m):
            return f"p50 {m['p50']:.1f}  p90 {m['p90']:.1f}  p99 {m['p99']:.1f}  mean {m['mean']:.1f}"

        lines = [
            f"serve     {w['arrivals']} arrivals at {w['rate']:g} requests/s for {w['duration_s']:g} s"
            + (f" (cv {w['cv']:g})" if w["arrivals"] == "gamma" else "")
            + f"; prompts {w['prompt_tokens']}, outputs {w['output_tokens']}; seed {c['seed']}",
            f"engine    max {sc['max_running']} running, {sc['prefill_chunk']} prompt tokens a step, reader chunks "
            f"of {sc['read_chunk']}, gate {sc['gate']}; compute {c['compute']['step_ms_batch1']:.3f} ms at batch 1 "
            f"+ {c['compute']['token_ms'] / c['compute']['scale']:.4g} ms a token",
            f"reads     {store}, threshold {pol['threshold']}, {pol['backend']} x{pol['readers']}"
            + (f", cache {pol['cache_rows']} rows/request ({pol['cache_policy']}, hit rate "
               f"{d['request_cache_hit_rate']:.3f})" if pol["cache_rows"] else "")
            + (f", shared cache {pol['shared_cache_rows']} rows ({pol['cache_policy']})"
               if pol["shared_cache_rows"] else "")
            + (f", DRAM {pol['dram_fraction']:.3g}" if pol["dram_fraction"] else ""),
            *([_drafts_line(c["speculation"])] if c.get("speculation") else []),
            f"requests  {r['measured']} measured of {r['arrived']} ({r['completed']} completed, {r['censored']} cut "
            f"short); {self.throughput['requests_per_s']:.3f} requests/s, "
            f"{self.throughput['output_tokens_per_s']:.1f} output tokens/s",
            f"TTFT ms   {pc(self.ttft_ms)}",
            f"TBT ms    {pc(self.tbt_ms)}",
            f"TPOT ms   {pc(self.tpot_ms)}",
            f"E2E ms    {pc(self.e2e_ms)}   (queue p99 {self.queue_ms['p99']:.1f})",
            f"SLO       {s['text']}: {'met' if s['met'] else 'NOT met'} (TTFT {'ok' if s['ttft_ok'] else 'over'}, "
            f"TBT {'ok' if s['tbt_ok'] else 'over'}{'' if s['stable'] else ', requests cut short'}); goodput "
            f"{s['goodput_rps']:.3f} requests/s, attainment {s['attainment']:.3f}",
            f"TTFT mean {self.ttft_parts_ms['queue']:.1f} ms queued + {self.ttft_parts_ms['prefill_reads']:.1f} ms "
            f"while its rows stream + {self.ttft_parts_ms['prefill_compute']:.1f} ms computing after them",
            f"token     {tt['compute']:.2f} ms compute + {tt['reads_alone']:.2f} ms reads alone + "
            f"{tt['contention']:.2f} ms behind prefill reads + {tt['stall']:.2f} ms stalled",
            f"batch     mean {e['mean_batch']:.1f} decoding (max {e['max_batch']}), {e['mean_running']:.1f} running, "
            f"{e['mean_waiting']:.1f} waiting; {e['steps']} steps, {e['prefill_steps']:.2f} with prompt tokens, "
            f"idle {e['idle_fraction']:.2f}",
            f"device    busy {d['busy_fraction']:.3f}, mean qd {d['mean_queue_depth']:.2f}, {d['reads_per_s']:.0f} reads/s "
            f"({d['iops_utilization']:.3f} of peak), mean read {d['mean_read_latency_us']:.1f} us; decode "
            f"{d['decode_reads']} reads (dedup saved {d['dedup_saving']:.3f}), prefill {d['prefill_reads']}",
            f"Little    requests L {self.littles_law['requests']['L']:.3f} = lambda W "
            f"{self.littles_law['requests']['lambda_W']:.3f}; reads L {self.littles_law['reads']['L']:.3f} = X R "
            f"{self.littles_law['reads']['X_R']:.3f}",
            f"simulated {self.sim_seconds:.1f} s in {self.wall_seconds:.2f} s",
        ]
        lines += [f"WARNING   {x}" for x in self.warnings]
        return "\n".join(lines)


def _timeline_steps(steps: Dict[str, np.ndarray], key: str, edges: np.ndarray) -> list:
    """Per bin, the time average of a step quantity (held from a step's start to the next step's start; 0 idle)."""
    t0, t1 = steps["t0"], steps["t_end"]
    if t0.size == 0:
        return [0.0] * (edges.size - 1)
    v = steps[key]
    t = np.concatenate([t0, t1])
    dv = np.concatenate([v, -v])
    o = np.argsort(t, kind="stable")
    t, lv = t[o], np.cumsum(dv[o])
    cum = np.concatenate([[0.0], np.cumsum(lv[:-1] * np.diff(t))])
    at = np.interp(edges, t, cum, left=0.0, right=cum[-1])
    w = np.diff(edges)
    return (np.diff(at) / np.where(w > 0, w, 1.0)).tolist()


def summarize(trace: EngineTrace, reqs: Requests, slo: SLO, *, window: tuple, device, drives: int, config: dict,
              bins: int = 100, warnings: Optional[list] = None) -> ServeResult:
    """The :class:`ServeResult` of an engine run (see the module docstring).

    ``window`` is ``(warmup, duration)``: requests arriving in it are measured.
    """
    t = _RequestTimes(trace, reqs, window)
    devs = trace.devices
    area = sum(d.area for d in devs)
    reads = sum(d.reads for d in devs)
    batch_area = sum(d.batch_area for d in devs)
    st = trace.steps
    tok, tok_tail, eng = _token_time(st, slo, t.end)
    ll = {"requests": littles_law_requests(reqs.arrival, t.leave, 0.0, t.end),
          "requests_steady": littles_law_requests(reqs.arrival, t.leave, window[0] + 0.25 * t.span, window[1]),
          "reads": {"L": area / t.end, "X": reads / t.end, "R_s": batch_area / reads if reads else 0.0,
                    "X_R": batch_area / t.end}}
    ll["reads"]["ratio"] = ll["reads"]["L"] / ll["reads"]["X_R"] if ll["reads"]["X_R"] > 0 else float("nan")
    # throughput over the measurement window, the goodput's denominator: goodput <= throughput
    thr = {"requests_per_s": float((t.meas & t.done).sum() / t.span) if t.span > 0 else 0.0,
           "output_tokens_per_s": float(trace.emitted.sum()) / t.end,
           "prompt_tokens_per_s": float(reqs.prompt[~np.isnan(trace.first)].sum()) / t.end}
    a, meas = t.a, t.meas
    return ServeResult(
        requests={"arrived": len(reqs), "measured": t.n_meas, "completed": int(t.done.sum()), "censored": t.censored,
                  "window_s": list(window)},
        ttft_ms=_pct(t.ttft), tbt_ms=_pct(trace.tbt), tpot_ms=_pct(t.tpot), e2e_ms=_pct(t.e2e),
        queue_ms=_pct(t.queue), throughput=thr, slo=t.slo(slo), device=_device(trace, device, drives, t.end),
        engine=eng, token_time_ms=tok, ttft_parts_ms=t.ttft_split(t.got),
        tail_ms={"token": tok_tail, "ttft": t.ttft_tail(slo)},
        littles_law=ll, timeline=_timeline(trace, t.end, bins),
        config=config, warnings=list(warnings or []), sim_seconds=t.end,
        per_request={"arrival": a, "admit": trace.admit, "first": trace.first, "finish": t.fin, "prompt": reqs.prompt,
                     "output": reqs.output, "emitted": trace.emitted, "measured": meas},
        tbt_samples=trace.tbt)


class _RequestTimes:
    """Per request of a run: arrival, admission, rows read, first token, leaving (the run's end where they did
    not happen), the measured ones, and their latencies."""

    def __init__(self, trace: EngineTrace, reqs: Requests, window: tuple):
        self.trace, self.reqs = trace, reqs
        self.end = end = max(trace.end, 1e-12)
        self.a = a = reqs.arrival
        self.meas = meas = (a >= window[0]) & (a < window[1])
        self.fin = fin = trace.finish
        self.done = done = ~np.isnan(fin)
        self.leave = np.where(done, fin, end)
        self.first = first = np.where(np.isnan(trace.first), end, trace.first)
        self.admit = admit = np.where(np.isnan(trace.admit), end, trace.admit)
        self.ready = np.where(np.isnan(trace.read), first, np.clip(trace.read, admit, first))
        self.ttft = np.maximum(first - a, 0.0)[meas]
        self.e2e = np.maximum(self.leave - a, 0.0)[meas]
        self.queue = np.maximum(admit - a, 0.0)[meas]
        O = reqs.output
        multi = meas & done & (O > 1)
        self.tpot = ((fin - trace.first) / np.maximum(O - 1, 1))[multi]
        self.censored = int((meas & ~done).sum())
        self.span = window[1] - window[0]
        self.n_meas = int(meas.sum())
        self.got = meas & ~np.isnan(trace.first)

    def slo(self, slo: SLO) -> dict:
        """The SLO verdict: the percentiles against their targets, stability, attainment, goodput."""
        a, first, O = self.a, self.first, self.reqs.output
        p = slo.percentile
        ttft_p, tbt_p = _q(self.ttft, p), _q(self.trace.tbt, p)
        ok_req = self.meas & self.done & ((first - a) <= slo.ttft_s)
        tpot_all = np.where(O > 1, (self.leave - first) / np.maximum(O - 1, 1), 0.0)
        ok_req &= tpot_all * 1e3 <= slo.tbt_ms
        n_meas, span = self.n_meas, self.span
        slo_d = {**slo.to_dict(), "text": slo.text(), "ttft_p_s": ttft_p, "tbt_p_ms": tbt_p * 1e3,
                 "ttft_ok": ttft_p <= slo.ttft_s, "tbt_ok": tbt_p * 1e3 <= slo.tbt_ms, "stable": self.censored == 0}
        slo_d["met"] = bool(slo_d["ttft_ok"] and slo_d["tbt_ok"] and slo_d["stable"] and n_meas > 0)
        slo_d["attainment"] = float(ok_req.sum() / n_meas) if n_meas else 0.0
        slo_d["goodput_rps"] = float(ok_req.sum() / span) if span > 0 else 0.0
        return slo_d

    def ttft_split(self, sel: np.ndarray) -> dict:
        """Mean ms of the requests ``sel`` waiting for admission, for their prompt's rows, for its compute."""
        if not sel.any():
            return {"queue": 0.0, "prefill_reads": 0.0, "prefill_compute": 0.0}
        a, admit, ready, first = self.a, self.admit, self.ready, self.first
        return {"queue": float(np.mean((admit - a)[sel])) * 1e3,
                "prefill_reads": float(np.mean((ready - admit)[sel])) * 1e3,
                "prefill_compute": float(np.mean((first - ready)[sel])) * 1e3}

    def ttft_tail(self, slo: SLO) -> dict:
        """:meth:`ttft_split` of the measured requests at or above the SLO percentile of the TTFT."""
        got = self.got
        ttft_all = np.where(got, self.first - self.a, -np.inf)
        return self.ttft_split(got & (ttft_all >= _q(ttft_all[got], slo.percentile))) if got.any() \
            else self.ttft_split(got)


def _device(trace: EngineTrace, device, drives: int, end: float) -> dict:
    """The drives' busy share, queue depth, reads, latency, utilisation, dedup and shared cache."""
    devs = trace.devices
    area = sum(d.area for d in devs)
    reads = sum(d.reads for d in devs)
    batch_area = sum(d.batch_area for d in devs)
    peak = device.peak_iops() * drives
    asked = trace.decode_rows_asked
    return {"name": device.name, "drives": drives,
            "busy_fraction": float(np.mean([d.busy for d in devs])) / end,
            "mean_queue_depth": area / end, "max_queue_depth": max(d.max_depth for d in devs),
            "reads_per_s": reads / end, "mean_read_latency_us": batch_area / reads * 1e6 if reads else 0.0,
            "iops_utilization": reads / end / peak if peak > 0 else 0.0,
            "decode_reads": trace.decode_reads, "prefill_reads": trace.prefill_reads,
            "dedup_saving": 1.0 - trace.decode_reads / asked if asked else 0.0,
            "shared_cache_hit_rate": (trace.shared_cache["hits"] / trace.shared_cache["requests"]
                                      if trace.shared_cache["requests"] else 0.0),
            "request_cache_hit_rate": (trace.request_cache["hits"] / trace.request_cache["requests"]
                                       if trace.request_cache["requests"] else 0.0)}


def _timeline(trace: EngineTrace, end: float, bins: int) -> dict:
    """Per bin: the drives' queue depth and busy share, the requests running and waiting, the batch."""
    devs = trace.devices
    tl = [summarize_counter((np.asarray(d.times), np.asarray(d.depths, dtype=np.float64)), end, bins) for d in devs]
    timeline = {"t_s": tl[0]["timeline"]["t_s"],
                "queue_depth": np.sum([x["timeline"]["queue_depth"] for x in tl], axis=0).tolist(),
                "busy": np.mean([x["timeline"]["busy"] for x in tl], axis=0).tolist()}
    edges = np.linspace(0.0, end, bins + 1)
    for key, name in (("running", "running"), ("waiting", "waiting"), ("B", "batch")):
        timeline[name] = _timeline_steps(trace.steps, key, edges)
    return timeline


def _token_time(st: Dict[str, np.ndarray], slo: SLO, end: float) -> tuple:
    """``(the time of a token by part, the same in the tail, the engine's steps)``: ms a decode token spends in
    compute, its reads alone, contention and stall (each step weighted by its tokens)."""
    B = st["B"]
    dur = st["t_end"] - st["t0"]
    busy_t = float(dur.sum())
    wait = st["t_read"] - st["t0"]
    comp = st["compute"]
    stall = np.maximum(st["t_end"] - st["t_read"] - comp, 0.0)
    alone = np.minimum(st["alone"], wait)
    cont = np.maximum(wait - alone, 0.0)
    wsum = float(B.sum())

    def per_token(x, sel=None):
        w = B if sel is None else B * sel
        tot = float(w.sum())
        return float(np.sum(x * w) / tot) * 1e3 if tot else 0.0

    # the tail: the decode steps at or above the SLO percentile of a token's time (each step weighted by its tokens)
    tail = np.zeros(B.size)
    if wsum:
        o = np.argsort(dur, kind="stable")
        cw = np.cumsum(B[o]) / wsum
        k = int(np.searchsorted(cw, slo.percentile / 100.0, side="left"))
        tail[o[min(k, o.size - 1):]] = 1.0

    eng = {"steps": int(B.size), "mean_batch": float(B.mean()) if B.size else 0.0,
           "max_batch": int(B.max()) if B.size else 0,
           "mean_running": float(np.sum(st["running"] * dur) / busy_t) if busy_t > 0 else 0.0,
           "mean_waiting": float(np.sum(st["waiting"] * dur) / busy_t) if busy_t > 0 else 0.0,
           "step_ms": _pct(dur), "idle_fraction": max(0.0, 1.0 - busy_t / end),
           "prefill_steps": float(np.mean(st["P"] > 0)) if B.size else 0.0}
    tok = {"compute": per_token(comp), "reads_alone": per_token(alone), "contention": per_token(cont),
           "stall": per_token(stall)}
    tok["total"] = sum(tok.values())
    tok_tail = {"compute": per_token(comp, tail), "reads_alone": per_token(alone, tail),
                "contention": per_token(cont, tail), "stall": per_token(stall, tail)}
    return tok, tok_tail, eng


def _drafts_line(sp: Mapping) -> str:
    """The summary line of a speculative run (``config["speculation"]`` of :func:`sim.serve.simulate_serve`)."""
    return (f"drafts    {sp['draft_tokens']} a step, acceptance {','.join(f'{a:g}' for a in sp['acceptance'])} "
            f"({sp['expected_tokens_per_step']:.3f} tokens a verification step expected), prefetch "
            f"{'on' if sp['prefetch_drafts'] else 'off'}: {sp['wasted_reads']} reads for rejected drafts, "
            f"{sp['prefetched_reads']} prefetched")
