"""sim.sweep: study files, per-point seeds, known answers, local processes vs a Dask cluster, tables, CLI;
rows written as points finish, lost workers, interrupted and resumed runs, failures to write."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engram import ArgumentError, FormatError
from engram.cli import main
from sim.sweep.capacity import probes_path
from sim.decode import DecodeRun, simulate_decode
from sim.device import SEED_CONCURRENT_US_PER_ROW, SEED_READERS, SEED_SERIAL_US_PER_ROW, load_device
from sim.core.io import OutputError
from sim.serve import ServeStudy
from sim.serve.study import is_serve_study
from sim.core.params import Compute, Policy
from sim.report.sections import wrap_warnings
from sim.sweep import (AXES, METRICS, Study, SweepError, TableWriter, meta_path, partial_path, point_seed, read_table,
                       resume_rows, run_points, run_study, write_table)
from sim.trace import load_trace
from sim.cli.options import study_arg
from sim.sweep.study import SHIPPED_STUDIES, shipped_studies, study_file
from tests.clirun import cli
from tests.mounts import tmpfs

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


def test_rows_say_what_the_simulator_ran():
    """Each row carries the phases the simulator ran (the older start_spread_ms included), the compute it drew
    beside the nominal one, the step p99.9 and the trace length; equal to a direct simulate_decode call."""
    study = Study.from_dict({
        "study": {"name": "ran", "seed": 3},
        "fixed": {"trace_limit": 300, "steps": 200, "compute_ms": 40.0, "compute_dist": "gamma", "compute_cv": 0.3,
                  "sessions": 4},
        "grid": [{"phases": ["random", "lockstep", "spread:20"]}, {"start_spread_ms": [30.0]}]})
    rows, _ = run_points(study.points(), 3, jobs=1, progress=False)
    assert [r["phases_run"] for r in rows] == ["random", "lockstep", "spread:20", "spread:30"]
    for r in rows:
        assert r["compute_mean_ms"] == 40.0 and r["trace_steps"] == 300 and r["wrapped"] == 0
        assert r["compute_realised_mean_ms"] == pytest.approx(40.0, rel=0.05) and r["compute_realised_cv"] > 0.25
        assert r["step_p99_ms"] <= r["step_p999_ms"]
    p = rows[3]
    d = simulate_decode(load_trace(p["trace"], limit=300), p["device"], Policy(), Compute(40e-3, "gamma", 0.3),
                        DecodeRun(sessions=4, steps=200, seed=p["seed"], phases="spread:30", bins=4))
    lat = d.step_latencies.reshape(-1)
    assert p["step_p999_ms"] == pytest.approx(np.percentile(lat, 99.9) * 1e3, rel=1e-12)
    assert p["compute_realised_mean_ms"] == d.compute_realised["mean_ms"] and d.phases == "spread:30"
    # a table of 300 steps read 400 steps a session: wrapped, and the row says over how many steps
    long = run_points([{**study.points()[0], "steps": 400}], 3, jobs=1, progress=False)[0][0]
    assert long["wrapped"] == 1 and long["trace_steps"] == 300


def study_rows(name: str, **where):
    """The rows of the shipped study ``name`` at the points matching ``where`` (their seeds are the study's)."""
    study = Study.load(STUDIES / f"{name}.toml")
    pts = [p for p in study.points() if all(p[k] == v for k, v in where.items())]
    return run_points(pts, study.seed, jobs=2, progress=False)[0]


def test_the_planner_studies_as_shipped():
    """drives, dram, shared_cache and tail at the session counts where their answers differ."""
    ssd = load_device("ssd:qd1_us=80,iops=100000")
    # 192 sessions need 192 x 48 x 20 = 184k reads/s: over one drive's 100k IOPS, within two drives'
    drives = {r["drives"]: r for r in study_rows("drives", sessions=192)}
    assert drives[1]["session_tokens_per_s_min"] < 20.0 <= drives[2]["session_tokens_per_s_min"]
    assert drives[4]["session_tokens_per_s_min"] >= 20.0 and drives[4]["device_busy"] < drives[2]["device_busy"]
    assert 192 * 48 * 20 > ssd.peak_iops() and all(r["phases_run"] == "random" for r in drives.values())
    # half the tables in DRAM: half the requests never reach the device
    dram = {r["dram_fraction"]: r for r in study_rows("dram", sessions=160)}
    assert dram[0.0]["session_tokens_per_s_min"] < 20.0 <= dram[0.5]["session_tokens_per_s_min"]
    for share, r in dram.items():
        assert r["dram_hit_rate"] == pytest.approx(share, abs=0.02)
        assert r["reads_per_step"] == pytest.approx(48 * (1 - share), rel=0.05)
    # a shared cache serves more the larger it is, and no session replays another's stretch of the trace
    shared = {r["shared_cache_rows"]: r for r in study_rows("shared_cache", sessions=64)}
    assert shared[0]["shared_cache_hit_rate"] == 0 < shared[4096]["shared_cache_hit_rate"] \
        < shared[65536]["shared_cache_hit_rate"]
    assert shared[65536]["reads_per_step"] == pytest.approx(48 * (1 - shared[65536]["shared_cache_hit_rate"]),
                                                            rel=0.02)
    assert wrap_warnings(list(shared.values())) == [] and all(r["trace_steps"] == 16000 for r in shared.values())
    # the measured distribution changes the tail, not the mean
    tail = {r["tail"]: r for r in study_rows("tail", sessions=90)}
    own, lent = tail[""], tail["vm-virtio-16core-4k"]
    assert own["step_p999_ms"] != lent["step_p999_ms"] and own["step_p99_ms"] <= own["step_p999_ms"]
    assert lent["step_mean_ms"] == pytest.approx(own["step_mean_ms"], rel=0.02)


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
    assert {"capacity.toml", "cache.toml", "demo.toml", "threshold_readers.toml", "drives.toml", "dram.toml",
            "shared_cache.toml", "tail.toml", "reuse.toml"} <= set(names)
    for p in STUDIES.glob("*.toml"):
        if is_serve_study(p):  # serving studies: tests/sim/test_serve_search.py
            assert ServeStudy.load(p).points(), p
            continue
        s = Study.load(p)
        assert s.points(), p
        if s.capacity is not None:  # a capacity study: its configurations, no plots needed
            assert "sessions" not in s.axes(), p
            continue
        assert s.plots, p
        for spec in s.plots:
            assert spec["x"] in s.axes(), (p, spec)
    from sim.cli.demo import DEMO_STUDY

    assert (STUDIES / "demo.toml").read_text() == DEMO_STUDY and Study.loads(DEMO_STUDY).name == "demo"


def test_shipped_studies_by_name_outside_the_repository(tmp_path, monkeypatch, capsys):
    """A wheel's user has no studies/: a study is named by its name (or the README's studies/NAME.toml) and the
    shipped file is read; a file that exists wins; anything else stays itself and its error lists the names."""
    assert (STUDIES / "capacity.toml").resolve() == (SHIPPED_STUDIES / "capacity.toml").resolve()
    names = shipped_studies()
    assert {"capacity", "serve", "demo", "threshold_readers"} <= set(names) and names == sorted(names)
    monkeypatch.chdir(tmp_path)
    for arg in ("capacity", "capacity.toml", "studies/capacity.toml"):
        assert study_file(arg) == SHIPPED_STUDIES / "capacity.toml" and study_arg(arg) == str(study_file(arg))
    for arg in ("elsewhere/capacity.toml", "a/studies/capacity.toml", "nosuch", "studies/nosuch.toml"):
        assert study_file(arg) == Path(arg)
    (tmp_path / "capacity.toml").write_text('[study]\nname = "mine"\n[fixed]\nsteps = 10\n')
    assert study_file("capacity.toml") == Path("capacity.toml")
    for name in names:  # every shipped study loads from its shipped file, as the package reads it
        assert is_serve_study(study_file(name)) or Study.load(study_file(name)).name
    line = cli(capsys, ["sim", "sweep", "nosuch"])
    assert line.endswith("nosuch: cannot read study (No such file or directory); the studies shipped with "
                         f"engram, by name: {', '.join(names)}")


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
    assert meta["complete"] is True and meta["missing"] == [] and d["complete"] is True
    assert rows[0]["tokens_per_s"] > rows[1]["tokens_per_s"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[grid]\nreader = [1]\n")
    assert main(["sim", "sweep", str(bad), "--out", str(out)]) == 2
    assert "unknown axis 'reader'" in capsys.readouterr().err
    bad.write_text("[grid\n")
    assert main(["sim", "sweep", str(bad), "--out", str(out)]) == 2
    assert "not TOML" in capsys.readouterr().err


# ------------------------------------------------------------------ lost workers, interruptions, resumption
def lossy_study() -> Study:
    """16 points of about a quarter of a second each (4 s in all on a loaded 2-core VM): a sweep long enough to
    lose a worker, or take Ctrl-C, in the middle even when the test itself is scheduled late."""
    return Study.from_dict({
        "study": {"name": "lossy", "seed": 5},
        "fixed": {"trace_limit": 1000, "steps": 1000, "compute_ms": 5.0, "compute_dist": "gamma", "compute_cv": 0.3},
        "grid": {"readers": [2, 16], "sessions": [1, 8, 16, 24], "cache_rows": [0, 1000]},
    })


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The lossy study run inline, nothing lost: the table every other runner must reproduce."""
    out = tmp_path_factory.mktemp("undisturbed") / "table.csv"
    res = run_study(lossy_study(), jobs=1, progress=False, out=out)
    assert res.lost == 0 and res.complete
    return out


def rows_written(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.is_file() else 0


def run_in_thread(fn):
    """Run ``fn`` in a thread; return (thread, result dict: ``value`` or ``error``)."""
    box = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    th = threading.Thread(target=go)
    th.start()
    return th, box


def wait_for_rows(path: Path, n: int, th: threading.Thread, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while rows_written(path) < n:
        assert th.is_alive(), "the run ended before the disturbance"
        assert time.monotonic() - t0 < timeout, f"fewer than {n} rows in {path} after {timeout} s"
        time.sleep(0.02)


def test_rows_are_written_as_points_finish(tmp_path, undisturbed):
    """While the run goes, the table holds the finished rows and its metadata says it is incomplete."""
    out = tmp_path / "t.csv"
    th, box = run_in_thread(lambda: run_study(lossy_study(), jobs=1, progress=False, out=out))
    wait_for_rows(out, 2, th)
    rows, meta = read_table(out)
    assert meta["complete"] is False and len(meta["missing"]) == 16 - meta["points_done"] >= 1
    assert all(set(METRICS) <= set(r) for r in rows[:2]) and meta["study"]["name"] == "lossy"
    th.join()
    assert "error" not in box
    assert out.read_bytes() == undisturbed.read_bytes()
    meta = json.loads(meta_path(out).read_text())
    assert meta["complete"] is True and meta["missing"] == [] and meta["points_done"] == 16


def spawned_workers():
    import psutil

    return [c for c in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(c.cmdline())]


def test_a_killed_worker_process_is_replaced(tmp_path, undisturbed):
    """A pool process killed mid-sweep (as by the OOM killer): its points run again, the table is the same."""
    out = tmp_path / "killed.csv"
    th, box = run_in_thread(lambda: run_study(lossy_study(), jobs=2, progress=False, out=out))
    wait_for_rows(out, 2, th)
    victims = spawned_workers()
    assert victims, "no worker process to kill"
    os.kill(victims[0].pid, signal.SIGKILL)
    th.join()
    assert "error" not in box, box.get("error")
    res = box["value"]
    assert res.runner == "processes:2" and 1 <= res.lost <= 2  # the points in flight when the pool broke
    assert out.read_bytes() == undisturbed.read_bytes()
    assert json.loads(meta_path(out).read_text())["lost_runs"] == res.lost


def test_dask_workers_restarted_mid_sweep(tmp_path, undisturbed):
    """Every worker of a real LocalCluster restarted once mid-sweep (client.restart(): all futures cancelled):
    the context is recomputed from the graph and the lost points are submitted again."""
    distributed = pytest.importorskip("dask.distributed")
    out = tmp_path / "dask.csv"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        th, box = run_in_thread(lambda: run_study(lossy_study(), scheduler=c.scheduler_address, progress=False,
                                                  out=out))
        wait_for_rows(out, 2, th)
        with distributed.Client(c.scheduler_address) as other:
            other.restart()
        th.join()
    assert "error" not in box, box.get("error")
    res = box["value"]
    assert res.runner.startswith("dask:") and res.lost >= 1
    assert out.read_bytes() == undisturbed.read_bytes()


def test_a_point_that_keeps_killing_its_worker_gives_up(tmp_path, monkeypatch):
    """A point whose worker dies every time is run `attempts` times, then named in a SweepError; the rows of
    the other points stay in the table."""
    from sim.sweep import runner

    study = Study.from_dict({"study": {"name": "doomed"}, "fixed": {"trace_limit": 100, "steps": 100},
                             "grid": {"readers": [1, 2, 3, 4]}})
    out = tmp_path / "doomed.csv"
    monkeypatch.setattr(runner, "_local_task", _die_on_three)
    with pytest.raises(SweepError, match=r"point 2: its worker process died 2 times"):
        run_study(study, jobs=2, progress=False, out=out, attempts=2)
    rows, meta = read_table(out)
    assert meta["complete"] is False and 2 in meta["missing"] and {0, 1} <= {r["point"] for r in rows}


def _die_on_three(point_fn, index, params, seed):
    """A task that kills its own process at readers = 3 (the worker dies as under the OOM killer)."""
    from sim.sweep import runner

    if params["readers"] == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return point_fn(index, params, seed, runner._WORKER_CTX)


def test_interrupted_cli_sweep_keeps_its_rows_and_resumes(tmp_path, undisturbed):
    """Ctrl-C: exit 130, the finished rows stay (complete: false); --resume runs only the others and ends with
    the undisturbed table."""
    study = tmp_path / "lossy.toml"
    study.write_text('[study]\nname = "lossy"\nseed = 5\n[fixed]\ntrace_limit = 1000\nsteps = 1000\n'
                     'compute_ms = 5.0\ncompute_dist = "gamma"\ncompute_cv = 0.3\n'
                     '[grid]\nreaders = [2, 16]\nsessions = [1, 8, 16, 24]\ncache_rows = [0, 1000]\n')
    out = tmp_path / "lossy.csv"
    cmd = [sys.executable, "-m", "engram.cli", "sim", "sweep", str(study), "--out", str(out), "--jobs", "1",
           "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while rows_written(out) < 2 and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    rows, meta = read_table(out)
    done = len(rows)
    assert meta["complete"] is False and 2 <= done < 16 and len(meta["missing"]) == 16 - done
    res = run_study(Study.load(study), jobs=1, progress=False, out=out, resume=True)
    assert res.resumed == done and res.complete
    assert out.read_bytes() == undisturbed.read_bytes()


def test_resume_drops_a_row_cut_short_and_refuses_another_study(tmp_path, undisturbed):
    out = tmp_path / "cut.csv"
    lines = undisturbed.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:6]) + lines[6][:40])  # five whole rows, then a row cut mid-write
    assert [r["point"] for r in resume_rows(lossy_study(), out)] == [0, 1, 2, 3, 4]
    res = run_study(lossy_study(), jobs=1, progress=False, out=out, resume=True)
    assert res.resumed == 5 and out.read_bytes() == undisturbed.read_bytes()
    other = Study.from_dict({"study": {"name": "lossy", "seed": 6}, "fixed": lossy_study().fixed,
                             "grid": lossy_study().grids[0]})
    with pytest.raises(ArgumentError, match="another study"):
        run_study(other, jobs=1, progress=False, out=out, resume=True)
    meta_path(out).unlink()  # without metadata the rows themselves must match the study
    with pytest.raises(ArgumentError, match="ran with seed"):
        resume_rows(other, out)


def test_resume_of_a_complete_table_runs_nothing(tmp_path, undisturbed):
    out = tmp_path / "done.csv"
    out.write_bytes(undisturbed.read_bytes())
    res = run_study(lossy_study(), jobs=1, progress=False, out=out, resume=True)
    assert res.resumed == 16 and res.lost == 0 and out.read_bytes() == undisturbed.read_bytes()


def test_parquet_tables_are_built_as_partial_csv(tmp_path):
    pytest.importorskip("pyarrow")
    out = tmp_path / "t.parquet"
    w = TableWriter(out, ["point", "x"], {"kind": "test"}, 3)
    w.add({"point": 1, "x": 0.5})
    assert partial_path(out).is_file() and not out.exists()
    assert read_table(out)[0] == [{"point": 1, "x": 0.5}]  # read from the partial rows
    w.add({"point": 0, "x": 0.25})
    w.add({"point": 2, "x": 1.0})
    w.finish()
    assert not partial_path(out).exists() and [r["point"] for r in read_table(out)[0]] == [0, 1, 2]


# ------------------------------------------------------------------ progress and failures to write
def test_cli_sweep_progress_off_a_terminal_is_plain_lines(tmp_path, capsys):
    """Standard error off a terminal (as here): plain lines, no bar; --quiet: nothing."""
    study = tmp_path / "s.toml"
    study.write_text('[study]\nname = "lines"\n[fixed]\ntrace_limit = 100\nsteps = 100\ncompute_ms = 10.0\n'
                     '[grid]\nthreshold = [8, 256]\n')
    args = ["sim", "sweep", str(study), "--out", str(tmp_path / "r.csv"), "--jobs", "1"]
    for flags in ([], ["--no-progress"]):
        assert main(args + flags) == 0
        r = capsys.readouterr()
        assert "\r" not in r.err and "sweep lines: 2 points" in r.err and "sweep lines: 2/2 points in" in r.err
        assert "study     lines: 2 points over threshold" in r.out and "best      threshold=8" in r.out
    assert main(args + ["--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_cli_sweep_over_sessions_reads_capacity_off_the_grid(tmp_path, capsys):
    """With sessions varying, 'best' would always be one session: the command gives the grid capacity."""
    study = tmp_path / "s.toml"
    study.write_text('[study]\nname = "grid"\n[fixed]\ntrace_limit = 200\nsteps = 150\ncompute = "reference"\n'
                     'phases = "random"\n'
                     '[grid]\nsessions = [1, 16, 128]\n')
    assert main(["sim", "sweep", str(study), "--out", str(tmp_path / "g.csv"), "--jobs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "best" not in out and "grid      all points: 16 sessions at 20 tokens/s" in out
    assert "phases random (each session starts at a uniformly random time within one step, seeded))" in out
    assert "engram sim capacity" in out


@pytest.mark.parametrize("where", ["file", "readonly", "full"])
def test_cli_sweep_failures_to_write_name_the_path(tmp_path, capsys, where):
    study = tmp_path / "s.toml"
    study.write_text('[study]\nname = "w"\n[fixed]\ntrace_limit = 300\nsteps = 300\ncompute_ms = 1.0\n'
                     '[grid]\nreaders = [1, 2, 4, 8, 16, 32]\nthreshold = [8, 256]\n')
    if where == "file":  # a file where the table's folder must be
        (tmp_path / "plain").write_text("x")
        out = tmp_path / "plain" / "t.csv"
        assert main(["sim", "sweep", str(study), "--out", str(out), "--jobs", "1", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"a part of {tmp_path / 'plain'} is a file, where a folder is needed" in err
        return
    # the disk: the pages of the table's metadata (its size as a finished run writes it, with room for an
    # unfinished run's longer lists) and one page for the rows, which hold 12 rows of about 500 bytes only in two
    assert main(["sim", "sweep", str(study), "--out", str(tmp_path / "whole.csv"), "--jobs", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert (tmp_path / "whole.csv").stat().st_size > 4096
    pages = -(-((tmp_path / "whole.csv.meta.json").stat().st_size + 512) // 4096) + 1
    with tmpfs(tmp_path / "mnt", f"{4 * pages}k", read_only=where == "readonly") as mnt:
        out = mnt / "t.csv"
        assert main(["sim", "sweep", str(study), "--out", str(out), "--jobs", "1", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and str(out) in err
        if where == "readonly":
            assert "Read-only file system" in err
        else:  # the disk fills after a few rows: they stay, and the table says it is incomplete
            assert "No space left on device" in err
            rows = read_table(out)[0]
            assert 1 <= len(rows) < 12 and all(isinstance(r["tokens_per_s"], float) for r in rows[:-1])


def test_output_error_type():
    e = OutputError("x: cannot write (y)")
    assert isinstance(e, OSError) and str(e) == "x: cannot write (y)"
    with pytest.raises(OutputError, match="not a regular file"):
        write_table([{"a": 1}], "/dev/null")


# ------------------------------------------------------------------ workers and their parent
LONG_STUDY = ('[study]\nname = "long"\nseed = 5\n[fixed]\ntrace_limit = 1000\nsteps = 20000\ncompute_ms = 5.0\n'
              '[grid]\nreaders = [2, 16]\nsessions = [16, 24, 32]\n')


def _workers_of(pid: int, want: int, proc, timeout: float = 120.0, ready: bool = False) -> list:
    """The sweep's spawned worker processes (``multiprocessing.spawn`` children of ``pid``), once ``want`` run
    (``ready``: and each has started its parent watch, a second thread)."""
    psutil = pytest.importorskip("psutil")
    parent = psutil.Process(pid)
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        try:
            kids = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
            if len(kids) >= want and (not ready or all(k.num_threads() >= 2 for k in kids)):
                return kids
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.01)
    raise AssertionError(f"the sweep started no {want} workers: {proc.poll()}")


def _alive(procs) -> list:
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _sweep_process(tmp_path):
    study = tmp_path / "long.toml"
    study.write_text(LONG_STUDY)
    cmd = [sys.executable, "-m", "engram.cli", "sim", "sweep", str(study), "--out", str(tmp_path / "long.csv"),
           "--jobs", "2"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_sweep_workers_die_with_a_parent_killed_by_sigkill(tmp_path):
    """SIGKILL of the sweep (no handler of ours runs): its workers end within a few seconds, not never."""
    proc = _sweep_process(tmp_path)
    try:
        kids = _workers_of(proc.pid, 2, proc, ready=True)  # running points
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        end = time.monotonic() + 10
        while _alive(kids) and time.monotonic() < end:
            time.sleep(0.05)
        left = _alive(kids)
    finally:
        if proc.poll() is None:
            proc.kill()
    for k in kids:
        if k.pid in left:
            k.kill()
    assert not left, f"workers {left} outlived their parent"


@pytest.mark.parametrize("when", ["starting", "running"])
def test_sweep_ctrl_c_ends_workers_at_once_with_one_line(tmp_path, when):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while the workers start or run points
    that take minutes: exit 130 within seconds, every worker gone, one line and no traceback (from the sweep or
    from a worker)."""
    proc = _sweep_process(tmp_path)
    try:
        kids = _workers_of(proc.pid, 1 if when == "starting" else 2, proc, ready=when == "running")
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines()  # but the progress lines and the study's warning that its trace wraps
             if not ln.startswith(("sweep long:", "trace wraps:"))]
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len(lines) == 1 and "interrupted" in lines[0] and "--resume" in lines[0], err
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    end = time.monotonic() + 5
    while _alive(kids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(kids)


# ------------------------------------------------------------------ a resumed run prints what a fresh one prints
GRID_TOML = ('[study]\nname = "grid"\n[fixed]\ntrace_limit = 200\nsteps = 100\ncompute = "reference"\n'
             '[grid]\nsessions = [1, 16, 64, 96]\nreaders = [4, 16]\n')
CAPACITY_TOML = ('[study]\nname = "cap"\nseed = 4\n[capacity]\ntarget = 20.0\nseeds = 2\nmax_sessions = 64\n'
                 '[fixed]\ntrace_limit = 200\nsteps = 100\ncompute = "reference"\n'
                 '[grid]\nreaders = [4, 16]\n')


def _report_lines(text: str) -> list:
    """What a run printed, but its wall time and how many rows it took from the earlier run."""
    return [ln for ln in text.splitlines() if not ln.startswith("ran ")]


@pytest.mark.parametrize("kind", ["sweep", "capacity"])
def test_a_resumed_run_prints_what_a_fresh_run_prints(tmp_path, capsys, kind):
    """Rows (or probes) read back from an unfinished table carry the study's own axis values (None, not the
    empty cell), so they group with new ones: the findings printed after --resume are the fresh run's, for every
    place the table was cut."""
    study = tmp_path / f"{kind}.toml"
    study.write_text(GRID_TOML if kind == "sweep" else CAPACITY_TOML)
    out = tmp_path / f"{kind}.csv"
    args = ["sim", kind, str(study), "--out", str(out), "--jobs", "1", "--quiet"]
    assert main(args) == 0
    fresh = _report_lines(capsys.readouterr().out)
    table = probes_path(out) if kind == "capacity" else out
    whole = table.read_text().splitlines(keepends=True)
    meta = json.loads(meta_path(table).read_text())
    for keep in (1, len(whole) // 2, len(whole) - 1):
        table.write_text("".join(whole[:keep + 1]))  # the header and `keep` rows
        meta_path(table).write_text(json.dumps({**meta, "complete": False}))
        if kind == "capacity":
            out.unlink(missing_ok=True)
        assert main(args + ["--resume"]) == 0
        assert _report_lines(capsys.readouterr().out) == fresh, f"resumed from {keep} rows"
