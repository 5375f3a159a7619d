"""The answer (the demo's headline): one target per table and per figure, the reason beside it (issue 24: the
presets' 20 tokens/s and this machine's 85 tokens/s at 5 ms compute shared one table and one axis)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.report.answer import answer_section, entries_from_crosscheck, grid_entries
from sim.report.document import Doc
from sim.report.plots import ReportFolder
from sim.sweep import Study, run_points

MEASURED_TARGET, PRESET_TARGET = 85.0, 20.0


def _crosscheck(compute_ms: float) -> dict:
    """The capacity part of a cross-check document (``crosscheck.json``), as engram crosscheck writes it for
    multi-session runs at 85 tokens/s with 5 ms compute a step."""
    cfg = {"trace": "stdlib:asyncio/base_events.py", "threshold": 8, "backend": "pread", "readers": 16,
           "compute": "sleep:5", "steps": 200, "mode": "threads"}
    sessions = [1, 2, 4, 8]
    rows = [{**cfg, "sessions": n, "repeats": 2,
             "measured": {"compute_mean_ms": compute_ms}, "predicted": {"compute_mean_ms": compute_ms,
                                                                        "start_spread_s": 0.002}}
            for n in sessions]
    cap = {**cfg, "sessions": sessions, "target_tokens_per_s": MEASURED_TARGET, "trace_label": "Python source",
           "measured_slowest": [160.0, 150.0, 120.0, 70.0], "predicted_slowest": [165.0, 152.0, 118.0, 80.0],
           "predicted_slowest_low": [150.0, 140.0, 100.0, 60.0], "predicted_slowest_high": [170.0, 160.0, 130.0, 90.0],
           "measured_capacity": 4, "predicted_capacity": 4, "all_met": {"measured": False, "predicted": False}}
    return {"capacity": [cap], "session_rows": rows}


@pytest.fixture(scope="module")
def grid_rows():
    study = Study.from_dict({"fixed": {"trace_limit": 100, "steps": 100, "compute": "reference"},
                             "grid": {"sessions": [1, 8, 16]}})
    rows, _ = run_points(study.points(), 0, jobs=1, progress=False)
    return rows, study.axes()


def _tables_and_reasons(doc: Doc):
    """Each table of the answer with the paragraph before it."""
    out = []
    for i, b in enumerate(doc.blocks):
        if b[0] == "table":
            out.append((doc.blocks[i - 1], b))
    return out


@pytest.mark.parametrize("targets", [(PRESET_TARGET,), (PRESET_TARGET, MEASURED_TARGET)])
def test_each_answer_table_has_one_target_and_its_reason(tmp_path, grid_rows, targets):
    rows, axes = grid_rows
    entries = grid_entries(rows, axes, {"target": PRESET_TARGET}, "grid", Path("grid.csv"))
    if MEASURED_TARGET in targets:
        entries += entries_from_crosscheck(_crosscheck(5.0))
    doc = Doc("t")
    out = ReportFolder(tmp_path / "r")
    answer_section(doc, out, entries, None)
    pairs = _tables_and_reasons(doc)
    assert len(pairs) == len(targets)
    for (before, (_, header, body)), want in zip(pairs, targets):
        col = list(header).index("target tokens/s")
        assert {r[col] for r in body} == {f"{want:g}"}  # one target a table
        assert before[0] == "p" and before[1].startswith(f"**Target {want:g} tokens/s**: the target "), before
        if want == MEASURED_TARGET:
            assert "this machine's measured multi-session runs, whose steps compute 5 ms" in before[1]
            assert "a ceiling of 200 tokens/s" in before[1]
        else:
            assert "sweep grid" in before[1]
    figures = sorted(p.name for p in (tmp_path / "r" / "figures").glob("capacity*.png"))
    assert len(figures) == len(targets)  # one axis a target
    intro = next(b[1] for b in doc.blocks if b[0] == "p")
    assert ("its target tokens/s" in intro) == (len(targets) > 1)
