"""Synthetic models (engram.synth): deterministic, random-access row content that decodes (SPEC §5)
to finite, trained-looking values; full-size sparse models with real row ids and offsets > 2**33."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import ArgumentError, Hasher, Layout, OutputError, load_tokenizer, read_model, synth

from tests.modelfiles import SCALE, plan, token_map
from engram._checks import setting_number
from engram.gguf.write import bar_wanted

def _decode(raw: np.ndarray) -> np.ndarray:
    """SPEC §5 by ml_dtypes: float32 [n, 256] (exact products; no bf16 rounding needed for checks)."""
    codes = raw[:, :256].copy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scales = raw[:, 256:].copy().view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    return codes * np.repeat(scales, 32, axis=1)


@pytest.fixture(scope="module")
def text_tokens(shared_data) -> np.ndarray:
    text = (shared_data / "promessi_sposi.txt").read_text(encoding="utf-8")[:4000]
    return np.array(load_tokenizer().encode(text, add_special_tokens=False).ids, dtype=np.int64)


# ------------------------------------------------------------------ row content
def test_rows_are_valid_and_look_trained():
    raw = synth.table_rows(1, 0, 50_000, seed=0)
    assert raw.shape == (50_000, 264) and raw.dtype == np.uint8
    codes, scales = raw[:, :256], raw[:, 256:]
    assert not np.any((codes & 0x7F) == 0x7F), "NaN code"
    assert scales.min() == synth.SCALE_MIN and scales.max() == synth.SCALE_MAX
    assert np.all(np.bincount(scales.ravel() - synth.SCALE_MIN, minlength=8) > 40_000)  # all 8 used, ~evenly
    vals = _decode(raw)
    assert np.isfinite(vals).all()
    c = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert abs(float(c.mean())) < 1.0 and 150 < float(c.std()) < 170  # normal(0, 160) in code units
    assert float(np.abs(c).max()) == 448.0
    # roughly normal: ~68% within one sigma, ~95% within two
    within = [float(np.mean(np.abs(c) <= k * c.std())) for k in (1, 2)]
    assert 0.64 < within[0] < 0.72 and 0.93 < within[1] < 0.97
    # block scales vary, so magnitudes vary across each row's 8 blocks
    assert np.mean(scales.max(axis=1) != scales.min(axis=1)) > 0.99
    assert 0.3 < float(vals.std()) < 1.5


def test_rows_are_deterministic_and_keyed():
    a = synth.table_rows(14, 1000, 1010, seed=5)
    assert np.array_equal(a, synth.table_rows(14, 1000, 1010, seed=5))
    assert not np.array_equal(a, synth.table_rows(14, 1000, 1010, seed=6))
    assert not np.array_equal(a, synth.table_rows(1, 1000, 1010, seed=5))
    assert len({r.tobytes() for r in synth.table_rows(1, 0, 2000)}) == 2000


@settings(max_examples=40, deadline=None)
@given(layer=st.sampled_from([1, 14]), start=st.integers(0, 2**34), n=st.integers(0, 300),
       seed=st.sampled_from([0, 1, 2**64 - 1]))
def test_any_range_equals_its_rows(layer, start, n, seed):
    """Row r's bytes depend only on (seed, layer, r): ranges, single rows and scattered ids agree."""
    block = synth.table_rows(layer, start, start + n, seed)
    assert block.shape == (n, 264)
    if n:
        picks = np.array(sorted({0, n - 1, n // 2}), dtype=np.int64)
        assert np.array_equal(synth.rows_at(layer, start + picks, seed), block[picks])
        assert np.array_equal(synth.table_rows(layer, start + n - 1, start + n, seed)[0], block[-1])


def test_projection_content():
    kv = synth.engram_kv(1, seed=0, start=0, stop=64)
    assert kv.dtype == np.float16 and kv.shape == (64, 6144)
    assert np.array_equal(kv[10:20], synth.engram_kv(1, seed=0, start=10, stop=20))
    assert 0.018 < float(kv.astype(np.float32).std()) < 0.022 and np.isfinite(kv).all()
    assert synth.engram_kv(14, seed=0).shape == (25600, 6144)
    q = synth.norm_weight(14, "q", seed=2)
    assert q.dtype == np.float32 and q.shape == (4, 5120)
    assert abs(float(q.mean()) - 1.0) < 0.01 and 0.04 < float(q.std()) < 0.06
    with pytest.raises(ArgumentError):
        synth.norm_weight(1, "v")
    with pytest.raises(ArgumentError):
        synth.engram_kv(1, start=0, stop=25601)
    with pytest.raises(ArgumentError):
        synth.rows_at(1, np.array([-1]))
    with pytest.raises(ArgumentError):
        synth.table_rows(1, 10, 5)


# ------------------------------------------------------------------ plans and arguments
def test_plan_shapes_and_metadata_types():
    p = plan(optional_keys=True)
    lay = Layout.deepseek_v41_flash(SCALE)
    assert p.layout == lay
    md = p.metadata
    assert md["general.alignment"][0] == 16384
    assert md["deepseek41.engram.offsets"][0] == lay.offsets.reshape(-1).tolist()
    names = [t.name for t in p.tensors]
    assert names[-2:] == ["blk.1.engram_embd.weight", "blk.14.engram_embd.weight"]
    assert p.tensor("blk.1.engram_embd.weight").nbytes == int(lay.rows[0]) * 264


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="scale"):
        synth.plan_model(synth.ModelShape(token_map=token_map()))
    with pytest.raises(ArgumentError, match="scale"):
        synth.plan_model(synth.ModelShape(full_size=True, scale=0.5, token_map=token_map()))
    with pytest.raises(ArgumentError, match="shards"):
        plan(shards=9)
    with pytest.raises(ArgumentError, match="seed"):
        plan(seed=-1)
    with pytest.raises(ArgumentError, match="trace"):
        synth.build_model("/nonexistent/x.gguf", synth.ModelShape(full_size=True, token_map=token_map()),
                          progress=False)
    with pytest.raises(ArgumentError, match="fill"):
        synth.write_model(plan(), "/nonexistent/x.gguf", synth.Fill(tables="some"))


@pytest.mark.parametrize("make, field", [
    (lambda: synth.ModelShape(scale=0.0, token_map=token_map()), "scale"),
    (lambda: synth.ModelShape(scale=0.5, seed=-1), "seed"),
    (lambda: synth.ModelShape(scale=0.5, eps=2.0), "eps"),
    (lambda: synth.ModelShape(scale=0.5, token_map=np.zeros((2, 2), np.int64)), "token_map"),
    (lambda: synth.Fill(tables="rows"), "tables"),
    (lambda: synth.Fill(tables="trace"), "trace"),
    (lambda: synth.Writing(chunk_bytes=100), "chunk_bytes"),
])
def test_settings_name_the_bad_field(make, field):
    """The settings of the writer refuse a bad value when made, naming the field."""
    with pytest.raises(ArgumentError, match=field):
        make()


@pytest.mark.parametrize("kw,message", [
    (dict(shards=0), "ModelShape.shards = 0: expected a whole number in [1, 65535]"),
    (dict(shards="2"), "ModelShape.shards = '2': expected a whole number in [1, 65535]"),
    (dict(shards=2.0), "ModelShape.shards = 2.0: expected a whole number in [1, 65535]"),
    (dict(shards=True), "ModelShape.shards = True: expected a whole number in [1, 65535]"),
    (dict(shards=1 << 16), "ModelShape.shards = 65536: expected a whole number in [1, 65535]"),
    (dict(seed=1.0), "ModelShape.seed = 1.0: expected a whole number in [0, 18446744073709551615]"),
    (dict(scale=True), "ModelShape.scale = True: expected a finite number in (0, 1]"),
    (dict(scale="0.001"), "ModelShape.scale = '0.001': expected a finite number in (0, 1]"),
    (dict(scale=1.5), "ModelShape.scale = 1.5: expected a finite number in (0, 1]"),
    (dict(eps="1e-6"), "ModelShape.eps = '1e-6': expected a finite number in (0, 1)"),
    (dict(eps=float("nan")), "ModelShape.eps = nan: expected a finite number in (0, 1)"),
    (dict(full_size="no"), "ModelShape.full_size = 'no': expected True or False"),
    (dict(optional_keys=1), "ModelShape.optional_keys = 1: expected True or False"),
    (dict(vocabulary="false"), "ModelShape.vocabulary = 'false': expected True or False"),
    (dict(table_offset=-1), "ModelShape.table_offset = -1: expected a whole number in [0, 4611686018427387904]"),
    (dict(table_offset=4096.0), "ModelShape.table_offset = 4096.0: expected a whole number in [0, 4611686018427387904]"),
    (dict(layout="v41"), "ModelShape.layout = str: expected None or an engram.Layout"),
    (dict(tokenizer_json=3), "ModelShape.tokenizer_json = 3: expected None or a path"),
    (dict(token_map=np.zeros((2, 2), np.int64)), "ModelShape.token_map must be a non-empty 1-D integer array"),
])
def test_model_shape_refuses_a_bad_field_naming_it(kw, message):
    with pytest.raises(ArgumentError) as exc:
        synth.ModelShape(**{"scale": 0.001, **kw})
    assert str(exc.value).startswith(message), str(exc.value)


def test_model_shape_keeps_its_valid_values(tmp_path):
    shape = synth.ModelShape(scale=1, shards=np.int64(3), seed=2**64 - 1, eps=0.5, optional_keys=True,
                             table_offset=1 << 20, tokenizer_json=tmp_path / "t.json", vocabulary=False)
    assert (shape.scale, shape.shards, shape.seed, shape.eps, shape.table_offset) == (1.0, 3, 2**64 - 1, 0.5, 1 << 20)
    assert type(shape.shards) is int and shape.optional_keys is True and shape.vocabulary is False
    assert synth.ModelShape(full_size=True).full_size is True and synth.ModelShape(full_size=True, scale=1.0).scale == 1
    assert synth.ModelShape(layout=Layout.deepseek_v41_flash(SCALE)).layout.rows[0] == \
        Layout.deepseek_v41_flash(SCALE).rows[0]


@pytest.mark.parametrize("kw,message", [
    (dict(chunk_bytes=100), "Writing.chunk_bytes = 100: expected a whole number in [264, 1073741824]"),
    (dict(chunk_bytes=1 << 31), "Writing.chunk_bytes = 2147483648: expected a whole number in [264, 1073741824]"),
    (dict(chunk_bytes=65536.0), "Writing.chunk_bytes = 65536.0: expected a whole number in [264, 1073741824]"),
    (dict(chunk_bytes="64M"), "Writing.chunk_bytes = '64M': expected a whole number in [264, 1073741824]"),
    (dict(chunk_bytes=True), "Writing.chunk_bytes = True: expected a whole number in [264, 1073741824]"),
    (dict(sync="yes"), "Writing.sync = 'yes': expected True or False"),
    (dict(direct_io=0), "Writing.direct_io = 0: expected True or False"),
    (dict(parents=None), "Writing.parents = None: expected True or False"),
])
def test_writing_refuses_a_bad_field_naming_it(kw, message):
    with pytest.raises(ArgumentError) as exc:
        synth.Writing(**kw)
    assert str(exc.value) == message


def test_writing_keeps_its_valid_values():
    w = synth.Writing(chunk_bytes=np.int64(264), sync=True, direct_io=np.bool_(False), parents=True)
    assert (w.chunk_bytes, w.sync, w.direct_io, w.parents) == (264, True, False, True)
    assert type(w.chunk_bytes) is int and type(w.direct_io) is bool
    assert synth.Writing().chunk_bytes == synth.DEFAULT_CHUNK_BYTES == 64 << 20


def test_fill_defaults_to_the_trace_when_one_is_given():
    assert synth.Fill().tables == "all" and synth.Fill(trace=[1, 2]).tables == "trace"
    assert synth.Fill(tables="none", trace=[1]).tables == "none"


def test_disk_space_is_checked_before_writing(tmp_path):
    p = plan(full_size=True)
    with pytest.raises(OutputError, match="GiB of disk"):
        synth.write_model(p, tmp_path / "huge.gguf", synth.Fill(tables="all"), progress=False)
    assert not (tmp_path / "huge.gguf").exists()


# ------------------------------------------------------------------ sparse trace models
def _trace_checks(info, path_rows, trace, seed):
    rows = Hasher(info.layout, info.token_map).hash(trace)
    for li, lid in enumerate(info.layout.layer_ids):
        tab = info.tables[lid]
        used = np.unique(rows[:, li, :])
        unused = np.setdiff1d(np.random.default_rng(lid).integers(0, tab.rows, 200), used)
        with open(tab.path, "rb") as f:
            for r in np.concatenate([used[:40], used[-40:]]).tolist():
                f.seek(tab.row_offset(r))
                assert np.array_equal(np.frombuffer(f.read(264), np.uint8), synth.rows_at(lid, [r], seed)[0])
            for r in unused[:60].tolist():
                f.seek(tab.row_offset(r))
                assert f.read(264) == bytes(264), (lid, r)
        path_rows[lid] = used
    return rows


def test_full_size_sparse_model(tmp_path, text_tokens):
    """The released layout: 384M rows a table, tables at the released offsets (> 2**33), only the
    trace's rows written; the rest are holes that read as zeros and take no disk."""
    trace = text_tokens[:300]
    (path,) = synth.build_model(tmp_path / "full.gguf", synth.ModelShape(full_size=True, seed=7, token_map=token_map()),
                                synth.Fill(trace=trace, projections=False), progress=False)
    info = read_model(path)
    assert [int(r) for r in info.layout.rows] == [384006168, 384016682]
    assert info.layout == Layout.deepseek_v41_flash()
    assert [info.tables[1].offset, info.tables[14].offset] == [synth.REAL_TABLE_OFFSET, 264_333_279_232]
    assert min(t.offset for t in info.tables.values()) > 2**33
    assert info.file_sizes[0] == 365_713_686_528  # the released file's size (SPEC §6: 365.7 GB)
    got = {}
    rows = _trace_checks(info, got, trace, seed=7)
    assert int(rows.max()) > 2**28 and info.tables[14].row_offset(int(got[14][-1])) > 2**38
    st_ = os.stat(path)
    assert st_.st_blocks * 512 < 96 << 20  # a few MB of a 365.7 GB file
    assert shutil.disk_usage(tmp_path).free > 1 << 30


def test_small_trace_model_and_cli(tmp_path, text_tokens, capsys, monkeypatch):
    """`engram synth --trace-tokens` at a small scale, then `engram inspect`; rows match table_rows."""
    from engram.cli import main
    import engram.tokenmap

    monkeypatch.setattr(engram.tokenmap, "build_token_map", lambda *a, **k: token_map().copy())
    tokens = tmp_path / "trace.txt"
    tokens.write_text(" ".join(str(int(t)) for t in text_tokens[:200]))
    out = tmp_path / "t.gguf"
    assert main(["synth", str(out), "--scale", "0.001", "--trace-tokens", str(tokens), "--seed", "11",
                 "--no-projections", "--shards", "2", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    paths = [Path(f["path"]) for f in rec["files"]]
    assert [p.name for p in paths] == ["t-00001-of-00002.gguf", "t-00002-of-00002.gguf"]
    info = read_model(paths[1])
    assert info.layout == Layout.deepseek_v41_flash(0.001)
    assert info.tables[1].path == paths[1] == info.tables[14].path
    _trace_checks(info, {}, text_tokens[:200], seed=11)
    assert main(["inspect", str(paths[0])]) == 0
    assert "blk.14.engram_embd.weight" in capsys.readouterr().out
    assert main(["synth", str(tmp_path / "x.gguf")]) == 2
    assert "--scale" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["synth", "--help"])
    assert e.value.code == 0


@pytest.mark.parametrize("where", ["direct", "buffered", "direct refused"])
def test_full_tables_stream_in_chunks(tmp_path, where, monkeypatch):
    """fill='all' with tiny chunks: every row of both tables equals table_rows (many chunk boundaries),
    written with O_DIRECT, buffered, or buffered after the file system refuses a direct write (EINVAL,
    as some network file systems do; simulated, since the local ones here accept O_DIRECT)."""
    opened = []
    real_open, real_write = synth._open_direct, synth._pwrite_all
    monkeypatch.setattr(synth, "_open_direct", lambda name: opened.append(real_open(name)) or opened[-1])
    if where == "direct refused":
        def refuse(fd, data, offset):
            if fd in opened:
                raise OSError(errno.EINVAL, "Invalid argument")
            real_write(fd, data, offset)
        monkeypatch.setattr(synth, "_pwrite_all", refuse)
    p = plan(scale=0.0001, seed=9)
    (path,) = synth.write_model(p, tmp_path / "all.gguf", synth.Fill(tables="all", projections=False), progress=False,
                                writing=synth.Writing(chunk_bytes=100_000, direct_io=where != "buffered"))
    _check_all_rows(path)
    assert len(opened) == (0 if where == "buffered" else 1)
    assert all(fd is not None for fd in opened)


def _check_all_rows(path):
    info = read_model(path)
    with open(path, "rb") as f:
        for lid, tab in info.tables.items():
            f.seek(tab.offset)
            data = np.frombuffer(f.read(tab.nbytes), np.uint8).reshape(tab.rows, 264)
            assert np.array_equal(data, synth.table_rows(lid, 0, tab.rows, 9))
        kv = info.layers[1].kv
        f.seek(kv.offset)
        assert f.read(4096) == bytes(4096)  # projections=False leaves holes


def test_writer_settings_of_the_wrong_kind_are_named(tmp_path):
    out = tmp_path / "m.gguf"
    with pytest.raises(ArgumentError, match=r"^shape must be an engram\.synth\.ModelShape\(\.\.\.\), got float 0\.0005$"):
        synth.build_model(out, 0.0005)
    with pytest.raises(ArgumentError, match=r"^fill must be an engram\.synth\.Fill\(\.\.\.\), got str 'none'$"):
        synth.build_model(out, synth.ModelShape(scale=0.0001), "none")
    with pytest.raises(ArgumentError, match=r"^shape must be an engram\.synth\.ModelShape"):
        synth.plan_model({"scale": 0.0001})
    plan = synth.plan_model(synth.ModelShape(scale=0.0001))
    with pytest.raises(ArgumentError, match=r"^writing must be an engram\.synth\.Writing\(\.\.\.\), got dict"):
        synth.write_model(plan, out, writing={"parents": True})
    with pytest.raises(ArgumentError, match=r"pass Fill\(trace=token ids\) or Fill\(tables='none'\)"):
        synth.build_model(out, synth.ModelShape(full_size=True))
    assert not out.exists()


def test_numbers_past_a_float_and_offsets_past_off_t_are_refused(tmp_path):
    """An integer past a float's range raised OverflowError from every number field (ModelShape.scale, eps); a
    table_offset past 2**62 failed while writing (struct.error, or OverflowError at 2**63)."""
    with pytest.raises(ArgumentError, match=r"^ModelShape\.scale = 1000000000.*\.\.\.: expected a finite number in "
                                            r"\(0, 1\]$"):
        synth.ModelShape(scale=10 ** 400)
    with pytest.raises(ArgumentError, match=r"^ModelShape\.eps = .*: expected a finite number in \(0, 1\)$"):
        synth.ModelShape(scale=SCALE, eps=10 ** 400)
    assert setting_number("X.t", 10 ** 400, 0.0, finite=False) == float("inf")
    assert setting_number("X.t", -(10 ** 400), finite=False) == float("-inf")
    with pytest.raises(ArgumentError, match=r"^ModelShape\.table_offset = 1180591620717411303424: expected a whole "
                                            r"number in \[0, 4611686018427387904\]$"):
        synth.ModelShape(scale=SCALE, table_offset=2 ** 70)
    assert synth.ModelShape(scale=SCALE, table_offset=synth.MAX_TABLE_OFFSET).table_offset == 1 << 62


def test_bar_wanted_on_a_closed_stream_and_numpy_bools():
    """A closed stream is no terminal (isatty raised ValueError); numpy's bools are the bools they hold."""
    import io
    s = io.StringIO()
    s.close()
    assert bar_wanted("auto", s) is False and bar_wanted(True, s) is False and bar_wanted("bar", s) is True
    assert bar_wanted(np.bool_(False)) is False and bar_wanted(np.bool_(True), object()) is False
    with pytest.raises(ArgumentError, match=r"^progress must be a bool or one of auto, bar, lines, off, got 1$"):
        bar_wanted(1)
