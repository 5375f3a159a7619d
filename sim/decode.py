"""Decode model: sessions x steps reading Engram rows on a shared device (SPEC §8, §9).

Each session replays a :class:`~sim.trace.Trace` (session ``i`` of ``S`` starts
at step ``i * T // S`` and wraps around).  A step:

1. hashes its token (``hash_time``, default 0: 0.14 us measured, negligible);
2. reads its distinct rows that are not in the session's LRU row cache (when
   ``Policy.cache_rows > 0``): serially when fewer than ``threshold`` rows,
   otherwise ``readers`` concurrent preads (``backend="pread"``) or an
   io_uring ring of ``ring_depth`` (``backend="io_uring"``);
3. computes for a time drawn from :class:`Compute`.  With
   ``Policy.overlap_layers = m > 0`` only the first table is read before
   compute; the second table's read starts when the first completes and
   overlaps the first ``m`` of ``Compute.layers`` layers of compute.

Sessions share the device: a read's latency is drawn at the device's queue
depth (reads of every session in flight).  Compute does not contend (each
session has its own, or the compute model already includes batching).

Two modes: ``"fast"`` (each batch of reads is one service event drawn from
:meth:`sim.device.Device.batch_samples`), ``"exact"`` (every read is a simpy
event; for validation).  Runs are reproducible: one ``seed`` feeds every
random stream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np
from tqdm import tqdm

from engram.errors import ArgumentError

from .device import SEED_REFERENCE, Device, Recorder, load_device, summarize_boxes
from .params import Compute, Policy
from .schema import percentiles_ms as _percentiles_ms
from .trace import CODE_SOURCE, Trace, load_trace, lru_hits

__all__ = [
    "DecodeResult",
    "fit_compute",
    "percentiles_ms",
    "seed_reproduction",
    "session_reads",
    "simulate_decode",
]


# =====================================================================================
# results
# =====================================================================================
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
        per-step deduplication and the row cache).
    cache_hit_rate : float
        Share of row requests served by the row cache.
    device : dict
        ``name``, ``busy_fraction``, ``mean_queue_depth``, ``max_queue_depth``,
        ``reads_per_s``, ``mean_read_latency_us``, ``iops_utilization``
        (reads/s over the device's peak IOPS).
    timeline : dict
        ``t_s``, ``queue_depth``, ``busy``: per-bin means over the run.
    config : dict
        Every parameter of the run (policy, compute, sessions, steps, mode, seed, trace, device).
    sim_seconds, wall_seconds : float
        Simulated duration and the simulator's own run time.
    step_latencies : numpy.ndarray
        float64 ``[sessions, steps]`` seconds (not in :meth:`to_dict`).
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
            "device": self.device, "timeline": self.timeline, "config": self.config,
            "sim_seconds": self.sim_seconds, "wall_seconds": self.wall_seconds,
        }

    def summary(self) -> str:
        c = self.config
        lines = [
            f"decode  {c['sessions']} session(s) x {c['steps']} steps, device {self.device['name']}, "
            f"mode {c['mode']}, seed {c['seed']}",
            f"policy  threshold {c['policy']['threshold']}, {c['policy']['backend']} "
            f"x{c['policy']['readers'] if c['policy']['backend'] == 'pread' else c['policy']['ring_depth']}, "
            f"cache {c['policy']['cache_rows']} rows, overlap {c['policy']['overlap_layers']} layers; "
            f"compute {c['compute']['mean_ms']:.3f} ms ({c['compute']['dist']})",
            f"tokens/s  {self.tokens_per_s:.3f} overall, {self.mean_session_tokens_per_s:.3f} per session",
            "step ms   " + "  ".join(f"{k} {v:.3f}" for k, v in self.step_ms.items()),
            "stall ms  " + "  ".join(f"{k} {v:.3f}" for k, v in self.stall_ms.items()),
            f"reads     {self.reads} of {self.row_requests} requested (cache hit rate {self.cache_hit_rate:.4f})",
            f"device    busy {self.device['busy_fraction']:.3f}, mean qd {self.device['mean_queue_depth']:.2f}, "
            f"{self.device['reads_per_s']:.0f} reads/s ({self.device['iops_utilization']:.3f} of peak), "
            f"mean read {self.device['mean_read_latency_us']:.1f} us",
            f"simulated {self.sim_seconds:.3f} s in {self.wall_seconds:.2f} s",
        ]
        return "\n".join(lines)


# =====================================================================================
# reads per step
# =====================================================================================
def _distinct_per_layer(rows: np.ndarray) -> np.ndarray:
    """int64 ``[steps, layers]``: distinct row ids of each step and layer."""
    if rows.shape[0] == 0:
        return np.zeros(rows.shape[:2], dtype=np.int64)
    s = np.sort(rows, axis=2)
    return 1 + np.count_nonzero(np.diff(s, axis=2), axis=2)


def session_reads(trace: Trace, sessions: int, steps: int, cache_rows: int = 0):
    """Device reads of every session and step.

    Returns
    -------
    (reads, hits) : list of numpy.ndarray, int
        ``reads[s]`` is int64 ``[steps, layers]``: distinct rows of each table
        that session ``s`` must read at each step (after its LRU row cache);
        ``hits`` counts requests served by the caches.
    """
    T = trace.steps
    if T == 0:
        raise ArgumentError("the trace has no steps")
    out, hits = [], 0
    for s in range(sessions):
        idx = (s * T // sessions + np.arange(steps)) % T
        rows = trace.rows[idx]
        if cache_rows > 0:
            view = Trace(rows, trace.tokens[idx], np.zeros(1, dtype=np.int64), trace.layer_ids, trace.heads)
            h = lru_hits(view, cache_rows, per_sequence=False)
            hits += int(h.sum())
            # A row repeated within a step is a hit on its second request, so misses are distinct.
            out.append((~h).sum(axis=2).astype(np.int64))
        else:
            out.append(_distinct_per_layer(rows))
    return out, hits


# =====================================================================================
# the model
# =====================================================================================
def _fast_session(env, dev, reads, compute, policy: Policy, hash_time: float, layers: int,
                  lat: list, stall: list, tick, shared: bool):
    """One session in fast mode (generator).

    Alone on the device (``shared`` false) a step is a single timeout; with
    other sessions each batch is an event of the device's contention model.
    """
    width, thr, ovh = policy.width, policy.threshold, policy.batch_overhead
    m = min(policy.overlap_layers, layers)
    overlap = m > 0 and reads.shape[1] > 1
    n_all = reads.sum(axis=1).tolist()
    n_first = reads[:, 0].tolist()
    n_rest = (reads[:, 1:].sum(axis=1)).tolist()
    comp = compute.tolist()
    frac = m / layers
    timeout = env.timeout
    issue, submit = dev.issue, dev.submit

    def later(delay, n, k):
        yield timeout(delay)
        yield submit(n, k)

    for t in range(len(comp)):
        t0 = env.now
        c = comp[t]
        if hash_time:
            yield timeout(hash_time)
        if not overlap:
            n = n_all[t]
            if n:
                k = 1 if n < thr else (n if n < width else width)
                if k > 1 and ovh:
                    yield timeout(ovh)
                if shared:
                    yield submit(n, k)
                    yield timeout(c)
                else:
                    yield timeout(issue(env.now, n, k) + c)
            else:
                yield timeout(c)
        else:
            n1, n2 = n_first[t], n_rest[t]
            if n1:
                k = 1 if n1 < thr else (n1 if n1 < width else width)
                if k > 1 and ovh:
                    yield timeout(ovh)
                yield submit(n1, k) if shared else timeout(issue(env.now, n1, k))
            ca, cb = c * frac, c * (1 - frac)
            k = 1 if n2 < thr else (n2 if n2 < width else width)
            o2 = ovh if k > 1 else 0.0
            if not n2:
                yield timeout(c)
            elif shared:
                ev = env.process(later(o2, n2, k)) if o2 else submit(n2, k)
                yield timeout(ca)
                yield ev
                yield timeout(cb)
            else:
                io2 = o2 + issue(env.now + o2, n2, k)
                yield timeout(max(io2, ca) + cb)
        stall.append(env.now - t0 - c - hash_time)
        lat.append(env.now - t0)
        if tick is not None and (t & 1023) == 1023:
            tick(1024)
    if tick is not None:
        tick(len(comp) & 1023)


def _exact_session(env, dev, reads, compute, policy: Policy, hash_time: float, layers: int,
                   lat: list, stall: list, tick):
    """One session in exact (per-read) mode (generator)."""
    m = min(policy.overlap_layers, layers)
    overlap = m > 0 and reads.shape[1] > 1
    frac = m / layers
    ovh = policy.batch_overhead
    comp = compute.tolist()

    def read(n):
        k = policy.concurrency(n)
        if k > 1 and ovh:
            yield env.timeout(ovh)
        yield from dev.batch(n, k)

    for t in range(len(comp)):
        t0 = env.now
        c = comp[t]
        if hash_time:
            yield env.timeout(hash_time)
        if not overlap:
            n = int(reads[t].sum())
            if n:
                yield from read(n)
            yield env.timeout(c)
        else:
            n1, n2 = int(reads[t, 0]), int(reads[t, 1:].sum())
            if n1:
                yield from read(n1)
            p2 = env.process(read(n2)) if n2 else None
            yield env.timeout(c * frac)
            if p2 is not None:
                yield p2
            yield env.timeout(c * (1 - frac))
        lat.append(env.now - t0)
        stall.append(env.now - t0 - c - hash_time)
        if tick is not None and (t & 1023) == 1023:
            tick(1024)
    if tick is not None:
        tick(len(comp) & 1023)


def simulate_decode(trace: Union[Trace, str], device: Union[Device, str], policy: Policy = Policy(),
                    compute: Union[Compute, float] = 0.0, *, sessions: int = 1, steps: Optional[int] = None,
                    mode: str = "fast", seed: int = 0, hash_time: float = 0.0, start_spread: float = 0.0,
                    bins: int = 100, progress: bool = False) -> DecodeResult:
    """Simulate ``sessions`` concurrent decode sessions of ``steps`` tokens each.

    Parameters
    ----------
    trace : Trace or str
        Row ids per step (a source spec is loaded with :func:`sim.trace.load_trace`).
    device : Device or str
        The shared device (a spec is loaded with :func:`sim.device.load_device`).
    policy : Policy
        Read policy and row cache.
    compute : Compute or float
        Compute time per step (a float is a constant, seconds).
    sessions : int
        Concurrent sessions (>= 1).
    steps : int, optional
        Steps per session (default: the trace length; longer runs wrap around
        the trace, and a row cache then sees the repeat).
    mode : str
        ``"fast"`` or ``"exact"``.
    seed : int
        Seeds every random stream (device and per-session compute).
    hash_time : float
        Seconds per step for hashing (default 0).
    start_spread : float
        Session ``i`` starts at ``i * start_spread / sessions`` seconds (default 0:
        all together, which with constant compute keeps them in lockstep).
    bins : int
        Bins of the queue-depth timeline.
    progress : bool
        Show a progress bar (tqdm) when the run takes more than a couple of seconds.

    Returns
    -------
    DecodeResult

    Raises
    ------
    ArgumentError
        Bad sessions, steps, mode or parameters.
    """
    import simpy

    t_wall = time.perf_counter()
    if isinstance(trace, str):
        trace = load_trace(trace)
    device = load_device(device)
    if not isinstance(compute, Compute):
        compute = Compute(float(compute))
    if mode not in ("fast", "exact"):
        raise ArgumentError(f"mode must be 'fast' or 'exact', got {mode!r}")
    if sessions < 1:
        raise ArgumentError(f"sessions must be >= 1, got {sessions}")
    steps = trace.steps if steps is None else int(steps)
    if steps < 1:
        raise ArgumentError(f"steps must be >= 1, got {steps}")
    if hash_time < 0 or start_spread < 0:
        raise ArgumentError(f"hash_time and start_spread must be >= 0, got {hash_time}, {start_spread}")

    reads, hits = session_reads(trace, sessions, steps, policy.cache_rows)
    requests = sessions * steps * trace.layers * trace.columns
    ss = np.random.SeedSequence(seed)
    dev_seed, *sess_seeds = ss.spawn(1 + sessions)
    comp = [compute.sample(np.random.default_rng(s), steps) for s in sess_seeds]

    env = simpy.Environment()
    rec = Recorder()
    dev_rng = np.random.default_rng(dev_seed)
    dev = device.fast(dev_rng, rec, env=env) if mode == "fast" else device.exact(env, dev_rng, rec)
    body = _fast_session if mode == "fast" else _exact_session
    extra = (sessions > 1,) if mode == "fast" else ()
    lats = [[] for _ in range(sessions)]
    stalls = [[] for _ in range(sessions)]
    begin = [i * start_spread / sessions for i in range(sessions)]
    finish = [0.0] * sessions

    bar = None
    if progress:
        bar = tqdm(total=sessions * steps, unit="step", delay=2.0, desc=f"decode ({mode})", leave=False)
    tick = bar.update if bar is not None else None

    def run(i):
        if begin[i] > 0:
            yield env.timeout(begin[i])
        yield from body(env, dev, reads[i], comp[i], policy, hash_time, compute.layers, lats[i], stalls[i], tick,
                        *extra)
        finish[i] = env.now

    for i in range(sessions):
        env.process(run(i))
    env.run()
    if bar is not None:
        bar.close()

    makespan = env.now - min(begin)
    lat = np.asarray(lats, dtype=np.float64)
    st = np.maximum(np.asarray(stalls, dtype=np.float64), 0.0)
    s, e, lv = rec.arrays()
    summ = summarize_boxes(s, e, lv, makespan, bins)
    peak = device.peak_iops()
    reads_per_s = rec.reads / makespan if makespan > 0 else 0.0
    dev_info = {
        "name": device.name,
        "busy_fraction": summ["busy_fraction"],
        "mean_queue_depth": summ["mean_queue_depth"],
        "max_queue_depth": summ["max_queue_depth"],
        "reads_per_s": reads_per_s,
        "mean_read_latency_us": (rec.latency_sum / rec.reads * 1e6) if rec.reads else 0.0,
        "iops_utilization": reads_per_s / peak if peak > 0 else 0.0,
    }
    config = {
        "trace": {"source": trace.source, "steps": trace.steps, "wrapped": steps > trace.steps},
        "device": {"name": device.name, "source": device.source},
        "policy": policy.to_dict(), "compute": compute.to_dict(),
        "sessions": sessions, "steps": steps, "mode": mode, "seed": seed, "hash_time_s": hash_time,
        "start_spread_s": start_spread,
    }
    return DecodeResult(
        tokens_per_s=sessions * steps / makespan if makespan > 0 else float("inf"),
        tokens_per_s_per_session=[steps / (f - b) if f > b else float("inf") for f, b in zip(finish, begin)],
        step_ms=percentiles_ms(lat.reshape(-1)),
        stall_ms=percentiles_ms(st.reshape(-1)),
        row_requests=requests,
        reads=int(rec.reads),
        cache_hit_rate=hits / requests if requests else 0.0,
        device=dev_info,
        timeline=summ["timeline"],
        config=config,
        sim_seconds=makespan,
        wall_seconds=time.perf_counter() - t_wall,
        step_latencies=lat,
    )


def fit_compute(tokens_per_s: float, trace: Union[Trace, str], device: Union[Device, str],
                policy: Policy = Policy(), *, steps: Optional[int] = None, mode: str = "fast", seed: int = 0,
                hash_time: float = 0.0) -> float:
    """Constant compute time (seconds a step) that makes one session decode at ``tokens_per_s``.

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
    r = simulate_decode(trace, device, policy, Compute(0.0), sessions=1, steps=steps, mode=mode, seed=seed,
                        hash_time=hash_time)
    io = r.sim_seconds / r.config["steps"]
    c = 1.0 / tokens_per_s - io
    if c <= 0:
        raise ArgumentError(f"cannot reach {tokens_per_s} tokens/s: reads alone take {io * 1e3:.3f} ms a step")
    return c


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
    c = fit_compute(ref["serial_tokens_per_s"], trace, device, serial, steps=steps, mode=mode)
    r_serial = simulate_decode(trace, device, serial, Compute(c), steps=steps, mode=mode)
    r_conc = simulate_decode(trace, device, conc, Compute(c), steps=steps, mode=mode)
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
