"""sim: a simpy model of Engram row reads that predicts decode tokens/s (SPEC §9), and the measurements
of the real engine it is calibrated from and checked against.

Read top-down; each stage imports only the stages above it:

- :mod:`sim.core.io`, :mod:`sim.core.schema` -- documents in and out, their layouts and checks
- :mod:`sim.core.params` -- the read policy and the compute of a step (and the defaults)
- :mod:`sim.trace` -- traces from real text or synthetic ones of any reuse rate (row ids per step), their reuse
  statistics, and their reads as fio I/O logs
- :mod:`sim.device` -- device models: read latency by queue depth (measured, presets, parametric SSD)
- :mod:`sim.decode`, :mod:`sim.decode.prefill` -- the simpy models: sessions x decode steps; one prompt's prefill
- :mod:`sim.measure` -- the real engine timed (writes documents; nothing in the simulator imports it)
- :mod:`sim.check.calibrate` -- microbenchmark documents -> device and compute models
- :mod:`sim.check.crosscheck` -- predicted vs measured decode runs
- :mod:`sim.check.planner` -- the same runs predicted from a device's fio JSON or datasheet string only (planner mode)
- :mod:`sim.sweep` -- what-if studies (TOML grids) in local processes or on a Dask cluster
- :mod:`sim.report` -- the plotted report
- :mod:`sim.cli.demo`, :mod:`sim.cli` -- the main job, and every command (``engram sim ...``, ``engram measure``, ...)

``sim`` imports ``engram``; ``engram`` never imports ``sim``.  The names
below are the simulator's public API (serving: :mod:`sim.serve`).
"""

from __future__ import annotations

from .decode import DecodeResult, DecodeRun, fit_compute, reference_compute, seed_reproduction, simulate_decode
from .device import (SEED_REFERENCE, Datasheet, Device, EmpiricalDevice, LatencyDist, ParametricSSD, PoissonLoadResult,
                     device_from_fio, load_device, poisson_load, preset, preset_names, ssd_from_figures, with_tail)
from sim.core.io import packaged_data_path, shared_data_dir
from sim.core.params import Compute, Phases, Policy, Storage
from sim.decode.prefill import PrefillResult, PrefillRun, simulate_prefill
from .trace import (CODE_SOURCE, ReuseStats, Trace, builtin_sources, load_trace, lru_hit_rate, lru_hits, repeat_mask,
                    resolve_source, reuse_stats)

__all__ = [
    "CODE_SOURCE",
    "SEED_REFERENCE",
    "Compute",
    "Datasheet",
    "DecodeResult",
    "DecodeRun",
    "Device",
    "EmpiricalDevice",
    "LatencyDist",
    "ParametricSSD",
    "Phases",
    "Policy",
    "PoissonLoadResult",
    "PrefillResult",
    "PrefillRun",
    "ReuseStats",
    "Storage",
    "Trace",
    "builtin_sources",
    "device_from_fio",
    "fit_compute",
    "load_device",
    "load_trace",
    "packaged_data_path",
    "lru_hit_rate",
    "lru_hits",
    "poisson_load",
    "preset",
    "preset_names",
    "reference_compute",
    "repeat_mask",
    "resolve_source",
    "reuse_stats",
    "seed_reproduction",
    "shared_data_dir",
    "simulate_decode",
    "simulate_prefill",
    "ssd_from_figures",
    "with_tail",
]
