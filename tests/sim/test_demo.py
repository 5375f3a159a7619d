"""The main job: ``engram demo`` end to end (a quick run by default; the full run is marked heavy)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest

from engram import Layout
from engram.backends import usable_backends
from engram.cli import main
from engram.errors import ArgumentError
from sim.cli.demo import DemoMeasurement, DemoSize, demo_grid, run_demo
from sim.core.schema import RunConfig

FIGURES = ("seed_reproduction", "predicted_vs_measured", "capacity_measured", "threshold", "readers", "devices",
           "step_cdf", "cache", "reuse", "reuse_rate", "capacity", "planner", "sweep_demo_0", "sweep_demo_1")
SECTIONS = ("Answer: concurrent sessions each device sustains", "Other headline figures", "Seed reproduction",
            "The run", "Predicted vs measured", "Tokens/s by threshold", "Tokens/s by readers", "Step-latency CDFs",
            "Reuse and row caches", "Capacity: how the report searched it",
            "What a planner can buy: drives, a shared cache, DRAM, the tail", "Study: demo",
            "Inputs, calibration and tables")


def check_report(md: Path) -> str:
    """Every section and figure of the demo's report, each with its numbers."""
    text = md.read_text()
    for head in SECTIONS:
        assert f"## {head}" in text, head
    for name in FIGURES:
        png = md.parent / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"figures/{name}.png" in text, name
        with open(md.parent / "data" / f"{name}.csv") as f:
            assert len(list(csv.reader(f))) >= 2, name
    for name in ("calibration.json", "crosscheck.json", "demo.json", "runs_summary.csv", "sweep-demo.csv"):
        assert (md.parent / "inputs" / name).is_file(), name
    assert (md.with_suffix(".html")).is_file()
    return text


def test_demo_grid():
    main_t, other = "stdlib:pydoc_data/topics.py", "stdlib:asyncio/base_events.py"
    g = demo_grid(main_t, [other], 200)
    assert all(isinstance(c, RunConfig) for c in g) and len({c.key for c in g}) == len(g) == 33
    multi = [c for c in g if c.compute == "sleep:5"]
    assert sorted((c.mode, c.sessions) for c in multi) == sorted(
        [("threads", n) for n in (1, 2, 4, 8, 16, 32)] + [("processes", n) for n in (2, 4, 8, 16, 32)])
    g = [c for c in g if c not in multi]
    on_main = [c for c in g if c.trace == main_t]
    assert sorted({c.threshold for c in on_main}) == [8, 48, 49, 256]
    for be in ("pread", "io_uring"):
        assert sorted(c.readers for c in on_main if c.backend == be and c.threshold == 8 and c.compute == "none") \
            == ([1, 2, 4, 8, 16, 32])
    assert {c.compute for c in on_main} == {"none", "spin:2", "mixer"}
    assert [c.steps for c in on_main if c.compute == "mixer"] == [30, 30]
    assert sorted((c.threshold, c.backend) for c in g if c.trace == other) == [(8, "io_uring"), (8, "pread"),
                                                                               (256, "pread")]
    q = demo_grid(main_t, [other], 40, quick=True)
    assert len(q) == 11 and all(c.steps == 40 for c in q) and sum(c.multi for c in q) == 4
    # only the backends that start: io_uring refused leaves its concurrent configurations out
    p = demo_grid(main_t, [other], 40, quick=True, backends=("pread",))
    assert {c.backend for c in p} == {"pread"} and len(p) == 9


def test_quick_demo(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "report"
    t0 = time.perf_counter()
    assert main(["demo", "--quick", "--scale", "0.0005", "--steps", "20", "--jobs", "1", "--no-fio",
                 "--workdir", str(work), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out / 'report.md'}" in printed  # says where the report is
    for step in ("[1/9] traces", "[2/9] model", "[3/9] lookups", "[4/9] measure", "[5/9] calibrate",
                 "[6/9] crosscheck", "[7/9] devices", "[8/9] sweep", "[9/9] report"):
        assert step in printed, step
    # planner mode reads the fio beside each device's runs: without fio the devices step says why it is skipped
    assert "skipped: planner mode predicts from the fio beside each device's runs, and fio is turned off" in printed
    text = check_report(out / "report.md")
    demo = json.loads((work / "demo.json").read_text())
    assert demo["lookups"]["rows_verified"] and demo["lookups"]["tokens"] == 4
    assert all(0 < g < 1 for r in demo["lookups"]["records"] for layer in r["gates"] for g in layer)
    assert [s["name"] for s in demo["steps"]] == ["traces", "model", "lookups", "measure", "calibrate",
                                                  "crosscheck", "devices", "sweep", "report"]
    assert demo["devices"]["built"] == []
    # one configuration again through the engine's row cache, cross-checked: predicted from its misses
    rc = demo["row_cache"]
    assert rc["policy"] == "tinylfu" and rc["bytes"] == 4 << 20 and rc["hit_rate_max_abs_error"] <= 0.01
    assert rc["tokens_per_s"]["predicted"] > 0 and "row cache" in printed
    assert demo["model"]["rows"] == [int(r) for r in Layout.deepseek_v41_flash(scale=0.0005).rows]
    assert demo["model"]["build_s"] > 0
    runs = json.loads((work / "runs.json").read_text())
    usable = tuple(b for b in ("pread", "io_uring") if b in usable_backends())
    assert len(runs["configs"]) == len(demo_grid("m", ["o"], 20, quick=True, backends=usable))
    assert all(r["rows_match"] for r in runs["runs"])
    # the backends that do not start here are left out, with the reason, everywhere
    left = {b for b in ("pread", "io_uring") if b not in usable}
    assert set(demo["backends"]["left_out"]) == left == set(runs["backends"]["left_out"])
    xc = json.loads((work / "crosscheck.json").read_text())
    assert left <= set(xc["backends"]["left_out"]) and demo["backends"]["study_backends"] == sorted(usable)
    for b in left:
        assert f"{b} left out" in printed
    # several sessions measured and predicted, and the capacity of each mode
    assert {(r["sessions"], r["mode"]) for r in xc["session_rows"]} == {(2, "threads"), (4, "threads"),
                                                                        (2, "processes"), (4, "processes")}
    assert [c["mode"] for c in xc["capacity"]] == ["threads", "processes"] == [c["mode"] for c in demo["capacity"]]
    assert xc["summary"]["regime"]["name"] in ("quiet", "busy", "loaded", "unmeasured") and "regime" in printed
    # the report: measured next to predicted capacity per mode, the regime, the coverage, the backends left out
    rg = xc["summary"]["regime"]
    assert f"Cross-check regime: **{rg['name']}** ({rg['why']})" in text
    share = xc["summary"]["inside_interval_share"]
    assert f"{xc['summary']['inside_interval']} of {xc['summary']['configurations']} configurations ({share:.0%}) " \
           "inside their 90% interval, run by run" in text
    if left:
        for b in left:
            assert f"{b} ({xc['backends']['left_out'][b]})" in text
    else:
        assert "none left out (every read backend started here)" in text
    answer = text.split("## Answer", 1)[1].split("\n## ", 1)[0]
    for c in xc["capacity"]:
        lines = [ln for ln in answer.splitlines() if ln.startswith(f"| this machine, sessions as {c['mode']} |")]
        assert len(lines) == 2, c["mode"]
        meas, pred = ([x.strip() for x in ln.strip("|").split(" | ")] for ln in lines)
        assert meas[2].lstrip(">= ") == str(c["measured_capacity"]) and meas[7].endswith("[measured]")
        assert pred[2].lstrip(">= ") == str(c["predicted_capacity"]) and pred[7].endswith("[predicted]")
        assert meas[4] == f"{c['target_tokens_per_s']:g}" and meas[5].startswith("spread ")
        assert f"Capacity on this machine, sessions as {c['mode']}: measured" in text
    with open(out / "data" / "capacity_measured.csv") as f:
        rows = list(csv.DictReader(f))
    for c in xc["capacity"]:
        got = [r for r in rows if r["mode"] == c["mode"]]
        assert [int(r["sessions"]) for r in got] == c["sessions"]
        assert [float(r["measured_slowest_tokens_per_s"]) for r in got] == c["measured_slowest"]
        assert all(float(r["predicted_low"]) <= float(r["predicted_high"]) for r in got)
    assert "Rows read from the file were identical to the generator's bytes" in text
    s = xc["summary"]
    assert f"Regime: **{s['regime']['name']}**" in text and s["windows_probed"] == s["runs"]
    assert f"runs inside their own: {s['runs_inside']} of {s['runs']}" in text
    assert "\n| sessions | as | trace |" in text  # the several-session table is a table of its own
    # a second run reuses the model file
    assert main(["demo", "--quick", "--scale", "0.0005", "--steps", "20", "--rounds", "1", "--jobs", "1", "--no-fio",
                 "--no-html", "--no-progress", "--workdir", str(work), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((work / "demo.json").read_text())["model"]["build_s"] is None
    assert time.perf_counter() - t0 < 300


def test_demo_refuses_a_short_text(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("Only a few words of text.")
    assert main(["demo", "--quick", "--text", str(short), "--workdir", str(tmp_path / "w"),
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "short.txt" in err and "tokens" in err
    assert not list((tmp_path / "w").glob("*.gguf"))  # nothing was built


@pytest.mark.parametrize("bad, field", [(dict(scale=0.0), "scale"), (dict(steps=5), "steps"), (dict(rounds=-1), "rounds"),
                                        (dict(lookups=0), "lookups")])
def test_a_bad_demo_size_is_refused_naming_the_field(bad, field):
    with pytest.raises(ArgumentError, match=f"^DemoSize\\.{field} = "):
        DemoSize(**bad)
    assert DemoSize(steps=0, rounds=0).resolved(True) == DemoSize(0.001, 40, 2, 4)  # 0: the default
    assert DemoSize(scale=0.01, steps=30).resolved(False) == DemoSize(0.01, 30, 5, 16)


@pytest.mark.parametrize("kw,message", [
    (dict(scale="0.01"), "DemoSize.scale = '0.01': expected a finite number in (0, 1]"),
    (dict(scale=True), "DemoSize.scale = True: expected a finite number in (0, 1]"),
    (dict(scale=2.0), "DemoSize.scale = 2.0: expected a finite number in (0, 1]"),
    (dict(scale=float("nan")), "DemoSize.scale = nan: expected a finite number in (0, 1]"),
    (dict(steps="200"), "DemoSize.steps = '200': expected a whole number >= 10 (or 0: the default)"),
    (dict(steps=200.0), "DemoSize.steps = 200.0: expected a whole number >= 10 (or 0: the default)"),
    (dict(rounds=True), "DemoSize.rounds = True: expected a whole number >= 1 (or 0: the default)"),
    (dict(rounds=-1), "DemoSize.rounds = -1: expected a whole number >= 1 (or 0: the default)"),
    (dict(lookups=2.5), "DemoSize.lookups = 2.5: expected a whole number >= 1"),
])
def test_demo_size_refuses_a_bad_field_naming_it(kw, message):
    with pytest.raises(ArgumentError) as exc:
        DemoSize(**kw)
    assert str(exc.value) == message


def test_demo_size_keeps_its_valid_values():
    size = DemoSize(scale=1, steps=10, rounds=1, lookups=1)
    assert (size.scale, size.steps, size.rounds, size.lookups) == (1.0, 10, 1, 1) and type(size.scale) is float
    assert DemoSize().resolved(False) == DemoSize(0.02, 200, 5, 16)


def test_a_bad_demo_measurement_is_refused_naming_the_field():
    with pytest.raises(ArgumentError, match="demo wait = "):
        DemoMeasurement(wait="yes")
    with pytest.raises(ArgumentError, match="--throttle-iops: 0 is not a whole number"):
        DemoMeasurement(throttles=[0])


@pytest.mark.heavy
def test_full_demo(tmp_path):
    """`make demo` as shipped: the default scale, grid and report, within about 15 minutes on 2 cores."""
    t0 = time.perf_counter()
    md = run_demo(tmp_path / "report", workdir=tmp_path / "work")
    assert time.perf_counter() - t0 < 20 * 60
    check_report(md)
    xc = json.loads((tmp_path / "work" / "crosscheck.json").read_text())
    assert xc["summary"]["configurations"] == 33 and xc["summary"]["rows_match"]


def test_demo_size_zero_as_numpy_is_the_default():
    """0 is the default for steps and rounds as a Python int; a numpy 0 was refused as below 10."""
    assert DemoSize(steps=np.int64(0), rounds=np.int32(0)).resolved(quick=True) == DemoSize(steps=0).resolved(True)
    with pytest.raises(ArgumentError, match=r"^DemoSize\.steps = 5: expected a whole number >= 10 \(or 0: the "
                                            r"default\)$"):
        DemoSize(steps=np.int64(5))
