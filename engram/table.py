"""One on-disk Engram table, read without caching (SPEC §8).

:class:`Table` opens its own read-only descriptor on the model file
(:mod:`engram.uncached`: Linux ``O_DIRECT`` with aligned bounce buffers sized
to the device's logical block; where ``O_DIRECT`` is refused a buffered
descriptor that keeps the page cache flat; macOS ``F_NOCACHE`` and
``F_RDAHEAD 0``).  The table is never mapped.

Batched reads sort the requests by row id, read each distinct row once (rows
sharing or touching a block in one read), copy duplicates, and restore token
order.  Request storage is bounded: 2048 tokens x 24 requests at a time,
whatever the batch size.  A batch with at least ``threshold`` distinct rows is
read concurrently (a persistent pool of pread readers, or an io_uring ring),
smaller batches serially; ``backend="serial"`` never reads concurrently.  The
GIL is released while reading and decoding.  Which backends start on this
machine, and the process's fallback from the ring, live in
:mod:`engram.backends`.

By default a table or group has its own readers: an I/O engine of its own
(:mod:`engram.io_engine`, the same pool and ring loops as the shared one).
With ``engine="shared"`` it reads through the process's engine of the file's
device, whose queue depth, pool threads and rings all its sessions share,
fairly; :class:`engram.Session` does this (the two defaults and why:
:mod:`engram.io_engine`).
"""

from __future__ import annotations

import errno as _errno
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Optional, Union

import numpy as np

from . import backends as _backends
from . import forks as _forks
from ._native import reader as _reader
from .backends import AUTO_ORDER, available_backends
from .codec import ROW_BYTES, ROW_VALUES
from .errors import ArgumentError, DecodeError, RowRangeError, TableIOError
from .io_engine import TABLE_ENGINE, EngineClient, IOEngine, generation as _engine_generation, shared_engine
from .rowcache import RowCache
from .uncached import close_quietly, open_uncached

__all__ = ["Table", "TableGroup", "ReadStats", "available_backends", "ROW_BYTES", "ROW_VALUES",
           "DEFAULT_READERS", "DEFAULT_THRESHOLD", "BACKENDS", "AUTO_ORDER", "ENGINES"]

#: Read backends a table can be asked for (``serial``: never concurrent, whatever the threshold).
BACKENDS = ("auto", "io_uring", "pread", "serial")
#: What a table or group reads through: its own readers, or an I/O engine (:mod:`engram.io_engine`).
ENGINES = ("private", "shared")
_BACKEND_CODES = {"serial": _reader.BACKEND_SERIAL, "pread": _reader.BACKEND_PREAD,
                  "io_uring": _reader.BACKEND_URING}

#: Default readers (pool threads or ring depth) of a table, and the default threshold (distinct
#: rows from which a batch is read concurrently; 8 as in the reference engine, SPEC §8).  Set from
#: benchmarks/BENCHMARKS.md, "Storage engine (bench_table)": 8 makes a decode step's 48 rows
#: concurrent; 16 readers reach the device on prefill batches, a decode step is at its best with
#: at least 48.
DEFAULT_READERS = 16
DEFAULT_THRESHOLD = 8

#: Most readers (pool threads or ring entries) a table or group may ask for.
MAX_READERS = 4096
#: Largest alignment of direct reads (``block_size``).
MAX_BLOCK_SIZE = 1 << 20


@dataclass
class ReadStats:
    """What one read call (or all calls of a table, cumulatively) did.

    Attributes
    ----------
    rows_requested : int
        Row ids asked for (duplicates included; row cache hits included).
    rows_distinct : int
        Distinct rows read (per 2048-token chunk): with a row cache, of its misses.
    cache_hits : int
        Row ids served by the row cache (:class:`engram.RowCache`; 0 without one): these
        were neither read nor counted in ``rows_distinct``, ``reads`` or ``bytes_read``.
    prefetch_hits : int
        Row ids of a decode step taken from a prefetch of drafted tokens (:meth:`engram.Session.prefetch`,
        speculative decoding; 0 otherwise): read in the background before the step, so neither read by
        the step nor counted in ``rows_distinct``, ``reads``, ``bytes_read`` or ``cache_hits``.
    reads : int
        I/O requests issued (one aligned span each).
    bytes_read : int
        Bytes read from the device (whole aligned spans).
    wall_s : float
        Wall time in seconds, from the call to the published output.
    backend : str
        ``serial``, ``pread`` or ``io_uring``; ``+serial`` is appended when some
        chunks of the call were small enough to be read serially; ``cache`` when
        the row cache served every row; ``prefetch`` when a prefetch did.  After a
        fallback from the ring this says ``pread``.
    concurrency : int
        Readers or ring depth used (1 for serial reads).
    calls : int
        Read calls counted.
    others_reads : int
        Reads of other clients (sessions) the shared engine granted while these
        calls were in progress (0 with private readers): how much this read was
        interleaved with others'.
    """

    rows_requested: int = 0
    rows_distinct: int = 0
    reads: int = 0
    bytes_read: int = 0
    wall_s: float = 0.0
    backend: str = ""
    concurrency: int = 1
    calls: int = 0
    others_reads: int = 0
    cache_hits: int = 0
    prefetch_hits: int = 0

    def add(self, other: "ReadStats") -> None:
        """Accumulate ``other`` into this record."""
        self.rows_requested += other.rows_requested
        self.rows_distinct += other.rows_distinct
        self.reads += other.reads
        self.bytes_read += other.bytes_read
        self.wall_s += other.wall_s
        self.calls += other.calls
        self.others_reads += other.others_reads
        self.cache_hits += other.cache_hits
        self.prefetch_hits += other.prefetch_hits
        self.concurrency = max(self.concurrency, other.concurrency)
        b = other.backend
        if b and b != self.backend and b not in self.backend.split(","):
            self.backend = f"{self.backend},{b}" if self.backend else b

    def to_dict(self) -> dict:
        return asdict(self)


def _engine_client(engine, fd: int, readers: int, path: str) -> Optional[EngineClient]:
    """The engine client a new table or group reads through (a reference of its own), or None
    for its own readers.  ``engine``: "private", "shared" (the engine of ``fd``'s device), an
    :class:`~engram.io_engine.IOEngine` (a new client of it) or an
    :class:`~engram.io_engine.EngineClient` (shared with its other users, e.g. a session's tables)."""
    if engine is None or engine == "private":
        return None
    if isinstance(engine, str):
        if engine != "shared":
            raise ArgumentError(f"engine must be one of {', '.join(map(repr, ENGINES))}, an IOEngine or an "
                                f"EngineClient, got {engine!r}")
        try:
            return shared_engine(fd).client(readers)
        except OSError as exc:
            raise TableIOError(f"{path}: cannot find the device of the file: {exc.strerror}", errno_=exc.errno) from None
    if isinstance(engine, IOEngine):
        return engine.client(readers)
    if isinstance(engine, EngineClient):
        return engine.retain(readers)
    raise ArgumentError(f"engine must be one of {', '.join(map(repr, ENGINES))}, an IOEngine or an EngineClient, "
                        f"got {type(engine).__name__}")


#: Largest row id (row ids are uint32, SPEC §4).
_ROW_ID_MAX = 0xFFFFFFFF
#: Lists up to this long are converted natively (`reader.list_ids`: cheaper than NumPy's list parser).
_SHORT_LIST = 16


def _row_ids(ids, ndim: int, width: Optional[int], describe) -> np.ndarray:
    """``ids`` as a uint32 array of ``ndim`` dims (strides kept when already uint32).

    ``describe(row, where)`` gives the message of a ``RowRangeError`` for an id
    that is negative or beyond uint32; the per-table bound is checked in C.
    """
    if ndim == 1 and type(ids) is list and len(ids) <= _SHORT_LIST:
        # a short list of Python ints in range (a single row, a decode step's column): converted natively;
        # anything else (bools, floats, NumPy scalars, out of range) takes the general path and its errors
        a = _reader.list_ids(ids, False)
        if a is not None:
            return a
    return _array_ids(ids, ndim, width, describe)


def _array_ids(ids, ndim: int, width: Optional[int], describe) -> np.ndarray:
    """:func:`_row_ids` of anything but a short list of ints in range: through NumPy, every error named."""
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
        if a.size and (a.min() < 0 or a.max() > _ROW_ID_MAX):
            bad = (a < 0) | (a > _ROW_ID_MAX)
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise RowRangeError(describe(int(a[where]), where))
        a = a.astype(np.uint32)
    elif any(s % 4 for s in a.strides):
        a = np.ascontiguousarray(a)
    return a


def _new_reader(segments, alignment: int, drop_bytes: int, read_flags: int, path: str):
    """A native reader; its limits (16 tables, offsets below 2**44) become ``ArgumentError``."""
    try:
        return _reader.RowReader(segments, alignment, drop_bytes, read_flags)
    except ValueError as exc:
        raise ArgumentError(f"{path}: {exc}; the reader addresses offsets below 2**44") from None


def _failure_to_error(f, paths, rows, two_d: bool, names=None) -> Exception:
    """The public error for a ``ReadFailure`` ``f`` of a reader over the tables ``paths``.

    ``rows``: rows of each table; ``two_d``: the caller passed ``[T, C]`` ids
    (positions are "token, column") rather than ``[n]``; ``names``: labels of
    the tables in a group.
    """
    seg = f.segment
    table = f" ({names[seg]})" if names else ""
    if f.kind == "range":
        where = f"token {f.token}, column {f.column}" if two_d else f"position {f.token}"
        return RowRangeError(f"{paths[seg]}{table}: row id {f.row} at {where} is outside the table [0, {rows[seg]})")
    if f.kind == "decode":
        return DecodeError(
            f"{paths[seg]}{table}: row {f.row} (file offset {f.offset}) column {f.value_column} does not decode "
            f"to a finite value (NaN code, NaN scale or overflow)", row=f.row, column=f.value_column)
    if f.kind == "short":
        return TableIOError(
            f"{paths[seg]}{table}: short read: row {f.row} at file offset {f.offset} lies past the data the "
            f"device returned (file truncated?)", row=f.row, offset=f.offset, errno_=_errno.EIO)
    if f.kind == "ring":
        return TableIOError(f"{', '.join(sorted(set(paths)))}: {_backends.read_failure(f)}", errno_=f.errno)
    if f.kind == "start":
        why = _backends.start_failure(f.errno) if f.backend == "io_uring" else \
            f"pread could not start: {os.strerror(f.errno)}"
        return TableIOError(f"{', '.join(sorted(set(paths)))}: {why}", errno_=f.errno)
    return TableIOError(f"{paths[seg]}{table}: reading row {f.row} at file offset {f.offset} through {f.backend} "
                        f"failed: {os.strerror(f.errno)}", row=f.row, offset=f.offset, errno_=f.errno)


def _check_engine(engine) -> None:
    """``ArgumentError`` unless ``engine`` names what a table or group reads through."""
    if engine is None or isinstance(engine, (IOEngine, EngineClient)):
        return
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ArgumentError(f"engine must be one of {', '.join(map(repr, ENGINES))}, an IOEngine or an EngineClient, "
                            f"got {engine!r}")


def _check_policy(backend: str, readers, threshold) -> None:
    """``ArgumentError`` unless backend, readers and threshold form a read policy."""
    if backend not in BACKENDS:
        raise ArgumentError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    for name, v, lo in (("readers", readers, 1), ("threshold", threshold, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ArgumentError(f"{name} must be an integer >= {lo}, got {v!r}")
    if readers > MAX_READERS:
        raise ArgumentError(f"readers must be at most {MAX_READERS}, got {readers}")


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

    def _after_fork_child(self) -> None:
        """In a child after fork(): the lock may be held by a thread of the parent (a prefill reader
        inside a read); the child's is new.  The reader forgets the parent's pool and ring itself, and
        a read the parent began is forgotten here (its engine job is the parent's)."""
        self._lock = threading.Lock()
        self._begun = None

    # A read the row cache serves whole adds its counts to ``stats`` in place and builds its ``last_stats``
    # only when asked, so a hit pays for no object that nobody reads.  ``_last_hit``: (rows, wall_s) while the
    # last read was such a read; ``_cache_in``: the backend string of ``stats`` known to name "cache".
    _last: "ReadStats" = None
    _last_hit: Optional[tuple] = None
    _cache_in: Optional[str] = None

    @property
    def last_stats(self) -> "ReadStats":
        """:class:`ReadStats` of the last read call."""
        h = self._last_hit
        if h is not None:
            self._last = ReadStats(rows_requested=h[0], wall_s=h[1], backend="cache", calls=1, cache_hits=h[0])
            self._last_hit = None
        return self._last

    @last_stats.setter
    def last_stats(self, st: "ReadStats") -> None:
        self._last, self._last_hit = st, None

    def _count_hits(self, n: int, wall: float) -> None:
        """Record a read of ``n`` rows the row cache served whole in ``wall`` seconds."""
        self._last_hit = (n, wall)
        s = self.stats
        s.rows_requested += n
        s.cache_hits += n
        s.calls += 1
        s.wall_s += wall
        if s.backend is not self._cache_in:
            if "cache" not in s.backend.split(","):
                s.backend = f"{s.backend},cache" if s.backend else "cache"
            self._cache_in = s.backend

    # A group reads through its tables' descriptors: while it does, each table is pinned, and a table closed
    # meanwhile closes its descriptor when the last pin goes (its number would otherwise name the next file
    # opened, whose bytes the read would publish and the row cache keep).
    def _pin(self) -> None:
        """Keep the descriptors this reads through open until :meth:`_unpin` (TableIOError when closed)."""

    def _unpin(self) -> None:
        """Release what :meth:`_pin` kept."""

    @staticmethod
    def _check_out(out, shape) -> None:
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape \
                or not out.flags.c_contiguous or not out.flags.writeable:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ArgumentError(f"out must be a writable C-contiguous float32 array of shape {shape}, got {got}")

    @staticmethod
    def _check_raw_out(out, shape) -> None:
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != shape \
                or not out.flags.c_contiguous or not out.flags.writeable:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ArgumentError(f"out must be a writable C-contiguous uint8 array of shape {shape} (raw "
                                f"{ROW_BYTES}-byte records), got {got}")

    def _read_into(self, ids: np.ndarray, out: Optional[np.ndarray], shape: tuple, raw: bool = False,
                   seg_cols: Optional[int] = None) -> np.ndarray:
        """Read ``ids`` into the caller's ``out`` (checked: float32 rows, or with ``raw`` uint8 records, of
        ``shape``) or into a new array; the one body of ``read_batch`` and ``read_raw``."""
        if out is not None:
            (self._check_raw_out if raw else self._check_out)(out, shape)
            self._read(ids, out, out, seg_cols, raw=raw)
            return out
        res = np.empty(shape, np.uint8 if raw else np.float32)
        self._read(ids, res, None, seg_cols, raw=raw)
        return res

    def _read(self, ids: np.ndarray, target: np.ndarray, caller_out: Optional[np.ndarray],
              seg_cols: Optional[int] = None, raw: bool = False, layers: bool = False) -> None:
        """Read ``ids`` into ``target`` (decoded rows, or with ``raw`` the 264-byte records); a
        caller's multi-chunk ``out`` is staged so that a failure leaves it untouched.  Shared by
        :class:`TableGroup`.  Raw reads pass by the row cache (it serves decoded rows).  ``layers``: ``ids``
        ``[1, n]`` are a group's ``[tables, T, columns]`` flattened (:meth:`TableGroup.read_layers`), which
        errors name positions of."""
        t0 = time.perf_counter()
        cache = None if raw else self._cache
        # a caller's out is staged when a failure could leave it half written: more than one chunk, or the
        # cache's hits written before the misses' reads (one row is a hit or a read, never both)
        n_ids = ids.size
        staged = caller_out is not None and (n_ids > _reader.CHUNK_REQUESTS or (cache is not None and n_ids > 1))
        dest = np.empty_like(target) if staged else target
        seg_cols = seg_cols or max(1, ids.shape[1])
        nh, keys, skip = 0, None, None
        if cache is not None and n_ids:  # hits are served (decoded) here; the reader gets the misses only
            if self._reader is None:
                raise TableIOError(f"{self.path}: closed")
            n = n_ids
            keys, skip = _reader.cache_buffers(n)
            lay, bound = self._cache_columns(ids.shape[1], seg_cols)
            nh = cache.serve(ids, lay, keys, dest, skip, bound)  # dest [n, 256] or [T, C, 256]
            if nh == n:  # every row served: no read machinery, no lock of the readers, stats built when asked
                if staged:
                    np.copyto(target, dest)
                self._count_hits(n, time.perf_counter() - t0)
                return
            # the misses are inserted by the reader itself, from its staged reads (no raw copy, no admit call)
            if not nh:
                skip = None
        else:
            cache = None
        with self._lock:
            self._ready()
            try:  # positional arguments: no keyword dict built and parsed on every read
                res = self._reader.read(ids, dest, self.threshold, self._backend_code(), seg_cols, skip, None,
                                        not raw, cache, keys)
            except _reader.ReadFailure as f:
                if not self._ring_at_fault(f):
                    raise self._error(f, ids, layers) from None
                extra, fused = ((skip,), {"cache": cache, "keys": keys}) if cache is not None else ((), {})
                res = self._reread_on_pool(f, ids, dest, seg_cols, extra, raw, fused, layers)
        if staged:
            np.copyto(target, dest)
        self._count(res, nh, t0)

    def _count(self, res: tuple, nh: int, t0: float) -> ReadStats:
        """Record the statistics of a read: ``res`` the native reader's tuple, ``nh`` the row cache's
        hits, ``t0`` the call's start (``time.perf_counter()``)."""
        req, dist, nreads, nbytes, conc, n_serial, n_pool, n_ring, others = res
        used = [name for name, n in (("io_uring", n_ring), ("pread", n_pool)) if n]
        backend = "+".join(used) if used else "serial" if req or not nh else "cache"
        if used and n_serial:
            backend += "+serial"
        st = ReadStats(rows_requested=req + nh, rows_distinct=dist, reads=nreads, bytes_read=nbytes,
                       wall_s=time.perf_counter() - t0, backend=backend, concurrency=conc, calls=1,
                       others_reads=others, cache_hits=nh)
        self.last_stats = st
        self.stats.add(st)
        return st

    def _ready(self) -> None:
        """Under ``_lock``, before a read or a begun read: open, attached to this process's engine (again
        after a fork or an engine restart), on the backend the last verdict chose.  TableIOError when closed."""
        if self._reader is None:
            raise TableIOError(f"{self.path}: closed")
        if self._client is not None and self._client_gen != _engine_generation():
            self._reattach()
        self._follow_verdict()

    # ------------------------------------------------- a read begun now, finished later
    _begun: Optional[tuple] = None

    def _begin(self, ids: np.ndarray, target: np.ndarray, seg_cols: int, layers: bool = False) -> None:
        """Begin reading ``ids`` (uint32 ``[T, C]``, one chunk at most) into ``target`` (float32, C-contiguous)
        without waiting: the row cache's hits are decoded now, the misses' reads handed to the engine from
        this thread, every read in flight at once where the engine's queue depth allows
        (``RowReader.begin``).  :meth:`_finish` completes it; until then this object reads nothing else."""
        t0 = time.perf_counter()
        cache = self._cache
        n = ids.size
        nh, keys, skip = 0, None, None
        if self._begun is not None:
            raise ArgumentError(f"{self.path}: a begun read is not finished")
        if cache is not None and n:
            if self._reader is None:
                raise TableIOError(f"{self.path}: closed")
            keys, skip = _reader.cache_buffers(n)
            lay, bound = self._cache_columns(ids.shape[1], seg_cols)
            nh = cache.serve(ids, lay, keys, target, skip, bound)
            if nh == n:  # every row served: nothing to read
                self._begun = (t0, ids, target, seg_cols, nh, False, (), {}, layers)
                return
        with self._lock:
            self._ready()
            try:
                # the misses are inserted by the reader at finish, from its staged reads (as a read's are)
                self._reader.begin(ids, target, self._backend_code(), seg_cols, skip if nh else None, None, n,
                                   cache=cache, keys=keys)
            except _reader.ReadFailure as f:
                raise self._error(f, ids, layers) from None
        extra, fused = ((skip if nh else None,), {"cache": cache, "keys": keys}) if keys is not None else ((), {})
        self._begun = (t0, ids, target, seg_cols, nh, True, extra, fused, layers)

    def _finish(self) -> ReadStats:
        """Wait for the read :meth:`_begin` began, check and publish its rows; its statistics (also in
        ``last_stats``).  Errors as a read's (``TableIOError``, ``DecodeError``); a ring failure is
        read again on the pool as a read's is."""
        if self._begun is None:
            raise ArgumentError(f"{self.path}: no begun read to finish")
        (t0, ids, target, seg_cols, nh, reading, extra, fused, layers), self._begun = self._begun, None
        if reading:
            with self._lock:
                if self._reader is None:
                    raise TableIOError(f"{self.path}: closed")
                try:
                    res = self._reader.finish()
                except _reader.ReadFailure as f:
                    if not self._ring_at_fault(f):
                        raise self._error(f, ids, layers) from None
                    res = self._reread_on_pool(f, ids, target, seg_cols, extra, False, fused, layers)
        else:
            res = (0, 0, 0, 0, 1, 0, 0, 0, 0)
        return self._count(res, nh, t0)

    # ------------------------------------------------- the row cache
    _cache: Optional[RowCache] = None

    def attach_cache(self, cache: Optional[RowCache], layer_ids) -> None:
        """Serve repeated rows from ``cache`` (an :class:`engram.RowCache`; None: no cache).

        ``layer_ids``: the decoder layer of this table (an int) or of each table of a group (a
        sequence), the first part of the cache's keys ``(layer, row)``.  Batches then look their
        rows up first; only the misses are read (sorted, deduplicated) and inserted;
        ``ReadStats.cache_hits`` counts the hits.  :class:`engram.Session` attaches the model's cache.

        Raises
        ------
        ArgumentError
            ``cache`` is not a RowCache or None; ``layer_ids`` is not one layer id (>= 0) per table.
        CacheLayoutError
            The cache serves one of these layer ids from another table (file, offset), or one layer id
            is given for two different tables (:meth:`engram.RowCache.bind_tables`): the keys would mix rows.
        """
        if cache is None:
            self._cache = None
            return
        if not isinstance(cache, RowCache):
            raise ArgumentError(f"cache must be an engram.RowCache or None, got {type(cache).__name__}")
        n = len(getattr(self, "tables", [self]))
        try:
            lids = [layer_ids] if isinstance(layer_ids, (int, np.integer)) else list(layer_ids)
        except TypeError:  # not an int, not a sequence (a float, None)
            lids = [None]
        if len(lids) != n or any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))
                                 or not 0 <= x < 2**31 for x in lids):
            raise ArgumentError(f"layer_ids must give one layer id >= 0 for each of the {n} table(s), got {layer_ids!r}")
        tables = getattr(self, "tables", [self])
        # each table known by the file its descriptor reads (not whatever its path names now)
        cache._bind_files([(int(lid), t.path, t.offset, t.rows, t._fd) for lid, t in zip(lids, tables)],
                          f"{type(self).__name__} of {', '.join(t.path for t in tables)}")
        self._cache_layers = np.asarray(lids, np.uint64) << np.uint64(32)
        self._cache_bounds = np.asarray([t.rows for t in tables], np.uint32)
        self._cache_cols: dict = {}
        self._cache = cache

    @property
    def cache(self) -> Optional[RowCache]:
        """The row cache serving this table or group, or None."""
        return self._cache

    def _cache_columns(self, C: int, seg_cols: int) -> tuple:
        """``(uint64 [C] each column's layer id << 32, the first part of its rows' cache keys; uint32 [C] the
        rows of each column's table)``."""
        got = self._cache_cols.get((C, seg_cols))
        if got is None:
            seg = np.arange(C) // seg_cols
            got = self._cache_cols[(C, seg_cols)] = (np.ascontiguousarray(self._cache_layers[seg]),
                                                     np.ascontiguousarray(self._cache_bounds[seg]))
        return got

    # ------------------------------------------------- the engine
    def _attach(self, client: Optional[EngineClient]) -> None:
        """Read through ``client``'s engine (None: this object's own readers)."""
        self._client = client
        self._client_gen = _engine_generation()
        if client is not None:
            native, ncl = client.native()
            self._reader.attach(native, ncl, self.readers)

    def _reattach(self) -> None:
        """In a child after fork(): the client's engine is the parent's; read through a new one."""
        self._attach(self._client)

    def _backend_code(self) -> int:
        """The reader's backend code: with an engine and ``auto`` on the ring, the engine picks the
        ring or its pool per batch (:data:`engram.io_engine.RING_BATCH`)."""
        if self.backend == "io_uring" and self.requested_backend == "auto" and self._client is not None:
            return _reader.BACKEND_AUTO
        return _BACKEND_CODES[self.backend]

    @property
    def engine(self) -> Optional[IOEngine]:
        """The I/O engine this reads through, or None (its own readers)."""
        return self._client.engine if self._client is not None else None

    @property
    def engine_client(self) -> Optional[EngineClient]:
        """The engine client this reads through (shared with a session's other tables), or None."""
        return self._client

    # ------------------------------------------------- fallback from the ring (auto): engram.backends decides
    def _follow_verdict(self) -> None:
        """``auto`` on the ring while the process has refused it since: move to the pool."""
        why = _backends.verdict_moves_to_pool(self.requested_backend, self.backend)
        if why is not None:
            self._to_pool(why)

    def _ring_at_fault(self, f) -> bool:
        return _backends.ring_at_fault(self.requested_backend, f)

    def _reread_on_pool(self, f, ids, dest, seg_cols, extra=(), raw=False, fused=None, layers=False):
        """Read the batch the ring failed again on the pread pool, once.  When the pool reads it,
        the ring is refused for the process (one warning, :func:`engram.backends.refuse_after_reread`)
        and this reader stays on the pool; when the pool fails too, its error is raised and the ring
        keeps its standing."""
        if self._reader.start_pool(self.readers):
            raise self._error(f, ids, layers) from None
        try:
            res = self._reader.read(ids, dest, self.threshold, _reader.BACKEND_PREAD, seg_cols, *extra, decode=not raw,
                                    **(fused or {}))
        except _reader.ReadFailure as g:
            raise self._error(g, ids, layers) from None
        self._to_pool(_backends.refuse_after_reread(f, self.path))
        return res

    def _to_pool(self, reason: str) -> None:
        if _backends.move_to_pool(self._reader, self.readers):
            self.backend = "pread"
            self.fallback = reason


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
        Concurrent read backend.  ``auto`` takes the io_uring ring where it
        starts and reads (proved once per process with a real read of this
        table), else the pread pool, and moves to the pool for good when a
        batch fails on the ring but reads on the pool (see
        :mod:`engram.backends`); :attr:`fallback` says why.  An explicit
        ``io_uring`` raises instead.  ``serial`` never reads concurrently.
    readers : int
        pread readers (persistent threads, the caller being one) or io_uring
        ring depth: the queue depth of a concurrent batch.  At most :data:`MAX_READERS`.
        Through an engine: the most reads in flight for one batch of this table
        (the engine's queue depth, shared by all its clients, is raised to it if lower).
    threshold : int
        Batches with at least this many distinct rows are read concurrently;
        smaller ones serially (the reference engine uses 8, SPEC §8).
    direct : True, False or "auto"
        ``O_DIRECT`` required, never, or where the file system accepts it
        (else a buffered descriptor that keeps the cache flat, see
        :mod:`engram.uncached`; :attr:`direct_fallback` says why).
    block_size : int, optional
        Alignment of direct reads; default the device's logical block size.
        With ``direct="auto"``, a ``block_size`` that ends without ``O_DIRECT``
        warns (``RuntimeWarning``).
    engine : "private", "shared", IOEngine or EngineClient
        ``private`` (default, :data:`engram.io_engine.TABLE_ENGINE`): the table's own pool or
        ring (an engine of its own: one client, ``readers`` deep).  ``shared``: the
        process's engine of the file's device (:mod:`engram.io_engine`): one
        queue depth, pool and cache of rings for every session on the device,
        fair between them; ``readers`` stays this table's batch depth.  An
        ``IOEngine``: a new client of that engine; an ``EngineClient``: read as
        that client (a session's tables share one).

    Attributes
    ----------
    backend : str
        The backend in use: ``io_uring``, ``pread`` or ``serial``.
    requested_backend : str
        The backend asked for (``auto`` may move from the ring to the pool).
    fallback : str or None
        Why ``auto`` does not use the ring.
    direct : bool
        ``O_DIRECT`` in use.
    direct_fallback : str or None
        Why ``O_DIRECT`` is off although it was tried.
    alignment : int
        Alignment of reads (bytes; 1 when buffered).
    drop_bytes : int
        Buffered fallback: unit of the pages dropped after each read (0 with ``O_DIRECT``).

    Raises
    ------
    TableIOError
        The file cannot be opened, is not a regular file (a directory, FIFO or
        device), is shorter than ``offset + rows * 264``, or the requested
        backend cannot start or read (naming the backend and errno).
    ArgumentError
        Invalid parameters.
    """

    def __init__(self, path: Union[str, os.PathLike], offset: int, rows: int, *, backend: str = "auto",
                 readers: int = DEFAULT_READERS, threshold: int = DEFAULT_THRESHOLD,
                 direct: Union[bool, str] = "auto", block_size: Optional[int] = None,
                 engine: Union[str, IOEngine, EngineClient, None] = TABLE_ENGINE):
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise ArgumentError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
        _check_policy(backend, readers, threshold)
        for name, v, lo in (("offset", offset, 0), ("rows", rows, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ArgumentError(f"{name} must be an integer >= {lo}, got {v!r}")
        if rows > 2**32:
            raise ArgumentError(f"rows must fit uint32 row ids, got {rows}")
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer))
                                       or not 512 <= block_size <= MAX_BLOCK_SIZE or block_size & (block_size - 1)):
            raise ArgumentError(f"block_size must be a power of two in [512, {MAX_BLOCK_SIZE}], got {block_size!r}")
        self.offset = int(offset)
        self.rows = int(rows)
        self.readers = int(readers)
        self.threshold = int(threshold)
        self.requested_backend = backend
        self.fallback: Optional[str] = None
        self._lock = threading.Lock()
        _forks.track(self)  # a new lock in a child after fork() (engram.forks)
        self._reader = None
        self._client: Optional[EngineClient] = None
        self._fd = -1
        _check_engine(engine)
        f = open_uncached(self.path, direct, block_size, probe_at=self.offset + self.rows // 2 * ROW_BYTES)
        self._fd = f.fd
        self.direct, self.alignment, self.drop_bytes = f.direct, f.alignment, f.drop_bytes
        self.direct_fallback = f.direct_fallback
        try:
            size = os.fstat(f.fd).st_size
            end = self.offset + self.rows * ROW_BYTES
            if size < end:
                raise TableIOError(
                    f"{self.path}: table of {self.rows} rows at offset {self.offset} ends at byte {end}, "
                    f"past the end of the file ({size} bytes)", offset=end)
            self._reader = _new_reader([(f.fd, self.offset, self.rows)], f.alignment, f.drop_bytes, f.read_flags,
                                       self.path)
            if backend != "serial":
                self._attach(_engine_client(engine, f.fd, self.readers, self.path))
            self.backend, self.fallback = _backends.start_backend(self._reader, backend, self.readers, self.path)
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
        # a short list of ints (one row, a decode step's column) becomes its [n, 1] column natively
        a = _reader.list_ids(ids, True) if type(ids) is list and len(ids) <= _SHORT_LIST else None
        if a is None:  # anything else: NumPy's path and its errors (the short list is not tried again)
            a = _array_ids(ids, 1, None, self._range_message)
            a = a.reshape(a.shape[0], 1)
        n = a.shape[0]
        # the rows go to a [n, 256] target: the reader and the cache take [T * C, 256] as [T, C, 256]
        if out is not None:
            self._check_out(out, (n, ROW_VALUES))
            self._read(a, out, out)
            return out
        res = np.empty((n, ROW_VALUES), dtype=np.float32)
        self._read(a, res, None)
        return res

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
        return self._read_into(a, out, (*a.shape, ROW_VALUES))

    def read_raw(self, ids, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The stored 264-byte records of a batch of tokens, in token order, not decoded.

        The same read as :meth:`read_batch` (sorted, each distinct row read once,
        concurrent from ``threshold`` distinct rows), but the records are copied
        as stored into ``out``: for a consumer that decodes them itself, e.g. an
        accelerator (:mod:`engram.gpu` hands page-locked buffers here).  Every
        record is checked to decode to finite values (SPEC §5) before any is
        published, so a bad row raises here as it would from :meth:`read_batch`.

        Parameters
        ----------
        ids : array_like of int, shape ``[T, C]``
        out : numpy.ndarray, optional
            uint8 ``[T, C, 264]``, C-contiguous and writable (a pinned
            ``torch.uint8`` tensor's ``.numpy()`` view works).

        Returns
        -------
        numpy.ndarray
            uint8 ``[T, C, 264]``: record ``[t, c]`` is row ``ids[t, c]``'s bytes.

        Raises
        ------
        Same as :meth:`read_rows`; on every error ``out`` is left untouched.
        """
        a = self._ids(ids, ndim=2)
        return self._read_into(a, out, (*a.shape, ROW_BYTES), raw=True)

    def _ids(self, ids, ndim: int) -> np.ndarray:
        return _row_ids(ids, ndim, None, self._range_message)

    def _range_message(self, row: int, where) -> str:
        pos = f"token {where[0]}, column {where[1]}" if len(where) == 2 else f"position {where[0]}"
        return f"{self.path}: row id {row} at {pos} is outside the table [0, {self.rows})"

    def _error(self, f, ids, layers: bool = False) -> Exception:
        return _failure_to_error(f, [self.path], [self.rows], ids.shape[1] > 1)

    # ------------------------------------------------------------- lifetime
    @property
    def closed(self) -> bool:
        return self._reader is None

    def close(self) -> None:
        """Stop the readers (or leave the engine) and close the descriptor (idempotent)."""
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.acquire()
        try:
            if getattr(self, "_reader", None) is not None:
                self._reader.close()
                self._reader = None
            client, self._client = getattr(self, "_client", None), None
            if client is not None:
                client.close()
            if getattr(self, "_fd", -1) >= 0:
                if self._pins:   # a group is reading through it: the last unpin closes it
                    self._fd_later = True
                else:
                    fd, self._fd = self._fd, -1
                    close_quietly(fd)
        finally:
            if lock is not None:
                lock.release()

    _pins = 0
    _fd_later = False

    def _pin(self) -> None:
        with self._lock:
            if self._reader is None:
                raise TableIOError(f"{self.path}: closed")
            self._pins += 1

    def _unpin(self) -> None:
        with self._lock:
            self._pins = max(0, self._pins - 1)
            if not self._pins and self._fd_later:
                self._fd_later = False
                fd, self._fd = self._fd, -1
                close_quietly(fd)

    def _after_fork_child(self) -> None:
        """In a child after fork(): as :meth:`_RowReads._after_fork_child`; the parent's groups' pins are not
        the child's (their reads run in the parent), so a descriptor left open for them closes now."""
        super()._after_fork_child()
        self._pins = 0
        if self._fd_later:
            self._fd_later = False
            fd, self._fd = self._fd, -1
            close_quietly(fd)


    def __repr__(self) -> str:
        engine = f", engine={self._client.engine!r}" if getattr(self, "_client", None) is not None else ""
        return (f"Table({self.path!r}, offset={self.offset}, rows={self.rows}, backend={self.backend!r}, "
                f"readers={self.readers}, threshold={self.threshold}, direct={self.direct}, "
                f"alignment={self.alignment}{engine})")


class TableGroup(_RowReads):
    """Several tables read as one batch: a decode step's rows of every Engram layer (SPEC §8).

    Column ``c`` of a batch reads from ``tables[c // columns]``, so the 48 rows
    of a V4.1 decode step (24 per layer) go out as one concurrent batch.  The
    group opens no descriptor: it reads through the tables' own, so it must
    not outlive them; it has its own readers (pool threads or ring), or reads
    through the tables' engine client when they share one.

    Parameters
    ----------
    tables : sequence of Table
        Open tables, all direct or all buffered (up to 16).
    columns : int
        Columns per table in a batch (24 for V4.1).
    backend, readers, threshold
        As for :class:`Table`; default those of the first table (its
        ``requested_backend``: a group of ``auto`` tables is ``auto`` too).
    engine : None, "private", "shared", IOEngine or EngineClient
        None (default): the engine client the tables share, if they all read
        through one, else the group's own readers.  Otherwise as for
        :class:`Table` (``shared``: the engine of the first table's device).

    Raises
    ------
    ArgumentError
        No tables, closed tables, or a mix of direct and buffered descriptors.
    TableIOError
        The requested backend cannot start.
    """

    def __init__(self, tables, columns: int = 24, *, backend: Optional[str] = None,
                 readers: Optional[int] = None, threshold: Optional[int] = None,
                 engine: Union[str, IOEngine, EngineClient, None] = None):
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
        first = tables[0]
        backend = backend if backend is not None else first.requested_backend
        readers = readers if readers is not None else first.readers
        threshold = threshold if threshold is not None else first.threshold
        _check_policy(backend, readers, threshold)
        _check_engine(engine)
        if engine is None:
            clients = {id(t._client) for t in tables}
            engine = tables[0]._client if len(clients) == 1 and tables[0]._client is not None else "private"
        self.tables = tables
        self.columns = int(columns)
        self.readers = int(readers)
        self.threshold = int(threshold)
        self.requested_backend = backend
        self.fallback: Optional[str] = None
        self._lock = threading.Lock()
        self._pin_lock = threading.Lock()
        _forks.track(self)  # a new lock in a child after fork() (engram.forks)
        self._client: Optional[EngineClient] = None
        self.path = ", ".join(sorted({t.path for t in tables}))
        flags = {t._reader.read_flags for t in tables}
        self._reader = _new_reader([(t._fd, t.offset, t.rows) for t in tables], max(t.alignment for t in tables),
                                   max(t.drop_bytes for t in tables), flags.pop() if len(flags) == 1 else 0,
                                   self.path)
        try:
            if backend != "serial":
                self._attach(_engine_client(engine, first._fd, self.readers, first.path))
            self.backend, self.fallback = _backends.start_backend(self._reader, backend, self.readers, self.path)
        except BaseException:
            self.close()
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
        return self._read_into(a, out, (a.shape[0], width, ROW_VALUES), seg_cols=self.columns)

    def read_raw(self, ids, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The stored 264-byte records of every table for a batch of tokens, not decoded.

        As :meth:`read_batch` (one deduplicated batch over all tables), with
        the records copied as stored into ``out`` (see :meth:`Table.read_raw`).

        Parameters
        ----------
        ids : array_like of int, shape ``[T, len(tables) * columns]``
        out : numpy.ndarray, optional
            uint8 ``[T, len(tables) * columns, 264]``, C-contiguous, writable.

        Returns
        -------
        numpy.ndarray
            uint8 ``[T, len(tables) * columns, 264]``.

        Raises
        ------
        RowRangeError, TableIOError, DecodeError, ArgumentError
            As :meth:`read_batch`; ``out`` is left untouched on every error.
        """
        width = len(self.tables) * self.columns
        a = _row_ids(ids, 2, width, self._range_message)
        for i, t in enumerate(self.tables):
            if t.closed:
                raise TableIOError(f"{t.path} (table {i}): closed; the group cannot read it")
        return self._read_into(a, out, (a.shape[0], width, ROW_BYTES), raw=True, seg_cols=self.columns)

    def _layer_ids(self, ids, what: str):
        """``ids`` as uint32 ``[tables, T, columns]`` (C-contiguous) and the shape of their rows."""
        n = len(self.tables)
        a = _row_ids(ids, 3, None, self._layer_message)
        if a.shape[0] != n or a.shape[2] != self.columns:
            raise ArgumentError(f"{what}: row ids must have shape [{n}, T, {self.columns}], got {a.shape}")
        a = np.ascontiguousarray(a)
        for i, t in enumerate(self.tables):
            if t.closed:
                raise TableIOError(f"{t.path} (table {i}): closed; the group cannot read it")
        return a, (n, a.shape[1], self.columns, ROW_VALUES)

    def read_layers(self, ids, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows of every table for a batch of tokens, table-major: each table's rows contiguous.

        The same one deduplicated batch as :meth:`read_batch`, laid out so that ``out[l]`` (table
        ``l``'s rows, float32 ``[T, columns, 256]``) is C-contiguous: a caller that hands each layer
        its rows needs no copy.

        Parameters
        ----------
        ids : array_like of int, shape ``[len(tables), T, columns]``
            Row ids, ``ids[l]`` those of table ``l`` (e.g. a hasher output ``[T, 2, 24]`` transposed).
        out : numpy.ndarray, optional
            float32 ``[len(tables), T, columns, 256]``, C-contiguous, writable.

        Raises
        ------
        RowRangeError, TableIOError, DecodeError, ArgumentError
            As :meth:`read_batch` (a RowRangeError names the table, token and column of ``ids``); ``out`` is
            left untouched on every error.
        """
        a, shape = self._layer_ids(ids, "read_layers")
        flat, seg_cols = a.reshape(1, -1), a.shape[1] * self.columns
        if out is not None:
            self._check_out(out, shape)
            o = out.reshape(1, -1, ROW_VALUES)
            self._read(flat, o, o, seg_cols, layers=True)
            return out
        res = np.empty(shape, np.float32)
        self._read(flat, res.reshape(1, -1, ROW_VALUES), None, seg_cols, layers=True)
        return res

    def begin_layers(self, ids, out: np.ndarray) -> None:
        """Begin reading the rows of :meth:`read_layers` into ``out`` and return at once.

        The requests are planned and handed to the I/O engine from the calling thread: on the ring,
        submitted to the kernel with one ``io_uring_enter``; on the pread pool, to its threads.  All
        of the batch's reads go in flight at once where the engine's queue depth and fairness allow
        (not bounded by the group's ``readers``); on the ring the rest, if any, are read by
        :meth:`finish`, which must follow before the group reads anything else.  The row cache's
        hits are decoded into ``out`` now.  At most ``CHUNK_REQUESTS`` (2048 x 24) ids.

        Parameters
        ----------
        ids : array_like of int, shape ``[len(tables), T, columns]``
        out : numpy.ndarray
            float32 ``[len(tables), T, columns, 256]``, C-contiguous, writable; filled by
            :meth:`finish`.  Untouched when this raises (every id is checked against its table before
            anything is written); when :meth:`finish` fails, only the cache's hits are written.

        Raises
        ------
        ArgumentError
            Bad ``ids`` or ``out``, more than one chunk of ids, or a begun read not finished.
        RowRangeError, TableIOError
            An id outside its table (names the table, token and column of ``ids``), or the group is closed
            (nothing read, ``out`` untouched).
        """
        a, shape = self._layer_ids(ids, "begin_layers")
        self._check_out(out, shape)
        if a.size > _reader.CHUNK_REQUESTS:
            raise ArgumentError(f"begin_layers: at most {_reader.CHUNK_REQUESTS} row ids, got {a.size}")
        self._begin(a.reshape(1, -1), out.reshape(1, -1, ROW_VALUES), a.shape[1] * self.columns, layers=True)

    @property
    def begun(self) -> bool:
        """:meth:`begin_layers` began a read that :meth:`finish` has not completed."""
        return self._begun is not None

    def finish(self) -> ReadStats:
        """Wait for the read :meth:`begin_layers` began, check and publish its rows into its ``out``.

        Returns
        -------
        ReadStats
            Its statistics (also ``last_stats``; ``wall_s`` from the begin to the rows published).

        Raises
        ------
        ArgumentError
            No read was begun.
        TableIOError, DecodeError
            As :meth:`read_batch` (a failed ring read again on the pool first).
        """
        return self._finish()

    def _error(self, f, ids, layers: bool = False) -> Exception:
        if layers and f.kind == "range":
            # ids [1, tables * T * columns] of read_layers / begin_layers: the position in [tables, T, columns]
            per = ids.shape[1] // len(self.tables)
            table, within = divmod(int(f.column), per)
            return RowRangeError(self._layer_message(f.row, (table, within // self.columns, within % self.columns)))
        return _failure_to_error(f, [t.path for t in self.tables], [t.rows for t in self.tables], True,
                                 [f"table {i}" for i in range(len(self.tables))])

    def _layer_message(self, row: int, where) -> str:
        """The range error of ``ids[where]`` of :meth:`read_layers` (``where`` = table, token, column)."""
        return (f"{self.tables[where[0]].path} (table {where[0]}): row id {row} at token {where[1]}, column "
                f"{where[2]} is outside the table [0, {self.tables[where[0]].rows})")

    def _range_message(self, row: int, where) -> str:
        t = self.tables[where[1] // self.columns]
        return (f"{t.path} (table {where[1] // self.columns}): row id {row} at token {where[0]}, "
                f"column {where[1]} is outside the table [0, {t.rows})")

    @property
    def closed(self) -> bool:
        return self._reader is None

    def _pin(self) -> None:
        """Pin every table (their descriptors stay open while this reads, even if one is closed meanwhile);
        TableIOError naming a table already closed, nothing pinned."""
        done = []
        try:
            for i, t in enumerate(self.tables):
                try:
                    t._pin()
                except TableIOError:
                    raise TableIOError(f"{t.path} (table {i}): closed; the group cannot read it") from None
                done.append(t)
        except BaseException:
            for t in done:
                t._unpin()
            raise

    def _unpin(self) -> None:
        for t in self.tables:
            t._unpin()

    def _read(self, ids, target, caller_out, seg_cols=None, raw=False, layers=False) -> None:
        self._pin()
        try:
            super()._read(ids, target, caller_out, seg_cols, raw, layers)
        finally:
            self._unpin()

    _begun_pinned = False

    def _begin(self, ids, target, seg_cols, layers=False) -> None:
        if self._begun is not None:
            raise ArgumentError(f"{self.path}: a begun read is not finished")
        self._pin()     # released by _finish, or by close
        try:
            super()._begin(ids, target, seg_cols, layers)
        except BaseException:
            self._unpin()
            raise
        self._begun_pinned = True

    def _finish(self) -> ReadStats:
        try:
            return super()._finish()
        finally:
            self._release_begun()

    def _release_begun(self) -> None:
        """Unpin the tables of a begun read once (its finish or the group's close, whichever comes first)."""
        lock = getattr(self, "_pin_lock", None)
        if lock is None:    # closed before it was made (a failed __init__)
            return
        with lock:
            pinned, self._begun_pinned = self._begun_pinned, False
        if pinned:
            self._unpin()

    def _after_fork_child(self) -> None:
        """In a child after fork(): a read the parent began is the parent's; its tables drop their pins."""
        super()._after_fork_child()
        self._pin_lock = threading.Lock()
        self._begun_pinned = False

    def close(self) -> None:
        """Stop this group's readers or leave its engine (the tables stay open); a begun read is waited
        for and dropped."""
        self._begun = None
        with self._lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            client, self._client = self._client, None
            if client is not None:
                client.close()
        self._release_begun()

