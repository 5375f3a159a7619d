"""sim.trace.iolog: the engine's reads of a trace as an fio I/O log (issue 14.8).

The plan is checked against the engine's own read counts (``ReadStats.reads`` and ``bytes_read`` of real
uncached reads of a real model file), and the written log is replayed by the real fio, whose counts must be
exactly the plan's.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import EngramModel, Table, TableGroup, synth
from engram.codec import ROW_BYTES
from engram.errors import ArgumentError, RowRangeError
from sim.trace import Trace, load_trace
from sim.trace.iolog import (DEFAULT_BLOCK, IoPlan, engine_block, model_tables, plan_reads, released_tables,
                             span_cap)
from tests.modelfiles import token_map

STEPS = 120
FIO = shutil.which("fio")
need_fio = pytest.mark.skipif(FIO is None, reason="fio is not installed")


@pytest.fixture(scope="module")
def trace() -> Trace:
    return load_trace(f"synth:reuse=0.225,tokens={STEPS},seed=2")


@pytest.fixture(scope="module")
def small(tmp_path_factory, trace):
    """A reduced-scale V4.1 model (~100k rows a table) whose rows of the trace are written."""
    path = tmp_path_factory.mktemp("iolog") / "small.gguf"
    synth.build_model(path, synth.ModelShape(scale=0.0003, token_map=token_map()),
                      synth.Fill(trace=trace.tokens, projections=False), progress=False)
    return path


@pytest.fixture(scope="module")
def full(tmp_path_factory, trace):
    """A full-size sparse V4.1 model: tables at the released offsets, only the trace's rows written."""
    path = tmp_path_factory.mktemp("iolog") / "full.gguf"
    synth.build_model(path, synth.ModelShape(full_size=True, token_map=token_map()),
                      synth.Fill(trace=trace.tokens, projections=False), progress=False)
    return path


def fio_counts(log, *args) -> dict:
    out = subprocess.run([FIO, "--name=engram", f"--read_iolog={log}", "--direct=1", "--readonly",
                          "--output-format=json", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    assert job["error"] == 0
    return {"ios": job["read"]["total_ios"], "bytes": job["read"]["io_bytes"], "ms": job["job_runtime"]}


# ------------------------------------------------------------------ the layout
def test_released_tables_are_the_spec_offsets():
    t = released_tables()
    assert [x.offset for x in t] == [162_955_640_832, 264_333_279_232]      # SPEC §6
    assert [x.rows for x in t] == [384006168, 384016682] and [x.layer_id for x in t] == [1, 14]


def test_full_size_model_has_the_released_offsets(full):
    tables, layout, _ = model_tables(full)
    assert [(t.layer_id, t.offset, t.rows) for t in tables] == [(t.layer_id, t.offset, t.rows)
                                                               for t in released_tables()]
    assert all(t.path == str(full.resolve()) for t in tables)


# --------------------------------------------------------- the engine's reads
@pytest.fixture(scope="module")
def group(small):
    tables, layout, _ = model_tables(small)
    out = {}
    for block in (512, 4096):
        ts = [Table(t.path, t.offset, t.rows, backend="serial", block_size=block) for t in tables]
        if not ts[0].direct:
            pytest.skip("O_DIRECT refused on the test file system: the engine reads unaligned")
        out[block] = TableGroup(ts, layout.columns)
    yield tables, layout, out
    for g in out.values():
        for t in g.tables:
            t.close()
        g.close()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_step_plan_equals_the_engine_reads(group, data):
    """Random steps whose rows crowd a few blocks (shared blocks, touching spans, the span cap, duplicates):
    the plan's reads and bytes are the engine's."""
    tables, layout, groups = group
    block = data.draw(st.sampled_from(sorted(groups)))
    ids = np.empty((1, 2, 24), np.uint32)
    for li, t in enumerate(tables):
        base = data.draw(st.integers(0, t.rows - 200))
        spread = data.draw(st.sampled_from([1, 8, 64, 200]))
        ids[0, li] = [base + data.draw(st.integers(0, spread - 1)) for _ in range(24)]
    tr = Trace(ids, np.zeros(1, np.int64), layer_ids=layout.layer_ids)
    plan = plan_reads(tr, tables, layout=layout, trace_layout=layout, block=block)
    g = groups[block]
    g.read_batch(ids.reshape(1, 48))
    assert (plan.reads, plan.bytes) == (g.last_stats.reads, g.last_stats.bytes_read)
    assert plan.rows == g.last_stats.rows_distinct
    assert np.all(plan.offset % block == 0) and np.all(plan.length % block == 0)
    assert np.all(plan.length <= span_cap(block))


def test_span_cap_boundary(group):
    """48 consecutive rows (12,672 bytes) of one table: one 16 KiB span at 4 KiB blocks from an aligned start."""
    tables, layout, groups = group
    first = (16384 - tables[0].offset % 16384) % 16384 // ROW_BYTES + 64  # a row at or after a 16 KiB boundary
    ids = np.zeros((1, 2, 24), np.uint32)
    ids[0, 0] = np.arange(first, first + 24)
    ids[0, 1] = np.arange(first + 24, first + 48) % tables[1].rows
    tr = Trace(ids, np.zeros(1, np.int64), layer_ids=layout.layer_ids)
    for block in (512, 4096):
        plan = plan_reads(tr, tables, layout=layout, trace_layout=layout, block=block)
        groups[block].read_batch(ids.reshape(1, 48))
        assert (plan.reads, plan.bytes) == (groups[block].last_stats.reads, groups[block].last_stats.bytes_read)
    plan = plan_reads(tr, tables, layout=layout, trace_layout=layout, block=4096)
    assert plan.reads == 2 and plan.file.tolist() == [0, 0]


def test_session_reads_equal_the_plan_step_by_step(small, trace):
    """The real decode loop of a session: every step's device reads and bytes are the plan's."""
    tables, layout, tm = model_tables(small)
    with EngramModel.open(small, backend="serial").session() as s:
        block = s.tables[layout.layer_ids[0]].alignment
        if not s.tables[layout.layer_ids[0]].direct:
            pytest.skip("O_DIRECT refused on the test file system")
        reads, nbytes = [], []
        for tok in trace.tokens.tolist():
            s.step(tok)
            reads.append(s.last_stats.reads)
            nbytes.append(s.last_stats.bytes_read)
    assert engine_block(tables[0]) == block
    plan = plan_reads(trace, tables, layout=layout, token_map=tm, block=block)
    assert np.array_equal(np.bincount(plan.step, minlength=STEPS), reads)
    assert np.array_equal(np.bincount(plan.step, weights=plan.length, minlength=STEPS).astype(int), nbytes)


# ---------------------------------------------------------------- fio replays
@need_fio
def test_fio_replays_exactly_the_planned_reads(small, trace, tmp_path):
    tables, layout, tm = model_tables(small)
    plan = plan_reads(trace, tables, layout=layout, token_map=tm, block=DEFAULT_BLOCK)
    log = plan.write(tmp_path / "small.iolog")
    # a step's 48 rows lie in 48 different columns' ranges: all distinct, and each its own read here
    assert plan.rows == STEPS * 48 and plan.reads <= plan.rows
    got = fio_counts(log, "--ioengine=psync")
    assert (got["ios"], got["bytes"]) == (plan.reads, plan.bytes)
    # a deep queue issues the same reads; fio leaves the bytes of the last in-flight reads out of io_bytes
    got = fio_counts(log, "--ioengine=libaio", "--iodepth=16")
    assert got["ios"] == plan.reads
    assert plan.bytes - 16 * span_cap(DEFAULT_BLOCK) <= got["bytes"] <= plan.bytes


@need_fio
def test_fio_replays_the_released_layout(full, trace, tmp_path):
    """Without a model: the released file's offsets, replayed against a full-size sparse model file."""
    plan = plan_reads(trace, released_tables(str(full.resolve())), block=DEFAULT_BLOCK)
    assert plan.offset.min() >= 162_955_640_832 and plan.offset.max() < full.stat().st_size
    assert plan.reads == STEPS * 48  # 48 rows spread over 188.8 GiB never share a block
    assert plan.bytes == 4096 * plan.reads + 4096 * int(np.sum(plan.length == 8192))
    got = fio_counts(plan.write(tmp_path / "full.iolog"), "--ioengine=psync")
    assert (got["ios"], got["bytes"]) == (plan.reads, plan.bytes)


@need_fio
def test_fio_replays_version_3_one_step_per_period(small, trace, tmp_path):
    tables, layout, tm = model_tables(small)
    plan = plan_reads(trace, tables, layout=layout, token_map=tm, steps=60)
    log = plan.write(tmp_path / "paced.iolog", version=3, step_us=2000)
    got = fio_counts(log, "--ioengine=psync")
    assert (got["ios"], got["bytes"]) == (plan.reads, plan.bytes)
    assert got["ms"] >= 59 * 2.0  # step k is not issued before 2 ms x k (a busy machine only lengthens it)
    assert fio_counts(log, "--ioengine=libaio", "--iodepth=16")["ios"] == plan.reads


# ------------------------------------------------------------------- the log
def test_log_lines(trace):
    plan = plan_reads(trace, steps=3)
    v2 = plan.lines()
    assert v2[0] == "fio version 2 iolog"
    assert v2[1:3] == ["DeepSeek-V4.1-Flash.gguf add", "DeepSeek-V4.1-Flash.gguf open"]
    assert v2[-1] == "DeepSeek-V4.1-Flash.gguf close" and len(v2) == plan.reads + 4
    first = v2[3].split()
    assert first[1] == "read" and int(first[2]) == plan.offset[0] and int(first[3]) == plan.length[0]
    v3 = plan.lines(3, step_us=50_000)
    assert v3[0] == "fio version 3 iolog" and v3[1] == "1 DeepSeek-V4.1-Flash.gguf add"
    stamps = [int(x.split()[0]) for x in v3[3:-1]]
    assert stamps == (1 + 50_000 * plan.step).tolist()
    with pytest.raises(ArgumentError, match="version 3"):
        plan.lines(2, step_us=1000)
    with pytest.raises(ArgumentError, match="2 or 3"):
        plan.lines(4)


def test_sessions_start_where_the_decode_model_starts_them(trace):
    plan = plan_reads(trace, sessions=3, steps=10)
    assert plan.sessions == 3 and np.array_equal(np.unique(plan.session), [0, 1, 2])
    one = plan_reads(Trace(trace.rows[40:], trace.tokens[40:]).head(10))
    s1 = plan.session_plan(1)
    assert np.array_equal(s1.offset, one.offset) and np.array_equal(s1.step, one.step)


def test_bad_input(trace, tmp_path):
    with pytest.raises(ArgumentError, match="power of two"):
        plan_reads(trace, block=1000)
    with pytest.raises(ArgumentError, match="tables given"):
        plan_reads(trace, released_tables()[:1])
    bad = trace.rows.copy()
    bad[5, 1, 7] = 400_000_000
    with pytest.raises(RowRangeError, match="step 5, layer 14, column 7"):
        plan_reads(Trace(bad, trace.tokens))
    plan = plan_reads(trace, steps=2)
    with pytest.raises(Exception, match="cannot write"):
        plan.write(tmp_path / "no" / "such" / "dir.iolog")
    assert not (tmp_path / "no").exists()
    assert isinstance(plan, IoPlan)
