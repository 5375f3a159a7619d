"""One on-disk Engram table, read without caching (SPEC §8).

:class:`Table` opens its own read-only descriptor on the model file: Linux
``O_DIRECT`` with aligned bounce buffers sized to the device's logical block;
where ``O_DIRECT`` is refused (tmpfs, some network file systems)
``posix_fadvise(RANDOM)`` and ``DONTNEED`` on every span read; macOS
``F_NOCACHE`` and ``F_RDAHEAD 0``.  The table is never mapped.

Batched reads sort the requests by row id, read each distinct row once (rows
sharing or touching a block in one read), copy duplicates, and restore token
order.  Request storage is bounded: 2048 tokens x 24 requests at a time,
whatever the batch size.  A batch with at least ``threshold`` distinct rows is
read concurrently (a persistent pool of pread readers, or an io_uring ring
when liburing was present at build time), smaller batches serially.  The GIL
is released while reading and decoding.
"""

from __future__ import annotations

import errno as _errno
import mmap
import os
import stat
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Optional, Union

import numpy as np

from ._native import reader as _reader
from .errors import ArgumentError, DecodeError, RowRangeError, TableIOError

__all__ = ["Table", "TableGroup", "ReadStats", "available_backends", "ROW_BYTES", "ROW_VALUES"]

#: Bytes of one encoded row and values it decodes to (SPEC §5).
ROW_BYTES = 264
ROW_VALUES = 256

_BACKEND_CODES = {"serial": _reader.BACKEND_SERIAL, "pread": _reader.BACKEND_PREAD,
                  "io_uring": _reader.BACKEND_URING}

#: Most readers (pool threads or ring entries) a table or group may ask for.
MAX_READERS = 4096
#: Largest alignment of direct reads (``block_size``).
MAX_BLOCK_SIZE = 1 << 20

#: Backend chosen by ``backend="auto"`` when several are built; set from the
#: measurements in benchmarks/BENCHMARKS.md (storage engine section).
AUTO_ORDER = ("io_uring", "pread")


def available_backends() -> tuple[str, ...]:
    """Read backends compiled into this build: ``serial``, ``pread`` and, with liburing, ``io_uring``."""
    out = ["serial", "pread"]
    if _reader.HAVE_URING:
        out.append("io_uring")
    return tuple(out)


@dataclass
class ReadStats:
    """What one read call (or all calls of a table, cumulatively) did.

    Attributes
    ----------
    rows_requested : int
        Row ids asked for (duplicates included).
    rows_distinct : int
        Distinct rows read (per 2048-token chunk).
    reads : int
        I/O requests issued (one aligned span each).
    bytes_read : int
        Bytes read from the device (whole aligned spans).
    wall_s : float
        Wall time in seconds, from the call to the published output.
    backend : str
        ``serial``, ``pread`` or ``io_uring``; ``+serial`` is appended when some
        chunks of the call were small enough to be read serially.
    concurrency : int
        Readers or ring depth used (1 for serial reads).
    calls : int
        Read calls counted.
    """

    rows_requested: int = 0
    rows_distinct: int = 0
    reads: int = 0
    bytes_read: int = 0
    wall_s: float = 0.0
    backend: str = ""
    concurrency: int = 1
    calls: int = 0

    def add(self, other: "ReadStats") -> None:
        """Accumulate ``other`` into this record."""
        self.rows_requested += other.rows_requested
        self.rows_distinct += other.rows_distinct
        self.reads += other.reads
        self.bytes_read += other.bytes_read
        self.wall_s += other.wall_s
        self.calls += other.calls
        self.concurrency = max(self.concurrency, other.concurrency)
        if other.backend and other.backend not in self.backend.split(","):
            self.backend = f"{self.backend},{other.backend}" if self.backend else other.backend

    def to_dict(self) -> dict:
        return asdict(self)


def _logical_block_size(fd: int) -> int:
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


def _close(fd: int) -> None:
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
        _close(fd)
        raise
    return fd


def _open_uncached(path: str, direct: Union[bool, str], block_size: Optional[int]) -> tuple[int, bool, int]:
    """Open ``path`` read-only without caching: returns (fd, direct?, alignment)."""
    if direct not in (True, False, "auto"):
        raise ArgumentError(f"direct must be True, False or 'auto', got {direct!r}")
    o_direct = getattr(os, "O_DIRECT", 0)
    # O_NONBLOCK: opening a FIFO must not wait for a writer; cleared by _regular() on a regular file.
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    if direct is not False and o_direct:
        try:
            fd = _regular(os.open(path, flags | o_direct), path)
        except TableIOError:
            raise
        except FileNotFoundError:
            raise TableIOError(f"{path}: no such file", errno_=_errno.ENOENT) from None
        except OSError as exc:
            if direct is True or exc.errno not in (_errno.EINVAL, _errno.EOPNOTSUPP):
                raise TableIOError(f"{path}: cannot open with O_DIRECT: {exc.strerror}", errno_=exc.errno) from None
        else:
            align = block_size or _logical_block_size(fd)
            # Some file systems accept the flag at open and refuse the read: probe one block.
            buf = mmap.mmap(-1, max(align, mmap.PAGESIZE))
            try:
                os.preadv(fd, [memoryview(buf)[:align]], 0)
                return fd, True, align
            except OSError as exc:
                _close(fd)
                if direct is True or exc.errno != _errno.EINVAL:
                    raise TableIOError(f"{path}: O_DIRECT read refused: {exc.strerror}", offset=0,
                                       errno_=exc.errno) from None
            finally:
                buf.close()
    elif direct is True:
        raise TableIOError(f"{path}: O_DIRECT is not available on {sys.platform}")
    try:
        fd = _regular(os.open(path, flags), path)
    except TableIOError:
        raise
    except OSError as exc:
        raise TableIOError(f"{path}: cannot open: {exc.strerror}", errno_=exc.errno) from None
    if sys.platform == "darwin":  # pragma: no cover - exercised on macOS only
        import fcntl

        fcntl.fcntl(fd, fcntl.F_NOCACHE, 1)
        fcntl.fcntl(fd, getattr(fcntl, "F_RDAHEAD", 45), 0)
    elif hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd, False, 1


def _start_backend(reader, backend: str, readers: int, path: str) -> tuple[str, Optional[str]]:
    """Start the pool or ring of ``reader``: returns (backend in use, fallback reason or None)."""
    if backend == "serial":
        return "serial", None
    order = AUTO_ORDER if backend == "auto" else (backend,)
    reasons = []
    for name in order:
        err = reader.start_ring(readers) if name == "io_uring" else reader.start_pool(readers)
        if err == 0:
            return name, ("; ".join(reasons) or None)
        why = f"{name} could not start: {os.strerror(err)}"
        if backend != "auto":
            raise TableIOError(f"{path}: {why}", errno_=err)
        reasons.append(why)
    raise TableIOError(f"{path}: no read backend could start ({'; '.join(reasons)})")


def _row_ids(ids, ndim: int, width: Optional[int], describe) -> np.ndarray:
    """``ids`` as a uint32 array of ``ndim`` dims (strides kept when already uint32).

    ``describe(row, where)`` gives the message of a ``RowRangeError`` for an id
    that is negative or beyond uint32; the per-table bound is checked in C.
    """
    if isinstance(ids, np.ndarray):
        a = ids
    else:
        try:
            a = np.asarray(ids)
        except (TypeError, ValueError) as exc:
            raise ArgumentError(f"row ids must be an integer array, got {type(ids).__name__} ({exc})") from None
    if a.ndim != ndim or (width is not None and a.shape[1] != width):
        want = f"[T, {width}]" if width is not None else f"{ndim}-D"
        raise ArgumentError(f"row ids must have shape {want}, got {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        raise ArgumentError(f"row ids must be integers, got dtype {a.dtype}")
    if a.dtype != np.uint32:
        if a.size:
            bad = (a < 0) | (a > np.iinfo(np.uint32).max)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise RowRangeError(describe(int(a[where]), where))
        a = a.astype(np.uint32)
    elif any(s % 4 for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def _new_reader(segments, alignment: int, dontneed: bool, path: str):
    """A native reader; its limits (16 tables, offsets below 2**44) become ``ArgumentError``."""
    try:
        return _reader.RowReader(segments, alignment, dontneed)
    except ValueError as exc:
        raise ArgumentError(f"{path}: {exc}; the reader addresses offsets below 2**44") from None


def _failure_to_error(f, paths, rows, two_d: bool, seg_cols: int = 0, names=None) -> Exception:
    """The public error for a ``ReadFailure`` of a reader over the tables ``paths``."""
    kind, a, b, c, d = f.args
    if kind == "range":
        seg = c // seg_cols if seg_cols else 0
        where = f"token {b}, column {c}" if two_d else f"position {b}"
        table = f" ({names[seg]})" if names else ""
        return RowRangeError(f"{paths[seg]}{table}: row id {a} at {where} is outside the table [0, {rows[seg]})")
    table = f" ({names[c]})" if names else ""
    if kind == "decode":
        return DecodeError(
            f"{paths[c]}{table}: row {a} (file offset {b}) column {d} does not decode to a finite value "
            f"(NaN code, NaN scale or overflow)", row=a, column=d)
    if kind == "short":
        return TableIOError(
            f"{paths[c]}{table}: short read: row {a} at file offset {b} lies past the data the device "
            f"returned (file truncated?)", row=a, offset=b, errno_=_errno.EIO)
    if kind == "ring":
        return TableIOError(f"{paths[0]}: io_uring failed: {os.strerror(d)}", errno_=d)
    return TableIOError(f"{paths[c]}{table}: reading row {a} at file offset {b} failed: {os.strerror(d)}",
                        row=a, offset=b, errno_=d)


class Closing:
    """Context-manager protocol for objects with an idempotent ``close()``; closes on collection too."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _RowReads(Closing):
    """Read machinery shared by :class:`Table` and :class:`TableGroup` (staging, stats, errors)."""

    @staticmethod
    def _check_out(out, shape) -> None:
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape \
                or not out.flags.c_contiguous or not out.flags.writeable:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ArgumentError(f"out must be a writable C-contiguous float32 array of shape {shape}, got {got}")

    def _read(self, ids: np.ndarray, target: np.ndarray, caller_out: Optional[np.ndarray],
              seg_cols: Optional[int] = None) -> None:
        """Read ``ids`` into ``target``; a caller's multi-chunk ``out`` is staged so
        that a failure leaves it untouched.  Shared by :class:`TableGroup`."""
        staged = caller_out is not None and ids.size > _reader.CHUNK_REQUESTS
        dest = np.empty_like(target) if staged else target
        t0 = time.perf_counter()
        with self._lock:
            if self._reader is None:
                raise TableIOError(f"{self.path}: closed")
            try:
                req, dist, nreads, nbytes, conc, n_serial, n_conc = self._reader.read(
                    ids, dest, self.threshold, _BACKEND_CODES[self.backend], seg_cols or max(1, ids.shape[1]))
            except _reader.ReadFailure as f:
                raise self._error(f, ids) from None
        if staged:
            np.copyto(target, dest)
        backend = self.backend if n_conc else "serial"
        if n_conc and n_serial:
            backend += "+serial"
        st = ReadStats(rows_requested=req, rows_distinct=dist, reads=nreads, bytes_read=nbytes,
                       wall_s=time.perf_counter() - t0, backend=backend, concurrency=conc, calls=1)
        self.last_stats = st
        self.stats.add(st)


class Table(_RowReads):
    """One Engram table inside a model file, read uncached.

    Parameters
    ----------
    path : str or os.PathLike
        File holding the table (a model GGUF or one shard of it).
    offset : int
        Absolute byte offset of row 0 in the file (``ModelInfo.tables[L].offset``).
    rows : int
        Rows of the table (``Layout.rows``); ids must lie in ``[0, rows)``.
    backend : {"auto", "io_uring", "pread", "serial"}
        Concurrent read backend.  ``auto`` takes io_uring when it was built and
        its ring starts, else the pread pool (the reason is kept in
        :attr:`fallback`).  ``serial`` never reads concurrently.
    readers : int
        pread readers (persistent threads, the caller being one) or io_uring
        ring depth: the queue depth of a concurrent batch.  At most :data:`MAX_READERS`.
    threshold : int
        Batches with at least this many distinct rows are read concurrently;
        smaller ones serially (the reference engine uses 8, SPEC §8).
    direct : True, False or "auto"
        ``O_DIRECT`` required, never, or when the file system accepts it
        (else ``posix_fadvise`` RANDOM + DONTNEED).
    block_size : int, optional
        Alignment of direct reads; default the device's logical block size.

    Raises
    ------
    TableIOError
        The file cannot be opened, is not a regular file (a directory, FIFO or
        device), is shorter than ``offset + rows * 264``, or the requested
        backend cannot start.
    ArgumentError
        Invalid parameters.
    """

    def __init__(self, path: Union[str, os.PathLike], offset: int, rows: int, *, backend: str = "auto",
                 readers: int = 16, threshold: int = 8, direct: Union[bool, str] = "auto",
                 block_size: Optional[int] = None):
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise ArgumentError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
        for name, v, lo in (("offset", offset, 0), ("rows", rows, 1), ("readers", readers, 1),
                            ("threshold", threshold, 0)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ArgumentError(f"{name} must be an integer >= {lo}, got {v!r}")
        if rows > 2**32:
            raise ArgumentError(f"rows must fit uint32 row ids, got {rows}")
        if readers > MAX_READERS:
            raise ArgumentError(f"readers must be at most {MAX_READERS}, got {readers}")
        if backend not in ("auto", "io_uring", "pread", "serial"):
            raise ArgumentError(f"backend must be 'auto', 'io_uring', 'pread' or 'serial', got {backend!r}")
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer))
                                       or not 512 <= block_size <= MAX_BLOCK_SIZE or block_size & (block_size - 1)):
            raise ArgumentError(f"block_size must be a power of two in [512, {MAX_BLOCK_SIZE}], got {block_size!r}")
        self.offset = int(offset)
        self.rows = int(rows)
        self.readers = int(readers)
        self.threshold = int(threshold)
        self.fallback: Optional[str] = None
        self._lock = threading.Lock()
        self._reader = None
        self._fd = -1
        fd, self.direct, self.alignment = _open_uncached(self.path, direct, block_size)
        self._fd = fd
        try:
            size = os.fstat(fd).st_size
            end = self.offset + self.rows * ROW_BYTES
            if size < end:
                raise TableIOError(
                    f"{self.path}: table of {self.rows} rows at offset {self.offset} ends at byte {end}, "
                    f"past the end of the file ({size} bytes)", offset=end)
            self._reader = _new_reader([(fd, self.offset, self.rows)], self.alignment, not self.direct, self.path)
            self.backend, self.fallback = _start_backend(self._reader, backend, self.readers, self.path)
        except BaseException:
            self.close()
            raise
        self.last_stats = ReadStats()
        self.stats = ReadStats()

    # ----------------------------------------------------------------- reads
    def read_rows(self, ids, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Decoded rows of ``ids``.

        Parameters
        ----------
        ids : array_like of int, shape ``[n]``
            Row ids in ``[0, rows)``.
        out : numpy.ndarray, optional
            float32 ``[n, 256]``, C-contiguous and writable.

        Returns
        -------
        numpy.ndarray
            float32 ``[n, 256]`` holding bf16 values (SPEC §5), in the order of ``ids``.

        Raises
        ------
        RowRangeError
            An id outside the table (before any I/O).
        TableIOError
            A read failed or ended early (names row and file offset).
        DecodeError
            A row holds a NaN code or scale or overflows (names row and column).
        ArgumentError
            Wrong shape or dtype of ``ids`` or ``out``.
        On every error ``out`` is left untouched.
        """
        a = self._ids(ids, ndim=1)
        n = a.shape[0]
        if out is not None:
            self._check_out(out, (n, ROW_VALUES))
            self._read(a.reshape(n, 1), out.reshape(n, 1, ROW_VALUES), out)
            return out
        res = np.empty((n, 1, ROW_VALUES), dtype=np.float32)
        self._read(a.reshape(n, 1), res, None)
        return res.reshape(n, ROW_VALUES)

    def read_batch(self, ids, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Decoded rows of a batch of tokens, in token order.

        Parameters
        ----------
        ids : array_like of int, shape ``[T, C]``
            Row ids of each token and column (``C = 24`` for one V4.1 layer);
            strided views such as ``rows[:, layer, :]`` of a hasher output are
            read without a copy.
        out : numpy.ndarray, optional
            float32 ``[T, C, 256]``, C-contiguous and writable.

        Returns
        -------
        numpy.ndarray
            float32 ``[T, C, 256]`` holding bf16 values.

        Raises
        ------
        Same as :meth:`read_rows`; on every error ``out`` is left untouched.
        """
        a = self._ids(ids, ndim=2)
        T, C = a.shape
        if out is not None:
            self._check_out(out, (T, C, ROW_VALUES))
            self._read(a, out, out)
            return out
        res = np.empty((T, C, ROW_VALUES), dtype=np.float32)
        self._read(a, res, None)
        return res

    def _ids(self, ids, ndim: int) -> np.ndarray:
        return _row_ids(ids, ndim, None, self._range_message)

    def _range_message(self, row: int, where) -> str:
        pos = f"token {where[0]}, column {where[1]}" if len(where) == 2 else f"position {where[0]}"
        return f"{self.path}: row id {row} at {pos} is outside the table [0, {self.rows})"

    def _error(self, f, ids) -> Exception:
        return _failure_to_error(f, [self.path], [self.rows], ids.shape[1] > 1)

    # ------------------------------------------------------------- lifetime
    @property
    def closed(self) -> bool:
        return self._reader is None

    def close(self) -> None:
        """Stop the readers and close the descriptor (idempotent)."""
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.acquire()
        try:
            if getattr(self, "_reader", None) is not None:
                self._reader.close()
                self._reader = None
            if getattr(self, "_fd", -1) >= 0:
                fd, self._fd = self._fd, -1
                _close(fd)
        finally:
            if lock is not None:
                lock.release()


    def __repr__(self) -> str:
        return (f"Table({self.path!r}, offset={self.offset}, rows={self.rows}, backend={self.backend!r}, "
                f"readers={self.readers}, threshold={self.threshold}, direct={self.direct}, "
                f"alignment={self.alignment})")


class TableGroup(_RowReads):
    """Several tables read as one batch: a decode step's rows of every Engram layer (SPEC §8).

    Column ``c`` of a batch reads from ``tables[c // columns]``, so the 48 rows
    of a V4.1 decode step (24 per layer) go out as one concurrent batch.  The
    group opens no descriptor: it reads through the tables' own, and has its
    own readers (pool threads or ring), so it must not outlive them.

    Parameters
    ----------
    tables : sequence of Table
        Open tables, all direct or all buffered (up to 16).
    columns : int
        Columns per table in a batch (24 for V4.1).
    backend, readers, threshold
        As for :class:`Table`; default those of the first table.

    Raises
    ------
    ArgumentError
        No tables, closed tables, or a mix of direct and buffered descriptors.
    TableIOError
        The requested backend cannot start.
    """

    def __init__(self, tables, columns: int = 24, *, backend: Optional[str] = None,
                 readers: Optional[int] = None, threshold: Optional[int] = None):
        tables = list(tables)
        if not tables or not all(isinstance(t, Table) for t in tables):
            raise ArgumentError("TableGroup needs one or more engram.Table objects")
        if any(t.closed for t in tables):
            raise ArgumentError("TableGroup: a table is closed")
        if len({t.direct for t in tables}) != 1:
            raise ArgumentError("TableGroup: tables mix O_DIRECT and buffered descriptors")
        if isinstance(columns, bool) or not isinstance(columns, (int, np.integer)) or columns < 1:
            raise ArgumentError(f"columns must be a positive integer, got {columns!r}")
        if len(tables) > _reader.MAX_SEGMENTS:
            raise ArgumentError(f"TableGroup reads at most {_reader.MAX_SEGMENTS} tables as one batch, "
                                f"got {len(tables)}")
        if backend is not None and backend not in ("auto", "io_uring", "pread", "serial"):
            raise ArgumentError(f"backend must be 'auto', 'io_uring', 'pread' or 'serial', got {backend!r}")
        for name, v in (("readers", readers), ("threshold", threshold)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise ArgumentError(f"{name} must be an integer, got {v!r}")
        first = tables[0]
        self.tables = tables
        self.columns = int(columns)
        self.readers = int(readers if readers is not None else first.readers)
        self.threshold = int(threshold if threshold is not None else first.threshold)
        if not 1 <= self.readers <= MAX_READERS or self.threshold < 0:
            raise ArgumentError(f"readers must be in [1, {MAX_READERS}] and threshold >= 0, "
                                f"got {self.readers} and {self.threshold}")
        self.fallback: Optional[str] = None
        self._lock = threading.Lock()
        self.path = ", ".join(sorted({t.path for t in tables}))
        self._reader = _new_reader([(t._fd, t.offset, t.rows) for t in tables],
                                   max(t.alignment for t in tables), not first.direct, self.path)
        backend = backend or ("auto" if first.fallback else first.backend)
        try:
            self.backend, self.fallback = _start_backend(self._reader, backend, self.readers, self.path)
        except BaseException:
            self._reader.close()
            self._reader = None
            raise
        self.last_stats = ReadStats()
        self.stats = ReadStats()

    def read_batch(self, ids, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows of every table for a batch of tokens.

        Parameters
        ----------
        ids : array_like of int, shape ``[T, len(tables) * columns]``
            Row ids, table after table (e.g. a hasher output ``[T, 2, 24]``
            reshaped to ``[T, 48]``).
        out : numpy.ndarray, optional
            float32 ``[T, len(tables) * columns, 256]``, C-contiguous, writable.

        Returns
        -------
        numpy.ndarray
            float32 ``[T, len(tables) * columns, 256]`` holding bf16 values.

        Raises
        ------
        RowRangeError, TableIOError, DecodeError, ArgumentError
            As :meth:`Table.read_batch`, naming the table's file; ``out`` is
            left untouched on every error.
        """
        width = len(self.tables) * self.columns
        a = _row_ids(ids, 2, width, self._range_message)
        for i, t in enumerate(self.tables):
            if t.closed:  # its descriptor is gone (and its number may already name another file)
                raise TableIOError(f"{t.path} (table {i}): closed; the group cannot read it")
        shape = (a.shape[0], width, ROW_VALUES)
        if out is not None:
            self._check_out(out, shape)
            self._read(a, out, out, self.columns)
            return out
        res = np.empty(shape, np.float32)
        self._read(a, res, None, self.columns)
        return res

    def _error(self, f, ids) -> Exception:
        return _failure_to_error(f, [t.path for t in self.tables], [t.rows for t in self.tables], True,
                                 self.columns, [f"table {i}" for i in range(len(self.tables))])

    def _range_message(self, row: int, where) -> str:
        t = self.tables[where[1] // self.columns]
        return (f"{t.path} (table {where[1] // self.columns}): row id {row} at token {where[0]}, "
                f"column {where[1]} is outside the table [0, {t.rows})")

    @property
    def closed(self) -> bool:
        return self._reader is None

    def close(self) -> None:
        """Stop this group's readers (the tables stay open)."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

