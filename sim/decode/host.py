"""The host's CPUs as the sessions of one machine share them: a closed queueing network solved by mean-value
analysis.

A device model (a datasheet string, fio's JSON) describes the drive, not the host that drives it.  Each decode
step also takes CPU on the host: the engine's own work (hash, decode, the readers' hand-offs, the session's
Python: ``step_cpu_s``) and each row read's system call and completion (``read_cpu_s``, fio's ``usr_cpu +
sys_cpu`` per read at QD1: :func:`sim.device.fio.cpu_per_read`), plus a ``spin`` compute.  With many sessions
those demands queue for the host's ``cpus``; the drive alone never shows it.

The model (Lazowska et al., *Quantitative System Performance*, ch. 6 and 8): ``N`` sessions cycle between a
delay station (the step's time with the CPUs free: the stated compute and the reads' wait, less the CPU part
of it) and a station of ``cpus`` servers holding each step's CPU demand ``D``; the multi-server station is
Seidmann's approximation (one server of demand ``D / cpus`` plus a delay of ``D (cpus - 1) / cpus``), solved
exactly by mean-value analysis over ``1..N`` sessions.  One session pays ``D`` without queueing; many approach
the bound ``cpus / D`` steps a second in all.  Seidmann's approximation overstates the queue where the sessions
are about as many as the CPUs and each step is mostly CPU (4 sessions on 4 CPUs, a step all CPU: +26%); a
decode step is mostly the reads' wait and the compute, where it holds.

A read from a memory-backed device (tmpfs, the page cache) is a copy in the reader's thread: its CPU is the
profile's ``memory_read_cpu_us``, the engine's pread from a copy of the model on tmpfs with its readers kept
busy (as where the host binds), not fio's figure there, which is mostly fio's own and its engine's (io_uring
hands each read to a worker thread on tmpfs: 13.5 us a read on an idle 2-core VM where the engine's pread
takes about 4).  On a host, such a device's reads are those copies (:meth:`HostCPU.copy_reads`), not the
latencies fio or a datasheet describe it by.

Sessions as processes (``sessions="processes"``: each its own engine and pool of readers) take more CPU a
step than the same sessions as threads of one process, which share one engine whose busy readers take the
next read without sleeping: the profile's ``process_cpu_ratio`` (``benchmarks/bench_host.py --modes-only``,
with the CPUs busy, where the host binds) scales the step's and each read's CPU.  With the CPUs mostly idle the
two differ less, and the CPU does not set the step there.  On a memory-backed device too: 32 sessions on tmpfs
took 1.19x (the median of 22 rounds, 0.83-1.60), the disk's 1.28 within their scatter.

The engine's own CPU a step is not in a device's description: the figure shipped in
``sim/data/hosts/engine-cpu.json`` (:func:`engine_profile`) was measured by ``benchmarks/bench_host.py`` on
the machine it names, and a planner's host differs from it by its CPU's speed.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Mapping, Optional

from engram._checks import setting_number
from engram.errors import ArgumentError, FormatError
from sim.core.io import packaged_data_path, read_text
from sim.core.limits import MAX_QUEUE_DEPTH
from sim.device.models import ParametricSSD

__all__ = ["ENGINE_PROFILE", "MAX_COPY_LANES", "MAX_CPUS", "MAX_STEP_CPU_S", "MIN_CPUS", "PROCESS_RATIO_RANGE",
           "SESSIONS", "HostCPU", "check_profile", "engine_profile", "memory_lanes", "process_scale"]

#: The engine's CPU profile in the package data (``sim/data/``): written by ``benchmarks/bench_host.py``.
ENGINE_PROFILE = "hosts/engine-cpu.json"


#: The most sessions :meth:`HostCPU.sessions_within` looks through (a capacity search's bound, sim.core.limits).
MAX_SESSIONS_WITHIN = 1 << 20

#: The CPUs a host may have (a hundredth of one to 65,536) and the longest CPU time a step may ask for, seconds:
#: beyond them the figures are typing errors, and the queue's arithmetic would overflow.
MIN_CPUS, MAX_CPUS, MAX_STEP_CPU_S = 0.01, 65536.0, 60.0
#: The most copies a memory-backed device serves at once (:meth:`HostCPU.copy_reads`): the deepest queue a device
#: model takes (:data:`sim.core.limits.MAX_QUEUE_DEPTH`).
MAX_COPY_LANES = MAX_QUEUE_DEPTH


#: How the sessions run on the host: threads of one process (one engine a device) or processes (one each).
SESSIONS = ("threads", "processes")
#: The range a profile's ``process_cpu_ratio`` may take (both ends allowed): beyond it a figure is a typing error.
PROCESS_RATIO_RANGE = (0.1, 10.0)


def process_scale(profile: Mapping, sessions: str) -> tuple:
    """``(factor, what it says)``: the CPU a step and a read of ``sessions`` (:data:`SESSIONS`) over the profile's
    figures, which are threads' -- the profile's ``process_cpu_ratio`` for processes (1 where the profile has
    none: said so), 1 and "" for threads; on any device (32 sessions on the 2-core VM, the CPUs busy: 1.28 on
    its disk, the profile's; 1.19 on tmpfs, the median of 22 rounds from 0.83 to 1.60).

    Raises
    ------
    ArgumentError
        ``sessions`` not one of :data:`SESSIONS`; the profile not a mapping, or its ratio not a number in
        :data:`PROCESS_RATIO_RANGE` (names ``process_cpu_ratio``).
    """
    if sessions not in SESSIONS:
        raise ArgumentError(f"sessions = {sessions!r:.40}: expected one of {', '.join(SESSIONS)}")
    if sessions == "threads":
        return 1.0, ""
    if not isinstance(profile, Mapping):
        raise ArgumentError(f"the engine's CPU profile = {profile!r:.40}: expected a mapping")
    r = profile.get("process_cpu_ratio")
    if r is None:
        return 1.0, "sessions as processes, taken as threads (the profile has no process_cpu_ratio)"
    r = setting_number("process_cpu_ratio", r, *PROCESS_RATIO_RANGE)
    return r, (f"sessions as processes: x {r:.2f} the CPU a step and a read (the profile's, "
               f"{profile.get('process_sessions', '?')} sessions as processes over threads)")


def _nonneg(name: str, v, high: Optional[float] = None, low: float = 0.0) -> float:
    """``v`` as a float in ``[low, high]`` (both ends allowed), else ArgumentError naming ``HostCPU.name`` and that
    range (:func:`engram._checks.setting_number`; -0.0 as 0.0)."""
    return setting_number(f"HostCPU.{name}", v, low, high) + 0.0


@dataclass(frozen=True)
class HostCPU:
    """A host's CPUs and what a decode step asks of them.

    Attributes
    ----------
    cpus : float
        CPUs the sessions and their readers run on (:data:`MIN_CPUS` to :data:`MAX_CPUS`, both allowed).
    step_cpu_s : float
        The engine's own CPU a step, seconds (0 to :data:`MAX_STEP_CPU_S`, as the other times): hash, decode,
        hand-offs to the readers.
    read_cpu_s : float
        CPU one row read takes on the host, seconds.
    spin_s : float
        Seconds of each step's compute that spin on these CPUs (>= 0; a ``spin:MS`` compute: a sleep or an
        accelerator's time takes none).
    source : str
        Where the figures came from (said in outputs).
    wake_s : float
        Seconds a step's reads take longer after the step's idle spell than back to back, with the CPUs idle
        (the engine's hand-offs to its readers, and theirs back, waking idle CPUs: the profile's ``wake_us``);
        a step pays it times the share of the CPUs idle (:meth:`step_time`).
    sessions : str
        How the sessions run, one of :data:`SESSIONS` (said in outputs; the figures above are already those of
        that way: :meth:`for_device`).

    Raises
    ------
    ArgumentError
        A figure that is not a finite number in range (names the field).
    """

    cpus: float
    step_cpu_s: float
    read_cpu_s: float
    spin_s: float = 0.0
    source: str = ""
    wake_s: float = 0.0
    sessions: str = "threads"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", _nonneg("cpus", self.cpus, low=MIN_CPUS, high=MAX_CPUS))
        for name in ("step_cpu_s", "read_cpu_s", "spin_s", "wake_s"):
            object.__setattr__(self, name, _nonneg(name, getattr(self, name), high=MAX_STEP_CPU_S))
        if not isinstance(self.source, str):
            raise ArgumentError(f"HostCPU.source = {self.source!r:.40}: expected a string")
        if self.sessions not in SESSIONS:
            raise ArgumentError(f"HostCPU.sessions = {self.sessions!r:.40}: expected one of {', '.join(SESSIONS)}")

    def demand(self, rows_per_step: float) -> float:
        """CPU seconds one step asks of the host: the engine's own, its ``rows_per_step`` reads' and the
        compute's spin."""
        d = self.step_cpu_s + _nonneg("rows_per_step", rows_per_step) * self.read_cpu_s + self.spin_s
        if not d <= MAX_STEP_CPU_S:
            raise ArgumentError(f"the host ({self.source or 'as given'}): a step of {rows_per_step:g} reads asks "
                                f"for {d:g} s of CPU ({self.step_cpu_s:g} s a step + {self.read_cpu_s:g} s a read"
                                f"{f' + {self.spin_s:g} s of spin' if self.spin_s else ''}), more than "
                                f"{MAX_STEP_CPU_S:g} s: a figure is off (--host-step-us, --host-read-us or fio's "
                                "CPU a read)")
        return d

    def step_time(self, sessions: int, free_step_s: float, rows_per_step: float) -> float:
        """The mean step of each of ``sessions`` sessions on this host, seconds.

        Parameters
        ----------
        sessions : int
            Sessions sharing the host (>= 1).
        free_step_s : float
            The mean step with the CPUs free and without the engine's own CPU: what a device model predicts
            (the stated compute, the reads' wait).  The reads' CPU and a spin lie inside it: they are not added
            again, they queue.
        rows_per_step : float
            Rows read a step (after deduplication and a row cache's hits).

        Returns
        -------
        float
            ``free_step_s + step_cpu_s`` for one session (+ ``wake_s`` times the CPUs' idle share
            ``1 - sessions x demand / (step x cpus)`` at the queued step, where there are rows to read); more as
            the CPUs saturate.

        Raises
        ------
        ArgumentError
            ``sessions`` not a whole number >= 1, a time or row count negative or not finite.
        """
        if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
            raise ArgumentError(f"HostCPU.step_time: sessions = {sessions!r:.40}: expected a whole number >= 1")
        for n, step in self._steps(free_step_s, rows_per_step):
            if n == sessions:
                return step
        raise AssertionError("unreachable")  # pragma: no cover - the steps go on for ever

    def sessions_within(self, step_s: float, free_step_s: float, rows_per_step: float, most: int) -> int:
        """The most sessions, up to ``most``, whose mean step on this host (:meth:`step_time`, each step ``free_step_s``
        with the CPUs free and ``rows_per_step`` reads) is at most ``step_s`` seconds: 0 where one session's is
        longer.  A capacity search's first guess where the host binds (:func:`sim.sweep.capacity.bracket_opening`).

        Parameters
        ----------
        step_s : float
            The longest mean step allowed, seconds (>= 0).
        free_step_s, rows_per_step : float
            As :meth:`step_time`.
        most : int
            The most sessions looked through (1 to :data:`MAX_SESSIONS_WITHIN`).

        Returns
        -------
        int
            Sessions, 0 to ``most``.

        Raises
        ------
        ArgumentError
            ``step_s`` negative or not finite, ``most`` not a whole number in range, else as :meth:`step_time`.
        """
        step_s = _nonneg("step_s", step_s)
        if isinstance(most, bool) or not isinstance(most, numbers.Integral) or not 1 <= most <= MAX_SESSIONS_WITHIN:
            raise ArgumentError(f"HostCPU.sessions_within: most = {most!r:.40}: expected a whole number in "
                                f"[1, {MAX_SESSIONS_WITHIN}]")
        fit = 0
        for n, step in self._steps(free_step_s, rows_per_step):
            if n > most or step > step_s:
                return fit
            fit = n
        return fit  # pragma: no cover - the steps go on for ever

    def _steps(self, free_step_s: float, rows_per_step: float):
        """``(n, the mean step of n sessions)`` for n = 1, 2, ... (without end): exact mean-value analysis of the
        closed network of :meth:`step_time`, plus the wake-up times the CPUs' idle share at that step (none with
        no rows: no reader to wake)."""
        free = _nonneg("free_step_s", free_step_s)
        d = self.demand(rows_per_step)
        wake = self.wake_s if rows_per_step > 0 else 0.0
        for n, step in self._queued(free, d):
            if wake > 0:  # fades as the CPUs get busy: many sessions queue, and no CPU is left idle to wake
                step += wake * (max(0.0, 1.0 - n * d / (step * self.cpus)) if step > 0 else 1.0)
            yield n, step

    def _queued(self, free: float, d: float):
        """``(n, the mean step of n sessions)`` of a step of ``free`` seconds with the CPUs free and ``d`` of CPU:
        the mean-value analysis (:meth:`step_time`), n = 1, 2, ... without end."""
        z = max(0.0, free + self.step_cpu_s - d)  # the part of the step that holds no CPU
        dq, dd = d / self.cpus, d * max(0.0, self.cpus - 1.0) / self.cpus
        if self.cpus < 1.0:  # a fraction of one CPU: one slow server
            dq, dd = d / self.cpus, 0.0
        n = 0
        if z + dd + dq <= 0:  # nothing to wait for and no CPU asked
            while True:
                n += 1
                yield n, free + self.step_cpu_s
        q = 0.0
        while True:
            n += 1
            r = dq * (1.0 + q)
            x = n / (z + dd + r)
            q = x * r
            yield n, n / x

    def readers_wait(self, readers: int, rows: float, read_s: float) -> float:
        """Seconds a step's ``rows`` reads take longer when its ``readers`` pread threads share the host's CPUs.

        A device model gives the reads' wait as if each reader had a CPU of its own: ``rows / readers`` reads
        one after another, each ``read_s`` (the device's mean at that depth, its CPU part inside).  Each read
        holds a CPU for ``read_cpu_s`` of it; with more readers than CPUs they queue for them within the step.
        The readers are the finite population of the machine-repairman model (Lazowska et al., *Quantitative
        System Performance*, ch. 8): ``readers`` customers cycling between ``cpus`` servers of ``read_cpu_s`` and
        a delay of ``read_s - read_cpu_s``; its exact throughput ``X`` gives the reads' time ``rows / X``
        against ``rows x read_s / readers`` with the CPUs free.  Measured on the 2-core VM's disk (fio's QD1
        round trip 52.5 us, 24 us of it CPU): 48 rows through 4 readers took 857-943 us back to back against
        the 636 us of the drive's figures; the model gives 754 us.

        Parameters
        ----------
        readers : int
            The session's pread readers (>= 1); at most ``ceil(rows)`` are busy.
        rows : float
            Rows read a step (>= 0).
        read_s : float
            One read's mean time with a CPU free, seconds (>= 0).

        Returns
        -------
        float
            The added seconds, >= 0 (0 with no more busy readers than CPUs, or no CPU a read).

        Raises
        ------
        ArgumentError
            ``readers`` not a whole number >= 1, ``rows`` or ``read_s`` negative or not finite.
        """
        if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
            raise ArgumentError(f"HostCPU.readers_wait: readers = {readers!r:.40}: expected a whole number >= 1")
        rows = _nonneg("rows", rows, high=1e12)
        read = _nonneg("read_s", read_s, high=MAX_STEP_CPU_S)
        busy = min(readers, max(1, math.ceil(rows)))
        c = min(self.read_cpu_s, read) if read > 0 else self.read_cpu_s
        # whole CPUs: a fraction of one is a slow server in the sessions' queue (step_time), counted there
        servers = max(1.0, self.cpus)
        if rows == 0 or c == 0 or busy <= servers:
            return 0.0
        think = max(0.0, read - c)
        # p[k]: the chance k readers are at the CPUs (birth rate (busy - k) / think, death min(k, cpus) / c)
        p, total, x = 1.0, 1.0, 0.0
        if think == 0.0:  # all CPU: every reader waits for a CPU
            x = min(busy, servers) / c
        else:
            for k in range(1, busy + 1):
                p *= (busy - k + 1) / think * c / min(k, servers)
                total += p
                x += p * min(k, servers) / c
                if p > 1e200:  # rescale: only the ratio x / total counts
                    p, total, x = p * 1e-200, total * 1e-200, x * 1e-200
            x /= total
        free = rows * max(read, c) / busy
        if not x > 0 or not math.isfinite(x):  # the chain's weights underflowed (a vanishing CPU a read)
            return 0.0
        return max(0.0, rows / x - free)

    @classmethod
    def for_device(cls, cpus: float, device=None, *, step_cpu_us: Optional[float] = None,
                   read_cpu_us: Optional[float] = None, spin_s: float = 0.0,
                   profile: Optional[Mapping] = None, wake_us: Optional[float] = None,
                   sessions: str = "threads") -> "HostCPU":
        """A host of ``cpus`` CPUs reading from ``device`` (a :class:`sim.device.Device` or None), its figures as
        a planner has them: the engine's CPU a step ``step_cpu_us`` (default the shipped profile's,
        :func:`engine_profile`), a read's CPU ``read_cpu_us`` (default: for a memory-backed device,
        ``derived["memory_backed"]``, the profile's ``memory_read_cpu_us``, the engine's pread from tmpfs -- fio's
        own CPU a read there is mostly fio's and its engine's, not a copy's; else the device's fio CPU per read,
        ``derived["cpu_per_read_us"]``, scaled by the profile's engine-to-fio ratio; else the profile's own,
        or 0 for a memory-backed device without either figure: the profile's is a drive's read path); a step's
        wake-up ``wake_us`` (default the profile's ``wake_us``, measured on a drive; none on a memory-backed
        device, whose readers copy without sleeping on a device, and none where the profile has no figure);
        ``sessions="processes"``: the step's and each read's CPU (given or not) times the profile's
        ``process_cpu_ratio`` (:func:`process_scale`), on any device.  ``source`` says which.

        Raises
        ------
        ArgumentError
            A figure out of range (as :class:`HostCPU`), ``cpus`` first; ``sessions`` not one of :data:`SESSIONS`.
        FormatError
            The profile cannot be read or is not one (:func:`engine_profile`, :func:`check_profile`).
        """
        cpus = _nonneg("cpus", cpus, low=MIN_CPUS, high=MAX_CPUS)
        p = engine_profile() if profile is None else check_profile(profile, "profile")
        step = float(p["step_cpu_us"]) if step_cpu_us is None else _nonneg("step_cpu_us", step_cpu_us)
        said = [f"{cpus:g} CPU{'' if cpus == 1 else 's'}", f"the engine's {step:.4g} us a step" +
                (" (given)" if step_cpu_us is not None else f" (its profile, {(p.get('machine') or {}).get('cpu', '?')})")]
        derived = getattr(device, "derived", None) or {}
        ratio = float(p.get("read_cpu_ratio") or 1.0)
        if read_cpu_us is not None:
            read = _nonneg("read_cpu_us", read_cpu_us)
            said.append(f"{read:.1f} us a read (given)")
        elif "memory_backed" in derived and p.get("memory_read_cpu_us") is not None:
            read = float(p["memory_read_cpu_us"])
            said.append(f"{read:.1f} us a read (the profile's pread from tmpfs: a memory-backed device)")
        elif (derived.get("cpu_per_read_us") or {}).get("value") is not None:
            fio = float(derived["cpu_per_read_us"]["value"])
            read = fio * ratio
            said.append(f"{read:.1f} us a read (fio's {fio:.1f} x {ratio:.2f}, the engine's pread over fio's)")
        elif "memory_backed" in derived:
            read = 0.0
            said.append("a read's CPU left in the memory-backed device's own service (fio gave no CPU figure)")
        else:
            read = float(p["read_cpu_us"]) * ratio
            said.append(f"{read:.1f} us a read (the profile's fio {float(p['read_cpu_us']):.1f} x {ratio:.2f})")
        if wake_us is not None:
            wake = _nonneg("wake_us", wake_us)
            said.append(f"a step's wake-up {wake:.0f} us x the CPUs' idle share (given)")
        elif "memory_backed" in derived or p.get("wake_us") is None:
            wake = 0.0
        else:
            wake = float(p["wake_us"])
            said.append(f"a step's wake-up {wake:.0f} us x the CPUs' idle share (the profile's: its readers' batch "
                        "after the step's sleep over back to back)")
        scale, note = process_scale(p, sessions)
        if note:
            said.append(note)
        for what, us in (("the engine's CPU a step", step), ("a read's CPU", read)):
            if us * scale > MAX_STEP_CPU_S * 1e6:
                raise ArgumentError(f"the host: {what} {us:g} us x {scale:.3g} (sessions as processes: the profile's "
                                    f"process_cpu_ratio) = {us * scale:g} us, more than {MAX_STEP_CPU_S:g} s: a "
                                    "figure is off (--host-step-us, --host-read-us or fio's CPU a read)")
        return cls(cpus, step * scale * 1e-6, read * scale * 1e-6, spin_s, "; ".join(said), wake * 1e-6, sessions)

    def copy_reads(self, device):
        """``device`` where its reads are a drive's; where it is memory-backed (a ``memory_backed`` entry in its
        ``derived``: tmpfs, a page-cache hit) and this host states a read's CPU above 0, the device whose each
        read is that copy: a :class:`~sim.device.models.ParametricSSD` of ``read_cpu_s`` a read, fixed, on as many
        channels as the CPUs the copies run on (``memory_backed``'s value, rounded), its ``derived`` the
        ``memory_backed`` entry and a ``read_s`` rule.  A read's CPU of 0 says the device's own service holds it
        (:meth:`for_device` without a figure): the device is kept (:meth:`copies_text` says so).

        A copy in the reader's thread takes its CPU and nothing else.  fio's latency on tmpfs is its engine's
        hand-off to a worker thread (io_uring: 34-42 us at QD1 on a 2-core VM), where the engine's pread
        readers copy a 512-byte row in about 4 us: taken as the device's, it made every tmpfs run 5-8% too slow,
        one session to 32 (benchmarks/BENCHMARKS.md, "Reads from memory as copies").

        Raises
        ------
        ArgumentError
            ``memory_backed`` not an entry whose value is a finite number in [1, :data:`MAX_COPY_LANES`]
            (names it); the copies past a device's ranges (over 1e9 reads a second, a read over 1 s: names the
            host's CPU a read and the lanes).
        """
        lanes = memory_lanes(device)
        if lanes is None or self.read_cpu_s <= 0 or _is_copies(device, self.read_cpu_s):
            return device  # a drive, no CPU a read stated, or these copies already
        rule = (f"a memory copy in the reader's thread: {self.read_cpu_s * 1e6:.2f} us a read (the host's CPU a "
                f"read), fixed, {lanes} at once (the CPUs the copies run on); the latencies the device was described "
                "by are not a copy's")
        name = str(getattr(device, "name", "device")).removesuffix(" (copies)")
        try:
            return ParametricSSD(self.read_cpu_s, lanes / self.read_cpu_s, lanes, service_cv=0.0,
                                 name=f"{name} (copies)", source=rule,
                                 derived={"memory_backed": dict(device.derived["memory_backed"]),
                                          "read_s": {"value": self.read_cpu_s, "rule": rule}})
        except ArgumentError as exc:
            raise ArgumentError(f"the host's CPU a read, {self.read_cpu_s * 1e6:g} us (--host-read-us, or the "
                                f"profile's memory_read_cpu_us), as the copies of memory-backed {name}, {lanes} at "
                                f"once: {exc}") from None

    def copies_text(self, device) -> str:
        """What :meth:`copy_reads` does with ``device``'s reads, in words ("" for a drive): the copies' rule, or
        that a read's CPU of 0 leaves the device's own latencies."""
        if memory_lanes(device) is None:
            return ""
        if self.read_cpu_s <= 0:
            return ("the device's own latencies: the host states no CPU a read (0), so the memory-backed device's "
                    "own service holds it")
        return self.copy_reads(device).source

    def to_dict(self) -> dict:
        """JSON-ready: ``cpus``, ``step_cpu_us``, ``read_cpu_us``, ``spin_us``, ``wake_us``, ``sessions``,
        ``source``."""
        return {"cpus": self.cpus, "step_cpu_us": self.step_cpu_s * 1e6, "read_cpu_us": self.read_cpu_s * 1e6,
                "spin_us": self.spin_s * 1e6, "wake_us": self.wake_s * 1e6, "sessions": self.sessions,
                "source": self.source}


def memory_lanes(device) -> Optional[int]:
    """The CPUs a memory-backed device's copies run on (its ``derived["memory_backed"]`` value, rounded); None for
    a drive (no such entry, or no ``derived`` mapping).

    Raises
    ------
    ArgumentError
        The entry not a mapping whose ``value`` is a finite number in [1, :data:`MAX_COPY_LANES`] (names it).
    """
    derived = getattr(device, "derived", None)
    if not isinstance(derived, Mapping) or "memory_backed" not in derived:
        return None
    entry = derived["memory_backed"]
    v = entry.get("value") if isinstance(entry, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        v = None
    try:
        lanes = int(round(float(v))) if v is not None and 1 <= float(v) <= MAX_COPY_LANES else None
    except (OverflowError, ValueError):  # past a float's range; NaN
        lanes = None
    if lanes is None:
        raise ArgumentError(f"{getattr(device, 'name', 'device')}: derived.memory_backed = {entry!r:.60}: expected "
                            f'{{"value": the CPUs its copies run on, a number in [1, {MAX_COPY_LANES}], "rule": ...}}')
    return lanes


def _is_copies(device, read_s: float) -> bool:
    """Whether ``device`` is already :meth:`HostCPU.copy_reads`'s copies of ``read_s`` seconds a read."""
    return isinstance(device, ParametricSSD) and device.service_cv == 0 and device.qd1_latency == read_s and \
        isinstance(getattr(device, "derived", None), Mapping) and "read_s" in device.derived


def engine_profile(path: Optional[str] = None) -> Mapping:
    """The engine's CPU profile: ``{"step_cpu_us", "read_cpu_us", "machine", "date", "command", ...}`` from
    ``path`` (default: the package's :data:`ENGINE_PROFILE`).

    Raises
    ------
    FormatError
        The file cannot be read, is not JSON, or is not a profile (:func:`check_profile`; names the file and the
        key).
    ArgumentError
        ``path`` is not a path.
    """
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"engine_profile: path = {path!r:.40}: expected a file path or None")
    p = packaged_data_path(ENGINE_PROFILE) if path is None else path
    text = read_text(p, "engine CPU profile")  # FormatError: cannot be read, not UTF-8
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise FormatError(f"{p}: the engine's CPU profile is not JSON ({exc})") from None
    return check_profile(doc, str(p))


def check_profile(doc, where: str) -> Mapping:
    """``doc`` if it is an engine CPU profile (:func:`engine_profile`), else FormatError naming ``where`` and the
    key: ``step_cpu_us`` and ``read_cpu_us`` finite numbers in [0, 60 s], ``read_cpu_ratio`` (optional) one > 0,
    ``process_cpu_ratio`` (optional) one in :data:`PROCESS_RATIO_RANGE`, ``memory_read_cpu_us`` and ``wake_us``
    (optional) ones in [0, 60 s],
    ``machine`` (optional) an object."""
    if not isinstance(doc, Mapping):
        raise FormatError(f"{where}: the engine's CPU profile must be a JSON object, got {type(doc).__name__}")
    for k, need, positive in (("step_cpu_us", True, False), ("read_cpu_us", True, False),
                              ("read_cpu_ratio", False, True), ("memory_read_cpu_us", False, False),
                              ("wake_us", False, False), ("process_cpu_ratio", False, True)):
        if k in doc or need:
            try:
                if k == "process_cpu_ratio":
                    setting_number(k, doc.get(k), *PROCESS_RATIO_RANGE)
                else:
                    setting_number(k, doc.get(k), 0.0, MAX_STEP_CPU_S * 1e6, above=positive)
            except ArgumentError as exc:
                raise FormatError(f"{where}: {exc}" + ("" if positive else " (microseconds)")) from None
    if "machine" in doc and not isinstance(doc["machine"], Mapping):
        raise FormatError(f"{where}: machine = {doc['machine']!r:.40}: expected an object")
    return doc
