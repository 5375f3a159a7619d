"""Which read backends start and read on this machine, now, and why (SPEC §8).

``serial`` and the ``pread`` pool run wherever threads do.  The ``io_uring``
ring is compiled on Linux from the kernel's uapi header (raw system calls, no
liburing), but whether it starts *and reads* is known only at run time:
``io_uring_setup`` fails with ENOSYS (kernel without io_uring, sandboxed
kernels), EPERM (``kernel.io_uring_disabled``, seccomp), ENOMEM (locked
memory); some kernels and filters let it start and complete every read with
``-EINVAL``.  ``ENGRAM_DISABLE_IO_URING=1`` refuses it the way
``kernel.io_uring_disabled=2`` does (for CI where the sysctl is not writable).

The process keeps one verdict on the ring: the first ``backend="auto"``
table proves it with a real read of its own rows at open; a refusal (the
kernel's, or reads that fail where the pread pool reads the same rows) falls
every ``auto`` reader of the process back to the pool, once, with one
``logging`` warning naming the reason.  :func:`probe_backends` runs the same
proof live on a file of the package (what ``engram info`` reports).

This module is the one place that decides which executor a reader starts and
when it leaves the ring, for a table's own readers and for readers attached to
the shared engine alike (:class:`engram.Table` and :class:`engram.TableGroup`
call it):

- :func:`start_backend` at open: ``serial``; ``pread`` (the pool); ``io_uring``
  (the ring, proved, or ``TableIOError``); ``auto`` (the ring where the
  process's verdict allows and it starts and reads, else the pool, with the
  reason in ``Table.fallback``);
- :func:`ring_at_fault` on a failed batch: a failure the pool may not share
  (not the device's own error), so ``auto`` re-reads the batch on the pool
  and, when that reads, :func:`refuse_after_reread` refuses the ring for the
  process; :func:`verdict_moves_to_pool` moves every other ``auto`` reader on
  the ring to the pool at its next read (:func:`move_to_pool`).
"""

from __future__ import annotations

import errno as _errno
import logging
import os
import threading
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from . import forks as _forks
from ._native import reader as _reader
from .codec import ROW_BYTES, ROW_VALUES
from .errors import TableIOError
from .uncached import close_quietly, open_uncached

__all__ = ["BackendStatus", "available_backends", "probe_backends", "usable_backends", "auto_backend",
           "ring_build", "start_backend", "ring_at_fault", "refuse_after_reread", "verdict_moves_to_pool",
           "move_to_pool", "AUTO_ORDER", "AUTO_RING_REASON", "DISABLE_ENV"]

log = logging.getLogger("engram")

#: Backend order of ``backend="auto"``: the ring where it reads, else the pool; set from the
#: measurements in benchmarks/BENCHMARKS.md (storage engine section).
AUTO_ORDER = ("io_uring", "pread")
#: Why ``auto`` uses the ring where one reads.
AUTO_RING_REASON = ("a ring started and read a block of a file here; auto puts io_uring before the pread pool "
                    "(faster at decode-size batches in the project's storage benchmarks: a 48-row step's p50 "
                    "0.69 ms against 0.90)")
#: Environment variable that refuses the ring at run time (any value but "" and "0").
DISABLE_ENV = "ENGRAM_DISABLE_IO_URING"
#: Errors of io_uring_setup that mean "not in this process" (the kernel, a sysctl or a filter
#: says no), as opposed to a shortage of descriptors or memory in one table.
KERNEL_REFUSALS = frozenset({_errno.ENOSYS, _errno.EPERM, _errno.EACCES, _errno.EINVAL, _errno.EOPNOTSUPP})
#: Errors a read gets from the device or file system itself: the pool would get them too,
#: so they never count against the ring.
DEVICE_ERRNOS = frozenset({_errno.EIO, _errno.ENOTCONN, _errno.ECONNABORTED, _errno.ENODEV, _errno.ENXIO,
                           _errno.ESTALE, _errno.ETIMEDOUT})
_SYSCTL = "/proc/sys/kernel/io_uring_disabled"


@dataclass(frozen=True)
class BackendStatus:
    """Whether a read backend can be used on this machine now.

    Attributes
    ----------
    name : {"serial", "pread", "io_uring"}
    built : bool
        Compiled into this build.
    usable : bool
        Starts and reads here (proved with a real read).
    reason : str or None
        Why it is not usable (None when it is).
    errno : int
        The errno behind ``reason`` (0 when usable).
    """

    name: str
    built: bool
    usable: bool
    reason: Optional[str] = None
    errno: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def available_backends() -> Tuple[str, ...]:
    """Read backends compiled into this build: ``serial``, ``pread`` and, on Linux, ``io_uring``.

    Compiled is not usable: see :func:`usable_backends`.
    """
    return ("serial", "pread", "io_uring") if _reader.HAVE_URING else ("serial", "pread")


def ring_build() -> str:
    """How the io_uring ring was built: raw system calls and the kernel headers used, or why not."""
    if not _reader.HAVE_URING:
        return _reader.URING_BUILD
    v = _reader.URING_HEADERS
    return f"raw io_uring system calls (<linux/io_uring.h> of Linux {v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF})"


def _refusal_context() -> str:
    """What in this environment refuses io_uring, for messages ("" when nothing visible)."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return f" ({DISABLE_ENV}={os.environ[DISABLE_ENV]})"
    try:
        with open(_SYSCTL) as f:
            v = f.read().strip()
    except OSError:
        return ""
    return f" (kernel.io_uring_disabled = {v})" if v not in ("", "0") else ""


def start_failure(err: int) -> str:
    """Why a ring could not start, from io_uring_setup's errno."""
    if err == _errno.ENOSYS and not _reader.HAVE_URING:
        return f"io_uring could not start: {_reader.URING_BUILD}"
    name = _errno.errorcode.get(err, str(err))
    return f"io_uring could not start: {os.strerror(err)} ({name}){_refusal_context()}"


def read_failure(f) -> str:
    """Why a ring that started is not trusted, from the ReadFailure of its read."""
    name = _errno.errorcode.get(f.errno, str(f.errno))
    if f.kind == "ring":
        return f"io_uring failed: io_uring_enter: {os.strerror(f.errno)} ({name})"
    return (f"io_uring starts but its reads fail: {os.strerror(f.errno)} ({name}) reading row {f.row} "
            f"at file offset {f.offset}, which the pread pool read")


# ------------------------------------------------------------------ the process verdict
class _Verdict:
    """The process's verdict on the ring (None until proved or refused) and the warnings given."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ring: Optional[BackendStatus] = None
        self.warned: set = set()


_VERDICT = _Verdict()


def _new_lock_in_child() -> None:
    _VERDICT.lock = threading.Lock()  # engram.forks: may be held by a thread of the parent


_forks.on_fork_child(_new_lock_in_child)


def ring_verdict() -> Optional[BackendStatus]:
    """The process's verdict on the ring: usable, refused (with the reason), or None (not yet known)."""
    return _VERDICT.ring


def warn_once(key, message: str, *args) -> None:
    """A ``logging`` warning on the ``engram`` logger, once per process per ``key``."""
    with _VERDICT.lock:
        if key in _VERDICT.warned:
            return
        _VERDICT.warned.add(key)
    log.warning(message, *args)


def refuse_ring(reason: str, err: int, warn: bool = True) -> BackendStatus:
    """Record that the ring is unusable in this process (warns once unless ``warn`` is False);
    returns the verdict."""
    st = BackendStatus("io_uring", _reader.HAVE_URING, False, reason, err)
    with _VERDICT.lock:
        if _VERDICT.ring is None or _VERDICT.ring.usable:
            _VERDICT.ring = st
        st = _VERDICT.ring
    if warn and _reader.HAVE_URING:  # a build without the ring has nothing to warn about
        warn_once("ring refused", "%s; reading with the pread pool from now on in this process", st.reason)
    return st


def accept_ring() -> None:
    """Record that a ring started and read in this process (unless it was refused meanwhile)."""
    with _VERDICT.lock:
        if _VERDICT.ring is None:
            _VERDICT.ring = BackendStatus("io_uring", True, True)


def prove_ring(reader) -> Tuple[Optional[bool], Optional[str], int]:
    """A real read of row 0 of segment 0 through ``reader``'s started ring.

    Returns (True, None, 0) when it read; (False, reason, errno) when the ring
    failed where a serial pread of the same row worked (the ring is at fault);
    (None, None, 0) when both failed (the file's fault: no verdict).
    """
    ids = np.zeros((1, 1), np.uint32)
    out = np.empty((1, 1, ROW_VALUES), np.float32)
    try:
        reader.read(ids, out, 0, _reader.BACKEND_URING, 1)
        return True, None, 0
    except _reader.ReadFailure as f:
        if f.kind == "decode":  # the bytes arrived: the ring reads
            return True, None, 0
        ring_failure = f
    try:
        reader.read(ids, out, 0, _reader.BACKEND_SERIAL, 1)
    except _reader.ReadFailure as f:
        if f.kind != "decode":
            return None, None, 0
    return False, read_failure(ring_failure), ring_failure.errno


# ------------------------------------------------------------------ a reader's executor
def _start_pool(reader, readers: int, path: str, why: Optional[str] = None) -> Tuple[str, Optional[str]]:
    err = reader.start_pool(readers)
    if err:
        pool = f"pread could not start: {os.strerror(err)}"
        raise TableIOError(f"{path}: {why + '; ' if why else ''}{pool}", errno_=err)
    return "pread", why


def _start_ring(reader, backend: str, readers: int, path: str) -> Tuple[str, Optional[str]]:
    """Start and, unless the process has proved it already, prove the ring.

    Returns ("io_uring", None), or ("pread", why) for ``auto`` when the ring
    cannot be used; raises ``TableIOError`` naming io_uring and the errno for
    an explicit ``io_uring``.
    """
    verdict = ring_verdict()
    if backend == "auto" and verdict is not None and not verdict.usable:
        return _start_pool(reader, readers, path, verdict.reason)
    err = reader.start_ring(readers)
    if err:
        why = start_failure(err)
        if backend != "auto":
            raise TableIOError(f"{path}: {why}", errno_=err)
        if err in KERNEL_REFUSALS:
            refuse_ring(why, err)
        else:  # a shortage in this table (descriptors, memory): the next table may start one
            warn_once(("ring start", err), "%s: %s; this table reads with the pread pool", path, why)
        return _start_pool(reader, readers, path, why)
    if verdict is None or not verdict.usable:
        ok, why, eno = prove_ring(reader)
        if ok is False:
            reader.stop_ring()
            if backend != "auto":
                raise TableIOError(f"{path}: {why}", errno_=eno)
            refuse_ring(why, eno)
            return _start_pool(reader, readers, path, ring_verdict().reason)
        if ok:
            accept_ring()
    return "io_uring", None


def start_backend(reader, backend: str, readers: int, path: str) -> Tuple[str, Optional[str]]:
    """Start the executor of ``reader`` (a native row reader, its own engine or attached to a
    shared one) for ``backend``, ``readers`` reads in flight: returns (the backend in use, why
    ``auto`` is not on the ring, or None).

    Raises
    ------
    TableIOError
        An explicit ``io_uring`` that cannot start or read (naming the errno), or a pool that
        cannot start (``path`` names the table's file).
    """
    if backend == "serial":
        return "serial", None
    if backend == "pread":
        return _start_pool(reader, readers, path)
    return _start_ring(reader, backend, readers, path)


def ring_at_fault(requested: str, f) -> bool:
    """A failed batch (``f``, a native ``ReadFailure``) of an ``auto`` reader on the ring that the
    pool may not share: the ring itself failed, or a read failed with an errno that is not the
    device's (:data:`DEVICE_ERRNOS`)."""
    return (requested == "auto" and f.backend == "io_uring"
            and (f.kind == "ring" or (f.kind == "io" and f.errno not in DEVICE_ERRNOS)))


def refuse_after_reread(f, path: str) -> str:
    """The pool read the batch the ring failed (``f``): refuse the ring for the process (one
    warning) and return the verdict's reason."""
    return refuse_ring(f"{read_failure(f)} (a batch of {path}, re-read on the pread pool)", f.errno).reason


def verdict_moves_to_pool(requested: str, backend: str) -> Optional[str]:
    """Why an ``auto`` reader on the ring must move to the pool now (the process refused the ring
    since it started), or None."""
    if requested != "auto" or backend != "io_uring":
        return None
    v = ring_verdict()
    return v.reason if v is not None and not v.usable else None


def move_to_pool(reader, readers: int) -> bool:
    """Start ``reader``'s pool and leave its ring; False (still on the ring) when the pool cannot start."""
    if reader.start_pool(readers) != 0:
        return False
    reader.stop_ring()
    return True


# ------------------------------------------------------------------ live probe
_PROBED: Dict[str, BackendStatus] = {}


def _probe_file() -> str:
    """A regular file of the package to read in the probe (the reader extension itself)."""
    return _reader.__file__


def _probe(path: str) -> Dict[str, BackendStatus]:
    f = open_uncached(path, "auto", None, probe_at=0)
    try:
        rows = max(1, os.fstat(f.fd).st_size // ROW_BYTES)
        reader = _reader.RowReader([(f.fd, 0, rows)], f.alignment, f.drop_bytes, f.read_flags)
        try:
            out = {"serial": BackendStatus("serial", True, True)}
            err = reader.start_pool(2)
            out["pread"] = BackendStatus("pread", True, err == 0,
                                         None if err == 0 else f"pread could not start: {os.strerror(err)}", err)
            if not _reader.HAVE_URING:
                out["io_uring"] = BackendStatus("io_uring", False, False, start_failure(_errno.ENOSYS),
                                                _errno.ENOSYS)
                return out
            err = reader.start_ring(1)
            if err:
                out["io_uring"] = BackendStatus("io_uring", True, False, start_failure(err), err)
                return out
            ok, why, eno = prove_ring(reader)
            out["io_uring"] = BackendStatus("io_uring", True, ok is not False, why, eno)
            return out
        finally:
            reader.close()
    finally:
        close_quietly(f.fd)


def probe_backends(refresh: bool = False, warn: bool = True) -> Dict[str, BackendStatus]:
    """Which backends start and read on this machine: name -> :class:`BackendStatus`.

    Proves each with a real read of a file of the package (the ring: start it,
    read through it, and compare with a pread of the same bytes).  Cached per
    process; ``refresh=True`` probes again and makes the result the process's
    verdict on the ring (so that ``auto`` follows a kernel setting changed
    meanwhile).  A refused ring is logged once (``warn=False``: not, for a
    caller that reports it itself).  Never raises for a backend that cannot
    start: it is reported.
    """
    with _VERDICT.lock:
        cached = dict(_PROBED) if _PROBED and not refresh else None
    if cached is not None:
        return cached
    res = _probe(_probe_file())
    ring = res["io_uring"]
    with _VERDICT.lock:
        _PROBED.clear()
        _PROBED.update(res)
        if refresh:
            _VERDICT.ring = None
    if ring.usable:
        accept_ring()
    else:
        refuse_ring(ring.reason, ring.errno, warn)
    return dict(res)


def usable_backends(refresh: bool = False) -> Tuple[str, ...]:
    """Names of the backends that start and read here now (see :func:`probe_backends`)."""
    return tuple(n for n, s in probe_backends(refresh).items() if s.usable)


def auto_backend(refresh: bool = False) -> Tuple[str, str]:
    """The backend ``backend="auto"`` uses on this machine now, and why: io_uring's reason to be chosen
    (:data:`AUTO_RING_REASON`) or why it was passed over."""
    st = probe_backends(refresh)
    v = ring_verdict()
    ring = v if v is not None else st["io_uring"]
    for name in AUTO_ORDER:
        if name == "io_uring" and ring.usable:
            return "io_uring", AUTO_RING_REASON
        if name != "io_uring" and st[name].usable:
            return name, ring.reason
    return "serial", f"{ring.reason}; {st['pread'].reason}"
