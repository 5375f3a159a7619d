"""sim.check.crosscheck: known-answer predictions, the error table of a real measurement, the three commands."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from engram import ArgumentError, FormatError, synth
from engram.cli import main
from tests.modelfiles import SCALE, token_map as _token_map
from sim.check.calibrate import Calibration, calibrate_file
from engram.backends import usable_backends
from sim.check.crosscheck import CDF_PERCENTILES, capacity, capacity_shown, crosscheck, crosscheck_files, markdown_table, \
    predict, _by_chance
from sim.check.intervals import INTERVAL_Z, MODEL_PEERS_MIN, MODEL_RUNS_MIN, median_interval, model_sd, run_sd
from sim.check.regimes import (QUIET_TARGETS, TARGETS, chance_of_fewer, regime, regime_checks, verdict,
                               verdict_text)
from sim.check.planner import markdown_table as planner_markdown_table
from sim.device import LatencyDist, MeasuredBatchDevice
from sim.core.io import load_json
from sim.measure import measure
from sim.core.params import Compute
from sim.core.schema import RunConfig
from sim.trace import CODE_SOURCE, load_trace

US = 1e-6


def point_calibration() -> Calibration:
    """Every batch and compute takes a fixed time: predictions have exact answers."""
    table = {1: LatencyDist.point(100 * US), 16: LatencyDist.point(300 * US)}
    batches = {(48, 1): LatencyDist.point(4800 * US), (48, 4): LatencyDist.point(1200 * US),
               (48, 16): LatencyDist.point(600 * US)}
    dev = MeasuredBatchDevice(table, batches, name="points")
    return Calibration({"pread": dev, "io_uring": dev}, {"spin:1": Compute.empirical([1e-3] * 4)}, 2 * US)


def expected_step(trace, steps: int, batch_us, k: int) -> float:
    """Mean step time with every batch of n distinct rows scaled by waves from the 48-row batch (seconds)."""
    rows = trace.rows[:steps].reshape(steps, -1)
    n = np.array([np.unique(r[:24]).size + np.unique(r[24:]).size for r in rows])
    kk = np.minimum(k, n)
    batch = batch_us * US * np.ceil(n / kk) / np.ceil(48 / np.minimum(k, 48))
    return float(np.mean(batch)) + 1e-3 + 2 * US


def _shift(trace, a: int):
    """The trace from step ``a`` on."""
    from sim.trace import Trace

    return Trace(trace.rows[a:], trace.tokens[a:], np.zeros(1, dtype=np.int64), trace.layer_ids, trace.heads)


@pytest.mark.parametrize("threshold, readers, batch_us, k", [(8, 16, 600, 16), (8, 4, 1200, 4), (256, 4, 4800, 1)])
def test_predict_known_answers(threshold, readers, batch_us, k):
    tr = load_trace(CODE_SOURCE, limit=200)
    cfg = RunConfig(CODE_SOURCE, threshold, "pread", readers, "spin:1", 200)
    p = predict(point_calibration(), cfg, tr, sim_steps=200)
    step = expected_step(tr, 200, batch_us, k)
    assert 1 / p["tokens_per_s"] == pytest.approx(step, rel=1e-9)
    assert p["step_mean_ms"] == pytest.approx(step * 1e3, rel=1e-9)
    assert p["compute_mean_ms"] == pytest.approx(1.0)
    assert p["read_mean_ms"] == pytest.approx((step - 1e-3) * 1e3, rel=1e-6)
    assert len(p["cdf_ms"]) == len(CDF_PERCENTILES) and p["cdf_ms"] == sorted(p["cdf_ms"])
    # wrapping the trace keeps the answer (no row cache)
    p2 = predict(point_calibration(), cfg, load_trace(CODE_SOURCE, limit=250), sim_steps=600)
    assert 1 / p2["tokens_per_s"] == pytest.approx(step, rel=1e-9)
    # several stretches are replayed one after the other
    long = load_trace(CODE_SOURCE, limit=700)
    p3 = predict(point_calibration(), RunConfig(CODE_SOURCE, threshold, "pread", readers, "spin:1", 100), long,
                 starts=[0, 100, 500], sim_steps=300)
    want = np.mean([expected_step(_shift(long, a), 100, batch_us, k)
                    for a in (0, 100, 500)])
    assert 1 / p3["tokens_per_s"] == pytest.approx(want, rel=1e-9)
    with pytest.raises(ArgumentError, match="do not fit"):
        predict(point_calibration(), cfg, long, starts=[600])


def test_predict_needs_a_calibrated_compute():
    tr = load_trace(CODE_SOURCE, limit=50)
    with pytest.raises(ArgumentError, match="mixer"):
        predict(point_calibration(), RunConfig(CODE_SOURCE, 8, "pread", 4, "mixer", 50), tr)


# ------------------------------------------------------------ real measurement
@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    d = tmp_path_factory.mktemp("xc")
    path = d / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=9),
                      synth.Fill(projections=False), progress=False)
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 40), RunConfig(CODE_SOURCE, 8, "io_uring", 4, "spin:0.5", 40),
            RunConfig("shared:promessi_sposi.txt", 256, "pread", 4, "none", 40),
            RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:1", 30, 2, "threads"),
            RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:1", 30, 3, "threads")]
    measure(path, cfgs, d, rounds=3, depths=(1, 4), fio=False, io_batches=8, io_chunks=2, big_seconds=0.01,
            single_rows=8, compute_samples=10, warmup=3, probe_every=3,
            shared_seconds=0.03, cache_batches=4, capacity_target=100.0, progress=False)
    calibrate_file(d / "microbench.json", d / "calibration.json")
    return d


def test_crosscheck_table(measured):
    res = crosscheck_files(measured / "calibration.json", measured / "runs.json", measured / "crosscheck.json",
                           sim_steps=500)
    runs = load_json(measured / "runs.json")
    assert json.loads((measured / "crosscheck.json").read_text())["summary"] == res["summary"]
    assert res["kind"] == "crosscheck" and res["targets"] == TARGETS
    assert [r["key"] for r in res["rows"] + res["session_rows"]] == [c["key"] for c in runs["configs"]]
    assert [r["sessions"] for r in res["session_rows"]] == [2, 3]
    for row in res["rows"] + res["session_rows"]:
        mine = [r for r in runs["runs"] if r["config"] == row["key"]]
        tps = np.array([r["tokens_per_s"] for r in mine])
        m, p, e = row["measured"], row["predicted"], row["error"]
        assert row["repeats"] == 3 and m["tokens_per_s"] == pytest.approx(np.median(tps))
        assert row["spread"]["tokens_per_s"] == pytest.approx((tps.max() - tps.min()) / np.median(tps))
        assert m["step_p50_ms"] == pytest.approx(np.median([r["step_ms"]["p50"] for r in mine]))
        # errors paired: each run against its own window's prediction, the median over runs
        runs_p = np.array(p["tokens_per_s_runs"])
        p50 = np.array([r["step_ms"]["p50"] for r in mine])
        assert e["tokens_per_s"] == pytest.approx(np.median(runs_p / tps - 1), rel=1e-12)
        assert e["step_p50"] == pytest.approx(np.median(np.array(p["step_p50_ms_runs"]) / p50 - 1), rel=1e-12)
        assert e["tokens_per_s_of_medians"] == pytest.approx(p["tokens_per_s"] / m["tokens_per_s"] - 1)
        assert row["within_spread"] == (tps.min() <= p["tokens_per_s"] <= tps.max())
        assert p["tokens_per_s"] > 0 and m["rows_match"]
        assert len(m["cdf_ms"]) == len(p["cdf_ms"]) == len(CDF_PERCENTILES)
        # steps with compute between reads use the batches measured with that compute as think time
        assert ("think-spin:0.5" in p["device"]) == (row["compute"] == "spin:0.5")
        # every run predicted in its own probed window; the interval holds the prediction
        assert p["windows"] == 3 and row["interval"]["low"] <= p["tokens_per_s"] <= row["interval"]["high"]
        # inside, run by run: the median of the runs' log errors within 1.645 x the median of their sds
        band = 1.645 * np.median(row["interval"]["run_sd"])
        logs = np.log(tps / np.array(p["tokens_per_s_runs"]))
        assert row["inside_interval"] == (abs(np.median(logs)) <= band)
        assert (row["interval"]["error_low"], row["interval"]["error_high"]) == pytest.approx(
            (np.expm1(-band), np.expm1(band)), rel=1e-12)
        assert f"{row['interval']['error_high'] * 100:+.1f}%]" in markdown_table(res)
        # each run's log-normal spread: its window's uncertainty and the model's error on the other rows
        iv = row["interval"]
        sd, wsd = np.array(iv["run_sd"]), np.array(iv["window_sd"])
        assert sd.shape == wsd.shape == (3,) and np.all(wsd > 0) and 0 <= row["runs_inside"] <= 3
        assert sd == pytest.approx(np.sqrt(wsd ** 2 + iv["model_sd"] ** 2), rel=1e-12)
        others = [r for r in res["rows"] if r is not row]
        if len(others) < MODEL_PEERS_MIN:  # too few of its own kind: every other configuration
            others = [r for r in res["rows"] + res["session_rows"] if r is not row]
        errs = [np.log(m_ / p_) for r in others for m_, p_ in
                zip(r["measured"]["tokens_per_s_runs"], r["predicted"]["tokens_per_s_runs"])]
        assert iv["model_sd"] == pytest.approx(
            model_sd(errs, [x for r in others for x in r["interval"]["window_sd"]]), rel=1e-12, abs=1e-15)
        runs_p = np.array(p["tokens_per_s_runs"])
        assert row["interval"]["low"] == pytest.approx(np.median(runs_p * np.exp(-1.645 * sd)))
        assert row["interval"]["high"] == pytest.approx(np.median(runs_p * np.exp(1.645 * sd)))
        assert row["runs_inside"] == int(np.sum(np.abs(np.log(tps / runs_p)) <= 1.645 * sd))
        assert row["interval"]["independent_low"] <= p["tokens_per_s"] <= row["interval"]["independent_high"]
        assert e["tokens_per_s_calibrated"] == pytest.approx(
            np.median(np.array(p["tokens_per_s_calibrated_runs"]) / tps - 1), rel=1e-12)
    for row in res["session_rows"]:
        mine = [r for r in runs["runs"] if r["config"] == row["key"]]
        assert row["measured"]["slowest_tokens_per_s"] == pytest.approx(
            np.median([r["slowest_tokens_per_s"] for r in mine]))
        assert row["predicted"]["slowest_tokens_per_s"] <= row["predicted"]["tokens_per_s"] + 1e-9
        assert row["measured"]["threads"] > 0
    (cap,) = res["capacity"]
    assert cap["sessions"] == [2, 3] and cap["target_tokens_per_s"] == 100.0
    assert cap["measured_capacity"] in (0, 2, 3) and cap["within_one_step"] == (
        abs([0, 2, 3].index(cap["measured_capacity"]) - [0, 2, 3].index(cap["predicted_capacity"])) <= 1)
    left = {b for b in ("pread", "io_uring") if b not in usable_backends()}
    assert left <= set(res["backends"]["left_out"])
    every = res["rows"] + res["session_rows"]
    errs = np.abs([r["error"]["tokens_per_s"] for r in every])
    s = res["summary"]
    assert s["tokens_per_s"]["median_abs_error"] == pytest.approx(np.median(errs))
    assert s["tokens_per_s"]["max_abs_error"] == pytest.approx(errs.max())
    assert s["configurations"] == len(runs["configs"]) and s["runs"] == 3 * len(runs["configs"]) and s["rows_match"]
    assert s["passed"] == all(s["pass"].values())
    assert s["runs_inside"] == sum(r["runs_inside"] for r in every) and s["windows_probed"] == s["runs"]
    cal_errs = np.abs([r["error"]["tokens_per_s_calibrated"] for r in every])
    assert s["calibrated_only"]["max_abs_error"] == pytest.approx(cal_errs.max())
    name = s["regime"]["name"]
    assert name in ("quiet", "busy", "loaded", "unmeasured")
    # the regime's goals: quiet, the quiet targets; busy, the any-machine ones and the coverage; loaded, the coverage
    if name == "loaded":
        assert "tokens_per_s_max_abs" not in s["pass"] and "step_p50_max_abs" not in s["pass"]
    else:
        use = QUIET_TARGETS if name == "quiet" else TARGETS
        assert s["pass"]["tokens_per_s_max_abs"] == (errs.max() <= use["tokens_per_s_max_abs"])
    assert ("inside_interval" in s["pass"]) == (name != "quiet")
    which, coverage, _ = regime_checks(name)
    assert s["goals"] == {"targets": which, "coverage": coverage, "capacity": bool(res["capacity"]),
                          "row_cache": False}
    assert s["background_cpu_median"] == s["regime"]["cpu"]
    md = markdown_table(res)
    assert md.splitlines()[0].startswith("| trace")
    assert len([ln for ln in md.splitlines() if ln.startswith("| ")]) == 1 + len(res["rows"]) + 1 + 2
    assert "base_events" in md and "serial" in md and ("PASS" in md) == s["passed"]
    assert f"Regime: {s['regime']['name']}" in md and "Capacity (threads" in md
    for c in res["capacity"]:
        for key in ("measured", "predicted"):
            assert (f"{capacity_shown(c, key)} (every count up to" in md) == c["all_met"][key]
            assert capacity_shown(c, key).startswith(">= ") == c["all_met"][key]
    assert f"each run inside its own 90% interval: {s['runs_inside']} of {s['runs']}" in md
    for b in left:
        assert f"Backends left out: {b}" in md


def test_crosscheck_uses_the_saved_traces(measured, tmp_path):
    cal = Calibration.load(measured / "calibration.json")
    doc = load_json(measured / "runs.json")
    gone = copy.deepcopy(doc)
    gone["file"]["path"] = str(tmp_path / "no-such-model.gguf")
    a = crosscheck(cal, gone, runs_path=measured / "runs.json", sim_steps=300)
    # without saved traces the trace is rebuilt from the model file's layout: the same rows, the same answer
    (tmp_path / "runs.json").write_text(json.dumps(doc))
    b = crosscheck(cal, doc, runs_path=tmp_path / "runs.json", sim_steps=300)
    assert [r["predicted"] for r in a["rows"]] == [r["predicted"] for r in b["rows"]]
    with pytest.raises(Exception, match="no saved trace"):
        crosscheck(cal, gone, runs_path=tmp_path / "runs.json")


def test_crosscheck_rejects_other_documents(measured):
    cal = Calibration.load(measured / "calibration.json")
    with pytest.raises(ArgumentError, match="decode-runs"):
        crosscheck(cal, load_json(measured / "microbench.json"))
    doc = load_json(measured / "runs.json")
    doc["runs"][0]["config"] = "nowhere"
    with pytest.raises(ArgumentError, match="unknown configuration"):
        crosscheck(cal, doc, runs_path=measured / "runs.json")
    doc = load_json(measured / "runs.json")
    doc["runs"] = []
    with pytest.raises(ArgumentError, match="no runs"):
        crosscheck(cal, doc, runs_path=measured / "runs.json")


# ------------------------------------------------------------------ commands
def test_commands(capsys, measured, tmp_path):
    work = tmp_path / "w"
    model = str(measured / "m.gguf")
    assert main(["measure", str(work), "--model", model, "--scale", str(SCALE), "--traces", CODE_SOURCE,
                 "--thresholds", "8,256", "--backends", "pread", "--readers", "4", "--computes", "none",
                 "--config", f"{CODE_SOURCE}/8/pread/4/spin:0.3/20", "--steps", "20", "--rounds", "2",
                 "--depths", "1,4", "--no-fio", "--io-batches", "4", "--io-chunks", "2", "--no-wait",
                 "--json", "--no-progress"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["configs"] == 3 and d["runs_done"] == 6 and d["model"] == model
    assert main(["calibrate", str(work), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["kind"] == "calibration" and set(c["compute"]) == {"none", "spin:0.3"}
    assert c["saved"] == str(work / "calibration.json")
    rc = main(["crosscheck", str(work), "--json", "--sim-steps", "300", "--no-progress", "--strict"])
    x = json.loads(capsys.readouterr().out)
    assert x["summary"]["configurations"] == 3 and rc == (0 if x["summary"]["passed"] else 1)
    assert main(["crosscheck", str(work), "--no-progress", "--sim-steps", "300"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| trace") and "3 configurations (0 with several sessions), 6 runs" in out
    assert main(["calibrate", str(work)]) == 0
    assert "per backend and depth" in capsys.readouterr().out
    # the calibration refuses a decode-run file
    assert main(["calibrate", str(work), "--microbench", str(work / "runs.json")]) == 2
    assert "microbenchmarks only" in capsys.readouterr().err
    assert main(["measure", str(work), "--model", model, "--scale", "0.001", "--no-progress"]) == 2
    assert "scale" in capsys.readouterr().err


def test_median_interval_known_answers():
    """The interval of the median over runs of log-normal draws: exact without spread, 1.645 sd for one run."""
    assert median_interval([100.0, 120.0, 90.0], [0.0, 0.0, 0.0]) == pytest.approx((100.0, 100.0))
    low, high = median_interval([200.0], [0.1], draws=20000)
    assert low == pytest.approx(200 * np.exp(-INTERVAL_Z * 0.1), rel=0.01)
    assert high == pytest.approx(200 * np.exp(INTERVAL_Z * 0.1), rel=0.01)
    # the median of three runs: NumPy's own draws of the same model
    c, sd = np.array([100.0, 110.0, 95.0]), np.array([0.05, 0.1, 0.02])
    z = np.random.default_rng([0, 15]).standard_normal((4000, 3))
    med = np.median(np.log(c) + z * sd, axis=1)
    assert median_interval(c, sd) == pytest.approx(tuple(np.exp(np.quantile(med, [0.05, 0.95]))), rel=1e-12)


def test_run_sd_adds_the_windows_uncertainties():
    cal = point_calibration()
    cal.windows = {"r0-c0": {"device": 1.2, "compute": 1.0, "read_se": 0.04, "compute_se": 0.02, "step_cv": 0.3}}
    cfg = RunConfig(CODE_SOURCE, 8, "pread", 4, "spin:1", 100, 4, "threads")
    pred = {"read_share": 0.6, "compute_share": 0.4, "sim_se": 0.01}
    want = np.sqrt((0.6 * 0.04) ** 2 + (0.4 * 0.02) ** 2 + 0.3 ** 2 / 400 + 0.01 ** 2)
    assert run_sd(cal, cfg, {"window": "r0-c0"}, pred) == pytest.approx(want, rel=1e-12)
    slow = np.sqrt((0.6 * 0.04) ** 2 + (0.4 * 0.02) ** 2 + 0.3 ** 2 / 100 + 0.01 ** 2)
    assert run_sd(cal, cfg, {"window": "r0-c0"}, pred, slowest=True) == pytest.approx(slow, rel=1e-12)
    assert run_sd(cal, cfg, {"window": "r9-c9"}, pred) == 0.01  # not probed: the simulation's own error alone


def test_model_sd_known_answers():
    # errors of scale 0.1 around their median, windows of sd 0.06: the model's own part is sqrt(0.1^2 - 0.06^2)
    e = 0.1 / 1.4826 * np.array([-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0])
    assert model_sd(e, [0.06] * 7) == pytest.approx(0.08, rel=1e-12)
    # a bias shared by every run does not widen the intervals (it must show as misses): the same with 5% off
    assert model_sd(e + np.log(0.95), [0.06] * 7) == pytest.approx(0.08, rel=1e-12)
    assert model_sd([np.log(0.95)] * 6, [0.0] * 6) == 0.0
    # the windows explain it all; too few runs say nothing
    assert model_sd(e, [0.5] * 7) == 0.0
    few = ([0.5, -0.5] * MODEL_RUNS_MIN)[:MODEL_RUNS_MIN - 1]
    assert model_sd(few, [0.0] * len(few)) == 0.0
    assert model_sd(few + [-0.5], [0.0] * MODEL_RUNS_MIN) == pytest.approx(1.4826 * 0.5)
    # one wild run of six moves the scale little
    assert model_sd([0.01, -0.01, 0.01, -0.01, 0.01, 2.0], [0.0] * 6) == pytest.approx(1.4826 * 0.01, rel=1e-12)


def test_regime_from_the_background():
    assert regime([{"cpu": 0.02, "steal": 0.0}, {"cpu": 0.05, "steal": 0.01}])["name"] == "quiet"
    r = regime([{"cpu": 0.5, "steal": 0.0}, {"cpu": 0.6, "steal": 0.0}, {"cpu": 0.01, "steal": 0.0}])
    assert r["name"] == "loaded" and r["cpu"] == pytest.approx(0.5) and "50.0%" in r["why"]
    assert regime([{"cpu": 0.0, "steal": 0.2}])["name"] == "loaded"
    # nothing recorded: not called quiet, held as busy
    assert regime([None, {}])["name"] == "unmeasured" and "not measured" in regime([None])["why"]
    assert regime_checks("unmeasured")[:2] == ("any", True)
    # the edges: at most 10% quiet, at most a third busy (steal: 5%, 10%)
    assert [regime([{"cpu": c, "steal": 0.0}])["name"] for c in (0.10, 0.1001, 0.333, 0.34)] == \
        ["quiet", "busy", "busy", "loaded"]
    assert [regime([{"cpu": 0.0, "steal": x}])["name"] for x in (0.05, 0.06, 0.10, 0.11)] == \
        ["quiet", "busy", "busy", "loaded"]
    assert "busy: at most 33% and 10%" in r["why"]


def test_chance_of_fewer_is_the_binomial_tail():
    # Bin(10, 0.9): P(X <= 8) = 1 - 10 * 0.9^9 * 0.1 - 0.9^10
    assert chance_of_fewer(8, 10) == pytest.approx(1 - 10 * 0.9 ** 9 * 0.1 - 0.9 ** 10, rel=1e-12)
    assert chance_of_fewer(10, 10) == pytest.approx(1.0) and chance_of_fewer(0, 3) == pytest.approx(0.001)
    res = {"coverage_target": 0.9}
    low = {"configurations": 10, "inside_interval": 8, "inside_interval_share": 0.8}
    assert "10 configurations an interval that holds 90% of the time shows 8 or fewer inside 26% of the time" in \
        _by_chance(low, res)
    assert _by_chance({**low, "inside_interval": 9, "inside_interval_share": 0.9}, res) == ""


@pytest.mark.parametrize("name, keys", [
    ("quiet", {"tokens_per_s_median_abs", "tokens_per_s_max_abs", "step_p50_max_abs"}),
    ("busy", {"tokens_per_s_median_abs", "tokens_per_s_max_abs", "step_p50_max_abs", "inside_interval"}),
    ("loaded", {"inside_interval"})])
def test_each_regime_holds_its_own_goals(name, keys):
    """errors 4% / 9% / p50 9%, coverage 95%: quiet fails on the max (8%), busy passes everything, loaded the
    coverage; the regime's sentence says which goals bind."""
    summary = {"tokens_per_s": {"median_abs_error": 0.04, "max_abs_error": 0.09},
               "step_p50": {"max_abs_error": 0.09}, "inside_interval_share": 0.95, "regime": {"name": name}}
    ok = verdict(summary, TARGETS, QUIET_TARGETS, [])
    assert set(ok) == keys
    assert all(ok.values()) == (name != "quiet") and ok.get("tokens_per_s_median_abs", False) == (name == "busy")
    assert ("coverage" in regime_checks(name)[2]) == (name != "quiet")


def _cap_row(n, measured, predicted, mode="threads"):
    return {"trace": "t", "trace_label": "t", "threshold": 8, "backend": "pread", "readers": 4, "compute": "sleep:5",
            "steps": 100, "mode": mode, "sessions": n, "measured": {"slowest_tokens_per_s": measured},
            "predicted": {"slowest_tokens_per_s": predicted},
            "interval": {"slowest_low": predicted * 0.9, "slowest_high": predicted * 1.1}}


def test_capacity_known_answers():
    rows = [_cap_row(n, m, p) for n, m, p in ((1, 150, 160), (2, 120, 130), (4, 95, 99), (8, 70, 88), (16, 40, 60))]
    (c,) = capacity(rows, 85.0)
    assert (c["measured_capacity"], c["predicted_capacity"], c["within_one_step"]) == (4, 8, True)
    (c,) = capacity(rows, 125.0)
    assert (c["measured_capacity"], c["predicted_capacity"]) == (1, 2)
    (c,) = capacity(rows, 200.0)
    assert (c["measured_capacity"], c["predicted_capacity"], c["within_one_step"]) == (0, 0, True)
    (c,) = capacity(rows, 30.0)
    assert c["measured_capacity"] == 16 and c["all_met"] == {"measured": True, "predicted": True}
    # every count met the target: a lower bound, shown ">= 16" for measured and predicted alike
    assert (capacity_shown(c, "measured"), capacity_shown(c, "predicted")) == (">= 16", ">= 16")
    (c,) = capacity(rows, 50.0)
    assert (capacity_shown(c, "measured"), capacity_shown(c, "predicted")) == ("8", ">= 16")
    # a count that misses the target ends the capacity, even when a larger one reaches it
    rows[1] = _cap_row(2, 80, 130)
    (c,) = capacity(rows, 85.0)
    assert (c["measured_capacity"], c["predicted_capacity"], c["within_one_step"]) == (1, 8, False)
    # modes are separate groups
    assert [c["mode"] for c in capacity(rows + [_cap_row(2, 90, 90, "processes")], 85.0)] == ["threads", "processes"]


def test_crosscheck_refuses_a_backend_the_calibration_lacks(measured):
    cal = Calibration.load(measured / "calibration.json")
    doc = load_json(measured / "runs.json")
    cal.devices = {"pread": cal.devices["pread"]}
    cal.backends = {"usable": ["pread"], "left_out": {"io_uring": "io_uring could not start: test"}}
    doc["configs"].append(RunConfig(CODE_SOURCE, 8, "io_uring", 4, "none", 40).to_dict())
    doc["runs"].append({**doc["runs"][0], "config": doc["configs"][-1]["key"]})
    with pytest.raises(ArgumentError, match=r"the measured runs names backend 'io_uring'.*could not start: test"):
        crosscheck(cal, doc, runs_path=measured / "runs.json")


def test_a_calibration_of_another_measurement_lends_no_windows(measured):
    """Window ids repeat from one measurement to the next: another measurement's windows are not used."""
    cal = Calibration.load(measured / "calibration.json")
    runs = load_json(measured / "runs.json")
    res = crosscheck(cal, {**runs, "date": "2020-01-01T00:00:00+00:00"}, runs_path=measured / "runs.json",
                     sim_steps=300)
    assert res["summary"]["windows_probed"] == 0
    assert any("from the measurement of 2020-01-01" in w and "calibrated device and compute alone" in w
               for w in res["warnings"])
    assert "Warning: the calibration's probe windows come from the measurement of" in markdown_table(res)


def test_a_window_of_another_configuration_is_refused(measured):
    cal = Calibration.load(measured / "calibration.json")
    runs = load_json(measured / "runs.json")
    first = runs["runs"][0]
    other = next(r for r in runs["runs"] if cal.window(r["window"])["readers"] != cal.window(first["window"])["readers"]
                 or cal.window(r["window"])["sessions"] != cal.window(first["window"])["sessions"])
    runs["runs"][0] = {**first, "window": other["window"]}
    with pytest.raises(FormatError, match=rf"window {other['window']} of the calibration was probed with .*"
                                          rf"the run of {first['config']} \(round {first['round']}\)"):
        crosscheck(cal, runs, runs_path=measured / "runs.json", sim_steps=300)


def test_a_biased_model_misses_its_intervals(measured):
    """Every window's device 0.6x what it measured.  The bias moves each configuration by the share of its step the
    device makes up (measured, quiet: +64% and +66% without compute between reads, +20-22% with spin:0.5 or
    sleep:1), so the configurations' errors scatter and the model's error, taken from the peers
    (sim.check.intervals), widens the compute-bound ones' intervals until they hold (3 of 5 inside, on CI busy and
    here quiet).  What must hold: the verdict fails, the errors and the share outside exceed the calibrated model's,
    and on a quiet machine every configuration whose step is the device alone lies outside its interval; on one
    that is not quiet the runs' scatter widens every interval by design and that last check is not held."""
    fair = crosscheck(Calibration.load(measured / "calibration.json"), load_json(measured / "runs.json"),
                      runs_path=measured / "runs.json", sim_steps=300)["summary"]
    cal = Calibration.load(measured / "calibration.json")
    for w in cal.windows.values():
        w["device"] *= 0.6
    res = crosscheck(cal, load_json(measured / "runs.json"), runs_path=measured / "runs.json", sim_steps=300)
    s = res["summary"]
    assert s["tokens_per_s"]["median_abs_error"] > 0.15
    assert s["tokens_per_s"]["median_abs_error"] > fair["tokens_per_s"]["median_abs_error"]
    assert not s["passed"]
    assert s["inside_interval_share"] <= fair["inside_interval_share"]
    device_bound = [r for r in res["rows"] + res["session_rows"] if r["compute"] == "none"]
    # under a load of other work a device-bound step waits for the CPUs too, which the bias leaves alone: +14%
    # measured with four other jobs on the two cores, against +64-66% quiet
    floor = 0.3 if s["regime"]["name"] in ("quiet", "busy") else 0.1
    assert len(device_bound) == 2 and all(r["error"]["tokens_per_s"] > floor for r in device_bound)
    if s["regime"]["name"] == "quiet":
        assert not any(r["inside_interval"] for r in device_bound)


def test_a_verdict_names_the_checks_it_missed():
    """A planner row of 0.5% / 3.0% tokens/s errors on a quiet machine failed on its step p50 (28.3%, not a column
    of that table): the verdict says which check failed and by how much, everywhere a verdict is printed."""
    s = {"passed": False, "tokens_per_s": {"median_abs_error": 0.005, "max_abs_error": 0.03},
         "step_p50": {"max_abs_error": 0.2826}, "inside_interval_share": 0.6,
         "pass": {"tokens_per_s_median_abs": True, "tokens_per_s_max_abs": True, "step_p50_max_abs": False,
                  "inside_interval": False, "capacity_within_one_step": False}}
    assert verdict_text(s) == ("FAIL (missed: step p50 max error 28.26%, interval coverage 60.00%, "
                               "capacity within one step)")
    assert verdict_text({**s, "passed": True}) == "PASS"
    assert verdict_text({"passed": False}) == "FAIL"
    # a miss by a hair does not print as its target (3% on a quiet machine)
    hair = {"passed": False, "tokens_per_s": {"median_abs_error": 0.0304}, "pass": {"tokens_per_s_median_abs": False}}
    assert verdict_text(hair) == "FAIL (missed: tokens/s median error 3.04%)"
    # older or partial files: no 'passed' (from the checks), parts missing or not of their kind, NaN figures
    assert verdict_text({"pass": {"inside_interval": True}}) == "PASS"
    assert verdict_text({}) == "FAIL" and verdict_text(None) == "FAIL"
    assert verdict_text({"passed": False, "tokens_per_s": 0.03, "pass": ["x"]}) == "FAIL"
    assert verdict_text({"passed": False, "step_p50": {"max_abs_error": "0.28"}, "pass": {"step_p50_max_abs": False}}) \
        == "FAIL (missed: step p50 max error)"
    assert verdict_text({"passed": False, "step_p50": {"max_abs_error": float("nan")},
                         "pass": {"step_p50_max_abs": False}}) == "FAIL (missed: step p50 max error not measured)"
    # the planner's table carries it in its verdict column
    res = {"devices": [{"name": "disk", "class": "disk", "built": True,
                        "modes": {"fio": {"refused": None, "device": "/x/fio-512.json", "capacity": [],
                                          "summary": {**s, "configurations": 11, "regime": {"name": "quiet"}}}}}],
           "classes": {}, "built": ["disk"], "skipped": {}}
    row = next(x for x in planner_markdown_table(res).splitlines() if x.startswith("| disk |"))
    assert row.endswith("| quiet | FAIL (missed: step p50 max error 28.26%, interval coverage 60.00%, "
                        "capacity within one step) |") and "| 0.5% | 3.0% |" in row
