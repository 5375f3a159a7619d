"""Speculative decoding (DeepSeek V4 multi-token prediction): drafts, their acceptance, the rows a
verification step reads.

A decode step with ``k`` draft tokens is a *verification step*: one forward pass over ``k + 1`` tokens --
the last confirmed token and the ``k`` tokens drafted after it -- keeping the accepted prefix of the drafts
and emitting one more token of its own, so a step emits ``1 + a`` tokens, ``a`` the accepted prefix length
(0..k).  Draft ``j`` (1-based) is accepted when drafts ``1..j`` all are right; draft ``j`` is right with
probability ``profile[j - 1]`` (:meth:`Speculation.profile`), drawn with the run's seeded generator, one
uniform number a draft.

Rows (SPEC §4 hashing, §8 deduplication): a token's rows hash the n-grams that end at it.  Position
``p`` and the accepted drafts read the trace's rows of their positions; a rejected draft, and every draft
after it, holds a wrong token in each of its n-grams (orders 2 and 3 both include the token and the one
before it), so its rows are other rows of the same table, drawn uniformly from the ids the trace's table
reaches (:func:`verification_rows`).  The ``(k + 1) x 48`` row requests of a step go through the same
DRAM-resident rows, row caches and per-table deduplication as one step's 48 (:func:`sim.decode.step_reads`):
one batch, read at the queue depth its distinct rows give (``Policy.concurrency``).

Prefetch (``prefetch_drafts``): the drafted tokens' rows (positions ``p + 1 .. p + k`` of the next step) are
issued to the device as soon as the previous step's rows have arrived, in the background, overlapping that
step's compute; the verification step then reads on its critical path only its rows that are not among the
drafts' (the confirmed token's own), after waiting for what of the prefetch is still in flight (the order
of ``engram.Session.step_many``, which takes a prefetch's rows before it reads the others).  This takes the
issue's premise that a drafted token is known a step before it is verified.  Rows of rejected drafts are
read either way: wasted reads that still load the device.

Compute: :class:`sim.core.params.Compute` has no per-token term (a decode step is bound by reading the weights,
which one forward pass over ``k + 1`` tokens reads once), so a verification step computes as long as a
one-token step plus :attr:`Speculation.verify_s` (0 by default; ``engram sim decode --consumer`` adds its
Engram consumer's per-token cost for the ``k`` extra tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple, Union

import numpy as np

from engram.errors import ArgumentError

from ..trace import Trace

__all__ = ["DEFAULT_ACCEPTANCE", "Speculation", "accepted_prefix", "parse_acceptance", "verification_rows"]

#: Acceptance of a draft when none is given: the issue's target point (k = 2, acceptance 0.7).
DEFAULT_ACCEPTANCE = 0.7


def parse_acceptance(value: Union[float, str, Sequence[float]]) -> Tuple[float, ...]:
    """An acceptance rate or a per-position profile as a tuple of floats in [0, 1].

    ``0.7``, ``"0.7"``, ``"0.8,0.6"`` or ``[0.8, 0.6]``: position ``j`` of a profile is the probability that
    draft ``j + 1`` is right (a profile shorter than ``k`` repeats its last value).

    Raises
    ------
    ArgumentError
        Not a number, NaN, a value outside [0, 1], or an empty profile (names the value).
    """
    if isinstance(value, str):
        parts = [x.strip() for x in value.split(",")]
        try:
            vals = tuple(float(x) for x in parts)
        except ValueError:
            raise ArgumentError(f"acceptance {value!r}: need a number in [0, 1] or a profile such as "
                                "'0.8,0.6'") from None
    elif isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        vals = (float(value),)
    else:
        try:
            vals = tuple(float(x) for x in value)
        except (TypeError, ValueError):
            raise ArgumentError(f"acceptance {value!r}: need a number in [0, 1] or a sequence of them") from None
    if not vals:
        raise ArgumentError("acceptance: the profile is empty")
    for j, v in enumerate(vals):
        if not (0.0 <= v <= 1.0) or math.isnan(v):
            raise ArgumentError(f"acceptance {v} at draft position {j + 1} is outside [0, 1]")
    return vals


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding settings of a decode or serving run (see the module).

    Attributes
    ----------
    draft_tokens : int
        ``k``, tokens drafted a step (>= 0; 0: off, one token a step, the default).
    acceptance : tuple of float
        Probability that each draft is right, by position (one value: the same for all); each in [0, 1],
        at most ``k`` values.  Given as a number, ``"0.8,0.6"`` or a sequence.
    prefetch_drafts : bool
        Read the drafted tokens' rows in the background as soon as the previous step's rows have arrived.
    verify_s : float
        Seconds a verification step computes beyond a one-token step (>= 0; default 0: see the module).

    Raises
    ------
    ArgumentError
        ``k < 0``, an acceptance outside [0, 1] or NaN, a profile longer than ``k``, a negative or
        non-finite ``verify_s``.
    """

    draft_tokens: int = 0
    acceptance: Tuple[float, ...] = (DEFAULT_ACCEPTANCE,)
    prefetch_drafts: bool = False
    verify_s: float = 0.0

    def __post_init__(self) -> None:
        k = self.draft_tokens
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ArgumentError(f"draft_tokens must be an integer >= 0 (0: off), got {k!r}")
        object.__setattr__(self, "draft_tokens", int(k))
        acc = parse_acceptance(self.acceptance)
        if k and len(acc) > k:
            raise ArgumentError(f"acceptance profile {','.join(f'{a:g}' for a in acc)} has {len(acc)} positions, "
                                f"more than draft_tokens = {k}")
        object.__setattr__(self, "acceptance", acc)
        object.__setattr__(self, "prefetch_drafts", bool(self.prefetch_drafts))
        if not (self.verify_s >= 0 and math.isfinite(self.verify_s)):
            raise ArgumentError(f"verify_s must be >= 0 seconds, got {self.verify_s}")

    @property
    def on(self) -> bool:
        """Whether the run drafts at all (``k > 0``)."""
        return self.draft_tokens > 0

    def profile(self) -> np.ndarray:
        """float64 ``[k]``: probability that draft ``j + 1`` is right (the profile, its last value repeated)."""
        acc = list(self.acceptance)
        k = self.draft_tokens
        return np.asarray((acc + [acc[-1]] * k)[:k], dtype=np.float64)

    def expected_tokens(self) -> float:
        """Mean tokens emitted a verification step: ``1 + sum_j prod_{i<=j} profile[i]``."""
        return 1.0 + float(np.cumprod(self.profile()).sum())

    def to_dict(self) -> dict:
        return {"draft_tokens": self.draft_tokens, "acceptance": list(self.acceptance),
                "prefetch_drafts": self.prefetch_drafts, "verify_ms": self.verify_s * 1e3,
                "expected_tokens_per_step": self.expected_tokens()}

    def __str__(self) -> str:
        if not self.on:
            return "off"
        return (f"k {self.draft_tokens}, acceptance {','.join(f'{a:g}' for a in self.acceptance)}, prefetch "
                + ("on" if self.prefetch_drafts else "off"))


def accepted_prefix(spec: Speculation, rng: np.random.Generator, steps: int) -> np.ndarray:
    """int64 ``[steps]``: accepted drafts of each verification step (0..k), one uniform draw a draft."""
    k = spec.draft_tokens
    if k == 0:
        return np.zeros(steps, dtype=np.int64)
    right = rng.random((steps, k)) < spec.profile()[None, :]
    return np.cumprod(right, axis=1).sum(axis=1).astype(np.int64)


def verification_rows(trace: Trace, sessions: int, steps: int, spec: Speculation,
                      rng: np.random.Generator) -> tuple:
    """The row requests of every session's verification steps (see the module).

    Session ``i`` of ``S`` starts at trace position ``i * T // S`` (as :func:`sim.decode.step_reads` does)
    and moves on by the tokens each step emits, wrapping around the trace.

    Returns
    -------
    (rows, accepted, positions) : numpy.ndarray
        ``rows`` int64 ``[S, steps, layers, (k + 1) * columns]``: the step's requests per table, the confirmed
        token's columns first, then each draft's; ``accepted`` int64 ``[S, steps]``; ``positions`` int64
        ``[S]``: trace positions each session covered (emitted tokens).
    """
    T, L, C = trace.steps, trace.layers, trace.columns
    k = spec.draft_tokens
    high = trace.rows.reshape(T, L, C).max(axis=(0, 2)).astype(np.int64) + 1   # [L]: ids the tables reach
    rows = np.empty((sessions, steps, L, (k + 1) * C), dtype=np.int64)
    acc = np.empty((sessions, steps), dtype=np.int64)
    pos = np.empty(sessions, dtype=np.int64)
    j = np.arange(k + 1)
    for s in range(sessions):
        a = accepted_prefix(spec, rng, steps)
        start = s * T // sessions + np.concatenate([[0], np.cumsum(1 + a)[:-1]])   # [steps]
        at = (start[:, None] + j[None, :]) % T                                       # [steps, k + 1]
        r = trace.rows[at].astype(np.int64)                                          # [steps, k + 1, L, C]
        wrong = j[None, :] > a[:, None]                                              # [steps, k + 1]
        n_wrong = int(wrong.sum())
        if n_wrong:
            other = (rng.random((n_wrong, L, C)) * high[None, :, None]).astype(np.int64)
            r[wrong] = other
        rows[s] = r.transpose(0, 2, 1, 3).reshape(steps, L, (k + 1) * C)
        acc[s] = a
        pos[s] = int((1 + a).sum())
    return rows, acc, pos
