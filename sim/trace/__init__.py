"""Token traces: the row ids each decode step reads, and how they repeat (SPEC §4, §8, §9).

- :mod:`~sim.trace.tokens` -- the real tokenizer and compressed token map, built once;
- :mod:`~sim.trace.sources` -- source specs (``stdlib:``, ``shared:``, ``text:``, ``tokens:``, paths);
- :mod:`~sim.trace.base` -- :class:`Trace`: row ids ``uint32 [T, layers, columns]`` from token ids;
- :mod:`~sim.trace.load` -- :func:`load_trace`: any source spec made into a trace;
- :mod:`~sim.trace.reuse` -- reuse statistics: the share of row reads that repeat, LRU row caches;
- :mod:`~sim.trace.rowcache` -- the engine's row cache policies replayed on a trace, beside Belady's bound;
- :mod:`~sim.trace.wrap` -- whether a run of sessions x steps reads past the end of its trace;
- :mod:`~sim.trace.shape` -- the per-order reuse shape of real text (measured profiles);
- :mod:`~sim.trace.synth` -- synthetic traces with a target reuse rate and Zipf skew;
- :mod:`~sim.trace.iolog` -- the engine's reads of a trace as an I/O log that ``fio --read_iolog`` replays.

Every name below is importable as ``from sim.trace import NAME``.
"""

from __future__ import annotations

from .base import Trace
from .load import load_trace
from .reuse import ReuseStats, lru_hit_rate, lru_hits, repeat_mask, reuse_stats
from .shape import PROFILES, ReuseProfile, measure_profile, order_targets
from .sources import CODE_SOURCE, SHARED_SOURCES, SYNTH_PREFIX, builtin_sources, read_prompts, read_token_file, resolve_source
from .synth import SynthSpec, max_reuse, synthesize, synthesize_spec
from .wrap import WrapInfo, session_offsets, wrap_info

__all__ = [
    "CODE_SOURCE",
    "PROFILES",
    "ReuseProfile",
    "ReuseStats",
    "SHARED_SOURCES",
    "SYNTH_PREFIX",
    "SynthSpec",
    "Trace",
    "WrapInfo",
    "builtin_sources",
    "load_trace",
    "lru_hit_rate",
    "lru_hits",
    "max_reuse",
    "measure_profile",
    "order_targets",
    "read_prompts",
    "read_token_file",
    "repeat_mask",
    "resolve_source",
    "reuse_stats",
    "session_offsets",
    "synthesize",
    "synthesize_spec",
    "wrap_info",
]
