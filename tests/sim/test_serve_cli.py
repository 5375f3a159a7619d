"""``engram sim serve`` and ``engram sim capacity`` on a serving study: runs, --json, errors, synthetic text."""

from __future__ import annotations

import json

import pytest

from engram.cli import main
from engram.errors import ArgumentError
from sim.serve.search import probes_path
from sim.sweep import read_table
from sim.trace import CODE_SOURCE

SMALL = ["--trace", CODE_SOURCE, "--trace-limit", "8192", "--compute-scale", "20", "--duration-s", "20",
         "--prompt-tokens", "lognormal:mean=200,cv=1,min=16,max=2000", "--output-tokens", "fixed:n=30"]
from sim.serve.study import SERVE_AXES, check_serve_point
from sim.serve import ServeStudy
from sim.serve.search import _rate_search


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_sim_serve_json(capsys):
    d = run_json(capsys, ["sim", "serve", "--rate", "2", "--json", *SMALL])
    assert d["point"]["rate"] == 2.0 and d["config"]["workload"]["duration_s"] == 20.0
    assert d["requests"]["measured"] == d["requests"]["completed"] > 20
    assert d["littles_law"]["requests"]["ratio"] == pytest.approx(1.0, abs=1e-9)
    assert d["slo"]["text"] == "p99 TTFT <= 2 s, p99 TBT <= 100 ms"
    assert set(d["ttft_ms"]) == {"mean", "p50", "p90", "p99", "max"}
    assert d["config"]["compute"]["scale"] == 20.0 and d["config"]["seed"] == 0


def test_sim_serve_text_and_a_study_point(capsys, tmp_path):
    assert main(["sim", "serve", "--rate", "1", "--tbt-ms", "80", "--reuse", "0.3", *SMALL[2:]]) == 0
    out = capsys.readouterr().out
    assert "TTFT ms" in out and "p99 TBT <= 80 ms" in out and "Little" in out
    study = tmp_path / "s.toml"
    study.write_text(f'[study]\nname = "s"\nseed = 4\n[serve]\ntrace = "{CODE_SOURCE}"\ntrace_limit = 8192\n'
                     'duration_s = 15\ncompute_scale = 20\n[grid]\nreaders = [4, 32]\n[slo]\nttft_s = 3.0\n')
    d = run_json(capsys, ["sim", "serve", str(study), "--point", "1", "--rate", "1.5", "--json"])
    assert d["config"]["policy"]["readers"] == 32 and d["slo"]["ttft_s"] == 3.0 and d["point"]["rate"] == 1.5
    assert d["config"]["seed"] != 0  # the study point's seed


def test_sim_capacity_on_a_serving_study(capsys, tmp_path):
    study = tmp_path / "cap.toml"
    study.write_text(f'[study]\nname = "cap"\n[serve]\ntrace = "{CODE_SOURCE}"\ntrace_limit = 8192\n'
                     'duration_s = 20\ncompute_scale = 20\noutput_tokens = "fixed:n=30"\n'
                     'prompt_tokens = "lognormal:mean=200,cv=1,min=16,max=2000"\n'
                     '[grid]\ndevice = ["seed-apple-m3-ultra"]\n[slo]\nttft_s = 1.0\n[search]\nseeds = 1\n')
    out = tmp_path / "cap.csv"
    d = run_json(capsys, ["sim", "capacity", str(study), "--out", str(out), "--jobs", "1", "--quiet", "--json",
                          "--min-rate", "1", "--rate-resolution", "0.2"])
    c = d["configurations"][0]
    assert c["capacity_rps"] > 0 and d["search"]["min_rate"] == 1.0 and d["search"]["resolution"] == 0.2
    rows, meta = read_table(out)
    assert rows[0]["capacity_rps"] == c["capacity_rps"] and meta["slo"]["ttft_s"] == 1.0
    assert len(read_table(probes_path(out))[0]) == rows[0]["probes"]
    assert main(["sim", "capacity", str(study), "--out", str(out), "--jobs", "1", "--quiet", "--target", "20"]) == 2
    assert "session capacity studies" in capsys.readouterr().err
    assert main(["sim", "sweep", str(study), "--out", str(tmp_path / "s.csv"), "--quiet"]) == 2
    assert "is a serving study" in capsys.readouterr().err and not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("argv, match", [
    (["sim", "serve", "--rate", "-1"], "rate"),
    (["sim", "serve", "--gate", "never"], "gate"),
    (["sim", "serve", "--prompt-tokens", "gauss:mean=3"], "unknown kind"),
    (["sim", "serve", "--device", "no-such-device"], "unknown device"),
])
def test_sim_serve_bad_input(capsys, argv, match):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse refuses a value outside the choices (--gate)
        rc = exc.code
    assert rc == 2
    assert match in capsys.readouterr().err


def test_errors_and_progress_labels_say_no_word_twice(capsys):
    """`engram sim serve: error: serve: rate ...`, not `engram sim serve: error: engram sim serve: ...`; a study named like
    its kind gives `capacity: 2/15 searches`, not `capacity capacity: ...`."""
    from sim.core.progress import progress_label
    assert main(["sim", "serve", "--rate", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "engram sim serve: error: serve: rate = 0.0 must be > 0"
    assert progress_label("capacity", "capacity") == "capacity"
    assert progress_label("serve capacity", "serve") == "capacity serve"
    assert progress_label("sweep", "threshold_readers") == "sweep threshold_readers"
    assert progress_label("capacity", "capacity-ssd") == "capacity-ssd"
    for kind, name in (("capacity", "capacity"), ("serve capacity", "serve-policy"), ("sweep", "demo")):
        words = progress_label(kind, name).replace("-", " ").split()
        assert len(words) == len(set(words))


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_an_arrival_cv_outside_its_range_is_refused_naming_it(capsys, tmp_path, value):
    """--cv inf drew gamma gaps of shape 0 (every request at once), and a point's cv = inf passed its check."""
    rule = "the inter-arrival gaps' coefficient of variation: 1 is Poisson, larger is burstier"
    assert main(["sim", "serve", "--arrivals", "gamma", "--cv", value, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"engram sim serve: error: --cv must be a finite number > 0 ({rule}), got {float(value)}"
    point = {**{k: d for k, (_, d, _) in SERVE_AXES.items()}, "arrivals": "gamma", "cv": float(value)}
    with pytest.raises(ArgumentError) as exc:
        check_serve_point(point, "serve")
    assert str(exc.value) == f"serve: cv = {float(value)} must be a finite number > 0 ({rule})"
    study = tmp_path / "s.toml"
    study.write_text(f'[study]\nname = "s"\n[serve]\narrivals = "gamma"\ncv = {value}\n')
    assert main(["sim", "serve", str(study), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"engram sim serve: error: {study}: [serve]: cv = {value} must be finite" if value in ("inf", "nan")
                   else f"engram sim serve: error: {study}: cv = {float(value)} must be a finite number > 0 ({rule})")


def test_the_arrival_cv_help_gives_its_range(capsys):
    with pytest.raises(SystemExit):
        main(["sim", "serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--cv CV inter-arrival CV (gamma) (default 1.0); a finite number > 0, the inter-arrival gaps' "
            "coefficient of variation: 1 is Poisson, larger is burstier; used by --arrivals gamma") in text


def test_the_first_rate_probed_is_the_studys_else_the_default(capsys, tmp_path):
    """The help said 0.5 while studies/serve.toml's search starts at 0.25: the study's [search] value is the
    default of --min-rate, and 0.5 only where the study gives none."""
    from pathlib import Path
    shipped = ServeStudy.load(Path(__file__).resolve().parents[2] / "studies" / "serve.toml")
    assert next(_rate_search(shipped.search)) == shipped.search.min_rate == 0.25
    bare = tmp_path / "bare.toml"
    bare.write_text('[study]\nname = "bare"\n[serve]\nduration_s = 20\n')
    assert next(_rate_search(ServeStudy.load(bare).search)) == 0.5
    with pytest.raises(SystemExit):
        main(["sim", "capacity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--min-rate MIN_RATE requests/s probed first (default: the study's [search] min_rate, else 0.5)" in text
    assert "--max-rate MAX_RATE the largest requests/s probed (default: the study's [search] max_rate, else 64)" in text
    assert "(default: the study's [search] resolution, else 0.05)" in text


def test_sim_serve_per_request_caches_follow_cache_policy(capsys):
    """``--cache-policy`` reaches the per-request row caches, not only the shared one: the two policies give
    different hit rates on the same requests, and the text names the policy that ran."""
    argv = ["sim", "serve", "--rate", "2", "--cache-rows", "500", *SMALL]
    rate = {}
    for name in ("lru", "tinylfu"):
        d = run_json(capsys, [*argv, "--cache-policy", name, "--json"])
        assert d["config"]["policy"]["cache_policy"] == name and d["config"]["policy"]["cache_rows"] == 500
        rate[name] = d["device"]["request_cache_hit_rate"]
        assert 0 < rate[name] < 1
        assert main([*argv, "--cache-policy", name]) == 0
        assert f"cache 500 rows/request ({name}, hit rate {rate[name]:.3f})" in capsys.readouterr().out
    assert rate["lru"] != rate["tinylfu"]
