"""The decode model: sessions x steps reading Engram rows on a shared device (SPEC §8, §9).

Each session replays a :class:`~sim.trace.Trace` (:mod:`sim.decode.reads`:
which of a step's requests reach the device after DRAM-resident rows, row
caches and deduplication).  A step:

1. hashes its token (``hash_time``, default 0: 0.14 us measured, negligible);
2. reads its rows: serially when fewer than ``threshold`` distinct rows,
   otherwise ``readers`` at a time (pread pool threads or io_uring queue
   depth alike); with ``drives > 1`` each read goes to the drive of its row;
3. computes for a time drawn from :class:`Compute`.  With
   ``Policy.overlap_layers = m > 0`` only the first table is read before
   compute; the second table's read starts when the first completes and
   overlaps the first ``m`` of ``Compute.layers`` layers of compute.

Sessions share the device: reads of every session meet each other in the
device's slots and FIFO queue (:mod:`sim.device.engines`).  Compute does not
contend (each session has its own, or the compute model already includes
batching).  Sessions start at random phases by default (:class:`~sim.core.params.Phases`).

Two modes: ``"exact"`` (every read a simpy event on the device's per-read
model: :mod:`sim.decode.exact`) and ``"fast"`` (batches of reads as segments
of a queue with the same slots and FIFO order, each batch's duration alone
drawn from the per-read model: :mod:`sim.decode.fast`).  Runs are
reproducible: one ``seed`` feeds every random stream.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Optional, Union

import numpy as np

from engram.errors import ArgumentError

from ..device import (SEED_REFERENCE, Device, Recorder, load_device, load_tail, summarize_boxes,
                      summarize_counter, with_tail)
from ..device.fio import HOST_BOUND_SHARE
from sim.core.limits import MAX_BINS, MAX_SESSIONS, check_amount, check_count, check_seed, check_settings
from sim.core.params import DEFAULT_PHASES, Compute, Phases, Policy, Storage, compute_stats
from sim.core.progress import progress as progress_bar, progress_mode
from sim.core.schema import percentiles_ms as _percentiles_ms
from ..trace import CODE_SOURCE, Trace, load_trace
from .exact import SessionWork, exact_session
from .fast import FastRun
from .host import HostCPU
from .reads import StepReads, hot_rows, step_reads
from .speculative import Speculation, verification_rows

__all__ = [
    "DecodeResult",
    "DecodeRun",
    "LOCKSTEP_CV",
    "LOCKSTEP_FOLD",
    "fit_compute",
    "lockstep_warning",
    "percentiles_ms",
    "reference_compute",
    "seed_reproduction",
    "session_reads",
    "simulate_decode",
]


def percentiles_ms(x: np.ndarray) -> dict:
    """``{mean, p50, p90, p99, p999, max}`` of seconds, in milliseconds."""
    return _percentiles_ms(x, (50, 90, 99, 99.9))


@dataclass
class DecodeResult:
    """Outcome of :func:`simulate_decode`.

    Attributes
    ----------
    tokens_per_s : float
        All sessions' tokens over the time from the first start to the last finish.
    tokens_per_s_per_session : list of float
        Each session's steps over its own run time.
    step_ms, stall_ms : dict
        Percentiles (ms) of step latency and of the time a step waited for rows.
    row_requests, reads : int
        Rows the steps asked for, and reads that reached the device (after
        DRAM-resident rows, the row caches and per-step deduplication).
    cache_hit_rate : float
        Share of row requests served by the row caches (the sessions' and the shared one).
    shared_cache_hit_rate, dram_hit_rate : float
        Share served by the shared cache alone, and by DRAM-resident rows.
    device : dict
        ``name``, ``drives``, ``busy_fraction`` (per drive, averaged),
        ``mean_queue_depth`` (all drives), ``max_queue_depth``, ``reads_per_s``,
        ``mean_read_latency_us``, ``iops_utilization`` (reads/s over the
        drives' peak IOPS); ``bucket_wait_counted``: False where the fast mode ran a device with a token bucket
        (a rate limit or fio's peak bound), whose queue leaves a batch's wait for its tokens out of the busy
        fraction, the mean queue depth and mean read (the raw device's); ``host_read_cpus`` where the device
        came from fio JSON with CPU figures: the host's CPUs the reads/s keep busy at fio's CPU per read
        (``derived["cpu_per_read_us"]``, :func:`sim.device.fio.cpu_per_read`), the kernel's read path alone --
        the simulator does not model the host's CPUs, so a figure near the host's CPU count says the host, not
        the drive, binds there.
    timeline : dict
        ``t_s``, ``queue_depth``, ``busy``: per-bin means over the run.
    compute_realised : dict
        ``mean_ms``, ``cv``, ``samples`` of the compute times drawn (beside the
        nominal ``config["compute"]``).
    phases : str
        How the sessions started (:class:`~sim.core.params.Phases`).
    wrap : dict
        Whether the run replays its trace (:func:`sim.decode.reads.wrap_info`).
    warnings : list of str
        What may mislead in this run's figures (a wrapped trace, ...).
    config : dict
        Every parameter of the run (policy, compute, sessions, steps, mode, seed, phases, trace, device).
    sim_seconds, wall_seconds : float
        Simulated duration and the simulator's own run time.
    step_latencies : numpy.ndarray
        float64 ``[sessions, steps]`` seconds (not in :meth:`to_dict`).
    host : dict
        On a host (``DecodeRun.host``): its figures (:meth:`HostCPU.to_dict`), ``free_step_ms``, ``added_ms``,
        ``rows_per_step``, ``readers_wait_us``, ``demand_us``, ``busy_cpus``, ``passes``, and on a memory-backed
        device ``copies``: how its reads were served (:meth:`HostCPU.copies_text`); else empty.
    speculative : dict
        Speculative runs only (``draft_tokens > 0``; empty otherwise and left out of :meth:`to_dict`):
        the settings (:meth:`sim.decode.speculative.Speculation.to_dict`), ``tokens`` emitted,
        ``verification_steps``, ``tokens_per_step`` (mean emitted), ``accepted_share`` (drafts accepted over
        drafted), ``tbt_ms`` (percentiles of the time between emitted tokens: a step's latency before its
        first token, 0 between the tokens one step emits), ``time_per_token_ms`` (percentiles over steps of
        a step's latency over its tokens), ``wasted_reads`` (rows only rejected drafts asked for) and
        ``prefetched_reads`` (rows read in the background ahead of their step).  In a speculative run
        ``steps`` counts verification steps and ``tokens_per_s`` emitted tokens.
    """

    tokens_per_s: float
    tokens_per_s_per_session: list
    step_ms: dict
    stall_ms: dict
    row_requests: int
    reads: int
    cache_hit_rate: float
    device: dict
    timeline: dict
    config: dict
    sim_seconds: float
    wall_seconds: float
    step_latencies: np.ndarray = field(repr=False, default=None)
    compute_realised: dict = field(default_factory=dict)
    phases: str = DEFAULT_PHASES
    wrap: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    shared_cache_hit_rate: float = 0.0
    dram_hit_rate: float = 0.0
    speculative: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)

    @property
    def mean_session_tokens_per_s(self) -> float:
        return float(np.mean(self.tokens_per_s_per_session))

    def to_dict(self) -> dict:
        return {
            "tokens_per_s": self.tokens_per_s,
            "mean_session_tokens_per_s": self.mean_session_tokens_per_s,
            "tokens_per_s_per_session": self.tokens_per_s_per_session,
            "step_ms": self.step_ms, "stall_ms": self.stall_ms,
            "row_requests": self.row_requests, "reads": self.reads, "cache_hit_rate": self.cache_hit_rate,
            "shared_cache_hit_rate": self.shared_cache_hit_rate, "dram_hit_rate": self.dram_hit_rate,
            "compute_realised": self.compute_realised, "phases": self.phases,
            "wrap": self.wrap, "warnings": self.warnings,
            "device": self.device, "timeline": self.timeline, "config": self.config,
            "sim_seconds": self.sim_seconds, "wall_seconds": self.wall_seconds,
            **({"speculative": self.speculative} if self.speculative else {}),
            **({"host": self.host} if self.host else {}),
        }

    def summary(self) -> str:
        c = self.config
        pol, comp = c["policy"], c["compute"]
        real = self.compute_realised
        store = f"device {self.device['name']}" + (f" x{c['drives']} striped" if c["drives"] > 1 else "")
        lines = [
            f"decode    {c['sessions']} session(s) x {c['steps']} steps, {store}, mode {c['mode']}, seed {c['seed']}",
            f"phases    {self.phases}" + (" (each session starts at a random time within one step, seeded)"
                                          if self.phases == "random" else ""),
            f"policy    threshold {pol['threshold']}, {pol['backend']} x{pol['readers']}, "
            f"cache {pol['cache_rows']} rows/session + {pol['shared_cache_rows']} shared, "
            f"DRAM {pol['dram_fraction']:.3g} of the tables" + (f" + {c['hot_rows']} hot rows" if c["hot_rows"] else "")
            + f", overlap {pol['overlap_layers']} layers",
            f"compute   {comp['mean_ms']:.3f} ms ({comp['dist']}, cv {comp['cv']:.3g}); drawn: mean "
            f"{real.get('mean_ms', 0.0):.3f} ms, cv {real.get('cv', 0.0):.3f}",
            f"tokens/s  {self.tokens_per_s:.3f} overall, {self.mean_session_tokens_per_s:.3f} per session",
            *([self._speculative_line()] if self.speculative else []),
            "step ms   " + "  ".join(f"{k} {v:.3f}" for k, v in self.step_ms.items()),
            "stall ms  " + "  ".join(f"{k} {v:.3f}" for k, v in self.stall_ms.items()),
            f"reads     {self.reads} of {self.row_requests} requested (row caches {self.cache_hit_rate:.4f}, "
            f"of which shared {self.shared_cache_hit_rate:.4f}; DRAM {self.dram_hit_rate:.4f})",
            f"device    busy {self.device['busy_fraction']:.3f}, mean qd {self.device['mean_queue_depth']:.2f}, "
            f"{self.device['reads_per_s']:.0f} reads/s ({self.device['iops_utilization']:.3f} of peak), "
            f"mean read {self.device['mean_read_latency_us']:.1f} us" + (
                "" if self.device.get("bucket_wait_counted", True) else
                " (busy, mean qd and mean read are the raw device's: a read's wait for its token of the device's "
                "peak or rate bound is not in them; the steps' wait for rows is stall ms)"),
            *([f"host      {self.device['host_read_cpus']:.2f} CPUs busy in the read path alone at fio's "
               f"{self.config['device']['derived']['cpu_per_read_us']['value']:.1f} us of CPU a read (the host's "
               f"CPUs are not modelled: with fewer than {self.device['host_read_cpus'] / HOST_BOUND_SHARE:.2f} "
               f"CPUs the host binds before the drive and these figures are upper bounds)"]
              if "host_read_cpus" in self.device and not self.host else []),
            *([self._host_line()] if self.host else []),
            f"simulated {self.sim_seconds:.3f} s in {self.wall_seconds:.2f} s",
        ]
        lines += [f"WARNING   {w}" for w in self.warnings]
        return "\n".join(lines)

    def _host_line(self) -> str:
        h = self.host
        return (f"host      {h['cpus']:g} CPU{'' if h['cpus'] == 1 else 's'}, {h['demand_us']:.0f} us of CPU a step (the engine's "
                f"{h['step_cpu_us']:.0f} + {h['rows_per_step']:.1f} reads x {h['read_cpu_us']:.1f} us"
                + (f" + spin {h['spin_us']:.0f}" if h.get("spin_us") else "") + f"): "
                f"{h['busy_cpus']:.2f} CPUs busy, each step {h['added_ms']:.3f} ms longer than with the CPUs free "
                f"({h['free_step_ms']:.3f} ms" + (f"; its readers wait {h['readers_wait_us']:.0f} us for the CPUs"
                                                   if h.get("readers_wait_us") else "")
                + (f"; a wake-up of up to {h['wake_us']:.0f} us" if h.get("wake_us") else "") + ")"
                + (f"\n          from: {h['source']}" if h.get("source") else "")
                + (f"\n          reads: {h['copies']}" if h.get("copies") else ""))

    def _speculative_line(self) -> str:
        sp = self.speculative
        zero = 1.0 - sp["verification_steps"] / sp["tokens"] if sp["tokens"] else 0.0
        return (f"drafts    {sp['draft_tokens']} a step, acceptance {','.join(f'{a:g}' for a in sp['acceptance'])}, "
                f"prefetch {'on' if sp['prefetch_drafts'] else 'off'}: {sp['tokens_per_step']:.3f} tokens a "
                f"verification step ({sp['accepted_share']:.3f} of drafts accepted); TBT p50 "
                f"{sp['tbt_ms']['p50']:.3f} p99 {sp['tbt_ms']['p99']:.3f} ms; {sp['wasted_reads']} reads for "
                f"rejected drafts, {sp['prefetched_reads']} prefetched\n"
                f"TBT       between tokens p50 {sp['tbt_ms']['p50']:.3f} p99 {sp['tbt_ms']['p99']:.3f} ms: the tokens "
                f"one verification step accepts arrive together, so {zero:.3f} of the gaps are 0; between steps "
                f"(each step's first token) p50 {self.step_ms['p50']:.3f} p99 {self.step_ms['p99']:.3f} ms")


def session_reads(trace: Trace, sessions: int, steps: int, cache_rows: int = 0):
    """Device reads of every session and step with a per-session row cache (:func:`sim.decode.reads.step_reads`).

    Returns
    -------
    (reads, hits) : list of numpy.ndarray, int
        ``reads[s]`` is int64 ``[steps, layers]``; ``hits`` counts requests served by the caches.
    """
    r = step_reads(trace, sessions, steps, Policy(cache_rows=cache_rows))
    return r.reads, r.cache_hits


# =====================================================================================
# the model
# =====================================================================================
def _merge(counters: list, t0: float) -> tuple:
    """One step function ``(times - t0, totals)`` (arrays) from several ``(times, values)`` (each 0 before its
    first time)."""
    ts, ds = [], []
    for times, values in counters:
        if len(times):
            v = np.asarray(values, dtype=np.float64)
            ts.append(np.asarray(times, dtype=np.float64))
            ds.append(np.diff(v, prepend=0.0))
    if not ts:
        return np.zeros(0), np.zeros(0)
    if len(ts) == 1 and (ts[0].size < 2 or bool((ts[0][1:] >= ts[0][:-1]).all())):
        return ts[0] - t0, np.cumsum(ds[0])  # one counter in time order: the stable sort below is the identity
    t = np.concatenate(ts)
    d = np.concatenate(ds)
    o = np.argsort(t, kind="stable")
    return t[o] - t0, np.cumsum(d[o])


def _counter(rec: Recorder) -> tuple:
    a = np.asarray(rec.counter, dtype=np.float64).reshape(-1, 2)
    return a[:, 0], a[:, 1]


def _period(reads: StepReads, device: Device, policy: Policy, compute: Compute, hash_time: float) -> float:
    """One step of session 0 alone, on average: its compute, hash and reads at mean latencies."""
    n = reads.reads[0].sum(axis=1)
    cache: dict = {}
    io = 0.0
    for x in n[: min(n.size, 512)].tolist():
        if x not in cache:
            k = policy.concurrency(x)
            cache[x] = device.nominal_batch(x, k)[0] + (policy.batch_overhead if k > 1 else 0.0) if x else 0.0
        io += cache[x]
    return compute.mean + hash_time + io / min(n.size, 512)


@dataclass(frozen=True)
class DecodeRun:
    """How a decode run goes (:func:`simulate_decode`): its sessions and steps, mode, seed, starts and records.

    Attributes
    ----------
    sessions : int
        Concurrent sessions (>= 1).
    steps : int, optional
        Steps per session (default: the trace length, or with a speculation the verification steps that
        cover it on average; longer runs replay the trace, which the result's ``warnings`` say; >= 1).
    mode : str
        ``"fast"`` or ``"exact"``.
    seed : int
        Seeds every random stream (device, phases, per-session compute, drafts' acceptance); a whole number
        >= 0.
    hash_time : float
        Seconds per step for hashing (default 0, >= 0).
    phases : Phases or str, optional
        ``"random"`` (default), ``"lockstep"``, ``"spread:MS"`` or explicit starts (``Phases.at([...])``,
        ``"offsets:MS,..."``; one per session) (:class:`~sim.core.params.Phases`).
    start_spread : float, optional
        Older form of ``phases="spread:MS"``, in seconds (>= 0; not with ``phases``).
    bins : int
        Bins of the queue-depth timeline (>= 1).
    timeline : bool
        Keep the queue-depth timeline (default).  False, for a caller that reads only the device's totals (a
        sweep's or a capacity search's point): the fast mode's queue of one drive records no changes, so
        :attr:`DecodeResult.timeline` is empty and ``max_queue_depth`` is the queue's own count; every other
        figure is the same, bit for bit.
    progress : bool or str
        Show progress when the run takes more than a couple of seconds: a bar on a terminal, plain lines
        elsewhere (:func:`sim.core.progress.progress`; a mode such as ``"lines"`` forces one), finished sessions
        counted without a time-left estimate.
    host : HostCPU, optional
        The host's CPUs shared by the sessions (:mod:`sim.decode.host`): the run's first steps are simulated
        with the CPUs free, then the whole run with each step longer by what the host's CPU queue adds at that
        step and read rate (mean-value analysis; ``DecodeResult.host`` says it), again until that settles.  A
        memory-backed device's reads are then the host's copies (:meth:`HostCPU.copy_reads`).  None (default):
        the host is left out.
    replay : str, optional
        For an internal run that replays its trace on purpose (a cross-check prediction or a report's what-if
        stretching a measured stretch to more steps to reduce simulation noise): the run's name.  Its trace
        warnings then name it and give no advice to the user; a wrap without a row cache is not warned at all
        (:func:`sim.decode.reads.wrap_info`).  ``None`` (a run the user configured): the warnings as they are.

    Raises
    ------
    ArgumentError
        Bad sessions, steps, mode, hash_time, bins, timeline, start_spread, phases or host, both ``phases`` and
        ``start_spread``, or a negative seed; each message names the field.
    """

    sessions: int = 1
    steps: Optional[int] = None
    mode: str = "fast"
    seed: int = 0
    hash_time: float = 0.0
    phases: Union[Phases, str, None] = None
    start_spread: Optional[float] = None
    bins: int = 100
    timeline: bool = True
    progress: Union[bool, str] = False
    replay: Optional[str] = None
    host: Optional[HostCPU] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.host is not None and not isinstance(self.host, HostCPU):
            raise ArgumentError(f"DecodeRun.host = {self.host!r:.60}: expected a sim.decode.host.HostCPU or None")
        if self.mode not in ("fast", "exact"):
            raise ArgumentError(f"mode must be 'fast' or 'exact', got {self.mode!r}")
        object.__setattr__(self, "sessions", check_count(self.sessions, "sessions", high=MAX_SESSIONS))
        if self.steps is not None:
            object.__setattr__(self, "steps", check_count(self.steps, "steps"))
        object.__setattr__(self, "hash_time", check_amount(self.hash_time, "hash_time", "seconds"))
        object.__setattr__(self, "bins", check_count(self.bins, "bins", high=MAX_BINS))
        if not isinstance(self.timeline, bool):
            raise ArgumentError(f"DecodeRun.timeline = {self.timeline!r:.40}: expected True or False")
        progress_mode(self.progress)
        if self.start_spread is not None:
            if self.phases is not None:
                raise ArgumentError("give phases or start_spread, not both")
            object.__setattr__(self, "start_spread", check_amount(self.start_spread, "start_spread", "seconds"))
        self.starts()

    def starts(self) -> Phases:
        """The sessions' phases: ``phases``, or ``start_spread`` as a spread (0: lockstep), or the default."""
        if self.start_spread is not None:
            return Phases("spread", float(self.start_spread)) if self.start_spread > 0 else Phases("lockstep")
        return Phases.parse(self.phases if self.phases is not None else DEFAULT_PHASES)


def simulate_decode(trace: Union[Trace, str], device: Union[Device, str], policy: Policy = Policy(),
                    compute: Union[Compute, float] = 0.0, run: DecodeRun = DecodeRun(), *,
                    storage: Storage = Storage(), speculation: Optional[Speculation] = None,
                    served: Optional[np.ndarray] = None) -> DecodeResult:
    """Simulate ``run.sessions`` concurrent decode sessions of ``run.steps`` tokens each.

    Parameters
    ----------
    trace : Trace or str
        Row ids per step (a source spec is loaded with :func:`sim.trace.load_trace`).
    device : Device or str
        The device, or each of the ``storage.drives`` (any form of :func:`sim.device.load_device`).
    policy : Policy
        Read policy, row caches, DRAM-resident share of the tables.
    compute : Compute or float
        Compute time per step (a float is a constant, seconds).
    run : DecodeRun
        Sessions, steps, mode, seed, hash time, phases, timeline bins, progress, replay.
    storage : Storage
        Drives the tables are striped over, rows resident in DRAM, a latency tail, a calibration
        (:class:`~sim.core.params.Storage`).
    speculation : Speculation, optional
        Speculative decoding (:mod:`sim.decode.speculative`): ``draft_tokens`` k a step, each step a
        verification step of ``k + 1`` tokens whose rows are read as one deduplicated batch, emitting
        ``1 + accepted`` tokens (acceptance drawn from ``run.seed``); ``prefetch_drafts`` reads the drafts' rows
        in the background during the previous step's compute.  ``None`` or ``k = 0``: off (the run is the
        one it was without it, bit for bit).  ``run.steps`` then counts verification steps.
    served : numpy.ndarray, optional
        bool like ``trace.rows``: requests a row cache replayed beforehand serves (no read), e.g. a measured
        run's own cache in the cross-check (:func:`sim.decode.reads.step_reads`); counted as shared-cache hits.
        Not with ``speculation`` (a verification batch is not a trace step).

    Returns
    -------
    DecodeResult

    Raises
    ------
    ArgumentError
        ``overlap_layers`` beyond ``compute.layers``, a trace too short for one step, a run whose reads would
        not fit in memory (:func:`sim.decode.reads.step_reads`), ``prefetch_drafts`` with ``storage.drives > 1``
        (not modelled); bad settings are refused by :class:`DecodeRun` and :class:`~sim.core.params.Storage`;
        a setting of another kind than its slot's (a number where a :class:`DecodeRun` goes, a string for the
        policy) is named with the kind to pass.
    """
    t_wall = time.perf_counter()
    check_settings(policy, Policy, "policy")
    check_settings(run, DecodeRun, "run")
    check_settings(storage, Storage, "storage")
    if speculation is not None:
        check_settings(speculation, Speculation, "speculation")
    copies = ""
    if run.host is not None:  # a memory-backed device's reads are copies on the host's CPUs
        loaded = load_device(device, storage.calibration, backend=policy.backend)
        device = run.host.copy_reads(loaded)
        copies = device.source if device is not loaded else run.host.copies_text(loaded)
    plan = _plan(trace, device, policy, compute, run, storage, speculation, served)
    host, first = {}, plan
    if run.host is not None:
        plan, lat, st, finish, figures, host = _on_host(plan, device, run, storage, speculation, served)
        if copies:
            host["copies"] = copies
    else:
        lat, st, finish, figures = _simulate(plan)
    res = _result(plan, lat, st, finish, figures, t_wall)
    if host:  # the compute as given, the host's part apart
        res.host = host
        res.config["compute"] = _config(first)["compute"]
        res.compute_realised = compute_stats(np.concatenate(first.comp))
    return res


#: Runs of a decode on a host (:func:`_on_host`) after the one with the CPUs free, at most, and the change of the
#: added step below which they stop: relative to the added step (``HOST_SETTLED``), or to the whole step
#: (``HOST_STEP_SETTLED``: the next run could move a step by at most that share, the tokens/s by as little -- where
#: the host adds a sliver to a long step, the drive's wait takes up the change: at 3,127 sessions on 64 CPUs a
#: second run moved the added 0.25 ms by 3% and the mean step by 1e-7 of itself).
HOST_PASSES, HOST_SETTLED, HOST_STEP_SETTLED = 3, 0.01, 5e-4
#: The run with the CPUs free gives only the mean step with the CPUs free, the first guess of the fixed point
#: (:func:`_on_host`).  Where the whole run would simulate more than ``HOST_FREE_WORK`` session-steps (a capacity
#: probe of thousands of sessions) it simulates only each session's first steps, at least ``HOST_FREE_STEPS`` and
#: ``HOST_FREE_WORK`` in all: the mean of every step of the whole run is taken as theirs, the steps after them
#: at the mean of their later half (past the sessions' start), the last ``HOST_FREE_TAIL`` left out (the run
#: draining).
HOST_FREE_STEPS, HOST_FREE_WORK, HOST_FREE_TAIL = 50, 100_000, 5


def _on_host(plan: _Plan, device, run: DecodeRun, storage: Storage, speculation: Optional[Speculation],
             served) -> tuple:
    """A run on ``run.host``: from the mean step with the CPUs free (a run of the first steps where the whole run
    is long: :data:`HOST_FREE_WORK`) and the reads a step of the whole run, the step the host's CPU queue adds at
    that step and read rate (:meth:`HostCPU.step_time`), then the run with each step's compute that much longer,
    again while the added step moves (the drive sees the slower steps, so its wait shrinks): ``(plan, lat, st,
    finish, figures, host figures)``."""
    steps = plan.run.steps
    first = max(HOST_FREE_STEPS, -(-HOST_FREE_WORK // run.sessions))
    done = None  # the whole run with the CPUs free, where it ran
    if first < steps:
        free = _free_step(_simulate(_plan(plan.trace, device, plan.policy, plan.compute,
                                          replace(plan.run, steps=first), storage, speculation, served))[0], steps)
    else:
        done = _simulate(plan)
        free = float(np.mean(done[0]))
    rows = _device_reads(plan) / max(1, run.sessions * steps)
    base, extra, passes = plan.compute, None, 0
    while passes < HOST_PASSES:
        wait = _readers_wait(run.host, plan.device, plan.policy, rows)
        new = max(0.0, run.host.step_time(run.sessions, free + wait, rows) - free)
        if extra is not None and abs(new - extra) <= max(HOST_SETTLED * extra, HOST_STEP_SETTLED * (free + extra),
                                                         1e-12 * HOST_SETTLED):
            break
        extra = new
        if extra == 0 and done is not None:  # no CPU asked: the run with the CPUs free is the run
            break
        passes += 1
        plan = _plan(plan.trace, device, plan.policy, base.shifted(extra), run, storage, speculation, served)
        done = _simulate(plan)
        rows = float(done[3][1]) / max(1, np.size(done[0]))
        free = max(0.0, float(np.mean(done[0])) - extra)  # the step with the CPUs free, the drive at the new pace
    lat, st, finish, figures = done
    step = float(np.mean(lat))
    demand = run.host.demand(rows)
    return plan, lat, st, finish, figures, {
        **run.host.to_dict(), "free_step_ms": free * 1e3, "added_ms": extra * 1e3, "rows_per_step": rows,
        "readers_wait_us": _readers_wait(run.host, plan.device, plan.policy, rows) * 1e6,
        "demand_us": demand * 1e6, "busy_cpus": run.sessions * demand / step if step > 0 else 0.0,
        "passes": passes}


def _readers_wait(host, device: Device, policy: Policy, rows: float) -> float:
    """Seconds a step's reads take longer as its pread readers share the host's CPUs
    (:meth:`HostCPU.readers_wait`), at the device's mean latency at the readers' depth.  None where the readers
    do not contend so: io_uring (one thread submits) and a memory-backed device, whose model already serves as
    many reads at once as the CPUs its readers have (:mod:`sim.device.fio`)."""
    if policy.backend != "pread" or "memory_backed" in (getattr(device, "derived", None) or {}):
        return 0.0
    depth = max(1, min(policy.readers, math.ceil(rows)))
    return host.readers_wait(policy.readers, rows, device.mean_latency(depth))


def _free_step(lat: np.ndarray, steps: int) -> float:
    """The mean step of a whole run of ``steps`` steps from ``lat`` (seconds ``[sessions, first steps]``) of a run
    of its first steps (:data:`HOST_FREE_WORK`): theirs, less the last :data:`HOST_FREE_TAIL`, and the steps
    after at the mean of their later half."""
    m = lat.mean(axis=0)
    head = m[:max(1, m.size - HOST_FREE_TAIL)]
    later = float(head[head.size // 2:].mean())
    return (float(head.sum()) + (steps - head.size) * later) / steps


def _device_reads(plan: _Plan) -> int:
    """The reads a run of ``plan`` takes from its device(s): its steps' (after caches and DRAM) and, in a
    speculative run, the drafts' rows prefetched."""
    return (sum(int(r.sum()) for r in plan.rd.reads)
            + (sum(int(p.sum()) for p in plan.prefetch) if plan.prefetch is not None else 0))


@dataclass
class _Plan:
    """A decode run ready to go: its inputs loaded, its steps resolved, its reads counted and its compute
    drawn (:func:`_plan`)."""

    trace: Trace
    device: Device
    policy: Policy
    compute: Compute
    run: DecodeRun
    storage: Storage          # ``hot`` resolved (:func:`sim.decode.reads.hot_rows`)
    spec: Optional[Speculation]
    rd: StepReads
    comp: list                # float64 [steps] seconds per session
    prefetch: Optional[list]  # int64 [steps] per session: the drafts' rows read ahead
    accepted: Optional[np.ndarray]
    overlap: float
    begin: list
    dev_seed: np.random.SeedSequence


def _loaded(trace, device, policy: Policy, compute, storage: Storage) -> tuple:
    """``(trace, device, compute)``: the trace and device loaded (the device with its tail), the compute a
    :class:`Compute`."""
    if isinstance(trace, str):
        trace = load_trace(trace)
    device = load_device(device, storage.calibration, backend=policy.backend)
    if storage.tail is not None:
        device = with_tail(device, load_tail(storage.tail, storage.calibration, backend=policy.backend))
    if not isinstance(compute, Compute):
        compute = Compute(float(compute))
    return trace, device, compute


def _plan(trace, device, policy: Policy, compute, run: DecodeRun, storage: Storage,
          speculation: Optional[Speculation], served: Optional[np.ndarray]) -> _Plan:
    """Every input of the run resolved and every random stream but the device's drawn, in the order the
    streams have always been spawned (device, phases, sessions' compute, then the drafts')."""
    trace, device, compute = _loaded(trace, device, policy, compute, storage)
    spec = speculation if speculation is not None and speculation.on else None
    steps = run.steps
    if steps is None and spec is not None:  # the verification steps that cover the trace on average
        steps = max(1, int((trace.steps - spec.draft_tokens) / spec.expected_tokens()))
    run = replace(run, steps=trace.steps if steps is None else steps)
    if policy.overlap_layers > compute.layers:
        raise ArgumentError(f"overlap_layers = {policy.overlap_layers} is beyond the model's {compute.layers} "
                            "layers (Compute.layers)")
    storage = replace(storage, hot=hot_rows(storage.hot) if storage.hot is not None else None)
    if spec is not None and spec.prefetch_drafts and storage.drives > 1:
        raise ArgumentError("prefetch_drafts with drives > 1 is not modelled (the drafts' reads per drive); "
                            "use one drive or prefetch off")
    ss = np.random.SeedSequence(run.seed)
    dev_seed, phase_seed, *sess_seeds = ss.spawn(2 + run.sessions)
    batch = accepted = None
    if spec is not None:  # its own stream, spawned after the others: a run without drafts keeps its draws
        rows, accepted, covered = verification_rows(trace, run.sessions, run.steps, spec,
                                                    np.random.default_rng(ss.spawn(1)[0]))
        batch = (rows, accepted, covered, trace.columns)
    rd = step_reads(trace, run.sessions, run.steps, policy, storage=storage,
                    order=run.mode == "exact" and storage.drives > 1, replay=run.replay, batch=batch, served=served)
    comp = [compute.sample(np.random.default_rng(s), run.steps) for s in sess_seeds]
    prefetch = None
    if spec is not None:
        comp, prefetch = _speculative_reads(spec, rd, comp)
    overlap = min(policy.overlap_layers, compute.layers) / compute.layers
    period = _period(rd, device, policy, compute, run.hash_time)
    begin = run.starts().offsets(run.sessions, period, np.random.default_rng(phase_seed))
    return _Plan(trace, device, policy, compute, run, storage, spec, rd, comp, prefetch, accepted, overlap, begin,
                 dev_seed)


def _speculative_reads(spec: Speculation, rd: StepReads, comp: list) -> tuple:
    """``(compute, prefetch)`` of a speculative run: each step's compute with its verification time, and with
    ``prefetch_drafts`` the drafts' rows of step ``t`` read during step ``t - 1`` (the first step reads all;
    ``rd.reads`` then keeps the critical path's rest)."""
    if spec.verify_s:
        comp = [c + spec.verify_s for c in comp]
    prefetch = None
    if spec.prefetch_drafts:
        prefetch = []
        crit = []
        for r, d in zip(rd.reads, rd.drafts):
            p = d.copy()
            p[0] = 0
            prefetch.append(p.sum(axis=1))
            crit.append(r - p)
        rd.reads = crit
    return comp, prefetch


def _simulate(plan: _Plan) -> tuple:
    """The sessions run in ``plan.run.mode``: ``(latencies, stalls, finish times, device figures)``, the figures
    ``(timeline summary, reads, latency area, busy fraction)`` over the run."""
    run = plan.run
    bar = None
    if run.progress:  # a bar on a terminal, plain lines elsewhere; sessions finish together: no time-left guess
        bar = progress_bar(run.sessions, f"decode ({run.mode})", "session", mode=run.progress, delay=2.0, eta=False)
    tick = bar.update if bar is not None else None
    dev_rng = np.random.default_rng(plan.dev_seed)
    if run.mode == "fast":
        fr = FastRun(plan.device.fast(dev_rng), plan.storage.drives, plan.policy, plan.rd.reads, plan.rd.by_drive,
                     plan.comp, run.hash_time, plan.overlap, plan.prefetch)
        if not run.timeline and plan.storage.drives == 1:  # the totals alone: the queue's count is its maximum
            fr.queues[0].record = False
        if run.sessions == 1:
            fr.run_alone(plan.begin[0])
        else:
            fr.run(plan.begin, tick)
        lat, st, finish = fr.lats, fr.stalls, fr.finish
    else:
        lat, st, finish, recs = _run_exact(plan, dev_rng, tick)
    if bar is not None:
        bar.close()
    t0 = min(plan.begin)
    makespan = max(finish) - t0
    bins = int(run.bins)
    if run.mode == "fast":
        figures = _fast_figures(fr, t0, makespan, bins)
    else:
        summ = summarize_counter(_merge([_counter(r) for r in recs], t0), makespan, bins)
        busy = float(np.mean([summarize_counter(_merge([_counter(r)], t0), makespan, 1)["busy_fraction"]
                              for r in recs]))
        figures = (summ, sum(r.reads for r in recs), sum(r.latency_sum for r in recs), busy)
    return lat, st, finish, figures


def _fast_figures(fr: FastRun, t0: float, makespan: float, bins: int) -> tuple:
    """The device figures of a fast run (:func:`_simulate`): from its boxes (one session) or its queues."""
    if fr.boxes is not None:
        s, e, lv = fr.boxes
        summ = summarize_boxes(s - t0, e - t0, lv, makespan, bins)
        return summ, fr.reads_done, fr.area_done, summ["busy_fraction"]
    if not fr.queues[0].record:  # one drive, no timeline (DecodeRun.timeline)
        summ = {"max_queue_depth": float(fr.queues[0].max_depth), "timeline": {}}
    else:
        summ = summarize_counter(_merge([(q.times, q.depths) for q in fr.queues], t0), makespan, bins)
    busy = float(np.mean([q.busy for q in fr.queues])) / makespan if makespan > 0 else 0.0
    return summ, sum(q.reads for q in fr.queues), sum(q.area for q in fr.queues), busy


def _device_info(plan: _Plan, figures: tuple, makespan: float) -> dict:
    """:attr:`DecodeResult.device` from the figures of :func:`_simulate`."""
    summ, n_reads, area, busy = figures
    drives = plan.storage.drives
    peak = plan.device.peak_iops() * drives
    reads_per_s = n_reads / makespan if makespan > 0 else 0.0
    derived = getattr(plan.device, "derived", None) or {}
    # fio's CPU a read of a memory-backed device is mostly fio's own and its engine's (sim.decode.host): no figure
    cpu = None if "memory_backed" in derived else (derived.get("cpu_per_read_us") or {}).get("value")
    return {
        "name": plan.device.name, "drives": drives, "busy_fraction": busy,
        "mean_queue_depth": area / makespan if makespan > 0 else 0.0,
        "max_queue_depth": summ["max_queue_depth"], "reads_per_s": reads_per_s,
        "mean_read_latency_us": (area / n_reads * 1e6) if n_reads else 0.0,
        "iops_utilization": reads_per_s / peak if peak > 0 else 0.0,
        **({"host_read_cpus": reads_per_s * cpu * 1e-6} if cpu is not None else {}),
        # the fast mode's queue counts a read from its admission to the raw device; a batch that waits for its
        # tokens after that is not in it (sim.device.fluid), the exact mode's is (BucketExactDevice)
        "bucket_wait_counted": plan.run.mode != "fast" or plan.device.bucket() is None,
    }


def _config(plan: _Plan) -> dict:
    """:attr:`DecodeResult.config`: every parameter of the run."""
    trace, device, run, storage, tail = plan.trace, plan.device, plan.run, plan.storage, plan.storage.tail
    return {
        "trace": {"source": trace.source, "steps": trace.steps, "wrapped": plan.rd.wrap["wrapped"]},
        "device": {"name": device.name, "source": device.source,
                   **({"derived": device.derived} if getattr(device, "derived", None) else {})},
        "policy": plan.policy.to_dict(), "compute": plan.compute.to_dict(),
        "sessions": run.sessions, "steps": run.steps, "mode": run.mode, "seed": run.seed,
        "hash_time_s": run.hash_time, "phases": str(run.starts()), "drives": storage.drives,
        "hot_rows": 0 if storage.hot is None else int(len(storage.hot)),
        "tail": None if tail is None else (tail.name if isinstance(tail, Device) else str(tail)),
    }


#: A run whose sessions read at once, while the device is busy, at least ``LOCKSTEP_FOLD`` times as many as
#: independent steps would (and at least that many) is said to be in lockstep (:func:`lockstep_warning`).
LOCKSTEP_FOLD = 2.0
#: A compute whose drawn cv is below this is constant: nothing in it breaks a convoy.
LOCKSTEP_CV = 0.005


def lockstep_warning(*, sessions: int, readers: int, drives: int, busy: float, mean_qd: float, stall_ms: float,
                     step_ms: float, rows: float, compute_cv: float) -> str:
    """A warning when a run's sessions read in lockstep under a constant compute; "" otherwise.

    Sessions whose reads overlap once finish together, and with every step's compute the same they read
    together again: a convoy that only grows.  A real compute's spread breaks it (on ``px``'s fio disk at 8
    sessions, 16 readers, 47 ms constant: a 3.3 ms stall; with a cv of 0.02, 0.77 ms).  Measured as the
    sessions reading at once while the device is busy (``mean_qd / busy / min(readers, rows)``, ``rows`` read a
    step) against what independent steps give (``1 + (sessions - 1) x stall_ms / step_ms``, each session's
    share of its step spent waiting for reads); said where it is :data:`LOCKSTEP_FOLD` times that or more, on
    one drive, with the compute's drawn cv under :data:`LOCKSTEP_CV`.  The figures are a run's
    (:class:`DecodeResult`'s ``device``, ``stall_ms``, ``step_ms``, ``compute_realised``) or a probe row's; a
    figure that is not a number says nothing.
    """
    try:
        n, r, busy, qd, stall, step, rows, cv = (float(v) for v in (sessions, readers, busy, mean_qd, stall_ms,
                                                                   step_ms, rows, compute_cv))
    except (TypeError, ValueError):
        return ""
    if not (n >= 2 and drives == 1 and 0 <= cv < LOCKSTEP_CV and busy > 0 and step > 0 and rows >= 1 and
            qd >= 0 and stall >= 0 and r >= 1) or not all(map(math.isfinite, (n, r, busy, qd, stall, step, rows))):
        return ""
    seen = qd / busy / min(r, rows)
    alone = 1.0 + (n - 1) * min(1.0, stall / step)
    if seen < LOCKSTEP_FOLD or seen < LOCKSTEP_FOLD * alone:
        return ""
    return (f"the sessions read in lockstep: {seen:.1f} read at once while the device is busy, where independent "
            f"steps give {alone:.1f}. With a constant compute, sessions whose reads once overlap stay in step (a "
            "convoy), which a real compute's spread breaks: give the compute a spread (sim decode's --compute-dist "
            "normal --compute-cv 0.02, a study's compute_dist and compute_cv, or the measured one) before acting on "
            "these figures")


def _result(plan: _Plan, lat, st, finish: list, figures: tuple, t_wall: float) -> DecodeResult:
    """The :class:`DecodeResult` of a finished run."""
    run, rd, spec, begin = plan.run, plan.rd, plan.spec, plan.begin
    makespan = max(finish) - min(begin)
    config = _config(plan)
    lat_all = np.asarray(lat, dtype=np.float64)
    tokens, per_session, speculative = run.sessions * run.steps, [run.steps] * run.sessions, {}
    if spec is not None:
        emitted = 1 + plan.accepted                                               # [S, steps]
        tokens, per_session = int(emitted.sum()), emitted.sum(axis=1).tolist()
        config["speculation"] = spec.to_dict()
        speculative = {**spec.to_dict(), **_speculative_figures(lat_all, emitted, spec)}
        speculative.update(wasted_reads=int(rd.wasted), prefetched_reads=int(sum(int(p.sum()) for p in plan.prefetch))
                           if plan.prefetch else 0)
    req, ph = rd.requests, str(run.starts())
    res = DecodeResult(
        tokens_per_s=tokens / makespan if makespan > 0 else float("inf"),
        tokens_per_s_per_session=[n / (f - b) if f > b else float("inf")
                                  for n, f, b in zip(per_session, finish, begin)],
        step_ms=percentiles_ms(lat_all.reshape(-1)),
        stall_ms=percentiles_ms(np.maximum(np.asarray(st, dtype=np.float64), 0.0).reshape(-1)),
        row_requests=req, reads=int(figures[1]),
        cache_hit_rate=(rd.cache_hits + rd.shared_hits) / req if req else 0.0,
        device=_device_info(plan, figures, makespan), timeline=figures[0]["timeline"], config=config,
        sim_seconds=makespan, wall_seconds=time.perf_counter() - t_wall, step_latencies=lat_all,
        compute_realised=compute_stats(np.concatenate(plan.comp)), phases=ph, wrap=rd.wrap,
        warnings=list(rd.wrap["warnings"]), shared_cache_hit_rate=rd.shared_hits / req if req else 0.0,
        dram_hit_rate=rd.dram_hits / req if req else 0.0, speculative=speculative,
    )
    lock = lockstep_warning(sessions=run.sessions, readers=plan.policy.readers, drives=plan.storage.drives,
                            busy=res.device["busy_fraction"], mean_qd=res.device["mean_queue_depth"],
                            stall_ms=res.stall_ms["mean"], step_ms=res.step_ms["mean"],
                            rows=res.reads / max(1, run.sessions * run.steps), compute_cv=res.compute_realised["cv"])
    if lock:
        res.warnings.append(lock)
    return res


def _speculative_figures(lat: np.ndarray, emitted: np.ndarray, spec: Speculation) -> dict:
    """Tokens, acceptance and time between tokens of a speculative run (:attr:`DecodeResult.speculative`):
    ``lat`` float64 ``[S, steps]`` seconds, ``emitted`` int64 ``[S, steps]`` tokens a step."""
    e = emitted.reshape(-1)
    lt = lat.reshape(-1)
    gaps = np.zeros(int(e.sum()))
    gaps[np.concatenate([[0], np.cumsum(e)[:-1]])] = lt          # each step's first token after its latency
    return {"tokens": int(e.sum()), "verification_steps": int(e.size), "tokens_per_step": float(e.mean()),
            "accepted_share": float((e - 1).sum() / (e.size * spec.draft_tokens)),
            "tbt_ms": percentiles_ms(gaps), "time_per_token_ms": percentiles_ms(lt / e)}


def _run_exact(plan: _Plan, dev_rng: np.random.Generator, tick) -> tuple:
    """The exact mode: (latencies, stalls, finish times, recorders per drive)."""
    import simpy

    env = simpy.Environment()
    drives, rd, comp, begin = plan.storage.drives, plan.rd, plan.comp, plan.begin
    recs = [Recorder() for _ in range(drives)]
    devs = [plan.device.exact(env, np.random.default_rng(dev_rng.integers(1 << 62)), recs[j]) for j in range(drives)]
    S, steps = len(comp), len(comp[0])
    lat, st = np.zeros((S, steps)), np.zeros((S, steps))
    finish = [0.0] * S

    def run(i):
        if begin[i] > 0:
            yield env.timeout(begin[i])
        work = SessionWork(rd.reads[i], rd.order[i] if rd.order else None, comp[i],
                           None if plan.prefetch is None else plan.prefetch[i])
        yield from exact_session(env, devs, work, plan.policy, plan.run.hash_time, plan.overlap, lat[i], st[i], tick)
        finish[i] = env.now

    for i in range(S):
        env.process(run(i))
    env.run()
    return lat, st, finish, recs


# =====================================================================================
# compute of the reference run
# =====================================================================================
def fit_compute(tokens_per_s: float, trace: Union[Trace, str], device: Union[Device, str],
                policy: Policy = Policy(), *, steps: Optional[int] = None, mode: str = "fast", seed: int = 0,
                hash_time: float = 0.0, calibration=None) -> float:
    """Constant compute time (seconds a step) that makes one session decode at ``tokens_per_s`` on ``device``.

    Runs the model once with no compute; the mean step time left is the read
    (and hash) time, so ``compute = 1 / tokens_per_s - mean step``.  With the
    same seed a single session then reproduces ``tokens_per_s`` exactly.

    Raises
    ------
    ArgumentError
        The target is not reachable: reads alone take longer than ``1 / tokens_per_s``.
    """
    if tokens_per_s <= 0:
        raise ArgumentError(f"tokens_per_s must be > 0, got {tokens_per_s}")
    r = simulate_decode(trace, device, policy, Compute(0.0), DecodeRun(steps=steps, mode=mode, seed=seed,
                                                                     hash_time=hash_time),
                        storage=Storage(calibration=calibration))
    io = r.sim_seconds / r.config["steps"]
    c = 1.0 / tokens_per_s - io
    if c <= 0:
        raise ArgumentError(f"cannot reach {tokens_per_s} tokens/s: reads alone take {io * 1e3:.3f} ms a step")
    return c


def reference_compute(trace: Optional[Union[Trace, str]] = None, *, steps: Optional[int] = None,
                      mode: str = "fast") -> float:
    """The compute of a step (seconds) of the SPEC §8 reference run: the reference engine reading serially
    (threshold 256, 16 readers) on the reference device decodes at 19.16 tokens/s.

    Compute belongs to the model and its accelerator, not to the disk: this is
    the compute every device is compared with (``engram sim decode`` keeps it
    whatever ``--device``).  ``trace`` defaults to the first 600 tokens of the
    built-in source-code trace (every step reads 48 rows, so the trace hardly
    matters: 47.013 ms).
    """
    ref = SEED_REFERENCE
    trace = trace if trace is not None else load_trace(CODE_SOURCE, limit=600)
    serial = Policy(threshold=ref["serial_threshold"], readers=ref["readers"])
    return fit_compute(ref["serial_tokens_per_s"], trace, ref["device"], serial, steps=steps, mode=mode)


def seed_reproduction(trace: Optional[Trace] = None, steps: Optional[int] = None, mode: str = "fast") -> dict:
    """The SPEC §8 / §9 check: fit compute so threshold 256 gives 19.16 tokens/s on the
    ``seed-apple-m3-ultra`` device (48 rows a step, 16 readers), then predict threshold 8.

    ``trace`` defaults to the first 600 tokens of the built-in source-code trace.

    Returns
    -------
    dict
        ``compute_ms``, ``serial_tokens_per_s`` (the fitted run), ``predicted_tokens_per_s``,
        ``reference_tokens_per_s`` (21.06), ``error`` (relative), ``speedup``, ``rows_per_step``.
    """
    ref = SEED_REFERENCE
    trace = trace if trace is not None else load_trace(CODE_SOURCE, limit=600)
    device = load_device(ref["device"])
    serial = Policy(threshold=ref["serial_threshold"], readers=ref["readers"])
    conc = Policy(threshold=ref["concurrent_threshold"], readers=ref["readers"])
    c = reference_compute(trace, steps=steps, mode=mode)
    r_serial = simulate_decode(trace, device, serial, Compute(c), DecodeRun(steps=steps, mode=mode))
    r_conc = simulate_decode(trace, device, conc, Compute(c), DecodeRun(steps=steps, mode=mode))
    pred = r_conc.tokens_per_s
    return {
        "device": device.name,
        "rows_per_step": r_conc.reads / r_conc.config["steps"],
        "compute_ms": c * 1e3,
        "serial_tokens_per_s": r_serial.tokens_per_s,
        "predicted_tokens_per_s": pred,
        "reference_tokens_per_s": ref["concurrent_tokens_per_s"],
        "error": pred / ref["concurrent_tokens_per_s"] - 1,
        "speedup": pred / r_serial.tokens_per_s - 1,
        "reference_speedup": ref["concurrent_tokens_per_s"] / ref["serial_tokens_per_s"] - 1,
    }
