"""Synthetic traces with a target reuse rate, shaped like real text (issue 14.5).

The reuse rate of a trace is the share of its row reads whose ``(layer, row)``
was read earlier in the same session (:func:`sim.trace.reuse_stats`; SPEC §8
measured 22.5% in a 600-token coding generation).  :func:`synthesize` makes a
trace of ``tokens`` steps whose hashed rows hit a target rate, with the
per-order shape of real text and a Zipf skew of where repeats come from.

Method
------
A token stream is synthesized and hashed with the real :class:`engram.Hasher`,
so every row is a real row id of the layout (each column's rows inside its
prime/offset range), both layers and all heads of an order repeat together as
they do for text, and the trace can be replayed by the real engine.

1. **Targets.**  The overall rate ``R`` is split into per-order rates
   ``r_2 >= r_3 >= r_4`` with the shape of a measured :class:`ReuseProfile`
   (:func:`sim.trace.shape.order_targets`), which fixes the share of tokens at
   each *match level* (1: the token's 2-gram is new; 2: its 2-gram repeats but
   not its 3-gram; 3; 4: its 4-gram repeats).
2. **Levels.**  Token by token, the next level is drawn from the profile's
   measured level-to-level law (a level rises by at most one a token), tilted
   by a constant weight per level so that its long-run shares are the targets,
   and steered by the running deficits (a weight ``exp(-FEEDBACK * cost)``, the
   cost being the squared deficit of each order, and ``OVERALL`` times that of
   their sum, after the choice).  The counts stay within a few tokens of the
   targets, and where a level cannot be realized (prose's shape at high rates
   asks for 2-grams that all repeat but branch) its neighbours take its place
   so that the overall rate still holds.
3. **Tokens.**  A level is realized exactly, in compressed-id space (SPEC §3):

   - level 1: a token from the real corpus's unigram distribution (the profile's
     corpus, else the Python source of :data:`sim.trace.CODE_SOURCE`) that does not
     follow the previous token anywhere earlier; when the next token is to start a
     run of repeats, instead an *anchor*: a copy of the token ``d`` steps back, with
     ``P(d) ~ d**-zipf`` for ``d >= min_distance`` (the Zipf skew: larger values copy
     from nearer text, so a small row cache catches more of the repeats);
   - rising one level (or staying at 4): continue copying the span after the source;
   - any other level (a switch): copy the successor of an earlier occurrence of the
     current context that extends it by exactly that level, chosen with the same
     distance law.

   The level of every token is checked against the n-grams seen so far.
4. **Check.**  The stream is hashed, the reuse rate of the rows measured; when hash
   collisions (a small layout) push it off the target by more than a quarter point,
   the per-order targets are corrected by the error and the stream made again.

Measured (``tests/sim/test_trace_synth.py``): 2000 tokens at 0, 0.1, 0.225, 0.5
and 0.8 hit the target within half a point with either profile; the per-order
rates of the ``code`` profile stay within 2 points of the scaled shape.  The
highest reachable rate is :func:`max_reuse` (no 2-gram can repeat before the
first copy distance).

The result is reproducible: one ``seed`` drives every draw.  Its source spec
(``Trace.source``) is ``synth:reuse=R,zipf=S,tokens=N,seed=K,profile=P``, which
:func:`sim.trace.load_trace` accepts anywhere a trace is named.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from engram import Layout
from engram.errors import ArgumentError, EngramError

from .base import Trace, default_layout
from .reuse import repeat_mask
from .shape import DEFAULT_PROFILE, LEVELS, ReuseProfile, levels_from_orders, order_targets, profile_named
from .sources import CODE_SOURCE, SYNTH_PREFIX, resolve_source
from .tokens import encode_text, tokenizer_and_map

__all__ = ["DEFAULT_TOKENS", "SynthSpec", "max_reuse", "synthesize", "synthesize_spec"]

#: Tokens of a synthetic trace unless told otherwise.
DEFAULT_TOKENS = 2000
#: Gain of the deficit feedback (per squared token of deficit).
FEEDBACK = 0.25
#: Weight of the overall deficit against each order's in the feedback.
OVERALL = 0.3
#: Largest error of the overall rate (after hashing) accepted without correcting the targets.
TOLERANCE = 0.0025
#: Attempts at correcting the targets for hash collisions.
ATTEMPTS = 4
#: Draws of a copy distance before an anchor gives up for this token.
ANCHOR_DRAWS = 16


# ===================================================================== spec
@dataclass(frozen=True)
class SynthSpec:
    """The parameters of a synthetic trace, and its source spec.

    Attributes
    ----------
    reuse : float
        Target reuse rate, in ``[0, 1)``.
    zipf : float or None
        Exponent of the copy-distance law; ``None``: the profile's measured one.
    tokens : int or None
        Steps; ``None``: :data:`DEFAULT_TOKENS` (or the caller's limit).
    seed : int
    profile : str
        Name of a profile in :data:`sim.trace.shape.PROFILES`.
    """

    reuse: float
    zipf: Optional[float] = None
    tokens: Optional[int] = None
    seed: int = 0
    profile: str = DEFAULT_PROFILE

    @classmethod
    def parse(cls, text: str) -> "SynthSpec":
        """Parse ``reuse=0.225,zipf=1.1,tokens=2000,seed=0,profile=code`` (with or without ``synth:``).

        Raises
        ------
        ArgumentError
            Unknown key, a value of the wrong type, or no ``reuse`` (names the item).
        """
        body = text[len(SYNTH_PREFIX):] if text.startswith(SYNTH_PREFIX) else text
        kinds = {"reuse": float, "zipf": float, "tokens": int, "seed": int, "profile": str}
        values: Dict[str, object] = {}
        for item in filter(None, (x.strip() for x in body.split(","))):
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or key not in kinds:
                raise ArgumentError(f"synthetic trace {text!r}: item {item!r} is not KEY=VALUE with KEY one of "
                                    f"{', '.join(kinds)}")
            try:
                values[key] = kinds[key](val.strip())
            except ValueError:
                raise ArgumentError(f"synthetic trace {text!r}: {key} = {val!r} is not "
                                    f"{kinds[key].__name__}") from None
        if "reuse" not in values:
            raise ArgumentError(f"synthetic trace {text!r}: needs reuse=RATE")
        spec = cls(**values)  # type: ignore[arg-type]
        spec.check()
        return spec

    def check(self, named_profile: bool = True) -> None:
        """Raise :class:`ArgumentError` naming the first parameter out of range (and, with
        ``named_profile``, an unknown profile name)."""
        if not (0.0 <= self.reuse < 1.0):
            raise ArgumentError(f"synthetic trace: reuse = {self.reuse} must be in [0, 1)")
        if self.zipf is not None and not (0.0 <= self.zipf <= 8.0):
            raise ArgumentError(f"synthetic trace: zipf = {self.zipf} must be in [0, 8]")
        if self.tokens is not None and self.tokens < 16:
            raise ArgumentError(f"synthetic trace: tokens = {self.tokens} must be >= 16")
        if self.seed < 0:
            raise ArgumentError(f"synthetic trace: seed = {self.seed} must be >= 0")
        if named_profile:
            profile_named(self.profile)

    def resolved(self, limit: Optional[int] = None) -> "SynthSpec":
        """Every parameter filled in: ``tokens`` is the smaller of it and ``limit``, default
        :data:`DEFAULT_TOKENS` (or ``limit``); ``zipf`` defaults to the profile's."""
        n = self.tokens if self.tokens is not None else (limit or DEFAULT_TOKENS)
        if limit is not None:
            n = min(n, int(limit))
        z = self.zipf if self.zipf is not None else profile_named(self.profile).zipf
        return SynthSpec(self.reuse, float(z), int(n), self.seed, self.profile)

    def spec(self) -> str:
        """The source spec, ``synth:reuse=...,zipf=...,tokens=...,seed=...,profile=...`` (unset items left out)."""
        items = [f"reuse={self.reuse:g}"]
        if self.zipf is not None:
            items.append(f"zipf={self.zipf:g}")
        if self.tokens is not None:
            items.append(f"tokens={self.tokens}")
        items += [f"seed={self.seed}", f"profile={self.profile}"]
        return SYNTH_PREFIX + ",".join(items)


# ===================================================================== corpus
@functools.lru_cache(maxsize=4)
def _corpus(source: str, tokenizer_json: Optional[str]) -> Tuple[np.ndarray, np.ndarray, str]:
    """Token ids and compressed ids of the real text whose unigram distribution fresh tokens follow.

    The profile's corpus when it is on this machine, else :data:`CODE_SOURCE` (always present).
    """
    used = source
    try:
        kind, path = resolve_source(source)
    except EngramError:
        kind = None
    if kind != "textfile":
        used = CODE_SOURCE
        kind, path = resolve_source(CODE_SOURCE)
    ids = encode_text(Path(path).read_text(encoding="utf-8"), tokenizer_json)
    _, token_map = tokenizer_and_map(tokenizer_json)
    return ids, token_map[ids].astype(np.int64), used


# ===================================================================== levels
def _stationary(p: np.ndarray) -> np.ndarray:
    """Stationary distribution of the row-stochastic matrix ``p``."""
    n = p.shape[0]
    a = np.vstack([p.T - np.eye(n), np.ones((1, n))])
    b = np.zeros(n + 1)
    b[-1] = 1.0
    s = np.linalg.lstsq(a, b, rcond=None)[0]
    return np.maximum(s, 0.0) / np.maximum(s, 0.0).sum()


def _tilt(transitions: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Row-stochastic ``[4, 4]``: ``transitions`` with one weight per destination level, chosen so that
    the stationary distribution is ``target``.  Every move a level allows (down to any level, up by one)
    keeps a little weight, so that any target can be reached."""
    q = np.tril(np.asarray(transitions, dtype=np.float64), k=1) + 1e-6 * np.tril(np.ones((LEVELS, LEVELS)), k=1)
    w = (target > 0).astype(np.float64)
    p = q
    for _ in range(2000):
        p = q * w[None, :]
        p /= p.sum(axis=1, keepdims=True)
        s = _stationary(p)
        if np.max(np.abs(s - target)) < 1e-9:
            break
        w *= np.sqrt(np.where(target > 0, target / np.maximum(s, 1e-300), 0.0))
        w = np.where(target > 0, np.maximum(w / w.max(), 1e-15), 0.0)
    return p


# ===================================================================== generator
class _Stream:
    """The token stream being built: tokens, compressed ids, and every n-gram seen so far.

    ``succ[k][context]`` maps the compressed id that followed a ``k + 1``-token
    context to the positions where it did (contexts of the positions before the
    stream are the pad id, as in the hash).
    """

    def __init__(self, n: int, pad: int, zipf: float, min_distance: int, rng: np.random.Generator):
        self.tok = np.zeros(n, dtype=np.int64)
        self.cid: List[int] = []
        self.pad = pad
        self.succ: List[Dict[tuple, Dict[int, List[int]]]] = [{}, {}, {}]
        self.rng = rng
        self.zipf = zipf
        self.min_distance = max(2, int(min_distance))
        d = np.arange(n + 1, dtype=np.float64)
        w = np.where(d >= self.min_distance, np.maximum(d, 1.0) ** -zipf, 0.0)
        self.cum = np.cumsum(w)  # cum[k]: weight of distances <= k

    def context(self, t: int) -> Tuple[int, int, int]:
        """Compressed ids at ``t - 3, t - 2, t - 1`` (pad before the stream)."""
        c = self.cid
        return tuple(c[t - k] if t - k >= 0 else self.pad for k in (3, 2, 1))  # type: ignore[return-value]

    def level(self, x: int, ctx: Tuple[int, int, int]) -> int:
        """Match level of compressed id ``x`` after ``ctx`` given the n-grams seen so far."""
        lv = 1
        for k in range(3):
            nxt = self.succ[k].get(ctx[2 - k:])
            if nxt is None or x not in nxt:
                break
            lv += 1
        return lv

    def push(self, t: int, token: int, x: int, ctx: Tuple[int, int, int]) -> None:
        self.tok[t] = token
        self.cid.append(x)
        for k in range(3):
            self.succ[k].setdefault(ctx[2 - k:], {}).setdefault(x, []).append(t)

    def distance_weights(self, t: int, q: np.ndarray) -> np.ndarray:
        d = (t - q).astype(np.float64)
        w = np.zeros(d.size)
        far = d >= self.min_distance
        w[far] = d[far] ** -self.zipf
        return w

    def anchor(self, t: int, ctx: Tuple[int, int, int]) -> Optional[int]:
        """A position ``q`` whose token can be copied to ``t`` as level 1, ``t - q`` drawn from the distance law."""
        if t < self.min_distance or self.cum[t] <= 0:
            return None
        follows = self.succ[0].get(ctx[2:], {})
        u = self.rng.random(ANCHOR_DRAWS) * self.cum[t]
        for d in np.searchsorted(self.cum, u, side="left").tolist():
            q = t - int(d)
            if 0 <= q < t - 1 and self.cid[q] not in follows and self.cid[q] != self.pad:
                return q
        return None

    def switch(self, t: int, level: int, ctx: Tuple[int, int, int]) -> Optional[int]:
        """A position whose token, copied to ``t``, gives exactly ``level`` (2 or 3) after ``ctx``."""
        k = level - 2
        here = self.succ[k].get(ctx[2 - k:], {})
        longer = self.succ[k + 1].get(ctx[1 - k:], {})
        cand = [q for x, qs in here.items() if x not in longer for q in qs if q < t]
        if not cand:
            return None
        q = np.asarray(cand, dtype=np.int64)
        w = self.distance_weights(t, q)
        if w.sum() <= 0:
            w = np.ones(q.size)
        return int(q[self.rng.choice(q.size, p=w / w.sum())])


class _Vocab:
    """Fresh tokens: draws from the real corpus's unigram distribution, never the pad id."""

    def __init__(self, ids: np.ndarray, cids: np.ndarray, pad: int, rng: np.random.Generator):
        keep = cids != pad
        self.ids, self.cids, self.rng = ids[keep], cids[keep], rng
        self.buf: List[int] = []

    def draw(self, banned: Dict[int, List[int]]) -> Tuple[int, int]:
        while True:
            if not self.buf:
                self.buf = self.rng.integers(0, self.ids.size, 4096).tolist()
            i = self.buf.pop()
            if int(self.cids[i]) not in banned:
                return int(self.ids[i]), int(self.cids[i])


def _levels_choice(p_row: np.ndarray, deficit: np.ndarray, allowed: np.ndarray, rng) -> int:
    """Draw a level (0-based) from ``p_row`` among ``allowed``, steered by the per-order deficits.

    ``deficit[k]`` is how many tokens order ``k + 2`` is short of its target so far.  Level
    ``l`` counts for orders ``2 .. l + 1``; each level's chance is multiplied by
    ``exp(-FEEDBACK * cost)``, the cost being the squared deficits after choosing it, each
    order's and (``OVERALL`` times) their sum's, so that a level the stream cannot realize is
    replaced by those that keep the overall rate.
    """
    adds = np.tril(np.ones((LEVELS, LEVELS - 1)), k=-1)  # adds[l, k] = 1 when level l counts for order k + 2
    left = deficit[None, :] - adds
    cost = (left ** 2).sum(axis=1) + OVERALL * left.sum(axis=1) ** 2
    z = np.where(allowed > 0, -FEEDBACK * cost, -np.inf)
    z = np.exp(z - z.max())
    w = p_row * z
    if w.sum() <= 0:
        w = z
    return int(rng.choice(LEVELS, p=w / w.sum()))


class _Generator:
    """The level and token of every step (see the module docstring, steps 2 and 3).

    State: the stream, the per-order counts ``reached`` against the targets
    ``rates``, the level of the last token ``cur`` (0-based), the copy source
    ``ptr`` of the last token, and ``plan``: the level of this token when the
    last one (a new 2-gram) already decided it.
    """

    def __init__(self, n: int, level_share: np.ndarray, profile: ReuseProfile, zipf: float, corpus, pad: int,
                 seed: int):
        self.rng = np.random.default_rng(seed)
        self.p = _tilt(np.asarray(profile.transitions), level_share)
        self.stream = _Stream(n, pad, zipf, profile.min_distance, self.rng)
        self.vocab = _Vocab(corpus[0], corpus[1], pad, self.rng)
        self.n = n
        self.rates = np.cumsum(level_share[::-1])[::-1][1:]  # share of tokens whose 2-, 3-, 4-gram repeats
        self.reached = np.zeros(LEVELS - 1)
        self.levels = np.zeros(n, dtype=np.int8)
        self.cur, self.ptr, self.plan = 0, None, None

    def _choose(self, t: int, ctx) -> Tuple[int, Optional[int]]:
        """This token's level (0-based) and, for a switch, the position to copy."""
        if self.plan is not None:
            lv, self.plan = self.plan, None
            return lv, None
        allowed = np.zeros(LEVELS)
        allowed[:min(self.cur + 2, LEVELS)] = 1.0
        while True:
            lv = _levels_choice(self.p[self.cur], self.rates * (t + 1) - self.reached, allowed, self.rng)
            if lv == 0 or (lv == min(self.cur + 1, LEVELS - 1) and self.ptr is not None):
                return lv, None
            if lv < LEVELS - 1:
                q = self.stream.switch(t, lv + 1, ctx)
                if q is not None:
                    return lv, q
            allowed[lv] = 0.0

    def _new_two_gram(self, t: int, ctx) -> Optional[int]:
        """For a level-1 token: decide the next token's level now, and when it starts a run of repeats,
        return the anchor to copy here (else ``None``: a fresh token)."""
        nxt = _levels_choice(self.p[0], self.rates * (t + 2) - self.reached, np.array([1.0, 1.0, 0.0, 0.0]),
                             self.rng)
        q = self.stream.anchor(t, ctx) if nxt == 1 and t + 1 < self.n else None
        self.plan = 1 if q is not None else 0
        return q

    def step(self, t: int) -> None:
        s = self.stream
        ctx = s.context(t)
        lv, q = self._choose(t, ctx)
        if lv == 0:
            q = self._new_two_gram(t, ctx)
        elif q is None:
            q = self.ptr + 1   # continue the copy: one level up, or staying at 4
        if q is None:
            token, x = self.vocab.draw(s.succ[0].get(ctx[2:], {}))
            self.ptr = None
        else:
            token, x, self.ptr = int(s.tok[q]), s.cid[q], q
        got = s.level(x, ctx)
        if got != lv + 1:  # cannot happen: every choice above gives exactly its level
            raise AssertionError(f"synthetic token at {t} has match level {got}, expected {lv + 1}")
        s.push(t, token, x, ctx)
        self.reached[:got - 1] += 1
        self.levels[t] = got
        self.cur = got - 1


def _generate(n: int, level_share: np.ndarray, profile: ReuseProfile, zipf: float, corpus, pad: int,
              seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Token ids ``[n]`` and their match levels ``[n]``."""
    g = _Generator(n, level_share, profile, zipf, corpus, pad, seed)
    for t in range(n):
        g.step(t)
    return g.stream.tok, g.levels


# ===================================================================== public
def synthesize_spec(spec: Union[str, SynthSpec], *, limit: Optional[int] = None, layout: Optional[Layout] = None,
                    tokenizer_json: Optional[str] = None) -> Trace:
    """The synthetic trace named by a ``synth:...`` spec (see :class:`SynthSpec`); ``limit`` caps its tokens
    (the target rate then holds for the shorter trace).

    Raises
    ------
    ArgumentError
        A malformed spec or a parameter out of range (names it).
    """
    s = (SynthSpec.parse(spec) if isinstance(spec, str) else spec).resolved(limit)
    return synthesize(s.reuse, zipf=s.zipf, tokens=int(s.tokens), seed=s.seed, profile=s.profile, layout=layout,
                      tokenizer_json=tokenizer_json)


def max_reuse(tokens: int, min_distance: int) -> float:
    """Highest reuse rate a synthetic trace of ``tokens`` tokens can reach: no 2-gram repeats before the
    first copy (``min_distance + 1`` tokens in), and a run climbs one order a token."""
    return max(0.0, 1.0 - (max(2, min_distance) + 3) / tokens)


def _reachable(rates: Dict[int, float], tokens: int, min_distance: int) -> Dict[int, float]:
    """Per-order targets moved into what ``tokens`` tokens can realize: the 2-gram rate below
    ``1 - (min_distance + 1) / tokens``, each order below the one before by a token or more (a run
    passes every level on its way up), none below 0."""
    out, cap = {}, 1.0 - (max(2, min_distance) + 1) / tokens
    for o in (2, 3, 4):
        out[o] = max(0.0, min(rates[o], cap))
        cap = max(0.0, out[o] - 1.0 / tokens)
    return out


def _per_order(trace: Trace) -> Dict[int, float]:
    rep = repeat_mask(trace)
    return {o: float(rep[:, :, trace.orders == o].mean()) for o in (2, 3, 4)}


def synthesize(reuse: float, *, zipf: Optional[float] = None, tokens: int = DEFAULT_TOKENS, seed: int = 0,
               profile: Union[str, ReuseProfile] = DEFAULT_PROFILE, layout: Optional[Layout] = None,
               tokenizer_json: Optional[str] = None) -> Trace:
    """A trace of ``tokens`` steps whose row reads repeat at the rate ``reuse`` (see the module docstring).

    Parameters
    ----------
    reuse : float
        Target reuse rate in ``[0, 1)``: the share of row reads that repeat an
        earlier ``(layer, row)`` of the trace (one session).  Hit within half a
        point at the full V4.1 layout and 2000 tokens (within a point is the
        promise; a small layout's hash collisions set a floor).
    zipf : float, optional
        Exponent of the copy-distance law, ``P(d) ~ d**-zipf``; default the
        profile's measured one (``code``: 1.13, ``prose``: 0.77).
    tokens : int
        Steps of the trace (>= 16).
    seed : int
        Seeds every draw.
    profile : str or ReuseProfile
        Per-order shape and level law (:data:`sim.trace.shape.PROFILES` name or a
        measured profile).
    layout : Layout, optional
        Default ``Layout.deepseek_v41_flash()``.

    Returns
    -------
    Trace
        ``rows`` uint32 ``[tokens, layers, columns]`` hashed by :class:`engram.Hasher`
        from ``tokens`` (real DeepSeek V4 token ids); one sequence; ``source`` the
        ``synth:...`` spec.

    Raises
    ------
    ArgumentError
        A parameter out of range, or a target the length cannot reach (a
        token's 2-gram can repeat only from the third token on).
    """
    prof = profile if isinstance(profile, ReuseProfile) else profile_named(profile)
    z = prof.zipf if zipf is None else float(zipf)
    spec = SynthSpec(float(reuse), z, int(tokens), int(seed), prof.name)
    spec.check(named_profile=isinstance(profile, str))
    ceiling = max_reuse(int(tokens), prof.min_distance)
    if reuse > ceiling:
        raise ArgumentError(f"synthetic trace: reuse {reuse} is above what {tokens} tokens can reach "
                            f"({ceiling:.4f}: no token can repeat before the first copy distance, "
                            f"{prof.min_distance} tokens)")
    layout = layout if layout is not None else default_layout()
    corpus = _corpus(prof.source, tokenizer_json)
    targets = order_targets(prof, float(reuse))
    aim = dict(targets)
    best: Optional[Tuple[float, Trace]] = None
    for _ in range(ATTEMPTS):
        share = levels_from_orders(_reachable(aim, int(tokens), prof.min_distance))
        ids, _ = _generate(int(tokens), share, prof, z, corpus, layout.pad_id, int(seed))
        tr = Trace.from_tokens(ids, layout=layout, tokenizer_json=tokenizer_json, source=spec.spec())
        got = _per_order(tr)
        err = abs(float(np.mean(list(got.values()))) - reuse)
        if best is None or err < best[0]:
            best = (err, tr)
        if err <= TOLERANCE:
            break
        aim = {o: aim[o] + targets[o] - got[o] for o in aim}
    assert best is not None
    return best[1]
