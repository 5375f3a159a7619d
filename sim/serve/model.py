"""``simulate_serve``: one serving configuration end to end -- requests, engine, device, metrics (issue 16).

The pieces: the workload (:mod:`sim.serve.workload`), the rows each request reads
(:mod:`sim.serve.rows`), the engine and its scheduler (:mod:`sim.serve.engine`), the compute of a
step (:mod:`sim.serve.compute`), the device shared by decode and prefill reads
(:mod:`sim.serve.device`) and what is measured (:mod:`sim.serve.metrics`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Union


from engram.errors import ArgumentError

from ..decode import hot_rows
from ..decode.speculative import Speculation
from ..device import Device, load_device, load_tail, with_tail
from sim.core.limits import MAX_BINS, check_amount, check_count, check_seed, check_settings
from sim.core.params import Policy, Storage
from ..trace import Trace, load_trace
from .compute import StepCompute
from .engine import Engine, EngineRun, Scheduler
from .metrics import SLO, ServeResult, summarize
from .rows import RowSource
from .workload import RequestFile, Workload, make_requests, read_request_file

__all__ = ["DEFAULT_TEXT", "DEFAULT_TEXT_TOKENS", "ServeRun", "ServeText", "drain_time", "simulate_serve"]

#: The text prompts are stretches of and decode tokens continue: a long real text (the novel ds4 benchmarks on).
DEFAULT_TEXT = "shared:promessi_sposi.txt"
#: Tokens of the default text taken (its first 200,000 of 417,059; a :class:`~sim.serve.rows.RowSource` keeps
#: whole read chunks of them: 198,656 at 2,048-token chunks).
DEFAULT_TEXT_TOKENS = 200_000


def drain_time(slo: SLO, max_output: int) -> float:
    """Seconds the run goes on after the last arrival: twice what the slowest request meeting the SLOs takes
    (its TTFT target plus its output at the TBT target), plus 10 s."""
    return 2.0 * (slo.ttft_s + max_output * slo.tbt_ms * 1e-3) + 10.0


@dataclass(frozen=True)
class ServeText:
    """Where the rows every request reads come from: a text and its requests file, or rows already prepared.

    Attributes
    ----------
    source : Trace or str
        The rows' text (a source spec of :func:`sim.trace.load_trace`, ``synth:reuse=R`` included).
    limit : int, optional
        Tokens of ``source`` to use when it is loaded here (>= 1; ``None``: all).
    rows : RowSource, optional
        The rows already prepared for this text, policy and reader chunk (a study prepares them once).
    requests_file : RequestFile, optional
        ``workload.requests`` already read (else read here).

    Raises
    ------
    ArgumentError
        ``limit`` below 1.
    """

    source: Union[Trace, str] = DEFAULT_TEXT
    limit: Optional[int] = DEFAULT_TEXT_TOKENS
    rows: Optional[RowSource] = None
    requests_file: Optional[RequestFile] = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ArgumentError(f"ServeText.limit must be >= 1 tokens, got {self.limit}")


@dataclass(frozen=True)
class ServeRun:
    """How one serving run goes: its random streams, measured window, end, summary and speculation.

    Attributes
    ----------
    seed : int
        Every random stream: arrivals, lengths, where requests read, device draws, compute spread.
    warmup : float
        Seconds at the start whose arrivals are not measured (>= 0, below the workload's duration).
    drain : float, optional
        Seconds the run may go on after the last arrival (>= 0; default :func:`drain_time`).
    bins : int
        Bins of the timelines (>= 1).
    fail_fast : bool
        Stop as soon as the TTFT target can no longer be met (for a capacity search).
    progress : bool or str
        :mod:`sim.core.progress` mode of the run, one item a request arrived (default off: a study's points run
        many at once).
    speculation : Speculation, optional
        Speculative decoding: draft tokens a step, their acceptance, the drafts' rows prefetched
        (:mod:`sim.serve.engine`, :mod:`sim.decode.speculative`); ``None`` or ``k = 0``: off.

    Raises
    ------
    ArgumentError
        A seed that is not a whole number >= 0, a negative warmup or drain, bins not a whole number >= 1.
    """

    seed: int = 0
    warmup: float = 0.0
    drain: Optional[float] = None
    bins: int = 100
    fail_fast: bool = False
    progress: Union[bool, str] = False
    speculation: Optional[Speculation] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_seed(self.seed))
        object.__setattr__(self, "warmup", check_amount(self.warmup, "ServeRun.warmup", "seconds"))
        object.__setattr__(self, "bins", check_count(self.bins, "ServeRun.bins", high=MAX_BINS))
        if self.speculation is not None:
            check_settings(self.speculation, Speculation, "ServeRun.speculation")
        if self.drain is not None:
            object.__setattr__(self, "drain", check_amount(self.drain, "ServeRun.drain", "seconds"))


def simulate_serve(workload: Workload, device: Union[Device, str] = "seed-apple-m3-ultra", policy: Policy = Policy(),
                   compute: Optional[StepCompute] = None, scheduler: Scheduler = Scheduler(), slo: SLO = SLO(), *,
                   text: ServeText = ServeText(), run: ServeRun = ServeRun(),
                   storage: Storage = Storage()) -> ServeResult:
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
    text : ServeText
        The rows' text and requests file, or the rows already prepared.
    run : ServeRun
        Seed, warmup, drain, timeline bins, early stop, progress, speculation.
    storage : Storage
        Drives the tables are striped over by row id, a hot set in DRAM, a device whose latency distribution
        to take, a calibration (:class:`sim.core.params.Storage`, as :func:`sim.decode.simulate_decode` takes it).

    Returns
    -------
    ServeResult

    Raises
    ------
    ArgumentError
        A warmup not below the duration, a second-table start after its layer, and the errors of the parts.
    """
    t_wall = time.perf_counter()
    for value, kind, where in ((workload, Workload, "workload"), (policy, Policy, "policy"),
                               (scheduler, Scheduler, "scheduler"), (slo, SLO, "slo"), (text, ServeText, "text"),
                               (run, ServeRun, "run"), (storage, Storage, "storage")):
        check_settings(value, kind, where)
    if compute is not None:
        check_settings(compute, StepCompute, "compute")
    drives, hot, tail, calibration = storage.drives, storage.hot, storage.tail, storage.calibration
    if not 0 <= run.warmup < workload.duration:
        raise ArgumentError(f"warmup = {run.warmup} must be in [0, duration = {workload.duration})")
    device = load_device(device, calibration, backend=policy.backend)
    if tail is not None:
        device = with_tail(device, load_tail(tail, calibration, backend=policy.backend))
    compute = compute if compute is not None else StepCompute.reference()
    requests_file = text.requests_file
    if workload.requests and requests_file is None:
        requests_file = read_request_file(workload.requests)
    rows = text.rows if text.rows is not None else _rows(text, policy, scheduler, hot, requests_file)
    if scheduler.gate == "stall" and len(rows.layer_ids) > 1 and scheduler.second_start_layer > rows.layer_ids[1]:
        raise ArgumentError(f"second_start_layer {scheduler.second_start_layer} is after the second table's layer "
                            f"{rows.layer_ids[1]}, which needs its rows")
    reqs = make_requests(workload, run.seed, requests_file)
    drain = drain_time(slo, int(reqs.output.max())) if run.drain is None else float(run.drain)
    measured = (reqs.arrival >= run.warmup) & (reqs.arrival < workload.duration)
    eng = Engine(reqs, rows, device, policy, compute, scheduler,
                 EngineRun(drives=int(drives), seed=run.seed, measured=measured, t_cap=workload.duration + drain,
                           abort_ttft=slo.ttft_s if run.fail_fast else None, abort_percentile=slo.percentile,
                           speculation=run.speculation))
    trace = eng.run(progress=run.progress)
    warnings = _warnings(reqs, rows, trace)
    config = {"workload": workload.to_dict(), "scheduler": scheduler.to_dict(), "policy": policy.to_dict(),
              "compute": compute.to_dict(), "device": {"name": device.name, "source": device.source},
              "drives": int(drives), "seed": run.seed, "slo": slo.to_dict(), "warmup_s": run.warmup, "drain_s": drain,
              "text": {"source": rows.source, "tokens": rows.text_tokens}, "aborted": trace.aborted,
              "hot_rows": 0 if hot is None else int(len(hot_rows(hot)))}
    if eng.spec is not None:
        config["speculation"] = {**eng.spec.to_dict(), "wasted_reads": int(eng.wasted_reads),
                                 "prefetched_reads": int(eng.prefetched_reads)}
    res = summarize(trace, reqs, slo, window=(run.warmup, workload.duration), device=device, drives=int(drives),
                    config=config, bins=int(run.bins), warnings=warnings)
    res.wall_seconds = time.perf_counter() - t_wall
    return res


def _rows(text: ServeText, policy: Policy, scheduler: Scheduler, hot, requests_file) -> RowSource:
    """The rows of ``text`` (loaded here when a source spec) for this policy and reader chunk."""
    tr = load_trace(text.source, limit=text.limit) if isinstance(text.source, str) else text.source
    hot_arr = hot_rows(hot) if hot is not None else None
    return RowSource(tr, policy, scheduler.read_chunk, hot=hot_arr, file=requests_file)


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
