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

from sim.device import Device, Recorder, load_device, summarize_boxes
from sim.core.params import Compute, Policy, compute_stats
from sim.core.progress import progress as progress_bar
from sim.trace import Trace, load_trace

__all__ = ["PrefillResult", "simulate_prefill"]


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


def simulate_prefill(trace: Union[Trace, str], device: Union[Device, str], policy: Policy = Policy(),
                     compute: Union[Compute, float] = 0.0, *, tokens: Optional[int] = None, chunk: int = 2048,
                     ubatch: Optional[int] = None, second_start_layer: int = 2, mode: str = "fast",
                     seed: int = 0, hash_time: float = 0.0, bins: int = 100, calibration=None,
                     progress: bool = False) -> PrefillResult:
    """Simulate the prefill of one prompt.

    Parameters
    ----------
    trace : Trace or str
        The prompt's row ids (its first ``tokens`` steps).
    device : Device or str
    policy : Policy
        Threshold and reader width for each chunk batch (cache and overlap are not used).
    compute : Compute or float
        Compute seconds per token through all ``Compute.layers`` layers.
    tokens : int, optional
        Prompt length (default the whole trace).
    chunk : int
        Tokens per reader chunk (2048 in the reference engine).
    ubatch : int, optional
        Tokens per compute micro-batch (default ``chunk``).
    second_start_layer : int
        Layer whose start (in the first micro-batch) starts the second table's
        reader; 0 starts both readers together.
    mode, seed, bins, progress
        As in :func:`sim.decode.simulate_decode`.
    hash_time : float
        Seconds per token for hashing the whole prompt up front.
    calibration : path or Calibration, optional
        For ``device="calibrated"`` (:func:`sim.device.load_device`).

    Raises
    ------
    ArgumentError
        Bad sizes or bins, or an Engram layer id beyond ``Compute.layers``.
    """
    import simpy

    t_wall = time.perf_counter()
    if isinstance(trace, str):
        trace = load_trace(trace, limit=tokens)
    device = load_device(device, calibration, backend=policy.backend)
    if not isinstance(compute, Compute):
        compute = Compute(float(compute))
    if mode not in ("fast", "exact"):
        raise ArgumentError(f"mode must be 'fast' or 'exact', got {mode!r}")
    N = trace.steps if tokens is None else int(tokens)
    if not 1 <= N <= trace.steps:
        raise ArgumentError(f"tokens must be in [1, {trace.steps}] (the trace length), got {tokens}")
    ubatch = chunk if ubatch is None else int(ubatch)
    if int(bins) < 1:
        raise ArgumentError(f"bins must be >= 1, got {bins}")
    if chunk < 1 or ubatch < 1 or second_start_layer < 0 or hash_time < 0:
        raise ArgumentError(f"need chunk >= 1, ubatch >= 1, second_start_layer >= 0, hash_time >= 0; "
                            f"got {chunk}, {ubatch}, {second_start_layer}, {hash_time}")
    layers = compute.layers
    engram_layers = list(trace.layer_ids)
    if max(engram_layers) >= layers:
        raise ArgumentError(f"Engram layer {max(engram_layers)} is beyond the {layers} compute layers")

    if len(engram_layers) > 1 and second_start_layer > engram_layers[1]:
        raise ArgumentError(f"second_start_layer {second_start_layer} is after the second table's layer "
                            f"{engram_layers[1]}, which needs its rows")
    creads = _chunk_reads(trace.rows[:N], chunk)
    nch = creads.shape[0]
    nub = -(-N // ubatch)
    ss = np.random.SeedSequence(seed)
    dev_seed, comp_seed = ss.spawn(2)
    per_token = compute.sample(np.random.default_rng(comp_seed), nub * layers).reshape(nub, layers)

    env = simpy.Environment()
    rec = Recorder()
    dev_rng = np.random.default_rng(dev_seed)
    dev = device.fast(dev_rng, rec, env=env) if mode == "fast" else device.exact(env, dev_rng, rec)

    L = len(engram_layers)
    done = [0] * L                       # chunks finished per table (the published counter)
    waiters = [dict() for _ in range(L)]  # chunk index -> event
    reader_done = [0.0] * L
    reader_busy = [0.0] * L
    start_second = env.event()

    def chunk_event(j, c):
        ev = waiters[j].get(c)
        if ev is None:
            ev = waiters[j][c] = env.event()
        return ev

    def reader(j, start_event):
        if start_event is not None:
            yield start_event
        for c in range(nch):
            n = int(creads[c, j])
            t0 = env.now
            if n:
                k = policy.concurrency(n)
                if k > 1 and policy.batch_overhead:
                    yield env.timeout(policy.batch_overhead)
                if mode == "fast":
                    yield dev.submit(n, k)
                else:
                    yield from dev.batch(n, k)
            reader_busy[j] += env.now - t0
            done[j] = c + 1
            ev = waiters[j].pop(c, None)
            if ev is not None:
                ev.succeed()
        reader_done[j] = env.now

    stall_by = [0.0] * L
    stalls = [0]
    comp_total = [hash_time * N]
    bar = None
    if progress:
        bar = progress_bar(nub, f"prefill ({mode})", "ubatch", mode=progress, delay=2.0)
    layer_of = {lid: j for j, lid in enumerate(engram_layers)}

    def compute_proc():
        for u in range(nub):
            m = min(N, (u + 1) * ubatch) - u * ubatch
            need = (min(N, (u + 1) * ubatch) - 1) // chunk
            for layer in range(layers):
                if u == 0 and L > 1 and layer == second_start_layer and not start_second.triggered:
                    start_second.succeed()
                j = layer_of.get(layer)
                if j is not None and done[j] <= need:
                    t0 = env.now
                    yield chunk_event(j, need)
                    stall_by[j] += env.now - t0
                    stalls[0] += 1
                dt = m * per_token[u, layer] / layers
                comp_total[0] += dt
                yield env.timeout(dt)
            if bar is not None:
                bar.update(1)

    def main():
        if hash_time:
            yield env.timeout(hash_time * N)
        procs = [env.process(reader(0, None))]
        for j in range(1, L):
            procs.append(env.process(reader(j, start_second if second_start_layer > 0 else None)))
        yield env.process(compute_proc())
        if not start_second.triggered:
            start_second.succeed()

    env.process(main())
    env.run()
    if bar is not None:
        bar.close()
    total = env.now
    # Readers may outlive compute only when a table is never needed; the prefill ends with compute.
    s, e, lv = rec.arrays()
    summ = summarize_boxes(s, e, lv, max(total, float(e.max()) if e.size else 0.0), bins)
    peak = device.peak_iops()
    reads_per_s = rec.reads / total if total > 0 else 0.0
    dev_info = {
        "name": device.name, "busy_fraction": summ["busy_fraction"],
        "mean_queue_depth": summ["mean_queue_depth"], "max_queue_depth": summ["max_queue_depth"],
        "reads_per_s": reads_per_s,
        "mean_read_latency_us": (rec.latency_sum / rec.reads * 1e6) if rec.reads else 0.0,
        "iops_utilization": reads_per_s / peak if peak > 0 else 0.0,
    }
    config = {
        "trace": {"source": trace.source, "steps": trace.steps}, "device": {"name": device.name,
                                                                             "source": device.source},
        "policy": policy.to_dict(), "compute": compute.to_dict(), "chunk": chunk, "ubatch": ubatch,
        "second_start_layer": second_start_layer, "mode": mode, "seed": seed, "hash_time_s": hash_time,
        "chunks": nch, "ubatches": nub,
    }
    return PrefillResult(
        tokens=N, prefill_seconds=total, compute_seconds=comp_total[0], stall_seconds=float(sum(stall_by)),
        stall_by_layer={lid: stall_by[j] for j, lid in enumerate(engram_layers)}, stalls=stalls[0],
        reader_done={lid: reader_done[j] for j, lid in enumerate(engram_layers)},
        reader_busy={lid: reader_busy[j] for j, lid in enumerate(engram_layers)},
        reads=int(rec.reads), tokens_per_s=N / total if total > 0 else float("inf"),
        overhead=total / comp_total[0] - 1 if comp_total[0] > 0 else 0.0,
        device=dev_info, timeline=summ["timeline"], config=config, wall_seconds=time.perf_counter() - t_wall,
        compute_realised=compute_stats(per_token),
    )
