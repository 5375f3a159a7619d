"""The row cache: its policies against reference models, the engine's reads with it, bad input."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engram import (ArgumentError, CacheLayoutError, CachePolicyError, CacheSizeError, DecodeError, EngramError,
                    EngramModel, Hasher, ReadStats, RowCache, Table, TableGroup, TableIOError, decode_rows,
                    synth)
from engram.codec import ROW_BYTES
from engram.rowcache import CachePolicy, cache_key, cache_rows, parse_size, physical_memory
from tests.faults import usable
from tests.modelfiles import SCALE, token_map as _token_map
from tests.tablefiles import rows_raw, write_table


# ---------------------------------------------------------------- the policies
def _lru_reference(keys, capacity, batch):
    """Hits of an LRU cache fed ``keys`` in batches: lookups first, then the batch's misses inserted."""
    d: OrderedDict = OrderedDict()
    hits = []
    for a in range(0, len(keys), batch):
        b = keys[a:a + batch]
        got = []
        for k in b:
            if k in d:
                d.move_to_end(k)
                got.append(True)
            else:
                got.append(False)
        for k, h in zip(b, got):
            if not h and k not in d:
                d[k] = None
                if len(d) > capacity:
                    d.popitem(last=False)
        hits += got
    return np.array(hits, dtype=bool)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=400), st.integers(1, 40), st.integers(1, 50))
def test_lru_equals_ordered_dict_model(keys, capacity, batch):
    p = CachePolicy(capacity, "lru")
    hits = np.zeros(len(keys), np.uint8)
    n = p.access(np.array(keys, np.uint64), hits, batch)
    ref = _lru_reference(keys, capacity, batch)
    assert np.array_equal(hits.astype(bool), ref)
    assert n == ref.sum() and p.entries == min(capacity, len(set(keys)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 80), min_size=1, max_size=500), st.integers(1, 60), st.integers(1, 50),
       st.sampled_from(["lru", "tinylfu"]))
def test_policy_invariants(keys, capacity, batch, name):
    """Both policies: never more than the capacity; a hit is a key held; while distinct keys fit, every
    repeat from an earlier batch hits (no eviction before full); held keys are distinct."""
    p = CachePolicy(capacity, name)
    k = np.array(keys, np.uint64)
    hits = np.zeros(k.size, np.uint8)
    p.access(k, hits, batch)
    held = p.held_keys()
    assert p.entries == held.size <= capacity and np.unique(held).size == held.size
    assert set(held.tolist()) <= set(keys)
    if len(set(keys)) <= capacity:
        first = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i // batch)
        want = np.array([i // batch > first[key] for i, key in enumerate(keys)])
        assert np.array_equal(hits.astype(bool), want)


def test_lookup_insert_equal_access():
    """The engine's two calls a batch (lookup, then insert of the misses) are the simulator's access()."""
    rng = np.random.default_rng(1)
    keys = (rng.zipf(1.3, 20000) % 3000).astype(np.uint64)
    for name in ("lru", "tinylfu"):
        a, b = CachePolicy(500, name), CachePolicy(500, name)
        hits = np.zeros(keys.size, np.uint8)
        a.access(keys, hits, 48)
        got = []
        for i in range(0, keys.size, 48):
            kb = np.ascontiguousarray(keys[i:i + 48])
            slots = np.empty(kb.size, np.int64)
            b.lookup(kb, slots)
            got.append(slots >= 0)
            b.insert(np.ascontiguousarray(kb[slots < 0]), np.empty(int((slots < 0).sum()), np.int64))
        assert np.array_equal(np.concatenate(got), hits.astype(bool)), name
        assert np.array_equal(np.sort(a.held_keys()), np.sort(b.held_keys()))


def test_tinylfu_keeps_hot_rows_through_a_long_scan():
    """A long prompt of rows read once flushes LRU's hot rows; W-TinyLFU keeps them (its admission)."""
    cap = 1000
    hot = np.arange(200, dtype=np.uint64)
    warm = np.tile(hot, 20)                                  # 200 hot rows, each read 20 times
    scan = np.arange(10**6, 10**6 + 20 * cap, dtype=np.uint64)  # 20,000 rows read once
    stream = np.concatenate([warm, scan, hot])
    rates = {}
    for name in ("lru", "tinylfu"):
        p = CachePolicy(cap, name)
        hits = np.zeros(stream.size, np.uint8)
        p.access(stream, hits, 48)
        rates[name] = hits[-hot.size:].mean()
    assert rates["lru"] == 0.0
    assert rates["tinylfu"] >= 0.95


def test_tinylfu_sketch_ages():
    p = CachePolicy(10, "tinylfu")
    k = np.full(50, 7, np.uint64)
    p.access(k, np.zeros(50, np.uint8), 1)
    assert p.frequency(7) == 15 and p.resets == 0            # saturated 4-bit counters
    p.access(np.arange(100, 160, dtype=np.uint64), np.zeros(60, np.uint8), 1)  # 110 counts >= 10 x 10
    assert p.resets == 1 and p.frequency(7) == 7             # halved once


# ---------------------------------------------------------------- sizes and errors
def test_sizes():
    assert parse_size("64M") == 64 << 20 and parse_size("1G") == 1 << 30 and parse_size("1.5K") == 1536
    # binary: a bare letter and KiB..TiB; decimal: KB..TB; any case, spaces, fractions rounded down
    known = {"64MB": 64_000_000, "64M": 67_108_864, "64MiB": 67_108_864, "64mib": 67_108_864, "64m": 67_108_864,
             "64mb": 64_000_000, "1KB": 1000, "1kB": 1000, "1K": 1024, "1KiB": 1024, "2GB": 2 * 10**9,
             "2GiB": 2 << 30, "1TB": 10**12, "1T": 1 << 40, "1.5MB": 1_500_000, "0.5K": 512, "1.1K": 1126,
             ".5KB": 500, "3.": 3, "0.5": 0, "4096": 4096, "4096B": 4096, " 8 K ": 8192, "1.2345KB": 1234}
    assert {k: parse_size(k) for k in known} == known
    assert parse_size(np.int64(5)) == 5 and parse_size(0) == 0
    assert parse_size("1" * 64) == int("1" * 64)              # 64 characters: still read


@pytest.mark.parametrize("size, why", [("1e3", "exponent"), ("1E6M", "exponent"), ("-1M", "negative"),
                                       ("12Q", "unknown unit 'Q'"), ("1KiBB", "unknown unit"), ("M", "not a number"),
                                       ("", "not a number"), ("1,5M", "not a number"), ("+5M", "not a number"),
                                       (True, "got bool"), (1.5, "got float"), (1000.0, "got float"),
                                       (None, "got NoneType"), (-5, ">= 0"),
                                       ("9" * 5000, r"'9{24}'\.\.\. \(5000 characters\) is too long to be a size"),
                                       ("1" * 65 + "K", r"\(66 characters\) is too long")])
def test_bad_sizes_name_the_rule(size, why):
    with pytest.raises(CacheSizeError, match=why) as e:
        parse_size(size, "--cache-bytes")
    assert str(e.value).startswith("--cache-bytes") and "\n" not in str(e.value)
    if isinstance(size, str):
        assert "64MB = 64000000" in str(e.value)          # the rule is in the message


def test_size_options_read_sizes_as_written():
    """The command line's size options parse with parse_size; a bad size is the parser's error naming the flag."""
    from engram.cli import build_parser

    def parse(argv):
        return build_parser(argv).parse_args(argv)

    assert parse(["sim", "trace", "reuse", "x", "--cache-bytes", "64MB,64M, 1g"]).cache_bytes == \
        [64_000_000, 64 << 20, 1 << 30]
    assert parse(["sim", "decode", "--shared-cache-bytes", "1.5MB"]).shared_cache_bytes == 1_500_000
    assert parse(["measure", "m.gguf", "--cache-bytes", "4MiB"]).cache_bytes == 4 << 20
    for argv in (["sim", "trace", "reuse", "x", "--cache-bytes", "64M,1e3"], ["sim", "decode", "--shared-cache-bytes=-1M"], ["measure", "m.gguf", "--cache-bytes", "4Q"]):
        with pytest.raises(SystemExit) as e:
            parse(argv)
        assert e.value.code == 2
    assert parse_size(4096) == 4096 and cache_rows("1M") == (1 << 20) // 264
    assert RowCache(264).capacity == 1 and RowCache(264 * 10 + 263, "lru").capacity == 10


@pytest.mark.parametrize("size", [0, 263, "100", "12Q", -5, True, 1.5, "9" * 5000])
def test_bad_sizes(size):
    with pytest.raises(CacheSizeError) as e:
        RowCache(size)
    assert isinstance(e.value, EngramError) and isinstance(e.value, ArgumentError)


def test_size_beyond_memory():
    mem = physical_memory()
    assert mem > 0
    with pytest.raises(CacheSizeError, match="exceeds this machine's memory"):
        RowCache(mem)


def test_bad_policy():
    with pytest.raises(CachePolicyError, match="'fifo'.*lru, tinylfu"):
        RowCache("1M", "fifo")
    with pytest.raises(CachePolicyError, match="prefill rule 'always'"):
        RowCache("1M", prefill="always")


@pytest.mark.parametrize("policy, prefill, what", [
    (np.array("lru"), "admit", r"row cache policy must be a string, one of lru, tinylfu; got an array <U3 \(\)"),
    (np.array(["lru"]), "admit", r"policy must be a string.*got an array <U3 \(1,\)"),
    ("lru", np.array(["admit", "bypass"]), r"prefill rule must be a string, one of admit, bypass; got an array"),
    ("lru", np.array("admit"), r"prefill rule must be a string.*got an array"),
    (["lru"], "admit", r"policy must be a string.*got list \['lru'\]"),
    (b"lru", "admit", r"policy must be a string.*got bytes"),
    (None, "admit", r"policy must be a string.*got NoneType"),
])
def test_policy_names_that_are_not_strings(policy, prefill, what):
    """A NumPy array of a name passed the name check (it compares equal) and then failed in the native policy with
    TypeError, or raised NumPy's ambiguous truth ValueError; refused as CachePolicyError.  A NumPy string is its
    str."""
    with pytest.raises(CachePolicyError, match=what):
        RowCache("1M", policy, prefill=prefill)
    c = RowCache("1M", np.str_("lru"), prefill=np.str_("bypass"))
    assert (c.policy, c.prefill) == ("lru", "bypass") and type(c.policy) is str and type(c.prefill) is str
    assert c._policy.name == "lru"


# ---------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=3), progress=False)
    return path


@pytest.fixture(scope="module")
def text_ids(tokenizer, shared_data):
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[20000:26000]
    return np.array(tokenizer.encode(text, add_special_tokens=False).ids[:800])


def _expected(model, row_ids):
    return {lid: decode_rows(synth.rows_at(lid, row_ids[:, li, :].reshape(-1), seed=3)).reshape(-1, 24, 256)
            for li, lid in enumerate(model.layer_ids)}


def test_table_reads_only_misses(model_path):
    """A batch's reads are its misses only, sorted by offset and deduplicated; hits are counted."""
    cache = RowCache(264 * 100, "lru")
    info = EngramModel.open(model_path).info
    loc = info.tables[1]
    with Table(loc.path, loc.offset, loc.rows, backend="serial", direct=False) as t:
        t.attach_cache(cache, 1)
        first = t.read_rows([500, 90000, 7])
        assert t.last_stats.cache_hits == 0 and t.last_stats.rows_distinct == 3
        got = t.read_rows([90000, 123456, 500, 40000, 123456, 7])
        s = t.last_stats
        assert (s.cache_hits, s.rows_requested, s.rows_distinct) == (3, 6, 2)
        spans = t._reader.last_spans()
        assert [o for _, o, _ in spans] == sorted(loc.offset + r * ROW_BYTES for r in (123456, 40000))
        assert all(n == ROW_BYTES for _, _, n in spans) and s.bytes_read == 2 * ROW_BYTES
        want = decode_rows(synth.rows_at(1, np.array([90000, 123456, 500, 40000, 123456, 7]), seed=3))
        assert np.array_equal(got, want) and np.array_equal(first, want[[2, 0, 5]])
        again = t.read_rows([7, 40000])
        assert t.last_stats.backend == "cache" and t.last_stats.reads == 0
        assert np.array_equal(again, want[[5, 3]])
        held, rows = cache.get(1, [7, 8, 123456])
        assert held.tolist() == [True, False, True] and np.array_equal(rows, want[[5, 1]])


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_session_rows_identical_with_cache(model_path, text_ids, policy):
    model = EngramModel.open(model_path, readers=8, cache=RowCache(264 * 20000, policy))
    ids = np.concatenate([text_ids[:300], text_ids[:300]])     # the second pass repeats every row
    ref_ids = Hasher(model.layout, model.token_map).hash(ids)
    ref = _expected(model, ref_ids)
    hits = 0
    with model.session() as s:
        for t, tok in enumerate(ids):
            rows = s.step(int(tok))
            for lid in model.layer_ids:
                assert np.array_equal(rows[lid], ref[lid][t]), (t, lid)
            hits += s.last_stats.cache_hits
            assert s.last_stats.rows_requested == 48
    st_ = model.cache.stats()
    assert st_["hits"] == hits > 300 * 48 // 2 and st_["lookups"] == 600 * 48


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 40), min_size=1, max_size=120), st.integers(1, 200),
       st.sampled_from(["lru", "tinylfu"]))
def test_hits_never_change_rows(model_path, tokens, rows, policy):
    """Random token streams over a small vocabulary (many repeats): rows with the cache equal rows without."""
    model = EngramModel.open(model_path, readers=4, backend="serial")
    cached = model.session(cache=RowCache(264 * rows, policy))
    plain = model.session(cache=None)
    try:
        for tok in tokens:
            a, b = cached.step(tok + 100), plain.step(tok + 100)
            for lid in model.layer_ids:
                assert np.array_equal(a[lid], b[lid])
            assert plain.last_stats.cache_hits == 0
    finally:
        cached.close()
        plain.close()


def test_sessions_in_threads_share_one_cache(model_path, text_ids):
    """Four sessions of one text in threads: three trail the first by a step, so every row they ask for
    was inserted by it: their steps are all hits, and every row equals the uncached engine's."""
    cache = RowCache(264 * 20000, "tinylfu")  # holds the text's 9,600 row reads
    model = EngramModel.open(model_path, readers=4, cache=cache)
    ids = text_ids[:200]
    ref = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
    errors, hits = [], {}
    done = [0]
    cond = threading.Condition()

    def run(i):
        try:
            with model.session() as s:
                n = 0
                for t, tok in enumerate(ids):
                    if i:
                        with cond:
                            cond.wait_for(lambda: done[0] > t, timeout=60)
                    rows = s.step(int(tok))
                    for lid in model.layer_ids:
                        if not np.array_equal(rows[lid], ref[lid][t]):
                            errors.append((i, t, lid))
                    n += s.last_stats.cache_hits
                    if not i:
                        with cond:
                            done[0] = t + 1
                            cond.notify_all()
                hits[i] = n
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert [hits[i] for i in (1, 2, 3)] == [200 * 48] * 3
    assert cache.stats()["hits"] == sum(hits.values()) and hits[0] < 200 * 48 // 4


@pytest.mark.parametrize("prefill", ["admit", "bypass"])
def test_prefill_admit_or_bypass(model_path, text_ids, prefill):
    cache = RowCache("2M", "lru", prefill=prefill)
    model = EngramModel.open(model_path, readers=4, cache=cache)
    ids = text_ids[:256]
    with model.session() as a:
        p = a.prefill(ids, chunk_tokens=64)
        ref = _expected(model, Hasher(model.layout, model.token_map).hash(ids))
        for lid in model.layer_ids:
            assert np.array_equal(p.rows(lid, 0, len(ids), timeout=60), ref[lid])
    if prefill == "bypass":
        assert cache.entries == 0 and cache.stats()["lookups"] == 0
    else:
        assert cache.entries > 0 and cache.stats()["lookups"] == 256 * 48
    with model.session() as b:  # a decode of the same text then hits what the prompt admitted
        for tok in ids[:50]:
            b.step(int(tok))
        assert (b.last_stats.cache_hits > 0) == (prefill == "admit")


def test_long_prompt_keeps_hot_rows_with_tinylfu(model_path, text_ids, tokenizer, shared_data):
    """Decode the same 40 tokens many times, prefill a long prompt (admitted), decode them again."""
    long_text = (shared_data / "agent_prompt_long.txt").read_text(encoding="utf-8")[:40000]
    prompt = np.array(tokenizer.encode(long_text, add_special_tokens=False).ids[:3000])
    hot = text_ids[:40]
    after = {}
    for policy in ("lru", "tinylfu"):
        model = EngramModel.open(model_path, readers=8, cache=RowCache(264 * 4000, policy, prefill="admit"))
        for _ in range(8):
            with model.session() as s:
                for tok in hot:
                    s.step(int(tok))
        with model.session() as s:
            s.prefill(prompt, chunk_tokens=512).wait(model.layer_ids[-1], len(prompt), timeout=120)
        with model.session() as s:
            n = 0
            for tok in hot:
                s.step(int(tok))
                n += s.last_stats.cache_hits
        after[policy] = n / (len(hot) * 48)
    assert after["lru"] < 0.05 and after["tinylfu"] > 0.9, after


def test_cache_between_models(model_path, tmp_path):
    cache = RowCache("1M")
    EngramModel.open(model_path, cache=cache)
    EngramModel.open(model_path, cache=cache)  # the same file again: the same rows
    other = tmp_path / "other.gguf"
    synth.build_model(other, synth.ModelShape(scale=SCALE * 2, token_map=_token_map(), seed=3), progress=False)
    with pytest.raises(CacheLayoutError, match="another layout"):
        EngramModel.open(other, cache=cache)
    twin = tmp_path / "twin.gguf"
    synth.build_model(twin, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=4), progress=False)
    m = EngramModel.open(twin)
    with pytest.raises(CacheLayoutError, match="other tables"):
        m.session(cache=cache)
    with pytest.raises(ArgumentError, match="RowCache or None"):
        EngramModel.open(model_path, cache="1M")


def test_cache_key():
    assert cache_key(14, 5).item() == (14 << 32) | 5
    assert cache_key([1, 14], [[3], [4]]).shape == (2, 2)
    assert cache_key(2 ** 32 - 1, 2 ** 32 - 1).item() == 2 ** 64 - 1
    assert cache_key(1, np.array([], np.int64)).shape == (0,)


@pytest.mark.parametrize("layer, row, what", [
    (0, 2 ** 32 + 1, r"row id 4294967297 is outside \[0, 2\*\*32\)"),      # was cache_key(1, 1)
    (-1, 3, r"layer id -1 is outside"),                                        # was OverflowError
    (2 ** 32, 3, r"layer id 4294967296 is outside"),
    (1, [5, -2], r"row id -2 at index \(1,\) is outside"),
    (1, [1, 2 ** 70], r"row id 1180591620717411303424 at index \(1,\) is outside"),
    (1.0, 3, r"layer ids must be integers .* got float64"),
    (1, [1.5], r"row ids must be integers .* got float64 \(e\.g\. 1\.5\)"),   # was row 1
    (True, 3, r"layer ids must be integers .* got bool"),
    ("a", 3, r"layer ids must be integers .* got <U1"),
    (1, None, r"row ids must be integers .* got object"),
    ([1, 2], [1, 2, 3], r"do not broadcast"),
])
def test_cache_key_refuses_ids_beyond_uint32_or_not_integers(layer, row, what):
    """A key is (layer << 32) | row: a row id of 2**32 or more ran into the layer's bits (cache_key(0, 2**32 + 1)
    was cache_key(1, 1)), negative ids raised OverflowError and floats were truncated."""
    with pytest.raises(ArgumentError, match=what):
        cache_key(layer, row)


@pytest.mark.parametrize("keys, records, what", [
    (np.array([7, 8], np.uint64), np.zeros((2, 100), np.uint8), "records must be a uint8 array \\[2, 264\\]"),
    (np.array([7, 8], np.uint64), np.zeros((2, 264), np.float32), "records must be a uint8 array"),
    (np.array([7, 8], np.uint64), np.zeros((3, 264), np.uint8), "records must be a uint8 array \\[2, 264\\]"),
    (np.array([7, 8], np.int64), np.zeros((2, 264), np.uint8), "keys must be a C-contiguous uint64"),
    ([7, 8], np.zeros((2, 264), np.uint8), "keys must be a C-contiguous uint64"),
])
def test_bad_inserts_are_refused_before_anything_is_inserted(keys, records, what):
    """A refused insert leaves the cache as it was: the keys stay misses, and a good insert then takes."""
    c = RowCache(1 << 20, policy="lru")
    with pytest.raises(ArgumentError, match=what):
        c.insert(keys, records)
    good = np.array([7, 8], np.uint64)
    hit, _ = c.lookup(good)
    assert not hit.any() and c.entries == 0
    rec = np.arange(2 * 264, dtype=np.uint8).reshape(2, 264)
    assert c.insert(good, rec) == 2
    hit, got = c.lookup(good)
    assert hit.all() and np.array_equal(got, rec)


def test_lookup_refuses_keys_that_are_not_uint64():
    with pytest.raises(ArgumentError, match="keys must be a C-contiguous uint64"):
        RowCache(1 << 20).lookup(np.zeros((2, 2), np.uint64))


# ---------------------------------------------------------------- the lean hit path keeps every check
def test_fully_hit_reads_keep_the_checks(model_path):
    """A batch the cache serves whole skips the readers, but not a check: ids beyond this table (held for
    another table of the same layer id), bad ids and bad ``out`` raise as without a cache, ``out`` untouched."""
    from engram import RowRangeError, TableIOError

    info = EngramModel.open(model_path).info
    loc = info.tables[1]
    cache = RowCache(264 * 100, "lru")
    with Table(loc.path, loc.offset, loc.rows, backend="serial", direct=False) as big, \
            Table(loc.path, loc.offset, 1000, backend="serial", direct=False) as small:
        big.attach_cache(cache, 1)
        small.attach_cache(cache, 1)          # the same layer id, fewer rows: a misuse the range check catches
        want = big.read_rows([5, 5000])
        out = np.full((2, 256), 7.0, np.float32)
        with pytest.raises(RowRangeError, match="row id 5000 at position 1 is outside the table"):
            small.read_rows([5, 5000], out=out)
        assert (out == 7.0).all()
        assert np.array_equal(small.read_rows([5]), want[:1]) and small.last_stats.backend == "cache"
        assert np.array_equal(big.read_rows([5000, 5], out=out), want[::-1]) and big.last_stats.cache_hits == 2
        for bad, err in (([-1], RowRangeError), ([2 ** 32], RowRangeError), ([True], ArgumentError),
                         ([5.0], ArgumentError), ([[5]], ArgumentError), (np.array([5], np.int8)[:0], None)):
            if err is None:
                assert big.read_rows(bad).shape == (0, 256)
                continue
            with pytest.raises(err):
                big.read_rows(bad)
        with pytest.raises(ArgumentError, match="out must be"):
            big.read_rows([5], out=np.zeros((1, 256), np.float64))
        assert np.array_equal(big.read_rows(np.array([5], np.int64)), want[:1])
        assert np.array_equal(big.read_rows([np.uint32(5)]), want[:1])   # a NumPy scalar: the general path
    with pytest.raises(TableIOError, match="closed"):
        big.read_rows([5])


def test_serve_and_admit_check_their_arrays():
    """The native batch calls take NumPy arrays and check dtype, shape, layout and writability."""
    c = RowCache(264 * 10, "tinylfu")
    ids = np.array([[3, 4]], np.uint32)
    col = np.zeros(2, np.uint64)
    keys, skip, out = np.empty(2, np.uint64), np.empty(2, np.uint8), np.empty((2, 256), np.float32)
    assert c.serve(ids, col, keys, out, skip) == 0 and keys.tolist() == [3, 4] and skip.tolist() == [0, 0]
    raw = synth.rows_at(1, np.array([3, 4]), seed=3)
    assert c.admit(keys, skip, raw) == 2
    assert c.serve(ids, col, keys, out, skip) == 2 and np.array_equal(out, decode_rows(raw))
    # strided ids (a column of a wider batch) are read in place
    wide = np.array([[9, 3, 9, 4]], np.uint32)[:, 1::2]
    assert c.serve(wide, col, keys, out, skip) == 2
    # a batch with an id at or beyond its column's table is served nothing: no key looked up or counted, out
    # untouched, every skip 0 (the reader raises its range error)
    before = (c.stats()["hits"], c.stats()["lookups"])
    out[:] = 7.0
    assert c.serve(ids, col, keys, out, skip, np.array([10, 4], np.uint32)) == 0 and skip.tolist() == [0, 0]
    assert (c.stats()["hits"], c.stats()["lookups"]) == before and (out == 7.0).all()
    assert c.serve(ids, col, keys, out, skip, np.array([10, 5], np.uint32)) == 2 and skip.tolist() == [1, 1]
    bad = [(ids.astype(np.int64), col, keys, out, skip), (ids, col[:1], keys, out, skip),
           (ids, col, keys[:1], out, skip), (ids, col, keys, out.astype(np.float64), skip),
           (ids, col, keys, out[:, :128], skip), (ids, col, keys, out, skip.astype(bool)),
           (ids, col, keys, out, skip, np.array([10], np.uint32)), (ids.tolist(), col, keys, out, skip)]
    ro = out.copy()
    ro.setflags(write=False)
    bad.append((ids, col, keys, ro, skip))
    for args in bad:
        with pytest.raises(ArgumentError, match="RowCache.serve"):
            c.serve(*args)
    for args in ((keys, skip[:1], raw), (keys, skip, raw[:1]), (keys, skip, raw[:, :200]),
                 (keys.astype(np.int64), skip, raw), (keys, skip, raw.astype(np.int8))):
        with pytest.raises(ArgumentError, match="RowCache.admit"):
            c.admit(*args)
    # a batch's lookups are its T * C positions, however long keys is
    looked = c.stats()["lookups"]
    c.serve(ids, col, np.empty(1000, np.uint64), out, skip)
    assert c.stats()["lookups"] == looked + 2


def test_serve_refuses_outputs_that_overlap():
    """keys, skip or out sharing bytes with each other or with ids, col_layer, col_rows or the records: a key
    written over a row decoded later sent the decode of a hit outside the records (a crash, or 264 bytes before
    them served as a row); refused before anything is written, the cache's counts unchanged."""
    c = RowCache(264 * 1000, "tinylfu")
    T = 8
    ids = np.arange(T, dtype=np.uint32).reshape(T, 1)
    col = np.zeros(1, np.uint64)
    keys, skip = np.empty(T, np.uint64), np.empty(T, np.uint8)
    out = np.zeros((T, 256), np.float32)
    raw = synth.rows_at(1, np.arange(T), seed=5)
    c.serve(ids, col, keys, out, skip)
    c.admit(keys, skip, raw)
    assert c.serve(ids, col, keys, out, skip) == T and np.array_equal(out, decode_rows(raw))
    before = c.stats()
    buf = np.zeros((T, 256), np.float32)
    shared = np.zeros(2 * T, np.uint64)          # keys and the ids that are their own bytes
    lay = np.zeros(T + 1, np.uint64)             # col_layer and keys in one buffer
    records = c._records.view(np.float32).reshape(-1)[: T * 256].reshape(T, 256)
    cases = [  # (ids, col_layer, keys, out, skip)
        (ids, col, buf[1].view(np.uint64)[:T], buf, skip),             # keys inside out
        (ids, col, keys, buf, buf[0].view(np.uint8)[:T]),              # skip inside out
        (ids, col, keys, buf, keys.view(np.uint8)[:T]),                # skip inside keys
        (shared[T:].view(np.uint32)[:T].reshape(T, 1), col, shared[T - 1:], buf, skip),  # keys over ids
        (ids, lay[:1], lay[1:], buf, skip),                            # keys right after col_layer: apart
        (ids, lay[:1], lay[:T], buf, skip),                            # keys over col_layer
        (ids, col, keys, records, skip),                               # out over the cache's records
    ]
    for k, args in enumerate(cases):
        snapshot, rec_before = buf.copy(), c._records.copy()
        if k == 4:
            assert c.serve(*args) == T and np.array_equal(buf, decode_rows(raw))
            buf[:] = 0
            continue
        with pytest.raises(ArgumentError, match="must not overlap"):
            c.serve(*args)
        assert np.array_equal(buf, snapshot) and np.array_equal(c._records, rec_before), k
    after = c.stats()
    assert (after["hits"], after["lookups"]) == (before["hits"] + T, before["lookups"] + T)  # case 4 only


# ---------------------------------------------------------------- the reader inserts the misses itself
@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
@pytest.mark.parametrize("backend", usable(("serial", "pread", "io_uring")))
def test_reader_inserts_misses_as_the_policy_twin(model_path, policy, backend):
    """The reader inserts a batch's misses from its staged reads (native calls): the cache then holds exactly
    the keys of a policy fed the same batches (lookup, then the misses inserted in position order: the twin),
    every held record is the file's record of its row, and the rows returned are the uncached ones.  Batches
    with duplicates, hits and one of two chunks (more than ``CHUNK_REQUESTS`` ids).  Serially the misses are
    inserted after the read; on the pool and the ring their slots are reserved while the reads fly and filled
    after: the same decisions, nothing left reserved."""
    from engram._native.reader import CHUNK_REQUESTS

    info = EngramModel.open(model_path).info
    loc = info.tables[1]
    rng = np.random.default_rng(7)
    cap = 3000
    cache, twin = RowCache(264 * cap, policy), CachePolicy(cap, policy)
    inserted = 0
    batches = [rng.integers(0, 5000, n) for n in (48, 48, 300, 7, 48)]
    batches += [rng.integers(0, loc.rows, CHUNK_REQUESTS + 100), rng.integers(0, 5000, 48)]
    with Table(loc.path, loc.offset, loc.rows, backend=backend, readers=4, threshold=1, direct=False) as t:
        t.attach_cache(cache, 1)
        for b in batches:
            keys = cache_key(1, b)
            slots = np.empty(keys.size, np.int64)
            twin.lookup(keys, slots)
            miss = np.ascontiguousarray(keys[slots < 0])
            inserted += twin.insert(miss, np.empty(miss.size, np.int64))
            out = np.full((b.size + 1, 256), 7.0, np.float32)   # a sentinel row past the batch's rows
            t.read_rows(b, out=out[:-1])
            assert (out[-1] == 7.0).all()
            assert np.array_equal(out[:-1], decode_rows(synth.rows_at(1, b, seed=3)))
            assert t.last_stats.cache_hits == int((slots >= 0).sum())
            held = twin.held_keys()
            assert np.array_equal(np.sort(cache._policy.held_keys()), np.sort(held))
            assert cache._policy.pending == 0
            assert t.last_stats.backend.split("+")[0] in ((backend,) if t.last_stats.cache_hits < b.size else ("cache",))
    rows = (held & np.uint64(0xFFFFFFFF)).astype(np.int64)
    ok, got = cache.get(1, rows)
    assert ok.all() and np.array_equal(got, decode_rows(synth.rows_at(1, rows, seed=3)))
    assert cache.stats()["inserts"] == inserted > cap      # every distinct miss written once; evictions happened


def test_reader_refuses_a_cache_without_keys(model_path):
    """The reader's cache arguments are checked (decoded reads only, keys of the batch)."""
    from engram._native.reader import BACKEND_SERIAL

    info = EngramModel.open(model_path).info
    loc = info.tables[1]
    cache = RowCache(264 * 10, "lru")
    with Table(loc.path, loc.offset, loc.rows, backend="serial", direct=False) as t:
        ids = np.array([[3, 4]], np.uint32)
        out = np.empty((1, 2, 256), np.float32)
        for kw in ({"keys": None}, {"keys": np.zeros(1, np.uint64)}, {"keys": np.zeros(2, np.int64)}):
            with pytest.raises(ValueError, match="keys must be"):
                t._reader.read(ids, out, 0, BACKEND_SERIAL, 2, None, None, True, cache, **kw)
        with pytest.raises(ValueError, match="decoded reads"):
            t._reader.read(ids, np.empty((1, 2, 264), np.uint8), 0, BACKEND_SERIAL, 2, None, None, False, cache,
                           np.zeros(2, np.uint64))
        assert cache.entries == 0


def _nan_table(tmp_path, rows=500):
    """A table of ``rows`` rows whose row 321 decodes to a NaN (an E4M3 NaN code in column 40)."""
    raw = rows_raw(rows, seed=3)
    raw[321, 40] = 0x7F
    path = tmp_path / "nan.bin"
    write_table(path, raw, 4096)
    return path, raw


@pytest.mark.parametrize("backend", usable(("serial", "pread", "io_uring")))
def test_a_failed_read_leaves_nothing_reserved(tmp_path, backend):
    """A batch whose read fails (a row that decodes to NaN) inserts none of its misses: on the pool and the ring
    the slots reserved while the reads flew are given back (their keys forgotten, free for the next insert), the
    held rows and their records stay, ``out`` is untouched; the next batch's misses then go in."""
    path, raw = _nan_table(tmp_path)
    cache = RowCache(264 * 8, "lru")
    with Table(path, 4096, 500, backend=backend, readers=4, threshold=1, direct=False) as t:
        t.attach_cache(cache, 0)
        t.read_rows([1, 2, 3])
        entries, inserts = cache.entries, cache.stats()["inserts"]
        out = np.full((4, 256), 5.0, np.float32)
        with pytest.raises(DecodeError, match="row 321"):
            t.read_rows([5, 321, 2, 6], out=out)
        assert np.all(out == 5.0)
        assert cache._policy.pending == 0 and cache.entries == entries == 3
        assert cache.stats()["inserts"] == inserts
        assert [cache._policy.contains(int(k)) for k in cache_key(0, [5, 321, 6, 1, 2, 3])] == [False] * 3 + [True] * 3
        got = t.read_rows(list(range(7, 15)))   # fills the 8 slots: the given-back ones and the rest
        assert np.array_equal(got, decode_rows(raw[7:15])) and cache.entries == 8
        held, rec = cache.get(0, list(range(7, 15)))
        assert held.all() and np.array_equal(rec, decode_rows(raw[7:15]))
        assert not cache.get(0, [1, 2, 3])[0].any()          # LRU: the rows held before went out


@pytest.mark.parametrize("backend", usable(("serial", "pread", "io_uring")))
def test_one_row_into_out_hit_or_failed_read(tmp_path, backend):
    """One row read into the caller's ``out`` is not staged (it is a hit or a read, never both): a hit is
    written, a failing miss leaves ``out`` and the row past it untouched and inserts nothing."""
    path, raw = _nan_table(tmp_path)
    cache = RowCache(264 * 8, "lru")
    with Table(path, 4096, 500, backend=backend, readers=4, threshold=1, direct=False) as t:
        t.attach_cache(cache, 0)
        t.read_rows([9])
        buf = np.full((2, 256), 5.0, np.float32)         # row 1: a sentinel past the output
        assert t.read_rows([9], out=buf[:1]) is not None and t.last_stats.cache_hits == 1
        assert np.array_equal(buf[0], decode_rows(raw[9:10])[0]) and np.all(buf[1] == 5.0)
        buf[0] = 5.0
        with pytest.raises(DecodeError, match="row 321"):
            t.read_rows([321], out=buf[:1])
        assert np.all(buf == 5.0) and cache.entries == 1 and cache._policy.pending == 0


def test_stats_of_hits_built_when_asked(tmp_path):
    """Reads the cache serves whole build their ``last_stats`` when asked and add to ``stats`` in place (a
    reference held to it sees them): both equal a read's (rows, calls, hits, backends in the order first seen);
    setting ``stats`` starts the count again."""
    path, raw = _nan_table(tmp_path)
    with Table(path, 4096, 500, backend="serial", direct=False) as t:
        t.attach_cache(RowCache(264 * 8, "lru"), 0)
        t.read_rows([1, 2])
        first, held = t.last_stats, t.stats
        for _ in range(3):
            t.read_rows([2, 1])
        s = t.last_stats
        assert (s.rows_requested, s.cache_hits, s.calls, s.reads, s.backend) == (2, 2, 1, 0, "cache")
        assert t.last_stats is s and first.backend == "serial" and first.cache_hits == 0
        assert (held.calls, held.cache_hits, held.backend) == (4, 6, "serial,cache")
        t.read_rows([3])
        assert t.last_stats.backend == "serial" and t.last_stats.cache_hits == 0
        tot = t.stats
        assert tot is held
        assert (tot.rows_requested, tot.cache_hits, tot.calls, tot.reads) == (9, 6, 5, 2)
        assert tot.backend == "serial,cache" and tot.wall_s > 0
        t.read_rows([3])
        t.stats = ReadStats()
        assert t.stats.calls == 0 and t.stats.cache_hits == 0
        t.read_rows([1])
        assert (t.stats.calls, t.stats.cache_hits) == (1, 1) and t.last_stats.backend == "cache"


def _group(model_path, cache, backend):
    model = EngramModel.open(model_path)
    info = model.info
    tables = [Table(info.tables[lid].path, info.tables[lid].offset, info.tables[lid].rows, backend=backend,
                    readers=4, threshold=1, direct=False) for lid in model.layer_ids]
    g = TableGroup(tables, 24)
    g.attach_cache(cache, model.layer_ids)
    return model, tables, g


@pytest.mark.parametrize("backend", usable(("pread", "io_uring")))
def test_a_begun_read_reserves_its_misses_until_finish(model_path, backend):
    """``begin_layers`` reserves its misses' slots while the reads fly: until ``finish`` they are held (another
    session's batch does not insert them again) but not served (a lookup misses them, nothing half-written is
    decoded); ``finish`` writes their records, which then serve the rows the file holds."""
    cache = RowCache(264 * 1000, "tinylfu")
    model, tables, g = _group(model_path, cache, backend)
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 50000, (2, 1, 24))
    want = _expected(model, ids.transpose(1, 0, 2))
    try:
        out = np.empty((2, 1, 24, 256), np.float32)
        g.begin_layers(ids, out)
        keys = np.concatenate([cache_key(lid, ids[i, 0]) for i, lid in enumerate(model.layer_ids)])
        n = np.unique(keys).size
        assert cache._policy.pending == n and cache.entries == n
        assert all(cache._policy.contains(int(k)) for k in keys)
        hit, rec = cache.lookup(keys)                     # reserved: held, not served
        assert not hit.any() and rec.shape == (0, 264)
        g.finish()
        assert cache._policy.pending == 0
        for i, lid in enumerate(model.layer_ids):
            assert np.array_equal(out[i, 0], want[lid][0])
            held, rows = cache.get(lid, ids[i, 0])
            assert held.all() and np.array_equal(rows, want[lid][0])
    finally:
        g.close()
        for t in tables:
            t.close()


@pytest.mark.parametrize("backend", usable(("pread", "io_uring")))
def test_reserved_slots_survive_eviction_clear_and_close(model_path, backend):
    """What may come between a begun read's reservation and its fill: its slots evicted by another session's
    inserts (the fill skips them; every record held is still its row's), the cache cleared (the fill writes
    nothing into the new policy), the group closed before ``finish`` (the slots given back)."""
    model = EngramModel.open(model_path)
    lid = model.layer_ids[0]
    loc = model.info.tables[lid]
    rng = np.random.default_rng(12)
    ids = rng.integers(0, 50000, (2, 1, 24))
    for case in ("evicted", "cleared", "closed"):
        cache = RowCache(264 * 30, "lru")
        _, tables, g = _group(model_path, cache, backend)
        try:
            out = np.empty((2, 1, 24, 256), np.float32)
            g.begin_layers(ids, out)
            assert cache._policy.pending > 0
            if case == "evicted":
                with Table(loc.path, loc.offset, loc.rows, backend="serial", direct=False) as other:
                    other.attach_cache(cache, lid)
                    other.read_rows(np.arange(60000, 60030))   # 30 inserts: every reserved slot taken
                assert cache._policy.pending == 0
                g.finish()
                rows = (cache._policy.held_keys() & np.uint64(0xFFFFFFFF)).astype(np.int64)
                held, rec = cache.get(lid, rows)
                assert held.all() and np.array_equal(rec, decode_rows(synth.rows_at(lid, rows, seed=3)))
                assert sorted(rows.tolist()) == list(range(60000, 60030))
            elif case == "cleared":
                cache.clear()
                g.finish()
                assert cache.entries == 0 and cache._policy.pending == 0
            else:
                pol = cache._policy
                g.close()
                assert pol.pending == 0 and cache.entries == 0
        finally:
            g.close()
            for t in tables:
                t.close()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork()")
def test_a_child_after_fork_drops_its_parents_reservations(model_path):
    """A child forked while its parent's read is in flight gets a copy of the cache whose reserved slots
    nobody will fill: they are given back in the child (held nowhere, inserted again on its own reads)."""
    import os

    backend = (usable(("io_uring", "pread")) or ("serial",))[0]
    cache = RowCache(264 * 1000, "lru")
    model, tables, g = _group(model_path, cache, backend)
    ids = np.arange(100, 148).reshape(2, 1, 24)
    try:
        out = np.empty((2, 1, 24, 256), np.float32)
        g.begin_layers(ids, out)
        assert cache._policy.pending == 48
        pid = os.fork()
        if pid == 0:  # the child: exit code 0 when the reservations are gone
            ok = cache._policy.pending == 0 and cache.entries == 0
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        g.finish()
        assert cache._policy.pending == 0 and cache.entries == 48
    finally:
        g.close()
        for t in tables:
            t.close()


@pytest.mark.parametrize("backend", usable(("pread", "io_uring")))
def test_tables_closed_during_a_group_read_keep_their_descriptors(model_path, tmp_path, backend):
    """Tables closed while a group reads through them keep their descriptors until the read ends: files
    opened meanwhile (which would take the freed numbers) are not read, the rows published and cached are
    the tables' own, the descriptors close after ``finish`` and the group's next read names the closed table."""
    cache = RowCache(264 * 4096, "lru")
    model, tables, g = _group(model_path, cache, backend)
    decoy = tmp_path / "zeros.bin"
    decoy.write_bytes(bytes(64 << 20))
    ids = np.random.default_rng(5).integers(0, 50000, (2, 1, 24))
    want = _expected(model, ids.transpose(1, 0, 2))
    out = np.empty((2, 1, 24, 256), np.float32)
    fds = [t._fd for t in tables]
    try:
        g.begin_layers(ids, out)
        for t in tables:
            t.close()
        opened = [os.open(decoy, os.O_RDONLY) for _ in range(4)]
        try:
            assert not set(fds) & set(opened)            # the numbers are still the tables'
            g.finish()
        finally:
            for fd in opened:
                os.close(fd)
        assert all(t._fd == -1 for t in tables)
        for i, lid in enumerate(model.layer_ids):
            assert np.array_equal(out[i, 0], want[lid][0])
            held, rows = cache.get(lid, ids[i, 0])
            assert held.all() and np.array_equal(rows, want[lid][0])
        with pytest.raises(TableIOError, match=r"\(table 0\): closed"):
            g.read_layers(ids)
    finally:
        g.close()
        for t in tables:
            t.close()


def test_one_layer_id_names_one_table(tmp_path, model_path):
    """A key is (layer id, row): a cache attached to two different tables under one layer id served the first
    table's rows to the second.  Refused (CacheLayoutError naming the layer and both files) on a table, on a
    group giving one id to two tables, and against the tables a model bound; the same file and offset again
    (another descriptor, or a table of its first rows) is fine, and a refused attach changes nothing."""
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    write_table(a, rows_raw(100, seed=1), 4096)
    write_table(b, rows_raw(300, seed=2), 4096)
    cache = RowCache("1M")
    with Table(a, 4096, 100, backend="serial") as ta, Table(b, 4096, 300, backend="serial") as tb, \
            Table(a, 4096, 50, backend="serial") as prefix, Table(a, 4096, 100, backend="pread") as again:
        ta.attach_cache(cache, 0)
        want_a = ta.read_rows([5, 6, 99])
        with pytest.raises(CacheLayoutError, match=rf"layer 0 from {a} .* the table {b} "):
            tb.attach_cache(cache, 0)
        assert tb.cache is None and tb.read_rows([5]).tolist() != want_a[:1].tolist()
        tb.attach_cache(cache, 1)                     # another layer id: its own keys
        assert not np.array_equal(tb.read_rows([5, 6, 99]), want_a)
        for t in (prefix, again):
            t.attach_cache(cache, 0)
        assert np.array_equal(again.read_rows([5, 6, 99]), want_a) and again.last_stats.cache_hits == 3
        with pytest.raises(CacheLayoutError, match="layer 7"):
            TableGroup([ta, tb]).attach_cache(RowCache("1M"), [7, 7])
        for bad in ([(0, a, 4096)], [("x", a, 4096, 100)], [(0, None, 4096, 100)], 5):
            with pytest.raises(ArgumentError, match=r"tables must be \(layer id, path, offset, rows\) each"):
                cache.bind_tables(bad)
    info = EngramModel.open(model_path).info
    bound = RowCache("1M")
    m = EngramModel.open(model_path, cache=bound)
    with m.session():
        one = info.tables[m.layer_ids[1]]
        with Table(one.path, one.offset, one.rows, backend="serial") as t:
            with pytest.raises(CacheLayoutError, match=rf"layer {m.layer_ids[0]} from"):
                t.attach_cache(bound, m.layer_ids[0])  # layer 1's rows under layer 0's keys
            t.attach_cache(bound, m.layer_ids[1])


def test_a_file_replaced_at_its_path_is_another_table(tmp_path):
    """A cache knows a file by device, inode, size and modification time, not by its path: a table file
    deleted and written again at the same path (whose inode number the file system may reuse), or rewritten
    in place, served the old file's rows from the cache.  Both are refused while the cache serves the old
    file, naming the file; a table still open on the old file (its descriptor reads the old rows) keeps its
    place, and a new RowCache serves the new file."""
    import time

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    write_table(a, rows_raw(100, seed=1), 4096)
    cache = RowCache("1M", "lru")
    with Table(a, 4096, 100, backend="serial") as old:
        old.attach_cache(cache, 0)
        want_old = old.read_rows([5, 6, 99])
        os.remove(a)                             # deleted and written again at the same path
        write_table(a, rows_raw(100, seed=3), 4096)
        with Table(a, 4096, 100, backend="serial") as t:
            with pytest.raises(CacheLayoutError, match=rf"layer 0 from {a} .*replaced since"):
                t.attach_cache(cache, 0)
            assert t.cache is None
            new_rows = t.read_rows([5, 6, 99])
            assert not np.array_equal(new_rows, want_old)
            fresh = RowCache("1M", "lru")
            t.attach_cache(fresh, 0)
            assert np.array_equal(t.read_rows([5, 6, 99]), new_rows)
            assert np.array_equal(t.read_rows([5, 6, 99]), new_rows) and t.last_stats.cache_hits == 3
        old.attach_cache(cache, 0)               # its descriptor still reads the old file: the same table
        assert np.array_equal(old.read_rows([5, 6, 99]), want_old) and old.last_stats.cache_hits == 3

    write_table(b, rows_raw(100, seed=1), 4096)
    cache = RowCache("1M", "lru")
    with Table(b, 4096, 100, backend="serial") as t:
        t.attach_cache(cache, 1)
        t.read_rows([5, 6, 99])
    time.sleep(0.05)                             # a modification time past the first write's, on any clock
    with open(b, "r+b") as f:                    # rewritten in place: the same inode, other rows
        f.seek(4096)
        f.write(rows_raw(100, seed=2).tobytes())
    with Table(b, 4096, 100, backend="serial") as t:
        with pytest.raises(CacheLayoutError, match=rf"layer 1 from {b} .*the file was modified since"):
            t.attach_cache(cache, 1)
        assert t.cache is None


def test_a_model_file_replaced_at_its_path_is_another_model(tmp_path):
    """``EngramModel.open(path, cache=)`` after the file at ``path`` was replaced (another model of the same
    layout) or modified in place: CacheLayoutError naming the file, not the old model's rows."""
    import time

    from tests.modelfiles import plan, write_header_only

    x = tmp_path / "x.gguf"
    write_header_only(plan(seed=3), x)
    cache = RowCache("1M")
    EngramModel.open(x, cache=cache)
    EngramModel.open(x, cache=cache)             # the same file again
    os.remove(x)
    write_header_only(plan(seed=4), x)
    with pytest.raises(CacheLayoutError, match="replaced since"):
        EngramModel.open(x, cache=cache)
    cache = RowCache("1M")
    EngramModel.open(x, cache=cache)
    time.sleep(0.05)
    with open(x, "r+b") as f:                    # a byte of a table's extent changed in place
        f.seek(os.stat(x).st_size - 1000)
        f.write(b"\x01")
    with pytest.raises(CacheLayoutError, match="modified since"):
        EngramModel.open(x, cache=cache)


def test_a_cache_is_not_copied_or_pickled():
    """``copy.copy`` shared the original's records array with the copy, whose inserts then overwrote rows the
    original served; deepcopy and pickling would copy native state and a lock.  All three are refused with
    CacheCopyError naming what to do, and the original keeps its rows."""
    import copy
    import pickle

    from engram import CacheCopyError

    c = RowCache(264 * 4, "lru")
    keys = cache_key(1, np.arange(3))
    rec = np.arange(3 * 264, dtype=np.uint8).reshape(3, 264)
    c.insert(keys, rec)
    for how, f in (("copy.copy", copy.copy), ("copy.deepcopy", copy.deepcopy), ("pickled", pickle.dumps)):
        with pytest.raises(CacheCopyError, match=rf"cannot be .*{how.split('.')[-1]}.*make a new RowCache\(1056, 'lru'\)"):
            f(c)
    with pytest.raises(TypeError):               # what generic code catches of an object that does not pickle
        pickle.dumps([c])
    hit, got = c.lookup(keys)
    assert hit.all() and np.array_equal(got, rec)


@pytest.mark.parametrize("backend", usable(("serial", "pread", "io_uring")))
@pytest.mark.parametrize("cached", [False, True])
def test_a_range_error_names_table_token_and_column_and_leaves_out_alone(model_path, backend, cached):
    """An id beyond its table at ``ids[1, 2, 23]`` of ``read_layers`` / ``begin_layers``: the RowRangeError names
    table 1, token 2, column 23 (it named token 0, column 143, the position in the flattened batch), and
    ``begin_layers`` leaves ``out`` bit-identical (it decoded the cache's hits into ``out`` before the reader's
    range check failed), as ``read_layers`` and ``read_batch`` do; nothing is counted or left reserved."""
    from engram import RowRangeError

    cache = RowCache(264 * 1000, "lru") if cached else None
    model = EngramModel.open(model_path)
    info = model.info
    tables = [Table(info.tables[lid].path, info.tables[lid].offset, info.tables[lid].rows, backend=backend,
                    readers=4, threshold=1, direct=False) for lid in model.layer_ids]
    g = TableGroup(tables, 24)
    if cached:
        g.attach_cache(cache, model.layer_ids)
    try:
        ids = np.arange(2 * 3 * 24, dtype=np.int64).reshape(2, 3, 24)
        want = g.read_layers(ids)                                  # every row a hit from now on, when cached
        bad = ids.copy()
        bad[1, 2, 23] = tables[1].rows
        msg = rf"\(table 1\): row id {tables[1].rows} at token 2, column 23 is outside the table \[0, {tables[1].rows}\)"
        before = cache.stats() if cached else None
        for call in ("read_layers", "begin_layers"):
            out = np.full((2, 3, 24, 256), np.nan, np.float32)
            out.view(np.uint32)[...] = np.arange(out.size, dtype=np.uint32).reshape(out.shape)  # each word its own
            snap = out.copy()
            with pytest.raises(RowRangeError, match=msg):
                getattr(g, call)(bad, out)
            assert out.tobytes() == snap.tobytes(), call
            assert not g.begun
        flat = bad.transpose(1, 0, 2).reshape(3, 48)
        with pytest.raises(RowRangeError, match=r"\(table 1\): row id \d+ at token 2, column 47 is outside"):
            g.read_batch(flat)
        if cached:
            after = cache.stats()
            assert (after["hits"], after["lookups"]) == (before["hits"], before["lookups"])
            assert cache._policy.pending == 0
        out = np.empty((2, 3, 24, 256), np.float32)
        g.begin_layers(ids, out)
        g.finish()
        assert np.array_equal(out, want)
    finally:
        g.close()
        for t in tables:
            t.close()


@pytest.mark.parametrize("backend", usable(("pread", "io_uring")))
def test_get_does_not_serve_a_slot_reserved_for_a_read_in_flight(model_path, backend):
    """``RowCache.get`` took a slot reserved for a begun read as held and returned the record its slot held
    before (another row's); a reserved row is not held until ``finish`` writes it."""
    cache = RowCache(264 * 48, "lru")
    model, tables, g = _group(model_path, cache, backend)
    try:
        a = np.arange(48, dtype=np.int64).reshape(2, 1, 24)
        g.read_layers(a)                              # the 48 slots hold rows 0..23 of both layers
        cache.clear()
        b = a + 5000
        want = _expected(model, b.transpose(1, 0, 2))
        out = np.empty((2, 1, 24, 256), np.float32)
        g.begin_layers(b, out)                        # the same 48 slots reserved for rows 5000..
        assert cache._policy.pending == 48
        for i, lid in enumerate(model.layer_ids):
            held, rows = cache.get(lid, b[i, 0])
            assert not held.any() and rows.shape == (0, 256)
        g.finish()
        for i, lid in enumerate(model.layer_ids):
            held, rows = cache.get(lid, b[i, 0])
            assert held.all() and np.array_equal(rows, want[lid][0])
    finally:
        g.close()
        for t in tables:
            t.close()


def test_a_failed_open_or_session_leaves_the_cache_free(tmp_path, model_path):
    """``EngramModel.open(path, cache=c, eps=-1)`` and ``model.session(cache=c, backend="bogus")`` failed but bound
    ``c`` to that model first: the next model given ``c`` was refused ("row cache serves ...").  A cache is bound
    only by an open or a session that succeeds."""
    from tests.modelfiles import plan, write_header_only

    other = tmp_path / "other.gguf"
    write_header_only(plan(scale=SCALE * 2), other)   # another layout
    c = RowCache("1M")
    with pytest.raises(ArgumentError, match="eps must be"):
        EngramModel.open(other, cache=c, eps=-1)
    with pytest.raises(ArgumentError, match="RowCache or None"):
        EngramModel.open(other, cache="1M")
    m = EngramModel.open(model_path, cache=c)
    assert m.cache is c and m.defaults["cache"] is c
    with pytest.raises(CacheLayoutError, match=f"row cache serves {model_path}"):
        EngramModel.open(other, cache=c)          # bound now: the other layout is refused
    c2 = RowCache("1M")
    b = EngramModel.open(other)
    with pytest.raises(ArgumentError, match="backend must be"):
        b.session(cache=c2, backend="bogus")
    with pytest.raises(ArgumentError, match="RowCache or None"):
        b.session(cache=5)
    s = EngramModel.open(model_path).session(cache=c2)
    try:
        assert s.cache is c2
    finally:
        s.close()
    with pytest.raises(CacheLayoutError, match=f"row cache serves {model_path}"):
        b.session(cache=c2)


def test_bad_arguments_are_argument_errors(tmp_path, model_path):
    """What raised raw exceptions or passed silently: get() with a negative layer (OverflowError), a string
    (ValueError), None rows (TypeError), a negative row ("not held"), a float row (row 1), a row of 2**32 + 2 (layer
    1's row 2); bind(None, None) (AttributeError); bind_tables with a negative, fractional or too large layer id or
    a negative row count (accepted); attach_cache with a float or None layer id (TypeError); use_cache on a closed
    session (KeyError).  Each is now an ArgumentError (TableIOError for the closed session) naming the argument."""
    a = tmp_path / "a.bin"
    write_table(a, rows_raw(10, seed=1), 4096)
    c = RowCache("1M", "lru")
    keys = cache_key(0, np.arange(3)) + np.uint64(2)              # layer 0's rows 2, 3, 4
    c.insert(keys, rows_raw(3, seed=5))
    assert c.get(0, [2, 3, 9])[0].tolist() == [True, True, False]
    for layer, rows, what in ((-1, [1], r"layer id -1 is outside"), ("a", [1], r"layer_id must be one integer"),
                              (1.0, [1], r"layer_id must be one integer"), ([0, 1], [1], r"layer_id must be one"),
                              (True, [1], r"layer_id must be one integer"), (1, None, r"rows must be integers"),
                              (1, "12", r"rows must be integers"), (1, [-1], r"row id -1 at index \(0,\) is outside"),
                              (1, [1.5], r"row ids must be integers"),
                              (0, [2 ** 32 + 2], r"row id 4294967298 at index \(0,\) is outside")):
        with pytest.raises(ArgumentError, match=r"RowCache\.get: " + what):
            c.get(layer, rows)
    held, got = c.get(0, np.uint32(2))                            # one row id
    assert held.tolist() == [True] and got.shape == (1, 256)
    for layout, tables in ((None, None), (None, {1: 3}), (None, [1, 2])):
        with pytest.raises(ArgumentError, match=r"RowCache\.bind: tables must map layer ids"):
            c.bind(layout, tables)
    info = EngramModel.open(model_path).info
    with pytest.raises(ArgumentError, match=r"RowCache\.bind: layout must be an engram\.Layout"):
        c.bind(None, info.tables)
    for entry, what in (((-1, a, 4096, 10), r"layer id must be an integer in \[0, 2\*\*32\), got -1"),
                        ((1.7, a, 4096, 10), r"layer id must be .* got 1\.7"),
                        ((2 ** 40, a, 4096, 10), r"layer id must be .* got 1099511627776"),
                        ((True, a, 4096, 10), r"layer id must be .* got True"),
                        ((5, a, 4096, -10), r"rows must be an integer in \[1, 2\*\*32\], got -10"),
                        ((5, a, 4096, 0), r"rows must be .* got 0"),
                        ((5, a, -1, 10), r"offset must be an integer >= 0, got -1"),
                        ((5, a, 4096.0, 10), r"offset must be .* got 4096\.0")):
        with pytest.raises(ArgumentError, match=r"tables must be \(layer id, path, offset, rows\) each .*" + what):
            c.bind_tables([entry])
    assert c._tables == {}                                        # nothing bound by a refused call
    with Table(a, 4096, 10, backend="serial") as t:
        for lid in (1.0, None, "1", -1, [1, 2]):
            with pytest.raises(ArgumentError, match="layer_ids must give one layer id >= 0"):
                t.attach_cache(c, lid)
        assert t.cache is None
    m = EngramModel.open(model_path)
    s = m.session()
    s.close()
    for cache in (c, None):
        with pytest.raises(TableIOError, match="use_cache: the session is closed"):
            s.use_cache(cache)
    assert c._owner is None                                       # the closed session bound nothing


def test_bookkeeping_bytes_bound_every_capacity():
    """BOOKKEEPING_BYTES was 92 "at most", while a TinyLFU cache of 1025 rows took 95.9 bytes a row, so the memory
    check underestimated.  A cache of any capacity and policy allocates at most ``rows * BOOKKEEPING_BYTES +
    BOOKKEEPING_FIXED_BYTES`` bytes of bookkeeping (checked by formula up to 2**31 - 1 rows, the edges of every
    power of two and of the huge-page rounding), the formula is what a policy reports, and the bound is tight:
    some capacity comes within a byte a row of it.  (LRU, without a sketch, stays under 88 a row.)"""
    from engram.rowcache import BOOKKEEPING_BYTES, BOOKKEEPING_FIXED_BYTES, bookkeeping_bytes

    caps = {c for k in range(32) for c in ((1 << k) - 1, 1 << k, (1 << k) + 1)}
    caps |= {c + d for c in ((1 << 20) // 24, (1 << 20) // 16, (1 << 20) // 4, 43691, 65537) for d in range(-2, 3)}
    caps |= set(np.random.default_rng(0).integers(1, 2 ** 31 - 1, 2000).tolist())
    caps = sorted(c for c in caps if 1 <= c <= 2 ** 31 - 1)
    # tight: a TinyLFU cache just past a power of two, below the huge-page rounding, comes within a byte a row
    assert BOOKKEEPING_BYTES - 1 < max(bookkeeping_bytes(c, "tinylfu") / c for c in caps if 1000 < c < 40000)
    for name in ("lru", "tinylfu"):
        for c in caps:
            assert bookkeeping_bytes(c, name) <= c * BOOKKEEPING_BYTES + BOOKKEEPING_FIXED_BYTES, (name, c)
        for c in (1, 2, 9, 17, 1025, 4097, 43691, 65537, 131073):
            assert CachePolicy(c, name).bookkeeping_bytes == bookkeeping_bytes(c, name)
    assert bookkeeping_bytes(1025, "tinylfu") == 1025 * 24 + 4096 * 16 + 4 * 2048     # 95.9 bytes a row
    assert bookkeeping_bytes(131073, "tinylfu") == (4 << 20) + (8 << 20) + (2 << 20)   # huge pages, 112 a row
    with pytest.raises(ValueError, match="unknown policy"):
        bookkeeping_bytes(10, "fifo")
