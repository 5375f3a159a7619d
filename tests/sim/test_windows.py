"""sim.check.windows: a run's own device and compute from its interleaved probe steps, checked against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engram import ArgumentError
from sim.decode import DecodeRun, simulate_decode
from sim.device import LatencyDist, MeasuredBatchDevice
from sim.core.params import Compute, Phases, Policy
from sim.core.schema import probe_positions
from sim.trace import Trace
from sim.measure import PROBES_MIN, Settings
from sim.check.windows import (FIT_ITERATIONS, FIT_TOL, SHAPE_MIN_STEPS, _fit_sessions, insert_probes, random_rows,
                               scale_device, step_noise, window_compute, window_device, window_noise, window_state,
                               window_states)

US = 1e-6
HASH = 3 * US


def device() -> MeasuredBatchDevice:
    table = {1: LatencyDist.point(100 * US), 4: LatencyDist.point(150 * US)}
    batches = {(48, 1): LatencyDist.point(4800 * US), (48, 4): LatencyDist.point(1200 * US)}
    return MeasuredBatchDevice(table, batches, name="points")


def record(read_us, compute_us=None, sessions=1, threshold=8, compute="spin:1", **kw) -> dict:
    m = len(read_us)
    return {"kind": "io", "tool": "session", "probe": "r0-c0", "backend": "pread", "threshold": threshold,
            "readers": 4, "qd": 4, "compute": compute, "sessions": sessions, "mode": "threads",
            "batch_us": list(read_us), "compute_us": list(compute_us if compute_us is not None else [0.0] * m),
            "t_us": [500.0 * i for i in range(m)], "distinct": [48] * m, **kw}


def test_probe_positions_known_answers():
    assert probe_positions(10, 3).tolist() == [0, 3, 6, 9, 10]
    assert probe_positions(4, 1).tolist() == [0, 1, 2, 3, 4]
    assert probe_positions(5, 0).size == probe_positions(0, 2).size == 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), every=st.integers(0, 7))
def test_insert_probes_is_numpy_insert(n, every):
    rows = np.arange(n * 2 * 3, dtype=np.uint32).reshape(n, 2, 3)
    out, mask = insert_probes(rows, every, 5)
    where = probe_positions(n, every)
    assert np.array_equal(out, np.insert(rows, where, random_rows(where.size, 5, 2, 3), axis=0))
    assert np.array_equal(out[mask], rows) and int((~mask).sum()) == where.size


def test_random_rows_are_distinct_within_a_step():
    r = random_rows(50, [1, 2])
    assert r.shape == (50, 2, 24) and r.dtype == np.uint32
    assert all(np.unique(s).size == 48 for s in r)


def test_step_noise_is_numpy_and_ignores_drift():
    rng = np.random.default_rng(3)
    t = rng.permutation(200).astype(float)
    x = 1.0 + 0.05 * rng.standard_normal(200)
    want = math.sqrt(np.mean(np.diff(x[np.argsort(t)]) ** 2) / 2) / x.mean()
    assert step_noise(t, x) == pytest.approx(want, rel=1e-12)
    # a slow ramp: the spread of the values is large, the step-to-step noise is not
    ramp = np.linspace(1.0, 2.0, 200)
    assert ramp.std() / ramp.mean() > 0.15 and step_noise(np.arange(200), ramp) < 0.005
    assert step_noise([0, 1], [1.0, 2.0]) == 0.0


def test_scale_device():
    d = scale_device(device(), 1.5)
    assert d.batch_dist(48, 4).mean == pytest.approx(1800 * US) and d.mean_latency(1) == pytest.approx(150 * US)
    assert d.name == "points" and scale_device(device(), 2.0, "w").name == "w"


def test_one_session_window_known_answers():
    read = np.array([1503.0, 1803.0, 1503.0, 1803.0, 2103.0, 2403.0, 2103.0, 2403.0])
    comp = np.full(8, 1100.0)
    w = window_state(record(read, comp), device(), Compute.empirical([1e-3] * 4), HASH)
    assert w["device"] == pytest.approx((read.mean() - 3) / 1200, rel=1e-12)
    assert w["device_first"] == pytest.approx((read[:4].mean() - 3) / 1200, rel=1e-12)
    assert w["device_second"] == pytest.approx((read[4:].mean() - 3) / 1200, rel=1e-12)
    assert w["compute"] == pytest.approx(1.1, rel=1e-12) and w["compute_se"] == 0.0
    x = read * US
    assert w["read_se"] == pytest.approx(math.sqrt(np.mean(np.diff(x) ** 2) / 2) / x.mean() / math.sqrt(8), rel=1e-9)
    y = (read + comp) * US
    assert w["step_cv"] == pytest.approx(math.sqrt(np.mean(np.diff(y) ** 2) / 2) / y.mean(), rel=1e-9)
    assert (w["probe_steps"], w["sessions"], w["fit_simulations"]) == (8, 1, 0)
    # threshold above the 48 rows: one reader reads them, the serial batch is the reference
    s = window_state(record([4803.0] * 4, threshold=256, compute="none"), device(), None, HASH)
    assert s["device"] == pytest.approx(1.0, rel=1e-12) and s["compute"] is None


def test_one_session_window_keeps_its_own_shape():
    """The probes' batch times (read less hash, 48 distinct rows only) and compute times, sorted."""
    read = np.array([1503.0, 2403.0, 1203.0, 1803.0, 9003.0, 1503.0, 1203.0, 1803.0, 1503.0, 777.0])
    comp = np.array([1100.0, 900.0, 1000.0, 5000.0, 1000.0, 1200.0, 800.0, 1000.0, 1000.0, 1000.0])
    rec = record(read, comp, distinct=[48] * 9 + [40])  # the last step read 40 rows: not a 48-row batch
    w = window_state(rec, device(), Compute.empirical([1e-3] * 4), HASH)
    assert w["batch_samples_us"] == sorted((read[:9] - 3).tolist())
    assert w["compute_samples_us"] == sorted(comp.tolist())
    # several sessions' probes hold their queueing: no batch shape; the compute none: no compute shape
    rec2 = record([2603.0, 2803.0] * 6, [1000.0] * 12, sessions=2, session_steps=11, offsets_s=[0.0, 0.0007],
                  session=[0] * 6 + [1] * 6)
    assert window_state(rec2, device(), Compute.empirical([1e-3] * 4), HASH, seed=4)["batch_samples_us"] == []
    assert window_state(record(read, compute="none"), device(), None, HASH)["compute_samples_us"] == []


def test_window_device_known_answers():
    own = [900.0, 1000.0, 1100.0, 1200.0, 1300.0, 1400.0, 1500.0, 5000.0]
    state = {"device": 1.5, "sessions": 1, "threshold": 8, "readers": 4, "batch_samples_us": own}
    d = window_device(device(), state, "w")
    # the readers' 48-row batch: the probes' shape, at the scaled calibrated mean (1200 us x 1.5)
    b = d.batch_dist(48, 4)
    q = np.array(own)
    trapezoid = float(np.sum(np.diff(np.linspace(0, 1, 8)) * (q[1:] + q[:-1]) / 2))  # the quantile function's mean
    assert b.mean == pytest.approx(1800 * US, rel=1e-12)
    assert b.q == pytest.approx(q * (1800.0 / trapezoid) * US, rel=1e-12)
    # everything else scaled by f, as before
    assert d.batch_dist(48, 1).mean == pytest.approx(4800 * US * 1.5) and d.mean_latency(1) == pytest.approx(150 * US)
    assert d.name == "w"
    # a threshold above 48 rows: the serial batch takes the shape
    d1 = window_device(device(), {**state, "threshold": 256}, "w")
    assert d1.batch_dist(48, 1).mean == pytest.approx(4800 * US * 1.5) and d1.batch_dist(48, 1).percentile(0) < \
        d1.batch_dist(48, 1).mean * 0.8 and d1.batch_dist(48, 4).percentile(0) == pytest.approx(1800 * US)
    # too few probe steps, or several sessions: the calibrated shape scaled by f
    for st_ in ({**state, "batch_samples_us": own[:SHAPE_MIN_STEPS - 1]}, {**state, "sessions": 2}):
        d2 = window_device(device(), st_, "w")
        assert d2.batch_dist(48, 4).percentile(0) == pytest.approx(1800 * US)


def test_window_compute_known_answers():
    base = Compute.empirical([1e-3, 2e-3], layers=2)
    own = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0, 1500.0, 1600.0, 9000.0]
    got = window_compute(base, {"compute": 1.4, "compute_samples_us": own})
    assert got.samples == pytest.approx(tuple(x * US for x in own)) and got.layers == 2
    few = window_compute(base, {"compute": 1.4, "compute_samples_us": own[:SHAPE_MIN_STEPS - 1]})
    assert few.samples == pytest.approx((1.4e-3, 2.8e-3)) and few.layers == 2
    assert window_compute(base, {"compute": None}) is base


def test_short_runs_probe_closer():
    s = Settings(probe_every=3)
    assert [s.run_probe_every(n) for n in (200, 60, 30, 5)] == [3, 60 // PROBES_MIN, 1, 1]
    assert all(probe_positions(n, s.run_probe_every(n)).size >= min(PROBES_MIN, n) for n in range(1, 300))
    assert Settings(probe_every=0).run_probe_every(30) == 0


def test_fit_sessions_secant_search():
    calls = []

    def read_of(f):
        calls.append(f)
        return 2e-3 * f ** 0.7 + 1e-3

    f, resid, n = _fit_sessions(read_of, 3.5e-3, 1.0)
    assert abs(read_of(f) / 3.5e-3 - 1) <= FIT_TOL * 1.01 and abs(resid) <= FIT_TOL and n <= FIT_ITERATIONS
    assert f == pytest.approx((2.5 / 2) ** (1 / 0.7), rel=0.01)
    f0, _, n0 = _fit_sessions(read_of, read_of(1.3), 1.3)
    assert (f0, n0) == (1.3, 1)


def test_several_sessions_window_reproduces_its_probes():
    """Two sessions: the fitted device makes the simulator's mean read that of the probes (to FIT_TOL)."""
    rec = record([2603.0, 2803.0] * 6, [1000.0] * 12, sessions=2, session_steps=11, offsets_s=[0.0, 0.0007],
                 session=[0] * 6 + [1] * 6)
    comp = Compute.empirical([1e-3] * 4)
    w = window_state(rec, device(), comp, HASH, seed=4)
    assert w["sessions"] == 2 and 1 <= w["fit_simulations"] <= FIT_ITERATIONS and abs(w["fit_residual"]) <= FIT_TOL
    trace = Trace(random_rows(22, [4, 13]), np.zeros(22, np.int64))
    pol = Policy(threshold=8, backend="pread", readers=4, ring_depth=4)
    r = simulate_decode(trace, scale_device(device(), w["device"]), pol, comp,
                        DecodeRun(sessions=2, steps=11, mode="fast", seed=4, hash_time=HASH,
                                  phases=Phases.at([0.0, 0.0007])))
    assert (r.stall_ms["mean"] * 1e-3 + HASH) / 2703e-6 == pytest.approx(1.0, abs=FIT_TOL)


def test_window_states_and_errors():
    recs = [record([1203.0] * 4), {"kind": "io", "tool": "engine", "probe": "x", "batch_us": [1.0]},
            {**record([1203.0] * 4), "probe": "r0-c1", "backend": "io_uring"}]
    out = window_states(recs, lambda be, label: device() if be == "pread" else None, {}, HASH)
    assert list(out) == ["r0-c0"] and out["r0-c0"]["device"] == pytest.approx(1.0)
    with pytest.raises(ArgumentError, match="r0-c0.*no probe steps"):
        window_state(record([]), device(), None, HASH)


def test_window_noise_is_at_least_its_configurations():
    """A window that missed the stalls (small noise) takes the median of its configuration's windows."""
    ws = {"r0-c1": {"read_se": 0.02, "compute_se": None, "step_cv": 0.1, "probe_steps": 25},
          "r1-c1": {"read_se": 0.10, "compute_se": None, "step_cv": 0.6, "probe_steps": 16},
          "r2-c1": {"read_se": 0.08, "compute_se": None, "step_cv": 0.5, "probe_steps": 36},
          "r0-c2": {"read_se": 0.9, "compute_se": 0.5, "step_cv": 3.0, "probe_steps": 4}}
    got = window_noise(ws, "r0-c1")
    per_step = np.median([0.02 * 5, 0.10 * 4, 0.08 * 6])  # read_se * sqrt(probe steps)
    assert got["read_se"] == pytest.approx(per_step / 5, rel=1e-12)
    assert got["step_cv"] == pytest.approx(0.5) and got["compute_se"] == 0.0
    # a window noisier than its configuration keeps its own
    assert window_noise(ws, "r1-c1") == {"read_se": 0.10, "compute_se": 0.0, "step_cv": 0.6}
    assert window_noise(ws, "r0-c2") == {"read_se": 0.9, "compute_se": 0.5, "step_cv": 3.0}
    with pytest.raises(KeyError):
        window_noise(ws, "r9-c9")
