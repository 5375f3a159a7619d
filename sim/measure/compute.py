"""The compute of a measured decode step: the Engram mixer and emulated loads, run on the step's rows.

A :class:`sim.core.schema.ComputeSpec` names the compute (``none``, ``mixer``,
``spin:MS``, ``sleep:MS``, ``blas:N``, joined with ``+``; a sleep runs with the thread's timer slack at
1 ns, so that it lasts what it says: :func:`_tight_sleeps`);
:func:`compute_runner` makes the callable the decode loop and the
microbenchmarks run after each read.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from typing import Callable, List, Mapping, Union

import numpy as np

from engram.codec import bf16_round
from engram.errors import ArgumentError

from sim.core.schema import ComputeSpec

__all__ = ["SLEEP_SLACK_NS", "compute_runner", "timer_slack_ns"]


def compute_runner(spec: Union[ComputeSpec, str], model=None, session=None,
                   residual_seed: int = 0) -> Callable[[Mapping[int, np.ndarray]], None]:
    """A callable ``run(rows)`` doing the compute ``spec`` on one step's rows (``{layer_id: float32 [24, 256]}``).

    ``model`` and ``session`` are needed for the mixer (weights must be
    loaded beforehand: :meth:`engram.EngramModel.weights`).  The mixer's
    residual is a seeded bf16-valued random ``[1, 4, 5120]`` array, reset
    before every call (the real residual comes from layers that do not run
    here).

    Raises
    ------
    ArgumentError
        A bad spec, or the mixer without a model and a session.
    """
    spec = spec if isinstance(spec, ComputeSpec) else ComputeSpec.parse(spec)
    steps: List[Callable] = []
    if spec.mixer:
        if model is None or session is None:
            raise ArgumentError("the mixer compute needs a model and a session")
        w = model.weights(model.layer_ids[0])
        streams = w.q_norm.shape[0]
        width = w.q_norm.shape[1]
        base = bf16_round(np.random.default_rng(residual_seed).standard_normal((1, streams, width))
                          .astype(np.float32))
        res = base.copy()
        lids = tuple(model.layer_ids)
        apply = session.apply

        def mix(rows):
            np.copyto(res, base)
            for lid in lids:
                apply(lid, res, rows[lid][None])

        steps.append(mix)
    for kind, amount in spec.extra:
        if kind == "spin":
            steps.append(_spinner(amount * 1e-3))
        elif kind == "sleep":
            steps.append(_sleeper(amount * 1e-3))
        else:
            steps.append(_blas(int(amount), residual_seed))
    if not steps:
        return _nothing
    if len(steps) == 1:
        return steps[0]

    def run(rows):
        for f in steps:
            f(rows)

    return run


def _nothing(rows) -> None:
    return None


def _spinner(seconds: float):
    clock = time.perf_counter

    def spin(rows):
        end = clock() + seconds
        while clock() < end:
            pass

    return spin


#: ``prctl(2)`` options: set and get the calling thread's timer slack, nanoseconds (linux/prctl.h).
PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
#: Timer slack the emulated sleep runs with, nanoseconds: the smallest the kernel takes (0 means "the default").
SLEEP_SLACK_NS = 1
_slack = threading.local()


def _libc():
    """The C library's ``prctl`` (None off Linux or where it cannot be loaded)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc()


def timer_slack_ns() -> int:
    """The calling thread's timer slack, nanoseconds (``prctl(PR_GET_TIMERSLACK)``); -1 where it cannot be read."""
    if _PRCTL is None:
        return -1
    return int(_PRCTL(PR_GET_TIMERSLACK, 0, 0, 0, 0))


def _tight_sleeps() -> None:
    """Set the calling thread's timer slack to :data:`SLEEP_SLACK_NS`, once per thread.

    Linux lets a sleeping thread's timer expire up to its timer slack late (50 us by default; ``prctl(2)``,
    PR_SET_TIMERSLACK), so ``sleep:5`` lasted 5.120 ms on average on the 2-core VM (400 sleeps), 2.4% more
    than the step's compute says.  With the slack at 1 ns it lasted 5.074 ms, side by side: what remains is
    the wake-up of an idle virtual CPU, which the guest cannot shorten.  The slack stays for the thread's life
    (the main thread's too, where a single session's loop runs), and threads it starts afterwards inherit it:
    a 1 ns slack only makes their timed waits end on time, and restoring it around each sleep would add two
    system calls to every step.  Elsewhere (no ``prctl``) nothing changes."""
    if getattr(_slack, "set", False):
        return
    _slack.set = True
    if _PRCTL is not None:
        _PRCTL(PR_SET_TIMERSLACK, SLEEP_SLACK_NS, 0, 0, 0)


def _sleeper(seconds: float):
    def sleep(rows):
        _tight_sleeps()
        time.sleep(seconds)

    return sleep


def _blas(n: int, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    c = np.empty((256, 256), np.float32)

    def blas(rows):
        for _ in range(n):
            np.matmul(a, b, out=c)

    return blas
