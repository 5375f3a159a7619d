"""One I/O engine per device, shared by the sessions of a process (SPEC §8; issue 15).

Each decode session keeps its own read-only descriptors, hash history, request
storage and results (SPEC §8), but its reads go through the engine of the
device that holds its tables, so that 16 sessions hold one pool of threads,
not 16 (a session with private readers on the pread backend held 45 threads:
a pool per table and one for the group).

The rules of an engine (the C side is ``engram/_native/io_engine.h``):

- **Queue depth.** ``readers`` reads in flight in all, whatever the number of
  sessions (default :data:`ENGINE_READERS`; raised, never lowered, to the
  largest ``readers`` a client asks for).  A batch of one session has at most
  its own ``readers`` in flight, as with private readers.  A batch with fewer
  distinct rows than its table's ``threshold`` is read serially by the
  submitting thread, outside the engine (one read at a time).
- **Fairness.** A session's share is ``readers / active sessions`` credits (a
  credit = one read in flight).  A credit that frees stays with the batch
  whose read ended while its session holds less than its share; else it goes,
  round-robin over the batches in progress, to one whose session holds less
  than its share; else (work-conserving) to any batch with reads left.  A
  decode batch (48 reads) that arrives while another session's prefill batch
  holds every credit takes each credit the prefill releases above its share:
  a prefill batch is interleaved read by read with the decode batches, never
  served first.  (Keeping a credit with its batch matters for the ring: a
  thread waiting in ``io_uring_enter`` can use a credit granted to it only at
  its next completion.)
- **Bounded queue.** At most :data:`ENGINE_MAX_JOBS` batches (chunks of up to
  2048 x 24 requests, held in their own reader) are admitted at a time, first
  come first served; a submitter past the bound waits.
- **Ring or pool, per batch** (``backend="auto"`` where the ring reads): a
  batch of at most :data:`RING_BATCH` reads is read on an io_uring ring driven
  by the submitting thread (borrowed from the engine's cache: one ring per
  submitting thread at a time, no thread of its own), a larger one on the
  engine's pool of pread threads (``readers`` threads, started on first use;
  the submitter reads its own batch too).  Explicit ``backend="io_uring"`` or
  ``"pread"`` always take that executor; the run-time fallback from the ring
  (:mod:`engram.backends`) moves a session to the pool as before.
- **Errors stay per session**: a failed read stops only its own batch; the
  error names that session's row and file offset and its output is untouched.
- **Lifetime.** Each user holds a reference (an :class:`EngineClient`); the
  engine starts its native part with the first client and stops it (threads
  joined, rings closed) when the last client is released.  A child after
  ``fork()`` never touches the parent's threads or rings: the engines are
  abandoned in the child (``os.register_at_fork``) and each client starts a
  new engine there on its next read.

**Private and shared: one engine, two defaults.**  Every concurrent read runs
through an engine's two executors (the pread pool and the io_uring ring, one
submission loop each, ``io_engine.h``).  ``engine="private"`` gives a table or
group an engine of its own: one client, its ``readers`` as the queue depth,
``readers - 1`` pool threads (the caller is the last reader), no fairness to
keep; ``engine="shared"`` reads through the process's engine of the file's
device (:func:`shared_engine`).  The defaults follow who reads:
:data:`TABLE_ENGINE` (``"private"``) for a :class:`~engram.Table` or
:class:`~engram.TableGroup` opened by itself -- a table alone has no one to
share a queue with, and its ``backend="auto"`` stays on the ring for batches of
any size (benchmarks/BENCHMARKS.md, storage engine) -- and :data:`SESSION_ENGINE`
(``"shared"``) for :meth:`engram.EngramModel.session`, whose many sessions on
one device must share one queue depth and one pool (16 sessions: 64 threads,
not 721; "Shared I/O engine").  Which backend a reader starts, and its fallback
from the ring, are decided in one place for both: :mod:`engram.backends`.

"Per device" means the ``st_dev`` of the open table file, a partition mapped
to its whole disk (``/sys/dev/block``), since partitions share the disk's
queue.  A FUSE, overlay or tmpfs mount is a device of its own (its anonymous
``st_dev``).  A model whose tables lie on two devices gets two engines: each
table's prefill reads go through its own device's engine; a decode step's
batch of every table (a :class:`~engram.TableGroup`) is one batch and goes
through the engine of the first table's device (splitting a 48-row step across
two queues would add a second wait to every step).
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple, Union

from . import forks as _forks
from ._native import engine as _cengine
from .errors import ArgumentError

__all__ = ["IOEngine", "EngineClient", "EngineStats", "shared_engine", "device_key", "engines", "generation",
           "ENGINE_READERS", "ENGINE_MAX_JOBS", "RING_BATCH", "TABLE_ENGINE", "SESSION_ENGINE"]

#: Default queue depth of a device's engine: reads in flight for all its sessions together (and
#: the threads of its pool).  benchmarks/BENCHMARKS.md, storage engine: fio reaches the VM disk's
#: peak at depth 64 (16: 92% of it).
ENGINE_READERS = 64
#: Batches (chunks of a session's read) admitted at a time: the bound of the engine's queue.
ENGINE_MAX_JOBS = 256
#: ``backend="auto"``: batches of at most this many reads go on an io_uring ring, larger ones on
#: the engine's pread pool.  benchmarks/BENCHMARKS.md, "Shared I/O engine": a decode step (48
#: rows) is faster on the ring in every measurement; from 4,800 rows on the two are level on a
#: quiet machine and the pool is 1.3-1.9x faster when other processes load the cores.
RING_BATCH = 1024

#: The engine a table or group opened by itself reads through (``Table(engine=...)``): its own.
TABLE_ENGINE = "private"
#: The engine a model's sessions read through (``EngramModel.open(engine=...)``): the device's, shared.
SESSION_ENGINE = "shared"

#: Most readers (queue depth) an engine may be given.
MAX_ENGINE_READERS = 4096


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of an engine's counters.

    Attributes
    ----------
    device : int or None
        The device key (``st_dev``) of a shared engine; None for a standalone one.
    running : bool
        The native engine is started (it has clients).
    readers : int
        Queue depth: reads in flight in all.
    threads : int
        Pool threads running (0 until a batch needs the pool).
    rings : int
        io_uring rings in the cache (each used by one submitting thread at a time).
    clients : int
        Clients holding the engine (sessions, standalone tables and groups).
    active_clients : int
        Clients with a batch in progress now.
    jobs : int
        Batches admitted now; ``waiting``: submitters waiting for a place in the queue.
    issued : int
        Reads granted since the engine started.
    ring_jobs, pool_jobs : int
        Batches read on a ring and on the pool since the engine started.
    """

    device: Optional[int]
    running: bool
    readers: int
    threads: int = 0
    rings: int = 0
    clients: int = 0
    active_clients: int = 0
    jobs: int = 0
    waiting: int = 0
    issued: int = 0
    ring_jobs: int = 0
    pool_jobs: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _positive(name: str, v, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
        raise ArgumentError(f"{name} must be an integer in [1, {hi}], got {v!r}")
    return int(v)


# ------------------------------------------------------------------ fork
class _Process:
    """The process's registry of shared engines, and its fork generation."""

    def __init__(self):
        self.lock = threading.Lock()
        self.generation = 0
        self.engines: Dict[int, "IOEngine"] = {}
        self.all: "set[IOEngine]" = set()  # every engine with a running native part


_PROC = _Process()


def _before_fork() -> None:
    _PROC.lock.acquire()
    for e in list(_PROC.all):
        if e._native is not None:
            e._native.fork_prepare()


def _after_fork_parent() -> None:
    for e in list(_PROC.all):
        if e._native is not None:
            e._native.fork_parent()
    _PROC.lock.release()


def _after_fork_child() -> None:
    for e in list(_PROC.all):
        if e._native is not None:
            e._native.fork_child()  # abandoned: its threads do not exist here, its rings are the parent's
        e._native = None
        e._clients = 0
    _PROC.all = set()
    _PROC.generation += 1
    _PROC.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                        after_in_child=_after_fork_child)


# ------------------------------------------------------------------ engines and clients
class IOEngine:
    """An I/O engine: one queue depth shared by its clients, fair between them.

    :func:`shared_engine` gives the process's engine of a device; an engine
    made directly is standalone (for tests and benchmarks that want their own
    queue depth).  Its native part (pool threads, rings) starts with its first
    client and stops when the last client is released.

    Parameters
    ----------
    readers : int
        Queue depth (reads in flight in all) and the pool's threads.
    max_jobs : int
        Batches admitted at a time (the bounded queue).
    ring_batch : int
        ``auto`` batches of at most this many reads go on a ring, larger on the pool.

    Raises
    ------
    ArgumentError
        A parameter out of range.
    """

    def __init__(self, readers: int = ENGINE_READERS, *, max_jobs: int = ENGINE_MAX_JOBS,
                 ring_batch: int = RING_BATCH, device: Optional[int] = None):
        self._readers = _positive("readers", readers, MAX_ENGINE_READERS)
        self.max_jobs = _positive("max_jobs", max_jobs, 1 << 20)
        if isinstance(ring_batch, bool) or not isinstance(ring_batch, int) or ring_batch < 0:
            raise ArgumentError(f"ring_batch must be an integer >= 0, got {ring_batch!r}")
        self.ring_batch = int(ring_batch)
        self.device = device
        self._native: Optional[_cengine.Engine] = None
        self._clients = 0

    # -------------------------------------------------------------- clients
    def client(self, readers: int = 1) -> "EngineClient":
        """A new client (one session): holds the engine running until :meth:`EngineClient.close`.

        ``readers``: the client's batch depth; the engine's queue depth is raised to it if lower.
        """
        readers = _positive("readers", readers, MAX_ENGINE_READERS)
        with _PROC.lock:
            native = self._start(readers)
            return EngineClient(self, native, _cengine.Client(native), _PROC.generation, readers)

    def _start(self, readers: int) -> "_cengine.Engine":
        """The running native engine, started if needed, with one more client (lock held)."""
        self._readers = max(self._readers, readers)
        if self._native is None:
            self._native = _cengine.Engine(self._readers, self.max_jobs, self.ring_batch)
            _PROC.all.add(self)
        else:
            self._native.grow(self._readers)
        self._clients += 1
        return self._native

    def _grow(self, readers: int) -> None:
        """Raise the queue depth to ``readers`` (never lowered while the engine object lives)."""
        with _PROC.lock:
            if readers > self._readers:
                self._readers = readers
                if self._native is not None:
                    self._native.grow(readers)

    def _release(self) -> None:
        """One client fewer; the native engine stops with the last (threads joined outside the lock)."""
        with _PROC.lock:
            self._clients -= 1
            if self._clients > 0 or self._native is None:
                return
            native, self._native = self._native, None
            _PROC.all.discard(self)
        native.close()

    # -------------------------------------------------------------- state
    @property
    def readers(self) -> int:
        """Queue depth: reads in flight in all."""
        return self._readers

    @property
    def running(self) -> bool:
        """The native engine is started (some client holds it)."""
        return self._native is not None

    def stats(self) -> EngineStats:
        """A snapshot of the counters (see :class:`EngineStats`)."""
        with _PROC.lock:
            native, clients = self._native, self._clients
        try:
            s = native.stats() if native is not None else None
        except ValueError:  # stopped meanwhile
            s = None
        if s is None:
            return EngineStats(self.device, False, self._readers)
        return EngineStats(self.device, True, s["readers"], s["threads"], s["rings"], clients, s["active_clients"],
                           s["jobs"], s["waiting"], s["issued"], s["ring_jobs"], s["pool_jobs"])

    def __repr__(self) -> str:
        where = f"device {os.major(self.device)}:{os.minor(self.device)}" if self.device is not None else "standalone"
        return f"IOEngine({where}, readers={self._readers}, running={self.running})"


class EngineClient:
    """A client of an :class:`IOEngine`: one session's membership (its fair share is counted
    together), shared by the session's tables and group.

    Reference counted: the creator holds one reference (:meth:`close` drops it),
    each table or group reading through the client holds another
    (:meth:`retain` / :meth:`close`); the engine is released with the last.
    Thread-safe.
    """

    def __init__(self, engine: IOEngine, native, client, generation: int, readers: int):
        self.engine = engine
        self.readers = readers
        self._native = native
        self._client = client
        self._generation = generation
        self._refs = 1
        self._lock = threading.Lock()
        _forks.track(self)

    def _after_fork_child(self) -> None:
        """In a child after fork(): the lock may be held by a thread of the parent (engram.forks)."""
        self._lock = threading.Lock()

    def retain(self, readers: Optional[int] = None) -> "EngineClient":
        """One more user of this client (whose batches have ``readers`` in flight; the engine's
        queue depth is raised to it if lower); returns the client.

        Raises
        ------
        ArgumentError
            The client is closed.
        """
        with self._lock:
            if self._refs <= 0:
                raise ArgumentError("the engine client is closed")
            self._refs += 1
        if readers is not None:
            self.engine._grow(_positive("readers", readers, MAX_ENGINE_READERS))
        return self

    def close(self) -> None:
        """Drop one reference; the last releases the engine (idempotent past zero)."""
        with self._lock:
            if self._refs <= 0:
                return
            self._refs -= 1
            last = self._refs == 0
        if last and self._generation == _PROC.generation:
            self.engine._release()

    @property
    def closed(self) -> bool:
        return self._refs <= 0

    @property
    def generation(self) -> int:
        """The process generation (incremented in a child after fork) the client was started in."""
        return self._generation

    def native(self) -> Tuple["_cengine.Engine", "_cengine.Client"]:
        """The native engine and client to read through in this process: after ``fork()`` a
        new engine started here (the parent's is never touched)."""
        with self._lock:
            if self._generation != _PROC.generation:
                with _PROC.lock:
                    native = self.engine._start(self.readers)
                self._native, self._client = native, _cengine.Client(native)
                self._generation = _PROC.generation
            return self._native, self._client

    @property
    def reads(self) -> int:
        """Reads the engine granted to this client's batches."""
        return int(self._client.reads)

    def __repr__(self) -> str:
        return f"EngineClient({self.engine!r}, refs={self._refs})"


# ------------------------------------------------------------------ the per-device registry
def device_key(fd: int) -> int:
    """The device an open file's reads queue on: its ``st_dev``, a partition mapped to its disk.

    Raises
    ------
    OSError
        ``fstat`` fails.
    """
    dev = os.fstat(fd).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    try:
        if os.path.exists(f"{base}/partition"):
            with open(os.path.join(os.path.realpath(base), os.pardir, "dev")) as f:
                maj, mnr = f.read().strip().split(":")
            return os.makedev(int(maj), int(mnr))
    except (OSError, ValueError):
        pass
    return dev


def shared_engine(where: Union[int, str, os.PathLike], readers: Optional[int] = None) -> IOEngine:
    """The process's engine of the device holding ``where`` (an open descriptor, or a path).

    ``readers``: the queue depth if the engine is made now (default
    :data:`ENGINE_READERS`); a running engine keeps its depth, raised to
    ``readers`` if lower.

    Raises
    ------
    OSError
        ``where`` cannot be examined.
    ArgumentError
        ``readers`` out of range.
    """
    if isinstance(where, int) and not isinstance(where, bool):
        dev = device_key(where)
    else:
        fd = os.open(os.fspath(where), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            dev = device_key(fd)
        finally:
            os.close(fd)
    want = ENGINE_READERS if readers is None else _positive("readers", readers, MAX_ENGINE_READERS)
    with _PROC.lock:
        e = _PROC.engines.get(dev)
        if e is None:
            e = _PROC.engines[dev] = IOEngine(want, device=dev)
            return e
    e._grow(want)
    return e


def generation() -> int:
    """This process's fork generation: 0, incremented in a child after each ``fork()``."""
    return _PROC.generation


def engines() -> Dict[int, IOEngine]:
    """The shared engines of this process, by device key (running or not)."""
    with _PROC.lock:
        return dict(_PROC.engines)
