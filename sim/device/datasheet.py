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
    reaches its IOPS, when given.
routing
    ``routing=random`` (stated, as the planner's datasheet strings do: :mod:`sim.check.planner`): each read
    queues at one channel drawn at random (``routing="random"`` of
    :class:`~sim.device.models.ParametricSSD`: the die that holds its page):
    the mean latency grows by ``1 / IOPS`` a read in flight from the QD1
    latency on, ``R(N) = qd1 + (N - 1) / iops`` (mean-value analysis), and the
    IOPS near the datasheet's figure only at deep queues, where datasheets
    measure it (QD 32 to 256).  Checked on measured drives: fio on a virtual
    disk at 512 B (QD1 97.4 us, 54,211 IOPS at QD 64: 150, 223, 376, 666 us at
    QD 4, 8, 16, 32 against fio's 349, 267, 390, 753; the first free channel
    97, 148, 295, 594) and the packaged ``vm-virtio-16core-4k`` from its QD1
    latency and peak (``ssd:qd1_us=31.9,iops=115802``: 12-18% below its
    latency at QD 2 to 16, within 8% at 32 and 64; the first free channel
    28-46% below at QD 2 to 8).  The default, ``routing=shared``, is the first
    free channel, as before (the simulator's studies and figures were made
    with it; its fast mode is checked against the exact one on it).
channel service cv
    ``cv`` when given; else, with ``p99_us`` (the 99th percentile latency at
    QD1), the cv of the gamma service time that puts the model's QD1 p99 there
    (bisection over the gamma's 99th percentile, computed from 100,000 draws of
    a fixed seed); else 0.5 (an assumption, not a measurement), or 1 with
    random routing (exponential service, for which the latency line below is
    exact; an assumption too).

A given ``parallelism`` that the QD1 latency cannot carry is an error that
says which values would work.

QD1 latency at or below 1/IOPS
    ``qd1_us x iops < 1`` says one read at a time already reaches the IOPS
    (a throttled volume measured by fio: its QD1 mean latency *is* 1/IOPS).
    Within 2% of 1 (the rounding of printed figures) the drive is taken with
    one channel whose service is ``1 / iops`` and no fixed delay: the QD1
    latency is raised to ``1 / iops`` (said in ``derived``).  Further below,
    the IOPS is below what one read at a time gives, which only a rate limit
    explains: the drive is taken as a raw drive of one channel serving each
    read in ``qd1_us`` behind a token bucket of ``iops`` tokens a second
    (:class:`~sim.device.models.RateLimitedDevice`; depth as for ``cap_iops``
    below), said in ``derived``.  Either reading with a given parallelism
    above 1 is the error above.

A rate-limited volume (``cap_iops``, ``burst_ios``)
    ``cap_iops`` puts a token bucket (:mod:`sim.device.bucket`) of that rate
    in front of the drive the other keys describe (the raw drive); a cap
    above the raw drive's IOPS is an error (one line).  ``burst_ios``, the
    bucket's depth in reads, when not given is ``cap_iops x 0.1 s``: the
    100 ms slice over which the Linux block throttle grants its budget
    (``DFL_THROTL_SLICE_HD = HZ / 10``, block/blk-throttle.c), an assumption
    said in ``derived``.  ``volume:qd1_us=..,cap_iops=..[,iops=..][,..]`` is
    the same with the raw drive's ``iops`` defaulting to ``cap_iops`` (only
    the bursts are shaped; assumed, said in ``derived``), and
    ``volume:type=gp2,size_gib=N,qd1_us=..`` an Amazon EBS gp2 volume: a
    baseline of 3 IOPS per GiB (at least 100, at most 16,000) with a bucket of
    5.4 million I/O credits and a burst ceiling of 3,000 IOPS (the raw drive's
    IOPS) for volumes whose baseline is below it ("General Purpose SSD
    volumes", Amazon EBS User Guide).  EBS documents no latency figure that a
    model could use ("single-digit millisecond"), so ``qd1_us`` is required.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from engram.errors import ArgumentError

from sim.core.schema import US
from sim.core.limits import MAX_QUEUE_DEPTH
from .models import MAX_BURST_IOS, MAX_IOPS, MAX_QD1_LATENCY, MIN_IOPS, MAX_SERVICE_CV, Device, ParametricSSD, RateLimitedDevice

__all__ = ["SPEC_KEYS", "VOLUME_KEYS", "Datasheet", "ssd_from_figures", "ssd_from_spec", "volume_from_spec"]

#: Keys of ``ssd:...``: name -> meaning.
SPEC_KEYS = {
    "qd1_us": "mean latency of one random read at queue depth 1, microseconds (required)",
    "iops": "random-read IOPS at 4 KiB, the datasheet's peak (required)",
    "iops_row": "random-read IOPS at the row's read size (default: iops)",
    "parallelism": "reads the drive serves at once, its channels (default: derived)",
    "cv": "coefficient of variation of a channel's service time (default: from p99_us, else 0.5)",
    "p99_us": "99th percentile latency at queue depth 1, microseconds (sets the cv)",
    "qd_peak": "queue depth at which the datasheet reaches its IOPS (caps the derived parallelism)",
    "cap_iops": "a rate limit in front of the drive, reads/s: a token bucket (a throttled or provisioned volume)",
    "burst_ios": "the bucket's depth, reads (default: cap_iops x 0.1 s, the Linux block throttle's slice)",
    "routing": "shared (default: a read takes the first free channel) or random (the channel holding its page: "
               "mean latency qd1_us + (N - 1) / iops at N in flight)",
}
#: Keys of ``volume:...`` besides those of ``ssd:...``.
VOLUME_KEYS = {
    "type": "gp2: an Amazon EBS gp2 volume (with size_gib); omitted: a generic volume (cap_iops required)",
    "size_gib": "the gp2 volume's size, GiB (its baseline is 3 IOPS a GiB, at least 100, at most 16,000)",
}
#: The Linux block throttle's slice (block/blk-throttle.c, ``DFL_THROTL_SLICE_HD = HZ / 10``), seconds: the
#: bucket depth assumed when ``burst_ios`` is not given is ``cap_iops`` times it.
THROTTLE_SLICE = 0.1
#: Amazon EBS gp2 ("General Purpose SSD volumes", Amazon EBS User Guide): IOPS a GiB of baseline, its floor and
#: ceiling, the burst ceiling, and the I/O credits a volume's bucket holds.
GP2_IOPS_PER_GIB, GP2_MIN_IOPS, GP2_MAX_IOPS, GP2_BURST_IOPS, GP2_CREDITS = 3.0, 100.0, 16000.0, 3000.0, 5.4e6
#: ``qd1_us x iops`` this close below 1 is the rounding of printed figures (one channel at 1/iops).
KNEE_ROUNDING = 0.02
#: Largest value of each key of ``ssd:...`` (its physical range, :data:`sim.device.models.MAX_IOPS` and its
#: peers); every key is > 0 (cv >= 0), and ``parallelism`` and ``qd_peak`` are whole numbers.
SPEC_MAX = {"qd1_us": MAX_QD1_LATENCY / US, "iops": MAX_IOPS, "iops_row": MAX_IOPS, "parallelism": MAX_QUEUE_DEPTH,
            "cv": MAX_SERVICE_CV, "p99_us": 10 * MAX_QD1_LATENCY / US, "qd_peak": MAX_QUEUE_DEPTH,
            "cap_iops": MAX_IOPS, "burst_ios": MAX_BURST_IOS}
#: Keys of ``ssd:...`` that are rates (reads a second): at least :data:`sim.device.models.MIN_IOPS`.
RATE_KEYS = ("iops", "iops_row", "cap_iops")
#: Keys of ``ssd:...`` that count things: whole numbers.
SPEC_WHOLE = ("parallelism", "qd_peak")
#: The channel service cv assumed when neither cv nor p99_us is given.
DEFAULT_SERVICE_CV = 0.5
#: ... and with random routing (exponential service: the mean-value analysis's latency line holds exactly).
ROUTED_SERVICE_CV = 1.0


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


@dataclass(frozen=True)
class Datasheet:
    """The figures of an SSD's datasheet that :func:`ssd_from_figures` builds a device from (the keys of
    ``ssd:...``, :data:`SPEC_KEYS`).  Every figure is a number within its physical range
    (:data:`SPEC_MAX`; rates at least :data:`sim.device.models.MIN_IOPS`), > 0 (``cv`` >= 0).

    Attributes
    ----------
    qd1_us : float
        Mean latency of one random read at queue depth 1, microseconds.
    iops : float
        Random-read IOPS at 4 KiB, the datasheet's peak.
    iops_row : float, optional
        Random-read IOPS at the row's read size (default: ``iops``).
    parallelism : int, optional
        Reads the drive serves at once, its channels (default: derived; a whole number).
    cv : float, optional
        Coefficient of variation of a channel's service time (default: from ``p99_us``, else 0.5, or 1
        with random routing).
    p99_us : float, optional
        99th percentile latency at queue depth 1, microseconds (sets ``cv``).
    qd_peak : int, optional
        Queue depth at which the datasheet reaches its IOPS (caps the derived parallelism; a whole number).
    cap_iops : float, optional
        A rate limit in front of the drive, reads a second: a token bucket.
    burst_ios : float, optional
        The bucket's depth, reads (default: ``cap_iops`` x 0.1 s); only with ``cap_iops``.
    routing : {"shared", "random"}, optional
        A read takes the first free channel (default) or the channel holding its page.

    Raises
    ------
    ArgumentError
        A routing other than shared or random, a figure that is not a number, outside its range or
        not whole where it counts things, ``burst_ios`` without ``cap_iops`` (each naming the key).
    """

    qd1_us: float
    iops: float
    iops_row: Optional[float] = None
    parallelism: Optional[int] = None
    cv: Optional[float] = None
    p99_us: Optional[float] = None
    qd_peak: Optional[int] = None
    cap_iops: Optional[float] = None
    burst_ios: Optional[float] = None
    routing: Optional[str] = None

    def __post_init__(self) -> None:
        if self.routing is not None and self.routing not in ParametricSSD.ROUTINGS:
            raise ArgumentError(f"ssd: routing = {self.routing!r}: expected one of "
                                f"{', '.join(ParametricSSD.ROUTINGS)}")
        for key in ("qd1_us", "iops", "iops_row", "p99_us", "qd_peak", "parallelism", "cv", "cap_iops", "burst_ios"):
            _check_figure(key, getattr(self, key))
        if self.burst_ios is not None and self.cap_iops is None:
            raise ArgumentError("ssd: burst_ios is the depth of a rate limit: give cap_iops with it")


def _check_figure(key: str, v) -> None:
    """``ArgumentError`` unless figure ``key`` is None or a number within its physical range."""
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"ssd: {key} = {v!r} is not a number")
    low_ok = v >= 0 if key == "cv" else (v >= MIN_IOPS if key in RATE_KEYS else v > 0)
    if not (math.isfinite(v) and low_ok and v <= SPEC_MAX[key]):
        low = "[0" if key == "cv" else (f"[{MIN_IOPS:g}" if key in RATE_KEYS else "(0")
        src = "sim.device.datasheet.SPEC_MAX" + (", sim.device.models.MIN_IOPS" if key in RATE_KEYS else "")
        raise ArgumentError(f"ssd: {key} = {float(v):g} is outside its physical range "
                            f"{low}, {SPEC_MAX[key]:g}] ({src})")
    if key in SPEC_WHOLE and v != int(v):
        raise ArgumentError(f"ssd: {key} = {float(v):g} must be a whole number")


class _Derivation:
    """The values :func:`ssd_from_figures` derives from a :class:`Datasheet`, step by step, and the rules
    it used (``derived``: name -> ``{"value", "rule"}``)."""

    def __init__(self, sheet: Datasheet):
        self.sheet = sheet
        self.parallelism = None if sheet.parallelism is None else int(sheet.parallelism)
        self.qd1 = sheet.qd1_us * US
        self.routing = sheet.routing or "shared"
        self.rate = float(sheet.iops_row if sheet.iops_row is not None else sheet.iops)
        self.cap_iops, self.capped_by_iops = sheet.cap_iops, False
        self.derived: dict = {}
        if sheet.iops_row is None:
            self.derived["iops_row"] = {"value": self.rate, "rule": "iops as given: a row is one read, of one "
                                                                    "aligned block of the device's read size (4 KiB, "
                                                                    "or 512 bytes on a 512-byte-sector disk) or two "
                                                                    "where it straddles a boundary (6.4% of rows at "
                                                                    "4 KiB), rated alike below the bandwidth limit"}
        self.knee = self.rate * self.qd1

    def below_knee(self) -> None:
        """A QD1 latency at or below 1 / IOPS: one channel at 1 / IOPS, or a rate limit (see the module)."""
        knee, qd1_us = self.knee, self.sheet.qd1_us
        if not (knee < 1.0 and (self.parallelism is None or self.parallelism == 1)):
            return
        if knee >= 1.0 - KNEE_ROUNDING or self.cap_iops is not None:
            self.qd1 = 1.0 / self.rate
            self.derived["qd1_us"] = {"value": self.qd1 / US,
                                      "rule": f"raised from {qd1_us:g} to 1/row IOPS: qd1_us x IOPS = "
                                              f"{knee:.4g} < 1, one read at a time reaches the IOPS "
                                              "(one channel at 1/IOPS, no fixed delay)"}
        else:  # IOPS below what one read at a time gives: a rate limit over a one-channel drive
            self.capped_by_iops, self.cap_iops = True, self.rate
            self.rate = 1.0 / self.qd1
            self.derived["cap_iops"] = {"value": self.cap_iops,
                                        "rule": f"the IOPS: qd1_us x IOPS = {knee:.4g}, well below 1, "
                                                "is a rate limit over a drive serving one read at a time "
                                                "in qd1_us (a throttled volume)"}
            self.derived["iops_row"] = {"value": self.rate, "rule": "1 / qd1_us: the raw drive behind the rate "
                                                                    "limit, one read at a time"}
        self.knee = self.rate * self.qd1

    def channels(self) -> None:
        """The parallelism: given, or the knee (capped at ``qd_peak``)."""
        knee, qd_peak = self.knee, self.sheet.qd_peak
        if knee > MAX_QUEUE_DEPTH:
            raise ArgumentError(f"ssd: row IOPS x QD1 latency = {knee:g} reads in flight to reach the ceiling, more "
                                f"than the deepest queue ({MAX_QUEUE_DEPTH}, sim.core.limits.MAX_QUEUE_DEPTH)")
        if self.parallelism is None:
            p = max(1, int(math.floor(knee * (1 + 1e-9))))
            rule = "floor(row IOPS x QD1 latency): the knee N* = X_max x R_min, all QD1 latency as channel service"
            if qd_peak is not None and p > int(qd_peak):
                p, rule = int(qd_peak), rule + f", capped at qd_peak {int(qd_peak)}"
            self.parallelism = p
            self.derived["parallelism"] = {"value": p, "rule": rule}

    def service_cv(self) -> float:
        """The channel service cv: given, fitted to ``p99_us``, or assumed."""
        cv, p99_us = self.sheet.cv, self.sheet.p99_us
        if cv is not None:
            return cv
        if p99_us is not None:
            svc = self.parallelism / self.rate
            if self.qd1 < svc * (1 - 1e-9):
                ParametricSSD(self.qd1, self.rate, self.parallelism)  # raises the explanatory error
            cv, note = _cv_for_p99(self.qd1, svc, p99_us * US)
        else:
            cv, note = ((ROUTED_SERVICE_CV, "assumed (no cv or p99_us given; random routing): exponential service, "
                                            "for which the mean latency is qd1_us + (N - 1) / IOPS exactly")
                        if self.routing == "random" else
                        (DEFAULT_SERVICE_CV, "assumed (no cv or p99_us given): not a measurement"))
        self.derived["cv"] = {"value": cv, "rule": note}
        return cv

    def rate_limited(self, drive: ParametricSSD, label: str) -> RateLimitedDevice:
        """``drive`` behind a token bucket of ``cap_iops`` (its depth given or assumed)."""
        cap_iops, burst_ios, derived = self.cap_iops, self.sheet.burst_ios, self.derived
        if burst_ios is None:
            burst_ios = max(1.0, cap_iops * THROTTLE_SLICE)
            derived["burst_ios"] = {"value": burst_ios, "rule": f"assumed: cap_iops x {THROTTLE_SLICE:g} s, the "
                                                                "Linux block throttle's slice (block/blk-throttle.c)"}
        if cap_iops > self.rate * (1 + 1e-9):
            raise ArgumentError(f"ssd: cap_iops = {cap_iops:g} is above the drive's {self.rate:g} IOPS: the rate "
                                "limit would never bind (give iops above the cap, or leave cap_iops out)")
        what = "IOPS read as a rate limit" if self.capped_by_iops else "datasheet figures and a rate limit"
        return RateLimitedDevice(drive, cap_iops, burst_ios, name=f"{label}-cap{cap_iops:g}-burst{burst_ios:g}",
                                 source=f"{what}: a token bucket of {cap_iops:g} IOPS, {burst_ios:g} reads deep, "
                                        f"over {label}", derived=derived)


def ssd_from_figures(sheet: Datasheet, *, name: Optional[str] = None) -> Device:
    """A :class:`ParametricSSD` from datasheet figures (see the module for the rules); ``derived`` lists
    what was derived and how.  With ``cap_iops`` (or a QD1 latency well below ``1 / iops``: see the module) a
    :class:`RateLimitedDevice` over that drive.  ``name``: the device's name (default from the figures).

    Raises
    ------
    ArgumentError
        A p99 below the QD1 latency, a given parallelism the QD1 latency cannot carry (names the values
        that work), a cap above the drive's IOPS (the figures themselves are checked by :class:`Datasheet`).
    """
    d = _Derivation(sheet)
    d.below_knee()
    d.channels()
    cv = d.service_cv()
    qd1, rate, parallelism, derived = d.qd1, d.rate, d.parallelism, d.derived
    delay = max(0.0, qd1 - parallelism / rate)
    derived["delay_us"] = {"value": delay / US, "rule": "qd1_us - parallelism / row IOPS (pipelined)"}
    derived["knee_qd"] = {"value": d.knee, "rule": "row IOPS x QD1 latency: the depth from which IOPS is at its peak"}
    label = name or f"ssd-qd1-{sheet.qd1_us:g}us-{rate:g}iops-p{parallelism}"
    guessed = [k for k in ("qd1_us", "iops_row", "parallelism", "cv") if k in derived]
    source = "datasheet figures" + (f"; derived: {', '.join(guessed)} (see 'derived')" if guessed else "")
    drive = ParametricSSD(qd1, rate, parallelism, float(cv), name=label, source=source, derived=derived,
                          routing=d.routing)
    if d.cap_iops is None:
        return drive
    return d.rate_limited(drive, label)


def _parse(spec: str, keys: dict, text: tuple = ()) -> dict:
    """``key=value,...`` of a spec: numbers, except the keys in ``text``.

    Raises
    ------
    ArgumentError
        An unknown key (lists the keys), a key given twice, a value that is not a number.
    """
    body = spec.split(":", 1)[1] if ":" in spec else spec
    kv = {}
    for part in filter(None, (x.strip() for x in body.split(","))):
        k, _, v = part.partition("=")
        k = k.strip()
        if k not in keys:
            raise ArgumentError(f"device spec {spec!r}: unknown key {k!r}; keys: " +
                                "; ".join(f"{a} ({b})" for a, b in keys.items()))
        if k in kv:
            raise ArgumentError(f"device spec {spec!r}: key {k!r} given twice")
        if k in text:
            kv[k] = v.strip()
            continue
        try:
            kv[k] = float(v)
        except ValueError:
            raise ArgumentError(f"device spec {spec!r}: {k}={v!r} is not a number") from None
    return kv


def ssd_from_spec(spec: str) -> Device:
    """From ``"ssd:qd1_us=80,iops=500000[,iops_row=..][,parallelism=..][,cv=..][,p99_us=..][,qd_peak=..]
    [,cap_iops=..][,burst_ios=..]"``: a :class:`ParametricSSD`, or with ``cap_iops`` (or a QD1 latency well
    below 1/IOPS) a :class:`RateLimitedDevice` over one (see the module).

    Raises
    ------
    ArgumentError
        Unknown or missing keys, values that are not numbers (names them and lists the keys).
    """
    kv = _parse(spec, SPEC_KEYS, text=("routing",))
    for need in ("qd1_us", "iops"):
        if need not in kv:
            raise ArgumentError(f"device spec {spec!r}: missing {need!r} ({SPEC_KEYS[need]}); "
                                "e.g. ssd:qd1_us=80,iops=500000")
    try:
        return ssd_from_figures(Datasheet(**kv))
    except ArgumentError as exc:
        raise ArgumentError(f"device spec {spec!r}: {exc}") from None


def volume_from_spec(spec: str) -> RateLimitedDevice:
    """From ``"volume:qd1_us=..,cap_iops=..[,burst_ios=..][,iops=..][,ssd keys]"`` (a generic rate-limited
    volume; the raw drive's ``iops`` defaults to ``cap_iops``) or ``"volume:type=gp2,size_gib=N,qd1_us=.."``
    (an Amazon EBS gp2 volume): see the module.

    Raises
    ------
    ArgumentError
        Unknown or missing keys, an unknown type, figures out of range (one line, naming the spec).
    """
    keys = {**SPEC_KEYS, **VOLUME_KEYS}
    kv = _parse(spec, keys, text=("type", "routing"))
    kind = kv.pop("type", None)
    derived = {}
    if kind is not None:
        if kind != "gp2":
            raise ArgumentError(f"device spec {spec!r}: unknown volume type {kind!r} (known: gp2; other volumes: "
                                "volume:qd1_us=..,cap_iops=..,burst_ios=..)")
        if "size_gib" not in kv:
            raise ArgumentError(f"device spec {spec!r}: a gp2 volume needs size_gib ({VOLUME_KEYS['size_gib']})")
        for k in ("cap_iops", "burst_ios", "iops"):
            if k in kv:
                raise ArgumentError(f"device spec {spec!r}: {k} is set by type=gp2 (from size_gib); leave it out")
        size = kv.pop("size_gib")
        if not (math.isfinite(size) and 1 <= size <= 16384):
            raise ArgumentError(f"device spec {spec!r}: size_gib = {size:g} is outside a gp2 volume's [1, 16384] GiB")
        base = min(GP2_MAX_IOPS, max(GP2_MIN_IOPS, GP2_IOPS_PER_GIB * size))
        kv["cap_iops"] = base
        kv["iops"] = max(base, GP2_BURST_IOPS)
        kv["burst_ios"] = GP2_CREDITS if base < GP2_BURST_IOPS else max(1.0, base * THROTTLE_SLICE)
        derived["gp2"] = {"value": base, "rule": f"baseline IOPS of a {size:g} GiB gp2 volume (3 a GiB, 100 to "
                                                 "16,000); burst to 3,000 IOPS from 5.4 million credits below "
                                                 "3,000 (Amazon EBS User Guide)"}
    elif "size_gib" in kv:
        raise ArgumentError(f"device spec {spec!r}: size_gib applies to type=gp2")
    for need in ("qd1_us", "cap_iops"):
        if need not in kv:
            raise ArgumentError(f"device spec {spec!r}: missing {need!r} ({SPEC_KEYS[need]}); "
                                "e.g. volume:qd1_us=500,cap_iops=3000,burst_ios=3000")
    if "iops" not in kv:
        kv["iops"] = kv["cap_iops"]
        derived["iops"] = {"value": kv["iops"], "rule": "assumed: the raw drive's IOPS is the cap (the bucket "
                                                        "shapes the bursts only)"}
    try:
        dev = ssd_from_figures(Datasheet(**kv))
    except ArgumentError as exc:
        raise ArgumentError(f"device spec {spec!r}: {exc}") from None
    dev.derived.update(derived)
    return dev
