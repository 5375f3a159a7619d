"""The measured grid: which configurations ``engram measure`` runs by default, and products of axes.

A configuration (:class:`sim.core.schema.RunConfig`) is a trace, a read policy
(threshold, backend, readers), a compute, and the sessions that run it at
once; a grid is a list of them without duplicates.  Every grid keeps only
the read backends that start and read on this machine now
(:func:`backends_here`, from :func:`engram.backends.probe_backends`), and says
which it left out and why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from engram.backends import probe_backends

from sim.core.params import BACKENDS
from sim.core.schema import SESSION_MODES, ComputeSpec, RunConfig
from ..trace import CODE_SOURCE

__all__ = ["MEASURED_CAPACITY_COMPUTE", "MEASURED_CAPACITY_TARGET", "DEFAULT_DEPTHS", "DEFAULT_POLICIES",
           "DEFAULT_SCALE",
           "DEFAULT_TRACES", "SESSION_COUNTS", "backends_here", "default_grid", "grid", "quick_grid",
           "session_grid", "usable_configs"]

#: Session counts of the multi-session runs.
SESSION_COUNTS = (1, 2, 4, 8, 16, 32)
#: Compute of a step in the multi-session runs: 5 ms that use no CPU of this machine (a step's work on an
#: accelerator, which the sessions do not share).  The capacity is stated with it.
MEASURED_CAPACITY_COMPUTE = "sleep:5"
#: Tokens/s the slowest session must reach for a session count to count in the measured capacity.
MEASURED_CAPACITY_TARGET = 85.0


def backends_here() -> Tuple[Tuple[str, ...], Dict[str, str]]:
    """The read backends (``pread``, ``io_uring``) that start and read on this machine now, and those left
    out with the reason (:func:`engram.backends.probe_backends`, e.g. ``{"io_uring": "io_uring could not
    start: ... (ENGRAM_DISABLE_IO_URING=1)"}``)."""
    status = probe_backends(warn=False)
    usable = tuple(b for b in BACKENDS if status[b].usable)
    left = {b: str(status[b].reason or "does not start here") for b in BACKENDS if not status[b].usable}
    return usable, left


def usable_configs(configs: Sequence[RunConfig],
                   usable: Optional[Sequence[str]] = None) -> Tuple[List[RunConfig], List[RunConfig]]:
    """``(kept, left out)``: the configurations whose backend starts here (``usable``, default
    :func:`backends_here`).  A serial configuration (threshold above 48) never starts its backend's readers
    for a step, but opens them: it is kept, moved to the first usable backend, unless that makes a
    duplicate."""
    usable = tuple(usable if usable is not None else backends_here()[0])
    kept, left, seen = [], [], set()
    for c in configs:
        if c.backend not in usable:
            if not (c.serial and usable):
                left.append(c)
                continue
            c = replace(c, backend=usable[0])
        if c.key not in seen:
            seen.add(c.key)
            kept.append(c)
    return kept, left

#: Several real texts and source code: an Italian novel, a long English system prompt of a
#: coding agent, 100 short prompts (each its own sequence), and Python source.
DEFAULT_TRACES = ("shared:promessi_sposi.txt", "shared:agent_prompt_long.txt", "shared:prompts.jsonl", CODE_SOURCE)
#: Layout scale of the measured model file: two tables of 7.68 M rows (2.03 GB each).
DEFAULT_SCALE = 0.02
#: Queue depths of the I/O microbenchmarks.
DEFAULT_DEPTHS = (1, 2, 4, 8, 16, 32, 64)


def grid(traces: Sequence[str], thresholds: Sequence[int], backends: Sequence[str], readers: Sequence[int],
         computes: Sequence[str], steps: int = 300,
         compute_steps: Optional[Mapping[str, int]] = None) -> List[RunConfig]:
    """The product of the axes, without duplicates.

    A serial configuration (threshold above 48 rows a step) does not depend
    on the backend or the readers: it appears once per trace and compute, with
    the first backend and readers given.  ``compute_steps`` maps a compute
    label to its step count (e.g. fewer steps for the slow mixer).
    """
    out, seen = [], set()
    for tr in traces:
        for comp in computes:
            label = ComputeSpec.parse(comp).label
            n = int((compute_steps or {}).get(label, steps))
            for thr in thresholds:
                for be in backends:
                    for k in readers:
                        c = RunConfig(tr, int(thr), be, int(k), label, n)
                        if c.serial:
                            c = RunConfig(tr, int(thr), backends[0], int(readers[0]), label, n)
                        if c.key not in seen:
                            seen.add(c.key)
                            out.append(c)
    return out


#: Read policies of the default grid: serial (threshold 256), threshold 8 with pread or io_uring x 4 or 16.
DEFAULT_POLICIES = ((256, "pread", 4), (8, "pread", 4), (8, "pread", 16), (8, "io_uring", 4), (8, "io_uring", 16))


def session_grid(trace: str, steps: int = 150, sessions: Sequence[int] = SESSION_COUNTS,
                 modes: Sequence[str] = SESSION_MODES, backend: str = "pread", readers: int = 4,
                 threshold: int = 8, compute: str = MEASURED_CAPACITY_COMPUTE) -> List[RunConfig]:
    """Multi-session configurations: ``sessions`` concurrent decode sessions x ``modes`` (threads of one
    process, processes sharing the device) on ``trace``, each session on its own stretch, one policy and
    compute (default :data:`MEASURED_CAPACITY_COMPUTE`).  One session as threads is the single-session run."""
    return [RunConfig(trace, threshold, backend, readers, compute, steps, int(n), mode)
            for mode in modes for n in sessions if not (mode != modes[0] and n == 1)]


def default_grid(steps: int = 200, io_steps: int = 800, mixer_steps: int = 30,
                 prompt_steps: int = 100, session_steps: int = 150) -> List[RunConfig]:
    """The default measured grid: 29 single-session configurations and 11 session-grid ones (1 to 32 sessions;
    the one session as a thread counts as single-session in :attr:`RunConfig.multi`: 30 and 10).

    - compute ``spin:2`` (a step's other work as a 2 ms busy wait, about the
      read time: reads are 35-65% of a step), ``steps`` steps: the Italian
      novel, the agent prompt and Python source x the 5 policies of
      :data:`DEFAULT_POLICIES` (15);
    - no compute (a step is its read: the device's noise is all of it, so
      these runs are longer, ``io_steps`` steps): the novel and the agent
      prompt x the 5 policies (10);
    - ``spin:2`` on the 100 short prompts (1,467 tokens: enough fresh rows for
      two configurations of ``prompt_steps`` over 7 rounds), serial and
      io_uring x 16 (2);
    - the real Engram projection + gated add (``mixer``) on the novel, serial
      and io_uring x 16, ``mixer_steps`` steps (2);
    - 1, 2, 4, 8, 16 and 32 concurrent sessions as threads, and 2 to 32 as
      processes, on the novel, threshold 8, pread x 4, compute
      :data:`MEASURED_CAPACITY_COMPUTE` (:func:`session_grid`, ``session_steps`` steps a session: 11).

    Configurations on io_uring are left to :func:`usable_configs` where the ring does not start.
    """
    def policies(trace, compute, n):
        return [RunConfig(trace, t, b, k, compute, n) for t, b, k in DEFAULT_POLICIES]

    novel, agent, prompts = DEFAULT_TRACES[0], DEFAULT_TRACES[1], DEFAULT_TRACES[2]
    out = []
    for tr in (novel, agent, CODE_SOURCE):
        out += policies(tr, "spin:2", steps)
    for tr in (novel, agent):
        out += policies(tr, "none", io_steps)
    out += [RunConfig(prompts, 256, "pread", 4, "spin:2", prompt_steps),
            RunConfig(prompts, 8, "io_uring", 16, "spin:2", prompt_steps),
            RunConfig(novel, 256, "pread", 4, "mixer", mixer_steps),
            RunConfig(novel, 8, "io_uring", 16, "mixer", mixer_steps)]
    return out + session_grid(novel, session_steps)


def quick_grid(steps: int = 60) -> List[RunConfig]:
    """A small grid for tests and smoke runs: code + novel x {serial, pread x 4, io_uring x 4} x none, and 2 and 4
    sessions (threads, processes) on the novel."""
    return (grid((CODE_SOURCE, DEFAULT_TRACES[0]), (8, 256), ("pread", "io_uring"), (4,), ("none",), steps)
            + session_grid(DEFAULT_TRACES[0], steps, (2, 4)))
