"""sim.report: the document renderers, the answer it leads with, a report on the device presets with sweep and
capacity tables, the HTML page in a real browser, failures to write."""

from __future__ import annotations

import base64
import contextlib
import csv
import html
import html.parser
import io
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from matplotlib.text import Text

from engram import ArgumentError
from engram.cli import main
from sim.sweep.capacity import run_capacity
from sim.report import Doc, ReportFolder, ReportPage, ReportSearch, build_report, default_traces, pyplot
from sim.report.plots import spread_labels
from sim.device import load_device
from sim.report.sections import ran_text
from sim.trace import wrap_info
from sim.sweep import Study, run_points, run_study
from tests.mounts import tmpfs

PREDICTED_FIGURES = ("seed_reproduction", "threshold", "readers", "devices", "step_cdf", "cache", "engine_cache", "reuse", "reuse_rate",
                     "speculative", "capacity", "planner")
from sim.check.regimes import QUIET_TARGETS, TARGETS
from sim.report.build import _measurement_lines
from sim.report.inputs import Inputs
from sim.report.sections import crosscheck_section
from engram.rowcache import DEFAULT_POLICY
from sim.core.params import Compute
from sim.core.schema import trace_label
from sim.report.figures import cache_section, reuse_rate_section, threshold_section
from sim.report.whatif import cache_data, reuse_data, threshold_data
from sim.trace import CODE_SOURCE, load_trace, lru_hit_rate
from sim.trace.rowcache import policy_hits, replay_keys
SLOW_SSD = "ssd:qd1_us=500,iops=20000,parallelism=8"


def png_size(data: bytes):
    """(width, height) from a PNG header; fails on anything that is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


class Page(html.parser.HTMLParser):
    """The visible text, the ids, the links and the images of an HTML page."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.ids, self.links, self.images, self._skip = [], set(), [], [], 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a":
            self.links.append(a.get("href", ""))
        if tag == "img":
            self.images.append(a)
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


#: Markdown syntax that must never reach a reader of the page.
RAW_MARKDOWN = re.compile(r"\*\*|\]\(|!\[|\|---|^#{1,6} |`", re.M)


def test_doc_renders_markdown_and_html(tmp_path):
    d = Doc("T <1>")
    d.h(1, "Sec A")
    d.p("a **bold** `x|y` <tag> and [a link](#sec-a)")
    d.ul(["one", "two"])
    d.table(["h1", "h2"], [[1.23456, "a|b"], [1234567.0, None], [0.000123, float("nan")]])
    d.figure("figures/f.png", "cap [x]", "data/f.csv")
    d.code("x = 1\n")
    md = d.markdown()
    assert md.startswith("# T <1>\n") and "## Sec A" in md and "- two" in md
    assert "|---:|---|" in md  # a column of numbers is aligned right
    assert "| 1.23 | a\\|b |" in md and "| 1,234,567 | - |" in md and "| 0.000123 | - |" in md
    assert "![cap (x)](figures/f.png)" in md and "[`data/f.csv`](data/f.csv)" in md and "```\nx = 1\n```" in md
    h = d.html()  # no folder: linked by relative path
    assert "<title>T &lt;1&gt;</title>" in h and '<h2 id="sec-a">Sec A</h2>' in h
    assert "<strong>bold</strong>" in h and "<code>x|y</code>" in h and "&lt;tag&gt;" in h
    assert '<a href="#sec-a">a link</a>' in h and '<td style="text-align:right">1.23</td>' in h
    assert '<img src="figures/f.png" alt="cap (x)" id="figure-f">' in h and "<td>a|b</td>" in h
    assert not RAW_MARKDOWN.search("".join(Page(h).text))
    # self-contained: the figure and the data travel inside the page
    (tmp_path / "figures").mkdir()
    (tmp_path / "data").mkdir()
    fig, ax = pyplot().subplots()
    fig.savefig(tmp_path / "figures" / "f.png")
    (tmp_path / "data" / "f.csv").write_text("a,b\n1,2\n")
    page = Page(d.html(tmp_path, self_contained=True))
    src = page.images[0]["src"]
    assert src.startswith("data:image/png;base64,") and png_size(base64.b64decode(src.split(",", 1)[1]))[0] > 100
    data = [x for x in page.links if x.startswith("data:text/csv")]
    assert len(data) == 1 and base64.b64decode(data[0].split(",", 1)[1]) == b"a,b\n1,2\n"
    assert all(x.startswith(("data:", "#")) for x in page.links)


def test_tokens_axes_start_at_zero_and_labels_do_not_overlap(tmp_path):
    plt = pyplot()
    out = ReportFolder(tmp_path)
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([1, 2, 4], [19.2, 20.5, 21.0])
    a.set_xlabel("readers")
    a.set_ylabel("decode tokens/s (one session)")
    b.plot([1, 2, 4], [19.2, 20.5, 21.0])
    b.set_xlabel("readers")
    b.set_ylabel("step latency (ms)")
    spread_labels(b, [(2, 20.5, "64", "k"), (2, 20.5, ">= 64", "k"), (2.05, 20.51, "60", "k")])
    out.save(fig, "axes", "t")
    assert a.get_ylim()[0] == 0 and b.get_ylim()[0] > 19  # only tokens/s axes start at zero
    fig.canvas.draw()
    boxes = [Text.get_window_extent(t) for t in b.texts]  # the words, without a leader line
    assert len(boxes) == 3
    for i, one in enumerate(boxes):  # three labels of nearly the same point, none over another
        for other in boxes[i + 1:]:
            assert one.y1 <= other.y0 + 1 or other.y1 <= one.y0 + 1, (one, other)
    w, h = png_size((tmp_path / "figures" / "axes.png").read_bytes())
    assert w > 300 and h > 200


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
    """``engram report`` on the presets with a sweep, a sweep over sessions and a capacity table:
    (report.md, the command's JSON)."""
    d = tmp_path_factory.mktemp("rep")
    study = Study.from_dict({"study": {"name": "tiny", "description": "two thresholds"},
                             "fixed": {"trace_limit": 200, "steps": 200, "compute": "reference"},
                             "grid": {"threshold": [8, 256], "readers": [1, 16]},
                             "plot": [{"x": "readers", "series": ["threshold"], "logx": True}]})
    run_study(study, jobs=1, progress=False, out=d / "tiny.csv")
    wrapped = Study.from_dict({"study": {"name": "wrapped"},
                               "fixed": {"trace_limit": 100, "steps": 150, "compute": "reference"},
                               "grid": {"cache_rows": [0, 1024]}})
    run_study(wrapped, jobs=1, progress=False, out=d / "wrapped.csv")
    grid = Study.from_dict({"study": {"name": "grid"},
                            "fixed": {"trace_limit": 200, "steps": 100, "compute": "reference", "device": SLOW_SSD,
                                      "start_spread_ms": 47.0},
                            "grid": {"sessions": [1, 2, 4, 8], "readers": [4, 16]},
                            "plot": [{"kind": "capacity", "x": "sessions", "y": "session_tokens_per_s_min",
                                      "series": ["readers"], "target": 20.0, "logx": True}]})
    run_study(grid, jobs=1, progress=False, out=d / "grid.csv")
    cap = Study.from_dict({"study": {"name": "drives", "seed": 2}, "capacity": {"seeds": 2, "max_sessions": 32},
                           "fixed": {"trace_limit": 200, "steps": 100, "compute": "reference", "phases": "random"},
                           "grid": {"device": [SLOW_SSD], "readers": [4, 16]}})
    run_capacity(cap, jobs=1, progress=False, out=d / "drives.csv")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["report", "--out", str(d / "out"), "--sweep", str(d / "tiny.csv"), "--sweep", str(d / "grid.csv"),
                   "--sweep", str(d / "wrapped.csv"),
                   "--sweep", str(d / "drives.csv"), "--quick", "--seeds", "1", "--max-sessions", "16", "--jobs", "1",
                   "--quiet", "--json"])
    assert rc == 0
    res = json.loads(buf.getvalue())
    return Path(res["report"]), res


def test_report_on_presets(preset_report):
    md, res = preset_report
    root = md.parent
    assert res["html"] == str(root / "report.html") and set(PREDICTED_FIGURES) <= {f[:-4] for f in res["figures"]}
    text = md.read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads[0] == "Answer: concurrent sessions each device sustains"  # the answer leads
    for head in ("Other headline figures", "Seed reproduction (SPEC §8, §9)", "Tokens/s by threshold",
                 "Tokens/s by readers (queue depth)", "Step-latency CDFs", "Reuse and row caches",
                 "Capacity: how the report searched it", "What a planner can buy: drives, a shared cache, DRAM, the tail",
                 "Study: tiny", "Study: grid", "Study: wrapped", "Capacity study: drives",
                 "Inputs, calibration and tables"):
        assert head in heads, head
    assert "No cross-check" in text and "21.06" in text
    # the per-session cache figures name the policy they simulated (the engine's default), never another
    assert "Row cache per session, W-TinyLFU (the policy simulated)" in text and "per-session W-TinyLFU" in text
    assert "LRU cache" not in text and "LRU hit rate" not in text
    hit = list(csv.DictReader(open(root / "data" / "cache_hit_rate.csv")))
    assert hit and {r["cache_policy"] for r in hit} == {DEFAULT_POLICY}
    for name in PREDICTED_FIGURES + ("sweep_tiny_0", "sweep_grid_0"):
        w, h = png_size((root / "figures" / f"{name}.png").read_bytes())
        assert 500 <= w <= 2400 and 300 <= h <= 1600, (name, w, h)
        assert f"figures/{name}.png" in text
        with open(root / "data" / f"{name}.csv") as f:
            rows = list(csv.reader(f))
        assert len(rows) >= 3, name
    for name in ("tiny.csv", "tiny.csv.meta.json", "drives.csv", "drives.csv.probes.csv"):
        assert (root / "inputs" / name).is_file(), name


def test_a_study_whose_cache_replays_its_trace_says_so(preset_report):
    """A row cache over a trace of 100 steps read for 150: the study's section prints the trace's own warning."""
    text = preset_report[0].read_text()
    part = text.split("## Study: wrapped", 1)[1].split("\n## ", 1)[0]
    want = wrap_info(100, 150, 1).warning()
    assert want.startswith("1 session(s) x 150 steps on a trace of 100 steps: each session wraps (1.50 laps)")
    assert "**Warning**: the cache figures of this study depend on replaying its trace" in part and want in part
    assert "Warning" not in text.split("## Study: tiny", 1)[1].split("\n## ", 1)[0]  # no cache, no wrap


def test_speculative_figure(preset_report):
    """Tokens/s against acceptance for k = 1, 2, 3 with and without prefetch on two devices: more acceptance never
    lowers tokens/s, prefetch never does, and at acceptance 1 a step emits k + 1 tokens."""
    root = Path(preset_report[0]).parent
    rows = list(csv.DictReader(open(root / "data" / "speculative.csv")))
    devices = {r["device"] for r in rows}
    assert len(devices) == 2
    for dev in devices:
        for k in ("1", "2", "3"):
            curve = {pf: [(float(r["acceptance"]), float(r["tokens_per_s"])) for r in rows
                          if r["device"] == dev and r["draft_tokens"] == k and r["prefetch"] == pf] for pf in ("off", "on")}
            for pf, pts in curve.items():
                ys = [y for _, y in sorted(pts)]
                assert len(ys) == 3 and all(b >= a for a, b in zip(ys, ys[1:])), (dev, k, pf, ys)
            assert all(on >= off for (_, off), (_, on) in zip(sorted(curve["off"]), sorted(curve["on"])))
            full = [r for r in rows if r["device"] == dev and r["draft_tokens"] == k and r["acceptance"] == "1.0"]
            assert all(float(r["tokens_per_step"]) == int(k) + 1 for r in full)
    assert "\n## Speculative decoding\n" in Path(preset_report[0]).read_text()


def test_reuse_rate_figure(preset_report):
    """Synthetic traces hit their target reuse rate; a cache never serves more than the text repeats; without
    a cache the reads do not depend on the reuse rate, with one they get faster as the text repeats more."""
    root = preset_report[0].parent
    rows = list(csv.DictReader(open(root / "data" / "reuse_rate.csv")))
    assert {float(r["target_reuse"]) for r in rows} == {0.0, 0.225, 0.5}  # --quick
    for r in rows:
        assert abs(float(r["reuse_rate"]) - float(r["target_reuse"])) <= 0.01
        assert float(r["cache_hit_rate"]) <= float(r["reuse_rate"]) + 1e-12
        assert (float(r["cache_hit_rate"]) == 0) == (r["cache_rows"] == "0" or r["target_reuse"] == "0.0")
    reads_only = [r for r in rows if r["panel"] == "Reference SSD, Engram reads only"]
    flat = [float(r["tokens_per_s"]) for r in reads_only if r["cache_rows"] == "0"]
    assert max(flat) / min(flat) - 1 < 0.01
    cached = [float(r["tokens_per_s"]) for r in sorted(reads_only, key=lambda r: float(r["target_reuse"]))
              if r["cache_rows"] == "4096"]
    assert cached == sorted(cached) and cached[-1] > 1.2 * cached[0]
    text = preset_report[0].read_text()
    assert "Trace coverage: 1 session(s) x 500 steps on a trace of 500 steps: no wrap." in text


def test_planner_panels(preset_report):
    """Capacity on the reference SSD by drives, shared cache and DRAM share (--quick: one seed, bisected to 8
    sessions, one device), and the tail with a measured distribution."""
    root = preset_report[0].parent
    rows = {(r["axis"], float(r["value"])): r for r in csv.DictReader(open(root / "data" / "planner.csv"))}
    cap = {k: int(r["capacity"]) for k, r in rows.items()}
    bound = load_device("seed-apple-m3-ultra").peak_iops() / (48 * 20.0)  # 81.4 sessions
    base = cap[("drives", 1.0)]
    assert bound - 8 - 1 <= base <= bound and cap[("shared_cache_rows", 0.0)] == cap[("dram_fraction", 0.0)] == base
    # two drives: twice the throughput bound; half the tables in DRAM: half the reads (each nearly doubles the
    # capacity; 20 steps a session at random phases reach a little less of the bound than one drive does)
    for key in (("drives", 2.0), ("dram_fraction", 0.5)):
        assert 1.8 * base <= cap[key] <= 2 * bound, key
    assert cap[("shared_cache_rows", 65536.0)] >= base and float(rows[("shared_cache_rows", 65536.0)][
        "shared_cache_hit_rate_at_capacity"]) > 0
    assert float(rows[("dram_fraction", 0.5)]["dram_hit_rate_at_capacity"]) == pytest.approx(0.5, abs=0.02)
    assert {r["phases"] for r in rows.values()} == {"random phases"}
    tail = list(csv.DictReader(open(root / "data" / "planner_tail.csv")))
    own = [r for r in tail if r["latency_distribution"].startswith("own")]
    lent = [r for r in tail if r["latency_distribution"].startswith("vm-virtio")]
    assert len(own) == len(lent) >= 3 and [r["sessions"] for r in own] == [r["sessions"] for r in lent]
    for r in tail:
        assert float(r["step_p50_ms"]) <= float(r["step_p99_ms"]) <= float(r["step_p999_ms"])
    # the reference SSD has fixed latencies: alone, a session's steps all take the same time; a measured
    # distribution gives them a tail
    assert float(own[0]["step_p999_ms"]) == pytest.approx(float(own[0]["step_p50_ms"]), rel=1e-6)
    assert float(lent[0]["step_p999_ms"]) > float(lent[0]["step_p50_ms"]) * 1.001
    text = preset_report[0].read_text()
    planner = text.split("## What a planner can buy", 1)[1]
    assert "no wrap, sessions read distinct steps" in planner
    # the cache a planner can buy is the engine's: its class, its default policy, the budgets in bytes
    assert "cache=RowCache(SIZE))`, its default policy W-TinyLFU" in planner and "65,536 rows = 16.5 MiB" in planner


def answer_rows(text: str):
    """The answer's table: (device, read policy, capacity, band, target, phases, assumes, from) per row."""
    part = text.split("## Answer", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("| ") and not ln.startswith("| device")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]


def test_the_answer_has_every_capacity_with_its_assumptions(preset_report):
    """The report's own search, the capacity table and the grid sweep all reach the answer, each with its band,
    and the assumptions (compute, batching, phases, target, headroom) are stated."""
    text = preset_report[0].read_text()
    rows = answer_rows(text)
    by = {(r[0], r[1], r[7].split(" (")[0]): r for r in rows}
    assert by[("seed-apple-m3-ultra", "threshold 8, 16 readers", "this report's search")][2] == ">= 16"
    drives = [r for r in rows if r[7].startswith("study 'drives'")]
    grid = [r for r in rows if r[7].startswith("study 'grid'") and "read off a grid" in r[7]]
    assert len(drives) == 2 and len(grid) == 2
    cap_table = list(csv.DictReader(open(preset_report[0].parent / "inputs" / "drives.csv")))
    for r, t in zip(sorted(drives, key=lambda r: r[1]), sorted(cap_table, key=lambda t: t["readers"])):
        assert r[2] == t["capacity"] and r[3] == f"{t['capacity_low']}-{t['capacity_high']} over 2 seeds"
        assert t["phases_run"] == "random" and float(t["compute_realised_cv"]) == 0.0
        assert float(t["compute_realised_mean_ms"]) == pytest.approx(float(t["compute_mean_ms"]), rel=1e-12)
    assert all(r[3].startswith("- (one grid") for r in grid)
    # each capacity states the phases it ran with: the report's search and the capacity study at random phases,
    # the grid study written with the older start_spread_ms at starts spread over one step
    for r in rows:
        assert r[5] == ("spread 47 ms" if r in grid else "random phases"), r
        assert r[4] == "20" and "compute 47.01 ms" in r[6] and "6.0% under the ceiling 21.27 tokens/s" in r[6]
        assert "drawn: mean 47.01 ms, CV 0" in r[6]
    answer = text.split("## Answer", 1)[1].split("\n## ", 1)[0]
    assert "batching none (each session computes alone; compute never contends)" in answer
    assert "phases: random (each session starts at a uniformly random time within one step, seeded)" in answer
    assert "2.99 ms a step for reads" in answer
    assert "Machine: no measurement on this machine" in text
    with open(preset_report[0].parent / "data" / "capacity.csv") as f:
        assert {r["phases"] for r in csv.DictReader(f)} == {"random phases", "spread 47 ms"}


def test_a_sweep_states_its_real_compute(preset_report):
    text = preset_report[0].read_text()
    fixed = text.split("## Study: tiny", 1)[1].split("Fixed: ", 1)[1].split("\n", 1)[0]
    assert fixed.startswith("compute = 47.01 ms a step (the SPEC §8 reference compute); drawn: mean 47.01 ms, CV 0")
    assert "compute_ms" not in fixed and "sessions" not in fixed
    grid = text.split("## Study: grid", 1)[1].split("\n## ", 1)[0]
    assert "Session phases as simulated: starts spread evenly over 47 ms." in grid
    assert "stars: the capacity read off the grid at 20 tokens/s, sessions at spread 47 ms as simulated" in grid


def test_a_sweep_over_compute_states_what_was_drawn():
    """Nominal against drawn compute, from real rows: a gamma compute of CV 0.5 draws a CV near 0.5."""
    study = Study.from_dict({"fixed": {"trace_limit": 200, "steps": 200, "compute_ms": 30.0, "sessions": 2},
                             "grid": [{"compute_dist": ["gamma"], "compute_cv": [0.5]}, {"compute_ms": [10.0]}]})
    rows, _ = run_points(study.points(), 0, jobs=1, progress=False)
    text = ran_text(rows, study.axes())
    assert text.startswith("Session phases as simulated: random (each session starts at a uniformly random time")
    m, cv = rows[0]["compute_realised_mean_ms"], rows[0]["compute_realised_cv"]
    assert abs(m / 30.0 - 1) < 0.1 and abs(cv - 0.5) < 0.1
    assert f"10.00 ms nominal: drawn mean 10.00 ms, CV 0; 30.00 ms nominal: drawn mean {m:.2f} ms, CV {cv:.3g}." \
        in text


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
    seed = [r for r in cap if r["device"] == "seed-apple-m3-ultra"]
    # the bracketed search: one session, then the most the search may probe (its bounds put the knee above it)
    assert [int(r["sessions"]) for r in seed] == [1, 16] and all(r["passed"] == "True" for r in seed)


def test_html_is_self_contained_and_has_no_raw_markdown(preset_report):
    root = preset_report[0].parent
    page = Page((root / "report.html").read_text())
    text = "".join(page.text)
    assert not RAW_MARKDOWN.search(text), RAW_MARKDOWN.search(text)
    assert "Contents: Answer: concurrent sessions each device sustains" in " ".join(text.split())
    assert len(page.images) == len(list((root / "figures").glob("*.png")))
    for img in page.images:
        assert img["src"].startswith("data:image/png;base64,")
        w, _ = png_size(base64.b64decode(img["src"].split(",", 1)[1]))
        assert w > 300
    for href in page.links:
        assert href.startswith("data:") or (href.startswith("#") and href[1:] in page.ids), href


def browser_check(page: Path, tmp: Path) -> dict:
    """Open ``page`` in headless Chromium and report what a reader gets: images loaded (naturalWidth > 0),
    in-page links whose target exists, links to other files, and the visible text."""
    probe = tmp / ("checked-" + page.name)
    script = ("<script>window.addEventListener('load', () => {"
              "const imgs = [...document.images];"
              "const links = [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));"
              "const r = {images: imgs.length,"
              " broken_images: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.id),"
              " links: links.length,"
              " dead_links: links.filter(h => h.startsWith('#') && !document.getElementById(h.slice(1))),"
              " files: links.filter(h => !h.startsWith('#') && !h.startsWith('data:')),"
              " text: document.body.innerText};"
              "const pre = document.createElement('pre'); pre.id = 'browser-check';"
              "pre.textContent = JSON.stringify(r); document.body.appendChild(pre);});</script>")
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                        "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="browser-check">(.*?)</pre>', r.stdout, re.S)
    assert m, f"chromium gave no result (exit {r.returncode}): {r.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless browser: apt-get install chromium (.ci/run installs it)")
@pytest.mark.parametrize("linked", [False, True])
def test_html_in_a_real_browser(preset_report, tmp_path, linked):
    """The page as a reader sees it: every image loads, every link resolves, no Markdown syntax shows."""
    root = preset_report[0].parent
    page = root / "report.html"
    if linked:  # the same report linking figures/ and data/ by relative path: checked in place
        assert main(["report", "--out", str(tmp_path / "linked"), "--quick", "--seeds", "1", "--max-sessions", "4",
                     "--jobs", "1", "--quiet", "--linked-figures"]) == 0
        page = tmp_path / "linked" / "report.html"
        checked = browser_check(page, page.parent)
    else:  # the self-contained page, alone in another folder: nothing to find beside it
        alone = tmp_path / "alone"
        alone.mkdir()
        shutil.copyfile(page, alone / "report.html")
        checked = browser_check(alone / "report.html", alone)
    assert checked["images"] >= 8 and checked["broken_images"] == []
    assert checked["links"] >= 10 and checked["dead_links"] == []
    if linked:
        assert checked["files"] and all((page.parent / f).is_file() for f in checked["files"])
    else:
        assert checked["files"] == []
    assert not RAW_MARKDOWN.search(checked["text"]), RAW_MARKDOWN.search(checked["text"])
    assert "Answer: concurrent sessions each device sustains" in checked["text"]


def test_report_errors(tmp_path, capsys):
    with pytest.raises(ArgumentError, match="no such measurement folder"):
        build_report(tmp_path / "r", workdir=tmp_path / "nope", quick=True, progress=False)
    assert main(["report", "--out", str(tmp_path / "r"), "--sweep", str(tmp_path / "missing.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "plain").write_text("x")
    assert main(["report", "--out", str(tmp_path / "plain" / "r"), "--quick", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'plain'}" in err and "a file stands where a folder is needed" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("bad, field", [(dict(target=0.0), "target"), (dict(target=float("nan")), "target"),
                                        (dict(compute_ms=-1.0), "compute_ms"), (dict(seeds=-1), "seeds"),
                                        (dict(max_sessions=2.5), "max_sessions"), (dict(jobs=True), "jobs")])
def test_a_bad_report_search_is_refused_naming_the_field(bad, field):
    with pytest.raises(ArgumentError, match=f"report search {field} = "):
        ReportSearch(**bad)
    assert ReportSearch(seeds=0).seeds == 0  # 0: the default, as the command's flags give it


@pytest.mark.parametrize("bad, field", [(dict(html_page=1), "html_page"), (dict(self_contained="no"), "self_contained"),
                                        (dict(title=3), "title")])
def test_a_bad_report_page_is_refused_naming_the_field(bad, field):
    with pytest.raises(ArgumentError, match=f"report page {field} = "):
        ReportPage(**bad)


def test_report_onto_a_read_only_folder(tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "64k", read_only=True) as ro:
        assert main(["report", "--out", str(ro / "r"), "--quick", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert str(ro / "r") in err and "Read-only file system" in err and "Traceback" not in err


def _crosscheck_row() -> dict:
    """One measured configuration of a cross-check, its figures complete."""
    return {"key": "c0", "trace": "stdlib:asyncio/base_events.py", "trace_label": "base_events", "threshold": 8,
            "serial": False, "backend": "pread", "readers": 16, "compute": "none", "steps": 200, "repeats": 2,
            "measured": {"tokens_per_s": 100.0, "tokens_per_s_runs": [98.0, 102.0], "step_p50_ms": 9.9,
                         "step_p95_ms": 12.0},
            "predicted": {"tokens_per_s": 101.0, "step_p50_ms": 9.8, "step_p95_ms": 11.5},
            "error": {"tokens_per_s": 0.01, "step_p50": -0.01, "step_p95": -0.04}, "spread": {"tokens_per_s": 0.04},
            "interval": {"error_low": -0.05, "error_high": 0.06}}


@pytest.mark.parametrize("summary", [
    {"configurations": 1, "runs": 2, "regime": {"name": "busy", "why": "others used 20% of the CPUs"},
     "tokens_per_s": {"median_abs_error": None, "max_abs_error": float("nan")}, "spread": {},
     "pass": {"tokens_per_s_median_abs": False}, "passed": False},
    {},
])
def test_a_crosscheck_summary_without_its_figures_reads_not_measured(tmp_path, summary):
    """The headline and the cross-check section took s['tokens_per_s']['median_abs_error'] * 100 and the like:
    a summary of an older or partial file (figures None, NaN or missing) raised TypeError or KeyError."""
    xc = {"summary": summary, "targets": TARGETS, "quiet_targets": QUIET_TARGETS, "rows": [_crosscheck_row()]}
    n = "1" if summary else "?"
    lines = _measurement_lines(Inputs(xc=xc))
    assert lines[1] == (f"Cross-check on this machine x?: {n} configurations, tokens/s median |error| not measured, "
                        "max not measured; median spread of repeats not measured.")
    verdict = "FAIL (missed: tokens/s median error)" if summary else "FAIL"
    assert lines[2].endswith(f"(tokens/s median |error| <= 5%, max <= 10%): {verdict}.")
    doc = Doc("t")
    crosscheck_section(doc, ReportFolder(tmp_path), Inputs(xc=xc))
    md = doc.markdown()

    def target(x: str) -> str:  # an empty summary has no regime: held as loaded, as before
        return f"target <= {x}" if summary else f"any-machine target <= {x}, not held under load"

    assert (f"tokens/s: median |error| **not measured** ({target('5%')}), max not measured ({target('10%')}); "
            f"step p50 max |error| not measured ({target('10%')})") in md
    assert ("has median not measured and max not measured: errors inside that spread are noise of the machine, "
            f"not of the model. ? of {n} predictions fall inside the measured range. Verdict: **{verdict}**.") in md
    # the cross-check's own summary, at the section's end
    runs = "2" if summary else "?"
    assert (f"{n} configurations (0 with several sessions), {runs} runs. Errors: ") in md
    assert (f"tokens/s: median |error| not measured ({target('5%')}), max not measured ({target('10%')}); step p50: "
            f"median |error| not measured, max not measured ({target('10%')}); step p95: median |error| not "
            "measured, max not measured.") in md
    assert ("Spread of repeated runs ((max - min) / median): tokens/s median not measured, max not measured "
            "(coefficient of variation: median not measured); step p50 median not measured, max not measured. "
            f"Prediction inside the measured range: ? of {n}; inside the 90% interval (run by run): 0 of {n} "
            "(not measured, target when not quiet >= 90%)") in md
    if summary:
        assert ("Regime: **busy** (others used 20% of the CPUs). Each run is predicted with the device and compute "
                "of its own time window, fitted from probe steps interleaved with it (0 of 2 runs).") in md


class _LegendFolder(ReportFolder):
    """A report folder that keeps the legend texts of each figure it saves."""

    def __init__(self, root):
        super().__init__(root)
        self.legends = {}

    def save(self, fig, name, title):
        self.legends[name] = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        return super().save(fig, name, title)


def test_cache_figures_name_and_plot_the_policy_simulated(tmp_path):
    """The per-session cache figures simulate the engine's default policy (W-TinyLFU, from the Policy the report
    builds) and say so: the hit rate plotted beside tokens/s is the simulation's own, which is the policy code's on
    the trace (not the LRU rate, which differs); the labels follow the policy of the data."""
    tr = load_trace(CODE_SOURCE, limit=300)
    inp = Inputs(traces={CODE_SOURCE: tr})
    comp = Compute(0.047)
    d = cache_data(inp, comp, quick=True)
    assert d.cache_policy == DEFAULT_POLICY == "tinylfu"
    keys = replay_keys(tr, 1, tr.steps)[:, 0]
    sized = [c for c in d.sizes if c]
    want = [float(policy_hits(keys, c, "tinylfu").mean()) for c in sized]
    assert d.hit_rates[CODE_SOURCE] == pytest.approx(want, abs=1e-12)
    for row in d.rows:  # every simulation of a size reports that hit rate
        if row[5]:
            assert row[6] == "tinylfu" and row[7] == pytest.approx(want[sized.index(row[5])], abs=1e-12)
    assert any(abs(w - lru_hit_rate(tr, c, progress=False)) > 1e-3 for w, c in zip(want, sized))
    label = trace_label(CODE_SOURCE)
    for name, shown in (("tinylfu", "W-TinyLFU"), ("lru", "LRU")):
        d.cache_policy = name
        out, doc = _LegendFolder(tmp_path / name), Doc("t")
        cache_section(doc, out, d)
        assert f"{label}: {shown} hit rate" in out.legends["cache"]
        assert f"Row cache per session, {shown} (the policy simulated)" in doc.markdown()
    rows = list(csv.DictReader(open(tmp_path / "tinylfu" / "data" / "cache_hit_rate.csv")))
    assert [r["cache_policy"] for r in rows] == ["tinylfu"] * len(sized)
    assert [float(r["cache_hit_rate"]) for r in rows] == pytest.approx(want, abs=1e-12)

    t = threshold_data(inp, comp, quick=True)
    assert t.cache_policy == "tinylfu"
    out = _LegendFolder(tmp_path / "thr")
    threshold_section(Doc("t"), out, t, comp)
    assert out.legends["threshold"] == ["no row cache", "4,096-row W-TinyLFU cache"]
    t.cache_policy = "lru"
    threshold_section(Doc("t"), out, t, comp)
    assert out.legends["threshold"] == ["no row cache", "4,096-row LRU cache"]

    r = reuse_data(inp, comp, quick=True)
    assert r.cache_policy == "tinylfu"
    out, doc = _LegendFolder(tmp_path / "reuse"), Doc("t")
    reuse_rate_section(doc, out, r)
    assert "4,096-row W-TinyLFU cache" in out.legends["reuse_rate"] and "LRU" not in " ".join(out.legends["reuse_rate"])
    assert "per-session W-TinyLFU row cache" in doc.markdown() and "per-session W-TinyLFU cache" in doc.markdown()


def test_a_capacity_study_without_compute_is_reported(tmp_path, capsys):
    """A capacity study that leaves the compute at 0 (a step is its reads alone): its capacity table reports, and
    the answer says there is no compute-only ceiling (1000 / 0 ms divided by zero before)."""
    study = tmp_path / "z.toml"
    study.write_text('[study]\nname = "z"\nseed = 0\n[capacity]\nmax_sessions = 4\nseeds = 1\n[fixed]\n'
                     'trace_limit = 300\nsteps = 20\n[grid]\ndevice = ["ssd:qd1_us=80,iops=100000"]\n')
    assert main(["sim", "capacity", str(study), "--out", str(tmp_path / "z.csv"), "--quiet", "--jobs", "1"]) == 0
    assert main(["report", "--sweep", str(tmp_path / "z.csv"), "--out", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    assert "no compute-only ceiling (a step is its reads alone)" in (tmp_path / "rep" / "report.md").read_text()
