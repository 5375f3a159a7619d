"""Device models: how long row reads take at each queue depth, and how to simulate them (SPEC §8, §9).

- :mod:`~sim.device.latency` -- :class:`LatencyDist`, one read's latency as a quantile function;
- :mod:`~sim.device.models` -- :class:`Device` and its kinds: :class:`EmpiricalDevice` (measured by queue
  depth), :class:`MeasuredBatchDevice` (plus measured whole batches), :class:`ParametricSSD`;
- :mod:`~sim.device.engines` -- simulating reads on a model: a batch as one event, or every read as one;
- :mod:`~sim.device.recorder` -- device activity during a simulation: utilisation, queue depth;
- :mod:`~sim.device.presets` -- labelled presets, :data:`SEED_REFERENCE`, :func:`load_device`;
- :mod:`~sim.device.queueing` -- open-loop Poisson load, for the queueing checks.
"""

from __future__ import annotations

from .. import io as _io
from .. import schema as _schema
from ..deprecation import moved
from .engines import ChannelExactDevice, ExactDevice, FastDevice
from .latency import LatencyDist, list_schedule
from .models import Device, EmpiricalDevice, MeasuredBatchDevice, ParametricSSD
from .presets import (SEED_CONCURRENT_US_PER_ROW, SEED_READERS, SEED_REFERENCE, SEED_SERIAL_US_PER_ROW, load_device,
                      preset, preset_names)
from .queueing import PoissonLoadResult, poisson_load
from .recorder import Recorder, summarize_boxes, time_average

__all__ = [
    "SEED_CONCURRENT_US_PER_ROW",
    "SEED_READERS",
    "SEED_REFERENCE",
    "SEED_SERIAL_US_PER_ROW",
    "ChannelExactDevice",
    "Device",
    "EmpiricalDevice",
    "ExactDevice",
    "FastDevice",
    "LatencyDist",
    "MeasuredBatchDevice",
    "ParametricSSD",
    "PoissonLoadResult",
    "Recorder",
    "list_schedule",
    "load_device",
    "poisson_load",
    "preset",
    "preset_names",
    "summarize_boxes",
    "time_average",
]

__getattr__ = moved(__name__, {"read_jsonl": (_io.read_jsonl, "sim.io"), "US": (_schema.US, "sim.schema")})
