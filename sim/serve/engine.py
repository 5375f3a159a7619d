"""The serving engine: continuous batching of requests whose decode steps and prefills read Engram rows.

One engine (one accelerator) runs one step at a time, like vLLM's or Sarathi-Serve's continuous
batching:

1. **Admission** (FCFS): waiting requests join the running set while it holds fewer than
   ``max_running`` requests.  A request admitted starts its prompt's background reader (SPEC §8,
   ``engram.Session.prefill``): every prompt row hashed up front, then the reader streams the rows in
   chunks of ``read_chunk`` tokens, chunk ``c`` of each table before chunk ``c + 1``, each chunk one
   batch of its distinct rows, and publishes how far it got (``prefill_readers = "per_table"``: one
   reader per table side by side, as :func:`sim.decode.prefill.simulate_prefill` models it).
2. **A step's work**: every running request past its prefill decodes one token (``B`` requests),
   and up to ``prefill_chunk`` prompt tokens are computed, given to the prefilling requests in
   admission order.  ``gate = "ready"``: only prompt tokens whose rows are already read are
   scheduled, so a step never waits for a prefill read (both tables' readers start at admission);
   ``gate = "stall"``: the scheduled prompt tokens are computed at once and each Engram layer waits
   until its table's reader has the chunk it needs (the second table's reader starts when the
   request's first prefill step reaches layer ``second_start_layer``) -- the reference engine's
   behaviour, which :func:`sim.decode.prefill.simulate_prefill` models for one prompt.
3. **Decode reads**: the ``B x 48`` rows of the step's decode tokens are read as one batch, each
   distinct row once across requests (:class:`~sim.serve.rows.RowSource`), serially below
   ``threshold`` distinct rows and else by ``readers`` (``Policy``), before compute starts (with
   ``overlap_layers = m``: the first table before compute, the second while the first ``m`` layers
   compute, as :mod:`sim.decode` does).  With several drives each read goes to its row's drive.
4. **Compute** for ``ms(B, P)`` (:class:`~sim.serve.compute.StepCompute`), spread evenly over the
   layers.  At the end of the step each decode request emits a token; a request whose last prompt
   token was computed emits its first token (its time to first token); a request that emitted its
   ``output`` tokens leaves.  The next step starts at once; the engine idles only with nothing to do.

Speculative decoding (``speculation``, :mod:`sim.decode.speculative`): every decoding request verifies
``k + 1`` tokens a step -- its last token and ``k`` drafts -- and emits ``1 + a`` (its accepted prefix,
drawn from the run's seed, at most the tokens it has left); the rows of all of them, rejected drafts'
other rows included, are the step's one decode batch, deduplicated across requests.  The compute takes
the ``k`` extra tokens of each request at the compute's per-token term (``ms(B, P + B k)``: they run
through the forward pass as prompt tokens do).  With ``prefetch_drafts`` (one drive, no resident rows,
caches or overlap) the next step's drafts' rows of the requests still decoding are read in the
background once this step's rows have arrived, and the next step reads on its critical path only the
rest, then waits for the prefetch before computing.  Its tokens come at once: the time between them is
the step's time before the first, 0 after.

Every batch of reads -- decode steps and prefill chunks -- shares the device
(:class:`~sim.serve.device.SharedDevice`): prefill reads slow decode reads down, and a stalled
step holds every decode token of the batch.

The run is an event loop over arrivals, the device's completions and timers (a step's compute,
its waypoints); a step costs a few events and a vectorised gather-sort of its rows.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Union

import numpy as np

from engram._checks import setting_int, setting_number
from engram.errors import ArgumentError

from ..decode import cache_hits
from ..decode.fast import split_readers
from ..decode.speculative import Speculation, accepted_prefix
from ..device import Device
from ..device.fluid import earliest
from sim.core.limits import MAX_DRIVES
from sim.core.params import Policy
from sim.core.progress import progress as progress_bar
from .compute import StepCompute
from .device import BatchTimes, SharedDevice
from .rows import DEFAULT_READ_CHUNK, RowSource, SharedRowCache
from .workload import Requests

__all__ = ["GATES", "PREFILL_READERS", "Engine", "EngineRun", "EngineTrace", "Scheduler"]

#: How prompt tokens wait for their rows (see the module docstring).
GATES = ("ready", "stall")
#: Background readers of a prompt (see :class:`Scheduler`).
PREFILL_READERS = ("one", "per_table")

# owner kinds of device batches, timer kinds, waypoint kinds
_DECODE, _DECODE_T1, _CHUNK, _PREFETCH = range(4)
_WAYPOINT, _END, _SUBMIT = range(3)
_W_READY, _W_START, _W_T1 = range(3)


@dataclass(frozen=True)
class Scheduler:
    """The engine's scheduling policy (see the module docstring).

    Attributes
    ----------
    max_running : int
        Requests in the running set at most (the largest decode batch).
    prefill_chunk : int
        Prompt tokens computed per step at most, over every prefilling request (Sarathi-Serve's chunk).
    read_chunk : int
        Tokens per chunk of the background prefill reader (2048 in the reference engine).
    gate : str
        ``"ready"`` or ``"stall"``.
    second_start_layer : int
        With ``gate = "stall"``: the layer whose start, in a request's first prefill step, starts its second
        table's reader (2 in the reference engine; 0 starts every reader at admission).
    prefill_readers : str
        ``"one"``: one background reader per prompt reading chunk ``c`` of every open table before chunk
        ``c + 1`` (``engram.Prefetcher``, the engine); ``"per_table"``: one reader per table, side by side
        (:func:`sim.decode.prefill.simulate_prefill`).

    Raises
    ------
    ArgumentError
        Counts below 1, an unknown gate, a negative layer.
    """

    max_running: int = 64
    prefill_chunk: int = 256
    read_chunk: int = DEFAULT_READ_CHUNK
    gate: str = "ready"
    second_start_layer: int = 2
    prefill_readers: str = "one"

    def __post_init__(self) -> None:
        for name in ("max_running", "prefill_chunk", "read_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ArgumentError(f"Scheduler.{name} must be an integer >= 1, got {v!r}")
        if self.gate not in GATES:
            raise ArgumentError(f"Scheduler.gate must be one of {', '.join(GATES)}, got {self.gate!r}")
        if self.prefill_readers not in PREFILL_READERS:
            raise ArgumentError(f"Scheduler.prefill_readers must be one of {', '.join(PREFILL_READERS)}, "
                                f"got {self.prefill_readers!r}")
        if self.second_start_layer < 0:
            raise ArgumentError(f"Scheduler.second_start_layer must be >= 0, got {self.second_start_layer}")

    def to_dict(self) -> dict:
        return asdict(self)


class _Step:
    __slots__ = ("t0", "D", "alloc", "t_read", "alone", "c", "wp", "wi", "frac", "t1_done", "t1_wait", "t_comp",
                 "B", "P", "t1_n", "running", "waiting", "emit")

    def __init__(self, t0, D, alloc):
        self.t0, self.D, self.alloc = t0, D, alloc
        self.t_read = t0
        self.alone = 0.0
        self.c = 0.0
        self.wp: list = []
        self.wi = 0
        self.frac = 0.0
        self.t1_done = True
        self.t1_wait = False
        self.t_comp = t0
        self.B = int(D.size)
        self.P = sum(t for _, t in alloc)
        self.t1_n = None
        self.running = 0
        self.waiting = 0
        self.emit = None


@dataclass
class EngineTrace:
    """What one engine run did; times in seconds.

    Attributes
    ----------
    admit, ready, read, first, finish : numpy.ndarray
        float64 ``[n]``: admission, first chunk of the prompt read in every table, the whole prompt read,
        first token (end of the prefill), last token; NaN when it did not happen before the run ended.
    emitted : numpy.ndarray
        int64 ``[n]``: output tokens emitted.
    tbt : numpy.ndarray
        float64: every gap between two tokens of a measured request (in the order they happened).
    steps : dict of numpy.ndarray
        Per step: ``t0``, ``t_read`` (decode reads done), ``t_end``, ``B``, ``P`` (prompt tokens), ``alone``
        (the decode batch's reads alone on the device), ``compute``, ``running``, ``waiting``.
    devices : list of SharedDevice
        Each drive's queue (area, busy, reads, times, depths).
    end : float
        When the run stopped (the last event, or the cap).
    capped : bool
        The run stopped (its time cap, or the TTFT abort) with requests unfinished.
    aborted : bool
        The run stopped early: the TTFT target could no longer be met.
    decode_reads, prefill_reads, decode_rows_asked : int
        Reads of decode batches and prefill chunks that reached the device, and decode row requests before
        any deduplication, resident rows or caches.
    shared_cache : dict
        ``hits``, ``requests`` of the shared row cache (zeros without one).
    request_cache : dict
        ``hits``, ``requests`` of the per-request row caches (``Policy.cache_rows``, ``Policy.cache_policy``)
        over the decode tokens stepped: a request is one non-resident row of one token (zeros without them).
    """

    admit: np.ndarray
    ready: np.ndarray
    read: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    emitted: np.ndarray
    tbt: np.ndarray
    steps: Dict[str, np.ndarray]
    devices: List[SharedDevice]
    end: float
    capped: bool
    aborted: bool
    decode_reads: int
    prefill_reads: int
    decode_rows_asked: int
    shared_cache: dict
    request_cache: dict


def _check_layers(rows: RowSource, policy: Policy, compute: StepCompute, sched: Scheduler) -> None:
    """Refuse an overlap or an Engram layer beyond the compute's layers, or a read chunk other than the rows'."""
    if policy.overlap_layers > compute.layers:
        raise ArgumentError(f"overlap_layers = {policy.overlap_layers} is beyond the {compute.layers} layers")
    if max(rows.layer_ids) >= compute.layers:
        raise ArgumentError(f"Engram layer {max(rows.layer_ids)} is beyond the {compute.layers} compute layers")
    if rows.read_chunk != sched.read_chunk:
        raise ArgumentError(f"the row source reads chunks of {rows.read_chunk} tokens, the scheduler "
                            f"{sched.read_chunk}")


@dataclass(frozen=True)
class EngineRun:
    """How one engine run goes: its drives, random streams, measured requests and when it stops.

    Attributes
    ----------
    drives : int
        Identical drives the tables are striped over by row id (>= 1).
    seed : int
        Device draws, compute spread and accepted drafts.
    measured : numpy.ndarray, optional
        bool ``[n]``: requests whose token gaps are kept (default all).
    t_cap : float
        Seconds: the run stops here even with requests left.
    positions : tuple of numpy.ndarray, optional
        ``(prompt start, decode start)`` per request in the row source (default :meth:`RowSource.place`): a
        measured run replayed read for read.
    abort_ttft : float, optional
        Seconds: stop as soon as more measured requests have waited longer than this for their first token
        than the SLO percentile ``abort_percentile`` allows (the TTFT SLO can no longer be met; a capacity
        search needs no more of the run).
    abort_percentile : float
        The SLO percentile of the abort, in [0, 100].
    speculation : Speculation, optional
        Draft tokens, their acceptance, the drafts' rows prefetched (see the module; ``None`` or ``k = 0``:
        off, the run as it was without it).

    Raises
    ------
    ArgumentError
        Names the field and the value: ``drives`` not a whole number in [1, 4096], ``seed`` not a whole number
        >= 0, ``measured`` not a one-dimensional bool array, ``t_cap`` not a number > 0 (``inf``: no cap),
        ``positions`` not a pair of arrays, ``abort_ttft`` not None or a number >= 0, ``abort_percentile`` not a
        number in [0, 100], ``speculation`` not None or a :class:`Speculation`; a bool, a float or a string
        given for a whole number.
    """

    drives: int = 1
    seed: int = 0
    measured: Optional[np.ndarray] = None
    t_cap: float = math.inf
    positions: Optional[tuple] = None
    abort_ttft: Optional[float] = None
    abort_percentile: float = 99.0
    speculation: Optional[Speculation] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "drives", setting_int("EngineRun.drives", self.drives, 1, MAX_DRIVES))
        object.__setattr__(self, "seed", setting_int("EngineRun.seed", self.seed, 0))
        if self.measured is not None:
            m = self.measured
            if not (isinstance(m, np.ndarray) and m.dtype == np.bool_ and m.ndim == 1):
                what = f"{m.dtype} array of shape {list(m.shape)}" if isinstance(m, np.ndarray) else type(m).__name__
                raise ArgumentError(f"EngineRun.measured = {what}: expected a one-dimensional bool array "
                                    "(one flag a request)")
        object.__setattr__(self, "t_cap", setting_number("EngineRun.t_cap", self.t_cap, 0.0, above=True,
                                                         finite=False))
        if self.positions is not None and (not isinstance(self.positions, (tuple, list)) or len(self.positions) != 2):
            raise ArgumentError(f"EngineRun.positions = {type(self.positions).__name__}: expected a pair "
                                "(prompt starts, decode starts) of arrays")
        if self.abort_ttft is not None:
            object.__setattr__(self, "abort_ttft", setting_number("EngineRun.abort_ttft", self.abort_ttft, 0.0,
                                                                  finite=False))
        object.__setattr__(self, "abort_percentile", setting_number("EngineRun.abort_percentile",
                                                                    self.abort_percentile, 0.0, 100.0))
        if self.speculation is not None and not isinstance(self.speculation, Speculation):
            raise ArgumentError(f"EngineRun.speculation = {type(self.speculation).__name__}: expected None or a "
                                "sim.decode.speculative.Speculation")


class Engine:
    """One run of the serving engine (see the module docstring).

    Parameters
    ----------
    reqs : Requests
    rows : RowSource
    device : Device
        Each drive's model.
    policy : Policy
        Threshold, readers, row caches, ``overlap_layers``, ``batch_overhead``.
    compute : StepCompute
    sched : Scheduler
    run : EngineRun
        Drives, seed, measured requests, time cap, replayed positions, the TTFT abort, speculation.

    Raises
    ------
    ArgumentError
        ``overlap_layers`` beyond the compute's layers, an Engram layer beyond them, a read chunk other than
        the row source's; speculation with per-request row caches, or its prefetch with resident rows, row
        caches, drives or overlap (not modelled).
    """

    def __init__(self, reqs: Requests, rows: RowSource, device: Device, policy: Policy, compute: StepCompute,
                 sched: Scheduler, run: EngineRun = EngineRun()):
        _check_layers(rows, policy, compute, sched)
        self.reqs, self.rows, self.policy, self.compute, self.sched = reqs, rows, policy, compute, sched
        self.drives = int(run.drives)
        self.t_cap = float(run.t_cap)
        ss = np.random.SeedSequence(run.seed)
        dev_ss, comp_ss = ss.spawn(2)
        self.times = BatchTimes(device, np.random.default_rng(dev_ss))
        self.devs = [SharedDevice(device) for _ in range(self.drives)]
        self._comp_rng = np.random.default_rng(comp_ss)
        self._mult: list = []
        self._init_requests(run)
        self._init_reads()
        self._init_speculation(run.speculation, ss)
        # records
        self.tbt_parts: List[np.ndarray] = []
        self.rec = {k: [] for k in ("t0", "t_read", "t_end", "B", "P", "alone", "compute", "running", "waiting")}
        self.decode_reads = self.prefill_reads = self.decode_rows_asked = 0
        self.request_cache_hits = self.request_cache_requests = 0
        self.end = 0.0
        self.arrived = 0
        self.aborted = False
        self.abort_ttft = run.abort_ttft
        n_meas = int(self.measured.sum())
        self.abort_allowed = int(math.floor(max(n_meas - 1, 0) * (1.0 - run.abort_percentile / 100.0)))

    def _init_requests(self, run: EngineRun) -> None:
        """Per request: where it reads, its lengths, its times, its state; the scheduler's queues."""
        reqs, positions = self.reqs, run.positions
        n = len(reqs)
        self.ppos, self.dpos = self.rows.place(reqs) if positions is None else (np.asarray(positions[0], np.int64),
                                                                                 np.asarray(positions[1], np.int64))
        self.P = reqs.prompt.tolist()
        self.O = reqs.output.astype(np.int64)
        self.Ol = self.O.tolist()
        self.emitted = np.zeros(n, dtype=np.int64)
        self.last = np.zeros(n)
        self.admit_t = np.full(n, np.nan)
        self.first_t = np.full(n, np.nan)
        self.finish_t = np.full(n, np.nan)
        self.ready_t = np.full(n, np.nan)
        self.read_t = np.full(n, np.nan)
        self.measured = np.ones(n, dtype=bool) if run.measured is None else np.asarray(run.measured, dtype=bool)
        self.done_pre = [0] * n
        self.ready: Dict[int, list] = {}
        self.counts: Dict[int, np.ndarray] = {}
        self.started2: Dict[int, bool] = {}
        self.open_: Dict[int, list] = {}
        self.nxt: Dict[int, list] = {}
        self.groups: Dict[int, list] = {}
        self.waiters: Dict[tuple, _Step] = {}
        self.waiting: deque = deque()
        self.prefilling: List[int] = []
        self.decoding: List[int] = []
        self._dec = np.zeros(0, dtype=np.int64)
        self._dec_em = self._dec_last = self._dec_O = self._dec_dpos = self._dec
        self._dec_meas = None
        self._dec_dirty = False
        self.busy = False
        self._planning = False
        self.timers: list = []
        self._seq = 0

    def _init_reads(self) -> None:
        """The tables' layers and overlap, whether reads take the fast path, the shared and per-request caches."""
        policy, compute, rows = self.policy, self.compute, self.rows
        self.L = rows.layers
        self.layer_frac = [lid / compute.layers for lid in rows.layer_ids]
        self.ov = (policy.overlap_layers / compute.layers) if (policy.overlap_layers > 0 and self.L > 1) else 0.0
        self.fast_reads = (rows.resident is None and policy.cache_rows == 0 and policy.shared_cache_rows == 0
                           and self.drives == 1 and not self.ov)
        self.shared = SharedRowCache(policy.shared_cache_rows, policy.cache_policy, rows) \
            if policy.shared_cache_rows > 0 else None
        # per-request row caches (the policy's cache_policy): a slot per running request, its hits of its whole
        # decode stream drawn at its admission
        self.hits = None
        if policy.cache_rows > 0:
            n, m = len(self.reqs), self.sched.max_running
            self.slot = np.zeros(n, dtype=np.int64)
            self.free_slots = list(range(m - 1, -1, -1))
            self.hits = np.zeros((m, max(int(self.O.max()) - 1, 1), rows.keys.shape[1]), dtype=bool)

    def _init_speculation(self, speculation: Optional[Speculation], ss: np.random.SeedSequence) -> None:
        """Drafts on or off, the prefetch's state; refused where not modelled."""
        self.spec = speculation if speculation is not None and speculation.on else None
        self._pf_box = None        # the prefetch in flight: [done, waiting step]
        self._pf_pos: Dict[int, np.ndarray] = {}   # per request: its prefetched drafts' positions
        self._pf_acc: Dict[int, int] = {}          # per request: the accepted drafts of its next step, drawn
        self.prefetched_reads = self.wasted_reads = 0
        if self.spec is not None:
            if self.policy.cache_rows > 0:
                raise ArgumentError("speculative decoding with per-request row caches is not modelled "
                                    "(cache_rows = 0, or a shared cache)")
            if self.spec.prefetch_drafts and not self.fast_reads:
                raise ArgumentError("prefetch_drafts in the serving model needs one drive, no resident rows, no "
                                    "row caches and no overlap (not modelled otherwise)")
            self._spec_rng = np.random.default_rng(ss.spawn(1)[0])
            self._J = np.arange(self.spec.draft_tokens + 1)

    # ================================================================== events
    def _timer(self, t: float, kind: int, obj) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (t, self._seq, kind, obj))

    def _multiplier(self) -> float:
        if not self._mult:
            self._mult = self.compute.multipliers(self._comp_rng, 4096).tolist()
        return self._mult.pop()

    def _submit(self, now: float, parts: List[int], owner: list) -> float:
        """Batches of ``parts[j]`` reads on drive ``j`` (one logical batch: ``owner[0]`` counts its parts);
        returns the longest part's duration alone."""
        p = self.policy
        total = sum(parts)
        k = p.concurrency(total)
        if self.drives == 1:
            phases = [[(0, total, k)]]
        else:
            phases = split_readers(k, parts)
            if len(phases) > 1:  # fewer readers than drives with reads: one reader each (an approximation)
                phases = [[ph[0] for ph in phases]]
        ph = phases[0]
        owner[0] = len(ph)
        alone = 0.0
        draw = self.times.draw
        for j, n, kj in ph:
            t = draw(n, kj)
            if t > alone:
                alone = t
            self.devs[j].submit(now, n, kj, t, owner)
        return alone

    def _read(self, now: float, parts: List[int], owner: list) -> float:
        """Submit now, or after the batch overhead of a concurrent batch (a timer)."""
        ovh = self.policy.batch_overhead
        if ovh and self.policy.concurrency(sum(parts)) > 1:
            self._timer(now + ovh, _SUBMIT, (parts, owner))
            return ovh
        return self._submit(now, parts, owner)

    # ================================================================== admission and readers
    def _admit(self, r: int, now: float) -> None:
        self.admit_t[r] = now
        self.prefilling.append(r)
        self.counts[r] = self.rows.prompt_reads(int(self.reqs.source[r]), int(self.ppos[r]), self.P[r])
        self.ready[r] = [0] * self.L
        if self.hits is not None:
            s = self.free_slots.pop()
            self.slot[r] = s
            m = self.Ol[r] - 1
            if m > 0:
                keys = self.rows.stream_keys(int(self.dpos[r]), m)
                res = self.rows.stream_resident(int(self.dpos[r]), m)
                active = np.ones(keys.shape, dtype=bool) if res is None else ~res
                self.hits[s, :m] = cache_hits(self.rows.cache_keys(keys), active, self.policy.cache_rows,
                                              self.policy.cache_policy).reshape(keys.shape)
        stall = self.sched.gate == "stall" and self.sched.second_start_layer > 0
        self.started2[r] = not stall
        self.open_[r] = [j == 0 or not stall for j in range(self.L)]
        self.nxt[r] = [0] * self.L
        tables = [list(range(self.L))] if self.sched.prefill_readers == "one" else [[j] for j in range(self.L)]
        self.groups[r] = [[g, False] for g in tables]
        for gi in range(len(tables)):
            self._reader_next(r, gi, now)

    def _reader_next(self, r: int, gi: int, now: float) -> None:
        """Reader ``gi`` of request ``r`` takes its next chunk: of its open tables, the one furthest behind (ties
        to the earlier table), as ``engram.Prefetcher`` does; a chunk with nothing to read is published at once."""
        grp = self.groups[r][gi]
        if grp[1]:
            return
        cnt = self.counts[r]
        nch = cnt.shape[0]
        nxt, op = self.nxt[r], self.open_[r]
        while True:
            best = -1
            for j in grp[0]:
                if op[j] and nxt[j] < nch and (best < 0 or nxt[j] < nxt[best]):
                    best = j
            if best < 0:
                return
            j, c = best, nxt[best]
            nxt[j] = c + 1
            if self.shared is not None:
                keys = self.rows.chunk_keys(int(self.reqs.source[r]), int(self.ppos[r]), self.P[r], c, j)
                n = int(self.shared.misses(keys).size)
            else:
                n = int(cnt[c, j])
            if n:
                if self.drives == 1:
                    parts = [n]
                else:
                    base, rem = divmod(n, self.drives)
                    parts = [base + (1 if d < rem else 0) for d in range(self.drives)]
                self.prefill_reads += n
                grp[1] = True
                self._read(now, parts, [0, _CHUNK, r, gi, j, c])
                return
            self._publish(r, j, c, now)

    def _chunk_done(self, r: int, gi: int, j: int, c: int, now: float) -> None:
        self.groups[r][gi][1] = False
        self._reader_next(r, gi, now)
        self._publish(r, j, c, now)

    def _publish(self, r: int, j: int, c: int, now: float) -> None:
        """Chunk ``c`` of table ``j`` of request ``r`` is read: its tokens' rows are ready."""
        ch = self.sched.read_chunk
        rd = self.ready[r]
        P = self.P[r]
        rd[j] = min(P, (c + 1) * ch)
        m = min(rd)
        if m > 0 and math.isnan(self.ready_t[r]):
            self.ready_t[r] = now
        if m >= P:
            self.read_t[r] = now
        st = self.waiters.pop((r, j), None)
        if st is not None:
            self._advance(st, now)
        elif not self.busy:
            self._plan(now)

    # ================================================================== steps
    def _decode_set(self) -> np.ndarray:
        """The decoding requests as arrays (ids, emitted, last token time, output, decode start, measured), rebuilt
        only when a request joins or leaves; between, a step updates the arrays in place."""
        if self._dec_dirty:
            D = self._dec
            if D.size:  # write the running figures back before the set changes
                self.emitted[D] = self._dec_em
                self.last[D] = self._dec_last
            D = self._dec = np.asarray(self.decoding, dtype=np.int64)
            self._dec_em = self.emitted[D]
            self._dec_last = self.last[D]
            self._dec_O = self.O[D]
            self._dec_dpos = self.dpos[D] - 1
            meas = self.measured[D]
            self._dec_meas = None if meas.all() else meas
            self._dec_dirty = False
        return self._dec

    def _plan(self, now: float) -> None:
        if self.busy or self._planning:
            return
        sched = self.sched
        waiting = self.waiting
        self._planning = True  # a reader publishing during admission must not start a step of its own
        while waiting and len(self.prefilling) + len(self.decoding) < sched.max_running:
            self._admit(waiting.popleft(), now)
        self._planning = False
        D = self._decode_set()
        alloc = []
        budget = sched.prefill_chunk
        ready_gate = sched.gate == "ready"
        for r in self.prefilling:
            left = self.P[r] - self.done_pre[r]
            avail = (min(self.ready[r]) - self.done_pre[r]) if ready_gate else left
            take = min(left, avail, budget)
            if take > 0:
                alloc.append((r, take))
                budget -= take
                if not budget:
                    break
        if not D.size and not alloc:
            return
        self.busy = True
        st = _Step(now, D, alloc)
        st.running = len(self.prefilling) + len(self.decoding)
        st.waiting = len(waiting)
        if not D.size:
            self._start_compute(st, now)
            return
        pos = (self._dec_dpos + self._dec_em) % self.rows.text_tokens
        extra = 0
        if self.spec is not None:
            pos, extra = self._verification(st, D)
        self.decode_rows_asked += int(D.size) * self.rows.keys.shape[1] * (1 + (self.spec.draft_tokens
                                                                                 if self.spec else 0))
        if self.fast_reads:
            n = self.rows.count_distinct(pos) + extra
            self.decode_reads += n
            if self.spec is not None and self._pf_pos:
                n -= self._prefetched_now(D)
            if n <= 0:
                st.alone = 0.0
                self._read_done(st, now)
                return
            st.alone = self._read(now, [n], [0, _DECODE, st])
            return
        hits = None
        if self.hits is not None:
            hits = self.hits[self.slot[D], self._dec_em - 1]
            self.request_cache_hits += int(hits.sum())
            res = self.rows.resident
            self.request_cache_requests += int(hits.size) if res is None else int((~res[pos]).sum())
        keys = self.rows.decode_keys(pos, hits)
        if self.shared is not None:
            keys = self.shared.misses(keys)
        by_table, by_drive = self.rows.split(keys, self.drives)
        if extra:  # rejected drafts' other rows: spread evenly over the tables and drives
            share = np.full(by_table.shape, extra // by_table.size, dtype=np.int64)
            share.reshape(-1)[: extra % by_table.size] += 1
            by_table = by_table + share
            by_drive = by_table.sum(axis=0)
        self.decode_reads += int(keys.size) + extra
        if not keys.size and not extra:
            self._start_compute(st, now)
            return
        if self.ov:
            first, rest = by_table[0].tolist(), by_table[1:].sum(axis=0).tolist()
            st.t1_n = rest if sum(rest) else None
            if not sum(first):
                st.alone = 0.0
                self._read_done(st, now)
                return
            st.alone = self._read(now, first, [0, _DECODE, st])
            return
        st.alone = self._read(now, by_drive.tolist(), [0, _DECODE, st])

    def _verification(self, st: _Step, D: np.ndarray) -> tuple:
        """The step's verification tokens: (positions of the tokens whose rows are the text's, int64; reads of
        the rejected drafts' other rows); sets ``st.emit``, the tokens each request emits."""
        k = self.spec.draft_tokens
        a = accepted_prefix(self.spec, self._spec_rng, D.size)
        if self._pf_acc:  # drawn when the drafts' rows were prefetched
            for i, r in enumerate(D.tolist()):
                got = self._pf_acc.pop(r, None)
                if got is not None:
                    a[i] = got
        st.emit = np.minimum(1 + a, self._dec_O - self._dec_em)
        base = self._dec_dpos + self._dec_em
        keep = self._J[None, :] <= a[:, None]
        pos = ((base[:, None] + self._J[None, :])[keep]) % self.rows.text_tokens
        extra = int((k - a).sum()) * int(self.rows.keys.shape[1])
        self.wasted_reads += extra
        return pos, extra

    def _prefetched_now(self, D: np.ndarray) -> int:
        """Reads of this step already prefetched (the drafts' rows of its requests that had theirs read);
        the prefetched positions of requests no longer decoding are dropped."""
        pos, extra = [], 0
        for r in D.tolist():
            got = self._pf_pos.get(r)
            if got is not None:
                pos.append(got[0])
                extra += got[1]
        self._pf_pos.clear()
        return (self.rows.count_distinct(np.concatenate(pos)) if pos and sum(p.size for p in pos) else 0) + extra

    def _prefetch_next(self, st: _Step, now: float) -> None:
        """Read in the background the next step's drafts' rows of the requests that go on decoding."""
        D = st.D
        go_on = (self._dec_em + st.emit) < self._dec_O
        if not go_on.any():
            return
        k = self.spec.draft_tokens
        ids = D[go_on]
        a = accepted_prefix(self.spec, self._spec_rng, ids.size)
        base = (self._dec_dpos + self._dec_em + st.emit)[go_on]
        cols = int(self.rows.keys.shape[1])
        pos_all, extra = [], 0
        for i, r in enumerate(ids.tolist()):
            p = (base[i] + np.arange(1, int(a[i]) + 1)) % self.rows.text_tokens
            self._pf_pos[r] = (p, (k - int(a[i])) * cols)
            self._pf_acc[r] = int(a[i])
            pos_all.append(p)
            extra += (k - int(a[i])) * cols
        flat = np.concatenate(pos_all)
        n = (self.rows.count_distinct(flat) if flat.size else 0) + extra
        if n <= 0:
            return
        self.prefetched_reads += n
        box = [False, None]
        self._pf_box = box
        self._read(now, [n], [0, _PREFETCH, box])

    def _read_done(self, st: _Step, now: float) -> None:
        box = self._pf_box
        if box is not None:
            if not box[0]:  # the prefetch of this step's drafts is still reading: wait for it
                box[1] = st
                return
            self._pf_box = None
        if self.spec is not None and self.spec.prefetch_drafts and st.D.size:
            self._prefetch_next(st, now)
        st.t_read = now
        if st.t1_n is not None:
            st.t1_done = False
            self._read(now, st.t1_n, [0, _DECODE_T1, st])
        self._start_compute(st, now)

    def _start_compute(self, st: _Step, now: float) -> None:
        st.t_comp = now
        extra = st.B * self.spec.draft_tokens if self.spec is not None else 0
        c = self.compute.mean_ms(st.B, st.P + extra) * 1e-3
        if self.compute.dist != "constant" and self.compute.cv > 0:
            c *= self._multiplier()
        st.c = c
        wp = []
        if not st.t1_done:
            wp.append((self.ov, 1, _W_T1, None))
        if self.sched.gate == "stall":
            s2 = self.sched.second_start_layer / self.compute.layers
            for r, take in st.alloc:
                need = self.done_pre[r] + take
                if not self.started2[r]:
                    wp.append((s2, 0, _W_START, r))
                for j, f in enumerate(self.layer_frac):
                    wp.append((f, 1, _W_READY, (r, j, need)))
        if wp:
            wp.sort(key=lambda w: (w[0], w[1]))
        st.wp = wp
        self._advance(st, now)

    def _advance(self, st: _Step, now: float) -> None:
        """Run the step's compute from ``now`` through its waypoints (rows it waits for, a reader it starts)."""
        wp = st.wp
        while st.wi < len(wp):
            f, _, kind, arg = wp[st.wi]
            if f > st.frac + 1e-15:
                self._timer(now + (f - st.frac) * st.c, _WAYPOINT, st)
                st.frac = f
                return
            if kind == _W_START:
                if not self.started2[arg]:
                    self.started2[arg] = True
                    op = self.open_[arg]
                    for j in range(1, self.L):
                        op[j] = True
                    for gi in range(len(self.groups[arg])):
                        self._reader_next(arg, gi, now)
            elif kind == _W_READY:
                r, j, need = arg
                if self.ready[r][j] < need:
                    self.waiters[(r, j)] = st
                    return
            elif not st.t1_done:
                st.t1_wait = True
                return
            st.wi += 1
        self._timer(now + (1.0 - st.frac) * st.c, _END, st)
        st.frac = 1.0

    def _finish(self, st: _Step, now: float) -> None:
        D = st.D
        if D.size:  # D is the decode set of _decode_set: its arrays are updated in place
            last = self._dec_last
            gaps = now - last
            meas = self._dec_meas
            self.tbt_parts.append(gaps if meas is None else gaps[meas])
            last.fill(now)
            em = self._dec_em
            if st.emit is None:
                em += 1
            else:  # a verification step's tokens come at once: 0 between them
                more = st.emit - 1
                self.tbt_parts.append(np.zeros(int((more if meas is None else more[meas]).sum())))
                em += st.emit
            done = em >= self._dec_O
            if done.any():
                fin = D[done]
                self.finish_t[fin] = now
                gone = set(fin.tolist())
                self.decoding = [r for r in self.decoding if r not in gone]
                self._dec_dirty = True
                if self.hits is not None:
                    self.free_slots.extend(self.slot[fin].tolist())
        for r, take in st.alloc:
            self.done_pre[r] += take
            if self.done_pre[r] >= self.P[r]:
                self.prefilling.remove(r)
                self.first_t[r] = now
                self.last[r] = now
                self.emitted[r] = 1
                for d in (self.counts, self.ready, self.open_, self.nxt, self.groups, self.started2):
                    d.pop(r, None)
                if self.Ol[r] <= 1:
                    self.finish_t[r] = now
                    if self.hits is not None:
                        self.free_slots.append(int(self.slot[r]))
                else:
                    self.decoding.append(r)
                    self._dec_dirty = True
        rec = self.rec
        rec["t0"].append(st.t0)
        rec["t_read"].append(st.t_comp)
        rec["t_end"].append(now)
        rec["B"].append(st.B)
        rec["P"].append(st.P)
        rec["alone"].append(st.alone)
        rec["compute"].append(st.c)
        rec["running"].append(st.running)
        rec["waiting"].append(st.waiting)
        self.busy = False
        if self.abort_ttft is not None and len(rec["t0"]) % 128 == 0:
            self._check_abort(now)
        self._plan(now)

    def _check_abort(self, now: float) -> None:
        """Whether more measured requests than the percentile allows are already past the TTFT target."""
        i = self.arrived
        late = (np.isnan(self.first_t[:i]) & self.measured[:i] & (self.reqs.arrival[:i] + self.abort_ttft < now))
        if int(np.count_nonzero(late)) > self.abort_allowed:
            self.aborted = True

    def _owner_done(self, o: list, now: float) -> None:
        o[0] -= 1
        if o[0]:
            return
        kind = o[1]
        if kind == _CHUNK:
            self._chunk_done(o[2], o[3], o[4], o[5], now)
        elif kind == _DECODE:
            self._read_done(o[2], now)
        elif kind == _PREFETCH:
            box = o[2]
            box[0] = True
            if box[1] is not None:
                st, box[1] = box[1], None
                self._read_done(st, now)
        else:
            st = o[2]
            st.t1_done = True
            if st.t1_wait:
                st.t1_wait = False
                self._advance(st, now)

    # ================================================================== the loop
    def run(self, progress: Union[bool, str] = False) -> EngineTrace:
        """Run until every request finished or the time cap; return what happened.

        ``progress``: :mod:`sim.core.progress` mode, one item a request arrived (shown after 2 s).
        """
        arr = self.reqs.arrival.tolist()
        N = len(arr)
        bar = progress_bar(N, "serve", "arrival", mode=progress, delay=2.0)
        shown, every = 0, max(1, N // 200)
        i = 0
        devs = self.devs
        one = len(devs) == 1
        d0 = devs[0]
        timers = self.timers
        pop = heapq.heappop
        inf = math.inf
        cap = self.t_cap
        waiting = self.waiting
        now = 0.0
        while True:
            ta = arr[i] if i < N else inf
            td, dj = (d0.tnext, 0) if one else earliest(devs)
            tt = timers[0][0] if timers else inf
            if self.aborted:
                break
            if td <= ta and td <= tt:
                if td == inf or td > cap:
                    break
                now = td
                for o in devs[dj].complete(td):
                    self._owner_done(o, td)
            elif tt <= ta:
                if tt > cap:
                    break
                now, _, kind, obj = pop(timers)
                if kind == _END:
                    self._finish(obj, now)
                elif kind == _WAYPOINT:
                    self._advance(obj, now)
                else:
                    parts, owner = obj
                    self._submit(now, parts, owner)
            else:
                if ta > cap:
                    break
                now = ta
                while i < N and arr[i] <= ta:  # requests arriving together are admitted together
                    waiting.append(i)
                    i += 1
                self.arrived = i
                if i - shown >= every:
                    bar.update(i - shown)
                    shown = i
                if not self.busy:
                    self._plan(now)
        bar.update(i - shown)
        bar.close()
        self._dec_dirty = True
        self._decode_set()  # the decoding requests' figures back into the per-request arrays
        capped = bool(np.isnan(self.finish_t).any())
        self.end = cap if capped and math.isfinite(cap) and not self.aborted else now
        for d in devs:
            d.advance(self.end)
        steps = {k: np.asarray(v, dtype=np.float64) for k, v in self.rec.items()}
        tbt = np.concatenate(self.tbt_parts) if self.tbt_parts else np.zeros(0)
        shared = {"hits": self.shared.hits, "requests": self.shared.requests} if self.shared else {"hits": 0,
                                                                                                    "requests": 0}
        own = {"hits": self.request_cache_hits, "requests": self.request_cache_requests}
        return EngineTrace(self.admit_t, self.ready_t, self.read_t, self.first_t, self.finish_t, self.emitted.copy(), tbt, steps, devs, self.end,
                           capped, self.aborted, self.decode_reads, self.prefill_reads, self.decode_rows_asked, shared,
                           own)
