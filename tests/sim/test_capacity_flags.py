"""``engram sim capacity`` for a planner without a study file, and the time left on a search's progress line."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.cli import main
from sim.capacity import MAX_CAPACITY_SESSIONS, CapacitySpec, SearchBound, SearchProgress, _search
from sim.serve.search import MAX_HALVINGS, _rate_search
from sim.serve.study import RateSearch
from tests.clirun import cli

SLOW = "ssd:qd1_us=500,iops=20000,parallelism=8"
FAST = "ssd:qd1_us=80,iops=100000"
SEARCH = ["--target", "20", "--seeds", "1", "--max-sessions", "24", "--jobs", "1", "--quiet", "--json"]


def capacity_json(capsys, argv) -> dict:
    assert main(["sim", "capacity", *argv, *SEARCH]) == 0
    return json.loads(capsys.readouterr().out)


def answers(doc: dict) -> list:
    keys = ("device", "drives", "reuse", "capacity", "low", "high", "per_seed", "lower_bound", "probes")
    return [{k: c.get(k) for k in keys} for c in doc["configurations"]]


def test_capacity_from_flags_equals_the_equivalent_study(capsys, tmp_path):
    flags = capacity_json(capsys, ["--device", SLOW, "--device", FAST, "--drives", "1,2", "--reuse", "0.3",
                                   "--compute-ms", "45", "--limit", "300", "--steps", "40",
                                   "--out", str(tmp_path / "flags.csv")])
    study = tmp_path / "planner.toml"
    study.write_text(f'''
[study]
name = "capacity"
seed = 0

[capacity]

[fixed]
trace = "stdlib:asyncio/base_events.py"
trace_limit = 300
steps = 40
compute = ""
compute_ms = 45.0
threshold = 8
readers = 16
phases = "random"

[grid]
device = ["{SLOW}", "{FAST}"]
drives = [1, 2]
reuse = [0.3]
''', encoding="utf-8")
    toml = capacity_json(capsys, [str(study), "--out", str(tmp_path / "toml.csv")])
    assert len(flags["configurations"]) == 4
    assert answers(flags) == answers(toml)
    got = {(c["device"], c["drives"]): c["capacity"] for c in flags["configurations"]}
    # the slow SSD alone is found below the top (5 ms a step for its reads); a second drive never lowers it
    slow = next(c for c in flags["configurations"] if c["device"] == SLOW and c["drives"] == 1)
    assert not slow["lower_bound"] and 1 <= slow["capacity"] < 24
    assert got[(SLOW, 2)] >= got[(SLOW, 1)] and got[(FAST, 2)] >= got[(FAST, 1)] >= got[(SLOW, 1)]
    assert flags["capacity"]["target"] == 20.0 and flags["capacity"]["seeds"] == 1


@pytest.mark.parametrize("flag", [["--device", FAST], ["--drives", "1,2"], ["--reuse", "0.2"], ["--compute-ms", "5"],
                                  ["--steps", "50"], ["--limit", "300"], ["--trace", "shared:promessi_sposi.txt"]])
def test_a_configuration_flag_with_a_study_file_is_refused(flag, tmp_path, capsys):
    out = tmp_path / "c.csv"
    err = cli(capsys, ["sim", "capacity", "studies/capacity.toml", *flag, "--out", str(out)])
    assert f"{flag[0]} describes a configuration of the command line" in err
    assert not out.exists()


@pytest.mark.parametrize("argv", [["--drives", "1,x"], ["--reuse", "0.2,abc"], ["--drives", "0"], ["--reuse", "1.5"],
                                  ["--device", "ssd:qd1_us=-1,iops=5"], ["--device", "ssd:qd1_us=80,iops=1e-30"]])
def test_bad_planner_values_get_one_line(argv, tmp_path, capsys):
    out = tmp_path / "c.csv"
    try:
        err = cli(capsys, ["sim", "capacity", *argv, "--out", str(out), "--max-sessions", "4", "--seeds", "1"])
    except SystemExit as exc:  # argparse's own refusal of a value of the wrong type: exit 2, usage + one line
        assert exc.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
    assert argv[0] in err or argv[1].split(",")[-1] in err or "drives" in err or "reuse" in err
    assert not out.exists() and not list(tmp_path.iterdir())


# ---------------------------------------------------------------- the bound of a search's length
def _run(gen, passes) -> list:
    """The probes a search asks with the oracle ``passes``."""
    asked = []
    try:
        x = next(gen)
        while True:
            asked.append(x)
            x = gen.send(passes(x))
    except StopIteration:
        return asked


@settings(max_examples=60, deadline=None)
@given(max_sessions=st.integers(1, 300), resolution=st.integers(1, 8), capacity=st.integers(0, 300))
def test_the_session_bound_holds_and_is_within_one_probe_once_bracketed(max_sessions, resolution, capacity):
    capacity = min(capacity, max_sessions)
    bound = SearchBound(lambda: _search(max_sessions, resolution), range(max_sessions + 1))
    asked = _run(_search(max_sessions, resolution), lambda s: s <= capacity)
    passed = failed = None
    for k, s in enumerate(asked):
        left = bound.left(passed, failed, k)
        assert left >= len(asked) - k
        if failed is not None:  # bisection: its length is the bracket's, within one halving
            assert left - (len(asked) - k) <= 1
        if s <= capacity:
            passed = s if passed is None else max(passed, s)
        else:
            failed = s if failed is None else min(failed, s)
    assert bound.left(passed, failed, len(asked)) == 0


@settings(max_examples=40, deadline=None)
@given(capacity=st.floats(0.001, 200.0), resolution=st.sampled_from([0.02, 0.05, 0.2]))
def test_the_rate_bound_holds(capacity, resolution):
    search = RateSearch(1, 0.5, 64.0, resolution)
    grid = np.geomspace(0.5 / 2.0 ** (MAX_HALVINGS + 1), 128.0, 2000)
    bound = SearchBound(lambda: _rate_search(search), grid)
    asked = _run(_rate_search(search), lambda r: r <= capacity)
    passed = failed = None
    for k, r in enumerate(asked):
        # the grid stands for every rate: the bound is allowed one probe of slack between its points
        assert bound.left(passed, failed, k) >= len(asked) - k - 1
        if r <= capacity:
            passed = r if passed is None else max(passed, r)
        else:
            failed = r if failed is None else min(failed, r)


def test_the_progress_line_says_the_time_left_and_tightens_to_the_count():
    out = io.StringIO()
    caps = {0: 5, 1: 37, 2: 0}
    bound = SearchBound(lambda: _search(64, 1), range(65))
    prog = SearchProgress(bound, list(caps), "capacity", "lines", stream=out, interval=0.0)
    gens = {k: _search(64, 1) for k in caps}
    asked = {k: next(g) for k, g in gens.items()}
    total = 0
    with prog:
        while asked:
            for k, s in list(asked.items()):
                ok = s <= caps[k]
                prog.answered(k, s, ok, f"search {k}: {s} sessions")
                total += 1
                try:
                    asked[k] = gens[k].send(ok)
                except StopIteration:
                    del asked[k]
                    prog.finished(k)
            prog.retotal()
    lines = out.getvalue().splitlines()
    assert lines[0] == f"capacity: {3 * 12} probes"  # 3 searches of at most 1, 2, .., 64 then 5 halvings of 32..64
    assert any(re.search(r"\d+/\d+ probes \(\d+%\) after \d+ s, about \d+ s left", x) for x in lines[1:])
    assert lines[-1].startswith(f"capacity: {total}/{total} probes in ")


def test_a_search_beyond_the_largest_count_is_refused_at_once(tmp_path, capsys):
    """--max-sessions 10^9 would walk every count to bound the search's length: refused, one line, nothing left."""
    out = tmp_path / "c.csv"
    err = cli(capsys, ["sim", "capacity", "--max-sessions", "1000000000", "--out", str(out), "--seeds", "1"])
    assert "max_sessions = 1000000000 is above 65536" in err and not list(tmp_path.iterdir())
    assert CapacitySpec(max_sessions=MAX_CAPACITY_SESSIONS).max_sessions == 65536


def test_a_burst_longer_than_the_probes_is_said_with_the_sustained_bound(capsys, tmp_path):
    """A capped volume whose burst outlasts the probes' window: the capacity (24 here) holds only while the
    burst lasts, and the answer says so with the sustained bound floor(20000 / (48 x 20)) = 20; a burst that
    the probes spend (or none) adds nothing."""
    doc = capacity_json(capsys, ["--device", "ssd:qd1_us=80,iops=500000,cap_iops=20000,burst_ios=50000",
                                 "--out", str(tmp_path / "a.csv")])
    c = doc["configurations"][0]
    assert c["capacity"] > 20
    assert "holds only while the burst lasts; sustained, at most 20 sessions" in c["assumptions"]
    doc = capacity_json(capsys, ["--device", FAST, "--out", str(tmp_path / "b.csv")])
    assert "burst" not in doc["configurations"][0]["assumptions"]
