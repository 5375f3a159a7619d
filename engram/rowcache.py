"""A row cache shared by every session of a model: raw 264-byte records kept in memory (SPEC §5, §8).

A decode step reads 48 rows (24 per table) and a prompt's chunks read thousands; n-grams repeat
(SPEC §8: 22.5% of a coding generation's row reads repeat an earlier row of the session), and
sessions of one server read the same system prompt.  :class:`RowCache` keeps the records of rows
read, keyed by ``(layer, row)``, so that a repeated row costs a copy and a decode instead of a
device read.  It keeps the records as the file holds them (264 bytes, not the 1 KiB of a decoded
row): decoding a row is cheap (BENCHMARKS.md), memory is not.

Which rows it keeps is its *policy* (:data:`POLICIES`, one implementation in
``engram/_native/rowcache.pyx``, which the simulator replays traces through too,
:class:`CachePolicy`):

- ``"lru"``: least recently used out first.
- ``"tinylfu"`` (the default, :data:`DEFAULT_POLICY`, there why): W-TinyLFU (Einziger, Friedman, Manes,
  "TinyLFU: A Highly Efficient Cache Admission Policy", ACM Transactions on Storage 13(4), 2017): a 1% window
  LRU, then a segmented LRU that admits a row only if a count-min sketch (with aging) estimates it more
  frequent than the row it would evict -- one long prompt of rows read once does not flush the rows every step
  reads.

How the engine uses it (:meth:`engram.EngramModel.open` ``cache=``, :meth:`EngramModel.session` ``cache=``): a
batch's keys are looked up first (hits touched, their records copied out under the lock); only the misses go
to the reader, still sorted by file offset and deduplicated.  A pooled or ring read *reserves* its misses
while they fly (``reserve_records`` of ``engram/_native/rowcache.pyx``, under this cache's ``_lock``: the
policy's admission and eviction run then, off the critical path; a reserved slot is a miss to every lookup)
and fills them from its staged reads once the rows are in and checked (``fill_records``); a read that fails
gives its reservations back (``cancel_records``), so nothing half-read is ever served.  A serial read, which
has no flight to hide the work in, inserts its misses after the read in one call (``admit_records``).  Hits
are decoded by the codec into their positions, so a hit gives exactly the values an uncached read gives.
``ReadStats.cache_hits`` counts the hits.  Prefill batches (:meth:`Session.prefill`) go through the cache too
(``prefill="admit"``) or past it (``prefill="bypass"``: neither served nor admitted).

Threads: one lock guards the policy and the records (each batch takes it two or three times: lookup, then
reserve and fill, or insert, of each chunk); concurrent sessions in threads share one cache safely.  Its cost
is measured in BENCHMARKS.md ("Row cache"); :meth:`RowCache.stats` counts ``contended`` acquisitions.

Processes: a cache is private to its process; processes do not share one.  Shared memory could
hold the records, but the policy changes its state on every lookup (recency links, sketch
counters), so a cache shared between processes needs a lock in the shared segment taken by every
process on every batch, and a process that dies holding it stalls the others; each process's
own cache, sized for that process's sessions from the trace (``engram sim trace reuse TRACE
--sessions N``), avoids both.  A child after ``fork()`` gets a copy of the parent's cache (its
pages copy-on-write) with a fresh lock, and fills it on its own.
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import weakref
from typing import Optional, Tuple, Union

import numpy as np

from ._native import rowcache as _native
from .codec import ROW_BYTES, decode_rows
from .errors import ArgumentError, CacheLayoutError, CachePolicyError, CacheSizeError

__all__ = ["RowCache", "CachePolicy", "POLICIES", "PREFILL", "DEFAULT_POLICY", "DEFAULT_PREFILL",
           "BOOKKEEPING_BYTES", "SIZE_RULE", "parse_size", "size_arg", "sizes_arg", "cache_rows", "cache_key",
           "physical_memory"]

#: Replacement policies (``"lru"``, ``"tinylfu"``).
POLICIES = tuple(_native.POLICIES)
#: What prefill batches do: ``"admit"`` (looked up and inserted like decode batches) or ``"bypass"``.
PREFILL = ("admit", "bypass")
#: The one default policy: of :class:`RowCache` and of everything that predicts or measures it (``engram sim
#: decode --cache-policy``, :class:`sim.core.params.Policy`, ``engram measure``, studies), so that a prediction and the
#: engine run the same policy unless told otherwise.  W-TinyLFU because the cache is shared by a model's
#: sessions, and where they share a text it keeps the hot rows through a long prompt of rows read once (4 sessions
#: on the first 8,000 tokens of ``shared:agent_prompt_long.txt`` hit 0.048 / 0.221 of their reads at 1 / 16 MiB
#: against LRU's 0.020 / 0.112).  Neither policy wins on every text: one session on the first 8,000 tokens of
#: ``shared:promessi_sposi.txt`` hits more with LRU at 16 MiB (0.093 against 0.063), on the whole novel less (0.098
#: against 0.148); docs/engine.md ("Row cache") has the figures and their commands.  Choose on the engine's own
#: text with ``engram sim trace reuse TRACE --cache-bytes ... --sessions N``.
DEFAULT_POLICY = "tinylfu"
DEFAULT_PREFILL = "admit"
#: Bytes of bookkeeping a row slot costs at most besides its record: its node (key, links, segment: 24),
#: hash table entries (key and slot, 16 bytes, 2 to 4 a slot: 32 to 64) and TinyLFU's sketch (4 bytes a
#: slot up to 2**24 slots).  ``CachePolicy.bookkeeping_bytes`` gives a cache's own figure.
BOOKKEEPING_BYTES = 92

#: The policy class itself: ``CachePolicy(capacity_rows, name)`` with ``lookup``, ``insert`` and
#: ``access`` (a whole stream of keys replayed batch by batch, the simulator's entry).
CachePolicy = _native.Policy

#: The rule of sizes (:func:`parse_size`), said in every option's help and error that takes one.
SIZE_RULE = ("bytes, or a number with a unit: K, M, G, T or KiB, MiB, GiB, TiB binary (2**10 ...), "
             "KB, MB, GB, TB decimal (10**3 ...), any case (64M = 67108864, 64MB = 64000000)")

#: Bytes of each unit (case folded): a bare letter and ``?iB`` binary, ``?B`` decimal (SI), as GNU dd,
#: head -c and truncate read them.
_UNITS = {"": 1, "b": 1}
for _i, _u in enumerate("kmgt", 1):
    _UNITS[_u] = _UNITS[_u + "ib"] = 1 << (10 * _i)
    _UNITS[_u + "b"] = 1000 ** _i
del _i, _u
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")
_EXPONENT = re.compile(r"\s*[0-9.]+[eE][-+]?[0-9]+\s*[A-Za-z]*\s*")


def parse_size(size: Union[int, str], what: str = "cache size") -> int:
    """Bytes of a size: an int >= 0, or a string, a number (fractions allowed) with an optional unit.

    K, M, G, T and KiB, MiB, GiB, TiB are binary (2**10, 2**20, 2**30, 2**40); KB, MB, GB, TB decimal
    (10**3, 10**6, 10**9, 10**12); B or none: bytes; any case (``"64m"`` is ``"64M"``, ``"64mb"`` is
    ``"64MB"``).  So ``"64M"`` = ``"64MiB"`` = 67,108,864 and ``"64MB"`` = 64,000,000 bytes: the rule of
    GNU ``dd``, ``head -c`` and ``truncate`` (and of the IEC and SI prefixes: ``MiB`` binary, ``MB``
    decimal), with a bare letter binary as ``dd``, ``ls -h`` and ``free`` print it.  (``fio`` in its default
    ``kb_base=1024`` reads ``MB`` as binary too, and ``numfmt --from=auto`` reads ``M`` as decimal; this
    rule is neither.)  A fraction is rounded down to a whole byte (``"1.5K"`` = 1536, ``"0.5"`` = 0).
    Exponents (``"1e3"``), signs, floats and bools are refused: a size is written as a user writes it,
    and ``1e3`` or a float may come from arithmetic that lost bytes.  See :data:`SIZE_RULE`.

    ``what`` names the value in the error (an option, e.g. ``"--cache-bytes"``).

    Raises
    ------
    CacheSizeError
        Not a size: a negative number, a bool, a float, an exponent, an unknown unit (the message gives
        the rule).
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer, str)):
        raise CacheSizeError(f"{what} must be bytes (an int, or a string like '64M' or '64MB'), got "
                             f"{type(size).__name__} {size!r}")
    if not isinstance(size, str):
        v = int(size)
        if v < 0:
            raise CacheSizeError(f"{what} must be >= 0 bytes, got {v}")
        return v
    m = _SIZE.fullmatch(size)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        why = ("a negative size" if size.strip().startswith("-")
               else "an exponent is not a size (write 1000 or 1KB for 1e3)" if _EXPONENT.fullmatch(size)
               else f"unknown unit {m.group(2)!r}" if m else "not a number with a unit")
        raise CacheSizeError(f"{what} {size!r}: {why}; need {SIZE_RULE}")
    whole, _, frac = m.group(1).partition(".")
    scale = _UNITS[unit]
    return int(whole or 0) * scale + (int(frac) * scale // 10 ** len(frac) if frac.strip("0") else 0)


def size_arg(text: str) -> int:
    """``argparse`` ``type=`` of a size option (:func:`parse_size`): a bad size is the parser's error, which names
    the option, with the rule."""
    try:
        return parse_size(text, "size")
    except CacheSizeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sizes_arg(text: str) -> list:
    """As :func:`size_arg`, a comma separated list of sizes (``"1M,64M,1G"``): a list of ints."""
    return [size_arg(t) for t in (x.strip() for x in text.split(",")) if t]


def physical_memory() -> int:
    """Bytes of physical memory of this machine (``sysconf``; 0 where it cannot say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def cache_rows(max_bytes: Union[int, str], *, check_memory: bool = True) -> int:
    """Rows a budget of ``max_bytes`` holds: ``max_bytes // 264`` records.

    Raises
    ------
    CacheSizeError
        The budget holds no row (below 264 bytes), or (``check_memory``) its records and
        bookkeeping (:data:`BOOKKEEPING_BYTES` a row) exceed this machine's physical memory.
    """
    b = parse_size(max_bytes)
    rows = b // ROW_BYTES
    if rows < 1:
        raise CacheSizeError(f"cache budget of {b} bytes holds no row: a row is {ROW_BYTES} bytes "
                             f"(e4m3_e8m0_32_row264, SPEC §5)"
                             + ("; for no row cache give cache=None (what a size of 0 means on the command line: "
                                "--cache-bytes 0, --shared-cache-bytes 0)" if b == 0 else ""))
    if rows >= 1 << 31:
        raise CacheSizeError(f"cache budget of {b} bytes is {rows} rows; at most 2**31 - 1 rows (563 GiB)")
    mem = physical_memory()
    need = rows * (ROW_BYTES + BOOKKEEPING_BYTES)
    if check_memory and mem and need > mem:
        raise CacheSizeError(f"cache budget of {b} bytes ({rows} rows, {need / 2**30:.1f} GiB with bookkeeping) "
                             f"exceeds this machine's memory ({mem / 2**30:.1f} GiB)")
    return rows


def _check_policy(policy, prefill) -> None:
    if policy not in POLICIES:
        raise CachePolicyError(f"unknown row cache policy {policy!r}; policies: {', '.join(POLICIES)}")
    if prefill not in PREFILL:
        raise CachePolicyError(f"unknown prefill rule {prefill!r} of the row cache; rules: {', '.join(PREFILL)}")


def cache_key(layer_id, row) -> np.ndarray:
    """uint64 keys ``(layer << 32) | row`` of layer ids and row ids (broadcast)."""
    return (np.asarray(layer_id, np.uint64) << np.uint64(32)) | np.asarray(row, np.uint64)


def _check_keys(keys) -> None:
    """``keys`` must be uint64 ``[n]``, C-contiguous (:func:`cache_key`); else ArgumentError."""
    if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1 or not keys.flags.c_contiguous:
        got = f"{keys.dtype} {keys.shape}" if isinstance(keys, np.ndarray) else type(keys).__name__
        raise ArgumentError(f"keys must be a C-contiguous uint64 array [n] (engram.rowcache.cache_key), got {got}")


class RowCache:
    """Raw 264-byte records of rows, keyed by ``(layer, row)``, shared by the sessions of one model.

    Parameters
    ----------
    max_bytes : int or str
        Budget of the records: ``max_bytes // 264`` rows (``"64M"`` = 64 MiB, ``"64MB"`` = 64,000,000 bytes,
        ``"1G"``: :func:`parse_size`).
        The bookkeeping adds about :data:`BOOKKEEPING_BYTES` bytes a row.  Record memory is taken
        as rows arrive (untouched pages cost nothing).
    policy : {"tinylfu", "lru"}
        Replacement policy (see the module): ``tinylfu`` (default, :data:`DEFAULT_POLICY`: why there) admits by
        frequency; ``lru`` suits a cache of one session.
    prefill : {"admit", "bypass"}
        Whether prefill batches use the cache (default ``admit``).

    Attributes
    ----------
    capacity : int
        Rows it holds at most.
    max_bytes : int
    policy, prefill : str

    Raises
    ------
    CacheSizeError
        A budget below one row (264 bytes; 0 too: a cache holds at least one row, and "no cache" is
        ``cache=None``, which is what a size of 0 means on the command line) or beyond this machine's
        physical memory.
    CachePolicyError
        A policy or prefill rule that does not exist.
    CacheLayoutError
        (:meth:`bind`, at ``EngramModel.open(..., cache=)``) the cache already serves a model of another
        layout or other tables.

    Notes
    -----
    Threads: safe; one lock guards a batch's lookup and its insert (:meth:`stats` counts ``contended``).
    Processes: not shared.  A cache lives in its process; sessions in other processes each need their own
    ``RowCache``, sized for that process's sessions (``engram sim trace reuse TRACE --sessions N``).  Why not
    shared memory: every lookup changes the policy's state (recency links, sketch counters), so a shared
    cache would need a lock in the shared segment taken by every process on every batch, and a process dying
    while it holds the lock stalls the others.  After ``fork()`` the child gets a copy-on-write copy with a
    fresh lock and fills it on its own.  ``engram measure`` with sessions as processes gives each process a
    fresh cache of the same budget and policy.
    """

    def __init__(self, max_bytes: Union[int, str], policy: str = DEFAULT_POLICY, *, prefill: str = DEFAULT_PREFILL):
        _check_policy(policy, prefill)
        self.capacity = cache_rows(max_bytes)
        self.max_bytes = parse_size(max_bytes)
        self.policy = policy
        self.prefill = prefill
        self._policy = CachePolicy(self.capacity, policy)
        self._records = np.empty((self.capacity, ROW_BYTES), np.uint8)
        self._lock = threading.Lock()
        self._owner: Optional[Tuple[str, object, tuple]] = None
        #: layer id -> (file id, offset, rows, path) of the table whose rows the keys of that layer name
        self._tables: dict = {}
        self.hits = 0
        self.lookups = 0
        self.inserts = 0
        self.contended = 0
        _CACHES.add(self)

    # ------------------------------------------------------------- models
    def bind(self, layout, tables, name: str = "") -> None:
        """Serve the model of ``layout`` whose tables are ``tables`` (``{layer id: TableLocation}``).

        The first model binds the cache; another model may share it only with the same layout and
        the same tables (file, offset, rows), e.g. the same file opened twice.

        Raises
        ------
        CacheLayoutError
            Another layout or other tables than the model the cache serves (names both).
        """
        ident = tuple(sorted((int(lid), _file_id(loc.path), int(loc.offset), int(loc.rows))
                             for lid, loc in tables.items()))
        with self._lock:
            if self._owner is None:
                self._register([(lid, loc.path, loc.offset, loc.rows) for lid, loc in tables.items()],
                               name or "this model")
                self._owner = (name, layout, ident)
                return
            owner, lay, have = self._owner
        if lay != layout:
            raise CacheLayoutError(f"row cache serves {owner or 'a model'} (layers {list(lay.layer_ids)}, rows "
                                   f"{[int(r) for r in lay.rows]}); {name or 'this model'} has another layout "
                                   f"(layers {list(layout.layer_ids)}, rows {[int(r) for r in layout.rows]}): its "
                                   f"keys (layer, row) would name other rows; give it its own RowCache")
        if have != ident:
            raise CacheLayoutError(f"row cache serves {owner or 'a model'}; {name or 'this model'} has the same "
                                   f"layout but other tables (file, offset): its rows differ; give it its own RowCache")

    def bind_tables(self, tables, where: str = "") -> None:
        """Serve the rows of ``tables``: ``(layer id, path, offset, rows)`` each (:meth:`engram.Table.attach_cache`).

        A key is ``(layer id, row)``, so each layer id names one table: the first table attached (or bound with a
        model, :meth:`bind`) under a layer id keeps it; the same table again (the same file and offset, e.g.
        each session's own descriptor of the model's file, or a table of its first rows, whose range check
        refuses the others) is fine.

        Raises
        ------
        ArgumentError
            An entry that is not four values (an int layer id, a path, an int offset, an int row count).
        CacheLayoutError
            A layer id the cache serves from another table (file, offset), or one layer id given for two
            tables (names the layer and both tables).
        """
        try:
            given = [(int(lid), os.fspath(path), int(offset), int(rows)) for lid, path, offset, rows in tables]
        except (TypeError, ValueError) as exc:
            raise ArgumentError(f"tables must be (layer id, path, offset, rows) each ({exc})") from None
        with self._lock:
            self._register(given, where or "this table")

    def _register(self, tables, where: str) -> None:
        """:meth:`bind_tables` under the lock, all or nothing."""
        new: dict = {}
        for lid, path, offset, rows in tables:
            ident = (_file_id(path), int(offset), int(rows), os.fspath(path))
            have = new.get(int(lid)) or self._tables.get(int(lid))
            if have is not None and have[:2] != ident[:2]:  # the same file and offset: the same rows (a prefix)
                raise CacheLayoutError(
                    f"row cache serves layer {int(lid)} from {have[3]} (offset {have[1]}, {have[2]} rows); {where} "
                    f"gives layer {int(lid)} the table {ident[3]} (offset {ident[1]}, {ident[2]} rows): the keys "
                    f"(layer, row) would name other rows; give it its own RowCache or another layer id")
            new[int(lid)] = ident
        self._tables.update(new)

    # ------------------------------------------------------------- batches
    def _acquire(self) -> None:
        if not self._lock.acquire(False):
            self.contended += 1
            self._lock.acquire()

    def lookup(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The hits of a batch: (bool ``[n]`` hit flags, uint8 ``[hits, 264]`` their records in order).

        ``keys``: uint64 ``[n]`` C-contiguous (:func:`cache_key`).  The hits count as accessed
        (recency; TinyLFU's sketch); the misses are counted by the :meth:`insert` that follows.  The
        records are copied out under the lock, so rows another
        thread evicts meanwhile stay valid.
        """
        _check_keys(keys)
        slots = np.empty(keys.shape[0], np.int64)
        self._acquire()
        try:
            h = self._policy.lookup(keys, slots)
            hit = slots >= 0
            rec = self._records[slots[hit]] if h else _NO_RECORDS
            self.hits += h
            self.lookups += keys.shape[0]
        finally:
            self._lock.release()
        return hit, rec

    def serve(self, ids: np.ndarray, col_layer: np.ndarray, keys: np.ndarray, out: np.ndarray,
              skip: np.ndarray, col_rows: Optional[np.ndarray] = None) -> int:
        """The engine's lookup of a batch, in one native call under the lock (``Table``'s read path).

        ``ids`` uint32 ``[T, C]``; ``col_layer`` uint64 ``[C]`` (each column's layer id << 32); fills
        ``keys`` uint64 ``[T * C]``, decodes every hit into its row of ``out`` float32 ``[T * C, 256]`` (or
        ``[T, C, 256]``) and
        flags it in ``skip`` uint8 ``[T * C]`` (1: hit).  ``col_rows`` uint32 ``[C]`` (optional): the rows of
        each column's table; an id beyond its table is left a miss, uncounted, for the reader's range error.
        Returns the hits.  Raises ArgumentError for arrays that do not fit (dtype, shape, layout, or outputs
        that overlap each other or the inputs), ``out`` untouched."""
        lock = self._lock
        if not lock.acquire(False):
            self.contended += 1
            lock.acquire()
        try:
            h = self._policy.serve(ids, col_layer, keys, self._records, out, skip, col_rows)
            self.hits += h
            self.lookups += ids.size  # the batch's T * C positions (keys may be longer)
        except ValueError as exc:
            raise ArgumentError(f"RowCache.serve: {exc}") from None
        finally:
            lock.release()
        return h

    def admit(self, keys: np.ndarray, skip: np.ndarray, raw: np.ndarray) -> int:
        """Insert the misses of a batch :meth:`serve` looked up (``skip == 0``) with their records ``raw``
        uint8 ``[T * C, 264]`` as read.  Returns the records written."""
        lock = self._lock
        if not lock.acquire(False):
            self.contended += 1
            lock.acquire()
        try:
            n = self._policy.admit(keys, skip, raw, self._records)
            self.inserts += n
        except ValueError as exc:
            raise ArgumentError(f"RowCache.admit: {exc}") from None
        finally:
            lock.release()
        return n

    def insert(self, keys: np.ndarray, records: np.ndarray) -> int:
        """Insert the misses of a batch: uint64 ``[m]`` keys and uint8 ``[m, 264]`` records as read.
        Keys already held (duplicates; a row another session inserted meanwhile) are left as they are.
        Returns the records written.

        Raises
        ------
        ArgumentError
            ``keys`` not uint64 ``[m]``, or ``records`` not uint8 ``[m, 264]``: checked before anything is
            inserted, so the cache is unchanged."""
        _check_keys(keys)
        if not isinstance(records, np.ndarray) or records.dtype != np.uint8 or records.shape != (keys.shape[0], ROW_BYTES):
            got = f"{records.dtype} {records.shape}" if isinstance(records, np.ndarray) else type(records).__name__
            raise ArgumentError(f"records must be a uint8 array [{keys.shape[0]}, {ROW_BYTES}] (one record a key), "
                                f"got {got}")
        slots = np.empty(keys.shape[0], np.int64)
        self._acquire()
        try:
            n = self._policy.insert(keys, slots)
            put = slots >= 0
            if n:
                self._records[slots[put]] = records[put]
            self.inserts += n
        finally:
            self._lock.release()
        return n

    def get(self, layer_id: int, rows) -> Tuple[np.ndarray, np.ndarray]:
        """The held rows of ``layer_id`` among ``rows`` (int ``[n]``), without touching or counting them:
        (bool ``[n]`` held, float32 ``[held, 256]`` decoded).  For inspection and tests."""
        keys = cache_key(layer_id, np.asarray(rows).reshape(-1))
        with self._lock:
            slots = np.array([self._policy.slot(int(k)) for k in keys], dtype=np.int64)
            rec = self._records[slots[slots >= 0]]
        return slots >= 0, decode_rows(rec)

    # ------------------------------------------------------------- state
    @property
    def entries(self) -> int:
        """Rows held now."""
        return int(self._policy.entries)

    def stats(self) -> dict:
        """``{"hits", "lookups", "hit_rate", "inserts", "entries", "capacity", "contended", "policy", "prefill",
        "max_bytes"}``: counts since the cache was made (or :meth:`clear`)."""
        with self._lock:
            return {"hits": self.hits, "lookups": self.lookups,
                    "hit_rate": self.hits / self.lookups if self.lookups else 0.0, "inserts": self.inserts,
                    "entries": self.entries, "capacity": self.capacity, "contended": self.contended,
                    "policy": self.policy, "prefill": self.prefill, "max_bytes": self.max_bytes}

    def clear(self) -> None:
        """Forget every row and count (the model binding stays)."""
        with self._lock:
            self._policy = CachePolicy(self.capacity, self.policy)
            self.hits = self.lookups = self.inserts = self.contended = 0

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        # slots the parent reserved for reads in flight are never filled here: given back
        self._policy.cancel_pending()

    def __repr__(self) -> str:
        return (f"RowCache({self.max_bytes}, policy={self.policy!r}, prefill={self.prefill!r}, "
                f"capacity={self.capacity} rows, entries={self.entries})")


def _file_id(path) -> tuple:
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return (os.path.realpath(path),)


_NO_RECORDS = np.empty((0, ROW_BYTES), np.uint8)
#: Every cache of the process, whose locks a fork() renews in the child.
_CACHES: "weakref.WeakSet[RowCache]" = weakref.WeakSet()


def _renew_locks() -> None:
    for c in list(_CACHES):
        c._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks)
