"""sim.serve.compute: the default step compute (SPEC §8 step, ds4 prefill), the fit to measured steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engram import ArgumentError, FormatError
from sim.decode import reference_compute
from sim.serve.compute import DS4_PREFILL_TOKENS_PER_S, REFERENCE_STEP_MS, StepCompute, default_token_ms


def test_the_default_is_the_reference_step_and_the_ds4_prefill():
    assert REFERENCE_STEP_MS == pytest.approx(reference_compute() * 1e3, abs=5e-4)
    sc = StepCompute.reference()
    assert sc.mean_ms(1) == pytest.approx(47.013)
    assert default_token_ms() == pytest.approx(1000 / 468.03) and DS4_PREFILL_TOKENS_PER_S == 468.03
    tok = 1000 / 468.03
    assert sc.mean_ms(1, 100) == pytest.approx(47.013 + 100 * tok)
    assert sc.mean_ms(33) == pytest.approx(47.013 + 32 * tok)
    assert sc.mean_ms(0, 2048) == pytest.approx(47.013 + 2047 * tok)  # a prefill-only step: a token of its own
    assert sc.ceiling_tokens_per_s() == pytest.approx(468.03)
    fast = StepCompute.reference(scale=20)
    assert fast.mean_ms(8, 64) == pytest.approx(sc.mean_ms(8, 64) / 20)


def test_knots_interpolate_and_extend():
    sc = StepCompute(((1, 10.0), (4, 13.0), (8, 21.0)), 0.5)
    assert sc.mean_ms(2) == pytest.approx(11.0)
    assert sc.mean_ms(6) == pytest.approx(17.0)
    assert sc.mean_ms(12) == pytest.approx(29.0)  # last slope 2 ms a request
    assert sc.mean_ms(0) == pytest.approx(10.0)   # below the first knot: its value
    assert sc.mean_ms(4, 10) == pytest.approx(18.0)


def test_fit_recovers_measured_steps(tmp_path):
    rng = np.random.default_rng(0)
    truth = lambda b, p: 12.0 + 0.7 * b + 0.05 * p  # noqa: E731
    recs = [{"batch": int(b), "prompt_tokens": int(p), "ms": truth(b, p) * (1 + rng.normal(0, 0.002))}
            for b in (1, 2, 4, 8, 16, 32) for p in (0, 0, 128, 512)]
    csv = tmp_path / "steps.csv"
    csv.write_text("batch,prompt_tokens,ms\n" + "\n".join(f"{r['batch']},{r['prompt_tokens']},{r['ms']}" for r in recs))
    js = tmp_path / "steps.json"
    js.write_text(json.dumps({"steps": recs}))
    for path in (csv, js):
        sc = StepCompute.from_file(path)
        assert sc.token_ms == pytest.approx(0.05, rel=0.02)
        for b, p in ((1, 0), (16, 0), (8, 300), (64, 1000)):
            assert sc.mean_ms(b, p) == pytest.approx(truth(b, p), rel=0.01)
        assert sc.fit["points"] == 24 and sc.fit["max_rel"] < 0.01
    plane = StepCompute.fitted([r for r in recs if r["prompt_tokens"]])  # no prompt-free step: the plane
    assert plane.mean_ms(10, 200) == pytest.approx(truth(10, 200), rel=0.01)


@pytest.mark.parametrize("recs, match", [
    ([{"batch": 1, "prompt_tokens": 0, "ms": 5}], "at least two"),
    ([{"batch": 1, "prompt_tokens": 0, "ms": 5}, {"batch": 2, "prompt_tokens": 0, "ms": 6}], "prompt tokens"),
    ([{"batch": 1, "ms": 5}, {"batch": 2, "prompt_tokens": 0, "ms": 6}], "record 0"),
    ([{"batch": 1, "prompt_tokens": 0, "ms": 50}, {"batch": 1, "prompt_tokens": 100, "ms": 10}], "negative"),
])
def test_fit_refuses_bad_measurements(recs, match):
    with pytest.raises(FormatError, match=match):
        StepCompute.fitted(recs)


@pytest.mark.parametrize("kw", [dict(knots=()), dict(knots=((2, 1.0), (1, 2.0))), dict(knots=((1, -1.0),)),
                                dict(knots=((1, 1.0),), scale=0.0), dict(knots=((1, 1.0),), dist="normal", cv=2.0)])
def test_bad_step_computes(kw):
    with pytest.raises(ArgumentError):
        StepCompute(token_ms=1.0, **kw)


def test_spread_has_mean_one():
    sc = StepCompute.reference(dist="gamma", cv=0.3)
    m = sc.multipliers(np.random.default_rng(2), 100_000)
    assert abs(m.mean() - 1) < 0.005 and abs(m.std() - 0.3) < 0.01
    assert np.all(StepCompute.reference().multipliers(np.random.default_rng(2), 5) == 1.0)
