"""sim.trace: traces from real text and their reuse statistics (SPEC §4, §8)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import Hasher, Layout, build_token_map, load_tokenizer
from engram.errors import ArgumentError, EngramError, FormatError
from sim.trace import (CODE_SOURCE, Trace, builtin_sources, load_trace, lru_hit_rate, lru_hits, repeat_mask,
                       resolve_source, reuse_stats)

LAYOUT = Layout.deepseek_v41_flash()


@pytest.fixture(scope="module")
def code600() -> Trace:
    return load_trace(CODE_SOURCE, limit=600)


@pytest.fixture(scope="module")
def engine():
    """The engine's own tokenizer and hasher, built independently of sim.trace."""
    return load_tokenizer(), Hasher(LAYOUT, build_token_map())


def direct_reuse(trace: Trace):
    """Straight count: for each read, was (layer, row) read earlier in its sequence? -> bool [T, L, C]."""
    out = np.zeros(trace.rows.shape, dtype=bool)
    starts = set(trace.starts.tolist())
    seen = set()
    for t in range(trace.steps):
        if t in starts:
            seen = set()
        for li in range(trace.layers):
            for c in range(trace.columns):
                key = (li, int(trace.rows[t, li, c]))
                out[t, li, c] = key in seen
                seen.add(key)
    return out


def naive_lru(trace: Trace, capacity: int, per_sequence: bool = True):
    """LRU as a plain list, most recent last."""
    out = np.zeros(trace.rows.shape, dtype=bool)
    starts = set(trace.starts.tolist()) if per_sequence else {0}
    cache: list = []
    for t in range(trace.steps):
        if t in starts:
            cache = []
        for li in range(trace.layers):
            for c in range(trace.columns):
                key = (li, int(trace.rows[t, li, c]))
                if key in cache:
                    cache.remove(key)
                    out[t, li, c] = True
                cache.append(key)
                if len(cache) > capacity:
                    cache.pop(0)
    return out


# --------------------------------------------------------------------- building
def test_code_source_ships_with_python(code600):
    kind, path = resolve_source(CODE_SOURCE)
    assert kind == "textfile" and path.is_file() and path.name == "base_events.py"
    assert CODE_SOURCE in builtin_sources()
    assert code600.rows.shape == (600, 2, 24) and code600.rows.dtype == np.uint32
    assert code600.layer_ids == (1, 14)
    assert code600.source == CODE_SOURCE


def test_trace_rows_are_the_engine_hash(code600, engine):
    tok, hasher = engine
    text = resolve_source(CODE_SOURCE)[1].read_text(encoding="utf-8")
    ids = np.asarray(tok.encode(text, add_special_tokens=False).ids[:600])
    assert np.array_equal(code600.tokens, ids)
    assert np.array_equal(code600.rows, hasher.hash(ids))
    # Each column's rows lie in that column's bucket range (SPEC §2 offsets and primes).
    off = LAYOUT.offsets.astype(np.int64)
    pr = LAYOUT.primes.astype(np.int64)
    r = code600.rows.astype(np.int64)
    assert np.all((r >= off) & (r < off + pr))


def test_text_and_tokens_sources_agree(tmp_path):
    text = "def f(x):\n    return x + 1\n"
    a = load_trace("text:" + text)
    tok = tmp_path / "ids.txt"
    tok.write_text(", ".join(str(x) for x in a.tokens.tolist()))
    b = load_trace(f"tokens:{tok}")
    np.save(tmp_path / "ids.npy", a.tokens)
    c = load_trace(str(tmp_path / "ids.npy"))
    assert np.array_equal(a.rows, b.rows) and np.array_equal(a.rows, c.rows)


def test_package_source():
    tr = load_trace("package:numpy/__init__.py", limit=50)
    assert tr.steps == 50


def test_save_load_roundtrip(tmp_path, code600):
    path = code600.save(tmp_path / "t.npz")
    back = Trace.load(path)
    assert np.array_equal(back.rows, code600.rows) and np.array_equal(back.tokens, code600.tokens)
    assert back.layer_ids == code600.layer_ids and back.heads == 8 and back.source == CODE_SOURCE
    assert load_trace(str(path), limit=10).steps == 10


def test_prompts_jsonl_fresh_history_per_prompt(tmp_path, engine):
    lines = [{"id": "a", "prompt": "Explain B-tree insertion."}, {"id": "b", "prompt": "Explain B-tree insertion."},
             {"id": "c", "prompt": "Ciao, come stai?"}]
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    tr = load_trace(str(p))
    assert tr.names == ("a", "b", "c") and tr.starts.size == 3
    tok, hasher = engine
    for i, x in enumerate(lines):
        a = tr.starts[i]
        b = tr.starts[i + 1] if i + 1 < tr.starts.size else tr.steps
        ids = tok.encode(x["prompt"], add_special_tokens=False).ids
        assert np.array_equal(tr.rows[a:b], hasher.hash(np.asarray(ids)))
    # Identical prompts in separate sessions: no reuse within a session, full reuse across.
    st_ = reuse_stats(tr.head(int(tr.starts[2])))
    assert st_.reuse_rate == pytest.approx(direct_reuse(tr.head(int(tr.starts[2]))).mean())
    assert reuse_stats(tr.head(int(tr.starts[2])), per_sequence=False).reuse_rate >= 0.5


def test_shared_prompts_file():
    tr = load_trace("shared:prompts.jsonl")
    assert tr.starts.size == 100 and tr.names[0] == "case_000"


def test_bad_sources(tmp_path):
    with pytest.raises(ArgumentError, match="no file"):
        load_trace("stdlib:no/such/module.py")
    with pytest.raises(ArgumentError, match="no installed package"):
        load_trace("package:no_such_package_xyz/a.py")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "prompt": "ok"}\n{"id": "y"}\n')
    with pytest.raises(FormatError, match="line 2"):
        load_trace(str(bad))
    bad.write_text('{"id": "x", "prompt": "ok"}\nnot json\n')
    with pytest.raises(FormatError, match="line 2"):
        load_trace(str(bad))
    tok = tmp_path / "t.txt"
    tok.write_text("1 2 three")
    with pytest.raises(FormatError, match="item 2"):
        load_trace(f"tokens:{tok}")
    tok.write_text("1 2 999999999")
    with pytest.raises(EngramError, match="position 2"):
        load_trace(f"tokens:{tok}")
    np.savez(tmp_path / "x.npz", a=np.zeros(3))
    with pytest.raises(FormatError, match="missing field"):
        Trace.load(tmp_path / "x.npz")
    with pytest.raises(ArgumentError):
        load_trace(CODE_SOURCE, limit=0)


def _saved(tmp_path, name, **fields):
    """A trace file of 13 steps [13, 2, 24] with ``fields`` replacing those :meth:`Trace.save` writes."""
    rng = np.random.default_rng(0)
    z = dict(rows=rng.integers(0, 1000, (13, 2, 24)).astype(np.uint32), tokens=np.arange(13, dtype=np.int64),
             starts=np.zeros(1, np.int64), layer_ids=np.array([1, 14]), heads=np.int64(8), source=np.str_("t"),
             names=np.array(["seq0"]))
    z.update(fields)
    path = tmp_path / f"{name}.npz"
    np.savez(path, **z)
    return path


@pytest.mark.parametrize("name, fields, what", [
    ("dup", dict(layer_ids=np.array([1, 1])), r"layer_ids names layer 1 twice"),
    ("neg", dict(layer_ids=np.array([-1, 14])), r"layer_ids must be integers in \[0, 2\*\*32\), got -1"),
    ("huge", dict(layer_ids=np.array([1, 2 ** 32 + 1])), r"layer_ids must be .*got 4294967297"),
    ("float_layer", dict(layer_ids=np.array([1.9, 14.2])), r"field 'layer_ids' must be integers \[layers\], got float64"),
    ("str_layer", dict(layer_ids=np.array(["a", "b"])), r"field 'layer_ids' must be integers"),
    ("float_heads", dict(heads=np.float64(8.5)), r"field 'heads' must be one integer, got float64"),
    ("array_heads", dict(heads=np.array([8, 8])), r"field 'heads' must be one integer, got int64 \(2,\) \[8, 8\]"),
    ("zero_columns", dict(rows=np.zeros((13, 2, 0), np.uint32)), r"at least one layer and one column, got shape \(13, 2, 0\)"),
    ("zero_layers", dict(rows=np.zeros((13, 0, 24), np.uint32), layer_ids=np.zeros(0, np.int64)), r"at least one layer"),
])
def test_bad_trace_fields_are_refused_naming_the_file_and_field(tmp_path, name, fields, what):
    """A saved trace whose layer ids collide, are negative, beyond uint32 or not integers, whose heads are not one
    integer, or whose rows have no column: a FormatError naming the file and the field (they made keys collide,
    truncated silently, raised OverflowError or TypeError, or printed NaN hit rates)."""
    path = _saved(tmp_path, name, **fields)
    with pytest.raises(FormatError, match=rf"{name}\.npz: .*{what}"):
        Trace.load(path)
    with pytest.raises(FormatError, match=what):
        load_trace(str(path))
    good = Trace.load(_saved(tmp_path, "good"))
    assert good.layer_ids == (1, 14) and good.heads == 8 and type(good.heads) is int


def test_trace_refuses_layer_ids_and_heads_that_are_not_integers():
    rows = np.zeros((3, 2, 24), np.uint32)
    for bad in ((1.9, 14), (1, True), (1, 2 ** 32)):
        with pytest.raises(ArgumentError, match="layer_ids must be integers"):
            Trace(rows, np.arange(3), layer_ids=bad)
    for bad in (8.0, True, "8"):
        with pytest.raises(ArgumentError, match="heads must be an integer"):
            Trace(rows, np.arange(3), heads=bad)
    assert Trace(rows, np.arange(3), layer_ids=np.array([1, 14]), heads=np.int64(8)).layer_ids == (1, 14)


# ------------------------------------------------------------------------ reuse
def test_reuse_of_600_tokens_of_source_code_equals_direct_count(code600):
    st_ = reuse_stats(code600, lru_sizes=(48, 1000, 10**6))
    direct = direct_reuse(code600)
    assert st_.repeats == int(direct.sum()) and st_.reads == 600 * 48
    assert st_.reuse_rate == direct.mean()
    orders = np.arange(24) // 8 + 2
    for o in (2, 3, 4):
        assert st_.by_order[o] == direct[:, :, orders == o].mean()
    for li, lid in enumerate((1, 14)):
        assert st_.by_layer[lid] == direct[:, li, :].mean()
        for o in (2, 3, 4):
            assert st_.by_layer_order[lid][o] == direct[:, li, orders == o].mean()
    # A repeated 4-gram repeats its 3- and 2-gram suffix: reuse falls with the order.
    assert st_.by_order[2] >= st_.by_order[3] >= st_.by_order[4] > 0
    # Equal column counts per order: the overall rate is the mean over orders.
    assert st_.reuse_rate == pytest.approx(np.mean(list(st_.by_order.values())))
    # A cache of one step's rows never hits (a step's 48 rows are distinct); an unbounded one hits every repeat.
    assert st_.lru[48] == 0.0
    assert st_.lru[10**6] == st_.reuse_rate
    assert 0 < st_.lru[1000] < st_.reuse_rate


def test_lru_matches_naive_list(code600):
    tr = code600.head(150)
    for cap in (60, 500, 3000):
        assert np.array_equal(lru_hits(tr, cap), naive_lru(tr, cap))


def random_trace(data, layers=2, heads=2, orders=2):
    T = data.draw(st.integers(1, 40))
    vocab = data.draw(st.integers(1, 12))
    rows = np.asarray(data.draw(st.lists(st.integers(0, vocab), min_size=T * layers * heads * orders,
                                         max_size=T * layers * heads * orders)), dtype=np.uint32)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, T - 1)), max_size=3)))) if T > 1 else []
    return Trace(rows.reshape(T, layers, heads * orders), np.zeros(T, dtype=np.int64), [0] + cuts,
                 tuple(range(layers)), heads)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_reuse_and_lru_properties(data):
    tr = random_trace(data)
    per_seq = data.draw(st.booleans())
    rep = repeat_mask(tr, per_seq)
    if per_seq:
        assert np.array_equal(rep, direct_reuse(tr))
    cap = data.draw(st.integers(0, 30))
    hits = lru_hits(tr, cap, per_seq)
    assert np.array_equal(hits, naive_lru(tr, cap, per_seq))
    # LRU hits are repeats, and more capacity never loses a hit (inclusion property).
    assert not np.any(hits & ~rep)
    assert np.all(lru_hits(tr, cap + 5, per_seq) >= hits)
    assert lru_hit_rate(tr, 10**6, per_seq) == pytest.approx(rep.mean())
