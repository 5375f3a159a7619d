"""The n-gram hash (SPEC §4): known answers, NumPy twins, chunking, masks, errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import ArgumentError, Hasher, History, HistoryError, Layout, TokenError
from tests.reference import hash_official_numpy, hash_reference

KAT_SEQ = [0, 1, 17, 99091, 2, 5000]


@pytest.fixture(scope="module")
def hasher(layout):
    return Hasher(layout)


def test_kat_vectors(hasher):
    rows = hasher.hash(KAT_SEQ)
    assert rows.dtype == np.uint32 and rows.shape == (6, 2, 24)
    assert rows[0, 0, [0, 7, 8, 23]].tolist() == [5702652, 121476532, 131476717, 380066193]
    assert rows[3, 0, [0, 7, 8, 23]].tolist() == [379248, 114357284, 129034992, 374200121]


def test_kat_step_path(hasher):
    hist = History()
    out = np.empty((2, 24), np.uint32)
    got = [hasher.step(t, hist, out).copy() for t in KAT_SEQ]
    assert np.array_equal(np.stack(got), hasher.hash(KAT_SEQ))
    assert hist.ids == (5000, 2, 99091)


def test_rows_within_columns(hasher, layout):
    rows = hasher.hash(np.random.default_rng(1).integers(0, 99_092, 3000)).astype(np.int64)
    lo = layout.offsets.astype(np.int64)[None]
    hi = lo + layout.primes.astype(np.int64)[None]
    assert np.all((rows >= lo) & (rows < hi))


def _kernels(layout):
    """The batch kernel with every available path: SIMD (if the CPU has it), scalar, 1 or 2 threads."""
    out = []
    for simd in (True, False):
        for threads in (1, 2):
            h = Hasher(layout)
            if simd and not h._kernel.simd:
                continue
            h._kernel.simd = simd
            h._kernel.threads = threads
            out.append(h)
    return out


def test_twins_on_real_text(layout, token_map, tokenizer, shared_data):
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[:60_000]
    ids = np.array(tokenizer.encode(text, add_special_tokens=False).ids)
    comp = token_map[ids]
    official = hash_official_numpy(layout, comp)
    ref, tail = hash_reference(layout, comp[:400])
    assert np.array_equal(official[:400], ref)
    for h in _kernels(layout):
        assert np.array_equal(h.hash(comp), official), (h._kernel.simd, h._kernel.threads)
    mapped = Hasher(layout, token_map)
    hist = History()
    assert np.array_equal(mapped.hash(ids, history=hist), official)
    assert hist.ids == tuple(int(x) for x in comp[::-1][:3])


def test_small_primes_use_exact_division():
    # Primes below 8192 take the hardware-division path; large ids stress the mix.
    lay = Layout.derive([7, 300, 9000], [3, 5], heads=8, compressed_vocab_size=99_092, pad_id=2)
    h = Hasher(lay)
    assert not h._kernel.fast_mod
    toks = np.random.default_rng(2).integers(0, 99_092, 500)
    ref, _ = hash_reference(lay, toks)
    assert np.array_equal(h.hash(toks), ref)


def test_other_head_counts_and_orders():
    lay = Layout.derive(20_000, [0], heads=3, max_ngram=3, compressed_vocab_size=1000, pad_id=7)
    h = Hasher(lay)
    toks = np.random.default_rng(3).integers(0, 1000, 300)
    mask = np.random.default_rng(4).random(300) < 0.8
    ref, tail = hash_reference(lay, toks, mask, tail=(-1, -1))
    hist = h.new_history()
    assert hist.ids == (-1, -1)
    assert np.array_equal(h.hash(toks, mask, hist), ref)
    assert hist.ids == tail


token_lists = st.lists(st.integers(0, 99_091), min_size=0, max_size=120)


@settings(max_examples=60, deadline=None)
@given(tokens=token_lists, data=st.data())
def test_chunked_equals_one_call(layout, tokens, data):
    """Hashing in chunks of any size with the history carried equals one call (SPEC §4)."""
    h = Hasher(layout)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(tokens), max_size=len(tokens))), bool)
    whole_hist = History()
    whole = h.hash(tokens, mask, whole_hist)
    ref, tail = hash_reference(layout, tokens, mask)
    assert np.array_equal(whole, ref)
    assert whole_hist.ids == tail
    hist = History()
    parts, i = [], 0
    while i < len(tokens):
        n = data.draw(st.integers(1, 40))
        parts.append(h.hash(tokens[i:i + n], mask[i:i + n], hist))
        i += n
    got = np.concatenate(parts) if parts else np.empty((0, 2, 24), np.uint32)
    assert np.array_equal(got, whole)
    assert hist == whole_hist


@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.integers(0, 99_091), min_size=1, max_size=30),
       start=st.lists(st.integers(-1, 99_091), min_size=3, max_size=3))
def test_restored_history_equals_replay(layout, tokens, start):
    """A history restored from ids hashes like the reference started from that tail."""
    h = Hasher(layout)
    ref, _ = hash_reference(layout, tokens, tail=tuple(start))
    assert np.array_equal(h.hash(tokens, history=History(start)), ref)


def test_masked_positions_are_dead(hasher, layout):
    toks = [10, 11, 12, 13, 14]
    mask = [True, True, False, True, True]
    rows = hasher.hash(toks, mask)
    ref, _ = hash_reference(layout, toks, mask)
    assert np.array_equal(rows, ref)
    # A masked token is DEAD: the next token sees pad for it and everything older.
    assert np.array_equal(rows[3], hasher.hash([13])[0])


def test_snapshot_restore(hasher):
    hist = History()
    hasher.hash([5, 6, 7, 8], history=hist)
    snap = hist.copy()
    a = hasher.hash([9, 10], history=hist)
    b = hasher.hash([9, 10], history=snap)
    assert np.array_equal(a, b) and hist == snap
    assert History(list(hist.ids)) == hist
    import pickle

    assert pickle.loads(pickle.dumps(hist)) == hist


@given(a=st.lists(st.integers(-1, 2**31 - 1), min_size=1, max_size=3),
       b=st.lists(st.integers(-1, 2**31 - 1), min_size=1, max_size=3))
def test_history_equality_is_equality_of_ids(a, b):
    """History's == (a loop in C) against its ids: equal exactly where the ids are, lengths included;
    not equal to what is not a History."""
    assert (History(a) == History(b)) == (tuple(a) == tuple(b))
    assert (History(a) != History(b)) == (tuple(a) != tuple(b))
    assert History(a) != tuple(a) and not (History(a) == list(a))


def test_history_length_is_read_only():
    """``History.n`` cannot be set: a length past the fixed array would make == and copy() read beyond it."""
    h = History([1, 2, 3])
    with pytest.raises(AttributeError):
        h.n = 10**6
    assert h.n == 3 and h.copy() == h


@pytest.mark.parametrize("bad", [[-1], [99_092], [5, 2**40], [2**64 - 1]])
def test_invalid_tokens_leave_history(hasher, bad):
    hist = History([4, 5, 6])
    with pytest.raises(TokenError, match="position"):
        hasher.hash([1, 2] + bad, history=hist)
    assert hist.ids == (4, 5, 6)


def test_invalid_inputs(hasher, token_map, layout):
    hist = History([4, 5, 6])
    with pytest.raises(TokenError, match="1.5 at position 0 is not an integer"):
        hasher.hash([1.5, 2.0], history=hist)
    with pytest.raises(TokenError, match="integers, got dtype float64"):
        hasher.hash(np.array([1.0, 2.0]), history=hist)
    with pytest.raises(TokenError, match="1-D"):
        hasher.hash([[1, 2]], history=hist)
    with pytest.raises(ArgumentError, match=r"mask must have shape \[3\]"):
        hasher.hash([1, 2, 3], mask=[True, False], history=hist)
    mapped = Hasher(layout, token_map)
    with pytest.raises(TokenError, match="129280"):
        mapped.hash([129_280], history=hist)
    with pytest.raises(TokenError, match="outside the vocabulary"):
        mapped.step(129_280, hist)
    with pytest.raises(TokenError):
        mapped.step("x", hist)
    with pytest.raises(TokenError):
        mapped.step(2**70, hist)
    assert hist.ids == (4, 5, 6)


def test_corrupt_or_foreign_history(hasher):
    with pytest.raises(HistoryError, match="id 1"):
        History([3, -5, 2])
    foreign = History([3, 200_000, 2])  # a layout with a larger compressed vocabulary
    with pytest.raises(HistoryError, match="id 1 is 200000"):
        hasher.hash([1], history=foreign)
    with pytest.raises(HistoryError, match="id 1 is 200000"):
        hasher.step(1, foreign)
    short = History([1, 2])
    with pytest.raises(HistoryError, match="needs 3"):
        hasher.hash([1], history=short)
    with pytest.raises(HistoryError, match="engram.History"):
        hasher.hash([1], history=(1, 2, 3))
    assert foreign.ids == (3, 200_000, 2) and short.ids == (1, 2)


def test_step_out_checks(hasher):
    hist = History()
    for out in (np.empty((2, 24), np.int32), np.empty((2, 23), np.uint32),
                np.empty((24, 2), np.uint32)[::2], np.zeros((2, 24), np.uint32)[::1, ::1].copy(order="F").T):
        with pytest.raises(ArgumentError):
            hasher.step(1, hist, out)
    ro = np.empty((2, 24), np.uint32)
    ro.setflags(write=False)
    with pytest.raises(ArgumentError):
        hasher.step(1, hist, ro)
    assert hist.ids == (-1, -1, -1)


def test_token_map_validation(layout):
    with pytest.raises(TokenError, match=r"token_map\[1\] = 99092"):
        Hasher(layout, np.array([0, 99_092]))
    with pytest.raises(TokenError, match="1-D"):
        Hasher(layout, np.zeros((2, 2), np.int32))


def test_empty_input(hasher):
    hist = History([1, 2, 3])
    assert hasher.hash([], history=hist).shape == (0, 2, 24)
    assert hist.ids == (1, 2, 3)


@pytest.mark.parametrize("bad", [-1, 129_280])
def test_a_masked_position_still_needs_a_vocabulary_id(layout, token_map, bad):
    h = Hasher(layout, token_map)
    hist = h.new_history()
    before = hist.ids
    with pytest.raises(TokenError, match=f"token {bad} at position 2"):
        h.hash(np.array([5, 6, bad, 7], np.int64), np.array([1, 1, 0, 1], bool), hist)
    assert hist.ids == before


@pytest.mark.parametrize("bad, at", [([5, 6, True], 2), ((np.bool_(False), 5), 0), ([5] * 70 + [True], 70)])
def test_a_bool_among_integer_ids_is_refused(hasher, bad, at):
    """A bool in a list of ids would become 0 or 1 in the array: refused as step refuses it (TokenError
    naming it and its position), by hash and check_tokens alike, the history untouched."""
    hist = History([4, 5, 6])
    with pytest.raises(TokenError, match=f"token {bad[at]!r} at position {at} is not an integer"):
        hasher.hash(bad, history=hist)
    with pytest.raises(TokenError, match=f"at position {at} is not an integer"):
        hasher.check_tokens(bad)
    assert hist.ids == (4, 5, 6)


@pytest.mark.parametrize("n", [3, 70])
def test_check_tokens_of_an_array_subclass_is_a_plain_array(hasher, n):
    """An int64 ndarray subclass (a masked array, whose tolist gives None where masked) is checked and
    returned as the plain array of its data, short or long."""
    data = np.arange(n, dtype=np.int64)
    tok = hasher.check_tokens(np.ma.masked_array(data, mask=data == 1))
    assert type(tok) is np.ndarray and np.array_equal(tok, data) and tok.tolist() == data.tolist()
