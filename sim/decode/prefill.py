"""Prefill model: a prompt's rows streamed by background readers while the layers compute (SPEC §8).

The prompt's rows are all hashed first (``hash_time`` per token, default 0).
Then one background reader per Engram table streams that table's rows in
chunks of ``chunk`` tokens (2048 in the reference engine): each chunk's
distinct rows are one batch, read serially below ``threshold`` rows and
otherwise ``readers`` (or ``ring_depth``) at a time, and the reader publishes
how many chunks it has finished.  The first table's reader starts before layer
0; the second's when compute reaches layer ``second_start_layer`` (2 in the
reference), so earlier layers' compute hides its read.

Compute processes the prompt in micro-batches of ``ubatch`` tokens (default
``chunk``), layer by layer; a micro-batch of ``m`` tokens spends
``m * compute_per_token / layers`` on each layer (one draw of the compute
distribution per micro-batch and layer).  At an Engram layer it waits until
the table's reader has finished the chunk holding the micro-batch's last
token; that wait is a stall.  Both readers share the device (fast or exact
mode, as in :mod:`sim.decode`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np

from engram.errors import ArgumentError

from sim.device import Device, Recorder, load_device, summarize_boxes, summarize_counter
from sim.core.limits import MAX_BINS, check_amount, check_count, check_seed
from sim.core.params import Compute, Policy, compute_stats
from sim.core.progress import progress as progress_bar
from sim.trace import Trace, load_trace

__all__ = ["PrefillResult", "PrefillRun", "simulate_prefill"]


@dataclass
class PrefillResult:
    """Outcome of :func:`simulate_prefill`; times in seconds.

    Attributes
    ----------
    tokens : int
        Prompt length.
    prefill_seconds : float
        From the start of hashing to the end of the last layer.
    compute_seconds : float
        Compute alone (hash + every layer), the time without any stall.
    stall_seconds : float
        Total time layers waited for rows; ``stall_by_layer`` splits it per
        Engram layer id; ``stalls`` counts the waits.
    reader_done : dict
        Engram layer id -> time its reader finished the whole prompt.
    reader_busy : dict
        Engram layer id -> seconds its reader spent reading.
    reads : int
        Row reads that reached the device (distinct rows per chunk).
    tokens_per_s : float
        ``tokens / prefill_seconds``.
    overhead : float
        ``prefill_seconds / compute_seconds - 1``: the cost of waiting for rows.
    device, timeline, config : dict
        As in :class:`sim.decode.DecodeResult`.
    compute_realised : dict
        ``mean_ms`` (per token), ``cv``, ``samples`` of the compute drawn (beside the nominal ``config["compute"]``).
    """

    tokens: int
    prefill_seconds: float
    compute_seconds: float
    stall_seconds: float
    stall_by_layer: dict
    stalls: int
    reader_done: dict
    reader_busy: dict
    reads: int
    tokens_per_s: float
    overhead: float
    device: dict
    timeline: dict
    config: dict
    wall_seconds: float
    compute_realised: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["stall_by_layer"] = {str(k): v for k, v in self.stall_by_layer.items()}
        d["reader_done"] = {str(k): v for k, v in self.reader_done.items()}
        d["reader_busy"] = {str(k): v for k, v in self.reader_busy.items()}
        return d

    def summary(self) -> str:
        c = self.config
        lines = [
            f"prefill  {self.tokens} tokens, chunk {c['chunk']}, ubatch {c['ubatch']}, second table from layer "
            f"{c['second_start_layer']}, device {self.device['name']}, mode {c['mode']}",
            f"time     {self.prefill_seconds * 1e3:.3f} ms ({self.tokens_per_s:.1f} tokens/s); compute alone "
            f"{self.compute_seconds * 1e3:.3f} ms; overhead {self.overhead * 100:.2f}%",
            f"stalls   {self.stalls}, {self.stall_seconds * 1e3:.3f} ms: " + ", ".join(
                f"layer {k} {v * 1e3:.3f} ms" for k, v in self.stall_by_layer.items()),
            "readers  " + ", ".join(f"layer {k} done at {self.reader_done[k] * 1e3:.3f} ms "
                                   f"(busy {self.reader_busy[k] * 1e3:.3f} ms)" for k in self.reader_done),
            f"device   {self.reads} reads, busy {self.device['busy_fraction']:.3f}, "
            f"mean qd {self.device['mean_queue_depth']:.2f}",
            f"compute  {c['compute']['mean_ms'] * 1e3:.3f} us a token ({c['compute']['dist']}, cv "
            f"{c['compute']['cv']:.3g}); drawn: mean {self.compute_realised.get('mean_ms', 0.0) * 1e3:.3f} us, "
            f"cv {self.compute_realised.get('cv', 0.0):.3f}",
        ]
        return "\n".join(lines)


def _chunk_reads(rows: np.ndarray, chunk: int) -> np.ndarray:
    """int64 ``[chunks, layers]``: distinct rows of each chunk and table."""
    T, L, _ = rows.shape
    nch = -(-T // chunk)
    out = np.zeros((nch, L), dtype=np.int64)
    for i in range(nch):
        part = rows[i * chunk:(i + 1) * chunk]
        for li in range(L):
            out[i, li] = np.unique(part[:, li, :]).size
    return out


@dataclass(frozen=True)
class PrefillRun:
    """How a prefill run goes (:func:`simulate_prefill`): the prompt, its chunks and micro-batches, the mode.

    Attributes
    ----------
    tokens : int, optional
        Prompt length (default the whole trace; at most the trace's steps).
    chunk : int
        Tokens per reader chunk (2048 in the reference engine; >= 1).
    ubatch : int, optional
        Tokens per compute micro-batch (default ``chunk``; >= 1).
    second_start_layer : int
        Layer whose start (in the first micro-batch) starts the second table's reader; 0 starts both readers
        together (>= 0).
    mode : str
        ``"fast"`` or ``"exact"`` (as in :func:`sim.decode.simulate_decode`).
    seed : int
        Seeds the device's and the compute's random streams.
    hash_time : float
        Seconds per token for hashing the whole prompt up front (>= 0).
    bins : int
        Bins of the queue-depth timeline (>= 1).
    progress : bool or str
        Show progress (:func:`sim.core.progress.progress`), one item a micro-batch.

    Raises
    ------
    ArgumentError
        Bad mode, bins, chunk, ubatch, second_start_layer or hash_time.
    """

    tokens: Optional[int] = None
    chunk: int = 2048
    ubatch: Optional[int] = None
    second_start_layer: int = 2
    mode: str = "fast"
    seed: int = 0
    hash_time: float = 0.0
    bins: int = 100
    progress: Union[bool, str] = False

    def __post_init__(self) -> None:
        if self.mode not in ("fast", "exact"):
            raise ArgumentError(f"mode must be 'fast' or 'exact', got {self.mode!r}")
        object.__setattr__(self, "chunk", check_count(self.chunk, "chunk"))
        ubatch = self.chunk if self.ubatch is None else check_count(self.ubatch, "ubatch")
        object.__setattr__(self, "ubatch", ubatch)
        object.__setattr__(self, "bins", check_count(self.bins, "bins", high=MAX_BINS))
        object.__setattr__(self, "second_start_layer", check_count(self.second_start_layer, "second_start_layer", 0))
        object.__setattr__(self, "hash_time", check_amount(self.hash_time, "hash_time", "seconds"))
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.tokens is not None:
            object.__setattr__(self, "tokens", check_count(self.tokens, "tokens"))


def simulate_prefill(trace: Union[Trace, str], device: Union[Device, str], policy: Policy = Policy(),
                     compute: Union[Compute, float] = 0.0, run: PrefillRun = PrefillRun(), *,
                     calibration=None) -> PrefillResult:
    """Simulate the prefill of one prompt.

    Parameters
    ----------
    trace : Trace or str
        The prompt's row ids (its first ``run.tokens`` steps).
    device : Device or str
    policy : Policy
        Threshold and reader width for each chunk batch (cache and overlap are not used).
    compute : Compute or float
        Compute seconds per token through all ``Compute.layers`` layers.
    run : PrefillRun
        Prompt length, chunk, micro-batch, second table's start, mode, seed, hash time, bins, progress.
    calibration : path or Calibration, optional
        For ``device="calibrated"`` (:func:`sim.device.load_device`).

    Raises
    ------
    ArgumentError
        A prompt longer than the trace, a second table started after its layer, or an Engram layer id beyond
        ``Compute.layers``; bad settings are refused by :class:`PrefillRun`.
    """
    t_wall = time.perf_counter()
    if isinstance(trace, str):
        trace = load_trace(trace, limit=run.tokens)
    device = load_device(device, calibration, backend=policy.backend)
    if not isinstance(compute, Compute):
        compute = Compute(float(compute))
    N = trace.steps if run.tokens is None else int(run.tokens)
    if not 1 <= N <= trace.steps:
        raise ArgumentError(f"tokens must be in [1, {trace.steps}] (the trace length), got {run.tokens}")
    engram_layers = list(trace.layer_ids)
    if max(engram_layers) >= compute.layers:
        raise ArgumentError(f"Engram layer {max(engram_layers)} is beyond the {compute.layers} compute layers")
    if len(engram_layers) > 1 and run.second_start_layer > engram_layers[1]:
        raise ArgumentError(f"second_start_layer {run.second_start_layer} is after the second table's layer "
                            f"{engram_layers[1]}, which needs its rows")
    sim = _Prefill(trace, device, policy, compute, run, N)
    sim.go()
    return sim.result(time.perf_counter() - t_wall)


class _Prefill:
    """One prefill on simpy: a reader process per table, the compute process, their shared counters."""

    def __init__(self, trace: Trace, device: Device, policy: Policy, compute: Compute, run: PrefillRun, N: int):
        import simpy

        self.trace, self.device, self.policy, self.compute, self.run, self.N = trace, device, policy, compute, run, N
        self.creads = _chunk_reads(trace.rows[:N], run.chunk)
        self.nch = self.creads.shape[0]
        self.nub = -(-N // run.ubatch)
        dev_seed, comp_seed = np.random.SeedSequence(run.seed).spawn(2)
        layers = compute.layers
        self.per_token = compute.sample(np.random.default_rng(comp_seed), self.nub * layers).reshape(self.nub, layers)
        self.env = env = simpy.Environment()
        self.rec = Recorder()
        dev_rng = np.random.default_rng(dev_seed)
        self.dev = device.fast(dev_rng, self.rec, env=env) if run.mode == "fast" else device.exact(env, dev_rng,
                                                                                                    self.rec)
        self.engram_layers = list(trace.layer_ids)
        L = len(self.engram_layers)
        self.done = [0] * L                       # chunks finished per table (the published counter)
        self.waiters = [dict() for _ in range(L)]  # chunk index -> event
        self.reader_done = [0.0] * L
        self.reader_busy = [0.0] * L
        self.start_second = env.event()
        self.stall_by = [0.0] * L
        self.stalls = 0
        self.comp_total = run.hash_time * N
        self.bar = None

    def _chunk_event(self, j: int, c: int):
        ev = self.waiters[j].get(c)
        if ev is None:
            ev = self.waiters[j][c] = self.env.event()
        return ev

    def _reader(self, j: int, start_event):
        """Table ``j``'s reader (process): its chunks one batch after another, each published when done."""
        env, policy, dev, fast = self.env, self.policy, self.dev, self.run.mode == "fast"
        if start_event is not None:
            yield start_event
        for c in range(self.nch):
            n = int(self.creads[c, j])
            t0 = env.now
            if n:
                k = policy.concurrency(n)
                if k > 1 and policy.batch_overhead:
                    yield env.timeout(policy.batch_overhead)
                if fast:
                    yield dev.submit(n, k)
                else:
                    yield from dev.batch(n, k)
            self.reader_busy[j] += env.now - t0
            self.done[j] = c + 1
            ev = self.waiters[j].pop(c, None)
            if ev is not None:
                ev.succeed()
        self.reader_done[j] = env.now

    def _compute(self):
        """The layers (process): micro-batch by micro-batch, waiting at an Engram layer for its chunk's rows."""
        env, N, ubatch, chunk, layers = self.env, self.N, self.run.ubatch, self.run.chunk, self.compute.layers
        L = len(self.engram_layers)
        layer_of = {lid: j for j, lid in enumerate(self.engram_layers)}
        for u in range(self.nub):
            m = min(N, (u + 1) * ubatch) - u * ubatch
            need = (min(N, (u + 1) * ubatch) - 1) // chunk
            for layer in range(layers):
                if u == 0 and L > 1 and layer == self.run.second_start_layer and not self.start_second.triggered:
                    self.start_second.succeed()
                j = layer_of.get(layer)
                if j is not None and self.done[j] <= need:
                    t0 = env.now
                    yield self._chunk_event(j, need)
                    self.stall_by[j] += env.now - t0
                    self.stalls += 1
                dt = m * self.per_token[u, layer] / layers
                self.comp_total += dt
                yield env.timeout(dt)
            if self.bar is not None:
                self.bar.update(1)

    def _main(self):
        env = self.env
        if self.run.hash_time:
            yield env.timeout(self.run.hash_time * self.N)
        env.process(self._reader(0, None))
        for j in range(1, len(self.engram_layers)):
            env.process(self._reader(j, self.start_second if self.run.second_start_layer > 0 else None))
        yield env.process(self._compute())
        if not self.start_second.triggered:
            self.start_second.succeed()

    def go(self) -> None:
        """Run the prefill to its end."""
        run = self.run
        if run.progress:
            self.bar = progress_bar(self.nub, f"prefill ({run.mode})", "ubatch", mode=run.progress, delay=2.0)
        self.env.process(self._main())
        self.env.run()
        if self.bar is not None:
            self.bar.close()

    def _device_info(self, summ: dict, total: float, latency_sum: float) -> dict:
        rec = self.rec
        peak = self.device.peak_iops()
        reads_per_s = rec.reads / total if total > 0 else 0.0
        return {
            "name": self.device.name, "busy_fraction": summ["busy_fraction"],
            "mean_queue_depth": summ["mean_queue_depth"], "max_queue_depth": summ["max_queue_depth"],
            "reads_per_s": reads_per_s,
            "mean_read_latency_us": (latency_sum / rec.reads * 1e6) if rec.reads else 0.0,
            "iops_utilization": reads_per_s / peak if peak > 0 else 0.0,
        }

    def result(self, wall: float) -> PrefillResult:
        """The :class:`PrefillResult` of the finished run (``wall``: its wall-clock seconds)."""
        total, N, run, trace, lids = self.env.now, self.N, self.run, self.trace, self.engram_layers
        # Readers may outlive compute only when a table is never needed; the prefill ends with compute.
        s, e, lv = self.rec.arrays()
        t_end = max(total, float(e.max()) if e.size else 0.0)
        if run.mode == "fast":  # the shared fluid queue keeps the reads in the device (its boxes are levelless)
            q = self.dev.queue
            summ = summarize_counter((q.times, q.depths), t_end, run.bins)
            summ["busy_fraction"] = q.busy / t_end if t_end > 0 else 0.0
            summ["mean_queue_depth"] = q.area / t_end if t_end > 0 else 0.0
            latency_sum = q.area  # Little: the reads' summed time in the device
        else:
            summ = summarize_boxes(s, e, lv, t_end, run.bins)
            latency_sum = self.rec.latency_sum
        config = {
            "trace": {"source": trace.source, "steps": trace.steps}, "device": {"name": self.device.name,
                                                                                 "source": self.device.source},
            "policy": self.policy.to_dict(), "compute": self.compute.to_dict(), "chunk": run.chunk,
            "ubatch": run.ubatch, "second_start_layer": run.second_start_layer, "mode": run.mode, "seed": run.seed,
            "hash_time_s": run.hash_time, "chunks": self.nch, "ubatches": self.nub,
        }
        comp_total = self.comp_total
        return PrefillResult(
            tokens=N, prefill_seconds=total, compute_seconds=comp_total, stall_seconds=float(sum(self.stall_by)),
            stall_by_layer={lid: self.stall_by[j] for j, lid in enumerate(lids)}, stalls=self.stalls,
            reader_done={lid: self.reader_done[j] for j, lid in enumerate(lids)},
            reader_busy={lid: self.reader_busy[j] for j, lid in enumerate(lids)},
            reads=int(self.rec.reads), tokens_per_s=N / total if total > 0 else float("inf"),
            overhead=total / comp_total - 1 if comp_total > 0 else 0.0,
            device=self._device_info(summ, total, latency_sum), timeline=summ["timeline"], config=config,
            wall_seconds=wall,
            compute_realised=compute_stats(self.per_token),
        )
