"""Background prefill reader (SPEC §8).

Every row of the prompt is hashed up front; a background thread then reads
them in chunks of 2048 tokens and publishes, per layer, how many tokens are
ready.  The inference engine asks only for what the layer it is computing
needs (:meth:`Prefetcher.wait`), so the reads hide behind the compute of
earlier layers.  As in the reference engine the first table's read starts at
once (before layer 0) and the second's when the engine reaches decoder layer
``second_table_layer`` (2 by default).

Read order: ``order="chunk"`` (default) reads chunk 0 of every open table,
then chunk 1, ..., which suits engines that run all layers on one micro-batch
of the prompt before the next (llama.cpp-style ubatches): each micro-batch's
rows of both tables arrive together.  ``order="table"`` reads the first table
whole before the second, for engines that run one layer over the whole prompt
at a time.  While the second table is still gated, the reader goes on with
the first.

A session's chunks are read through its tables' I/O engine
(:mod:`engram.io_engine`): each chunk is one batch there, interleaved read by
read with the decode batches of the other sessions on the device, so a long
prompt never holds their steps back by more than their share.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence

import numpy as np

from . import forks as _forks
from .errors import ArgumentError, EngramError
from .table import ReadStats

__all__ = ["Prefetcher", "PrefetchCancelled"]


class PrefetchCancelled(EngramError):
    """The prefetch was cancelled (or its session closed) before the rows were ready."""


class Prefetcher:
    """Rows of a prompt streamed by a background reader.

    Built by :meth:`engram.Session.prefill`; not constructed directly.

    Attributes
    ----------
    layer_ids : tuple[int, ...]
        Engram layers, in the order their tables are read.
    tokens : int
        Prompt length ``T``.
    row_ids : numpy.ndarray
        uint32 ``[T, layers, 24]``: every row id of the prompt (hashed up front).
    chunk_tokens : int
        Tokens read per chunk (2048).
    stats : ReadStats
        Cumulative read statistics of the prefetch.
    """

    def __init__(self, tables: Sequence, layer_ids: Sequence[int], row_ids: np.ndarray, *,
                 chunk_tokens: int = 2048, second_table_layer: int = 2, order: str = "chunk",
                 name: str = "engram-prefill"):
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, (int, np.integer)) or chunk_tokens < 1:
            raise ArgumentError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
        if isinstance(second_table_layer, bool) or not isinstance(second_table_layer, (int, np.integer)) \
                or second_table_layer < 0:
            raise ArgumentError(f"second_table_layer must be an integer >= 0, got {second_table_layer!r}")
        if order not in ("chunk", "table"):
            raise ArgumentError(f"order must be 'chunk' or 'table', got {order!r}")
        self.order = order
        self.layer_ids = tuple(int(x) for x in layer_ids)
        self.row_ids = row_ids
        self.tokens = int(row_ids.shape[0])
        self.chunk_tokens = int(chunk_tokens)
        self.second_table_layer = int(second_table_layer)
        self._tables = list(tables)
        cols = row_ids.shape[2]
        self._buffers = [np.empty((self.tokens, cols, 256), np.float32) for _ in self.layer_ids]
        # Decoder layer at which each table's read may start: the first at once, the rest later.
        self._start_at = [-1] + [self.second_table_layer] * (len(self.layer_ids) - 1)
        self._ready = [0] * len(self.layer_ids)
        self._engine_layer = -1
        self._error: Optional[BaseException] = None
        self._cancelled = False
        self._cond = threading.Condition()
        self.stats = ReadStats()
        self._name = name
        self._thread: Optional[threading.Thread] = None
        self._thread_pid = -1  # the process whose thread reads (engram.forks: the parent's after fork())
        _forks.track(self)
        with self._cond:
            self._start_reader()

    # ------------------------------------------------------------ fork
    def _after_fork_child(self) -> None:
        """In a child after fork(): the condition's lock may be held by the parent's reader thread."""
        self._cond = threading.Condition()

    def _finished(self) -> bool:
        """Every table read, or the reader stopped on an error or a cancel (lock held)."""
        return self._cancelled or self._error is not None or min(self._ready, default=self.tokens) >= self.tokens

    def _start_reader(self) -> None:
        """A reader thread of this process, unless one runs or nothing is left (lock held)."""
        if self._thread_pid == _forks.pid() or self._finished():
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread_pid = _forks.pid()
        self._thread.start()

    # ------------------------------------------------------------ reader
    def _next_task(self) -> Optional[int]:
        """Table index to read a chunk of next (under the lock), None when all is read.

        Waits while every unfinished table is still gated.
        """
        while True:
            if self._cancelled:
                return None
            todo = [li for li in range(len(self.layer_ids)) if self._ready[li] < self.tokens]
            if not todo:
                return None
            open_ = [li for li in todo if self._engine_layer >= self._start_at[li]]
            if self.order == "table":
                open_ = open_[:1] if open_ and open_[0] == todo[0] else []
            if open_:
                # chunk order: the table that is furthest behind; ties go to the earlier layer
                return min(open_, key=lambda li: (self._ready[li], li))
            self._cond.wait()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    li = self._next_task()
                if li is None:
                    return
                start = self._ready[li]
                stop = min(self.tokens, start + self.chunk_tokens)
                table = self._tables[li]
                table.read_batch(self.row_ids[start:stop, li, :], out=self._buffers[li][start:stop])
                self.stats.add(table.last_stats)
                with self._cond:
                    self._ready[li] = stop  # published only once the chunk is complete
                    self._cond.notify_all()
        except BaseException as exc:  # surfaced by wait(); the thread never dies silently
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    # ------------------------------------------------------------ engine side
    def _index(self, layer_id: int) -> int:
        try:
            return self.layer_ids.index(int(layer_id))
        except (ValueError, TypeError):
            raise ArgumentError(f"layer {layer_id!r} has no Engram table (layers: {list(self.layer_ids)})") from None

    @property
    def progress(self) -> Dict[int, int]:
        """Tokens ready per layer id (a consistent snapshot)."""
        with self._cond:
            return dict(zip(self.layer_ids, self._ready))

    @property
    def done(self) -> bool:
        """Every table read (or the reader stopped on an error or a cancel).  In a child after
        fork() whose reader has not resumed: whether anything is left to read."""
        with self._cond:
            if self._thread_pid != _forks.pid():
                return self._finished()
            return self._thread is None or not self._thread.is_alive()

    @property
    def error(self) -> Optional[BaseException]:
        """The reader's error, if it failed."""
        return self._error

    def enter_layer(self, layer: int) -> None:
        """Tell the reader that the engine reached decoder layer ``layer`` (opens later tables' reads)."""
        with self._cond:
            if layer > self._engine_layer:
                self._engine_layer = int(layer)
                self._cond.notify_all()

    def wait(self, layer_id: int, upto: Optional[int] = None, timeout: Optional[float] = None) -> None:
        """Block until tokens ``[0, upto)`` of ``layer_id`` are ready.

        Waiting for a layer means the engine has reached it, so the call also
        opens the reads gated on earlier layers.

        Raises
        ------
        The reader's error (e.g. :class:`~engram.TableIOError` for a truncated
        table), :class:`PrefetchCancelled` after :meth:`cancel`,
        :class:`~engram.ArgumentError` for an unknown layer or ``upto`` outside
        ``[0, tokens]``, ``TimeoutError`` when ``timeout`` (seconds) passes.
        """
        li = self._index(layer_id)
        upto = self.tokens if upto is None else int(upto)
        if not 0 <= upto <= self.tokens:
            raise ArgumentError(f"upto must lie in [0, {self.tokens}], got {upto}")
        self.enter_layer(int(layer_id))
        with self._cond:
            self._start_reader()  # in a child after fork(): the parent's thread does not read here
            ok = self._cond.wait_for(
                lambda: self._ready[li] >= upto or self._error is not None or self._cancelled, timeout)
            if self._ready[li] >= upto:
                return
            if self._error is not None:
                raise self._error
            if self._cancelled:
                raise PrefetchCancelled(f"prefetch cancelled before layer {layer_id} reached token {upto}")
            if not ok:
                raise TimeoutError(f"layer {layer_id}: {self._ready[li]} of {upto} tokens ready after {timeout} s")

    def rows(self, layer_id: int, start: int = 0, stop: Optional[int] = None,
             timeout: Optional[float] = None) -> np.ndarray:
        """Rows of tokens ``[start, stop)`` of ``layer_id``: float32 ``[stop - start, 24, 256]``.

        Waits for them first (see :meth:`wait`).  The result is a read-only view
        of the prefetch buffer.
        """
        stop = self.tokens if stop is None else int(stop)
        if not 0 <= int(start) <= stop <= self.tokens:
            raise ArgumentError(f"need 0 <= start <= stop <= {self.tokens}, got [{start}, {stop})")
        self.wait(layer_id, stop, timeout)
        view = self._buffers[self._index(layer_id)][int(start):stop]
        view.flags.writeable = False
        return view

    def cancel(self, wait: bool = True) -> None:
        """Stop the reader after its current chunk; waiters get :class:`PrefetchCancelled`."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()
            thread = self._thread if self._thread_pid == _forks.pid() else None  # never the parent's
        if wait and thread is not None and threading.current_thread() is not thread:
            thread.join()

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()
