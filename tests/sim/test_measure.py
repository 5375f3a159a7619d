"""sim.measure: compute specs, configurations and grids, the real decode loop, microbenchmarks, the whole run."""

from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest

from engram import ArgumentError, EngramModel, FormatError, Hasher, synth
from tests.modelfiles import SCALE, token_map as _token_map
from sim.io import load_json
from sim.measure import (DEFAULT_TRACES, Background, compute_microbench, compute_runner, decode_run, default_grid,
                         ensure_model, fio_microbench, grid, hash_microbench, io_microbench, is_quiet, measure,
                         quick_grid, segments, trace_tokens_needed)
from sim.schema import MICRO_SCHEMA, RUNS_SCHEMA, ComputeSpec, RunConfig, trace_label
from sim.trace import CODE_SOURCE, load_trace


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("measure") / "m.gguf"
    synth.build_model(path, scale=SCALE, token_map=_token_map(), progress=False, projections=False, seed=5)
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
    assert len(g) == 29 >= 24 and len({c.key for c in g}) == 29
    assert {c.trace for c in g} == set(DEFAULT_TRACES)
    assert {c.threshold for c in g} == {8, 256} and {c.backend for c in g} == {"pread", "io_uring"}
    assert {c.readers for c in g if not c.serial} == {4, 16}
    assert {c.compute: sum(x.compute == c.compute for x in g) for c in g} == {"spin:2": 17, "none": 10, "mixer": 2}
    assert {c.steps for c in g if c.compute == "none"} == {800}
    assert [c.steps for c in g if c.trace.endswith(".jsonl")] == [100, 100]
    assert [c.steps for c in g if c.compute == "mixer"] == [30, 30]
    assert len(quick_grid()) == 6


def test_default_grid_fits_its_traces(layout):
    """Every run of the default grid (7 rounds) reads its own stretch: each trace is long enough."""
    need = trace_tokens_needed(default_grid(), 7)
    assert need["shared:prompts.jsonl"] == 1400 and need[CODE_SOURCE] == 5 * 7 * 200
    assert need["shared:agent_prompt_long.txt"] == 5 * 7 * (800 + 200)
    for spec, n in need.items():
        assert load_trace(spec, limit=n, layout=layout).steps == n, spec


def test_segments_are_disjoint():
    cfgs = [RunConfig("a.txt", 8, "pread", 4, "none", 10), RunConfig("b.txt", 8, "pread", 4, "none", 7),
            RunConfig("a.txt", 256, "pread", 4, "none", 5)]
    seg = segments(cfgs, 2)
    assert seg == {(0, 0): 0, (1, 0): 0, (2, 0): 10, (0, 1): 15, (1, 1): 7, (2, 1): 25}
    assert trace_tokens_needed(cfgs, 2) == {"a.txt": 30, "b.txt": 14}


# ------------------------------------------------------------------ decode loop
@pytest.mark.parametrize("threshold, backend", [(8, "pread"), (8, "io_uring"), (256, "pread")])
def test_decode_run_reads_the_trace_rows(model, threshold, backend):
    from engram import available_backends

    if backend not in available_backends():
        pytest.skip(f"{backend} not built")
    tr = load_trace(CODE_SOURCE, limit=70, layout=model.layout)
    cfg = RunConfig(CODE_SOURCE, threshold, backend, 4, "spin:0.2", 60)
    r = decode_run(model, tr, cfg, warmup=5)
    assert r["rows_match"] and r["steps"] == 60
    for k in ("step_us", "read_us", "compute_us"):
        assert len(r[k]) == 60
    step, read, comp = (np.array(r[k]) for k in ("step_us", "read_us", "compute_us"))
    assert np.all(read + comp <= step + 0.05) and np.all(comp >= 200)
    assert r["tokens_per_s"] == pytest.approx(60 / r["wall_s"])
    assert 60 / r["tokens_per_s"] >= step.sum() * 1e-6
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
    r = decode_run(model, tr, RunConfig("shared:prompts.jsonl", 8, "pread", 4, "none", 120), warmup=4)
    assert r["rows_match"] and r["start"] == 0
    # a stretch starting inside a prompt replays the prompt's last tokens first
    inside = int(tr.starts[3]) + 2
    r = decode_run(model, tr, RunConfig("shared:prompts.jsonl", 8, "pread", 4, "none", 20), start=inside, warmup=0)
    assert r["rows_match"] and r["start"] == inside


def test_decode_run_continues_the_text(model):
    tr = load_trace(CODE_SOURCE, limit=200, layout=model.layout)
    for start in (1, 2, 3, 77, 150):
        r = decode_run(model, tr, RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 50), start=start, warmup=1)
        assert r["rows_match"] and r["steps"] == 50, start
    with pytest.raises(ArgumentError, match="from step 151"):
        decode_run(model, tr, RunConfig(CODE_SOURCE, 256, "pread", 4, "none", 50), start=151)


def test_decode_run_needs_enough_tokens(model):
    tr = load_trace(CODE_SOURCE, limit=20, layout=model.layout)
    with pytest.raises(ArgumentError, match="has 20 tokens"):
        decode_run(model, tr, RunConfig(CODE_SOURCE, 8, "pread", 4, "none", 30))


# --------------------------------------------------------------- microbenchmarks
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
    assert {r["kind"] for r in micro["records"]} == {"io", "compute", "hash"}
    assert sorted({r["round"] for r in micro["records"]}) == [0, 1]
    assert not any("step_us" in r for r in micro["records"])
    assert {r["compute"] for r in micro["records"] if r["kind"] == "compute"} == {"spin:0.2", "none"}
    assert [c["key"] for c in runs["configs"]] == [c.key for c in cfgs]
    assert sorted((r["config"], r["round"]) for r in runs["runs"]) == sorted(
        (c.key, k) for c in cfgs for k in (0, 1))
    assert all(r["rows_match"] for r in runs["runs"])
    # every run read its own stretch of the trace
    assert sorted(r["start"] for r in runs["runs"]) == [0, 25, 50, 75]
    think = [r for r in micro["records"] if r.get("think")]
    # two chunks a round of the compute between batches; four chunks of serial batches (read by the serial run)
    assert [(r["think"], r["backend"], r["qd"]) for r in think] == [("spin:0.2", "pread", 4)] * 4
    serial48 = [r for r in micro["records"] if r.get("backend") == "serial" and r.get("batch_rows") == 48
                and not r.get("think")]
    assert len(serial48) == 8 and sorted(r.get("chunk", 0) for r in serial48) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert not any(r.get("backend") == "pread" and r.get("chunk") for r in micro["records"] if not r.get("think"))
    assert len(think[0]["batch_us"]) == 4 and min(think[0]["think_us"]) >= 200
    assert (tmp_path / runs["traces"][CODE_SOURCE]).is_file()
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
    synth.build_model(path, scale=SCALE, token_map=_token_map(), progress=False, seed=2)
    m = EngramModel.open(path)
    for lid in m.layer_ids:
        m.weights(lid)
    tr = load_trace(CODE_SOURCE, limit=20, layout=m.layout)
    r = decode_run(m, tr, RunConfig(CODE_SOURCE, 8, "pread", 4, "mixer", 12), warmup=2)
    assert r["rows_match"] and min(r["compute_us"]) > 1000
    (rec,) = compute_microbench(m, ["mixer"], mixer_samples=3)
    assert len(rec["samples_us"]) == 3 and min(rec["samples_us"]) > 1000
