"""The fast decode mode's inner loop as text: the template that :func:`sim.device.fluid.queue_function` compiles
with the device queue's statements inline (:data:`sim.decode.fast.LEAN`), and the module the build compiles from
the same text.

The loop is where a capacity probe of thousands of sessions spends its time (:meth:`sim.decode.fast.FastRun._run_lean`).
:mod:`sim.decode.fast` compiles :data:`LEAN_TEMPLATE` at import, as Python.  The build (``setup.py``) compiles the
same text once more with Cython, from :func:`built_text`: the function :func:`~sim.device.fluid.queue_function`
returns, word for word, its locals given C types (:data:`C_TYPES`: the floats as C doubles -- IEEE 754 binary64, the
arithmetic of Python's floats, each operation rounded on its own: the build compiles with ``-ffp-contract=off`` --
and the counts as machine integers, far from their bounds), and the text it came from as ``SOURCE``.  The
simulator runs the build only where ``SOURCE`` is the text of now (a build older than an edit of the queue or the
loop is passed over), so there is still one text of the queue, and the runs are the same either way, bit for bit
(``tests/sim/test_decode.py``).

This module imports the standard library alone: the build loads it, and :mod:`sim.device.fluid`, from their files.
"""

from __future__ import annotations

import ast
import heapq
import importlib
import math
from typing import Dict

__all__ = ["C_TYPES", "LEAN_NAME", "LEAN_TEMPLATE", "WAKE_QUEUE_BUILT", "built_text", "lean_namespace", "wake_add",
           "wake_first", "wake_next", "wake_queue"]

LEAN_NAME = "sim.decode.fast._lean_loop"

#: The loop (see :data:`sim.decode.fast.LEAN`): a session's step is its reads (if any) as one batch, then its
#: compute; ``@advance`` ... ``@settle`` are the device queue's statements (:data:`sim.device.fluid.QUEUE`).
LEAN_TEMPLATE = '''
    def lean(sq, sampler, wake, ns, comps, kof, lat_rows, step, t0, finish, tick):
        @load
        push, pop, inf = heapq.heappush, heapq.heappop, math.inf
        steps, seq = len(comps[0]), len(wake)
        wq = wake_queue(wake)
        cache, samples_of = sampler._cache, sampler.samples_of
        ubuf, ui, urng = sampler._u, sampler._ui, sampler.rng
        ulen = len(ubuf)
        byn = [None] * len(kof)  # per batch size: (sigmas, their count, extras, ref, readers), as sizes appear
        done = []
        while True:
            if wake_first(wq) < tnext:  # at a tie, the device first (see the module)
                now, i = wake_next(wq)  # session i starts its step
                t0[i] = now
                n = ns[i][step[i]]
                if n:
                    @advance
                    g = byn[n]
                    if g is None:
                        k = kof[n]
                        got = cache.get((n, k))
                        if got is None:
                            got = samples_of(n, k)
                        g = byn[n] = (got[1], len(got[1]), got[2], got[4], k)
                    sig, nsig, ext, ref, k = g
                    if nsig == 1:
                        x = 0
                    else:
                        if ui >= ulen:
                            ubuf = urng.random(65536).tolist()
                            ui, ulen = 0, len(ubuf)
                        x = int(ubuf[ui] * nsig)
                        ui += 1
                    c = k if k < n else n
                    left, sigma, extra, owner = n - c, sig[x], ext[x], i
                    @submit
                    @settle
                    continue
                done.append([i])  # nothing to read: the compute follows at once, the device untouched
            elif tnext == inf:
                break
            else:  # the device's next completion
                now = tnext
                @advance
                @complete
                @settle
            if done:  # sessions whose reads are done: their compute follows
                for bt in done:
                    i = bt[0]
                    t = step[i]
                    end = now + comps[i][t]
                    lat_rows[i][t] = end - t0[i]
                    step[i] = t + 1
                    if t + 1 == steps:
                        finish[i] = end
                        if tick is not None:
                            tick(1)
                    else:
                        seq += 1
                        wake_add(wq, end, seq, i)
                done.clear()
        @store
        sampler._u, sampler._ui = ubuf, ui
'''

#: The modules the loop's text names (its globals beside ``push``, ``pop`` and ``inf``).
_MODULES = ("heapq", "math")

#: C types of the loop's names in the build, its locals (those the function assigns) and its parameters: every
#: value such a name holds is of that type (a list or a tuple may also be None; indices are checked as Python's).
C_TYPES: Dict[str, str] = {
    "double": "V tq area busy tnext now dt Ve gap end sigma extra nb tl gate_tail",
    "Py_ssize_t": "q d qseq reads max_depth nL room slack c left n k x i t take c2 ui ulen nsig steps seq",
    "bint": "first shared record",
    "list": "L heap late times depths done byn ubuf bt b2 seg sig ext wake ns comps kof lat_rows step t0 finish",
    "tuple": "g",
    "WakeQueue": "wq",
}

#: The sessions' wake-ups in the build: the queue :func:`wake_queue` makes, on C structs -- the same order, the
#: earliest ``(time, seq)`` first (``seq`` is unique, so no two compare equal), without a tuple a wake-up.  The
#: heap of tuples took a fifth of a capacity probe's time (3,541 sessions).
WAKE_QUEUE_BUILT = """\
from libc.stdlib cimport malloc, realloc, free


cdef struct Wake:
    double t
    Py_ssize_t seq, i


cdef class WakeQueue:
    cdef Wake* h
    cdef Py_ssize_t n, size

    def __dealloc__(self):
        free(self.h)


cdef inline bint _before(Wake a, Wake b):
    return a.t < b.t or (a.t == b.t and a.seq < b.seq)


cdef int wake_add(WakeQueue w, double t, Py_ssize_t seq, Py_ssize_t i) except -1:
    cdef Py_ssize_t j = w.n, up
    cdef Wake e
    cdef Wake* grown
    if w.n == w.size:
        grown = <Wake*>realloc(w.h, 2 * w.size * sizeof(Wake))
        if grown == NULL:
            raise MemoryError()
        w.h, w.size = grown, 2 * w.size
    e.t, e.seq, e.i = t, seq, i
    w.n += 1
    while j > 0:
        up = (j - 1) >> 1
        if not _before(e, w.h[up]):
            break
        w.h[j] = w.h[up]
        j = up
    w.h[j] = e
    return 0


cdef WakeQueue wake_queue(list wake):
    cdef WakeQueue w = WakeQueue()
    w.size = len(wake) if wake else 1
    w.h = <Wake*>malloc(w.size * sizeof(Wake))
    if w.h == NULL:
        raise MemoryError()
    for t, seq, i in wake:
        wake_add(w, t, seq, i)
    return w


cdef inline double wake_first(WakeQueue w):
    return w.h[0].t if w.n else inf


cdef (double, Py_ssize_t) wake_next(WakeQueue w):
    cdef Wake top = w.h[0], last
    cdef Py_ssize_t j = 0, c
    w.n -= 1
    if w.n:
        last = w.h[w.n]
        while True:
            c = 2 * j + 1
            if c >= w.n:
                break
            if c + 1 < w.n and _before(w.h[c + 1], w.h[c]):
                c += 1
            if not _before(w.h[c], last):
                break
            w.h[j] = w.h[c]
            j = c
        w.h[j] = last
    return top.t, top.i
"""


def wake_queue(wake: list) -> list:
    """The sessions' wake-ups, ``[(time, seq, session)]`` in :mod:`heapq`'s order, as the queue the loop takes them
    from (the list itself; the build's is :data:`WAKE_QUEUE_BUILT`)."""
    return wake


def wake_first(wq: list) -> float:
    """When the earliest wake-up comes (``inf``: none)."""
    return wq[0][0] if wq else math.inf


def wake_next(wq: list) -> tuple:
    """``(time, session)`` of the earliest wake-up, taken off the queue."""
    t, _, i = heapq.heappop(wq)
    return t, i


def wake_add(wq: list, t: float, seq: int, i: int) -> None:
    """Session ``i`` wakes at ``t`` (``seq``: after every wake-up added before at the same time)."""
    heapq.heappush(wq, (t, seq, i))


def lean_namespace() -> dict:
    """The globals the loop's text names (for :func:`~sim.device.fluid.queue_function`): its modules and the
    wake-up queue's functions."""
    return {**{m: importlib.import_module(m) for m in _MODULES}, "wake_queue": wake_queue, "wake_first": wake_first,
            "wake_next": wake_next, "wake_add": wake_add}


def built_text(source: str) -> str:
    """The module the build compiles (Cython) from ``source``, the text of the function that
    :func:`~sim.device.fluid.queue_function` made of :data:`LEAN_TEMPLATE`: that text, its locals typed
    (:data:`C_TYPES`), the globals it names, and ``SOURCE``, the text itself."""
    fn = ast.parse(source).body[0]
    if not isinstance(fn, ast.FunctionDef):
        raise ValueError("built_text: the source is not one function")
    params = [a.arg for a in fn.args.args]
    assigned = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - set(params)
    of = {name: ctype for ctype, names in C_TYPES.items() for name in names.split()}
    lines = source.splitlines()
    body = fn.body[0].lineno - 1  # the def line(s)
    if body != 1 or not lines[0].startswith(f"def {fn.name}("):
        raise ValueError("built_text: the function's parameters are not on its first line")
    lines[0] = f"def {fn.name}({', '.join(f'{of[p]} {p}' if p in of else p for p in params)}):"
    pad = " " * fn.body[0].col_offset
    typed = [f"{pad}cdef {ctype} {', '.join(sorted(set(names.split()) & assigned))}"
             for ctype, names in C_TYPES.items() if set(names.split()) & assigned]
    head = ["# cython: language_level=3",
            "# Generated by the build from sim/decode/lean_loop.py and sim/device/fluid.py: edit those, not this.",
            *(f"import {m}" for m in _MODULES), "from heapq import heappush as push, heappop as pop",
            "from math import inf", "", WAKE_QUEUE_BUILT, "", f"SOURCE = {source!r}", "", ""]
    return "\n".join(head + lines[:body] + typed + lines[body:]) + "\n"
