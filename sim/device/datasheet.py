"""An SSD from what its datasheet gives: QD1 latency and random-read IOPS, the rest derived by stated rules.

``ssd:qd1_us=80,iops=500000`` is enough; :func:`ssd_from_figures` builds the
:class:`~sim.device.models.ParametricSSD` (fixed delay, then ``parallelism``
FIFO channels) and records in its ``derived`` field every value it derived
and the rule it used:

row IOPS
    ``iops_row`` (the random-read IOPS at the row's read size) when given,
    else ``iops`` (4 KiB): a 264-byte row is read as one aligned 4 KiB block, or
    8 KiB for the 263 in 4096 rows (6.4%) that straddle a block boundary
    (SPEC §8), and drives rate both sizes alike below their bandwidth limit.
parallelism
    when not given, ``floor(row IOPS x QD1 latency)``: the knee
    ``N* = X_max x R_min`` of operational analysis (Denning and Buzen, 1978),
    taking all of the QD1 latency as channel service (no fixed delay, up to
    the rounding); at most ``qd_peak``, the queue depth at which the datasheet
    reaches its IOPS, when given.  The knee itself -- the depth from which the
    model delivers its IOPS -- does not depend on this split.
channel service cv
    ``cv`` when given; else, with ``p99_us`` (the 99th percentile latency at
    QD1), the cv of the gamma service time that puts the model's QD1 p99 there
    (bisection over the gamma's 99th percentile, computed from 100,000 draws of
    a fixed seed); else 0.5 (an assumption, not a measurement).

A given ``parallelism`` that the QD1 latency cannot carry is an error that
says which values would work.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from engram.errors import ArgumentError

from ..schema import US
from ..limits import MAX_QUEUE_DEPTH
from .models import MAX_IOPS, MAX_QD1_LATENCY, MAX_SERVICE_CV, ParametricSSD

__all__ = ["SPEC_KEYS", "ssd_from_figures", "ssd_from_spec"]

#: Keys of ``ssd:...``: name -> meaning.
SPEC_KEYS = {
    "qd1_us": "mean latency of one random read at queue depth 1, microseconds (required)",
    "iops": "random-read IOPS at 4 KiB, the datasheet's peak (required)",
    "iops_row": "random-read IOPS at the row's read size (default: iops)",
    "parallelism": "reads the drive serves at once, its channels (default: derived)",
    "cv": "coefficient of variation of a channel's service time (default: from p99_us, else 0.5)",
    "p99_us": "99th percentile latency at queue depth 1, microseconds (sets the cv)",
    "qd_peak": "queue depth at which the datasheet reaches its IOPS (caps the derived parallelism)",
}
#: Largest value of each key of ``ssd:...`` (its physical range, :data:`sim.device.models.MAX_IOPS` and its
#: peers); every key is > 0 (cv >= 0), and ``parallelism`` and ``qd_peak`` are whole numbers.
SPEC_MAX = {"qd1_us": MAX_QD1_LATENCY / US, "iops": MAX_IOPS, "iops_row": MAX_IOPS, "parallelism": MAX_QUEUE_DEPTH,
            "cv": MAX_SERVICE_CV, "p99_us": 10 * MAX_QD1_LATENCY / US, "qd_peak": MAX_QUEUE_DEPTH}
#: Keys of ``ssd:...`` that count things: whole numbers.
SPEC_WHOLE = ("parallelism", "qd_peak")
#: The channel service cv assumed when neither cv nor p99_us is given.
DEFAULT_SERVICE_CV = 0.5


def _gamma_p99(cv: float) -> float:
    """99th percentile of a gamma distribution of mean 1 and coefficient of variation ``cv``."""
    if cv <= 0:
        return 1.0
    shape = 1.0 / (cv * cv)
    x = np.random.default_rng(20260101).gamma(shape, 1.0 / shape, 100_000)
    return float(np.quantile(x, 0.99))


def _cv_for_p99(qd1: float, service: float, p99: float) -> tuple:
    """(cv, note): the service cv that puts the QD1 p99 of ``delay + gamma service`` at ``p99`` (seconds)."""
    delay = qd1 - service
    target = (p99 - delay) / service
    if target <= 1.0:
        raise ArgumentError(f"ssd: p99_us = {p99 / US:g} must be above the QD1 latency qd1_us = {qd1 / US:g}")
    lo, hi = 0.0, 4.0
    if _gamma_p99(hi) < target:
        return hi, f"cv capped at {hi:g}: p99 {p99 / US:g} us needs a heavier tail than a gamma service gives"
    for _ in range(30):
        mid = (lo + hi) / 2
        if _gamma_p99(mid) < target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4), "gamma service cv whose QD1 99th percentile is p99_us"


def ssd_from_figures(qd1_us: float, iops: float, *, iops_row: Optional[float] = None,
                     parallelism: Optional[int] = None, cv: Optional[float] = None, p99_us: Optional[float] = None,
                     qd_peak: Optional[int] = None, name: Optional[str] = None) -> ParametricSSD:
    """A :class:`ParametricSSD` from datasheet figures (see the module for the rules); ``derived`` lists
    what was derived and how.

    Raises
    ------
    ArgumentError
        Non-positive figures, a p99 below the QD1 latency, or a given
        parallelism the QD1 latency cannot carry (names the values that work).
    """
    for key, v in (("qd1_us", qd1_us), ("iops", iops), ("iops_row", iops_row), ("p99_us", p99_us),
                   ("qd_peak", qd_peak), ("parallelism", parallelism), ("cv", cv)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ArgumentError(f"ssd: {key} = {v!r} is not a number")
        low_ok = v >= 0 if key == "cv" else v > 0
        if not (math.isfinite(v) and low_ok and v <= SPEC_MAX[key]):
            raise ArgumentError(f"ssd: {key} = {float(v):g} is outside its physical range "
                                f"{'[0' if key == 'cv' else '(0'}, {SPEC_MAX[key]:g}] (sim.device.datasheet.SPEC_MAX)")
        if key in SPEC_WHOLE and v != int(v):
            raise ArgumentError(f"ssd: {key} = {float(v):g} must be a whole number")
    parallelism = None if parallelism is None else int(parallelism)
    qd_peak = None if qd_peak is None else int(qd_peak)
    qd1 = qd1_us * US
    rate = float(iops_row if iops_row is not None else iops)
    derived = {}
    if iops_row is None:
        derived["iops_row"] = {"value": rate, "rule": "the 4 KiB IOPS: a row is read as one aligned 4 KiB block "
                                                      "(8 KiB for the 6.4% that straddle a boundary)"}
    knee = rate * qd1
    if knee > MAX_QUEUE_DEPTH:
        raise ArgumentError(f"ssd: row IOPS x QD1 latency = {knee:g} reads in flight to reach the ceiling, more than "
                            f"the deepest queue ({MAX_QUEUE_DEPTH}, sim.limits.MAX_QUEUE_DEPTH)")
    if parallelism is None:
        p = max(1, int(math.floor(knee * (1 + 1e-9))))
        rule = "floor(row IOPS x QD1 latency): the knee N* = X_max x R_min, all QD1 latency as channel service"
        if qd_peak is not None and p > qd_peak:
            p, rule = int(qd_peak), rule + f", capped at qd_peak {int(qd_peak)}"
        parallelism = p
        derived["parallelism"] = {"value": p, "rule": rule}
    if cv is None:
        if p99_us is not None:
            svc = int(parallelism) / rate
            if qd1 < svc * (1 - 1e-9):
                ParametricSSD(qd1, rate, int(parallelism))  # raises the explanatory error
            cv, note = _cv_for_p99(qd1, svc, p99_us * US)
        else:
            cv, note = DEFAULT_SERVICE_CV, "assumed (no cv or p99_us given): not a measurement"
        derived["cv"] = {"value": cv, "rule": note}
    delay = max(0.0, qd1 - int(parallelism) / rate)
    derived["delay_us"] = {"value": delay / US, "rule": "qd1_us - parallelism / row IOPS (pipelined)"}
    derived["knee_qd"] = {"value": knee, "rule": "row IOPS x QD1 latency: the depth from which IOPS is at its peak"}
    label = name or f"ssd-qd1-{qd1_us:g}us-{rate:g}iops-p{int(parallelism)}"
    guessed = [k for k in ("iops_row", "parallelism", "cv") if k in derived]
    source = "datasheet figures" + (f"; derived: {', '.join(guessed)} (see 'derived')" if guessed else "")
    return ParametricSSD(qd1, rate, int(parallelism), float(cv), name=label, source=source, derived=derived)


def ssd_from_spec(spec: str) -> ParametricSSD:
    """From ``"ssd:qd1_us=80,iops=500000[,iops_row=..][,parallelism=..][,cv=..][,p99_us=..][,qd_peak=..]"``.

    Raises
    ------
    ArgumentError
        Unknown or missing keys, values that are not numbers (names them and lists the keys).
    """
    body = spec.split(":", 1)[1] if ":" in spec else spec
    kv = {}
    for part in filter(None, (x.strip() for x in body.split(","))):
        k, _, v = part.partition("=")
        k = k.strip()
        if k not in SPEC_KEYS:
            raise ArgumentError(f"device spec {spec!r}: unknown key {k!r}; keys: " +
                                "; ".join(f"{a} ({b})" for a, b in SPEC_KEYS.items()))
        if k in kv:
            raise ArgumentError(f"device spec {spec!r}: key {k!r} given twice")
        try:
            kv[k] = float(v)
        except ValueError:
            raise ArgumentError(f"device spec {spec!r}: {k}={v!r} is not a number") from None
    for need in ("qd1_us", "iops"):
        if need not in kv:
            raise ArgumentError(f"device spec {spec!r}: missing {need!r} ({SPEC_KEYS[need]}); "
                                "e.g. ssd:qd1_us=80,iops=500000")
    p, qp = kv.get("parallelism"), kv.get("qd_peak")
    try:
        return ssd_from_figures(kv["qd1_us"], kv["iops"], iops_row=kv.get("iops_row"),
                                parallelism=p, cv=kv.get("cv"), p99_us=kv.get("p99_us"), qd_peak=qp)
    except ArgumentError as exc:
        raise ArgumentError(f"device spec {spec!r}: {exc}") from None
