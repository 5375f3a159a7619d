"""The device and compute of each measured run's own time window, fitted from the run's probe steps.

Every decode run of :mod:`sim.measure` interleaves probe steps with its trace
steps: the same session (or sessions) steps a random token id before every
``every``-th trace step and after the last, with the same compute after it
(:func:`sim.measure.runs.session_loop`).  A probe step reads fresh random
rows through the same readers and I/O engine, at the same time and with the
same other sessions as the trace steps around it, so it sees the device, the
engine and the CPUs in the state the run saw -- on a shared machine that
state moves from second to second.  The probes are a microbenchmark
(``microbench.json``, tool ``"session"``); the trace steps stay in
``runs.json`` and are never read here.

:func:`window_state` turns one run's probes into the factors the run is
predicted with (:meth:`sim.check.calibrate.Calibration.window_models`):

compute factor ``g``
    the probes' mean compute over the calibrated compute's mean (None for
    the compute ``none``);
device factor ``f``
    the calibrated device scaled by ``f`` makes the simulator reproduce the
    probes' mean read time (hash, rows, decode).  One session: ``f = (read -
    hash) / E[batch]`` over the probes' batches (the simulator's read of one
    session is its batch alone).  Several sessions: the simulator runs the
    window's sessions (their measured start offsets, every step a probe-like
    step of fresh rows, the window's compute) and ``f`` is found by a secant
    search in ``log f`` (:data:`FIT_TOL`); so whatever slows a step when
    many sessions share the machine -- the device, the engine's queue, the
    CPUs that hash, wake readers and decode for every session -- is in the
    device of that window, at that number of sessions.

batch shape (one session)
    the probes' own batch times (read less hash, ``batch_samples_us``)
    replace the calibrated 48-row batch of the window's readers
    (:func:`window_device`), scaled to the same mean (so ``f`` still holds):
    the shape of a step's read moves with the machine's state as much as its
    scale, and a shape measured in another window puts the median wrong (on a
    busy 2-core machine the cross-check's step p50 error fell from a median
    5.96%, max 35%, to 1.60%, max 11.7%: BENCHMARKS.md); means agree as
    before.
    Several sessions keep the calibrated shape scaled by ``f`` (their probes'
    reads hold the queueing among sessions, not a batch alone).
compute shape
    likewise the probes' own compute times (``compute_samples_us``) are the
    window's compute (:func:`window_compute`; their mean is ``g`` times the
    calibrated one): a loaded CPU stretches some steps' compute and not
    others, and the median moves apart from the mean.

The window's uncertainty, for the cross-check's prediction interval: the
relative standard error of the probes' mean read and compute
(``read_se``, ``compute_se``), and ``step_cv``, the step-to-step variation of
a probe step's time (read + compute) that a slow drift of the machine does
not explain (from differences of neighbouring steps in time: ``sqrt(mean(
(x[i] - x[i-1])^2) / 2) / mean(x)``), with which the run's own mean over its
steps varies; ``device_first`` and ``device_second`` are ``f`` from the first
and second half of the probes (how much the window drifted).  A short window can
miss the rare stalls of a loaded machine and then looks both faster and
steadier than it was: :func:`window_noise` takes its noise as at least the
median noise of its configuration's windows in every round.

A window of fewer than :data:`WINDOW_MIN_STEPS` probe steps is not fitted
(:func:`window_states` leaves it out): its noise cannot be told from its
drift, and its run is predicted with the calibrated device and compute, as a
run without probes is.  The several-session fit simulates at most
:data:`FIT_MAX_STEPS` steps a session: it needs a mean read, not the whole
measured loop.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from engram.errors import ArgumentError

from sim.decode import DecodeRun, simulate_decode
from sim.device import LatencyDist, MeasuredBatchDevice
from sim.core.params import Compute, Phases, Policy
from sim.core.schema import STEP_ROWS, TABLE_COLUMNS, US, ComputeSpec, probe_positions
from sim.trace import Trace

__all__ = ["FIT_ITERATIONS", "FIT_MAX_STEPS", "FIT_TOL", "SHAPE_MIN_STEPS", "WINDOW_MIN_STEPS", "insert_probes", "random_rows", "scale_device",
           "step_noise", "window_compute", "window_device", "window_noise", "window_state", "window_states"]

#: A window's device factor is fitted until the simulated mean read is within this share of the probes'.
FIT_TOL = 0.005
#: Most simulations of one window's fit.
FIT_ITERATIONS = 8
#: Most and least slope of log(simulated read) in log(f) the secant search trusts.
_SLOPES = (0.2, 5.0)
#: Probe steps a window needs for its own batch and compute shape (fewer: the calibrated shapes, scaled).
SHAPE_MIN_STEPS = 8
#: Probe steps a window needs to be fitted at all (fewer: no state; its run is predicted with the calibrated
#: device and compute, as a run without probes is): its noise (:func:`step_noise`) needs 3 steps.
WINDOW_MIN_STEPS = 3
#: Most steps a session of the several-session fit simulates: the fit needs the mean read, not the whole loop
#: (a window's ``session_steps`` may be a million).
FIT_MAX_STEPS = 4096


def scale_device(dev: MeasuredBatchDevice, factor: float, name: Optional[str] = None) -> MeasuredBatchDevice:
    """``dev`` with every read latency and batch time multiplied by ``factor`` (a slower or faster window)."""
    return MeasuredBatchDevice({q: d.scaled(factor) for q, d in dev.measured.items()},
                               {key: d.scaled(factor) for key, d in dev.batches.items()},
                               name=name or dev.name, source=dev.source)


def window_device(dev: MeasuredBatchDevice, state: Mapping, name: Optional[str] = None) -> MeasuredBatchDevice:
    """The device of one window: ``dev`` scaled by the window's factor ``f``, and for one session the 48-row
    batch of its readers replaced by the probes' own batch times (``batch_samples_us``) scaled to that batch's
    mean (see the module docstring).  ``state``: a :func:`window_state`."""
    scaled = scale_device(dev, max(1e-3, float(state["device"])), name)
    samples = state.get("batch_samples_us") or ()
    if int(state.get("sessions", 1)) > 1 or len(samples) < SHAPE_MIN_STEPS:
        return scaled
    k = int(state["readers"])
    key = (STEP_ROWS, Policy(threshold=int(state["threshold"]), backend=str(state.get("backend", "pread")), readers=k,
                             ring_depth=k).concurrency(STEP_ROWS))
    own = LatencyDist.from_samples(np.asarray(samples, dtype=np.float64) * US, knots=len(samples),
                                   source=f"probe steps of window {name or dev.name}")
    mean = scaled.batch_dist(*key).mean
    if own.mean <= 0 or mean <= 0:
        return scaled
    batches = dict(scaled.batches)
    batches[key] = own.scaled(mean / own.mean)
    return MeasuredBatchDevice(scaled.measured, batches, name=scaled.name, source=scaled.source)


def window_compute(comp: Compute, state: Mapping) -> Compute:
    """The compute of one window: the probes' own compute times (``compute_samples_us``) with ``comp``'s layers
    when there are :data:`SHAPE_MIN_STEPS` of them, else ``comp`` scaled by the window's factor ``g`` (``comp``
    itself for the compute ``none``).  ``state``: a :func:`window_state`."""
    if state.get("compute") is None or not comp.samples:
        return comp
    own = state.get("compute_samples_us") or ()
    if len(own) >= SHAPE_MIN_STEPS:
        return Compute.empirical([float(x) * US for x in own], comp.layers)
    g = max(1e-3, float(state["compute"]))
    return Compute.empirical([x * g for x in comp.samples], comp.layers)


def random_rows(steps: int, seed, layers: int = 2, columns: int = TABLE_COLUMNS) -> np.ndarray:
    """uint32 ``[steps, layers, columns]`` random row ids, all distinct within a step (as a probe step reads)."""
    return np.random.default_rng(seed).integers(0, 2**31, (steps, layers, columns)).astype(np.uint32)


def insert_probes(rows: np.ndarray, every: int, seed) -> tuple:
    """``(rows with probe steps, bool mask of the trace steps)``: random-row steps inserted into one session's
    ``[n, layers, columns]`` rows where :func:`sim.core.schema.probe_positions` puts them."""
    n = rows.shape[0]
    where = probe_positions(n, every)
    if not where.size:
        return rows, np.ones(n, bool)
    probe = random_rows(where.size, seed, rows.shape[1], rows.shape[2])
    out = np.insert(rows, where, probe, axis=0)
    mask = np.ones(out.shape[0], bool)
    mask[where + np.arange(where.size)] = False
    return out, mask


def step_noise(t: np.ndarray, x: np.ndarray) -> float:
    """Relative step-to-step variation of ``x`` sampled at times ``t``, without its slow drift:
    ``sqrt(mean(diff(x sorted by t)^2) / 2) / mean(x)`` (0 with fewer than 3 samples)."""
    x = np.asarray(x, dtype=np.float64)[np.argsort(np.asarray(t), kind="stable")]
    if x.size < 3 or x.mean() <= 0:
        return 0.0
    return float(math.sqrt(np.mean(np.diff(x) ** 2) / 2) / x.mean())


def _batch_mean(dev: MeasuredBatchDevice, n: int, policy: Policy) -> float:
    """Mean time of a step's batch of ``n`` distinct rows alone on ``dev``, read as the simulator reads it."""
    if n < 1:
        return 0.0
    return dev.batch_dist(n, policy.concurrency(n)).mean


def _fit_sessions(read_of: Callable[[float], float], target: float, f0: float) -> tuple:
    """``(f, relative residual, simulations)``: the secant search in ``log f`` for ``read_of(f) == target``."""
    x0, y0 = math.log(f0), math.log(read_of(f0) / target)
    best = (abs(y0), f0)
    if abs(y0) <= FIT_TOL:
        return f0, y0, 1
    x1 = x0 - y0
    n = 1
    while n < FIT_ITERATIONS:
        y1 = math.log(read_of(math.exp(x1)) / target)
        n += 1
        best = min(best, (abs(y1), math.exp(x1)))
        if abs(y1) <= FIT_TOL:
            break
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 1.0
        slope = min(max(slope, _SLOPES[0]), _SLOPES[1])
        x0, y0, x1 = x1, y1, x1 - y1 / slope
    return best[1], math.copysign(best[0], 1.0), n


def window_state(rec: Mapping, device: MeasuredBatchDevice, compute: Optional[Compute], hash_s: float,
                 seed: int = 0) -> dict:
    """The device and compute of one run's window, from its probe record (see the module docstring).

    Parameters
    ----------
    rec : mapping
        A probe record (kind ``"io"``, tool ``"session"``; :func:`sim.measure.runs.probe_record`).
    device : MeasuredBatchDevice
        The calibrated device of the record's backend and compute.
    compute : Compute or None
        The calibrated compute of the record's compute spec (None: not calibrated).
    hash_s : float
        The calibrated hash time of a step (seconds).
    seed : int
        Seed of the simulation of several sessions and of their random rows.

    Returns
    -------
    dict
        ``{"backend", "qd", "threshold", "readers", "sessions", "mode", "compute_label", "probe_steps",
        "read_mean_us", "device", "device_first", "device_second", "read_se", "compute", "compute_se",
        "step_cv", "fit_residual", "fit_simulations", "batch_samples_us", "compute_samples_us"}`` (one session's probe
        steps of 48 distinct rows, read less hash, sorted, µs; empty for several sessions; then their compute
        times, sorted, µs, empty for the compute ``none``).

    Raises
    ------
    ArgumentError
        A record without probe steps.
    """
    read = np.asarray(rec["batch_us"], dtype=np.float64) * US
    comp = np.asarray(rec.get("compute_us", ()), dtype=np.float64) * US
    t = np.asarray(rec.get("t_us", np.arange(read.size)), dtype=np.float64) * US
    if not read.size:
        raise ArgumentError(f"probe record of window {rec.get('probe')!r} has no probe steps")
    if comp.size != read.size:
        comp = np.zeros(read.size)
    m = read.size
    label = ComputeSpec.parse(rec.get("compute", "none")).label
    policy = Policy(threshold=int(rec["threshold"]), backend=rec["backend"], readers=int(rec["readers"]),
                    ring_depth=int(rec["readers"]))
    g, g_se, wcomp = _window_compute(comp, t, label, compute)
    n, count = np.unique(np.asarray(rec.get("distinct") or [STEP_ROWS] * m, dtype=np.int64), return_counts=True)
    expect = float(np.dot([_batch_mean(device, int(x), policy) for x in n], count) / m)
    f0 = max(1e-3, (read.mean() - hash_s) / expect) if expect > 0 else 1.0
    f, resid, sims = _fit_device(rec, device, policy, wcomp, float(read.mean()), hash_s, seed, f0)
    first, second = _halves(t, read, f, hash_s)
    dist = np.asarray(rec.get("distinct") or [STEP_ROWS] * m, dtype=np.int64)
    own = np.sort(np.maximum(read[dist == STEP_ROWS] - hash_s, 0.0)) / US if int(rec.get("sessions", 1)) == 1 else []
    return {"backend": rec["backend"], "qd": int(rec.get("qd", policy.readers)), "threshold": policy.threshold,
            "readers": policy.readers, "sessions": int(rec.get("sessions", 1)), "mode": rec.get("mode", "threads"),
            "compute_label": label, "probe_steps": int(m), "read_mean_us": float(read.mean()) / US,
            "device": float(f), "device_first": first, "device_second": second,
            "read_se": step_noise(t, read) / math.sqrt(m), "compute": g, "compute_se": g_se,
            "step_cv": step_noise(t, read + comp), "fit_residual": float(resid), "fit_simulations": int(sims),
            "batch_samples_us": [round(float(x), 3) for x in own],
            "compute_samples_us": [round(float(x), 3) for x in np.sort(comp) / US] if g is not None else []}


def _window_compute(comp: np.ndarray, t: np.ndarray, label: str, compute: Optional[Compute]) -> tuple:
    """``(factor, its relative standard error, the window's compute model)`` from the probes' compute times
    (``None, None`` for the compute ``none`` or an uncalibrated one); the model is the one the prediction uses
    (:func:`window_compute`), so that several sessions are fitted with the compute they are predicted with."""
    g = g_se = None
    if label != "none" and compute is not None and compute.mean > 0 and comp.mean() > 0:
        g = float(comp.mean() / compute.mean)
        g_se = step_noise(t, comp) / math.sqrt(comp.size)
    if compute is None or not compute.samples:
        return g, g_se, (Compute.empirical(comp.tolist()) if comp.any() else Compute(0.0))
    return g, g_se, window_compute(compute, {"compute": g, "compute_samples_us": (comp / US).tolist()})


def _fit_device(rec: Mapping, device: MeasuredBatchDevice, policy: Policy, compute: Compute, read_mean: float,
                hash_s: float, seed: int, f0: float) -> tuple:
    """``(f, relative residual, simulations)``: one session's ``f0`` as it is; several sessions' fitted by
    simulating them (their measured start offsets, every step of fresh random rows, at most
    :data:`FIT_MAX_STEPS` steps a session) until the simulated mean read is the probes' (:func:`_fit_sessions`)."""
    sessions = int(rec.get("sessions", 1))
    if sessions <= 1:
        return f0, 0.0, 0
    steps = min(FIT_MAX_STEPS, int(rec.get("session_steps") or max(1, len(rec["batch_us"]) // sessions)))
    offsets = [float(x) for x in rec.get("offsets_s") or [0.0] * sessions]
    trace = Trace(random_rows(sessions * steps, [seed, 13]), np.zeros(sessions * steps, np.int64))

    def read_of(x: float) -> float:
        r = simulate_decode(trace, scale_device(device, x), policy, compute,
                            DecodeRun(sessions=sessions, steps=steps, mode="fast", seed=seed, hash_time=hash_s,
                                      phases=Phases.at(offsets)))
        return r.stall_ms["mean"] * 1e-3 + hash_s

    return _fit_sessions(read_of, read_mean, f0)


def _halves(t: np.ndarray, read: np.ndarray, f: float, hash_s: float) -> tuple:
    """The device factor of the first and the second half of the probe steps in time (``f`` scaled by their
    reads over all); both halves are all the steps when there are fewer than 4."""
    m = read.size
    order = np.argsort(t, kind="stable")
    half = [order[: m // 2], order[m // 2:]] if m >= 4 else [order, order]
    own = read.mean() - hash_s
    return tuple(float(f * (read[idx].mean() - hash_s) / own) if own > 0 else float(f) for idx in half)


def window_states(probes: Sequence[Mapping], device_of: Callable[[str, str], Optional[MeasuredBatchDevice]],
                  computes: Mapping[str, Compute], hash_s: float, seed: int = 0) -> dict:
    """``{window: state}`` of every probe record of tool ``"session"`` whose backend has a device
    (``device_of(backend, compute label)``, None when it has none) and that holds :data:`WINDOW_MIN_STEPS`
    probe steps at least; see :func:`window_state`.  A window left out has no state: its run is predicted
    with the calibrated device and compute, as a run without probes is.  The records are those
    :func:`sim.core.schema.check_microbench` checked."""
    out = {}
    for i, r in enumerate(probes):
        if r.get("tool") != "session" or len(r.get("batch_us") or ()) < WINDOW_MIN_STEPS:
            continue
        label = ComputeSpec.parse(r.get("compute", "none")).label
        dev = device_of(r["backend"], label)
        if dev is None:
            continue
        out[str(r["probe"])] = window_state(r, dev, computes.get(label), hash_s, seed + i)
    return out


def window_noise(windows: Mapping[str, Mapping], window: str) -> dict:
    """``{"read_se", "compute_se", "step_cv"}`` of ``window``: its own, or its configuration's when larger.

    The configuration's: the median over its windows of every round (ids ``rROUND-cINDEX`` with the same
    ``cINDEX``) of the relative noise of one probe step's read (``read_se * sqrt(probe_steps)``), of its
    compute, and ``step_cv``; the first two over ``sqrt`` of this window's probe steps.

    Raises
    ------
    KeyError
        ``window`` is not in ``windows``.
    """
    w = windows[window]
    peers = [v for k, v in windows.items() if k.split("-", 1)[-1] == window.split("-", 1)[-1]]
    root = math.sqrt(max(int(w.get("probe_steps") or 1), 1))

    def floor(key: str, per_step: bool) -> float:
        xs = [float(v.get(key) or 0.0) * (math.sqrt(max(int(v.get("probe_steps") or 1), 1)) if per_step else 1.0)
              for v in peers]
        pooled = float(np.median(xs)) / (root if per_step else 1.0)
        return max(float(w.get(key) or 0.0), pooled)

    return {"read_se": floor("read_se", True), "compute_se": floor("compute_se", True),
            "step_cv": floor("step_cv", False)}
