"""The consumer of an Engram layer (SPEC §7): projection by engram_kv and the gated add.

The gated add is checked bit for bit against its NumPy twin (the documented precision,
tests/reference.py::gated_add_twin) on every arithmetic path, and against SPEC §7 read
literally in float64: gates within 1e-6, outputs equal to the bf16 rounding of the
float64 result except at near-ties (one bf16 ulp, exact value within the float32 error
of the rounding midpoint) and near-total cancellations of h and gate * v.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engram
from engram import ArgumentError, decode_rows, encode_rows
from engram import mixer
from engram._native import gate as native
from tests.reference import (bf16_round_float64_reference, bf16_round_nan_reference, first_non_finite_twin,
                       gated_add_float64, gated_add_twin, lane_sum_reference)

PATHS = native.paths()
U32 = 2.0**-24  # unit roundoff of float32
S4, W5120 = 4, 5120


@pytest.fixture(params=PATHS)
def path(request):
    prev = native.set_path(request.param)
    yield request.param
    native.set_path(prev)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def bf(x):
    return bf16_round_nan_reference(np.asarray(x, dtype=np.float32))


def same_bits(a, b):
    """Equal bit patterns, any NaN equal to any NaN."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(bits(a)[~na], bits(b)[~nb]))


def layer_inputs(rng, T, S=S4, W=W5120, h_scale=1.0, v_scale=1.0, corr=0.5, w_spread=0.1):
    """bf16 residual, keys correlated with it (gates over a wide range), a value, norm weights."""
    h = bf(rng.standard_normal((T, S, W)) * h_scale)
    kv = np.empty((T, S + 1, W), dtype=np.float32)
    mix = rng.uniform(-corr, corr, size=(T, S, 1))
    kv[:, :S] = mix * h / max(h_scale, 1e-300) + rng.standard_normal((T, S, W))
    kv[:, S] = rng.standard_normal((T, W)) * v_scale
    q_w = (1.0 + w_spread * rng.standard_normal((S, W))).astype(np.float32)
    k_w = (1.0 + w_spread * rng.standard_normal((S, W))).astype(np.float32)
    return h, kv, q_w, k_w


def run(h, kv, q_w, k_w, eps, mask=None):
    r = h.copy()
    g = np.full(h.shape[:2], -1.0, dtype=np.float32)
    engram.gated_add(r, kv, q_w, k_w, eps, mask, gates_out=g)
    return r, g


def run_kernel(h, kv, q_w, k_w, eps, mask=None):
    """The gate kernel alone (no argument or finiteness checks): for its IEEE handling of non-finite values."""
    r = h.copy()
    g = np.full(h.shape[:2], -1.0, dtype=np.float32)
    m8 = None if mask is None else np.ascontiguousarray(mask, dtype=np.uint8)
    native.gated_add_into(r, np.ascontiguousarray(kv), q_w, k_w, eps, m8, g)
    return r, g


def non_finite_message(name, a, mask, axes):
    """The message the finiteness check gives for ``a``, from the twin's index (None when all is finite)."""
    idx = first_non_finite_twin(a, mask)
    if idx is None:
        return None
    where = ", ".join(f"{ax} {i}" for ax, i in zip(axes, idx))
    return (f"{name}[{', '.join(map(str, idx))}] = {float(a[idx])} ({where}): {name} must be finite; "
            f"residual and gates_out are untouched")


def ordered16(x):
    """bf16-valued float32 (or +-inf) -> integers in value order (adjacent bf16 values differ by 1)."""
    b = (bits(x) >> 16).astype(np.int64)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def check_against_float64(out, gates, h, kv, q_w, k_w, eps, mask=None):
    """Compare a gated add with SPEC §7 in float64; returns (near-ties, cancellations).

    The kernel forms F = fl32(h + fl32(g32 * v)) with g32 = float32(gate), so
    |F - E| <= errF = 2.5u |G v| + 2^-150 |v| + u |E| (+ float32 subnormal slack)
    around the exact E = h + G v (2^-150 |v|: a gate below 2^-126 is a float32
    subnormal).  bf16(F) differs from bf16(E) only when a rounding midpoint lies
    between them: a near-tie (one ulp apart, E within errF of the midpoint) or, when
    |E| is tiny against |G v| (cancellation) or the gate is subnormal, by more (still
    within errF + half an ulp of E).
    """
    E, G = gated_add_float64(h, kv, q_w, k_w, eps, mask)
    ref = bf16_round_float64_reference(E).astype(np.float32)
    finite = np.isfinite(G)
    assert np.array_equal(finite, np.isfinite(gates))
    gerr = np.abs(gates.astype(np.float64) - G)[finite]
    assert gerr.size == 0 or gerr.max() <= 1e-6, f"gate error {gerr.max():g}"
    S = h.shape[1]
    v = bf(kv[:, S]).astype(np.float64)
    Gv = np.abs(G[:, :, None] * v[:, None, :])
    ok = np.isfinite(E) & np.isfinite(Gv)
    errF = 2.5 * U32 * Gv + 2.0**-150 * np.abs(v)[:, None, :] + (U32 + 1e-15) * np.abs(E) + 2.0**-147

    differ = ok & (out != ref)
    ulps = np.abs(ordered16(out) - ordered16(ref))
    as64 = lambda x: np.clip(x.astype(np.float64), -(2.0**128), 2.0**128)  # inf -> 2^128
    mid = (as64(out) + as64(ref)) / 2

    tie = differ & (ulps == 1)
    assert np.all(np.abs(E - mid)[tie] <= errF[tie]), "a one-ulp difference that is not a near-tie"
    far = differ & (ulps > 1)
    if far.any():
        cancel = np.abs(E) <= 2.0**-12 * Gv
        tiny_gate = np.broadcast_to((G < 2.0**-126)[:, :, None], E.shape)
        assert np.all((cancel | tiny_gate)[far]), "a multi-ulp difference without cancellation"
        slack = errF + 2.0**-8 * np.maximum(np.abs(as64(out)), np.abs(E)) + 2.0**-133
        assert np.all(np.abs(as64(out) - E)[far] <= slack[far])
    return int(tie.sum()), int(far.sum())


# ----------------------------------------------------------------------------- gated add: exactness

def test_paths_listed():
    assert PATHS[0] == "portable"
    assert native.get_path() == PATHS[-1]
    assert mixer.gate_path() in PATHS
    assert native.LANES == 16
    with pytest.raises(ArgumentError, match="not available"):
        native.set_path("sse9")


def test_bit_exact_vs_twin(path):
    rng = np.random.default_rng(7)
    h, kv, q_w, k_w = layer_inputs(rng, 6)
    out, gates = run(h, kv, q_w, k_w, 1e-6)
    tw, tg = gated_add_twin(h, kv, q_w, k_w, 1e-6)
    assert np.array_equal(bits(out), bits(tw))
    assert np.array_equal(bits(gates), bits(tg))
    assert np.array_equal(out, bf(out))  # outputs are bf16 values
    assert not np.array_equal(out, h)


def test_threads_give_the_same_bits():
    rng = np.random.default_rng(8)
    h, kv, q_w, k_w = layer_inputs(rng, 20)  # 409,600 values: above the threading threshold
    prev = native.set_threads(1)
    try:
        one = run(h, kv, q_w, k_w, 1e-5)
        native.set_threads(2)
        two = run(h, kv, q_w, k_w, 1e-5)
    finally:
        native.set_threads(prev)
    assert np.array_equal(bits(one[0]), bits(two[0])) and np.array_equal(bits(one[1]), bits(two[1]))
    with pytest.raises(ArgumentError):
        native.set_threads(0)


def test_vs_float64_spec_reference():
    rng = np.random.default_rng(11)
    T = 16
    h, kv, q_w, k_w = layer_inputs(rng, T, corr=3.0)
    out, gates = run(h, kv, q_w, k_w, 1e-6)
    # the gates cover most of (0, 1) and both signs of the dot
    assert gates.min() < 0.2 and gates.max() > 0.8
    ties, cancels = check_against_float64(out, gates, h, kv, q_w, k_w, 1e-6)
    n = out.size
    E, _ = gated_add_float64(h, kv, q_w, k_w, 1e-6)
    exact = int(np.sum(out == bf16_round_float64_reference(E)))
    assert exact + ties + cancels == n
    # rare: about 3e-5 of the values here (10 of 327,680)
    assert 0 < ties + cancels <= n * 2e-4, (ties, cancels)


def test_bf16_rounding_rule():
    # every sign/exponent/high mantissa with a set of low halves around the rounding point
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000], dtype=np.uint32)
    x = (hi[:, None] | lows[None, :]).ravel().view(np.float32)
    got = np.empty_like(x)
    native.bf16_round_into(x, got)
    assert np.array_equal(bits(got), bits(bf16_round_nan_reference(x)))
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got), nan)  # a NaN never becomes inf or -0
    ml = x[~nan].astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(bits(got[~nan]), bits(ml))
    # the SPEC §5 bit rule for every non-NaN value
    b = bits(x[~nan]).astype(np.uint64)
    spec = (((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF).astype(np.uint32)
    assert np.array_equal(bits(got[~nan]), spec)


def test_lane_sum_reference_is_the_documented_order():
    rng = np.random.default_rng(3)
    for W in (1, 15, 16, 17, 100):
        t = rng.standard_normal(W) * 10.0 ** rng.integers(-8, 8, W)
        p = [0.0] * 16
        for i in range(W):
            p[i % 16] += float(t[i])
        n = 8
        while n:
            for j in range(n):
                p[j] += p[j + n]
            n //= 2
        assert lane_sum_reference(t) == p[0]


# ----------------------------------------------------------------------------- gated add: semantics

def test_mask_skips_positions(path):
    rng = np.random.default_rng(12)
    h, kv, q_w, k_w = layer_inputs(rng, 9)
    mask = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1], dtype=bool)
    out, gates = run(h, kv, q_w, k_w, 1e-6, mask)
    assert np.array_equal(bits(out[~mask]), bits(h[~mask]))
    assert np.all(gates[~mask] == 0.0)
    full, full_g = run(h, kv, q_w, k_w, 1e-6)
    assert np.array_equal(bits(out[mask]), bits(full[mask]))
    assert np.array_equal(bits(gates[mask]), bits(full_g[mask]))
    tw, tg = gated_add_twin(h, kv, q_w, k_w, 1e-6, mask)
    assert np.array_equal(bits(out), bits(tw)) and np.array_equal(bits(gates), bits(tg))
    # all masked: nothing changes; a list of bools works as mask
    out2, g2 = run(h, kv, q_w, k_w, 1e-6, [False] * 9)
    assert np.array_equal(bits(out2), bits(h)) and not g2.any()


def test_known_gates_from_cosine():
    """k = +-h, unit weights, eps 0: dot = +-sqrt(W), gate = sigmoid(+-W^(1/4))."""
    rng = np.random.default_rng(13)
    W = 5120
    h = bf(rng.standard_normal((2, 2, W)))
    kv = np.zeros((2, 3, W), np.float32)
    kv[:, 0] = h[:, 0]
    kv[:, 1] = -h[:, 1]
    kv[:, 2] = 1.0
    ones = np.ones((2, W), np.float32)
    out, gates = run(h, kv, ones, ones, 0.0)
    up = 1.0 / (1.0 + math.exp(-(W ** 0.25)))
    assert np.allclose(gates[:, 0], up, rtol=0, atol=1e-7)
    assert np.allclose(gates[:, 1], 1.0 - up, rtol=0, atol=1e-7)
    assert gates[0, 1] < 0.5 < gates[0, 0]
    assert np.array_equal(out[:, 0], bf(h[:, 0] + gates[:, 0, None] * np.float32(1.0)))


def test_zero_vectors_give_dot_zero():
    """All-zero k (any eps) or all-zero h with eps = 0: dot 0, gate sigmoid(sqrt(1e-6))."""
    rng = np.random.default_rng(14)
    W = 256
    h = bf(rng.standard_normal((2, 2, W)))
    h[1] = 0.0
    kv = rng.standard_normal((2, 3, W)).astype(np.float32)
    kv[0, 1] = 0.0
    ones = np.ones((2, W), np.float32)
    g0 = np.float32(1.0 / (1.0 + math.exp(-1e-3)))
    for eps in (0.0, 1e-6):
        out, gates = run(h, kv, ones, ones, eps)
        assert gates[0, 1] == g0 and gates[1, 0] == g0 and gates[1, 1] == g0
        v = bf(kv[1, 2])
        assert np.array_equal(bits(out[1, 0]), bits(bf(np.float32(0.0) + g0 * v)))
        tw, tg = gated_add_twin(h, kv, ones, ones, eps)
        assert np.array_equal(bits(out), bits(tw)) and np.array_equal(bits(gates), bits(tg))


def test_saturated_gates():
    """Huge norm weights: |dot| ~ sqrt(W) 1e8, gate exactly 1 (h + v) or 0 (h unchanged)."""
    rng = np.random.default_rng(15)
    W = 5120
    h = bf(rng.standard_normal((3, 2, W)))
    kv = np.empty((3, 3, W), np.float32)
    kv[:, 0] = h[:, 0]
    kv[:, 1] = -h[:, 1]
    kv[:, 2] = rng.standard_normal((3, W))
    w = np.full((2, W), 1e4, np.float32)
    out, gates = run(h, kv, w, w, 1e-6)
    assert np.all(gates[:, 0] == 1.0) and np.all(gates[:, 1] == 0.0)
    assert np.array_equal(bits(out[:, 0]), bits(bf(h[:, 0] + bf(kv[:, 2]))))
    assert np.array_equal(bits(out[:, 1]), bits(h[:, 1]))
    tw, tg = gated_add_twin(h, kv, w, w, 1e-6)
    assert np.array_equal(bits(out), bits(tw)) and np.array_equal(bits(gates), bits(tg))


@pytest.mark.parametrize("h_scale,v_scale", [(2.0**-130, 2.0**-130), (2.0**-140, 1.0), (1.0, 2.0**-135),
                                             (3.3e38, 3.3e38), (3.3e38, 1.0), (1e30, 1e-30)])
def test_extreme_magnitudes(path, h_scale, v_scale):
    """bf16 subnormals and values near the bf16 maximum (overflow to +-inf): twin bits and float64."""
    rng = np.random.default_rng(16)
    T, W = 3, W5120
    h = bf(rng.uniform(-1, 1, (T, S4, W)) * h_scale)  # |h| up to 3.3e38, below the bf16 maximum 3.39e38
    kv = np.empty((T, S4 + 1, W), np.float32)
    kv[:, :S4] = h.astype(np.float64) / h_scale * rng.uniform(-1, 1, (T, S4, 1)) + rng.uniform(-1, 1, (T, S4, W))
    kv[:, S4] = rng.uniform(-1, 1, (T, W)) * v_scale
    q_w = (1.0 + 0.1 * rng.standard_normal((S4, W))).astype(np.float32)
    k_w = np.ones((S4, W), np.float32)
    assert np.all(np.isfinite(h)) and np.all(np.isfinite(kv))
    out, gates = run(h, kv, q_w, k_w, 1e-6)
    tw, tg = gated_add_twin(h, kv, q_w, k_w, 1e-6)
    assert np.array_equal(bits(out), bits(tw)) and np.array_equal(bits(gates), bits(tg))
    check_against_float64(out, gates, h, kv, q_w, k_w, 1e-6)
    if h_scale > 1e38 and v_scale > 1e38:
        assert np.isinf(out).any() and np.isfinite(out).any()  # bf16 overflow happens, as +-inf
        E, _ = gated_add_float64(h, kv, q_w, k_w, 1e-6)
        big = np.abs(E) >= 2.0**128
        assert np.all(np.isinf(out[big]))


def test_non_finite_inputs_propagate_in_the_kernel(path):
    """The kernel alone (gated_add refuses such inputs first): NaN/inf in h or k poison that stream (gate
    NaN), inf in v the matching outputs; the twin gives the same bits."""
    rng = np.random.default_rng(17)
    h, kv, q_w, k_w = layer_inputs(rng, 3, W=64)
    h[0, 1, 5] = np.nan
    h[1, 2, 0] = np.inf
    kv[2, 3, 7] = np.nan
    kv[1, S4, 9] = -np.inf
    kv[2, S4, 10] = np.float32(np.nan)
    out, gates = run_kernel(h, kv, q_w, k_w, 1e-6)
    tw, tg = gated_add_twin(h, kv, q_w, k_w, 1e-6)
    assert same_bits(out, tw) and same_bits(gates, tg)
    assert np.isnan(gates[0, 1]) and np.isnan(gates[1, 2]) and np.isnan(gates[2, 3])
    assert np.all(np.isnan(out[0, 1])) and np.all(np.isnan(out[1, 2])) and np.all(np.isnan(out[2, 3]))
    assert np.all(np.isfinite(gates[0, [0, 2, 3]]))
    assert np.all(np.isneginf(out[1, [0, 1, 3], 9]))
    assert np.all(np.isnan(out[2, :, 10]))
    finite = np.isfinite(out)
    assert finite.sum() == out.size - 3 * 64 - 3 - 3  # nothing else touched by the non-finite values


def test_non_finite_inputs_are_refused(path):
    """A NaN or infinity in residual or kv at a kept token: ArgumentError naming the array, token, stream (or
    part of kv) and column of the first one; residual and gates_out untouched.  Masked-off tokens are not read."""
    rng = np.random.default_rng(21)
    h, kv, q_w, k_w = layer_inputs(rng, 3, W=64)
    cases = [("residual", (1, 2, 63), np.nan, "residual[1, 2, 63] = nan (token 1, stream 2, column 63)"),
             ("residual", (0, 0, 0), np.inf, "residual[0, 0, 0] = inf (token 0, stream 0, column 0)"),
             ("kv", (2, 3, 7), -np.inf, "kv[2, 3, 7] = -inf (token 2, part 3, column 7)"),
             ("kv", (0, S4, 9), np.nan, "kv[0, 4, 9] = nan (token 0, part 4, column 9)")]
    for name, idx, value, where in cases:
        hh, kk = h.copy(), kv.copy()
        (hh if name == "residual" else kk)[idx] = value
        before, gates = hh.copy(), np.full((3, S4), -1.0, np.float32)
        with pytest.raises(ArgumentError) as e:
            engram.gated_add(hh, kk, q_w, k_w, 1e-6, gates_out=gates)
        assert str(e.value) == f"{where}: {name} must be finite; residual and gates_out are untouched"
        assert str(e.value) == non_finite_message(name, hh if name == "residual" else kk, None,
                                                  ("token", "stream" if name == "residual" else "part", "column"))
        assert np.array_equal(hh, before, equal_nan=True) and np.all(gates == -1)
    # the first in C order is named when there are several
    hh = h.copy()
    hh[2, 0, 1], hh[1, 3, 50] = np.nan, np.inf
    with pytest.raises(ArgumentError, match=r"^residual\[1, 3, 50\] = inf \(token 1, stream 3, column 50\)"):
        engram.gated_add(hh, kv, q_w, k_w, 1e-6)
    # a masked-off token is not read: its NaN is allowed, and left as it was
    hh, kk = h.copy(), kv.copy()
    hh[1, 0, 3], kk[1, S4, 4] = np.nan, np.inf
    mask = np.array([True, False, True])
    out, gates = run(hh, kk, q_w, k_w, 1e-6, mask)
    tw, tg = gated_add_twin(hh, kk, q_w, k_w, 1e-6, mask)
    assert same_bits(out, tw) and same_bits(gates, tg) and np.isnan(out[1, 0, 3]) and np.all(np.isfinite(gates))


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 4), S=st.integers(1, 4), W=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       n_bad=st.integers(1, 4), use_mask=st.booleans())
def test_property_first_non_finite_is_named(T, S, W, seed, n_bad, use_mask):
    """Random NaN/inf positions in residual and kv, random masks: the error names what the loop twin finds
    first (residual before kv), or the call succeeds when every one lies in a masked-off token."""
    rng = np.random.default_rng(seed)
    h, kv, q_w, k_w = layer_inputs(rng, T, S=S, W=W)
    for _ in range(n_bad):
        a = h if rng.random() < 0.5 else kv
        a[tuple(int(rng.integers(0, d)) for d in a.shape)] = rng.choice([np.nan, np.inf, -np.inf])
    mask = rng.random(T) < 0.5 if use_mask else None
    want = (non_finite_message("residual", h, mask, ("token", "stream", "column"))
            or non_finite_message("kv", kv, mask, ("token", "part", "column")))
    r, gates = h.copy(), np.full((T, S), -1.0, np.float32)
    if want is None:
        engram.gated_add(r, kv, q_w, k_w, 1e-6, mask, gates_out=gates)
        tw, tg = gated_add_twin(h, kv, q_w, k_w, 1e-6, mask)
        assert same_bits(r, tw) and same_bits(gates, tg)
    else:
        with pytest.raises(ArgumentError) as e:
            engram.gated_add(r, kv, q_w, k_w, 1e-6, mask, gates_out=gates)
        assert str(e.value) == want
        assert np.array_equal(r, h, equal_nan=True) and np.all(gates == -1)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(0, 5), S=st.integers(0, 5), W=st.integers(1, 200), seed=st.integers(0, 2**32 - 1),
       h_exp=st.integers(-135, 120), v_exp=st.integers(-135, 120), k_exp=st.integers(-135, 120),
       w_exp=st.integers(-20, 20), eps=st.sampled_from([0.0, 1e-6, 1e-2, 10.0, float(np.float32(1e-5))]),
       use_mask=st.booleans(), path_i=st.integers(0, 2))
def test_property_random_shapes(T, S, W, seed, h_exp, v_exp, k_exp, w_exp, eps, use_mask, path_i):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore", invalid="ignore"):  # large exponents may make inputs infinite or NaN: allowed
        h = bf(rng.standard_normal((T, S, W)) * 2.0**h_exp)
        kv = (rng.standard_normal((T, S + 1, W)) * 2.0**k_exp).astype(np.float32)
        kv[:, S] = (rng.standard_normal((T, W)) * 2.0**v_exp).astype(np.float32)
        if S and T:
            kv[:, :S] += (h * (rng.uniform(-1, 1) * 2.0 ** (k_exp - h_exp))).astype(np.float32)
    q_w = (rng.standard_normal((S, W)) * 2.0**w_exp).astype(np.float32)
    k_w = rng.standard_normal((S, W)).astype(np.float32)
    mask = rng.random(T) < 0.7 if use_mask else None
    refused = first_non_finite_twin(h, mask) is not None or first_non_finite_twin(kv, mask) is not None
    if refused:  # gated_add refuses it untouched; the kernel's IEEE handling is still compared below
        r = h.copy()
        with pytest.raises(ArgumentError, match="must be finite"):
            engram.gated_add(r, kv, q_w, k_w, eps, mask)
        assert np.array_equal(r, h, equal_nan=True)
    prev = native.set_path(PATHS[min(path_i, len(PATHS) - 1)])
    try:
        out, gates = (run_kernel if refused else run)(h, kv, q_w, k_w, eps, mask)
    finally:
        native.set_path(prev)
    tw, tg = gated_add_twin(h, kv, q_w, k_w, eps, mask)
    assert same_bits(out, tw) and same_bits(gates, tg)
    if mask is not None:
        assert np.array_equal(bits(out[~mask]), bits(h[~mask]))
    # SPEC §7 read literally is 0/0 for an all-zero h or bf16(k) with eps = 0 (the kernel's
    # choice there, dot 0, is test_zero_vectors_give_dot_zero's subject)
    zero_vector = np.any(~np.any(h != 0, axis=2)) or np.any(~np.any(bf(kv[:, :S]) != 0, axis=2))
    if np.all(np.isfinite(kv)) and (eps > 0 or not zero_vector):
        check_against_float64(out, gates, h, kv, q_w, k_w, eps, mask)


# ----------------------------------------------------------------------------- gated add: arguments

def _bad_gated_add_calls():
    T, S, W = 3, 2, 32
    rng = np.random.default_rng(18)
    h = bf(rng.standard_normal((T, S, W)))
    kv = rng.standard_normal((T, S + 1, W)).astype(np.float32)
    w = np.ones((S, W), np.float32)
    big = np.zeros((T, S, 2 * W), np.float32)
    cases = {
        "residual float64": dict(residual=h.astype(np.float64)),
        "residual 2-D": dict(residual=h.reshape(T, S * W)),
        "residual list": dict(residual=h.tolist()),
        "residual non-contiguous": dict(residual=big[:, :, ::2]),
        "residual read-only": dict(residual="readonly"),
        "kv shape": dict(kv=kv[:, :S]),
        "kv dtype": dict(kv=kv.astype(np.float16)),
        "kv width": dict(kv=np.zeros((T, S + 1, W + 1), np.float32)),
        "q_w shape": dict(q_w=np.ones((S + 1, W), np.float32)),
        "k_w dtype": dict(k_w=np.ones((S, W), np.float64)),
        "mask length": dict(mask=np.ones(T + 1, bool)),
        "mask dtype": dict(mask=np.ones(T, np.float32)),
        "mask entry 2": dict(mask=np.full(T, 2, np.int8)),
        "mask 2-D": dict(mask=np.ones((T, 1), bool)),
        "eps nan": dict(eps=float("nan")),
        "eps inf": dict(eps=float("inf")),
        "eps negative": dict(eps=-1e-6),
        "eps bool": dict(eps=True),
        "eps string": dict(eps="1e-6"),
        "gates_out shape": dict(gates_out=np.zeros((T, S + 1), np.float32)),
        "gates_out dtype": dict(gates_out=np.zeros((T, S), np.float64)),
        "gates_out read-only": dict(gates_out="readonly"),
        "gates_out overlaps residual": dict(gates_out="alias"),
        "residual overlaps kv": dict(kv="alias"),
        "width zero": dict(residual=np.zeros((T, S, 0), np.float32), kv=np.zeros((T, S + 1, 0), np.float32),
                           q_w=np.zeros((S, 0), np.float32), k_w=np.zeros((S, 0), np.float32)),
    }
    for name, change in cases.items():
        args = dict(residual=h.copy(), kv=kv, q_w=w, k_w=w, eps=1e-6, mask=None,
                    gates_out=np.full((T, S), 7.0, np.float32))
        args.update(change)
        if isinstance(args["residual"], str):
            args["residual"] = h.copy()
            args["residual"].flags.writeable = False
        if isinstance(args["gates_out"], str):
            if args["gates_out"] == "readonly":
                args["gates_out"] = np.full((T, S), 7.0, np.float32)
                args["gates_out"].flags.writeable = False
            else:
                args["gates_out"] = args["residual"][:, :, 0]
                args["residual"] = args["residual"]
        if isinstance(args["kv"], str):
            buf = np.zeros((T, S + 1, W), np.float32)
            args["residual"] = buf[:, :S]
            buf[:] = kv
            args["kv"] = buf
        yield name, args


@pytest.mark.parametrize("name,args", list(_bad_gated_add_calls()), ids=lambda x: x if isinstance(x, str) else "")
def test_argument_errors_leave_residual_untouched(name, args):
    res = args["residual"]
    before = np.array(res, copy=True)
    gates_before = np.array(args["gates_out"], copy=True)
    with pytest.raises(ArgumentError) as err:
        engram.gated_add(args["residual"], args["kv"], args["q_w"], args["k_w"], args["eps"], args["mask"],
                         gates_out=args["gates_out"])
    assert np.array_equal(np.asarray(res), before, equal_nan=True)
    assert np.array_equal(args["gates_out"], gates_before)
    word = name.split()[0]
    if word != "width":
        assert word in str(err.value)


def test_argument_error_messages_name_shapes():
    h = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ArgumentError, match=r"kv must have shape \[2, 5, 8\].*got \[2, 4, 8\]"):
        engram.gated_add(h, np.zeros((2, 4, 8), np.float32), np.ones((4, 8), np.float32),
                         np.ones((4, 8), np.float32), 1e-6)


def test_empty_and_non_contiguous_inputs():
    rng = np.random.default_rng(19)
    h, kv, q_w, k_w = layer_inputs(rng, 4, W=48)
    # no tokens / no streams: nothing to do
    engram.gated_add(h[:0].copy(), kv[:0], q_w, k_w, 1e-6)
    engram.gated_add(np.zeros((2, 0, 48), np.float32), np.zeros((2, 1, 48), np.float32),
                     np.zeros((0, 48), np.float32), np.zeros((0, 48), np.float32), 1e-6)
    # strided kv and weights are copied, with the same result
    kv_f = np.asfortranarray(kv)
    qw_s = np.repeat(q_w, 2, axis=1)[:, ::2]
    a, ga = run(h, kv, q_w, k_w, 1e-6)
    b, gb = run(h, kv_f, qw_s, k_w, 1e-6)
    assert np.array_equal(bits(a), bits(b)) and np.array_equal(bits(ga), bits(gb))
    # gates_out is optional; numpy scalars work as eps
    r = h.copy()
    assert engram.gated_add(r, kv, q_w, k_w, np.float32(1e-6)) is None
    assert np.array_equal(bits(r), bits(a))


# ----------------------------------------------------------------------------- projection

def make_rows(rng, T, columns=24, width=256):
    """Rows as the engine sees them: encoded to e4m3_e8m0_32_row264 and decoded (bf16 values)."""
    x = (rng.standard_normal((T * columns, width)) * 0.05).astype(np.float32)
    return decode_rows(encode_rows(x)).reshape(T, columns, width)


def make_kv_f16(rng, n_out, n_in):
    """Random finite F16 weights straight from random bits (|w| < 2)."""
    b = rng.integers(0, 1 << 16, size=(n_out, n_in), dtype=np.uint16) & np.uint16(0xBFFF)
    return b.view(np.float16)


def check_projection(out, rows, w32, cols=None):
    """out vs float64 einsum within the float32 accumulation bound gamma_n * sum |a b|."""
    T, parts, dim = out.shape
    a = rows.reshape(T, -1).astype(np.float64)
    sel = np.arange(parts * dim) if cols is None else cols
    w = w32[sel].astype(np.float64)
    ref = np.einsum("ti,oi->to", a, w)
    mag = np.einsum("ti,oi->to", np.abs(a), np.abs(w))
    n = a.shape[1]
    gamma = n * U32 / (1 - n * U32)
    got = out.reshape(T, -1)[:, sel].astype(np.float64)
    err = np.abs(got - ref)
    assert np.all(err <= gamma * mag), float((err / np.maximum(mag, 1e-300)).max())
    return float((err / np.maximum(mag, 1e-300)).max())


def test_kv_weights_exact_conversion():
    rng = np.random.default_rng(20)
    w16 = make_kv_f16(rng, 50, 30)
    w32 = mixer.kv_weights(w16)
    assert w32.dtype == np.float32 and w32.flags.c_contiguous and w32.shape == (50, 30)
    assert np.array_equal(w32, w16.astype(np.float32))
    # a strided source (e.g. a transposed view) converts the same
    assert np.array_equal(mixer.kv_weights(w16.T), w16.T.astype(np.float32))
    with pytest.raises(ArgumentError, match="float16"):
        mixer.kv_weights(w32)
    with pytest.raises(ArgumentError, match="dimensions"):
        mixer.kv_weights(w16.reshape(-1))


@pytest.mark.parametrize("T,S,columns,width,dim", [(1, 4, 24, 256, 64), (7, 4, 24, 256, 40),
                                                   (5, 2, 3, 16, 11), (0, 4, 24, 256, 8), (3, 1, 1, 1, 1)])
def test_project_small_shapes(T, S, columns, width, dim):
    rng = np.random.default_rng(21)
    rows = make_rows(rng, T, columns, width) if width == 256 else \
        bf(rng.standard_normal((T, columns, width)))
    w32 = mixer.kv_weights(make_kv_f16(rng, (S + 1) * dim, columns * width))
    out = engram.project(rows, w32, streams=S)
    assert out.shape == (T, S + 1, dim) and out.dtype == np.float32
    if T:
        check_projection(out, rows, w32)
    plain = np.matmul(rows.reshape(T, columns * width), w32.T).reshape(T, S + 1, dim)
    assert np.array_equal(bits(out), bits(plain))
    buf = np.full((T, S + 1, dim), np.nan, np.float32)
    assert engram.project(rows, w32, out=buf, streams=S) is buf
    assert np.array_equal(bits(buf), bits(out))


def test_project_v41_shapes():
    """The real sizes: engram_kv [25600, 6144] F16 -> float32; keys then value per token."""
    rng = np.random.default_rng(22)
    T = 3
    # 6400 random F16 rows, each output row one of them at random (random bits for all
    # 157M weights would take most of this test's time)
    w16 = make_kv_f16(rng, 6400, 24 * 256)[rng.integers(0, 6400, 5 * 5120)]
    w32 = mixer.kv_weights(w16)
    assert w32.shape == (25600, 6144)
    rows = make_rows(rng, T)
    out = np.empty((T, 5, 5120), np.float32)
    engram.project(rows, w32, out=out)
    cols = rng.choice(25600, size=600, replace=False)
    check_projection(out, rows, w32, cols)
    # part p of token t is w32[p*5120:(p+1)*5120] @ rows[t].ravel(): keys 0..3, then the value
    t = 2
    for p in range(5):
        blk = w32[p * 5120:(p + 1) * 5120]
        ref = blk.astype(np.float64) @ rows[t].ravel().astype(np.float64)
        mag = np.abs(blk).astype(np.float64) @ np.abs(rows[t].ravel()).astype(np.float64)
        assert np.all(np.abs(out[t, p] - ref) <= 6144 * U32 * mag)
    assert np.array_equal(bits(out), bits(np.matmul(rows.reshape(T, -1), w32.T).reshape(T, 5, 5120)))


def test_project_then_gated_add_pipeline():
    """Decoded rows -> project -> gated add equals the twins chained, for a masked prompt."""
    rng = np.random.default_rng(23)
    T, dim = 6, 512
    rows = make_rows(rng, T)
    w32 = mixer.kv_weights(make_kv_f16(rng, 5 * dim, 24 * 256)) * np.float32(0.05)
    kv = engram.project(rows, w32)
    h = bf(rng.standard_normal((T, 4, dim)))
    q_w = np.ones((4, dim), np.float32)
    mask = np.array([0, 1, 1, 1, 1, 0], bool)
    out, gates = run(h, kv, q_w, q_w, 1e-6, mask)
    tw, tg = gated_add_twin(h, np.matmul(rows.reshape(T, -1), w32.T).reshape(T, 5, dim), q_w, q_w, 1e-6, mask)
    assert np.array_equal(bits(out), bits(tw)) and np.array_equal(bits(gates), bits(tg))
    check_against_float64(out, gates, h, kv, q_w, q_w, 1e-6, mask)


def _bad_project_calls():
    rng = np.random.default_rng(24)
    T = 2
    rows = bf(rng.standard_normal((T, 3, 4)))
    w = np.ones((10, 12), np.float32)
    good_out = lambda: np.full((T, 5, 2), 7.0, np.float32)
    ro = good_out()
    ro.flags.writeable = False
    wide = np.zeros((T, 5, 4), np.float32)
    return {
        "rows float64": dict(rows=rows.astype(np.float64)),
        "rows 2-D": dict(rows=rows.reshape(T, 12)),
        "rows non-contiguous": dict(rows=np.repeat(rows, 2, axis=2)[:, :, ::2]),
        "w_kv float64": dict(w_kv=w.astype(np.float64)),
        "w_kv in features": dict(w_kv=np.ones((10, 13), np.float32)),
        "w_kv out features": dict(w_kv=np.ones((11, 12), np.float32)),
        "w_kv non-contiguous": dict(w_kv=np.ones((12, 10), np.float32).T),
        "out shape": dict(out=np.zeros((T, 5, 3), np.float32)),
        "out dtype": dict(out=np.zeros((T, 5, 2), np.float64)),
        "out read-only": dict(out=ro),
        "out non-contiguous": dict(out=wide[:, :, ::2]),
        "out overlaps rows": dict(out="alias"),
        "streams zero": dict(streams=0),
        "streams bool": dict(streams=True),
    }, rows, w, good_out


@pytest.mark.parametrize("name", list(_bad_project_calls()[0]))
def test_project_argument_errors(name):
    cases, rows, w, good_out = _bad_project_calls()
    args = dict(rows=rows, w_kv=w, out=good_out(), streams=4)
    args.update(cases[name])
    if isinstance(args["out"], str):
        buf = np.zeros(100, np.float32)
        args["rows"] = buf[:24].reshape(2, 3, 4)
        args["out"] = buf[4:24].reshape(2, 5, 2)
    before = args["out"].copy()
    with pytest.raises(ArgumentError) as err:
        engram.project(args["rows"], args["w_kv"], out=args["out"], streams=args["streams"])
    assert np.array_equal(args["out"], before, equal_nan=True)
    assert name.split()[0] in str(err.value)


# ====================================================================== F16 projection kernel
from engram._native import project as f16_native  # noqa: E402

F16_PATHS = f16_native.paths()


@pytest.fixture(params=F16_PATHS)
def f16_path(request):
    prev = f16_native.set_path(request.param)
    yield request.param
    f16_native.set_path(prev)


def project_f16_twin(x, w16):
    """NumPy twin of the F16 kernel (engram/_native/project_simd.h), bit for bit: float32 [T, n_out].

    Input i goes to partial sum i % 64 in increasing i (float32 product, then float32 sum),
    then p[j] += p[j + s] for s = 32, 16, 8, 4, 2, 1.  Zero padding past n_in adds +0.0 to
    sums that never are -0.0 (they start at +0.0), so it changes no bit.
    """
    lanes = 64
    T, n = x.shape
    w = w16.astype(np.float32)  # exact
    nb = -(-n // lanes)
    out = np.empty((T, w.shape[0]), np.float32)
    for t in range(T):
        prod = np.zeros((w.shape[0], nb * lanes), np.float32)
        prod[:, :n] = w * x[t]
        p = np.zeros((w.shape[0], lanes), np.float32)
        for c in range(nb):
            p = p + prod[:, c * lanes:(c + 1) * lanes]
        s = lanes // 2
        while s:
            p[:, :s] = p[:, :s] + p[:, s:2 * s]
            s //= 2
        out[t] = p[:, 0]
    return out


def _f16_project(x, w16):
    out = np.full((x.shape[0], w16.shape[0]), np.nan, np.float32)
    f16_native.f16_project_into(w16.view(np.uint16), x, out)
    return out


@pytest.mark.parametrize("T,n_out,n_in", [(1, 40, 64), (1, 33, 6144), (2, 17, 128), (3, 9, 100), (4, 5, 12),
                                          (5, 11, 200), (9, 7, 6144 + 7), (6, 37, 3000), (1, 3, 1), (2, 4, 0)])
def test_f16_kernel_equals_twin_on_every_path(f16_path, T, n_out, n_in):
    """General float32 inputs (not bf16, magnitudes spread over 2^+-20): products round, so a fused
    multiply-add anywhere, or another summation order, would change bits."""
    rng = np.random.default_rng(T * 1000 + n_in)
    x = (rng.standard_normal((T, n_in)) * 2.0 ** rng.integers(-20, 20, (T, n_in))).astype(np.float32)
    w16 = make_kv_f16(rng, n_out, n_in)
    got = _f16_project(x, w16)
    assert same_bits(got, project_f16_twin(x, w16)), f16_path


def test_f16_kernel_threads_and_v41_shapes(f16_path):
    """[25600, 6144] F16 weights (rows of engram_kv), T = 1..5: the kernel equals the twin on 300 rows
    and does not depend on the thread count; with bf16 rows every product is exact."""
    rng = np.random.default_rng(31)
    w16 = make_kv_f16(rng, 6400, 6144)[rng.integers(0, 6400, 25600)]
    pick = rng.choice(25600, 300, replace=False)
    prev = f16_native.get_threads()
    try:
        for T in (1, 2, 5):
            x = make_rows(rng, T).reshape(T, -1)
            f16_native.set_threads(1)
            one = _f16_project(x, w16)
            f16_native.set_threads(2)
            two = _f16_project(x, w16)
            assert same_bits(one, two)
            assert same_bits(one[:, pick], project_f16_twin(x, w16[pick]))
            check_projection(one.reshape(T, 5, 5120), x.reshape(T, 24, 256), w16, pick)
    finally:
        f16_native.set_threads(prev)


def test_f16_kernel_non_finite_values_propagate(f16_path):
    rng = np.random.default_rng(32)
    x = rng.standard_normal((2, 130)).astype(np.float32)
    w16 = make_kv_f16(rng, 6, 130)
    x[0, 5] = np.nan
    x[1, 129] = np.inf  # in the tail past 128
    w16[3, 7] = np.float16(np.inf)
    got = _f16_project(x, w16)
    with np.errstate(invalid="ignore"):
        assert same_bits(got, project_f16_twin(x, w16))
    assert np.isnan(got[0]).all()
    hit = w16[:, 129] != 0
    assert not np.isfinite(got[1, hit]).any() and hit.sum() >= 4


def test_f16_to_f32_every_half_exact(f16_path):
    """All 65,536 F16 bit patterns convert exactly (NaNs stay NaNs), in blocks of any size."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = bits.view(np.float16).astype(np.float32)
    for rows in (1, 7, 4096):
        w = np.resize(bits, (rows, (1 << 16) // rows + (1 if (1 << 16) % rows else 0)))
        out = np.full(w.shape, -1.0, np.float32)
        f16_native.f16_to_f32_into(w, out)
        want = np.resize(ref, w.shape)
        assert same_bits(out, want), (f16_path, rows)
    # through the projection too: one input of 1.0 gives 0 + w (-0.0 becomes +0.0, as the sum starts at +0.0)
    got = _f16_project(np.ones((1, 1), np.float32), bits.reshape(-1, 1).view(np.float16))
    with np.errstate(invalid="ignore"):
        assert same_bits(got[0], np.float32(0) + ref)


def test_project_dispatch_f16_and_float32():
    """project: F16 weights up to F16_KERNEL_MAX_TOKENS tokens give the kernel's bits; beyond, float32
    blocks and BLAS (within the float32-accumulation bound); float32 weights give numpy.matmul's bits."""
    rng = np.random.default_rng(33)
    dim = 40
    w16 = make_kv_f16(rng, 5 * dim, 24 * 256)
    w32 = mixer.kv_weights(w16)
    prev = mixer.BLAS_BLOCK_ROWS
    mixer.BLAS_BLOCK_ROWS = 64  # several blocks and a partial last one (200 rows)
    try:
        for T in (0, 1, mixer.F16_KERNEL_MAX_TOKENS, mixer.F16_KERNEL_MAX_TOKENS + 1, 40):
            rows = make_rows(rng, T)
            out = engram.project(rows, w16)
            assert out.shape == (T, 5, dim) and out.dtype == np.float32
            x = rows.reshape(T, 24 * 256)
            if 0 < T <= mixer.F16_KERNEL_MAX_TOKENS:
                assert same_bits(out.reshape(T, 5 * dim), project_f16_twin(x, w16))
            elif T:
                check_projection(out, rows, w32)
            plain = engram.project(rows, w32)
            assert same_bits(plain.reshape(T, 5 * dim), np.matmul(x, w32.T))
            if T:
                check_projection(plain, rows, w32)
    finally:
        mixer.BLAS_BLOCK_ROWS = prev
