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
  calibration never sees the runs it is checked against; checks its probe
  records, :func:`check_probe`), :func:`check_runs` (every configuration and
  run, :func:`check_run`), :func:`check_windows` (a calibration's windows),
  on the typed fields of :func:`check_int`, :func:`check_number`,
  :func:`check_numbers`, :func:`check_str`: a hand-edited or corrupt document
  is refused before any work, naming the record and the field.

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
                                                          # sim.check.windows.window_state
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
     #   "sessions": {...}, "single": {...}, "windows_probed", "goals": {"targets", "coverage", "capacity",
     #   "row_cache"}, and where the runs had a row cache "row_cache": {"configurations",
     #   "hit_rate_max_abs_error", "hit_rate_within_one_point"} (its check "row_cache_hit_rate" in "pass")
     # "session_rows": like "rows", for several sessions (measured/predicted "slowest_tokens_per_s",
     #   "aggregate_tokens_per_s"); every row has "interval": {"low", "high", "slowest_low", "slowest_high", "z",
     #   "run_sd": [...] (window and model combined), "window_sd": [...], "model_sd", "independent_low",
     #   "independent_high"}, "inside_interval", "runs_inside", predicted "tokens_per_s_calibrated" (the
     #   calibrated device and compute alone), predicted "tokens_per_s_runs", "step_p50_ms_runs",
     #   "tokens_per_s_calibrated_runs" (each run's), and error "tokens_per_s_calibrated" and
     #   "tokens_per_s_of_medians" (errors are the median over runs of each run's; see sim.check.crosscheck)
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
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from .params import BACKENDS

__all__ = [
    "MAX_BLAS",
    "MAX_EMULATED_MS",
    "CALIBRATION_SCHEMA",
    "CAPACITY_SCHEMA",
    "CROSSCHECK_SCHEMA",
    "MICRO_KINDS",
    "MICRO_SCHEMA",
    "RUNS_SCHEMA",
    "RUN_FIELDS",
    "RUN_SUMMARIES",
    "SERVE_SCHEMA",
    "SESSION_MODES",
    "STEP_ROWS",
    "SWEEP_SCHEMA",
    "TABLE_COLUMNS",
    "US",
    "ComputeSpec",
    "RunConfig",
    "check_int",
    "check_list",
    "check_mapping",
    "check_microbench",
    "LATENCY",
    "check_number",
    "check_numbers",
    "check_probe",
    "check_run",
    "check_runs",
    "check_str",
    "check_windows",
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
#: Schema of serving tables (their ``.meta.json``; :mod:`sim.serve`).
SERVE_SCHEMA = "engram.serve/1"

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


#: The longest emulated compute a step takes (spin:MS, sleep:MS), milliseconds: past it a spec is a typo, not a step.
MAX_EMULATED_MS = 60_000
#: The most 256x256 float32 products a step's blas:N runs (about 3.4 TFLOP).
MAX_BLAS = 100_000


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
            An unknown part or a bad amount (names it): negative, not finite, a blas count that is not whole,
            or past :data:`MAX_EMULATED_MS` / :data:`MAX_BLAS`.
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
            bound = MAX_BLAS if kind == "blas" else MAX_EMULATED_MS
            if v > bound:
                raise ArgumentError(f"compute spec {text!r}: {kind}:{amount} is past the bound of {bound:,} "
                                    f"{'products' if kind == 'blas' else 'ms'} a step")
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
    draft_tokens : int
        Speculative decoding (:mod:`sim.measure.runs`, :mod:`sim.decode.speculative`): tokens drafted a
        verification step (0: off, the default).  ``steps`` then counts the tokens of the stretch the run
        emits, not its verification steps.  One session in a thread, a compute other than the mixer.
    acceptance : float
        Probability that a draft is the true next token of the replayed text (else a random id), in [0, 1].
    prefetch_drafts : bool
        The drafts' rows read in the background (``Session.prefetch``) while the step before computes.
    """

    trace: str
    threshold: int
    backend: str
    readers: int
    compute: str = "none"
    steps: int = 300
    sessions: int = 1
    mode: str = "threads"
    draft_tokens: int = 0
    acceptance: float = 0.0
    prefetch_drafts: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ArgumentError(f"backend must be 'pread' or 'io_uring', got {self.backend!r}")
        if self.threshold < 1 or self.readers < 1 or self.steps < 1 or self.sessions < 1:
            raise ArgumentError(f"threshold, readers, steps and sessions must be >= 1, got "
                                f"{self.threshold}, {self.readers}, {self.steps}, {self.sessions}")
        if self.mode not in SESSION_MODES:
            raise ArgumentError(f"mode must be one of {SESSION_MODES}, got {self.mode!r}")
        object.__setattr__(self, "compute", ComputeSpec.parse(self.compute).label)
        k, a = self.draft_tokens, self.acceptance
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ArgumentError(f"draft_tokens must be an integer >= 0 (0: off), got {k!r}")
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise ArgumentError(f"acceptance must be a number in [0, 1], got {a!r}")
        object.__setattr__(self, "acceptance", float(a))
        object.__setattr__(self, "prefetch_drafts", bool(self.prefetch_drafts))
        if k and (self.multi or ComputeSpec.parse(self.compute).mixer):
            raise ArgumentError(f"speculative runs (draft_tokens {k}) are single sessions in a thread with a "
                                f"compute other than the mixer, got {self.sessions} x {self.mode}, {self.compute}")

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
        if self.draft_tokens:  # speculative: /dK-aA[-prefetch]
            base += f"/d{self.draft_tokens}-a{self.acceptance:g}" + ("-prefetch" if self.prefetch_drafts else "")
        return f"{base}/x{self.sessions}-{self.mode}" if self.multi else base

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.draft_tokens:  # a run without drafts keeps the document it had
            for name in ("draft_tokens", "acceptance", "prefetch_drafts"):
                d.pop(name)
        d.update(key=self.key, trace_label=trace_label(self.trace), serial=self.serial)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RunConfig":
        """Inverse of :meth:`to_dict` (extra fields are ignored).

        Raises
        ------
        FormatError
            Not a mapping, a field missing, of the wrong type (``steps: "x"``, ``threshold: 8.5``) or out of
            range (names the field and its value).
        """
        if not isinstance(d, Mapping):
            raise FormatError(f"run configuration: expected a JSON object, got {_show(d)}")
        where = "run configuration"
        try:
            missing = [k for k in ("trace", "threshold", "backend", "readers") if k not in d]
            if missing:
                raise KeyError(missing[0])
            return cls(check_str(where, "trace", d["trace"]), check_int(where, "threshold", d["threshold"], 1),
                       check_str(where, "backend", d["backend"]), check_int(where, "readers", d["readers"], 1),
                       check_str(where, "compute", d.get("compute", "none")),
                       check_int(where, "steps", d.get("steps", 300), 1),
                       check_int(where, "sessions", d.get("sessions", 1), 1),
                       check_str(where, "mode", d.get("mode", "threads")),
                       check_int(where, "draft_tokens", d.get("draft_tokens", 0), 0),
                       d.get("acceptance", 0.0), d.get("prefetch_drafts", False) is True)
        except KeyError as exc:
            raise FormatError(f"{where}: missing field {exc}") from None
        except ArgumentError as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"{where}: {exc}") from None

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


# ------------------------------------------------------------------ typed fields of the documents
def _show(value) -> str:
    """A value as an error message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(where: str, d: Mapping, key: str):
    """``d[key]``, or a :class:`FormatError` naming ``where`` and the missing ``key``."""
    if key not in d:
        raise FormatError(f"{where}: missing field {key!r}")
    return d[key]


def check_str(where: str, key: str, value) -> str:
    """``value`` when it is a string.

    Raises
    ------
    FormatError
        Names ``where``, ``key`` and the value.
    """
    if not isinstance(value, str):
        raise FormatError(f"{where}: {key} = {_show(value)} is not a string")
    return value


def check_int(where: str, key: str, value, low: int = 0) -> int:
    """``value`` as an int when it is a whole number (an int, not a bool or a float) ``>= low``.

    Raises
    ------
    FormatError
        Names ``where``, ``key`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise FormatError(f"{where}: {key} = {_show(value)} is not a whole number")
    if value < low:
        raise FormatError(f"{where}: {key} = {int(value)} must be >= {low}")
    return int(value)


#: ``check_number(..., low=LATENCY)``: the field is a latency (a read, a batch, a step, in s, ms or us): a finite
#: number > 0.  Zero, negatives and NaN are not latencies (a device or calibration with zero latencies passed
#: the checks and then divided by zero); every latency field of every document is checked with it.
LATENCY = "latency"


def check_number(where: str, key: str, value, low: Union[float, None, str] = 0.0, *, above: bool = False,
                 high: Optional[float] = None, none: bool = False) -> Optional[float]:
    """``value`` as a float when it is a finite number (not a bool or a string) ``>= low`` (``> low`` with
    ``above``; any finite number when ``low`` is None) and ``<= high``; None passes when ``none``.
    ``low=LATENCY``: a latency, a finite number > 0 (:data:`LATENCY`).

    Raises
    ------
    FormatError
        Names ``where``, ``key`` and the value.
    """
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise FormatError(f"{where}: {key} = {_show(value)} is not a number")
    x = float(value)
    if low == LATENCY:
        if not (np.isfinite(x) and x > 0):
            raise FormatError(f"{where}: {key} = {x:g} is not a latency (a finite number > 0)")
        return x
    ok = np.isfinite(x) and (low is None or (x > low if above else x >= low)) and (high is None or x <= high)
    if not ok:
        want = "a finite number" if low is None else f"a finite number {'>' if above else '>='} {low:g}"
        raise FormatError(f"{where}: {key} = {x:g} must be {want}" + (f" and <= {high:g}" if high is not None else ""))
    return x


def check_numbers(where: str, key: str, value, low: Union[float, None, str] = 0.0, *, above: bool = False,
                  whole: bool = False, length: Optional[int] = None, of: str = "") -> list:
    """``value`` when it is a list of numbers each as :func:`check_number` (``whole``: :func:`check_int`)
    wants, of ``length`` values when given (``of`` names what sets it).

    Raises
    ------
    FormatError
        Names ``where``, ``key``, the first bad value and its index, or the two lengths.
    """
    check_list(where, key, value)
    if length is not None and len(value) != length:
        raise FormatError(f"{where}: {key} has {len(value)} values, {of} has {length}")
    kinds = (int,) if whole else (int, float)
    if all(type(x) in kinds for x in value):  # the common case, checked at once
        x = np.asarray(value, dtype=np.float64)
        if low == LATENCY:
            ok = np.isfinite(x) & (x > 0)
        else:
            ok = np.isfinite(x) if low is None else np.isfinite(x) & ((x > low) if above else (x >= low))
        if ok.all():
            return list(value)
    for j, x in enumerate(value):
        if whole:
            check_int(where, f"{key}[{j}]", x, int(low or 0))
        else:
            check_number(where, f"{key}[{j}]", x, low, above=above)
    return list(value)


def check_mapping(where: str, key: str, value, none: bool = False) -> Optional[Mapping]:
    """``value`` when it is a JSON object (a mapping); None passes when ``none``.

    Raises
    ------
    FormatError
        Names ``where``, ``key`` and the value.
    """
    if value is None and none:
        return None
    if not isinstance(value, Mapping):
        raise FormatError(f"{where}: {key}: expected a JSON object, got {_show(value)}")
    return value


def check_list(where: str, key: str, value) -> list:
    """``value`` when it is a list (a tuple or an array too).

    Raises
    ------
    FormatError
        Names ``where``, ``key`` and the value.
    """
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise FormatError(f"{where}: {key}: expected a list, got {_show(value)}")
    return value


# ------------------------------------------------------------------ checks at the door
def check_microbench(doc: Mapping) -> List[dict]:
    """The records of a microbenchmark document; refuses decode runs and malformed probe records.

    Raises
    ------
    ArgumentError
        ``doc`` is a decode-run document, not a ``engram.microbench/1``
        document, has no records, or holds a record that is not a
        microbenchmark (kinds ``io``, ``compute``, ``hash``, ``cache``; names the record).
    FormatError
        A probe record (tool ``"session"``) with a field missing, of the wrong type or out of range, or a
        window probed twice (:func:`check_probe`; names the record, its window, the field and the value).
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
    seen: Dict[str, int] = {}
    for i, r in enumerate(recs):
        if not isinstance(r, Mapping):
            raise ArgumentError(f"microbenchmark record {i} is not an object")
        bad = [f for f in RUN_FIELDS if f in r]
        if bad or r.get("kind") not in MICRO_KINDS:
            raise ArgumentError(f"calibration uses microbenchmarks only: record {i} (kind {r.get('kind')!r}"
                                f"{', fields ' + ', '.join(bad) if bad else ''}) is not a microbenchmark")
        if r.get("tool") == "session" or r.get("probe"):
            window = check_probe(i, r)
            if window in seen:
                raise FormatError(f"record {i}: window {window!r} is probed twice (records {seen[window]} and {i}): "
                                  "one probe record a decode run")
            seen[window] = i
    return list(recs)


def check_probe(i: int, r: Mapping) -> str:
    """The window id of probe record ``i`` (tool ``"session"``, :func:`sim.measure.runs.probe_record`), once
    its fields are checked: ``probe`` a non-empty string; ``batch_us`` a non-empty list of finite numbers
    > 0; ``compute_us`` (finite >= 0), ``t_us`` (finite) and ``distinct`` (whole numbers >= 1) absent or
    as long as ``batch_us``; ``threshold``, ``readers`` and, when present, ``sessions``, ``session_steps``
    and ``qd`` whole numbers >= 1; ``offsets_s`` absent or one finite number >= 0 a session; ``backend``
    and ``compute`` (a :class:`ComputeSpec`) strings.

    Raises
    ------
    FormatError
        Names the record, its window, the field and the value.
    """
    window = r.get("probe")
    if not isinstance(window, str) or not window:
        raise FormatError(f"record {i}: probe = {_show(window)} is not a window id (a non-empty string)")
    where = f"record {i} (probe steps of window {window!r})"
    n = len(check_numbers(where, "batch_us", _field(where, r, "batch_us"), LATENCY))
    if n == 0:
        raise FormatError(f"{where}: batch_us is empty (one read time a probe step)")
    for key, low, whole in (("compute_us", 0.0, False), ("t_us", None, False), ("distinct", 1, True)):
        if r.get(key) is not None:
            check_numbers(where, key, r[key], low, whole=whole, length=n, of="batch_us")
    for key in ("threshold", "readers"):
        check_int(where, key, _field(where, r, key), 1)
    for key in ("sessions", "session_steps", "qd"):
        if r.get(key) is not None:
            check_int(where, key, r[key], 1)
    if r.get("offsets_s") is not None:
        check_numbers(where, "offsets_s", r["offsets_s"], 0.0, length=int(r.get("sessions") or 1), of="sessions")
    check_str(where, "backend", _field(where, r, "backend"))
    try:
        ComputeSpec.parse(check_str(where, "compute", r.get("compute", "none")))
    except ArgumentError as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: compute: {exc}") from None
    return window


def check_windows(windows) -> Dict[str, dict]:
    """The ``windows`` of a calibration document, checked: each a mapping with ``device`` a latency (a finite
    number > 0, :data:`LATENCY`), ``compute`` None or a latency, ``read_se``, ``compute_se`` and ``step_cv`` None or
    finite numbers >= 0, ``threshold``, ``readers``, ``sessions`` and ``probe_steps`` whole numbers >= 1,
    ``batch_samples_us`` absent (calibrations before them) or a list of latencies (finite numbers > 0:
    :data:`LATENCY`), ``compute_samples_us`` absent or a list of finite numbers >= 0, and ``backend`` a
    string.  None (no windows) gives ``{}``.

    Raises
    ------
    FormatError
        Names the window, the field and the value.
    """
    if windows is None:
        return {}
    if not isinstance(windows, Mapping):
        raise FormatError(f"windows: expected a JSON object, got {_show(windows)}")
    out = {}
    for wid, w in windows.items():
        where = f"window {wid!r}"
        check_mapping(where, "state", w)
        check_number(where, "device", _field(where, w, "device"), LATENCY)
        check_number(where, "compute", w.get("compute"), LATENCY, none=True)
        for key in ("read_se", "compute_se", "step_cv"):
            check_number(where, key, w.get(key), 0.0, none=True)
        for key in ("threshold", "readers", "sessions", "probe_steps"):
            check_int(where, key, _field(where, w, key), 1)
        if w.get("batch_samples_us") is not None:
            check_numbers(where, "batch_samples_us", w["batch_samples_us"], LATENCY)
        if w.get("compute_samples_us") is not None:
            check_numbers(where, "compute_samples_us", w["compute_samples_us"], 0.0)
        check_str(where, "backend", _field(where, w, "backend"))
        out[str(wid)] = dict(w)
    return out


def check_runs(doc: Mapping, file: Optional[Union[str, os.PathLike]] = None) -> List[RunConfig]:
    """The configurations of a decode-run document, once every configuration and run is checked
    (:func:`check_run`; ``params.capacity_target`` None or a finite number > 0, ``traces`` None or a
    mapping, ``configs`` and ``runs`` lists).

    Raises
    ------
    ArgumentError
        ``doc`` is not a mapping, or not a ``engram.decode-runs/1`` document.
    FormatError
        A configuration or a run lacks a field or holds one of the wrong type or out of range (names
        ``file`` when given, the configuration or the run -- its configuration key and round -- the field
        and the value).
    """
    if not isinstance(doc, Mapping):
        raise ArgumentError(f"crosscheck needs a decode-run document (a mapping), got {type(doc).__name__}")
    if doc.get("kind") != "decode_runs" or doc.get("schema") != RUNS_SCHEMA:
        raise ArgumentError(f"crosscheck needs a {RUNS_SCHEMA!r} document, got kind {doc.get('kind')!r}")
    try:
        configs = doc.get("configs", [])
        if not isinstance(configs, list):
            raise FormatError(f"configs: expected a list, got {_show(configs)}")
        out = []
        for i, d in enumerate(configs):
            try:
                out.append(RunConfig.from_dict(d))
            except FormatError as exc:
                key = d.get("key") if isinstance(d, Mapping) else None
                raise FormatError(f"configs[{i}]{f' ({key})' if key else ''}: {exc}") from None
        runs = doc.get("runs", [])
        if not isinstance(runs, list):
            raise FormatError(f"runs: expected a list, got {_show(runs)}")
        for i, r in enumerate(runs):
            check_run(i, r)
        params = check_mapping("document", "params", doc.get("params"), none=True) or {}
        check_number("params", "capacity_target", params.get("capacity_target"), 0.0, above=True, none=True)
        traces = check_mapping("document", "traces", doc.get("traces"), none=True) or {}
        for spec, rel in traces.items():
            check_str("traces", repr(spec), rel)
    except FormatError as exc:
        raise FormatError(f"{file}: {exc}" if file is not None else str(exc)) from None
    return out


#: Per-step summaries of a run (``{mean, p50, ...}`` in ms) and the keys of each the cross-check reads.
RUN_SUMMARIES = {"step_ms": ("mean", "p50", "p95"), "read_ms": ("mean",), "compute_ms": ("mean",)}


def check_run(i: int, r: Mapping) -> None:
    """Check run ``i`` of a decode-run document: ``config`` a string; ``tokens_per_s`` a finite number > 0,
    ``slowest_tokens_per_s`` and ``aggregate_tokens_per_s`` too when present; ``step_ms``, ``read_ms`` and
    ``compute_ms`` mappings of finite numbers >= 0 holding the keys of :data:`RUN_SUMMARIES`;
    ``background`` None or a mapping whose ``cpu`` and ``steal`` are None or in [0, 1]; ``window`` None or
    a string; ``round``, ``probe_every``, ``start``, ``threads`` and each of ``starts`` whole numbers >= 0;
    ``start_offsets_s`` and ``step_us`` lists of finite numbers >= 0 (each when present).

    Raises
    ------
    FormatError
        Names the run (its index, configuration key and round), the field and the value.
    """
    if not isinstance(r, Mapping):
        raise FormatError(f"runs[{i}]: expected a JSON object, got {_show(r)}")
    config = check_str(f"runs[{i}]", "config", _field(f"runs[{i}]", r, "config"))
    where = f"runs[{i}] (configuration {config!r}, round {_show(r.get('round'))})"
    check_number(where, "tokens_per_s", _field(where, r, "tokens_per_s"), 0.0, above=True)
    for key in ("slowest_tokens_per_s", "aggregate_tokens_per_s"):
        if key in r:
            check_number(where, key, r[key], 0.0, above=True)
    for name, used in RUN_SUMMARIES.items():
        summary = check_mapping(where, name, _field(where, r, name))
        for key in used:
            _field(f"{where}: {name}", summary, key)
        for key, x in summary.items():
            check_number(where, f"{name}.{key}", x, 0.0)
    bg = check_mapping(where, "background", r.get("background"), none=True) or {}
    for key in ("cpu", "steal"):
        check_number(where, f"background.{key}", bg.get(key), 0.0, high=1.0, none=True)
    if r.get("window") is not None:
        check_str(where, "window", r["window"])
    for key in ("round", "probe_every", "start", "threads"):
        if key in r:
            check_int(where, key, r[key], 0)
    if r.get("starts") is not None:
        check_numbers(where, "starts", r["starts"], 0, whole=True)
    if r.get("start_offsets_s") is not None:
        check_numbers(where, "start_offsets_s", r["start_offsets_s"], 0.0)
    if r.get("step_us") is not None:
        check_numbers(where, "step_us", r["step_us"], LATENCY)
