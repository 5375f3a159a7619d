"""Device presets, labelled with their source, and the one way every command loads a device (:func:`load_device`).

``seed-apple-m3-ultra``
    the SPEC §8 reference figures (:data:`SEED_REFERENCE` holds every figure
    of the seed run: rows, readers, thresholds, microseconds a row, tokens/s);
``vm-virtio-16core-4k``
    a measured virtual disk, read at run time from the package data
    (``sim/data/devices/vm-virtio-16core-4k.jsonl``, :func:`sim.core.io.packaged_data_path`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Mapping, Union

from engram.errors import ArgumentError, FormatError

from sim.core.io import load_json, packaged_data_path, read_text
from sim.core.schema import CALIBRATION_SCHEMA, US, ComputeSpec
from .datasheet import ssd_from_spec, volume_from_spec
from .fio import device_from_fio, is_fio_output, parse_block_size
from .latency import LatencyDist
from .models import Device, EmpiricalDevice, is_assumed

__all__ = ["DEVICE_FORMS", "PRESET_FILES", "VM_VIRTIO_FILE", "SEED_CONCURRENT_US_PER_ROW", "SEED_READERS", "SEED_REFERENCE",
           "SEED_SERIAL_US_PER_ROW", "assumed_figures", "load_device", "preset", "preset_names"]


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
           "qd 16. Two points, no spread: qd 2..15 interpolated; 16 reads served at once (78,125 reads/s), more "
           "wait in FIFO order.")
    return EmpiricalDevice({1: LatencyDist.point(SEED_SERIAL_US_PER_ROW * US, src),
                            SEED_READERS: LatencyDist.point(qd16 * US, src)},
                           name=SEED_REFERENCE["device"], source=src)


def _vm_virtio() -> EmpiricalDevice:
    path = packaged_data_path(VM_VIRTIO_FILE)
    if not path.is_file():
        raise ArgumentError(f"device preset 'vm-virtio-16core-4k': no file {path} (the package data is "
                            "incomplete: reinstall engram)")
    return EmpiricalDevice.from_jsonl(
        path, "vm-virtio-16core-4k",
        "measured 2026-11-29: random 4 KiB O_DIRECT pread on a 16-core VM's virtio disk (ext4), qd 1..256, "
        f"3 s each ({path}); mean latency = qd / iops, percentiles p50/p95/p99")


#: The package data file of the ``vm-virtio-16core-4k`` preset (:func:`sim.core.io.packaged_data_path`).
VM_VIRTIO_FILE = "devices/vm-virtio-16core-4k.jsonl"

#: The package data file each measured preset reads (presets not named here are built from figures).
PRESET_FILES = {"vm-virtio-16core-4k": VM_VIRTIO_FILE}

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
        ``sim/data/devices/vm-virtio-16core-4k.jsonl`` of the package data, read at run time.

    Raises
    ------
    ArgumentError
        Unknown name (lists the known ones).
    """
    try:
        return _PRESETS[name]()
    except KeyError:
        raise ArgumentError(f"unknown device preset {name!r}; known: {', '.join(_PRESETS)}") from None


#: Every form :func:`load_device` accepts, for messages and ``--help``.
DEVICE_FORMS = ("a preset (" + ", ".join(_PRESETS) + "); ssd:qd1_us=..,iops=..[,..,cap_iops=..,burst_ios=..] "
                "(datasheet figures, optionally behind a rate limit); volume:qd1_us=..,cap_iops=..[,burst_ios=..] "
                "or volume:type=gp2,size_gib=..,qd1_us=.. (a rate-limited volume); fio:FILE.json[,assume_bs=16k][,cpus=N] "
                "(fio output; assume_bs: of another block size, taken as it is; cpus=N: a memory-backed device, "
                "tmpfs or the page cache, whose reads are copies on the readers' N CPUs: its IOPS scale to them); "
                "calibrated or calibrated:BACKEND (this machine, with a calibration file); a .json file (a saved "
                "device, fio --output-format=json output, or an engram calibration); a .jsonl microbenchmark file")


def _from_calibration(doc: Mapping, where: str, backend: str, compute: str) -> Device:
    """The device of ``backend`` in a calibration document: the batches measured with ``compute`` as think
    time where there are any, else back to back (as :meth:`sim.check.calibrate.Calibration.device`)."""
    if doc.get("schema") != CALIBRATION_SCHEMA:
        raise FormatError(f"{where}: calibration of schema {doc.get('schema')!r}, expected {CALIBRATION_SCHEMA!r}")
    devices = doc.get("devices") or {}
    for key, v in (("devices", devices), ("think_devices", doc.get("think_devices") or {})):
        if not isinstance(v, Mapping):
            raise FormatError(f"{where}: {key}: expected a JSON object, got {v!r:.40}")
    if backend not in devices:
        raise ArgumentError(f"{where}: the calibration has no device for backend {backend!r} "
                            f"(has {sorted(devices)}); choose it with --backend")
    label = ComputeSpec.parse(compute).label
    think = (doc.get("think_devices") or {}).get(label) or {}
    at = f"think_devices.{label}.{backend}" if isinstance(think, Mapping) and backend in think else f"devices.{backend}"
    d = think.get(backend, devices[backend]) if isinstance(think, Mapping) else devices[backend]
    try:
        return Device.from_dict(d)
    except FormatError as exc:
        raise FormatError(f"{where}: {at}: {exc}") from None


def _from_json(path: Path, backend: str, compute: str) -> Device:
    text = read_text(path, "device file")
    if is_fio_output(text):
        return device_from_fio(path)
    d = load_json(path)
    if d.get("kind") == "calibration":
        return _from_calibration(d, str(path), backend, compute)
    try:
        return Device.from_dict(d)
    except FormatError as exc:
        raise FormatError(f"{path}: {exc}") from None


def _fio_spec(spec: str) -> Device:
    """``fio:FILE[,assume_bs=SIZE][,cpus=N]``: fio's JSON output with its block size stated as an assumption,
    and for a memory-backed device the CPUs the readers will copy on (:mod:`sim.device.fio`).

    Raises
    ------
    ArgumentError
        No file, an unknown key or one given twice, ``cpus`` not a whole number in [1, 4096] (one line).
    """
    body = spec[len("fio:"):]
    path, _, rest = body.partition(",")
    kv = {}
    form = "fio:FILE[,assume_bs=16k][,cpus=N]"
    for part in filter(None, (x.strip() for x in rest.split(","))):
        k, _, v = part.partition("=")
        k = k.strip()
        if k not in ("assume_bs", "cpus"):
            raise ArgumentError(f"device spec {spec!r}: unknown key {part!r} ({form})")
        if not v.strip():
            raise ArgumentError(f"device spec {spec!r}: {k} has no value ({form})")
        if k in kv:
            raise ArgumentError(f"device spec {spec!r}: key {k!r} given twice ({form})")
        kv[k] = v.strip()
    if not path:
        raise ArgumentError(f"device spec {spec!r}: no fio output file ({form})")
    cpus = None
    if "cpus" in kv:
        try:
            cpus = int(kv["cpus"])
        except ValueError:
            raise ArgumentError(f"device spec {spec!r}: cpus={kv['cpus']!r} is not a whole number of CPUs") from None
        if not 1 <= cpus <= 4096:
            raise ArgumentError(f"device spec {spec!r}: cpus={cpus} is outside [1, 4096]")
    if "assume_bs" in kv:
        try:
            parse_block_size(kv["assume_bs"])
        except ArgumentError as exc:
            raise ArgumentError(f"device spec {spec!r}: assume_bs={kv['assume_bs']!r}: {exc}") from None
    return device_from_fio(path, assume_bs=kv.get("assume_bs"), cpus=cpus)


def load_device(spec: Union[str, os.PathLike, Device], calibration=None, *, backend: str = "pread",
                compute: str = "none") -> Device:
    """A device from any of the forms every command accepts (:data:`DEVICE_FORMS`).

    Parameters
    ----------
    spec : str, path or Device
        A preset name; ``ssd:qd1_us=..,iops=..[,iops_row=..,parallelism=..,cv=..,p99_us=..,qd_peak=..]``
        (datasheet figures, the rest derived: :mod:`sim.device.datasheet`), with ``cap_iops=..,burst_ios=..``
        a rate-limited volume over that drive; ``volume:...`` (a rate-limited volume, generic or
        ``type=gp2``: :func:`sim.device.datasheet.volume_from_spec`);
        ``calibrated`` (this machine's device of ``backend``) or
        ``calibrated:BACKEND``, both from ``calibration``; a ``.json`` file --
        a device saved by :meth:`Device.save` (``{"kind": "empirical" |
        "measured_batch" | "parametric_ssd", ...}``), the output of
        ``fio --output-format=json`` (:mod:`sim.device.fio`), or a calibration
        written by ``engram calibrate`` (its device of ``backend``); a
        ``.jsonl`` file of microbenchmark records, one queue depth a line:
        ``{"qd": 16, "iops": 91281, "p50_us": 161.5, "p99_us": 372.5}``
        (any of ``iops``/``rows_per_s``, ``mean_us``, ``pNN_us``, ``samples_us``).
    calibration : path, mapping or Calibration, optional
        The calibration for ``calibrated``: a file, its document, or a
        :class:`sim.check.calibrate.Calibration`.
    backend : str
        Read backend whose calibrated device to take (``pread`` or ``io_uring``).
    compute : str
        Compute spec of the steps (:class:`sim.core.schema.ComputeSpec`): a
        calibration's batches measured with that compute as think time are
        used where it has them.

    Raises
    ------
    ArgumentError, FormatError
        Unknown spec (lists the forms), ``calibrated`` without a calibration,
        unreadable or malformed file (names it).
    """
    if isinstance(spec, Device):
        return spec
    s = str(spec)
    if s in _PRESETS:
        return preset(s)
    if s.startswith("ssd:"):
        return ssd_from_spec(s)
    if s.startswith("volume:"):
        return volume_from_spec(s)
    if s.startswith("fio:"):
        return _fio_spec(s)
    if s == "calibrated" or s.startswith("calibrated:"):
        be = backend if s == "calibrated" else s.split(":", 1)[1]
        if calibration is None:
            raise ArgumentError(f"device {s!r} needs a calibration: give --calibration FILE (written by "
                                "engram calibrate), or the calibration file itself as the device")
        if hasattr(calibration, "device"):
            return calibration.device(be, compute)
        if isinstance(calibration, Mapping):
            return _from_calibration(calibration, "calibration", be, compute)
        return _from_calibration(load_json(calibration), str(calibration), be, compute)
    path = Path(s)
    if path.suffix == ".jsonl":
        return EmpiricalDevice.from_jsonl(path)
    if path.suffix == ".json":
        return _from_json(path, backend, compute)
    raise ArgumentError(f"unknown device {s!r}: give {DEVICE_FORMS}")


def assumed_figures(device, tail=None) -> List[str]:
    """``["NAME = VALUE RULE", ...]``: the figures ``device``'s model assumed, not measured nor given (its
    ``derived`` entries whose rule says "assumed": :func:`sim.device.models.is_assumed`), in their order; with
    ``tail`` (a device whose latency distribution the run takes, ``--tail``) the device's own spread (``cv``) is
    left out and the tail's assumed figures follow, as ``tail NAME = ...``; empty where there are none -- a
    prediction on a datasheet rests on them (a latency spread of cv 0.5 where no cv or p99 is given), one on a fio
    file's measured spread does not."""
    def said(dev, skip=()) -> List[str]:
        derived = getattr(dev, "derived", None) or {}
        out = []
        for k, v in (derived.items() if isinstance(derived, Mapping) else ()):
            if k in skip or not isinstance(v, Mapping) or not is_assumed(v.get("rule")):
                continue
            rule = str(v.get("rule"))
            rule = rule[len("assumed"):].strip(" :") if rule.startswith("assumed") else rule
            out.append(f"{k} = {v.get('value')} {rule}")
        return out

    if tail is None:
        return said(device)
    return said(device, skip=("cv",)) + [f"tail {x}" for x in said(tail)]
