"""sim.decode.prefill: closed forms of the chunked background reader behind layer compute (SPEC §8)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engram.errors import ArgumentError
from sim.device import preset
from sim.core.params import Compute, Policy
from sim.decode.prefill import PrefillRun, simulate_prefill
from sim.trace import CODE_SOURCE, Trace, load_trace

US = 1e-6
QD16 = 16 * 12.8 * US  # seed device: per-read latency with 16 readers


@pytest.fixture(scope="module")
def code() -> Trace:
    return load_trace(CODE_SOURCE, limit=4096)


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_compute_bound_prefill_stalls_only_for_the_first_chunk(code, mode):
    """Everything but the first chunk of the first table hides behind compute."""
    N, chunk, c = 2048, 512, 0.01
    r = simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(c),
                         PrefillRun(tokens=N, chunk=chunk, mode=mode))
    n0 = np.unique(code.rows[:chunk, 0, :]).size
    # alone on the device (the second reader starts at layer 2): waves of 16 at depth 16, the last at its own
    read0 = preset("seed-apple-m3-ultra").batch_samples(n0, 16)[0][0]
    assert read0 == pytest.approx((n0 // 16) * QD16 + (107.9 + 96.9 * (n0 % 16 - 1) / 15) * US * (n0 % 16 > 0))
    layer0 = chunk * c / 43
    assert r.stall_by_layer[1] == pytest.approx(read0 - layer0, rel=1e-9)
    assert r.stall_by_layer[14] == 0 and r.stalls == 1
    assert r.compute_seconds == pytest.approx(N * c, rel=1e-12)
    assert r.prefill_seconds == pytest.approx(N * c + read0 - layer0, rel=1e-9)
    assert r.reads == sum(np.unique(code.rows[i:i + chunk, j, :]).size for i in range(0, N, chunk) for j in (0, 1))
    assert r.config["chunks"] == 4 and r.tokens_per_s == pytest.approx(N / r.prefill_seconds)


def test_read_bound_prefill_ends_with_the_readers(code):
    r = simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(0.0), PrefillRun(tokens=4096))
    assert r.prefill_seconds == pytest.approx(max(r.reader_done.values()), rel=1e-12)
    assert r.stall_seconds == pytest.approx(r.prefill_seconds, rel=1e-12)
    # Both readers busy at once: the seed device is saturated from qd 16, so the total
    # is the reads at 78,125 a second (minus the first chunk read alone at the same rate).
    assert r.prefill_seconds == pytest.approx(r.reads / 78125, rel=0.01)


def test_the_second_table_starting_late_keeps_the_first_chunk_alone(code):
    args = dict(tokens=4096, chunk=2048)
    late = simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3),
                            PrefillRun(second_start_layer=2, **args))
    early = simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3),
                             PrefillRun(second_start_layer=0, **args))
    assert early.stall_by_layer[1] > 1.5 * late.stall_by_layer[1]


def test_fast_mode_agrees_with_per_read_mode(code):
    args = dict(policy=Policy(), compute=Compute(1e-3, "gamma", 0.1))
    run = dict(tokens=4096, seed=4)
    f = simulate_prefill(code, "vm-virtio-16core-4k", run=PrefillRun(mode="fast", **run), **args)
    e = simulate_prefill(code, "vm-virtio-16core-4k", run=PrefillRun(mode="exact", **run), **args)
    assert f.reads == e.reads
    assert f.prefill_seconds == pytest.approx(e.prefill_seconds, rel=0.01)
    assert f.stall_seconds == pytest.approx(e.stall_seconds, rel=0.03)
    for lid in (1, 14):
        assert f.reader_done[lid] == pytest.approx(e.reader_done[lid], rel=0.02)
    # the device's figures too: the fast mode's came from levelless boxes (mean qd 0, read latency 0)
    for key, rel in (("busy_fraction", 0.03), ("mean_queue_depth", 0.05), ("mean_read_latency_us", 0.05)):
        assert f.device[key] > 0 and f.device[key] == pytest.approx(e.device[key], rel=rel), key
    assert f.device["max_queue_depth"] == e.device["max_queue_depth"]
    assert np.mean(f.timeline["queue_depth"]) == pytest.approx(np.mean(e.timeline["queue_depth"]), rel=0.05)
    json.dumps(f.to_dict())


def test_errors(code):
    with pytest.raises(ArgumentError, match="second_start_layer"):
        simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3), PrefillRun(second_start_layer=15))
    with pytest.raises(ArgumentError, match="tokens"):
        simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3), PrefillRun(tokens=10**6))
    with pytest.raises(ArgumentError, match="chunk"):
        simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3), PrefillRun(chunk=0))
    with pytest.raises(ArgumentError, match="beyond"):
        simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3, layers=10))


@pytest.mark.parametrize("kw, field", [({"mode": "slow"}, "mode"), ({"bins": 0}, "bins"), ({"chunk": 0}, "chunk"),
                                       ({"ubatch": 0}, "ubatch"), ({"second_start_layer": -1}, "second_start_layer"),
                                       ({"hash_time": -1e-6}, "hash_time")])
def test_prefill_run_refuses_bad_values(kw, field):
    """:class:`PrefillRun` checks its fields when made, and the message names the field."""
    with pytest.raises(ArgumentError, match=field):
        PrefillRun(**kw)
    assert PrefillRun(chunk=64).ubatch == 64 and PrefillRun(chunk=64, ubatch=16).ubatch == 16


def test_prefill_reports_the_compute_it_drew(code):
    r = simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-4, "lognormal", 0.5),
                         PrefillRun(tokens=4096, chunk=512, ubatch=256))
    x = Compute(1e-4, "lognormal", 0.5).sample(np.random.default_rng(np.random.SeedSequence(0).spawn(2)[1]),
                                              16 * 43)
    assert r.compute_realised["samples"] == 16 * 43
    assert r.compute_realised["mean_ms"] == pytest.approx(x.mean() * 1e3, rel=1e-12)
    assert r.compute_realised["cv"] == pytest.approx(x.std() / x.mean(), rel=1e-12)
    assert "drawn: mean" in r.summary() and r.to_dict()["compute_realised"] == r.compute_realised
    with pytest.raises(ArgumentError, match="bins"):
        simulate_prefill(code, "seed-apple-m3-ultra", Policy(), Compute(1e-3), PrefillRun(tokens=100, bins=0))
