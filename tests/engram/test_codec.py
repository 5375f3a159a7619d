"""The row codec e4m3_e8m0_32_row264 (SPEC §5): known answers, every (code, scale) pair
against a NumPy twin and ml_dtypes on every decode path, errors, and the encode round trip."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engram
from engram import ArgumentError, DecodeError
from engram._native import codec as native
from engram.codec import ZERO_BLOCK_SCALE, bf16_round, decode_rows, encode_rows
from tests.reference import (bf16_bits_round_reference, decode_rows_reference, e4m3_reference,
                       encode_rows_reference)

PATHS = native.paths()


@pytest.fixture(params=PATHS)
def path(request):
    prev = native.set_path(request.param)
    yield request.param
    native.set_path(prev)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def make_row(code=0x38, scale=127):
    row = np.full((1, 264), code, dtype=np.uint8)
    row[:, 256:] = scale
    return row


# ----------------------------------------------------------------------------- known answers

def test_paths_listed():
    assert PATHS[0] == "portable"
    assert native.get_path() == PATHS[-1]  # the fastest the CPU runs is the default
    assert engram.codec.decode_path() in PATHS
    with pytest.raises(ArgumentError, match="not available"):
        native.set_path("sse9")


def test_kat_one(path):
    assert decode_rows(make_row(0x38, 127))[0].tolist() == [1.0] * 256
    assert decode_rows(make_row(0xB8, 127))[0, 0] == -1.0


@pytest.mark.parametrize("s", range(255))
def test_kat_scale_multiplies_by_power_of_two(s):
    # 0x38 is 1.0, so the value is the scale itself: 2^(s-127) for every finite scale byte
    assert decode_rows(make_row(0x38, s))[0, 0] == np.float32(np.ldexp(1.0, s - 127))
    # and scale 127 + b multiplies the scale-127 value by 2^b where both are normal floats
    codes = np.arange(0, 0x7F, dtype=np.uint8)
    row = np.zeros((2, 264), np.uint8)
    row[:, :127] = codes
    row[0, 256:] = 127
    row[1, 256:] = s
    if s <= 246 and s >= 10:
        out = decode_rows(row)
        assert np.array_equal(out[1, :127], out[0, :127] * np.float32(np.exp2(s - 127.0)))


def test_kat_fields():
    # E4M3 bit fields (SPEC §5): largest 448, smallest normal 2^-6, smallest subnormal 2^-9
    row = make_row(0, 127)
    row[0, :6] = [0x7E, 0x08, 0x01, 0x07, 0x80, 0xFE]
    out = decode_rows(row)[0]
    assert out[:4].tolist() == [448.0, 2.0**-6, 2.0**-9, 7 * 2.0**-9]
    assert bits(out[4]) == 0x80000000  # negative zero keeps its sign
    assert out[5] == -448.0
    # results in the float32 subnormal range round to bf16 on the bits: 2^-136 -> 0, 2^-133 stays
    row = make_row(0x01, 0)  # 2^-9 * 2^-127 = 2^-136: float32 bits 0x2000
    row[0, 1:6] = [0x08, 0x09, 0x0C, 0x12, 0x0F]
    out = decode_rows(row)[0]
    assert out[0] == 0.0
    assert bits(out[1]) == 0x10000   # 2^-133 (bits 0x10000) is a bf16 value
    assert bits(out[2]) == 0x10000   # 1.125 * 2^-133 (0x12000) rounds down
    assert bits(out[3]) == 0x20000   # 1.5 * 2^-133 (0x18000): tie, odd -> up to 2^-132
    assert bits(out[4]) == 0x20000   # 1.25 * 2^-132 (0x28000): tie, even -> down
    assert bits(out[5]) == 0x20000   # 1.875 * 2^-133 (0x1E000) rounds up


# ----------------------------------------------------------------------------- every (code, scale) pair

@pytest.fixture(scope="module")
def all_pairs():
    """65,536 rows; row 256 * s + c holds code c in every column and scale s in every block."""
    idx = np.arange(65536)
    raw = np.empty((65536, 264), np.uint8)
    raw[:, :256] = (idx & 0xFF)[:, None]
    raw[:, 256:] = (idx >> 8)[:, None]
    vals, bad = decode_rows_reference(raw)
    return raw, vals, bad


def test_twin_agrees_with_ml_dtypes(all_pairs):
    raw, vals, bad = all_pairs
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(bits(e4m3_reference(codes)[(codes & 127) != 127]),
                          bits(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[(codes & 127) != 127]))
    c = raw[:, 0].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s = raw[:, 256].view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ml = (c * s).astype(ml_dtypes.bfloat16).astype(np.float32)
    ok = ~bad[:, 0]
    assert np.array_equal(~ok, ~np.isfinite(ml))
    assert np.array_equal(bits(vals[ok, 0]), bits(ml[ok]))
    # 1326 bad pairs: 256 scales x 2 NaN codes, 254 NaN-scale codes, and the overflows of s >= 247
    assert int((~ok).sum()) == 2 * 256 + 254 + sum(2 * (0x7F - ((262 - s) << 3)) for s in range(247, 255))


def test_every_pair_decodes_as_spec(all_pairs, path):
    raw, vals, bad = all_pairs
    good = ~bad[:, 0]
    out = np.full((65536, 256), np.nan, np.float32)
    native.decode_rows_into(raw, out)
    assert np.array_equal(bits(out[good]), bits(vals[good]))
    assert np.array_equal(bits(decode_rows(raw[good])), bits(vals[good]))


def test_every_pair_checks_as_spec(all_pairs, path):
    raw, vals, bad = all_pairs
    found = []
    start = 0
    while True:
        i = native.find_bad_row(raw[start:])
        if i < 0:
            break
        found.append(start + i)
        start += i + 1
    assert found == np.flatnonzero(bad[:, 0]).tolist()
    for r in (0, 127 * 256 + 0x38, 255 * 256 + 1, 247 * 256 + 0x78, 247 * 256 + 0x77, 254 * 256 + 0x3F):
        assert native.first_bad_column(raw[r]) == (0 if bad[r, 0] else -1)


def test_c_interface_decode_row(all_pairs, path):
    raw, vals, bad = all_pairs
    out = np.empty(256, np.float32)
    for r in np.flatnonzero(~bad[:, 0])[::97]:
        native.decode_row_into(raw[r], out)
        assert np.array_equal(bits(out), bits(vals[r]))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 40), lo=st.integers(0, 254),
       inject=st.sampled_from([0, 1, 3]))
def test_random_rows_match_twin(seed, n, lo, inject):
    """Random rows (scales in a window starting at ``lo``), optionally with injected NaN codes,
    NaN scales and overflowing scales: the check, the error and the values follow the twin."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, 264), dtype=np.uint8)
    raw[:, :256] &= 0xF7  # no NaN code
    raw[:, 256:] = rng.integers(lo, min(lo + 12, 255), (n, 8))
    for _ in range(inject):
        r, c = rng.integers(0, n), rng.integers(0, 256)
        kind = rng.integers(0, 3)
        if kind == 0:
            raw[r, c] |= 0x7F
        elif kind == 1:
            raw[r, 256 + c // 32] = 255
        else:
            raw[r, 256 + c // 32] = rng.integers(247, 255)
    vals, bad = decode_rows_reference(raw)
    for p in PATHS:
        prev = native.set_path(p)
        try:
            for r in range(n):
                cols = np.flatnonzero(bad[r])
                assert native.first_bad_column(raw[r]) == (int(cols[0]) if cols.size else -1)
            bad_rows = np.flatnonzero(bad.any(axis=1))
            out = np.full((n, 256), 3.0, np.float32)
            if bad_rows.size:
                with pytest.raises(DecodeError) as ei:
                    decode_rows(raw, out)
                assert ei.value.row == bad_rows[0]
                assert ei.value.column == np.flatnonzero(bad[bad_rows[0]])[0]
                assert np.all(out == 3.0)
            else:
                decode_rows(raw, out)
                assert np.array_equal(bits(out), bits(vals))
        finally:
            native.set_path(prev)


def test_threaded_batch_equals_serial(path):
    rng = np.random.default_rng(5)
    n = 20_000  # above the threshold from which batches are split across threads
    raw = rng.integers(0, 256, (n, 264), dtype=np.uint8)
    raw[:, :256] &= 0xF7
    raw[:, 256:] = rng.integers(0, 247, (n, 8))
    vals, _ = decode_rows_reference(raw)
    prev = native.set_threads(1)
    try:
        one = decode_rows(raw)
        native.set_threads(2)
        two = decode_rows(raw)
    finally:
        native.set_threads(prev)
    assert np.array_equal(bits(one), bits(vals)) and np.array_equal(bits(two), bits(vals))


# ----------------------------------------------------------------------------- decode errors

@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("case", ["nan_code", "neg_nan_code", "nan_scale", "overflow"])
def test_decode_error_names_row_and_column(case, dtype, path):
    raw = encode_rows(np.random.default_rng(2).standard_normal((6, 256)).astype(np.float32))
    if case == "nan_code":
        raw[4, 77] = 0x7F
        raw[5, 3] = 0x7F
        row, col, text = 4, 77, "0x7f"
    elif case == "neg_nan_code":
        raw[2, 255] = 0xFF
        row, col, text = 2, 255, "0xff"
    elif case == "nan_scale":
        raw[3, 256 + 5] = 255
        row, col, text = 3, 160, "scale byte 255"
    else:
        raw[1, 256 + 2] = 250
        raw[1, 64:96] = 0x30  # 0.5 * 2^123: finite
        raw[1, 90] = 0x28     # 2^-2 * 2^123: finite
        raw[1, 93] = 0xD8     # -16 * 2^123 = -2^127: finite
        raw[1, 94] = 0x70     # 128 * 2^123 = 2^130: overflows
        row, col, text = 1, 94, "not finite"
    out = np.full((6, 256), 7.0, np.float32)
    with pytest.raises(DecodeError) as ei:
        decode_rows(raw.view(dtype), out)
    assert (ei.value.row, ei.value.column) == (row, col)
    msg = str(ei.value)
    assert f"row {row} column {col}" in msg and text in msg
    assert np.all(out == 7.0)
    assert isinstance(ei.value, engram.EngramError) and isinstance(ei.value, ValueError)


def test_decode_error_overflow_boundary():
    # scale 254: 2^127 * 1.875 is the largest finite value; code 0x40 (2.0) overflows
    raw = make_row(0x3F, 254)
    assert decode_rows(raw)[0, 0] == np.float32(1.875 * 2.0**127)
    raw[0, 10] = 0x40
    with pytest.raises(DecodeError) as ei:
        decode_rows(raw)
    assert ei.value.column == 10


# ----------------------------------------------------------------------------- argument checks

@pytest.mark.parametrize("raw", [
    np.zeros(264, np.uint8),
    np.zeros((2, 263), np.uint8),
    np.zeros((2, 264, 1), np.uint8),
    np.zeros((2, 264), np.uint16),
    np.zeros((2, 264), np.float32),
    np.zeros((2, 528), np.uint8)[:, ::2],
    np.zeros((264, 2), np.uint8).T,
    [[0] * 264],
    b"\x00" * 264,
])
def test_decode_bad_arguments(raw):
    with pytest.raises(ArgumentError):
        decode_rows(raw)


def test_decode_one_dimensional_hint():
    with pytest.raises(ArgumentError, match=r"reshape\(1, 264\)"):
        decode_rows(make_row()[0])


def test_decode_bad_out():
    raw = make_row()
    for out in (np.zeros((1, 256), np.float64), np.zeros((2, 256), np.float32), np.zeros(256, np.float32),
                np.zeros((1, 512), np.float32)[:, ::2], [[0.0] * 256]):
        with pytest.raises(ArgumentError):
            decode_rows(raw, out)
    ro = np.zeros((1, 256), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ArgumentError, match="writable"):
        decode_rows(raw, ro)
    buf = np.zeros(2048, np.uint8)
    with pytest.raises(ArgumentError, match="overlaps"):
        decode_rows(buf[:264].reshape(1, 264), buf[256:1280].view(np.float32).reshape(1, 256))


def test_decode_out_and_readonly_input():
    raw = make_row(0x40, 130)  # 2 * 2^3
    raw.setflags(write=False)
    out = np.zeros((1, 256), np.float32)
    assert decode_rows(raw, out) is out
    assert np.all(out == 16.0)
    empty = decode_rows(np.zeros((0, 264), np.uint8))
    assert empty.shape == (0, 256) and empty.dtype == np.float32


def test_encode_limit():
    lim = np.float32(248 * 2.0**120)
    assert float(lim) == engram.codec.ENCODE_LIMIT
    below = np.nextafter(lim, np.float32(0))
    x = np.zeros((3, 256), np.float32)
    x[1, 40] = -below
    raw = encode_rows(x)
    assert raw[1, 256 + 1] == 247 and raw[1, 40] == 0xF7  # -240 * 2^120
    assert decode_rows(raw)[1, 40] == np.float32(-240 * 2.0**120)
    x[2, 7] = lim
    x[2, 9] = np.finfo(np.float32).max
    with pytest.raises(ArgumentError, match=r"x\[2, 7\]"):
        encode_rows(x)


def test_encode_bad_arguments():
    for x in (np.zeros((2, 256), np.float64), np.zeros(256, np.float32), np.zeros((2, 255), np.float32),
              [[0.0] * 256]):
        with pytest.raises(ArgumentError):
            encode_rows(x)
    for v in (np.nan, np.inf, -np.inf):
        x = np.zeros((5, 256), np.float32)
        x[3, 200] = v
        with pytest.raises(ArgumentError, match=r"x\[3, 200\]"):
            encode_rows(x)


# ----------------------------------------------------------------------------- encode

def test_encode_kat():
    x = np.zeros((1, 256), np.float32)
    x[0, :32] = 1.0           # amax 1 -> smallest s with 1 / 2^(s-127) <= 448 is 119 (2^-8 * 448 = 1.75)
    x[0, 32:64] = 448.0       # exactly representable at scale 127
    x[0, 64] = 448.5          # just above: next scale
    x[0, 96:128] = -3.0e38    # near the top of float32: 2^120 * 0.88 * 2^8 -> s = 247
    raw = encode_rows(x)
    assert raw[0, 256:].tolist() == [119, 127, 128, 247] + [ZERO_BLOCK_SCALE] * 4
    assert ZERO_BLOCK_SCALE == 0
    assert raw[0, 32] == 0x7E and raw[0, 0] == 0x78  # 448 and 256 (= 1 * 2^8)
    dec = decode_rows(raw)[0]
    assert np.all(dec[:64] == x[0, :64]) and dec[64] == 448.0 and np.all(dec[128:] == 0)


def _blocks(draw_scales, zero, rng):
    """float32 [n, 256] whose blocks have magnitudes 2^e for the given exponents."""
    n = len(draw_scales) // 8
    x = rng.standard_normal((n, 8, 32)) * np.exp2(np.array(draw_scales, dtype=np.float64).reshape(n, 8, 1))
    x[np.array(zero).reshape(n, 8)] = 0.0
    x = np.clip(x, -3.4e38, 3.4e38).astype(np.float32)
    return x.reshape(n, 256)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_round_trip_matches_ml_dtypes(data, n, seed):
    exps = data.draw(st.lists(st.one_of(st.integers(-150, -120), st.integers(-30, 30), st.integers(100, 127)),
                              min_size=8 * n, max_size=8 * n))
    zero = data.draw(st.lists(st.booleans(), min_size=8 * n, max_size=8 * n))
    ties = data.draw(st.lists(st.booleans(), min_size=8 * n, max_size=8 * n))
    rng = np.random.default_rng(seed)
    x = _blocks(exps, zero, rng)
    # blocks of exact E4M3 midpoints: amax 448 * 2^t fixes the scale at 127 + t
    for i in np.flatnonzero(ties):
        t = int(np.clip(exps[i], -120, 119))
        r, b = divmod(int(i), 8)
        j = rng.integers(0, 8, 31)
        e = rng.integers(-6, 8, 31)
        mid = np.where(rng.random(31) < 0.3, (2 * j + 1) / 1024.0, (1 + (2 * j + 1) / 16.0) * np.exp2(e))
        sign = np.where(rng.random(31) < 0.5, -1.0, 1.0)
        x[r, 32 * b] = np.float32(448.0 * 2.0**t)
        x[r, 32 * b + 1:32 * b + 32] = (sign * mid * 2.0**t).astype(np.float32)
    # sprinkle exact ties, signed zeros and subnormals
    x[rng.random(x.shape) < 0.02] = -0.0
    x[rng.random(x.shape) < 0.02] = np.float32(1e-40)
    over = np.abs(x) >= 248 * 2.0**120  # rounds to 2^128 at the largest scale
    if over.any():
        r, c = np.argwhere(over)[0]
        with pytest.raises(ArgumentError, match=rf"x\[{r}, {c}\].*2\^128"):
            encode_rows(x)
        x[over] = 0.0
    raw = encode_rows(x)
    ref_raw, ref_dec = encode_rows_reference(x)
    assert np.array_equal(raw, ref_raw)
    # the scale is the smallest with amax / 2^(s-127) <= 448
    amax = np.abs(x.astype(np.float64)).reshape(n, 8, 32).max(axis=2)
    s = raw[:, 256:].astype(np.float64)
    assert np.all(amax <= 448.0 * np.exp2(s - 127))
    assert np.all((s == 0) | (amax > 448.0 * np.exp2(s - 128)))
    for p in PATHS:
        prev = native.set_path(p)
        try:
            assert np.array_equal(bits(decode_rows(raw)), bits(ref_dec))
        finally:
            native.set_path(prev)


def test_encode_chunks_and_layout():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((70_000, 256)) * 0.02).astype(np.float32)
    raw = encode_rows(x)
    ref_raw, ref_dec = encode_rows_reference(x[-500:])
    assert raw.shape == (70_000, 264) and raw.flags.c_contiguous
    assert np.array_equal(raw[-500:], ref_raw)
    assert np.array_equal(encode_rows(np.asfortranarray(x[:100])), raw[:100])
    assert encode_rows(np.zeros((0, 256), np.float32)).shape == (0, 264)


# ----------------------------------------------------------------------------- bf16

def test_bf16_round_matches_bits_rule():
    rng = np.random.default_rng(4)
    b = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    b[:1000] = (b[:1000] & 0xFFFF0000) | 0x8000  # exact ties
    x = b.view(np.float32)
    x = x[np.isfinite(x)]
    x = x[np.abs(x) < 3.38e38]  # the bit rule would carry into infinity above the bf16 maximum
    assert np.array_equal(bits(bf16_round(x)), bits(bf16_bits_round_reference(x)))
    assert bf16_round(np.float32(1.00390625)) == 1.0  # tie to even
    assert bf16_round(np.float32(1.01171875)) == 1.015625
