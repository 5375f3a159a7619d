"""Speculative decoding in the engine (issue 27): Session.step_many, rollback and prefetch of drafts.

Known answers: the rows of the synthetic model's content (``synth.rows_at``) and the rows a second session
gives stepping the same tokens one by one; token streams vary under hypothesis (real text and random ids).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engram import (ArgumentError, DraftCancelled, DraftPrefetch, EngramError, EngramModel, HistoryError, RowCache,
                    TableIOError, TokenError, decode_rows, synth)
from engram.model import ROLLBACK_TOKENS
from tests.faults import run_child
from tests.modelfiles import SCALE, token_map as _token_map

SEED = 5
HEALTH = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec-model") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=SEED),
                      synth.Fill(projections=False), progress=False)
    return path


@pytest.fixture(scope="module")
def model(model_path):
    return EngramModel.open(model_path, readers=8)


@pytest.fixture(scope="module")
def text_ids(tokenizer, shared_data):
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[40000:44000]
    return np.array(tokenizer.encode(text, add_special_tokens=False).ids[:400], dtype=np.int64)


def expected(model, tokens, history=None) -> dict:
    """{layer: float32 [T, 24, 256]}: the synthetic content's rows of ``tokens`` hashed from ``history``."""
    row_ids = model.hasher.hash(np.asarray(tokens, np.int64), None, None if history is None else history.copy())
    return {lid: decode_rows(synth.rows_at(lid, row_ids[:, li, :].reshape(-1), seed=SEED)).reshape(-1, 24, 256)
            for li, lid in enumerate(model.layer_ids)}


def stream(text_ids, vocab, data):
    """A token stream: a stretch of real text with some ids replaced by random ones (drafts gone wrong)."""
    start = data.draw(st.integers(0, len(text_ids) - 40), label="start")
    n = data.draw(st.integers(1, 40), label="n")
    toks = text_ids[start:start + n].copy()
    for i in data.draw(st.lists(st.integers(0, n - 1), max_size=5), label="random at"):
        toks[i] = data.draw(st.integers(0, vocab - 1), label="id")
    return toks


def chunks(n, data):
    """Split ``n`` tokens into steps of 1..5 tokens."""
    out, i = [], 0
    while i < n:
        k = data.draw(st.integers(1, min(5, n - i)), label="T")
        out.append((i, i + k))
        i += k
    return out


# ---------------------------------------------------------------- step_many
@settings(max_examples=25, **HEALTH)
@given(st.data())
def test_step_many_equals_steps(model, text_ids, data):
    toks = stream(text_ids, model.hasher.vocab_size, data)
    want = expected(model, toks)
    with model.session() as many, model.session() as one:
        for a, b in chunks(len(toks), data):
            got = many.step_many(toks[a:b])
            st_ = many.last_stats
            for t in range(a, b):
                rows = one.step(int(toks[t]))
                for lid in model.layer_ids:
                    assert np.array_equal(rows[lid], want[lid][t])
            for lid in model.layer_ids:
                assert got[lid].shape == (b - a, 24, 256) and got[lid].dtype == np.float32
                assert got[lid].flags.c_contiguous
                assert np.array_equal(got[lid], want[lid][a:b]), (a, b, lid)
            # one batch: every row id of the T tokens asked once, each distinct (table, row) read once
            ids = model.hasher.hash(toks[:b])[a:b]
            distinct = sum(len(np.unique(ids[:, li, :])) for li in range(len(model.layer_ids)))
            assert (st_.calls, st_.rows_requested, st_.rows_distinct) == (1, 48 * (b - a), distinct)
            assert st_.prefetch_hits == 0
            assert np.array_equal(many.last_row_ids, ids[-1])
            assert many.history == one.history


def test_step_many_reads_repeated_rows_once(model, text_ids):
    """One token six times from a fresh history: from the fourth on the history is that token three
    times, so tokens 3, 4 and 5 have the same 48 rows: 288 asked, at most 4 x 48 read, each once."""
    tok = int(text_ids[7])
    with model.session() as s:
        got = s.step_many([tok] * 6)
        st_ = s.last_stats
        assert st_.rows_requested == 288 and st_.rows_distinct <= 192 and st_.reads == st_.rows_distinct
        want = expected(model, [tok] * 6)
        for lid in model.layer_ids:
            assert np.array_equal(got[lid], want[lid])
            assert np.array_equal(got[lid][3], got[lid][5])


@pytest.mark.parametrize("bad, what", [([], "at least one token"), ([5, 7, 10**9], "token 1000000000 at position 2"),
                                       ([5, -1], "token -1 at position 1"), ([1.5], "integer"),
                                       ([[1, 2]], "1-D")])
def test_step_many_bad_input_leaves_history(model, text_ids, bad, what):
    with model.session() as s:
        s.step_many(text_ids[:4])
        before, stats = s.snapshot(), s.last_stats
        with pytest.raises(EngramError, match=what) as exc:
            s.step_many(bad)
        assert isinstance(exc.value, ArgumentError if not bad else TokenError)
        assert s.history == before and s.last_stats is stats
        s.rollback(4)  # nothing was recorded for the failed call
        with pytest.raises(HistoryError):
            s.rollback(1)


def test_step_many_on_a_closed_session(model):
    s = model.session()
    s.close()
    for call in (lambda: s.step_many([1, 2]), lambda: s.prefetch([1]), lambda: s.step(1)):
        with pytest.raises(TableIOError, match="closed"):
            call()


# ---------------------------------------------------------------- rollback
@settings(max_examples=25, **HEALTH)
@given(st.data())
def test_rollback_equals_never_seen(model, text_ids, data):
    """Step a stream (in batches), roll back n, step on: the rows of a session that never saw the n."""
    toks = stream(text_ids, model.hasher.vocab_size, data)
    n = data.draw(st.integers(0, len(toks)), label="rollback")
    tail = text_ids[data.draw(st.integers(0, 300), label="tail at"):][:data.draw(st.integers(1, 6), label="tail")]
    with model.session() as s, model.session() as ref:
        for a, b in chunks(len(toks), data):
            if b - a == 1 and data.draw(st.booleans(), label="step"):
                s.step(int(toks[a]))
            else:
                s.step_many(toks[a:b])
        s.rollback(n)
        kept = toks[:len(toks) - n]
        if len(kept):
            ref.step_many(kept)
        assert s.history == ref.history
        got, twin = s.step_many(tail), ref.step_many(tail)
        want = expected(model, np.concatenate([kept, tail]))
        for lid in model.layer_ids:
            assert np.array_equal(got[lid], want[lid][len(kept):])
            assert np.array_equal(got[lid], twin[lid])


def test_rollback_beyond_what_can_be_undone(model, text_ids):
    with model.session() as s:
        with pytest.raises(HistoryError, match=r"rollback\(1\): only 0"):
            s.rollback(1)
        s.step_many(text_ids[:3])
        s.step(int(text_ids[3]))
        s.step_rows(int(text_ids[4]))
        before = s.snapshot()
        with pytest.raises(HistoryError, match=r"rollback\(6\): only 5 decode"):
            s.rollback(6)
        assert s.history == before
        for bad in (-1, 1.0, True, "2"):
            with pytest.raises(ArgumentError, match="rollback needs"):
                s.rollback(bad)
        assert s.history == before
        s.rollback(0)
        assert s.history == before
        s.rollback(5)
        assert s.history == model.hasher.new_history()
        # a prompt cannot be rolled back into, nor a restored state
        s.prefill(text_ids[:20]).wait(model.layer_ids[-1], timeout=60)
        s.step(int(text_ids[20]))
        s.rollback(1)
        with pytest.raises(HistoryError, match="only 0"):
            s.rollback(1)
        s.step(int(text_ids[20]))
        s.restore(before)
        with pytest.raises(HistoryError, match="only 0"):
            s.rollback(1)


def test_rollback_is_bounded(model, text_ids):
    with model.session() as s:
        for i in range(ROLLBACK_TOKENS + 10):
            s.step_rows(int(text_ids[i % len(text_ids)]))
        with pytest.raises(HistoryError, match=f"only {ROLLBACK_TOKENS}"):
            s.rollback(ROLLBACK_TOKENS + 1)
        s.rollback(ROLLBACK_TOKENS)


# ---------------------------------------------------------------- prefetch
def _drafts_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "engram-drafts")


@settings(max_examples=20, **HEALTH)
@given(st.data())
def test_prefetch_serves_the_matching_prefix(model, text_ids, data):
    """Prefetch k drafts, then step T tokens whose first m are the drafts: m x 48 rows from the prefetch,
    the rest read in one batch, every row exact; with wait or without (the step waits)."""
    at = data.draw(st.integers(0, 300), label="at")
    k = data.draw(st.integers(1, 4), label="k")
    drafts = text_ids[at + 5:at + 5 + k].copy()
    m = data.draw(st.integers(0, k), label="m")
    T = data.draw(st.integers(max(1, m), m + 3), label="T")
    toks = np.concatenate([drafts[:m], text_ids[at + 5 + k:at + 5 + k + T - m]])[:T]
    if m < k and len(toks) > m:
        toks[m] = (drafts[m] + 1) % model.hasher.vocab_size  # a wrong draft ends the match
    toks = toks[:T]
    single = T == 1 and data.draw(st.booleans(), label="step")
    with model.session() as s:
        s.step_many(text_ids[at:at + 5])
        p = s.prefetch(drafts)
        assert isinstance(p, DraftPrefetch) and len(p) == k and s.history == p.history
        if data.draw(st.booleans(), label="wait"):
            p.wait(timeout=60)
            assert p.stats.rows_requested == 48 * k
        got = s.step(int(toks[0])) if single else s.step_many(toks)
        want = expected(model, np.concatenate([text_ids[at:at + 5], toks]))
        for lid in model.layer_ids:
            g = got[lid][None] if single else got[lid]
            assert np.array_equal(g, want[lid][5:]), lid
        st_ = s.last_stats
        assert st_.prefetch_hits == 48 * m and st_.rows_requested == 48 * len(toks)
        if m == len(toks):
            assert (st_.backend, st_.reads, st_.rows_distinct) == ("prefetch", 0, 0)
        else:
            assert 0 < st_.rows_distinct <= 48 * (len(toks) - m)
        assert s._prefetch is None  # used or dropped: the next step reads
        s.step_many(toks[:1])
        assert s.last_stats.prefetch_hits == 0


def test_prefetch_from_another_history_is_not_used(model, text_ids):
    with model.session() as s, model.session() as ref:
        s.step_many(text_ids[:5])
        ref.step_many(text_ids[:5])
        p = s.prefetch(text_ids[5:7])
        p.wait(timeout=60)
        s.step(int(text_ids[9]))       # the history moved past something else
        assert s.last_stats.prefetch_hits == 0
        s.rollback(1)                  # back where the prefetch was issued, but it was dropped
        got = s.step_many(text_ids[5:7])
        assert s.last_stats.prefetch_hits == 0
        want = ref.step_many(text_ids[5:7])
        assert all(np.array_equal(got[lid], want[lid]) for lid in model.layer_ids)


def test_prefetch_survives_a_rollback_to_its_history(model, text_ids):
    """Verification rejected the drafts; the prefetch issued for the history after the rollback serves."""
    with model.session() as s, model.session() as ref:
        s.step_many(text_ids[:8])
        s.rollback(2)                 # two drafts rejected
        p = s.prefetch(text_ids[6:9])
        got = s.step_many(text_ids[6:9])
        assert s.last_stats.prefetch_hits == 3 * 48 and p.done
        ref.step_many(text_ids[:6])
        want = ref.step_many(text_ids[6:9])
        assert all(np.array_equal(got[lid], want[lid]) for lid in model.layer_ids)


def test_a_new_prefetch_cancels_the_old_and_one_thread_serves(model, text_ids):
    before = _drafts_threads()
    with model.session() as s:
        s.step_many(text_ids[:3])
        ps = [s.prefetch(text_ids[3 + i:5 + i]) for i in range(20)]
        for p in ps[:-1]:
            assert p.state in ("cancelled", "ready")
        assert _drafts_threads() == before + 1
        ps[-1].wait(timeout=60)
        got = s.step(int(text_ids[22]))
        assert s.last_stats.prefetch_hits == 48
        want = expected(model, np.concatenate([text_ids[:3], text_ids[22:23]]))
        assert all(np.array_equal(got[lid], want[lid][3]) for lid in model.layer_ids)
        cancelled = [p for p in ps[:-1] if p.cancelled]
        for p in cancelled:
            with pytest.raises(DraftCancelled):
                p.wait(timeout=1)
    assert _drafts_threads() == before


def test_a_mismatched_step_cancels_the_prefetch(model, text_ids):
    with model.session() as s:
        s.step_many(text_ids[:3])
        p = s.prefetch(text_ids[3:6])
        s.step(int(text_ids[3]) + 1)
        assert p.state in ("cancelled", "ready") and s.last_stats.prefetch_hits == 0


@pytest.mark.parametrize("bad, kind, what", [([], ArgumentError, r"k >= 1"),
                                             ([3, 10**9], TokenError, "token 1000000000 at position 1"),
                                             ([2.5], TokenError, "integer")])
def test_prefetch_bad_input(model, text_ids, bad, kind, what):
    with model.session() as s:
        s.step_many(text_ids[:3])
        p = s.prefetch(text_ids[3:5])
        h = s.snapshot()
        with pytest.raises(kind, match=what):
            s.prefetch(bad)
        assert s.history == h and s._prefetch is p and not p.cancelled
        s.step_many(text_ids[3:5])
        assert s.last_stats.prefetch_hits == 96


def test_close_cancels_a_pending_prefetch(model, text_ids):
    before = _drafts_threads()
    for _ in range(5):
        s = model.session()
        s.step_many(text_ids[:3])
        p = s.prefetch(text_ids[3:7])
        s.close()
        assert p.done and _drafts_threads() == before
        if p.cancelled:
            with pytest.raises(DraftCancelled, match="cancelled"):
                p.rows()
        else:
            assert np.array_equal(p.rows(2)[:, :24], expected(model, text_ids[:5])[model.layer_ids[0]][3:5])


@pytest.mark.parametrize("engine", ["shared", "private"])
@pytest.mark.parametrize("cached", [False, True])
def test_prefetch_with_engines_and_the_row_cache(model_path, text_ids, engine, cached):
    m = EngramModel.open(model_path, readers=8, engine=engine, cache=RowCache(264 * 5000, "lru") if cached else None)
    with m.session() as s:
        assert (s.tables[m.layer_ids[0]].engine is None) == (engine == "private")
        toks = text_ids[:60]
        want = expected(m, toks)
        for a in range(0, 60, 3):
            p = s.prefetch(toks[a:a + 3])
            assert p.row_ids.shape == (3, 2, 24)
            if a % 2:  # all three drafts verified in one step
                got = s.step_many(toks[a:a + 3])
                assert s.last_stats.prefetch_hits == 144
            else:      # one token stepped: the rest of the prefetch is dropped
                one = s.step(int(toks[a]))
                assert s.last_stats.prefetch_hits == 48
                rest = s.step_many(toks[a + 1:a + 3])
                assert s.last_stats.prefetch_hits == 0 and s.last_stats.rows_requested == 96
                got = {lid: np.concatenate([one[lid][None], rest[lid]]) for lid in m.layer_ids}
            assert all(np.array_equal(got[lid], want[lid][a:a + 3]) for lid in m.layer_ids)
        # the second pass over the same text: the cache serves the prefetch's reads
        s.restore(m.hasher.new_history())
        p = s.prefetch(toks[:3])
        p.wait(timeout=60)
        assert p.stats.cache_hits == (144 if cached else 0)
        got = s.step_many(toks[:3])
        assert s.last_stats.prefetch_hits == 144
        assert all(np.array_equal(got[lid], want[lid][:3]) for lid in m.layer_ids)


# ---------------------------------------------------------------- fork
FORK = r'''
import json, os, sys
import numpy as np
from engram import EngramModel, Hasher, decode_rows, synth
model = EngramModel.open(os.environ["M_PATH"], readers=8)
ids = np.array(json.loads(os.environ["IDS"]))
row_ids = Hasher(model.layout, model.token_map).hash(ids)
ref = {lid: decode_rows(synth.rows_at(lid, row_ids[:, li, :].reshape(-1), seed=5)).reshape(-1, 24, 256)
       for li, lid in enumerate(model.layer_ids)}
s = model.session()
s.step_many(ids[:4])
out = {}
for case in ("use", "close"):
    p = s.prefetch(ids[4:8])  # queued or being read when the process forks
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if case == "use":
            got = s.step_many(ids[4:7])
            res = {"exact": bool(all(np.array_equal(got[lid], ref[lid][4:7]) for lid in model.layer_ids)),
                   "hits": s.last_stats.prefetch_hits}
        else:
            s.close()
            res = {"closed": s.closed, "done": p.done}
        os.write(w, json.dumps(res).encode())
        os.close(w)
        sys.exit(0)  # finalizers run: the child's session closes (its own reader thread, never the parent's)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    out[case] = json.loads(os.read(r, 1 << 16) or b"{}")
    os.close(r)
    out[case + "_exit"] = os.waitstatus_to_exitcode(status)
    got = s.step_many(ids[4:8])
    out[case + "_parent"] = [bool(all(np.array_equal(got[lid], ref[lid][4:8]) for lid in model.layer_ids)),
                             s.last_stats.prefetch_hits]
    s.rollback(4)
s.close()
print(json.dumps(out))
'''


def test_fork_with_a_prefetch_pending(model_path, text_ids):
    """fork() right after a prefetch (its read queued or in flight): the child's step takes the drafts'
    rows (read again by a thread of its own if the parent's was reading), its close() does not hang,
    and the parent's prefetch serves the parent exactly."""
    got = run_child(FORK, env={"M_PATH": str(model_path), "IDS": json.dumps(text_ids[:10].tolist())}, timeout=120)
    assert got == {"use": {"exact": True, "hits": 144}, "use_exit": 0, "use_parent": [True, 192],
                   "close": {"closed": True, "done": True}, "close_exit": 0, "close_parent": [True, 192]}


def test_read_stats_add_counts_prefetch_hits(model, text_ids):
    with model.session() as s:
        s.step_many(text_ids[:3])
        s.prefetch(text_ids[3:5]).wait(timeout=60)
        s.step_many(text_ids[3:6])
        a = s.last_stats
        total = type(a)()
        total.add(a)
        total.add(a)
        assert (a.prefetch_hits, a.rows_requested, total.prefetch_hits, total.rows_requested) == (96, 144, 192, 288)


# ---------------------------------------------------------------- reads begun now, finished later
def _layer_ids_of(model, toks):
    """uint32 [layers, T, 24]: the row ids of ``toks`` hashed from a new history, table after table."""
    return np.ascontiguousarray(model.hasher.hash(np.asarray(toks, np.int64)).transpose(1, 0, 2))


@pytest.mark.parametrize("backend", ["auto", "pread", "serial"])
@pytest.mark.parametrize("engine", ["shared", "private"])
def test_begin_layers_and_read_layers_are_read_batch(model_path, text_ids, backend, engine):
    """read_layers and begin_layers + finish give read_batch's rows, table after table, with its counts;
    a second begin before finish, and finish without begin, are refused."""
    from engram import TableGroup
    m = EngramModel.open(model_path, readers=8, backend=backend, engine=engine)
    with m.session() as s:
        g = TableGroup([s.tables[lid] for lid in m.layer_ids], 24, engine=engine)
        try:
            ids = _layer_ids_of(m, text_ids[:30])
            want = expected(m, text_ids[:30])
            flat = g.read_batch(ids.transpose(1, 0, 2).reshape(30, 48))
            st_batch = g.last_stats
            got = g.read_layers(ids)
            assert got.shape == (2, 30, 24, 256) and all(got[i].flags.c_contiguous for i in range(2))
            out = np.full((2, 30, 24, 256), np.nan, np.float32)
            g.begin_layers(ids, out)
            assert g.begun
            with pytest.raises(ArgumentError, match="not finished"):
                g.begin_layers(ids, np.empty_like(out))
            with pytest.raises(ValueError, match="begun read"):
                g.read_batch(ids.transpose(1, 0, 2).reshape(30, 48))
            st_ = g.finish()
            assert not g.begun
            with pytest.raises(ArgumentError, match="no begun read"):
                g.finish()
            for i, lid in enumerate(m.layer_ids):
                assert np.array_equal(got[i], want[lid]) and np.array_equal(out[i], want[lid])
                assert np.array_equal(flat[:, i * 24:(i + 1) * 24], want[lid])
            assert (st_.rows_requested, st_.rows_distinct, st_.reads) == \
                (st_batch.rows_requested, st_batch.rows_distinct, st_batch.reads) and g.last_stats is st_
        finally:
            g.close()


def test_begun_batches_deeper_than_the_engine_finish_in_any_order(model_path, text_ids):
    """Two batches begun on one engine of 8 credits, 144 rows each, finished newest first: neither waits for
    credits that only the other's finish would return (the begun ring reads give theirs back)."""
    from engram import TableGroup
    from engram.io_engine import IOEngine
    eng = IOEngine(8)
    m = EngramModel.open(model_path, readers=8, engine=eng)
    with m.session() as s:
        groups = [TableGroup([s.tables[lid] for lid in m.layer_ids], 24, engine=eng) for _ in range(2)]
        outs, done = [np.empty((2, 3, 24, 256), np.float32) for _ in range(2)], []

        def run():
            for r in range(5):
                for gi, g in enumerate(groups):
                    g.begin_layers(_layer_ids_of(m, text_ids[6 * r + 3 * gi:6 * r + 3 * gi + 3]), outs[gi])
                for gi in (1, 0):
                    groups[gi].finish()
                    want = expected(m, text_ids[6 * r + 3 * gi:6 * r + 3 * gi + 3])
                    done.append(all(np.array_equal(outs[gi][i], want[lid]) for i, lid in enumerate(m.layer_ids)))

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(120)
        try:
            assert not t.is_alive(), "a begun batch waited for credits held by the other"
            assert done == [True] * 10
        finally:
            for g in groups:
                g.close()


def test_a_fully_prefetched_step_returns_views_of_the_prefetch(model, text_ids):
    with model.session() as s, model.session() as ref:
        s.step_many(text_ids[:4])
        ref.step_many(text_ids[:4])
        p = s.prefetch(text_ids[4:7])
        got = s.step_many(text_ids[4:7])
        want = ref.step_many(text_ids[4:7])
        assert s.last_stats.prefetch_hits == 144 and s.history == ref.history
        for lid in model.layer_ids:
            assert got[lid].flags.c_contiguous and np.shares_memory(got[lid], p._rows)
            assert np.array_equal(got[lid], want[lid])
        s.rollback(2)
        ref.rollback(2)
        assert np.array_equal(s.step(int(text_ids[9]))[model.layer_ids[0]], ref.step(int(text_ids[9]))[model.layer_ids[0]])


@pytest.mark.parametrize("bad, what", [(-1, "token -1 at position 0"), (10**9, "token 1000000000 at position 0"),
                                       (np.int64(-5), "token -5 at position 0"), (True, "integer"),
                                       (2.0, "integer")])
def test_step_with_a_prefetch_pending_refuses_bad_tokens(model, text_ids, bad, what):
    """The step's own check of a token against a pending prefetch (an int in range is taken as it is, anything
    else is checked as step_many checks it): a bad id is a TokenError, the history and the prefetch untouched."""
    with model.session() as s:
        s.step_many(text_ids[:3])
        p = s.prefetch(text_ids[3:5])
        h = s.snapshot()
        with pytest.raises(TokenError, match=what):
            s.step(bad)
        assert s.history == h and s._prefetch is p and not p.cancelled
        s.step(np.int64(text_ids[3]))  # a NumPy integer that is the first draft takes the prefetch
        assert s.last_stats.prefetch_hits == 48


def test_a_step_taking_the_drafts_leaves_the_prefetchs_snapshots(model, text_ids):
    """The histories a step takes from a prefetch are the session's own copies: stepping, rolling back and
    stepping again leave the prefetch's published snapshots (``histories``, ``row_ids``) as they were."""
    with model.session() as s:
        s.step_many(text_ids[:3])
        p = s.prefetch(text_ids[3:5])
        hists = [h.copy() for h in p.histories]
        ids = p.row_ids.copy()
        s.step_many(text_ids[3:5])
        s.step(int(text_ids[5]))
        s.rollback(2)
        s.step_many(text_ids[10:13])
        assert p.histories == hists and np.array_equal(p.row_ids, ids)
        assert s.last_row_ids is not p.row_ids[-1]


def test_short_and_long_token_arrays_are_checked_alike(model):
    """Hasher.check_tokens checks up to SHORT_TOKENS ids in Python and longer arrays with NumPy: the same
    answers and the same errors (naming the first bad id and its position) on both sides of the bound."""
    from engram.hashing import SHORT_TOKENS

    h = model.hasher
    for n in (1, SHORT_TOKENS, SHORT_TOKENS + 1):
        ok = np.arange(n, dtype=np.int64) % h.vocab_size
        assert h.check_tokens(ok) is ok
        for bad, at in ((-1, n - 1), (h.vocab_size, 0)):
            b = ok.copy()
            b[at] = bad
            with pytest.raises(TokenError, match=f"token {bad} at position {at} "):
                h.check_tokens(b)
        strided = np.repeat(ok, 2)[::2]
        assert np.array_equal(h.check_tokens(strided), ok) and h.check_tokens(strided).flags.c_contiguous


@pytest.mark.parametrize("first", [True, False])
def test_step_with_a_prefetch_pending_refuses_a_0d_array(model, text_ids, first):
    """A 0-d array is no token id for step (as without a prefetch): a TokenError, whether or not it holds the
    first draft, the history and the prefetch untouched."""
    with model.session() as s:
        s.step_many(text_ids[:3])
        p = s.prefetch(text_ids[3:5])
        h = s.snapshot()
        with pytest.raises(TokenError, match="not an integer token id"):
            s.step(np.array(text_ids[3] if first else text_ids[9]))
        assert s.history == h and s._prefetch is p and not p.cancelled
        with pytest.raises(TokenError, match="not an integer token id"):
            s.step(np.array(text_ids[3]))
        s.step(int(text_ids[3]))
        assert s.last_stats.prefetch_hits == 48


def test_step_many_and_prefetch_of_a_masked_array(model, text_ids):
    """A masked int64 array is stepped and prefetched as its data (no TypeError from the Nones of its tolist),
    the rows those of a session stepping the data."""
    toks = np.ma.masked_array(text_ids[3:8].copy(), mask=[0, 1, 0, 0, 0])
    with model.session() as s, model.session() as ref:
        s.step_many(text_ids[:3])
        ref.step_many(text_ids[:3])
        s.prefetch(toks)
        got = s.step_many(toks)
        want = ref.step_many(text_ids[3:8])
        assert s.last_stats.prefetch_hits == 5 * 48 and s.history == ref.history
        assert all(np.array_equal(got[lid], want[lid]) for lid in model.layer_ids)
