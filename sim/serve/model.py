"""``simulate_serve``: one serving configuration end to end -- requests, engine, device, metrics (issue 16).

The pieces: the workload (:mod:`sim.serve.workload`), the rows each request reads
(:mod:`sim.serve.rows`), the engine and its scheduler (:mod:`sim.serve.engine`), the compute of a
step (:mod:`sim.serve.compute`), the device shared by decode and prefill reads
(:mod:`sim.serve.device`) and what is measured (:mod:`sim.serve.metrics`).
"""

from __future__ import annotations

import os
import time
from typing import Optional, Union

import numpy as np

from engram.errors import ArgumentError

from ..decode import hot_rows
from ..decode.speculative import Speculation
from ..device import Device, load_device, with_tail
from sim.core.params import Policy
from ..trace import Trace, load_trace
from .compute import StepCompute
from .engine import Engine, Scheduler
from .metrics import SLO, ServeResult, summarize
from .rows import RowSource
from .workload import RequestFile, Workload, make_requests, read_request_file

__all__ = ["DEFAULT_TEXT", "DEFAULT_TEXT_TOKENS", "drain_time", "simulate_serve"]

#: The text prompts are stretches of and decode tokens continue: a long real text (the novel ds4 benchmarks on).
DEFAULT_TEXT = "shared:promessi_sposi.txt"
#: Tokens of the default text taken (its first 200,000 of 417,059; a :class:`~sim.serve.rows.RowSource` keeps
#: whole read chunks of them: 198,656 at 2,048-token chunks).
DEFAULT_TEXT_TOKENS = 200_000


def drain_time(slo: SLO, max_output: int) -> float:
    """Seconds the run goes on after the last arrival: twice what the slowest request meeting the SLOs takes
    (its TTFT target plus its output at the TBT target), plus 10 s."""
    return 2.0 * (slo.ttft_s + max_output * slo.tbt_ms * 1e-3) + 10.0


def simulate_serve(workload: Workload, device: Union[Device, str] = "seed-apple-m3-ultra", policy: Policy = Policy(),
                   compute: Optional[StepCompute] = None, scheduler: Scheduler = Scheduler(), slo: SLO = SLO(), *,
                   text: Union[Trace, str] = DEFAULT_TEXT, text_limit: Optional[int] = DEFAULT_TEXT_TOKENS,
                   drives: int = 1, hot: Union[np.ndarray, str, os.PathLike, None] = None,
                   tail: Union[Device, str, None] = None, calibration=None, seed: int = 0, warmup: float = 0.0,
                   drain: Optional[float] = None, bins: int = 100, requests_file: Optional[RequestFile] = None,
                   rows: Optional[RowSource] = None, fail_fast: bool = False,
                   progress: Union[bool, str] = False, speculation: Optional[Speculation] = None) -> ServeResult:
    """Simulate serving ``workload`` on one engine whose Engram tables sit on ``device``.

    Parameters
    ----------
    workload : Workload
        Arrivals and lengths (:mod:`sim.serve.workload`).
    device : Device or str
        Each drive (any form of :func:`sim.device.load_device`).
    policy : Policy
        Threshold, backend, readers, row caches, DRAM-resident share, overlap (SPEC §8).
    compute : StepCompute, optional
        Compute of a step (default :meth:`StepCompute.reference`: the SPEC §8 step on an M3 Ultra).
    scheduler : Scheduler
        Admission, batch size, prefill chunk, reader chunk, gate.
    slo : SLO
        Latency targets of the goodput and of the SLO verdict.
    text : Trace or str
        The rows' text (a source spec of :func:`sim.trace.load_trace`, ``synth:reuse=R`` included).
    text_limit : int, optional
        Tokens of ``text`` to use when it is loaded here.
    drives : int
        Identical drives the tables are striped over by row id.
    hot, tail, calibration
        A hot set in DRAM, a device whose latency distribution to take, a calibration (as in
        :func:`sim.decode.simulate_decode`).
    seed : int
        Every random stream: arrivals, lengths, where requests read, device draws, compute spread.
    warmup : float
        Seconds at the start whose arrivals are not measured.
    drain : float, optional
        Seconds the run may go on after the last arrival (default :func:`drain_time`).
    requests_file : RequestFile, optional
        ``workload.requests`` already read (else read here).
    rows : RowSource, optional
        The rows already prepared for this text, policy and reader chunk (a study prepares them once).
    fail_fast : bool
        Stop as soon as the TTFT target can no longer be met (for a capacity search).
    progress : bool or str
        :mod:`sim.core.progress` mode of the run, one item a request arrived (default off: a study's points run
        many at once).
    speculation : Speculation, optional
        Speculative decoding: draft tokens a step, their acceptance, the drafts' rows prefetched
        (:mod:`sim.serve.engine`, :mod:`sim.decode.speculative`); ``None`` or ``k = 0``: off.

    Returns
    -------
    ServeResult

    Raises
    ------
    ArgumentError
        Bad warmup, drain or bins, a second-table start after its layer, and the errors of the parts.
    """
    t_wall = time.perf_counter()
    if not 0 <= warmup < workload.duration:
        raise ArgumentError(f"warmup = {warmup} must be in [0, duration = {workload.duration})")
    if int(bins) < 1:
        raise ArgumentError(f"bins must be >= 1, got {bins}")
    device = load_device(device, calibration, backend=policy.backend)
    if tail is not None:
        device = with_tail(device, load_device(tail, calibration, backend=policy.backend))
    compute = compute if compute is not None else StepCompute.reference()
    if workload.requests and requests_file is None:
        requests_file = read_request_file(workload.requests)
    if rows is None:
        tr = load_trace(text, limit=text_limit) if isinstance(text, str) else text
        hot_arr = hot_rows(hot) if hot is not None else None
        rows = RowSource(tr, policy, scheduler.read_chunk, hot=hot_arr, file=requests_file)
    if scheduler.gate == "stall" and len(rows.layer_ids) > 1 and scheduler.second_start_layer > rows.layer_ids[1]:
        raise ArgumentError(f"second_start_layer {scheduler.second_start_layer} is after the second table's layer "
                            f"{rows.layer_ids[1]}, which needs its rows")
    reqs = make_requests(workload, seed, requests_file)
    drain = drain_time(slo, int(reqs.output.max())) if drain is None else float(drain)
    if drain < 0:
        raise ArgumentError(f"drain must be >= 0 seconds, got {drain}")
    measured = (reqs.arrival >= warmup) & (reqs.arrival < workload.duration)
    eng = Engine(reqs, rows, device, policy, compute, scheduler, drives=int(drives), seed=seed, measured=measured,
                 t_cap=workload.duration + drain, abort_ttft=slo.ttft_s if fail_fast else None,
                 abort_percentile=slo.percentile, speculation=speculation)
    trace = eng.run(progress=progress)
    warnings = _warnings(reqs, rows, trace)
    config = {"workload": workload.to_dict(), "scheduler": scheduler.to_dict(), "policy": policy.to_dict(),
              "compute": compute.to_dict(), "device": {"name": device.name, "source": device.source},
              "drives": int(drives), "seed": seed, "slo": slo.to_dict(), "warmup_s": warmup, "drain_s": drain,
              "text": {"source": rows.source, "tokens": rows.text_tokens}, "aborted": trace.aborted,
              "hot_rows": 0 if hot is None else int(len(hot_rows(hot)))}
    if eng.spec is not None:
        config["speculation"] = {**eng.spec.to_dict(), "wasted_reads": int(eng.wasted_reads),
                                 "prefetched_reads": int(eng.prefetched_reads)}
    res = summarize(trace, reqs, slo, window=(warmup, workload.duration), device=device, drives=int(drives),
                    config=config, bins=int(bins), warnings=warnings)
    res.wall_seconds = time.perf_counter() - t_wall
    return res


def _warnings(reqs, rows: RowSource, trace) -> list:
    out = []
    need = reqs.tokens
    if need > rows.text_tokens:
        out.append(f"the requests read {need:,} tokens of text and the text has {rows.text_tokens:,}: stretches repeat "
                   f"(about {need / rows.text_tokens:.1f} times); two requests reading one stretch at the same step "
                   "would share rows that independent requests would not: use a longer text")
    if trace.aborted:
        out.append("stopped early: more requests than the SLO percentile allows had already waited past the TTFT "
                   "target (the latencies are lower bounds)")
    elif trace.capped:
        out.append("the run hit its time cap with requests unfinished (the system did not keep up): their "
                   "latencies are lower bounds")
    return out
