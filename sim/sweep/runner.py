"""Running points: each through the decode simulator, in local processes or on a Dask cluster, surviving lost
workers, with every row handed over (and written) as soon as its point finishes.

Traces, devices and compute models are resolved once in the calling process
(:class:`Context`) and shipped to the workers, so the workers need neither
the tokenizer nor the data files.  A point's seed
(:func:`sim.sweep.study.point_seed`) depends only on the study and the point,
so the rows are the same whatever the runner, the order or the retries.

Lost workers
------------
- Local processes: a worker process that dies (killed by the system, out of
  memory) breaks the pool; the points in flight are run again in a new pool,
  each alone, so a point that kills its worker every time is told apart from
  the points that ran beside it.
- Dask: the context is a task of the graph (submitted with its data), not
  scattered data, so the scheduler recomputes it when the worker holding it
  dies; points whose futures are cancelled (``client.restart()``, a scheduler
  restart) or whose workers died too often (``KilledWorker``) are submitted
  again.

Either way a point runs at most ``attempts`` times (:data:`MAX_ATTEMPTS`)
before :class:`SweepError` names it; an error raised by a point itself (a bad
device) is not retried.

Workers die with their parent
-----------------------------
A local worker never outlives the process that started it (a sweep whose
parent was killed with SIGKILL left its ``multiprocessing`` spawn children
blocked on a pipe for good): it asks the kernel for SIGKILL when its parent
ends (Linux ``prctl(PR_SET_PDEATHSIG)``; the kernel sends it when the thread
that started the worker ends, and the pool's workers are started by the
thread that calls :meth:`PointRunner.run`, which holds the runner), and a
watchdog thread of its own ends it within :data:`PARENT_POLL_S` seconds of
``os.getppid()`` changing (every platform).  Ctrl-C belongs to the parent:
workers start with SIGINT blocked (the mask of the thread that starts them,
whose own KeyboardInterrupt waits until the worker is in the pool's list)
and ignore it from their first instruction of ours, so a Ctrl-C while they
start prints no traceback of theirs; the parent then ends every worker at
once (SIGTERM, SIGKILL after :data:`STOP_GRACE_S` seconds) instead of waiting
for their points.  The context reaches the workers through an unlinked
temporary file whose descriptor they inherit (:class:`_SharedContext`), not
through the pipe that starts them, so starting a worker never waits for it to
read megabytes of traces (nor holds Ctrl-C back meanwhile), and nothing of it
is left on disk whatever ends the sweep.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import contextlib
import ctypes
import mmap
import multiprocessing as mp
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from multiprocessing import reduction
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from engram.errors import ArgumentError, EngramError
from engram.rowcache import DEFAULT_POLICY

from sim.check.calibrate import Calibration, check_study_backends
from ..decode import DecodeRun, hot_rows, seed_reproduction, simulate_decode
from ..decode.host import HostCPU
from ..decode.reads import held_warnings
from ..device import load_device, load_tail
from sim.core.params import Compute, Policy, Storage
from sim.core.progress import progress as progress_bar
from sim.core.progress import progress_label
from sim.core.schema import SWEEP_SCHEMA
from ..trace import load_trace
from .study import (AXES, METRICS, PHASES_COLUMN, ROWS_A_STEP, Study, check_point, point_phases, point_seed,
                    point_trace)
from .table import TableWriter, partial_path, read_table, same_axis_value

__all__ = ["HOLD_WARNINGS", "MAX_ATTEMPTS", "PARENT_POLL_S", "STOP_GRACE_S", "Context", "PointRunner", "SweepError",
           "SweepResult", "check_points", "device_key", "point_host", "point_policy", "resolve_context", "resume_rows", "run_points", "run_study"]

#: Runs of one point whose worker died, before the sweep gives up on it.
MAX_ATTEMPTS = 3

#: Seconds between a worker's checks that its parent is still the one that started it.
PARENT_POLL_S = 0.5
#: Seconds a worker is given to end after SIGTERM when the parent stops the pool at once, before SIGKILL.
STOP_GRACE_S = 1.0
#: Linux ``prctl`` option: the signal a process receives when its parent ends.
_PR_SET_PDEATHSIG = 1

#: A task: (point index, the point's axis values, its seed).
Task = Tuple[int, Dict[str, Any], int]


class SweepError(EngramError, RuntimeError):
    """Points could not be run: their worker died :data:`MAX_ATTEMPTS` times (the message names them)."""


def device_key(p: Mapping[str, Any]) -> tuple:
    """Which resolved device a point uses: calibrated devices depend on the backend and the compute."""
    spec = p["device"]
    if spec == "calibrated" or spec.startswith("calibrated:"):
        return (spec, p["backend"], p["compute"])
    return (spec,)


@dataclass
class Context:
    """Everything the workers need, resolved once: traces by ``(spec, limit)``, devices, compute models."""

    traces: Dict[Tuple[str, int], Any]
    devices: Dict[tuple, Any]
    computes: Dict[str, Any]
    extras: Dict[str, Any] = None  # "tail:SPEC" -> device, "hot:FILE" -> hot set


def resolve_context(points: Sequence[Mapping[str, Any]], calibration: Optional[Path],
                    traces: Optional[Mapping[str, Any]] = None) -> Context:
    """Load every trace, device and compute model the points use.

    ``traces`` maps trace specs to loaded :class:`~sim.trace.Trace` objects to use instead of loading them
    (a report's traces, whose source may be gone); the point's ``trace_limit`` still applies.

    Raises
    ------
    ArgumentError, FormatError
        A device, trace or calibration that cannot be loaded; a calibrated device without a calibration; a host
        whose step of 48 reads asks more CPU than :data:`sim.decode.host.MAX_STEP_CPU_S`.
    """
    cal = None

    def need_cal(what: str):
        nonlocal cal
        if cal is None:
            if calibration is None:
                raise ArgumentError(f"{what} needs a calibration: give [study] calibration = FILE "
                                    "or --calibration FILE")
            cal = Calibration.load(calibration)
        return cal

    devices: Dict[tuple, Any] = {}
    loaded: Dict[str, Any] = {}
    hosts = set()
    for p in points:
        key = device_key(p)
        hk = (key,) + tuple(str(p.get(k)) for k in ("host_cpus", "host_step_us", "host_read_us", "host_sessions"))
        if hk in hosts:
            continue
        hosts.add(hk)
        if key in devices:
            _check_host(p, devices[key])
            continue
        spec = p["device"]
        if spec == "calibrated" or spec.startswith("calibrated:"):
            # this machine: the device of the point's backend (or the named one), with the batches
            # measured with the point's compute as think time where the calibration has them
            label = p["compute"].split(":", 1)[1] if p["compute"].startswith("calibrated:") else "none"
            devices[key] = load_device(spec, need_cal(f"device {spec!r}"), backend=p["backend"], compute=label)
        else:
            if spec not in loaded:
                loaded[spec] = load_device(spec)
            devices[key] = loaded[spec]
        _check_host(p, devices[key])
    computes: Dict[str, Any] = {}
    for spec in dict.fromkeys(p["compute"] for p in points):
        if spec == "reference":
            computes[spec] = Compute(seed_reproduction()["compute_ms"] * 1e-3)
        elif spec.startswith("calibrated:"):
            computes[spec] = need_cal(f"compute {spec!r}").compute_model(spec.split(":", 1)[1])
    given = dict(traces or {})
    out: Dict[Tuple[str, int], Any] = {}
    for spec, limit in dict.fromkeys((point_trace(p), p["trace_limit"]) for p in points):
        out[(spec, limit)] = given[spec].head(limit) if spec in given else load_trace(spec, limit=limit)
    extras: Dict[str, Any] = {}
    for p in points:
        if p["tail"] and f"tail:{p['tail']}" not in extras:
            extras[f"tail:{p['tail']}"] = load_tail(p["tail"])
        if p["dram_rows"] and f"hot:{p['dram_rows']}" not in extras:
            extras[f"hot:{p['dram_rows']}"] = hot_rows(p["dram_rows"])
    return Context(out, devices, computes, extras)


# =====================================================================================
# one point
# =====================================================================================
#: The :attr:`Context.extras` key that holds back the trace warnings of the points' runs (each result row is
#: the same; the caller says them once: :func:`sim.sweep.capacity.find_capacity` once per configuration).
HOLD_WARNINGS = "hold_warnings"


def point_policy(p: Mapping[str, Any]) -> Policy:
    """The :class:`~sim.core.params.Policy` of a complete point (its read policy and row cache axes)."""
    return Policy(threshold=p["threshold"], backend=p["backend"], readers=p["readers"],
                  cache_rows=p["cache_rows"], overlap_layers=p["overlap_layers"],
                  batch_overhead=p["batch_overhead_us"] * 1e-6, shared_cache_rows=p["shared_cache_rows"],
                  dram_fraction=p["dram_fraction"], shared_cache_bytes=p.get("shared_cache_bytes") or 0,
                  cache_policy=p.get("cache_policy") or DEFAULT_POLICY,
                  cache_warmup_steps=p.get("cache_warmup_steps") or 0)


def _check_host(p: Mapping[str, Any], device) -> None:
    """Refuse a point whose host (:func:`point_host`) asks more CPU a step of 48 reads than
    :data:`sim.decode.host.MAX_STEP_CPU_S` -- fio's CPU a read is known only once its device loads -- before a
    file is opened; the message names the point's host axes."""
    try:
        host = point_host(p, device)
        if host is not None:
            host.demand(ROWS_A_STEP)
    except ArgumentError as exc:
        axes = ", ".join(f"{k} = {p[k]!r}" for k in ("host_cpus", "host_step_us", "host_read_us", "host_sessions")
                         if p.get(k) is not None)
        raise ArgumentError(f"the point of device {p.get('device')!r} ({axes}): {exc}") from None


def point_host(p: Mapping[str, Any], device) -> Optional[HostCPU]:
    """The host of a complete point (its ``host_cpus``, ``host_step_us``, ``host_read_us`` and ``host_sessions``
    axes, the reads' CPU from ``device``'s fio figures where they are none: :meth:`sim.decode.host.HostCPU.for_device`); None
    when ``host_cpus`` is unset (the drive alone).  A study's compute is taken off the host's CPUs (an
    accelerator's time, no spin)."""
    def axis(name: str):  # unset: None, or an empty cell of a table read back
        v = p.get(name)
        return None if v is None or v == "" else float(v)

    if axis("host_cpus") is None:
        return None
    return HostCPU.for_device(axis("host_cpus"), device, step_cpu_us=axis("host_step_us"),
                              read_cpu_us=axis("host_read_us"), sessions=p.get("host_sessions") or "threads")


def _run_point(index: int, params: Dict[str, Any], seed: int, ctx: Context) -> Dict[str, Any]:
    """Simulate one point; returns the result row (axes, seed, metrics)."""
    p = params
    trace = ctx.traces[(point_trace(p), p["trace_limit"])]
    device = ctx.devices[device_key(p)]
    policy = point_policy(p)
    if p["compute"]:
        base = ctx.computes[p["compute"]]
        compute = Compute(base.mean, base.dist, base.cv, base.samples, p["layers"])
    else:
        compute = Compute(p["compute_ms"] * 1e-3, p["compute_dist"], p["compute_cv"], (), p["layers"])
    phases = point_phases(p)
    extras = ctx.extras or {}
    with held_warnings() if extras.get(HOLD_WARNINGS) else contextlib.nullcontext():
        r = simulate_decode(trace, device, policy, compute,
                            DecodeRun(sessions=p["sessions"], steps=p["steps"], mode=p["mode"], seed=seed,
                                      hash_time=p["hash_us"] * 1e-6, phases=phases, bins=4, timeline=False,
                                      host=point_host(p, device)),
                            storage=Storage(drives=p["drives"], hot=extras.get(f"hot:{p['dram_rows']}"),
                                            tail=extras.get(f"tail:{p['tail']}")))
    lat = r.step_latencies.reshape(-1)
    pct = np.percentile(lat, [50, 90, 99, 99.9])
    per = np.asarray(r.tokens_per_s_per_session, dtype=np.float64)
    out: Dict[str, Any] = {"point": index, **params, "seed": seed}
    out.update({
        "tokens_per_s": float(r.tokens_per_s),
        "session_tokens_per_s": float(per.mean()),
        "session_tokens_per_s_min": float(per.min()),
        "step_mean_ms": float(lat.mean()) * 1e3,
        "step_p50_ms": float(pct[0]) * 1e3,
        "step_p90_ms": float(pct[1]) * 1e3,
        "step_p99_ms": float(pct[2]) * 1e3,
        "step_p999_ms": float(pct[3]) * 1e3,
        "stall_mean_ms": float(r.stall_ms["mean"]),
        "compute_mean_ms": compute.mean * 1e3,
        "reads_per_step": r.reads / (p["sessions"] * p["steps"]),
        "cache_hit_rate": float(r.cache_hit_rate),
        "device_busy": float(r.device["busy_fraction"]),
        "mean_queue_depth": float(r.device["mean_queue_depth"]),
        "reads_per_s": float(r.device["reads_per_s"]),
        "iops_utilization": float(r.device["iops_utilization"]),
        "shared_cache_hit_rate": float(r.shared_cache_hit_rate),
        "dram_hit_rate": float(r.dram_hit_rate),
        "compute_realised_mean_ms": float(r.compute_realised["mean_ms"]),
        "compute_realised_cv": float(r.compute_realised["cv"]),
        "wrapped": int(bool(r.wrap["wrapped"])),
        "trace_steps": int(r.wrap["trace_steps"]),
        PHASES_COLUMN: r.phases,
    })
    return out


_WORKER_CTX: Optional[Context] = None


def _die_with_parent(parent: int) -> None:
    """End this process when ``parent`` (the pid that started it) ends: ``PR_SET_PDEATHSIG`` where the kernel
    has it, and a watchdog thread polling ``os.getppid()`` every :data:`PARENT_POLL_S` seconds everywhere."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the watchdog alone
            pass
    if os.getppid() != parent:  # the parent ended before the request was made
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="engram-parent-watch", daemon=True).start()


class _SharedContext:
    """The context pickled once into an unlinked temporary file; pickled for a spawned worker as the file's
    descriptor (``multiprocessing.reduction.DupFd``), which the worker maps and unpickles (:func:`_load_context`)."""

    def __init__(self, ctx: Context):
        self._file = tempfile.TemporaryFile(prefix="engram-sweep-context-")
        pickle.dump(ctx, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._file.flush()

    def __reduce__(self):
        return _load_context, (reduction.DupFd(self._file.fileno()),)

    def close(self) -> None:
        self._file.close()


def _load_context(dup) -> Context:
    """In a worker: the context from the inherited descriptor (mapped: the file offset is shared with the others)."""
    fd = dup.detach()
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
            return pickle.loads(m)
    finally:
        os.close(fd)


def _init_worker(ctx: Context, parent: int) -> None:
    """A local worker process: dies with ``parent``; keeps the context; Ctrl-C is the parent's to handle (the
    worker started with SIGINT blocked: ignored now, then unblocked, so one that came meanwhile is dropped)."""
    global _WORKER_CTX
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent(parent)
    _WORKER_CTX = ctx


@contextlib.contextmanager
def _sigint_blocked():
    """Ctrl-C held back meanwhile: SIGINT blocked in this thread, so that processes started here inherit the
    mask and a Ctrl-C while they start waits until they ignore it (:func:`_init_worker`); and, in the main
    thread, its Python handler deferred to the end of the block (another thread may receive the signal, and the
    handler would raise KeyboardInterrupt between a worker's start and its entry in the pool's list)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    caught: list = []
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
        else:
            handler = None
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
            if caught:
                handler(signal.SIGINT, None)  # KeyboardInterrupt, now that the worker is in the pool's list


def _local_task(point_fn: Callable, index: int, params: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """A task of a local worker: ``point_fn`` (a module-level function, sent by reference) on its context."""
    return point_fn(index, params, seed, _WORKER_CTX)


def _context_task(ctx: Context) -> Context:
    """The context as a task of the Dask graph: its data travels in the task, so a lost copy is recomputed."""
    return ctx


def _dask_task(point_fn: Callable, index: int, params: Dict[str, Any], seed: int, ctx: Context) -> Dict[str, Any]:
    return point_fn(index, params, seed, ctx)


# =====================================================================================
# runners
# =====================================================================================
class PointRunner:
    """Runs tasks ``(index, point, seed)`` in this process, in local processes or on a Dask cluster.

    Use as a context manager; :meth:`run` may be called several times (the capacity search does), reusing the
    processes or the cluster connection.

    Parameters
    ----------
    ctx : Context
        The traces, devices and compute models of every point it will run.
    jobs : int, optional
        Local worker processes (default: the CPU count; 1 runs in this process).
    scheduler : str, optional
        Address of a running Dask scheduler; the points then run on that cluster.
    connect_timeout : float
        Seconds to reach the scheduler.
    attempts : int
        Runs of a point whose worker died before :class:`SweepError`.

    Attributes
    ----------
    name : str
        ``"inline"``, ``"processes:N"`` or ``"dask:ADDRESS"``.
    lost : int
        Points run again because their worker died.
    point_fn : callable
        Runs one point, ``(index, params, seed, ctx) -> row``: a decode point here; a subclass names its own
        (:class:`sim.serve.ServeRunner`).  Module level, so worker processes and Dask find it by name.
    """

    point_fn = staticmethod(_run_point)

    def __init__(self, ctx: Context, *, jobs: Optional[int] = None, scheduler: Optional[str] = None,
                 connect_timeout: float = 30.0, attempts: int = MAX_ATTEMPTS, size: Optional[int] = None):
        self.ctx = ctx
        self.scheduler = scheduler
        self.connect_timeout = float(connect_timeout)
        self.attempts = int(attempts)
        if self.attempts < 1:
            raise ArgumentError(f"attempts must be >= 1, got {attempts}")
        jobs = int(jobs) if jobs else (os.cpu_count() or 1)
        if jobs < 1:
            raise ArgumentError(f"jobs must be >= 1, got {jobs}")
        self.jobs = jobs if size is None else max(1, min(jobs, int(size)))
        self.lost = 0
        #: Seconds each task ran, by task index (:meth:`run`).
        self.seconds: Dict[int, float] = {}
        self._pool: Optional[cf.ProcessPoolExecutor] = None
        self._shared: Optional[_SharedContext] = None
        self._client = None
        self._ctx_future = None
        if scheduler:
            self.name = f"dask:{scheduler}"
        else:
            self.name = "inline" if self.jobs == 1 else f"processes:{self.jobs}"

    # ------------------------------------------------------------ lifetime
    def __enter__(self) -> "PointRunner":
        if self.scheduler:
            self._connect()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(abort=exc_type is not None)

    def close(self, abort: bool = False) -> None:
        """Stop the worker processes (at once when ``abort``) or disconnect from the cluster."""
        if self._pool is not None:
            self._stop_pool(abort)
        if self._shared is not None:
            shared, self._shared = self._shared, None
            shared.close()
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the cluster may be gone; nothing to release then
                pass

    def _connect(self) -> None:
        try:
            from dask.distributed import Client
        except ModuleNotFoundError:
            raise ArgumentError("--scheduler needs dask.distributed: pip install 'dask[distributed]'") from None
        try:
            self._client = Client(self.scheduler, timeout=f"{self.connect_timeout}s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise ArgumentError(f"cannot reach the Dask scheduler at {self.scheduler!r}: {exc}") from None

    def _stop_pool(self, abort: bool) -> None:
        pool, self._pool = self._pool, None
        if not abort:
            pool.shutdown(wait=True)
            return
        # the points still running are not wanted: end the workers now instead of waiting for them (a worker
        # is in the pool's list once started: SIGINT is blocked while submit starts one)
        procs = dict(getattr(pool, "_processes", None) or {})
        for p in procs.values():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in procs.values():
            with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join(STOP_GRACE_S)
        pool.shutdown(wait=True, cancel_futures=True)  # its workers are gone: the manager thread ends at once

    # ------------------------------------------------------------ running
    def run(self, tasks: Sequence[Task], on_row: Callable[[Dict[str, Any]], None],
            more: Optional[Callable[[int], Sequence[Task]]] = None) -> None:
        """Run ``tasks``, calling ``on_row`` with each row as its point finishes (in completion order).

        ``more(free)``, called after the rows of each completion: tasks to run next (the next probes of searches
        that got their row), queued behind those waiting; ``free`` is the workers that would idle if no task
        came (local processes less the tasks running and waiting; 0 on a Dask cluster, whose size is not
        known); None when nothing more is wanted: the tasks still running or waiting are dropped (local
        workers running one are stopped).  The run ends then, or when no task runs, waits or comes.  The seconds each task ran (from its start to
        its row) are in :attr:`seconds`, by task index, before ``on_row`` gets its row.

        Raises
        ------
        SweepError
            A point whose worker died :attr:`attempts` times.
        EngramError
            An error of a point itself (not retried).
        """
        tasks = list(tasks)
        if not tasks:
            return
        if self.scheduler:
            self._run_dask(tasks, on_row, more)
        elif self.jobs == 1:
            pending = collections.deque(tasks)
            while pending:
                t = pending.popleft()
                t0 = time.perf_counter()
                row = self.point_fn(*t, self.ctx)
                self.seconds[t[0]] = time.perf_counter() - t0
                on_row(row)
                extra = more(1 - len(pending)) if more is not None else ()
                if extra is None:
                    return
                pending.extend(extra)
        else:
            self._run_local(tasks, on_row, more)

    def _charge(self, attempts: collections.Counter, lost: Sequence[Task], why: str) -> None:
        """Count one more lost run of each task; give up on those that ran out of attempts."""
        self.lost += len(lost)
        for t in lost:
            attempts[t[0]] += 1
        dead = sorted(t[0] for t in lost if attempts[t[0]] >= self.attempts)
        if dead:
            raise SweepError(f"point{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))}: {why} "
                             f"{self.attempts} times (killed by the system? out of memory?); not retried again")

    def _run_local(self, tasks: List[Task], on_row, more=None) -> None:
        """At most one task a worker in flight, so the tasks lost with a broken pool are the ones it was running;
        a task lost once then runs alone, so that a task that kills its worker is the only one charged."""
        pending = collections.deque(tasks)
        attempts: collections.Counter = collections.Counter()
        inflight: Dict[cf.Future, Task] = {}
        started: Dict[cf.Future, float] = {}
        while pending or inflight:
            if self._pool is None:
                if self._shared is None:
                    self._shared = _SharedContext(self.ctx)
                self._pool = cf.ProcessPoolExecutor(self.jobs, mp_context=mp.get_context("spawn"),
                                                    initializer=_init_worker, initargs=(self._shared, os.getpid()))
            while pending and len(inflight) < self.jobs:
                # a point that was in flight when a pool broke runs alone, so a second loss is its own
                if any(attempts[x[0]] for x in inflight.values()) or (attempts[pending[0][0]] and inflight):
                    break
                t = pending.popleft()
                with _sigint_blocked():  # submit starts the workers
                    f = self._pool.submit(_local_task, self.point_fn, *t)
                inflight[f], started[f] = t, time.perf_counter()
            done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            broken = [f for f in done if isinstance(f.exception(), cf.process.BrokenProcessPool)]
            if broken:  # the others fail with the pool: collect what finished before it broke
                cf.wait(inflight)
                done = set(inflight)
            lost = []
            now = time.perf_counter()
            for f in sorted(done, key=lambda f: inflight[f][0]):
                t = inflight.pop(f)
                self.seconds[t[0]] = now - started.pop(f)
                exc = f.exception()
                if exc is None:
                    on_row(f.result())
                elif isinstance(exc, cf.process.BrokenProcessPool):
                    lost.append(t)
                else:
                    raise exc
            if lost:
                self._stop_pool(abort=True)
                self._charge(attempts, lost, "its worker process died")
                pending.extendleft(reversed(lost))
            extra = more(self.jobs - len(inflight) - len(pending)) if more is not None else ()
            if extra is None:  # nothing more is wanted: the workers still running a task are stopped
                if inflight:
                    self._stop_pool(abort=True)
                return
            pending.extend(extra)

    def _context(self):
        """The context's future on the cluster, submitted again when it was cancelled or lost."""
        if self._ctx_future is None or self._ctx_future.status in ("cancelled", "lost", "error"):
            self._ctx_future = self._client.submit(_context_task, self.ctx, pure=False)
        return self._ctx_future

    def _run_dask(self, tasks: List[Task], on_row, more=None) -> None:
        from dask.distributed import KilledWorker, as_completed

        if self._client is None:
            self._connect()
        client = self._client
        attempts: collections.Counter = collections.Counter()
        owner: Dict[Any, Task] = {}
        started: Dict[Any, float] = {}
        ac = as_completed()

        def submit(t: Task) -> None:
            f = client.submit(_dask_task, self.point_fn, *t, self._context(), pure=False)
            owner[f], started[f] = t, time.perf_counter()
            ac.add(f)

        for t in tasks:
            submit(t)
        try:
            for f in ac:
                t = owner.pop(f)
                self.seconds[t[0]] = time.perf_counter() - started.pop(f)
                try:
                    row = f.result()
                except (asyncio.CancelledError, cf.CancelledError, KilledWorker) as exc:
                    why = "its worker died" if isinstance(exc, KilledWorker) else \
                        "its future was cancelled (workers restarted)"
                    self._charge(attempts, [t], why)
                    submit(t)
                    continue
                on_row(row)
                extra = more(0) if more is not None else ()
                if extra is None:
                    client.cancel(list(owner))
                    return
                for t in extra:
                    submit(t)
        except BaseException:
            client.cancel(list(owner))
            raise


def check_points(points: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Complete copies of ``points`` checked against the axes' ranges.

    Raises
    ------
    ArgumentError
        No points, a point without an axis, a value outside its range.
    """
    pts = [dict(p) for p in points]
    if not pts:
        raise ArgumentError("no points to run")
    for p in pts:
        missing = set(AXES) - set(p)
        if missing:
            raise ArgumentError(f"point lacks axis {sorted(missing)[0]!r}")
        check_point(p, "point")
    return pts


def run_points(points: Sequence[Mapping[str, Any]], study_seed: int = 0, *, calibration=None,
               jobs: Optional[int] = None, scheduler: Optional[str] = None, progress: Union[bool, str] = True,
               desc: str = "sweep", connect_timeout: float = 30.0,
               traces: Optional[Mapping[str, Any]] = None) -> Tuple[List[Dict[str, Any]], str]:
    """Simulate ``points`` (complete axis dicts, see :meth:`Study.points`); return ``(rows, runner)``.

    ``jobs`` local processes (default: the CPU count; 1 runs in this process),
    or the Dask cluster at ``scheduler`` (``tcp://host:port``) when given
    (``connect_timeout`` seconds to reach it).  ``traces``: loaded traces by
    spec (see :func:`resolve_context`).  ``progress``: ``True``/``"auto"``,
    ``"lines"``, ``False`` (:mod:`sim.core.progress`).  Rows come back in point
    order whatever the runner; each point's seed is
    ``point_seed(study_seed, point)``.

    Raises
    ------
    ArgumentError
        Bad points, an unreachable scheduler, or a device, trace or calibration
        that cannot be loaded.
    SweepError
        A point whose worker died :data:`MAX_ATTEMPTS` times.
    """
    pts = check_points(points)
    seeds = [point_seed(study_seed, p) for p in pts]
    ctx = resolve_context(pts, Path(calibration) if calibration else None, traces)
    rows: List[Optional[Dict[str, Any]]] = [None] * len(pts)
    with progress_bar(len(pts), desc, "point", mode=progress) as bar, \
            PointRunner(ctx, jobs=jobs, scheduler=scheduler, connect_timeout=connect_timeout,
                        size=len(pts)) as runner:
        def keep(row: Dict[str, Any]) -> None:
            rows[row["point"]] = row
            bar.update(1, f"point {row['point']}")

        runner.run([(i, p, s) for i, (p, s) in enumerate(zip(pts, seeds))], keep)
    return [r for r in rows if r is not None], runner.name


# =====================================================================================
# studies
# =====================================================================================
@dataclass
class SweepResult:
    """The table of a study run.

    Attributes
    ----------
    study : Study
    rows : list of dict
        One per point, in point order: ``point``, every axis, ``seed``, every metric of :data:`METRICS`, and
        the session phases it ran with (``phases_run``, :data:`PHASES_COLUMN`).
    seconds : float
        Wall time of the run.
    runner : str
        ``"processes:N"``, ``"inline"`` or ``"dask:ADDRESS"``.
    resumed : int
        Rows taken from an earlier, unfinished run of the same study (``resume=True``).
    lost : int
        Point runs lost with their worker and run again.
    table : Path or None
        Where the table was written.
    """

    study: Study
    rows: List[Dict[str, Any]]
    seconds: float
    runner: str
    resumed: int = 0
    lost: int = 0
    table: Optional[Path] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> List[str]:
        return ["point", *AXES, "seed", *METRICS, PHASES_COLUMN]

    @property
    def complete(self) -> bool:
        return len(self.rows) == len(self.study.points())

    def meta(self) -> dict:
        return {"kind": "sweep", "schema": SWEEP_SCHEMA, "study": self.study.to_dict(),
                "study_fingerprint": self.study.fingerprint(), "axes": self.study.axes(), "columns": self.columns,
                "metrics": METRICS, "axis_labels": {k: v[2] for k, v in AXES.items()},
                "points": len(self.study.points()), "seconds": self.seconds, "runner": self.runner,
                "resumed": self.resumed, "lost_runs": self.lost, **self.extra}

    def write(self, path: Union[str, os.PathLike]) -> Path:
        """Write the table (``.csv`` or ``.parquet``) and ``PATH.meta.json`` beside it; return the table's path.

        Raises
        ------
        OutputError
        """
        w = TableWriter(path, self.columns, self.meta(), len(self.study.points()), self.rows)
        return w.finish()


def resume_rows(study: Study, path: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """The finished rows of an earlier run of ``study`` in the table at ``path`` (none when there is no table).

    Rows cut short (a run killed while writing one) are left out and run again.  Each row's axes hold the
    study's own values (an unset axis None, not the empty cell it was read back as; a string axis a string),
    so that resumed rows group with new ones wherever rows are grouped by axis values.

    Raises
    ------
    ArgumentError
        The table belongs to another study (names the point and axis that differ).
    FormatError
        The table cannot be read.
    """
    path = Path(path)
    if not (path.is_file() or partial_path(path).is_file()):
        return []
    rows, meta = read_table(path)
    name = (meta.get("study") or {}).get("name")
    if meta.get("study_fingerprint") not in (None, study.fingerprint()):
        raise ArgumentError(f"{path}: written by another study ({name!r}, other points or seed) than "
                            f"{study.source} ({study.name!r}); give another --out, or drop --resume")
    pts = study.points()
    keep: Dict[int, Dict[str, Any]] = {}
    for r in rows:
        i = r.get("point")
        if not isinstance(i, int) or not 0 <= i < len(pts):
            raise ArgumentError(f"{path}: a row of point {i!r}, but {study.source} has points 0..{len(pts) - 1}")
        if any(not isinstance(r.get(m), (int, float)) or isinstance(r.get(m), bool) for m in METRICS) \
                or not isinstance(r.get("seed"), int):
            continue  # cut short
        for a in AXES:
            if not same_axis_value(r.get(a), pts[i][a]):
                raise ArgumentError(f"{path}: point {i} has {a} = {r.get(a)!r}, but in {study.source} it has "
                                    f"{pts[i][a]!r}: a table of another study")
        if r["seed"] != point_seed(study.seed, pts[i]):
            raise ArgumentError(f"{path}: point {i} ran with seed {r['seed']}, not the study's: another study seed")
        keep[i] = {**r, **{a: pts[i][a] for a in AXES}}  # the study's values, as a new row holds them
    return [keep[i] for i in sorted(keep)]


def _points_to_run(study: Study, cal: Optional[Path], out, resume: bool) -> Tuple[list, list, list]:
    """The study's points (checked, and against the calibration's backends before any simulation
    runs), the rows an earlier run finished (``resume``), and the (index, point, seed) still to run."""
    if resume and out is None:
        raise ArgumentError("resume needs the table of the earlier run (out)")
    pts = check_points(study.points())
    if cal is not None:
        check_study_backends(cal, pts, where=str(study.source))
    seeds = [point_seed(study.seed, p) for p in pts]
    done = resume_rows(study, out) if resume else []
    have = {r["point"] for r in done}
    return pts, done, [(i, p, s) for i, (p, s) in enumerate(zip(pts, seeds)) if i not in have]


def run_study(study: Union[Study, str, os.PathLike], *, jobs: Optional[int] = None, scheduler: Optional[str] = None,
              calibration: Union[str, os.PathLike, None] = None, progress: Union[bool, str] = True,
              out: Union[str, os.PathLike, None] = None, connect_timeout: float = 30.0, resume: bool = False,
              attempts: int = MAX_ATTEMPTS) -> SweepResult:
    """Run every point of a study, writing each row to ``out`` as it finishes.

    Parameters
    ----------
    study : Study or path
        A :class:`Study` or a study TOML file.
    jobs : int, optional
        Local worker processes (default: the CPU count; 1 runs inline).  They are spawned, so each imports the
        calling script: from a script, call this under ``if __name__ == "__main__":`` unless ``jobs=1``
        (see :func:`sim.sweep.capacity.run_capacity`).
    scheduler : str, optional
        Address of a running Dask scheduler (``tcp://host:port``); the points
        then run on that cluster (``dask.distributed``).
    connect_timeout : float
        Seconds to reach the scheduler.
    calibration : path, optional
        Calibration file for ``calibrated`` devices and computes (overrides the study's).
    progress : bool or str
        ``True``/``"auto"``: a bar on a terminal, plain periodic lines elsewhere; ``"lines"``; ``False``.
    out : path, optional
        The table (``.csv`` or ``.parquet``) and ``OUT.meta.json``: rows are appended as their points
        finish (``"complete": false`` with the missing points) and the table is rewritten in point order
        at the end.  An interrupted run (Ctrl-C, a lost machine, an error) leaves its finished rows.
    resume : bool
        Take the finished rows of an earlier run of the same study from ``out`` and run only the others.
    attempts : int
        Runs of a point whose worker died before giving up (:class:`SweepError`).

    Returns
    -------
    SweepResult
        Rows identical, for the same study, whatever the runner, the retries or the resumptions.

    Raises
    ------
    ArgumentError, FormatError
        A bad study, device, trace or calibration; ``resume`` on a table of another study.
    OutputError
        ``out`` cannot be written (names the path).
    SweepError
        A point whose worker died ``attempts`` times.
    KeyboardInterrupt
        Interrupted; the finished rows are in ``out``.
    """
    if not isinstance(study, Study):
        study = Study.load(study)
    cal = Path(calibration) if calibration else study.calibration
    t0 = time.perf_counter()
    pts, done, todo = _points_to_run(study, cal, out, resume)
    ctx = resolve_context([t[1] for t in todo] or pts[:1], cal)
    res = SweepResult(study, [], 0.0, "", resumed=len(done))
    writer = TableWriter(out, res.columns, res.meta(), len(pts), done) if out is not None else None
    rows: Dict[int, Dict[str, Any]] = {r["point"]: r for r in done}
    runner = PointRunner(ctx, jobs=jobs, scheduler=scheduler, connect_timeout=connect_timeout, attempts=attempts,
                         size=len(todo))
    bar = progress_bar(len(pts), progress_label("sweep", study.name), "point", mode=progress, initial=len(done))

    def keep(row: Dict[str, Any]) -> None:
        rows[row["point"]] = row
        if writer is not None:
            writer.add(row)
        bar.update(1, f"point {row['point']} ({', '.join(f'{a}={row[a]}' for a in study.axes())})")

    try:
        with runner:
            runner.run(todo, keep)
    except BaseException:
        bar.close()
        if writer is not None:
            writer.close(runner=runner.name, lost_runs=runner.lost, seconds=time.perf_counter() - t0)
        raise
    bar.close()
    res.rows = [rows[i] for i in sorted(rows)]
    res.seconds, res.runner, res.lost = time.perf_counter() - t0, runner.name, runner.lost
    if writer is not None:
        res.table = writer.finish(**res.meta())
    return res
