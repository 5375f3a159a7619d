"""sim.measure: compute specs, configurations and grids, the real decode loop, microbenchmarks, the whole run."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time

import numpy as np
import pytest

from engram import ArgumentError, EngramModel, FormatError, Hasher, synth
from engram.backends import usable_backends
from tests.modelfiles import SCALE, token_map as _token_map
from sim.core.io import load_json
from sim.measure import (MEASURED_CAPACITY_COMPUTE, DEFAULT_TRACES, SESSION_COUNTS, Background, cache_check,
                         compute_microbench, compute_runner, decode_run, default_grid, ensure_model, fio_microbench,
                         grid, hash_microbench, io_microbench, io_shared, is_quiet, measure, quick_grid,
                         probe_record, segments, session_grid, sessions_run, trace_tokens_needed, usable_configs)
from sim.measure import DecodeLoop, Settings
from sim.measure.microbench import open_tables
from sim.measure.runs import session_loop
from sim.core.schema import MAX_BLAS, MAX_EMULATED_MS, MICRO_SCHEMA, RUNS_SCHEMA, ComputeSpec, RunConfig, trace_label
from sim.trace import CODE_SOURCE, load_trace


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("measure") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=5),
                      synth.Fill(projections=False), progress=False)
    return path


@pytest.fixture(scope="module")
def model(model_path):
    return EngramModel.open(model_path)


# ------------------------------------------------------------------ compute specs
@pytest.mark.parametrize("text, label, mixer, extra", [
    ("none", "none", False, ()),
    ("mixer", "mixer", True, ()),
    ("spin:2", "spin:2", False, (("spin", 2.0),)),
    ("spin:2.50", "spin:2.5", False, (("spin", 2.5),)),
    (" mixer + sleep:1 ", "mixer+sleep:1", True, (("sleep", 1.0),)),
    ("blas:3+spin:0.5", "blas:3+spin:0.5", False, (("blas", 3), ("spin", 0.5))),
])
def test_compute_spec_parse(text, label, mixer, extra):
    c = ComputeSpec.parse(text)
    assert (c.mixer, c.extra, c.label) == (mixer, extra, label)
    assert ComputeSpec.parse(c.label) == c


@pytest.mark.parametrize("bad", ["", "gpu:3", "spin", "spin:x", "spin:-1", "blas:1.5", "spin:nan"])
def test_compute_spec_rejects(bad):
    with pytest.raises(ArgumentError):
        ComputeSpec.parse(bad)


@pytest.mark.parametrize("bad, part", [("sleep:60001", "sleep:60001"), ("sleep:1e300", "sleep:1e300"),
                                       ("mixer+spin:1e9", "spin:1e9"), ("blas:100001", "blas:100001"),
                                       ("blas:1e15", "blas:1e15")])
def test_compute_spec_bounds(bad, part):
    """An amount past a step's bound is refused when parsed (sleep:1e300 used to fail at the first step with
    OverflowError, sleep:1e9 to sleep for 11.6 days); the bounds themselves are taken."""
    with pytest.raises(ArgumentError, match=rf"{part} is past the bound of"):
        ComputeSpec.parse(bad)
    assert ComputeSpec.parse(f"sleep:{MAX_EMULATED_MS}+blas:{MAX_BLAS}").extra == (("sleep", 60000.0), ("blas", 100000))


def test_compute_runners_do_their_work():
    rows = {1: np.zeros((24, 256), np.float32)}
    for spec, at_least in (("spin:3", 3e-3), ("sleep:2", 2e-3), ("spin:1+sleep:1", 2e-3)):
        run = compute_runner(ComputeSpec.parse(spec))
        t0 = time.perf_counter()
        run(rows)
        assert time.perf_counter() - t0 >= at_least, spec
    assert compute_runner("none")(rows) is None
    compute_runner(ComputeSpec.parse("blas:2"))(rows)
    with pytest.raises(ArgumentError, match="mixer"):
        compute_runner("mixer")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's (prctl)")
def test_an_emulated_sleep_runs_with_a_tight_timer_slack():
    """The sleep compute sets its thread's timer slack to 1 ns (sleep:5 lasted 5.120 ms at the 50 us default,
    5.074 at 1 ns), in the thread that sleeps and not in others."""
    from sim.measure.compute import PR_SET_TIMERSLACK, SLEEP_SLACK_NS, _PRCTL, timer_slack_ns
    if _PRCTL is None:
        pytest.skip("prctl cannot be loaded here")
    out = {}
    main_before = timer_slack_ns()

    def worker():
        _PRCTL(PR_SET_TIMERSLACK, 50_000, 0, 0, 0)  # the kernel's default, whatever this thread inherited
        out["before"] = timer_slack_ns()
        compute_runner("sleep:0.1")({})
        out["after"] = timer_slack_ns()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out["before"] == 50_000
    assert out["after"] == SLEEP_SLACK_NS
    assert timer_slack_ns() == main_before  # another thread's sleeps leave this one's slack alone


# ------------------------------------------------------------- configurations
def test_run_config_key_parse_and_dict():
    c = RunConfig(CODE_SOURCE, 8, "io_uring", 16, "spin:2.0", 120)
    assert c.compute == "spin:2" and not c.serial
    assert c.key == "base_events/t8/io_uring/r16/spin:2/120"
    assert RunConfig.parse(f"{CODE_SOURCE}/8/io_uring/16/spin:2/120") == c
    assert RunConfig.parse("shared:prompts.jsonl/256/pread/4", steps=77) == \
        RunConfig("shared:prompts.jsonl", 256, "pread", 4, "none", 77)
    assert RunConfig.parse("shared:x.txt/8/pread/4/mixer") == RunConfig("shared:x.txt", 8, "pread", 4, "mixer", 300)
    assert RunConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert RunConfig(CODE_SOURCE, 49, "pread", 4).serial and not RunConfig(CODE_SOURCE, 48, "pread", 4).serial
    for bad in ("a/b", "x/8/nvme/4", "x/eight/pread/4", "x/8/pread/4/none/many"):
        with pytest.raises(ArgumentError):
            RunConfig.parse(bad)
    with pytest.raises(ArgumentError):
        RunConfig(CODE_SOURCE, 8, "aio", 4)
    with pytest.raises(ArgumentError):
        RunConfig(CODE_SOURCE, 0, "pread", 4)
    with pytest.raises(FormatError):
        RunConfig.from_dict({"trace": "x"})
    assert trace_label("shared:promessi_sposi.txt") == "promessi_sposi"
    assert trace_label("stdlib:asyncio/base_events.py") == "base_events"


def test_grid_drops_duplicate_serial_configurations():
    g = grid(["a.txt", "b.txt"], [8, 256], ["pread", "io_uring"], [4, 16], ["none", "spin:2"], 50,
             {"spin:2": 20})
    # per trace and compute: 2 backends x 2 readers concurrent + 1 serial
    assert len(g) == 2 * 2 * 5 == len({c.key for c in g})
    serial = [c for c in g if c.serial]
    assert len(serial) == 4 and all(c.backend == "pread" and c.readers == 4 for c in serial)
    assert {c.steps for c in g if c.compute == "spin:2"} == {20} and {c.steps for c in g if c.compute == "none"} == {50}


def test_default_grid_covers_the_axes():
    g = default_grid()
    assert len(g) == 40 and len({c.key for c in g}) == 40
    single = [c for c in g if c.compute != MEASURED_CAPACITY_COMPUTE]
    assert len(single) == 29 and {c.trace for c in g} == set(DEFAULT_TRACES)
    assert {c.threshold for c in g} == {8, 256} and {c.backend for c in g} == {"pread", "io_uring"}
    assert {c.readers for c in g if not c.serial} == {4, 16}
    assert {c.compute: sum(x.compute == c.compute for x in single) for c in single} == \
        {"spin:2": 17, "none": 10, "mixer": 2}
    assert {c.steps for c in g if c.compute == "none"} == {800}
    assert [c.steps for c in g if c.trace.endswith(".jsonl")] == [100, 100]
    assert [c.steps for c in g if c.compute == "mixer"] == [30, 30]
    multi = [c for c in g if c.compute == MEASURED_CAPACITY_COMPUTE]
    assert sorted((c.mode, c.sessions) for c in multi) == sorted(
        [("threads", n) for n in SESSION_COUNTS] + [("processes", n) for n in SESSION_COUNTS if n > 1])
    assert len(quick_grid()) == 10 and sum(c.multi for c in quick_grid()) == 4


def test_default_grid_fits_its_traces(layout):
    """Every run of the default grid (7 rounds) reads its own stretch: each trace is long enough."""
    need = trace_tokens_needed(default_grid(), 7)
    assert need["shared:prompts.jsonl"] == 1400 and need[CODE_SOURCE] == 5 * 7 * 200
    assert need[DEFAULT_TRACES[0]] == 7 * (5 * 200 + 5 * 800 + 2 * 30 + 150 * (2 * sum(SESSION_COUNTS) - 1))
    assert need["shared:agent_prompt_long.txt"] == 5 * 7 * (800 + 200)
    for spec, n in need.items():
        assert load_trace(spec, limit=n, layout=layout).steps == n, spec


def test_segments_are_disjoint():
    cfgs = [RunConfig("a.txt", 8, "pread", 4, "none", 10), RunConfig("b.txt", 8, "pread", 4, "none", 7),
            RunConfig("a.txt", 256, "pread", 4, "none", 5)]
    seg = segments(cfgs, 2)
    assert seg == {(0, 0): 0, (1, 0): 0, (2, 0): 10, (0, 1): 15, (1, 1): 7, (2, 1): 25}
    assert trace_tokens_needed(cfgs, 2) == {"a.txt": 30, "b.txt": 14}
    # several sessions take one stretch each
    cfgs.append(RunConfig("a.txt", 8, "pread", 4, "none", 5, 3, "processes"))
    seg = segments(cfgs, 2)
    assert seg[(3, 0)] == 15 and seg[(0, 1)] == 30 and seg[(3, 1)] == 45
    assert trace_tokens_needed(cfgs, 2)["a.txt"] == 60


def test_usable_configs_keep_only_backends_that_start():
    cfgs = [RunConfig("a.txt", 8, "io_uring", 4), RunConfig("a.txt", 256, "io_uring", 4),
            RunConfig("a.txt", 256, "pread", 4), RunConfig("a.txt", 8, "pread", 4, "none", 300, 2, "processes")]
    kept, left = usable_configs(cfgs, ("pread",))
    # the serial io_uring configuration becomes the pread one (a duplicate, dropped); the concurrent one is left out
    assert [c.key for c in kept] == ["a/t256/pread/r4/none/300", "a/t8/pread/r4/none/300/x2-processes"]
    assert [c.key for c in left] == ["a/t8/io_uring/r4/none/300"]
    assert usable_configs(cfgs, ("pread", "io_uring"))[0] == cfgs


def test_run_config_sessions_in_key_and_dict():
    c = RunConfig(CODE_SOURCE, 8, "pread", 4, "sleep:5", 100, 8, "processes")
    assert c.multi and c.key.endswith("/sleep:5/100/x8-processes")
    assert RunConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert not RunConfig(CODE_SOURCE, 8, "pread", 4).multi
    for bad in ({"sessions": 0}, {"mode": "fibers"}):
        with pytest.raises(ArgumentError):
            RunConfig(CODE_SOURCE, 8, "pread", 4, **bad)
    g = session_grid(CODE_SOURCE, 10, (1, 2))
    assert [x.key.split("/", 5)[-1] for x in g] == ["10", "10/x2-threads", "10/x2-processes"]


# ------------------------------------------------------------------ decode loop
@pytest.mark.parametrize("threshold, backend", [(8, "pread"), (8, "io_uring"), (256, "pread")])
def test_decode_run_reads_the_trace_rows(model, threshold, backend):
    from engram.backends import probe_backends

    if not probe_backends()[backend].usable:
        pytest.skip(f"{backend} does not start here: {probe_backends()[backend].reason}")
    tr = load_trace(CODE_SOURCE, limit=70, layout=model.layout)
    cfg = RunConfig(CODE_SOURCE, threshold, backend, 4, "spin:0.2", 60)
    r = decode_run(model, tr, cfg, DecodeLoop(warmup=5))
    assert r["rows_match"] and r["steps"] == 60
    for k in ("step_us", "read_us", "compute_us"):
        assert len(r[k]) == 60
    step, read, comp = (np.array(r[k]) for k in ("step_us", "read_us", "compute_us"))
    assert np.all(read + comp <= step + 0.05) and np.all(comp >= 200)
    # the steps run back to back: each from the end of the one before, so they add up to the loop's wall time
    assert r["tokens_per_s"] == pytest.approx(60 / (step.sum() * 1e-6), rel=1e-5)
    assert step.sum() * 1e-6 == pytest.approx(r["wall_s"], abs=1e-4)
    assert r["concurrent_steps"] == (60 if threshold == 8 else 0)
    assert 40 <= r["rows_distinct_mean"] <= 48
    assert r["step_ms"]["p50"] == pytest.approx(np.median(step) / 1e3, rel=1e-3)


def test_decode_run_restarts_history_per_sequence(model, shared_data):
    tr = load_trace("shared:prompts.jsonl", limit=130, layout=model.layout)
    assert tr.starts.size > 3
    # the trace's rows are those of a fresh history at every prompt
    h = Hasher(model.layout, model.token_map)
    a, b = int(tr.starts[1]), int(tr.starts[2])
    assert np.array_equal(tr.rows[a:b], h.hash(tr.tokens[a:b]))
    r = decode_run(model, tr, RunConfig("shared:prompts.jsonl", 8, "pread", 4, "none", 120), DecodeLoop(warmup=4))
    assert r["rows_match"] and r["start"] == 0
    # a stretch starting inside a prompt replays the prompt's last tokens first
    inside = int(tr.starts[3]) + 2
    r = decode_run(model, tr, RunConfig("shared:prompts.jsonl", 8, "pread", 4, "none", 20),
                   DecodeLoop(start=inside, warmup=0))
    assert r["rows_match"] and r["start"] == inside


def test_decode_run_continues_the_text(model):
    tr = load_trace(CODE_SOURCE, limit=200, layout=model.layout)
    for start in (1, 2, 3, 77, 150):
        r = decode_run(model, tr, RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 50),
                       DecodeLoop(start=start, warmup=1))
        assert r["rows_match"] and r["steps"] == 50, start
    with pytest.raises(ArgumentError, match="from step 151"):
        decode_run(model, tr, RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 50), DecodeLoop(start=151))


def test_decode_run_needs_enough_tokens(model):
    tr = load_trace(CODE_SOURCE, limit=20, layout=model.layout)
    with pytest.raises(ArgumentError, match="has 20 tokens"):
        decode_run(model, tr, RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 30))


# --------------------------------------------------------------- microbenchmarks
@pytest.mark.parametrize("field, value", [("start", -1), ("warmup", 1.5), ("probe_every", -2), ("warmup", True)])
def test_decode_loop_refuses_a_bad_value(field, value):
    with pytest.raises(ArgumentError, match=f"{field} must be a whole number >= 0, got {value!r}"):
        DecodeLoop(**{field: value})


def test_io_microbench_records(model):
    recs = io_microbench(model.info, backends=("pread",), depths=(1, 4), batches=6, big_seconds=0.01,
                         single_rows=10, seed=1)
    kinds = [(r["backend"], r["qd"], r["batch_rows"]) for r in recs]
    assert kinds == [("serial", 1, 48), ("serial", 1, 1), ("pread", 4, 48), ("pread", 4, 4096 // 48 * 48)]
    s48, one, b48, big = recs
    assert len(s48["batch_us"]) == 6 and s48["rows"] == 288 and 6 * 48 >= s48["reads"] >= 6 * 40
    assert len(one["batch_us"]) == 10 and all(x > 0 for x in one["batch_us"])
    assert big["batches"] >= 2 and big["reads_per_s"] == pytest.approx(big["reads"] / big["wall_s"])
    assert all(r["kind"] == "io" and r["tool"] == "engine" for r in recs)
    # deterministic rows: the same seed reads the same rows (same read counts)
    again = io_microbench(model.info, backends=("pread",), depths=(4,), batches=6, big_seconds=0.0, seed=1,
                          single_rows=1)
    assert again[0]["reads"] == s48["reads"]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed")
def test_fio_microbench(model):
    (r,) = fio_microbench(model.info, [2], seconds=0.15)
    assert r["tool"] == "fio" and r["qd"] == 2 and r["iops"] > 0 and r["mean_us"] > 0
    assert "--direct=1" in r["cmd"] and "--iodepth=2" in r["cmd"]
    assert r["p1_us"] <= r["p50_us"] <= r["p99_us"]


def test_compute_and_hash_microbench(model):
    recs = compute_microbench(model, ["none", "spin:0.5", "spin:0.50"], samples=8)
    assert [r["compute"] for r in recs] == ["none", "spin:0.5"]
    assert len(recs[1]["samples_us"]) == 8 and min(recs[1]["samples_us"]) >= 500
    h = hash_microbench(model, samples=50)
    assert h["kind"] == "hash" and len(h["samples_us"]) == 50 and 0 < np.median(h["samples_us"]) < 1000


# ------------------------------------------------------------------ whole runs
def test_measure_writes_both_documents(model_path, tmp_path):
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "spin:0.2", 25), RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 25)]
    res = measure(model_path, cfgs, tmp_path, rounds=2, depths=(1, 4), fio=False, io_batches=4, io_chunks=4,
                  think_batches=4, big_seconds=0.01, single_rows=5, compute_samples=5, warmup=3, progress=False)
    assert res["runs_done"] == 4 and res["configs"] == 2
    micro = load_json(tmp_path / "microbench.json", "microbench")
    runs = load_json(tmp_path / "runs.json", "decode_runs")
    assert micro["schema"] == MICRO_SCHEMA and runs["schema"] == RUNS_SCHEMA
    assert {r["kind"] for r in micro["records"]} == {"io", "compute", "hash", "cache"}
    assert sorted({r["round"] for r in micro["records"]}) == [0, 1]
    assert not any("step_us" in r for r in micro["records"])
    assert {r["compute"] for r in micro["records"] if r["kind"] == "compute"} == {"spin:0.2", "none"}
    assert [c["key"] for c in runs["configs"]] == [c.key for c in cfgs]
    assert sorted((r["config"], r["round"]) for r in runs["runs"]) == sorted(
        (c.key, k) for c in cfgs for k in (0, 1))
    assert all(r["rows_match"] for r in runs["runs"])
    # every run read its own stretch of the trace
    assert sorted(r["start"] for r in runs["runs"]) == [0, 25, 50, 75]
    # every run's probe steps are one record of its window: 25 steps are too few for one probe every 2nd step
    # (13 + 1 < PROBES_MIN), so one before every step and after the last: 26
    for run in runs["runs"]:
        (probe,) = [r for r in micro["records"] if r.get("probe") == run["window"]]
        assert probe["tool"] == "session" and probe["every"] == 1 and run["probe_steps"] == 26
        assert len(probe["batch_us"]) == len(probe["compute_us"]) == 26 and probe["session_steps"] == 51
        assert min(probe["compute_us"]) >= (200 if "spin" in run["config"] else 0)
    micro["records"] = [r for r in micro["records"] if not r.get("probe")]
    think = [r for r in micro["records"] if r.get("think")]
    # two chunks a round of the compute between batches; four chunks of serial batches (read by the serial run)
    assert [(r["think"], r["backend"], r["qd"]) for r in think] == [("spin:0.2", "pread", 4)] * 4
    serial48 = [r for r in micro["records"] if r.get("backend") == "serial" and r.get("batch_rows") == 48
                and not r.get("think")]
    assert len(serial48) == 8 and sorted(r.get("chunk", 0) for r in serial48) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert not any(r.get("backend") == "pread" and r.get("chunk") for r in micro["records"] if not r.get("think"))
    assert len(think[0]["batch_us"]) == 4 and min(think[0]["think_us"]) >= 200
    assert (tmp_path / runs["traces"][CODE_SOURCE]).is_file()
    assert runs["backends"]["usable"] and runs["backends"] == micro["backends"] and runs["complete"]
    assert runs["file"]["path"] == str(model_path.resolve()) and len(runs["file"]["tables"]) == 2
    with pytest.raises(FormatError, match="decode_runs"):
        load_json(tmp_path / "microbench.json", "decode_runs")
    only = measure(model_path, cfgs[:1], tmp_path / "m", rounds=1, depths=(2,), decode=False, fio=False,
                   io_batches=2, big_seconds=0.0, single_rows=2, compute_samples=2, progress=False)
    assert only["runs"] is None and not (tmp_path / "m" / "runs.json").exists()
    with pytest.raises(ArgumentError):
        measure(model_path, [], tmp_path / "e", progress=False)


def test_background_sees_other_processes_not_ours(model_path):
    import subprocess
    import sys

    bg = Background(model_path)
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 5\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.2)
        got = bg.sample(0.6)
    finally:
        child.kill()
        child.wait()
    # one busy process of ours-not: about one core of the machine's
    assert got["cpu"] >= 0.6 / (os.cpu_count() or 1) and got["seconds"] >= 0.6
    assert not is_quiet(got, 0.25 / (os.cpu_count() or 1), 1e9)
    assert is_quiet({"cpu": 0.1, "disk_iops": 50.0}, 0.25, 200)
    assert not is_quiet({"cpu": 0.1, "disk_iops": 500.0}, 0.25, 200)
    assert is_quiet(None, 0.0, 0.0) and is_quiet({"cpu": None, "disk_iops": None}, 0.0, 0.0)


def test_measure_waits_for_and_records_the_background(model_path, tmp_path):
    cfgs = [RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 20)]
    res = measure(model_path, cfgs, tmp_path, rounds=1, depths=(2,), fio=False, io_batches=3, big_seconds=0.0,
                  single_rows=2, compute_samples=2, warmup=1, progress=False, max_background_cpu=1.0,
                  max_background_iops=1e9, quiet_wait=1.0, redo=1, wait_budget=3.0)
    assert 0 <= res["waited_s"] <= 5
    runs = load_json(tmp_path / "runs.json")
    (run,) = runs["runs"]
    assert run["background"]["attempt"] == 0 and run["background"]["cpu"] >= 0
    assert run["reads"] >= 20 * 40 and runs["params"]["max_background_cpu"] == 1.0
    micro = load_json(tmp_path / "microbench.json")
    assert all("background" in r for r in micro["records"])


def test_ensure_model(model_path, tmp_path):
    assert ensure_model(model_path, SCALE) == model_path
    with pytest.raises(ArgumentError, match="scale"):
        ensure_model(model_path, 0.001)
    with pytest.raises(ArgumentError, match="no model file"):
        ensure_model(tmp_path / "none.gguf", SCALE, build=False)


@pytest.mark.heavy
def test_decode_run_with_the_mixer(tmp_path):
    path = tmp_path / "mixer.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=2), progress=False)
    m = EngramModel.open(path)
    for lid in m.layer_ids:
        m.weights(lid)
    tr = load_trace(CODE_SOURCE, limit=20, layout=m.layout)
    r = decode_run(m, tr, RunConfig(CODE_SOURCE, 8, "pread", 4, "mixer", 12), DecodeLoop(warmup=2))
    assert r["rows_match"] and min(r["compute_us"]) > 1000
    (rec,) = compute_microbench(m, ["mixer"], mixer_samples=3)
    assert len(rec["samples_us"]) == 3 and min(rec["samples_us"]) > 1000


# ------------------------------------------------------------------ several sessions
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_sessions_run_reads_distinct_stretches(model, mode):
    tr = load_trace(CODE_SOURCE, limit=200, layout=model.layout)
    cfg = RunConfig(CODE_SOURCE, 8, "pread", 2, "sleep:1", 30, 3, mode)
    r = sessions_run(model, tr, cfg, DecodeLoop(start=50, warmup=2), stagger=0.003)
    assert r["rows_match"] and r["sessions"] == 3 and r["mode"] == mode
    assert r["starts"] == [50, 80, 110] and len(r["session_tokens_per_s"]) == 3
    assert r["slowest_tokens_per_s"] == min(r["session_tokens_per_s"])
    assert r["tokens_per_s"] == pytest.approx(np.mean(r["session_tokens_per_s"]))
    assert r["aggregate_tokens_per_s"] == pytest.approx(sum(r["session_tokens_per_s"]))
    # the phases: session i starts about i * stagger / 3 after the first, never before it
    off = r["start_offsets_s"]
    assert off[0] == 0.0 or min(off) == 0.0
    assert off[2] >= 0.0015 and r["stagger_s"] == 0.003
    assert len(r["step_us"]) == 90 and min(r["compute_us"]) >= 1000
    assert r["threads"] >= 3 and r["concurrent_steps"] == 90
    with pytest.raises(ArgumentError, match="need 90"):
        sessions_run(model, tr, cfg, DecodeLoop(start=150))


def test_shared_reads_and_cache_check(model):
    rec = io_shared(model.info, np.random.default_rng(1), "pread", 2, 3, 0.05, 0)
    assert rec["qd"] == 6 and rec["submitters"] == 3 and rec["readers"] == 2 and rec["batch_rows"] == 48
    assert rec["batches"] >= 3 and rec["reads"] >= 3 * 40 and rec["reads_per_s"] == pytest.approx(
        rec["reads"] / rec["wall_s"])
    tables = open_tables(model.info)
    try:
        c = cache_check(tables, np.random.default_rng(3), 6, 0)
        assert c["kind"] == "cache" and len(c["cold_us"]) == len(c["warm_us"]) == 6
        assert c["warm_over_cold"] == pytest.approx(np.mean(c["warm_us"]) / np.mean(c["cold_us"]), rel=1e-3)
    finally:
        for t in tables:
            t.close()


# ------------------------------------------------------------------ probe steps
@pytest.mark.parametrize("backend", ["pread", pytest.param("io_uring", marks=pytest.mark.skipif(
    "io_uring" not in usable_backends(), reason="io_uring does not start on this machine (engram info)"))])
def test_probe_steps_interleaved_with_the_trace_steps(model, backend):
    """Probe steps (random token ids) sit before every 3rd trace step and after the last; the trace steps still read
    the trace's rows (the history is restored around each probe), and trace and probe steps add up to the loop."""
    tr = load_trace(CODE_SOURCE, limit=60, layout=model.layout)
    cfg = RunConfig(CODE_SOURCE, 8, backend, 4, "sleep:1", 10)
    r = session_loop(model, tr, cfg, DecodeLoop(start=20, warmup=2, probe_every=3, probe_seed=7))
    assert r["rows_match"] and r["step_s"].size == 10 and r["probe_read_s"].size == 5  # before 0, 3, 6, 9 and 10
    assert np.all(np.diff(r["probe_t"]) > 0) and r["probe_t"][0] == 0.0
    assert r["probe_comp_s"].min() >= 1e-3 and np.all(r["probe_distinct"] > 40)  # fresh random rows, ~48 distinct
    total = r["step_s"].sum() + r["probe_read_s"].sum() + r["probe_comp_s"].sum()
    assert total == pytest.approx(r["t_end"] - r["t_first"], abs=1e-4)
    rec = probe_record(cfg, "r1-c3", 1, [r], 3)
    assert rec["probe"] == "r1-c3" and rec["tool"] == "session" and rec["kind"] == "io" and rec["every"] == 3
    assert rec["session_steps"] == 15 and rec["offsets_s"] == [0.0] and rec["sessions"] == 1
    assert rec["batch_us"] == pytest.approx(r["probe_read_s"] * 1e6, abs=0.01)
    assert rec["rows"] == int(r["probe_distinct"].sum()) and rec["compute"] == "sleep:1"
    assert probe_record(cfg, "w", 0, [session_loop(model, tr, cfg, DecodeLoop(start=20, warmup=1))], 0) is None
    run = decode_run(model, tr, cfg, DecodeLoop(start=20, warmup=1, probe_every=3))
    assert run["probe_steps"] == 5 and run["probe_every"] == 3 and len(run["_probe"]) == 1
    assert run["tokens_per_s"] == pytest.approx(10 / (np.sum(run["step_us"]) * 1e-6), rel=1e-4)


def test_probe_steps_of_several_sessions(model):
    tr = load_trace(CODE_SOURCE, limit=200, layout=model.layout)
    cfg = RunConfig(CODE_SOURCE, 8, "pread", 2, "sleep:1", 12, 2, "threads")
    run = sessions_run(model, tr, cfg, DecodeLoop(start=10, warmup=1, probe_every=4, probe_seed=3), stagger=0.002)
    assert run["rows_match"] and run["probe_steps"] == 4
    rec = probe_record(cfg, "r0-c2", 0, run["_probe"], 4)
    assert rec["sessions"] == 2 and rec["session"] == [0] * 4 + [1] * 4 and len(rec["t_us"]) == 8
    assert rec["offsets_s"] == pytest.approx(run["start_offsets_s"]) and rec["session_steps"] == 16
    # each session's probe times count from the first session's start
    assert rec["t_us"][4] == pytest.approx(rec["offsets_s"][1] * 1e6, abs=1.0)


def test_cache_and_size_warnings():
    from sim.measure.run import cache_warnings, size_warnings

    assert cache_warnings([{"kind": "cache", "cold_us": [4000.0], "warm_us": [1000.0], "warm_over_cold": 0.25}])
    assert not cache_warnings([{"kind": "cache", "cold_us": [1000.0], "warm_us": [990.0], "warm_over_cold": 0.99}])

    class Info:
        tables = {1: type("T", (), {"rows": 1000})()}

    assert "small against" in size_warnings(Info, {"memory_bytes": 2**30})[0]
    assert size_warnings(Info, {"memory_bytes": None}) == []


def test_fio_failure_says_why(model, tmp_path, monkeypatch):
    """A fio that fails prints its exit status and what it said (never an empty message)."""
    from engram import TableIOError

    fake = tmp_path / "fio"
    fake.write_text("#!/bin/sh\necho 'fio: engine io_uring not loadable' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(TableIOError, match=r"\(qd 16\): exit status 3; fio said: fio: engine io_uring not loadable"):
        fio_microbench(model.info, [16], seconds=0.1)
    fake.write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(TableIOError, match=r"exit status 1; fio printed nothing"):
        fio_microbench(model.info, [16], seconds=0.1)


def test_measure_multi_session_and_left_out_backends(model_path, tmp_path):
    """Run with the ring refused (ENGRAM_DISABLE_IO_URING=1, in a process of its own): the io_uring configuration
    is left out, with the reason, in both documents; the several-session runs are measured."""
    import subprocess
    import sys

    code = f"""
import json
from sim.measure import measure
from sim.core.schema import RunConfig
cfgs = [RunConfig({CODE_SOURCE!r}, 8, "io_uring", 4, "none", 20),
        RunConfig({CODE_SOURCE!r}, 8, "pread", 2, "sleep:1", 20, 2, "threads")]
res = measure({str(model_path)!r}, cfgs, {str(tmp_path)!r}, rounds=1, depths=(1, 2), fio=False, io_batches=3,
              big_seconds=0.0, single_rows=2, compute_samples=3, warmup=1, probe_every=4, shared_seconds=0.02,
              cache_batches=3, progress=False)
print(json.dumps(res["backends"]))
"""
    env = dict(os.environ, ENGRAM_DISABLE_IO_URING="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    be = json.loads(out.stdout.strip().splitlines()[-1])
    assert be["usable"] == ["pread"] and "ENGRAM_DISABLE_IO_URING" in be["left_out"]["io_uring"]
    assert be["configs_left_out"] == ["base_events/t8/io_uring/r4/none/20"]
    runs = load_json(tmp_path / "runs.json")
    micro = load_json(tmp_path / "microbench.json")
    assert runs["backends"] == micro["backends"] == be
    (run,) = runs["runs"]
    # 20 steps a session are too few for a probe every 4th (PROBES_MIN): one before every step and after the last
    assert run["sessions"] == 2 and run["rows_match"] and run["window"] == "r0-c0" and run["probe_every"] == 1
    (probe,) = [r for r in micro["records"] if r.get("probe")]
    assert probe["probe"] == "r0-c0" and probe["sessions"] == 2 and len(probe["batch_us"]) == 2 * 21
    shared = [r for r in micro["records"] if r.get("submitters")]
    assert [(r["backend"], r["qd"]) for r in shared] == [("pread", 4)]
    assert micro["params"]["backends"] == ["pread"]


def test_measure_refuses_an_unwritable_folder(model_path, tmp_path):
    from engram import TableIOError

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who writes anywhere (root)")
        with pytest.raises(TableIOError, match=str(ro)):
            measure(model_path, [RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 5)], ro, rounds=1, fio=False,
                    progress=False)
    finally:
        ro.chmod(0o700)


# ------------------------------------------------------------------ the row cache on
@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_decode_run_with_the_row_cache(model, policy):
    """A run with the cache on: the trace steps' measured hit rate is the one predicted by replaying the same
    stretch through the same policy, exactly (warm-up and probe steps go past the cache)."""
    from engram import RowCache

    tr = load_trace("shared:agent_prompt_long.txt", limit=700, layout=model.layout)
    cfg = RunConfig("shared:agent_prompt_long.txt", 8, "pread", 4, "none", 600)
    plain = decode_run(model, tr, cfg, DecodeLoop(start=50, warmup=3, probe_every=20))
    r = decode_run(model, tr, cfg, DecodeLoop(start=50, warmup=3, probe_every=20, cache=RowCache(264 * 3000, policy)))
    c = r["row_cache"]
    assert "row_cache" not in plain and r["rows_match"]
    assert c["requests"] == 600 * 48 and c["policy"] == policy and c["rows"] == 3000
    assert c["hits"] == c["predicted_hits"] > 0 and c["hit_rate"] == c["predicted_hit_rate"]
    assert r["rows_distinct_mean"] < plain["rows_distinct_mean"]


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_sessions_run_with_the_row_cache(model, mode):
    from engram import RowCache

    tr = load_trace("shared:agent_prompt_long.txt", limit=700, layout=model.layout)
    cfg = RunConfig("shared:agent_prompt_long.txt", 8, "pread", 2, "none", 200, 3, mode)
    r = sessions_run(model, tr, cfg, DecodeLoop(start=50, warmup=2, cache=RowCache(264 * 4000, "lru")), stagger=0.0)
    c = r["row_cache"]
    assert c["shared"] == (mode == "threads") and c["requests"] == 3 * 200 * 48
    # processes: each session its own cache, exact; threads: one cache, the sessions' order is the machine's
    assert abs(c["hit_rate"] - c["predicted_hit_rate"]) <= (0.01 if mode == "threads" else 0.0)


def test_measure_settings_check_the_cache():
    from engram import CachePolicyError, CacheSizeError

    assert Settings(cache_bytes="1M").run_cache().capacity == (1 << 20) // 264
    assert Settings().run_cache() is None
    with pytest.raises(CacheSizeError):
        Settings(cache_bytes=100)
    with pytest.raises(ArgumentError, match="cache_policy"):
        Settings(cache_bytes="1M", cache_policy="fifo")
    assert issubclass(CachePolicyError, ArgumentError)


def test_others_share_stays_a_share():
    from sim.measure.background import others_share

    # 2 CPUs, 1 s: others busy 1.5 CPU-seconds of 2.0 -> 0.75
    assert others_share(1.7, 0.2, 1.0, 2) == pytest.approx(0.75)
    # a tick-coarse window on a saturated machine: 2.03 busy over 1 s of 2 CPUs, none ours -> held at 1
    assert others_share(2.03, 0.0, 1.0, 2) == 1.0
    # this process counted more than the machine's ticks show (counters read at other instants) -> 0
    assert others_share(0.10, 0.12, 1.0, 2) == 0.0
