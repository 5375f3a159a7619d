"""Measured runs of the real engine: decode loops over real traces, and microbenchmarks (SPEC §8, §9).

Two kinds of measurement, written to two separate documents (their layout:
:mod:`sim.core.schema`) so that the calibration (:mod:`sim.check.calibrate`) can be
shown never to read the runs it is checked against (:mod:`sim.check.crosscheck`);
nothing in the simulator imports this package.

- :mod:`~sim.measure.configs` -- the measured grid (trace x threshold x backend x readers x compute);
- :mod:`~sim.measure.compute` -- a step's compute: the Engram mixer and emulated loads;
- :mod:`~sim.measure.microbench` -- ``microbench.json``: the engine's reads by queue depth, fio, compute, hash;
- :mod:`~sim.measure.runs` -- ``runs.json``: the real decode loop over a stretch of a real trace;
- :mod:`~sim.measure.sessions` -- N concurrent sessions (threads or processes) on one device;
- :mod:`~sim.measure.environment` -- the machine and the model file;
- :mod:`~sim.measure.background` -- the load of other processes, and waiting for a quiet machine;
- :mod:`~sim.measure.settings`, :mod:`~sim.measure.tasks`, :mod:`~sim.measure.run` -- the whole
  measurement: typed tasks in interleaved, shuffled rounds;
- :mod:`~sim.measure.throttle`, :mod:`~sim.measure.devices` -- devices to check against, made here: the disk
  behind read-IOPS throttles (cgroups), a copy on tmpfs, with fio beside each device's runs.

The rest of the model's layers (attention, experts) does not exist here: the
step's compute is the Engram projection and gated add (``mixer``), optionally
plus an emulated load (``spin:MS`` busy-waits, ``sleep:MS`` sleeps, ``blas:N``
runs N fixed 256x256 float32 matrix products), or nothing (``none``: the step
is the read alone).  Compute specs combine with ``+`` (``mixer+spin:5``).
"""

from __future__ import annotations

from .background import Background, QuietGuard, is_quiet
from .compute import compute_runner
from .configs import (MEASURED_CAPACITY_COMPUTE, MEASURED_CAPACITY_TARGET, DEFAULT_DEPTHS, DEFAULT_POLICIES,
                      DEFAULT_SCALE,
                      DEFAULT_TRACES, SESSION_COUNTS, backends_here, default_grid, grid, quick_grid, session_grid,
                      usable_configs)
from .environment import ensure_model, file_info, machine_info
from .microbench import (FIO_PERCENTILES, cache_check, compute_microbench, fio_microbench, hash_microbench,
                         io_microbench, io_shared)
from .run import measure
from .runs import DecodeLoop, decode_run, probe_record, segments, trace_tokens_needed
from .sessions import sessions_run
from .settings import PROBES_MIN, Settings

__all__ = [
    "MEASURED_CAPACITY_COMPUTE",
    "MEASURED_CAPACITY_TARGET",
    "SESSION_COUNTS",
    "backends_here",
    "cache_check",
    "io_shared",
    "session_grid",
    "sessions_run",
    "usable_configs",
    "DEFAULT_DEPTHS",
    "DEFAULT_POLICIES",
    "DEFAULT_SCALE",
    "DEFAULT_TRACES",
    "FIO_PERCENTILES",
    "Background",
    "QuietGuard",
    "PROBES_MIN", "Settings",
    "DecodeLoop",
    "compute_microbench",
    "compute_runner",
    "decode_run",
    "default_grid",
    "ensure_model",
    "file_info",
    "fio_microbench",
    "grid",
    "hash_microbench",
    "io_microbench",
    "is_quiet",
    "machine_info",
    "measure",
    "probe_record",
    "quick_grid",
    "segments",
    "trace_tokens_needed",
]
