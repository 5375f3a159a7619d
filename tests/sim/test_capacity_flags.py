"""``engram sim capacity`` for a planner without a study file, and the time left on a search's progress line."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from sim.decode.host import engine_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.cli import main
from sim.sweep.capacity import (ASSUMED_SESSION_STEPS_PER_S, MAX_CAPACITY_SESSIONS, CapacitySpec, SearchBound,
                                SearchProgress, SearchRun, WorkProgress, _search, find_capacity, read_capacity)
from sim.sweep import AXES
from sim.sweep.study import point_seed
from sim.serve.search import MAX_HALVINGS, _rate_search
from sim.serve.study import RateSearch
from sim.core.progress import ProgressOutput
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


def _study(path, fixed: str, grid: str):
    """A capacity study at ``path`` as the flags describe it: the trace and the read policy of the flags'
    defaults, ``fixed`` and ``grid`` lines added."""
    path.write_text(f'''
[study]
name = "capacity"
seed = 0

[capacity]

[fixed]
trace = "stdlib:asyncio/base_events.py"
steps = 40
threshold = 8
readers = 16
phases = "random"
{fixed}

[grid]
{grid}
''', encoding="utf-8")
    return path


def test_capacity_from_flags_equals_the_equivalent_study(capsys, tmp_path):
    flags = capacity_json(capsys, ["--device", SLOW, "--device", FAST, "--drives", "1,2", "--reuse", "0.3",
                                   "--compute-ms", "45", "--limit", "300", "--steps", "40",
                                   "--out", str(tmp_path / "flags.csv")])
    study = _study(tmp_path / "planner.toml", 'trace_limit = 300\ncompute = ""\ncompute_ms = 45.0',
                   f'device = ["{SLOW}", "{FAST}"]\ndrives = [1, 2]\nreuse = [0.3]')
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
                                  ["--steps", "50"], ["--limit", "300"], ["--trace", "shared:promessi_sposi.txt"],
                                  ["--shared-cache-bytes", "1M"], ["--host-cpus", "4"]])
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


def test_a_shared_row_cache_of_the_command_line_is_searched_and_reported(capsys, tmp_path):
    """--shared-cache-bytes and --cache-policy (engram sim decode's options) give each configuration one row cache
    shared by its sessions, warmed before each probe by the probes' steps (--cache-warmup-steps): the answers of the
    study that says the same in [fixed]; the JSON and the output give the cache and its hit rate at the capacity,
    which is the engine's policy replayed over that probe's steps after the warm-up; a cache that starts empty in
    each probe hits less there, and the output says so."""
    from sim.core.params import Policy
    from sim.decode.reads import step_reads
    from sim.trace import load_trace

    base = ["--device", SLOW, "--limit", "600", "--steps", "40", "--shared-cache-bytes", "1M", "--cache-policy", "lru"]
    doc = capacity_json(capsys, [*base, "--out", str(tmp_path / "w.csv")])
    c = doc["configurations"][0]
    rc, n = c["row_cache"], c["capacity"]
    assert (rc["shared_cache_rows"], rc["shared_cache_bytes"], rc["cache_policy"], rc["cache_warmup_steps"]) == \
        (3971, 1 << 20, "lru", 40)
    tr = load_trace("stdlib:asyncio/base_events.py", limit=600)
    rd = step_reads(tr, n, 40, Policy(shared_cache_bytes="1M", cache_policy="lru", cache_warmup_steps=40))
    assert rd.shared_hits > 0 and rc["hit_rate_at_capacity"] == pytest.approx(rd.shared_hits / rd.requests, abs=1e-12)
    assert ("one row cache of 1 MiB (3,971 rows) shared by the sessions, lru, warmed before each probe by 40 steps a "
            "session") in c["assumptions"]
    empty = step_reads(tr, n, 40, Policy(shared_cache_bytes="1M", cache_policy="lru"))
    assert rc["other_start"] == {"cache_warmup_steps": 0, "hit_rate": pytest.approx(empty.shared_hits / empty.requests,
                                                                                    abs=1e-12)}
    assert rc["other_start"]["hit_rate"] < rc["hit_rate_at_capacity"]  # a warm LRU cache holds more
    grows = ("a cache's hit rate changes with the steps it has seen until its policy settles (W-TinyLFU's counts "
             "over many steps), so the capacity depends on the probes' steps and warm-up")
    assert rc["note"] == (f"row cache warmed by 40 steps a session before each probe: hit rate "
                          f"{rc['hit_rate_at_capacity']:.4f} in the probe of {n} sessions x 40 steps "
                          f"({rc['other_start']['hit_rate']:.4f} from empty); {grows}: compare a longer "
                          "--cache-warmup-steps (a study's cache_warmup_steps)")

    study = _study(tmp_path / "cache.toml", 'trace_limit = 600\ncompute = "reference"\nshared_cache_bytes = "1048576"\n'
                   'cache_policy = "lru"\ncache_warmup_steps = 40', f'device = ["{SLOW}"]')
    assert answers(capacity_json(capsys, [str(study), "--out", str(tmp_path / "toml.csv")])) == answers(doc)

    cold = capacity_json(capsys, [*base, "--cache-warmup-steps", "0", "--out", str(tmp_path / "c.csv")])
    cc = cold["configurations"][0]
    rd = step_reads(tr, cc["capacity"], 40, Policy(shared_cache_bytes="1M", cache_policy="lru"))
    assert cc["row_cache"]["cache_warmup_steps"] == 0
    assert cc["row_cache"]["hit_rate_at_capacity"] == pytest.approx(rd.shared_hits / rd.requests, abs=1e-12)
    warm = step_reads(tr, cc["capacity"], 40,
                      Policy(shared_cache_bytes="1M", cache_policy="lru", cache_warmup_steps=40))
    assert cc["row_cache"]["other_start"] == {"cache_warmup_steps": 40,
                                              "hit_rate": pytest.approx(warm.shared_hits / warm.requests, abs=1e-12)}
    assert "empty at the start of each probe" in cc["assumptions"]
    assert cc["row_cache"]["note"] == (
        f"row cache starts empty in each probe: hit rate {cc['row_cache']['hit_rate_at_capacity']:.4f} in the probe "
        f"of {cc['capacity']} sessions x 40 steps against {cc['row_cache']['other_start']['hit_rate']:.4f} once "
        f"warmed by 40 steps a session; {grows}: warm it first (--cache-warmup-steps N, a study's "
        "cache_warmup_steps)")
    none = capacity_json(capsys, ["--device", SLOW, "--limit", "600", "--steps", "40",
                                  "--out", str(tmp_path / "n.csv")])
    assert none["configurations"][0]["row_cache"] is None
    assert "row cache" not in none["configurations"][0]["assumptions"]
    # the text output says the cache line under the capacity
    assert main(["sim", "capacity", *base, "--out", str(tmp_path / "w.csv"), *SEARCH[:-1]]) == 0
    out = capsys.readouterr().out
    assert f"capacity  the configuration: {n} sessions (1 seed); random phases\n          {rc['note']}\n" in out
    assert "searched with 1 seed up to 24 sessions" in out


@pytest.mark.parametrize("argv, msg", [
    (["--cache-policy", "lru"], "--cache-policy takes effect only with --shared-cache-bytes SIZE"),
    (["--cache-warmup-steps", "10"], "--cache-warmup-steps takes effect only with --shared-cache-bytes SIZE"),
    (["--shared-cache-bytes", "0", "--cache-warmup-steps", "10"], "--cache-warmup-steps takes effect only with"),
    (["--shared-cache-bytes", "1M", "--cache-warmup-steps", "-1"], "--cache-warmup-steps must be >= 0, got -1"),
    (["--shared-cache-bytes", "100"], "argument --shared-cache-bytes: size '100' (100 bytes) holds no row"),
])
def test_row_cache_flags_without_a_cache_or_out_of_range_are_refused(capsys, tmp_path, argv, msg):
    out = tmp_path / "c.csv"
    args = ["sim", "capacity", *argv, "--out", str(out), "--max-sessions", "4", "--seeds", "1"]
    if msg.startswith("argument "):  # a size is checked as it is parsed: argparse's usage and its one error line
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "Traceback" not in err and msg in err.strip().splitlines()[-1]
    else:
        assert msg in cli(capsys, args)
    assert not list(tmp_path.iterdir())


def test_a_capacity_of_0_says_why(capsys, tmp_path):
    """A rate-limited volume given without iops: its drive is assumed to be as slow as the cap (3,000 IOPS), so one
    session's 48 reads a step take 16 ms against the 2.99 ms the target leaves: the answer 0 says so, with the
    probe's own figures and the device's assumptions; a capacity above 0 says nothing of the kind."""
    dev = ["--device", "volume:qd1_us=500,cap_iops=3000", "--limit", "300", "--steps", "40"]
    doc = capacity_json(capsys, [*dev, "--out", str(tmp_path / "z.csv")])
    c = doc["configurations"][0]
    (probe,) = read_capacity(tmp_path / "z.csv")[1]
    assert c["capacity"] == 0 and probe["sessions"] == 1 and probe["reads_per_step"] == 48.0
    why = c["zero_capacity_reason"]
    assert why.startswith(f"one session alone decodes at {probe['session_tokens_per_s_min']:.2f} tokens/s (slowest), "
                          f"under the target of 20: its steps wait {probe['stall_mean_ms']:.2f} ms on average for "
                          "their 48.0 reads, against the 2.99 ms a step the target leaves after 47.01 ms of compute; "
                          "the volume's bucket (3,000 IOPS, 300 reads deep) lets a step's 48.0 reads through to its "
                          "drive, which reads them in 16.00 ms at the least at its peak of 3,000 IOPS; the device "
                          "assumes "), why
    assert "iops = 3000, assumed: the raw drive's IOPS is the cap" in why
    assert "burst_ios = 300, assumed: cap_iops x 0.1 s" in why
    assert why.endswith("(engram sim device volume:qd1_us=500,cap_iops=3000 shows every rule)")
    assert main(["sim", "capacity", *dev, "--out", str(tmp_path / "z.csv"), *SEARCH[:-1]]) == 0
    assert f"0 sessions (1 seed); random phases\n          why 0: {why}\n" in capsys.readouterr().out
    assert capacity_json(capsys, ["--device", FAST, "--limit", "300", "--steps", "40", "--out",
                                  str(tmp_path / "f.csv")])["configurations"][0]["zero_capacity_reason"] is None


def test_trace_warnings_are_said_once_a_configuration_naming_it(capfd, caplog, tmp_path):
    """Sessions sharing a short trace under a shared cache: the warning is said once for each configuration, by the
    search, naming the configuration and the count it holds at (the share of the probe there), not by each worker
    process of the probes."""
    import logging

    from sim.core.params import Policy
    from sim.decode.reads import wrap_info
    from sim.trace import load_trace

    study = tmp_path / "shared.toml"
    study.write_text(f'''
[study]
name = "shared"
seed = 0

[capacity]
seeds = 2
max_sessions = 24

[fixed]
device = "{SLOW}"
trace_limit = 150
steps = 100
compute = "reference"
shared_cache_rows = 3971

[grid]
drives = [1, 2]
''', encoding="utf-8")
    caplog.set_level(logging.WARNING)
    assert main(["sim", "capacity", str(study), "--jobs", "2", "--quiet", "--json", "--out", str(tmp_path / "c.csv")]) == 0
    got = capfd.readouterr()
    doc = json.loads(got.out)
    assert "share their trace" not in got.err  # the workers said nothing
    said = [r.getMessage() for r in caplog.records if "share their trace" in r.getMessage()]
    assert all(r.name == "sim.capacity" for r in caplog.records if "share their trace" in r.getMessage())
    tr = load_trace("stdlib:asyncio/base_events.py", limit=150)
    want = []
    for i, c in enumerate(doc["configurations"]):
        n = c["capacity"]
        share = wrap_info(tr, n, 100, Policy(shared_cache_rows=3971))["shared_positions"]
        assert n > 1 and c["warnings"] == [
            f"at {n} sessions: sessions share their trace: {share:.0%} of the sessions' steps read a stretch another "
            "session also reads, so the shared row cache hits rows independent sessions would not share: use a trace "
            "of at least sessions x steps tokens"]
        want.append(f"configuration {i} (drives={c['drives']}): {c['warnings'][0]}")
    assert said == want


def test_a_capacity_set_by_sessions_in_lockstep_says_so(capfd, tmp_path):
    """fio of this VM's disk (512-byte reads), 16 readers, 47 ms of compute: constant, the probes at the capacity
    and one past it read in lockstep (sim.decode.model.lockstep_warning) and the configuration's warnings say so
    with the count; with a cv of 0.02 nothing is said of it, and the capacity is higher."""
    fio = Path(__file__).parent / "data" / "fio-disk-randread-512.json"
    got = {}
    for cv in (0.0, 0.02):
        study = tmp_path / f"lock-{cv}.toml"
        study.write_text(f'''
[study]
name = "lock"
seed = 0

[capacity]
seeds = 1
max_sessions = 24

[fixed]
device = "fio:{fio},assume_bs=512"
readers = 16
compute_ms = 47.0
compute_dist = "normal"
compute_cv = {cv}
steps = 200
''', encoding="utf-8")
        assert main(["sim", "capacity", str(study), "--jobs", "1", "--quiet", "--json",
                     "--out", str(tmp_path / f"c-{cv}.csv")]) == 0
        got[cv] = json.loads(capfd.readouterr().out)["configurations"][0]
    c, d = got[0.0], got[0.02]
    locked = [w for w in c["warnings"] if "read in lockstep" in w]
    assert locked and all(re.match(r"at \d+ sessions: the sessions read in lockstep", w) for w in locked)
    assert {int(w.split()[1]) for w in locked} <= {c["capacity"], c["capacity"] + 1}
    assert not any("lockstep" in w for w in d["warnings"]) and d["capacity"] > c["capacity"]


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
    prog = SearchProgress(bound, list(caps), "capacity", "lines", output=ProgressOutput(stream=out, interval=0.0))
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


def test_a_fio_device_says_the_host_cpus_its_reads_keep_busy(capsys, tmp_path):
    """A device from fio JSON with CPU figures (the disk's: 22.752 us a read at QD1): the answer says the CPUs
    the probes' reads at the capacity keep busy, reads/s x 22.752 us, and that with fewer than twice that the host
    binds first (HOST_BOUND_SHARE 0.5); a datasheet device, with no CPU figure, says nothing of the host."""
    import csv
    from pathlib import Path

    disk = Path(__file__).parent / "data" / "fio-disk-randread-4k.json"
    # target 15, not the search's 20: at 20 (2.99 ms a step for reads) this disk holds 0 or 1 sessions, as the
    # seeded phases fall (they are drawn from the configuration's text, the file's path in it), and at 0 there is
    # no probe at the capacity to report; at 15 it holds about 20 wherever the checkout lies
    assert SEARCH[:2] == ["--target", "20"]
    assert main(["sim", "capacity", "--device", f"fio:{disk}", "--out", str(tmp_path / "f.csv"), "--target", "15",
                 *SEARCH[2:]]) == 0
    doc = json.loads(capsys.readouterr().out)
    c = doc["configurations"][0]
    assert c["capacity"] >= 5
    (row,) = list(csv.DictReader(open(tmp_path / "f.csv")))
    rps = float(row["reads_per_s_at_capacity"])
    busy = rps * (0.832501 + 20.679321) / 100 * 3.003 / 28393
    assert rps > 0 and (f"at {c['capacity']} sessions the probes read {rps:,.0f} reads/s, which keep {busy:.2f} "
                        f"CPUs busy in the host's read path alone at fio's 22.8 us of CPU a read") in c["assumptions"]
    assert f"with fewer than {busy / 0.5:.2f} CPUs the host binds before the drive" in c["assumptions"]
    doc = capacity_json(capsys, ["--device", FAST, "--out", str(tmp_path / "b.csv")])  # a datasheet: no CPU figure
    said = doc["configurations"][0]["assumptions"]
    assert "CPUs busy" not in said and "the host's CPUs not modelled (the drive alone: --host-cpus N" in said


def test_an_earlier_default_table_is_refused_not_overwritten(tmp_path, capsys, monkeypatch):
    """Without --out the search writes capacity.csv in the current directory: a second run there is refused in
    one line naming the file, the --out that replaces it and the --resume that continues it, and leaves the
    earlier table as it was; with --out named it is replaced, with --resume --out continued."""
    monkeypatch.chdir(tmp_path)
    argv = ["sim", "capacity", "--device", SLOW, "--limit", "100", "--steps", "20", "--seeds", "1",
            "--max-sessions", "4", "--jobs", "1", "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert {"capacity.csv", "capacity.csv.probes.csv"} <= set(before)
    err = cli(capsys, argv)
    assert err.endswith("capacity.csv exists (an earlier capacity search): give --out capacity.csv to replace it, "
                        "--resume --out capacity.csv to continue it, or another --out"), err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / "capacity.csv").unlink()  # the probes alone are an earlier search too
    assert "capacity.csv.probes.csv exists" in cli(capsys, argv)
    assert main([*argv, "--out", "capacity.csv", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*argv, "--out", "capacity.csv", "--resume", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["resumed_probes"] == first["configurations"][0]["probes"] > 0
    assert answers(again) == answers(first)
    # a study file's default table is its own name's, resumed without --out
    study = tmp_path / "mine.toml"
    study.write_text('[study]\nname = "mine"\n[capacity]\ntarget = 20.0\nseeds = 1\nmax_sessions = 4\n'
                     '[fixed]\ntrace_limit = 100\nsteps = 20\ncompute = "reference"\n')
    assert main(["sim", "capacity", str(study), "--jobs", "1", "--quiet"]) == 0
    err = cli(capsys, ["sim", "capacity", str(study), "--jobs", "1", "--quiet"])
    assert err.endswith("mine.csv exists (an earlier capacity search): give --out mine.csv to replace it, "
                        "--resume to continue it, or another --out"), err
    assert main(["sim", "capacity", str(study), "--jobs", "1", "--quiet", "--resume"]) == 0


def test_a_bracketed_search_says_its_probes_and_the_session_steps_to_go():
    """The progress of a bracketed search (the 3.4 M-IOPS SSD of benchmarks/bench_capacity.py: probes of 1,
    3541 (failed) and 3540 sessions of 300 steps): probes done with their session-steps, the fewest still needed
    (two probes of about 3,541 sessions after the first: a pass or a failure there cannot close the bracket;
    one after the failure: 3,540 passing closes it) and their time at the assumed rate, then at the rate the
    round of many sessions measured; the first probe's round is too small to measure a rate."""
    out = io.StringIO()
    key = (0, 0)
    prog = WorkProgress([key], {key: 300}, "capacity", "lines", asked={key: 1}, resolution=1, max_sessions=4096,
                        output=ProgressOutput(stream=out, interval=0.0))
    with prog:
        prog.ran(300, 0.5)
        prog.note("probe of configuration 0, seed 0: 1 sessions")
        prog.answered(key, 1, True)
        prog.asked(key, 3541)
        prog.retotal()
        prog.ran(3541 * 300, 15.0)
        prog.note("probe of configuration 0, seed 0: 3541 sessions")
        prog.answered(key, 3541, False)
        prog.asked(key, 3540)
        prog.retotal()
        prog.ran(3540 * 300, 15.0)
        prog.note("probe of configuration 0, seed 0: 3540 sessions")
        prog.answered(key, 3540, True)
        prog.finished(key, "configuration 0, seed 0: 3540 sessions (3 probes)")
        prog.retotal()
    lines = out.getvalue().splitlines()
    assert lines[0] == "capacity: 0 probes (0 session-steps) done after 0 s; the 1-session probe first: its reads " \
                       "give the knee's estimate and the work to go"
    after = r" done after \d+ s; "
    assumed = f"about {2_124_600 / ASSUMED_SESSION_STEPS_PER_S:.0f} s left at {ASSUMED_SESSION_STEPS_PER_S:,.0f}"
    assert re.fullmatch(r"capacity: 1 probe \(300 session-steps\)" + after + r"at least 2 more probes \(2,124,600 "
                        r"session-steps\), " + assumed + r" session-steps a second \(assumed: no probe of "
                        r"many sessions has finished yet\); last: probe of configuration 0, seed 0: 1 sessions",
                        lines[1]), lines[1]
    assert assumed == "about 21 s left at 100,000"  # 2,124,600 session-steps at the assumed 100,000 a second
    rate = 3541 * 300 / 15.0  # 70,820 session-steps a second: 1,062,000 to go take 15.0 s
    assert re.fullmatch(r"capacity: 2 probes \(1,062,600 session-steps\)" + after + r"at least 1 more probe "
                        r"\(1,062,000 session-steps\), about 15 s left at 70,820 session-steps a second \(measured\); "
                        r"last: probe of configuration 0, seed 0: 3541 sessions", lines[2]), lines[2]
    assert f"{rate:,.0f}" == "70,820"
    assert re.fullmatch(r"capacity: 3 probes \(2,124,600 session-steps\) done after \d+ s; last: configuration 0, "
                        r"seed 0: 3540 sessions \(3 probes\)", lines[3]), lines[3]
    assert re.fullmatch(r"capacity: 3 probes \(2,124,600 session-steps\) in \d+ s", lines[-1]), lines[-1]
    assert len(lines) == 5
    assert prog.bar.n == prog.bar.total == 2_124_600


def test_a_bracketed_search_prints_its_progress(capsys):
    """find_capacity's bracketed search goes through WorkProgress: its lines name probes and session-steps."""
    base = {k: v[1] for k, v in AXES.items()}
    base.update(trace_limit=100, steps=20, compute="reference", threshold=8, readers=16, device=SLOW)
    (cap,), _ = find_capacity([base], CapacitySpec(seeds=1, max_sessions=24), run=SearchRun(jobs=1, progress="lines"))
    err = capsys.readouterr().err.strip().splitlines()
    work = sum(int(p["sessions"]) for p in cap.probes) * 20
    assert err[0].startswith("capacity: 0 probes (0 session-steps) done after 0 s; the 1-session probe first")
    assert re.fullmatch(rf"capacity: {len(cap.probes)} probes \({work:,} session-steps\) in \d+ s", err[-1]), err


def test_a_sustained_search_finds_the_cap_not_the_burst(capsys, tmp_path):
    """The capped volume whose burst outlasts the probes, searched with --sustained (every probe starts with the
    bucket drained): the capacity is the sustained one, floor(cap_iops / (reads a step x target)) -- the cap of
    20,000 reads/s over the probes' reads a step at 20 tokens/s -- or one session under it (the sessions' reads
    come in bursts at random phases), below the burst's answer; the answer says how it was probed; a resumed
    table of the other kind is refused."""
    dev = ["--device", "ssd:qd1_us=80,iops=500000,cap_iops=20000,burst_ios=50000"]
    burst = capacity_json(capsys, [*dev, "--out", str(tmp_path / "a.csv")])["configurations"][0]
    doc = capacity_json(capsys, [*dev, "--sustained", "--out", str(tmp_path / "s.csv")])
    c = doc["configurations"][0]
    probes = read_capacity(tmp_path / "s.csv")[1]
    at = next(p for p in probes if p["sessions"] == c["capacity"])
    bound = int(np.floor(20000 / (at["reads_per_step"] * 20.0) + 1e-9))
    assert bound - 1 <= c["capacity"] <= bound < burst["capacity"], (c["capacity"], bound, burst["capacity"])
    assert at["reads_per_s"] <= 20000 * 1.001  # the cap holds: no burst credit carried the probe
    assert doc["capacity"]["sustained"] is True
    assert "drained at the start of every probe (sustained: no burst credit)" in c["assumptions"]
    assert f"bounding it at {bound} sessions" in c["assumptions"]
    err = cli(capsys, ["sim", "capacity", *dev, "--out", str(tmp_path / "s.csv"), "--resume", *SEARCH[:-1]])
    assert "probes of a search with --sustained" in err


def test_the_time_left_counts_the_probes_that_run_side_by_side():
    """Two searches on two workers: a round of two probes of 1,000 sessions x 100 steps in 1 s is 100,000
    session-steps a second a probe; while both searches are open they run side by side (200,000 a second),
    once one has returned the other's last probe runs alone (100,000)."""
    out = io.StringIO()
    prog = WorkProgress(["a", "b"], {"a": 100, "b": 100}, "capacity", "lines", asked={"a": 1, "b": 1}, workers=2,
                        output=ProgressOutput(stream=out, interval=0.0))
    with prog:
        prog.ran(200, 0.1, 2)
        for k in "ab":
            prog.answered(k, 1, True)
            prog.asked(k, 1000)
        prog.retotal()
        assert prog.to_go() == (4, 400_000) and prog.rate() == (2 * ASSUMED_SESSION_STEPS_PER_S, False)
        prog.ran(200_000, 1.0, 2)
        assert prog.rate() == (200_000.0, True)
        for k in "ab":
            prog.answered(k, 1000, False)
        prog.asked("a", 999)
        prog.finished("b")
        prog.retotal()
        assert prog.to_go() == (1, 99_900) and prog.rate() == (100_000.0, True)
    assert "at least 1 more probe (99,900 session-steps), about 1 s left at 100,000 session-steps a second " \
           "(measured)" in out.getvalue().splitlines()[-2]


def test_the_host_of_the_command_line_binds_the_capacity(capsys, tmp_path):
    """--host-cpus (engram sim decode's option; the study axes host_cpus, host_step_us, host_read_us): one CPU and
    10 ms of the engine's CPU a step (no read CPU) let the sessions take at most 1 / 10 ms = 100 steps/s in all, so
    at 20 tokens/s each at most 5 sessions, and fewer where the queue's wait counts (mean-value analysis); the drive
    alone carries the search's top.  The same study file gives the same answers; the answer says the host it
    modelled."""
    base = ["--device", FAST, "--compute-ms", "5", "--steps", "40"]
    alone = capacity_json(capsys, [*base, "--out", str(tmp_path / "alone.csv")])
    assert alone["configurations"][0]["capacity"] == 24 and alone["configurations"][0]["lower_bound"]
    host = ["--host-cpus", "1", "--host-step-us", "10000", "--host-read-us", "0"]
    flags = capacity_json(capsys, [*base, *host, "--out", str(tmp_path / "host.csv")])
    (c,) = flags["configurations"]
    assert 3 <= c["capacity"] <= 5 and not c["lower_bound"]
    wake = engine_profile()["wake_us"]  # the profile's: the drive's step wakes its readers on idle CPUs
    said = (f"1 CPU; the engine's 1e+04 us a step (given); 0.0 us a read (given); a step's wake-up {wake:.0f} us x "
            "the CPUs' idle share (the profile's: its readers' batch after the step's sleep over back to back)")
    assert c["host"] == {"cpus": 1.0, "step_cpu_us": 10000.0, "read_cpu_us": 0.0, "spin_us": 0.0,
                         "wake_us": pytest.approx(wake), "sessions": "threads", "source": said}
    assert alone["configurations"][0]["host"] is None
    assert f"the host modelled (sim.decode.host): {said}" in c["assumptions"]
    study = _study(tmp_path / "host.toml", 'compute = ""\ncompute_ms = 5.0\ntrace_limit = 1000\nhost_cpus = 1.0\n'
                   'host_step_us = 10000.0\nhost_read_us = 0.0', f'device = ["{FAST}"]')
    toml = capacity_json(capsys, [str(study), "--out", str(tmp_path / "toml.csv")])
    assert answers(toml) == answers(flags)


@pytest.mark.parametrize("argv, msg", [
    (["--host-step-us", "100"], "--host-step-us takes effect only with --host-cpus N"),
    (["--host-read-us", "5"], "--host-read-us takes effect only with --host-cpus N"),
    (["--host-cpus", "0"], "--host-cpus = 0.0: expected a finite number in [0.01, 65536]"),
    (["--host-cpus", "0.001"], "--host-cpus = 0.001: expected a finite number in [0.01, 65536]"),
    (["--host-cpus", "nan"], "--host-cpus = nan: expected a finite number in [0.01, 65536]"),
    (["--host-cpus", "2", "--host-step-us", "-1"], "--host-step-us = -1.0: expected a finite number in [0, 6e+07]"),
    (["--host-cpus", "2", "--host-read-us", "1e300"],
     "--host-read-us = 1e+300: expected a finite number in [0, 6e+07]"),
    (["--host-cpus", "4", "--host-read-us", "6e7"], "host_step_us + 48 x host_read_us = 2.88e+09 us"),
])
def test_bad_host_flags_of_a_capacity_are_refused(capsys, tmp_path, argv, msg):
    out = tmp_path / "c.csv"
    assert msg in cli(capsys, ["sim", "capacity", *argv, "--out", str(out), "--max-sessions", "4", "--seeds", "1"])
    assert not list(tmp_path.iterdir())


def test_the_fewest_host_cpus_are_searched(capsys, tmp_path):
    """--host-cpus 0.01 (MIN_CPUS, the fewest the flag's range allows) is searched, not refused by the host's own
    check (which excluded 0.01 and named HostCPU.cpus) after the probes' table was opened."""
    doc = capacity_json(capsys, ["--device", FAST, "--compute-ms", "5", "--steps", "20", "--host-cpus", "0.01",
                                 "--out", str(tmp_path / "c.csv")])
    (c,) = doc["configurations"]
    assert c["host"]["cpus"] == 0.01 and c["capacity"] >= 0 and "error" not in c


def test_sessions_as_processes_carry_fewer_sessions_where_the_host_binds(capsys, tmp_path):
    """--host-sessions processes: each session's step and reads take the profile's process_cpu_ratio times the
    CPU; where the host's CPUs bind first the capacity is smaller, and the host says so in --json."""
    base = ["--device", FAST, "--compute-ms", "5", "--steps", "40", "--host-cpus", "0.25"]
    threads = capacity_json(capsys, [*base, "--out", str(tmp_path / "t.csv")])["configurations"][0]
    procs = capacity_json(capsys, [*base, "--host-sessions", "processes", "--out", str(tmp_path / "p.csv")])
    (p,) = procs["configurations"]
    assert "sessions as processes" in p["host"]["source"] and "processes" not in threads["host"]["source"]
    assert p["host"]["step_cpu_us"] > threads["host"]["step_cpu_us"]
    assert 0 < p["capacity"] < threads["capacity"]
    # the same draws for both (sim.sweep.study.UNSEEDED_AXES): threads named or not, the same answer and probes
    named = capacity_json(capsys, [*base, "--host-sessions", "threads", "--out", str(tmp_path / "n.csv")])
    keep = ("capacity", "per_seed", "probes")
    assert {k: named["configurations"][0][k] for k in keep} == {k: threads[k] for k in keep}
    assert point_seed(3, {"a": 1, "host_sessions": "processes"}) == point_seed(3, {"a": 1}) != point_seed(3, {"a": 2})


@pytest.mark.parametrize("fixed, msg", [
    ("host_step_us = 100.0", "host_step_us go with host_cpus = N"),
    ("host_cpus = 100000.0", "host_cpus = 100000.0: expected a finite number in [0.01, 65536]"),
    ("host_cpus = 2.0\nhost_read_us = -3.0", "host_read_us = -3.0: expected a finite number in [0, 6e+07]"),
    ("host_cpus = 4.0\nhost_read_us = 5e6", "host_step_us + 48 x host_read_us = 2.4e+08 us: a step of 48 reads"),
    ('host_sessions = "processes"', "host_sessions go with host_cpus = N"),
    ('host_cpus = 2.0\nhost_sessions = "forks"', "host_sessions = 'forks': expected one of threads, processes"),
    # within the bound as threads, past it as processes (the profile's ratio)
    ('host_cpus = 2.0\nhost_read_us = 1000000.0\nhost_sessions = "processes"',
     "(host_step_us + 48 x host_read_us) x 1.28 (host_sessions = processes: the profile's process_cpu_ratio)"),
])
def test_bad_host_axes_of_a_study_are_refused(capsys, tmp_path, fixed, msg):
    study = _study(tmp_path / "bad.toml", fixed, f'device = ["{FAST}"]')
    err = cli(capsys, ["sim", "capacity", str(study), "--out", str(tmp_path / "c.csv")])
    assert msg in err and "bad.toml" in err
    assert not (tmp_path / "c.csv").exists()


def test_a_coarse_resolution_says_the_bracket_the_search_ended_with(capsys, tmp_path):
    """At --resolution R the search stops once the count that passed and the one that failed are R apart or
    less: the capacity is only known to lie between them.  The answer said the count that passed alone ("1
    session" at --resolution 1000, where nothing above 1 was probed); it says the bracket, in the text and in
    --json (``bracket``: [passed, failed - 1], or up to --max-sessions where none failed; [N, null] for a pass
    at --max-sessions), and an exact search (--resolution 1) reads as before."""
    slow = ["--device", SLOW, "--compute-ms", "5", "--steps", "40"]
    exact = capacity_json(capsys, [*slow, "--out", str(tmp_path / "r1.csv")])["configurations"][0]
    assert exact["capacity"] == 20 and exact["bracket"] == [20, 20]
    coarse = capacity_json(capsys, [*slow, "--resolution", "4", "--out", str(tmp_path / "r4.csv")])
    (c,) = coarse["configurations"]
    assert c["capacity"] == 20 and c["bracket"] == [20, 23] and coarse["capacity"]["resolution"] == 4
    fast = ["--device", FAST, "--compute-ms", "5", "--steps", "40"]
    top = capacity_json(capsys, [*fast, "--out", str(tmp_path / "top.csv")])["configurations"][0]
    assert top["capacity"] == 24 and top["lower_bound"] and top["bracket"] == [24, None]
    wide = capacity_json(capsys, [*fast, "--resolution", "1000", "--out", str(tmp_path / "w.csv")])
    assert wide["configurations"][0]["capacity"] == 1 and wide["configurations"][0]["bracket"] == [1, 24]
    text = [a for a in SEARCH if a != "--json"]
    for argv, line in (
            ([*slow, "--resolution", "4"], "capacity  the configuration: between 20 and 23 sessions (1 seed; "
                                           "resolution 4: 20 passed, 24 failed); random phases"),
            ([*fast, "--resolution", "1000"], "capacity  the configuration: between 1 and 24 sessions (1 seed; "
                                              "resolution 1000: 1 passed, none probed above it up to 24); "
                                              "random phases"),
            (slow, "capacity  the configuration: 20 sessions (1 seed); random phases")):
        assert main(["sim", "capacity", *argv, *text, "--out", str(tmp_path / "t.csv")]) == 0
        out = capsys.readouterr().out
        assert line in out.splitlines(), out
        for f in tmp_path.glob("t.csv*"):
            f.unlink()


def test_a_capacity_says_what_its_device_assumed(capsys, tmp_path):
    """A datasheet device's assumed figures (a cv of 0.5 where no cv or p99_us is given) are said beside its
    capacity, in the text and in --json; a fio device, whose spread is measured, assumes none."""
    fio = str(Path(__file__).parent / "data" / "fio-disk-randread-4k.json")
    doc = capacity_json(capsys, ["--device", FAST, "--device", fio, "--compute-ms", "5", "--steps", "20",
                                 "--out", str(tmp_path / "c.csv")])
    by = {c["device"]: c for c in doc["configurations"]}
    assert by[FAST]["device_assumed"] == ["cv = 0.5 (no cv or p99_us given): not a measurement"]
    assert by[fio]["device_assumed"] == []
    text = [a for a in SEARCH if a != "--json"]
    assert main(["sim", "capacity", "--device", FAST, "--compute-ms", "5", "--steps", "20",
                 "--out", str(tmp_path / "t.csv"), *text]) == 0
    out = capsys.readouterr().out
    assert f"device    {FAST}: assumed, not measured: cv = 0.5 (no cv or p99_us given): not a measurement" in out
