"""A token bucket: the rate limit of a throttled or provisioned volume, as every simulator path applies it.

A rate-limited volume (a cloud block volume's provisioned IOPS, a cgroup
``blkio.throttle.read_iops_device`` / ``io.max riops=`` throttle) passes a read
to its raw device only with a token.  Tokens arrive at ``rate`` a second into
a bucket that holds at most ``depth``; a read takes one.  The bucket starts
full.  So after an idle spell of ``t`` seconds -- a decode step's compute -- up
to ``min(depth, rate x t)`` reads pass at the raw device's own latency, and
in the long run no more than ``rate`` reads a second pass (plus the depth once).

Tokens are granted in the order reads ask for them (FIFO): the ``j``-th read
asked for at ``now`` when the bucket holds ``level`` tokens gets its token at
``now + max(0, j - level) / rate``.  The state is one number that may go
negative: ``level < 0`` is the debt of tokens granted ahead, paid back at
``rate``.  This is the token bucket of the traffic-shaping literature
(Turner 1986, "New directions in communications"; RFC 2697's single-rate
bucket), read-counted.

Every device service uses this one class: the segment queue's statements
(:data:`sim.device.fluid.QUEUE`, through :meth:`TokenBucket.take`: the fast
mode's queue, the fast decode loop that runs it inline, the serving model's
fluid device) and the exact per-read models (:mod:`sim.device.engines`).
"""

from __future__ import annotations

import math

from engram.errors import ArgumentError

__all__ = ["TokenBucket"]


class TokenBucket:
    """Tokens of ``rate`` a second in a bucket of ``depth`` (see the module); times in seconds.

    Parameters
    ----------
    rate : float
        Tokens a second (reads a second in the long run), > 0 and finite.
    depth : float
        Most tokens the bucket holds (reads that pass back to back after an idle spell), >= 1 and finite.

    Attributes
    ----------
    level : float
        Tokens held at :attr:`t` (negative: a debt of tokens granted ahead).
    t : float
        Time of the last :meth:`take`.
    granted : int
        Tokens granted so far.

    Raises
    ------
    ArgumentError
        A rate or depth that is not a positive finite number (depth below 1).
    """

    __slots__ = ("rate", "depth", "level", "t", "granted")

    def __init__(self, rate: float, depth: float):
        for key, v, low in (("rate", rate, 0.0), ("depth", depth, 1.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                    not (v > low if key == "rate" else v >= low):
                raise ArgumentError(f"TokenBucket: {key} = {v!r} must be a finite number "
                                    f"{'> 0' if key == 'rate' else '>= 1'}")
        self.rate, self.depth = float(rate), float(depth)
        self.level, self.t, self.granted = self.depth, 0.0, 0

    def take(self, now: float, n: int) -> float:
        """Grant ``n >= 1`` tokens asked for at ``now`` (not earlier than the last call); returns when the last of
        them is granted (``now`` when the bucket held them all)."""
        level = self.level + self.rate * (now - self.t) if now > self.t else self.level
        if level > self.depth:
            level = self.depth
        if now > self.t:
            self.t = now
        level -= n
        self.level = level
        self.granted += n
        return now if level >= 0.0 else now + (-level) / self.rate

    def copy(self) -> "TokenBucket":
        """A full bucket of the same rate and depth (one per simulated drive)."""
        return TokenBucket(self.rate, self.depth)

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self.rate:g}/s, depth={self.depth:g}, level={self.level:g} at {self.t:g} s)"
