"""The documents the simulator writes and reads: their schemas, units, vocabulary and checks.

Measuring writes two documents, calibrating reads one and writes another,
the cross-check reads two; this module is what they share, so that none of
them imports another's code (profiling apart from the simulator):

- schema names (:data:`MICRO_SCHEMA`, :data:`RUNS_SCHEMA`,
  :data:`CALIBRATION_SCHEMA`, :data:`CROSSCHECK_SCHEMA`, :data:`SWEEP_SCHEMA`, :data:`CAPACITY_SCHEMA`);
- units: documents hold times in microseconds (:data:`US` seconds each);
- the vocabulary of a measured configuration: :class:`ComputeSpec` (the
  compute of a step, ``none``, ``mixer``, ``spin:MS``, ...), :class:`RunConfig`
  (trace x threshold x backend x readers x compute x steps), :func:`trace_label`;
- checks at the door: :func:`check_microbench` (refuses decode runs: the
  calibration never sees the runs it is checked against), :func:`check_runs`.

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
       {"kind": "hash", "round": r, "samples_us": [...]},
       {"kind": "io", "tool": "engine", "backend": ..., "qd": submitters x readers, "readers": k,
        "submitters": m, "batch_rows": 48, "round": r, "batches": n, "reads": n, "wall_s": s,
        "reads_per_s": x, "batch_mean_us": x},                 # several sessions' worth of readers at once
       {"kind": "io", "tool": "session", "probe": WINDOW, "round": r, "backend", "threshold", "readers",
        "qd", "batch_rows": 48, "compute": label, "sessions": n, "mode", "every": k, "session_steps": n,
        "offsets_s": [...], "session": [...], "batch_us": [...], "compute_us": [...], "t_us": [...],
        "distinct": [...], "rows": n},                         # the probe steps interleaved with the run
                                                               # of WINDOW (sim.measure.runs.probe_record)
       {"kind": "cache", "round": 0, "cold_us": [...], "warm_us": [...], "warm_over_cold": x}]}
    # every record also has "background": {"cpu": share of all CPUs used by other processes,
    #   "steal", "disk_iops": other requests a second on the model's device, "seconds", "attempt"}
    # both documents also have "backends": {"usable": [...], "left_out": {backend: reason},
    #   "configs_left_out": [keys]}, "warnings": [...] and "complete": bool

``runs.json``::

    {"schema": "engram.decode-runs/1", "kind": "decode_runs", "date", "machine", "file", "params",
     "configs": [{"key", "trace", "trace_label", "threshold", "backend", "readers", "compute",
                  "steps", "sessions", "mode", "serial"}],
     "traces": {trace: "traces/NAME.npz"},                  # the traces the runs read (Trace.save)
     "runs": [{"config": key, "round": r, "order": i, "start": first trace step, "steps": n, "wall_s": s,
               "tokens_per_s": x (trace steps over their own time),
               "probe_every": k, "probe_steps": m (probe steps a session, in microbench.json),
               "step_ms": {mean, p50, p90, p95, p99, max}, "read_ms": {...}, "compute_ms": {...},
               "concurrent_steps": n, "rows_distinct_mean": x, "reads": n, "rows_match": bool,
               "background": {"cpu", "steal", "disk_iops", "seconds", "attempt"}, "window": WINDOW,
               "threads": OS threads of the sessions' process(es) mid-run,
               # several sessions also: "sessions", "mode", "starts": [...], "start_offsets_s": [...],
               # "stagger_s", "session_tokens_per_s": [...], "slowest_tokens_per_s",
               # "aggregate_tokens_per_s", "session_step_p50_ms": [...]
               "step_us": [...], "read_us": [...], "compute_us": [...]}]}

JSON schema of ``calibration.json``::

    {"schema": "engram.calibration/1", "kind": "calibration", "date": ISO-8601,
     "machine": {...}, "file": {...},                     # from the microbenchmark document
     "source": {"path", "sha256", "schema", "date", "records": n},
     "devices": {"pread": MeasuredBatchDevice.to_dict(), "io_uring": ...},
     "think_devices": {"spin:2": {"pread": MeasuredBatchDevice.to_dict(), ...}, ...},
     "fio_device": EmpiricalDevice.to_dict() or null,
     "compute": {"none": {"samples_us": [...], "mean_us", "p50_us", "p95_us"}, "mixer": {...}, ...},
     "hash_us": x,
     "fit": [{"backend", "qd", "engine_mean_us", "fio_mean_us", "engine_over_fio",
              "batch48_mean_us", "batch48_p50_us", "device_batch48_mean_us", "device_batch48_p50_us",
              "overhead_raw_us", "batches"}, ...],
     "think_fit": [{"think", "backend", "qd", "batch48_mean_us", "batch48_p50_us", "think_mean_us",
                    "back_to_back_mean_us", "batches"}, ...],
     "windows": {WINDOW: {"backend", "qd", "threshold", "readers", "sessions", "mode", "compute_label",
                          "probe_steps", "read_mean_us", "device", "device_first", "device_second", "read_se",
                          "compute", "compute_se", "step_cv", "fit_residual", "fit_simulations"}},
                                                          # sim.windows.window_state
     "shared_fit": [{"backend", "qd", "submitters", "readers", "reads_per_s", "one_group_reads_per_s", "gain"}],
     "backends": {"usable": [...], "left_out": {backend: reason}}}

JSON schema of ``crosscheck.json``::

    {"schema": "engram.crosscheck/1", "kind": "crosscheck", "date": ISO-8601,
     "calibration": {"path", "sha256", "date", "source"}, "runs": {"path", "sha256", "date"},
     "machine": {...}, "sim": {"steps", "seed", "mode": "fast"},
     "targets": {"tokens_per_s_median_abs": 0.05, "tokens_per_s_max_abs": 0.10, "step_p50_max_abs": 0.10},
     "summary": {"configurations", "tokens_per_s": {"median_abs_error", "max_abs_error", "mean_error"},
                 "step_p50": {...}, "step_p95": {...}, "step_mean": {...},
                 "spread": {"tokens_per_s_median", "tokens_per_s_max", "tokens_per_s_cv_median",
                 "step_p50_median", "step_p50_max"}, "within_spread": n, "background_cpu_median",
                 "rows_match": bool, "pass": {...}, "passed": bool},
     "quiet_targets": {...}, "coverage_target": 0.9, "backends": {"usable", "left_out"}, "warnings": [...],
     # summary also: "regime": {"name": "quiet"|"busy"|"loaded"|"unmeasured", "cpu", "steal", "why"}, "inside_interval",
     #   "inside_interval_share", "runs_inside", "runs_inside_share", "calibrated_only": {...},
     #   "sessions": {...}, "single": {...}, "windows_probed"
     # "session_rows": like "rows", for several sessions (measured/predicted "slowest_tokens_per_s",
     #   "aggregate_tokens_per_s"); every row has "interval": {"low", "high", "slowest_low", "slowest_high", "z",
     #   "run_sd": [...] (window and model combined), "window_sd": [...], "model_sd", "independent_low",
     #   "independent_high"}, "inside_interval", "runs_inside", predicted "tokens_per_s_calibrated" (the
     #   calibrated device and compute alone), predicted "tokens_per_s_runs", "step_p50_ms_runs",
     #   "tokens_per_s_calibrated_runs" (each run's), and error "tokens_per_s_calibrated" and
     #   "tokens_per_s_of_medians" (errors are the median over runs of each run's; see sim.crosscheck)
     # "capacity": [{"trace", "threshold", "backend", "readers", "compute", "steps", "mode",
     #   "target_tokens_per_s", "sessions": [...], "measured_slowest": [...], "predicted_slowest": [...],
     #   "predicted_slowest_low", "predicted_slowest_high", "measured_capacity", "predicted_capacity",
     #   "all_met", "within_one_step"}]
     "rows": [{"key", "trace", "trace_label", "threshold", "backend", "readers", "compute", "steps", "serial",
               "repeats": n,
               "measured": {"tokens_per_s", "tokens_per_s_runs": [...], "step_p50_ms", "step_p95_ms",
                            "step_mean_ms", "read_mean_ms", "compute_mean_ms", "rows_match",
                            "background_cpu", "background_disk_iops", "cdf_ms": [...]},
               "predicted": {"tokens_per_s", "step_p50_ms", "step_p95_ms", "step_mean_ms", "read_mean_ms",
                             "compute_mean_ms", "device", "cdf_ms": [...]},
               "error": {"tokens_per_s", "step_p50", "step_p95", "step_mean"},
               "spread": {"tokens_per_s", "tokens_per_s_cv", "step_p50"}, "within_spread": bool}],
     "cdf_percentiles": [1, 2, 5, 10, ..., 99]}

Sweep tables (``engram sim sweep``) are CSV or Parquet, one row per point
(``point``, every axis of :data:`sim.sweep.AXES`, ``seed``, every metric of
:data:`sim.sweep.METRICS`), with ``TABLE.meta.json``::

    {"kind": "sweep", "schema": "engram.sweep/1", "study": {...}, "axes": [...], "columns": [...],
     "metrics": {...}, "axis_labels": {...}, "points": n, "seconds": s, "runner": "processes:N"|"inline"|"dask:..."}
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Mapping, Sequence

import numpy as np

from engram.errors import ArgumentError, FormatError

from .params import BACKENDS

__all__ = [
    "CALIBRATION_SCHEMA",
    "CAPACITY_SCHEMA",
    "CROSSCHECK_SCHEMA",
    "MICRO_KINDS",
    "MICRO_SCHEMA",
    "RUNS_SCHEMA",
    "RUN_FIELDS",
    "SESSION_MODES",
    "STEP_ROWS",
    "SWEEP_SCHEMA",
    "TABLE_COLUMNS",
    "US",
    "ComputeSpec",
    "RunConfig",
    "check_microbench",
    "check_runs",
    "percentiles_ms",
    "probe_positions",
    "trace_label",
    "us_list",
]

MICRO_SCHEMA = "engram.microbench/1"
RUNS_SCHEMA = "engram.decode-runs/1"
CALIBRATION_SCHEMA = "engram.calibration/1"
CROSSCHECK_SCHEMA = "engram.crosscheck/1"
SWEEP_SCHEMA = "engram.sweep/1"
CAPACITY_SCHEMA = "engram.capacity/1"

#: Seconds in a microsecond: documents hold times in microseconds, the simulator works in seconds.
US = 1e-6
#: Columns of one table of the V4.1 Flash layout (``Layout.columns``: 3 n-gram orders x 8 heads).
TABLE_COLUMNS = 24
#: Rows of one decode step (2 tables x 24 columns): the batch the microbenchmarks time.
STEP_ROWS = 2 * TABLE_COLUMNS

#: How the sessions of a multi-session run share the device: threads of one process, or processes.
SESSION_MODES = ("threads", "processes")
#: Record kinds of a microbenchmark document.
MICRO_KINDS = ("io", "compute", "hash", "cache")
#: Fields that only decode runs carry; a microbenchmark record holding any of them is refused.
RUN_FIELDS = ("step_us", "tokens_per_s", "step_ms", "config")


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
        Decode steps of each session (the first ``steps`` tokens of its stretch of the trace).
    sessions : int
        Concurrent decode sessions on the one device, each on its own stretch of the trace (default 1).
    mode : {"threads", "processes"}
        Sessions as threads of one process, or as processes sharing the device (default threads).
    """

    trace: str
    threshold: int
    backend: str
    readers: int
    compute: str = "none"
    steps: int = 300
    sessions: int = 1
    mode: str = "threads"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ArgumentError(f"backend must be 'pread' or 'io_uring', got {self.backend!r}")
        if self.threshold < 1 or self.readers < 1 or self.steps < 1 or self.sessions < 1:
            raise ArgumentError(f"threshold, readers, steps and sessions must be >= 1, got "
                                f"{self.threshold}, {self.readers}, {self.steps}, {self.sessions}")
        if self.mode not in SESSION_MODES:
            raise ArgumentError(f"mode must be one of {SESSION_MODES}, got {self.mode!r}")
        object.__setattr__(self, "compute", ComputeSpec.parse(self.compute).label)

    @property
    def multi(self) -> bool:
        """True for a run of several sessions, or of one session in a process of its own."""
        return self.sessions > 1 or self.mode != "threads"

    @property
    def serial(self) -> bool:
        """True when no decode step reaches the threshold (48 rows a step): readers and backend do not matter."""
        return self.threshold > STEP_ROWS

    @property
    def key(self) -> str:
        """Unique name: ``trace/tTHRESHOLD/BACKEND/rREADERS/COMPUTE/STEPS``, and ``/xSESSIONS-MODE`` when
        :attr:`multi`."""
        base = f"{trace_label(self.trace)}/t{self.threshold}/{self.backend}/r{self.readers}/{self.compute}/{self.steps}"
        return f"{base}/x{self.sessions}-{self.mode}" if self.multi else base

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(key=self.key, trace_label=trace_label(self.trace), serial=self.serial)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunConfig":
        try:
            return cls(str(d["trace"]), int(d["threshold"]), str(d["backend"]), int(d["readers"]),
                       str(d.get("compute", "none")), int(d.get("steps", 300)), int(d.get("sessions", 1)),
                       str(d.get("mode", "threads")))
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


def probe_positions(steps: int, every: int) -> np.ndarray:
    """Where a decode run's probe steps sit among its ``steps`` trace steps: int64 ``[m]``, the trace steps
    before each probe step -- one before every ``every``-th trace step and one after the last (none when
    ``every < 1``).  The measurement places them so (:func:`sim.measure.runs.session_loop`), the
    calibration and the cross-check replay them so."""
    if every < 1 or steps < 1:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(0, steps, every), [steps]]).astype(np.int64)


def us_list(seconds) -> list:
    """Times in seconds as a document's list of microseconds (0.01 us resolution)."""
    return [round(float(x) * 1e6, 2) for x in seconds]


def percentiles_ms(seconds, percentiles: Sequence[float] = (50, 90, 99, 99.9)) -> dict:
    """``{"mean", "p50", ..., "max"}`` of times in seconds, in milliseconds (``99.9`` is key ``"p999"``).

    All zeros for no times.  ``seconds`` is a 1-D float array.
    """
    x = np.asarray(seconds, dtype=np.float64)
    keys = ["p" + f"{p:g}".replace(".", "") for p in percentiles]
    if x.size == 0:
        return {k: 0.0 for k in ("mean", *keys, "max")}
    p = np.percentile(x, list(percentiles))
    out = {"mean": float(x.mean()) * 1e3}
    out.update({k: float(v) * 1e3 for k, v in zip(keys, p)})
    out["max"] = float(x.max()) * 1e3
    return out


def check_microbench(doc: Mapping) -> List[dict]:
    """The records of a microbenchmark document; refuses decode runs.

    Raises
    ------
    ArgumentError
        ``doc`` is a decode-run document, not a ``engram.microbench/1``
        document, has no records, or holds a record that is not a
        microbenchmark (kinds ``io``, ``compute``, ``hash``, ``cache``; names the record).
    """
    if not isinstance(doc, Mapping):
        raise ArgumentError("calibrate needs a microbenchmark document (a dict)")
    if doc.get("kind") == "decode_runs" or doc.get("schema") == RUNS_SCHEMA or "runs" in doc:
        raise ArgumentError("calibration uses microbenchmarks only: refusing a decode-run document")
    if doc.get("kind") != "microbench" or doc.get("schema") != MICRO_SCHEMA:
        raise ArgumentError(f"calibrate needs a {MICRO_SCHEMA!r} document, got kind {doc.get('kind')!r}, "
                            f"schema {doc.get('schema')!r}")
    recs = doc.get("records")
    if not isinstance(recs, list) or not recs:
        raise ArgumentError("microbenchmark document has no records")
    for i, r in enumerate(recs):
        if not isinstance(r, Mapping):
            raise ArgumentError(f"microbenchmark record {i} is not an object")
        bad = [f for f in RUN_FIELDS if f in r]
        if bad or r.get("kind") not in MICRO_KINDS:
            raise ArgumentError(f"calibration uses microbenchmarks only: record {i} (kind {r.get('kind')!r}"
                                f"{', fields ' + ', '.join(bad) if bad else ''}) is not a microbenchmark")
    return list(recs)


def check_runs(doc: Mapping) -> List[RunConfig]:
    """The configurations of a decode-run document.

    Raises
    ------
    ArgumentError
        Not a ``engram.decode-runs/1`` document.
    FormatError
        A configuration lacks a field (names it).
    """
    if doc.get("kind") != "decode_runs" or doc.get("schema") != RUNS_SCHEMA:
        raise ArgumentError(f"crosscheck needs a {RUNS_SCHEMA!r} document, got kind {doc.get('kind')!r}")
    return [RunConfig.from_dict(d) for d in doc.get("configs", [])]
