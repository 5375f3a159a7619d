"""sim: a simpy model of Engram row reads that predicts decode tokens/s (SPEC §9).

- :mod:`sim.trace` -- traces from real text (row ids per step) and their reuse statistics
- :mod:`sim.device` -- device models: read latency by queue depth (measured, presets, parametric SSD)
- :mod:`sim.decode` -- sessions x decode steps on a shared device
- :mod:`sim.prefill` -- one prompt's rows streamed in chunks behind the layers' compute
- :mod:`sim.cli` -- ``engram sim ...``

``sim`` imports ``engram``; ``engram`` never imports ``sim``.  The names below
are loaded on first use, so ``import sim`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "trace": ("CODE_SOURCE", "ReuseStats", "Trace", "builtin_sources", "load_trace", "lru_hit_rate", "lru_hits",
              "repeat_mask", "resolve_source", "reuse_stats", "shared_data_dir"),
    "device": ("Device", "EmpiricalDevice", "LatencyDist", "ParametricSSD", "PoissonLoadResult", "load_device",
               "poisson_load", "preset", "preset_names"),
    "decode": ("Compute", "DecodeResult", "Policy", "SEED_REFERENCE", "fit_compute", "seed_reproduction",
               "simulate_decode"),
    "prefill": ("PrefillResult", "simulate_prefill"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
