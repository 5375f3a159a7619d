"""Malformed model files (SPEC §6): each raises FormatError naming the key or tensor, reads only
header bytes (never a table) and allocates little, however absurd the header's counts.

Files are small valid models written with their extents as holes, then changed either in
the plan (keys, types, tensors) or by patching header bytes at offsets that ``read_model``
itself reports for the valid file.  They carry no vocabulary (``tokenizer.ggml.*``, 5 MB of
strings the parser walks but never keeps), so the bounds on bytes read stay tight; the
vocabulary's own corruptions are at the end.
"""

from __future__ import annotations

import os
import struct
import tracemalloc

import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram import FormatError, read_model, synth
from engram.gguf import header as gguf_header

from tests import modelfiles
from tests.modelfiles import clone_patched, write_header_only

P = "deepseek41.engram."
U32, U64, I32, F32, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.INT32,
                                GGUFValueType.FLOAT32, GGUFValueType.STRING, GGUFValueType.ARRAY)


def plan(**kw) -> synth.ModelPlan:
    """A small model without the vocabulary keys (see the module docstring)."""
    kw.setdefault("vocabulary", False)
    return modelfiles.plan(**kw)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid header-only model and what read_model says about it."""
    d = tmp_path_factory.mktemp("base")
    (path,) = write_header_only(plan(), d / "base.gguf")
    return path, read_model(path)


def expect_error(target, *needles, table_floor=None):
    """read_model(target) must raise FormatError whose message holds every needle, having read only
    header bytes (below ``table_floor``) and allocated at most a few MB."""
    reads = []
    real = gguf_header._pread

    def watch(fd, n, off):
        reads.append((off, n))
        return real(fd, n, off)

    gguf_header._pread = watch
    tracemalloc.start()
    try:
        with pytest.raises(FormatError) as exc:
            read_model(target)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gguf_header._pread = real
    msg = str(exc.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert peak < 6 << 20, f"peak allocation {peak} bytes"
    assert sum(n for _, n in reads) < 4 << 20
    if table_floor is not None and reads:
        assert max(off + n for off, n in reads) < table_floor
    return msg


def _floor(info) -> int:
    return min(t.offset for t in info.tables.values())


# ====================================================================== plan-level changes
def _edit(tmp_path, edit, **plan_kw):
    p = plan(**plan_kw)
    edit(p)
    (path,) = write_header_only(p, tmp_path / "bad.gguf")
    return path


def _set(key, value, vtype, sub=None):
    def edit(p):
        p.metadata[key] = (value, vtype, sub)
    return edit


def _patch_list(key, index, delta):
    def edit(p):
        v, t, s = p.metadata[key]
        v = list(v)
        v[index] += delta
        p.metadata[key] = (v, t, s)
    return edit


def _drop_key(key):
    def edit(p):
        del p.metadata[key]
    return edit


def _tensor(name, **changes):
    def edit(p):
        t = p.tensor(name)
        for k, v in changes.items():
            setattr(t, k, v)
    return edit


def _drop_tensor(name):
    def edit(p):
        p.tensors.remove(p.tensor(name))
    return edit


def _add_tensor(spec):
    def edit(p):
        p.tensors.insert(0, spec)
    return edit


PLAN_CASES = {
    "wrong encoding string": (_set(P + "encoding", "e4m3_e8m0_32_row256", STR),
                              [P + "encoding", "'e4m3_e8m0_32_row256'"], {}),
    "rows differ from the sum of primes": (_patch_list(P + "rows", 1, 1), [P + "rows", "layer 14"], {}),
    "token map entry out of range": (_patch_list(P + "token_map", 7, 99092 - 7),
                                     [P + "token_map", "[7] = 99092", "99092"], {}),
    "transposed engram_kv": (_tensor("blk.14.engram_kv.weight", shape=(6144, 25600)),
                             ["blk.14.engram_kv.weight", "transposed", "[6144, 25600]"], {}),
    "missing tensor": (_drop_tensor("blk.14.engram_q_norm.weight"), ["blk.14.engram_q_norm.weight", "missing"], {}),
    "missing table": (_drop_tensor("blk.1.engram_embd.weight"), ["blk.1.engram_embd.weight", "missing"], {}),
    "float where an integer belongs": (_set(P + "compressed_vocab_size", 99092.0, F32),
                                       [P + "compressed_vocab_size", "FLOAT32"], {}),
    "string where an array belongs": (_set(P + "layer_ids", "1,14", STR), [P + "layer_ids", "STRING"], {}),
    "float array where integers belong": (_set(P + "primes", [1.5] * 48, ARR, F32), [P + "primes", "FLOAT32"], {}),
    "offsets contradict primes": (_patch_list(P + "offsets", 5, 2), [P + "offsets", "column 5"],
                                  {"optional_keys": True}),
    "head_count contradicts primes": (_set(P + "head_count", 4, U32), [P + "primes", "head_count = 4"],
                                      {"optional_keys": True}),
    "max_ngram_size contradicts the multipliers": (_set(P + "max_ngram_size", 3, U32),
                                                   [P + "multipliers", "has 8 entries", "max_ngram_size = 3", "6"],
                                                   {"optional_keys": True}),
    "key_length contradicts the encoding": (_set(P + "key_length", 128, U32), [P + "key_length", "128"],
                                            {"optional_keys": True}),
    "even multiplier": (_patch_list(P + "multipliers", 2, 1), [P + "multipliers", "even"], {}),
    "pad id outside the compressed vocabulary": (_set(P + "pad_id", 99092, U32), [P + "pad_id", "99092"], {}),
    "negative layer id": (_set(P + "layer_ids", [1, -14], ARR, I32), [P + "layer_ids", "negative"], {}),
    "architecture without Engram keys": (_set("general.architecture", "llama", STR),
                                         ["'llama'", "deepseek41.engram.encoding"], {}),
    "missing architecture": (_drop_key("general.architecture"), ["general.architecture", "missing"], {}),
    "missing primes": (_drop_key(P + "primes"), [P + "primes", "missing", "deepseek4.engram.primes"], {}),
    "missing token map": (_drop_key(P + "token_map"), [P + "token_map", "missing"], {}),
    "token map shorter than the compressed vocabulary": (_set(P + "token_map", list(range(1000)), ARR, U32),
                                                         [P + "token_map", "1000 entries", "99092"], {}),
    "token map length contradicts vocab_size": (_set("deepseek41.vocab_size", 129000, U32),
                                                [P + "token_map", "vocab_size = 129000"], {}),
    "table of the wrong type": (_tensor("blk.1.engram_embd.weight", ggml_type=GGMLQuantizationType.F16),
                                ["blk.1.engram_embd.weight", "F16", "I8"], {}),
    "table rows differ from metadata": (_tensor("blk.14.engram_embd.weight", shape=(199815, 264)),
                                        ["blk.14.engram_embd.weight", "199815"], {}),
    "norm of the wrong shape": (_tensor("blk.1.engram_k_norm.weight", shape=(5120, 4)),
                                ["blk.1.engram_k_norm.weight", "transposed"], {}),
    "Engram tensor of a layer without Engram": (
        _add_tensor(synth.TensorSpec("blk.5.engram_embd.weight", (10, 264), GGMLQuantizationType.I8, "x")),
        ["blk.5.engram_embd.weight", "layer 5"], {}),
}


@pytest.mark.parametrize("case", sorted(PLAN_CASES))
def test_plan_level_contradictions(tmp_path, case):
    edit, needles, kw = PLAN_CASES[case]
    path = _edit(tmp_path, edit, **kw)
    msg = expect_error(path, *needles)
    assert str(path) in msg


# ====================================================================== byte patches
def _kv(info, key):
    """Offset of the value type (u32) of ``key`` in the base header."""
    return info.metadata[key].offset + 8 + len(key.encode())


def _ti(info, name):
    """Offset of ``n_dims`` of tensor ``name`` in the base header."""
    return info.tensors[name].info_offset + 8 + len(name.encode())


def _put(fmt, where, value):
    def patch(head):
        struct.pack_into(fmt, head, where, value)
    return patch


def _byte_cases(info):
    tm = _kv(info, P + "token_map")
    enc = _kv(info, P + "encoding")
    kv14 = _ti(info, "blk.1.engram_kv.weight")
    t14 = _ti(info, "blk.14.engram_embd.weight")   # n_dims(4) dims(16) type(4) offset(8)
    t1 = _ti(info, "blk.1.engram_embd.weight")
    gtype = info.metadata["general.type"].offset
    rel14 = struct.Struct("<Q")

    def rel(where):
        return lambda head: rel14.unpack_from(head, where)[0]

    def shift_offset(head):
        struct.pack_into("<Q", head, t14 + 24, rel(t14 + 24)(head) + 32)

    def overlap(head):
        struct.pack_into("<Q", head, t14 + 24, rel(t1 + 24)(head))

    def rename_key(head):
        assert head[gtype + 8:gtype + 20] == b"general.type"
        head[gtype + 8:gtype + 20] = b"general.name"

    def bad_utf8(head):
        head[enc - 3] = 0xFF

    return {
        "wrong magic": (_put("4s", 0, b"GGUG"), ["magic", "b'GGUG'"]),
        "wrong version": (_put("<I", 4, 2), ["version 2"]),
        "big-endian file": (_put(">I", 4, 3), ["big-endian"]),
        "absurd tensor count": (_put("<Q", 8, 1 << 40), ["tensor count 1099511627776"]),
        "absurd metadata key count": (_put("<Q", 16, 1 << 50), ["key count"]),
        "absurd array length": (_put("<Q", tm + 8, 1 << 60), [P + "token_map", "array length 1152921504606846976"]),
        "array longer than the file": (_put("<Q", tm + 8, 1 << 25), [P + "token_map", "left in the file"],
                                       info.data_offsets[0]),
        "absurd string length": (_put("<Q", enc + 4, 1 << 62), [P + "encoding", "string length"]),
        "absurd key length": (_put("<Q", info.metadata[P + "pad_id"].offset, 1 << 61), ["metadata key #", "length"]),
        "unknown value type": (_put("<I", _kv(info, P + "pad_id"), 77), [P + "pad_id", "unknown value type 77"]),
        "absurd n_dims": (_put("<I", kv14, 1000), ["blk.1.engram_kv.weight", "n_dims = 1000"]),
        "unknown tensor type": (_put("<I", kv14 + 4 + 16, 99), ["blk.1.engram_kv.weight", "unknown tensor type 99"]),
        "impossibly large tensor": (_put("<Q", t14 + 4 + 8, 1 << 62), ["blk.14.engram_embd.weight", "impossibly"]),
        "misaligned tensor offset": (shift_offset, ["blk.14.engram_embd.weight", "not a multiple", "16384"]),
        "overlapping tensors": (overlap, ["blk.14.engram_embd.weight", "blk.1.engram_embd.weight", "overlap"]),
        "duplicate key": (rename_key, ["duplicate metadata key 'general.name'"]),
        "alignment not a power of two": (_put("<I", _kv(info, "general.alignment") + 4, 1000),
                                         ["general.alignment = 1000"]),
        "invalid UTF-8 key": (bad_utf8, ["UTF-8"]),
    }


BYTE_CASES = sorted(["wrong magic", "wrong version", "big-endian file", "absurd tensor count",
                     "absurd metadata key count", "absurd array length", "array longer than the file",
                     "absurd string length", "absurd key length", "unknown value type", "absurd n_dims",
                     "unknown tensor type", "impossibly large tensor", "misaligned tensor offset",
                     "overlapping tensors", "duplicate key", "alignment not a power of two", "invalid UTF-8 key"])


@pytest.mark.parametrize("case", BYTE_CASES)
def test_header_byte_patches(base, tmp_path, case):
    path, info = base
    patch, needles, *size = _byte_cases(info)[case]
    bad = clone_patched(path, tmp_path / "bad.gguf", patch, size=size[0] if size else None)
    expect_error(bad, *needles, table_floor=_floor(info))


def test_truncated_header(base, tmp_path):
    path, info = base
    at = _kv(info, P + "token_map") + 100_000  # inside the token map
    bad = clone_patched(path, tmp_path / "cut.gguf", lambda h: None, size=at, header_len=at)
    expect_error(bad, "truncated", P + "token_map")
    for n in (0, 1, 3, 4, 23):  # the magic cut, or whole but the counts missing
        short = clone_patched(path, tmp_path / f"short{n}.gguf", lambda h: None, size=n, header_len=n)
        with open(path, "rb") as f:
            assert short.read_bytes() == f.read(n) and b"GGUF".startswith(short.read_bytes()[:4])
        expect_error(short, f"{short}: not a GGUF file: too short to hold a GGUF header ({n} "
                            f"byte{'' if n == 1 else 's'}; the fixed header alone needs 24: magic, version, tensor "
                            f"count, key count)")
    # a wrong magic is named as such even in a short file
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"PK\x03\x04\x14")
    expect_error(wrong, f"{wrong}: not a GGUF file: magic b'PK\\x03\\x04' at byte offset 0, expected b'GGUF'")


def test_inspect_a_short_file_says_so(tmp_path, capsys):
    """engram inspect on a 3-byte file said ``magic None``: it names the size and the bytes a header needs."""
    from engram.cli import main

    three = tmp_path / "three.gguf"
    three.write_bytes(b"GGU")
    assert main(["inspect", str(three)]) == 2
    err = capsys.readouterr().err
    assert err == (f"engram inspect: error: {three}: not a GGUF file: too short to hold a GGUF header (3 bytes; the "
                   f"fixed header alone needs 24: magic, version, tensor count, key count)\n")


def test_table_past_end_of_file(base, tmp_path):
    path, info = base
    t = info.tables[14]
    bad = clone_patched(path, tmp_path / "short.gguf", lambda h: None, size=t.end - 1)
    expect_error(bad, "blk.14.engram_embd.weight", "past the end", str(t.end - 1), table_floor=_floor(info))
    # cutting only the alignment padding after the last table is fine
    ok = clone_patched(path, tmp_path / "exact.gguf", lambda h: None, size=t.end)
    assert read_model(ok).tables[14].end == t.end


def test_no_such_file(tmp_path):
    expect_error(tmp_path / "nope.gguf", "no such model file")


# ====================================================================== split sets
@pytest.fixture()
def split(tmp_path):
    return write_header_only(plan(shards=3), tmp_path / "sp.gguf")


def test_shard_missing(split):
    os.unlink(split[1])
    expect_error(split[0], "sp-00002-of-00003.gguf", "missing")
    expect_error(split[2], "sp-00002-of-00003.gguf", "missing")
    expect_error([split[0], split[2]], "split.count = 3", "2 shards")


def test_split_keys_contradict(split, tmp_path):
    info = read_model(split[0])
    # the last shard claims a different shard count
    from engram.gguf import read_kv

    kv = read_kv(split[2])["split.count"]
    where = kv.offset + 8 + len("split.count") + 4
    with open(split[2], "rb") as f:
        head = bytearray(f.read(info.data_offsets[2]))
    struct.pack_into("<H", head, where, 4)
    size = os.stat(split[2]).st_size
    with open(split[2], "r+b") as f:
        f.write(head)
        f.truncate(size)
    expect_error(split[0], "split.count = 4", "sp-00003-of-00003.gguf")


def test_split_no_contradicts_file_name(split, tmp_path):
    a, b = split[1], split[2]
    tmp = a.with_suffix(".tmp")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    expect_error(split[0], "split.no", "contradicts the file name")
    # given as a list, the order comes from split.no and the set reads fine
    info = read_model([split[0], split[1], split[2]])
    assert info.paths == (split[0], split[2], split[1])


def test_single_file_of_a_split_set(split, tmp_path):
    lone = tmp_path / "lone.gguf"
    os.rename(split[0], lone)
    expect_error(lone, "split.count = 3", "only this file")


# ====================================================================== fuzz
@pytest.fixture(scope="module")
def fuzz_base(base):
    path, info = base
    with open(path, "rb") as f:
        head = f.read(info.data_offsets[0])
    return head, os.stat(path).st_size, _floor(info)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_header_corruption_only_raises_format_error(fuzz_base, tmp_path, data):
    """Any corruption of header bytes either still parses or raises FormatError -- never another
    exception, never a large allocation, never a read of table data."""
    head, size, floor = fuzz_base
    h = bytearray(head)
    n = data.draw(st.integers(1, 4))
    # bias toward the structural parts: the fixed header, the first keys, the tensor infos
    tail = len(h) - 2000
    for _ in range(n):
        where = data.draw(st.one_of(st.integers(0, 700), st.integers(tail, len(h) - 1), st.integers(0, len(h) - 1)))
        h[where] = data.draw(st.integers(0, 255))
    path = tmp_path / "fuzz.gguf"
    with open(path, "wb") as f:
        f.write(h)
        f.truncate(size)
    tracemalloc.start()
    try:
        try:
            read_model(path)
        except FormatError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20  # bounded by the limits: 1 MiB strings, 2**20-entry token map
