"""sim.serve.rows: prompt chunk reads and decode steps' reads against plain NumPy counts of the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from engram import ArgumentError
from engram.rowcache import CachePolicy, cache_key
from sim.decode import resident_mask
from sim.decode.reads import shared_cache_hits
from sim.core.params import Policy
from sim.serve.rows import TABLE_SHIFT, RowSource, SharedRowCache
from sim.serve.workload import Workload, make_requests
from sim.trace import CODE_SOURCE, load_trace


@pytest.fixture(scope="module")
def text():
    return load_trace(CODE_SOURCE, limit=9000)


@pytest.fixture(scope="module")
def rows(text):
    return RowSource(text, Policy(), 2048)


def _distinct(rows3: np.ndarray) -> int:
    """Distinct (table, row) pairs of uint32 ``[T, layers, columns]`` rows (the NumPy twin)."""
    L = rows3.shape[1]
    return sum(np.unique(rows3[:, j, :]).size for j in range(L))


def test_keys_hold_table_and_row(text, rows):
    assert rows.text_tokens == 8192 and rows.chunks == 4
    k = rows.keys[123]
    assert np.array_equal(k[:24] & ((1 << TABLE_SHIFT) - 1), text.rows[123, 0])
    assert np.array_equal(k[24:] >> TABLE_SHIFT, np.ones(24, np.uint32))


@pytest.mark.parametrize("ppos, tokens", [(0, 1), (0, 2048), (2048, 700), (4096, 5000), (6144, 4096), (2048, 2049)])
def test_prompt_reads_are_distinct_rows_per_chunk_and_table(text, rows, ppos, tokens):
    got = rows.prompt_reads(-1, ppos, tokens)
    n = -(-tokens // 2048)
    assert got.shape == (n, 2)
    idx = (ppos + np.arange(tokens)) % rows.text_tokens
    for c in range(n):
        part = text.rows[idx[c * 2048:(c + 1) * 2048]]
        for j in range(2):
            assert got[c, j] == np.unique(part[:, j, :]).size


def test_prompt_reads_without_resident_rows(text):
    pol = Policy(dram_fraction=0.3)
    rs = RowSource(text, pol, 2048)
    res = resident_mask(text.rows[:8192], 0.3)
    assert 0.25 < res.mean() < 0.35
    got = rs.prompt_reads(-1, 2048, 3000)
    for c, (a, b) in enumerate(((2048, 4096), (4096, 5048))):
        for j in range(2):
            r = text.rows[a:b, j, :][~res[a:b, j, :]]
            assert got[c, j] == np.unique(r).size


def test_decode_steps_count_each_row_once_across_requests(text, rows):
    rng = np.random.default_rng(1)
    for B in (1, 7, 64):
        pos = rng.integers(0, rows.text_tokens, B)
        assert rows.count_distinct(pos) == _distinct(text.rows[pos]) == rows.decode_keys(pos).size
    same = np.full(10, 77)  # ten requests reading one token: its 48 rows once
    assert rows.count_distinct(same) == 48


def test_decode_reads_split_by_table_and_drive(text, rows):
    pos = np.arange(100, 140)
    keys = rows.decode_keys(pos)
    by_table, by_drive = rows.split(keys, 3)
    for j in range(2):
        u = np.unique(text.rows[pos, j, :])
        assert by_table[j].sum() == u.size
        for d in range(3):
            assert by_table[j, d] == np.count_nonzero(u % 3 == d)
    assert by_drive.sum() == keys.size


def test_decode_keys_drop_resident_rows_and_cache_hits(text):
    rs = RowSource(text, Policy(dram_fraction=0.5), 2048)
    pos = np.arange(500, 520)
    res = resident_mask(text.rows[pos], 0.5).reshape(20, 48)
    hits = np.zeros((20, 48), bool)
    hits[::2] = True
    got = rs.decode_keys(pos, hits)
    want = np.unique(rs.keys[pos][~(res | hits)])
    assert np.array_equal(got, want)


def test_shared_cache_is_an_lru_of_every_batch(text, rows):
    """The shared cache against sim.decode.shared_cache_hits (the decode model's shared cache: the engine's
    policy, a batch looked up, then its misses inserted) on the same batches in order."""
    rng = np.random.default_rng(5)
    batches = [rows.decode_keys(rng.integers(0, 300, 8)) for _ in range(40)]
    cache = SharedRowCache(500, "lru")
    got = np.concatenate([np.isin(b, cache.misses(b), invert=True) for b in batches])
    width = max(b.size for b in batches)
    keys = np.zeros((len(batches), width), np.uint64)
    active = np.zeros((len(batches), width), bool)
    for i, b in enumerate(batches):
        keys[i, :b.size], active[i, :b.size] = b, True
    want = shared_cache_hits(keys, active, 500, "lru")[active]
    assert np.array_equal(got, want)
    assert cache.hits == int(want.sum()) > 0


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_shared_cache_sees_the_engines_keys(text, rows, policy):
    """The policy is fed the engine's keys (layer id << 32 | row, engram.rowcache.cache_key), which TinyLFU's
    sketch hashes: the same hits as the engine's policy on those keys, batch by batch (looked up, then the misses
    inserted), and the misses come back as the model's own keys."""
    k = rows.keys[7]
    assert np.array_equal(rows.cache_keys(k), cache_key(np.repeat(np.asarray(text.layer_ids, np.uint64), 24),
                                                        text.rows[7].reshape(-1)))
    rng = np.random.default_rng(9)
    batches = [rows.decode_keys(rng.integers(0, 3000, 8)) for _ in range(120)]
    cache = SharedRowCache(300, policy, rows)
    ref = CachePolicy(300, policy)
    for b in batches:
        miss = cache.misses(b)
        e = np.ascontiguousarray(rows.cache_keys(b))
        slots = np.empty(e.size, np.int64)
        ref.lookup(e, slots)
        assert np.array_equal(miss, b[slots < 0]) and miss.dtype == np.uint32
        ref.insert(np.ascontiguousarray(e[slots < 0]), np.empty(int((slots < 0).sum()), np.int64))
    assert cache.hits > 0


def test_placement(text, rows):
    r = make_requests(Workload(rate=10, duration=20, prompt_tokens="uniform:min=10,max=3000", output_tokens="5"), 4)
    ppos, dpos = rows.place(r)
    assert np.all(ppos % 2048 == 0) and np.all(ppos < rows.text_tokens)
    assert np.array_equal(dpos, (ppos + r.prompt) % rows.text_tokens)


def test_short_text_is_refused(text):
    with pytest.raises(ArgumentError, match="fewer than one read chunk"):
        RowSource(text.head(1000), Policy(), 2048)
