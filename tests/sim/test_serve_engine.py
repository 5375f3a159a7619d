"""sim.serve engine and metrics: zero-load figures equal the single-request models, Little's law, the effects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engram import ArgumentError, CachePolicyError
from sim.decode import DecodeRun, cache_hits, simulate_decode
from sim.device import load_device
from sim.core.params import Compute, Policy, Storage
from sim.decode.prefill import PrefillRun, simulate_prefill
from sim.decode.speculative import Speculation
from sim.serve import SLO, RowSource, Scheduler, ServeRun, ServeText, StepCompute, Workload, make_requests, \
    simulate_serve
from sim.serve.engine import Engine, EngineRun
from sim.serve.workload import Requests
from sim.trace import CODE_SOURCE, Trace, load_trace
from sim.trace.rowcache import policy_hits

FAST_SSD = "ssd:qd1_us=80,iops=600000,parallelism=32"
DEVICES = ("seed-apple-m3-ultra", FAST_SSD, "vm-virtio-16core-4k")


@pytest.fixture(scope="module")
def text():
    return load_trace(CODE_SOURCE, limit=12288)


@pytest.fixture(scope="module")
def rows(text):
    return RowSource(text, Policy(), 2048)


def _one_request(prompt: int, output: int) -> Workload:
    return Workload(rate=0.001, duration=1.0, arrivals="constant", prompt_tokens=f"fixed:n={prompt}",
                    output_tokens=f"fixed:n={output}")


@pytest.mark.parametrize("spec", DEVICES)
def test_zero_load_equals_the_prefill_and_decode_models(text, rows, spec):
    """One request alone: its TTFT is simulate_prefill's prefill time of its prompt and its TBT is
    simulate_decode's step of its tokens (same device, policy, chunks, layers, compute)."""
    pol = Policy()
    tok_s = 0.2e-3
    comp = StepCompute(((0, 0.0), (1, 47.013), (2, 2 * 47.013)), tok_s * 1e3)
    sch = Scheduler(prefill_chunk=2048, gate="stall", prefill_readers="per_table")
    w = _one_request(4096, 120)
    r = simulate_serve(w, spec, pol, comp, sch, text=ServeText(rows=rows), run=ServeRun(seed=3))
    ppos, dpos = rows.place(make_requests(w, 3))
    p0, d0 = int(ppos[0]), int(dpos[0])
    pf = simulate_prefill(Trace(text.rows[p0:p0 + 4096], text.tokens[p0:p0 + 4096]), spec, pol, Compute(tok_s),
                          PrefillRun(chunk=2048, ubatch=2048))
    ttft = float(r.per_request["first"][0] - r.per_request["arrival"][0])
    assert ttft == pytest.approx(pf.prefill_seconds, rel=1e-3)
    dec = simulate_decode(Trace(text.rows[d0:d0 + 119], text.tokens[d0:d0 + 119]), spec, pol, Compute(0.047013),
                          DecodeRun(seed=5))
    tbt = r.tbt_samples
    assert tbt.size == 119
    if spec == "seed-apple-m3-ultra":  # fixed latencies: every step equal
        assert np.allclose(tbt, dec.step_latencies.reshape(-1), rtol=1e-12)
    else:
        assert tbt.mean() == pytest.approx(dec.step_latencies.mean(), rel=0.01)
    assert r.token_time_ms["contention"] == pytest.approx(0.0, abs=1e-9)
    assert r.token_time_ms["stall"] == pytest.approx(0.0, abs=1e-9)
    assert r.token_time_ms["compute"] == pytest.approx(47.013)


def test_littles_law_on_requests_and_reads(rows):
    w = Workload(rate=6.0, duration=120.0, prompt_tokens="lognormal:mean=200,cv=1,min=8,max=2000",
                 output_tokens="lognormal:mean=60,cv=1,min=2,max=400")
    r = simulate_serve(w, FAST_SSD, compute=StepCompute.reference(scale=20), text=ServeText(rows=rows),
                       run=ServeRun(seed=1))
    ll = r.littles_law
    assert r.requests["censored"] == 0 and r.requests["completed"] == r.requests["arrived"] > 500
    assert ll["requests"]["ratio"] == pytest.approx(1.0, abs=1e-9)          # the whole run: an identity
    assert ll["requests_steady"]["ratio"] == pytest.approx(1.0, abs=0.15)   # steady state: approximately
    assert ll["reads"]["ratio"] == pytest.approx(1.0, abs=1e-9)
    assert ll["requests"]["lambda"] == pytest.approx(r.requests["arrived"] / r.sim_seconds)
    assert ll["reads"]["L"] == pytest.approx(r.device["mean_queue_depth"])


def _batch(rows, positions, *, prompt_at=None, prompt=4096, gate="ready", steps=60, spec="vm-virtio-16core-4k",
           compute_ms=5.0):
    """``len(positions)`` requests decoding from t=0 at those text positions, and optionally one prompt arriving."""
    B = len(positions)
    m = B + (prompt_at is not None)
    arrival = np.zeros(m)
    pl = np.ones(m, np.int64)
    out = np.full(m, steps, np.int64)
    ppos = np.zeros(m, np.int64)
    dpos = np.asarray(list(positions) + ([0] if prompt_at is not None else []), np.int64)
    if prompt_at is not None:
        arrival[-1], pl[-1], out[-1], ppos[-1] = prompt_at, prompt, 2, 4096
    reqs = Requests(arrival, pl, out, np.full(m, -1, np.int64), np.zeros(m), np.arange(m))
    comp = StepCompute(((0, compute_ms), (1, compute_ms)), 0.0)
    sch = Scheduler(max_running=m, prefill_chunk=prompt, gate=gate)
    return Engine(reqs, rows, load_device(spec), Policy(), comp, sch,
                  run=EngineRun(seed=0, positions=(ppos, dpos))).run()


def test_a_step_reads_a_row_once_across_requests(rows):
    same = _batch(rows, [300] * 6, gate="stall")  # every one-token prompt in the first step: decoding in lockstep
    apart = _batch(rows, [300, 1300, 2300, 3300, 5300, 7300], gate="stall")
    steps = 59  # decode steps: 60 tokens, the first from the one-token prompt
    assert same.decode_reads == 48 * steps
    assert apart.decode_reads > 5 * 48 * steps
    assert same.decode_rows_asked == apart.decode_rows_asked == 6 * 48 * steps


def test_prefill_reads_slow_decode_and_a_stalled_step_holds_the_batch(rows):
    pos = [100 * i for i in range(8)]
    alone = _batch(rows, pos, steps=120)
    ready = _batch(rows, pos, prompt_at=0.05, steps=120)
    stall = _batch(rows, pos, prompt_at=0.05, steps=120, gate="stall")
    read = lambda tr: (tr.steps["t_read"] - tr.steps["t0"])[tr.steps["B"] == 8]  # noqa: E731
    wait = lambda tr: (tr.steps["t_end"] - tr.steps["t_read"] - tr.steps["compute"])  # noqa: E731
    assert read(ready).max() > 1.5 * read(alone).max()   # decode reads behind the prompt's chunks
    assert wait(alone).max() == pytest.approx(0.0, abs=1e-12) and wait(ready).max() == pytest.approx(0.0, abs=1e-12)
    assert wait(stall).max() > 0.02                        # the step with prompt tokens waits for their rows
    assert np.max(np.diff(stall.steps["t_end"])) > np.max(np.diff(ready.steps["t_end"]))
    assert ready.prefill_reads == stall.prefill_reads > 100_000


def test_metrics_split_a_tokens_time(rows):
    w = Workload(rate=1.0, duration=60.0, prompt_tokens="lognormal:mean=800,cv=0.5,min=300,max=4000",
                 output_tokens="fixed:n=80")
    r = simulate_serve(w, "seed-apple-m3-ultra", compute=StepCompute.reference(scale=20), text=ServeText(rows=rows),
                       run=ServeRun(seed=2))
    tt = r.token_time_ms
    assert tt["contention"] > 0.2 * tt["reads_alone"] > 0
    assert tt["total"] == pytest.approx(tt["compute"] + tt["reads_alone"] + tt["contention"] + tt["stall"])
    steps_mean = r.engine["step_ms"]["mean"]
    assert tt["total"] == pytest.approx(np.average(r.tbt_samples) * 1e3, rel=0.25) and steps_mean > 0
    tail = r.tail_ms["token"]
    assert sum(tail.values()) > tt["total"] and tail["contention"] > tt["contention"]
    assert sum(r.tail_ms["ttft"].values()) >= r.ttft_ms["p99"] * 0.999
    parts = r.ttft_parts_ms
    assert parts["queue"] + parts["prefill_reads"] + parts["prefill_compute"] == pytest.approx(r.ttft_ms["mean"],
                                                                                             rel=1e-9)
    assert r.requests["censored"] == 0 and 0 < r.slo["attainment"] <= 1 and r.slo["goodput_rps"] <= w.rate * 1.5


def test_slower_devices_never_serve_better(rows):
    w = Workload(rate=5.0, duration=60.0, prompt_tokens="lognormal:mean=400,cv=1,min=16,max=3000",
                 output_tokens="lognormal:mean=80,cv=1,min=2,max=500")
    got = []
    for iops in (40_000, 100_000, 300_000, 800_000):
        r = simulate_serve(w, f"ssd:qd1_us=100,iops={iops},cv=0", compute=StepCompute.reference(scale=20),
                           text=ServeText(rows=rows), run=ServeRun(seed=4))
        got.append((r.slo["goodput_rps"], r.tbt_ms["p99"], r.ttft_ms["p99"], r.device["busy_fraction"]))
    g, tbt, ttft, busy = map(np.asarray, zip(*got))
    assert np.all(np.diff(g) >= 0) and g[-1] > g[0]
    assert np.all(np.diff(tbt) <= 0) and np.all(np.diff(ttft) <= 0) and np.all(np.diff(busy) < 0)


def test_same_seed_same_run_and_other_seeds_other_requests(rows):
    w = Workload(rate=3.0, duration=30.0, prompt_tokens="lognormal:mean=300,cv=1", output_tokens="fixed:n=40")
    kw = dict(compute=StepCompute.reference(scale=20), text=ServeText(rows=rows))
    a = simulate_serve(w, FAST_SSD, run=ServeRun(seed=7), **kw)
    b = simulate_serve(w, FAST_SSD, run=ServeRun(seed=7), **kw)
    c = simulate_serve(w, FAST_SSD, run=ServeRun(seed=8), **kw)
    assert a.row() | {"wall_seconds": 0} == b.row() | {"wall_seconds": 0}
    assert np.array_equal(a.tbt_samples, b.tbt_samples)
    assert a.ttft_ms != c.ttft_ms


def test_planner_axes_cut_the_device_time(text, rows):
    w = Workload(rate=3.0, duration=40.0, prompt_tokens="lognormal:mean=600,cv=1,min=16,max=4000",
                 output_tokens="fixed:n=100")
    kw = dict(compute=StepCompute.reference(scale=20), run=ServeRun(seed=5))
    base = simulate_serve(w, "seed-apple-m3-ultra", text=ServeText(rows=rows), **kw)
    two = simulate_serve(w, "seed-apple-m3-ultra", text=ServeText(rows=rows), storage=Storage(drives=2),
                         **kw)
    assert two.device["drives"] == 2 and two.device["busy_fraction"] < 0.7 * base.device["busy_fraction"]
    assert two.tbt_ms["p50"] < base.tbt_ms["p50"]
    dram = simulate_serve(w, "seed-apple-m3-ultra", Policy(dram_fraction=0.5),
                          text=ServeText(rows=RowSource(text, Policy(dram_fraction=0.5), 2048)), **kw)
    d, dd = base.device, dram.device
    assert 0.4 < (dd["decode_reads"] + dd["prefill_reads"]) / (d["decode_reads"] + d["prefill_reads"]) < 0.6
    cache = simulate_serve(w, "seed-apple-m3-ultra", Policy(cache_rows=5000), text=ServeText(rows=rows), **kw)
    assert cache.device["decode_reads"] < base.device["decode_reads"]
    assert cache.device["prefill_reads"] == base.device["prefill_reads"]
    shared = simulate_serve(w, "seed-apple-m3-ultra", Policy(shared_cache_rows=200_000), text=ServeText(rows=rows),
                            **kw)
    assert shared.device["shared_cache_hit_rate"] > 0.05
    assert shared.device["decode_reads"] + shared.device["prefill_reads"] < d["decode_reads"] + d["prefill_reads"]
    over = simulate_serve(w, "seed-apple-m3-ultra", Policy(overlap_layers=10), text=ServeText(rows=rows), **kw)
    assert over.tbt_ms["mean"] < base.tbt_ms["mean"]


def test_an_overloaded_run_stops_early_when_asked(rows):
    w = Workload(rate=40.0, duration=60.0, prompt_tokens="fixed:n=1500", output_tokens="fixed:n=50")
    kw = dict(compute=StepCompute.reference(scale=20), text=ServeText(rows=rows))
    fast = simulate_serve(w, "seed-apple-m3-ultra", run=ServeRun(seed=1, fail_fast=True), **kw)
    assert fast.config["aborted"] and not fast.slo["met"] and fast.sim_seconds < 60
    assert any("stopped early" in x for x in fast.warnings)
    full = simulate_serve(w, "seed-apple-m3-ultra", run=ServeRun(seed=1, drain=30.0), **kw)
    assert not full.slo["met"] and full.requests["censored"] > 0 and full.sim_seconds == pytest.approx(90.0)


def test_bad_configurations(rows):
    w = _one_request(100, 5)
    with pytest.raises(ArgumentError, match="overlap_layers"):
        simulate_serve(w, policy=Policy(overlap_layers=50), text=ServeText(rows=rows))
    with pytest.raises(ArgumentError, match="second_start_layer"):
        simulate_serve(w, scheduler=Scheduler(gate="stall", second_start_layer=20), text=ServeText(rows=rows))
    with pytest.raises(ArgumentError, match="warmup"):
        simulate_serve(w, text=ServeText(rows=rows), run=ServeRun(warmup=2.0))
    for kw in (dict(max_running=0), dict(gate="wait"), dict(prefill_readers="two"), dict(prefill_chunk=1.5)):
        with pytest.raises(ArgumentError):
            Scheduler(**kw)
    with pytest.raises(ArgumentError, match="SLO"):
        SLO(ttft_s=0)


@pytest.mark.parametrize("rate,scale,iops", [(0.5, 20, 40_000), (3.0, 10, 600_000), (3.0, 10, 40_000),
                                             (8.0, 20, 100_000), (20.0, 5, 20_000)])
def test_goodput_never_exceeds_throughput(rows, rate, scale, iops):
    """Both are counted over the measurement window: goodput is the completed measured requests that
    met the SLOs per second of it, throughput all completed measured requests per second of it."""
    w = Workload(rate=rate, duration=20.0, prompt_tokens="lognormal:mean=300,cv=1,min=16,max=2000",
                 output_tokens="lognormal:mean=40,cv=1,min=2,max=200")
    r = simulate_serve(w, f"ssd:qd1_us=80,iops={iops}", compute=StepCompute.reference(scale=scale),
                       text=ServeText(rows=rows), run=ServeRun(seed=3))
    span = r.requests["window_s"][1] - r.requests["window_s"][0]
    measured_done = int(np.sum(r.per_request["measured"] & ~np.isnan(r.per_request["finish"])))
    assert r.throughput["requests_per_s"] == pytest.approx(measured_done / span)
    assert r.slo["goodput_rps"] <= r.throughput["requests_per_s"] + 1e-12
    assert r.slo["goodput_rps"] == pytest.approx(r.slo["attainment"] * r.requests["measured"] / span)


@pytest.mark.parametrize("make,field", [(lambda: ServeRun(warmup=-1.0), "warmup"), (lambda: ServeRun(bins=0), "bins"),
                                        (lambda: ServeRun(drain=-2.0), "drain"),
                                        (lambda: ServeText(limit=0), "limit"),
                                        (lambda: EngineRun(drives=0), "drives"),
                                        (lambda: EngineRun(abort_percentile=101.0), "abort_percentile")])
def test_bad_run_settings_name_the_field(make, field):
    with pytest.raises(ArgumentError, match=field):
        make()


@pytest.mark.parametrize("kw,message", [
    (dict(drives="x"), "EngineRun.drives = 'x': expected a whole number in [1, 4096]"),
    (dict(drives=True), "EngineRun.drives = True: expected a whole number"),
    (dict(drives=2.0), "EngineRun.drives = 2.0: expected a whole number"),
    (dict(drives=4097), "EngineRun.drives = 4097: expected a whole number in [1, 4096]"),
    (dict(seed=-1), "EngineRun.seed = -1: expected a whole number >= 0"),
    (dict(seed="0"), "EngineRun.seed = '0': expected a whole number >= 0"),
    (dict(measured=[True, False]), "EngineRun.measured = list: expected a one-dimensional bool array"),
    (dict(measured=np.ones(3, np.int64)), "EngineRun.measured = int64 array of shape [3]: expected"),
    (dict(t_cap=0.0), "EngineRun.t_cap = 0.0: expected a number > 0"),
    (dict(t_cap=float("nan")), "EngineRun.t_cap = nan: expected a number > 0"),
    (dict(t_cap="10"), "EngineRun.t_cap = '10': expected a number > 0"),
    (dict(positions=(np.zeros(2),)), "EngineRun.positions = tuple: expected a pair"),
    (dict(abort_ttft=-1.0), "EngineRun.abort_ttft = -1.0: expected a number >= 0"),
    (dict(abort_percentile="99"), "EngineRun.abort_percentile = '99': expected a finite number in [0, 100]"),
    (dict(abort_percentile=True), "EngineRun.abort_percentile = True: expected a finite number in [0, 100]"),
    (dict(speculation=2), "EngineRun.speculation = int: expected None or a sim.decode.speculative.Speculation"),
])
def test_engine_run_refuses_a_bad_field_naming_it(kw, message):
    with pytest.raises(ArgumentError) as exc:
        EngineRun(**kw)
    assert str(exc.value).startswith(message), str(exc.value)


def test_engine_run_keeps_its_valid_values():
    measured = np.array([True, False, True])
    run = EngineRun(drives=np.int64(3), seed=7, measured=measured, t_cap=12, positions=(np.zeros(3), np.ones(3)),
                    abort_ttft=2, abort_percentile=95, speculation=Speculation(draft_tokens=2))
    assert (run.drives, run.seed, run.t_cap, run.abort_ttft, run.abort_percentile) == (3, 7, 12.0, 2.0, 95.0)
    assert type(run.drives) is int and type(run.t_cap) is float and run.measured is measured
    assert run.speculation.draft_tokens == 2
    default = EngineRun()
    assert (default.drives, default.seed, default.t_cap, default.abort_ttft) == (1, 0, math.inf, None)


@pytest.mark.parametrize("cache_rows", [500, 4000])
def test_per_request_caches_run_the_policys_replacement(rows, cache_rows):
    """Four requests decoding 399 tokens each, far apart in the text, each with its own row cache: its hits are
    those of the engine's policy code (sim.trace.rowcache.policy_hits, one key at a time) on its decode stream's
    keys under the policy's cache_policy, and the rows it reads are the rest.  TinyLFU and LRU keep different rows
    (more hits for TinyLFU at 500 rows, fewer at 4000), so a model that ran LRU whatever the policy said fails."""
    pos, steps = [300, 2300, 5300, 9300], 400
    m = len(pos)
    reqs = Requests(np.zeros(m), np.ones(m, np.int64), np.full(m, steps, np.int64), np.full(m, -1, np.int64),
                    np.zeros(m), np.arange(m))
    got = {}
    for name in ("lru", "tinylfu"):
        tr = Engine(reqs, rows, load_device("seed-apple-m3-ultra"), Policy(cache_rows=cache_rows, cache_policy=name),
                    StepCompute(((0, 5.0), (1, 5.0)), 0.0), Scheduler(max_running=m, prefill_chunk=1),
                    run=EngineRun(seed=0, positions=(np.zeros(m, np.int64), np.asarray(pos, np.int64)))).run()
        # on the engine's keys (layer id << 32 | row), which the policy's TinyLFU sketch hashes
        want = sum(int(policy_hits(rows.cache_keys(rows.stream_keys(d, steps - 1)), cache_rows, name).sum())
                   for d in pos)
        assert tr.request_cache == {"hits": want, "requests": m * (steps - 1) * 48}
        # the texts' stretches share no row: every row a cache misses is read once
        assert tr.decode_reads == m * (steps - 1) * 48 - want
        got[name] = want
    assert (got["tinylfu"] > got["lru"]) == (cache_rows == 500) and got["tinylfu"] != got["lru"]
    with pytest.raises(CachePolicyError, match="'fifo'"):
        cache_hits(np.arange(4, dtype=np.uint64), np.ones(4, bool), 2, "fifo")
