"""A device's mean latency by queue depth with another device's measured latency distribution (its tail).

A datasheet or a two-point reference gives a device's speed, rarely the
spread of its latency; a measurement (fio, the engine's microbenchmark, a
``.jsonl`` file) gives the whole distribution at each depth.
:func:`with_tail` combines them: at every depth ``q`` the latency is the
shape device's quantile function at ``q`` (at its nearest measured depth
outside its range), divided by its mean and multiplied by the base device's
mean latency at ``q``.  Means, IOPS and the saturation depth stay the base
device's; the percentiles (p99, p99.9, ...) come from the measured shape.
"""

from __future__ import annotations

import os
from typing import Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from .latency import LatencyDist
from .models import Device, EmpiricalDevice, RateLimitedDevice
from .presets import load_device

__all__ = ["load_tail", "with_tail"]


def load_tail(spec: Union[str, os.PathLike, Device], calibration=None, *, backend: str = "pread") -> Device:
    """The device whose latency distribution a ``tail`` (``--tail``, a study's ``tail`` axis, ``Storage.tail``)
    names: :func:`~sim.device.presets.load_device` of ``spec``, its errors prefixed with ``tail SPEC:``.

    Raises
    ------
    ArgumentError, FormatError
        As :func:`~sim.device.presets.load_device` (unknown spec, a file that cannot be read), the message
        naming the ``tail`` and its value.
    """
    try:
        return load_device(spec, calibration, backend=backend)
    except (ArgumentError, FormatError) as exc:
        shown = spec.name if isinstance(spec, Device) else str(spec)
        exc.args = (f"tail {shown!r}: {exc}", *exc.args[1:])
        raise exc from None


def with_tail(base: Device, shape: Device) -> Device:
    """``base``'s mean latency at every depth with ``shape``'s latency distribution (see the module); a
    rate-limited ``base`` keeps its bucket in front of its raw device with the tail, a peak-bounded one its bound,
    every one what was derived of it (``derived``: its CPU a read, memory-backed).

    Raises
    ------
    ArgumentError
        A shape device whose distributions are single values (it has no tail to give).
    """
    if isinstance(base, RateLimitedDevice):  # the tail is the raw device's; the bucket stays in front
        return RateLimitedDevice(with_tail(base.raw, shape), base.cap_iops, base.burst_ios,
                                 name=f"{base.name}+tail:{shape.name}", source=base.source, derived=base.derived)
    if shape.is_point():
        raise ArgumentError(f"tail {shape.name!r}: the device has fixed latencies, no distribution to take the "
                            "tail from (use a measured device: a .jsonl microbenchmark, fio output, a preset with "
                            "percentiles)")
    top = base.saturation_depth()
    sdepths = shape.depths()
    depths = sorted({q for q in base.depths() + sdepths if q <= top} | {1, top})
    table = {}
    for q in depths:
        sq = min(sdepths, key=lambda d: (abs(d - q), d)) if (q < sdepths[0] or q > sdepths[-1]) else q
        s = shape.latency(sq)
        m = base.mean_latency(q)
        table[q] = LatencyDist(s.u, np.asarray(s.q) * (m / s.mean), f"{shape.name} shape at depth {sq}")
    src = (f"{base.name} mean latency by queue depth ({base.source}); latency distribution (tail) of "
           f"{shape.name} at each depth, scaled to those means")
    return EmpiricalDevice(table, f"{base.name}+tail:{shape.name}", src,
                           peak_bound=bool(getattr(base, "peak_bound", False)), derived=getattr(base, "derived", None))
