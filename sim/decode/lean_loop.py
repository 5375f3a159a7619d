"""The fast decode mode's inner loop as text: the template that :func:`sim.device.fluid.queue_function` compiles
with the device queue's statements inline (:data:`sim.decode.fast.LEAN`), and the module the build compiles from
the same text.

The loop is where a capacity probe of thousands of sessions spends its time (:meth:`sim.decode.fast.FastRun._run_lean`).
:mod:`sim.decode.fast` compiles :data:`LEAN_TEMPLATE` at import, as Python.  The build (``setup.py``) compiles the
same text once more with Cython, from :func:`built_text`: the function :func:`~sim.device.fluid.queue_function`
returns, word for word, its locals given C types (:data:`C_TYPES`: the floats as C doubles -- IEEE 754 binary64, the
arithmetic of Python's floats, each operation rounded on its own: the build compiles with ``-ffp-contract=off`` --
and the counts as machine integers, far from their bounds), its heaps on C arrays (:data:`HEAP_BUILT`: the
sessions' wake-ups, which the text takes through :func:`wake_queue` and its kin, and the device queue's, through the
lines :data:`BUILT_EDITS` names), and the text it came from as ``SOURCE``.  The
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

__all__ = ["C_TYPES", "LEAN_NAME", "LEAN_TEMPLATE", "HEAP_BUILT", "BUILT_EDITS", "built_text", "lean_namespace", "wake_add",
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
    "list": "L times depths done byn ubuf bt b2 seg sig ext wake ns comps kof lat_rows step t0 finish",
    "tuple": "g",
    "Heap": "wq heap late",
}

#: The loop's three heaps in the build: the sessions' wake-ups (the queue :func:`wake_queue` makes) and the device's
#: ``heap`` of segments in service and ``late`` of batches waiting for their straggler or their token
#: (:data:`sim.device.fluid.QUEUE`: the text's ``push``/``pop`` on them and their ``[0][0]``, put in by
#: :data:`BUILT_EDITS`).  One heap: each entry's key ``(time or V, seq)`` on C arrays beside its payload (a
#: session, or the queue's entry itself) -- the same order (``seq`` is unique: no two keys compare equal, and a
#: payload is never compared), without a comparison of tuples, which took about two fifths of a capacity probe's
#: time (3,541 sessions).
HEAP_BUILT = """\
from libc.stdlib cimport realloc, free


cdef class Heap:
    cdef double* v
    cdef Py_ssize_t* s
    cdef list e
    cdef Py_ssize_t n, size

    def __dealloc__(self):
        free(self.v)
        free(self.s)

    def entries(self):
        return self.e[:self.n]


cdef int _heap_add(Heap h, double v, Py_ssize_t s, object payload) except -1:
    cdef Py_ssize_t j = h.n, up, size
    cdef double* vv
    cdef Py_ssize_t* ss
    if h.n == h.size:
        size = 2 * h.size if h.size else 64
        vv = <double*>realloc(h.v, size * sizeof(double))
        if vv == NULL:
            raise MemoryError()
        h.v = vv
        ss = <Py_ssize_t*>realloc(h.s, size * sizeof(Py_ssize_t))
        if ss == NULL:
            raise MemoryError()
        h.s = ss
        h.e.extend([None] * (size - h.size))
        h.size = size
    h.n += 1
    while j > 0:
        up = (j - 1) >> 1
        if not (v < h.v[up] or (v == h.v[up] and s < h.s[up])):
            break
        h.v[j], h.s[j], h.e[j] = h.v[up], h.s[up], h.e[up]
        j = up
    h.v[j], h.s[j], h.e[j] = v, s, payload
    return 0


cdef object _heap_take(Heap h):
    if h.n == 0:
        raise IndexError("pop from an empty heap")
    cdef object top = h.e[0], last
    cdef Py_ssize_t m, j = 0, k, ls
    cdef double lv
    h.n -= 1
    m = h.n
    if m:
        lv, ls, last = h.v[m], h.s[m], h.e[m]
        while True:
            k = 2 * j + 1
            if k >= m:
                break
            if k + 1 < m and (h.v[k + 1] < h.v[k] or (h.v[k + 1] == h.v[k] and h.s[k + 1] < h.s[k])):
                k += 1
            if not (h.v[k] < lv or (h.v[k] == lv and h.s[k] < ls)):
                break
            h.v[j], h.s[j], h.e[j] = h.v[k], h.s[k], h.e[k]
            j = k
        h.v[j], h.s[j], h.e[j] = lv, ls, last
    h.e[m] = None
    return top


cdef Heap segment_heap(list entries):
    cdef Heap h = Heap()
    h.e = []
    for entry in entries:
        _heap_add(h, entry[0], entry[1], entry)
    return h


cdef inline push(h, tuple entry):
    if type(h) is Heap:
        _heap_add(<Heap>h, entry[0], entry[1], entry)
    else:
        heapq.heappush(h, entry)


cdef inline pop(h):
    if type(h) is Heap:
        return _heap_take(<Heap>h)
    return heapq.heappop(h)


cdef Heap wake_queue(list wake):
    cdef Heap h = Heap()
    h.e = []
    for t, seq, i in wake:
        _heap_add(h, t, seq, i)
    return h


cdef inline double wake_first(Heap h):
    return h.v[0] if h.n else inf


cdef (double, Py_ssize_t) wake_next(Heap h):
    cdef double t = h.v[0]
    return t, _heap_take(h)


cdef inline int wake_add(Heap h, double t, Py_ssize_t seq, Py_ssize_t i) except -1:
    return _heap_add(h, t, seq, i)
"""

#: The build's edits of the loop's text, each a line of it (stripped) and what stands for it there: the heaps
#: (:data:`HEAP_BUILT`) made of the queue's lists at the start, their tops read from their arrays, and the
#: lists given back their entries at the end (none: the loop ends with the device idle); ``push`` and ``pop`` are the
#: built module's.  Each edit is made wherever its line is; a line found nowhere is an error of the build.
BUILT_EDITS = (
    ("heap = sq.heap", "heap = segment_heap(sq.heap)"),
    ("push, pop, inf = heapq.heappush, heapq.heappop, math.inf", "pass  # push and pop: the module's"),
    ("gap = heap[0][0] - V", "gap = heap.v[0] - V"),
    ("if heap:", "if heap.n:"),
    ("while heap and (first or heap[0][0] <= Ve):", "while heap.n and (first or heap.v[0] <= Ve):"),
    ("late = sq.late", "late = segment_heap(sq.late)"),
    ("if late and late[0][0] < tnext:", "if late.n and late.v[0] < tnext:"),
    ("tnext = late[0][0]", "tnext = late.v[0]"),
    ("while late and late[0][0] <= now:", "while late.n and late.v[0] <= now:"),
    ("sampler._u, sampler._ui = ubuf, ui", "sampler._u, sampler._ui = ubuf, ui\nsq.heap[:] = heap.entries()\n"
                                           "sq.late[:] = late.entries()"),
)


def wake_queue(wake: list) -> list:
    """The sessions' wake-ups, ``[(time, seq, session)]`` in :mod:`heapq`'s order, as the queue the loop takes them
    from (the list itself; the build's is a heap of :data:`HEAP_BUILT`)."""
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
    lines = _edited(source.splitlines())
    body = fn.body[0].lineno - 1  # the def line(s)
    if body != 1 or not lines[0].startswith(f"def {fn.name}("):
        raise ValueError("built_text: the function's parameters are not on its first line")
    lines[0] = f"def {fn.name}({', '.join(f'{of[p]} {p}' if p in of else p for p in params)}):"
    pad = " " * fn.body[0].col_offset
    typed = [f"{pad}cdef {ctype} {', '.join(sorted(set(names.split()) & assigned))}"
             for ctype, names in C_TYPES.items() if set(names.split()) & assigned]
    head = ["# cython: language_level=3",
            "# Generated by the build from sim/decode/lean_loop.py and sim/device/fluid.py: edit those, not this.",
            *(f"import {m}" for m in _MODULES), "from math import inf", "", HEAP_BUILT, "", f"SOURCE = {source!r}", "", ""]
    return "\n".join(head + lines[:body] + typed + lines[body:]) + "\n"


def _edited(lines: list) -> list:
    """``lines`` with :data:`BUILT_EDITS` made wherever their line is (at its indentation); an edit whose line is
    nowhere is an error."""
    out = []
    hit = {old: 0 for old, _ in BUILT_EDITS}
    edits = dict(BUILT_EDITS)
    for x in lines:
        new = edits.get(x.strip())
        if new is None:
            out.append(x)
            continue
        hit[x.strip()] += 1
        out += [x[:len(x) - len(x.lstrip())] + y for y in new.split("\n")]
    missing = [old for old, n in hit.items() if not n]
    if missing:
        raise ValueError(f"built_text: the loop has no line {missing[0]!r} (BUILT_EDITS must follow the text)")
    return out
