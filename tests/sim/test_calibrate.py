"""sim.check.calibrate: fits from hand-made microbenchmarks (known answers), the batch device, persistence, and the
pin that the calibration never reads decode runs."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from engram import ArgumentError, FormatError, synth
from tests.modelfiles import SCALE, token_map as _token_map
from sim.check.calibrate import Calibration, calibrate, calibrate_file, check_study_backends
from sim.sweep import Study, run_study, runner
from sim.device import Device, EmpiricalDevice, LatencyDist, MeasuredBatchDevice, load_device
from sim.core.io import load_json
from sim.measure import measure
from sim.core.params import Compute
from sim.core.schema import CALIBRATION_SCHEMA, MICRO_SCHEMA, RunConfig
from sim.trace import CODE_SOURCE
from sim.decode import DecodeRun

US = 1e-6


def micro_doc(fio: bool = True) -> dict:
    """A microbenchmark document with round figures: every fitted value has a known answer."""
    recs = [
        # serial 48-row batches: mean 4800 us -> 100 us a read at qd 1
        {"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": 48, "round": 0,
         "batch_us": [4000.0, 4800.0, 5600.0], "rows": 144, "reads": 144},
        {"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": 1, "round": 0,
         "batch_us": [80.0, 90.0, 100.0, 130.0], "rows": 4, "reads": 4},
    ]
    for be, scale in (("pread", 1.0), ("io_uring", 0.8)):
        for k, batch in ((4, 1200.0), (16, 600.0)):
            recs.append({"kind": "io", "tool": "engine", "backend": be, "qd": k, "batch_rows": 48, "round": 0,
                         "batch_us": [batch * scale * f for f in (0.9, 1.0, 1.1, 1.0)], "rows": 192, "reads": 192})
            # k / (reads / wall): 4 / 40000 = 100 us; 16 / 64000 = 250 us (pread)
            rate = {4: 40000.0, 16: 64000.0}[k] / scale
            recs.append({"kind": "io", "tool": "engine", "backend": be, "qd": k, "batch_rows": 4080, "round": 0,
                         "batches": 10, "rows": 40800, "reads": 40800, "wall_s": 40800 / rate,
                         "reads_per_s": rate})
    if fio:
        for qd, mean in ((1, 90.0), (4, 110.0), (16, 240.0)):
            recs.append({"kind": "io", "tool": "fio", "qd": qd, "round": 0, "iops": qd / (mean * US),
                         "mean_us": mean, "p1_us": 0.5 * mean, "p50_us": 0.9 * mean, "p90_us": 1.3 * mean,
                         "p99_us": 3 * mean, "p99.9_us": 6 * mean, "cmd": "fio ..."})
    # think time: spin:2 between serial batches and between pread x 4 batches
    recs += [{"kind": "io", "tool": "engine", "backend": "serial", "qd": 1, "batch_rows": 48, "think": "spin:2",
              "round": 0, "batch_us": [5000.0, 5200.0], "think_us": [2000.0, 2000.0], "rows": 96, "reads": 96},
             {"kind": "io", "tool": "engine", "backend": "pread", "qd": 4, "batch_rows": 48, "think": "spin:2.0",
              "round": 0, "batch_us": [1500.0, 1500.0], "think_us": [2000.0, 2000.0], "rows": 96, "reads": 96}]
    recs += [{"kind": "compute", "compute": "none", "round": 0, "samples_us": [1.0, 1.0, 2.0]},
             {"kind": "compute", "compute": "spin:2", "round": 0, "samples_us": [2000.0, 2010.0, 2020.0]},
             {"kind": "hash", "round": 0, "samples_us": [2.0, 3.0, 4.0]}]
    return {"schema": MICRO_SCHEMA, "kind": "microbench", "date": "2026-11-29T12:00:00+00:00",
            "machine": {"cpu": "test cpu", "cores": 2}, "file": {"path": "/x.gguf"}, "records": recs}


# --------------------------------------------------------------- known answers
def test_fit_known_answers():
    cal = calibrate(micro_doc())
    assert set(cal.devices) == {"pread", "io_uring"}
    dev = cal.device("pread")
    assert isinstance(dev, MeasuredBatchDevice)
    # read latency by queue depth: qd 1 = serial batch mean / 48; qd k = k * wall / reads (Little's law)
    assert dev.mean_latency(1) == pytest.approx(100 * US)
    # (Little's law on the 48-row batches: k x their time / their reads, 4 x 4800 us / 192; large batches
    # only where no 48-row batches were timed)
    assert dev.mean_latency(4) == pytest.approx(100 * US)
    assert dev.mean_latency(16) == pytest.approx(16 * 2400 / 192 * US)
    assert cal.device("io_uring").mean_latency(16) == pytest.approx(16 * 2400 * 0.8 / 192 * US)
    # the shape is fio's at the nearest depth, scaled to the engine's mean: p50 / mean kept
    assert isinstance(cal.fio_device, EmpiricalDevice)
    fio_ratio = cal.fio_device.latency(16).percentile(50) / cal.fio_device.latency(16).mean
    assert dev.latency(16).percentile(50) / dev.latency(16).mean == pytest.approx(fio_ratio)
    assert cal.fio_device.mean_latency(4) == pytest.approx(110 * US)
    # batch service times: the measured 48-row batches
    assert dev.batch_dist(48, 4).mean == pytest.approx(1200 * US)
    assert dev.batch_dist(48, 16).percentile(50) == pytest.approx(600 * US)
    assert dev.batch_dist(48, 1).mean == pytest.approx(4800 * US)
    assert cal.device("io_uring").batch_dist(48, 4).mean == pytest.approx(960 * US)
    # compute and hash
    # compute: the compute microbenchmark and the think times of the think-time batches, three windows with
    # means 2010, 2000, 2000 us: their median (pooled: the mean of all 7 samples)
    assert cal.compute["spin:2"].mean == pytest.approx(2000 * US)
    pooled = calibrate(micro_doc(), windows="pooled")
    assert pooled.compute["spin:2"].mean == pytest.approx((2000 + 2010 + 2020 + 4 * 2000) / 7 * US)
    assert cal.compute_model("spin:2.0") is cal.compute["spin:2"]
    assert cal.compute["none"].mean == pytest.approx(4 / 3 * US)
    assert cal.hash_s == pytest.approx(3 * US)
    # diagnostics: 48 reads of 100 us on 4 readers (point-free fio shape) vs the measured 1200 us
    row = next(r for r in cal.fit if r["backend"] == "pread" and r["qd"] == 4)
    assert row["batch48_mean_us"] == pytest.approx(1200) and row["engine_mean_us"] == pytest.approx(100)
    assert row["fio_mean_us"] == pytest.approx(110) and row["engine_over_fio"] == pytest.approx(100 / 110)
    assert row["overhead_raw_us"] == pytest.approx(row["batch48_mean_us"] - row["device_batch48_mean_us"])
    assert cal.fit[0]["backend"] == "serial" and cal.fit[0]["batch48_mean_us"] == pytest.approx(4800)
    assert cal.date == "2026-11-29T12:00:00+00:00" and cal.machine["cpu"] == "test cpu"
    # think time: the batches measured with spin:2 between them, back-to-back ones elsewhere
    think = cal.device("pread", "spin:2")
    assert think is not dev and think.batch_dist(48, 4).mean == pytest.approx(1500 * US)
    assert think.batch_dist(48, 1).mean == pytest.approx(5100 * US)
    assert think.batch_dist(48, 16).mean == pytest.approx(600 * US)
    assert think.mean_latency(16) == dev.mean_latency(16)
    assert cal.device("io_uring", "spin:2").batch_dist(48, 1).mean == pytest.approx(5100 * US)
    assert cal.device("io_uring", "spin:2").batch_dist(48, 4).mean == pytest.approx(960 * US)
    assert cal.device("pread", "none") is dev and cal.device("pread", "blas:3") is dev
    tf = {(r["backend"], r["qd"]): r for r in cal.think_fit}
    assert tf[("pread", 4)]["batch48_mean_us"] == pytest.approx(1500)
    assert tf[("pread", 4)]["back_to_back_mean_us"] == pytest.approx(1200)
    assert tf[("serial", 1)]["think_mean_us"] == pytest.approx(2000) and tf[("serial", 1)]["think"] == "spin:2"
    pol = cal.policy(8, "io_uring", 16)
    assert (pol.threshold, pol.backend, pol.readers, pol.ring_depth, pol.batch_overhead) == (8, "io_uring", 16, 16, 0)
    with pytest.raises(ArgumentError, match="mixer"):
        cal.compute_model("mixer")
    with pytest.raises(ArgumentError, match="backend"):
        cal.device("aio")


def test_typical_window():
    """A window disturbed by other work moves the typical window's mean little and is not in its shape."""
    doc = micro_doc()
    serial = doc["records"][0]
    doc["records"][1:1] = [dict(serial, batch_us=[4800.0] * 3), dict(serial, batch_us=[48000.0] * 3)]
    cal = calibrate(doc)
    # window means 4800, 4800, 48000: median 4800
    assert cal.device("pread").batch_dist(48, 1).mean == pytest.approx(4800 * US)
    assert cal.device("pread").mean_latency(1) == pytest.approx(100 * US)
    pooled = calibrate(doc, windows="pooled")
    assert pooled.device("pread").batch_dist(48, 1).mean == pytest.approx((4800 * 6 + 48000 * 3) / 9 * US)
    # the typical window's shape is the variation within windows: 4000..5600 around 4800 in the first,
    # none in the two constant ones; pooled keeps the variation between windows too
    d = cal.device("pread").batch_dist(48, 1)
    assert d.q[-1] / d.q[0] == pytest.approx(5600 / 4000)
    p = pooled.device("pread").batch_dist(48, 1)
    assert p.q[-1] / p.q[0] == pytest.approx(48000 / 4000)
    assert cal.source["windows"] == "median" and pooled.source["windows"] == "pooled"
    with pytest.raises(ArgumentError, match="windows"):
        calibrate(doc, windows="mean")


def test_fit_without_fio_uses_single_row_shape():
    cal = calibrate(micro_doc(fio=False))
    assert cal.fio_device is None
    one = np.array([80.0, 90.0, 100.0, 130.0])
    d = cal.device("pread").latency(16)
    assert d.mean == pytest.approx(16 * 2400 / 192 * US)
    # the normalised quantile function of the single-row reads, scaled to the engine's mean
    assert d.q[-1] / d.q[0] == pytest.approx(one.max() / one.min())
    assert np.allclose(d.q / d.q[0], np.quantile(one, np.linspace(0, 1, 4)) / one.min())


def test_fit_is_a_function_of_the_document():
    a = calibrate(micro_doc()).to_dict()
    assert calibrate(micro_doc()).to_dict() == a
    doc = micro_doc()
    doc["records"][2]["batch_us"][0] *= 2
    assert calibrate(doc).to_dict() != a


# ------------------------------------------------------------- refusing runs
def test_calibrate_refuses_decode_runs():
    runs = {"schema": "engram.decode-runs/1", "kind": "decode_runs", "configs": [], "runs": [{"config": "x"}]}
    with pytest.raises(ArgumentError, match="microbenchmarks only"):
        calibrate(runs)
    for bad in ({"kind": "decode", "steps": 3}, {"kind": "io", "tool": "engine", "tokens_per_s": 3.0},
                {"kind": "compute", "compute": "none", "samples_us": [1.0], "step_us": [1.0]}):
        doc = micro_doc()
        doc["records"].append(bad)
        with pytest.raises(ArgumentError, match="microbenchmarks only"):
            calibrate(doc)
    doc = micro_doc()
    doc["runs"] = []
    with pytest.raises(ArgumentError, match="decode-run"):
        calibrate(doc)
    with pytest.raises(ArgumentError):
        calibrate({"schema": MICRO_SCHEMA, "kind": "microbench", "records": []})
    doc = micro_doc()
    doc["records"] = [r for r in doc["records"] if r.get("backend") != "serial"]
    with pytest.raises(ArgumentError, match="serial"):
        calibrate(doc)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A small real measurement: microbenchmarks and decode runs side by side in one directory."""
    d = tmp_path_factory.mktemp("cal")
    path = d / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=7),
                      synth.Fill(projections=False), progress=False)
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 30), RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 30)]
    measure(path, cfgs, d, rounds=2, depths=(1, 4), fio=False, io_batches=6, io_chunks=4, big_seconds=0.01,
            single_rows=8, compute_samples=6, warmup=3, progress=False)
    return d


def test_calibration_never_reads_the_decode_runs(measured, tmp_path):
    """The pin: removing or corrupting the decode runs (and their traces) leaves the calibration unchanged."""
    micro = measured / "microbench.json"
    before = calibrate_file(micro, tmp_path / "a.json").to_dict()
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads(json.dumps(before))
    runs = measured / "runs.json"
    saved = runs.read_bytes()
    try:
        runs.write_text("{ this is not JSON")
        for f in (measured / "traces").iterdir():
            f.write_bytes(b"\0" * 10)
        assert calibrate_file(micro).to_dict() == before
        runs.unlink()
        assert calibrate_file(micro).to_dict() == before
    finally:
        runs.write_bytes(saved)
    with pytest.raises(ArgumentError, match="microbenchmarks only"):
        calibrate_file(runs)
    assert before["source"]["path"] == str(micro.resolve()) and len(before["source"]["sha256"]) == 64


def test_calibration_of_a_real_measurement(measured):
    cal = calibrate_file(measured / "microbench.json")
    doc = load_json(measured / "microbench.json")
    io = [r for r in doc["records"] if r["kind"] == "io" and not r.get("think") and not r.get("probe")]
    serial = [r["batch_us"] for r in io if r["backend"] == "serial" and r["batch_rows"] == 48]
    assert len(serial) == 2 * 4  # 2 rounds x 4 chunks (the serial run has no compute)
    typical = np.median([np.mean(w) for w in serial])
    assert cal.device("pread").mean_latency(1) == pytest.approx(typical / 48 * US)
    # depth 4: Little's law on the 48-row batches at 4 readers
    small = [r for r in io if r.get("backend") == "pread" and r["batch_rows"] == 48]
    assert cal.device("pread").mean_latency(4) == pytest.approx(
        4 * sum(np.sum(r["batch_us"]) for r in small) * US / sum(r["reads"] for r in small))
    b48 = [r["batch_us"] for r in small]
    assert len(b48) == 2 * 4
    assert cal.device("pread").batch_dist(48, 4).mean == pytest.approx(np.median([np.mean(w) for w in b48]) * US)
    pooled = calibrate_file(measured / "microbench.json", windows="pooled")
    assert pooled.device("pread").batch_dist(48, 4).mean == pytest.approx(np.mean(np.concatenate(b48)) * US)
    assert set(cal.compute) == {"none"} and cal.hash_s > 0


# ------------------------------------------------------------------ persistence
def assert_close(a, b, path="") -> None:
    """Equal structure and strings, numbers equal to 1e-9 relative (JSON keeps microseconds)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


def test_calibration_round_trip(tmp_path):
    cal = calibrate(micro_doc())
    path = cal.save(tmp_path / "c.json")
    d = json.loads(path.read_text())
    assert d["schema"] == CALIBRATION_SCHEMA and {"machine", "file", "date", "devices", "compute"} <= set(d)
    back = Calibration.load(path)
    assert_close(back.to_dict(), cal.to_dict())
    for be in ("pread", "io_uring"):
        for k in (1, 4, 16):
            assert back.device(be).batch_dist(48, k).mean == pytest.approx(cal.device(be).batch_dist(48, k).mean)
            assert back.device(be).mean_latency(k) == pytest.approx(cal.device(be).mean_latency(k))
            assert back.device(be, "spin:2").batch_dist(48, k).mean == pytest.approx(
                cal.device(be, "spin:2").batch_dist(48, k).mean)
    # the device of a calibration is a device file for `engram sim decode --device`
    dev_path = tmp_path / "dev.json"
    dev_path.write_text(json.dumps(d["devices"]["pread"]))
    dev = load_device(dev_path)
    assert isinstance(dev, MeasuredBatchDevice) and dev.batch_dist(48, 16).mean == pytest.approx(600 * US)
    bad = dict(d, kind="microbench")
    with pytest.raises(FormatError):
        Calibration.from_dict(bad)
    broken = copy.deepcopy(d)
    del broken["hash_us"]
    with pytest.raises(FormatError, match="hash_us"):
        Calibration.from_dict(broken)
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(FormatError):
        Calibration.load(tmp_path / "x.json")


# -------------------------------------------------------- measured-batch device
def batch_device() -> MeasuredBatchDevice:
    rng = np.random.default_rng(0)
    table = {1: LatencyDist.point(100 * US), 16: LatencyDist.point(400 * US)}
    batches = {(48, 1): LatencyDist.from_samples(rng.normal(4800, 100, 500) * US),
               (48, 4): LatencyDist.point(1200 * US), (48, 16): LatencyDist.point(600 * US)}
    return MeasuredBatchDevice(table, batches, name="t")


def test_batch_device_draws_measured_batches():
    dev = batch_device()
    t, a = dev.batch_samples(48, 16, size=100, rng=np.random.default_rng(1))
    assert t.tolist() == [600 * US] and a.tolist() == [600 * US * 16]
    t, _ = dev.batch_samples(48, 1, size=4000, rng=np.random.default_rng(1))
    assert t.mean() == pytest.approx(4800 * US, rel=0.01)
    # readers between measured counts: quantiles mixed linearly in k
    assert dev.batch_dist(48, 10).mean == pytest.approx((1200 + (600 - 1200) * 6 / 12) * US)
    # outside the measured counts: the nearest
    assert dev.batch_dist(48, 64).mean == pytest.approx(600 * US)
    s = dev.batch_dist(48, 1).mean
    assert dev.batch_dist(48, 2).mean == pytest.approx(s + (1200 * US - s) / 3)
    # other batch sizes scale as the per-read model's batches: 24 reads on 4 readers = 6 waves of the measured 12
    assert dev.batch_dist(24, 4).mean == pytest.approx(600 * US)
    # 47 reads on 16: the last wave of 15 reads at depth 15 (380 us), not at depth 16 (400 us)
    assert dev.batch_dist(47, 16).mean == pytest.approx(600 * US * (400 + 400 + 380) / 1200)
    assert dev.batch_dist(47, 1).mean == pytest.approx(4800 * US * 47 / 48, rel=0.01)


def test_batch_device_in_the_simulator():
    from sim.decode import Policy, simulate_decode
    from sim.trace import load_trace

    tr = load_trace(CODE_SOURCE, limit=100)
    r = simulate_decode(tr, batch_device(), Policy(threshold=8, readers=16), Compute(1e-3), DecodeRun(steps=100))
    # almost every step reads 48 distinct rows on 16 readers: 0.6 ms + 1 ms
    assert 1 / r.tokens_per_s == pytest.approx(1.6e-3, rel=0.01)
    r = simulate_decode(tr, batch_device(), Policy(threshold=256, readers=16), Compute(1e-3), DecodeRun(steps=100))
    assert 1 / r.tokens_per_s == pytest.approx(5.8e-3, rel=0.02)


def test_batch_device_serialization_and_errors():
    dev = batch_device()
    back = Device.from_dict(json.loads(json.dumps(dev.to_dict())))
    assert isinstance(back, MeasuredBatchDevice) and back.batches.keys() == dev.batches.keys()
    assert back.batch_dist(48, 10).mean == pytest.approx(dev.batch_dist(48, 10).mean)
    with pytest.raises(ArgumentError):
        MeasuredBatchDevice({1: LatencyDist.point(1e-4)}, {})
    with pytest.raises(ArgumentError):
        MeasuredBatchDevice({1: LatencyDist.point(1e-4)}, {(0, 4): LatencyDist.point(1e-3)})
    d = dev.to_dict()
    d["batches"] = [{"n": 48}]
    with pytest.raises(FormatError, match="batches"):
        Device.from_dict(d)
    with pytest.raises(ArgumentError):
        dev.batch_samples(0, 4)
    assert math.isfinite(dev.peak_iops())


def test_shared_reads_set_the_depth_several_sessions_reach():
    """48-row batches from several submitters at once: the device's latency at their total depth, the faster of
    that and one reader group's."""
    doc = micro_doc()
    # 4 submitters x 4 readers: 96000 reads/s at depth 16 (one group of 16: 16 x 2400 us / 192 = 200 us a read)
    doc["records"].append({"kind": "io", "tool": "engine", "backend": "pread", "qd": 16, "readers": 4,
                           "submitters": 4, "batch_rows": 48, "round": 0, "batches": 2000, "rows": 96000,
                           "reads": 96000, "wall_s": 1.0, "reads_per_s": 96000.0, "batch_mean_us": 1500.0})
    # 16 x 4 at depth 64: 100000 reads/s
    doc["records"].append({"kind": "io", "tool": "engine", "backend": "pread", "qd": 64, "readers": 4,
                           "submitters": 16, "batch_rows": 48, "round": 0, "batches": 2000, "rows": 96000,
                           "reads": 50000, "wall_s": 0.5, "reads_per_s": 100000.0, "batch_mean_us": 1500.0})
    cal = calibrate(doc)
    dev = cal.device("pread")
    assert dev.mean_latency(16) == pytest.approx(16 / 96000)
    assert dev.mean_latency(64) == pytest.approx(64 / 100000)
    # the batches of one session stay those measured with one group
    assert dev.batch_dist(48, 4).mean == pytest.approx(1200 * US)
    fit = {(r["qd"], r["submitters"]): r for r in cal.shared_fit}
    assert fit[(16, 4)]["gain"] == pytest.approx(96000 / (192 / (2400 * US)))
    assert fit[(64, 16)]["one_group_reads_per_s"] is None
    assert "4 submitters x 4 readers" in cal.summary()
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.shared_fit == cal.shared_fit and again.device("pread").mean_latency(64) == pytest.approx(64 / 1e5)


def probe_rec(window, backend="pread", threshold=8, readers=4, compute="spin:2", batch_us=(), compute_us=(),
              sessions=1, **kw):
    """A probe record of one decode run's window (:func:`sim.measure.runs.probe_record`)."""
    m = len(batch_us)
    return {"kind": "io", "tool": "session", "probe": window, "round": 0, "backend": backend, "threshold": threshold,
            "readers": readers, "qd": readers, "batch_rows": 48, "compute": compute, "sessions": sessions,
            "mode": "threads", "every": 2, "session_steps": 2 * m - 1, "offsets_s": [0.0] * sessions,
            "session": [0] * m, "batch_us": list(batch_us), "compute_us": list(compute_us) or [0.0] * m,
            "t_us": [1000.0 * i for i in range(m)], "distinct": [48] * m, "rows": 48 * m, **kw}


def test_windows_from_the_probe_steps():
    """A run's interleaved probe steps give its window's device and compute factors over the calibrated ones."""
    doc = micro_doc()
    read = [1803.0, 1503.0, 1803.0, 1503.0, 1803.0, 1503.0]  # hash 3 us + batches 1.1x..1.3x those calibrated
    doc["records"] += [probe_rec("r0-c1", batch_us=read, compute_us=[2200.0] * 6),
                       probe_rec("r1-c0", threshold=256, compute="none", batch_us=[4803.0] * 4)]
    cal = calibrate(doc)
    plain = calibrate(micro_doc())
    # probes never enter the fit itself
    assert cal.device("pread").batch_dist(48, 4).mean == pytest.approx(plain.device("pread").batch_dist(48, 4).mean)
    w = cal.windows["r0-c1"]
    base = cal.device("pread", "spin:2").batch_dist(48, 4).mean
    assert w["device"] == pytest.approx((np.mean(read) - 3.0) * US / base, rel=1e-9)
    assert w["compute"] == pytest.approx(2200 * US / cal.compute_model("spin:2").mean, rel=1e-9) and w["probe_steps"] == 6
    # neighbouring steps differ by 300 us: sqrt(300^2 / 2) / 1653, over sqrt(6) for the mean's error
    assert w["read_se"] == pytest.approx(300 / np.sqrt(2) / 1653 / np.sqrt(6), rel=1e-6)
    assert w["compute_se"] == 0.0 and w["sessions"] == 1 and w["fit_simulations"] == 0
    serial = cal.windows["r1-c0"]  # threshold 256: the 48 rows are read one after the other
    assert serial["compute"] is None
    assert serial["device"] == pytest.approx(4800 * US / cal.device("pread").batch_dist(48, 1).mean, rel=1e-9)
    dev, comp = cal.window_models("pread", "spin:2", "r0-c1")
    base_dev, base_comp = cal.window_models("pread", "spin:2", None)
    assert dev.batch_dist(48, 4).mean == pytest.approx(base_dev.batch_dist(48, 4).mean * w["device"])
    assert comp.mean == pytest.approx(base_comp.mean * w["compute"])
    assert "windows      2 probed" in cal.summary()
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.windows == cal.windows


def test_backends_left_out_and_the_study_check(tmp_path):
    doc = micro_doc()
    doc["records"] = [r for r in doc["records"] if r.get("backend") != "io_uring"]
    doc["backends"] = {"usable": ["pread"], "left_out": {"io_uring": "io_uring could not start: ENOSYS"}}
    cal = calibrate(doc, source={"path": "/m/microbench.json"})
    assert sorted(cal.devices) == ["pread"] and cal.left_out == {"io_uring": "io_uring could not start: ENOSYS"}
    assert "left out     io_uring: io_uring could not start: ENOSYS" in cal.summary()
    cal.check_backends(["pread"])
    with pytest.raises(ArgumentError, match=r"studies/demo.toml names backend 'io_uring'.*/m/microbench.json.*ENOSYS"):
        cal.check_backends(["pread", "io_uring"], "studies/demo.toml")
    path = cal.save(tmp_path / "calibration.json")
    points = [{"device": "calibrated", "backend": "pread"}, {"device": "seed-apple-m3-ultra", "backend": "io_uring"}]
    check_study_backends(path, points, "s.toml")  # only calibrated points count
    for bad in ({"device": "calibrated", "backend": "io_uring"}, {"device": "calibrated:io_uring"}):
        with pytest.raises(ArgumentError, match="s.toml names backend 'io_uring'"):
            check_study_backends(path, points + [bad], "s.toml")


def test_a_sweep_naming_a_backend_the_calibration_lacks_stops_before_simulating(tmp_path, monkeypatch):
    doc = micro_doc()
    doc["records"] = [r for r in doc["records"] if r.get("backend") != "io_uring"]
    doc["backends"] = {"usable": ["pread"], "left_out": {"io_uring": "io_uring could not start: ENOSYS"}}
    path = calibrate(doc, source={"path": "/m/microbench.json"}).save(tmp_path / "calibration.json")
    study = Study.from_dict({"study": {"name": "s"}, "fixed": {"device": "calibrated", "steps": 5},
                             "grid": {"backend": ["pread", "io_uring"]}}, source="s.toml")
    ran = []
    monkeypatch.setattr(runner, "resolve_context", lambda *a, **k: ran.append(a))
    with pytest.raises(ArgumentError, match="s.toml names backend 'io_uring'.*ENOSYS"):
        run_study(study, calibration=path, progress=False)
    assert ran == []  # refused before any device, trace or simulation was loaded
