"""Fuzzing of the GGUF header reader and the hash/decode/read entry points (issue 9).

Hypothesis builds inputs with structure (GGUF headers from scratch with lying counts,
valid headers with one count or length replaced, arrays of every dtype, shape and memory
layout); atheris (when installed) mutates bytes guided by coverage for a bounded time.
Every input must end in the right answer or one typed error -- no other exception, no
crash, no hang, and no allocation driven by a count read from a header (tracemalloc peak
and the child's RSS are bounded).  Iteration counts are printed with ``-s``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUF_MAGIC, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram import (ArgumentError, DecodeError, FormatError, Hasher, History, HistoryError, Layout, RowRangeError,
                    Table, TokenError, decode_rows, synth)
from engram.gguf import read_kv, read_model
from tests.reference import decode_rows_reference, hash_reference
from tests.tablefiles import rows_raw, write_table

TESTS = Path(__file__).resolve().parent.parent
#: Examples run per hypothesis test (the counts recorded in the README).
EXAMPLES = {"gguf_scratch": 200, "gguf_counts": 200, "hash": 300, "step": 200, "decode": 200, "read": 100}
ITERATIONS: dict = {}
ALLOC_LIMIT = 8 << 20  # bytes a rejected header may make us allocate (the largest legal string is 1 MiB)
ATHERIS_AS_LIMIT = 3 << 30  # address space of the atheris child (Python, numpy and the engine need ~1 GiB)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\nfuzz iterations: {ITERATIONS} (total {sum(v for v in ITERATIONS.values() if isinstance(v, int))})")


def _tick(name: str) -> None:
    ITERATIONS[name] = ITERATIONS.get(name, 0) + 1


SMALL = Layout.derive(50, (1, 14), compressed_vocab_size=1000, pad_id=2)


@pytest.fixture(scope="module")
def seed_header(tmp_path_factory):
    """A valid small model (1000-entry token map): header bytes, file size, and where fields are."""
    p = synth.plan_model(synth.ModelShape(layout=SMALL, token_map=np.arange(1000), optional_keys=True))
    (path,) = synth.write_model(p, tmp_path_factory.mktemp("seed") / "seed.gguf",
                                synth.Fill(tables="none", projections=False), progress=False)
    info = read_model(path)
    with open(path, "rb") as f:
        head = f.read(info.data_offsets[0])
    return head, os.path.getsize(path), info


def _parse_bounded(path) -> None:
    """read_kv and read_model on ``path``: FormatError only, bounded allocation and time."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        for fn in (read_kv, read_model):
            try:
                fn(path)
            except FormatError:
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_LIMIT, f"peak allocation {peak} bytes"
    assert time.perf_counter() - t0 < 5, "header parse took over 5 s"


# ====================================================================== GGUF from scratch
_VTYPES = [int(t) for t in GGUFValueType]
_SIZES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1, GGUFValueType.UINT16: 2,
          GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
          GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}

_counts = st.one_of(st.integers(0, 8), st.integers(0, 2**64 - 1), st.sampled_from([2**20, 2**26, 2**32, 2**63]))


@st.composite
def _string(draw, max_len=40):
    s = draw(st.binary(max_size=max_len))
    n = draw(st.one_of(st.just(len(s)), _counts))  # a declared length that may lie
    return struct.pack("<Q", n) + s


@st.composite
def _value(draw, vtype: int, depth: int = 0):
    if vtype in _SIZES:
        return draw(st.binary(min_size=_SIZES[vtype], max_size=_SIZES[vtype]))
    if vtype == GGUFValueType.STRING:
        return draw(_string())
    if vtype == GGUFValueType.ARRAY and depth < 3:
        sub = draw(st.sampled_from(_VTYPES + [99]))
        items = draw(st.lists(_value(sub, depth + 1) if sub in _VTYPES else st.binary(max_size=8), max_size=6))
        n = draw(st.one_of(st.just(len(items)), _counts))
        return struct.pack("<IQ", sub, n) + b"".join(items)
    return draw(st.binary(max_size=16))


_KEYS = st.one_of(st.sampled_from([
    "general.architecture", "general.alignment", "deepseek41.engram.encoding", "deepseek41.engram.layer_ids",
    "deepseek41.engram.primes", "deepseek41.engram.multipliers", "deepseek41.engram.rows",
    "deepseek41.engram.token_map", "deepseek41.engram.compressed_vocab_size", "deepseek41.engram.pad_id",
    "deepseek41.attention.layer_norm_rms_epsilon", "split.count", "split.no"]), st.text(max_size=20))


@st.composite
def _kv(draw):
    key = draw(_KEYS).encode("utf-8", "surrogatepass")
    vtype = draw(st.sampled_from(_VTYPES + [13, 255]))
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + draw(_value(vtype))


@st.composite
def _tensor_info(draw):
    name = draw(st.sampled_from(["blk.1.engram_embd.weight", "blk.14.engram_kv.weight", "x"]))
    nd = draw(st.integers(0, 6))
    dims = draw(st.lists(st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)), min_size=nd, max_size=nd))
    gtype = draw(st.one_of(st.sampled_from([0, 1, 24, 30]), st.integers(0, 2**32 - 1)))
    off = draw(st.one_of(st.sampled_from([0, 32, 16384]), st.integers(0, 2**64 - 1)))
    return (struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", nd)
            + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", gtype, off))


@st.composite
def gguf_files(draw):
    kvs = draw(st.lists(_kv(), max_size=6))
    tis = draw(st.lists(_tensor_info(), max_size=4))
    n_kv = draw(st.one_of(st.just(len(kvs)), _counts))
    n_t = draw(st.one_of(st.just(len(tis)), _counts))
    version = draw(st.sampled_from([3, 3, 3, 2, 0x03000000]))
    body = struct.pack("<IIQQ", GGUF_MAGIC, version, n_t, n_kv) + b"".join(kvs) + b"".join(tis)
    tail = draw(st.sampled_from([0, 100, 1 << 20]))
    return body, tail


@settings(max_examples=EXAMPLES["gguf_scratch"], deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=gguf_files())
def test_gguf_headers_from_scratch(tmp_path, doc):
    body, tail = doc
    path = tmp_path / "f.gguf"
    with open(path, "wb") as f:
        f.write(body)
        f.truncate(len(body) + tail)
    _parse_bounded(path)
    _tick("gguf from scratch")


# ====================================================================== valid header, one count replaced
def _count_fields(info):
    """Offsets of every length/count field of the seed header: (offset, format)."""
    fields = [(8, "<Q"), (16, "<Q")]  # tensor count, key count
    for key, kv in info.metadata.items():
        fields.append((kv.offset, "<Q"))  # key length
        vt = kv.offset + 8 + len(key.encode())
        fields.append((vt, "<I"))  # value type
        if kv.type == GGUFValueType.STRING:
            fields.append((vt + 4, "<Q"))
        elif kv.type == GGUFValueType.ARRAY:
            fields += [(vt + 4, "<I"), (vt + 8, "<Q")]  # element type, count
    for name, t in info.tensors.items():
        fields.append((t.info_offset, "<Q"))
        nd = t.info_offset + 8 + len(name.encode())
        fields.append((nd, "<I"))
        fields += [(nd + 4 + 8 * i, "<Q") for i in range(len(t.gguf_shape))]
        fields.append((nd + 4 + 8 * len(t.gguf_shape), "<I"))  # type
        fields.append((nd + 4 + 8 * len(t.gguf_shape) + 4, "<Q"))  # offset
    return fields


@settings(max_examples=EXAMPLES["gguf_counts"], deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_gguf_counts_and_lengths_replaced(seed_header, tmp_path, data):
    head, size, info = seed_header
    fields = _count_fields(info)
    h = bytearray(head)
    for _ in range(data.draw(st.integers(1, 3))):
        off, fmt = data.draw(st.sampled_from(fields))
        hi = 2**32 - 1 if fmt == "<I" else 2**64 - 1
        v = data.draw(st.one_of(st.integers(0, 64), st.integers(0, hi), st.sampled_from([hi, hi // 2, 2**20 + 1])))
        struct.pack_into(fmt, h, off, v)
    path = tmp_path / "c.gguf"
    with open(path, "wb") as f:
        f.write(h)
        f.truncate(size)
    _parse_bounded(path)
    _tick("gguf counts replaced")


def test_absurd_counts_allocate_nothing(seed_header, tmp_path):
    """Each count of the header set to 2**64 - 1, 2**63 and 2**32: rejected before any allocation."""
    head, size, info = seed_header
    for off, fmt in _count_fields(info):
        for v in ((2**32 - 1,) if fmt == "<I" else (2**64 - 1, 2**63, 2**32)):
            h = bytearray(head)
            struct.pack_into(fmt, h, off, v)
            path = tmp_path / "a.gguf"
            with open(path, "wb") as f:
                f.write(h)
                f.truncate(size)
            _parse_bounded(path)
            _tick("gguf absurd counts")


RSS_CHILD = r'''
import json, os, struct, sys
from engram import FormatError
from engram.gguf import read_kv, read_model
src, size, fields, nhead = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
with open(src, "rb") as f:
    head = f.read(nhead)
path = src + ".absurd"
def hwm_kib():  # peak RSS of this process image (VmHWM; unlike ru_maxrss not inherited from the parent)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
read_model(src)  # the valid model once: imports and caches warm
base = hwm_kib()
n = 0
for off, fmt in fields:
    for v in ((2**32 - 1,) if fmt == "<I" else (2**64 - 1, 2**63, 2**32, 2**26 + 1)):
        h = bytearray(head)
        struct.pack_into(fmt, h, off, v)
        with open(path, "wb") as f:
            f.write(h)
            f.truncate(size)
        for fn in (read_kv, read_model):
            try:
                fn(path)
            except FormatError:
                pass
        n += 1
print(json.dumps({"base_kib": base, "peak_kib": hwm_kib(), "n": n}))
'''


def test_absurd_counts_leave_rss_flat(seed_header, tmp_path):
    """The same absurd counts in a fresh process: its peak RSS stays where a valid parse left it."""
    import json

    from tests.faults import run_child

    head, size, info = seed_header
    src = tmp_path / "h.gguf"
    src.write_bytes(head)
    with open(src, "r+b") as f:
        f.truncate(size)
    fields = _count_fields(info)
    code = RSS_CHILD.replace("sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])",
                             f"{str(src)!r}, {size}, json.loads({json.dumps(json.dumps(fields))}), {len(head)}")
    res = run_child(code)
    assert res["n"] >= len(fields)
    assert res["peak_kib"] - res["base_kib"] < 16 * 1024, res
    ITERATIONS["gguf absurd counts (RSS child)"] = res["n"]


# ====================================================================== hash entry points
_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float32,
           np.float64, np.bool_]


@st.composite
def _arrays(draw, lo=-3, hi=1010, max_len=30):
    dtype = draw(st.sampled_from(_DTYPES))
    n = draw(st.integers(0, max_len))
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    lo_, hi_ = (max(lo, int(info.min)), min(hi, int(info.max))) if info else (lo, hi)
    vals = draw(st.lists(st.integers(lo_, hi_), min_size=n, max_size=n))
    a = np.array(vals).astype(dtype)
    shape = draw(st.sampled_from(["1d", "2d", "strided"]))
    if shape == "2d" and n % 2 == 0:
        a = a.reshape(2, -1)
    elif shape == "strided":
        a = np.repeat(a, 2)[::2]
    return a


@settings(max_examples=EXAMPLES["hash"], deadline=None)
@given(tokens=_arrays(), mask=st.one_of(st.none(), _arrays(lo=0, hi=2)),
       hist=st.lists(st.integers(-3, 1010), min_size=0, max_size=5))
def test_hash_any_input(tokens, mask, hist):
    h = Hasher(SMALL)
    try:
        history = History(hist)
    except HistoryError:
        assert len(hist) == 0 or min(hist) < -1
        _tick("hash")
        return
    before = history.ids
    valid = (tokens.ndim == 1 and (tokens.dtype.kind in "iu" or tokens.size == 0)
             and all(0 <= int(t) < 1000 for t in tokens.reshape(-1))
             and len(hist) == 3 and all(-1 <= i < 1000 for i in hist)
             and (mask is None or (mask.shape == tokens.shape
                                   and (mask.dtype == np.bool_ or mask.dtype.kind in "iu" or mask.size == 0)
                                   and all(int(m) in (0, 1) for m in mask.reshape(-1)))))
    try:
        rows = h.hash(tokens, mask, history)
    except (TokenError, HistoryError) as exc:
        assert not valid, exc
        assert history.ids == before
    else:
        assert valid
        ref, tail = hash_reference(SMALL, [int(t) for t in tokens], None if mask is None else mask.astype(bool),
                                   tail=before)
        assert np.array_equal(rows, ref) and history.ids == tail
    _tick("hash")


_tokens_any = st.one_of(st.integers(-2**70, 2**70), st.integers(0, 999), st.floats(allow_nan=True),
                        st.booleans(), st.none(), st.text(max_size=3),
                        st.builds(np.int64, st.integers(-10, 1010)), st.builds(np.uint64, st.integers(0, 2**64 - 1)),
                        st.builds(np.float32, st.floats(width=32)))


@settings(max_examples=EXAMPLES["step"], deadline=None)
@given(token=_tokens_any, out=st.sampled_from(["none", "good", "ro", "f64", "shape", "strided", "list"]))
def test_step_any_input(token, out):
    h = Hasher(SMALL)
    hist = History([5, 6, 7])
    o = {"none": None, "good": np.zeros((2, 24), np.uint32), "ro": np.zeros((2, 24), np.uint32),
         "f64": np.zeros((2, 24)), "shape": np.zeros((24, 2), np.uint32),
         "strided": np.zeros((2, 48), np.uint32)[:, ::2], "list": [0] * 48}[out]
    if out == "ro":
        o.setflags(write=False)
    snapshot = None if o is None or isinstance(o, list) else o.copy()
    valid_token = (type(token) is int or isinstance(token, np.integer)) and not isinstance(token, bool) \
        and 0 <= int(token) < 1000
    try:
        rows = h.step(token, hist, o)
    except (TokenError, HistoryError, ArgumentError) as exc:
        assert not (valid_token and out in ("none", "good")), exc
        assert hist.ids == (5, 6, 7)
        if snapshot is not None:
            assert np.array_equal(o, snapshot)
    else:
        assert valid_token and out in ("none", "good")
        assert np.array_equal(rows, hash_reference(SMALL, [int(token)], tail=(5, 6, 7))[0][0])
    _tick("step")


# ====================================================================== decode entry point
@settings(max_examples=EXAMPLES["decode"], deadline=None)
@given(data=st.data())
def test_decode_any_bytes(data):
    n = data.draw(st.integers(0, 6))
    raw = np.frombuffer(data.draw(st.binary(min_size=n * 264, max_size=n * 264)), np.uint8).reshape(n, 264).copy()
    if n and data.draw(st.booleans()):  # mostly valid rows, so that the decode path runs too
        raw[:, :256] &= 0x7E
        raw[:, 256:] = np.minimum(raw[:, 256:], 130)
    form = data.draw(st.sampled_from(["u8", "i8", "strided", "1d", "f32", "out_ro", "out_wrong"]))
    out = np.full((n, 256), 5.0, np.float32)
    arg, kw = raw, {"out": out}
    if form == "i8":
        arg = raw.view(np.int8)
    elif form == "strided":
        arg = np.repeat(raw, 2, axis=0)[::2] if n > 1 else raw
    elif form == "1d":
        arg = raw.reshape(-1)
    elif form == "f32":
        arg = raw.astype(np.float32)
    elif form == "out_ro":
        out.setflags(write=False)
    elif form == "out_wrong":
        kw = {"out": np.zeros((n, 255), np.float32)}
    ref, bad = decode_rows_reference(raw)
    try:
        got = decode_rows(arg, **kw)
    except ArgumentError:
        assert form in ("strided", "1d", "f32", "out_ro", "out_wrong") and not (form == "strided" and n <= 1)
        assert np.all(out == 5.0)
    except DecodeError as exc:
        assert bad.any() and bad[exc.row, exc.column] and not bad[:exc.row].any()
        assert np.all(out == 5.0)
    else:
        assert not bad.any() and (form in ("u8", "i8") or (form == "strided" and n <= 1))
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    _tick("decode")


# ====================================================================== read entry point
@pytest.fixture(scope="module")
def fuzz_table(tmp_path_factory):
    raw = rows_raw(500, seed=17)
    path = tmp_path_factory.mktemp("ft") / "t.bin"
    write_table(path, raw, 1000)
    with Table(path, 1000, 500, readers=4, threshold=2) as t:
        yield t, decode_rows(raw)


@settings(max_examples=EXAMPLES["read"], deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=_arrays(lo=-2, hi=502, max_len=60), out=st.sampled_from(["none", "good", "ro", "strided"]))
def test_read_any_ids(fuzz_table, ids, out):
    t, ref = fuzz_table
    two_d = ids.ndim == 2
    shape = ids.shape + (256,)
    o = {"none": None, "good": np.full(shape, 4.0, np.float32), "ro": np.full(shape, 4.0, np.float32),
         "strided": np.full(shape[:-1] + (512,), 4.0, np.float32)[..., ::2]}[out]
    if out == "ro":
        o.setflags(write=False)
    fn = t.read_batch if two_d else t.read_rows
    in_range = ids.dtype.kind in "iu" and all(0 <= int(i) < 500 for i in ids.reshape(-1))
    try:
        got = fn(ids, out=o)
    except RowRangeError:
        assert ids.dtype.kind in "iu" and not in_range
        if o is not None:
            assert np.all(o == 4.0)
    except ArgumentError:
        assert (ids.size and ids.dtype.kind not in "iu") or out in ("ro", "strided")
        if o is not None:
            assert np.all(o == 4.0)
    else:
        assert in_range or ids.size == 0
        assert np.array_equal(got, ref[ids.astype(np.int64)])
    _tick("read")


# ====================================================================== atheris
def test_atheris_bounded_run(seed_header, tmp_path):
    """Coverage-guided byte mutation of the three targets of ``tests/fuzz_atheris.py`` for a
    bounded time; any finding (exception, crash, timeout, memory) fails with libFuzzer's report."""
    _atheris(seed_header, tmp_path, int(os.environ.get("ENGRAM_ATHERIS_SECONDS", "8")), "atheris")


@pytest.mark.heavy
def test_atheris_long_run(seed_header, tmp_path):
    """The same, for 60 s (``-m heavy``)."""
    _atheris(seed_header, tmp_path, 60, "atheris (heavy)")


def _atheris(seed_header, tmp_path, seconds: int, label: str) -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install atheris)")
    head, _, _ = seed_header
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "gguf").write_bytes(b"\x00" + head)
    (corpus / "rows").write_bytes(b"\x01" + rows_raw(3, seed=1).tobytes())
    (corpus / "hash").write_bytes(b"\x02" + bytes(range(64)))
    env = dict(os.environ, PYTHONPATH=str(TESTS.parent), ENGRAM_FUZZ_DIR=str(tmp_path))
    # libFuzzer's -rss_limit_mb reads ru_maxrss, which a child inherits from this (possibly large)
    # test process; the child's address space is capped instead, so that an allocation driven by
    # a header count fails with MemoryError, which atheris reports as a finding.
    cmd = [sys.executable, "-m", "tests.fuzz_atheris", str(corpus), f"-max_total_time={seconds}",
           "-timeout=20", "-rss_limit_mb=0", f"-max_len={len(head) + 1024}", f"-artifact_prefix={tmp_path}/"]

    def cap_memory():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (ATHERIS_AS_LIMIT, ATHERIS_AS_LIMIT))

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, env=env, cwd=tmp_path,
                       preexec_fn=cap_memory)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    m = re.search(r"Done (\d+) runs in (\d+) second", log)
    assert m, log[-3000:]
    runs = int(m.group(1))
    assert runs > 100
    ITERATIONS[f"{label} runs"] = runs
    ITERATIONS[f"{label} seconds"] = f"{m.group(2)} s"
