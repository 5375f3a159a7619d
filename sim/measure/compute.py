"""The compute of a measured decode step: the Engram mixer and emulated loads, run on the step's rows.

A :class:`sim.core.schema.ComputeSpec` names the compute (``none``, ``mixer``,
``spin:MS``, ``sleep:MS``, ``blas:N``, joined with ``+``);
:func:`compute_runner` makes the callable the decode loop and the
microbenchmarks run after each read.
"""

from __future__ import annotations

import time
from typing import Callable, List, Mapping, Union

import numpy as np

from engram.codec import bf16_round
from engram.errors import ArgumentError

from sim.core.schema import ComputeSpec

__all__ = ["compute_runner"]


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


def _sleeper(seconds: float):
    def sleep(rows):
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
