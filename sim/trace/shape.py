"""The reuse shape of real text: how each n-gram order repeats, measured on the packaged corpora.

A row read repeats when its column's n-gram appeared earlier in the session
(each column owns its own rows, SPEC §2), so the 2-, 3- and 4-gram columns
repeat at different rates: a repeated 4-gram repeats its 3- and 2-gram
suffixes, never the other way round.  :func:`measure_profile` condenses a
real trace into a :class:`ReuseProfile`:

- ``by_order``: the reuse rate of each order's columns (the definition of
  :func:`sim.trace.reuse_stats`), averaged over windows of ``window`` tokens,
  each window its own session;
- ``transitions``: the step-to-step law of the *match level* of a token, the
  longest n-gram ending at it that appeared before: level 1 (its 2-gram is
  new), 2 (the 2-gram repeats, the 3-gram is new), 3, or 4 (the 4-gram
  repeats).  A level can rise by at most one per token (an n-gram of order
  ``o`` ending at ``t`` contains the one of order ``o - 1`` ending at ``t - 1``);
- ``zipf`` and ``min_distance``: how far back a run of repeats copies from,
  the distance ``d`` from a token whose 2-gram repeats (after one that did
  not) to that 2-gram's latest earlier occurrence, fitted as
  ``P(d) ~ d**-zipf`` for ``d >= min_distance`` (maximum likelihood).

:data:`PROFILES` holds the profiles of the packaged corpora (``code``: the long
coding-agent prompt, the kind of context the SPEC §8 figure of 22.5% comes
from; ``prose``: the Italian novel), measured by :func:`measure_profile`
(``tests/sim/test_trace_synth.py`` measures them again and compares).

:func:`order_targets` scales a profile to any overall reuse rate ``R``: the
chance that an order's n-gram is new, ``1 - r_o``, is the profile's raised to
one common power ``a``, ``1 - r_o(R) = (1 - r_o) ** a``, with ``a`` chosen so
that the orders average to ``R`` (every order has as many columns).  At the
profile's own rate ``a = 1`` and the orders are the measured ones; at low
rates the orders keep the measured ratios of ``-ln(1 - r_o)`` (close to those
of ``r_o``); at high rates every order tends to 1 together, as it must.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple, Union

import numpy as np

from engram.errors import ArgumentError

from sim.core.progress import progress as progress_bar
from .base import Trace
from .reuse import repeat_mask

__all__ = ["LEVELS", "PROFILES", "PROFILE_WINDOW", "DEFAULT_PROFILE", "ReuseProfile", "match_levels", "measure_profile",
           "order_targets", "profile_named"]

#: Match levels of a token: 1 (new 2-gram), 2, 3, 4 (its 4-gram repeats), for the n-gram orders 2..4 of V4.1.
LEVELS = 4
#: Tokens per window of a profile (each window its own session): the default synthetic trace length.
PROFILE_WINDOW = 2000


@dataclass(frozen=True)
class ReuseProfile:
    """How a real text's row reads repeat, order by order (see the module docstring).

    Attributes
    ----------
    name : str
        Short name (``code``, ``prose``, or the source of a measured one).
    source : str
        The trace source it was measured on.
    window, windows : int
        Tokens per window and windows measured.
    by_order : dict
        n-gram order (2, 3, 4) -> reuse rate of that order's columns.
    transitions : tuple of tuple of float
        ``[4][4]`` row-stochastic: ``transitions[i][j]`` is the chance that a token
        at match level ``i + 1`` is followed by one at level ``j + 1``
        (zero above ``j = i + 1``).
    zipf : float
        Exponent of the distance law ``P(d) ~ d**-zipf`` of a run's copy source.
    min_distance : int
        Smallest distance of that law (the 5th percentile measured).
    """

    name: str
    source: str
    window: int
    windows: int
    by_order: Dict[int, float]
    transitions: Tuple[Tuple[float, ...], ...]
    zipf: float
    min_distance: int

    @property
    def reuse_rate(self) -> float:
        """Overall reuse rate: the mean over orders (every order has as many columns)."""
        return float(np.mean(list(self.by_order.values())))

    def level_distribution(self) -> np.ndarray:
        """float64 ``[4]``: share of tokens at match level 1..4 implied by ``by_order``."""
        return levels_from_orders(self.by_order)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["by_order"] = {str(k): v for k, v in self.by_order.items()}
        d["transitions"] = [list(r) for r in self.transitions]
        d["reuse_rate"] = self.reuse_rate
        return d


#: Profiles of the packaged corpora (``sim/data/``, ``shared:NAME``), measured with
#: ``measure_profile(load_trace(SOURCE), name=NAME)`` (2000-token windows).
PROFILES: Dict[str, ReuseProfile] = {
    "code": ReuseProfile(
        name="code", source="shared:agent_prompt_long.txt", window=2000, windows=18,
        by_order={2: 0.4044, 3: 0.2698, 4: 0.2014},
        transitions=((0.8092, 0.1908, 0.0, 0.0),
                     (0.4288, 0.1003, 0.4709, 0.0),
                     (0.3271, 0.0492, 0.0390, 0.5847),
                     (0.1660, 0.0206, 0.0119, 0.8015)),
        zipf=1.13, min_distance=7),
    "prose": ReuseProfile(
        name="prose", source="shared:promessi_sposi.txt", window=2000, windows=208,
        by_order={2: 0.1758, 3: 0.0411, 4: 0.0135},
        transitions=((0.8658, 0.1342, 0.0, 0.0),
                     (0.6577, 0.1447, 0.1976, 0.0),
                     (0.5638, 0.1154, 0.0258, 0.2950),
                     (0.4751, 0.1118, 0.0172, 0.3958)),
        zipf=0.77, min_distance=11),
}

#: The profile of synthetic traces unless told otherwise: coding context (SPEC §8's 22.5% is a coding generation).
DEFAULT_PROFILE = "code"


def profile_named(name: str) -> ReuseProfile:
    """The profile called ``name`` in :data:`PROFILES`.

    Raises
    ------
    ArgumentError
        No such profile (lists the known ones).
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise ArgumentError(f"no reuse profile {name!r} (profiles: {', '.join(PROFILES)})") from None


# ---------------------------------------------------------------- measuring
def match_levels(trace: Trace) -> np.ndarray:
    """int8 ``[T]``: each token's match level, 1..4 (see the module docstring), per sequence of the trace.

    An order counts as repeated at a token when most of its columns (both
    layers, every head) repeat an earlier row, which sets aside the rare hash
    collision of a single column; the level is one more than the number of
    orders, from 2 up, that repeat without a gap.
    """
    rep = repeat_mask(trace)
    orders = trace.orders
    out = np.ones(trace.steps, dtype=np.int8)
    alive = np.ones(trace.steps, dtype=bool)
    for o in range(2, 2 + LEVELS - 1):
        cols = rep[:, :, orders == o]
        hit = cols.reshape(trace.steps, -1).mean(axis=1) > 0.5
        alive &= hit
        out += alive
    return out


def _copy_distances(trace: Trace, levels: np.ndarray) -> np.ndarray:
    """int64: for each token whose 2-gram repeats after one whose 2-gram did not, the distance back to the
    latest earlier token with the same 2-gram row (layer 0, first 2-gram column), within its sequence."""
    col = trace.rows[:, 0, int(np.flatnonzero(trace.orders == 2)[0])].astype(np.int64)
    seq = trace.sequence_ids()
    last: Dict[Tuple[int, int], int] = {}
    out = []
    for t in range(trace.steps):
        key = (int(seq[t]), int(col[t]))
        if t > 0 and seq[t] == seq[t - 1] and levels[t] >= 2 and levels[t - 1] == 1 and key in last:
            out.append(t - last[key])
        last[key] = t
    return np.asarray(out, dtype=np.int64)


def _fit_zipf(d: np.ndarray, lo: int, hi: int) -> float:
    """Maximum-likelihood exponent of ``P(d) ~ d**-s`` on ``lo <= d < hi`` (grid of 0.01 over [0, 4])."""
    d = d[(d >= lo) & (d < hi)]
    if d.size == 0:
        return 0.0
    ks = np.arange(lo, hi, dtype=np.float64)
    grid = np.arange(0.0, 4.0001, 0.01)
    logk, sum_log_d = np.log(ks), float(np.log(d).sum())
    nll = [s * sum_log_d + d.size * math.log(np.exp(-s * logk).sum()) for s in grid]
    return round(float(grid[int(np.argmin(nll))]), 2)


def measure_profile(trace: Trace, *, window: int = PROFILE_WINDOW, name: Optional[str] = None,
                    progress: Union[bool, str] = False) -> ReuseProfile:
    """Measure a :class:`ReuseProfile` on consecutive windows of ``window`` tokens of ``trace``.

    Each window is its own session (a trace of several sequences is cut
    within each sequence); rates are rounded to 4 decimals.  ``progress``: :mod:`sim.core.progress` mode, one item
    a window (shown after 2 s).

    Raises
    ------
    ArgumentError
        The trace is shorter than one window, or does not have 3 n-gram orders.
    """
    if trace.columns // trace.heads != LEVELS - 1:
        raise ArgumentError(f"a reuse profile needs n-gram orders 2..4, the trace has {trace.columns} columns "
                            f"of {trace.heads} heads")
    bounds = list(trace.starts) + [trace.steps]
    counts = np.zeros((LEVELS, LEVELS))
    per_order, dists = [], []
    starts = [w for a, b in zip(bounds[:-1], bounds[1:]) for w in range(a, b - window + 1, window)]
    with progress_bar(len(starts), "profile", "window", mode=progress, delay=2.0) as bar:
        for w in starts:
            sub = Trace(trace.rows[w:w + window], trace.tokens[w:w + window], [0], trace.layer_ids, trace.heads)
            rep = repeat_mask(sub)
            per_order.append([rep[:, :, sub.orders == o].mean() for o in (2, 3, 4)])
            lv = match_levels(sub)
            np.add.at(counts, (lv[:-1] - 1, lv[1:] - 1), 1)
            dists.append(_copy_distances(sub, lv))
            bar.update()
    if not per_order:
        raise ArgumentError(f"trace {trace.source!r} has no window of {window} tokens in one sequence")
    r = np.mean(per_order, axis=0)
    counts = np.tril(counts, k=1)  # a level rises by at most one a token (a hash collision aside)
    trans = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    d = np.concatenate(dists)
    lo = max(2, int(np.percentile(d, 5))) if d.size else 2
    return ReuseProfile(
        name=name or trace.source, source=trace.source, window=int(window), windows=len(per_order),
        by_order={o: round(float(x), 4) for o, x in zip((2, 3, 4), r)},
        transitions=tuple(tuple(round(float(x), 4) for x in row) for row in trans),
        zipf=_fit_zipf(d, lo, window), min_distance=lo)


# ---------------------------------------------------------------- scaling
def levels_from_orders(by_order: Dict[int, float]) -> np.ndarray:
    """float64 ``[4]``: share of tokens at match level 1..4 given per-order reuse rates (nested orders)."""
    r = [1.0] + [float(by_order[o]) for o in (2, 3, 4)] + [0.0]
    return np.asarray([r[i] - r[i + 1] for i in range(LEVELS)])


def order_targets(profile: ReuseProfile, reuse: float) -> Dict[int, float]:
    """Per-order reuse rates with mean ``reuse`` and the shape of ``profile`` (see the module docstring).

    Returns
    -------
    dict
        order (2, 3, 4) -> reuse rate; ``r_2 >= r_3 >= r_4``; their mean is
        ``reuse`` to 1e-12.

    Raises
    ------
    ArgumentError
        ``reuse`` outside ``[0, 1)``.
    """
    if not 0.0 <= reuse < 1.0 or not math.isfinite(reuse):
        raise ArgumentError(f"reuse rate must be in [0, 1), got {reuse}")
    new = np.asarray([1.0 - profile.by_order[o] for o in (2, 3, 4)])
    if reuse == 0.0:
        return {2: 0.0, 3: 0.0, 4: 0.0}

    def mean_rate(a: float) -> float:
        return float(np.mean(1.0 - new ** a))

    lo, hi = 0.0, 1.0
    while mean_rate(hi) < reuse:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_rate(mid) < reuse else (lo, mid)
    a = 0.5 * (lo + hi)
    return {o: float(1.0 - x ** a) for o, x in zip((2, 3, 4), new)}
