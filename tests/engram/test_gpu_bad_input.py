"""engram.gpu against hostile input on the CPU device (Triton's kernels in its interpreter): every refusal a
typed EngramError with the caller's tensors and the session's history untouched (issue 22)."""

from __future__ import annotations

import os

try:  # without a GPU, Triton's kernels run in its interpreter (set before engram.gpu compiles them)
    import torch as _torch
    _HAS_CUDA = _torch.cuda.is_available()
except ImportError:
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the extra engram[gpu])")

from engram import ArgumentError, EngramModel, decode_rows, synth  # noqa: E402
from engram.gpu import kernels  # noqa: E402
from tests.modelfiles import SCALE, token_map as _token_map  # noqa: E402

needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
PATHS = ["torch", pytest.param("triton", marks=needs_triton)]
#: Where the kernels run: the GPU of a CUDA host (compiled Triton), else the CPU (Triton's interpreter).
KDEV = torch.device("cuda") if _HAS_CUDA else torch.device("cpu")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpubad") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=3), progress=False)
    return EngramModel.open(path, readers=8)


# ------------------------------------------------------------------ kernels: the public paths check what they index
@pytest.mark.parametrize("path", PATHS)
def test_decode_raw_refuses_what_it_would_index_out_of_bounds(path):
    raw = torch.from_numpy(synth.rows_at(1, np.arange(4), seed=2))
    good = torch.full((4, 256), 7.0, dtype=torch.bfloat16)
    cases = [
        (raw.float(), None, None, "raw must have dtype uint8"),
        (raw[:, :100].contiguous(), None, None, r"raw must have shape \[n, 264\]"),
        (raw[0], None, None, r"raw must have shape \[n, 264\]"),
        (raw.numpy(), None, None, "raw must be a torch.Tensor"),
        (raw.t().contiguous().t(), None, None, "raw must be contiguous"),
        (raw, good[:1], None, r"out must have shape \[4, 256\], got \[1, 256\]"),
        (raw, good.float(), None, "out must have dtype bfloat16"),
        (raw, torch.zeros((256, 4), dtype=torch.bfloat16).t(), None, "out must be contiguous"),
        (raw, good, torch.zeros((2, 256), dtype=torch.float16), r"x16 must have shape \[4, 256\]"),
        (raw, good, torch.zeros((4, 256), dtype=torch.bfloat16), "x16 must have dtype float16"),
    ]
    for r, out, x16, msg in cases:
        keep = out.clone() if out is not None else None
        with pytest.raises(ArgumentError, match=msg):
            kernels.decode_raw(r, out, x16, path=path)
        if out is not None:
            assert torch.equal(out, keep)
    with pytest.raises(ArgumentError, match="path must be one of"):
        kernels.decode_raw(raw, path="cuda")
    # the good call still decodes SPEC's values
    got = kernels.decode_raw(raw.to(KDEV), good.to(KDEV), path=path)
    assert np.array_equal(got.float().cpu().numpy(), decode_rows(raw.numpy()))


@needs_triton
@pytest.mark.parametrize("what", ["decode", "project", "gate"])
def test_a_triton_path_on_tensors_it_cannot_reach_is_an_argument_error(monkeypatch, what):
    """With the interpreter off (any CUDA host; here forced), CPU tensors on a Triton path are refused
    before a launch (Triton's launcher would fail with a ValueError), the caller's tensors untouched."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    raw = torch.from_numpy(synth.rows_at(1, np.arange(2), seed=2))
    out = torch.full((2, 256), 7.0, dtype=torch.bfloat16)
    x = torch.ones((1, 64), dtype=torch.bfloat16)
    w = torch.ones((8, 64), dtype=torch.float16)
    res, g = torch.ones((1, 2, 64), dtype=torch.bfloat16), torch.full((1, 2), 3.0)
    w64 = kernels.gate_weights(torch.ones((2, 64)), torch.ones((2, 64)))
    calls = {"decode": lambda: kernels.decode_raw(raw, out, path="triton"),
             "project": lambda: kernels.project(x.to(torch.float16), x, w, out=torch.zeros((1, 8)), path="lanes"),
             "gate": lambda: kernels.gated_add(res, torch.ones((1, 3, 64)), w64, 1e-6, None, g, path="triton")}
    keep = (out.clone(), res.clone(), g.clone())
    with pytest.raises(ArgumentError, match=r"runs Triton on a CUDA device, or on the CPU under TRITON_INTERPRET=1; "
                                            r"the tensors are on cpu"):
        calls[what]()
    assert torch.equal(out, keep[0]) and torch.equal(res, keep[1]) and torch.equal(g, keep[2])


def test_project_refuses_mismatched_tensors_and_paths():
    K, N = 512, 64
    x = torch.zeros((2, K), dtype=torch.bfloat16)
    x16, w = x.to(torch.float16), torch.zeros((N, K), dtype=torch.float16)
    out = torch.full((2, N), 5.0)
    cases = [
        (x16, x, w[:, :100], out, r"w16 must have shape \[n, 512\]"),
        (x16, x, w.float(), out, "w16 must have dtype float16"),
        (x16, x, w.t().contiguous().t(), out, "w16 must be contiguous"),
        (x16[:1], x, w, out, r"x16 must have shape \[2, 512\]"),
        (x16, x.float(), w, out, "rows must have dtype bfloat16"),
        (x16, x, w, out[:, :3], r"out must have shape \[2, 64\]"),
        (x16, x, w, out.double(), "out must have dtype float32"),
        (x16, x, w, torch.zeros((N, 2)).t(), "out must be contiguous"),
    ]
    for a, b, c, o, msg in cases:
        keep = o.clone()
        with pytest.raises(ArgumentError, match=msg):
            kernels.project(a, b, c, out=o)
        assert torch.equal(o, keep)
    for bad in ("cublas", "CPU"):
        with pytest.raises(ArgumentError, match="path must be one of"):
            kernels.project(x16, x, w, out=out, path=bad)
    assert torch.all(out == 5.0)


@pytest.mark.parametrize("path", PATHS)
def test_gated_add_refuses_mismatched_tensors(path):
    T, S, W = 2, 4, 64
    res = torch.ones((T, S, W), dtype=torch.bfloat16)
    kv, w64 = torch.ones((T, S + 1, W)), torch.ones((S, W), dtype=torch.float64)
    gates = torch.full((T, S), 3.0)
    cases = [
        (res, kv[:, :2], w64, None, gates, r"kv must have shape \[2, 5, 64\]"),
        (res, kv.double(), w64, None, gates, "kv must have dtype float32"),
        (res, kv, w64[:2], None, gates, r"w64 must have shape \[4, 64\]"),
        (res, kv, w64, torch.ones(3, dtype=torch.uint8), gates, r"mask8 must have shape \[2\]"),
        (res, kv, w64, torch.ones(2, dtype=torch.bool), gates, "mask8 must have dtype uint8"),
        (res, kv, w64, None, gates[:1], r"gates must have shape \[2, 4\]"),
        (res.transpose(0, 1).contiguous().transpose(0, 1), kv, w64, None, gates, "residual must be contiguous"),
        (res[0], kv, w64, None, gates, r"residual must have shape \[n, n, n\]"),
    ]
    for r, k, w, m, g, msg in cases:
        keep_r, keep_g = r.clone(), g.clone()
        with pytest.raises(ArgumentError, match=msg):
            kernels.gated_add(r, k, w, 1e-6, m, g, path=path)
        assert torch.equal(r, keep_r) and torch.equal(g, keep_g)


@needs_triton
def test_lanes_projection_of_a_strided_batch_view_equals_its_contiguous_copy():
    """``step_batch(...)[:, i]`` is a strided view; the lanes kernel (CUDA's path up to 2 tokens) indexed
    token t at ``t * K`` and so read token 0's other layer as token 1."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn((64, 512), generator=g) / 8).to(torch.float16)
    batch = torch.randn((2, 2, 512), generator=g).to(torch.bfloat16)  # [B, layers, K]
    on = batch.to(KDEV)
    for i in range(2):
        x, xd = batch[:, i], on[:, i]
        assert not xd.is_contiguous()
        ref = kernels.project(x.contiguous().to(torch.float16), x.contiguous(), w, path="host")
        got = kernels.project(xd.to(torch.float16), xd, w.to(KDEV), path="lanes")
        assert torch.equal(got.cpu(), ref)


# ------------------------------------------------------------------ sessions: layer ids, ranges, grads
def test_layer_ids_that_are_not_integers_are_argument_errors(model):
    from engram.gpu import CapturedStep

    with model.session(device="cpu") as s:
        hd = s.step_async(100)
        hd.wait()
        p = s.prefill([1, 2, 3])
        cs = CapturedStep([s])
        for bad in ("x", None, 1.5, True, [1]):
            for call in (lambda: s.weights(bad), lambda: hd.rows_ready(bad), lambda: s.rows_ready(bad),
                         lambda: p.wait(bad), lambda: p.rows(bad), lambda: cs.launch(bad)) + \
                    ((lambda: cs.finish(bad)),) * (bad is not None):  # finish(None) finishes every layer
                with pytest.raises(ArgumentError, match="layer must be an integer"):
                    call()
        for call in (lambda: s.weights(3), lambda: hd.rows_ready(3), lambda: p.rows(3), lambda: cs.launch(3),
                     lambda: cs.finish(3)):
            with pytest.raises(ArgumentError, match="layer 3 has no Engram table"):
                call()
        assert s.weights(np.int64(1)) is s.weights(1)
        cs.close()


def test_prefill_rows_refuse_negative_and_reversed_ranges(model):
    with model.session(device="cpu") as s, model.session(device="cpu") as ref:
        p = s.prefill([100, 2000, 31337])
        for start, stop, msg in [(-2, None, "start must be an integer in"), (3, 1, "start must be an integer in"),
                                 (0, 4, "stop must be an integer in"), (0, -1, "stop must be an integer in"),
                                 ("0", None, "start must be an integer"), (0, 2.0, "stop must be an integer")]:
            with pytest.raises(ArgumentError, match=msg):
                p.rows(1, start, stop)
        with pytest.raises(ArgumentError, match="upto must be an integer"):
            p.wait(1, "x")
        assert p.rows(1, 3).shape == (0, 24, 256)
        want = torch.stack([ref.step(t)[14] for t in (100, 2000, 31337)])
        assert torch.equal(p.rows(14, 1, 3), want[1:3])


def test_apply_refuses_rows_that_require_grad_and_takes_a_mask_that_does(model):
    with model.session(device="cpu") as s:
        rows = s.step(100)[1][None]
        res = torch.zeros((1, 4, 5120), dtype=torch.bfloat16)
        with pytest.raises(ArgumentError, match="rows require grad"):
            s.apply(1, res, rows.clone().requires_grad_())
        with pytest.raises(ArgumentError, match=r"residual must have shape \[T, 4, 5120\], got \[4, 5120\]"):
            s.apply(1, res[0], rows)
        assert torch.all(res == 0)
        a, b = res.clone(), res.clone()
        s.apply(1, a, rows, mask=torch.ones(1, requires_grad=True).bool())
        s.apply(1, b, rows)
        assert torch.equal(a, b) and not torch.all(a == 0)
        with pytest.raises(ArgumentError, match="mask"):
            s.apply(1, res, rows, mask=torch.full((1,), 0.5, requires_grad=True))
        assert torch.all(res == 0)


def test_apply_refuses_gates_out_that_alias_residual_or_rows(model):
    """gates_out over residual's (or the rows') memory would be written while they are read: refused in one
    line, residual untouched; a gates_out of its own still works."""
    with model.session(device="cpu") as s:
        rows = s.step(100)[1][None].clone()
        res = torch.zeros((1, 4, 5120), dtype=torch.bfloat16)
        over_res = res.view(-1).view(torch.float32)[1000:1004].view(1, 4)
        with pytest.raises(ArgumentError, match="gates_out shares memory with residual"):
            s.apply(1, res, rows, gates_out=over_res)
        assert torch.all(res == 0)
        over_rows = rows.view(-1).view(torch.float32)[8:12].view(1, 4)
        before = rows.clone()
        with pytest.raises(ArgumentError, match="gates_out shares memory with rows"):
            s.apply(1, res, rows, gates_out=over_rows)
        assert torch.all(res == 0) and torch.equal(rows, before)
        g = torch.empty((1, 4), dtype=torch.float32)
        s.apply(1, res, rows, gates_out=g)
        assert not torch.all(res == 0) and torch.all(g > 0)


def test_a_failed_decode_after_a_good_read_puts_the_history_back(model, monkeypatch):
    """step and step_batch: when the device's copy or decode fails after the rows were read (a device error
    the CPU device cannot produce, injected into the decode kernel), the history is as before the call and
    the next step gives the rows of a session that never saw the failed token."""
    from engram import DeviceError
    from engram.gpu import step_batch
    with model.session(device="cpu") as s, model.session(device="cpu") as t, model.session(device="cpu") as ref:
        for x in (s, t, ref):
            x.step(11)
        h_s, h_t = s.host.history.copy(), t.host.history.copy()

        def broken(*a, **k):
            raise DeviceError("the device failed the decode")

        with monkeypatch.context() as mp:
            mp.setattr(kernels, "decode_raw", broken)
            with pytest.raises(DeviceError):
                s.step(12)
            with pytest.raises(DeviceError):
                step_batch([s, t], [12, 13])
        assert s.host.history == h_s and t.host.history == h_t
        got, want = s.step(40), ref.step(40)
        assert all(torch.equal(got[lid], want[lid]) for lid in model.layer_ids)
        s.rollback(1)
        ref.rollback(1)
        assert s.host.history == ref.host.history


# ------------------------------------------------------------------ the captured step and step_batch
def test_captured_step_refuses_empty_and_repeated_layers_and_sessions(model):
    from engram.gpu import CapturedStep, step_batch

    with model.session(device="cpu") as s, model.session() as host:
        h = s.history.copy()
        with pytest.raises(ArgumentError, match="one or more layers"):
            s.capture(1, layers=[])
        with pytest.raises(ArgumentError, match="a layer appears twice"):
            s.capture(1, layers=[1, 1])  # its gated add ran twice a step
        with pytest.raises(ArgumentError, match="a session appears twice"):
            CapturedStep([s, s])  # its history advanced twice a step
        with pytest.raises(ArgumentError, match="not an engram.gpu.GpuSession"):
            CapturedStep([host])
        with pytest.raises(ArgumentError, match="one GpuSession"):
            step_batch(s, [1])
        with pytest.raises(ArgumentError, match="sequence of GpuSession"):
            step_batch(7, [1])
        assert np.array_equal(s.history.ids, h.ids)
        one = s.capture(1, layers=[14])
        one.step(100)
        with model.session(device="cpu") as r:
            want = r.step(100)[14]
        assert one.layer_ids == (14,) and torch.equal(one.rows[14][0], want)
        one.close()


# ------------------------------------------------------------------ two threads on one session
def test_two_threads_stepping_one_session_get_the_rows_of_their_own_row_ids(model):
    """Two threads interleaved in step_async and step_batch on one session: each handle's rows are the
    decoded records of its own row ids (they were another token's: one staging buffer, one history)."""
    import threading

    from engram.gpu import step_batch

    with model.session(device="cpu") as s, model.session(device="cpu") as other:
        bad, errors = [], []

        def check(rows: dict, row_ids: np.ndarray, tag) -> None:
            for i, lid in enumerate(model.layer_ids):
                raw = np.empty((1, 24, 264), np.uint8)
                s.host.tables[lid].read_raw(row_ids[i:i + 1], raw)
                if not np.array_equal(rows[lid].float().numpy(), decode_rows(raw[0])):
                    bad.append(tag)

        def run(tokens):
            try:
                for t in tokens:
                    hd = s.step_async(t)
                    check(hd.wait(), hd.row_ids, t)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def run_batch(tokens):
            try:
                for t in tokens:
                    rows = step_batch([other, s], [t, t + 1])
                    # other is stepped by this thread only: its row ids of this batch are still its last
                    check({lid: rows[0, i] for i, lid in enumerate(model.layer_ids)}, other.host.last_row_ids,
                          ("batch", t))
            except Exception as exc:  # pragma: no cover
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(range(100 + k, 160, 2),)) for k in range(2)]
        threads.append(threading.Thread(target=run_batch, args=(range(500, 515),)))
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == [] and bad == []
