"""What the engine's Python objects do in a child after ``fork()`` (SPEC §8; issue 24).

A server that forks workers (gunicorn with a preloaded application,
``multiprocessing`` with the ``fork`` start method) may fork while a session's
prefill reader, or another thread, is inside a read.  Only the forking thread
exists in the child: a lock held by any other thread at that moment would stay
held there forever, and a thread the child waits for would never answer.  The
rules, one per kind of object:

- **Locks.** Every lock of a :class:`~engram.Table`, :class:`~engram.TableGroup`,
  :class:`~engram.Prefetcher`, :class:`~engram.DraftPrefetch` and its reader
  (:mod:`engram.drafts`), :class:`~engram.io_engine.EngineClient` and
  :class:`~engram.EngramModel`, and the module locks of :mod:`engram.backends`
  and :mod:`engram.vocabulary`, is made new in the child
  (``os.register_at_fork(after_in_child=...)``, run before any other thread
  can exist there).  A read that a thread of the parent was making is not the
  child's: the child's objects are as they were before it began.
- **Threads** are the parent's.  Each object that owns one records the process
  that started it (:func:`pid`, compared per object): a prefill reader whose
  thread was reading at the fork resumes, in the child, on the child's next
  :meth:`~engram.Prefetcher.wait` (from the first chunk not yet complete: a
  chunk is published only once read whole), and is never joined there.  A
  prefetch of drafted tokens that was queued or being read at the fork is
  read again in the child, by a reader thread of its own, when a step takes it.
- **Readers, pools, rings, engines** (native): the pool's threads and the
  ring's kernel queue are the parent's; the child abandons them and starts its
  own on its next read (``engram/_native/reader.pyx``, ``_forget_if_forked``;
  :mod:`engram.io_engine`).

So after a fork every object works in the child, and ``close()``, garbage
collection and interpreter exit never wait on the parent's threads.
"""

from __future__ import annotations

import os
import weakref
from typing import Callable, List

__all__ = ["track", "on_fork_child", "pid"]

_OBJECTS: "weakref.WeakSet" = weakref.WeakSet()
_CALLBACKS: List[Callable[[], None]] = []
_PID = [os.getpid()]


def pid() -> int:
    """This process's id (kept current across ``fork()``; cheaper than a system call)."""
    return _PID[0]


def track(obj):
    """Register ``obj``: its ``_after_fork_child()`` runs in each child right after ``fork()``,
    in the child's only thread (there it makes its locks new).  Held weakly; returns ``obj``."""
    _OBJECTS.add(obj)
    return obj


def on_fork_child(callback: Callable[[], None]) -> None:
    """Run ``callback()`` in each child right after ``fork()`` (for module-level locks)."""
    _CALLBACKS.append(callback)


def _after_fork_child() -> None:
    _PID[0] = os.getpid()
    for cb in list(_CALLBACKS):
        cb()
    for obj in list(_OBJECTS):
        obj._after_fork_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
