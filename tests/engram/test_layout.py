"""Layout derivation and validation (SPEC §2), with the known-answer values."""

import numpy as np
import pytest

from engram import Layout, LayoutError
from engram.layout import is_prime


def test_kat_primes(layout):
    assert layout.primes[0, 0] == 16_000_057 and layout.primes[0, -1] == 16_000_463
    assert layout.primes[1, 0] == 16_000_477 and layout.primes[1, -1] == 16_000_889
    flat = layout.primes.ravel().astype(int).tolist()
    assert len(set(flat)) == 48 and all(is_prime(p) for p in flat)
    # Every prime between the first and last is taken: the 48 primes after 16e6.
    expected, c = [], 15_999_999
    while len(expected) < 48:
        c += 1
        if is_prime(c):
            expected.append(c)
    assert flat == expected


def test_kat_rows_offsets_multipliers(layout):
    assert layout.rows.tolist() == [384006168, 384016682]
    assert layout.offsets[:, 12].tolist() == [192001740, 192007016]
    assert layout.offsets[:, 23].tolist() == [368005705, 368015793]
    assert layout.offsets[:, 0].tolist() == [0, 0]
    assert layout.multipliers[0].tolist() == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert layout.multipliers[1].tolist() == [67716810739261, 51510806800915, 30921347202721, 82619226485591]
    assert layout.layer_ids == (1, 14) and layout.columns == 24
    assert layout.compressed_vocab_size == 99_092 and layout.pad_id == 2
    assert [layout.order_of_column(c) for c in (0, 7, 8, 23)] == [2, 2, 3, 4]


def test_offsets_are_cumulative_primes(layout):
    for li in range(layout.layers):
        acc = np.concatenate([[0], np.cumsum(layout.primes[li].astype(np.int64))])
        assert layout.offsets[li].astype(np.int64).tolist() == acc[:-1].tolist()
        assert int(layout.rows[li]) == int(acc[-1])


def test_scaled_layout_keeps_other_constants():
    small = Layout.deepseek_v41_flash(scale=0.001)
    assert small.primes.min() > 16_000 and small.primes.max() < 17_000
    assert small.multipliers.tolist() == Layout.deepseek_v41_flash().multipliers.tolist()
    assert small == Layout.deepseek_v41_flash(scale=0.001)
    assert small != Layout.deepseek_v41_flash()


def test_derive_per_order_sizes_and_small_primes():
    lay = Layout.derive([3, 10, 100], [0], heads=2, compressed_vocab_size=50, pad_id=0)
    assert lay.primes.tolist() == [[3, 5, 11, 13, 101, 103]]
    lay2 = Layout.derive(1, [0, 1], heads=2, max_ngram=2, compressed_vocab_size=5, pad_id=1)
    assert lay2.primes.tolist() == [[2, 3], [5, 7]]


def test_is_prime_matches_sieve():
    n = 20000
    sieve = np.ones(n, bool)
    sieve[:2] = False
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = False
    assert [is_prime(i) for i in range(n)] == sieve.tolist()
    assert is_prime(2**61 - 1) and not is_prime(2**61 + 1) and not is_prime(3215031751)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(pad_id=99_092), "pad_id"),
        (dict(pad_id=-1), "pad_id"),
        (dict(compressed_vocab_size=0), "compressed_vocab_size"),
        (dict(layer_ids=(1, 1)), "layer_ids"),
        (dict(layer_ids=()), "layer_ids"),
        (dict(heads=0), "heads"),
        (dict(max_ngram=1), "max_ngram"),
    ],
)
def test_validate_names_field(layout, change, field):
    kw = dict(layer_ids=layout.layer_ids, primes=layout.primes, multipliers=layout.multipliers,
              compressed_vocab_size=layout.compressed_vocab_size, pad_id=layout.pad_id)
    kw.update(change)
    with pytest.raises(LayoutError, match=field):
        Layout(**kw)


def test_validate_array_fields(layout):
    base = dict(layer_ids=layout.layer_ids, compressed_vocab_size=layout.compressed_vocab_size,
                pad_id=layout.pad_id)
    p = layout.primes.copy()
    p[1, 5] = 1
    with pytest.raises(LayoutError, match=r"primes: layer 14 column 5"):
        Layout(primes=p, multipliers=layout.multipliers, **base)
    m = layout.multipliers.copy()
    m[0, 2] += 1
    with pytest.raises(LayoutError, match=r"multipliers: layer 1 lookback 2 is even"):
        Layout(primes=layout.primes, multipliers=m, **base)
    m = layout.multipliers.copy()
    m[0, 0] = 2**62 + 1
    with pytest.raises(LayoutError, match="overflows int64"):
        Layout(primes=layout.primes, multipliers=m, **base)
    with pytest.raises(LayoutError, match=r"primes: expected shape \(2, 24\)"):
        Layout(primes=layout.primes[:, :23], multipliers=layout.multipliers, **base)
    with pytest.raises(LayoutError, match="primes: expected integers"):
        Layout(primes=layout.primes.astype(float), multipliers=layout.multipliers, **base)
    big = np.full((2, 24), 2**31 - 1, dtype=np.uint64)
    with pytest.raises(LayoutError, match="rows: layer 1"):
        Layout(primes=big, multipliers=layout.multipliers, **base)


def test_layout_arrays_are_read_only(layout):
    with pytest.raises(ValueError):
        layout.primes[0, 0] = 5


def test_preset_is_fast():
    import time

    t0 = time.perf_counter()
    Layout.deepseek_v41_flash()
    # Generous bound (the derivation takes ~0.1 s); guards against a naive prime search.
    assert time.perf_counter() - t0 < 2.0
