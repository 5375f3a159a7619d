"""Opening a table file so that reading it leaves no pages cached (SPEC §8).

Linux and the BSDs: ``O_DIRECT`` with reads aligned to the device's logical
block.  Where ``O_DIRECT`` is refused (tmpfs before Linux 6.6, squashfs,
overlayfs on squashfs, some network file systems) the descriptor is buffered
and the reader keeps the cache flat itself: ``POSIX_FADV_RANDOM`` (readahead
off), ``RWF_DONTCACHE`` on every read where the kernel and file system take it
(Linux 6.14+), and ``POSIX_FADV_DONTNEED`` after every read over the whole
*fill unit* of the file system: the pages a read of one row pulls in (a
squashfs block of 128 KiB, not just the row's page).  The fill unit is
measured at open with ``cachestat(2)`` (Linux 6.5+): drop a window, read one
row, count the pages that came in; elsewhere it is the largest block size
the file system reports.  macOS: ``F_NOCACHE`` and ``F_RDAHEAD 0``.

:func:`uncached_plan` is the platform choice as a pure function (unit-tested
per platform); :func:`open_uncached` applies it.  The table is never mapped.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import logging
import mmap
import os
import re
import stat
import sys
import warnings
from dataclasses import dataclass
from typing import Optional, Union

from ._native import reader as _reader
from .codec import ROW_BYTES
from .errors import ArgumentError, TableIOError

__all__ = ["UncachedPlan", "UncachedFile", "uncached_plan", "open_uncached", "logical_block_size"]

log = logging.getLogger("engram")

#: Largest fill unit the buffered fallback drops after a read (bytes).
MAX_DROP_BYTES = 16 << 20
#: cachestat(2): one number on every Linux architecture (Linux 6.5).
_NR_CACHESTAT = 451


@dataclass(frozen=True)
class UncachedPlan:
    """How to open a table file on a platform.

    Attributes
    ----------
    try_direct : bool
        Open with ``O_DIRECT`` first.
    buffered : {"fadvise", "f_nocache", "plain"}
        The buffered descriptor's way to stay out of the cache (or to keep the
        cache flat): ``posix_fadvise`` RANDOM + DONTNEED (Linux, BSD),
        ``F_NOCACHE`` + ``F_RDAHEAD 0`` (macOS), nothing (a platform with neither).
    """

    try_direct: bool
    buffered: str


@dataclass
class UncachedFile:
    """An open, read-only table descriptor and how it avoids the cache.

    Attributes
    ----------
    fd : int
    direct : bool
        ``O_DIRECT`` is in use.
    alignment : int
        Alignment of reads in bytes (1 for a buffered descriptor).
    drop_bytes : int
        Buffered fallback: after each read the cached pages around it are
        dropped in units of this many bytes (the file system's fill unit); 0
        for ``O_DIRECT`` or where nothing can be dropped.
    read_flags : int
        ``RWF_DONTCACHE`` when reads of this descriptor take it, else 0.
    direct_fallback : str or None
        Why ``O_DIRECT`` is off although ``direct="auto"`` tried it.
    """

    fd: int
    direct: bool
    alignment: int
    drop_bytes: int = 0
    read_flags: int = 0
    direct_fallback: Optional[str] = None


def uncached_plan(platform: str, direct: Union[bool, str], has_o_direct: bool, has_fadvise: bool) -> UncachedPlan:
    """The way to open a table on ``platform`` (a ``sys.platform`` value).

    Raises
    ------
    ArgumentError
        ``direct`` is not True, False or "auto".
    TableIOError
        ``direct=True`` where the platform has no ``O_DIRECT`` (macOS).
    """
    if direct not in (True, False, "auto"):
        raise ArgumentError(f"direct must be True, False or 'auto', got {direct!r}")
    if direct is True and not has_o_direct:
        raise TableIOError(f"O_DIRECT is not available on {platform}")
    if platform == "darwin":
        buffered = "f_nocache"
    elif has_fadvise:
        buffered = "fadvise"
    else:
        buffered = "plain"
    return UncachedPlan(try_direct=direct is not False and has_o_direct, buffered=buffered)


def logical_block_size(fd: int) -> int:
    """Logical block size of the device holding ``fd`` (Linux sysfs), else 4096."""
    try:
        st = os.fstat(fd)
        maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
        base = f"/sys/dev/block/{maj}:{mnr}"
        for p in (f"{base}/queue/logical_block_size", f"{base}/../queue/logical_block_size"):
            if os.path.exists(p):
                with open(p) as f:
                    v = int(f.read().strip())
                if v >= 512 and v & (v - 1) == 0:
                    return v
    except (OSError, ValueError):
        pass
    return 4096


def close_quietly(fd: int) -> None:
    """Close ``fd``; an error from close(2) (EIO, or ENOTCONN once a FUSE server is gone) is
    dropped: Linux releases the descriptor anyway, and retrying could close another file."""
    try:
        os.close(fd)
    except OSError:
        pass


def _regular(fd: int, path: str) -> int:
    """``fd`` back in blocking mode if it is a regular file; else close it and raise ``TableIOError``."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "not a regular file")
            raise TableIOError(f"{path}: is {kind}; a table lives in a regular file", errno_=_errno.EINVAL)
        os.set_blocking(fd, True)
    except BaseException:
        close_quietly(fd)
        raise
    return fd


def _open(path: str, flags: int, what: str) -> int:
    try:
        return _regular(os.open(path, flags), path)
    except TableIOError:
        raise
    except FileNotFoundError:
        raise TableIOError(f"{path}: no such file", errno_=_errno.ENOENT) from None
    except OSError as exc:
        raise TableIOError(f"{path}: cannot open{what}: {exc.strerror}", errno_=exc.errno) from None


def _try_direct(path: str, flags: int, direct, block_size: Optional[int], probe_at: int):
    """(fd, alignment) of an O_DIRECT descriptor whose reads work, or (None, why it is off).

    The probe reads the aligned span of a row at ``probe_at``: data, not a hole (a file
    system checks the alignment only where it has blocks to read)."""
    o_direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = _open(path, flags | o_direct, " with O_DIRECT")
    except TableIOError as exc:
        if direct is True or exc.errno_ not in (_errno.EINVAL, _errno.EOPNOTSUPP):
            raise
        return None, f"the file system refuses O_DIRECT at open ({os.strerror(exc.errno_)})"
    align = block_size or logical_block_size(fd)
    # Some file systems accept the flag at open and refuse the read: probe one row's span.
    start = probe_at // align * align
    length = (probe_at + ROW_BYTES + align - 1) // align * align - start
    buf = mmap.mmap(-1, max(length, mmap.PAGESIZE))
    try:
        os.preadv(fd, [memoryview(buf)[:length]], start)
        return fd, align
    except OSError as exc:
        close_quietly(fd)
        if direct is True or exc.errno != _errno.EINVAL:
            raise TableIOError(f"{path}: O_DIRECT read refused: {exc.strerror}", offset=start,
                               errno_=exc.errno) from None
        return None, f"an O_DIRECT read of {length} bytes at offset {start} was refused ({exc.strerror})"
    finally:
        buf.close()


def open_uncached(path: str, direct: Union[bool, str], block_size: Optional[int], *,
                  probe_at: Optional[int] = None, platform: str = sys.platform) -> UncachedFile:
    """Open ``path`` read-only without caching (see the module docstring).

    ``probe_at``: file offset of a row (data, not a hole) read to check that
    ``O_DIRECT`` reads work with the alignment (default 0) and to measure the
    fill unit of a buffered descriptor (default: the middle of the file).  An explicit
    ``block_size`` with ``direct="auto"`` that ends without ``O_DIRECT`` warns
    (``RuntimeWarning``); either way ``direct_fallback`` says why.

    Raises
    ------
    TableIOError
        The file cannot be opened, is not a regular file, or ``direct=True``
        and ``O_DIRECT`` is refused.
    ArgumentError
        ``direct`` is not True, False or "auto".
    """
    plan = uncached_plan(platform, direct, bool(getattr(os, "O_DIRECT", 0)), _reader.HAVE_FADVISE)
    # O_NONBLOCK: opening a FIFO must not wait for a writer; cleared by _regular() on a regular file.
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    why = None
    if plan.try_direct:
        at = 0 if probe_at is None else probe_at
        fd, got = _try_direct(path, flags, direct, block_size, at)
        if fd is not None:
            return UncachedFile(fd, True, got)
        why = got
        if block_size is not None:
            warnings.warn(f"{path}: block_size={block_size} given, but O_DIRECT is off: {why}; reading "
                          f"buffered (fadvise fallback)", RuntimeWarning, stacklevel=3)
        else:
            log.info("%s: O_DIRECT is off: %s; buffered reads, pages dropped after each read", path, why)
    fd = _open(path, flags, "")
    try:
        f = UncachedFile(fd, False, 1, direct_fallback=why)
        _keep_cache_flat(f, path, plan.buffered, probe_at)
    except BaseException:
        close_quietly(fd)
        raise
    return f


def _keep_cache_flat(f: UncachedFile, path: str, how: str, probe_at: Optional[int]) -> None:
    """Set up the buffered descriptor ``f`` to leave the page cache flat."""
    if how == "f_nocache":  # pragma: no cover - exercised on macOS only
        import fcntl

        fcntl.fcntl(f.fd, fcntl.F_NOCACHE, 1)
        fcntl.fcntl(f.fd, getattr(fcntl, "F_RDAHEAD", 45), 0)
        return
    if how != "fadvise":
        return
    os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_RANDOM)
    size = os.fstat(f.fd).st_size
    at = min(max(0, size // 2 if probe_at is None else probe_at), max(0, size - ROW_BYTES))
    f.drop_bytes = fill_unit(f.fd, at, path)
    f.read_flags = _dontcache_flag(f.fd, at)


def _declared_block(fd: int) -> int:
    """The largest block size the file system reports for ``fd`` (st_blksize, statvfs), at least a page."""
    unit = mmap.PAGESIZE
    try:
        unit = max(unit, os.fstat(fd).st_blksize)
        unit = max(unit, os.fstatvfs(fd).f_bsize)
    except OSError:
        pass
    return unit


class _CacheStat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64), ("nr_writeback", ctypes.c_uint64),
                ("nr_evicted", ctypes.c_uint64), ("nr_recently_evicted", ctypes.c_uint64)]


class _CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


_LIBC = None


def cached_pages(fd: int, offset: int, length: int) -> Optional[int]:
    """Pages of ``fd`` in the page cache over ``[offset, offset + length)`` (``cachestat(2)``),
    or None where the kernel has no cachestat (before Linux 6.5, or not Linux)."""
    global _LIBC
    if not sys.platform.startswith("linux"):
        return None
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    rng, cs = _CacheStatRange(offset, length), _CacheStat()
    if _LIBC.syscall(ctypes.c_long(_NR_CACHESTAT), ctypes.c_int(fd), ctypes.byref(rng), ctypes.byref(cs),
                     ctypes.c_uint(0)) != 0:
        return None
    return int(cs.nr_cache)


def _low_bit(x: int) -> int:
    """Largest power of two dividing ``x`` (``x`` > 0)."""
    return x & -x


def _first_cached(fd: int, lo: int, hi: int, first: bool) -> int:
    """Index (in pages from ``lo``) of the first (or last) cached page of ``fd`` in ``[lo, hi)``,
    which holds at least one; binary search over cachestat counts."""
    a, b = 0, (hi - lo) // mmap.PAGESIZE  # the answer lies in [a, b)
    while b - a > 1:
        m = (a + b) // 2
        if first:
            if cached_pages(fd, lo, m * mmap.PAGESIZE):  # a cached page below m
                b = m
            else:
                a = m
        else:
            if cached_pages(fd, lo + m * mmap.PAGESIZE, hi - lo - m * mmap.PAGESIZE):  # one at or above m
                a = m
            else:
                b = m
    return a


def measured_fill_unit(fd: int, at: int) -> Optional[int]:
    """The unit in which the file system fills the page cache of ``fd``, measured, or None.

    With cachestat: drop the pages of a window around ``at``, read one row at
    ``at``, and find the run of pages that came in (``[first, last]``); the
    unit is the largest power of two both ends are aligned to (a squashfs
    block: 128 KiB; one page on ext4).  None where cachestat is missing, the
    window keeps pages the kernel cannot drop, or no page came in (a stacked
    file system such as overlayfs caches in the file below).
    """
    if not _reader.HAVE_FADVISE:
        return None
    lo = max(0, at // MAX_DROP_BYTES * MAX_DROP_BYTES - MAX_DROP_BYTES)
    hi = lo + 3 * MAX_DROP_BYTES
    os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
    try:
        if cached_pages(fd, lo, hi - lo) != 0:
            return None
        os.pread(fd, ROW_BYTES, at)
        if not cached_pages(fd, lo, hi - lo):
            return None
        first = lo + _first_cached(fd, lo, hi, True) * mmap.PAGESIZE
        end = lo + (_first_cached(fd, lo, hi, False) + 1) * mmap.PAGESIZE
        return min(_low_bit(first) if first else MAX_DROP_BYTES, _low_bit(end), MAX_DROP_BYTES)
    except OSError:
        return None
    finally:
        os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)


def fill_unit(fd: int, at: int, path: Optional[str] = None) -> int:
    """Unit in which the buffered fallback drops pages after a read of ``fd`` (bytes, a power of two).

    The measured fill unit (:func:`measured_fill_unit`; for a file on
    overlayfs, measured on the layer's file that holds the data), at least the
    block size the file system declares, at most :data:`MAX_DROP_BYTES`.
    """
    unit = min(_declared_block(fd), MAX_DROP_BYTES)
    got = measured_fill_unit(fd, at)
    real = overlay_layer_file(path) if got is None and path else None
    if real is not None:
        try:
            rfd = os.open(real, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            rfd = -1
        if rfd >= 0:
            try:
                unit = max(unit, min(_declared_block(rfd), MAX_DROP_BYTES))
                got = measured_fill_unit(rfd, at)
            finally:
                close_quietly(rfd)
    return max(unit, got or 0)


def _unescape(field: str) -> str:
    """A /proc/self/mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_of(path: str):
    """(mount point, file system type, super options) of the mount holding ``path``, or None."""
    best = None
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(" ")
        if "-" not in parts[6:]:
            continue
        sep = parts.index("-", 6)
        mnt = _unescape(parts[4])
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best[0])):
            best = (mnt, parts[sep + 1], parts[sep + 3] if len(parts) > sep + 3 else "")
    return best


def overlay_layer_file(path: str) -> Optional[str]:
    """For a file on overlayfs: the file of the upper or first lower layer holding its data, else None.

    Reads the layers from ``/proc/self/mountinfo`` (``upperdir=``,
    ``lowerdir=a:b``, ``lowerdir+=``).  Linux only.
    """
    real = os.path.realpath(path)
    m = _mount_of(real)
    if m is None or m[1] != "overlay":
        return None
    rel = os.path.relpath(real, m[0])
    upper, lowers = [], []
    for opt in m[2].split(","):
        if opt.startswith("upperdir="):
            upper.append(opt[len("upperdir="):])
        elif opt.startswith("lowerdir+="):
            lowers.append(opt[len("lowerdir+="):])
        elif opt.startswith("lowerdir="):
            lowers.extend(opt[len("lowerdir="):].split(":"))
    for d in upper + lowers:
        cand = os.path.join(_unescape(d), rel)
        if os.path.isfile(cand):
            return cand
    return None


def _dontcache_flag(fd: int, at: int) -> int:
    """``RWF_DONTCACHE`` if a buffered read of ``fd`` takes it (Linux 6.14+ and the file system), else 0."""
    flag = _reader.RWF_DONTCACHE_FLAG
    if not flag or not _reader.HAVE_PREADV2 or not hasattr(os, "preadv"):
        return 0
    buf = bytearray(ROW_BYTES)
    try:
        os.preadv(fd, [buf], at, flag)
    except OSError:
        return 0
    return flag
