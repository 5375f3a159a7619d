"""The compute of one engine step as a function of its batch: decode requests ``B`` and prompt tokens ``P``.

A step of a continuous-batching engine runs every layer once over ``B`` decode tokens (one per
running request) and ``P`` prompt tokens (chunks of prompts being prefilled).  Its compute time is

    ``ms(B, P) = f(B) + P * token_ms``

with ``f`` piecewise linear through knots ``(B, ms)`` (extended past the last knot with the last
slope) -- the form DistServe's simulator fits (a + b * tokens + c * batch) -- times a draw of
mean 1 and coefficient of variation ``cv`` when ``dist`` is not constant, divided by ``scale``.

Default: a V4.1 Flash-class model on the SPEC §8 reference machine (one Apple M3 Ultra)
    - ``f(1) = 47.013 ms``: the compute of one decode step of the SPEC §8 reference run (fitted so
      that the reference engine reading serially gives 19.16 tokens/s: :func:`sim.decode.reference_compute`);
    - ``token_ms = 1000 / 468.03 = 2.137 ms``: a long prompt's prefill speed on the same machine,
      468.03 tokens/s (the ds4 engine's published figure for DeepSeek V4 Flash on a Mac Studio M3
      Ultra, 11,709-token prompt, q2 experts);
    - every extra decode request costs ``token_ms`` too (``f(B) = f(1) + (B - 1) * token_ms``,
      ``f(0) = f(1) - token_ms``): a batched decode token costs what a prompt token costs when
      prefill runs at full speed.  This is an assumption, not a measurement: it caps the engine's
      tokens/s at ``1000 / token_ms`` = 468 however large the batch, and charges small batches more
      than a memory-bound accelerator would.  Calibrate it (below) for any real accelerator.
    - Attention over a growing context is not modelled (V4's compressed KV cache makes it a small
      part of a step); nor is the hash (0.14 us a token).

``scale`` (the ``compute_scale`` axis of a study) divides every figure: a what-if for an
accelerator that many times faster.

Calibration: :meth:`StepCompute.from_file` reads measured steps, CSV (header ``batch,prompt_tokens,ms``)
or JSON (a list of ``{"batch", "prompt_tokens", "ms"}``), and fits ``f`` from the steps without
prompt tokens (the median of each batch size is a knot) and ``token_ms`` from the rest (least
squares of what ``f`` leaves, through the origin); with no prompt-free steps it fits the plane
``a + b * B + c * P``.  :attr:`StepCompute.fit` keeps the residuals.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from engram.errors import ArgumentError, FormatError

from sim.core.params import DEFAULT_LAYERS, Compute, Consumer

__all__ = ["DS4_PREFILL_TOKENS_PER_S", "REFERENCE_STEP_MS", "StepCompute", "default_token_ms"]

#: SPEC §8 reference decode step compute at batch 1, ms (:func:`sim.decode.reference_compute`, 47.013 ms; kept
#: as a figure so that building the default needs no simulation; ``tests/sim/test_serve_compute.py`` checks it).
REFERENCE_STEP_MS = 47.013
#: ds4 (github.com/antirez/ds4, README): DeepSeek V4 Flash prefill on a Mac Studio M3 Ultra, 11,709-token prompt.
DS4_PREFILL_TOKENS_PER_S = 468.03


def default_token_ms() -> float:
    """Milliseconds a prompt token costs by default: ``1000 / DS4_PREFILL_TOKENS_PER_S``."""
    return 1e3 / DS4_PREFILL_TOKENS_PER_S


@dataclass(frozen=True)
class StepCompute:
    """Compute of one engine step (see the module docstring); times in milliseconds.

    Attributes
    ----------
    knots : tuple of (int, float)
        ``(batch, ms)`` of ``f``, batch sizes increasing from 0 or more.
    token_ms : float
        Milliseconds a prompt token adds.
    dist, cv : str, float
        Spread of a step's time around its mean (:class:`sim.core.params.Compute` distributions).
    scale : float
        Every time is divided by it (> 0).
    layers : int
        Decoder layers a step's time spreads over evenly (where an Engram layer waits for its rows).
    source : str
        Where the figures come from.
    fit : dict
        Residuals of a calibration (``rms_ms``, ``max_rel``, ``points``), or empty.

    Raises
    ------
    ArgumentError
        No knot, batches not increasing, negative times, a bad distribution, cv or scale.
    """

    knots: Tuple[Tuple[int, float], ...]
    token_ms: float
    dist: str = "constant"
    cv: float = 0.0
    scale: float = 1.0
    layers: int = DEFAULT_LAYERS
    source: str = ""
    fit: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        knots = tuple((int(b), float(m)) for b, m in self.knots)
        if not knots:
            raise ArgumentError("StepCompute needs at least one (batch, ms) knot")
        bs = [b for b, _ in knots]
        if bs[0] < 0 or any(b2 <= b1 for b1, b2 in zip(bs, bs[1:])):
            raise ArgumentError(f"StepCompute: knot batches must increase from >= 0, got {bs}")
        if any(not (m >= 0 and math.isfinite(m)) for _, m in knots) or not (self.token_ms >= 0 and
                                                                              math.isfinite(self.token_ms)):
            raise ArgumentError("StepCompute: times must be finite and >= 0")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ArgumentError(f"StepCompute: scale = {self.scale!r} must be > 0")
        if self.layers < 1:
            raise ArgumentError(f"StepCompute: layers must be >= 1, got {self.layers}")
        Compute(1.0, self.dist, self.cv)  # checks the distribution and cv
        object.__setattr__(self, "knots", knots)
        xs = np.asarray(bs, dtype=np.float64)
        ys = np.asarray([m for _, m in knots])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(knots) > 1 else self.token_ms
        object.__setattr__(self, "_xs", xs.tolist())
        object.__setattr__(self, "_ys", ys.tolist())
        object.__setattr__(self, "_slope", float(slope))

    # ------------------------------------------------------------------ building
    @classmethod
    def reference(cls, step_ms: float = REFERENCE_STEP_MS, token_ms: Optional[float] = None, *,
                  scale: float = 1.0, dist: str = "constant", cv: float = 0.0,
                  layers: int = DEFAULT_LAYERS) -> "StepCompute":
        """The default (see the module docstring): ``f(B) = step_ms + (B - 1) * token_ms``."""
        tok = default_token_ms() if token_ms is None else float(token_ms)
        src = (f"f(1) = {step_ms:g} ms (SPEC §8 reference step), {tok:.4g} ms a token "
               + ("(ds4 prefill, M3 Ultra, 468.03 tokens/s)" if token_ms is None else "(given)")
               + "; extra decode requests cost a token each")
        return cls(((0, max(step_ms - tok, 0.0)), (1, step_ms), (2, step_ms + tok)), tok, dist, cv, scale, layers,
                   src)

    @classmethod
    def fitted(cls, records: Sequence[Mapping], *, source: str = "measured", scale: float = 1.0,
               dist: str = "constant", cv: float = 0.0, layers: int = DEFAULT_LAYERS) -> "StepCompute":
        """Fit measured steps ``{"batch", "prompt_tokens", "ms"}`` (see the module docstring).

        Raises
        ------
        FormatError
            A record without the three numbers, negative values, fewer than two records, or nothing to fit
            ``token_ms`` from (names the record).
        """
        pts = []
        for i, r in enumerate(records):
            try:
                b, p, ms = int(r["batch"]), int(r["prompt_tokens"]), float(r["ms"])
            except (KeyError, TypeError, ValueError):
                raise FormatError(f"{source}: record {i}: need batch, prompt_tokens and ms") from None
            if b < 0 or p < 0 or not (ms >= 0 and math.isfinite(ms)) or b + p == 0:
                raise FormatError(f"{source}: record {i}: batch and prompt_tokens >= 0 (not both 0), ms >= 0")
            pts.append((b, p, ms))
        if len(pts) < 2:
            raise FormatError(f"{source}: need at least two measured steps to fit, got {len(pts)}")
        a = np.asarray(pts, dtype=np.float64)
        B, P, y = a[:, 0], a[:, 1], a[:, 2]
        decode = P == 0
        if decode.any() and (~decode).any():
            bs = np.unique(B[decode])
            knots = tuple((int(b), float(np.median(y[decode & (B == b)]))) for b in bs)
            f = np.interp(B, bs, [m for _, m in knots])
            if len(knots) > 1:
                s = (knots[-1][1] - knots[-2][1]) / (knots[-1][0] - knots[-2][0])
                f = np.where(B > bs[-1], knots[-1][1] + (B - bs[-1]) * s, f)
            tok = float(np.sum((y - f)[~decode] * P[~decode]) / np.sum(P[~decode] ** 2))
            if len(knots) == 1:  # one batch size: extend with the token cost
                knots = knots + ((knots[0][0] + 1, knots[0][1] + max(tok, 0.0)),)
        else:
            if not P.any():
                raise FormatError(f"{source}: no step with prompt tokens: cannot fit the cost of a prompt token")
            X = np.stack([np.ones_like(B), B, P], axis=1)
            (c0, cb, cp), *_ = np.linalg.lstsq(X, y, rcond=None)
            knots = ((0, float(max(c0, 0.0))), (1, float(max(c0 + cb, 0.0))))
            tok = float(cp)
        if tok < 0:
            raise FormatError(f"{source}: the fitted cost of a prompt token is negative ({tok:.4g} ms): "
                              "the measurements do not grow with prompt tokens")
        sc = cls(knots, tok, dist, cv, scale, layers, f"fitted to {len(pts)} measured steps ({source})")
        pred = np.asarray([sc.mean_ms(int(b), int(p)) * scale for b, p, _ in pts])
        rel = np.abs(pred - y) / np.maximum(y, 1e-9)
        object.__setattr__(sc, "fit", {"points": len(pts), "rms_ms": float(np.sqrt(np.mean((pred - y) ** 2))),
                                       "max_rel": float(rel.max())})
        return sc

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike], **kw) -> "StepCompute":
        """Fit measured steps from a CSV (``batch,prompt_tokens,ms``) or JSON file (a list of such objects, or
        ``{"steps": [...]}``).

        Raises
        ------
        FormatError
            An unreadable file or bad records (names the file).
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise FormatError(f"{p}: cannot read measured steps ({exc})") from None
        if p.suffix.lower() == ".json":
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                raise FormatError(f"{p}: not JSON ({exc})") from None
            recs = doc.get("steps") if isinstance(doc, dict) else doc
            if not isinstance(recs, list):
                raise FormatError(f"{p}: expected a list of {{batch, prompt_tokens, ms}} or {{\"steps\": [...]}}")
        else:
            recs = list(csv.DictReader(text.splitlines()))
        return cls.fitted(recs, source=str(p), **kw)

    def with_options(self, *, scale: Optional[float] = None, dist: Optional[str] = None, cv: Optional[float] = None,
                     layers: Optional[int] = None) -> "StepCompute":
        sc = StepCompute(self.knots, self.token_ms, dist or self.dist, self.cv if cv is None else cv,
                         self.scale if scale is None else scale, self.layers if layers is None else layers,
                         self.source)
        object.__setattr__(sc, "fit", self.fit)
        return sc

    def with_consumer(self, consumer: Consumer) -> "StepCompute":
        """This compute plus an Engram consumer (:class:`sim.core.params.Consumer`): every Engram layer's
        ``consumer.ms`` of the step's decode requests added at each knot (the knots of both, unscaled:
        ``scale`` speeds up the rest of the step, not the consumer), and the consumer's per-token slope
        added to ``token_ms`` (a prompt token through the consumer)."""
        if consumer.layers == 0 or all(m == 0 for _, m in consumer.knots):
            return self
        bs = sorted({b for b, _ in self.knots} | {b for b, _ in consumer.knots})
        knots = tuple((b, self.mean_ms(b) * self.scale + consumer.layers * consumer.ms(b) * self.scale) for b in bs)
        tok = self.token_ms + consumer.layers * consumer.slope_ms() * self.scale
        sc = StepCompute(knots, tok, self.dist, self.cv, self.scale, self.layers,
                         f"{self.source}; + consumer {consumer.name} ({consumer.source})")
        object.__setattr__(sc, "fit", self.fit)
        return sc

    # ------------------------------------------------------------------ using
    def mean_ms(self, batch: int, prompt_tokens: int = 0) -> float:
        """Mean milliseconds of a step with ``batch`` decode requests and ``prompt_tokens`` prompt tokens."""
        xs, ys = self._xs, self._ys
        b = float(batch)
        if b >= xs[-1]:
            f = ys[-1] + (b - xs[-1]) * self._slope
        elif b <= xs[0]:
            f = ys[0]
        else:
            i = bisect.bisect_right(xs, b)
            f = ys[i - 1] + (ys[i] - ys[i - 1]) * (b - xs[i - 1]) / (xs[i] - xs[i - 1])
        return (f + prompt_tokens * self.token_ms) / self.scale

    def multipliers(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """float64 ``[size]``: the spread of step times, mean 1 (all ones for a constant compute)."""
        if self.dist == "constant" or self.cv == 0:
            return np.ones(size)
        return Compute(1.0, self.dist, self.cv).sample(rng, size)

    def ceiling_tokens_per_s(self) -> float:
        """Tokens/s of the engine's largest batches: ``1000 / slope`` (inf for a flat ``f``)."""
        s = self._slope / self.scale
        return 1e3 / s if s > 0 else math.inf

    def to_dict(self) -> dict:
        return {"knots": [list(k) for k in self.knots], "token_ms": self.token_ms, "dist": self.dist, "cv": self.cv,
                "scale": self.scale, "layers": self.layers, "source": self.source, "fit": self.fit,
                "step_ms_batch1": self.mean_ms(1), "ceiling_tokens_per_s": self.ceiling_tokens_per_s()}

