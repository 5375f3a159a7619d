"""``engram sim ...``: every subcommand runs, --json parses, bad input is an error exit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engram.cli import main
from sim.decode import reads as decode_reads



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
    assert d["compute_realised"]["mean_ms"] == pytest.approx(0.5, rel=1e-9) and d["compute_realised"]["cv"] == 0
    g = run_json(capsys, ["sim", "prefill", "--limit", "3000", "--compute-tokens-per-s", "2000", "--compute-dist",
                          "gamma", "--compute-cv", "0.3", "--json", "--no-progress"])
    assert g["compute_realised"]["cv"] == pytest.approx(0.3, rel=0.3) and g["config"]["compute"]["cv"] == 0.3
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



@pytest.mark.parametrize("argv, command", [
    (["calibrate", "WORK", "--no-progress"], "calibrate"),
    (["measure", "WORK", "--no-such-option"], "measure"),
    (["crosscheck", "WORK", "--no-such-option"], "crosscheck"),
    (["sim", "decode", "--no-such-option"], "sim decode"),
    (["sim", "capacity", "--no-such-option"], "sim capacity"),
    (["sim", "trace", "reuse", "text:a b", "--cache-bytes", "1M", "--no-such-option"], "sim trace reuse"),
    (["sim", "--no-such-option", "decode"], "sim"),
    (["info", "--no-such-option"], "info"),
])
def test_an_unknown_option_is_refused_with_its_commands_usage(capsys, argv, command):
    """An option a command lacks prints that command's usage and error line, not the top level's
    (``usage: engram [-h] COMMAND ...``, which names no option of the command)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    bad = next(a for a in argv if a.startswith("--no-"))
    assert err.startswith(f"usage: engram {command} [-h]"), err
    assert err.rstrip().splitlines()[-1] == f"engram {command}: error: unrecognized arguments: {bad}"


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_a_fit_target_that_is_not_a_positive_rate_is_refused(capsys, value):
    """--fit-tokens-per-s 0 once fitted the default 19.16 tokens/s instead; NaN and inf reached the fit."""
    assert main(["sim", "decode", "--limit", "50", "--no-progress", "--fit-tokens-per-s", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"engram sim decode: error: --fit-tokens-per-s must be a finite number > 0, got {float(value)}"


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_a_prefill_compute_rate_that_is_not_a_positive_rate_is_refused(capsys, value):
    """--compute-tokens-per-s inf once gave a prefill of no compute; NaN reached the model."""
    assert main(["sim", "prefill", "--limit", "50", "--no-progress", "--compute-tokens-per-s", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"engram sim prefill: error: --compute-tokens-per-s must be a finite number > 0, got {float(value)}"

# ----------------------------------------------------------- compute kept (issue 14.1)
def test_decode_keeps_the_reference_compute_for_every_device(capsys):
    seed = run_json(capsys, ["sim", "decode", "--limit", "600", "--json", "--no-progress"])
    slow = run_json(capsys, ["sim", "decode", "--limit", "600", "--json", "--no-progress",
                             "--device", "ssd:qd1_us=500,iops=20000,parallelism=8"])
    assert slow["fitted_compute"]["compute_ms"] == pytest.approx(seed["fitted_compute"]["compute_ms"], rel=1e-9)
    assert slow["fitted_compute"]["fitted_on"] == "seed-apple-m3-ultra" and not slow["fitted_compute"]["refit"]
    assert slow["tokens_per_s"] < seed["tokens_per_s"] == pytest.approx(20.996, abs=1e-3)  # before: 32.1 > 21.0
    refit = run_json(capsys, ["sim", "decode", "--limit", "600", "--json", "--no-progress", "--refit",
                              "--device", "ssd:qd1_us=500,iops=20000,parallelism=8"])
    assert refit["fitted_compute"]["refit"] and refit["fitted_compute"]["compute_ms"] < 30
    assert main(["sim", "decode", "--limit", "300", "--no-progress", "--device", "ssd:qd1_us=80,iops=500000"]) == 0
    out = capsys.readouterr().out
    assert "fitted on seed-apple-m3-ultra" in out and "kept for ssd-qd1-80us" in out and "phases    random" in out
    assert main(["sim", "decode", "--limit", "50", "--compute-ms", "5", "--refit"]) == 2
    assert "not with --compute-ms" in capsys.readouterr().err


# ---------------------------------------------------- one meaning per flag (issue 19.3)
def test_readers_mean_the_queue_depth_of_either_backend(capsys):
    base = ["sim", "decode", "--limit", "200", "--compute-ms", "1", "--json", "--no-progress"]
    four = run_json(capsys, base + ["--backend", "io_uring", "--readers", "4"])
    assert four["config"]["policy"]["readers"] == 4 and four["config"]["policy"]["backend"] == "io_uring"
    pread = run_json(capsys, base + ["--readers", "4"])
    assert four["step_ms"]["mean"] == pytest.approx(pread["step_ms"]["mean"], rel=1e-12)  # before: a ring of 64
    alias = run_json(capsys, base + ["--backend", "io_uring", "--ring-depth", "4"])
    assert alias["config"]["policy"]["readers"] == 4
    assert main(base + ["--backend", "io_uring", "--ring-depth", "8", "--readers", "4"]) == 2
    assert "deprecated alias of --readers" in capsys.readouterr().err
    assert main(base + ["--ring-depth", "8"]) == 2
    assert "applies to --backend io_uring" in capsys.readouterr().err


def test_flags_that_do_not_apply_are_errors(capsys):
    base = ["sim", "decode", "--limit", "50", "--compute-ms", "1", "--no-progress"]
    for extra, msg in ((["--compute-cv", "0.3"], "constant compute has cv 0"),
                       (["--compute-dist", "exponential", "--compute-cv", "0.3"], "cv 1 by definition"),
                       (["--compute-dist", "normal", "--compute-cv", "3"], "cannot have cv 3"),
                       (["--overlap-layers", "44"], "beyond the model's 43 layers"),
                       (["--bins", "0"], "bins must be >= 1"),
                       (["--calibration", "x.json"], "--calibration applies to --device calibrated"),
                       (["--phases", "often"], "phases"),
                       (["--phases", "random", "--start-spread-ms", "5"], "not both")):
        assert main(base + extra) == 2, extra
        assert msg in capsys.readouterr().err, extra


# -------------------------------------------------------------- phases, wrap (14.4, 14.6)
def test_phases_and_wrapped_traces_in_the_output(capsys, caplog, monkeypatch):
    d = run_json(capsys, ["sim", "decode", "--limit", "200", "--steps", "400", "--sessions", "3", "--compute-ms",
                          "2", "--cache-rows", "5000", "--phases", "lockstep", "--json", "--no-progress"])
    assert d["phases"] == "lockstep" and d["config"]["phases"] == "lockstep"
    assert d["wrap"]["wrapped"] and len(d["warnings"]) == 1 and "trace wraps" in d["warnings"][0]
    caplog.clear()
    monkeypatch.setattr(decode_reads, "_LOGGED", set())  # the log has each warning once per process
    assert main(["sim", "decode", "--limit", "200", "--steps", "400", "--compute-ms", "2", "--cache-rows", "5000",
                 "--no-progress"]) == 0
    assert "WARNING   trace wraps" in capsys.readouterr().out  # the summary
    assert any(r.levelname == "WARNING" and "trace wraps" in r.getMessage() for r in caplog.records)  # the log


# ------------------------------------------------------------- one device syntax (19.2)
def test_every_command_takes_every_device_form(capsys, tmp_path):
    from sim.check.calibrate import calibrate
    from tests.sim.test_calibrate import micro_doc

    cal = str(calibrate(micro_doc()).save(tmp_path / "calibration.json"))
    fio = str(Path(__file__).parent / "data" / "fio-randread-4k-libaio.json")
    base = ["sim", "decode", "--limit", "100", "--compute-ms", "1", "--json", "--no-progress"]
    a = run_json(capsys, base + ["--device", cal])  # before: "unknown kind 'calibration'"
    b = run_json(capsys, base + ["--device", "calibrated", "--calibration", cal])  # before: "unknown device"
    assert a["tokens_per_s"] == b["tokens_per_s"] and a["device"]["name"] == "engine-pread"
    c = run_json(capsys, base + ["--device", "calibrated:io_uring", "--calibration", cal])
    assert c["device"]["name"] == "engine-io_uring"
    f = run_json(capsys, base + ["--device", fio])
    assert f["device"]["name"] == "fio-randread-4k-libaio"
    s = run_json(capsys, base + ["--device", "ssd:qd1_us=80,iops=500000"])  # before: "missing 'parallelism'"
    assert s["config"]["device"]["derived"]["parallelism"]["value"] == 40
    p = run_json(capsys, ["sim", "prefill", "--limit", "500", "--compute-us-per-token", "100", "--device", cal,
                          "--json", "--no-progress"])
    assert p["device"]["name"] == "engine-pread"
    dv = run_json(capsys, ["sim", "device", "calibrated", "--calibration", cal, "--backend", "io_uring", "--json"])
    assert dv["name"] == "engine-io_uring"
    dv = run_json(capsys, ["sim", "device", "ssd:qd1_us=80,iops=500000", "--json"])
    assert dv["derived"]["parallelism"]["value"] == 40
    assert main(["sim", "device", "ssd:qd1_us=80,iops=500000"]) == 0
    assert "derived parallelism = 40" in capsys.readouterr().out


def test_decode_planner_axes(capsys, tmp_path):
    hot = tmp_path / "hot.npy"
    np.save(hot, np.arange(10, dtype=np.int64))
    d = run_json(capsys, ["sim", "decode", "--limit", "300", "--compute-ms", "1", "--sessions", "4", "--drives", "2",
                          "--shared-cache-rows", "100000", "--dram-fraction", "0.25", "--dram-rows", str(hot),
                          "--tail", "vm-virtio-16core-4k", "--json", "--no-progress"])
    assert d["config"]["drives"] == 2 and d["device"]["drives"] == 2 and d["config"]["hot_rows"] == 10
    assert d["dram_hit_rate"] == pytest.approx(0.25, abs=0.03) and d["shared_cache_hit_rate"] > 0
    assert d["config"]["tail"] and "+tail:" in d["device"]["name"]


def _all_parsers():
    """Every parser of the simulator's commands, by its program name."""
    import argparse

    from sim.cli import register
    top = argparse.ArgumentParser(prog="engram")
    register(top.add_subparsers())
    out, todo = {}, [top]
    while todo:
        p = todo.pop()
        out[p.prog] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(a.choices.values())
    return out


def test_no_required_argument_claims_a_default():
    """A positional argument the command requires never says '(default ...)' in its help."""
    bad = [f"{prog} {a.dest}" for prog, p in _all_parsers().items() for a in p._actions
           if not a.option_strings and a.nargs not in ("?", "*", "...", "A...") and a.help
           and "default" in a.help]
    assert not bad, bad


def test_measure_help_counts_its_grids_and_says_what_threads_counts():
    """--quick and the default grid are stated from the grids the command runs; the threads column is explained."""
    from sim.measure import default_grid, quick_grid
    helps = {a.dest: a.help for a in _all_parsers()["engram measure"]._actions}
    q = quick_grid()
    multi = sum(c.multi for c in q)
    assert helps["quick"].startswith(f"small and fast: {len(q) - multi} single-session + {multi} multi-session "
                                     "configurations x 60 steps")
    d = default_grid()
    desc = " ".join(_all_parsers()["engram measure"].description.split())
    assert f"Default grid ({len(d) - sum(c.multi for c in d)} single-session + {sum(c.multi for c in d)} " in desc
    assert "threads: the OS threads of the measuring process" in desc


def test_sim_device_says_why_it_serves_more_reads_than_its_parallelism(capsys):
    from sim.device import load_device
    dev = load_device("ssd:qd1_us=150,iops=90000")
    assert main(["sim", "device", "ssd:qd1_us=150,iops=90000"]) == 0
    out = capsys.readouterr().out
    q, par = dev.saturation_depth(), dev.parallel_reads()
    assert (q, par) == (16, 13)  # the knee 13.5; the closed loop reaches the ceiling at 16
    assert f"derived parallelism = {par}:" in out and f"serves  {q} reads at once" in out
    assert f"{q}, not the parallelism {par}: the shallowest depth of the table from the knee (13.5)" in out
