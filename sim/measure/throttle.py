"""A read-IOPS throttle of the disk under a file: a cgroup the measuring process (and its workers) runs in.

The kernel's block throttle (``blk-throttle``) caps the read requests a second a cgroup may send to one
block device: cgroup v1 ``blkio.throttle.read_iops_device`` (``"MAJ:MIN IOPS"``), cgroup v2 ``io.max``
(``"MAJ:MIN riops=IOPS"``; Documentation/admin-guide/cgroup-v1/blkio-controller.rst and cgroup-v2.rst of the
kernel).  :class:`IopsThrottle` makes such a cgroup below the process's own, writes the limit, moves the
whole process into it (``cgroup.procs``: every thread, the pread readers' and io_uring's workers included;
processes forked later -- the session workers of a process-mode run, fio -- start inside it) and, on the
way out, moves every process still in it back and removes it: on a normal exit, an exception, Ctrl-C
(``KeyboardInterrupt``) and ``SIGTERM`` / ``SIGHUP`` (turned into :class:`Interrupted` while the throttle is
held, from the main thread).  A cgroup left by a process that was killed outright (``SIGKILL``) is removed by
the next throttle made on the machine (:func:`remove_stale`: the owner's pid is in the name).

:func:`throttle_support` says, without changing anything, whether a throttle of the disk under a file can be
made here, and why not: not root, no blkio controller (v1) or ``io`` controller (v2), the file on no block
device (tmpfs, a FUSE file system).  The device is the whole disk of the file's ``st_dev`` (a partition's
parent: blk-throttle limits whole disks).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Union

from engram.errors import ArgumentError, OutputError

__all__ = ["CGROUP_PREFIX", "MAX_THROTTLE_IOPS", "Interrupted", "IopsThrottle", "ThrottleSupport",
           "block_device_of", "remove_stale", "throttle_support"]

#: Name prefix of the cgroups made here: ``engram-throttle-PID-IOPS``.
CGROUP_PREFIX = "engram-throttle-"
#: Largest throttle asked for (reads/s): far above any device, a typo guard.
MAX_THROTTLE_IOPS = 100_000_000


class Interrupted(KeyboardInterrupt):
    """``SIGTERM`` or ``SIGHUP`` arrived while a throttle was held (a ``KeyboardInterrupt``, as Ctrl-C)."""


def _mounts() -> List[tuple]:
    """``(mount point, type, options)`` of every cgroup mount, from /proc/self/mounts."""
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                    out.append((parts[1].replace("\\040", " "), parts[2], parts[3].split(",")))
    except OSError:
        pass
    return out


def _own_path(version: int) -> str:
    """The process's cgroup path in the v1 blkio hierarchy or the v2 one (from /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if (version == 1 and "blkio" in ctrls.split(",")) or (version == 2 and hid == "0" and ctrls == ""):
                    return path
    except (OSError, ValueError):
        pass
    return "/"


def block_device_of(path: Union[str, os.PathLike]) -> tuple:
    """``("MAJ:MIN" of the whole disk holding ``path``, None)``, or ``(None, why not)``."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
    base = Path(f"/sys/dev/block/{maj}:{mnr}")
    if maj == 0 or not base.exists():
        return None, (f"{path} lies on no block device (device {maj}:{mnr}: tmpfs, a network or FUSE file "
                      f"system): the block throttle has no device to limit")
    if (base / "partition").exists():  # blk-throttle limits whole disks
        try:
            maj, mnr = (int(x) for x in (base.resolve().parent / "dev").read_text().split(":"))
        except (OSError, ValueError) as exc:
            return None, f"{path}: the disk of partition {maj}:{mnr} not found ({exc})"
    return f"{maj}:{mnr}", None


@dataclass(frozen=True)
class ThrottleSupport:
    """Whether a read-IOPS throttle of the disk under a file can be made here.

    Attributes
    ----------
    ok : bool
    reason : str
        Why not (empty when ``ok``).
    version : int
        1 (blkio) or 2 (``io.max``); 0 when none.
    parent : str
        The cgroup folder the throttles are made in (the process's own cgroup).
    device : str
        ``"MAJ:MIN"`` of the disk throttled.
    """

    ok: bool
    reason: str = ""
    version: int = 0
    parent: str = ""
    device: str = ""

    def to_dict(self) -> dict:
        return {"ok": self.ok, "reason": self.reason, "cgroup_version": self.version, "parent": self.parent,
                "device": self.device}


def throttle_support(path: Union[str, os.PathLike]) -> ThrottleSupport:
    """Can a read-IOPS throttle of the disk under ``path`` be made here, and where (nothing is changed)."""
    dev, why = block_device_of(path)
    if dev is None:
        return ThrottleSupport(False, why)
    if os.geteuid() != 0:
        return ThrottleSupport(False, f"not root (uid {os.geteuid()}): only root may make and limit cgroups",
                               device=dev)
    notes = []
    for mnt, kind, opts in _mounts():
        if kind == "cgroup" and "blkio" in opts:
            parent = Path(mnt) / _own_path(1).lstrip("/")
            if (parent / "blkio.throttle.read_iops_device").exists() and os.access(parent, os.W_OK):
                return ThrottleSupport(True, "", 1, str(parent), dev)
            notes.append(f"cgroup v1 blkio at {mnt} has no writable blkio.throttle.read_iops_device in {parent}")
    for mnt, kind, _ in _mounts():
        if kind == "cgroup2":
            parent = Path(mnt) / _own_path(2).lstrip("/")
            try:
                ctrls = (parent / "cgroup.controllers").read_text().split()
            except OSError as exc:
                notes.append(f"cgroup v2 at {mnt}: {exc.strerror or exc}")
                continue
            if "io" in ctrls:
                return ThrottleSupport(True, "", 2, str(parent), dev)
            notes.append(f"cgroup v2 at {mnt} offers no io controller (controllers: {', '.join(ctrls) or 'none'})")
    return ThrottleSupport(False, "; ".join(notes) or "no cgroup file system mounted (neither v1 blkio nor v2)",
                           device=dev)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _procs(folder: Path) -> List[int]:
    try:
        return [int(x) for x in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _move(pids, to: Path) -> None:
    """Move ``pids`` into cgroup ``to`` (processes that have exited meanwhile are skipped)."""
    for pid in pids:
        try:
            (to / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                raise


def _rmdir(folder: Path, parent: Path, attempts: int = 50) -> None:
    """Remove cgroup ``folder``, moving what is still in it to ``parent`` (exiting processes linger a moment).

    Raises
    ------
    OutputError
        It could not be removed (names it and why).
    """
    last = None
    for i in range(attempts):
        _move(_procs(folder), parent)
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            last = exc
            if exc.errno != errno.EBUSY:
                break
            time.sleep(0.02 * min(i + 1, 10))
    raise OutputError(f"{folder}: the throttle's cgroup could not be removed "
                      f"({last.strerror if last else 'busy'}); remove it with rmdir once its processes ended")


def remove_stale(parent: Union[str, os.PathLike]) -> List[str]:
    """Remove the throttle cgroups under ``parent`` whose owner process is gone; returns their paths."""
    gone = []
    parent = Path(parent)
    try:
        entries = list(parent.iterdir())
    except OSError:
        return gone
    for d in entries:
        if not d.name.startswith(CGROUP_PREFIX) or not d.is_dir():
            continue
        try:
            owner = int(d.name[len(CGROUP_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if owner != os.getpid() and _pid_alive(owner):
            continue
        try:
            _rmdir(d, parent, attempts=5)
            gone.append(str(d))
        except OutputError:
            pass
    return gone


class IopsThrottle:
    """A cgroup limiting the reads a second of this process (and the processes it starts) on one disk.

    Use as a context manager: ``with IopsThrottle(4000, "/work/model.gguf") as t: ...`` -- inside, every
    read of the process from that disk passes the kernel's throttle; on leaving (also on an exception,
    Ctrl-C, ``SIGTERM``, ``SIGHUP``) the process is back in its own cgroup and the cgroup removed.

    Parameters
    ----------
    iops : int
        Read requests a second, a whole number in ``[1, MAX_THROTTLE_IOPS]``.
    path : path
        A file on the disk to throttle (the table file).
    support : ThrottleSupport, optional
        :func:`throttle_support` of ``path`` (found when not given).

    Attributes
    ----------
    folder : Path
        The cgroup (``<parent>/engram-throttle-PID-IOPS``), set while held (``cgroup``: its path, kept).
    limit_file, limit : str
        The file the limit was written to and what was written.

    Raises
    ------
    ArgumentError
        ``iops`` not a whole number in range, or the kernel refused the limit (its reason, the value).
    OutputError
        The throttle cannot be made here (the reason of :func:`throttle_support`), the cgroup cannot be
        made, the process not moved into it, or the cgroup not removed afterwards (names the folder).
    """

    def __init__(self, iops: int, path: Union[str, os.PathLike], support: Optional[ThrottleSupport] = None):
        if isinstance(iops, bool) or int(iops) != iops or not 1 <= int(iops) <= MAX_THROTTLE_IOPS:
            raise ArgumentError(f"throttle: {iops!r} read IOPS is not a whole number in [1, {MAX_THROTTLE_IOPS}]")
        self.iops = int(iops)
        self.path = str(path)
        self.support = support or throttle_support(path)
        self.folder: Optional[Path] = None
        self.limit_file = ""
        self.limit = ""
        self.cgroup = ""
        self._home: Optional[Path] = None
        self._old = {}

    def __enter__(self) -> "IopsThrottle":
        s = self.support
        if not s.ok:
            raise OutputError(f"throttle of {self.iops} read IOPS on {self.path}: {s.reason}")
        parent = Path(s.parent)
        remove_stale(parent)
        folder = parent / f"{CGROUP_PREFIX}{os.getpid()}-{self.iops}"
        try:
            folder.mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{folder}: the throttle's cgroup cannot be made ({exc.strerror or exc})") from None
        self.folder, self._home, self.cgroup = folder, parent, str(folder)
        try:
            self._hold_signals()
            if s.version == 1:
                self.limit_file, self.limit = "blkio.throttle.read_iops_device", f"{s.device} {self.iops}"
            else:
                self.limit_file, self.limit = "io.max", f"{s.device} riops={self.iops}"
            try:
                (folder / self.limit_file).write_text(self.limit + "\n")
            except OSError as exc:
                raise ArgumentError(f"throttle: the kernel refused {self.limit!r} in {folder / self.limit_file} "
                                    f"({exc.strerror or exc})") from None
            try:
                _move([os.getpid()], folder)
            except OSError as exc:
                raise OutputError(f"{folder}: this process cannot be moved into the throttle's cgroup "
                                  f"({exc.strerror or exc})") from None
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._leave()

    def inside(self) -> bool:
        """True when this process is in the throttle's cgroup now."""
        return self.folder is not None and os.getpid() in _procs(self.folder)

    def written(self) -> str:
        """The limit as the kernel reads it back (``"254:0 4000"``; v2: the device's ``io.max`` line)."""
        if self.folder is None:
            return ""
        try:
            lines = (self.folder / self.limit_file).read_text().split("\n")
        except OSError:
            return ""
        dev = self.support.device
        return next((x.strip() for x in lines if x.startswith(dev + " ")), "")

    def to_dict(self) -> dict:
        return {"iops": self.iops, "cgroup": self.cgroup, "limit_file": self.limit_file,
                "limit": self.limit, **self.support.to_dict()}

    def _hold_signals(self) -> None:
        """SIGTERM and SIGHUP raise :class:`Interrupted` while held (main thread only), so the cgroup is
        removed."""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum, frame):
            raise Interrupted(f"signal {signal.Signals(signum).name}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old[sig] = signal.signal(sig, stop)
            except (ValueError, OSError):
                pass

    def _leave(self) -> None:
        folder, home, self.folder = self.folder, self._home, None
        try:
            if folder is not None and home is not None:
                _move([os.getpid()], home)
                _rmdir(folder, home)
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old)
            self._old = {}
