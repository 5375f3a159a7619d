"""sim.report: the document renderers, capacity, and a report on the device presets with a sweep table."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import struct
from pathlib import Path

import pytest

from engram import ArgumentError
from engram.cli import main
from sim.report import Doc, ReportFolder, build_report, capacity_of, default_traces, pyplot
from sim.sweep import Study, run_study

PREDICTED_FIGURES = ("seed_reproduction", "threshold", "readers", "devices", "step_cdf", "cache", "reuse", "capacity")


def png_size(path):
    """(width, height) from a PNG header; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_doc_renders_markdown_and_html():
    d = Doc("T <1>")
    d.h(1, "Sec A")
    d.p("a **bold** `x|y` <tag>")
    d.ul(["one", "two"])
    d.table(["h1", "h2"], [[1.23456, "a|b"], [1234567.0, None], [0.000123, float("nan")]])
    d.figure("figures/f.png", "cap", "data/f.csv")
    d.code("x = 1\n")
    md = d.markdown()
    assert md.startswith("# T <1>\n") and "## Sec A" in md and "- two" in md
    assert "| 1.23 | a\\|b |" in md and "| 1,234,567 | - |" in md and "| 0.000123 | - |" in md
    assert "![cap](figures/f.png)" in md and "[`data/f.csv`](data/f.csv)" in md and "```\nx = 1\n```" in md
    h = d.html()
    assert "<title>T &lt;1&gt;</title>" in h and "<h2 id='sec-a'>Sec A</h2>" in h
    assert "<b>bold</b>" in h and "<code>x|y</code>" in h and "&lt;tag&gt;" in h
    assert "<img src='figures/f.png' alt='cap'>" in h and "<td>a|b</td>" in h


def test_capacity_of():
    rows = [{"sessions": s, "y": v} for s, v in ((1, 21.0), (8, 20.5), (16, 20.0), (32, 19.9), (64, 25.0))]
    assert capacity_of(rows, 20.0, "y") == (16, False)  # the first miss ends the search
    assert capacity_of(rows, 19.0, "y") == (64, True)
    assert capacity_of(rows, 22.0, "y") == (0, False)


def test_unreadable_figures_are_refused(tmp_path):
    plt = pyplot()
    out = ReportFolder(tmp_path)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], label="a")
    ax.plot([1, 2], [2, 1], label="b")
    ax.set_xlabel("x (s)")
    with pytest.raises(RuntimeError, match="axis label"):
        out.save(fig, "bad", "t")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], label="a")
    ax.plot([1, 2], [2, 1], label="b")
    ax.set_xlabel("x (s)")
    ax.set_ylabel("y (s)")
    with pytest.raises(RuntimeError, match="no legend"):
        out.save(fig, "bad", "t")


def test_default_traces_ship_with_python():
    t = default_traces()
    assert t[0] == "stdlib:asyncio/base_events.py" and len(t) == 2 and t[1].startswith("stdlib:")


@pytest.fixture(scope="module")
def preset_report(tmp_path_factory):
    """``engram report`` on the presets with a sweep table: (report.md, the command's JSON)."""
    d = tmp_path_factory.mktemp("rep")
    study = Study.from_dict({"study": {"name": "tiny", "description": "two thresholds"},
                             "fixed": {"trace_limit": 200, "steps": 200, "compute": "reference"},
                             "grid": {"threshold": [8, 256], "readers": [1, 16]},
                             "plot": [{"x": "readers", "series": ["threshold"], "logx": True}]})
    run_study(study, jobs=1, progress=False, out=d / "tiny.csv")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["report", "--out", str(d / "out"), "--sweep", str(d / "tiny.csv"), "--quick", "--sessions",
                   "1,8", "--jobs", "1", "--json"])
    assert rc == 0
    res = json.loads(buf.getvalue())
    return Path(res["report"]), res


def test_report_on_presets(preset_report):
    md, res = preset_report
    root = md.parent
    assert res["html"] == str(root / "report.html") and set(PREDICTED_FIGURES) <= {f[:-4] for f in res["figures"]}
    text = md.read_text()
    for head in ("Headline figures", "Seed reproduction", "Tokens/s by threshold", "Tokens/s by readers",
                 "Step-latency CDFs", "Reuse and row caches", "Capacity", "Study: tiny",
                 "Inputs, calibration and tables"):
        assert f"## {head}" in text, head
    assert "No cross-check" in text and "21.06" in text
    for name in PREDICTED_FIGURES + ("sweep_tiny_0",):
        w, h = png_size(root / "figures" / f"{name}.png")
        assert 500 <= w <= 2400 and 300 <= h <= 1600, (name, w, h)
        assert f"figures/{name}.png" in text
        with open(root / "data" / f"{name}.csv") as f:
            rows = list(csv.reader(f))
        assert len(rows) >= 3, name
    html = (root / "report.html").read_text()
    assert html.count("<img ") == len(list((root / "figures").glob("*.png")))
    assert (root / "inputs" / "tiny.csv").is_file() and (root / "inputs" / "tiny.csv.meta.json").is_file()


def test_report_numbers_are_the_figures(preset_report):
    root = preset_report[0].parent
    with open(root / "data" / "seed_reproduction.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["reference_tokens_per_s"]) == 19.16 and float(rows[1]["reference_tokens_per_s"]) == 21.06
    assert float(rows[0]["simulated_tokens_per_s"]) == pytest.approx(19.16, rel=1e-9)
    assert float(rows[1]["simulated_tokens_per_s"]) == pytest.approx(21.06, rel=0.02)
    with open(root / "data" / "threshold.csv") as f:
        thr = [r for r in csv.DictReader(f) if r["cache_rows"] == "0"]
    # without a cache every step reads 48 distinct rows: the threshold is a step at 48
    conc = {float(r["tokens_per_s"]) for r in thr if int(r["threshold"]) <= 48}
    ser = {float(r["tokens_per_s"]) for r in thr if int(r["threshold"]) > 48}
    assert len(conc) == 1 and len(ser) == 1 and conc.pop() > ser.pop()
    with open(root / "data" / "capacity.csv") as f:
        cap = list(csv.DictReader(f))
    assert {r["device"] for r in cap} >= {"seed-apple-m3-ultra"} and {r["sessions"] for r in cap} == {"1", "8"}


def test_report_errors(tmp_path, capsys):
    with pytest.raises(ArgumentError, match="no such measurement folder"):
        build_report(tmp_path / "r", workdir=tmp_path / "nope", quick=True, progress=False)
    assert main(["report", "--out", str(tmp_path / "r"), "--sweep", str(tmp_path / "missing.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
