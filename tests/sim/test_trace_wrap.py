"""sim.trace.wrap: whether sessions x steps read past the end of a trace (issue 14.6, trace side)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import ArgumentError
from sim.decode import session_reads
from sim.trace import Trace, WrapInfo, session_offsets, wrap_info


def step_trace(T: int) -> Trace:
    """A trace whose rows name their step: every read of step t is a row no other step reads."""
    rows = (np.arange(T, dtype=np.uint32)[:, None, None] * 48 + np.arange(48, dtype=np.uint32).reshape(1, 2, 24))
    return Trace(rows.astype(np.uint32), np.zeros(T, np.int64))


def brute(T: int, steps: int, sessions: int):
    """Per-session trace steps read, with the decode model's start rule written out."""
    idx = [(s * T // sessions + np.arange(steps)) % T for s in range(sessions)]
    allsteps = np.concatenate(idx)
    replays = [steps - np.unique(i).size for i in idx]
    return replays, np.unique(allsteps).size


def test_known_cases():
    w = wrap_info(600, 6000, 1)
    assert (w.wraps, w.overlaps, w.laps, w.replayed_steps) == (True, True, 10.0, 5400)
    assert w.replayed_fraction == 0.9 and w.covered_steps == 600 and w.shared_steps == 5400
    assert "wraps (10.00 laps)" in w.warning() and "5400 of its 6000 steps (90.0%)" in w.warning()
    w = wrap_info(600, 600, 1)
    assert not w.wraps and not w.overlaps and w.warning() is None and "no wrap" in w.summary()
    w = wrap_info(600, 400, 2)   # starts 0 and 300: steps 300..399 read by both
    assert not w.wraps and w.overlaps and w.covered_steps == 600 and w.shared_steps == 200
    assert "200 steps (25.0%)" in w.warning() and ">= 800 steps" in w.warning()
    w = wrap_info(600, 150, 4)   # starts 0, 150, 300, 450: a perfect tiling
    assert not w.overlaps and w.covered_steps == 600 and w.warning() is None
    assert list(session_offsets(600, 4)) == [0, 150, 300, 450]
    assert list(session_offsets(3, 5)) == [0, 0, 1, 1, 2]


def test_trace_wraps_matches_the_decode_model():
    """A per-session cache that never evicts hits exactly the replayed steps' rows in sim.decode."""
    tr = step_trace(50)
    for steps, sessions in ((50, 1), (51, 1), (130, 1), (40, 3), (120, 2), (7, 9)):
        w = tr.wraps(steps, sessions)
        assert isinstance(w, WrapInfo)
        _, hits = session_reads(tr, sessions, steps, cache_rows=10**6)
        assert hits == sessions * w.replayed_steps * 48
        assert w.wraps == (hits > 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 200), st.integers(1, 20))
def test_wrap_info_equals_brute_force(T, steps, sessions):
    w = wrap_info(T, steps, sessions)
    replays, covered = brute(T, steps, sessions)
    assert all(r == w.replayed_steps for r in replays)
    assert w.covered_steps == covered
    assert w.shared_steps == sessions * steps - covered
    assert w.overlaps == (sessions * steps > covered)
    assert w.to_dict()["wraps"] == (steps > T)


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="steps must be >= 1"):
        wrap_info(10, 0)
    with pytest.raises(ArgumentError, match="sessions must be >= 1"):
        wrap_info(10, 5, 0)
    with pytest.raises(ArgumentError, match="no steps"):
        Trace(np.zeros((0, 2, 24), np.uint32), np.zeros(0, np.int64)).wraps(5)
