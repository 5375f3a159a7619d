"""GGUF reading (SPEC §6): synthetic models open with gguf's own reader and gguf-dump, and
``read_model`` round-trips them, split sets included, from headers only."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, TokenType
from hypothesis import given, settings, strategies as st

import engram
from engram import ArgumentError, FormatError, Layout, read_model, synth
from engram.gguf import check_finite, header as gguf_header

from tests.modelfiles import SCALE, plan, token_map, write_header_only

SEED = 3
P = "deepseek41.engram."


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A complete small model; 1 MiB chunks so tables and engram_kv span many chunks."""
    d = tmp_path_factory.mktemp("small")
    (path,) = synth.build_model(d / "small.gguf", synth.ModelShape(scale=SCALE, seed=SEED, token_map=token_map()),
                                progress=False, writing=synth.Writing(chunk_bytes=1 << 20))
    return path


@pytest.fixture(scope="module")
def small_reader(small) -> GGUFReader:
    """``gguf``'s own reader of ``small`` (it takes seconds over the 256k strings of the vocabulary: once)."""
    return GGUFReader(small)


@pytest.fixture(scope="module")
def split3(tmp_path_factory) -> list:
    """A split set without the vocabulary (``gguf.GGUFReader`` reads every shard here; a split set with it is
    in ``test_vocabulary.py``)."""
    d = tmp_path_factory.mktemp("split")
    return synth.build_model(d / "sp.gguf",
                             synth.ModelShape(scale=SCALE, seed=SEED, shards=3, token_map=token_map(),
                                              vocabulary=False), synth.Fill(projections=False), progress=False)


# ------------------------------------------------------------------ gguf's own tools
def test_gguf_reader_sees_spec_keys_types_and_shapes(small_reader):
    r = small_reader
    lay = Layout.deepseek_v41_flash(SCALE)

    def field(key, types, value=None):
        f = r.fields[key]
        assert f.types == types, key
        if value is not None:
            assert f.contents() == value, key
        return f

    S, U32, U64, A = GGUFValueType.STRING, GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.ARRAY
    field("general.architecture", [S], "deepseek41")
    field("general.alignment", [U32], 16384)
    field(P + "encoding", [S], "e4m3_e8m0_32_row264")
    field(P + "layer_ids", [A, U32], [1, 14])
    field(P + "rows", [A, U32], [int(x) for x in lay.rows])
    field(P + "compressed_vocab_size", [U32], 99092)
    field(P + "pad_id", [U32], 2)
    assert field(P + "token_map", [A, U32]).contents() == token_map().tolist()
    field(P + "primes", [A, U32], lay.primes.reshape(-1).tolist())
    field(P + "multipliers", [A, U64], [int(x) for x in lay.multipliers.reshape(-1)])
    eps = field("deepseek41.attention.layer_norm_rms_epsilon", [GGUFValueType.FLOAT32]).contents()
    assert eps == pytest.approx(1e-6, rel=1e-6)
    # the vocabulary, under the gguf package's tokenizer keys as llama.cpp's converters write them
    field("tokenizer.ggml.model", [S], "gpt2")
    field("tokenizer.ggml.pre", [S], "deepseek-v3")
    tokens = field("tokenizer.ggml.tokens", [A, S]).contents()
    assert len(tokens) == 129280 and tokens[270] == "Ġthe" and tokens[294] == "Ġof"
    assert tokens[0] == "<｜begin▁of▁sentence｜>" and tokens[129279] == "<｜image｜>"
    types = field("tokenizer.ggml.token_type", [A, GGUFValueType.INT32]).contents()
    assert (types[0], types[270], types[128803]) == (TokenType.CONTROL, TokenType.NORMAL, TokenType.USER_DEFINED)
    merges = field("tokenizer.ggml.merges", [A, S]).contents()
    assert len(merges) == 127741 and merges[:2] == ["Ġ t", "Ġ a"]
    field("tokenizer.ggml.bos_token_id", [U32], 0)
    field("tokenizer.ggml.eos_token_id", [U32], 1)
    assert r.alignment == 16384
    shapes = {t.name: (t.tensor_type, [int(x) for x in t.shape]) for t in r.tensors}
    F16, F32, I8 = GGMLQuantizationType.F16, GGMLQuantizationType.F32, GGMLQuantizationType.I8
    assert shapes == {
        "blk.1.engram_kv.weight": (F16, [6144, 25600]), "blk.14.engram_kv.weight": (F16, [6144, 25600]),
        "blk.1.engram_q_norm.weight": (F32, [5120, 4]), "blk.14.engram_q_norm.weight": (F32, [5120, 4]),
        "blk.1.engram_k_norm.weight": (F32, [5120, 4]), "blk.14.engram_k_norm.weight": (F32, [5120, 4]),
        "blk.1.engram_embd.weight": (I8, [264, int(lay.rows[0])]),
        "blk.14.engram_embd.weight": (I8, [264, int(lay.rows[1])]),
    }
    # the tables come last, in layer order
    assert [t.name for t in r.tensors][-2:] == ["blk.1.engram_embd.weight", "blk.14.engram_embd.weight"]
    assert r.tensors[-2].data.shape == (int(lay.rows[0]), 264)


def test_gguf_dump_lists_keys_and_tensors(small):
    exe = Path(sys.executable).with_name("gguf-dump")
    out = subprocess.run([str(exe), "--json", str(small)], capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    md = d["metadata"]
    assert md["general.architecture"]["value"] == "deepseek41"
    assert md["general.alignment"] == {**md["general.alignment"], "type": "UINT32", "value": 16384}
    assert md[P + "encoding"]["value"] == "e4m3_e8m0_32_row264"
    for key, sub in (("layer_ids", "UINT32"), ("rows", "UINT32"), ("token_map", "UINT32"), ("primes", "UINT32"),
                     ("multipliers", "UINT64")):
        assert md[P + key]["type"] == "ARRAY" and md[P + key]["array_types"] == [sub], key
    assert md[P + "compressed_vocab_size"]["type"] == "UINT32"
    assert md["deepseek41.attention.layer_norm_rms_epsilon"]["type"] == "FLOAT32"
    assert md["tokenizer.ggml.tokens"]["type"] == "ARRAY" and md["tokenizer.ggml.tokens"]["array_types"] == ["STRING"]
    assert md["tokenizer.ggml.model"]["value"] == "gpt2"
    t = d["tensors"]
    assert t["blk.14.engram_kv.weight"]["shape"] == [6144, 25600] and t["blk.14.engram_kv.weight"]["type"] == "F16"
    assert t["blk.1.engram_embd.weight"]["type"] == "I8"
    assert t["blk.1.engram_embd.weight"]["shape"] == [264, int(Layout.deepseek_v41_flash(SCALE).rows[0])]


# ------------------------------------------------------------------ read_model round trip
def test_read_model_round_trip(small, small_reader):
    info = read_model(small)
    assert isinstance(info, engram.ModelInfo)
    assert info.layout == Layout.deepseek_v41_flash(SCALE)
    assert info.token_map.dtype == np.int32 and np.array_equal(info.token_map, token_map())
    assert info.eps == pytest.approx(1e-6, rel=1e-6)
    assert (info.architecture, info.version, info.alignment, info.encoding) == \
        ("deepseek41", 3, 16384, "e4m3_e8m0_32_row264")
    assert info.paths == (Path(small),) and info.file_sizes == (os.stat(small).st_size,)
    r = small_reader
    by_name = {t.name: t for t in r.tensors}
    assert set(info.tensors) == set(by_name)
    for name, loc in info.tensors.items():
        t = by_name[name]
        assert loc.offset == t.data_offset and loc.nbytes == t.n_bytes, name
        assert loc.gguf_shape == tuple(int(x) for x in t.shape) and loc.ggml_type == t.tensor_type, name
        assert loc.offset % 16384 == 0
    for li, lid in enumerate((1, 14)):
        tab = info.tables[lid]
        assert tab.rows == int(info.layout.rows[li]) and tab.row_bytes == 264
        assert tab.offset == by_name[f"blk.{lid}.engram_embd.weight"].data_offset
        assert tab.path == Path(small) and tab.shard == 0
        layer = info.layers[lid]
        assert layer.table is tab
        assert (layer.kv.shape, layer.kv.dtype) == ((25600, 6144), np.dtype("<f2"))
        assert (layer.q_norm.shape, layer.q_norm.dtype) == ((4, 5120), np.dtype("<f4"))
        assert layer.k_norm.name == f"blk.{lid}.engram_k_norm.weight"
    assert info.tables[14].offset == info.tables[1].offset + -(-info.tables[1].nbytes // 16384) * 16384
    assert info.metadata["engram.synth.seed"].value == SEED


def test_table_bytes_equal_table_rows(small):
    info = read_model(small)
    rng = np.random.default_rng(0)
    with open(small, "rb") as f:
        for lid, tab in info.tables.items():
            per_chunk = (1 << 20) // 264
            picks = {0, 1, tab.rows - 1, per_chunk - 1, per_chunk, 5 * per_chunk + 7}
            picks |= set(rng.integers(0, tab.rows, 20).tolist())
            for row in sorted(picks):
                f.seek(tab.row_offset(row))
                got = np.frombuffer(f.read(264), np.uint8)
                assert np.array_equal(got, synth.table_rows(lid, row, row + 1, SEED)[0]), (lid, row)
            f.seek(tab.offset + 1000 * 264)
            block = np.frombuffer(f.read(300 * 264), np.uint8).reshape(300, 264)
            assert np.array_equal(block, synth.table_rows(lid, 1000, 1300, SEED))
            f.seek(tab.end)  # padding after the table reads as zeros
            assert set(f.read(64)) <= {0}


def test_projection_tensors_read_back(small):
    info = read_model(small)
    kv = info.read_tensor("blk.14.engram_kv.weight")
    assert kv.dtype == np.float16 and kv.shape == (25600, 6144)
    assert np.array_equal(kv[:300], synth.engram_kv(14, SEED, 0, 300))
    assert np.array_equal(kv[-5:], synth.engram_kv(14, SEED, 25595, 25600))
    assert 0.015 < float(kv[::97].astype(np.float32).std()) < 0.025
    qn = info.read_tensor("blk.1.engram_q_norm.weight")
    assert np.array_equal(qn, synth.norm_weight(1, "q", SEED))
    assert np.array_equal(info.read_tensor("blk.1.engram_k_norm.weight"), synth.norm_weight(1, "k", SEED))
    assert not np.array_equal(qn, synth.norm_weight(1, "k", SEED))
    with pytest.raises(ArgumentError, match="Engram table"):
        info.read_tensor("blk.1.engram_embd.weight")
    with pytest.raises(ArgumentError, match="no tensor"):
        info.read_tensor("blk.2.engram_kv.weight")


def test_read_model_reads_headers_only_and_allocates_little(small, monkeypatch):
    reads = []
    real = gguf_header._pread

    def watch(fd, n, off):
        reads.append((off, n))
        return real(fd, n, off)

    monkeypatch.setattr(gguf_header, "_pread", watch)
    tracemalloc.start()
    try:
        info = read_model(small)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    first_table = min(t.offset for t in info.tables.values())
    assert reads and max(off + n for off, n in reads) <= info.data_offsets[0] + (1 << 16) < first_table
    assert sum(n for _, n in reads) < 2 * info.data_offsets[0]
    assert peak < 8 << 20  # the token map (517 KB) plus small change; never a table


# ------------------------------------------------------------------ split sets
def test_split_set_from_any_shard_and_from_list(split3):
    assert [p.name for p in split3] == [f"sp-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    infos = [read_model(p) for p in split3]
    shuffled = list(split3)
    random.Random(1).shuffle(shuffled)
    infos.append(read_model(shuffled))
    infos.append(read_model([str(p) for p in split3]))
    for info in infos:
        assert info.paths == tuple(split3)
        assert info.layout == Layout.deepseek_v41_flash(SCALE)
        assert np.array_equal(info.token_map, token_map())
        assert info.tables[1].path == split3[1] and info.tables[14].path == split3[2]
        assert info.tables[1].offset % 16384 == 0 and info.tables[14].offset % 16384 == 0
        assert (info.tables[1].shard, info.tables[14].shard) == (1, 2)
        assert info.layers[14].kv.path == split3[0]
    for shard, p in enumerate(split3):
        r = GGUFReader(p)
        assert r.fields["split.no"].contents() == shard
        assert r.fields["split.count"].contents() == 3
        assert r.fields["split.tensors.count"].contents() == 8
        assert ("general.architecture" in r.fields) == (shard == 0)
        for t in r.tensors:
            loc = infos[0].tensors[t.name]
            assert (loc.path, loc.offset, loc.nbytes) == (p, t.data_offset, t.n_bytes)
    tab = infos[0].tables[14]
    with open(tab.path, "rb") as f:
        f.seek(tab.row_offset(4321))
        assert np.array_equal(np.frombuffer(f.read(264), np.uint8), synth.table_rows(14, 4321, 4322, SEED)[0])


@pytest.mark.parametrize("shards", [2, 8])
def test_other_shard_counts(tmp_path, shards):
    paths = write_header_only(plan(shards=shards), tmp_path / "m.gguf")
    assert len(paths) == shards
    info = read_model(paths[-1])
    assert info.paths == tuple(paths)
    assert info.tables[14].path == paths[-1]
    assert len(info.tensors) == 8


# ------------------------------------------------------------------ tolerated variants
def test_other_integer_types_and_optional_keys_are_accepted(tmp_path):
    p = plan(optional_keys=True)
    md = p.metadata
    I32, U64, I64 = GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64
    for key, sub in (("layer_ids", I32), ("rows", U64), ("token_map", I32), ("primes", U64),
                     ("multipliers", I64), ("offsets", U64)):
        v, t, _ = md[P + key]
        md[P + key] = (v, t, sub)
    md[P + "compressed_vocab_size"] = (99092, U64, None)
    md[P + "pad_id"] = (2, I32, None)
    md[P + "head_count"] = (8, GGUFValueType.UINT16, None)
    md["deepseek41.attention.layer_norm_rms_epsilon"] = (1e-5, GGUFValueType.FLOAT64, None)
    md["deepseek41.vocab_size"] = (129280, GGUFValueType.UINT32, None)
    (path,) = write_header_only(p, tmp_path / "ints.gguf")
    info = read_model(path)
    assert info.layout == Layout.deepseek_v41_flash(SCALE)
    assert np.array_equal(info.token_map, token_map()) and info.token_map.dtype == np.int32
    assert info.eps == 1e-5
    assert info.metadata[P + "rows"].subtype == U64


def test_full_size_header_reports_real_rows_and_offsets(tmp_path):
    """Header-only full-size file: real rows, the released table offsets (SPEC §6), > 2**33."""
    (path,) = write_header_only(plan(full_size=True), tmp_path / "full.gguf")
    info = read_model(path)
    assert [t.rows for t in info.tables.values()] == [384006168, 384016682]
    assert [t.offset for t in info.tables.values()] == [162_955_640_832, 264_333_279_232]
    assert all(t.offset > 2**33 for t in info.tables.values())
    assert info.file_sizes[0] == info.tables[14].end + (-info.tables[14].end % 16384)
    # holes: a 365.7 GB file in its header (5.5 MiB with the vocabulary) and a few hundred KB
    assert os.stat(path).st_blocks * 512 < info.data_offsets[0] + (1 << 20)
    assert info.tables[14].row_offset(384016681) == 264_333_279_232 + 384016681 * 264
    with pytest.raises(ArgumentError):
        info.tables[14].row_offset(384016682)


def test_inspect_cli(small, capsys):
    from engram.cli import main

    assert main(["inspect", str(small), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    info = read_model(small)
    assert d["tables"]["14"]["offset"] == info.tables[14].offset
    assert d["layout"]["rows"] == [int(r) for r in info.layout.rows]
    assert {t["name"] for t in d["tensors"]} == set(info.tensors)
    assert main(["inspect", str(small)]) == 0
    out = capsys.readouterr().out
    assert "blk.14.engram_embd.weight" in out and f"{info.tables[1].offset:,}" in out
    assert main(["inspect", str(small) + ".missing"]) == 2
    assert "no such model file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["inspect", "--help"])
    assert e.value.code == 0


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from([np.float16, np.float32, np.float64]), byteorder=st.sampled_from(["<", ">"]),
       shape=st.sampled_from([(7,), (3, 5), (1100, 3), (2, 3, 4), (513, 1)]),
       bad=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([np.nan, np.inf, -np.inf])), max_size=3),
       data=st.data())
def test_check_finite_is_numpy_isfinite(dtype, byteorder, shape, bad, data):
    """check_finite's exponent-bit test against numpy.isfinite: raises iff a value is not finite, and names the
    first in C order with its file offset; the largest, subnormal and signed-zero values pass."""
    fin = np.finfo(dtype)
    pool = np.array([0.0, -0.0, 1.0, fin.max, -fin.max, fin.tiny, fin.tiny / 4, -fin.tiny / 4], dtype)
    a = pool[np.asarray(data.draw(st.lists(st.integers(0, pool.size - 1), min_size=int(np.prod(shape)),
                                           max_size=int(np.prod(shape)))), dtype=np.int64)].reshape(shape)
    for i, v in bad:
        a.reshape(-1)[i % a.size] = v
    a = a.astype(a.dtype.newbyteorder(byteorder))  # either byte order: the same values
    loc = SimpleNamespace(path="m.gguf", name="blk.1.engram_kv.weight", offset=4096)
    bad_at = np.flatnonzero(~np.isfinite(a))
    if not bad_at.size:
        check_finite(loc, a)
        return
    with pytest.raises(FormatError) as exc:
        check_finite(loc, a)
    i = int(bad_at[0])
    idx = np.unravel_index(i, shape)
    where = (f"row {idx[0]}, column {idx[1]}" if len(shape) == 2 else
             f"index {idx[0]}" if len(shape) == 1 else f"index {tuple(int(x) for x in idx)}")
    assert f"holds {float(a.reshape(-1)[i])} at {where} (file offset {4096 + i * a.itemsize})" in str(exc.value)


def test_check_finite_needs_the_tensor_as_read():
    loc = SimpleNamespace(path="m.gguf", name="blk.1.engram_q_norm.weight", offset=0)
    for data, why in ((np.ones((3, 4), np.float32).T, "ndarray (not C-contiguous)"),
                      ([1.0, float("nan")], "list")):
        with pytest.raises(ArgumentError) as exc:
            check_finite(loc, data)
        assert str(exc.value).startswith("blk.1.engram_q_norm.weight: check_finite needs the tensor as read")
        assert str(exc.value).endswith(f"got {why}")
