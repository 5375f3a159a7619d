"""The writers' progress bar (``engram synth``, ``engram repair``) follows the project's progress rule: a tqdm bar
on a terminal only, unless ``progress="bar"`` asks for one anywhere (``sim.core.progress`` and the report builder
decide the same way).  A bar written to a file or a pipe leaves its carriage-return redraws in it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engram import ArgumentError, synth
from engram.gguf import repair_model
from engram.gguf.write import bar_wanted, progress_bar

from tests.modelfiles import plan

ROOT = Path(__file__).resolve().parents[2]

#: Writes a small model (synth) and a repaired copy of it (repair), both with the ``progress`` given.
WRITE_BOTH = """
    from engram import synth
    from engram.gguf import repair_model
    from tests.modelfiles import plan
    synth.write_model(plan(scale=0.0001), {model!r}, synth.Fill(tables="all", projections=False),
                      progress={progress!r})
    repair_model({model!r}, {repaired!r}, progress={progress!r})
"""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _write_in_child(tmp_path: Path, name: str, progress, stderr_to_file: bool):
    """Run :data:`WRITE_BOTH` in a child whose standard error is a file (or a pipe); its stderr and the paths."""
    model, repaired = tmp_path / f"{name}.gguf", tmp_path / f"{name}-repaired.gguf"
    code = textwrap.dedent(WRITE_BOTH.format(model=str(model), repaired=str(repaired), progress=progress))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if stderr_to_file:
        log = tmp_path / f"{name}.stderr"
        with open(log, "w") as f:
            proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=f, text=True, timeout=300)
        err = log.read_text()
    else:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        err = proc.stderr
    assert proc.returncode == 0, err
    return err, model, repaired


@pytest.mark.parametrize("stderr_to_file", [True, False], ids=["file", "pipe"])
def test_no_bar_off_a_terminal_and_the_same_files(tmp_path, stderr_to_file):
    err, model, repaired = _write_in_child(tmp_path, "m", True, stderr_to_file)
    assert "\r" not in err and "%|" not in err, err
    # the files are those a run without progress writes
    quiet = tmp_path / "quiet.gguf"
    synth.write_model(plan(scale=0.0001), quiet, synth.Fill(tables="all", projections=False), progress=False)
    assert model.read_bytes() == quiet.read_bytes()
    quiet_repaired = tmp_path / "quiet-repaired.gguf"
    repair_model(quiet, quiet_repaired, progress=False)
    assert repaired.read_bytes() == quiet_repaired.read_bytes()


def test_a_bar_asked_for_is_drawn_off_a_terminal(tmp_path):
    err, model, repaired = _write_in_child(tmp_path, "b", "bar", stderr_to_file=True)
    assert "synth b.gguf" in err and "repair b-repaired.gguf" in err and "%|" in err, err
    assert model.exists() and repaired.exists()


def test_bar_wanted_follows_the_progress_rule(monkeypatch):
    tty, log = _Terminal(), io.StringIO()
    for progress in (True, None, "auto"):
        assert bar_wanted(progress, tty) and not bar_wanted(progress, log)
    assert bar_wanted("bar", log) and bar_wanted("bar", tty)
    for progress in (False, "off", "lines"):
        assert not bar_wanted(progress, tty)
    for bad in ("yes", 1, 0.5):
        with pytest.raises(ArgumentError, match="progress must be"):
            bar_wanted(bad, tty)
    monkeypatch.setattr(sys, "stderr", tty)  # standard error a terminal: the default draws the bar there
    with progress_bar(True, 100, "synth t.gguf") as bar:
        assert bar is not None
        bar.update(100)
    assert "synth t.gguf" in tty.getvalue()
    monkeypatch.setattr(sys, "stderr", log)
    with progress_bar(True, 100, "synth t.gguf") as bar:
        assert bar is None
    assert log.getvalue() == ""


def test_a_bad_progress_is_refused_before_anything_is_made(tmp_path):
    with pytest.raises(ArgumentError, match="progress must be"):
        synth.write_model(plan(scale=0.0001), tmp_path / "m.gguf", synth.Fill(tables="none", projections=False),
                          progress="yes")
    with pytest.raises(ArgumentError, match="progress must be"):
        repair_model(tmp_path / "absent.gguf", tmp_path / "r.gguf", progress="yes")
    assert list(tmp_path.iterdir()) == []
