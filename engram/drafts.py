"""Speculative decoding: the rows of drafted tokens, read in the background before they are verified.

With multi-token prediction (DeepSeek V4) a decode step drafts the next ``k``
tokens; their Engram rows depend only on the history and the drafts, so they
are known a whole step before the drafts are confirmed.
:meth:`engram.Session.prefetch` hashes the drafts against the session's
current history (without advancing it) and hands their rows to the session's
:class:`DraftReader`: one background thread a session, started on the first
prefetch, that reads every drafted token's rows as one sorted, deduplicated
batch (``k x 48`` rows, through the session's I/O engine and row cache) while
the caller computes.  The next :meth:`~engram.Session.step` or
:meth:`~engram.Session.step_many` whose leading tokens are the drafts (from the
same history) takes those tokens' rows from the :class:`DraftPrefetch`
(waiting if its read is still in flight) and drops the rest;
``ReadStats.prefetch_hits`` counts the rows so served.  A prefetch that no step
uses is cancelled: one still queued is never read; one being read finishes its
batch in the background and is dropped.

After ``fork()`` (:mod:`engram.forks`) the reader thread is the parent's: the
child starts its own on its next prefetch or wait, and a prefetch that was
queued or being read at the fork is read again there.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import numpy as np

from . import forks as _forks
from .errors import EngramError, TableIOError
from .hashing import History
from .table import ReadStats, TableGroup

__all__ = ["DraftPrefetch", "DraftReader", "DraftCancelled"]

_QUEUED, _READING, _READY, _FAILED, _CANCELLED = "queued", "reading", "ready", "failed", "cancelled"


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
    stats : ReadStats
        The background read's statistics (once it has run; ``wall_s`` is its own read time).
    issued_at, ready_at : float
        ``time.perf_counter()`` at the prefetch and when its rows were ready (None until then).
    """

    def __init__(self, tokens: np.ndarray, history: History, row_ids: np.ndarray):
        self.tokens = tokens
        self.history = history
        self.row_ids = row_ids
        k, L, C = row_ids.shape
        self._rows = np.empty((k, L * C, 256), np.float32)
        self.state = _QUEUED
        self.error: Optional[BaseException] = None
        self.stats = ReadStats()
        self.issued_at = time.perf_counter()
        self.ready_at: Optional[float] = None
        self._cond = threading.Condition()
        _forks.track(self)

    def _after_fork_child(self) -> None:
        """In a child after fork(): the lock may be held by the parent's reader; a read the parent's
        thread was making is not the child's, so the prefetch is queued again (engram.forks)."""
        self._cond = threading.Condition()
        if self.state == _READING:
            self.state = _QUEUED

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def done(self) -> bool:
        """The read finished (rows ready, or it failed), or the prefetch was cancelled."""
        return self.state in (_READY, _FAILED, _CANCELLED)

    @property
    def cancelled(self) -> bool:
        return self.state == _CANCELLED

    def matched(self, history: History, tokens: np.ndarray) -> int:
        """How many leading ``tokens`` (int64 ``[T]``) are this prefetch's drafts from ``history``:
        0 when the history differs or the prefetch was cancelled or failed."""
        if self.state in (_CANCELLED, _FAILED) or history != self.history:
            return 0
        n = min(len(self), int(tokens.shape[0]))
        if n == 0:
            return 0
        diff = np.flatnonzero(self.tokens[:n] != tokens[:n])
        return int(diff[0]) if diff.size else n

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the rows are read (seconds; None: no limit).

        Raises
        ------
        DraftCancelled
            The prefetch was cancelled first.
        EngramError
            The read's own error (e.g. :class:`~engram.TableIOError`, :class:`~engram.DecodeError`).
        TimeoutError
            ``timeout`` passed first.
        """
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
        read-only view.  Waits first (:meth:`wait`, same errors)."""
        self.wait(timeout)
        view = self._rows[: len(self) if upto is None else int(upto)]
        view.flags.writeable = False
        return view

    def cancel(self) -> None:
        """Drop the prefetch: queued, it is never read; being read, its batch finishes in the background
        and is thrown away; waiters get :class:`DraftCancelled` (idempotent; a read one stays readable)."""
        with self._cond:
            if self.state in (_QUEUED, _READING):
                self.state = _CANCELLED
                self._cond.notify_all()

    def __repr__(self) -> str:
        return f"DraftPrefetch(tokens={self.tokens.tolist()}, state={self.state!r})"


class DraftReader:
    """One background reader of a session's drafts: a thread and a :class:`~engram.TableGroup` of its own.

    The group reads the session's tables through the same engine client (or private readers) and the
    same row cache as the session's steps, but with its own staging and lock, so that a step never
    waits on a prefetch it does not use.  One prefetch at a time: a new one cancels the one before.

    Parameters
    ----------
    tables : sequence of Table
        The session's tables, in layer order.
    columns : int
        Columns per table (24 for V4.1).
    engine
        What the session's group reads through (an :class:`~engram.io_engine.EngineClient` or
        ``"private"``).

    Raises
    ------
    TableIOError, ArgumentError
        As :class:`~engram.TableGroup`.
    """

    def __init__(self, tables, columns: int, engine):
        self.group = TableGroup(list(tables), columns, engine=engine)
        self._cond = threading.Condition()
        self._job: Optional[DraftPrefetch] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._thread_pid = -1
        _forks.track(self)

    def _after_fork_child(self) -> None:
        """In a child after fork(): the parent's thread does not exist here (engram.forks)."""
        self._cond = threading.Condition()

    def attach_cache(self, cache, layer_ids) -> None:
        """Read the drafts through ``cache`` (the session's row cache; None: none)."""
        self.group.attach_cache(cache, layer_ids)

    def submit(self, job: DraftPrefetch) -> DraftPrefetch:
        """Queue ``job`` for the reader (cancelling the one before); returns it.

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
            self._cond.notify_all()
        return job

    def ensure_reading(self, job: DraftPrefetch) -> None:
        """In a child after fork(): a job the parent's thread held is read by a thread of this process."""
        with self._cond:
            if job.state == _QUEUED and not self._closed:
                self._start()
                self._cond.notify_all()

    def _start(self) -> None:
        """A reader thread of this process, unless one runs (lock held)."""
        if self._thread_pid == _forks.pid() and self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="engram-drafts", daemon=True)
        self._thread_pid = _forks.pid()
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._job is None or self._job.state != _QUEUED):
                    self._cond.wait()
                if self._closed:
                    return
                job = self._job
                with job._cond:
                    if job.state != _QUEUED:
                        continue
                    job.state = _READING
            k, L, C = job.row_ids.shape
            try:
                self.group.read_batch(job.row_ids.reshape(k, L * C), out=job._rows)
                err = None
            except BaseException as exc:  # surfaced by wait(); the thread never dies silently
                err = exc
            with job._cond:
                if job.state == _READING:
                    if err is None:
                        job.stats = self.group.last_stats
                        job.ready_at = time.perf_counter()
                        job.state = _READY
                    else:
                        job.error, job.state = err, _FAILED
                job._cond.notify_all()

    def close(self) -> None:
        """Cancel the queued or running prefetch, stop the thread (waiting for a read in flight), close
        the group (idempotent; never waits on the parent's thread after fork())."""
        with self._cond:
            self._closed = True
            if self._job is not None:
                self._job.cancel()
            self._cond.notify_all()
            thread = self._thread if self._thread_pid == _forks.pid() else None
        if thread is not None and threading.current_thread() is not thread:
            thread.join()
        self.group.close()
