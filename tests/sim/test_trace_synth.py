"""sim.trace.synth and sim.trace.shape: synthetic traces with a target reuse rate (issue 14.5).

The reuse rate is the share of row reads whose (layer, row) was read earlier in the session, as
``sim.trace.reuse_stats`` counts it; every check below measures it on the hashed rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import Hasher, Layout
from engram.errors import ArgumentError
from sim.trace import (PROFILES, SynthSpec, Trace, load_trace, lru_hit_rate, max_reuse, measure_profile,
                       order_targets, reuse_stats, synthesize)
from sim.trace import synth as synth_module
from sim.trace.shape import match_levels

LAYOUT = Layout.deepseek_v41_flash()
TARGETS = (0.0, 0.1, 0.225, 0.5, 0.8)


@pytest.fixture(scope="module")
def made():
    """(profile, target) -> the 2000-token synthetic trace of seed 0."""
    return {(p, r): synthesize(r, profile=p, tokens=2000, seed=0) for p in ("code", "prose") for r in TARGETS}


# --------------------------------------------------------------------- the target
@pytest.mark.parametrize("profile", ["code", "prose"])
def test_reuse_target_hit_within_one_point(made, profile):
    for r in TARGETS:
        st_ = reuse_stats(made[(profile, r)])
        assert st_.reads == 2000 * 48
        assert abs(st_.reuse_rate - r) <= 0.01, (profile, r, st_.reuse_rate)
        # measured: within half a point at every target (0 exactly, up to a rare hash collision)
        assert abs(st_.reuse_rate - r) <= 0.005, (profile, r, st_.reuse_rate)


def test_other_seeds_and_lengths_hit_the_target():
    for seed, tokens, r in ((1, 600, 0.225), (2, 5000, 0.5), (3, 1000, 0.1), (4, 3000, 0.8)):
        got = reuse_stats(synthesize(r, tokens=tokens, seed=seed)).reuse_rate
        assert abs(got - r) <= 0.01, (seed, tokens, r, got)


def test_rows_are_the_real_hash_of_real_tokens(made, token_map):
    """Each column's rows lie in its prime/offset range, and are the engine's hash of the trace's tokens."""
    hasher = Hasher(LAYOUT, token_map)
    off = LAYOUT.offsets.astype(np.int64)
    pr = LAYOUT.primes.astype(np.int64)
    for key in (("code", 0.225), ("prose", 0.8)):
        tr = made[key]
        assert tr.rows.shape == (2000, 2, 24) and tr.rows.dtype == np.uint32 and tr.starts.tolist() == [0]
        r = tr.rows.astype(np.int64)
        assert np.all((r >= off) & (r < off + pr))
        assert tr.tokens.min() >= 0 and tr.tokens.max() < token_map.size
        assert np.array_equal(tr.rows, hasher.hash(tr.tokens))


def test_reproducible_and_loadable_by_spec(made):
    tr = made[("code", 0.225)]
    assert tr.source == "synth:reuse=0.225,zipf=1.13,tokens=2000,seed=0,profile=code"
    again = load_trace(tr.source)
    assert np.array_equal(again.rows, tr.rows) and np.array_equal(again.tokens, tr.tokens)
    other = load_trace("synth:reuse=0.225,seed=1")
    assert other.steps == 2000 and not np.array_equal(other.rows, tr.rows)
    # a limit makes the trace that long, at the same target
    short = load_trace("synth:reuse=0.5,profile=prose", limit=800)
    assert short.steps == 800 and abs(reuse_stats(short).reuse_rate - 0.5) <= 0.01
    assert short.source == "synth:reuse=0.5,zipf=0.77,tokens=800,seed=0,profile=prose"


def test_saved_synthetic_trace_roundtrips(tmp_path, made):
    tr = made[("prose", 0.1)]
    back = load_trace(str(tr.save(tmp_path / "s.npz")))
    assert np.array_equal(back.rows, tr.rows) and back.source == tr.source


# --------------------------------------------------------------- the real shape
def test_per_order_reuse_follows_the_real_text_shape(made):
    """Every order within 2 points of the profile's shape scaled to the target; at the corpus's own
    rate, within 1 point of the measured orders."""
    for profile, targets in (("code", (0.1, 0.225, 0.5, 0.8)), ("prose", (0.1, 0.225))):
        for r in targets:
            st_ = reuse_stats(made[(profile, r)])
            want = order_targets(PROFILES[profile], r)
            for o in (2, 3, 4):
                assert abs(st_.by_order[o] - want[o]) <= 0.02, (profile, r, o, st_.by_order, want)
            assert st_.by_order[2] > st_.by_order[3] > st_.by_order[4] > 0
    for profile in ("code", "prose"):
        prof = PROFILES[profile]
        st_ = reuse_stats(synthesize(prof.reuse_rate, profile=profile, tokens=2000, seed=5))
        for o in (2, 3, 4):
            assert abs(st_.by_order[o] - prof.by_order[o]) <= 0.01, (profile, o, st_.by_order, prof.by_order)


def test_code_and_prose_keep_their_different_shapes(made):
    """At the same overall rate the code profile repeats long n-grams far more than prose (measured
    on the corpora: 4-gram/2-gram 0.50 vs 0.08)."""
    code, prose = reuse_stats(made[("code", 0.225)]), reuse_stats(made[("prose", 0.225)])
    assert code.by_order[4] / code.by_order[2] > 0.4
    assert prose.by_order[4] / prose.by_order[2] < 0.15
    assert prose.by_order[2] > code.by_order[2]


def test_levels_rise_by_at_most_one(made):
    for key in (("code", 0.5), ("prose", 0.8)):
        lv = match_levels(made[key]).astype(int)
        assert lv[0] == 1 and np.all(np.diff(lv) <= 1)


def test_zipf_skew_sets_locality_not_the_rate():
    """A larger exponent copies from nearer text: a small row cache catches more, the rate stays."""
    flat = synthesize(0.3, zipf=0.0, tokens=3000, seed=0)
    steep = synthesize(0.3, zipf=2.0, tokens=3000, seed=0)
    for tr in (flat, steep):
        assert abs(reuse_stats(tr).reuse_rate - 0.3) <= 0.01
    small = 20 * 48  # the rows of 20 steps
    assert lru_hit_rate(steep, small) > lru_hit_rate(flat, small) + 0.05


# ------------------------------------------------------------------ the profiles
@pytest.mark.parametrize("name", ["code", "prose"])
def test_profiles_are_measured_on_the_shared_corpora(shared_data, name):
    stored = PROFILES[name]
    got = measure_profile(load_trace(stored.source), name=name)
    assert got.by_order == stored.by_order
    assert np.allclose(got.transitions, stored.transitions, atol=1e-4)
    assert (got.window, got.windows, got.zipf, got.min_distance) == (stored.window, stored.windows, stored.zipf,
                                                                      stored.min_distance)


def test_profile_of_a_trace_with_known_repeats():
    """A text repeated verbatim: the second copy's 2-, 3- and 4-grams all repeat (after the seam)."""
    base = load_trace("stdlib:inspect.py", limit=400).tokens
    tr = Trace.from_tokens(np.concatenate([base, base]))
    prof = measure_profile(tr, window=800)
    first = reuse_stats(tr.head(400)).by_order
    for o in (2, 3, 4):
        # the second half repeats everything except n-grams spanning the seam (o - 1 of them)
        expect = (first[o] * 400 + (400 - (o - 1)) + (o - 1) * 0) / 800
        assert abs(prof.by_order[o] - expect) <= (o - 1) / 800 + 1e-4
    assert prof.transitions[3][3] > 0.95


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 0.99), st.sampled_from(["code", "prose"]))
def test_order_targets_properties(r, name):
    prof = PROFILES[name]
    t = order_targets(prof, r)
    assert np.mean(list(t.values())) == pytest.approx(r, abs=1e-9)
    assert t[2] >= t[3] >= t[4] >= 0
    higher = order_targets(prof, min(0.995, r + 0.005))
    assert all(higher[o] >= t[o] for o in (2, 3, 4))


def test_order_targets_at_the_profile_rate_are_the_profile():
    for prof in PROFILES.values():
        t = order_targets(prof, prof.reuse_rate)
        assert all(t[o] == pytest.approx(prof.by_order[o], abs=1e-9) for o in (2, 3, 4))


# ------------------------------------------------------------------- bad input
def test_spec_parsing():
    s = SynthSpec.parse("synth:reuse=0.225, zipf=1.1,tokens=500,seed=7,profile=prose")
    assert (s.reuse, s.zipf, s.tokens, s.seed, s.profile) == (0.225, 1.1, 500, 7, "prose")
    assert SynthSpec.parse(s.spec()) == s
    assert SynthSpec.parse("reuse=0.1").resolved(300) == SynthSpec(0.1, 1.13, 300, 0, "code")
    for bad, msg in (("synth:zipf=1", "needs reuse"), ("synth:reuse=0.2,color=red", "color=red"),
                     ("synth:reuse=abc", "not float"), ("synth:reuse=1.0", r"reuse = 1.0 must be in \[0, 1\)"),
                     ("synth:reuse=0.2,tokens=5", "tokens = 5"), ("synth:reuse=0.2,profile=poetry", "poetry"),
                     ("synth:reuse=0.2,seed=-1", "seed = -1"), ("synth:reuse=0.2,zipf=-1", "zipf = -1")):
        with pytest.raises(ArgumentError, match=msg):
            load_trace(bad)


def test_without_the_shared_corpora_fresh_tokens_come_from_the_python_source(monkeypatch, tmp_path):
    monkeypatch.setenv("ENGRAM_SHARED_DATA", str(tmp_path / "absent"))
    synth_module._corpus.cache_clear()
    try:
        tr = synthesize(0.3, tokens=1000, seed=1)
        ids, _, used = synth_module._corpus(PROFILES["code"].source, None)
        assert used == "stdlib:asyncio/base_events.py"
        assert set(tr.tokens.tolist()) <= set(ids.tolist())
        assert abs(reuse_stats(tr).reuse_rate - 0.3) <= 0.01
    finally:
        synth_module._corpus.cache_clear()


def test_unreachable_rate_is_refused():
    assert max_reuse(100, 7) == pytest.approx(0.9)
    with pytest.raises(ArgumentError, match="above what 100 tokens can reach"):
        synthesize(0.95, tokens=100)
