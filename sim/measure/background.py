"""The background load of a shared machine while we measure, and measuring only when it is quiet.

:class:`Background` samples what other processes do (CPU share, hypervisor
steal, disk requests on the model's device); :class:`QuietGuard` runs a
measurement task after waiting for a quiet machine and redoes one that
others disturbed, within a budget of waiting.  Every record of a
measurement carries the background it ran in.
"""

from __future__ import annotations

import os
import time
from typing import Callable, List, Optional, Tuple, Union

__all__ = ["Background", "QuietGuard", "is_quiet"]


def _proc_cpu() -> Optional[tuple]:
    """(busy, steal, total) jiffies of all CPUs from ``/proc/stat`` (busy = user + nice + system)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = v[7] if len(v) > 7 else 0
    return v[0] + v[1] + v[2], steal, sum(v[:8])


def _proc_disk(dev: Optional[tuple]) -> Optional[tuple]:
    """(reads, writes) completed on block device ``(major, minor)`` from ``/proc/diskstats``."""
    if dev is None:
        return None
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if len(p) > 7 and int(p[0]) == dev[0] and int(p[1]) == dev[1]:
                    return int(p[3]), int(p[7])
    except (OSError, ValueError):
        pass
    return None


def others_share(busy: float, mine: float, seconds: float, ncpu: int) -> float:
    """The share of all ``ncpu`` CPUs that others kept busy over ``seconds`` of wall time: ``busy`` CPU-seconds of
    the whole machine (``/proc/stat``, counted in clock ticks) less ``mine`` of this process (``os.times``), in
    [0, 1].  The two counters and the wall clock are read at slightly different instants and the ticks are
    10 ms coarse, so over a short window the raw quotient can fall below 0 or pass 1 on a saturated machine:
    it is held to the range a share has."""
    return min(1.0, max(0.0, busy - mine) / (seconds * ncpu))


class Background:
    """What other processes do to the machine while we measure: their CPU use and disk requests.

    ``start()`` then ``stop(our_reads)`` over a stretch of time gives
    ``{"cpu": share of all CPUs busy outside this process (user + system),
    "steal": share stolen by the hypervisor, "disk_iops": reads and writes per
    second on the model file's device beyond ``our_reads``, "seconds"}``.
    Our own CPU time (every thread, and child processes such as fio) comes
    from :func:`os.times`; kernel work done for our reads that is not charged
    to us (interrupts) is excluded by counting only user + nice + system.

    Parameters
    ----------
    path : path
        A file on the device to watch (the model file).
    """

    def __init__(self, path: Union[str, os.PathLike]):
        try:
            st = os.stat(path)
            self.dev = (os.major(st.st_dev), os.minor(st.st_dev))
        except OSError:
            self.dev = None
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.ncpu = os.cpu_count() or 1
        self._s = None

    def start(self) -> None:
        t = os.times()
        self._s = (time.perf_counter(), _proc_cpu(), t.user + t.system + t.children_user + t.children_system,
                   _proc_disk(self.dev))

    def stop(self, our_reads: Optional[int] = None) -> dict:
        t1 = time.perf_counter()
        t = os.times()
        mine1 = t.user + t.system + t.children_user + t.children_system
        cpu1, disk1 = _proc_cpu(), _proc_disk(self.dev)
        t0, cpu0, mine0, disk0 = self._s
        dt = max(t1 - t0, 1e-6)
        out = {"seconds": dt, "cpu": None, "steal": None, "disk_iops": None}
        if cpu0 and cpu1:
            busy = (cpu1[0] - cpu0[0]) / self.hz
            out["cpu"] = others_share(busy, mine1 - mine0, dt, self.ncpu)
            total = max(cpu1[2] - cpu0[2], 1)
            out["steal"] = (cpu1[1] - cpu0[1]) / total
        if disk0 and disk1:
            n = (disk1[0] - disk0[0]) + (disk1[1] - disk0[1]) - (our_reads or 0)
            out["disk_iops"] = max(0.0, n) / dt
        return out

    def sample(self, seconds: float = 0.5) -> dict:
        """Background over the next ``seconds`` (this process idle)."""
        self.start()
        time.sleep(seconds)
        return self.stop(0)


def is_quiet(bg: Optional[dict], max_cpu: float, max_iops: float) -> bool:
    """True when the background load ``bg`` (of :meth:`Background.stop`) is within ``max_cpu`` (share of all
    CPUs) and ``max_iops`` (disk requests a second); a missing figure counts as quiet."""
    if not bg:
        return True
    return (bg["cpu"] is None or bg["cpu"] <= max_cpu) and (bg["disk_iops"] is None or bg["disk_iops"] <= max_iops)


class QuietGuard:
    """Runs measurement tasks while watching the machine, redoing those that other processes disturbed.

    Parameters
    ----------
    path : path
        A file on the device to watch (the model file).
    max_cpu : float or None
        Share of all CPUs other processes may use (e.g. 0.25); ``None``
        never waits or redoes (the background is still recorded).
    max_iops : float
        Disk requests a second by others on the device tolerated.
    quiet_wait : float
        Seconds to wait for a quiet machine before one task (sampling 0.5 s at a time).
    redo : int
        Times a disturbed task is run again.
    budget : float
        Seconds of waiting in all; after that every task runs once, regardless.
    on_wait : callable, optional
        Called while waiting (to say so on a progress bar).
    """

    def __init__(self, path: Union[str, os.PathLike], max_cpu: Optional[float] = None, max_iops: float = 1000.0,
                 quiet_wait: float = 20.0, redo: int = 1, budget: float = 120.0,
                 on_wait: Optional[Callable[[], None]] = None):
        self.background = Background(path)
        self.max_cpu, self.max_iops, self.quiet_wait, self.redo = max_cpu, max_iops, quiet_wait, redo
        self.deadline = time.perf_counter() + budget
        self.on_wait = on_wait or (lambda: None)
        #: Seconds spent waiting for a quiet machine so far.
        self.waited = 0.0

    @property
    def guarding(self) -> bool:
        return self.max_cpu is not None

    def _quiet(self, bg: Optional[dict]) -> bool:
        return is_quiet(bg, self.max_cpu, self.max_iops)

    def _wait_quiet(self) -> None:
        t0 = time.perf_counter()
        t_end = min(t0 + self.quiet_wait, self.deadline)
        while time.perf_counter() < t_end:
            if self._quiet(self.background.sample(0.5)):
                break
            self.on_wait()
        self.waited += time.perf_counter() - t0

    def run(self, task: Callable[[], Tuple[List[dict], Optional[int]]]) -> List[dict]:
        """Run ``task`` (returning its records and our own device requests, or ``None`` when unknown) and
        return its records, each with ``"background"``: the load of others while it ran and the ``attempt``.
        """
        for attempt in range(self.redo + 1):
            if self.guarding:
                self._wait_quiet()
            self.background.start()
            recs, ours = task()
            got = self.background.stop(ours)
            if ours is None:
                got["disk_iops"] = None
            got["attempt"] = attempt
            for x in recs:
                x["background"] = got
            if not self.guarding or self._quiet(got) or attempt == self.redo or time.perf_counter() > self.deadline:
                return recs
        return []  # pragma: no cover - the loop always returns
