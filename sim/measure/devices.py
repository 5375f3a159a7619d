"""Devices to check the simulator against, made on this machine: the disk, throttled volumes, tmpfs.

A capacity planner describes a drive by fio's output or its datasheet; to check what the simulator makes of
such a description, :func:`measure_devices` makes devices of known, different speeds on one machine and
measures the same grid on each (:func:`sim.measure.measure`), with fio beside the runs:

``disk``
    the model file where it lies (the measurement folder itself: ``WORKDIR/microbench.json``, ...).
``throttle-N``
    the same disk behind a read-IOPS throttle of ``N`` requests a second: the measuring process and the
    processes it starts run in a throttled cgroup (:class:`sim.measure.throttle.IopsThrottle`; cgroup v1
    ``blkio.throttle.read_iops_device`` or v2 ``io.max``), in ``WORKDIR/devices/throttle-N/``.  The kernel's
    throttle is a budget a time slice, not a queue: reads pass at the disk's own speed while the budget
    lasts, so a volume of this kind is a rate limit over a raw device, as a cloud block volume is.
``tmpfs``
    a copy of the model file on a tmpfs (``/dev/shm``, else one mounted for the purpose), read with
    ``O_DIRECT`` (Linux >= 6.6): memory as the device, in ``WORKDIR/devices/tmpfs/``.  Removed afterwards.

Each device gets fio random reads (``--direct=1``) of the first table's extent at the engine's read size
(its read unit on that file, :attr:`engram.Table.alignment`: 512 B on a disk of 512-byte logical blocks) and
at 4 KiB, at queue depths 1 to 64, saved as fio wrote them (one JSON document a depth) in the device's
folder: ``fio-<bytes>.json``.  After its runs the device gets fio again at the engine's read size,
``fio-<bytes>-after.json`` (``fio_after``): a drive whose figures moved while the runs ran (a shared cloud
disk's can move fourfold within minutes) cannot be predicted from either file alone, and the planner's
cross-check (:mod:`sim.check.planner`) says how far the two lie apart.  A device that cannot be made here
is skipped with the reason (not root, no blkio or io controller, the file on no block device, no room on
tmpfs, ``O_DIRECT`` refused there), fio with the reason when it is not installed.  ``WORKDIR/devices.json`` says which devices were built and which
skipped, and why (layout: :data:`DEVICES_SCHEMA`, below); each device's documents carry their ``device``.

``devices.json``::

    {"schema": "engram.devices/1", "kind": "devices", "date", "model", "read_size", "fio_depths",
     "devices": [{"name", "class": "disk"|"throttled"|"tmpfs", "built": bool, "reason": str (skipped),
                  "folder": relative path, "iops": throttle (throttled), "throttle": {...} (throttled),
                  "read_size": bytes, "fio": {"<bytes>": relative path} , "fio_skipped": reason or "",
                  "fio_after": {"<bytes>": relative path}, "fio_after_skipped": reason or "",
                  "measured": bool, "complete": bool}]}
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from engram import Table, read_model
from engram.codec import ROW_BYTES
from engram.errors import ArgumentError, FormatError, OutputError, TableIOError

from sim.core.io import now_iso, write_json
from sim.core.schema import RunConfig
from sim.device.fio import HELD_OFF_SHARE, fio_records, in_flight_share
from .run import measure
from .settings import Settings
from .throttle import MAX_THROTTLE_IOPS, IopsThrottle, throttle_support

__all__ = ["DEVICES_NAME", "DEVICES_SCHEMA", "DevicePlan", "FIO_DEPTHS", "FIO_SIZE_4K", "FIO_TRIES", "check_rates",
           "device_classes", "engine_read_size",
           "fio_json", "measure_devices", "on_tmpfs", "plan_devices"]

#: Schema name of ``devices.json``.
DEVICES_SCHEMA = "engram.devices/1"
#: Its file name in the measurement folder.
DEVICES_NAME = "devices.json"
#: Queue depths of each device's fio runs.
FIO_DEPTHS = (1, 2, 4, 8, 16, 32, 64)
#: The most runs of fio a depth where each waited for its CPU (:func:`fio_json`).
FIO_TRIES = 3
#: The datasheet block size fio also runs at (bytes).
FIO_SIZE_4K = 4096
#: Where a tmpfs copy goes first (a tmpfs on most Linux machines).
SHM = "/dev/shm"


def device_classes() -> tuple:
    """The device classes of :func:`measure_devices`, in the order they are measured."""
    return ("disk", "throttled", "tmpfs")


def engine_read_size(model_path: Union[str, os.PathLike]) -> tuple:
    """``(read unit in bytes, O_DIRECT in use?, why not)`` of the engine on the first table of a model file:
    the alignment of its uncached reads (:class:`engram.Table`); a 264-byte row is one unit, two for the rows
    that straddle a unit boundary."""
    info = read_model(model_path)
    loc = info.tables[sorted(info.tables)[0]]
    with Table(loc.path, loc.offset, loc.rows, backend="serial") as t:
        return int(t.alignment), bool(t.direct), getattr(t, "direct_fallback", None) or ""


def fio_json(model_path: Union[str, os.PathLike], out: Union[str, os.PathLike], bs: int,
             depths: Sequence[int] = FIO_DEPTHS, seconds: float = 1.0, progress: Optional[Callable] = None,
             tries: int = FIO_TRIES) -> Path:
    """fio random reads (``--direct=1``, io_uring, else libaio) of the first table's extent at block size
    ``bs`` bytes, one run a depth one after the other, written to ``out`` as fio printed them (one JSON
    document a depth: :func:`sim.device.fio.read_fio_output` reads them back).

    A run whose job waited for its CPU (:func:`sim.device.fio.in_flight_share` below
    :data:`sim.device.fio.HELD_OFF_SHARE`: other load on the host) is run again, up to ``tries`` runs a depth;
    the one with the highest share is kept, and its document's ``engram.held_off`` lists the shares of the runs
    left out (the CPU a read at QD1 sets the planner's host, and a held-off run's is high).

    Raises
    ------
    ArgumentError
        ``tries`` not a whole number >= 1, ``bs`` not one, no depth.
    TableIOError
        fio is not installed, fails at a depth (its message kept) or completes no reads there (names the file, the
        block size and the depth); nothing is left at ``out``.
    """
    if isinstance(tries, bool) or not isinstance(tries, Integral) or tries < 1:
        raise ArgumentError(f"fio_json: tries = {tries!r:.40}: expected a whole number >= 1 (runs a depth)")
    if isinstance(bs, bool) or not isinstance(bs, Integral) or bs < 1:
        raise ArgumentError(f"fio_json: bs = {bs!r:.40}: expected a block size in bytes >= 1")
    if not depths:
        raise ArgumentError("fio_json: no queue depth given")
    exe = shutil.which("fio")
    if exe is None:
        raise TableIOError("fio is not installed (apt-get install fio)")
    info = read_model(model_path)
    loc = info.tables[sorted(info.tables)[0]]
    off = loc.offset // bs * bs
    size = (loc.offset + loc.rows * ROW_BYTES - off) // bs * bs
    docs, engine = [], "io_uring"
    for qd in depths:
        runs: List[tuple] = []
        while len(runs) < tries:
            for attempt in ("io_uring", "libaio") if engine == "io_uring" else (engine,):
                cmd = [exe, "--name=engram-randread", f"--filename={loc.path}", "--rw=randread", f"--bs={int(bs)}",
                       "--direct=1", f"--ioengine={attempt}", f"--iodepth={int(qd)}", f"--offset={off}",
                       f"--size={size}", f"--runtime={max(1, int(round(seconds * 1000)))}ms", "--time_based",
                       "--randrepeat=0", "--norandommap", "--output-format=json"]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode == 0 and '"fio version"' in res.stdout:
                    engine = attempt
                    break
            else:
                said = (res.stderr or res.stdout or "").strip()[-400:] or "nothing"
                raise TableIOError(f"fio failed on {loc.path} at bs {bs}, qd {qd} (exit {res.returncode}): {said}")
            doc = json.loads(res.stdout[res.stdout.index("{"):])
            doc["engram"] = {"cmd": " ".join(cmd), "read_size": int(bs)}
            try:
                share = min((in_flight_share(r) for r in fio_records([doc]) if not r.get("paced")), default=1.0)
            except FormatError as exc:
                raise TableIOError(f"fio on {loc.path} at bs {bs}, qd {qd}: its output is unusable: {exc}") from None
            runs.append((share, doc))
            if share >= HELD_OFF_SHARE:
                break
        runs.sort(key=lambda sd: -sd[0])
        doc = runs[0][1]
        if len(runs) > 1:
            doc["engram"]["held_off"] = [round(sh, 3) for sh, _ in runs[1:]]
        docs.append(doc)
        if progress is not None:
            progress(1)
    out = Path(out)
    try:
        out.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    except OSError as exc:
        raise TableIOError(f"{out}: cannot write fio's output ({exc.strerror or exc})", errno_=exc.errno or 0) \
            from None
    return out


def _model_files(model_path: Union[str, os.PathLike]) -> List[Path]:
    info = read_model(model_path)
    return list(dict.fromkeys([Path(info.path)] + [Path(t.path) for t in info.tables.values()]))


@contextlib.contextmanager
def on_tmpfs(model_path: Union[str, os.PathLike]) -> Iterator[Path]:
    """A copy of the model file(s) on a tmpfs read with ``O_DIRECT``: yields the copy's path; removes it (and
    unmounts a tmpfs mounted for it) afterwards, also on errors and Ctrl-C.

    ``/dev/shm`` when it is a tmpfs with room, else a tmpfs mounted in a temporary folder (root only).

    Raises
    ------
    OutputError
        No tmpfs with room (names the sizes), the copy fails, or the engine's ``O_DIRECT`` is refused on it
        (the kernel's reason).
    """
    files = _model_files(model_path)
    need = sum(f.stat().st_size for f in files)
    base, mounted = None, None
    try:
        if os.path.ismount(SHM) or Path(SHM).is_dir():
            st = os.statvfs(SHM)
            if _fs_type(SHM) == "tmpfs" and st.f_bavail * st.f_frsize > need * 1.1 + (256 << 20):
                base = Path(tempfile.mkdtemp(prefix="engram-tmpfs-", dir=SHM))
        if base is None:
            if os.geteuid() != 0:
                raise OutputError(f"no tmpfs with room for {need / 2**30:.2f} GiB: {SHM} is not a tmpfs or too "
                                  f"full, and only root may mount one")
            mounted = Path(tempfile.mkdtemp(prefix="engram-tmpfs-"))
            res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={need + (64 << 20)}", "tmpfs", str(mounted)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise OutputError(f"cannot mount a tmpfs at {mounted}: {(res.stderr or res.stdout).strip()}")
            base = mounted
        copies = []
        for f in files:
            dst = base / f.name
            try:
                shutil.copyfile(f, dst)
            except OSError as exc:
                raise OutputError(f"{dst}: the tmpfs copy failed ({exc.strerror or exc})") from None
            copies.append(dst)
        copy = copies[0]
        _, direct, why = engine_read_size(copy)
        if not direct:
            raise OutputError(f"O_DIRECT is refused on tmpfs here ({why or 'the engine reads it buffered'}): "
                              f"a table on tmpfs would be read through the page cache (Linux >= 6.6 needed)")
        yield copy
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], capture_output=True)
            with contextlib.suppress(OSError):
                mounted.rmdir()


def _fs_type(path: str) -> str:
    """The file system type of the mount holding ``path`` (from /proc/self/mounts)."""
    best, kind = "", ""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def check_rates(throttles: Sequence[int]) -> None:
    """Refuse throttle rates that are not whole numbers in ``[1, MAX_THROTTLE_IOPS]`` or that repeat.

    Raises
    ------
    ArgumentError
        Names the rate.
    """
    seen = set()
    for n in throttles:
        if isinstance(n, bool) or not isinstance(n, (int, float)) or int(n) != n or not \
                1 <= int(n) <= MAX_THROTTLE_IOPS:
            raise ArgumentError(f"--throttle-iops: {n!r} is not a whole number of read IOPS in "
                                f"[1, {MAX_THROTTLE_IOPS}]")
        if int(n) in seen:
            raise ArgumentError(f"--throttle-iops: {int(n)} given twice")
        seen.add(int(n))


def plan_devices(model_path: Union[str, os.PathLike], throttles: Sequence[int] = (), tmpfs: bool = False) -> list:
    """The devices to measure, each ``{"name", "class", "built": None (to do) or False, "reason", "folder",
    ...}``: the disk; ``throttle-N`` for each rate (skipped with the reason where the kernel lets no throttle
    be made: :func:`sim.measure.throttle.throttle_support`); ``tmpfs`` when asked.  A throttle the kernel
    refuses is refused here, before anything is measured: each is made and removed once.

    Raises
    ------
    ArgumentError
        A rate that is not a whole number >= 1, given twice, or one the kernel refuses (its reason).
    OutputError
        A throttle's cgroup can be made but not removed.
    """
    check_rates(throttles)
    info = read_model(model_path)
    table_file = info.tables[sorted(info.tables)[0]].path
    out = [{"name": "disk", "class": "disk", "built": None, "reason": "", "folder": "."}]
    support = throttle_support(table_file) if throttles else None
    for n in throttles:
        d = {"name": f"throttle-{int(n)}", "class": "throttled", "iops": int(n), "built": None, "reason": "",
             "folder": f"devices/throttle-{int(n)}"}
        if not support.ok:
            d.update(built=False, reason=support.reason)
        else:
            with IopsThrottle(int(n), table_file, support) as t:  # refused by the kernel: ArgumentError
                d["throttle"] = dict(t.to_dict(), read_back=t.written())
        out.append(d)
    if tmpfs:
        out.append({"name": "tmpfs", "class": "tmpfs", "built": None, "reason": "", "folder": "devices/tmpfs"})
    return out


@dataclass(frozen=True)
class DevicePlan:
    """The devices :func:`measure_devices` makes beside the disk, and the fio runs on each.

    Attributes
    ----------
    throttles : sequence of int
        Read-IOPS rates, a ``throttle-N`` device each (whole numbers in ``[1, MAX_THROTTLE_IOPS]``, none twice).
    tmpfs : bool
        Measure a copy of the model file on a tmpfs too.
    fio : bool
        Run fio on each device (when installed), ``fio_seconds`` at each of ``fio_depths``.
    fio_seconds : float
        Seconds of each fio depth (> 0).
    fio_depths : sequence of int
        Queue depths of each device's fio runs (whole numbers >= 1).

    Raises
    ------
    ArgumentError
        A bad rate (:func:`check_rates`), ``fio_seconds`` not > 0, or ``fio_depths`` empty or with a depth
        that is not a whole number >= 1 (names the field).
    """

    throttles: Sequence[int] = ()
    tmpfs: bool = False
    fio: bool = True
    fio_seconds: float = 1.0
    fio_depths: Sequence[int] = FIO_DEPTHS

    def __post_init__(self) -> None:
        check_rates(self.throttles)
        if isinstance(self.fio_seconds, bool) or not isinstance(self.fio_seconds, (int, float)) or \
                not self.fio_seconds > 0:
            raise ArgumentError(f"fio_seconds must be > 0, got {self.fio_seconds!r}")
        depths = list(self.fio_depths)
        if not depths or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in depths):
            raise ArgumentError(f"fio_depths must be whole numbers >= 1, got {self.fio_depths!r}")


def measure_devices(model_path: Union[str, os.PathLike], configs: Sequence[RunConfig],
                    out_dir: Union[str, os.PathLike], settings: Optional[Settings] = None, *,
                    devices: DevicePlan = DevicePlan(), progress: Union[bool, str] = True, measure_disk: bool = True,
                    say: Callable[[str], None] = lambda s: None) -> dict:
    """Measure ``configs`` on the disk and each device of ``devices`` (:func:`plan_devices`; see the module), with
    fio beside the runs.

    The disk's documents go to ``out_dir`` (as :func:`sim.measure.measure` writes them), the other devices'
    to ``out_dir/devices/NAME/``; ``out_dir/devices.json`` lists every device, built or skipped with the
    reason, and is rewritten after each device (an interrupted measurement keeps what it measured).  ``say``
    gets a line per device as it starts, is skipped or ends.  ``measure_disk=False``: the disk gets its fio
    files only, its runs being those ``out_dir`` already holds (a measurement of another grid: ``engram demo``
    measures its full grid on the disk and a smaller one on the other devices).

    Returns
    -------
    dict
        The ``devices.json`` document, with ``"path"`` and ``"results"`` (device name -> what
        :func:`sim.measure.measure` returned).

    Raises
    ------
    ArgumentError
        See :func:`plan_devices` and :func:`sim.measure.measure`.
    OutputError, TableIOError
        A document cannot be written, a cgroup not removed.
    """
    m = _DeviceMeasurement(model_path, configs, Path(out_dir), settings or Settings(), devices)
    m.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        for d in m.devices:
            if d["built"] is False:
                say(f"skipped   {d['name']}: {d['reason']}")
                continue
            m.device(d, progress, measure_disk, say)
            m.save()
    finally:
        for d in m.devices:
            if d["built"] is None:
                d.update(built=False, reason="not reached: the measurement stopped before it")
        m.save()
    return dict(m.doc, path=str(m.path), results=m.results)


class _DeviceMeasurement:
    """The state of :func:`measure_devices`: the ``devices.json`` document, its path, and each measured device's
    result."""

    def __init__(self, model_path, configs: Sequence[RunConfig], out_dir: Path, settings: Settings,
                 plan: DevicePlan) -> None:
        self.model_path, self.configs, self.out_dir, self.settings, self.plan = \
            model_path, configs, out_dir, settings, plan
        self.devices = plan_devices(model_path, plan.throttles, plan.tmpfs)
        read_size, _, _ = engine_read_size(model_path)
        info = read_model(model_path)
        self.table_file = info.tables[sorted(info.tables)[0]].path
        self.doc = {"schema": DEVICES_SCHEMA, "kind": "devices", "date": now_iso(), "model": str(model_path),
                    "read_size": read_size, "fio_depths": [int(k) for k in plan.fio_depths],
                    "devices": self.devices}
        self.path = out_dir / DEVICES_NAME
        self.results: Dict[str, dict] = {}

    def save(self) -> None:
        """Write ``devices.json`` as it stands."""
        try:
            write_json(self.path, self.doc)
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot write the device list ({exc.strerror or exc})") from None

    def _build(self, d: dict, stack: contextlib.ExitStack):
        """Make device ``d`` (its throttle, its tmpfs copy; undone when ``stack`` closes): the model path to
        measure there, or None when it cannot be made (``d`` says why)."""
        model = Path(self.model_path)
        try:
            if d["class"] == "throttled":
                t = stack.enter_context(IopsThrottle(d["iops"], self.table_file))
                d["throttle"] = dict(t.to_dict(), read_back=t.written())
            elif d["class"] == "tmpfs":
                model = stack.enter_context(on_tmpfs(self.model_path))
        except OutputError as exc:
            d.update(built=False, reason=str(exc))
            return None
        d["built"] = True
        return model

    def _fio(self, d: dict, model: Path, folder: Path) -> None:
        """fio on device ``d`` at the engine's read size and at 4 KiB (``d["fio"]``), or why not
        (``d["fio_skipped"]``)."""
        d["fio"], d["fio_skipped"] = {}, ""
        if not self.plan.fio:
            d["fio_skipped"] = "fio turned off (--no-fio)"
            return
        if shutil.which("fio") is None:
            d["fio_skipped"] = "fio is not installed (apt-get install fio)"
            return
        for bs in dict.fromkeys([d["read_size"], FIO_SIZE_4K]):
            try:
                p = fio_json(model, folder / f"fio-{bs}.json", bs, self.plan.fio_depths, self.plan.fio_seconds)
                d["fio"][str(bs)] = str(p.relative_to(self.out_dir))
            except TableIOError as exc:
                d["fio_skipped"] = str(exc)
                break

    def _fio_after(self, d: dict, model: Path, folder: Path) -> None:
        """fio on device ``d`` again after its runs, at the engine's read size only (``d["fio_after"]``), or why
        not (``d["fio_after_skipped"]``); none where fio did not run before them."""
        d["fio_after"], d["fio_after_skipped"] = {}, ""
        if d["fio_skipped"] or str(d["read_size"]) not in d["fio"]:
            d["fio_after_skipped"] = d["fio_skipped"] or "no fio at the engine's read size before the runs"
            return
        bs = d["read_size"]
        try:
            p = fio_json(model, folder / f"fio-{bs}-after.json", bs, self.plan.fio_depths, self.plan.fio_seconds)
            d["fio_after"][str(bs)] = str(p.relative_to(self.out_dir))
        except TableIOError as exc:
            d["fio_after_skipped"] = str(exc)

    def device(self, d: dict, progress: Union[bool, str], measure_disk: bool, say: Callable[[str], None]) -> None:
        """Make device ``d``, run fio on it, then the measurement (the disk's only with ``measure_disk``), then
        fio again (:meth:`_fio_after`)."""
        folder = self.out_dir / d["folder"]
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            model = self._build(d, stack)
            if model is None:
                say(f"skipped   {d['name']}: {d['reason']}")
                return
            d["read_size"], _, _ = engine_read_size(model)
            say(f"device    {d['name']} ({d['class']}): measuring in {folder}")
            self._fio(d, model, folder)
            if d["fio_skipped"]:
                say(f"fio       {d['name']}: skipped: {d['fio_skipped']}")
            self.save()
            if d["class"] == "disk" and not measure_disk:
                d.update(measured=(folder / "runs.json").is_file(), complete=(folder / "runs.json").is_file(),
                         grid="the measurement already in the folder")
                return
            t0 = time.perf_counter()
            res = measure(model, self.configs, folder, self.settings, progress=progress, device=_device_head(d))
            d.update(measured=True, complete=bool(res.get("complete")), seconds=time.perf_counter() - t0)
            self.results[d["name"]] = res
            self._fio_after(d, model, folder)
            if d["fio_after_skipped"] and not d["fio_skipped"]:
                say(f"fio after {d['name']}: skipped: {d['fio_after_skipped']}")
            say(f"measured  {d['name']}: {res['runs_done']} runs in {res['seconds']:.1f} s")


def _device_head(d: dict) -> dict:
    """What a device's own documents say about it."""
    keep = ("name", "class", "iops", "throttle", "read_size", "fio", "fio_skipped")
    return {k: d[k] for k in keep if k in d}
