"""Whether a planned run reads past the end of its trace: sessions x steps over a trace of T steps.

The decode model (:mod:`sim.decode`) replays one trace for every session:
session ``i`` of ``S`` starts at step ``i * T // S`` (:func:`session_offsets`)
and reads ``steps`` consecutive steps, wrapping to step 0 past the end.  Two
things can then inflate a cache's hit rate without the text repeating itself:

- a session runs longer than the trace (``steps > T``): it **wraps**, and its
  second lap re-reads rows it read on the first, so its own row cache hits
  them (``replayed_steps`` of its steps are such replays);
- the sessions together read more steps than the trace holds
  (``sessions * steps > T``): they **overlap**, reading the same steps, so a
  row cache shared across sessions hits rows another session read.

:func:`wrap_info` (or :meth:`sim.trace.Trace.wraps`) says which, and by how
much, before anything is simulated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from engram.errors import ArgumentError

__all__ = ["WrapInfo", "session_offsets", "wrap_info"]


def session_offsets(trace_steps: int, sessions: int) -> np.ndarray:
    """int64 ``[sessions]``: the trace step each session starts at, ``i * trace_steps // sessions``.

    The rule of :func:`sim.decode.session_reads`: sessions start evenly spread
    over the trace so that, as long as the trace is long enough, they read
    different text.

    Raises
    ------
    ArgumentError
        ``trace_steps < 1`` or ``sessions < 1``.
    """
    if trace_steps < 1 or sessions < 1:
        raise ArgumentError(f"trace_steps and sessions must be >= 1, got {trace_steps} and {sessions}")
    return np.arange(sessions, dtype=np.int64) * int(trace_steps) // int(sessions)


@dataclass(frozen=True)
class WrapInfo:
    """How a run of ``sessions`` x ``steps`` covers a trace of ``trace_steps`` steps.

    Attributes
    ----------
    trace_steps, steps, sessions : int
        The trace length and the planned run (steps per session).
    laps : float
        ``steps / trace_steps``: passes of each session over the trace.
    replayed_steps : int
        Steps of each session that replay a step the same session already read,
        ``max(0, steps - trace_steps)``.
    covered_steps : int
        Distinct trace steps read by any session.
    shared_steps : int
        Reads of a step that some session (itself or another) had already read:
        ``sessions * steps - covered_steps``.
    """

    trace_steps: int
    steps: int
    sessions: int
    laps: float
    replayed_steps: int
    covered_steps: int
    shared_steps: int

    @property
    def wraps(self) -> bool:
        """A session reads past the end of the trace and replays its own steps (its row cache is inflated)."""
        return self.replayed_steps > 0

    @property
    def overlaps(self) -> bool:
        """Sessions read steps another session also reads (a row cache shared across sessions is inflated)."""
        return self.shared_steps > 0

    @property
    def replayed_fraction(self) -> float:
        """Share of every session's steps that replay its own earlier steps."""
        return self.replayed_steps / self.steps

    @property
    def shared_fraction(self) -> float:
        """Share of all reads of steps that were already read by some session."""
        return self.shared_steps / (self.sessions * self.steps)

    def warning(self) -> Optional[str]:
        """A one-line warning when the run wraps or its sessions overlap, else ``None``."""
        run = f"{self.sessions} session(s) x {self.steps} steps on a trace of {self.trace_steps} steps"
        if self.wraps:
            return (f"{run}: each session wraps ({self.laps:.2f} laps); {self.replayed_steps} of its "
                    f"{self.steps} steps ({self.replayed_fraction:.1%}) replay steps it already read, so a row "
                    f"cache hits rows the text does not repeat; use a trace of >= {self.steps} steps")
        if self.overlaps:
            return (f"{run}: sessions read {self.shared_steps} steps ({self.shared_fraction:.1%}) that another "
                    f"session also reads; a row cache shared across sessions sees those as hits; use a trace "
                    f"of >= {self.sessions * self.steps} steps for sessions of distinct text")
        return None

    def summary(self) -> str:
        """One line: the run, and whether it wraps or overlaps."""
        if self.warning():
            return self.warning()
        distinct = ", sessions read distinct steps" if self.sessions > 1 else ""
        return (f"{self.sessions} session(s) x {self.steps} steps on a trace of {self.trace_steps} steps: "
                f"no wrap{distinct}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(wraps=self.wraps, overlaps=self.overlaps, replayed_fraction=self.replayed_fraction,
                 shared_fraction=self.shared_fraction, warning=self.warning())
        return d


def wrap_info(trace_steps: int, steps: int, sessions: int = 1) -> WrapInfo:
    """How ``sessions`` sessions of ``steps`` steps each cover a trace of ``trace_steps`` steps.

    Sessions start at :func:`session_offsets` and read consecutive steps
    modulo ``trace_steps``, as :func:`sim.decode.session_reads` does.

    Raises
    ------
    ArgumentError
        A count below 1.
    """
    if steps < 1:
        raise ArgumentError(f"steps must be >= 1, got {steps}")
    T, n = int(trace_steps), int(steps)
    starts = session_offsets(T, sessions)
    if n >= T:
        covered = T
    else:
        gaps = np.diff(np.append(starts, starts[0] + T))
        covered = int(min(T, np.minimum(gaps, n).sum()))
    return WrapInfo(trace_steps=T, steps=n, sessions=int(sessions), laps=n / T, replayed_steps=max(0, n - T),
                    covered_steps=covered, shared_steps=int(sessions) * n - covered)
