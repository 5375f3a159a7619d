"""Speculative decoding in the simulator (sim.decode.speculative, the decode and serving models, the CLI):
known answers, NumPy twins of the verification batch, monotone tokens/s, the run without drafts unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engram.cli import main
from engram.errors import ArgumentError
from sim.decode import DecodeRun, simulate_decode, step_reads
from sim.decode.speculative import Speculation, accepted_prefix, parse_acceptance, verification_rows
from sim.core.params import Compute, Policy, Storage
from sim.serve import ServeRun, ServeText, simulate_serve
from sim.serve.workload import Workload
from sim.trace import CODE_SOURCE, load_trace

DEVICES = ("vm-virtio-16core-4k", "seed-apple-m3-ultra")  # a slow and a fast device


@pytest.fixture(scope="module")
def trace():
    return load_trace(CODE_SOURCE, limit=1500)


def _drop_wall(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "wall_seconds"}


# ------------------------------------------------------------------ settings
def test_acceptance_profiles_and_bad_input():
    assert parse_acceptance("0.8,0.6") == (0.8, 0.6)
    assert parse_acceptance(0.7) == (0.7,)
    s = Speculation(3, "0.8,0.6")
    np.testing.assert_allclose(s.profile(), [0.8, 0.6, 0.6])
    assert s.expected_tokens() == pytest.approx(1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.6)
    assert not Speculation().on and Speculation(1).on
    for bad in (dict(draft_tokens=-1), dict(draft_tokens=2, acceptance=1.5), dict(draft_tokens=2, acceptance=-0.1),
                dict(draft_tokens=2, acceptance=float("nan")), dict(draft_tokens=1, acceptance="0.8,0.6"),
                dict(draft_tokens=2, acceptance="x"), dict(draft_tokens=True), dict(draft_tokens=1, verify_s=-1.0)):
        with pytest.raises(ArgumentError):
            Speculation(**bad)


def test_accepted_prefix_known_answers():
    rng = np.random.default_rng(0)
    assert (accepted_prefix(Speculation(3, 1.0), rng, 50) == 3).all()
    assert (accepted_prefix(Speculation(3, 0.0), rng, 50) == 0).all()
    assert (accepted_prefix(Speculation(3, "1,0"), rng, 50) == 1).all()
    s = Speculation(3, "0.9,0.5")
    a = accepted_prefix(s, np.random.default_rng(1), 40000)
    # mean accepted prefix = 0.9 + 0.9 * 0.5 + 0.9 * 0.25: within 5 standard errors
    assert abs(a.mean() - (s.expected_tokens() - 1)) < 5 * a.std() / math.sqrt(a.size)
    assert a.min() >= 0 and a.max() <= 3


# ------------------------------------------------------------------ the verification batch
def test_verification_rows_follow_the_trace(trace):
    T, C = trace.steps, trace.columns
    rows, acc, pos = verification_rows(trace, 2, 40, Speculation(2, 1.0), np.random.default_rng(0))
    assert rows.shape == (2, 40, trace.layers, 3 * C) and (acc == 2).all() and (pos == 120).all()
    for s in range(2):
        for t in (0, 7, 39):
            p0 = s * T // 2 + 3 * t
            for j in range(3):
                np.testing.assert_array_equal(rows[s, t, :, j * C:(j + 1) * C], trace.rows[(p0 + j) % T])
    # every draft wrong: the drafts' rows are other rows of the same tables, one position a step
    rows, acc, pos = verification_rows(trace, 1, 40, Speculation(2, 0.0), np.random.default_rng(0))
    assert (acc == 0).all() and pos[0] == 40
    high = trace.rows.max(axis=(0, 2)).astype(np.int64)
    for t in range(40):
        np.testing.assert_array_equal(rows[0, t, :, :C], trace.rows[t])
        drafts = rows[0, t, :, C:]
        assert (drafts >= 0).all() and (drafts <= high[:, None]).all()
        assert (drafts != np.concatenate([trace.rows[t + 1], trace.rows[t + 2]], axis=1)).mean() > 0.99


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 3), acc=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_one_batch_deduplicated_numpy_twin(trace, k, acc, seed):
    """The reads of a verification step are the distinct rows of all its k + 1 tokens, per table."""
    spec = Speculation(k, acc)
    rows, a, pos = verification_rows(trace, 2, 25, spec, np.random.default_rng(seed))
    rd = step_reads(trace, 2, 25, Policy(), batch=(rows, a, pos, trace.columns))
    C = trace.columns
    for s in range(2):
        want = np.array([[np.unique(rows[s, t, li]).size for li in range(trace.layers)] for t in range(25)])
        np.testing.assert_array_equal(rd.reads[s], want)
        drafts = np.array([[np.unique(rows[s, t, li, C:]).size for li in range(trace.layers)] for t in range(25)])
        np.testing.assert_array_equal(rd.drafts[s], drafts)
    kept = sum(np.unique(rows[s, t, li, :(1 + a[s, t]) * C]).size
               for s in range(2) for t in range(25) for li in range(trace.layers))
    assert rd.wasted == sum(int(r.sum()) for r in rd.reads) - kept
    assert rd.requests == 2 * 25 * trace.layers * (k + 1) * C


# ------------------------------------------------------------------ the decode model
@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_no_drafts_is_the_run_it_was(trace, mode):
    kw = dict(compute=Compute(0.02, "gamma", 0.3), run=DecodeRun(sessions=3, steps=60, mode=mode, seed=4))
    a = simulate_decode(trace, "vm-virtio-16core-4k", **kw).to_dict()
    b = simulate_decode(trace, "vm-virtio-16core-4k", speculation=Speculation(0, 0.3, True), **kw).to_dict()
    assert _drop_wall(a) == _drop_wall(b) and "speculative" not in b


def test_all_accepted_emits_k_plus_one_a_step(trace):
    r = simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=100), compute=0.047,
                        speculation=Speculation(2, 1.0))
    sp = r.speculative
    assert sp["tokens"] == 300 and sp["tokens_per_step"] == 3.0 and sp["accepted_share"] == 1.0
    assert sp["wasted_reads"] == 0
    assert r.tokens_per_s == pytest.approx(300 / r.sim_seconds)
    # the tokens of a step come at once: two of every three gaps are 0
    assert sp["tbt_ms"]["p50"] == 0.0 and sp["tbt_ms"]["max"] == pytest.approx(r.step_ms["max"])
    # the summary says why the p50 is 0, and gives the time between steps beside it
    text = r.summary()
    assert "TBT p50 0.000" in text  # the line users script stays
    assert (f"so 0.667 of the gaps are 0; between steps (each step's first token) p50 {r.step_ms['p50']:.3f} "
            f"p99 {r.step_ms['p99']:.3f} ms") in text
    r0 = simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=100), compute=0.047,
                         speculation=Speculation(2, 0.0))
    assert "so 0.000 of the gaps are 0" in r0.summary()
    assert r0.speculative["tokens"] == 100 and r0.speculative["wasted_reads"] > 0
    assert r0.reads == r.reads  # 3 x 48 distinct rows a step either way


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_more_acceptance_never_lowers_tokens_per_s(trace, device, k):
    """One session, fixed k: tokens/s rises with acceptance (the reads a step hardly change, the tokens do)."""
    for pf in (False, True):
        rates = [simulate_decode(trace, device, run=DecodeRun(steps=150, seed=2), compute=0.01,
                                 speculation=Speculation(k, a, pf)).tokens_per_s for a in (0.0, 0.25, 0.5, 0.75, 1.0)]
        assert all(y >= x for x, y in zip(rates, rates[1:])), (pf, rates)


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_never_lowers_tokens_per_s_at_one_session(trace, device):
    for k in (1, 2, 3):
        for a in (0.0, 0.5, 0.9):
            off = simulate_decode(trace, device, run=DecodeRun(steps=150, seed=3), compute=0.01,
                                  speculation=Speculation(k, a))
            on = simulate_decode(trace, device, run=DecodeRun(steps=150, seed=3), compute=0.01,
                                 speculation=Speculation(k, a, True))
            assert on.speculative["tokens"] == off.speculative["tokens"]  # the same drafts and acceptance
            assert on.tokens_per_s >= off.tokens_per_s, (k, a, on.tokens_per_s, off.tokens_per_s)
            assert on.speculative["prefetched_reads"] > 0 and on.stall_ms["mean"] <= off.stall_ms["mean"]


def test_prefetch_hides_the_drafts_reads_when_compute_covers_them(trace):
    """Seed device (fixed latencies), long compute: a prefetched step waits for its confirmed token's rows only:
    its stall is one token's read, the stall of a run without drafts."""
    base = simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=80), compute=0.047)
    on = simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=80), compute=0.047,
                         speculation=Speculation(2, 1.0, True))
    off = simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=80), compute=0.047,
                          speculation=Speculation(2, 1.0))
    assert on.stall_ms["p50"] == pytest.approx(base.stall_ms["p50"], rel=0.02)
    assert off.stall_ms["p50"] > 1.5 * base.stall_ms["p50"]


@pytest.mark.parametrize("pf,sessions,tol", [(False, 1, 0.01), (True, 1, 0.01), (True, 3, 0.04)])
def test_fast_and_exact_agree(trace, pf, sessions, tol):
    """Alone on the device the two modes are one model; shared, within the tolerance of tests/sim/test_decode.py."""
    kw = dict(compute=Compute(2e-3, "lognormal", 0.2), speculation=Speculation(2, 0.6, pf))
    run = dict(steps=150, sessions=sessions, seed=5)
    f = simulate_decode(trace, "vm-virtio-16core-4k", run=DecodeRun(mode="fast", **run), **kw)
    e = simulate_decode(trace, "vm-virtio-16core-4k", run=DecodeRun(mode="exact", **run), **kw)
    assert f.speculative["tokens"] == e.speculative["tokens"]
    assert f.tokens_per_s == pytest.approx(e.tokens_per_s, rel=tol)


def test_prefetch_with_drives_refused(trace):
    with pytest.raises(ArgumentError, match="drives"):
        simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=10), storage=Storage(drives=2), compute=0.01,
                        speculation=Speculation(1, 0.5, True))


# ------------------------------------------------------------------ the serving model
def test_serving_without_drafts_unchanged_and_with_them_more_tokens():
    w = Workload(1.0, 8.0, prompt_tokens="64", output_tokens="40")
    a = simulate_serve(w, text=ServeText(limit=4000), run=ServeRun(seed=1)).row()
    b = simulate_serve(w, text=ServeText(limit=4000), run=ServeRun(seed=1, speculation=Speculation(0))).row()
    assert _drop_wall(a) == _drop_wall(b)
    r1 = simulate_serve(w, text=ServeText(limit=4000), run=ServeRun(seed=1, speculation=Speculation(2, 1.0)))
    assert r1.config["speculation"]["wasted_reads"] == 0
    # every request still emits exactly its 40 tokens, in about a third of the steps
    np.testing.assert_array_equal(r1.per_request["emitted"], r1.per_request["output"])
    assert r1.row()["e2e_mean_ms"] < a["e2e_mean_ms"]
    r2 = simulate_serve(w, text=ServeText(limit=4000), run=ServeRun(seed=1, speculation=Speculation(2, 1.0, True)))
    assert r2.config["speculation"]["prefetched_reads"] > 0
    assert "drafts    2 a step, acceptance 1 (3.000 tokens a verification step expected), prefetch on" in r2.summary()
    assert r2.row()["e2e_mean_ms"] <= r1.row()["e2e_mean_ms"]


def test_serving_refuses_what_it_does_not_model():
    w = Workload(1.0, 4.0, prompt_tokens="64", output_tokens="8")
    with pytest.raises(ArgumentError, match="row caches"):
        simulate_serve(w, "seed-apple-m3-ultra", Policy(cache_rows=100), text=ServeText(limit=4000),
                       run=ServeRun(speculation=Speculation(1)))
    with pytest.raises(ArgumentError, match="prefetch_drafts"):
        simulate_serve(w, "seed-apple-m3-ultra", Policy(overlap_layers=2), text=ServeText(limit=4000),
                       run=ServeRun(speculation=Speculation(1, 0.5, True)))


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("flags", [["--draft-tokens", "-1"], ["--draft-tokens", "2", "--acceptance", "1.5"],
                                   ["--draft-tokens", "2", "--acceptance", "nan"],
                                   ["--draft-tokens", "1", "--acceptance", "0.8,0.6"]])
@pytest.mark.parametrize("cmd", [["sim", "decode", "--limit", "50", "--compute-ms", "10"],
                                 ["sim", "serve", "--duration-s", "2", "--trace-limit", "500"]])
def test_cli_bad_input_one_line_exit_2(capsys, cmd, flags):
    rc = main(cmd + flags)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "draft" in err or "acceptance" in err


@pytest.mark.parametrize("flags", [["--acceptance", "0.5"], ["--prefetch-drafts"], ["--draft-tokens", "0", "--prefetch-drafts"]])
def test_cli_decode_refuses_draft_settings_without_drafts(capsys, flags):
    rc = main(["sim", "decode", "--limit", "50", "--compute-ms", "10", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "only with --draft-tokens" in err, err


@pytest.mark.parametrize("flags", [["--acceptance", "0.5"], ["--prefetch-drafts", "on"],
                                   ["--draft-tokens", "0", "--prefetch-drafts", "off"]])
def test_cli_serve_refuses_draft_settings_without_drafts(capsys, flags):
    rc = main(["sim", "serve", "--duration-s", "2", "--trace-limit", "500", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "only with --draft-tokens" in err, err


def test_cli_decode_json(capsys):
    import json
    rc = main(["sim", "decode", "--limit", "300", "--compute-ms", "20", "--draft-tokens", "2", "--acceptance",
               "1", "--prefetch-drafts", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["speculative"]["tokens_per_step"] == 3.0 and d["config"]["speculation"]["draft_tokens"] == 2
    assert d["speculative"]["prefetched_reads"] > 0


def test_wrap_warning_counts_tokens(trace):
    """A speculative run covers more trace positions than it has steps: its wrap warning counts tokens."""
    r = simulate_decode(trace, "seed-apple-m3-ultra", run=DecodeRun(steps=600), compute=0.01,
                        speculation=Speculation(2, 1.0))
    assert r.wrap["wrapped"] and r.wrap["replays"] == pytest.approx(1800 / trace.steps)
    assert any("each session runs 1800 tokens over a trace of 1500" in w for w in r.warnings)
