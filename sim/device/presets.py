"""Device presets, labelled with their source, and loading a device from a name, a spec or a file.

``seed-apple-m3-ultra``
    the SPEC §8 reference figures (:data:`SEED_REFERENCE` holds every figure
    of the seed run: rows, readers, thresholds, microseconds a row, tokens/s);
``vm-virtio-16core-4k``
    a measured virtual disk, read from the shared data directory at run time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from engram.errors import ArgumentError

from ..io import load_json, shared_data_dir
from ..schema import US
from .latency import LatencyDist
from .models import Device, EmpiricalDevice, ParametricSSD

__all__ = ["SEED_CONCURRENT_US_PER_ROW", "SEED_READERS", "SEED_REFERENCE", "SEED_SERIAL_US_PER_ROW",
           "load_device", "preset", "preset_names"]


#: The SPEC §8 reference run: the reference engine decoding on an Apple M3 Ultra SSD, 48 random rows a step,
#: read serially (threshold 256) or by 16 readers (threshold 8).  Every figure of the seed, once.
SEED_REFERENCE = {
    "device": "seed-apple-m3-ultra",
    "rows_per_step": 48,
    "readers": 16,
    "serial_us_per_row": 107.9,
    "concurrent_us_per_row": 12.8,
    "serial_threshold": 256,
    "serial_tokens_per_s": 19.16,
    "concurrent_threshold": 8,
    "concurrent_tokens_per_s": 21.06,
}
#: Microseconds a row, 48 rows read serially (qd 1).
SEED_SERIAL_US_PER_ROW = SEED_REFERENCE["serial_us_per_row"]
#: Microseconds a row, 48 rows read by 16 readers.
SEED_CONCURRENT_US_PER_ROW = SEED_REFERENCE["concurrent_us_per_row"]
#: Readers of the concurrent reference run.
SEED_READERS = SEED_REFERENCE["readers"]


def _seed_device() -> EmpiricalDevice:
    qd16 = SEED_CONCURRENT_US_PER_ROW * SEED_READERS  # per-read latency with 16 readers in flight
    src = ("SPEC §8 reference figures, Apple M3 Ultra SSD, 48 random 264-byte rows: serial 5.177 ms a batch "
           "= 107.9 us a row (qd 1); 16 readers 0.614 ms a batch = 12.8 us a row, i.e. 204.8 us per read at "
           "qd 16. Two points, no spread: qd 2..15 interpolated, above 16 saturated (78,125 reads/s).")
    return EmpiricalDevice({1: LatencyDist.point(SEED_SERIAL_US_PER_ROW * US, src),
                            SEED_READERS: LatencyDist.point(qd16 * US, src)},
                           name=SEED_REFERENCE["device"], source=src)


def _vm_virtio() -> EmpiricalDevice:
    path = shared_data_dir() / "devices" / "vm-virtio-16core-4k.jsonl"
    if not path.is_file():
        raise ArgumentError(f"device preset 'vm-virtio-16core-4k': no file {path}")
    return EmpiricalDevice.from_jsonl(
        path, "vm-virtio-16core-4k",
        "measured 2026-11-29: random 4 KiB O_DIRECT pread on a 16-core VM's virtio disk (ext4), qd 1..256, "
        f"3 s each ({path}); mean latency = qd / iops, percentiles p50/p95/p99")


_PRESETS = {
    SEED_REFERENCE["device"]: _seed_device,
    "vm-virtio-16core-4k": _vm_virtio,
}


def preset_names() -> list:
    """Names accepted by :func:`preset`."""
    return list(_PRESETS)


def preset(name: str) -> Device:
    """A labelled device preset.

    ``seed-apple-m3-ultra``
        SPEC §8: 107.9 us a row serially, 12.8 us a row with 16 readers (:data:`SEED_REFERENCE`).
    ``vm-virtio-16core-4k``
        ``../shared/data/devices/vm-virtio-16core-4k.jsonl``, read at run time.

    Raises
    ------
    ArgumentError
        Unknown name (lists the known ones).
    """
    try:
        return _PRESETS[name]()
    except KeyError:
        raise ArgumentError(f"unknown device preset {name!r}; known: {', '.join(_PRESETS)}") from None


def load_device(spec: Union[str, os.PathLike, Device]) -> Device:
    """A device from a preset name, ``ssd:qd1_us=..,iops=..,parallelism=..[,cv=..]``,
    a ``.json`` file written by :meth:`Device.save`, or a ``.jsonl`` microbenchmark file.

    Raises
    ------
    ArgumentError, FormatError
        Unknown spec, unreadable or malformed file.
    """
    if isinstance(spec, Device):
        return spec
    s = str(spec)
    if s in _PRESETS:
        return preset(s)
    if s.startswith("ssd:"):
        return ParametricSSD.from_spec(s)
    path = Path(s)
    if path.suffix == ".jsonl":
        return EmpiricalDevice.from_jsonl(path)
    if path.suffix == ".json":
        return Device.from_dict(load_json(path))
    raise ArgumentError(f"unknown device {s!r}: give a preset ({', '.join(_PRESETS)}), "
                        "ssd:qd1_us=..,iops=..,parallelism=.., or a .json/.jsonl file")
