"""Model files people actually have (issue 17.1, 17.2, 17.4): legacy ``deepseek4.engram.*`` keys read
as aliases, derivable constants left out or stated wrongly, ``engram repair``, and the gate epsilon.

Files are small header-only models (every extent a hole) from :func:`tests.modelfiles.plan`, with
their metadata edited the way older converters wrote it.  They leave the vocabulary out (its 5 MB of
strings would make ``gguf.GGUFReader``, which the checks read with, take seconds a file); repair of a
model with its vocabulary is tested in ``test_vocabulary.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from engram import FormatError, Layout, read_model, synth
from engram.cli import main as cli_main
from engram.gguf import DEFAULT_EPS, repair_model

from tests.modelfiles import SCALE, plan, token_map, write_header_only

P, L = "deepseek41.engram.", "deepseek4.engram."
EPS = "deepseek41.attention.layer_norm_rms_epsilon"
U32, ARR = GGUFValueType.UINT32, GGUFValueType.ARRAY
LAYOUT = Layout.deepseek_v41_flash(SCALE)
DERIVABLE_KEYS = ("rows", "offsets", "head_count", "max_ngram_size", "key_length", "compressed_vocab_size",
                  "layer_ids")


def model(tmp_path, edit=None, name="m.gguf", **kw):
    kw.setdefault("vocabulary", False)
    p = plan(**kw)
    if edit is not None:
        edit(p.metadata)
    (path,) = write_header_only(p, tmp_path / name)
    return path


def rename(*keys):
    """Spell ``keys`` (or every Engram key) the legacy way."""
    def edit(md):
        for k in list(md):
            if k.startswith(P) and (not keys or k[len(P):] in keys):
                md[L + k[len(P):]] = md.pop(k)
    return edit


def drop(*names):
    def edit(md):
        for n in names:
            md.pop(P + n, None)
    return edit


def entry(key, i, delta):
    def edit(md):
        v, t, sub = md[key]
        v = list(v)
        v[i] += delta
        md[key] = (v, t, sub)
    return edit


def both(*edits):
    def edit(md):
        for e in edits:
            e(md)
    return edit


def same_model(info):
    assert info.layout == LAYOUT
    assert np.array_equal(info.token_map, token_map())
    assert [t.rows for t in info.tables.values()] == [int(r) for r in LAYOUT.rows]


# ====================================================================== legacy spelling
def test_every_key_in_the_legacy_spelling_reads(tmp_path):
    info = read_model(model(tmp_path, rename(), optional_keys=True))
    same_model(info)
    for name in ("encoding", "primes", "multipliers", "token_map", "pad_id", "rows", "offsets", "head_count"):
        assert info.sources[name].kind == "legacy key", name
        assert info.sources[name].detail == L + name
    assert info.sources["eps"].kind == "key"  # the files keep the attention key


def test_only_the_non_encoding_keys_legacy(tmp_path):
    """The file of the issue: `required metadata key deepseek41.engram.layer_ids is missing` used to
    end here while deepseek4.engram.layer_ids sat in the file."""
    names = [k[len(P):] for k in plan().metadata if k.startswith(P) and k != P + "encoding"]
    info = read_model(model(tmp_path, rename(*names)))
    same_model(info)
    assert info.sources["encoding"].kind == "key" and info.sources["layer_ids"].kind == "legacy key"


def test_both_spellings_equal(tmp_path):
    def dup(md):
        md[L + "primes"] = md[P + "primes"]
        md[L + "pad_id"] = md[P + "pad_id"]
    info = read_model(model(tmp_path, dup))
    same_model(info)
    assert str(info.sources["primes"]) == f"keys {P}primes = {L}primes"


def test_both_spellings_disagree_on_a_primary_key(tmp_path):
    def dup(md):
        md[L + "multipliers"] = md[P + "multipliers"]
    path = model(tmp_path, both(dup, entry(L + "multipliers", 5, 2)))
    m = LAYOUT.multipliers.reshape(-1)
    with pytest.raises(FormatError) as e:
        read_model(path)
    msg = str(e.value)
    for needle in (P + "multipliers", L + "multipliers", "disagree at entry [5]", str(int(m[5])),
                   str(int(m[5]) + 2), f"engram repair {path} ", "--prefer P", "deepseek41, deepseek4"):
        assert needle in msg, (needle, msg)
    # the user says which one is right; the repaired file has the current key only
    (out,) = repair_model(path, tmp_path / "fixed.gguf", prefer="deepseek41", progress=False)
    fixed = read_model(out)
    same_model(fixed)
    assert L + "multipliers" not in fixed.metadata and fixed.sources["multipliers"].kind == "key"
    # the other choice is a valid layout too (odd multipliers), so it is written as asked
    (other,) = repair_model(path, tmp_path / "other.gguf", prefer="deepseek4", progress=False)
    assert int(read_model(other).layout.multipliers.reshape(-1)[5]) == int(m[5]) + 2


def test_disagreeing_primes_that_contradict_the_tables_are_not_repaired(tmp_path):
    def dup(md):
        md[L + "primes"] = md[P + "primes"]
    path = model(tmp_path, both(dup, entry(L + "primes", 3, 12)))  # 8009+12 = 8021, a prime
    with pytest.raises(FormatError, match=r"disagree at entry \[3\]"):
        read_model(path)
    with pytest.raises(FormatError, match="cannot repair") as e:
        repair_model(path, tmp_path / "x.gguf", prefer="deepseek4", progress=False)
    assert "blk.1.engram_embd.weight" in str(e.value) and not (tmp_path / "x.gguf").exists()


# ====================================================================== derivable constants
def test_derivable_keys_left_out(tmp_path, capsys):
    path = model(tmp_path, both(drop("rows", "compressed_vocab_size", "layer_ids"),
                                drop("offsets", "head_count", "max_ngram_size", "key_length")), optional_keys=True)
    info = read_model(path)
    same_model(info)
    assert set(info.derived) == set(DERIVABLE_KEYS) | {"embedding_length"}
    assert "blk.1.engram_embd.weight" in info.sources["layer_ids"].detail
    assert info.layout.compressed_vocab_size == 99092 and info.layout.heads == 8 and info.layout.max_ngram == 4
    assert cli_main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rows                   derived: sum of each layer's primes (deepseek41.engram.primes)" in out
    assert "compressed_vocab_size  derived: largest entry of deepseek41.engram.token_map + 1" in out
    assert cli_main(["inspect", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["derived"]) == set(info.derived) and d["sources"]["primes"] == f"key {P}primes"


CONTRADICTIONS = {
    # case: (edit, plan kwargs, needles)
    "rows": (entry(P + "rows", 1, 1), {}, [P + "rows", "entry [1] (layer 14) = 199815", "sum to 199814"]),
    "offsets (legacy spelling)": (both(rename("offsets"), entry(L + "offsets", 30, -1)), {"optional_keys": True},
                                  [L + "offsets", "entry [30] (layer 14 column 6)", "row"]),
    "compressed_vocab_size": (lambda md: md.__setitem__(P + "compressed_vocab_size", (99093, U32, None)), {},
                              [P + "compressed_vocab_size", "= 99093", "is 99091", "size is 99092"]),
    "key_length": (lambda md: md.__setitem__(P + "key_length", (128, U32, None)), {"optional_keys": True},
                   [P + "key_length", "= 128", "256 values a row"]),
    "head_count": (lambda md: md.__setitem__(P + "head_count", (4, U32, None)), {"optional_keys": True},
                   [P + "primes", "has 48 entries", "head_count = 4", "= 24"]),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_derivable_key_contradicting_the_rest_names_it_and_repair_rewrites_it(tmp_path, case):
    edit, kw, needles = CONTRADICTIONS[case]
    path = model(tmp_path, edit, **kw)
    with pytest.raises(FormatError) as e:
        read_model(path)
    msg = str(e.value)
    for n in needles + [str(path)]:
        assert n in msg, (n, msg)
    assert f"run `engram repair {path} {tmp_path / 'm.repaired.gguf'}`" in msg
    (out,) = repair_model(path, tmp_path / "m.repaired.gguf", progress=False)
    fixed = read_model(out)
    same_model(fixed)
    r = GGUFReader(out)
    assert not [f for f in r.fields if f.startswith(L)]
    assert r.fields[P + "rows"].contents() == [int(x) for x in LAYOUT.rows]
    if kw.get("optional_keys"):  # the optional keys the file had are written, derived and checked
        assert r.fields[P + "offsets"].contents() == LAYOUT.offsets.reshape(-1).tolist()
        assert (r.fields[P + "head_count"].contents(), r.fields[P + "key_length"].contents()) == (8, 256)


def test_derived_rows_contradicting_the_table_tensor(tmp_path):
    """No rows key: the table tensor's shape is checked against the sum of the primes, and the message
    says so instead of naming a key the file does not have."""
    def edit(p):
        del p.metadata[P + "rows"]
        p.tensor("blk.14.engram_embd.weight").shape = (199815, 264)
    p = plan()
    edit(p)
    (path,) = write_header_only(p, tmp_path / "t.gguf")
    with pytest.raises(FormatError) as e:
        read_model(path)
    msg = str(e.value)
    assert "blk.14.engram_embd.weight" in msg and "[264, 199815]" in msg and "199814 rows" in msg
    assert "the sum of its primes (the file has no rows key)" in msg and P + "rows" not in msg
    with pytest.raises(FormatError, match="cannot repair"):
        repair_model(path, tmp_path / "x.gguf", progress=False)


def test_messages_say_what_was_derived(tmp_path):
    """A count derived from tensors (no layer_ids key) is not reported as a key's value."""
    def edit(md):
        del md[P + "layer_ids"]
        v, t, sub = md[P + "multipliers"]
        md[P + "multipliers"] = (v[:7], t, sub)
    with pytest.raises(FormatError) as e:
        read_model(model(tmp_path, edit))
    msg = str(e.value)
    assert P + "multipliers" in msg and "has 7 entries" in msg and "2 layers (derived:" in msg
    assert P + "layer_ids" not in msg


def setentry(key, i, value):
    def edit(md):
        v, t, sub = md[key]
        v = list(v)
        v[i] = value
        md[key] = (v, t, sub)
    return edit


@pytest.mark.parametrize("bad, needles", [
    (setentry(P + "primes", 30, 1), ["entry [30] (layer 14 column 6) = 1", "prime >= 2"]),
    (entry(P + "multipliers", 6, 1), ["entry [6] (layer 14 lookback 2)", "is even"]),
    (setentry(P + "layer_ids", 1, 1), ["entry [1] = 1 repeats entry [0]"]),
])
def test_array_errors_name_the_entry(tmp_path, bad, needles):
    with pytest.raises(FormatError) as e:
        read_model(model(tmp_path, bad))
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


# ====================================================================== split sets
def test_repair_a_legacy_split_set(tmp_path):
    p = plan(shards=3)
    rename()(p.metadata)
    paths = write_header_only(p, tmp_path / "sp.gguf")
    outs = repair_model(paths[1], tmp_path / "new.gguf", progress=False)
    assert [o.name for o in outs] == [f"new-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    info = read_model(outs[2])
    same_model(info)
    assert info.paths == tuple(outs) and all(s.kind in ("key", "derived") for s in info.sources.values())
    assert [t.shard for t in info.tables.values()] == [1, 2]
    assert GGUFReader(outs[1]).fields["split.no"].contents() == 1


def test_repair_cli(tmp_path, capsys):
    path = model(tmp_path, rename())
    out = tmp_path / "fixed.gguf"
    assert cli_main(["repair", str(path), str(out), "--no-progress", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["files"] == [str(out)] and rec["sources"]["primes"] == f"key {P}primes"
    assert cli_main(["repair", str(path), str(path), "--no-progress"]) == 2
    assert "is one of the inputs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli_main(["repair", "--help"])
    assert e.value.code == 0


def test_repair_keeps_table_bytes(tmp_path):
    """A model with real rows: the tables of the repaired file hold the same bytes at their new offsets."""
    p = plan(scale=0.0001, seed=4)
    rename()(p.metadata)
    (src,) = synth.write_model(p, tmp_path / "src.gguf", synth.Fill(tables="all", projections=False), progress=False)
    (out,) = repair_model(src, tmp_path / "dst.gguf", progress=False)
    a, b = read_model(src), read_model(out)
    for lid in (1, 14):
        with open(src, "rb") as f, open(out, "rb") as g:
            f.seek(a.tables[lid].offset)
            g.seek(b.tables[lid].offset)
            assert f.read(a.tables[lid].nbytes) == g.read(b.tables[lid].nbytes)


# ====================================================================== gate epsilon
def test_file_without_epsilon_opens_with_the_documented_default(tmp_path, capsys):
    path = model(tmp_path, lambda md: md.pop(EPS))
    info = read_model(path)
    assert info.eps == DEFAULT_EPS == 1e-6
    assert info.sources["eps"].kind == "default" and "rms_norm_eps" in info.sources["eps"].detail
    assert cli_main(["inspect", str(path)]) == 0
    assert "gate eps      1e-06  (default: 1e-06 (DeepSeek V4 rms_norm_eps" in capsys.readouterr().out
    # repair does not invent the key; --eps writes one
    (out,) = repair_model(path, tmp_path / "a.gguf", progress=False)
    assert EPS not in GGUFReader(out).fields
    (out,) = repair_model(path, tmp_path / "b.gguf", eps=1e-5, progress=False)
    assert read_model(out).eps == pytest.approx(1e-5) and read_model(out).sources["eps"].kind == "key"


def test_legacy_epsilon_key(tmp_path):
    def edit(md):
        md["deepseek4.attention.layer_norm_rms_epsilon"] = md.pop(EPS)
    info = read_model(model(tmp_path, edit))
    assert info.eps == pytest.approx(1e-6) and info.sources["eps"].kind == "legacy key"


# ---------------------------------------------------------------- what is missing or out of range, in the file's terms
REQUIRED_KEYS = ("encoding", "primes", "multipliers", "token_map", "pad_id")


def keep_only(*names):
    def edit(md):
        for k in list(md):
            if k.startswith(P) and k[len(P):] not in names:
                md.pop(k)
    return edit


@pytest.mark.parametrize("missing", [s for n in range(1, len(REQUIRED_KEYS) + 1)
                                     for s in __import__("itertools").combinations(REQUIRED_KEYS, n)],
                         ids=lambda s: "+".join(s))
def test_every_missing_required_key_is_named(tmp_path, missing):
    """Each subset of the required keys left out (the derivable ones kept): one error naming exactly those keys
    with the file's spelling, never "no Engram metadata" while Engram keys are there."""
    path = model(tmp_path, drop(*missing))
    with pytest.raises(FormatError) as e:
        read_model(path)
    msg = str(e.value)
    assert "no Engram metadata" not in msg and "incomplete Engram metadata" in msg, msg
    named = msg.split(" missing")[0]
    assert all(P + n in named for n in missing) and not any(P + n in named for n in REQUIRED_KEYS if n not in missing)


def test_a_file_with_only_four_engram_keys_names_what_it_lacks(tmp_path):
    path = model(tmp_path, keep_only("primes", "multipliers", "token_map", "rows"))
    with pytest.raises(FormatError, match=rf"required keys {P}encoding, {P}pad_id are missing .*\(the file has 4 "
                                          rf"Engram keys: {P}multipliers, {P}primes, {P}rows, {P}token_map\)"):
        read_model(path)


def test_a_file_without_any_engram_key_says_so(tmp_path):
    path = model(tmp_path, keep_only())
    with pytest.raises(FormatError, match=rf"no Engram metadata: required key {P}encoding is missing"):
        read_model(path)


def _prime(i, value):
    def edit(md):
        v, t, _ = md[P + "primes"]
        v = list(v)
        v[i] = value
        md[P + "primes"] = (v, t, GGUFValueType.UINT64)
    return edit


@pytest.mark.parametrize("i", [0, 7, LAYOUT.columns + 3])
@pytest.mark.parametrize("value", [2 ** 32 + 15, 2 ** 40 + 1, 2 ** 63 + 29, 1, 0])
def test_a_prime_out_of_range_is_named_with_its_range(tmp_path, i, value):
    """A prime past uint32 row ids (or below 2) is the primes key's entry, with its range; not a row count."""
    path = model(tmp_path, _prime(i, value))
    lid, col = LAYOUT.layer_ids[i // LAYOUT.columns], i % LAYOUT.columns
    with pytest.raises(FormatError) as e:
        read_model(path)
    msg = str(e.value)
    assert f"{P}primes: entry [{i}] (layer {lid} column {col}) = {value} is outside [2, {2 ** 32 - 1}]" in msg, msg
    assert "rows" not in msg.split(":")[1]


def test_primes_whose_rows_pass_uint32_name_the_layer_and_its_entries(tmp_path):
    """Every prime in range, but a layer's sum past 2^32 - 1: the primes key and that layer's entries."""
    c = LAYOUT.columns

    def edit(md):
        v, t, _ = md[P + "primes"]
        v = list(v)
        v[c] = v[c + 1] = 2 ** 31 + 11  # a prime, twice: layer 1's sum passes uint32
        md[P + "primes"] = (v, t, GGUFValueType.UINT64)

    with pytest.raises(FormatError, match=rf"{P}primes: entries \[{c}, {2 * c}\) \(layer {LAYOUT.layer_ids[1]}\) "
                                          rf"sum to \d+ rows, more than the {2 ** 32 - 1}"):
        read_model(model(tmp_path, edit))
