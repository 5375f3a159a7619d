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
from .errors import ArgumentError, CacheCopyError, CacheLayoutError, CachePolicyError, CacheSizeError

__all__ = ["RowCache", "CachePolicy", "POLICIES", "PREFILL", "DEFAULT_POLICY", "DEFAULT_PREFILL",
           "BOOKKEEPING_BYTES", "BOOKKEEPING_FIXED_BYTES", "bookkeeping_bytes", "SIZE_RULE", "parse_size", "size_arg",
           "sizes_arg", "cache_rows", "cache_key",
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
#: Bytes of bookkeeping a row slot costs at most besides its record, with :data:`BOOKKEEPING_FIXED_BYTES`: a
#: cache of ``rows`` slots allocates at most ``rows * BOOKKEEPING_BYTES + BOOKKEEPING_FIXED_BYTES`` bytes for
#: its policy, whatever ``rows`` and the policy.  Its node (key, links, segment: 24 bytes), hash table entries
#: (key and slot, 16 bytes; the power of two at least twice the slots: under 4 a slot, so under 64 bytes) and
#: TinyLFU's sketch (4 one-byte counters per width, the power of two at least the slots: under 8 bytes a
#: slot).  The exact figure of a capacity: :func:`bookkeeping_bytes` (``CachePolicy.bookkeeping_bytes``).
BOOKKEEPING_BYTES = 96
#: Bytes of bookkeeping beyond :data:`BOOKKEEPING_BYTES` a row, at most: the smallest tables (16 entries, a
#: sketch 16 wide: 248 bytes for a cache of 1 row beyond 96) and each of the three arrays of 1 MiB or more
#: rounded up to whole 2 MiB huge pages.
BOOKKEEPING_FIXED_BYTES = 3 * (2 << 20) + 256
#: ``bookkeeping_bytes(capacity, policy)``: bytes a policy of ``capacity`` slots allocates for its own arrays.
bookkeeping_bytes = _native.bookkeeping_bytes

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
#: Longest size string read (a size of bytes has at most 20 digits; spaces, a fraction and a unit besides).
_SIZE_CHARS = 64


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
        Not a size: a negative number, a bool, a float, an exponent, an unknown unit, a string longer than
        64 characters (the message gives the rule).
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer, str)):
        raise CacheSizeError(f"{what} must be bytes (an int, or a string like '64M' or '64MB'), got "
                             f"{type(size).__name__} {size!r}")
    if not isinstance(size, str):
        v = int(size)
        if v < 0:
            raise CacheSizeError(f"{what} must be >= 0 bytes, got {v}")
        return v
    if len(size) > _SIZE_CHARS:
        raise CacheSizeError(f"{what} {size[:24]!r}... ({len(size)} characters) is too long to be a size (at most "
                             f"{_SIZE_CHARS} characters); need {SIZE_RULE}")
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
    """``argparse`` ``type=`` of an optional row cache size (:func:`parse_size`): 0 (no row cache) or a budget of
    at least one row (264 bytes) and at most 2**31 - 1 rows.  A bad size is the parser's error, which names the
    option, with the rule."""
    try:
        b = parse_size(text, "size")
        if b:
            cache_rows(b, check_memory=False, what=f"size {text.strip()!r}")
    except CacheSizeError as exc:
        raise argparse.ArgumentTypeError(str(exc) + ("; 0 means no row cache" if "holds no row" in str(exc) else "")) \
            from None
    return b


def sizes_arg(text: str) -> list:
    """``argparse`` ``type=`` of a comma separated list of row cache sizes (``"1M,64M,1G"``), each of at least one
    row (264 bytes; a list of caches to replay, where a cache of 0 bytes has nothing to replay) and at most
    2**31 - 1 rows: a list of ints, a size given twice (the same bytes, however written) kept once, in order."""
    out: list = []
    for t in (x.strip() for x in text.split(",")):
        if not t:
            continue
        try:
            b = parse_size(t, "size")
            cache_rows(b, check_memory=False, what=f"size {t!r}", zero="; each cache replayed holds at least one row")
        except CacheSizeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if b not in out:
            out.append(b)
    if not out:
        raise argparse.ArgumentTypeError(f"give at least one size, comma separated: {SIZE_RULE}")
    return out


def physical_memory() -> int:
    """Bytes of physical memory of this machine (``sysconf``; 0 where it cannot say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


#: What :func:`cache_rows` says of a budget of 0 bytes by default.
_ZERO_HINT = ("; a row cache holds at least one row: for none give cache=None (a size of 0 says that where the size "
              "is optional: engram measure --cache-bytes 0, engram sim decode --shared-cache-bytes 0)")


def cache_rows(max_bytes: Union[int, str], *, check_memory: bool = True, what: str = "cache budget",
               zero: Optional[str] = None) -> int:
    """Rows a budget of ``max_bytes`` holds: ``max_bytes // 264`` records.

    ``what`` names the budget in the errors (an option, a study key); ``zero`` is what the error of a budget of
    0 bytes adds (default: how to ask for no cache).

    Raises
    ------
    CacheSizeError
        The budget holds no row (below 264 bytes), more than 2**31 - 1 rows, or (``check_memory``) its
        records and bookkeeping (:data:`BOOKKEEPING_BYTES` a row and :data:`BOOKKEEPING_FIXED_BYTES`, an upper
        bound) exceed this machine's physical memory.
    """
    b = parse_size(max_bytes, what)
    rows = b // ROW_BYTES
    label = f"{what} of {b} bytes" if what == "cache budget" else f"{what} ({b} bytes)"
    if rows < 1:
        raise CacheSizeError(f"{label} holds no row: a row is {ROW_BYTES} bytes (e4m3_e8m0_32_row264, SPEC §5)"
                             + ((_ZERO_HINT if zero is None else zero) if b == 0 else ""))
    if rows >= 1 << 31:
        raise CacheSizeError(f"{label} is {rows} rows; at most 2**31 - 1 rows (563 GiB)")
    mem = physical_memory()
    need = rows * (ROW_BYTES + BOOKKEEPING_BYTES) + BOOKKEEPING_FIXED_BYTES
    if check_memory and mem and need > mem:
        raise CacheSizeError(f"{label}, {rows} rows, {need / 2**30:.1f} GiB with bookkeeping, exceeds this "
                             f"machine's memory ({mem / 2**30:.1f} GiB)")
    return rows


def _check_policy(policy, prefill) -> Tuple[str, str]:
    """``(policy, prefill)`` as plain strings (a NumPy string is its str); CachePolicyError for a name that is not
    a string (an array, even of one name, a number, None) or names no policy or prefill rule."""
    for value, kind, names in ((policy, "row cache policy", POLICIES), (prefill, "row cache's prefill rule", PREFILL)):
        if not isinstance(value, str):
            got = (f"an array {value.dtype} {value.shape}" if isinstance(value, np.ndarray)
                   else f"{type(value).__name__} {value!r}"[:80])
            raise CachePolicyError(f"the {kind} must be a string, one of {', '.join(names)}; got {got}")
    policy, prefill = str(policy), str(prefill)
    if policy not in POLICIES:
        raise CachePolicyError(f"unknown row cache policy {policy!r}; policies: {', '.join(POLICIES)}")
    if prefill not in PREFILL:
        raise CachePolicyError(f"unknown prefill rule {prefill!r} of the row cache; rules: {', '.join(PREFILL)}")
    return policy, prefill


def _uint32s(x, what: str) -> np.ndarray:
    """``x`` (an int or array_like of ints) as uint64, each value in ``[0, 2**32)``; else ArgumentError naming
    the first value that is not (and its index)."""
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{what}s must be integers in [0, 2**32), got {type(x).__name__} ({exc})") from None
    if a.dtype == object and a.size and all(type(v) is int for v in a.flat):  # Python ints beyond 64 bits
        bad = next(i for i, v in enumerate(a.flat) if not 0 <= v <= 0xFFFFFFFF)
        where = f" at index {tuple(int(i) for i in np.unravel_index(bad, a.shape))}" if a.ndim else ""
        raise ArgumentError(f"{what} {a.flat[bad]}{where} is outside [0, 2**32)")
    if a.size and a.dtype.kind not in "iu":
        first = a.flat[0]
        first = first.item() if isinstance(first, np.generic) else first
        raise ArgumentError(f"{what}s must be integers in [0, 2**32), got {a.dtype} (e.g. {first!r})")
    if a.size and (a.dtype.kind == "i" or a.itemsize > 4) and (a.min() < 0 or a.max() > 0xFFFFFFFF):  # uint32: fits
        bad = np.argwhere((a < 0) | (a > 0xFFFFFFFF))[0] if a.ndim else ()
        where = f" at index {tuple(int(i) for i in bad)}" if a.ndim else ""
        raise ArgumentError(f"{what} {int(a[tuple(bad)])}{where} is outside [0, 2**32)")
    return a.astype(np.uint64)


def cache_key(layer_id, row) -> np.ndarray:
    """uint64 keys ``(layer << 32) | row`` of layer ids and row ids (broadcast): int or array_like of ints,
    each in ``[0, 2**32)``, so that a key names one ``(layer, row)``.

    Raises
    ------
    ArgumentError
        A layer id or row id that is not an integer (a float, a bool, a string) or lies outside
        ``[0, 2**32)`` (names the value and its index), or shapes that do not broadcast.
    """
    lay, rows = _uint32s(layer_id, "layer id"), _uint32s(row, "row id")
    try:
        return (lay << np.uint64(32)) | rows
    except ValueError as exc:
        raise ArgumentError(f"layer ids {lay.shape} and row ids {rows.shape} do not broadcast ({exc})") from None


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
        The bookkeeping adds at most :data:`BOOKKEEPING_BYTES` bytes a row (and :data:`BOOKKEEPING_FIXED_BYTES`).
        Record memory is taken as rows arrive (untouched pages cost nothing).
    policy : {"tinylfu", "lru"}
        Replacement policy (see the module): ``tinylfu`` (default, :data:`DEFAULT_POLICY`: why there) admits by
        frequency; ``lru`` suits a cache of one session.  A string (``numpy.str_`` is taken as its str).
    prefill : {"admit", "bypass"}
        Whether prefill batches use the cache (default ``admit``); a string.

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
        A policy or prefill rule that does not exist, or one that is not a string (an array, a number, None).
    CacheCopyError
        ``copy.copy``, ``copy.deepcopy`` or pickling: a cache is not copied (make a new one).
    CacheLayoutError
        (:meth:`bind`, at ``EngramModel.open(..., cache=)``) the cache already serves a model of another
        layout or other tables, or its model file was replaced or modified at its path since (a file is
        known by device, inode, size and modification time: :meth:`bind_tables`).

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

    Files: the cache keeps a read-only descriptor of each model file it serves, so that a file replaced at
    its path is never taken for it (:meth:`bind_tables`); a deleted model file's space is freed when the
    cache is dropped.
    """

    def __init__(self, max_bytes: Union[int, str], policy: str = DEFAULT_POLICY, *, prefill: str = DEFAULT_PREFILL):
        policy, prefill = _check_policy(policy, prefill)
        self.capacity = cache_rows(max_bytes)
        self.max_bytes = parse_size(max_bytes)
        self.policy = policy
        self.prefill = prefill
        self._policy = CachePolicy(self.capacity, policy)
        self._records = np.empty((self.capacity, ROW_BYTES), np.uint8)
        self._lock = threading.Lock()
        self._owner: Optional[Tuple[str, object, tuple]] = None
        #: layer id -> (file identity, offset, rows, path) of the table whose rows the keys of that layer name
        self._tables: dict = {}
        #: (device, inode) -> a read-only descriptor of each file served: its inode number stays its own
        self._held: dict = {}
        weakref.finalize(self, _close_all, self._held)
        self.hits = 0
        self.lookups = 0
        self.inserts = 0
        self.contended = 0
        _CACHES.add(self)

    # ------------------------------------------------------------- models
    def bind(self, layout, tables, name: str = "") -> None:
        """Serve the model of ``layout`` whose tables are ``tables`` (``{layer id: TableLocation}``).

        The first model binds the cache; another model may share it only with the same layout and
        the same tables (file, offset, rows), e.g. the same file opened twice.  A file is the same while
        its identity is (:meth:`bind_tables`): a model file replaced or rewritten at the same path is
        another model.

        Raises
        ------
        ArgumentError
            ``layout`` is not a Layout, or ``tables`` not a mapping of layer ids to table locations (as
            :meth:`bind_tables` checks them).
        CacheLayoutError
            Another layout or other tables than the model the cache serves (names both), or the cache's
            file replaced or modified since (names the file).
        """
        try:
            given = [_table_entry(lid, loc.path, loc.offset, loc.rows) for lid, loc in tables.items()]
        except ArgumentError as exc:
            raise ArgumentError(f"RowCache.bind: {exc}") from None
        except (AttributeError, TypeError) as exc:
            raise ArgumentError(f"RowCache.bind: tables must map layer ids to TableLocation (path, offset, rows), "
                                f"got {type(tables).__name__} ({exc})") from None
        if not hasattr(layout, "layer_ids") or not hasattr(layout, "rows"):
            raise ArgumentError(f"RowCache.bind: layout must be an engram.Layout, got {type(layout).__name__}")
        with self._lock:
            opened = []
            try:
                ids = [self._identify(path, fd, opened) for _, path, _, _, fd in given]
                ident = tuple(sorted((lid, fid, offset, rows) for (lid, _, offset, rows, _), fid in zip(given, ids)))
                if self._owner is None:
                    self._register(given, name or "this model", ids)
                    self._owner = (name, layout, ident)
                else:
                    self._same_model(layout, ident, name)
                self._keep(opened)
            finally:
                _close_all(opened)

    def _same_model(self, layout, ident: tuple, name: str) -> None:
        """CacheLayoutError unless ``layout`` and the tables' identities ``ident`` are the bound model's."""
        owner, lay, have = self._owner
        if lay != layout:
            raise CacheLayoutError(f"row cache serves {owner or 'a model'} (layers {list(lay.layer_ids)}, rows "
                                   f"{[int(r) for r in lay.rows]}); {name or 'this model'} has another layout "
                                   f"(layers {list(layout.layer_ids)}, rows {[int(r) for r in layout.rows]}): its "
                                   f"keys (layer, row) would name other rows; give it its own RowCache")
        if have != ident:
            changed = any(h[1][:2] == i[1][:2] and h[1] != i[1] for h, i in zip(have, ident))
            why = (" (the file was modified since the cache bound it: its size or modification time differ)"
                   if changed else " (the file at that path was replaced since: another file)"
                   if owner and name and os.path.realpath(owner) == os.path.realpath(name) else "")
            raise CacheLayoutError(f"row cache serves {owner or 'a model'}; {name or 'this model'} has the same "
                                   f"layout but other tables (file, offset){why}: its rows differ; give it its own "
                                   f"RowCache")

    def bind_tables(self, tables, where: str = "") -> None:
        """Serve the rows of ``tables``: ``(layer id, path, offset, rows)`` each (:meth:`engram.Table.attach_cache`).

        A key is ``(layer id, row)``, so each layer id names one table: the first table attached (or bound with a
        model, :meth:`bind`) under a layer id keeps it; the same table again (the same file and offset, e.g.
        each session's own descriptor of the model's file, or a table of its first rows, whose range check
        refuses the others) is fine.

        A file is known by its identity, not its path: device, inode, size and modification time
        (``os.stat``).  A file replaced at the same path (deleted and written again, or renamed over) or
        rewritten in place is another file, refused with CacheLayoutError while the cache serves the old
        one's rows: make a new RowCache for it.  The cache keeps a read-only descriptor of every file it
        serves, so that the file's inode number cannot pass to a new file while the cache holds its rows
        (a deleted file's space is freed when the cache is dropped).

        Raises
        ------
        ArgumentError
            An entry that is not four values: an integer layer id in ``[0, 2**32)``, a path, an integer offset
            ``>= 0``, an integer row count in ``[1, 2**32]`` (names the entry and the value).
        CacheLayoutError
            A layer id the cache serves from another table (file, offset), or one layer id given for two
            tables (names the layer and both tables), or a file replaced or modified since the cache bound it.
        """
        try:
            given = [_table_entry(lid, path, offset, rows) for lid, path, offset, rows in tables]
        except (TypeError, ValueError) as exc:
            raise ArgumentError(f"tables must be (layer id, path, offset, rows) each ({exc})") from None
        self._bind_files(given, where or "this table")

    def _bind_files(self, given, where: str) -> None:
        """:meth:`bind_tables` of ``(layer id, path, offset, rows, fd)`` entries: ``fd`` an open descriptor of
        the file the table reads (its identity is taken from it, not from the path), or None."""
        with self._lock:
            opened = []
            try:
                self._register(given, where, [self._identify(path, fd, opened) for _, path, _, _, fd in given])
                self._keep(opened)
            finally:
                _close_all(opened)

    def _identify(self, path, fd, opened: list) -> tuple:
        """The identity of a file (under the lock): ``(device, inode, size, mtime_ns)`` of ``fd`` when given (an
        open descriptor of it) or of ``path`` opened read-only; ``(realpath,)`` of a path that cannot be opened.
        A descriptor that keeps the file alive is appended to ``opened`` (:meth:`_keep` keeps it if the cache
        holds no descriptor of that file yet; the caller closes the rest)."""
        try:
            held = os.dup(fd) if fd is not None and fd >= 0 else os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return (os.path.realpath(path),)
        opened.append(held)
        try:
            st = os.fstat(held)
        except OSError:
            return (os.path.realpath(path),)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _keep(self, opened: list) -> None:
        """After a bind succeeded: keep one descriptor of each file the cache did not hold yet (removed from
        ``opened``); the caller closes what is left."""
        for fd in list(opened):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in self._held:
                self._held[(st.st_dev, st.st_ino)] = fd
                opened.remove(fd)

    def _register(self, tables, where: str, ids) -> None:
        """:meth:`bind_tables` under the lock, all or nothing; ``ids`` the files' identities (:meth:`_identify`)."""
        new: dict = {}
        for (lid, path, offset, rows, _), fid in zip(tables, ids):
            ident = (fid, int(offset), int(rows), os.fspath(path))
            have = new.get(int(lid)) or self._tables.get(int(lid))
            if have is not None and have[:2] != ident[:2]:  # the same file and offset: the same rows (a prefix)
                same_path = os.path.realpath(have[3]) == os.path.realpath(ident[3]) and have[1] == ident[1]
                why = ("; the file was modified since the cache bound it (its size or modification time differ)"
                       if same_path and have[0][:2] == fid[:2] else
                       "; the file at that path was replaced since the cache bound it (another file)"
                       if same_path else "")
                raise CacheLayoutError(
                    f"row cache serves layer {int(lid)} from {have[3]} (offset {have[1]}, {have[2]} rows); {where} "
                    f"gives layer {int(lid)} the table {ident[3]} (offset {ident[1]}, {ident[2]} rows){why}: the "
                    f"keys (layer, row) would name other rows; give it its own RowCache or another layer id")
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
        each column's table; a batch with an id beyond its table is served nothing (0 returned, every ``skip``
        0, ``out`` untouched, nothing counted), for the reader's range error.
        Returns the hits.  Raises ArgumentError for arrays that do not fit (dtype, shape, layout, or outputs
        that overlap each other or the inputs), ``out`` untouched."""
        lock = self._lock
        if not lock.acquire(False):
            self.contended += 1
            lock.acquire()
        try:
            h = self._policy.serve(ids, col_layer, keys, self._records, out, skip, col_rows)
            if h < 0:  # an id beyond its table: the read fails its range check
                return 0
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
        (bool ``[n]`` held, float32 ``[held, 256]`` decoded).  A row reserved for a read still in flight is
        not held (its record is not written yet), as every lookup misses it.  For inspection and tests.

        Raises
        ------
        ArgumentError
            ``layer_id`` not one integer, or ``rows`` not integers, or either outside ``[0, 2**32)`` (names
            the value: a row id of 2**32 or more would name another layer's row)."""
        if isinstance(layer_id, (bool, np.bool_)) or not isinstance(layer_id, (int, np.integer)):
            raise ArgumentError(f"RowCache.get: layer_id must be one integer in [0, 2**32), got "
                                f"{type(layer_id).__name__} {layer_id!r}"[:200])
        if rows is None or isinstance(rows, (str, bytes)):
            raise ArgumentError(f"RowCache.get: rows must be integers in [0, 2**32) [n], got {type(rows).__name__}")
        try:
            keys = np.atleast_1d(cache_key(layer_id, rows)).reshape(-1)
        except ArgumentError as exc:
            raise ArgumentError(f"RowCache.get: {exc}") from None
        with self._lock:
            slots = np.array([self._policy.ready_slot(int(k)) for k in keys], dtype=np.int64)
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

    def _no_copy(self, how: str):
        raise CacheCopyError(f"a RowCache cannot be {how}: it holds native state (the policy's tables), a lock and "
                             f"open descriptors of its files, which a copy would share or lose; make a new "
                             f"RowCache({self.max_bytes}, {self.policy!r}) instead")

    def __copy__(self):
        self._no_copy("copied (copy.copy)")

    def __deepcopy__(self, memo):
        self._no_copy("copied (copy.deepcopy)")

    def __reduce_ex__(self, protocol):
        self._no_copy("pickled")

    def __repr__(self) -> str:
        return (f"RowCache({self.max_bytes}, policy={self.policy!r}, prefill={self.prefill!r}, "
                f"capacity={self.capacity} rows, entries={self.entries})")


def _table_entry(lid, path, offset, rows, fd=None) -> tuple:
    """``(layer id, path, offset, rows, fd)`` of a table, checked: ArgumentError naming a layer id that is not an
    integer in ``[0, 2**32)``, an offset that is not an integer >= 0 or a row count not in ``[1, 2**32]``."""
    for name, v, lo, hi, want in (("layer id", lid, 0, 2**32 - 1, "an integer in [0, 2**32)"),
                                  ("offset", offset, 0, None, "an integer >= 0"),
                                  ("rows", rows, 1, 2**32, "an integer in [1, 2**32]")):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < lo \
                or (hi is not None and v > hi):
            raise ArgumentError(f"table {os.fspath(path) if isinstance(path, (str, os.PathLike)) else path!r} "
                                f"(layer id {lid!r}): {name} must be {want}, got {v!r}")
    return int(lid), os.fspath(path), int(offset), int(rows), fd


def _close_all(fds) -> None:
    """Close the descriptors ``fds`` (a list, or a dict's values), emptied."""
    for fd in list(fds.values() if isinstance(fds, dict) else fds):
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


_NO_RECORDS = np.empty((0, ROW_BYTES), np.uint8)
#: Every cache of the process, whose locks a fork() renews in the child.
_CACHES: "weakref.WeakSet[RowCache]" = weakref.WeakSet()


def _renew_locks() -> None:
    for c in list(_CACHES):
        c._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_locks)
