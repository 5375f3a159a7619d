"""``engram sim trace`` and its subcommands: stats (the default), synth, profile, iolog."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engram import synth
from engram.cli import main
from sim.trace import Trace, load_trace, reuse_stats
from tests.modelfiles import token_map


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_default_subcommand_keeps_the_old_form(capsys, tmp_path):
    out = tmp_path / "t.npz"
    d = run_json(capsys, ["sim", "trace", "--limit", "300", "--out", str(out), "--json"])
    assert d["tokens"] == 300 and out.is_file() and "run" not in d
    again = run_json(capsys, ["sim", "trace", str(out), "--json"])
    explicit = run_json(capsys, ["sim", "trace", "stats", str(out), "--json"])
    assert again["reuse_rate"] == explicit["reuse_rate"] == d["reuse_rate"]
    # options before the source still count
    d = run_json(capsys, ["sim", "trace", "--limit", "100", str(out), "--json"])
    assert d["tokens"] == 100


def test_planned_run_wraps(capsys):
    d = run_json(capsys, ["sim", "trace", "--limit", "600", "--steps", "6000", "--json"])
    assert d["run"]["wraps"] and d["run"]["replayed_steps"] == 5400 and d["run"]["laps"] == 10.0
    assert main(["sim", "trace", "--limit", "600", "--steps", "6000"]) == 0
    assert "WARNING   1 session(s) x 6000 steps" in capsys.readouterr().out
    d = run_json(capsys, ["sim", "trace", "--limit", "600", "--steps", "200", "--sessions", "3", "--json"])
    assert not d["run"]["wraps"] and not d["run"]["overlaps"] and d["run"]["warning"] is None
    d = run_json(capsys, ["sim", "trace", "--limit", "600", "--steps", "300", "--sessions", "3", "--json"])
    assert d["run"]["overlaps"] and d["run"]["shared_steps"] == 300


def test_synth(capsys, tmp_path):
    out = tmp_path / "s.npz"
    d = run_json(capsys, ["sim", "trace", "synth", "--reuse", "0.3", "--tokens", "1500", "--seed", "4",
                          "--out", str(out), "--lru", "4800", "--json"])
    assert d["spec"] == "synth:reuse=0.3,zipf=1.13,tokens=1500,seed=4,profile=code"
    assert abs(d["stats"]["reuse_rate"] - 0.3) <= 0.01 and d["shape"] == [1500, 2, 24]
    saved = Trace.load(out)
    assert reuse_stats(saved).reuse_rate == d["stats"]["reuse_rate"]
    assert np.array_equal(load_trace(d["spec"]).rows, saved.rows)       # the spec rebuilds it
    # every command takes the spec as a trace source
    d2 = run_json(capsys, ["sim", "trace", "synth:reuse=0.3,tokens=1500,seed=4", "--json"])
    assert d2["reuse_rate"] == d["stats"]["reuse_rate"]
    d3 = run_json(capsys, ["sim", "decode", "--trace", "synth:reuse=0.3,tokens=500", "--compute-ms", "40",
                           "--cache-rows", "100000", "--no-progress", "--json"])
    assert abs(d3["cache_hit_rate"] - 0.3) <= 0.01
    assert main(["sim", "trace", "synth", "--reuse", "0.5", "--profile", "prose", "--tokens", "800"]) == 0
    text = capsys.readouterr().out
    assert "profile=prose" in text and "(target 0.5000)" in text


def test_profile(capsys):
    d = run_json(capsys, ["sim", "trace", "profile", "stdlib:asyncio/base_events.py", "--limit", "4000",
                          "--window", "1000", "--json"])
    assert d["windows"] == 4 and set(d["by_order"]) == {"2", "3", "4"} and len(d["transitions"]) == 4
    assert d["by_order"]["2"] >= d["by_order"]["3"] >= d["by_order"]["4"]


def test_iolog(capsys, tmp_path):
    log = tmp_path / "a.iolog"
    d = run_json(capsys, ["sim", "trace", "iolog", "synth:reuse=0.2,tokens=100", "--out", str(log), "--json"])
    assert d["reads"] == 4800 and d["version"] == 2 and d["block"] == 4096 and d["logs"] == [str(log)]
    lines = log.read_text().splitlines()
    assert lines[0] == "fio version 2 iolog" and len(lines) == 4800 + 4
    assert "--replay_redirect=" in d["fio"]
    tr = load_trace("synth:reuse=0.2,tokens=100")
    path = tmp_path / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=0.0003, token_map=token_map()),
                      synth.Fill(trace=tr.tokens, projections=False), progress=False)
    d = run_json(capsys, ["sim", "trace", "iolog", "synth:reuse=0.2,tokens=100", "--model", str(path), "--out",
                          str(tmp_path / "b.iolog"), "--sessions", "2", "--steps", "80", "--tokens-per-s", "20",
                          "--json"])
    assert d["version"] == 3 and d["step_us"] == 50000 and d["sessions"] == 2
    assert d["logs"] == [str(tmp_path / "b.s0.iolog"), str(tmp_path / "b.s1.iolog")]
    assert d["run"]["overlaps"] and d["block_source"] != "given"
    first = (tmp_path / "b.s1.iolog").read_text().splitlines()
    assert first[0] == "fio version 3 iolog" and first[-2].startswith(f"{1 + 79 * 50000} ")
    assert main(["sim", "trace", "iolog", "synth:reuse=0.2,tokens=100", "--out", str(tmp_path / "c.iolog")]) == 0
    assert "replay    fio " in capsys.readouterr().out


IOLOG = ["sim", "trace", "iolog", "synth:reuse=0.2,tokens=50", "--out", "x.iolog"]


@pytest.mark.parametrize("argv, message", [
    (["sim", "trace", "synth", "--reuse", "1.5"], "reuse = 1.5"),
    (["sim", "trace", "synth", "--reuse", "0.99", "--tokens", "100"], "above what 100 tokens can reach"),
    (["sim", "trace", "synth:reuse=0.2,bogus=1"], "bogus=1"),
    (IOLOG + ["--block-size", "auto"], "needs --model"),
    (IOLOG + ["--block-size", "1000"], "power of two"),
    (["sim", "trace", "--limit", "50", "--steps", "0"], "steps must be >= 1"),
])
def test_bad_input_is_an_error_exit(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.iolog").exists()


def test_help_of_every_subcommand(capsys):
    for sub in ("stats", "synth", "profile", "iolog"):
        with pytest.raises(SystemExit) as e:
            main(["sim", "trace", sub, "--help"])
        assert e.value.code == 0
    assert "synth" in capsys.readouterr().out
