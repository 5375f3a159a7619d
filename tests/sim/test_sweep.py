"""sim.sweep: study files, per-point seeds, known answers, local processes vs a Dask cluster, tables, CLI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engram import ArgumentError, FormatError
from engram.cli import main
from sim.device import SEED_CONCURRENT_US_PER_ROW, SEED_READERS, SEED_SERIAL_US_PER_ROW
from sim.sweep import AXES, METRICS, Study, point_seed, read_table, run_points, run_study, write_table

STUDIES = Path(__file__).resolve().parents[2] / "studies"
US = 1e-6


def small_study(**fixed) -> Study:
    """6 points on the SPEC §8 reference device (two fixed latencies): answers are exact."""
    return Study.from_dict({
        "study": {"name": "small", "seed": 7},
        "fixed": {"trace_limit": 300, "steps": 300, "compute_ms": 40.0, **fixed},
        "grid": {"threshold": [8, 256], "readers": [4, 16], "sessions": [1, 3]},
    })


def test_study_points_defaults_and_union():
    s = small_study()
    pts = s.points()
    # threshold x readers x sessions
    assert len(pts) == 8 and s.axes() == ["threshold", "readers", "sessions"]
    assert all(set(p) == set(AXES) for p in pts)
    assert pts[0]["device"] == "seed-apple-m3-ultra" and pts[0]["compute_ms"] == 40.0 and pts[0]["steps"] == 300
    u = Study.from_dict({"grid": [{"readers": [1, 2]}, {"readers": [2, 4], "threshold": [8]}]})
    # the second grid's (readers 2, threshold 8) is the first grid's point 2: kept once
    assert [(p["readers"], p["threshold"]) for p in u.points()] == [(1, 8), (2, 8), (4, 8)]


@pytest.mark.parametrize("doc, match", [
    ({"grids": {}}, "unknown section 'grids'"),
    ({"grid": {"reader": [1]}}, "unknown axis 'reader'"),
    ({"fixed": {"readers": "16"}}, "readers = '16' must be int"),
    ({"grid": {"threshold": []}}, "has no values"),
    ({"grid": {"backend": ["aio"]}}, "backend = 'aio'"),
    ({"grid": {"readers": [0]}}, "readers = 0 must be >= 1"),
    ({"fixed": {"compute": "gpu"}}, "compute = 'gpu'"),
    ({"study": {"seed": -1}}, "seed = -1"),
    ({"study": {"name": "x", "owner": "y"}}, "unknown key 'owner'"),
    ({"plot": [{"y": "tokens_per_s"}]}, "needs x"),
    ({"plot": [{"x": "readers", "y": "speed"}]}, "y = 'speed'"),
    ({"plot": [{"x": "readers", "series": ["colour"]}]}, "series 'colour'"),
])
def test_study_errors_name_the_key(doc, match):
    with pytest.raises(ArgumentError, match=match):
        Study.from_dict(doc)


def test_point_seed_depends_on_the_study_seed_and_the_point_only():
    p = dict(Study.from_dict({}).points()[0])
    blob = json.dumps({"study_seed": 3, **{k: p[k] for k in sorted(p) if p[k] is not None}}, sort_keys=True,
                      separators=(",", ":"))
    want = int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "little") >> 1
    assert point_seed(3, p) == want
    assert point_seed(3, dict(reversed(list(p.items())))) == want  # key order does not matter
    assert point_seed(4, p) != want
    assert point_seed(3, {**p, "repeat": 1}) != want
    assert 0 <= want < 2 ** 63
    assert point_seed(3, {**p, "a_new_axis": None}) == want  # an unset axis keeps existing seeds


def test_known_answers_on_the_reference_device():
    """One session, constant compute, a device of fixed latencies: tokens/s = 1 / (compute + read)."""
    rows, runner = run_points(small_study().points(), 7, jobs=1, progress=False)
    assert runner == "inline" and len(rows) == 8 and [r["point"] for r in rows] == list(range(8))
    for r in rows:
        assert set(METRICS) <= set(r) and r["seed"] == point_seed(7, {k: r[k] for k in AXES})
        if r["sessions"] != 1:
            continue
        if r["threshold"] == 256:  # serial: 48 reads at queue depth 1
            read = 48 * SEED_SERIAL_US_PER_ROW * US
        else:  # ceil(48 / k) waves of reads at depth k (interpolated linearly between depths 1 and 16)
            k = r["readers"]
            lat = (SEED_SERIAL_US_PER_ROW + (SEED_CONCURRENT_US_PER_ROW * SEED_READERS - SEED_SERIAL_US_PER_ROW)
                   * (k - 1) / (SEED_READERS - 1)) * US
            read = -(-48 // k) * lat
        assert 1 / r["tokens_per_s"] == pytest.approx(40e-3 + read, rel=1e-9)
        assert r["reads_per_step"] == 48 and r["cache_hit_rate"] == 0
        assert r["compute_mean_ms"] == pytest.approx(40.0)
    # sessions sharing the device are never faster than one alone
    by = {(r["threshold"], r["readers"], r["sessions"]): r for r in rows}
    for t in (8, 256):
        for k in (4, 16):
            assert by[(t, k, 3)]["session_tokens_per_s"] <= by[(t, k, 1)]["session_tokens_per_s"] * (1 + 1e-9)


def test_local_processes_and_a_dask_cluster_give_identical_tables(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    study = Study.from_dict({
        "study": {"name": "same", "seed": 11},
        "fixed": {"trace_limit": 300, "steps": 300, "compute_ms": 5.0, "compute_dist": "gamma", "compute_cv": 0.3},
        "grid": {"device": ["seed-apple-m3-ultra", "ssd:qd1_us=90,iops=200000,parallelism=16"],
                 "readers": [2, 16], "sessions": [1, 4], "cache_rows": [0, 1000]},
    })
    local = run_study(study, jobs=2, progress=False, out=tmp_path / "local.csv")
    inline = run_study(study, jobs=1, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        remote = run_study(study, scheduler=c.scheduler_address, progress=False, out=tmp_path / "dask.csv")
    assert local.runner == "processes:2" and remote.runner.startswith("dask:")
    assert len(local.rows) == 16
    assert local.rows == remote.rows == inline.rows
    assert (tmp_path / "local.csv").read_bytes() == (tmp_path / "dask.csv").read_bytes()
    # random compute and a random device: the seeds matter, and differ by point
    assert len({r["seed"] for r in local.rows}) == 16
    assert len({r["step_p99_ms"] for r in local.rows}) > 8


def test_table_round_trip(tmp_path):
    rows = [{"point": 0, "device": "1", "readers": 4, "tokens_per_s": 0.1 + 0.2},
            {"point": 1, "device": "seed-apple-m3-ultra", "readers": 16, "tokens_per_s": 1e-300}]
    p = write_table(rows, tmp_path / "t.csv")
    back, meta = read_table(p)
    assert back == rows and meta == {}  # floats exactly, a numeric-looking device name stays a string
    with pytest.raises(FormatError):
        read_table(tmp_path / "missing.csv")
    try:
        import pyarrow
    except ModuleNotFoundError:
        with pytest.raises(ArgumentError, match="pyarrow"):
            write_table(rows, tmp_path / "t.parquet")
    else:
        assert pyarrow.__version__ and read_table(write_table(rows, tmp_path / "t.parquet"))[0] == rows


def test_unreachable_scheduler_is_an_argument_error():
    pytest.importorskip("dask.distributed")
    with pytest.raises(ArgumentError, match="cannot reach the Dask scheduler"):
        run_study(small_study(), scheduler="tcp://127.0.0.1:9", progress=False, connect_timeout=1)


def test_calibrated_device_needs_a_calibration():
    s = Study.from_dict({"fixed": {"device": "calibrated", "steps": 10, "trace_limit": 50}})
    with pytest.raises(ArgumentError, match="needs a calibration"):
        run_study(s, jobs=1, progress=False)


def test_example_studies_parse():
    names = sorted(p.name for p in STUDIES.glob("*.toml"))
    assert {"capacity.toml", "cache.toml", "demo.toml", "threshold_readers.toml"} <= set(names)
    for p in STUDIES.glob("*.toml"):
        s = Study.load(p)
        assert s.points() and s.plots, p
        for spec in s.plots:
            assert spec["x"] in s.axes(), (p, spec)
    from sim.demo import DEMO_STUDY

    assert (STUDIES / "demo.toml").read_text() == DEMO_STUDY


def test_cli_sweep(tmp_path, capsys):
    study = tmp_path / "s.toml"
    study.write_text('[study]\nname = "cli"\n[fixed]\ntrace_limit = 100\nsteps = 100\ncompute_ms = 10.0\n'
                     '[grid]\nthreshold = [8, 256]\n')
    out = tmp_path / "r.csv"
    assert main(["sim", "sweep", str(study), "--out", str(out), "--jobs", "1", "--no-progress", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["points"] == 2 and d["axes"] == ["threshold"] and Path(d["table"]) == out
    rows, meta = read_table(out)
    assert [r["threshold"] for r in rows] == [8, 256] and meta["study"]["name"] == "cli"
    assert rows[0]["tokens_per_s"] > rows[1]["tokens_per_s"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid]\nreader = [1]\n")
    assert main(["sim", "sweep", str(bad), "--out", str(out)]) == 2
    assert "unknown axis 'reader'" in capsys.readouterr().err
    bad.write_text("[grid\n")
    assert main(["sim", "sweep", str(bad), "--out", str(out)]) == 2
    assert "not TOML" in capsys.readouterr().err
