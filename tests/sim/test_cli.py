"""``engram sim ...``: every subcommand runs, --json parses, bad input is an error exit."""

from __future__ import annotations

import json

import pytest

from engram.cli import main


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_sim_trace(capsys, tmp_path):
    out = tmp_path / "t.npz"
    d = run_json(capsys, ["sim", "trace", "--limit", "600", "--lru", "1000", "--out", str(out), "--json"])
    assert d["tokens"] == 600 and d["reads"] == 28800 and set(d["by_order"]) == {"2", "3", "4"}
    assert d["shape"] == [600, 2, 24] and out.is_file() and "1000" in d["lru"]
    d2 = run_json(capsys, ["sim", "trace", str(out), "--json"])
    assert d2["reuse_rate"] == d["reuse_rate"]
    assert main(["sim", "trace", "--limit", "100"]) == 0
    assert "2-gram" in capsys.readouterr().out


def test_sim_decode_default_is_the_seed_run(capsys):
    d = run_json(capsys, ["sim", "decode", "--limit", "300", "--json", "--no-progress"])
    assert d["fitted_compute"]["threshold"] == 256 and d["fitted_compute"]["tokens_per_s"] == 19.16
    assert abs(d["tokens_per_s"] / 21.06 - 1) < 0.02
    assert d["config"]["policy"]["threshold"] == 8 and d["config"]["device"]["name"] == "seed-apple-m3-ultra"
    assert len(d["timeline"]["queue_depth"]) == 100


def test_sim_decode_options(capsys):
    d = run_json(capsys, ["sim", "decode", "--limit", "200", "--steps", "300", "--sessions", "2", "--compute-ms",
                          "2", "--device", "ssd:qd1_us=80,iops=200000,parallelism=8", "--backend", "io_uring",
                          "--ring-depth", "24", "--cache-rows", "5000", "--overlap-layers", "5", "--mode", "exact",
                          "--compute-dist", "gamma", "--compute-cv", "0.2", "--seed", "3", "--json"])
    assert d["config"]["sessions"] == 2 and d["config"]["steps"] == 300 and d["config"]["mode"] == "exact"
    assert d["config"]["trace"]["wrapped"] is True and d["cache_hit_rate"] > 0
    assert len(d["tokens_per_s_per_session"]) == 2


def test_sim_prefill(capsys):
    d = run_json(capsys, ["sim", "prefill", "--trace", "stdlib:asyncio/base_events.py", "--limit", "3000",
                          "--chunk", "1024", "--compute-tokens-per-s", "2000", "--json", "--no-progress"])
    assert d["tokens"] == 3000 and d["config"]["chunks"] == 3 and d["prefill_seconds"] >= 1.5
    assert main(["sim", "prefill", "--limit", "500", "--trace", "text:" + "hello world " * 200,
                 "--compute-us-per-token", "100"]) == 0
    assert "stalls" in capsys.readouterr().out


def test_sim_device(capsys, tmp_path):
    assert "seed-apple-m3-ultra" in run_json(capsys, ["sim", "device", "--json"])["presets"]
    path = tmp_path / "d.json"
    d = run_json(capsys, ["sim", "device", "seed-apple-m3-ultra", "--qd", "1,16", "--save", str(path), "--json"])
    assert [r["qd"] for r in d["table"]] == [1, 16] and d["table"][0]["mean_us"] == pytest.approx(107.9)
    d2 = run_json(capsys, ["sim", "device", str(path), "--json"])
    assert d2["table"][:2] == d["table"]


def test_errors_exit_2(capsys):
    assert main(["sim", "decode", "--device", "nope", "--limit", "10"]) == 2
    assert "unknown device" in capsys.readouterr().err
    assert main(["sim", "trace", "stdlib:no/such.py"]) == 2
    assert main(["sim", "decode", "--limit", "10", "--fit-tokens-per-s", "5000"]) == 2
    assert "cannot reach" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim", "prefill"])  # a compute speed is required
