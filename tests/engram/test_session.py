"""Model and session API: decode steps, prefill prefetch, snapshots, concurrency (SPEC §7–§8)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from engram import (ArgumentError, EngramModel, FormatError, Hasher, History, HistoryError, TableIOError, TokenError,
                    decode_rows)
from engram import synth
from engram.prefetch import PrefetchCancelled
from tests.modelfiles import SCALE, token_map as _token_map


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=3), progress=False)
    return path


@pytest.fixture(scope="module")
def model(model_path):
    return EngramModel.open(model_path, readers=8)


@pytest.fixture(scope="module")
def text_ids(tokenizer, shared_data):
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[5000:9000]
    return np.array(tokenizer.encode(text, add_special_tokens=False).ids[:600])


def expected_rows(model, row_ids: np.ndarray, seed=3) -> dict:
    """Decoded rows straight from the synthetic content: {layer_id: [T, 24, 256]}."""
    out = {}
    for li, lid in enumerate(model.layer_ids):
        ids = row_ids[:, li, :]
        raw = synth.rows_at(lid, ids.reshape(-1), seed=seed)
        out[lid] = decode_rows(raw).reshape(ids.shape[0], ids.shape[1], 256)
    return out


def test_open_reads_layout(model):
    assert model.layer_ids == (1, 14)
    assert model.layout.columns == 24 and model.eps > 0
    assert np.array_equal(model.token_map, _token_map())


def test_step_equals_hash_and_decode(model, text_ids):
    ids = text_ids[:200]
    ref_ids = Hasher(model.layout, model.token_map).hash(ids)
    ref = expected_rows(model, ref_ids)
    with model.session() as s:
        for t, tok in enumerate(ids):
            rows = s.step(int(tok))
            assert np.array_equal(s.last_row_ids, ref_ids[t])
            for lid in model.layer_ids:
                assert rows[lid].shape == (24, 256) and rows[lid].dtype == np.float32
                assert np.array_equal(rows[lid], ref[lid][t]), (t, lid)
        assert s.last_stats.rows_requested == 48


@pytest.mark.parametrize("chunk, order", [(1, "chunk"), (7, "table"), (64, "chunk"), (2048, "table")])
def test_prefill_equals_steps(model, text_ids, chunk, order):
    ids = text_ids[:300]
    with model.session() as a, model.session() as b:
        p = a.prefill(ids, chunk_tokens=chunk, order=order)
        stepped = [b.step(int(t)) for t in ids]
        for lid in model.layer_ids:
            got = p.rows(lid, 0, len(ids), timeout=60)
            assert np.array_equal(got, np.stack([r[lid] for r in stepped]))
            assert not got.flags.writeable
        assert p.progress == {1: 300, 14: 300}
        assert a.history == b.history
        half = p.rows(1, 100, 150)
        assert half.shape == (50, 24, 256)


@pytest.mark.parametrize("order", ["chunk", "table"])
def test_prefill_second_table_waits_for_layer(model, text_ids, order):
    with model.session() as s:
        p = s.prefill(text_ids[:100], second_table_layer=5, chunk_tokens=16, order=order)
        p.wait(1, 100, timeout=60)  # the first table goes on while the second is gated
        assert p.progress[14] == 0  # the engine has not reached layer 5
        p.enter_layer(5)
        p.wait(14, 100, timeout=60)
        assert p.progress == {1: 100, 14: 100}


def test_prefill_chunk_order_interleaves(model, text_ids):
    """Chunk order: once both tables are open, neither runs more than a chunk ahead."""
    with model.session() as s:
        p = s.prefill(text_ids[:600], chunk_tokens=32, second_table_layer=0)
        p.enter_layer(0)
        seen = []
        for _ in range(100_000):
            pr = p.progress
            seen.append(pr[1] - pr[14])
            if p.done:
                break
        p.wait(14, timeout=60)
        # one chunk apart, plus one chunk the first table may have read before the gate opened
        assert max(seen) <= 64 and min(seen) >= -32


def test_prefill_mask(model, text_ids):
    ids = text_ids[:50]
    mask = np.ones(50, bool)
    mask[10:20] = False
    with model.session() as s:
        p = s.prefill(ids, mask)
        p.wait(14, timeout=60)
        ref_ids = Hasher(model.layout, model.token_map).hash(ids, mask)
        assert np.array_equal(p.row_ids, ref_ids)
        ref = expected_rows(model, ref_ids)
        assert np.array_equal(p.rows(14), ref[14])


def test_truncated_table_surfaces_from_wait(model_path, tmp_path, text_ids):
    import shutil

    path = tmp_path / "trunc.gguf"
    shutil.copyfile(model_path, path)
    m = EngramModel.open(path)
    with m.session() as s:
        loc = m.info.tables[1]
        os.truncate(path, loc.offset + 1000 * 264)  # after open: the reads come up short
        p = s.prefill(text_ids[:400], chunk_tokens=64)
        with pytest.raises(TableIOError, match="short read"):
            p.wait(1, 400, timeout=60)
        with pytest.raises(TableIOError):
            p.rows(14, timeout=60)


def test_cancel_and_close_during_prefetch(model, text_ids):
    s = model.session()
    p = s.prefill(np.resize(text_ids, 20_000), chunk_tokens=256)
    p.cancel()
    with pytest.raises(PrefetchCancelled):
        p.wait(14, 20_000, timeout=60)
    assert p.done
    p2 = s.prefill(np.resize(text_ids, 20_000), chunk_tokens=256)
    s.close()  # cancels p2 and joins its reader; no deadlock
    assert p2.done
    with pytest.raises(PrefetchCancelled):
        p2.wait(1, 20_000, timeout=60)
    with pytest.raises(TableIOError, match="closed"):
        s.step(5)


def test_prefetch_argument_errors(model, text_ids):
    with model.session() as s:
        with pytest.raises(ArgumentError, match="chunk_tokens"):
            s.prefill(text_ids[:10], chunk_tokens=0)
        p = s.prefill(text_ids[:10])
        with pytest.raises(ArgumentError, match="layer 2 has no Engram table"):
            p.wait(2)
        with pytest.raises(ArgumentError, match="upto"):
            p.wait(1, 11)
        with pytest.raises(ArgumentError):
            p.rows(1, 5, 3)
        with pytest.raises(TokenError):
            s.prefill([1, -4])


def test_snapshot_restore(model, text_ids):
    with model.session() as a:
        for t in text_ids[:20]:
            a.step(int(t))
        snap = a.snapshot()
        nxt = [a.step(int(t)) for t in text_ids[20:30]]
        a.restore(snap)
        again = [a.step(int(t)) for t in text_ids[20:30]]
        for x, y in zip(nxt, again):
            assert all(np.array_equal(x[l], y[l]) for l in model.layer_ids)
        # a snapshot is just the last 3 ids: a new session restored from it matches
        with model.session() as b:
            b.restore(snap)
            assert np.array_equal(b.step(int(text_ids[20]))[14], nxt[0][14])
        with pytest.raises(HistoryError):
            a.restore(History([1, 2]))
        with pytest.raises(HistoryError):
            a.restore((1, 2, 3))


def test_invalid_token_keeps_history(model):
    with model.session() as s:
        s.step(100)
        before = s.snapshot()
        with pytest.raises(TokenError):
            s.step(10**9)
        assert s.history == before


def test_sessions_in_threads_equal_serial(model, text_ids):
    n_sessions, steps = 6, 60
    seqs = [np.roll(text_ids, 17 * i)[:steps] for i in range(n_sessions)]
    serial = []
    for seq in seqs:
        with model.session() as s:
            serial.append([s.step(int(t)) for t in seq])
    results = [None] * n_sessions
    errors = []

    def run(i):
        try:
            with model.session() as s:
                results[i] = [s.step(int(t)) for t in seqs[i]]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_sessions)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for i in range(n_sessions):
        for a, b in zip(serial[i], results[i]):
            assert all(np.array_equal(a[l], b[l]) for l in model.layer_ids)


def test_session_options(model):
    with pytest.raises(ArgumentError, match="unknown session options"):
        model.session(readerz=3)
    with model.session(backend="serial", readers=1) as s:
        s.step(5)
        assert s.last_stats.backend == "serial"


def test_apply_projects_and_gates(model, text_ids):
    from engram.codec import bf16_round
    from engram.mixer import gated_add, project

    w = model.weights(14)
    assert w.kv.shape == (25600, 6144) and w.kv.dtype == np.float16  # kept F16: 315 MB, not 629
    assert w.q_norm.shape == (4, 5120) and w.k_norm.shape == (4, 5120)
    raw = model.info.read_tensor(model.info.layers[14].kv.name, max_bytes=1 << 31)
    assert np.array_equal(w.kv, raw) and w.kv.nbytes == 25600 * 6144 * 2
    assert model.weights(14) is w  # read once
    with model.session() as s:
        rows = np.stack([s.step(int(t))[14] for t in text_ids[:3]])
        rng = np.random.default_rng(0)
        residual = bf16_round(rng.standard_normal((3, 4, 5120)).astype(np.float32))
        expect = residual.copy()
        original = residual.copy()
        kv_ref = (rows.reshape(3, 6144).astype(np.float64) @ raw.astype(np.float64).T).reshape(3, 5, 5120)
        gates = np.zeros((3, 4), np.float32)
        mask = np.array([True, False, True])
        kv = s.apply(14, residual, rows, mask=mask, gates_out=gates)
        np.testing.assert_allclose(kv, kv_ref, rtol=1e-4, atol=1e-5)
        gated_add(expect, project(rows, w.kv), w.q_norm, w.k_norm, model.eps, mask=mask)
        assert np.array_equal(residual, expect)
        assert np.array_equal(residual[1], original[1]) and not np.array_equal(residual[0], original[0])
        assert np.all((gates[[0, 2]] > 0) & (gates[[0, 2]] < 1)) and np.all(gates[1] == 0)
        with pytest.raises(ArgumentError):
            s.apply(2, residual, rows)


def test_rows_from_another_machine_equal_step(model, model_path, text_ids):
    """Disaggregated serving (issue 17.7): a storage node reads the raw 264-byte records at
    TableLocation.row_offset and ships them with their row ids; decode_rows(raw, row_ids=) on the
    compute node equals Session.step bit for bit, and a corrupted record is named by its row id."""
    from engram import DecodeError

    info = model.info
    fd = os.open(model_path, os.O_RDONLY)
    try:
        with model.session() as compute, model.session() as local:
            for tok in text_ids[:60]:
                ids = compute.step_rows(int(tok))  # the compute node hashes: uint32 [2, 24]
                want = local.step(int(tok))
                for li, lid in enumerate(model.layer_ids):
                    loc = info.tables[lid]
                    wire = b"".join(os.pread(fd, 264, loc.row_offset(int(r))) for r in ids[li])  # storage node
                    raw = np.frombuffer(wire, np.uint8).reshape(-1, 264)
                    assert np.array_equal(decode_rows(raw, row_ids=ids[li]), want[lid])
    finally:
        os.close(fd)
    bad = raw.copy()
    bad[5, 17] = 0x7F
    rid = int(ids[-1][5])
    out = np.full((24, 256), 7.0, np.float32)
    with pytest.raises(DecodeError, match=rf"row id {rid} \(record 5\) column 17") as e:
        decode_rows(bad, out, row_ids=ids[-1])
    assert (e.value.row, e.value.column) == (rid, 17) and np.all(out == 7.0)
    with pytest.raises(ArgumentError, match=r"row_ids must be integers of shape \[24\]"):
        decode_rows(raw, row_ids=ids[-1][:3])


# ---------------------------------------------------------------- gate epsilon, masks, messages (issue 17)
def test_gate_epsilon_is_a_parameter(model_path, text_ids):
    """EngramModel.open(eps=) and session(eps=) choose the gate epsilon; the file's value is the default.
    A residual with a tiny mean square shows the difference (SPEC §7: rsqrt(mean(h^2) + eps))."""
    from engram.codec import bf16_round
    from engram.mixer import gated_add, project

    default = EngramModel.open(model_path)
    assert default.eps == pytest.approx(1e-6) and default.info.sources["eps"].kind == "key"
    tiny = EngramModel.open(model_path, eps=1e-20)
    assert tiny.eps == 1e-20
    with pytest.raises(ArgumentError, match="eps must be a finite number >= 0"):
        EngramModel.open(model_path, eps=float("nan"))
    rng = np.random.default_rng(5)
    residual = bf16_round(rng.standard_normal((2, 4, 5120)).astype(np.float32) * np.float32(2e-4))
    gates = {}
    with default.session() as a, tiny.session() as b, default.session(eps=1e-20) as c:
        rows = np.stack([a.step(int(t))[14] for t in text_ids[:2]])
        for name, s in (("file", a), ("open", b), ("session", c)):
            g = np.zeros((2, 4), np.float32)
            s.apply(14, residual.copy(), rows, gates_out=g)
            gates[name] = g
        assert c.eps == 1e-20 and a.eps == default.eps
        with pytest.raises(ArgumentError, match="eps"):
            default.session(eps=-1.0)
    w = default.weights(14)
    for name, eps in (("file", default.eps), ("open", 1e-20)):
        want = np.zeros((2, 4), np.float32)
        gated_add(residual.copy(), project(rows, w.kv), w.q_norm, w.k_norm, eps, gates_out=want)
        assert np.array_equal(gates[name], want)
    assert np.array_equal(gates["open"], gates["session"])
    assert np.abs(gates["file"] - gates["open"]).max() > 0.01  # mean(h^2) ~ 4e-8 against eps 1e-6


MASKS_OK = {
    "bool": lambda m: m.astype(bool),
    "int64": lambda m: m.astype(np.int64),
    "uint8": lambda m: m.astype(np.uint8),
    "list of 0/1": lambda m: [int(x) for x in m],
    "list of bool": lambda m: [bool(x) for x in m],
}


@pytest.mark.parametrize("kind", sorted(MASKS_OK))
def test_one_mask_rule_accepts(model, text_ids, kind):
    """The same masks work at every entry point and mean the same thing."""
    from engram.codec import bf16_round

    ids = text_ids[:6]
    base = np.array([1, 1, 0, 1, 0, 1])
    mask = MASKS_OK[kind](base)
    ref_ids = Hasher(model.layout, model.token_map).hash(ids, base.astype(bool))
    assert np.array_equal(Hasher(model.layout, model.token_map).hash(ids, mask), ref_ids)
    with model.session() as s:
        p = s.prefill(ids, mask)
        assert np.array_equal(p.row_ids, ref_ids)
        rows = p.rows(14, timeout=60)
        residual = bf16_round(np.random.default_rng(1).standard_normal((6, 4, 5120)).astype(np.float32))
        before = residual.copy()
        gates = np.full((6, 4), -1.0, np.float32)
        s.apply(14, residual, rows, mask=mask, gates_out=gates)
    off = base == 0
    assert np.array_equal(residual[off], before[off]) and np.all(gates[off] == 0)
    assert not np.array_equal(residual[~off], before[~off]) and np.all(gates[~off] > 0)


MASKS_BAD = {
    "a 2": (np.array([1, 2, 0, 1, 0, 1]), "mask[1] = 2"),
    "floats": (np.ones(6, np.float32), "mask[0] = 1.0"),
    "strings": (np.array(["1"] * 6), "mask[0] = '1'"),
    "wrong length": (np.ones(5, bool), "mask must have shape [6]"),
    "object bools": (np.array([True] * 6, dtype=object),
                     "mask[0] = True: a mask holds bool or 0/1 integers, got dtype object (Python objects, not a "
                     "bool or integer array)"),
    "object ints": (np.array([1, 0, 1, 1, 0, 1], dtype=object), "mask[0] = 1: a mask holds bool or 0/1 integers, "
                                                                 "got dtype object"),
    "Nones": (np.array([None] * 6), "mask[0] = None: a mask holds bool or 0/1 integers, got dtype object"),
    "a list mixing None": ([True, None, True, True, False, True], "mask[0] = True: a mask holds bool or 0/1 "
                                                                  "integers, got dtype object"),
    "2-D": (np.ones((6, 1), bool), "mask must have shape [6]"),
}


@pytest.mark.parametrize("kind", sorted(MASKS_BAD))
def test_one_mask_rule_refuses_everywhere(model, text_ids, kind):
    from engram import MaskError, TokenError
    from engram.mixer import gated_add

    mask, needle = MASKS_BAD[kind]
    ids = text_ids[:6]
    residual = np.ones((6, 4, 5120), np.float32)
    rows = np.zeros((6, 24, 256), np.float32)
    w = np.ones((4, 5120), np.float32)
    calls = {
        "Hasher.hash": lambda s: Hasher(model.layout, model.token_map).hash(ids, mask),
        "Session.prefill": lambda s: s.prefill(ids, mask),
        "Session.apply": lambda s: s.apply(14, residual, rows, mask=mask),
        "gated_add": lambda s: gated_add(residual, np.ones((6, 5, 5120), np.float32), w, w, 1e-6, mask),
    }
    with model.session() as s:
        hist = s.snapshot()
        for name, call in calls.items():
            with pytest.raises(ArgumentError) as e:
                call(s)
            assert isinstance(e.value, MaskError) and isinstance(e.value, TokenError), name
            assert needle in str(e.value), (name, str(e.value))
        assert s.history == hist and np.all(residual == 1)


def test_apply_names_the_array_that_does_not_fit(model):
    """Issue 19.8: a residual of the wrong width is named as such (it used to blame kv)."""
    with model.session() as s:
        rows = np.zeros((1, 24, 256), np.float32)
        with pytest.raises(ArgumentError, match=r"residual must have shape \[T, 4, 5120\].*got \[1, 4, 4096\]"):
            s.apply(14, np.zeros((1, 4, 4096), np.float32), rows)
        with pytest.raises(ArgumentError, match=r"rows must have shape \[1, 24, 256\].*got \[2, 24, 256\]"):
            s.apply(14, np.zeros((1, 4, 5120), np.float32), np.zeros((2, 24, 256), np.float32))
        with pytest.raises(ArgumentError, match="layer 3 has no Engram table"):
            s.apply(3, np.zeros((1, 4, 5120), np.float32), rows)
    from engram.mixer import gated_add

    w = np.ones((4, 5120), np.float32)
    with pytest.raises(ArgumentError, match=r"residual must have shape \[T, 4, 5120\].*got \[1, 4, 4096\]"):
        gated_add(np.zeros((1, 4, 4096), np.float32), np.zeros((1, 5, 5120), np.float32), w, w, 1e-6)


def test_apply_refuses_non_finite_values_untouched(model, text_ids):
    """One NaN in the residual or the rows used to turn the whole residual and the gates NaN, in place.
    Now: ArgumentError naming the array, token, stream or row and column of the first one (C order), residual
    and gates_out untouched; a masked-off token is not read."""
    from engram.codec import bf16_round
    from tests.reference import first_non_finite_twin

    ids = text_ids[:3]
    with model.session() as s:
        rows = s.prefill(ids).rows(14, timeout=60)
        residual = bf16_round(np.random.default_rng(4).standard_normal((3, 4, 5120)).astype(np.float32))
        cases = [("residual", (1, 3, 4095), np.nan, "stream"), ("residual", (0, 0, 0), -np.inf, "stream"),
                 ("rows", (2, 23, 255), np.inf, "row"), ("rows", (0, 5, 17), np.nan, "row")]
        for name, idx, value, axis in cases:
            r, x = residual.copy(), rows.copy()
            (r if name == "residual" else x)[idx] = value
            before, gates = r.copy(), np.full((3, 4), -1.0, np.float32)
            with pytest.raises(ArgumentError) as e:
                s.apply(14, r, x, gates_out=gates)
            assert first_non_finite_twin(r if name == "residual" else x) == idx
            assert str(e.value) == (f"{name}[{idx[0]}, {idx[1]}, {idx[2]}] = {float(value)} (token {idx[0]}, {axis} "
                                    f"{idx[1]}, column {idx[2]}): {name} must be finite; residual and gates_out are "
                                    f"untouched"), str(e.value)
            assert np.array_equal(r, before, equal_nan=True) and np.all(gates == -1)
        # the NaN lies in a token the mask turns off: accepted, that token left as it was
        r, x = residual.copy(), rows.copy()
        r[1, 2, 7], x[1, 0, 0] = np.nan, np.inf
        gates = np.full((3, 4), -1.0, np.float32)
        s.apply(14, r, x, mask=[True, False, True], gates_out=gates)
        expected = residual[1].copy()
        expected[2, 7] = np.nan
        assert np.array_equal(r[1], expected, equal_nan=True)
        assert np.all(gates[1] == 0) and np.all(np.isfinite(gates)) and np.all(np.isfinite(r[[0, 2]]))


def test_closed_session_says_so(model):
    s = model.session()
    s.step(5)
    s.close()
    with pytest.raises(TableIOError, match="step: the session is closed; open a new one"):
        s.step(6)


def test_hasher_check_history(model):
    h = model.hasher
    ok = History([1, 2, 3])
    assert h.check_history(ok) is ok
    with pytest.raises(HistoryError, match="needs 3"):
        h.check_history(History([1, 2]))
    with pytest.raises(HistoryError, match="history id 2 is 99092"):
        h.check_history(History([1, 2, 99092]))
    with pytest.raises(HistoryError, match="must be an engram.History"):
        h.check_history((1, 2, 3))


@pytest.mark.parametrize("tensor, index, value", [("q_norm", (2, 17), np.nan), ("k_norm", (0, 0), -np.inf),
                                                  ("kv", (25599, 6143), np.inf), ("kv", (513, 3), np.nan)])
def test_weights_refuse_a_nan_or_an_infinity(model_path, tensor, index, value):
    """A corrupt weight is named (tensor, row, column, file offset) when the layer's weights are first read; the
    file written back, the same model reads them again (nothing cached from the failed read)."""
    m = EngramModel.open(model_path)
    lid = m.layer_ids[-1]
    loc = getattr(m.info.layers[lid], tensor)
    offset = loc.offset + int(np.ravel_multi_index(index, loc.shape)) * loc.dtype.itemsize
    with open(model_path, "r+b") as f:
        f.seek(offset)
        original = f.read(loc.dtype.itemsize)
        try:
            f.seek(offset)
            f.write(np.array(value, loc.dtype).tobytes())
            f.flush()
            with pytest.raises(FormatError) as exc:
                m.weights(lid)
            text = str(exc.value)
            assert f"tensor {loc.name} holds {float(value)} at row {index[0]}, column {index[1]}" in text
            assert f"(file offset {offset})" in text and str(model_path) in text
        finally:
            f.seek(offset)
            f.write(original)
    w = m.weights(lid)
    assert np.isfinite(getattr(w, tensor)).all()
