"""Every subcommand that writes a file refuses an output path whose folder does not exist: one line, exit 2, and
nothing made (issue 24: ``--out /nonexistent/x.csv`` made the folder; ``engram report`` on a missing folder left
empty ``data/ figures/ inputs/`` behind).  The file outputs are found by walking the command tree, so a new
subcommand with ``--out`` or ``--save`` that this test does not run fails it."""

from __future__ import annotations

import argparse

import pytest

from engram import synth
from engram.cli import build_parser
from tests.clirun import cli
from tests.modelfiles import token_map as _token_map

SWEEP = '[study]\nname = "s"\n[fixed]\ntrace_limit = 100\nsteps = 50\ncompute_ms = 10.0\n[grid]\nreaders = [4, 8]\n'
CAPACITY = ('[study]\nname = "c"\n[capacity]\ntarget = 20.0\nseeds = 1\nmax_sessions = 4\n'
            '[fixed]\ntrace_limit = 100\nsteps = 50\ncompute = "reference"\n')

#: (command words, the output option, the file name, the rest of the arguments) of every file output;
#: "{m}" is a small model file, "{s}" a study file.  calibrate and crosscheck read a measurement folder:
#: tests/sim/test_bad_documents.py runs them (test_calibrate_and_crosscheck_refuse_a_missing_output_folder).
FILE_OUTPUTS = {
    ("synth",): (None, "m.gguf", ["--scale", "0.0001", "--no-progress", "--no-projections"]),
    ("repair",): (None, "r.gguf", ["{m}", "--no-progress"]),
    ("sim", "trace"): ("--out", "t.npz", ["stdlib:asyncio/base_events.py", "--limit", "100"]),
    ("sim", "trace", "stats"): ("--out", "t.npz", ["stdlib:asyncio/base_events.py", "--limit", "100"]),
    ("sim", "trace", "synth"): ("--out", "t.npz", ["--reuse", "0.3", "--tokens", "200"]),
    ("sim", "trace", "iolog"): ("--out", "t.iolog", ["stdlib:asyncio/base_events.py", "--limit", "50",
                                                      "--model", "{m}"]),
    ("sim", "device"): ("--save", "d.json", ["seed-apple-m3-ultra"]),
    ("sim", "sweep"): ("--out", "s.csv", ["{s}", "--jobs", "1", "--quiet"]),
    ("sim", "capacity"): ("--out", "c.csv", ["{s}", "--jobs", "1", "--quiet"]),
}
STUDIES = {("sim", "sweep"): SWEEP, ("sim", "capacity"): CAPACITY}
ELSEWHERE = {("calibrate",), ("crosscheck",)}
#: Folder outputs: the command makes the folder (and its parents), after its inputs are checked.
FOLDER_OUTPUTS = {("report",), ("demo",), ("measure",)}


def _file_outputs() -> set:
    """Every (command words) whose parser has an output file option (--out, --save) or an ``out`` argument."""
    found = set()

    def walk(parser, words):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, words + (name,))
            elif a.dest in ("out", "save", "output"):
                found.add(words)

    for top in ("sim", "synth", "repair", "calibrate", "crosscheck", "report", "demo", "measure"):
        walk(build_parser([top]), ())
    return found


def test_every_output_option_is_walked():
    assert _file_outputs() - FOLDER_OUTPUTS == set(FILE_OUTPUTS) | ELSEWHERE


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("out-model") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=0.0001, token_map=_token_map(), seed=3),
                      synth.Fill(projections=False), progress=False)
    return path


@pytest.mark.parametrize("words", sorted(FILE_OUTPUTS), ids=lambda w: "-".join(w))
@pytest.mark.parametrize("where", ["missing", "missing/deeper", "a-file/below"])
def test_an_output_in_a_missing_folder_is_refused_and_nothing_made(tmp_path, capsys, model_file, words, where):
    option, name, rest = FILE_OUTPUTS[words]
    study = tmp_path / "study.toml"
    study.write_text(STUDIES.get(words, SWEEP))
    (tmp_path / "a-file").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    target = tmp_path / where / name
    rest = [a.replace("{m}", str(model_file)).replace("{s}", str(study)) for a in rest]
    args = [*words, *rest, *([option, str(target)] if option else [str(target)])]
    if words == ("repair",):  # MODEL OUT
        args = [*words, rest[0], str(target), *rest[1:]]
    err = cli(capsys, args)
    top = where.split("/")[0]
    assert str(tmp_path / top) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made, nothing half-written
    assert ("is a file" in err) if top == "a-file" else ("does not exist" in err), err


def test_report_on_a_missing_measurement_folder_makes_nothing(tmp_path, capsys):
    out = tmp_path / "report"
    err = cli(capsys, ["report", str(tmp_path / "no-such-folder"), "--out", str(out), "--quick", "--quiet"])
    assert "no-such-folder" in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_report_with_a_missing_sweep_table_makes_nothing(tmp_path, capsys):
    out = tmp_path / "deep" / "report"
    err = cli(capsys, ["report", "--sweep", str(tmp_path / "no.csv"), "--out", str(out), "--quick", "--quiet"])
    assert "no.csv" in err and not (tmp_path / "deep").exists()
