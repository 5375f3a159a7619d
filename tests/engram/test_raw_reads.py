"""Raw reads: the stored 264-byte records of a batch, deduplicated, in token order (Table/TableGroup.read_raw)."""

from __future__ import annotations

import numpy as np
import pytest

from engram import ArgumentError, DecodeError, RowRangeError, Table, TableGroup, decode_rows, synth
from tests.modelfiles import SCALE, token_map as _token_map
from engram.gguf import read_model


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    path = tmp_path_factory.mktemp("raw") / "m.gguf"
    synth.build_model(path, synth.ModelShape(scale=SCALE, token_map=_token_map(), seed=5),
                      synth.Fill(projections=False), progress=False)
    info = read_model(path)
    ts = [Table(info.tables[lid].path, info.tables[lid].offset, info.tables[lid].rows, readers=4)
          for lid in info.layout.layer_ids]
    yield info, ts
    for t in ts:
        t.close()


def test_read_raw_is_the_stored_records_in_token_order(tables):
    info, ts = tables
    rng = np.random.default_rng(1)
    ids = rng.integers(0, ts[0].rows, size=(7, 24), dtype=np.uint32)
    ids[3] = ids[1]  # repeats across tokens are read once and copied
    raw = ts[0].read_raw(ids)
    assert raw.dtype == np.uint8 and raw.shape == (7, 24, 264)
    expect = synth.rows_at(info.layout.layer_ids[0], ids.reshape(-1), seed=5).reshape(7, 24, 264)
    assert np.array_equal(raw, expect)
    assert ts[0].last_stats.rows_distinct == len(np.unique(ids))
    assert np.array_equal(decode_rows(raw.reshape(-1, 264)).reshape(7, 24, 256), ts[0].read_batch(ids))


def test_group_read_raw_into_caller_buffer(tables):
    info, ts = tables
    with TableGroup(ts, 24) as g:
        rng = np.random.default_rng(2)
        ids = np.concatenate([rng.integers(0, ts[0].rows, (5, 24)), rng.integers(0, ts[1].rows, (5, 24))],
                             axis=1).astype(np.uint32)
        out = np.zeros((5, 48, 264), np.uint8)
        assert g.read_raw(ids, out) is out
        for i, lid in enumerate(info.layout.layer_ids):
            part = ids[:, i * 24:(i + 1) * 24].reshape(-1)
            assert np.array_equal(out[:, i * 24:(i + 1) * 24].reshape(-1, 264), synth.rows_at(lid, part, seed=5))


def test_read_raw_refuses_bad_out_and_ids_untouched(tables):
    _, ts = tables
    ids = np.zeros((2, 24), np.uint32)
    for bad in (np.zeros((2, 24, 264), np.float32), np.zeros((2, 24, 256), np.uint8),
                np.zeros((2, 24, 264 * 2), np.uint8)[:, :, ::2]):
        with pytest.raises(ArgumentError, match="uint8"):
            ts[0].read_raw(ids, bad)
    out = np.full((2, 24, 264), 7, np.uint8)
    ids[1, 5] = ts[0].rows
    with pytest.raises(RowRangeError, match="token 1, column 5"):
        ts[0].read_raw(ids, out)
    assert np.all(out == 7)


def test_read_raw_checks_records(tmp_path):
    rows = synth.rows_at(1, np.arange(64), seed=0)
    rows[9, 3] = 0x7F  # an E4M3 NaN code
    path = tmp_path / "t.bin"
    path.write_bytes(rows.tobytes())
    with Table(path, 0, 64, backend="serial") as t:
        out = np.full((1, 2, 264), 7, np.uint8)
        with pytest.raises(DecodeError) as e:
            t.read_raw(np.array([[1, 9]]), out)
        assert e.value.row == 9 and np.all(out == 7)
        assert np.array_equal(t.read_raw(np.array([[8, 10]]))[0], rows[[8, 10]])
