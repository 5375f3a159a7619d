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


def test_a_capacity_table_of_a_coarse_search_reads_as_its_bracket(tmp_path, capsys):
    """A capacity table searched at --resolution 4 (20 passed, 24 failed): the answer's capacity reads "between 20
    and 23", as engram sim capacity says it, not "20"; an exact search's reads as its count; without the probes
    table the bracket is not known and the count is what is said."""
    from engram.cli import main
    from sim.report.answer import entries_from_capacity_table
    base = ["sim", "capacity", "--device", "ssd:qd1_us=500,iops=20000,parallelism=8", "--compute-ms", "5",
            "--steps", "40", "--target", "20", "--seeds", "1", "--max-sessions", "24", "--jobs", "1", "--quiet"]
    for res, shown in (("4", "between 20 and 23"), ("1", "20")):
        out = tmp_path / f"r{res}.csv"
        assert main([*base, "--resolution", res, "--out", str(out)]) == 0
        capsys.readouterr()
        (e,) = entries_from_capacity_table(out)
        assert e.shown() == shown and e.value() == 20
    (tmp_path / "r4.csv.probes.csv").unlink()
    (e,) = entries_from_capacity_table(tmp_path / "r4.csv")
    assert e.shown() == "20"
