"""Measured runs of the real engine: decode loops over real traces, and microbenchmarks (SPEC §8, §9).

Two kinds of measurement, written to two separate files so that the
calibration (:mod:`sim.calibrate`) can be shown never to read the runs it is
checked against (:mod:`sim.crosscheck`):

``microbench.json`` (:func:`io_microbench`, :func:`fio_microbench`, :func:`compute_microbench`)
    - the engine's own reads by queue depth: :class:`engram.TableGroup` batches
      of uniformly random rows of both tables, 48 rows a batch (a decode step's
      size) and large batches (steady state), at ``readers`` = ring depth = the
      queue depth, per backend; 48-row batches and single rows read serially;
    - the same 48-row batches with a compute spec of the grid run on each
      batch's rows before the next batch (think time), at the readers (or
      serially) as the configurations with that compute use them;
    - ``fio`` random 4 KiB reads with ``--direct=1`` by queue depth (when fio is
      installed);
    - the compute of a step (projection + gated add of every Engram layer for
      one token, and/or the emulated extra compute) on rows read at random;
    - the hash part of a step (:meth:`engram.Session.step_rows`).
``runs.json`` (:func:`decode_run`)
    the real decode loop over a stretch of a real trace: per step ``session.step(token)``
    (hash, one concurrent batch of 48 rows over both tables, decode), then the
    step's compute, each timed with ``time.perf_counter``; tokens/s over the
    wall time of the loop.  A grid of configurations (trace x threshold x
    backend x readers x compute) is run in ``rounds`` rounds; each round runs
    every microbenchmark task and every configuration once, all in one seeded
    shuffled order (so repeats are interleaved, and the microbenchmarks and
    the runs sample the same stretches of a shared machine's load).  Every run
    reads its own stretch of its trace (:func:`segments`): no run re-reads the
    rows of another, which a virtual disk's host cache would serve faster than
    the fresh random rows of the microbenchmarks.

The rest of the model's layers (attention, experts) does not exist here: the
step's compute is the Engram projection and gated add (``mixer``), optionally
plus an emulated load (``spin:MS`` busy-waits, ``sleep:MS`` sleeps, ``blas:N``
runs N fixed 256x256 float32 matrix products), or nothing (``none``: the step
is the read alone).  Compute specs combine with ``+`` (``mixer+spin:5``).

JSON schema (all times in microseconds unless named otherwise)
--------------------------------------------------------------
``microbench.json``::

    {"schema": "engram.microbench/1", "kind": "microbench", "date": ISO-8601,
     "machine": {...}, "file": {path, size, tables: [{layer, offset, rows}], direct},
     "params": {...},
     "records": [
       {"kind": "io", "tool": "engine", "backend": "serial"|"pread"|"io_uring", "qd": k,
        "batch_rows": 48, "round": r, "batch_us": [per-batch times], "rows": n, "reads": n},
       {"kind": "io", "tool": "engine", "backend": ..., "qd": k, "batch_rows": B, "round": r,
        "batches": n, "rows": n, "reads": n, "wall_s": s, "reads_per_s": x},     # large batches
       {"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": 1, "round": r,
        "batch_us": [single-row read times]},
       {"kind": "io", "tool": "engine", "backend": "serial"|"pread"|"io_uring", "qd": k, "batch_rows": 48,
        "think": "spin:2"|"mixer"|..., "round": r, "batch_us": [...], "think_us": [...]},  # compute between
                                                                                         # batches
       {"kind": "io", "tool": "fio", "qd": k, "round": r, "iops": x, "mean_us": m,
        "pNN_us": ..., "cmd": "fio ..."},
       {"kind": "compute", "compute": "mixer"|"spin:2"|..., "round": r, "samples_us": [...]},
       {"kind": "hash", "round": r, "samples_us": [...]}]}
    # every record also has "background": {"cpu": share of all CPUs used by other processes,
    #   "steal", "disk_iops": other requests a second on the model's device, "seconds", "attempt"}

``runs.json``::

    {"schema": "engram.decode-runs/1", "kind": "decode_runs", "date", "machine", "file", "params",
     "configs": [{"key", "trace", "trace_label", "threshold", "backend", "readers", "compute",
                  "steps", "serial"}],
     "traces": {trace: "traces/NAME.npz"},                  # the traces the runs read (Trace.save)
     "runs": [{"config": key, "round": r, "order": i, "start": first trace step, "steps": n, "wall_s": s,
               "tokens_per_s": x,
               "step_ms": {mean, p50, p90, p95, p99, max}, "read_ms": {...}, "compute_ms": {...},
               "concurrent_steps": n, "rows_distinct_mean": x, "reads": n, "rows_match": bool,
               "background": {"cpu", "steal", "disk_iops", "seconds", "attempt"},
               "step_us": [...], "read_us": [...], "compute_us": [...]}]}
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from .io import load_json, now_iso, write_json
from .trace import CODE_SOURCE, Trace, load_trace

__all__ = [
    "DEFAULT_TRACES",
    "DEFAULT_POLICIES",
    "DEFAULT_SCALE",
    "MICRO_SCHEMA",
    "RUNS_SCHEMA",
    "ComputeSpec",
    "RunConfig",
    "compute_microbench",
    "Background",
    "decode_run",
    "segments",
    "trace_tokens_needed",
    "default_grid",
    "ensure_model",
    "fio_microbench",
    "grid",
    "hash_microbench",
    "io_microbench",
    "load_json",
    "machine_info",
    "measure",
    "quick_grid",
    "trace_label",
]

MICRO_SCHEMA = "engram.microbench/1"
RUNS_SCHEMA = "engram.decode-runs/1"

#: Several real texts and source code: an Italian novel, a long English system prompt of a
#: coding agent, 100 short prompts (each its own sequence), and Python source.
DEFAULT_TRACES = ("shared:promessi_sposi.txt", "shared:agent_prompt_long.txt", "shared:prompts.jsonl", CODE_SOURCE)
#: Layout scale of the measured model file: two tables of 7.68 M rows (2.03 GB each).
DEFAULT_SCALE = 0.02
#: Queue depths of the I/O microbenchmarks.
DEFAULT_DEPTHS = (1, 2, 4, 8, 16, 32, 64)
#: Rows of one decode step (2 layers x 24 columns).
STEP_ROWS = 48

US = 1e-6


# =====================================================================================
# configurations
# =====================================================================================
def trace_label(spec: str) -> str:
    """A short name for a trace source: ``shared:promessi_sposi.txt`` -> ``promessi_sposi``."""
    body = spec.split(":", 1)[1] if ":" in spec and not os.path.exists(spec) else spec
    return Path(body).stem or body


@dataclass(frozen=True)
class ComputeSpec:
    """The compute of one decode step: the Engram mixer and/or an emulated load.

    Written ``none``, ``mixer``, ``spin:MS``, ``sleep:MS``, ``blas:N`` or a
    ``+``-joined combination (``mixer+spin:5``).

    Attributes
    ----------
    mixer : bool
        Project the rows of every Engram layer and gate-add them into a
        residual (:meth:`engram.Session.apply`, SPEC §7).
    extra : tuple of (kind, amount)
        Emulated loads run after the mixer: ``("spin", ms)`` busy-waits,
        ``("sleep", ms)`` sleeps, ``("blas", n)`` runs ``n`` 256x256 float32
        matrix products.
    """

    mixer: bool = False
    extra: tuple = ()

    @classmethod
    def parse(cls, text: str) -> "ComputeSpec":
        """Parse a compute spec.

        Raises
        ------
        ArgumentError
            An unknown part or a bad amount (names it).
        """
        if not isinstance(text, str) or not text.strip():
            raise ArgumentError(f"compute spec must be a non-empty string, got {text!r}")
        mixer, extra = False, []
        for part in text.strip().split("+"):
            part = part.strip()
            if part == "none":
                continue
            if part == "mixer":
                mixer = True
                continue
            kind, _, amount = part.partition(":")
            if kind not in ("spin", "sleep", "blas") or not amount:
                raise ArgumentError(f"compute spec {text!r}: unknown part {part!r} "
                                    "(use none, mixer, spin:MS, sleep:MS, blas:N)")
            try:
                v = float(amount)
            except ValueError:
                raise ArgumentError(f"compute spec {text!r}: {amount!r} is not a number") from None
            if not (v >= 0 and np.isfinite(v)) or (kind == "blas" and v != int(v)):
                raise ArgumentError(f"compute spec {text!r}: bad amount {amount!r}")
            extra.append((kind, int(v) if kind == "blas" else v))
        return cls(mixer, tuple(extra))

    @property
    def label(self) -> str:
        """Canonical text of the spec (``parse(label) == self``)."""
        parts = ["mixer"] if self.mixer else []
        parts += [f"{k}:{a:g}" for k, a in self.extra]
        return "+".join(parts) or "none"

    def __str__(self) -> str:
        return self.label

    def runner(self, model=None, session=None, residual_seed: int = 0) -> Callable[[Mapping[int, np.ndarray]], None]:
        """A callable ``run(rows)`` doing this compute on one step's rows (``{layer_id: float32 [24, 256]}``).

        ``model`` and ``session`` are needed for the mixer (weights must be
        loaded beforehand: :meth:`engram.EngramModel.weights`).  The mixer's
        residual is a seeded bf16-valued random ``[1, 4, 5120]`` array, reset
        before every call (the real residual comes from layers that do not run
        here).
        """
        steps: List[Callable] = []
        if self.mixer:
            if model is None or session is None:
                raise ArgumentError("the mixer compute needs a model and a session")
            from engram.codec import bf16_round

            w = model.weights(model.layer_ids[0])
            streams = w.q_norm.shape[0]
            width = w.q_norm.shape[1]
            base = bf16_round(np.random.default_rng(residual_seed).standard_normal((1, streams, width))
                              .astype(np.float32))
            res = base.copy()
            lids = tuple(model.layer_ids)
            apply = session.apply

            def mix(rows):
                np.copyto(res, base)
                for lid in lids:
                    apply(lid, res, rows[lid][None])

            steps.append(mix)
        for kind, amount in self.extra:
            if kind == "spin":
                steps.append(_spinner(amount * 1e-3))
            elif kind == "sleep":
                steps.append(_sleeper(amount * 1e-3))
            else:
                steps.append(_blas(int(amount), residual_seed))
        if not steps:
            return _nothing
        if len(steps) == 1:
            return steps[0]

        def run(rows):
            for f in steps:
                f(rows)

        return run


def _nothing(rows) -> None:
    return None


def _spinner(seconds: float):
    clock = time.perf_counter

    def spin(rows):
        end = clock() + seconds
        while clock() < end:
            pass

    return spin


def _sleeper(seconds: float):
    def sleep(rows):
        time.sleep(seconds)

    return sleep


def _blas(n: int, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    c = np.empty((256, 256), np.float32)

    def blas(rows):
        for _ in range(n):
            np.matmul(a, b, out=c)

    return blas


@dataclass(frozen=True)
class RunConfig:
    """One measured configuration: a trace, a read policy and a compute.

    Attributes
    ----------
    trace : str
        Trace source spec (see :func:`sim.trace.load_trace`).
    threshold : int
        Distinct rows from which a batch is read concurrently (SPEC §8).
    backend : str
        ``pread`` or ``io_uring``.
    readers : int
        pread readers or io_uring ring depth.
    compute : str
        Compute spec (:class:`ComputeSpec`), canonical label.
    steps : int
        Decode steps (the first ``steps`` tokens of the trace).
    """

    trace: str
    threshold: int
    backend: str
    readers: int
    compute: str = "none"
    steps: int = 300

    def __post_init__(self) -> None:
        if self.backend not in ("pread", "io_uring"):
            raise ArgumentError(f"backend must be 'pread' or 'io_uring', got {self.backend!r}")
        if self.threshold < 1 or self.readers < 1 or self.steps < 1:
            raise ArgumentError(f"threshold, readers and steps must be >= 1, got "
                                f"{self.threshold}, {self.readers}, {self.steps}")
        object.__setattr__(self, "compute", ComputeSpec.parse(self.compute).label)

    @property
    def serial(self) -> bool:
        """True when no decode step reaches the threshold (48 rows a step): readers and backend do not matter."""
        return self.threshold > STEP_ROWS

    @property
    def key(self) -> str:
        """Unique name: ``trace/tTHRESHOLD/BACKEND/rREADERS/COMPUTE/STEPS``."""
        return f"{trace_label(self.trace)}/t{self.threshold}/{self.backend}/r{self.readers}/{self.compute}/{self.steps}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(key=self.key, trace_label=trace_label(self.trace), serial=self.serial)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunConfig":
        try:
            return cls(str(d["trace"]), int(d["threshold"]), str(d["backend"]), int(d["readers"]),
                       str(d.get("compute", "none")), int(d.get("steps", 300)))
        except KeyError as exc:
            raise FormatError(f"run configuration: missing field {exc}") from None

    @classmethod
    def parse(cls, text: str, steps: int = 300) -> "RunConfig":
        """From ``TRACE/THRESHOLD/BACKEND/READERS[/COMPUTE[/STEPS]]``.

        Raises
        ------
        ArgumentError
            Wrong number of fields or bad values (names the text).
        """
        # The trace spec may itself hold '/': take the fields from the right.
        fields = text.split("/")
        for n_tail in (5, 4, 3):
            if len(fields) <= n_tail:
                continue
            tail, head = fields[-n_tail:], "/".join(fields[:-n_tail])
            if tail[0].isdigit() and tail[1] in ("pread", "io_uring") and tail[2].isdigit():
                if n_tail == 5 and not tail[4].isdigit():
                    continue
                return cls(head, int(tail[0]), tail[1], int(tail[2]), tail[3] if n_tail >= 4 else "none",
                           int(tail[4]) if n_tail == 5 else steps)
        raise ArgumentError(f"configuration {text!r}: expected TRACE/THRESHOLD/BACKEND/READERS[/COMPUTE[/STEPS]]")


def grid(traces: Sequence[str], thresholds: Sequence[int], backends: Sequence[str], readers: Sequence[int],
         computes: Sequence[str], steps: int = 300,
         compute_steps: Optional[Mapping[str, int]] = None) -> List[RunConfig]:
    """The product of the axes, without duplicates.

    A serial configuration (threshold above 48 rows a step) does not depend
    on the backend or the readers: it appears once per trace and compute, with
    the first backend and readers given.  ``compute_steps`` maps a compute
    label to its step count (e.g. fewer steps for the slow mixer).
    """
    out, seen = [], set()
    for tr in traces:
        for comp in computes:
            label = ComputeSpec.parse(comp).label
            n = int((compute_steps or {}).get(label, steps))
            for thr in thresholds:
                for be in backends:
                    for k in readers:
                        c = RunConfig(tr, int(thr), be, int(k), label, n)
                        if c.serial:
                            c = RunConfig(tr, int(thr), backends[0], int(readers[0]), label, n)
                        if c.key not in seen:
                            seen.add(c.key)
                            out.append(c)
    return out


#: Read policies of the default grid: serial (threshold 256), threshold 8 with pread or io_uring x 4 or 16.
DEFAULT_POLICIES = ((256, "pread", 4), (8, "pread", 4), (8, "pread", 16), (8, "io_uring", 4), (8, "io_uring", 16))


def default_grid(steps: int = 200, io_steps: int = 800, mixer_steps: int = 30,
                 prompt_steps: int = 100) -> List[RunConfig]:
    """The default measured grid: 29 configurations.

    - compute ``spin:2`` (a step's other work as a 2 ms busy wait, about the
      read time: reads are 35-65% of a step), ``steps`` steps: the Italian
      novel, the agent prompt and Python source x the 5 policies of
      :data:`DEFAULT_POLICIES` (15);
    - no compute (a step is its read: the device's noise is all of it, so
      these runs are longer, ``io_steps`` steps): the novel and the agent
      prompt x the 5 policies (10);
    - ``spin:2`` on the 100 short prompts (1,467 tokens: enough fresh rows for
      two configurations of ``prompt_steps`` over 7 rounds), serial and
      io_uring x 16 (2);
    - the real Engram projection + gated add (``mixer``) on the novel, serial
      and io_uring x 16, ``mixer_steps`` steps (2).
    """
    def policies(trace, compute, n):
        return [RunConfig(trace, t, b, k, compute, n) for t, b, k in DEFAULT_POLICIES]

    novel, agent, prompts = DEFAULT_TRACES[0], DEFAULT_TRACES[1], DEFAULT_TRACES[2]
    out = []
    for tr in (novel, agent, CODE_SOURCE):
        out += policies(tr, "spin:2", steps)
    for tr in (novel, agent):
        out += policies(tr, "none", io_steps)
    out += [RunConfig(prompts, 256, "pread", 4, "spin:2", prompt_steps),
            RunConfig(prompts, 8, "io_uring", 16, "spin:2", prompt_steps),
            RunConfig(novel, 256, "pread", 4, "mixer", mixer_steps),
            RunConfig(novel, 8, "io_uring", 16, "mixer", mixer_steps)]
    return out


def quick_grid(steps: int = 60) -> List[RunConfig]:
    """A small grid for tests and smoke runs: code + novel x {serial, pread x 4, io_uring x 4} x none."""
    return grid((CODE_SOURCE, DEFAULT_TRACES[0]), (8, 256), ("pread", "io_uring"), (4,), ("none",), steps)


# =====================================================================================
# environment
# =====================================================================================
def machine_info() -> dict:
    """CPU, cores, memory, kernel, Python/NumPy and BLAS of this machine."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    info = {"cpu": cpu or platform.processor(), "cores": os.cpu_count(), "memory_bytes": mem,
            "system": platform.system(), "kernel": platform.release(), "python": platform.python_version(),
            "numpy": np.__version__, "hostname": platform.node()}
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: d.get(k) for k in ("internal_api", "version", "num_threads")} for d in threadpool_info()]
    except Exception:  # pragma: no cover - optional
        pass
    try:
        info["loadavg"] = list(os.getloadavg())
    except OSError:  # pragma: no cover
        pass
    return info


def _file_info(info) -> dict:
    st = os.stat(info.path)
    dev = os.major(st.st_dev), os.minor(st.st_dev)
    return {"path": str(Path(info.path).resolve()), "size": st.st_size, "mtime": st.st_mtime,
            "device": f"{dev[0]}:{dev[1]}",
            "tables": [{"layer": int(l), "offset": int(t.offset), "rows": int(t.rows), "path": str(t.path)}
                       for l, t in sorted(info.tables.items())]}


def ensure_model(path: Union[str, os.PathLike], scale: float = DEFAULT_SCALE, *, build: bool = True,
                 progress: bool = True, **build_kw) -> Path:
    """The model file at ``path``, built with :func:`engram.synth.build_model` when missing.

    An existing file is reused when its tables have the rows of
    ``Layout.deepseek_v41_flash(scale=scale)``.

    Raises
    ------
    ArgumentError
        The file exists with another layout, or is missing and ``build`` is false.
    FormatError
        The file is not a model in the real format.
    """
    from engram import Layout, read_model
    from engram.synth import build_model

    path = Path(path)
    want = [int(r) for r in Layout.deepseek_v41_flash(scale=scale).rows]
    if path.exists():
        info = read_model(path)
        got = [int(info.tables[l].rows) for l in sorted(info.tables)]
        if got != want:
            raise ArgumentError(f"{path}: tables have {got} rows, not the {want} of scale {scale}; "
                                "give its scale with --scale or another --model path")
        return path
    if not build:
        raise ArgumentError(f"{path}: no model file (build one with engram synth, or drop --no-build)")
    path.parent.mkdir(parents=True, exist_ok=True)
    build_model(path, scale=scale, progress=progress, **build_kw)
    return path


def _us_list(seconds: np.ndarray) -> list:
    return [round(float(x) * 1e6, 2) for x in seconds]


def _pct_ms(x: np.ndarray) -> dict:
    if x.size == 0:
        return {k: 0.0 for k in ("mean", "p50", "p90", "p95", "p99", "max")}
    p = np.percentile(x, [50, 90, 95, 99])
    return {"mean": float(x.mean()) * 1e3, "p50": float(p[0]) * 1e3, "p90": float(p[1]) * 1e3,
            "p95": float(p[2]) * 1e3, "p99": float(p[3]) * 1e3, "max": float(x.max()) * 1e3}


# =====================================================================================
# microbenchmarks
# =====================================================================================
def _open_tables(info, backend: str = "serial"):
    from engram import Table

    return [Table(info.tables[l].path, info.tables[l].offset, info.tables[l].rows, backend=backend,
                  threshold=1 << 30) for l in sorted(info.tables)]


def _time_batches(group, rng, rows, batches: int, dest: np.ndarray):
    """One warm-up read, then ``batches`` timed reads of random 48-row steps: (seconds [n], reads)."""
    clock = time.perf_counter
    group.read_batch(_random_ids(rng, rows, 1), out=dest)
    ts = np.empty(batches)
    nreads = 0
    for i in range(batches):
        ids = _random_ids(rng, rows, 1)
        t0 = clock()
        group.read_batch(ids, out=dest)
        ts[i] = clock() - t0
        nreads += group.last_stats.reads
    return ts, nreads


def _random_ids(rng: np.random.Generator, rows: Sequence[int], tokens: int, columns: int = 24) -> np.ndarray:
    """uint32 ``[tokens, len(rows) * columns]``: uniform random row ids of each table, table after table."""
    return np.concatenate([rng.integers(0, r, (tokens, columns), dtype=np.uint32) for r in rows], axis=1)


def _io_serial(tables, rng: np.random.Generator, batches: int, single_rows: int, round_: int) -> List[dict]:
    """Serial reads: ``batches`` 48-row batches and ``single_rows`` single-row reads."""
    from engram import TableGroup

    rows = [t.rows for t in tables]
    clock = time.perf_counter
    dest = np.empty((1, STEP_ROWS, 256), np.float32)
    out = []
    with TableGroup(tables, 24, backend="serial", readers=1, threshold=1 << 30) as g:
        ts, nreads = _time_batches(g, rng, rows, batches, dest)
        out.append({"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": STEP_ROWS,
                    "round": round_, "batch_us": _us_list(ts), "rows": batches * STEP_ROWS, "reads": nreads})
    t = tables[0]
    one = np.empty((1, 256), np.float32)
    ts = np.empty(single_rows)
    for i in range(single_rows):
        ids = rng.integers(0, t.rows, 1, dtype=np.uint32)
        t0 = clock()
        t.read_rows(ids, out=one)
        ts[i] = clock() - t0
    out.append({"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": 1,
                "round": round_, "batch_us": _us_list(ts), "rows": single_rows, "reads": single_rows})
    return out


def _io_batches(tables, rng: np.random.Generator, backend: str, k: int, batches: int, round_: int,
                chunk: int) -> dict:
    """One more chunk of ``batches`` 48-row batches at ``readers = k`` (``backend="serial"``: serially)."""
    from engram import TableGroup

    rows = [t.rows for t in tables]
    dest = np.empty((1, STEP_ROWS, 256), np.float32)
    serial = backend == "serial"
    with TableGroup(tables, 24, backend=backend, readers=1 if serial else int(k),
                    threshold=1 << 30 if serial else 1) as g:
        ts, nreads = _time_batches(g, rng, rows, batches, dest)
    return {"kind": "io", "tool": "engine", "backend": backend, "qd": int(k), "batch_rows": STEP_ROWS,
            "round": round_, "chunk": chunk, "batch_us": _us_list(ts), "rows": batches * STEP_ROWS, "reads": nreads}


def _io_depth(tables, rng: np.random.Generator, backend: str, k: int, batches: int, big_seconds: float,
              round_: int) -> List[dict]:
    """Concurrent reads at ``readers = k``: ``batches`` 48-row batches, then large batches for ``big_seconds``."""
    from engram import TableGroup

    rows = [t.rows for t in tables]
    clock = time.perf_counter
    dest = np.empty((1, STEP_ROWS, 256), np.float32)
    out = []
    with TableGroup(tables, 24, backend=backend, readers=int(k), threshold=1) as g:
        g.read_batch(_random_ids(rng, rows, 2), out=np.empty((2, STEP_ROWS, 256), np.float32))
        ts = np.empty(batches)
        nreads = 0
        for i in range(batches):
            ids = _random_ids(rng, rows, 1)
            t0 = clock()
            g.read_batch(ids, out=dest)
            ts[i] = clock() - t0
            nreads += g.last_stats.reads
        out.append({"kind": "io", "tool": "engine", "backend": backend, "qd": int(k), "batch_rows": STEP_ROWS,
                    "round": round_, "batch_us": _us_list(ts), "rows": batches * STEP_ROWS, "reads": nreads})
        tokens = max(4096, 64 * int(k)) // STEP_ROWS
        big = np.empty((tokens, STEP_ROWS, 256), np.float32)
        n = nrows = nreads = 0
        wall = 0.0
        while wall < big_seconds or n < 2:
            ids = _random_ids(rng, rows, tokens)
            t0 = clock()
            g.read_batch(ids, out=big)
            wall += clock() - t0
            n += 1
            nrows += g.last_stats.rows_distinct
            nreads += g.last_stats.reads
        out.append({"kind": "io", "tool": "engine", "backend": backend, "qd": int(k),
                    "batch_rows": tokens * STEP_ROWS, "round": round_, "batches": n, "rows": nrows,
                    "reads": nreads, "wall_s": wall, "reads_per_s": nreads / wall})
    return out


def _io_think(tables, rng: np.random.Generator, backend: str, k: int, batches: int, run, think: str,
              layer_ids: Sequence[int], round_: int) -> dict:
    """48-row batches at ``readers = k`` (``backend="serial"``: read serially) with the compute ``run`` on each
    batch's rows between batches (the think time of a closed loop): the batch times and the think times."""
    from engram import TableGroup

    rows = [t.rows for t in tables]
    clock = time.perf_counter
    dest = np.empty((1, STEP_ROWS, 256), np.float32)
    C = STEP_ROWS // len(layer_ids)
    got = {lid: dest[0, j * C:(j + 1) * C] for j, lid in enumerate(layer_ids)}
    serial = backend == "serial"
    with TableGroup(tables, C, backend=backend, readers=1 if serial else int(k),
                    threshold=1 << 30 if serial else 1) as g:
        g.read_batch(_random_ids(rng, rows, 1, C), out=dest)
        run(got)
        ts = np.empty(batches)
        th = np.empty(batches)
        nreads = 0
        for i in range(batches):
            ids = _random_ids(rng, rows, 1, C)
            t0 = clock()
            g.read_batch(ids, out=dest)
            t1 = clock()
            run(got)
            th[i] = clock() - t1
            ts[i] = t1 - t0
            nreads += g.last_stats.reads
    return {"kind": "io", "tool": "engine", "backend": backend, "qd": int(k), "batch_rows": STEP_ROWS,
            "think": think, "round": round_, "batch_us": _us_list(ts), "think_us": _us_list(th),
            "rows": batches * STEP_ROWS, "reads": nreads}


def io_microbench(info, *, backends: Sequence[str] = ("pread", "io_uring"),
                  depths: Sequence[int] = DEFAULT_DEPTHS, batches: int = 60, big_seconds: float = 0.2,
                  single_rows: int = 200, seed: int = 0, round_: int = 0, progress=None) -> List[dict]:
    """The engine's own reads by queue depth, on uniformly random rows of both tables.

    Per backend and depth ``k >= 2`` (``readers`` = ring depth = ``k``,
    threshold 1): ``batches`` batches of 48 rows (24 a table, one decode
    step's worth) timed one by one, then large batches (``max(4096,
    64 k)`` rows) for ``big_seconds`` (steady-state reads/s).  Serially
    (``qd`` 1): ``batches`` 48-row batches and ``single_rows`` single-row
    reads.  Deterministic row ids (``seed``, ``round_``).

    Parameters
    ----------
    info : engram.ModelInfo
        The model whose tables are read (``read_model(path)``).

    Returns
    -------
    list of dict
        Records of kind ``"io"``, tool ``"engine"`` (see the module docstring).

    Raises
    ------
    TableIOError
        A table cannot be opened or a backend cannot start.
    """
    tables = _open_tables(info)
    out: List[dict] = []
    try:
        out += _io_serial(tables, np.random.default_rng([seed, round_, 1]), batches, single_rows, round_)
        if progress is not None:
            progress(1)
        for be in backends:
            for k in depths:
                if k < 2:
                    continue
                rng = np.random.default_rng([seed, round_, 2, _BACKEND_TAG[be], int(k)])
                out += _io_depth(tables, rng, be, int(k), batches, big_seconds, round_)
                if progress is not None:
                    progress(1)
    finally:
        for t in tables:
            t.close()
    return out


_BACKEND_TAG = {"pread": 1, "io_uring": 2}


#: fio completion-latency percentiles kept in the records.
FIO_PERCENTILES = ("1.000000", "5.000000", "10.000000", "20.000000", "30.000000", "40.000000", "50.000000",
                   "60.000000", "70.000000", "80.000000", "90.000000", "95.000000", "99.000000", "99.900000")


def fio_microbench(info, depths: Sequence[int] = DEFAULT_DEPTHS, seconds: float = 0.5, round_: int = 0,
                   progress=None) -> List[dict]:
    """fio random 4 KiB reads of the first table's extent with ``--direct=1`` (io_uring), by queue depth.

    Returns an empty list when fio is not installed.  Each record has
    ``iops``, ``mean_us`` (total latency, submission to completion) and
    ``pNN_us`` completion-latency percentiles, and the command line.

    Raises
    ------
    TableIOError
        fio fails on the file (its message is kept).
    """
    from engram.errors import TableIOError

    exe = shutil.which("fio")
    if exe is None:
        return []
    loc = info.tables[sorted(info.tables)[0]]
    off = loc.offset // 4096 * 4096
    size = (loc.offset + loc.rows * 264 - off) // 4096 * 4096
    out = []
    for qd in depths:
        cmd = [exe, "--name=engram-randread", f"--filename={loc.path}", "--rw=randread", "--bs=4k", "--direct=1",
               "--ioengine=io_uring", f"--iodepth={int(qd)}", f"--offset={off}", f"--size={size}",
               f"--runtime={max(1, int(round(seconds * 1000)))}ms", "--time_based", "--randrepeat=0", "--norandommap",
               "--output-format=json"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise TableIOError(f"fio failed on {loc.path} (qd {qd}): {res.stderr.strip()[:300]}")
        job = json.loads(res.stdout)["jobs"][0]["read"]
        pct = job["clat_ns"].get("percentile", {})
        rec = {"kind": "io", "tool": "fio", "qd": int(qd), "round": round_, "iops": float(job["iops"]),
               "mean_us": float(job["lat_ns"]["mean"]) / 1e3, "clat_mean_us": float(job["clat_ns"]["mean"]) / 1e3,
               "ios": int(job.get("total_ios", 0)), "cmd": " ".join(cmd[1:]).join(("fio ", ""))}
        for p in FIO_PERCENTILES:
            if p in pct:
                rec[f"p{float(p):g}_us"] = float(pct[p]) / 1e3
        out.append(rec)
        if progress is not None:
            progress(1)
    return out


def compute_microbench(model, computes: Sequence[str], *, samples: int = 100, mixer_samples: int = 15,
                       seed: int = 0, round_: int = 0, progress=None) -> List[dict]:
    """Time each compute spec on one token's rows, read for random token ids (not from any trace).

    ``samples`` calls per spec (``mixer_samples`` when the spec holds the
    mixer), each on the rows of a fresh step of a random token, after one
    warm-up call.  Returns records of kind ``"compute"`` with ``samples_us``.
    """
    rng = np.random.default_rng([seed, round_, 3])
    out = []
    clock = time.perf_counter
    with model.session(backend="serial", threshold=1 << 30) as s:
        for label in dict.fromkeys(ComputeSpec.parse(c).label for c in computes):
            spec = ComputeSpec.parse(label)
            run = spec.runner(model, s, residual_seed=seed)
            n = mixer_samples if spec.mixer else samples
            toks = rng.integers(0, len(model.token_map), n + 1).tolist()
            ts = np.empty(n)
            for i, tok in enumerate(toks):
                rows = s.step(tok)
                t0 = clock()
                run(rows)
                dt = clock() - t0
                if i:
                    ts[i - 1] = dt
            out.append({"kind": "compute", "compute": label, "round": round_, "samples_us": _us_list(ts)})
            if progress is not None:
                progress(1)
    return out


def hash_microbench(model, samples: int = 2000, seed: int = 0, round_: int = 0) -> dict:
    """Time the hash part of a step, :meth:`engram.Session.step_rows`, on random token ids (``"hash"`` record)."""
    rng = np.random.default_rng([seed, round_, 4])
    toks = rng.integers(0, len(model.token_map), samples).tolist()
    clock = time.perf_counter
    ts = np.empty(samples)
    with model.session(backend="serial", threshold=1 << 30) as s:
        for i, tok in enumerate(toks):
            t0 = clock()
            s.step_rows(tok)
            ts[i] = clock() - t0
    return {"kind": "hash", "round": round_, "samples_us": _us_list(ts)}


# =====================================================================================
# decode runs
# =====================================================================================
def decode_run(model, trace: Trace, config: RunConfig, *, start: int = 0, warmup: int = 8,
               residual_seed: int = 0) -> dict:
    """Run the real decode loop of ``config`` over ``config.steps`` tokens of ``trace`` from step ``start``.

    Each step: ``session.step(token)`` (hash + one batch of the 48 rows of both
    tables + decode; its time is the read time), then the step's compute
    (:class:`ComputeSpec`); the step time runs from before the read to after
    the compute.  The loop continues the text: the up to 3 tokens of the
    sequence before ``start`` are replayed into the hash history first
    (hashing only, no reads: SPEC §4), and a new sequence of the trace
    restarts the history, so every step's row ids equal the trace's (checked:
    ``rows_match``).  ``warmup`` steps on random token ids (random rows) wake
    the readers before the timed loop.

    Returns
    -------
    dict
        A run record (see the module docstring), without ``config``/``round``.

    Raises
    ------
    ArgumentError
        The trace has fewer than ``start + config.steps`` tokens.
    TableIOError, DecodeError
        A read failed.
    """
    n = config.steps
    start = int(start)
    if start < 0 or trace.steps < start + n:
        raise ArgumentError(f"trace {trace.source!r} has {trace.steps} tokens, the configuration needs "
                            f"{n} from step {start}")
    spec = ComputeSpec.parse(config.compute)
    tokens = trace.tokens[start:start + n].tolist()
    seq_starts = trace.starts
    starts = set(int(x) - start for x in seq_starts if start < x < start + n)
    first = int(seq_starts[seq_starts <= start].max())
    history = trace.tokens[max(first, start - 3):start].tolist()
    read_s = np.empty(n)
    comp_s = np.empty(n)
    step_s = np.empty(n)
    distinct = np.empty(n, np.int64)
    concurrent = nreads = 0
    match = True
    clock = time.perf_counter
    rng = np.random.default_rng([residual_seed, start, 6])
    with model.session(backend=config.backend, readers=config.readers, threshold=config.threshold) as s:
        run = spec.runner(model, s, residual_seed)
        for tok in rng.integers(0, len(model.token_map), warmup).tolist():
            run(s.step(tok))
        s.restore(model.hasher.new_history())
        for tok in history:
            s.step_rows(int(tok))
        step, want = s.step, trace.rows[start:start + n]
        t_begin = clock()
        for i in range(n):
            if i in starts:
                s.restore(model.hasher.new_history())
            t0 = clock()
            rows = step(tokens[i])
            t1 = clock()
            run(rows)
            t2 = clock()
            read_s[i] = t1 - t0
            comp_s[i] = t2 - t1
            step_s[i] = t2 - t0
            st = s.last_stats
            distinct[i] = st.rows_distinct
            nreads += st.reads
            if st.backend != "serial":
                concurrent += 1
            if match and not np.array_equal(s.last_row_ids, want[i]):
                match = False
        wall = clock() - t_begin
    return {"start": start, "steps": n, "wall_s": wall, "tokens_per_s": n / wall, "step_ms": _pct_ms(step_s),
            "read_ms": _pct_ms(read_s), "compute_ms": _pct_ms(comp_s), "concurrent_steps": concurrent,
            "rows_distinct_mean": float(distinct.mean()), "reads": nreads, "rows_match": match,
            "step_us": _us_list(step_s), "read_us": _us_list(read_s), "compute_us": _us_list(comp_s)}


def segments(configs: Sequence[RunConfig], rounds: int) -> Dict[tuple, int]:
    """First trace step of each run: ``{(config index, round): start}``.

    The runs of one trace read consecutive, disjoint stretches of it (round
    after round, configuration after configuration), so no run re-reads rows
    an earlier run read: a shared device's caches (a virtual disk's host page
    cache) would make repeated rows faster than the fresh random rows of the
    microbenchmarks.  Only a trace's own repeats (SPEC §8: 22.5% of reads)
    stay.  :func:`trace_tokens_needed` gives the length each trace needs.
    """
    out, nxt = {}, {}
    for r in range(rounds):
        for i, c in enumerate(configs):
            s = nxt.get(c.trace, 0)
            out[(i, r)] = s
            nxt[c.trace] = s + c.steps
    return out


def trace_tokens_needed(configs: Sequence[RunConfig], rounds: int) -> Dict[str, int]:
    """Tokens each trace source needs for :func:`segments`: ``{trace: sum of steps x rounds}``."""
    need: Dict[str, int] = {}
    for c in configs:
        need[c.trace] = need.get(c.trace, 0) + c.steps * rounds
    return need


# =====================================================================================
# background load of a shared machine
# =====================================================================================
def _proc_cpu() -> Optional[tuple]:
    """(busy, steal, total) jiffies of all CPUs from ``/proc/stat`` (busy = user + nice + system)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = v[7] if len(v) > 7 else 0
    return v[0] + v[1] + v[2], steal, sum(v[:8])


def _proc_disk(dev: Optional[tuple]) -> Optional[tuple]:
    """(reads, writes) completed on block device ``(major, minor)`` from ``/proc/diskstats``."""
    if dev is None:
        return None
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if len(p) > 7 and int(p[0]) == dev[0] and int(p[1]) == dev[1]:
                    return int(p[3]), int(p[7])
    except (OSError, ValueError):
        pass
    return None


class Background:
    """What other processes do to the machine while we measure: their CPU use and disk requests.

    ``start()`` then ``stop(our_reads)`` over a stretch of time gives
    ``{"cpu": share of all CPUs busy outside this process (user + system),
    "steal": share stolen by the hypervisor, "disk_iops": reads and writes per
    second on the model file's device beyond ``our_reads``, "seconds"}``.
    Our own CPU time (every thread, and child processes such as fio) comes
    from :func:`os.times`; kernel work done for our reads that is not charged
    to us (interrupts) is excluded by counting only user + nice + system.

    Parameters
    ----------
    path : path
        A file on the device to watch (the model file).
    """

    def __init__(self, path: Union[str, os.PathLike]):
        try:
            st = os.stat(path)
            self.dev = (os.major(st.st_dev), os.minor(st.st_dev))
        except OSError:
            self.dev = None
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.ncpu = os.cpu_count() or 1
        self._s = None

    def start(self) -> None:
        t = os.times()
        self._s = (time.perf_counter(), _proc_cpu(), t.user + t.system + t.children_user + t.children_system,
                   _proc_disk(self.dev))

    def stop(self, our_reads: Optional[int] = None) -> dict:
        t1 = time.perf_counter()
        t = os.times()
        mine1 = t.user + t.system + t.children_user + t.children_system
        cpu1, disk1 = _proc_cpu(), _proc_disk(self.dev)
        t0, cpu0, mine0, disk0 = self._s
        dt = max(t1 - t0, 1e-6)
        out = {"seconds": dt, "cpu": None, "steal": None, "disk_iops": None}
        if cpu0 and cpu1:
            busy = (cpu1[0] - cpu0[0]) / self.hz
            out["cpu"] = max(0.0, busy - (mine1 - mine0)) / (dt * self.ncpu)
            total = max(cpu1[2] - cpu0[2], 1)
            out["steal"] = (cpu1[1] - cpu0[1]) / total
        if disk0 and disk1:
            n = (disk1[0] - disk0[0]) + (disk1[1] - disk0[1]) - (our_reads or 0)
            out["disk_iops"] = max(0.0, n) / dt
        return out

    def sample(self, seconds: float = 0.5) -> dict:
        """Background over the next ``seconds`` (this process idle)."""
        self.start()
        time.sleep(seconds)
        return self.stop(0)


def _quiet(bg: Optional[dict], max_cpu: float, max_iops: float) -> bool:
    if not bg:
        return True
    return (bg["cpu"] is None or bg["cpu"] <= max_cpu) and (bg["disk_iops"] is None or bg["disk_iops"] <= max_iops)


# =====================================================================================
# the whole measurement
# =====================================================================================
def measure(model_path: Union[str, os.PathLike], configs: Sequence[RunConfig], out_dir: Union[str, os.PathLike], *,
            rounds: int = 7, depths: Sequence[int] = DEFAULT_DEPTHS, backends: Optional[Sequence[str]] = None,
            micro: bool = True, decode: bool = True, fio: bool = True, fio_seconds: float = 0.5,
            fio_rounds: int = 2, io_batches: int = 150, io_chunks: int = 8, depth_batches: int = 60,
            think_batches: int = 100, think_chunks: int = 2,
            big_seconds: float = 0.1, single_rows: int = 200, compute_samples: int = 100,
            mixer_samples: int = 15, warmup: int = 8, seed: int = 0, progress: bool = True,
            max_background_cpu: Optional[float] = None, max_background_iops: float = 1000.0,
            quiet_wait: float = 20.0, redo: int = 1, wait_budget: float = 120.0,
            micro_name: str = "microbench.json", runs_name: str = "runs.json") -> dict:
    """Measure microbenchmarks and decode runs of ``configs`` on the model at ``model_path``.

    ``rounds`` rounds; each round runs every microbenchmark task (serial
    reads; each backend x depth, ``depth_batches`` 48-row batches, or
    ``io_chunks`` chunks of ``io_batches`` where configurations without
    compute read them; fio at each depth in the first ``fio_rounds`` rounds;
    each compute spec; each compute as think time, ``think_chunks`` chunks of
    ``think_batches``; the hash) and every
    configuration once, all in one order shuffled with
    ``seed`` and the round number, so that the microbenchmarks and the runs
    sample the same stretches of a shared machine's load.  Results go to
    ``out_dir/microbench.json`` and ``out_dir/runs.json`` (written after every
    round, so an interrupted run keeps what it measured), and the runs' traces
    to ``out_dir/traces/*.npz``.

    Every record carries the background load of other processes while it ran
    (:class:`Background`).  With ``max_background_cpu`` set (a share of all
    CPUs, e.g. 0.25) a task waits up to ``quiet_wait`` seconds for a quiet
    machine (others below ``max_background_cpu`` and ``max_background_iops``
    disk requests a second over 0.5 s) and is run again (up to ``redo``
    times) when others were busy during it; waiting stops after
    ``wait_budget`` seconds in all.

    Returns
    -------
    dict
        ``{"microbench": path or None, "runs": path or None, "configs": n, "runs_done": n,
        "seconds": wall, "waited_s": seconds spent waiting for a quiet machine}``.

    Raises
    ------
    ArgumentError
        No configurations, rounds < 1, or a trace shorter than its steps.
    FormatError, TableIOError
        The model cannot be read.
    """
    from engram import EngramModel

    if rounds < 1:
        raise ArgumentError(f"rounds must be >= 1, got {rounds}")
    if decode and not configs:
        raise ArgumentError("no configurations to measure")
    if not (micro or decode):
        raise ArgumentError("nothing to measure: both microbenchmarks and decode runs are off")
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    model = EngramModel.open(model_path)
    info = model.info
    file_info = _file_info(info)
    backends = tuple(backends or sorted({c.backend for c in configs}) or ("pread", "io_uring"))
    for be in backends:
        if be not in _BACKEND_TAG:
            raise ArgumentError(f"backend must be 'pread' or 'io_uring', got {be!r}")
    depths = sorted({int(k) for k in depths})
    if not depths or depths[0] < 1:
        raise ArgumentError(f"depths must be integers >= 1, got {depths}")
    computes = list(dict.fromkeys(c.compute for c in configs)) or ["none"]
    need_mixer = any(ComputeSpec.parse(c).mixer for c in computes)

    traces: Dict[str, Trace] = {}
    starts: Dict[tuple, int] = {}
    if decode:
        for spec, need in trace_tokens_needed(configs, rounds).items():
            traces[spec] = load_trace(spec, limit=need, layout=model.layout)
            if traces[spec].steps < need:
                raise ArgumentError(f"trace {spec!r} has {traces[spec].steps} tokens; its runs need {need} "
                                    f"(each run reads its own stretch: fewer steps, rounds or configurations)")
        starts = segments(configs, rounds)
    if need_mixer:
        for lid in model.layer_ids:
            model.weights(lid)

    params = {"rounds": rounds, "depths": depths, "backends": list(backends), "fio": fio,
              "fio_seconds": fio_seconds, "fio_rounds": fio_rounds, "io_batches": io_batches,
              "io_chunks": io_chunks, "depth_batches": depth_batches, "think_batches": think_batches,
              "think_chunks": think_chunks, "big_seconds": big_seconds,
              "single_rows": single_rows, "compute_samples": compute_samples, "mixer_samples": mixer_samples,
              "warmup": warmup, "seed": seed, "max_background_cpu": max_background_cpu,
              "max_background_iops": max_background_iops, "quiet_wait": quiet_wait, "redo": redo,
              "wait_budget": wait_budget}
    micro_doc = {"schema": MICRO_SCHEMA, "kind": "microbench", "date": now_iso(), "machine": machine_info(),
                 "file": file_info, "params": params, "records": []}
    runs_doc = {"schema": RUNS_SCHEMA, "kind": "decode_runs", "date": now_iso(), "machine": machine_info(),
                "file": file_info, "params": params, "configs": [c.to_dict() for c in configs], "runs": []}
    micro_path = out_dir / micro_name if micro else None
    runs_path = out_dir / runs_name if decode else None
    if decode:
        # The exact traces of the runs, for the cross-check (no tokenizer or model file needed there).
        names: Dict[str, str] = {}
        (out_dir / "traces").mkdir(parents=True, exist_ok=True)
        for spec, tr in traces.items():
            base = trace_label(spec).replace("/", "_")
            name, i = base, 1
            while name in names.values():
                i += 1
                name = f"{base}-{i}"
            names[spec] = name
            tr.save(out_dir / "traces" / f"{name}.npz")
        runs_doc["traces"] = {spec: f"traces/{name}.npz" for spec, name in names.items()}

    tasks: List[tuple] = []
    if micro:
        tasks.append(("serial",))
        tasks += [("depth", be, k) for be in backends for k in depths if k >= 2]
        if fio and shutil.which("fio"):
            tasks += [("fio", k) for k in depths]
        tasks += [("compute", c) for c in computes]
        # More chunks of 48-row batches where configurations without compute read them, spread over the round.
        used = dict.fromkeys(("serial", 1) if c.serial else (c.backend, c.readers) for c in configs
                             if c.compute == "none")
        tasks += [("batches", be, k, j) for (be, k) in used for j in range(1, io_chunks)]
        # Think time: each compute between 48-row batches, at the readers its configurations use.
        think = {}
        for c in configs:
            if c.compute != "none":
                think[(c.compute, "serial" if c.serial else c.backend, 1 if c.serial else c.readers)] = True
        tasks += [("think", be, k, label, j) for (label, be, k) in think
                  for j in range(1 if ComputeSpec.parse(label).mixer else think_chunks)]
        tasks.append(("hash",))
    if decode:
        tasks += [("decode", i) for i in range(len(configs))]

    from tqdm import tqdm

    tables = _open_tables(info) if micro else []

    def _run_task(task: tuple, r: int, pos: int) -> tuple:
        """Run one task: ``(document list to extend, records, our device reads or None)``."""
        kind = task[0]
        bar.set_postfix_str(f"round {r}: {configs[task[1]].key if kind == 'decode' else ' '.join(map(str, task))}")
        if kind == "serial":
            recs = _io_serial(tables, np.random.default_rng([seed, r, 1]), io_batches, single_rows, r)
        elif kind == "depth":
            rng = np.random.default_rng([seed, r, 2, _BACKEND_TAG[task[1]], task[2]])
            n = io_batches if (task[1], task[2]) in used else depth_batches
            recs = _io_depth(tables, rng, task[1], task[2], n, big_seconds, r)
        elif kind == "batches":
            _, be, k, j = task
            rng = np.random.default_rng([seed, r, 8, _BACKEND_TAG.get(be, 0), k, j])
            recs = [_io_batches(tables, rng, be, k, io_batches, r, j)]
        elif kind == "fio":
            if r >= fio_rounds:
                return micro_doc["records"], [], 0
            recs = fio_microbench(info, [task[1]], fio_seconds, round_=r)
        elif kind == "think":
            _, be, k, label, j = task
            spec = ComputeSpec.parse(label)
            rng = np.random.default_rng([seed, r, 7, _BACKEND_TAG.get(be, 0), k, j])
            with model.session(backend="serial", threshold=1 << 30) as ms:
                run = spec.runner(model, ms, residual_seed=seed)
                recs = [_io_think(tables, rng, be, k, mixer_samples if spec.mixer else think_batches, run, label,
                                  model.layer_ids, r)]
                recs[0]["chunk"] = j
        elif kind == "compute":
            recs = compute_microbench(model, [task[1]], samples=compute_samples, mixer_samples=mixer_samples,
                                      seed=seed, round_=r)
            return micro_doc["records"], recs, None
        elif kind == "hash":
            return micro_doc["records"], [hash_microbench(model, seed=seed, round_=r)], 0
        else:
            c = configs[task[1]]
            rec = decode_run(model, traces[c.trace], c, start=starts[(task[1], r)], warmup=warmup,
                             residual_seed=seed)
            return runs_doc["runs"], [{"config": c.key, "round": r, "order": pos, **rec}], rec["reads"]
        return micro_doc["records"], recs, sum(int(x.get("reads", 0)) + int(x.get("ios", 0)) for x in recs)

    bg = Background(model_path)
    guard = max_background_cpu is not None
    waited = [0.0]
    deadline = time.perf_counter() + wait_budget

    def _wait_quiet() -> None:
        t_end = min(time.perf_counter() + quiet_wait, deadline)
        while time.perf_counter() < t_end:
            if _quiet(bg.sample(0.5), max_background_cpu, max_background_iops):
                return
            bar.set_postfix_str("waiting for a quiet machine")

    def _attempt(task: tuple, r: int, pos: int) -> None:
        for attempt in range(redo + 1):
            if guard:
                t0 = time.perf_counter()
                _wait_quiet()
                waited[0] += time.perf_counter() - t0
            bg.start()
            target, recs, ours = _retry(lambda: _run_task(task, r, pos))
            got = bg.stop(ours)
            if ours is None:
                got["disk_iops"] = None
            got["attempt"] = attempt
            for x in recs:
                x["background"] = got
            if not guard or _quiet(got, max_background_cpu, max_background_iops) or attempt == redo \
                    or time.perf_counter() > deadline:
                target.extend(recs)
                return

    bar = tqdm(total=rounds * len(tasks), unit="task", desc="measure", disable=not progress, leave=False)
    try:
        for r in range(rounds):
            order = np.random.default_rng([seed, r, 5]).permutation(len(tasks))
            for pos, ti in enumerate(order):
                _attempt(tasks[int(ti)], r, pos)
                bar.update(1)
            if micro:
                micro_doc["waited_s"] = waited[0]
                write_json(micro_path, micro_doc)
            if decode:
                runs_doc["machine"]["loadavg_end"] = machine_info().get("loadavg")
                runs_doc["waited_s"] = waited[0]
                write_json(runs_path, runs_doc)
    finally:
        bar.close()
        for t in tables:
            t.close()
    return {"microbench": str(micro_path) if micro_path else None, "runs": str(runs_path) if runs_path else None,
            "configs": len(configs) if decode else 0, "runs_done": len(runs_doc["runs"]),
            "seconds": time.perf_counter() - t_start, "waited_s": waited[0]}


def _retry(fn, attempts: int = 4, wait: float = 1.0):
    """Run ``fn``; a read backend that cannot start for a moment (``EPERM``/``EAGAIN``/``ENOMEM`` from
    ``io_uring_setup`` while the machine is busy) is retried ``attempts - 1`` times, ``wait`` seconds apart."""
    from engram.errors import TableIOError

    for i in range(attempts):
        try:
            return fn()
        except TableIOError as exc:
            if i == attempts - 1 or "could not start" not in str(exc):
                raise
            time.sleep(wait)
