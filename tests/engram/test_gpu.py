"""engram.gpu on the CPU device and Triton's interpreter: kernels against the NumPy engine, sessions, batches,
prefill, the captured step, bad input.  CUDA-only tests are marked ``gpu`` (deselected by default)."""

from __future__ import annotations

import os
import subprocess
import sys

try:  # without a GPU, Triton's kernels run in its interpreter (set before engram.gpu compiles them)
    import torch as _torch
    _HAS_CUDA = _torch.cuda.is_available()
except ImportError:
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the extra engram[gpu])")

from engram import ArgumentError, DeviceError, EngramModel, TableIOError, decode_rows, gated_add, project, synth  # noqa: E402
from engram.codec import bf16_round  # noqa: E402
from engram.gpu import GpuSession, kernels, resolve_device, step_batch  # noqa: E402
from tests.modelfiles import SCALE, token_map as _token_map  # noqa: E402
from tests.reference import gated_add_twin  # noqa: E402

CPU = torch.device("cpu")
#: Where the kernel tests run: the GPU of a CUDA host (compiled Triton), else the CPU (Triton's interpreter).
KDEV = torch.device("cuda") if _HAS_CUDA else CPU
needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")


def bf16_np(t: torch.Tensor) -> np.ndarray:
    """float32 NumPy copy of a bf16 tensor."""
    return t.detach().to(torch.float32).cpu().numpy()


def bf16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in bf16 steps between bf16-valued float32 arrays of one sign pattern."""
    ia = a.astype(ml_dtypes.bfloat16).view(np.int16).astype(np.int64)
    ib = b.astype(ml_dtypes.bfloat16).view(np.int16).astype(np.int64)
    ia = np.where(ia < 0, -32768 - ia, ia)
    ib = np.where(ib < 0, -32768 - ib, ib)
    return np.abs(ia - ib)


def bf16_ulp(x: np.ndarray) -> np.ndarray:
    """One bf16 step at the magnitude of ``x`` (float64)."""
    a = np.maximum(np.abs(np.asarray(x, np.float64)), 2.0 ** -126)
    return np.ldexp(1.0, np.floor(np.log2(a)).astype(int) - 7)


def assert_within_one_rounding(dev: np.ndarray, cpu: np.ndarray, kv_cpu: np.ndarray, gates: np.ndarray) -> None:
    """The device residual differs from the CPU path's by at most one bf16 rounding of the value ``v`` (the
    projection sums in another order, so a ``v`` near a bf16 midpoint may round the other way) plus the final
    rounding: ``|dev - cpu| <= gate * ulp(v) + ulp(cpu)``; and almost every value is identical."""
    S = gates.shape[1]
    v = kv_cpu[:, S][:, None, :]
    bound = gates[:, :, None].astype(np.float64) * bf16_ulp(v) + bf16_ulp(cpu)
    assert np.all(np.abs(dev.astype(np.float64) - cpu) <= bound)
    assert np.mean(dev != cpu) < 0.01


# ------------------------------------------------------------------ kernels
def all_pairs():
    """Records holding every (code, scale) pair: one record a scale byte 0..254, codes 0..255."""
    raw = np.zeros((255, 264), np.uint8)
    raw[:, :256] = np.arange(256, dtype=np.uint8)
    raw[:, 256:] = np.arange(255, dtype=np.uint8)[:, None]
    codes = np.arange(256, dtype=np.uint8)
    with np.errstate(over="ignore"):
        exact = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)[None, :] * \
            np.ldexp(1.0, np.arange(255) - 127)[:, None]
    valid = ((codes & 127) != 127)[None, :] & (np.abs(exact) < 2.0 ** 128)
    return raw, valid


@pytest.mark.parametrize("path", ["torch", pytest.param("triton", marks=needs_triton)])
def test_decode_every_pair_bit_identical_to_decode_rows(path):
    raw, valid = all_pairs()
    out = kernels.decode_raw(torch.from_numpy(raw).to(KDEV), path=path)
    got = out.cpu().view(torch.int16).numpy().view(np.uint16)
    # decode_rows refuses records with a NaN or overflow: decode the valid values through it one block at a time
    fixed = raw.copy()
    fixed[:, :256][~valid] = 0
    blocks_ok = valid.reshape(255, 8, 32).all(axis=2)
    fixed[:, 256:][~blocks_ok] = 127
    ref = decode_rows(fixed).astype(ml_dtypes.bfloat16).view(np.uint16)
    mask = valid & np.repeat(blocks_ok, 32, axis=1)
    assert mask.sum() > 40000
    assert np.array_equal(got[mask], ref[mask])
    # the SPEC §5 known answers
    one = np.zeros((1, 264), np.uint8)
    one[0, 0], one[0, 1], one[0, 256:] = 0x38, 0x38, 127
    one[0, 257] = 130
    o = bf16_np(kernels.decode_raw(torch.from_numpy(one).to(KDEV), path=path))
    assert o[0, 0] == 1.0 and o[0, 32] == 0.0 and o[0, 1] == 1.0


@needs_triton
def test_decode_triton_equals_torch_on_table_rows():
    raw = synth.rows_at(14, np.arange(0, 5000, 3), seed=9)
    t = torch.from_numpy(raw).to(KDEV)
    x16a = torch.empty((len(raw), 256), dtype=torch.float16, device=KDEV)
    x16b = torch.empty((len(raw), 256), dtype=torch.float16, device=KDEV)
    a = kernels.decode_raw(t, x16=x16a, path="triton")
    b = kernels.decode_raw(t, x16=x16b, path="torch")
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.equal(x16a.view(torch.int16), x16b.view(torch.int16))
    assert np.array_equal(bf16_np(a), decode_rows(raw))
    assert kernels.f16_exact(t) and torch.equal(x16a.to(torch.bfloat16), a)  # synth scales are f16-exact


def gate_inputs(T=3, S=4, W=640, seed=0):
    rng = np.random.default_rng(seed)
    residual = bf16_round(rng.standard_normal((T, S, W)).astype(np.float32) * 2)
    kv = rng.standard_normal((T, S + 1, W)).astype(np.float32)
    kv[0, 1] = -kv[0, 1] * 0 + residual[0, 1] * 0.5  # a stream whose key follows h: a gate near 1
    q = (1 + 0.1 * rng.standard_normal((S, W))).astype(np.float32)
    k = (1 + 0.1 * rng.standard_normal((S, W))).astype(np.float32)
    return residual, kv, q, k


@pytest.mark.parametrize("path", ["torch", pytest.param("triton", marks=needs_triton)])
def test_gate_against_numpy_engine(path):
    residual, kv, q, k = gate_inputs()
    mask = np.array([1, 0, 1], np.uint8)
    expect, expect_g = gated_add_twin(residual, kv, q, k, 1e-6, mask=mask.astype(bool))
    cpu = residual.copy()
    cpu_g = np.zeros((3, 4), np.float32)
    gated_add(cpu, kv, q, k, 1e-6, mask=mask, gates_out=cpu_g)
    r = torch.from_numpy(residual).to(torch.bfloat16).to(KDEV)
    g = torch.zeros((3, 4), dtype=torch.float32, device=KDEV)
    kernels.gated_add(r, torch.from_numpy(kv).to(KDEV),
                      kernels.gate_weights(torch.from_numpy(q).to(KDEV), torch.from_numpy(k).to(KDEV)), 1e-6,
                      torch.from_numpy(mask).to(KDEV), g, path=path)
    gn = g.cpu().numpy()
    np.testing.assert_allclose(gn, cpu_g, rtol=0, atol=1e-5)
    assert np.array_equal(gn, expect_g) or np.abs(gn - expect_g).max() < 1e-7
    assert bf16_ulps(bf16_np(r), cpu).max() <= 1
    assert np.array_equal(bf16_np(r)[1], residual[1]) and g[1].abs().max() == 0
    assert (bf16_np(r) != residual).any()


@needs_triton
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_gate_triton_equals_torch_bit_for_bit(eps):
    for seed in range(3):
        residual, kv, q, k = gate_inputs(T=4, W=5120, seed=seed)
        residual[2, 3] = 0  # an all-zero stream: dot 0, gate sigmoid(1e-3)
        w64 = kernels.gate_weights(torch.from_numpy(q).to(KDEV), torch.from_numpy(k).to(KDEV))
        outs = []
        for path in ("triton", "torch"):
            r = torch.from_numpy(residual).to(torch.bfloat16).to(KDEV)
            g = torch.empty((4, 4), dtype=torch.float32, device=KDEV)
            kernels.gated_add(r, torch.from_numpy(kv).to(KDEV), w64, eps, None, g, path=path)
            outs.append((r, g))
        assert torch.equal(outs[0][0].view(torch.int16), outs[1][0].view(torch.int16))
        assert torch.equal(outs[0][1], outs[1][1])
        assert outs[0][1][2, 3].item() == np.float32(1 / (1 + np.exp(-1e-3)))


@needs_triton
@pytest.mark.parametrize("T,n_out,n_in", [(1, 40, 6144), (2, 33, 128), (3, 17, 100), (5, 9, 192), (4, 16, 64)])
@pytest.mark.parametrize("exact", [True, False])
def test_lanes_projection_bit_identical_to_the_cpu_kernel(T, n_out, n_in, exact):
    """The lanes kernel sums in the CPU kernel's order: the same bits as engram.project's F16 kernel (and its
    NumPy twin) for every token count (launches of up to 4 tokens), inputs past the last block of 64, with
    and without fused multiply-adds; nothing written past ``out``."""
    from tests.engram.test_mixer import project_f16_twin

    rng = np.random.default_rng(T * 1000 + n_in)
    x = torch.from_numpy(rng.standard_normal((T, n_in)).astype(np.float32) * 3).to(torch.bfloat16)
    w = torch.from_numpy((rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float16))
    buf = torch.full((T + 1, n_out), float("nan"), device=KDEV)
    kernels.project(x.to(KDEV).to(torch.float16), x.to(KDEV), w.to(KDEV), exact=exact, out=buf[:T], path="lanes")
    twin = project_f16_twin(x.to(torch.float32).numpy(), w.numpy())
    assert np.array_equal(buf[:T].cpu().numpy().view(np.uint32), twin.view(np.uint32))
    assert torch.isnan(buf[T]).all()
    host = torch.full((T, n_out), float("nan"))
    kernels.project(None, x, w, out=host, path="host")
    assert np.array_equal(host.numpy().view(np.uint32), twin.view(np.uint32))


def test_projection_paths():
    cpu = torch.device("cpu")
    assert kernels.projection_path(cpu, 1) == "host" and kernels.projection_path(cpu, 256) == "host"
    assert kernels.projection_path(cpu, 257) == "f32-blocks"
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        lanes = "lanes" if kernels.triton_available() else kernels.project_mode(cuda)
        assert kernels.projection_path(cuda, kernels.LANES_MAX_TOKENS) == lanes
        assert kernels.projection_path(cuda, kernels.LANES_MAX_TOKENS + 1) == kernels.project_mode(cuda)
        assert kernels.projection_path(cuda, 64, exact=False) == "f32-blocks"


def test_projection_keeps_spec_numerics_f16_not_bf16():
    """F16 weights with exact products (the chosen path) give the CPU path's bits; bf16 weights (the
    alternative) move the keys by ~2^-9 relative."""
    raw = synth.rows_at(1, np.arange(24 * 2), seed=1)
    rows = decode_rows(raw).reshape(2, 24, 256)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((640, 6144)) * 0.02).astype(np.float16)
    ref = project(rows, w).reshape(2, 640)
    x = torch.from_numpy(rows.reshape(2, 6144)).to(torch.bfloat16)
    out = kernels.project(x.to(torch.float16), x, torch.from_numpy(w))
    assert np.array_equal(out.numpy().view(np.uint32), ref.view(np.uint32))
    scale = np.abs(rows.reshape(2, 6144).astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    blocks = kernels.project(x.to(torch.float16), x, torch.from_numpy(w), path="f32-blocks")
    assert np.all(np.abs(blocks.numpy() - ref) <= 6144 * 2.0 ** -24 * scale)
    bf = (x.float() @ torch.from_numpy(w).to(torch.bfloat16).float().t()).numpy()
    assert np.abs(bf - ref).max() > 1e-3 * np.abs(ref).max()


# ------------------------------------------------------------------ sessions
@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpumodel") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=3), progress=False)
    return path


@pytest.fixture(scope="module")
def model(model_path):
    return EngramModel.open(model_path, readers=8)


TOKENS = [100, 2000, 31337, 5, 77, 100, 2000, 9001]


def test_session_factory_and_step_rows_bit_identical(model):
    s = model.session(device="cpu")
    assert isinstance(s, GpuSession) and s.device == CPU and not s.pinned
    with s, model.session() as h:
        for t in TOKENS[:4]:
            got = s.step(t)
            ref = h.step(t)
            for lid in model.layer_ids:
                assert got[lid].dtype == torch.bfloat16 and got[lid].shape == (24, 256)
                assert np.array_equal(bf16_np(got[lid]), ref[lid])
            assert np.array_equal(s.host.last_row_ids, h.last_row_ids)


def test_step_async_rows_ready_equals_step(model):
    with model.session(device="cpu") as a, model.session(device="cpu") as b:
        for t in TOKENS[:3]:
            hd = a.step_async(t)
            ref = b.step(t)
            for lid in (14, 1):
                a.rows_ready(lid).wait()
                assert torch.equal(hd.rows[lid], ref[lid])
        with pytest.raises(ArgumentError, match="layer 3"):
            a.rows_ready(3)


def test_step_batch_one_deduplicated_read(model):
    sessions = [model.session(device="cpu", max_batch=2) for _ in range(4)]
    refs = [model.session(device="cpu") for _ in range(4)]
    try:
        tokens = np.array([100, 100, 2000, 31337])
        rows = step_batch(sessions, tokens)
        assert rows.shape == (4, 2, 24, 256) and rows.dtype == torch.bfloat16
        for b in range(4):
            r = refs[b].step(int(tokens[b]))
            for i, lid in enumerate(model.layer_ids):
                assert torch.equal(rows[b, i], r[lid])
        st = sessions[0].host.last_stats
        assert st.rows_requested == 4 * 48 and st.rows_distinct <= 3 * 48  # sessions 0 and 1 share their rows
        # the batch's rows feed apply of each layer directly
        res = torch.from_numpy(bf16_round(np.random.default_rng(1).standard_normal((4, 4, 5120)).astype(
            np.float32))).to(torch.bfloat16)
        kv = sessions[0].apply(14, res, rows[:, 1])
        assert kv.shape == (4, 5, 5120)
    finally:
        for s in sessions + refs:
            s.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _HAS_CUDA, reason="no CUDA device"))])
def test_step_many_and_rollback_equal_host_steps(model, device):
    """step_many on the device: rows bit-identical to the host session stepping one by one; rollback
    undoes device steps of every kind; T = 0 and ids outside the vocabulary are typed errors."""
    from engram import HistoryError, TokenError

    with model.session(device=device, max_batch=2) as s, model.session() as h:
        got = s.step_many(TOKENS[:5])  # more tokens than the batch staging held: it grows
        ref = [h.step(t) for t in TOKENS[:5]]
        for lid in model.layer_ids:
            assert got[lid].shape == (5, 24, 256) and got[lid].dtype == torch.bfloat16
            for t in range(5):
                assert np.array_equal(bf16_np(got[lid][t].cpu()), ref[t][lid])
        assert s.host.last_stats.rows_requested == 5 * 48 and s.history == h.history
        s.step(TOKENS[5])
        s.step_async(TOKENS[6]).rows_ready(14).wait()
        s.rollback(4)  # back to after TOKENS[:3]
        h.rollback(2)
        assert s.history == h.history
        before = s.history.copy()
        for bad, kind in (([], ArgumentError), ([1, 10**9], TokenError)):
            with pytest.raises(kind):
                s.step_many(bad)
        with pytest.raises(HistoryError, match="only 3"):
            s.rollback(4)
        assert s.history == before
        again = s.step_many(TOKENS[3:5])
        for lid in model.layer_ids:
            assert torch.equal(again[lid].cpu(), got[lid][3:5].cpu())
        kv = s.apply(14, torch.zeros((2, 4, 5120), dtype=torch.bfloat16, device=s.device), again[14])
        assert kv.shape == (2, 5, 5120)


def test_apply_matches_cpu_path(model):
    with model.session(device="cpu") as s, model.session() as h:
        for t in TOKENS[:2]:
            rows_g = s.step(t)
            rows_h = h.step(t)
        rng = np.random.default_rng(0)
        residual = bf16_round(rng.standard_normal((1, 4, 5120)).astype(np.float32))
        for lid in model.layer_ids:
            res_h = residual.copy()
            gates_h = np.zeros((1, 4), np.float32)
            kv_h = h.apply(lid, res_h, rows_h[lid][None], gates_out=gates_h)
            res_g = torch.from_numpy(residual).to(torch.bfloat16)
            gates_g = torch.zeros((1, 4), dtype=torch.float32)
            kv = s.apply(lid, res_g, rows_g[lid][None], gates_out=gates_g)
            assert kv.dtype == torch.float32 and kv.shape == (1, 5, 5120)
            assert np.array_equal(kv.numpy().reshape(-1).view(np.uint32), kv_h.reshape(-1).view(np.uint32))
            np.testing.assert_allclose(gates_g.numpy(), gates_h, rtol=0, atol=1e-7)
            assert_within_one_rounding(bf16_np(res_g), res_h, kv_h, gates_h)
            assert (bf16_np(res_g) != residual).any()


def test_apply_mask_leaves_tokens(model):
    with model.session(device="cpu") as s:
        rows = torch.stack([s.step(t)[1] for t in TOKENS[:3]])
        res = torch.from_numpy(bf16_round(np.random.default_rng(2).standard_normal((3, 4, 5120)).astype(
            np.float32))).to(torch.bfloat16)
        before = res.clone()
        g = torch.full((3, 4), 7.0)
        s.apply(1, res, rows, mask=[True, False, True], gates_out=g)
        assert torch.equal(res[1], before[1]) and not torch.equal(res[0], before[0])
        assert torch.all(g[1] == 0) and torch.all((g[[0, 2]] > 0) & (g[[0, 2]] < 1))


def test_prefill_streams_rows_equal_to_steps(model):
    ids = np.array(TOKENS * 5)
    with model.session(device="cpu") as s, model.session() as h:
        p = s.prefill(ids, chunk_tokens=7)
        for lid in model.layer_ids:
            p.wait(lid, 10)
        got = {lid: p.rows(lid) for lid in model.layer_ids}
        ref = [h.step(int(t)) for t in ids]
        for lid in model.layer_ids:
            assert got[lid].shape == (len(ids), 24, 256)
            assert np.array_equal(bf16_np(got[lid]), np.stack([r[lid] for r in ref]))
        assert p.done and p.progress == {lid: len(ids) for lid in model.layer_ids}
        assert np.array_equal(s.history.ids, h.history.ids)
        with pytest.raises(ArgumentError):
            p.wait(1, len(ids) + 1)


def test_captured_step_equals_apply(model):
    with model.session(device="cpu") as s, model.session(device="cpu") as ref:
        cs = s.capture(1)
        assert cs.graphs == {}  # CPU: the same consumer, run eagerly
        init = torch.from_numpy(bf16_round(np.random.default_rng(3).standard_normal((1, 4, 5120)).astype(
            np.float32))).to(torch.bfloat16)
        for t in TOKENS[:2]:
            for lid in model.layer_ids:
                cs.residual[lid].copy_(init)
            cs.begin(t)
            cs.finish()
            rows = ref.step(t)
            for lid in model.layer_ids:
                r = init.clone()
                g = torch.zeros((1, 4))
                ref.apply(lid, r, rows[lid][None], gates_out=g)
                assert torch.equal(cs.rows[lid][0], rows[lid])
                assert torch.equal(cs.residual[lid], r) and torch.equal(cs.gates[lid], g)
        assert cs.eager_steps == 0
        cs.close()


# ------------------------------------------------------------------ bad input
def test_bad_tensors_are_refused_untouched(model):
    with model.session(device="cpu") as s:
        rows = s.step(100)[1][None]
        good = torch.zeros((1, 4, 5120), dtype=torch.bfloat16)
        g = torch.full((1, 4), 3.0)
        cases = [
            (good.float(), rows, "residual must have dtype bfloat16"),
            (torch.zeros((1, 4, 512), dtype=torch.bfloat16), rows, r"residual must have shape \[1, 4, 5120\]"),
            (torch.zeros((1, 4, 5120), dtype=torch.bfloat16, device="meta"), rows, "residual is on meta"),
            (good.numpy() if False else good.float().numpy(), rows, "residual must be a torch.Tensor"),
            (good, rows.float(), "rows must have dtype bfloat16"),
            (good, rows[:, :12], r"rows must have shape \[1, 24, 256\]"),
            (good, rows.to("meta"), "rows is on meta"),
            (good, torch.zeros((1, 256, 24), dtype=torch.bfloat16).transpose(1, 2), "contiguously"),
        ]
        for residual, r, msg in cases:
            keep = residual.clone() if isinstance(residual, torch.Tensor) and residual.device.type == "cpu" else None
            with pytest.raises(ArgumentError, match=msg):
                s.apply(1, residual, r, gates_out=g)
            if keep is not None:
                assert torch.equal(residual, keep)
        with pytest.raises(ArgumentError, match="gates_out must have dtype float32"):
            s.apply(1, good, rows, gates_out=g.double())
        with pytest.raises(ArgumentError, match="layer 2"):
            s.apply(2, good, rows)
        for bad_layer in (True, 1.0, "1", None):
            with pytest.raises(ArgumentError, match="layer must be an integer"):
                s.apply(bad_layer, good, rows, gates_out=g)
        leaf = torch.zeros((1, 4, 5120), dtype=torch.bfloat16, requires_grad=True)
        with pytest.raises(ArgumentError, match="residual requires grad"):
            s.apply(1, leaf, rows, gates_out=g)
        assert torch.all(leaf.detach() == 0)
        with pytest.raises(ArgumentError, match="gates_out requires grad"):
            s.apply(1, good, rows, gates_out=torch.zeros((1, 4), requires_grad=True))
        with pytest.raises(ArgumentError, match="mask"):
            s.apply(1, good, rows, mask=[2])
        assert torch.all(good == 0) and torch.all(g == 3.0)


def test_closed_session_says_so(model):
    s = model.session(device="cpu")
    rows = s.step(5)[1][None]
    s.close()
    res = torch.zeros((1, 4, 5120), dtype=torch.bfloat16)
    for call in (lambda: s.step(1), lambda: s.step_async(1), lambda: s.prefill([1, 2]),
                 lambda: s.apply(1, res, rows), lambda: step_batch([s], [1])):
        with pytest.raises(TableIOError, match="closed"):
            call()
    assert torch.all(res == 0)
    s.close()  # idempotent


def test_devices_that_do_not_exist(model):
    for dev in ("cuda:7", "nosuchdevice", "mps"):
        with pytest.raises(DeviceError) as e:
            model.session(device=dev)
        assert dev.split(":")[0] in str(e.value)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="does not exist"):
            resolve_device("cuda")


def test_out_of_memory_is_a_device_error(model):
    with pytest.raises(DeviceError, match="out of memory"):
        GpuSession(model, "cpu", max_batch=1 << 46)  # 2^46 tokens x 48 rows x 264 bytes of staging


def test_step_batch_arguments(model):
    with model.session(device="cpu") as a, model.session(device="cpu") as b:
        h = a.history.copy()
        with pytest.raises(ArgumentError, match="2 integers"):
            step_batch([a, b], [1])
        with pytest.raises(ArgumentError, match="twice"):
            step_batch([a, a], [1, 2])
        with pytest.raises(ArgumentError, match="GpuSession"):
            step_batch([a, model.session()], [1, 2])
        assert np.array_equal(a.history.ids, h.ids)


def test_without_torch_engram_works_and_engram_gpu_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import engram\n"
            "try:\n"
            "    import engram.gpu\n"
            "except engram.DeviceError as e:\n"
            "    print('DeviceError:', e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert res.returncode == 0, res.stderr
    assert "DeviceError:" in res.stdout and "engram[gpu]" in res.stdout


# ------------------------------------------------------------------ CUDA only
def gpu(f):
    """CUDA only: marked ``gpu`` (deselected by default; ``-m gpu`` on a GPU machine), skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")(f))



@gpu
def test_cuda_step_apply_and_graph_match_cpu(model):
    with model.session(device="cuda") as s, model.session() as h:
        assert s.pinned
        res0 = bf16_round(np.random.default_rng(4).standard_normal((1, 4, 5120)).astype(np.float32))
        cs = s.capture(1)
        assert set(cs.graphs) == set(model.layer_ids)
        with model.session(device="cuda") as e:
            for t in TOKENS[:3]:
                rows = e.step(t)
                ref = h.step(t)
                for lid in model.layer_ids:
                    cs.residual[lid].copy_(torch.from_numpy(res0).to(torch.bfloat16))
                cs.step(t)
                torch.cuda.synchronize()
                for lid in model.layer_ids:
                    assert np.array_equal(bf16_np(rows[lid]), ref[lid])
                    assert np.array_equal(bf16_np(cs.rows[lid][0]), ref[lid])
                    r = res0.copy()
                    g = np.zeros((1, 4), np.float32)
                    kv_h = h.apply(lid, r, ref[lid][None], gates_out=g)
                    np.testing.assert_allclose(cs.gates[lid].cpu().numpy(), g, rtol=0, atol=1e-5)
                    assert_within_one_rounding(bf16_np(cs.residual[lid]), r, kv_h, g)
                    rg = torch.from_numpy(res0).to(torch.bfloat16).cuda()
                    gg = torch.zeros((1, 4), device="cuda")
                    kv_g = e.apply(lid, rg, rows[lid][None], gates_out=gg)
                    assert np.array_equal(kv_g.cpu().numpy().reshape(-1).view(np.uint32),
                                          kv_h.reshape(-1).view(np.uint32))  # the lanes kernel: the CPU's bits
                    np.testing.assert_allclose(gg.cpu().numpy(), g, rtol=0, atol=1e-5)
                    assert_within_one_rounding(bf16_np(rg), r, kv_h, g)
        cs.close()


@gpu
def test_cuda_batch_and_async(model):
    sessions = [model.session(device="cuda", max_batch=8) for _ in range(8)]
    rows = step_batch(sessions, np.arange(8) + 100)
    torch.cuda.synchronize()
    for b in range(8):
        with model.session() as one:
            ref = one.step(100 + b)
        for i, lid in enumerate(model.layer_ids):
            assert np.array_equal(bf16_np(rows[b, i]), ref[lid])
    hd = sessions[0].step_async(555)
    hd.rows_ready(14).wait()
    hd.rows_ready(1).wait()
    torch.cuda.synchronize()
    assert rows.shape == (8, 2, 24, 256) and rows.is_cuda
    for s in sessions:
        s.close()


@gpu
def test_cuda_wrong_device_and_oom(model):
    with model.session(device="cuda") as s:
        rows = s.step(5)[1][None]
        with pytest.raises(ArgumentError, match="residual is on cpu"):
            s.apply(1, torch.zeros((1, 4, 5120), dtype=torch.bfloat16), rows)
        free, total = torch.cuda.mem_get_info()
        with pytest.raises(DeviceError, match="out of memory"):
            s.prefill(np.zeros(int(total // (2 * 24 * 256 * 2)) + 10, dtype=np.int64))
