"""sim.serve.workload: arrivals, lengths, requests files, common random numbers across rates."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engram import ArgumentError, FormatError
from sim.core.limits import MAX_REQUEST_TOKENS
from sim.serve.workload import Lengths, Workload, make_requests, read_request_file
from tests.clirun import cli
from sim.trace.tokens import encode_text


@pytest.mark.parametrize("spec, kind, lo, hi", [
    ("512", "fixed", 512, 512),
    ("fixed:n=64", "fixed", 64, 64),
    ("uniform:min=16,max=2048", "uniform", 16, 2048),
    ("lognormal:mean=512,cv=1,min=16,max=16384", "lognormal", 16, 16384),
    ("exponential:mean=256,min=2", "exponential", 2, 1 << 20),
    ("file", "file", 1, 1 << 20),
])
def test_lengths_parse_and_spec_round_trip(spec, kind, lo, hi):
    lg = Lengths.parse(spec)
    assert (lg.kind, lg.lo, lg.hi) == (kind, lo, hi)
    assert Lengths.parse(lg.spec()) == lg


@pytest.mark.parametrize("bad", ["gauss:mean=3", "lognormal:cv=1", "uniform:min=5", "fixed:n=0", "lognormal:mean=x",
                                 "uniform:min=9,max=3", "lognormal:mean=10,sigma=2", "fixed:m=3"])
def test_lengths_reject(bad):
    with pytest.raises(ArgumentError):
        Lengths.parse(bad)


def test_lognormal_lengths_have_their_mean_and_cv():
    x = Lengths.parse("lognormal:mean=512,cv=1").draw(np.random.default_rng(0), 200_000)
    assert abs(x.mean() / 512 - 1) < 0.02
    assert abs(x.std() / x.mean() - 1.0) < 0.05
    y = Lengths.parse("lognormal:mean=512,cv=1,min=100,max=600").draw(np.random.default_rng(0), 10_000)
    assert y.min() == 100 and y.max() == 600


@pytest.mark.parametrize("arrivals, cv, want_cv", [("poisson", 1.0, 1.0), ("gamma", 3.0, 3.0), ("gamma", 0.5, 0.5),
                                                   ("constant", 1.0, 0.0)])
def test_arrival_processes_have_their_rate_and_burstiness(arrivals, cv, want_cv):
    w = Workload(rate=50.0, duration=400.0, arrivals=arrivals, cv=cv, prompt_tokens="16", output_tokens="4")
    r = make_requests(w, seed=3)
    gaps = np.diff(r.arrival)
    n = len(r)
    assert abs(n / (50 * 400) - 1) < 4 * want_cv / math.sqrt(20_000) + 1e-3
    assert abs(gaps.mean() - 0.02) < 0.02 * (0.05 * max(want_cv, 0.2))
    assert abs(gaps.std() / gaps.mean() - want_cv) < 0.06 * max(want_cv, 0.1) + 1e-9
    assert np.all(r.arrival >= 0) and np.all(r.arrival < 400) and np.all(gaps >= 0)


def test_requests_are_the_same_at_every_rate():
    """Common random numbers: request i has the same lengths and draw whatever the rate; only the time scales."""
    base = dict(duration=100.0, prompt_tokens="lognormal:mean=300,cv=1", output_tokens="uniform:min=2,max=50")
    a = make_requests(Workload(rate=2.0, **base), seed=11)
    b = make_requests(Workload(rate=8.0, **base), seed=11)
    n = len(a)
    assert len(b) > 3 * n
    assert np.array_equal(a.prompt, b.prompt[:n]) and np.array_equal(a.output, b.output[:n])
    assert np.array_equal(a.draw, b.draw[:n])
    assert np.allclose(a.arrival, b.arrival[:n] * 4.0, rtol=1e-12)
    c = make_requests(Workload(rate=2.0, **base), seed=12)
    assert not np.array_equal(a.prompt[:50], c.prompt[:50])


def test_requests_file_lengths_come_from_the_real_tokenizer(shared_data):
    f = read_request_file(shared_data / "prompts.jsonl")
    lines = [json.loads(x) for x in (shared_data / "prompts.jsonl").read_text().splitlines() if x.strip()]
    assert len(f) == len(lines) == 100
    for i in (0, 17, 99):
        assert f.prompt_tokens[i] == encode_text(lines[i]["prompt"]).size == f.tokens[i].size
        assert f.ids[i] == lines[i]["id"]
    w = Workload(rate=5.0, duration=40.0, prompt_tokens="file", output_tokens="fixed:n=32",
                 requests=str(shared_data / "prompts.jsonl"))
    r = make_requests(w, 0, f)
    assert np.array_equal(r.source, np.arange(len(r)) % 100)
    assert np.array_equal(r.prompt, f.prompt_tokens[r.source])


def test_replayed_timestamps_are_scaled_to_the_rate(tmp_path):
    p = tmp_path / "trace.jsonl"
    t = [0.0, 1.0, 1.5, 4.0, 10.0]
    p.write_text("\n".join(json.dumps({"id": f"r{i}", "prompt_tokens": 100 + i, "output_tokens": 7, "arrival_s": x})
                           for i, x in enumerate(t)))
    f = read_request_file(p)
    as_is = make_requests(Workload(rate=0.0, duration=100.0, arrivals="replay", prompt_tokens="file",
                                   output_tokens="file", requests=str(p)), 0, f)
    assert np.allclose(as_is.arrival, t)
    assert np.array_equal(as_is.prompt, [100, 101, 102, 103, 104]) and np.all(as_is.output == 7)
    fast = make_requests(Workload(rate=4.0, duration=100.0, arrivals="replay", prompt_tokens="file",
                                  output_tokens="file", requests=str(p)), 0, f)
    assert np.allclose(fast.arrival, np.asarray(t) * (4 / 10) / 4.0)  # mean gap 2.5 s -> 0.25 s
    assert np.all(fast.source == -1)  # no prompt text: stretches of the text


@pytest.mark.parametrize("lines, match", [
    ([{"id": "a"}], "prompt"),
    ([{"prompt": "x", "arrival_s": 1.0}, {"prompt": "y"}], "arrival_s on some lines"),
    ([{"prompt": "x", "output_tokens": -3}], "output_tokens"),
    ([{"prompt": 7}], "prompt must be a string"),
    ([{"prompt_tokens": 5, "arrival_s": "soon"}], "arrival_s"),
])
def test_bad_requests_files_name_the_line(tmp_path, lines, match):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines))
    with pytest.raises(FormatError, match=match):
        read_request_file(p)


@pytest.mark.parametrize("kw, match", [
    (dict(rate=0.0), "rate"), (dict(rate=1.0, duration=0.0), "duration"),
    (dict(rate=1.0, arrivals="bursty"), "unknown process"), (dict(rate=1.0, arrivals="gamma", cv=0.0), "cv"),
    (dict(rate=1.0, arrivals="replay"), "requests file"), (dict(rate=1.0, prompt_tokens="file"), "requests file"),
])
def test_bad_workloads(kw, match):
    with pytest.raises(ArgumentError, match=match):
        Workload(**kw)


# ------------------------------------------------------------------ every length source is bounded
HUGE = 10 ** 12


@pytest.mark.parametrize("flag, spec", [
    ("--prompt-tokens", f"fixed:n={HUGE}"), ("--output-tokens", f"fixed:n={HUGE}"), ("--prompt-tokens", str(HUGE)),
    ("--prompt-tokens", f"uniform:min=1,max={HUGE}"), ("--output-tokens", f"lognormal:mean=256,cv=1,max={HUGE}"),
    ("--output-tokens", f"exponential:mean={HUGE}"), ("--prompt-tokens", f"lognormal:mean={HUGE}"),
])
def test_a_drawn_length_past_the_longest_request_is_refused(capsys, flag, spec):
    """Drawn lengths (every spelling): past sim.core.limits.MAX_REQUEST_TOKENS, one line and exit 2 before anything
    is drawn (fixed:n=10^12 ended in a NumPy allocation traceback, or hung)."""
    err = cli(capsys, ["sim", "serve", flag, spec, "--rate", "1", "--duration-s", "5"])
    assert "sim.core.limits.MAX_REQUEST_TOKENS" in err and str(MAX_REQUEST_TOKENS) in err, err
    with pytest.raises(ArgumentError, match="MAX_REQUEST_TOKENS"):
        Lengths.parse(spec)


@pytest.mark.parametrize("field", ["prompt_tokens", "output_tokens"])
def test_a_requests_file_length_past_the_longest_request_is_refused(tmp_path, capsys, field):
    """File lengths: a line's prompt_tokens or output_tokens past the bound names the line (it ran without bound,
    15 GB resident)."""
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"prompt_tokens": 100, "output_tokens": 10}) + "\n"
                 + json.dumps({"prompt_tokens": 100, "output_tokens": 10, field: HUGE}) + "\n")
    err = cli(capsys, ["sim", "serve", "--requests", str(f), "--prompt-tokens", "file", "--output-tokens", "file",
                       "--rate", "1", "--duration-s", "5"])
    assert f"{f}: line 2: {field} = {HUGE}" in err and "MAX_REQUEST_TOKENS" in err, err
    with pytest.raises(FormatError, match=f"line 2: {field}"):
        read_request_file(f, encode=lambda s: [1])


def test_a_requests_file_that_nothing_reads_is_refused(tmp_path, capsys):
    """--requests F with drawn lengths and drawn arrivals read F and ignored it: now refused, naming what would
    read it."""
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"prompt_tokens": 100, "output_tokens": 10}) + "\n")
    err = cli(capsys, ["sim", "serve", "--requests", str(f), "--rate", "1", "--duration-s", "5"])
    assert "nothing would be read from it" in err and "--prompt-tokens file" in err, err
    with pytest.raises(ArgumentError, match="nothing would be read"):
        Workload(1.0, 5.0, requests=str(f))
    # any one reader of the file makes it meaningful
    for kw in ({"prompt_tokens": "file"}, {"output_tokens": "file"}):
        assert Workload(1.0, 5.0, requests=str(f), **kw).requests == str(f)


def test_the_longest_request_is_accepted(tmp_path):
    w = Workload(1.0, 5.0, prompt_tokens=f"fixed:n={MAX_REQUEST_TOKENS}")
    assert make_requests(w, 0).prompt.max() == MAX_REQUEST_TOKENS
