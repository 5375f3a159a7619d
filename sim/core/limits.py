"""The bounds the simulator puts on its inputs before it allocates anything: memory a run may take, queue
depths a device table may name, seeds.

One place checks each kind of input, so every command and every API call refuses it with the same
:class:`engram.ArgumentError` (or :class:`engram.FormatError` for a file):

* :func:`check_memory` -- a run whose arrays are estimated before they are made (decode: steps x sessions x
  bytes per step-record; serving: requests = rate x duration x bytes per request) must fit in
  :data:`MEMORY_SHARE` of the machine's physical memory (``os.sysconf``), or the run is refused with the
  estimate and the limit, instead of being killed by the kernel part way.
* :func:`check_queue_depth` -- a queue depth is a whole number in ``[1, MAX_QUEUE_DEPTH]``: the largest queue
  an NVMe submission queue can hold (NVMe base specification: 64 Ki entries).
* :func:`check_seed` -- a seed is a whole number >= 0 (NumPy's ``SeedSequence`` takes no negative entropy).
* :data:`MAX_REQUEST_TOKENS` -- a serving request's prompt or output length is at most 2^20 tokens (a stated
  maximum: the context window of a V4.1-class model is 1M tokens, and the largest ``max`` the length
  spellings default to); a length past it is refused as a rate past the memory is, before anything is drawn.
"""

from __future__ import annotations

import math
import os
from typing import Optional

from engram.errors import ArgumentError

__all__ = ["MAX_QUEUE_DEPTH", "MAX_REQUEST_TOKENS", "MEMORY_SHARE", "check_memory", "MAX_BINS", "MAX_DRIVES", "MAX_SESSIONS", "check_amount",
           "check_count", "check_queue_depth", "check_seed",
           "check_settings", "memory_limit"]

#: Share of physical memory one simulation may plan to use (the rest is the machine's, shared with others).
MEMORY_SHARE = 0.5
#: Longest prompt or output of one serving request, in tokens (a 1M-token context window; see the module docstring).
MAX_REQUEST_TOKENS = 1 << 20
#: Deepest queue a device table may name: an NVMe submission queue holds at most 65536 entries.
MAX_QUEUE_DEPTH = 65536


def physical_memory() -> Optional[int]:
    """Bytes of physical memory (``SC_PAGE_SIZE x SC_PHYS_PAGES``), or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit() -> Optional[int]:
    """Bytes a run may plan to use: :data:`MEMORY_SHARE` of physical memory (None: unknown, no limit)."""
    phys = physical_memory()
    return None if phys is None else int(phys * MEMORY_SHARE)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_memory(need_bytes: float, what: str) -> None:
    """Refuse a run whose estimated memory ``need_bytes`` exceeds :func:`memory_limit`.

    ``what`` says what was estimated and how (e.g. ``"--steps 200000 x --sessions 64 step-records of 48 row
    slots"``); the message gives it with the estimate and the limit.

    Raises
    ------
    ArgumentError
        The estimate is above the limit.
    """
    limit = memory_limit()
    if limit is not None and need_bytes > limit:
        raise ArgumentError(f"{what} needs about {_gb(need_bytes)} of memory, more than the limit of "
                            f"{_gb(limit)} ({MEMORY_SHARE:g} of this machine's {_gb(physical_memory())} physical "
                            "memory, sim.core.limits.MEMORY_SHARE): make the run smaller")


def check_queue_depth(q, where: str) -> int:
    """``q`` as an int if it is a whole number in ``[1, MAX_QUEUE_DEPTH]``.

    ``q`` may be an int, a float holding a whole number, or a string of digits (a JSON object key).

    Raises
    ------
    ArgumentError
        Not a whole number, or out of range (``where`` names the file and key).
    """
    v = q
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            raise ArgumentError(f"{where}: queue depth {q!r} is not a whole number") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or \
            (isinstance(v, float) and not (math.isfinite(v) and v == int(v))):
        raise ArgumentError(f"{where}: queue depth {q!r} is not a whole number")
    v = int(v)
    if not 1 <= v <= MAX_QUEUE_DEPTH:
        raise ArgumentError(f"{where}: queue depth {v} is outside [1, {MAX_QUEUE_DEPTH}] "
                            "(sim.core.limits.MAX_QUEUE_DEPTH: an NVMe queue's largest size)")
    return v


def check_seed(seed, where: str = "seed") -> int:
    """``seed`` as an int if it is a whole number >= 0.

    Raises
    ------
    ArgumentError
        Negative or not a whole number (``where`` names the option or field).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            ok = float(seed) == int(seed)
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise ArgumentError(f"{where} must be a whole number >= 0, got {seed!r}")
        seed = int(seed)
    if seed < 0:
        raise ArgumentError(f"{where} must be >= 0, got {seed}")
    return seed


#: Most sessions one simulation takes (a capacity search probes at most a few thousand).
MAX_SESSIONS = 1_000_000
#: Most timeline bins a result is summarised in.
MAX_BINS = 100_000
#: Most drives the tables are striped over.
MAX_DRIVES = 4096


def check_amount(value, where: str, unit: str = "") -> float:
    """``value`` as a float if it is a finite number >= 0 (a time, a spread, an overhead; ``unit`` for the message).

    Raises
    ------
    ArgumentError
        A bool, something not a number, NaN, infinite or negative (``where`` names the field).
    """
    try:
        v = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v >= 0):
        raise ArgumentError(f"{where} must be a finite number >= 0{unit and ' ' + unit}, got {value!r}")
    return v


def check_count(value, where: str, low: int = 1, high: Optional[int] = None) -> int:
    """``value`` as an int if it is a whole number >= ``low`` (a count: sessions, steps, bins).

    Raises
    ------
    ArgumentError
        A bool, a fraction, something not a number, or below ``low`` (``where`` names the field).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            ok = float(value) == int(value)
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok or isinstance(value, bool):
            raise ArgumentError(f"{where} must be a whole number >= {low}, got {value!r}")
        value = int(value)
    if value < low:
        raise ArgumentError(f"{where} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ArgumentError(f"{where} must be <= {high:,}, got {value:,}")
    return value


def check_settings(value, kind: type, where: str):
    """``value`` if it is a ``kind`` (a settings object of an entry point), else an ArgumentError saying what
    to pass: the settings of the simulator's entry points are objects, not numbers or dicts."""
    if not isinstance(value, kind):
        raise ArgumentError(f"{where} must be a {kind.__module__.split('.')[0]}.{kind.__name__}(...), "
                            f"got {type(value).__name__} {value!r}"[:300])
    return value
