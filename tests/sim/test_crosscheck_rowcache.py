"""sim.check.crosscheck with the engine's row cache on: a run is predicted from its misses, with the cache it had."""

from __future__ import annotations

import numpy as np
import pytest

from engram import FormatError, synth
from sim.check.calibrate import Calibration, calibrate_file
from sim.check.crosscheck import (ROW_CACHE_HIT_RATE_TOLERANCE, crosscheck, crosscheck_files, markdown_table,
                                  predict_run, run_cache_hits)
from sim.check.regimes import QUIET_TARGETS, TARGETS, verdict, verdict_text
from sim.decode.reads import step_reads
from sim.core.io import load_json, write_json
from sim.measure import measure
from sim.core.schema import RunConfig
from sim.trace import CODE_SOURCE, load_trace
from sim.trace.rowcache import policy_hits, stretch_hits
from tests.modelfiles import SCALE, token_map as _token_map
from tests.sim.test_crosscheck import US, point_calibration

TEXT = CODE_SOURCE


def _expected_step(rows: np.ndarray, hit: np.ndarray, batch_us: float, k: int) -> np.ndarray:
    """Step times (s) of the point calibration when only the misses of each step are read: each table's
    distinct missed rows, the 48-row batch time scaled by waves (as ``expected_step`` of test_crosscheck)."""
    out = []
    for r, h in zip(rows.reshape(rows.shape[0], -1), hit.reshape(hit.shape[0], -1)):
        n = np.unique(r[:24][~h[:24]]).size + np.unique(r[24:][~h[24:]]).size
        out.append(0.0 if n == 0 else batch_us * US * np.ceil(n / min(k, n)) / np.ceil(48 / min(k, 48)))
    return np.array(out) + 1e-3 + 2 * US


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_a_cache_run_is_predicted_from_its_misses(policy):
    """Known answer: the point calibration gives every step's time from its distinct reads; with the run's
    cache (same policy, same budget, fresh at the run's start) the hits are not read, and replaying the
    stretch to more steps meets the same hits again (the rate is not inflated by the replay)."""
    tr = load_trace(TEXT, limit=700)
    n, start, rows = 300, 100, 1500
    cfg = RunConfig(TEXT, 256, "pread", 4, "spin:1", n)  # serial: a step's read time is 100 us a distinct row
    run = {"start": start, "row_cache": {"rows": rows, "policy": policy, "shared": True, "bytes": rows * 264}}
    hit = run_cache_hits(cfg, tr, run)
    lay = (np.asarray(tr.layer_ids, np.uint64) << np.uint64(32))[:, None]
    keys = tr.rows[start:start + n].astype(np.uint64) | lay
    assert hit.shape == (n, 1, 2, 24)
    assert np.array_equal(hit[:, 0], policy_hits(keys, rows, policy, 48)) and 0.05 < hit.mean() < 0.9
    want = float(np.mean(_expected_step(tr.rows[start:start + n], hit[:, 0], 4800, 1)))
    for sim_steps in (n, 3 * n):
        p = predict_run(point_calibration(), cfg, tr, run, sim_steps=sim_steps, windows=False)
        assert p["cache_hit_rate"] == pytest.approx(hit.mean(), abs=0)
        assert 1 / p["tokens_per_s"] == pytest.approx(want, rel=1e-9)
    plain = predict_run(point_calibration(), cfg, tr, {"start": start}, sim_steps=n, windows=False)
    assert plain["cache_hit_rate"] is None and plain["tokens_per_s"] < p["tokens_per_s"]
    # the reads the simulator issues are each step's distinct missed rows of each table
    rd = step_reads(tr.__class__(tr.rows[start:start + n], tr.tokens[start:start + n], np.zeros(1, np.int64),
                                 tr.layer_ids, tr.heads), 1, n, served=hit[:, 0])
    misses = [[np.unique(r[li][~h[li]]).size for li in range(2)] for r, h in zip(tr.rows[start:start + n], hit[:, 0])]
    assert np.array_equal(rd.reads[0], np.array(misses)) and rd.shared_hits == int(hit.sum())


def test_served_positions_follow_the_sessions_replay():
    tr = load_trace(TEXT, limit=40)
    served = np.zeros(tr.rows.shape, bool)
    served[5, 0, :3] = True
    rd = step_reads(tr, 2, 60, served=served)
    # session 0 meets step 5 at its steps 5 and 45, session 1 (starting at 20) at its step 25
    assert rd.shared_hits == 3 * 3 and rd.requests == 2 * 60 * 48
    with pytest.raises(Exception, match="served must be"):
        step_reads(tr, 1, 10, served=served[:10])


def test_stretch_hits_shared_and_private():
    tr = load_trace(TEXT, limit=900)
    one = stretch_hits(tr, [0, 300], 200, 800, "lru", shared=True)
    own = stretch_hits(tr, [0, 300], 200, 800, "lru", shared=False)
    assert one.shape == own.shape == (200, 2, 2, 24)
    assert np.array_equal(own[:, 0], stretch_hits(tr, [0], 200, 800, "lru")[:, 0])
    assert not np.array_equal(one, own)
    with pytest.raises(Exception, match="do not fit"):
        stretch_hits(tr, [800], 200, 800, "lru")


def test_a_bad_row_cache_record_is_a_format_error():
    tr = load_trace(TEXT, limit=100)
    cfg = RunConfig(TEXT, 8, "pread", 16, "spin:1", 50)
    with pytest.raises(FormatError, match="row_cache"):
        run_cache_hits(cfg, tr, {"start": 0, "row_cache": {"rows": 100, "policy": "fifo"}})
    with pytest.raises(FormatError, match="row_cache"):
        run_cache_hits(cfg, tr, {"start": 0, "row_cache": {"policy": "lru"}})


# ------------------------------------------------------------ a real measurement with the cache on
@pytest.fixture(scope="module")
def measured_cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("xcc")
    path = d / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=9),
                      synth.Fill(projections=False), progress=False)
    cfgs = [RunConfig(TEXT, 8, "pread", 4, "none", 60), RunConfig(TEXT, 8, "pread", 4, "sleep:1", 40, 2, "threads")]
    measure(path, cfgs, d, rounds=2, depths=(1, 4), fio=False, io_batches=8, io_chunks=2, big_seconds=0.01,
            single_rows=8, compute_samples=10, warmup=3, probe_every=3, shared_seconds=0.03, cache_batches=4,
            cache_bytes=264 * 2000, cache_policy="tinylfu", progress=False)
    calibrate_file(d / "microbench.json", d / "calibration.json")
    return d


def test_crosscheck_predicts_the_runs_with_the_cache(measured_cache):
    d = measured_cache
    res = crosscheck_files(d / "calibration.json", d / "runs.json", sim_steps=300)
    runs = load_json(d / "runs.json")["runs"]
    every = res["rows"] + res["session_rows"]
    assert len(every) == 2 and res["summary"]["runs"] == len(runs) == 4
    for row in every:
        mine = [r for r in runs if r["config"] == row["key"]]
        rc = row["row_cache"]
        assert rc["policy"] == "tinylfu" and rc["rows"] == 2000 and rc["shared"]
        # the replay behind the prediction is the run's own predicted hit rate (one implementation)
        assert rc["hit_rate_predicted_runs"] == pytest.approx([r["row_cache"]["predicted_hit_rate"] for r in mine],
                                                             abs=1e-12)
        assert rc["hit_rate_measured_runs"] == [r["row_cache"]["hit_rate"] for r in mine]
        gap = max(abs(a - b) for a, b in zip(rc["hit_rate_measured_runs"], rc["hit_rate_predicted_runs"]))
        assert rc["hit_rate_max_abs_error"] == pytest.approx(gap) and gap <= ROW_CACHE_HIT_RATE_TOLERANCE
        assert rc["hit_rate_predicted"] > 0.02
        assert row["predicted"]["tokens_per_s"] > 0 and "interval" in row
    s = res["summary"]["row_cache"]
    assert s["configurations"] == 2 and s["hit_rate_within_one_point"]
    assert not any("row cache" in w and "left out" in w for w in res["warnings"])
    assert "Row cache" in markdown_table(res)


@pytest.mark.parametrize("name", ["quiet", "busy", "loaded", "unmeasured"])
def test_a_hit_rate_off_by_more_than_a_point_fails_the_verdict(name):
    """Errors and coverage that pass in every regime; the row cache's measured hit rate 2.5 points off the
    replayed one: the verdict fails on it alone, in every regime, and says so with the gap in points."""
    base = {"tokens_per_s": {"median_abs_error": 0.01, "max_abs_error": 0.02}, "step_p50": {"max_abs_error": 0.02},
            "inside_interval_share": 1.0, "regime": {"name": name}}
    good = {**base, "row_cache": {"configurations": 2, "hit_rate_max_abs_error": 0.004,
                                  "hit_rate_within_one_point": True}}
    bad = {**base, "row_cache": {"configurations": 2, "hit_rate_max_abs_error": 0.025,
                                 "hit_rate_within_one_point": False}}
    assert "row_cache_hit_rate" not in verdict(base, TARGETS, QUIET_TARGETS, [])
    ok = verdict(good, TARGETS, QUIET_TARGETS, [])
    assert ok["row_cache_hit_rate"] is True and all(ok.values())
    ok = verdict(bad, TARGETS, QUIET_TARGETS, [])
    assert ok["row_cache_hit_rate"] is False
    assert [k for k, v in ok.items() if not v] == ["row_cache_hit_rate"]
    assert verdict_text({**bad, "pass": ok, "passed": all(ok.values())}) == \
        "FAIL (missed: row cache hit rate gap 2.50 points)"


def test_crosscheck_fails_a_run_whose_hit_rate_is_off(measured_cache):
    """The measured runs with one run's recorded hit rate moved 3 points from what it measured: the cross-check's
    summary has the gap, and its verdict fails on the row cache, whatever the errors did."""
    d = measured_cache
    doc = load_json(d / "runs.json")
    run = doc["runs"][0]
    run["row_cache"]["hit_rate"] = run["row_cache"]["predicted_hit_rate"] + 0.03
    write_json(d / "runs-off.json", doc)  # beside runs.json: its saved traces are found there
    res = crosscheck(Calibration.load(d / "calibration.json"), doc, runs_path=d / "runs-off.json", sim_steps=300)
    s = res["summary"]
    assert s["row_cache"]["hit_rate_max_abs_error"] == pytest.approx(0.03, abs=1e-9)
    assert not s["row_cache"]["hit_rate_within_one_point"]
    assert s["pass"]["row_cache_hit_rate"] is False and not s["passed"] and s["goals"]["row_cache"]
    assert "row cache hit rate gap 3.00 points" in verdict_text(s)
    assert "row cache hit rate gap 3.00 points" in markdown_table(res)
