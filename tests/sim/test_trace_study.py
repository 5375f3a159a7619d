"""The ``reuse`` axis of a study: each point's trace becomes the synthetic trace of that reuse rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram.errors import ArgumentError
from sim.sweep import Study, read_table, run_points, run_study
from sim.sweep.study import point_trace
from sim.trace import load_trace, reuse_stats

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def study(grid: str, fixed: str = "") -> Study:
    return Study.loads(f"[study]\nname = \"r\"\n[fixed]\ntrace_limit = 800\nsteps = 800\ncompute_ms = 40.0\n"
                       f"{fixed}\n[grid]\n{grid}\n")


def test_point_trace():
    p = study("reuse = [0.3]").points()[0]
    assert point_trace(p) == "synth:reuse=0.3,seed=0,profile=code"
    assert point_trace(dict(p, zipf=2.0, repeat=3)) == "synth:reuse=0.3,zipf=2,seed=3,profile=code"
    assert point_trace(dict(p, trace="synth:reuse=0.1,profile=prose,seed=5")) == "synth:reuse=0.3,seed=5,profile=prose"
    assert point_trace(dict(p, reuse=None)) == p["trace"] == "stdlib:asyncio/base_events.py"


def test_cache_hit_rate_follows_the_reuse_axis():
    """One session over the whole trace with a cache that never evicts hits exactly the repeats."""
    pts = study("reuse = [0.0, 0.225, 0.5, 0.8]", "cache_rows = 100000").points()
    rows, _ = run_points(pts, 0, jobs=1, progress=False)
    assert [r["reuse"] for r in rows] == [0.0, 0.225, 0.5, 0.8]
    for r in rows:
        want = reuse_stats(load_trace(point_trace(r), limit=800)).reuse_rate
        assert r["cache_hit_rate"] == pytest.approx(want, abs=1e-12)
        assert abs(r["cache_hit_rate"] - r["reuse"]) <= 0.01
    # fewer device reads a step as the text repeats more
    reads = [r["reads_per_step"] for r in rows]
    assert all(a > b for a, b in zip(reads, reads[1:]))
    assert reads[0] == pytest.approx(48.0, abs=0.01)


def test_reuse_axis_errors():
    with pytest.raises(ArgumentError, match=r"reuse = 1.2 must be in \[0, 1\)"):
        study("reuse = [1.2]")
    with pytest.raises(ArgumentError, match="zipf = 1.0 needs reuse"):
        study("zipf = [1.0]")
    with pytest.raises(ArgumentError, match="reuse = 'a' must be float"):
        study("reuse = ['a']")


def test_reuse_study_file_runs(tmp_path):
    st = Study.load(STUDIES / "reuse.toml")
    assert st.axes() == ["cache_rows", "reuse"]
    small = Study.from_dict({"study": {"name": "reuse-small"},
                             "fixed": {"trace_limit": 400, "steps": 400, "compute_ms": 40.0},
                             "grid": {"reuse": [0.1, 0.6], "cache_rows": [0, 4096]}})
    res = run_study(small, jobs=1, progress=False)
    rows, meta = read_table(res.write(tmp_path / "reuse.csv"))
    assert [(r["reuse"], r["cache_rows"]) for r in rows] == [(0.1, 0), (0.1, 4096), (0.6, 0), (0.6, 4096)]
    assert "reuse" in meta["axes"]
