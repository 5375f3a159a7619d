"""sim.sweep.capacity: the search (galloping, bisection, seed ensembles), its seeds, its assumptions, capacity studies
and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engram import ArgumentError
from engram.cli import main
from sim.sweep.capacity import (BATCHING, CapacitySpec, capacity_of, find_capacity, grid_capacities, probes_path,
                                read_capacity)
from sim.sweep.capacity import CAPACITY_METRIC, SMALL_CAPACITY, SearchRun, _bracketed, _search, session_bounds
from sim.decode import seed_reproduction
from sim.device import load_device
from sim.sweep import AXES, Study, point_seed, read_table, run_points

REFERENCE_MS = seed_reproduction()["compute_ms"]


def drive(search, capacity: int):
    """Run a search against a device that sustains exactly ``capacity`` sessions; (result, probes)."""
    probes = []
    s = next(search)
    while True:
        probes.append(s)
        try:
            s = search.send(s <= capacity)
        except StopIteration as stop:
            return stop.value, probes


@pytest.mark.parametrize("true", [0, 1, 2, 3, 5, 63, 64, 65, 100, 777, 1023])
def test_search_finds_the_exact_count(true):
    (cap, bound), probes = drive(_search(1024, 1), true)
    assert (cap, bound) == (true, False)
    assert len(probes) <= 2 * math.ceil(math.log2(true + 2)) + 2  # galloping, then bisection
    assert len(set(probes)) == len(probes)  # no count probed twice


def test_search_bounds_and_resolution():
    assert drive(_search(1024, 1), 5000)[0] == (1024, True)  # passed at the largest count: a lower bound
    assert drive(_search(100, 1), 100)[0] == (100, True)
    assert drive(_search(100, 1), 99)[0] == (99, False)
    (cap, _), probes = drive(_search(1024, 8), 300)
    assert 300 - 8 < cap <= 300 and len(probes) < len(drive(_search(1024, 1), 300)[1])


def capacity_configs(**over):
    """The seed preset, threshold 8 x 16 readers, the SPEC §8 compute, sessions at random phases (the default)."""
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace_limit=300, steps=120, compute="reference", threshold=8, readers=16)
    base.update(over)
    return [base]


@pytest.fixture(scope="module")
def reference_capacity():
    (cap,), runner = find_capacity(capacity_configs(compute="", compute_ms=REFERENCE_MS, compute_dist="gamma",
                                                    compute_cv=0.05),
                                   CapacitySpec(seeds=3, max_sessions=256), 11, run=SearchRun(jobs=2, progress=False))
    return cap, runner


def test_capacity_is_the_boundary_of_its_probes(reference_capacity):
    """The capacity passes the target and one session more fails it, for every seed of the ensemble."""
    cap, runner = reference_capacity
    assert runner == "processes:2" and len(cap.per_seed) == 3
    assert 16 < cap.capacity < 256 and cap.low <= cap.capacity <= cap.high
    for r, c in enumerate(cap.per_seed):
        at, above = cap.at(c, r), cap.at(c + 1, r)
        assert at["repeat"] == r and at["session_tokens_per_s_min"] >= 20.0
        assert above["repeat"] == r and above["session_tokens_per_s_min"] < 20.0
    # one session alone decodes near the compute-only ceiling
    assert cap.at(1, 0)["session_tokens_per_s_min"] == pytest.approx(1e3 / REFERENCE_MS, rel=0.05)


def test_capacity_seeds_come_from_the_study_seed_and_the_point(reference_capacity):
    """Every probe's seed is point_seed(study seed, probe point): the same probes give the same rows, on any
    runner and in any run (no temporary file or order enters the seed)."""
    cap, _ = reference_capacity
    for p in cap.probes:
        assert p["seed"] == point_seed(11, {a: p[a] for a in AXES})
    again, runner = find_capacity(capacity_configs(compute="", compute_ms=REFERENCE_MS, compute_dist="gamma",
                                                   compute_cv=0.05),
                                  CapacitySpec(seeds=3, max_sessions=256), 11, run=SearchRun(jobs=1, progress=False))
    assert runner == "inline" and again[0].per_seed == cap.per_seed
    assert [p["seed"] for p in again[0].probes] == [p["seed"] for p in cap.probes]
    # the probes at the capacity, rerun as a plain sweep, give the same numbers
    pts = [{a: p[a] for a in AXES} for p in cap.probes[-3:]]
    rows, _ = run_points(pts, 11, jobs=1, progress=False)
    assert [r["session_tokens_per_s_min"] for r in rows] == [p["session_tokens_per_s_min"] for p in cap.probes[-3:]]


def test_assumptions_state_compute_batching_phases_and_headroom(reference_capacity):
    cap, _ = reference_capacity
    a = cap.assumptions()
    assert cap.ceiling == pytest.approx(21.27, abs=0.005) and cap.headroom == pytest.approx(0.0597, abs=5e-4)
    assert cap.read_budget_ms == pytest.approx(50.0 - REFERENCE_MS, rel=1e-9)
    assert "compute 47.01 ms a step on average (gamma, CV 0.05)" in a and BATCHING in a
    assert "phases: random (each session starts at a uniformly random time within one step, seeded)" in a
    assert "6.0% under the compute-only ceiling of 21.27" in a and "2.99 ms a step for reads" in a
    # the phases are the simulator's, as every probe ran (DecodeResult.phases), not the study's words
    assert {p["phases_run"] for p in cap.probes} == {"random"}
    # the compute drawn, pooled over every step of every probe: the NumPy twin of pooled_compute
    n = np.array([p["sessions"] * p["steps"] for p in cap.probes], float)
    m = np.array([p["compute_realised_mean_ms"] for p in cap.probes])
    sd = m * np.array([p["compute_realised_cv"] for p in cap.probes])
    mean = (n * m).sum() / n.sum()
    cv = np.sqrt((n * (sd ** 2 + m ** 2)).sum() / n.sum() - mean ** 2) / mean
    assert cap.compute_realised == pytest.approx((mean, cv), rel=1e-9)
    assert mean == pytest.approx(REFERENCE_MS, rel=0.005) and cv == pytest.approx(0.05, abs=0.003)
    assert f"drawn: mean {mean:.2f} ms, CV {cv:.3g}" in a
    row = cap.row()
    assert row["capacity"] == cap.capacity and row["capacities"] == " ".join(map(str, cap.per_seed))
    assert row["ceiling_tokens_per_s"] == cap.ceiling and row["phases_run"] == "random"
    assert row["session_phases"].startswith("random (") and row["phases"] == "random"
    assert (row["compute_realised_mean_ms"], row["compute_realised_cv"]) == cap.compute_realised


def test_no_headroom_means_no_capacity():
    """49.7 ms of compute leaves 0.3 ms a step for 48 reads at 20 tokens/s: too little even for one session on
    the reference SSD; above 50 ms the target is past the compute-only ceiling."""
    caps, _ = find_capacity(capacity_configs(compute="", compute_ms=49.7) + capacity_configs(compute="",
                                                                                             compute_ms=51.0),
                            CapacitySpec(seeds=1, max_sessions=64), 0, run=SearchRun(jobs=1, progress=False))
    tight, over = caps
    assert tight.capacity == over.capacity == 0 and len(tight.probes) == len(over.probes) == 1
    assert "leaving 0.30 ms a step for reads" in tight.assumptions()
    assert over.headroom < 0 and "above the compute-only ceiling of 19.61 tokens/s" in over.assumptions()


def test_each_phase_assumption_is_stated_as_it_ran():
    """Random phases (the default), lockstep, and the older start_spread_ms of a study: each capacity states the
    phases its probes ran with, and lockstep never beats the others."""
    rand, lock, spread = find_capacity(capacity_configs() + capacity_configs(phases="lockstep")
                                       + capacity_configs(start_spread_ms=47.0),
                                       CapacitySpec(seeds=1, max_sessions=128), 0,
                                       run=SearchRun(jobs=2, progress=False))[0]
    assert {p["phases_run"] for p in rand.probes} == {"random"} and "phases: random (" in rand.assumptions()
    assert {p["phases_run"] for p in lock.probes} == {"lockstep"}
    assert "phases: lockstep (every session starts at once)" in lock.assumptions()
    assert {p["phases_run"] for p in spread.probes} == {"spread:47"}
    assert "phases: starts spread evenly over 47 ms" in spread.assumptions()
    # With a constant compute, sessions started together fall into the device's FIFO order after their
    # first step and stay staggered, so over 120 steps all reach near the device's throughput bound:
    # 78,125 reads/s / (48 rows x 20 tokens/s) = 81.4 sessions.
    bound = load_device("seed-apple-m3-ultra").peak_iops() / (48 * 20.0)
    assert lock.capacity <= min(rand.capacity, spread.capacity) and max(rand.capacity, spread.capacity) <= bound
    assert min(rand.capacity, spread.capacity) >= 0.9 * bound


def test_phases_and_the_older_spread_cannot_both_be_given():
    with pytest.raises(ArgumentError, match="not both"):
        Study.from_dict({"fixed": {"start_spread_ms": 47.0, "phases": "lockstep"}})


def test_capacity_spec_and_study_errors():
    for bad, match in (({"target": 0}, "target"), ({"seeds": 0}, "seeds"), ({"max_sessions": 1.5}, "max_sessions"),
                       ({"metric": "tokens_per_s"}, "metric")):
        with pytest.raises(ArgumentError, match=match):
            CapacitySpec(**bad)
    with pytest.raises(ArgumentError, match="not a capacity study"):
        CapacitySpec.from_study(Study.from_dict({}))
    with pytest.raises(ArgumentError, match="cannot set 'sessions'"):
        CapacitySpec.from_study(Study.from_dict({"capacity": {}, "grid": {"sessions": [1, 2]}}))
    with pytest.raises(ArgumentError, match="unknown key 'goal'"):
        CapacitySpec.from_study(Study.from_dict({"capacity": {"goal": 20}}))
    spec = CapacitySpec.from_study(Study.from_dict({"capacity": {"target": 19, "seeds": 2}}), max_sessions=64)
    assert spec == CapacitySpec(19.0, 2, 64)


def test_grid_capacity_reads_off_the_grid():
    rows = [{"sessions": s, "y": v} for s, v in ((1, 21.0), (8, 20.5), (16, 20.0), (32, 19.9), (64, 25.0))]
    assert capacity_of(rows, 20.0, "y") == (16, False)  # the first miss ends the search
    assert capacity_of(rows, 19.0, "y") == (64, True)
    assert capacity_of(rows, 22.0, "y") == (0, False)
    both = [dict(r, device=d, session_tokens_per_s_min=r["y"] + (0 if d == "a" else 5), **{"repeat": 0})
            for r in rows for d in ("a", "b")]
    got = {k["device"]: (cap, bound) for k, cap, bound, _ in grid_capacities(both, 20.0, axes=["device"])}
    assert got == {"a": (16, False), "b": (64, True)}


CAPACITY_TOML = """
[study]
name = "tiny-capacity"
description = "two drives"
seed = 4

[capacity]
target = 20.0
seeds = 2
max_sessions = 64

[fixed]
trace_limit = 200
steps = 100
compute = "reference"
phases = "random"

[grid]
device = ["seed-apple-m3-ultra", "ssd:qd1_us=500,iops=20000,parallelism=8"]
"""



def test_run_capacity_from_a_script_needs_the_main_guard_for_local_workers(tmp_path):
    """The workers are spawned: each imports the calling script before it takes a probe, so the script's
    top level runs in every one (what run_capacity's docstring asks a script to guard); under the guard
    two workers give the answer one process gives, and jobs=1 runs without one."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    study = tmp_path / "cap.toml"
    study.write_text(CAPACITY_TOML)
    call = ("from sim.sweep.capacity import run_capacity\n"
            f"res = run_capacity({str(study)!r}, jobs=JOBS, progress=False)\n")
    show = 'print("caps", [r["capacity"] for r in res.rows()], flush=True)\n'
    # one write(2) a line, under PIPE_BUF: two workers' lines never interleave (print makes a write per
    # piece when stdout is unbuffered, as under PYTHONUNBUFFERED)
    guarded = ('import os\nos.write(1, f"top level in {__name__}\\n".encode())\nif __name__ == "__main__":\n'
               + "".join("    " + line + "\n" for line in (call + show).replace("JOBS", "2").splitlines()))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    outs = []
    for name, text in (("guarded.py", guarded), ("plain.py", call.replace("JOBS", "1") + show)):
        (tmp_path / name).write_text(text)
        r = subprocess.run([sys.executable, name], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(r.stdout.splitlines())
    tops = [line for line in outs[0] if line.startswith("top level in")]
    assert tops[0] == "top level in __main__" and len(tops) >= 2
    assert set(tops[1:]) == {"top level in __mp_main__"}  # each worker ran the script's top level
    assert outs[0][-1] == outs[1][-1] and outs[0][-1].startswith("caps [64, ")

def test_capacity_study_cli_resume_and_table(tmp_path, capsys):
    study = tmp_path / "cap.toml"
    study.write_text(CAPACITY_TOML)
    out = tmp_path / "cap.csv"
    assert main(["sim", "capacity", str(study), "--out", str(out), "--jobs", "2", "--quiet", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    fast, slow = d["configurations"]
    assert fast["device"] == "seed-apple-m3-ultra" and fast["capacity"] == 64 and fast["lower_bound"] is True
    assert 0 < slow["capacity"] < 16 and slow["low"] <= slow["capacity"] <= slow["high"]
    assert "the SPEC §8 reference compute" in slow["assumptions"] and d["capacity"]["seeds"] == 2
    assert fast["phases"] == slow["phases"] == "random" and fast["compute_realised_cv"] == 0.0
    assert fast["compute_realised_mean_ms"] == pytest.approx(fast["compute_mean_ms"], rel=1e-12)
    rows, probes, meta = read_capacity(out)
    assert meta["kind"] == "capacity" and meta["complete"] is True and len(rows) == 2
    assert [r["capacity"] for r in rows] == [64, slow["capacity"]] and rows[0]["lower_bound"] is True
    assert len(probes) == fast["probes"] + slow["probes"] and probes_path(out).is_file()
    # a second run resumes from the probes: nothing is simulated again, the answer is the same
    assert main(["sim", "capacity", str(study), "--out", str(out), "--resume", "--quiet", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["resumed_probes"] == len(probes) and again["configurations"] == d["configurations"]
    # an interrupted search (half its probes written) resumes from them and ends where the whole run did
    lines = probes_path(out).read_text().splitlines(keepends=True)
    probes_path(out).write_text("".join(lines[:len(lines) // 2]))
    out.unlink()
    assert main(["sim", "capacity", str(study), "--out", str(out), "--resume", "--quiet", "--json"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert half["resumed_probes"] == len(lines) // 2 - 1 and half["configurations"] == d["configurations"]
    assert len(read_capacity(out)[1]) == len(probes)
    # human output states the assumptions and the band
    assert main(["sim", "capacity", str(study), "--out", str(out), "--resume", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "assumes   target 20 tokens/s for every session" in text and "phases: random (" in text
    assert "capacity  device=seed-apple-m3-ultra: >= 64 sessions (all equal over 2 seeds); random phases" in text
    # a capacity study is not a sweep, and a sweep table is not resumable as this study
    assert main(["sim", "sweep", str(study), "--out", str(tmp_path / "x.csv")]) == 2
    assert "engram sim capacity" in capsys.readouterr().err
    assert read_table(probes_path(out))[1]["kind"] == "capacity-probes"


def test_capacity_on_a_dask_cluster_is_the_local_one():
    """The search runs on a Dask cluster like a sweep, with the same probes, seeds and capacities."""
    distributed = pytest.importorskip("dask.distributed")
    configs = capacity_configs(device="ssd:qd1_us=90,iops=200000,parallelism=16", compute_dist="gamma",
                               compute="", compute_ms=REFERENCE_MS, compute_cv=0.05, steps=80)
    spec = CapacitySpec(seeds=2, max_sessions=64)
    local, _ = find_capacity(configs, spec, 9, run=SearchRun(jobs=1, progress=False))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        remote, runner = find_capacity(configs, spec, 9, run=SearchRun(scheduler=c.scheduler_address, progress=False))
    assert runner.startswith("dask:") and remote[0].per_seed == local[0].per_seed
    assert [(p["sessions"], p["seed"], p["session_tokens_per_s_min"]) for p in remote[0].probes] == \
        [(p["sessions"], p["seed"], p["session_tokens_per_s_min"]) for p in local[0].probes]


# ------------------------------------------------------------------ the bracketed search (queueing bounds first)
def drive_rows(search, capacity: int, first: dict, target: float = 20.0):
    """Run a row-reading search against a device that sustains exactly ``capacity`` sessions, the 1-session
    probe's row being ``first`` (its bounds may be wrong on purpose); (result, probes)."""
    probes = []
    s = next(search)
    while True:
        probes.append(s)
        row = dict(first) if s == 1 else {}
        row[CAPACITY_METRIC] = target + (1.0 if s <= capacity else -1.0)
        if s == 1 and capacity >= 1:
            row[CAPACITY_METRIC] = first[CAPACITY_METRIC]
        try:
            s = search.send(row)
        except StopIteration as stop:
            return stop.value, probes


#: One session at 21 tokens/s (a 47.62 ms step), 48 reads a step at a peak of 600,000 IOPS (D = 80 us).
FIRST = {CAPACITY_METRIC: 21.0, "reads_per_step": 48.0, "reads_per_s": 1008.0, "iops_utilization": 1008.0 / 600000}


def test_session_bounds_known_answer():
    """lower = floor((50 - 47.619) ms / 80 us) + 1 = 30; upper = floor(1 / (20 x 80 us)) = 625; the MVA estimate of
    a 47.54 ms delay and one 80 us server lies between (the knee 1 + Z / D = 595 less the queue at the target)."""
    lower, est, upper = session_bounds(FIRST, 20.0)
    assert (lower, upper) == (30, 625) and lower < est <= upper
    assert session_bounds({**FIRST, CAPACITY_METRIC: 19.0}, 20.0) == (0, 0, 0)
    assert session_bounds({**FIRST, "reads_per_s": 0.0}, 20.0) == (1, 1, None)


@pytest.mark.parametrize("true", [1, 2, 7, 29, 30, 31, 400, 590, 600, 624, 625, 626, 2000, 4095, 4096])
def test_bracketed_search_finds_the_exact_count_whatever_the_bounds(true):
    """The bounds only choose where to look: a device whose true capacity lies anywhere -- inside the bracket,
    below its lower bound, above its upper -- is found exactly, in few probes near the estimate."""
    (cap, bound), probes = drive_rows(_bracketed(4096, 1, 20.0, CAPACITY_METRIC), true, FIRST)
    assert (cap, bound) == (true, true == 4096)
    small = {**FIRST, "reads_per_s": FIRST["reads_per_s"] / 20}  # a peak of 30,000 IOPS: upper bound 31
    assert drive_rows(_bracketed(4096, 1, 20.0, CAPACITY_METRIC), true, small) == drive(_search(4096, 1), true)
    assert len(set(probes)) == len(probes)
    if 30 <= true <= 625:
        assert len(probes) <= 2 * math.ceil(math.log2(626)) + 2  # no more than galloping could take
    gallop = drive(_search(4096, 1), true)[1]
    if 560 <= true <= 625:  # near the estimate: fewer probes than galloping, none far above the capacity
        assert len(probes) < len(gallop) and max(probes) < 2 * true


def test_bracketed_and_galloping_searches_agree():
    """Today's search (galloping) and the bracketed one on three devices, three seeds each: the same capacity
    within one session (a count that passed next to one that failed), the bracketed one in fewer probes where
    the capacity is not small."""
    devices = ["seed-apple-m3-ultra", "ssd:qd1_us=80,iops=600000,parallelism=32",
               "ssd:qd1_us=60,iops=200000,cap_iops=60000,burst_ios=64"]
    configs = [c for d in devices for c in capacity_configs(device=d, steps=60)]
    spec = dict(seeds=3, max_sessions=1024)
    old, _ = find_capacity(configs, CapacitySpec(**spec, search="gallop"), 5, run=SearchRun(jobs=2, progress=False))
    new, _ = find_capacity(configs, CapacitySpec(**spec, search="bracket"), 5, run=SearchRun(jobs=2, progress=False))
    for a, b in zip(old, new):
        assert all(abs(x - y) <= 1 for x, y in zip(a.per_seed, b.per_seed)), (a.config["device"], a.per_seed, b.per_seed)
        assert len(b.probes) <= len(a.probes)
        if max(a.per_seed) >= SMALL_CAPACITY:  # below it the bracketed search gallops too
            assert len(b.probes) < len(a.probes)
    with pytest.raises(ArgumentError, match="search = 'fast'"):
        CapacitySpec(search="fast")


@pytest.mark.parametrize("kw,field", [(dict(jobs=0), "jobs"), (dict(connect_timeout=0.0), "connect_timeout")])
def test_bad_search_run_names_the_field(kw, field):
    with pytest.raises(ArgumentError, match=field):
        SearchRun(**kw)


@pytest.mark.parametrize("kw,message", [
    (dict(jobs=0), "SearchRun.jobs = 0: expected a whole number >= 1"),
    (dict(jobs="2"), "SearchRun.jobs = '2': expected a whole number >= 1"),
    (dict(jobs=2.0), "SearchRun.jobs = 2.0: expected a whole number >= 1"),
    (dict(jobs=True), "SearchRun.jobs = True: expected a whole number >= 1"),
    (dict(scheduler=""), "SearchRun.scheduler = '': expected a non-empty string"),
    (dict(scheduler=8786), "SearchRun.scheduler = 8786: expected a non-empty string"),
    (dict(connect_timeout="30"), "SearchRun.connect_timeout = '30': expected a finite number > 0"),
    (dict(connect_timeout=math.inf), "SearchRun.connect_timeout = inf: expected a finite number > 0"),
    (dict(progress="loud"), "SearchRun.progress = 'loud': expected True, False or one of 'auto', 'bar', 'lines'"),
    (dict(progress=1), "SearchRun.progress = 1: expected True, False or one of"),
    (dict(desc=None), "SearchRun.desc = None: expected a string"),
    (dict(done="rows"), "SearchRun.done = str: expected a sequence of probe rows"),
    (dict(done=[{"point": 0}, 3]), "SearchRun.done[1] = int: expected a probe row (a mapping)"),
    (dict(on_probe="print"), "SearchRun.on_probe = 'print': expected None or a callable"),
])
def test_search_run_refuses_a_bad_field_naming_it(kw, message):
    with pytest.raises(ArgumentError) as exc:
        SearchRun(**kw)
    assert str(exc.value).startswith(message), str(exc.value)


def test_search_run_keeps_its_valid_values():
    rows = [{"point": 3}]
    run = SearchRun(jobs=np.int64(2), scheduler="tcp://127.0.0.1:8786", connect_timeout=5, progress="lines",
                    desc="capacity", done=rows, on_probe=rows.append)
    assert (run.jobs, run.scheduler, run.connect_timeout, run.progress, run.desc) == (
        2, "tcp://127.0.0.1:8786", 5.0, "lines", "capacity")
    assert type(run.jobs) is int and run.done is rows and run.on_probe == rows.append
    assert SearchRun(progress=False).progress is False and SearchRun().jobs is None


def test_capacity_overrides_name_an_unknown_field():
    study = Study.from_dict({"capacity": {"target": 19}})
    with pytest.raises(ArgumentError) as exc:
        CapacitySpec.from_study(study, max_session=64)
    msg = str(exc.value)
    assert "CapacitySpec has no field 'max_session'" in msg and "max_sessions" in msg and "target" in msg, msg
    assert not isinstance(exc.value, TypeError)
    assert CapacitySpec.from_study(study, max_sessions=64, seeds=None) == CapacitySpec(19.0, CapacitySpec().seeds, 64)


def test_searches_advance_alone_and_probe_ahead_without_changing_their_probes(tmp_path):
    """Each search takes its probe's row as soon as it is in, and idle workers probe counts it may ask next: the
    answers, the probes taken and the probes table (numbered in rounds) are those of the searches run one probe
    at a time in this process; a probe run ahead that no search asked is not in them."""
    configs = capacity_configs(device="ssd:qd1_us=80,iops=600000,parallelism=32", steps=40, trace_limit=200)
    spec = CapacitySpec(seeds=1, max_sessions=1024)
    seen = []
    (two,), _ = find_capacity(configs, spec, 3, run=SearchRun(jobs=2, progress=False, on_probe=seen.append))
    (one,), _ = find_capacity(configs, spec, 3, run=SearchRun(jobs=1, progress=False))
    assert two.per_seed == one.per_seed and len(two.probes) >= 3
    key = lambda p: (p["point"], p["sessions"], p["seed"], p["session_tokens_per_s_min"])  # noqa: E731
    assert [key(p) for p in two.probes] == [key(p) for p in one.probes]
    assert sorted(p["point"] for p in seen) == list(range(len(two.probes)))  # only the probes the search took


def test_a_run_stops_when_nothing_more_is_wanted():
    """PointRunner.run: tasks come as rows go (``more``), and a None from it drops what still waits."""
    from sim.sweep.runner import PointRunner

    class Squares(PointRunner):
        point_fn = staticmethod(lambda i, p, s, ctx: {"point": i, "x": p["x"] ** 2})

    rows, asked = [], []

    def more(free):
        asked.append(free)
        return None if len(rows) == 3 else [(10 + len(rows), {"x": len(rows)}, 0)]

    with Squares(None, jobs=1) as runner:
        runner.run([(0, {"x": 5}, 0), (1, {"x": 6}, 0)], rows.append, more=more)
    # the third row ends the run: the task still waiting (x = 2) never runs
    assert [r["x"] for r in rows] == [25, 36, 1] and asked == [0, 0, 0] and set(runner.seconds) == {0, 1, 11}


def test_on_a_host_the_bracket_starts_where_its_cpus_bind():
    """A host whose CPUs bind before the drive: the first probe of many sessions is the mean-value analysis that
    every probe on the host runs (the 1-session step with the CPUs free, its reads), at the CPUs' bound, not the
    drive's estimate; the search still finds every capacity exactly."""
    from sim.decode.host import HostCPU
    from sim.sweep.capacity import host_sessions

    host = HostCPU(4, 100 * 1e-6, 20 * 1e-6)  # 1.06 ms of CPU a 48-read step: 4 CPUs bound 188.7 sessions at 20/s
    first = {**FIRST, "step_mean_ms": 1e3 / 21.0}
    n = host_sessions(first, host, 20.0, 4096)
    free = 1 / 21.0 - 100e-6
    assert host.step_time(n, free, 48.0) <= 0.05 < host.step_time(n + 1, free, 48.0) and 150 < n <= 188
    assert host_sessions(first, host, 20.0, 100) == 100 and host_sessions(first, HostCPU(0.02, 0.06, 0), 20.0, 9) == 0
    g = _bracketed(4096, 1, 20.0, CAPACITY_METRIC, host)
    assert next(g) == 1 and g.send(first) == n < session_bounds(FIRST, 20.0)[1]
    for true in (1, 150, n, n + 3, 600):
        assert drive_rows(_bracketed(4096, 1, 20.0, CAPACITY_METRIC, host), true, first)[0] == (true, False)
