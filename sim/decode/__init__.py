"""The decode model: sessions x steps reading Engram rows on a shared device (SPEC §8, §9).

- :mod:`~sim.decode.reads` -- which of a step's requests reach the device: DRAM-resident rows, row caches,
  deduplication, drives; whether a run replays its trace;
- :mod:`~sim.decode.fast` -- the fast mode: sessions on a plain event loop, batches on segment queues;
- :mod:`~sim.decode.exact` -- the exact mode: every read a simpy event;
- :mod:`~sim.decode.speculative` -- speculative decoding: drafts, their acceptance, a verification step's rows;
- :mod:`~sim.decode.model` -- :func:`simulate_decode`, its result, and the compute of the reference run.
"""

from __future__ import annotations

from sim.core.params import Compute, Phases, Policy, Storage
from .model import (DecodeResult, DecodeRun, fit_compute, percentiles_ms, reference_compute, seed_reproduction,
                    session_reads, simulate_decode)
from .reads import StepReads, cache_hits, hot_rows, resident_mask, step_reads, wrap_info

__all__ = [
    "Compute",
    "DecodeResult",
    "DecodeRun",
    "Phases",
    "Policy",
    "StepReads",
    "Storage",
    "cache_hits",
    "fit_compute",
    "hot_rows",
    "percentiles_ms",
    "reference_compute",
    "resident_mask",
    "seed_reproduction",
    "session_reads",
    "simulate_decode",
    "step_reads",
    "wrap_info",
]
