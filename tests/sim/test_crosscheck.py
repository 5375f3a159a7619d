"""sim.crosscheck: known-answer predictions, the error table of a real measurement, the three commands."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from engram import ArgumentError, synth
from engram.cli import main
from tests.modelfiles import SCALE, token_map as _token_map
from sim.calibrate import Calibration, calibrate_file
from sim.crosscheck import CDF_PERCENTILES, TARGETS, crosscheck, crosscheck_files, markdown_table, predict
from sim.device import LatencyDist, MeasuredBatchDevice
from sim.io import load_json
from sim.measure import measure
from sim.params import Compute
from sim.schema import RunConfig
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
    synth.build_model(path, scale=SCALE, token_map=_token_map(), progress=False, projections=False, seed=9)
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 40), RunConfig(CODE_SOURCE, 8, "io_uring", 4, "spin:0.5", 40),
            RunConfig("shared:promessi_sposi.txt", 256, "pread", 4, "none", 40)]
    measure(path, cfgs, d, rounds=3, depths=(1, 4), fio=False, io_batches=8, io_chunks=2, big_seconds=0.01,
            single_rows=8, compute_samples=10, warmup=3, progress=False)
    calibrate_file(d / "microbench.json", d / "calibration.json")
    return d


def test_crosscheck_table(measured):
    res = crosscheck_files(measured / "calibration.json", measured / "runs.json", measured / "crosscheck.json",
                           sim_steps=500)
    runs = load_json(measured / "runs.json")
    assert json.loads((measured / "crosscheck.json").read_text())["summary"] == res["summary"]
    assert res["kind"] == "crosscheck" and res["targets"] == TARGETS
    assert [r["key"] for r in res["rows"]] == [c["key"] for c in runs["configs"]]
    for row in res["rows"]:
        mine = [r for r in runs["runs"] if r["config"] == row["key"]]
        tps = np.array([r["tokens_per_s"] for r in mine])
        m, p, e = row["measured"], row["predicted"], row["error"]
        assert row["repeats"] == 3 and m["tokens_per_s"] == pytest.approx(np.median(tps))
        assert row["spread"]["tokens_per_s"] == pytest.approx((tps.max() - tps.min()) / np.median(tps))
        assert m["step_p50_ms"] == pytest.approx(np.median([r["step_ms"]["p50"] for r in mine]))
        assert e["tokens_per_s"] == pytest.approx(p["tokens_per_s"] / m["tokens_per_s"] - 1)
        assert e["step_p50"] == pytest.approx(p["step_p50_ms"] / m["step_p50_ms"] - 1)
        assert row["within_spread"] == (tps.min() <= p["tokens_per_s"] <= tps.max())
        assert p["tokens_per_s"] > 0 and m["rows_match"]
        assert len(m["cdf_ms"]) == len(p["cdf_ms"]) == len(CDF_PERCENTILES)
        # steps with compute between reads use the batches measured with that compute as think time
        assert ("think-spin:0.5" in p["device"]) == (row["compute"] == "spin:0.5")
    errs = np.abs([r["error"]["tokens_per_s"] for r in res["rows"]])
    s = res["summary"]
    assert s["tokens_per_s"]["median_abs_error"] == pytest.approx(np.median(errs))
    assert s["tokens_per_s"]["max_abs_error"] == pytest.approx(errs.max())
    assert s["configurations"] == 3 and s["runs"] == 9 and s["rows_match"]
    assert s["passed"] == all(s["pass"].values())
    assert s["pass"]["tokens_per_s_max_abs"] == (errs.max() <= TARGETS["tokens_per_s_max_abs"])
    md = markdown_table(res)
    assert md.splitlines()[0].startswith("| trace")
    assert len([ln for ln in md.splitlines() if ln.startswith("| ")]) == 1 + 3
    assert "base_events" in md and "serial" in md and ("PASS" in md) == s["passed"]


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
    assert out.startswith("| trace") and "configurations, 6 runs" in out
    assert main(["calibrate", str(work)]) == 0
    assert "per backend and depth" in capsys.readouterr().out
    # the calibration refuses a decode-run file
    assert main(["calibrate", str(work), "--microbench", str(work / "runs.json")]) == 2
    assert "microbenchmarks only" in capsys.readouterr().err
    assert main(["measure", str(work), "--model", model, "--scale", "0.001", "--no-progress"]) == 2
    assert "scale" in capsys.readouterr().err
