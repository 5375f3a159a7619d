"""The engine's row cache replayed on traces: the engine's measured hit rate equals the predicted one;
Belady's bound; the simulator's caches are the engine's policy code; the CLI."""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engram import EngramModel, RowCache, synth
from engram.errors import ArgumentError, CacheSizeError
from engram.rowcache import CachePolicy, physical_memory
from sim.decode.reads import shared_cache_hits, step_reads
from sim.core.params import Policy
from sim.serve.rows import SharedRowCache
from sim.trace import Trace
from sim.trace.rowcache import cache_curve, optimal_hits, policy_hits, replay_keys
from engram.cli import main
from tests.clirun import cli
from tests.modelfiles import SCALE, token_map as _token_map


def _brute_optimal(keys, cap):
    """The optimal hit count by exhaustive search over what to keep (tiny inputs)."""
    from functools import lru_cache

    keys = tuple(keys)

    @lru_cache(maxsize=None)
    def best(i, held):
        if i == len(keys):
            return 0
        k = keys[i]
        if k in held:
            return 1 + best(i + 1, held)
        opts = [best(i + 1, held)]                                   # bypass
        if len(held) < cap:
            opts.append(best(i + 1, held | {k}))
        else:
            opts += [best(i + 1, (held - {v}) | {k}) for v in held]
        return max(opts)

    return best(0, frozenset())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=14), st.integers(1, 3))
def test_optimal_is_belady(keys, cap):
    got = optimal_hits(np.array(keys, np.uint64), cap)
    assert got.sum() == _brute_optimal(keys, cap)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=300), st.integers(1, 25), st.sampled_from(["lru", "tinylfu"]))
def test_optimal_bounds_the_policies(keys, cap, policy):
    k = np.array(keys, np.uint64)
    assert policy_hits(k, cap, policy, 1).sum() <= optimal_hits(k, cap).sum()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=3), progress=False)
    return path


@pytest.fixture(scope="module")
def tokens(tokenizer, shared_data):
    text = (shared_data / "agent_prompt_long.txt").read_text(encoding="utf-8")[:12000]
    return np.array(tokenizer.encode(text, add_special_tokens=False).ids[:1500])


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_engine_hit_rate_equals_prediction(model_path, tokens, policy):
    """One session: the engine's hit rate on a trace equals the replay's exactly (the same policy code)."""
    size = 264 * 6000
    model = EngramModel.open(model_path, readers=8, cache=RowCache(size, policy))
    trace = Trace.from_tokens(tokens, layout=model.layout)
    with model.session() as s:
        for t in tokens:
            s.step(int(t))
    measured = model.cache.stats()["hit_rate"]
    predicted = cache_curve(trace, [size], [policy], optimal=False).points[0].hit_rate[policy]
    assert 0.02 < measured == pytest.approx(predicted, abs=1e-12)


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_engine_sessions_hit_rate_within_a_point(model_path, tokens, policy):
    """Three sessions sharing the cache, started as the decode model starts them: in one thread taking
    turns a step each the engine's hit rate is the prediction exactly; in threads (their steps in whatever
    order the machine runs them) within one point."""
    size, S = 264 * 12000, 3
    trace = Trace.from_tokens(tokens[:600], layout=EngramModel.open(model_path).layout)
    predicted = cache_curve(trace, [size], [policy], sessions=S, optimal=False).points[0].hit_rate[policy]
    T = trace.steps
    starts = [i * T // S for i in range(S)]
    # each session reads the trace's rows from its start on, wrapping, as the prediction has it (the
    # sessions' reads go through their decode groups, as Session.step sends them)
    rows = np.stack([trace.rows[(a + np.arange(T)) % T] for a in starts])
    model = EngramModel.open(model_path, readers=4, cache=RowCache(size, policy))
    sessions = [model.session() for _ in range(S)]
    try:
        group = [s._group for s in sessions]
        for t in range(T):
            for i in range(S):
                group[i].read_batch(rows[i, t].reshape(1, -1))
        turns = model.cache.stats()["hit_rate"]
    finally:
        for s in sessions:
            s.close()
    assert turns == pytest.approx(predicted, abs=1e-12)

    model = EngramModel.open(model_path, readers=4, cache=RowCache(size, policy))
    sessions = [model.session() for _ in range(S)]
    barrier = threading.Barrier(S)

    def run(i):
        g = sessions[i]._group
        for t in range(T):
            if t % 50 == 0:
                barrier.wait(60)  # keep the sessions at the same pace, as the prediction has them
            g.read_batch(rows[i, t].reshape(1, -1))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(S)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for s in sessions:
        s.close()
    assert abs(model.cache.stats()["hit_rate"] - predicted) <= 0.01


def test_replay_keys_order():
    rows = np.arange(4 * 2 * 3, dtype=np.uint32).reshape(4, 2, 3)
    tr = Trace(rows, np.arange(4), np.array([0]), (1, 14), 1, "t", ())
    k = replay_keys(tr, sessions=2)
    assert k.shape == (4, 2, 2, 3)
    assert int(k[0, 1, 0, 0]) == (1 << 32) | int(rows[2, 0, 0])     # session 1 starts at step 2
    assert int(k[3, 1, 1, 2]) == (14 << 32) | int(rows[1, 1, 2])    # and wraps


def test_the_simulators_caches_are_the_engines():
    """The decode model's and the serving model's shared caches give the hits of the engine's policy."""
    rng = np.random.default_rng(5)
    keys = (rng.zipf(1.2, (300, 48)) % 4000).astype(np.uint64)
    active = rng.random((300, 48)) < 0.9
    for policy in ("lru", "tinylfu"):
        got = shared_cache_hits(keys, active, 700, policy)
        p = CachePolicy(700, policy)
        want = np.zeros(keys.shape, bool)
        for b in range(keys.shape[0]):
            kb = np.ascontiguousarray(keys[b][active[b]])
            slots = np.empty(kb.size, np.int64)
            p.lookup(kb, slots)
            want[b, np.flatnonzero(active[b])] = slots >= 0
            p.insert(np.ascontiguousarray(kb[slots < 0]), np.empty(int((slots < 0).sum()), np.int64))
        assert np.array_equal(got, want), policy
        c = SharedRowCache(700, policy)
        n = sum(c.misses(np.unique(keys[b]).astype(np.uint32)).size for b in range(keys.shape[0]))
        assert c.requests - c.hits == n and 0 < c.hits < c.requests


def test_policy_bytes_and_policy():
    assert Policy(shared_cache_bytes="1M").shared_cache_rows == (1 << 20) // 264
    assert Policy(shared_cache_bytes=2640, shared_cache_rows=10).shared_cache_rows == 10
    with pytest.raises(ArgumentError, match="give one of them"):
        Policy(shared_cache_bytes=2640, shared_cache_rows=11)
    with pytest.raises(ArgumentError, match="cache_policy"):
        Policy(cache_policy="fifo")
    with pytest.raises(CacheSizeError):
        Policy(shared_cache_bytes=100)
    rng = np.random.default_rng(2)
    tr = Trace.from_tokens(100 + rng.zipf(1.3, 900) % 3000)
    lru = step_reads(tr, 2, 600, Policy(shared_cache_rows=5000, cache_policy="lru"))
    tiny = step_reads(tr, 2, 600, Policy(shared_cache_rows=5000, cache_policy="tinylfu"))
    curve = cache_curve(tr, [264 * 5000], ["lru", "tinylfu"], sessions=2, steps=600, optimal=False)
    reads = 2 * 600 * 48
    assert 0 < lru.shared_hits < tiny.shared_hits
    assert lru.shared_hits / reads == pytest.approx(curve.points[0].hit_rate["lru"], abs=1e-12)
    assert tiny.shared_hits / reads == pytest.approx(curve.points[0].hit_rate["tinylfu"], abs=1e-12)


def test_a_warm_up_is_the_steps_before_the_start_through_the_caches():
    """Policy.cache_warmup_steps: a session first decodes the trace steps before its start through the caches,
    uncounted; so its run is the tail of a cold run that starts that many steps earlier."""
    rows = np.arange(6 * 2 * 3, dtype=np.uint32).reshape(6, 2, 3) + 100
    rows[5] = rows[0]                        # the step before session 0's start reads step 0's rows
    tr = Trace(rows, np.arange(6), np.array([0]), (1, 14), 1, "t", ())
    cold = step_reads(tr, 1, 3, Policy(shared_cache_rows=1000))
    warm = step_reads(tr, 1, 3, Policy(shared_cache_rows=1000, cache_warmup_steps=1))
    assert (cold.shared_hits, warm.shared_hits) == (0, 6) and warm.requests == cold.requests == 3 * 6
    assert warm.reads[0].tolist() == [[0, 0], [3, 3], [3, 3]] and cold.reads[0].tolist() == [[3, 3]] * 3
    own = step_reads(tr, 1, 3, Policy(cache_rows=1000, cache_warmup_steps=1))
    assert (own.cache_hits, own.shared_hits) == (6, 0)
    # no cache: nothing to warm
    assert step_reads(tr, 1, 3, Policy(cache_warmup_steps=4)).reads[0].tolist() == [[3, 3]] * 3

    rng = np.random.default_rng(3)
    tr = Trace.from_tokens(100 + rng.zipf(1.3, 700) % 2000)
    for policy in ("lru", "tinylfu"):
        for w in (1, 57, 200):
            got = step_reads(tr, 1, 150, Policy(shared_cache_rows=900, cache_policy=policy, cache_warmup_steps=w))
            shifted = Trace(np.roll(tr.rows, w, axis=0), np.roll(tr.tokens, w), layer_ids=tr.layer_ids,
                            heads=tr.heads)
            longer = step_reads(shifted, 1, w + 150, Policy(shared_cache_rows=900, cache_policy=policy))
            first = step_reads(shifted, 1, w, Policy(shared_cache_rows=900, cache_policy=policy))
            assert got.shared_hits == longer.shared_hits - first.shared_hits > 0, (policy, w)
            assert np.array_equal(got.reads[0], longer.reads[0][w:])
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ArgumentError, match="cache_warmup_steps"):
            Policy(cache_warmup_steps=bad)


@pytest.mark.parametrize("warm, share", [(100, 0.0), (200, 0.5), (250, 1.0)])
def test_a_warm_up_that_reads_what_other_sessions_read_is_warned(warm, share):
    """4 sessions 250 steps apart on a trace of 1,000, 100 steps each: a warm-up of 200 steps before session s + 1's
    start covers the last 50 of session s's steps, one of 250 all 100; a shared cache then hits rows independent
    sessions would not share."""
    from sim.decode.reads import wrap_info

    tr = Trace(np.zeros((1000, 2, 3), np.uint32), np.arange(1000), layer_ids=(1, 14), heads=1)
    w = wrap_info(tr, 4, 100, Policy(shared_cache_rows=10, cache_warmup_steps=warm))
    assert w["warmup_shared_positions"] == share and w["shared_positions"] == 0.0
    said = [x for x in w["warnings"] if "another session's warm-up" in x]
    assert said == ([f"the caches' warm-up reads stretches other sessions read after it: {share:.0%} of the sessions' "
                     f"steps read a stretch another session's warm-up of {warm} steps read, so the shared row cache "
                     "hits rows independent sessions would not share: use a trace of at least sessions x (warm-up + "
                     "steps) tokens"] if share else [])
    # a session's own cache sees no other session's warm-up
    assert wrap_info(tr, 4, 100, Policy(cache_rows=10, cache_warmup_steps=warm))["warmup_shared_positions"] == 0.0


def test_sim_decode_warms_its_caches_on_request(capsys):
    """engram sim decode --cache-warmup-steps: the run's shared cache hit rate is the policy's over the timed steps
    after the warm-up (step_reads with the same Policy); a warm-up that reaches the run's own steps on a short
    trace is warned; below 0 it is refused naming the option."""
    from sim.trace import load_trace

    argv = ["sim", "decode", "--limit", "600", "--sessions", "2", "--steps", "100", "--shared-cache-bytes", "1M",
            "--json", "--no-progress"]
    assert main([*argv, "--cache-warmup-steps", "150"]) == 0
    d = json.loads(capsys.readouterr().out)
    tr = load_trace("stdlib:asyncio/base_events.py", limit=600)
    want = step_reads(tr, 2, 100, Policy(shared_cache_bytes="1M", cache_warmup_steps=150))
    assert d["config"]["policy"]["cache_warmup_steps"] == 150 and want.shared_hits > 0
    assert d["shared_cache_hit_rate"] == pytest.approx(want.shared_hits / want.requests, abs=1e-12)
    assert not any("warm-up" in w for w in d["warnings"])
    # a warm LRU cache holds the most recent rows, a superset of what an empty one holds by then: never fewer hits
    warm, cold = (step_reads(tr, 2, 100, Policy(shared_cache_bytes="1M", cache_policy="lru", cache_warmup_steps=w))
                  for w in (150, 0))
    assert (cold.shared_hits, warm.shared_hits) == (800, 864)
    # a full W-TinyLFU cache admits a row only over a more frequent victim: on this code, whose rows come back
    # soon after they are read, the warm cache keeps the warm-up's rows and hits far less than an empty one,
    # which admits every row while it fills (784 hits)
    assert step_reads(tr, 2, 100, Policy(shared_cache_bytes="1M")).shared_hits == 784 and want.shared_hits == 103
    assert main([*argv, "--cache-warmup-steps", "550"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert any(w.startswith("the caches' warm-up of 550 steps and the 100 steps that follow overlap on a trace of "
                            "600") for w in d["warnings"])
    assert "--cache-warmup-steps must be >= 0, got -1" in cli(capsys, [*argv, "--cache-warmup-steps", "-1"])


def test_cli_reuse(capsys):
    assert main(["sim", "trace", "reuse", "text:" + "the cat sat on the mat and the cat sat on the hat " * 20,
                 "--cache-bytes", "2K,1M", "--sessions", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["rows"] for p in d["points"]] == [7, 3971] and d["sessions"] == 2
    for p in d["points"]:
        assert p["hit_rate"]["lru"] <= p["hit_rate"]["optimal"] + 1e-12
        assert p["hit_rate"]["tinylfu"] <= p["hit_rate"]["optimal"] + 1e-12
        assert set(p["by_layer"]["lru"]) == {"1", "14"} and set(p["by_order"]["optimal"]) == {"2", "3", "4"}
    assert d["points"][1]["hit_rate"]["optimal"] == pytest.approx(d["reuse_rate"])


@pytest.mark.parametrize("argv, msg", [
    (["--cache-bytes", "1M", "--policies", "fifo"], "unknown row cache policy 'fifo'"),
])
def test_cli_reuse_bad_input(capsys, argv, msg):
    assert msg in cli(capsys, ["sim", "trace", "reuse", "text:hello world again and again"] + argv)


@pytest.mark.parametrize("argv, msg", [
    (["--sessions", "1000000000"], r"1,000,000,000 session\(s\) x \d+ steps .* needs about .* GB of memory"),
    (["--steps", "99999999999"], r"1 session\(s\) x 99,999,999,999 steps .* needs about"),
    (["--sessions", "3000000", "--steps", "13"], r"3,000,000 session\(s\) x 13 steps x 48 row reads "
                                                  r"\(1,872,000,000 reads, with the optimal bound\) needs about"),
])
def test_cli_reuse_too_big_is_refused_before_it_allocates(capsys, argv, msg):
    """Runs whose replay cannot fit in memory ended in numpy._ArrayMemoryError tracebacks or were killed by the
    kernel; the size is checked first, against sim.core.limits' share of memory, with the estimate."""
    line = cli(capsys, ["sim", "trace", "reuse", "text:hello world again and again", "--cache-bytes", "1M"] + argv)
    assert re.search(msg, line) and "make the run smaller" in line, line


def test_replay_memory_estimate(monkeypatch):
    """The estimate is of the reads replayed (sessions x steps x layers x columns), more a read with the optimal
    bound; a replay within the limit runs."""
    from sim.core import limits
    from sim.trace.rowcache import OPTIMAL_BYTES_A_READ, REPLAY_BYTES_A_READ, check_replay_memory

    tr = Trace(np.arange(10 * 48, dtype=np.uint32).reshape(10, 2, 24), np.zeros(10, np.int64))
    assert check_replay_memory(tr, 3, 7) == 3 * 7 * 48 and check_replay_memory(tr, 1, None) == 480
    monkeypatch.setattr(limits, "memory_limit", lambda: 3 * 7 * 48 * REPLAY_BYTES_A_READ)
    check_replay_memory(tr, 3, 7)
    assert cache_curve(tr, ["1M"], sessions=3, steps=7, optimal=False).reads == 3 * 7 * 48
    with pytest.raises(ArgumentError, match=r"3 session\(s\) x 8 steps x 48 row reads \(1,152 reads\) needs about"):
        cache_curve(tr, ["1M"], sessions=3, steps=8, optimal=False)
    with pytest.raises(ArgumentError, match="with the optimal bound"):
        cache_curve(tr, ["1M"], sessions=3, steps=7)
    assert OPTIMAL_BYTES_A_READ > REPLAY_BYTES_A_READ
    with pytest.raises(ArgumentError, match="needs about"):
        replay_keys(tr, 3, 8)


@pytest.mark.parametrize("sizes, why", [("1Q", "unknown unit 'Q'"), ("1M,1e3", "exponent"), ("-1M", "negative")])
def test_cli_reuse_bad_size_is_the_parsers_error(capsys, sizes, why):
    """A size that is not one is refused by the parser: exit 2, one line naming the flag, the unit rule."""
    with pytest.raises(SystemExit) as e:
        main(["sim", "trace", "reuse", "text:hello world again and again", "--cache-bytes=" + sizes])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "argument --cache-bytes" in err and why in err and "64MB = 64000000" in err


@pytest.mark.parametrize("option, value, why", [
    ("--cache-bytes", "100", r"size '100' \(100 bytes\) holds no row: a row is 264 bytes"),
    ("--cache-bytes", "0", r"size '0' \(0 bytes\) holds no row: .*; each cache replayed holds at least one row$"),
    ("--cache-bytes", "1M,999T", r"size '999T' \(1098412116148224 bytes\) is 4160651955106 rows; at most 2\*\*31 - 1"),
    ("--cache-bytes", ",", r"give at least one size"),
    ("--policies", "", r"give at least one policy, comma separated: lru, tinylfu"),
    ("--policies", ",", r"give at least one policy"),
])
def test_cli_reuse_sizes_and_policies_are_the_parsers_errors(capsys, option, value, why):
    """``--policies ""`` or ``","`` ran with no policy and exited 0; ``--cache-bytes 0`` was refused after parsing
    with a message telling to use a size of 0 on the command line.  All are the parser's errors naming the
    option, exit 2."""
    argv = ["sim", "trace", "reuse", "text:hello world again and again", "--cache-bytes", "1M", f"{option}={value}"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and f"argument {option}: " in err and re.search(why, err), err
    assert "cache=None" not in err and "--shared-cache-bytes" not in err


def test_cli_reuse_replays_a_size_or_policy_given_twice_once(capsys):
    """A size (the same bytes however written) or a policy given twice printed its rows twice; each is replayed
    once, in the order first given."""
    text = "text:" + "the cat sat on the mat and the cat sat on the hat " * 20
    assert main(["sim", "trace", "reuse", text, "--cache-bytes", "2K,1M,2048,1MiB,1048576", "--policies",
                 "tinylfu,lru,tinylfu", "--no-optimal", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["bytes"] for p in d["points"]] == [2048, 1 << 20] and d["policies"] == ["tinylfu", "lru"]
    assert [sorted(p["hit_rate"]) for p in d["points"]] == [["lru", "tinylfu"]] * 2
    assert main(["sim", "trace", "reuse", text, "--cache-bytes", "2K,2048", "--policies", "lru,lru",
                 "--no-optimal"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(line.split()[:2] == ["2", "KiB"] for line in out) == 2          # the table's row and the detail's
    tr = Trace(np.arange(4 * 48, dtype=np.uint32).reshape(4, 2, 24), np.zeros(4, np.int64))
    curve = cache_curve(tr, ["1M", 1 << 20, "1MiB"], ["lru", "lru"], optimal=False)
    assert len(curve.points) == 1 and curve.policies == ["lru"]
    with pytest.raises(ArgumentError, match="nothing to replay"):
        cache_curve(tr, ["1M"], [], optimal=False)
    with pytest.raises(CacheSizeError, match=r"cache size 0 \(0 bytes\) holds no row.*each cache replayed") as e:
        cache_curve(tr, [0])
    assert "cache=None" not in str(e.value)


def test_size_options_name_themselves_after_parsing_too(capsys):
    """``--shared-cache-bytes`` and ``measure --cache-bytes`` refuse a budget of less than a row (0 is no cache) or
    of more rows than a cache holds as the parser's errors, naming the option; ``Settings`` names
    ``--cache-bytes`` in the memory check it makes after parsing; a study names the file and key."""
    from sim.measure.settings import Settings
    from sim.sweep import Study

    for argv, option in ((["sim", "decode", "--steps", "10", "--shared-cache-bytes"], "--shared-cache-bytes"),
                         (["measure", "m.gguf", "--cache-bytes"], "--cache-bytes")):
        for value, why in (("100", "holds no row: a row is 264 bytes .*; 0 means no row cache"),
                           ("999T", r"at most 2\*\*31 - 1 rows")):
            with pytest.raises(SystemExit) as e:
                main(argv + [value])
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert e.value.code == 2 and f"argument {option}: size '{value}'" in err and re.search(why, err), err
    with pytest.raises(CacheSizeError, match=r"^--cache-bytes \(\d+ bytes\), \d+ rows, .* exceeds this machine's memory"):
        Settings(cache_bytes=physical_memory())
    with pytest.raises(ArgumentError, match=r"study.toml: .*shared_cache_bytes = \d+ is \d+ rows; at most 2\*\*31 - 1"):
        Study.from_dict({"study": {"name": "x"}, "fixed": {"shared_cache_bytes": "999T"}, "grid": {"steps": [10]}},
                        source="study.toml").points()


def test_cli_reuse_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sim", "trace", "reuse", "--help"])
    assert e.value.code == 0 and "Belady" in capsys.readouterr().out


def test_a_study_takes_the_cache_policy_and_bytes(tmp_path):
    """Sweeps (and so capacity searches) take the engine's cache by policy and bytes: the shared hit rate of each
    point is the replay's of the same reads."""
    import csv

    from sim.sweep import Study, run_study

    study = Study.from_dict({"study": {"name": "cache"},
                             "fixed": {"trace": "shared:agent_prompt_long.txt", "trace_limit": 400, "steps": 200,
                                       "sessions": 2, "compute": "reference", "shared_cache_bytes": "2M"},
                             "grid": {"cache_policy": ["lru", "tinylfu"]}})
    run_study(study, jobs=1, progress=False, out=tmp_path / "c.csv")
    rows = {r["cache_policy"]: r for r in csv.DictReader(open(tmp_path / "c.csv"))}
    from sim.trace import load_trace

    tr = load_trace("shared:agent_prompt_long.txt", limit=400)
    curve = cache_curve(tr, ["2M"], ["lru", "tinylfu"], sessions=2, steps=200, optimal=False)
    for p in ("lru", "tinylfu"):
        assert float(rows[p]["shared_cache_hit_rate"]) == pytest.approx(curve.points[0].hit_rate[p], abs=1e-9)
    with pytest.raises(ArgumentError, match="cache_policy"):
        Study.from_dict({"study": {"name": "x"}, "fixed": {"cache_policy": "fifo"}, "grid": {"steps": [10]}}).points()


def test_zero_bytes_is_no_cache_on_the_command_line_and_an_error_here():
    """RowCache(0) is a CacheSizeError that says cache=None; a size of 0 elsewhere means no cache."""
    from sim.measure.settings import Settings
    from sim.core.params import Policy

    with pytest.raises(CacheSizeError, match="holds no row.*cache=None"):
        RowCache(0)
    with pytest.raises(CacheSizeError, match="holds no row") as e:
        RowCache(263)
    assert "cache=None" not in str(e.value)
    assert Settings(cache_bytes=0).run_cache() is None and Settings(cache_bytes="0").run_cache() is None
    assert Policy(shared_cache_bytes=0).shared_cache_rows == 0
    with pytest.raises(CacheSizeError, match="holds no row"):
        Policy(shared_cache_bytes=263)
