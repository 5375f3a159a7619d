"""Queueing checks: a device's exact model under open-loop Poisson arrivals of single reads.

Used to check the per-read models against queueing theory (Little's law, the
M/M/c queue of a :class:`~sim.device.models.ParametricSSD` with no delay and
exponential service).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engram.errors import ArgumentError

from sim.core.schema import US
from .models import Device
from .recorder import Recorder, summarize_boxes, time_average

__all__ = ["PoissonLoadResult", "poisson_load"]


@dataclass
class PoissonLoadResult:
    """Outcome of :func:`poisson_load`; times in seconds.

    ``latencies`` and ``waits`` (time queued for a channel; empty for devices
    without channels) are per read in completion order; ``mean_queue_depth``
    is the time average of the device's count of reads inside it over
    ``[0, duration]`` (kept apart from the per-read times, for Little's law).
    """

    rate: float
    reads: int
    duration: float
    latencies: np.ndarray
    waits: np.ndarray
    mean_queue_depth: float
    busy_fraction: float

    @property
    def throughput(self) -> float:
        return self.reads / self.duration

    def to_dict(self) -> dict:
        return {"rate": self.rate, "reads": self.reads, "duration_s": self.duration,
                "mean_latency_us": float(self.latencies.mean()) / US,
                "mean_wait_us": float(self.waits.mean()) / US if self.waits.size else 0.0,
                "mean_queue_depth": self.mean_queue_depth, "busy_fraction": self.busy_fraction,
                "throughput": self.throughput}


def poisson_load(device: Device, rate: float, reads: int, seed: int = 0) -> PoissonLoadResult:
    """Drive ``device``'s exact model with Poisson arrivals of single reads.

    Parameters
    ----------
    rate : float
        Arrivals per second (> 0).
    reads : int
        Number of arrivals; the run ends when the last read completes.

    Raises
    ------
    ArgumentError
        Non-positive ``rate`` or ``reads``.
    """
    import simpy

    if rate <= 0 or reads < 1:
        raise ArgumentError(f"poisson_load: need rate > 0 and reads >= 1, got {rate}, {reads}")
    env = simpy.Environment()
    rng = np.random.default_rng(seed)
    rec = Recorder()
    dev = device.exact(env, np.random.default_rng(rng.integers(1 << 62)), rec)
    gaps = rng.exponential(1.0 / rate, reads).tolist()

    def source():
        for g in gaps:
            yield env.timeout(g)
            env.process(dev.read())

    env.process(source())
    env.run()
    s, e, lv = rec.arrays()
    summ = summarize_boxes(s, e, lv, env.now, bins=1)
    return PoissonLoadResult(rate=rate, reads=reads, duration=env.now, latencies=e - s,
                             waits=np.asarray(rec.wait), mean_queue_depth=time_average(rec.counter, env.now),
                             busy_fraction=summ["busy_fraction"])
