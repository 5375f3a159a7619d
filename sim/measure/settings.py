"""How much to measure: rounds, queue depths, batch counts, and how quiet the machine must be."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence, Tuple

import numpy as np

from engram.errors import ArgumentError
from engram.rowcache import POLICIES as CACHE_POLICIES, RowCache, cache_rows, parse_size

from sim.core.params import BACKENDS
from sim.core.schema import RunConfig
from .configs import MEASURED_CAPACITY_TARGET, DEFAULT_DEPTHS

__all__ = ["PROBES_MIN", "Settings"]

#: How errors name :attr:`Settings.cache_bytes`: by the option of ``engram measure`` that sets it.
_CACHE_BYTES = "--cache-bytes"

#: Probe steps a decode run has a session at least (when it probes at all): see :meth:`Settings.run_probe_every`.
PROBES_MIN = 16


def _whole(x) -> bool:
    """True for an int (a NumPy integer too), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclass(frozen=True)
class Settings:
    """The settings of one measurement (:func:`sim.measure.measure`); written to both documents as ``params``.

    Attributes
    ----------
    rounds : int
        Interleaved rounds: every task runs once a round, in an order shuffled with ``seed`` and the round.
    depths : sequence of int
        Queue depths of the I/O microbenchmarks (readers = ring depth = depth; 1 is serial).
    backends : sequence of str, optional
        Backends of the I/O microbenchmarks (default: those of the configurations, else both).
    micro, decode : bool
        Run the microbenchmarks, the decode runs.
    fio : bool
        Run fio at each depth (when installed), in the first ``fio_rounds`` rounds, ``fio_seconds`` each.
    io_batches : int
        48-row batches of the serial microbenchmark, and of a chunk where configurations without compute read.
    io_chunks : int
        Chunks a round of 48-row batches at the readers that configurations without compute use.
    depth_batches : int
        48-row batches at the other depths.
    think_batches, think_chunks : int
        48-row batches (``mixer_samples`` for the mixer) of a chunk with a compute between batches, and chunks a
        round (0: none).
    big_seconds : float
        Seconds of large batches at each depth (steady-state reads/s).
    single_rows : int
        Single-row serial reads.
    shared_seconds : float
        Seconds of large batches from several submitters at once (one task per submitter count).
    submitters : sequence of int, optional
        Submitter counts of those reads (default: the session counts of the multi-session configurations).
    probe_every : int
        A probe step (a random token id through the run's own session, with its compute) before every
        ``probe_every``-th step of a decode run and after its last (0: no probes; the cross-check then
        predicts with the calibrated device alone).  A short run probes more often, so that it has
        :data:`PROBES_MIN` probe steps a session at least (:meth:`run_probe_every`): a window's own shape
        of read and compute needs them (:mod:`sim.check.windows`).
    cache_batches : int
        48-row batches of the cold/warm cache check (0: none).
    capacity_target : float
        Tokens/s the slowest session of a multi-session run must reach (the measured capacity is the
        largest session count that does).
    compute_samples, mixer_samples : int
        Timed calls of each compute spec (``mixer_samples`` when it holds the mixer).
    warmup : int
        Steps on random tokens before each decode run.
    cache_bytes : int
        Decode runs read through a row cache of this budget (:class:`engram.RowCache`; 0: none, the
        default): a fresh cache each run, filled by its trace steps only (warm-up and probe steps go past
        it), shared by the sessions of a run in threads, one a session with sessions as processes.
        The runs record its hit rate beside the one predicted on the same stretch of the trace
        (:mod:`sim.trace.rowcache`: the same policy code).
    cache_policy : str
        Its policy (``tinylfu``, the engine's default, or ``lru``).
    seed : int
        Seed of row ids, orders and residuals.
    max_background_cpu, max_background_iops, quiet_wait, redo, wait_budget
        Waiting for a quiet machine (:class:`sim.measure.background.QuietGuard`): none when
        ``max_background_cpu`` is ``None``.
    """

    rounds: int = 7
    depths: Sequence[int] = DEFAULT_DEPTHS
    backends: Optional[Sequence[str]] = None
    micro: bool = True
    decode: bool = True
    fio: bool = True
    fio_seconds: float = 0.5
    fio_rounds: int = 2
    io_batches: int = 150
    io_chunks: int = 8
    depth_batches: int = 60
    think_batches: int = 100
    think_chunks: int = 2
    big_seconds: float = 0.1
    single_rows: int = 200
    shared_seconds: float = 0.15
    submitters: Optional[Sequence[int]] = None
    probe_every: int = 2
    cache_batches: int = 100
    capacity_target: float = MEASURED_CAPACITY_TARGET
    compute_samples: int = 100
    mixer_samples: int = 15
    warmup: int = 8
    seed: int = 0
    max_background_cpu: Optional[float] = None
    max_background_iops: float = 1000.0
    quiet_wait: float = 20.0
    redo: int = 1
    wait_budget: float = 120.0
    cache_bytes: int = 0
    cache_policy: str = "tinylfu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_bytes", parse_size(self.cache_bytes, _CACHE_BYTES))
        if self.cache_policy not in CACHE_POLICIES:
            raise ArgumentError(f"cache_policy must be one of {', '.join(CACHE_POLICIES)}, got {self.cache_policy!r}")
        if self.cache_bytes:
            cache_rows(self.cache_bytes, what=_CACHE_BYTES)  # a budget below a row or beyond memory, named
            RowCache(self.cache_bytes, self.cache_policy)
        if self.rounds < 1:
            raise ArgumentError(f"rounds must be >= 1, got {self.rounds}")
        if not (self.micro or self.decode):
            raise ArgumentError("nothing to measure: both microbenchmarks and decode runs are off")
        if not _whole(self.probe_every) or self.probe_every < 0:
            raise ArgumentError(f"probe_every must be a whole number >= 0, got {self.probe_every!r}")

    def run_cache(self):
        """A fresh row cache for one decode run (None without ``cache_bytes``)."""
        return RowCache(self.cache_bytes, self.cache_policy) if self.cache_bytes else None

    def run_probe_every(self, steps: int) -> int:
        """The probe spacing of a decode run of ``steps`` trace steps a session: ``probe_every``, or less so
        that the run has :data:`PROBES_MIN` probe steps (one probe step a trace step at the closest); 0 stays
        0 (no probes).

        Raises
        ------
        ArgumentError
            ``steps`` is not a whole number >= 1.
        """
        if not _whole(steps) or steps < 1:
            raise ArgumentError(f"steps must be a whole number >= 1, got {steps!r}")
        if self.probe_every < 1:
            return 0
        return max(1, min(self.probe_every, int(steps) // PROBES_MIN))

    def resolved_backends(self, configs: Sequence[RunConfig],
                          usable: Optional[Sequence[str]] = None) -> Tuple[str, ...]:
        """The backends to microbenchmark: those asked (default: those of the configurations, else both)
        that start here (``usable``; default: every backend).

        Raises
        ------
        ArgumentError
            A backend other than ``pread`` and ``io_uring``, or none that starts here.
        """
        backends = tuple(self.backends or sorted({c.backend for c in configs}) or BACKENDS)
        for be in backends:
            if be not in BACKENDS:
                raise ArgumentError(f"backend must be 'pread' or 'io_uring', got {be!r}")
        if usable is not None:
            kept = tuple(b for b in backends if b in usable)
            if not kept:
                raise ArgumentError(f"none of the backends {list(backends)} starts on this machine "
                                    f"(usable: {list(usable)}; see engram info)")
            backends = kept
        return backends

    def resolved_depths(self) -> list:
        """The queue depths, sorted, without repeats.

        Raises
        ------
        ArgumentError
            No depth, or one below 1.
        """
        depths = sorted({int(k) for k in self.depths})
        if not depths or depths[0] < 1:
            raise ArgumentError(f"depths must be integers >= 1, got {depths}")
        return depths

    def params(self, configs: Sequence[RunConfig], usable: Optional[Sequence[str]] = None) -> dict:
        """The ``params`` of the documents: every setting but ``micro`` and ``decode``, depths and backends
        resolved."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("micro", "decode")}
        out["depths"] = self.resolved_depths()
        out["backends"] = list(self.resolved_backends(configs, usable))
        return out
