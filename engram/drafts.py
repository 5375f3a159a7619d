"""Speculative decoding: the rows of drafted tokens, read in the background before they are verified.

With multi-token prediction (DeepSeek V4) a decode step drafts the next ``k``
tokens; their Engram rows depend only on the history and the drafts, so they
are known a whole step before the drafts are confirmed.
:meth:`engram.Session.prefetch` hashes the drafts against the session's
current history (without advancing it) and begins their read at once, from the
calling thread (:meth:`engram.TableGroup.begin_layers`): every drafted token's
rows as one sorted, deduplicated batch (``k x 48`` rows, through the session's
I/O engine and row cache), handed to the engine before ``prefetch`` returns --
on the io_uring ring submitted to the kernel with one ``io_uring_enter``, on the
pread pool given to its threads -- with all of the batch's reads in flight where
the engine's queue depth allows.  The session's :class:`DraftReader` (one
background thread a session, started on the first prefetch) then collects the
completions (it reaps, checks and decodes the rows, returning the engine's
credits as reads end) while the caller computes; a step that comes first
collects them itself instead of waiting for the thread.

The next :meth:`~engram.Session.step` or :meth:`~engram.Session.step_many`
whose leading tokens are the drafts (from the same history) takes those tokens'
rows from the :class:`DraftPrefetch` (waiting if its read is still in flight)
and drops the rest; ``ReadStats.prefetch_hits`` counts the rows so served.  The
rows are kept table after table (``[layers, k, 24, 256]``), so a step hands
each layer a contiguous view, no copy.  A prefetch that no step uses is
cancelled: its reads, already in flight, end in the background and are dropped.

After ``fork()`` (:mod:`engram.forks`) the reader thread and the engine's reads
are the parent's: a prefetch in flight at the fork is read again in the child
when it is waited for (by the child's step, or the child's own thread).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import List, Optional, Sequence

import numpy as np

from . import forks as _forks
from .codec import ROW_VALUES
from .errors import EngramError, TableIOError
from .hashing import History
from .io_engine import EngineClient
from .table import ReadStats, TableGroup

__all__ = ["DraftPrefetch", "DraftReader", "DraftCancelled"]

_BEGUN, _READY, _FAILED, _CANCELLED = "reading", "ready", "failed", "cancelled"
#: Groups (native readers) a session's drafts read through: a new prefetch begins on a free one while
#: the dropped prefetch before it may still be in flight on the other.
DRAFT_GROUPS = 2


class DraftCancelled(EngramError):
    """The prefetch of drafted tokens was cancelled (or its session closed) before its rows were read."""


class DraftPrefetch:
    """The rows of drafted tokens, being read in the background (made by :meth:`engram.Session.prefetch`).

    Attributes
    ----------
    tokens : numpy.ndarray
        int64 ``[k]``: the drafted token ids, in order.
    history : History
        The session's history the drafts follow (a snapshot taken at the prefetch).
    row_ids : numpy.ndarray
        uint32 ``[k, layers, 24]``: the drafts' row ids, as :meth:`engram.Session.step` would hash them.
    histories : list of History
        ``k + 1`` snapshots: the history before each draft, and after the last.
    stats : ReadStats
        The background read's statistics (once it has run; ``wall_s`` from the prefetch's begin to its
        rows decoded).
    issued_at, begun_at, ready_at : float
        ``time.perf_counter()`` at the prefetch, when its reads had been handed to the I/O engine, and
        when its rows were ready (None until then).
    """

    def __init__(self, tokens: np.ndarray, history: History, row_ids: np.ndarray,
                 histories: Optional[List[History]] = None):
        self.issued_at = time.perf_counter()
        self.tokens = tokens
        self._token_list = tokens.tolist()
        self.history = history
        self.row_ids = row_ids
        self.histories = histories
        k, L, C = row_ids.shape
        self._rows = np.empty((L, k, C, ROW_VALUES), np.float32)  # table-major: each layer's rows contiguous
        self._layers = list(self._rows)  # each table's [k, 24, 256] view: what a step of all k drafts returns
        self._handover: Optional[tuple] = None  # (histories, last row ids): the session's own copies
        self.state = _BEGUN
        self.error: Optional[BaseException] = None
        self.stats = ReadStats()
        self.begun_at: Optional[float] = None
        self.ready_at: Optional[float] = None
        self._cond = threading.Condition()
        self._reader: Optional["DraftReader"] = None
        self._group: Optional[TableGroup] = None  # the group holding its begun read, until collected
        self._claimed = False                      # someone is collecting it
        self._pid = -1                             # the process that began its read
        _forks.track(self)

    def _after_fork_child(self) -> None:
        """In a child after fork(): the lock may be held by the parent's reader thread, which does not
        exist here; a collection it was making is left to this process (its group reads the batch
        again, engram.forks)."""
        self._cond = threading.Condition()
        self._claimed = False

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def done(self) -> bool:
        """The read finished (rows ready, or it failed), or the prefetch was cancelled."""
        return self.state in (_READY, _FAILED, _CANCELLED)

    @property
    def cancelled(self) -> bool:
        return self.state == _CANCELLED

    def matched(self, history: History, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` (``T`` ints, or int64 ``[T]``) are this prefetch's drafts from
        ``history``: 0 when the history differs or the prefetch was cancelled or failed."""
        if self.state in (_CANCELLED, _FAILED) or history != self.history:
            return 0
        n = 0
        for a, b in zip(self._token_list, tokens.tolist() if isinstance(tokens, np.ndarray) else tokens):
            if a != b:
                break
            n += 1
        return n

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the rows are read (seconds; None: no limit).

        When the background thread has not begun collecting the reads yet, the caller collects them
        itself (reaps the completions, checks and decodes the rows: the reads are already in flight,
        so this takes no longer than they do, whatever ``timeout``).

        Raises
        ------
        DraftCancelled
            The prefetch was cancelled first.
        EngramError
            The read's own error (e.g. :class:`~engram.TableIOError`, :class:`~engram.DecodeError`).
        TimeoutError
            ``timeout`` passed first.
        """
        if self.state == _READY:  # published under the lock once the rows are in: nothing to wait for
            return
        reader = self._reader
        if self.state == _BEGUN and reader is not None and reader._claim(self):
            reader._collect(self)
        with self._cond:
            ok = self._cond.wait_for(lambda: self.state in (_READY, _FAILED, _CANCELLED), timeout)
            if self.state == _READY:
                return
            if self.state == _FAILED:
                raise self.error
            if self.state == _CANCELLED:
                raise DraftCancelled(f"the prefetch of {len(self)} drafted tokens was cancelled before its rows "
                                     f"were read")
            if not ok:
                raise TimeoutError(f"the prefetch of {len(self)} drafted tokens was not read after {timeout} s")

    def rows(self, upto: Optional[int] = None, timeout: Optional[float] = None) -> np.ndarray:
        """float32 ``[upto, layers * 24, 256]`` (bf16 values): the rows of the first ``upto`` drafts
        (default all), layer after layer as :meth:`engram.TableGroup.read_batch` returns them; a
        read-only array.  Waits first (:meth:`wait`, same errors)."""
        self.wait(timeout)
        L, k, C, V = self._rows.shape
        n = k if upto is None else int(upto)
        out = np.ascontiguousarray(self._rows[:, :n].transpose(1, 0, 2, 3)).reshape(-1, L * C, V)
        out.flags.writeable = False
        return out

    def layer_rows(self, layer: int, upto: int) -> np.ndarray:
        """float32 ``[upto, 24, 256]``: the rows of table ``layer`` (its index in the session's layers)
        for the first ``upto`` drafts, a C-contiguous view of the prefetch's buffer (call after
        :meth:`wait`)."""
        return self._layers[layer] if upto == len(self._token_list) else self._rows[layer, :upto]

    def _prepare_handover(self) -> None:
        """Copy, while the reads are in flight, what a step taking these drafts gives its session: the
        ``k + 1`` histories and each draft's row ids (the step then copies nothing on its critical path)."""
        if self.histories is not None:
            self._handover = self._own_copies()

    def _own_copies(self) -> tuple:
        """``(copies of the k + 1 histories, copies of each draft's row ids)``."""
        return [h.copy() for h in self.histories], [ids.copy() for ids in self.row_ids]

    def _take(self, upto: int) -> tuple:
        """``(histories before each of the first upto drafts, the history after them, the last one's row
        ids)``, the session's own: taken once, by the step the prefetch serves (it is dropped then)."""
        hand, self._handover = self._handover, None
        hist, ids = hand if hand is not None else self._own_copies()
        return hist[:upto], hist[upto], ids[upto - 1]

    def cancel(self) -> None:
        """Drop the prefetch: its reads, already in flight, end in the background and are thrown away;
        waiters get :class:`DraftCancelled` (idempotent; a read one stays readable)."""
        with self._cond:
            if self.state == _BEGUN:
                self.state = _CANCELLED
                self._cond.notify_all()

    def __repr__(self) -> str:
        return f"DraftPrefetch(tokens={self.tokens.tolist()}, state={self.state!r})"


class DraftReader:
    """A session's drafts' reader: :data:`DRAFT_GROUPS` :class:`~engram.TableGroup` of its own and one
    background thread that collects their begun reads.

    The groups read the session's tables through the same I/O engine (each as a client of its own, so
    that the engine's fairness between clients interleaves a step's reads with a prefetch still in
    flight) or private readers, and the same row cache as the session's steps, with their own staging
    and lock, so that a step never waits on a prefetch it does not use.  :meth:`submit` begins a
    prefetch's read from the calling thread; the thread (or a waiter that comes first) finishes it.
    A new prefetch cancels the one before.

    Parameters
    ----------
    tables : sequence of Table
        The session's tables, in layer order.
    columns : int
        Columns per table (24 for V4.1).
    engine
        What the session's group reads through (an :class:`~engram.io_engine.EngineClient`: the drafts
        are read by new clients of its engine; or ``"private"``).

    Raises
    ------
    TableIOError, ArgumentError
        As :class:`~engram.TableGroup`.
    """

    def __init__(self, tables, columns: int, engine):
        if isinstance(engine, EngineClient):
            # clients of their own on the session's engine: the engine interleaves a step's reads with a
            # prefetch still in flight (fair between clients) instead of queueing them behind it
            engine = engine.engine
        self._tables, self._columns, self._engine = list(tables), columns, engine
        self._cache, self._cache_layers = None, None
        self.groups: List[TableGroup] = [TableGroup(self._tables, columns, engine=engine)]
        self._free: List[TableGroup] = list(self.groups)
        self._todo: deque = deque()  # begun prefetches for the thread to collect
        self._cond = threading.Condition()
        self._job: Optional[DraftPrefetch] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._thread_pid = -1
        _forks.track(self)

    @property
    def group(self) -> TableGroup:
        """The first of the groups the drafts are read through."""
        return self.groups[0]

    def _after_fork_child(self) -> None:
        """In a child after fork(): the parent's thread does not exist here (engram.forks)."""
        self._cond = threading.Condition()

    def attach_cache(self, cache, layer_ids) -> None:
        """Read the drafts through ``cache`` (the session's row cache; None: none)."""
        self._cache, self._cache_layers = cache, layer_ids
        for g in self.groups:
            g.attach_cache(cache, layer_ids)

    def _group_for(self) -> TableGroup:
        """A group with no begun read: a free one, a new one (up to DRAFT_GROUPS), or the oldest busy one
        once its read is collected (by this thread if nobody collects it yet)."""
        while True:
            with self._cond:
                if self._free:
                    return self._free.pop()
                make = len(self.groups) < DRAFT_GROUPS
                if make:
                    self.groups.append(None)  # its place, taken under the lock
                oldest = self._todo[0] if self._todo and not make else None
            if make:
                g = TableGroup(self._tables, self._columns, engine=self._engine)
                if self._cache is not None:
                    g.attach_cache(self._cache, self._cache_layers)
                with self._cond:
                    self.groups[self.groups.index(None)] = g
                return g
            if oldest is not None and self._claim(oldest):
                self._collect(oldest)
                continue
            with self._cond:  # being collected by the thread or a waiter
                if not self._free:
                    self._cond.wait(0.05)

    def submit(self, job: DraftPrefetch) -> DraftPrefetch:
        """Begin ``job``'s read from the calling thread (cancelling the prefetch before) and hand its
        collection to the thread; returns it.  An error of the begin is the job's (raised by its
        :meth:`~DraftPrefetch.wait`).

        Raises
        ------
        TableIOError
            The reader is closed.
        """
        with self._cond:
            if self._closed:
                raise TableIOError("prefetch: the session is closed")
            if self._job is not None and self._job is not job:
                self._job.cancel()
            self._job = job
            self._start()
        job._reader = self
        job._pid = _forks.pid()
        g = self._group_for()
        try:
            g.begin_layers(np.ascontiguousarray(job.row_ids.transpose(1, 0, 2)), job._rows)
        except BaseException as exc:  # surfaced by wait()
            with job._cond:
                job.error, job.state = exc, _FAILED
                job._cond.notify_all()
            with self._cond:
                self._free.append(g)
                self._cond.notify_all()
            return job
        job.begun_at = time.perf_counter()
        job._prepare_handover()
        with self._cond:
            job._group = g
            self._todo.append(job)
            self._cond.notify_all()
        return job

    def _claim(self, job: DraftPrefetch) -> bool:
        """Take ``job``'s collection (False: it has none left, or someone else has it)."""
        with job._cond:
            if job._group is None or job._claimed:
                return False
            job._claimed = True
            return True

    def _collect(self, job: DraftPrefetch) -> None:
        """Finish the claimed ``job``'s begun read (reap, check, decode), publish its state, free its group."""
        g = job._group
        try:
            if job._pid == _forks.pid():
                st, err = g.finish(), None
            else:  # begun in the parent before fork(): its reads are the parent's; read them here
                g.read_layers(np.ascontiguousarray(job.row_ids.transpose(1, 0, 2)), out=job._rows)
                st, err = g.last_stats, None
        except BaseException as exc:  # surfaced by wait(); the thread never dies silently
            st, err = None, exc
        with job._cond:
            if job.state == _BEGUN:
                if err is None:
                    job.stats = st
                    job.ready_at = time.perf_counter()
                    job.state = _READY
                else:
                    job.error, job.state = err, _FAILED
            job._group = None  # last: a fork() in between leaves the job to the child's collection
            job._cond.notify_all()
        with self._cond:
            try:
                self._todo.remove(job)
            except ValueError:
                pass
            self._free.append(g)
            self._cond.notify_all()

    def _start(self) -> None:
        """A collecting thread of this process, unless one runs (lock held)."""
        if self._thread_pid == _forks.pid() and self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="engram-drafts", daemon=True)
        self._thread_pid = _forks.pid()
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._todo:
                    self._cond.wait()
                if self._closed:
                    return
                todo = list(self._todo)
            for job in todo:  # the oldest that nobody collects yet
                if self._claim(job):
                    self._collect(job)
                    break
            else:
                with self._cond:  # waiters collect them all: wait until one is off the list
                    if list(self._todo) == todo:
                        self._cond.wait(0.05)

    def close(self) -> None:
        """Cancel the pending prefetch, stop the thread (waiting for a collection in progress), close
        the groups (waiting for reads in flight; idempotent; never waits on the parent's thread after
        fork())."""
        with self._cond:
            self._closed = True
            if self._job is not None:
                self._job.cancel()
            self._cond.notify_all()
            thread = self._thread if self._thread_pid == _forks.pid() else None
        if thread is not None and threading.current_thread() is not thread:
            thread.join()
        with self._cond:
            todo, self._todo = list(self._todo), deque()
        for job in todo:
            with job._cond:
                job._group = None
                job._cond.notify_all()
        for g in self.groups:
            if g is not None:
                g.close()
