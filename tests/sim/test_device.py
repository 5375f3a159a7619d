"""sim.device: device models, presets, persistence, and queueing checks with closed-form answers."""

from __future__ import annotations

import heapq
import json
import math

import numpy as np
import pytest

from engram.errors import ArgumentError, FormatError
import shutil
import subprocess
from pathlib import Path

from sim.check.calibrate import calibrate
from sim.device import (DEVICE_FORMS, Device, EmpiricalDevice, LatencyDist, MeasuredBatchDevice, ParametricSSD,
                        device_from_fio, load_device, poisson_load, preset, preset_names, summarize_boxes,
                        summarize_counter, time_average, with_tail)
from sim.core.io import packaged_data_path
from tests.sim.test_calibrate import micro_doc
from engram.cli import main
from sim.device import load_tail

US = 1e-6
FIO_JSON = Path(__file__).parent / "data" / "fio-randread-4k-libaio.json"
VM_JSONL = packaged_data_path("devices/vm-virtio-16core-4k.jsonl")


def batch_means(x: np.ndarray, batches: int = 20):
    """Mean and its standard error by the method of batch means (correlated queueing output)."""
    m = x[: x.size // batches * batches].reshape(batches, -1).mean(axis=1)
    return float(x.mean()), float(m.std(ddof=1) / math.sqrt(batches))


def erlang_c_wait(c: int, lam: float, mu: float) -> float:
    """M/M/c mean time in queue (Erlang C)."""
    a = lam / mu
    rho = a / c
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) / (1 - rho)
    return tail / (head + tail) / (c * mu - lam)


def finite_source_latency(k: int, c: int, think: float, service: float) -> float:
    """Closed loop of k readers: delay `think`, then c exponential servers (M/M/c//k); mean cycle = k / X."""
    lam, mu = 1 / think, 1 / service
    p = []
    for n in range(k + 1):
        w = math.comb(k, n) * (lam / mu) ** n
        w *= 1.0 if n <= c else math.factorial(n) / (math.factorial(c) * c ** (n - c))
        p.append(w)
    p = np.asarray(p) / sum(p)
    X = float(sum(p[n] * min(n, c) * mu for n in range(k + 1)))
    return k / X


def list_schedule_twin(x: np.ndarray, k: int) -> float:
    """Makespan of reads with latencies x taken in order by k readers (heap of reader free times)."""
    free = [0.0] * k
    for v in x:
        t = heapq.heappop(free)
        heapq.heappush(free, t + v)
    return max(free)


# ----------------------------------------------------------------------- presets
@pytest.mark.parametrize("figures, field", [
    (dict(qd1_us=0.0, iops=1e5), "qd1_us"), (dict(qd1_us=80, iops="many"), "iops"),
    (dict(qd1_us=80, iops=1e5, parallelism=2.5), "parallelism"), (dict(qd1_us=80, iops=1e5, cv=-1), "cv"),
    (dict(qd1_us=80, iops=1e5, routing="nearest"), "routing"), (dict(qd1_us=80, iops=1e5, burst_ios=10), "burst_ios"),
])
def test_datasheet_figures_are_checked_naming_the_key(figures, field):
    from sim.device import Datasheet
    with pytest.raises(ArgumentError, match=field):
        Datasheet(**figures)


def test_seed_preset_is_the_spec_figures():
    d = preset("seed-apple-m3-ultra")
    assert "SPEC §8" in d.source and d.name == "seed-apple-m3-ultra"
    assert d.mean_latency(1) == pytest.approx(107.9 * US, rel=1e-12)
    assert d.mean_latency(16) == pytest.approx(16 * 12.8 * US, rel=1e-12)
    serial, _ = d.batch_samples(48, 1)
    conc, _ = d.batch_samples(48, 16)
    # SPEC §8: serial 5.177 ms a batch, 16 readers 0.614 ms a batch.
    assert serial[0] == pytest.approx(5.177e-3, rel=1e-3)
    assert conc[0] == pytest.approx(0.614e-3, rel=1e-3)
    assert conc[0] / 48 == pytest.approx(12.8 * US, rel=1e-12)
    # Interpolated between the two measured depths, saturated above.
    assert d.mean_latency(1) < d.mean_latency(4) < d.mean_latency(16)
    assert d.iops(64) == pytest.approx(d.iops(16))


def test_vm_virtio_preset_reads_the_shared_file():
    d = preset("vm-virtio-16core-4k")
    recs = [json.loads(x) for x in VM_JSONL.read_text().splitlines() if x.strip()]
    assert d.depths() == [r["qd"] for r in recs]
    for r in recs:
        lat = d.latency(r["qd"])
        # Little's law on the closed-loop benchmark: mean latency = qd / IOPS.
        assert lat.mean == pytest.approx(r["qd"] / r["iops"], rel=1e-9)
        for p in (50, 95, 99):
            assert lat.percentile(p) == pytest.approx(r[f"p{p}_us"] * US, rel=1e-9)
    assert d.peak_iops() == pytest.approx(max(r["iops"] for r in recs), rel=1e-9)
    # Between measured depths the mean grows monotonically; above 256 the device is saturated.
    means = [d.mean_latency(q) for q in range(1, 300)]
    assert all(b >= a for a, b in zip(means, means[1:]))
    assert d.mean_latency(512) == pytest.approx(2 * d.mean_latency(256))


def test_preset_names_and_errors(tmp_path):
    assert set(preset_names()) == {"seed-apple-m3-ultra", "vm-virtio-16core-4k"}
    with pytest.raises(ArgumentError, match="unknown device preset"):
        preset("nope")
    with pytest.raises(ArgumentError, match="unknown device"):
        load_device("nope")
    with pytest.raises(ArgumentError, match="missing 'iops'"):
        load_device("ssd:qd1_us=80,parallelism=4")
    with pytest.raises(ArgumentError, match="unknown key 'foo'; keys: qd1_us"):
        load_device("ssd:qd1_us=80,iops=1e5,parallelism=4,foo=1")
    with pytest.raises(ArgumentError, match="below the channel service time"):
        ParametricSSD(10 * US, 1e5, 4)  # 4 channels at 1e5 IOPS need 40 us per read
    bad = tmp_path / "d.json"
    bad.write_text("{")
    with pytest.raises(FormatError, match="not JSON"):
        load_device(str(bad))
    bad.write_text('{"kind": "tape"}')
    with pytest.raises(FormatError, match="unknown kind"):
        load_device(str(bad))
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"qd": 1, "iops": 1000}\n{"iops": 5}\n')
    with pytest.raises(FormatError, match="d.jsonl: line 2 has no 'qd'"):
        load_device(str(bad))
    bad.write_text('{"qd": 1, "p50_us": 30, "p99_us": 20}\n')
    with pytest.raises(FormatError, match="p99"):
        load_device(str(bad))


# --------------------------------------------------------------- distributions
def test_latency_from_percentiles_passes_through_them_and_matches_the_mean():
    pct = {50: 30.5 * US, 95: 39.5 * US, 99: 56.5 * US}
    d = LatencyDist.from_percentiles(pct, mean=31.93 * US)
    for p, v in pct.items():
        assert d.percentile(p) == pytest.approx(v, rel=1e-12)
    assert d.mean == pytest.approx(31.93 * US, rel=1e-12)
    x = d.sample(np.random.default_rng(1), 200_000)
    assert x.mean() == pytest.approx(d.mean, rel=3e-3)
    assert np.percentile(x, 95) == pytest.approx(39.5 * US, rel=1e-2)
    # A mean below the median moves the lower end, never below zero.
    d2 = LatencyDist.from_percentiles({50: 100 * US, 99: 110 * US}, mean=60 * US)
    assert d2.q[0] >= 0 and d2.mean >= 0


def test_device_json_roundtrip(tmp_path):
    rng = np.random.default_rng(3)
    samples = {1: rng.gamma(20, 5 * US, 5000), 8: rng.gamma(20, 20 * US, 5000)}
    d = EmpiricalDevice.from_table(samples, name="bench", source="test samples")
    for q, x in samples.items():
        for p in (0, 25, 50, 75, 100):  # knots of the 257-point quantile function
            assert d.latency(q).percentile(p) == pytest.approx(np.percentile(x, p), rel=1e-12)
        assert d.latency(q).percentile(90) == pytest.approx(np.percentile(x, 90), rel=2e-3)
        assert d.latency(q).mean == pytest.approx(x.mean(), rel=2e-3)
    back = load_device(str(d.save(tmp_path / "d.json")))
    assert isinstance(back, EmpiricalDevice) and back.name == "bench" and back.source == "test samples"
    for q in (1, 2, 3, 8, 20):
        assert np.allclose(back.latency(q).quantile(np.linspace(0, 1, 33)),
                           d.latency(q).quantile(np.linspace(0, 1, 33)), rtol=1e-9, atol=0)
    s = ParametricSSD(80 * US, 5e5, 32, 0.3)
    back = load_device(str(s.save(tmp_path / "s.json")))
    assert isinstance(back, ParametricSSD) and back.to_dict() == s.to_dict()


def test_measurement_records_as_the_engine_reports_them():
    # Calibration input: rows read per second and latency percentiles per queue depth.
    recs = [{"qd": 1, "rows_per_s": 10_000, "p50_us": 95, "p99_us": 150},
            {"qd": 4, "rows_per_s": 30_000, "p50_us": 120, "p99_us": 260},
            {"qd": 16, "mean_us": 300.0}]
    d = EmpiricalDevice.from_measurements(recs)
    assert d.mean_latency(1) == pytest.approx(1e-4)
    assert d.mean_latency(4) == pytest.approx(4 / 30_000)
    assert d.latency(16).is_point and d.mean_latency(16) == pytest.approx(300 * US)
    assert Device.from_dict(d.to_dict()).mean_latency(4) == pytest.approx(d.mean_latency(4))


def test_batch_samples_is_list_scheduling():
    """Measured at one depth only, every read takes its own draw whatever the depth: a batch is the list
    schedule of its reads on min(readers, 4) slots (4 = the deepest depth: more readers only queue)."""
    d = EmpiricalDevice.from_table({4: np.random.default_rng(0).exponential(100 * US, 4000)})
    for n, k in ((5, 1), (7, 4), (48, 16), (48, 3), (250, 16)):
        t, a = d.batch_samples(n, k, size=4000, rng=np.random.default_rng(n))
        x = d.latency(4).sample(np.random.default_rng(n + 1), (4000, n))
        twin = np.array([list_schedule_twin(row, min(k, 4)) for row in x])
        se = math.hypot(t.std(), twin.std()) / math.sqrt(4000)
        assert abs(t.mean() - twin.mean()) < 4 * se, (n, k)
        assert a.mean() >= n * d.latency(4).mean * 0.97  # queued reads add their wait to the area


def test_long_batches_use_an_accurate_end_effect():
    d = EmpiricalDevice.from_table({16: np.random.default_rng(0).gamma(4, 40 * US, 4000)})
    d.EXACT_BATCH_LIMIT = 10**9
    d.END_WAVES = 10**9
    exact, _ = d.batch_samples(1200, 16, size=600, rng=np.random.default_rng(1))
    d.EXACT_BATCH_LIMIT, d.END_WAVES = 0, 16
    approx, _ = d.batch_samples(1200, 16, size=4000, rng=np.random.default_rng(2))
    se = math.hypot(exact.std() / math.sqrt(600), approx.std() / math.sqrt(4000))
    assert abs(exact.mean() - approx.mean()) < 4 * se
    assert approx.std() == pytest.approx(exact.std(), rel=0.15)


# ----------------------------------------------------------- queueing checks
def test_mmc_waiting_time_is_erlang_c():
    c, s = 4, 100 * US
    dev = ParametricSSD(s, c / s, c, service_cv=1.0)  # no fixed delay: an M/M/4 queue
    assert dev.delay == 0.0
    lam = 0.75 * c / s
    r = poisson_load(dev, lam, 60_000, seed=7)
    wq = erlang_c_wait(c, lam, 1 / s)
    m, se = batch_means(r.waits)
    assert abs(m - wq) < 4 * se, (m, wq, se)
    m, se = batch_means(r.latencies)
    assert abs(m - (wq + s)) < 4 * se


def test_one_reader_fixed_service_is_pollaczek_khinchine():
    s = 50 * US
    dev = ParametricSSD(s, 1 / s, 1, service_cv=0.0)  # M/D/1
    lam = 0.6 / s
    r = poisson_load(dev, lam, 60_000, seed=11)
    rho = lam * s
    m, se = batch_means(r.waits)
    assert abs(m - rho * s / (2 * (1 - rho))) < 4 * se
    assert r.busy_fraction == pytest.approx(rho, abs=0.02)


def test_littles_law_on_the_device_queue():
    c, s = 3, 80 * US
    dev = ParametricSSD(s + 20 * US, c / s, c, service_cv=0.5)  # 20 us fixed delay in front of 3 channels
    lam = 0.7 * c / s
    n = 60_000
    r = poisson_load(dev, lam, n, seed=5)
    # L (time average of the device's own counter) = lambda (the arrival rate) x W (mean per-read latency).
    lw = lam * float(r.latencies.mean())
    assert r.mean_queue_depth == pytest.approx(lw, rel=4 / math.sqrt(n) + 0.01)
    assert r.mean_queue_depth != pytest.approx(lw, rel=1e-9)  # measured apart, not an identity


def test_closed_loop_characterisation_is_the_finite_source_queue():
    dev = ParametricSSD(60 * US, 4 / (50 * US), 4, service_cv=1.0)  # 10 us delay, 4 channels of 50 us
    for k in (1, 3, 8, 16):
        x = dev.closed_loop(k, reads=60_000)
        m, se = batch_means(x)
        assert abs(m - finite_source_latency(k, 4, 10 * US, 50 * US)) < 4 * se + 1e-9
    # Fixed service below the channel count: every read takes d + s.
    fixed = ParametricSSD(60 * US, 4 / (50 * US), 4, service_cv=0.0)
    assert fixed.latency(3).is_point and fixed.mean_latency(3) == pytest.approx(60 * US)
    # Saturated: throughput reaches the IOPS ceiling.
    assert fixed.iops(64) == pytest.approx(fixed.peak_iops(), rel=0.01)


def test_summaries_of_activity():
    start = np.array([0.0, 1.0, 1.5])
    end = np.array([2.0, 3.0, 1.75])
    lv = np.array([1.0, 2.0, 1.0])
    s = summarize_boxes(start, end, lv, 4.0, bins=4)
    assert s["busy_fraction"] == pytest.approx(3 / 4)
    assert s["mean_queue_depth"] == pytest.approx((2 + 4 + 0.25) / 4)
    assert s["timeline"]["queue_depth"] == pytest.approx([1, 3.25, 2, 0])
    assert s["max_queue_depth"] == 4
    assert time_average([(0.0, 1), (1.0, 3), (2.0, 0)], 4.0) == pytest.approx(1.0)


def test_summary_of_a_counter_is_the_summary_of_its_boxes():
    # reads in the device: 1 on [0, 2), 3 on [1, 1.5) ... as the boxes of test_summaries_of_activity
    changes = [(0.0, 1), (1.0, 3), (1.5, 4), (1.75, 3), (2.0, 2), (3.0, 0)]
    s = summarize_counter(changes, 4.0, bins=4)
    b = summarize_boxes(np.array([0.0, 1.0, 1.5]), np.array([2.0, 3.0, 1.75]), np.array([1.0, 2.0, 1.0]), 4.0, 4)
    for key in ("busy_fraction", "mean_queue_depth", "max_queue_depth"):
        assert s[key] == pytest.approx(b[key])
    assert s["timeline"]["queue_depth"] == pytest.approx(b["timeline"]["queue_depth"])
    t, v = zip(*changes)
    assert summarize_counter((t, v), 4.0, 4) == s


# ------------------------------------------------------- devices from a datasheet (issue 19.1)
def test_a_datasheet_is_enough():
    """QD1 latency and IOPS: the parallelism is the knee IOPS x QD1 latency, and the device says so."""
    d = load_device("ssd:qd1_us=80,iops=500000")
    assert d.parallelism == 40 and d.delay == pytest.approx(0.0, abs=1e-12) and d.service_cv == 0.5
    assert set(d.derived) >= {"parallelism", "cv", "iops_row"} and "floor(row IOPS x QD1" in d.derived[
        "parallelism"]["rule"]
    assert d.mean_latency(1) == pytest.approx(80 * US, rel=0.01) and d.iops(128) == pytest.approx(5e5, rel=0.01)
    # routing=random: each read at a channel drawn at random, exponential service: the latency line
    # qd1 + (N - 1) / iops (mean-value analysis of p random-routed channels)
    r = load_device("ssd:qd1_us=80,iops=500000,routing=random")
    assert r.routing == "random" and r.parallelism == 40 and r.service_cv == 1.0
    assert r.mean_latency(1) == pytest.approx(80 * US, rel=0.02)  # 20,000 exponential draws: 0.7% sd
    for n in (16, 128, 1024):
        assert r.mean_latency(n) == pytest.approx((80 + (n - 1) * 2) * US, rel=0.03)
    assert r.peak_iops() == 5e5 and d.routing == "shared"
    assert d.to_dict()["derived"] == d.derived and "derived" in d.describe()
    # what the drive delivers at the row's size overrides the 4 KiB figure; the depth at peak caps the channels
    d = load_device("ssd:qd1_us=80,iops=500000,iops_row=400000,qd_peak=16")
    assert d.iops_max == 400000 and d.parallelism == 16 and "iops_row" not in d.derived
    assert d.delay == pytest.approx(80 * US - 16 / 4e5)
    # a tail latency at QD1 sets the service cv
    d = load_device("ssd:qd1_us=100,iops=100000,p99_us=250")
    assert d.latency(1).percentile(99) == pytest.approx(250 * US, rel=0.03) and d.service_cv == d.derived["cv"]["value"]
    assert "p99_us" in d.derived["cv"]["rule"] and load_device("ssd:qd1_us=100,iops=100000,p99_us=400").service_cv > 0.8
    with pytest.raises(ArgumentError, match="p99_us = 90 must be above the QD1 latency"):
        load_device("ssd:qd1_us=100,iops=100000,p99_us=90")


def test_a_parallelism_the_latency_cannot_carry_says_what_would():
    with pytest.raises(ArgumentError) as err:
        load_device("ssd:qd1_us=150,iops=90000,parallelism=32")
    msg = str(err.value)
    assert "parallelism can be at most 13" in msg and "needs qd1_us >= 355.6" in msg and "leave parallelism out" in msg
    assert load_device("ssd:qd1_us=150,iops=90000").parallelism == 13


def test_fio_json_output_is_a_device():
    """The fixture is real: fio 3.33, libaio, O_DIRECT random 4 KiB reads of a 256 MiB file, iodepth 1..32."""
    doc = json.loads(FIO_JSON.read_text())
    d = load_device(str(FIO_JSON))
    assert isinstance(d, EmpiricalDevice) and d.depths() == [1, 2, 4, 8, 16, 32] and "fio randread" in d.source
    for job in doc["jobs"]:
        qd, r = int(job["job options"]["iodepth"]), job["read"]
        lat = d.latency(qd)
        assert lat.mean == pytest.approx(r["lat_ns"]["mean"] * 1e-9, rel=1e-9)
        assert lat.mean == pytest.approx(qd / r["iops"], rel=0.05)  # Little's law on fio's closed loop
        shift = (r["lat_ns"]["mean"] - r["clat_ns"]["mean"]) * 1e-9
        for p in ("50.000000", "90.000000", "99.000000"):  # fio's bucket bounds, scaled to the mean: within 3%
            assert lat.percentile(float(p)) == pytest.approx(r["clat_ns"]["percentile"][p] * 1e-9 + shift, rel=0.03)
        assert lat.quantile(1.0) == pytest.approx(r["clat_ns"]["max"] * 1e-9 + shift, rel=0.03)  # fio's maximum
    # several runs in one file: the median of each figure
    two = FIO_JSON.read_text() + "\nfio: note: some text fio printed\n" + FIO_JSON.read_text()
    path = FIO_JSON.parent / "__two_runs.json"
    try:
        path.write_text(two)
        assert device_from_fio(path).mean_latency(4) == pytest.approx(d.mean_latency(4), rel=1e-12)
        assert device_from_fio([FIO_JSON, FIO_JSON]).mean_latency(4) == pytest.approx(d.mean_latency(4), rel=1e-12)
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_run_here_is_a_device(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"\0" * (8 << 20))
    out = []
    for qd in (1, 4):
        r = subprocess.run(["fio", "--name=q", f"--filename={f}", "--rw=randread", "--bs=4k", "--size=8M",
                            f"--iodepth={qd}", "--ioengine=psync" if qd == 1 else "--ioengine=libaio",
                            "--runtime=100ms", "--time_based", "--output-format=json"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode:
            pytest.skip(f"fio cannot run here: {r.stderr[-200:]}")
        out.append(r.stdout)
    path = tmp_path / "runs.json"
    path.write_text("\n".join(out))
    d = load_device(str(path))
    assert d.depths() == [1, 4] and d.mean_latency(4) > 0


def test_a_calibration_is_a_device(tmp_path):
    cal = calibrate(micro_doc())
    path = cal.save(tmp_path / "calibration.json")
    for spec, kw in ((str(path), {}), ("calibrated", {"calibration": path}), ("calibrated:io_uring", {"calibration": cal})):
        d = load_device(spec, **kw, backend="pread")
        want = cal.device("io_uring" if spec.endswith("io_uring") else "pread")
        assert isinstance(d, MeasuredBatchDevice) and d.batch_dist(48, 4).mean == pytest.approx(want.batch_dist(48, 4).mean)
    assert load_device(str(path), backend="io_uring").batch_dist(48, 4).mean == pytest.approx(960 * US)
    think = load_device("calibrated", cal.to_dict(), compute="spin:2")
    assert think.batch_dist(48, 4).mean == pytest.approx(1500 * US)
    with pytest.raises(ArgumentError, match="needs a calibration"):
        load_device("calibrated")
    with pytest.raises(ArgumentError, match="no device for backend 'aio'"):
        load_device(str(path), backend="aio")
    with pytest.raises(ArgumentError, match="unknown device 'x.txt'"):
        load_device("x.txt")
    assert "fio --output-format=json" in DEVICE_FORMS


def test_a_tail_keeps_the_means_and_takes_the_spread():
    base = load_device("ssd:qd1_us=80,iops=500000,cv=0")
    shape = load_device(str(FIO_JSON))
    t = with_tail(base, shape)
    assert t.saturation_depth() == base.saturation_depth()
    for q in (1, 2, 4, 16, 32, 40):
        s = shape.latency(min(shape.depths(), key=lambda d: (abs(d - q), d)))
        assert t.mean_latency(q) == pytest.approx(base.mean_latency(q), rel=1e-9)
        assert t.latency(q).percentile(99.9) / t.mean_latency(q) == pytest.approx(s.percentile(99.9) / s.mean, rel=1e-6)
    with pytest.raises(ArgumentError, match="fixed latencies"):
        with_tail(shape, preset("seed-apple-m3-ultra"))



@pytest.mark.parametrize("spec, kind, rest", [
    ("nope", ArgumentError, "unknown device 'nope': give a preset"),
    ("ssd:qd1_us=80", ArgumentError, "device spec 'ssd:qd1_us=80': missing 'iops'"),
    ("ssd:qd1_us=80,iops=oops", ArgumentError, "device spec 'ssd:qd1_us=80,iops=oops': iops='oops' is not a number"),
    ("missing-tail.json", FormatError, "missing-tail.json: cannot read device file (No such file or directory)"),
    ("calibrated", ArgumentError, "device 'calibrated' needs a calibration"),
    ("seed-apple-m3-ultra", ArgumentError, "the device has fixed latencies, no distribution to take the tail from"),
])
def test_every_error_of_a_tail_names_the_tail_and_its_value(spec, kind, rest, capsys):
    """A bad tail read 'unknown device ...' or 'device spec ...' as if --device were wrong: each now starts
    'tail SPEC:', from the loader and from with_tail alike, on every command that takes one."""
    with pytest.raises(kind) as exc:
        with_tail(load_device("ssd:qd1_us=80,iops=500000"), load_tail(spec))
    assert str(exc.value).startswith(f"tail {spec!r}: {rest}"), str(exc.value)
    for argv in (["sim", "decode", "--limit", "50", "--compute-ms", "1"], ["sim", "serve", "--duration-s", "5"]):
        assert main([*argv, "--no-progress", "--tail", spec]) == 2
        assert capsys.readouterr().err.startswith(f"engram sim {argv[1]}: error: tail {spec!r}: {rest}")
    assert load_tail(str(FIO_JSON)).name == load_device(str(FIO_JSON)).name

def test_a_datasheet_drive_follows_a_measured_one_between_qd1_and_its_peak():
    """The packaged vm-virtio-16core-4k from its QD1 latency and peak alone: randomly routed channels stay within
    20% of its measured latency at every depth from 2 to 64; the first free channel (the knee rule) is 28-46%
    below it at QD 2 to 8 (it reaches the peak from QD 4 on)."""
    measured = load_device("vm-virtio-16core-4k")
    qd1, peak = measured.mean_latency(1), measured.peak_iops()
    routed = load_device(f"ssd:qd1_us={qd1 / US:.1f},iops={peak:.0f},routing=random")
    first_free = load_device(f"ssd:qd1_us={qd1 / US:.1f},iops={peak:.0f}")
    for q in (2, 4, 8, 16, 32, 64):
        assert routed.mean_latency(q) == pytest.approx(measured.mean_latency(q), rel=0.20), q
    for q in (2, 4, 8):
        assert first_free.mean_latency(q) < 0.75 * measured.mean_latency(q), q


def test_thinktime_jobs_are_left_out_of_the_latency_by_depth_and_said(tmp_path):
    """A fio file with an idle-pattern job (thinktime, here 5 ms every 48 reads at QD4 with 3x the latency)
    gives the same device as the back-to-back jobs alone, its ``derived`` naming the job left out; a file of
    thinktime jobs only is a FormatError that says why."""
    doc = json.loads(FIO_JSON.read_text())
    base = device_from_fio(FIO_JSON)
    idle = json.loads(json.dumps(next(j for j in doc["jobs"] if int(j["job options"]["iodepth"]) == 4)))
    idle["jobname"] = "after-idle"
    idle["job options"].update(thinktime="5ms", thinktime_blocks="48")
    idle["read"]["lat_ns"]["mean"] *= 3
    both = tmp_path / "both.json"
    both.write_text(json.dumps({**doc, "jobs": doc["jobs"] + [idle]}))
    dev = device_from_fio(both)
    assert [dev.mean_latency(q) for q in (1, 4, 16)] == [base.mean_latency(q) for q in (1, 4, 16)]
    assert "job(s) after-idle ran with a thinktime" in dev.derived["idle_jobs"]["rule"]
    assert "idle_jobs" not in base.derived
    only = tmp_path / "only.json"
    only.write_text(json.dumps({**doc, "jobs": [idle]}))
    with pytest.raises(FormatError, match=r"no read job with completed reads run back to back \(1 ran with a "
                                          r"thinktime"):
        device_from_fio(only)


def test_the_device_queue_is_written_once():
    """The queue's statements live in sim.device.fluid.QUEUE alone: the segment queue's methods, the serving model's
    fluid device and the fast decode loop that runs the queue inline are compiled from them (each carries every
    statement of the parts it names), and no module of sim/ spells them by hand."""
    import linecache

    from sim.decode.fast import _lean_loop
    from sim.device.fluid import QUEUE, SegmentQueue
    from sim.serve.device import SharedDevice

    parts = {SegmentQueue.submit: ("advance", "submit", "settle"),
             SegmentQueue.complete: ("advance", "complete", "settle"),
             SharedDevice.submit: ("advance", "submit", "settle"),
             SharedDevice.complete: ("advance", "complete", "settle"),
             _lean_loop: ("advance", "submit", "complete", "settle")}
    for fn, names in parts.items():
        src = [x.strip() for x in fn.source.splitlines()]
        assert linecache.getlines(fn.__code__.co_filename) == fn.source.splitlines(True), fn.__qualname__
        for name in names:
            body = [x.strip() for x in QUEUE[name].strip().splitlines()]
            assert any(src[i:i + len(body)] == body for i in range(len(src))), (fn.__qualname__, name)
    root = Path(__file__).resolve().parents[2] / "sim"
    spelled = ["push(heap, (V + b2[3], qseq, b2, take))", "Ve = V + 1e-12", "self.V += dt /"]
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name != "fluid.py":
            assert not any(x in text for x in spelled), path
