"""The measured grid: which configurations ``engram measure`` runs by default, and products of axes.

A configuration (:class:`sim.schema.RunConfig`) is a trace, a read policy
(threshold, backend, readers) and a compute; a grid is a list of them
without duplicates.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence

from ..schema import ComputeSpec, RunConfig
from ..trace import CODE_SOURCE

__all__ = ["DEFAULT_DEPTHS", "DEFAULT_POLICIES", "DEFAULT_SCALE", "DEFAULT_TRACES", "default_grid", "grid",
           "quick_grid"]

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


def default_grid(steps: int = 200, io_steps: int = 800, mixer_steps: int = 30,
                 prompt_steps: int = 100) -> List[RunConfig]:
    """The default measured grid: 29 configurations.

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
      and io_uring x 16, ``mixer_steps`` steps (2).
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
    return out


def quick_grid(steps: int = 60) -> List[RunConfig]:
    """A small grid for tests and smoke runs: code + novel x {serial, pread x 4, io_uring x 4} x none."""
    return grid((CODE_SOURCE, DEFAULT_TRACES[0]), (8, 256), ("pread", "io_uring"), (4,), ("none",), steps)
