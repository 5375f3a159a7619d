"""Device models: how long row reads take at each queue depth, and how to simulate them (SPEC §8, §9).

- :mod:`~sim.device.latency` -- :class:`LatencyDist`, one read's latency as a quantile function;
- :mod:`~sim.device.models` -- :class:`Device` and its kinds: :class:`EmpiricalDevice` (measured by queue
  depth), :class:`MeasuredBatchDevice` (plus measured whole batches), :class:`ParametricSSD`,
  :class:`RateLimitedDevice` (a token bucket over any of them);
- :mod:`~sim.device.bucket` -- :class:`TokenBucket`, the rate limit every simulator path applies;
- :mod:`~sim.device.alone` -- one batch alone on a device, as the exact models simulate it;
- :mod:`~sim.device.fluid` -- the fast mode's device: batches as segments of reads in slots and a FIFO queue;
- :mod:`~sim.device.engines` -- simulating reads on a model: batches as segments, or every read as an event;
- :mod:`~sim.device.recorder` -- device activity during a simulation: utilisation, queue depth;
- :mod:`~sim.device.datasheet` -- an SSD from its datasheet figures, the rest derived by stated rules;
- :mod:`~sim.device.fio` -- a device from fio's JSON output;
- :mod:`~sim.device.tail` -- a device's means with another device's measured latency distribution;
- :mod:`~sim.device.presets` -- labelled presets, :data:`SEED_REFERENCE`, :func:`load_device` (every form);
- :mod:`~sim.device.queueing` -- open-loop Poisson load, for the queueing checks.
"""

from __future__ import annotations

from .bucket import TokenBucket
from .datasheet import Datasheet, ssd_from_figures, ssd_from_spec, volume_from_spec
from .engines import BucketExactDevice, ChannelExactDevice, ExactDevice, FastDevice, SlotExactDevice
from .fio import device_from_fio
from .fluid import SegmentQueue
from .latency import LatencyDist, list_schedule
from .models import Device, EmpiricalDevice, MeasuredBatchDevice, ParametricSSD, RateLimitedDevice
from .presets import (DEVICE_FORMS, PRESET_FILES, SEED_CONCURRENT_US_PER_ROW, SEED_READERS, SEED_REFERENCE, SEED_SERIAL_US_PER_ROW,
                      load_device, preset, preset_names)
from .queueing import PoissonLoadResult, poisson_load
from .recorder import Recorder, summarize_boxes, summarize_counter, time_average
from .tail import load_tail, with_tail

__all__ = [
    "DEVICE_FORMS",
    "PRESET_FILES",
    "SEED_CONCURRENT_US_PER_ROW",
    "SEED_READERS",
    "SEED_REFERENCE",
    "SEED_SERIAL_US_PER_ROW",
    "BucketExactDevice",
    "ChannelExactDevice",
    "Datasheet",
    "Device",
    "EmpiricalDevice",
    "ExactDevice",
    "FastDevice",
    "LatencyDist",
    "MeasuredBatchDevice",
    "ParametricSSD",
    "PoissonLoadResult",
    "RateLimitedDevice",
    "Recorder",
    "SegmentQueue",
    "SlotExactDevice",
    "TokenBucket",
    "device_from_fio",
    "list_schedule",
    "load_device",
    "load_tail",
    "poisson_load",
    "preset",
    "preset_names",
    "ssd_from_figures",
    "ssd_from_spec",
    "summarize_boxes",
    "volume_from_spec",
    "summarize_counter",
    "time_average",
    "with_tail",
]
